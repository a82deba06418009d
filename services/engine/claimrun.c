/*
 * How a claim runs (claimrun.h). The file reads in the order a claim meets the steps: the job,
 * the decisions' consequences, then each shared step's I/O and the callback that records its
 * outcome, then the answer.
 */
#include "claimrun.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "hash.h"
#include "jsonin.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "query.h"
#include "regen.h"
#include "restore.h"
#include "seek.h"
#include "turnbatch.h"

METRICS_DEFINE(CLAIMRUN_METRICS)

#define CLAIMRUN_EVAL_MAX 64 /* claims in one claim.lua call: the script holds Redis meanwhile */

void *claimrun_job_new(claimrun *r, http_req *req, size_t size, claim_kind kind, claim_own_fn own,
                       void (*clear)(reqjob *rj))
{
    claim_job *j = reqjob_new(req, size, clear);
    if (!j)
        return NULL;
    j->run = r;
    j->own = own;
    j->user = req->user_id;
    claimstep_begin(&j->course, kind);
    return j;
}

int claimrun_buckets(claimrun *r, int64_t tpl_id)
{
    size_t slot = (size_t)((uint64_t)tpl_id % CLAIMRUN_BUCKET_SLOTS);
    if (r->buckets[slot].tpl == tpl_id && r->buckets[slot].n >= 1)
        return r->buckets[slot].n;
    uint64_t serial;
    int settled;
    const tpl *t = query_copy_peek(r->query, tpl_id, &serial, &settled);
    return t && t->buckets >= 1 && t->buckets <= BUCKET_MAX ? t->buckets : 1;
}

static void claimrun_learn(claimrun *r, int64_t tpl_id, int n)
{
    size_t slot = (size_t)((uint64_t)tpl_id % CLAIMRUN_BUCKET_SLOTS);
    r->buckets[slot].tpl = tpl_id;
    r->buckets[slot].n = n;
}

void claimrun_job_keys(claim_job *j)
{
    keys_template(j->k_tpl, j->tpl);
    j->nbkt = claimrun_buckets(j->run, j->tpl);
    j->bkt = bucket_home(j->user, j->nbkt);
    resv_keys_of(&j->rk, j->tpl, j->bkt, j->nbkt, j->user, j->request_id);
}

/* ---- the decisions' consequences, and the next step ---- */

/* What the decision leaves to do beside the next step: done once, here. */
static void claimrun_effects(claim_job *j)
{
    claim_course *c = &j->course;
    if (c->copy_settled)
        query_copy_settled(j->run->query, j->tpl, j->local_serial);
    if (c->copy_fill)
        query_copy_fill(j->run->query, j->shop, j->tpl);
    if (c->end_record)
        resv_done(j->run->resv, &j->rk);
    if (c->mark_queued)
        resv_queued(j->run->resv, &j->rk, j->now);
    if (c->item_set)
        claimdb_set(&j->item, c->item_to);
    c->copy_settled = c->copy_fill = c->end_record = c->mark_queued = c->item_set = 0;
}

void claimrun_done(claim_job *j)
{
    claimstep_next(&j->course, &j->out);
    memset(&j->out, 0, sizeof(j->out));
    claimrun_effects(j);
    claimrun_step(j);
}

/* A step that could not even start: its outcome is st, decided at once. */
static void claimrun_failed(claim_job *j, qn_status st)
{
    j->out.st = st;
    claimrun_done(j);
}

/* A Redis callback's status: QN_OK for a reply that is not an error. */
static qn_status claimrun_redis_st(const redisReply *r, const char *err)
{
    return err || !r || r->type == REDIS_REPLY_ERROR ? QN_ERR : QN_OK;
}

/* The earlier attempt of a repeated request id is older than any request lives: its process
 * died, or never learnt its outcome. */
static int claimrun_orphaned(const claim_job *j)
{
    return j->gate.resv_ms > 0 &&
           now_wall_ms() - j->gate.resv_ms > j->run->cfg->http_request_timeout_ms;
}

/* ---- TOUCH: the sweeper's index names the template ---- */

static void claimrun_on_touched(qn_status st, void *arg)
{
    claim_job *j = arg;
    j->out.st = st;
    claimrun_done(j);
}

static void claimrun_touch(claim_job *j)
{
    if (!regen_ok(
            j->run->regen)) { /* Redis may have lost stock and counters: nothing is reserved */
        claimrun_failed(j, QN_EAGAIN);
        return;
    }
    resv_touch(j->run->resv, j->tpl, j->shop, j->nbkt, claimrun_on_touched, j);
}

/* ---- GATE: claim.lua, with the other claims of the loop turn on the same bucket ---- */

static void claimrun_gate(claim_job *j)
{
    j->now = now_wall_ms();
    claim_job **slot = turnbatch_add(j->run->evals);
    if (!slot) {
        claimrun_failed(j, QN_ENOMEM);
        return;
    }
    *slot = j;
}

static void claimrun_on_gate(claim_job *j, const redisReply *r, const char *err)
{
    if (err) {
        log_warn(&j->rj.req->log, "claim: claim.lua failed: %s", err);
        j->out.st = QN_ERR;
    } else {
        j->out.st = claimgate_parse(r, &j->out.gate);
        if (j->out.st != QN_OK)
            log_warn(&j->rj.req->log, "claim: claim.lua's answer cannot be read");
    }
    if (j->out.st == QN_OK && j->out.gate.code == CLAIMGATE_WRONG_BUCKETS) {
        if (j->out.gate.count >= 1 && j->out.gate.count <= BUCKET_MAX) {
            claimrun_learn(j->run, j->tpl, (int)j->out.gate.count);
            claimrun_job_keys(j); /* the home among the template's buckets */
        } else {
            j->out.st = QN_EINVAL;
        }
    }
    j->course.bucketed = j->nbkt > 1;
    j->gate = j->out.gate;
    claimrun_done(j);
}

static void claimrun_on_eval(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    claimrun_on_gate(arg, r, err);
}

/* One claim.lua call answering several claims: its answers, in the claims' order. */
typedef struct claimrun_evals {
    size_t n;
    claim_job *jobs[CLAIMRUN_EVAL_MAX];
} claimrun_evals;

static void claimrun_on_evals(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claimrun_evals *b = arg;
    (void)c;
    if (!err && (r->type != REDIS_REPLY_ARRAY || r->elements != b->n))
        err = r->type == REDIS_REPLY_ERROR ? r->str : "bad reply";
    for (size_t i = 0; i < b->n; i++)
        claimrun_on_gate(b->jobs[i], err ? NULL : r->element[i], err);
    free(b);
}

static uint64_t claimrun_bucket_hash(const void *x)
{
    const claim_job *j = *(claim_job *const *)x;
    return hash_mix64((uint64_t)j->tpl * BUCKET_MAX + (uint64_t)j->bkt);
}

static int claimrun_same_bucket(const void *x, const void *y)
{
    const claim_job *a = *(claim_job *const *)x, *b = *(claim_job *const *)y;
    return a->tpl == b->tpl && a->bkt == b->bkt && a->nbkt == b->nbkt;
}

/* jobs[0..n), claims of one bucket of one template in their order of arrival (turnbatch): one
 * call of claim.lua (its batch form when n > 1). */
static void claimrun_eval_send(void *items, size_t n, void *arg)
{
    claimrun *run = arg;
    claim_job **jobs = items;
    const char *keys[3], *args[2 + 4 * CLAIMRUN_EVAL_MAX];
    char now[CLAIMRUN_EVAL_MAX][24], shop[CLAIMRUN_EVAL_MAX][24], nb[16];
    int na = 0;
    claimrun_evals *b = NULL;
    /* One bucket: the three keys once, the buckets routed by, four arguments a claim. */
    keys[0] = jobs[0]->rk.tpl, keys[1] = jobs[0]->rk.users, keys[2] = jobs[0]->rk.set;
    snprintf(nb, sizeof(nb), "%d", jobs[0]->nbkt);
    args[na++] = resv_owner(run->resv);
    args[na++] = nb;
    for (size_t i = 0; i < n; i++) {
        claim_job *j = jobs[i];
        log_i64_str(now[i], j->now);
        log_i64_str(shop[i], j->shop);
        args[na++] = now[i], args[na++] = shop[i], args[na++] = j->rk.user;
        args[na++] = j->rk.member;
    }
    metrics_inc(&metric_quan_claim_gate_calls_total);
    metrics_add(&metric_quan_claim_gate_claims_total, (int64_t)n);
    qn_status st = QN_ENOMEM;
    if (n == 1) {
        st = REDIS_EVAL_N(run->redis, claim, 3, keys, na, args, claimrun_on_eval, jobs[0]);
    } else if ((b = malloc(sizeof(*b)))) {
        b->n = n;
        memcpy(b->jobs, jobs, n * sizeof(*jobs));
        st = REDIS_EVAL_N(run->redis, claim, 3, keys, na, args, claimrun_on_evals, b);
    }
    if (st == QN_OK)
        return;
    free(b);
    for (size_t i = 0; i < n; i++)
        claimrun_failed(jobs[i], QN_ERR);
}

/* ---- SEEK: the home bucket is dry; stock from the others, or the verdict (seek.h) ---- */

static void claimrun_on_seek(qn_status st, bucket_verdict_t v, void *arg)
{
    claim_job *j = arg;
    j->out.st = st;
    j->out.verdict = v;
    claimrun_done(j);
}

static void claimrun_seek(claim_job *j)
{
    char prefix[KEYS_LEN];
    /* unique per attempt: this process's run, and its count of seeks */
    snprintf(prefix, sizeof(prefix), "%s.%llu", resv_owner(j->run->resv),
             (unsigned long long)++j->run->seeks);
    qn_status st = seek_start(j->run->redis, j->tpl, j->nbkt, j->bkt, prefix, claimrun_on_seek, j);
    if (st != QN_OK)
        claimrun_failed(j, st);
}

/* ---- LOAD, TEMPLATE: the query chain reads the template ---- */

static void claimrun_on_loaded_touched(qn_status st, void *arg)
{
    claim_job *j = arg;
    j->out.st = st == QN_OK ? QN_OK : QN_ERR;
    claimrun_done(j);
}

/* The template read also says how many buckets it has: a process that routed by an old number
 * (a bucket of it gone after a change of buckets, relayout.h, reads "not cached") routes by
 * the new one from here on, its sweeper's index told first as after a "wrong buckets". A
 * template whose change is still under way is read from the database (its hash closed) and
 * routes by the new number too: its buckets answer "not cached" until they are written. */
static void claimrun_on_loaded(qn_status st, const tpl *t, void *arg)
{
    claim_job *j = arg;
    if (st == QN_OK)
        j->tpl_hours = t->validity_hours > 0 ? t->validity_hours : 24;
    j->out.st = st;
    if (st == QN_OK && t->buckets >= 1 && t->buckets <= BUCKET_MAX && t->buckets != j->nbkt) {
        claimrun_learn(j->run, j->tpl, t->buckets);
        claimrun_job_keys(j);
        if (j->course.kind != CLAIM_EXCHANGE) { /* an exchange goes through TOUCH next anyway */
            resv_touch(j->run->resv, j->tpl, j->shop, j->nbkt, claimrun_on_loaded_touched, j);
            return;
        }
    }
    claimrun_done(j);
}

static void claimrun_load(claim_job *j)
{
    if (query_template(j->run->query, j->shop, j->tpl, claimrun_on_loaded, j) != QN_OK)
        claimrun_failed(j, QN_ERR);
}

/* ---- RECORD, CODE_OWN: the reservation's record of a repeated request id ---- */

static void claimrun_on_record(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_job *j = arg;
    (void)c;
    j->out.st = claimrun_redis_st(r, err);
    if (j->out.st == QN_OK && r->type == REDIS_REPLY_STRING) /* a score: maybe "1e+15" */
        j->out.record = strtod(r->str, NULL) < (double)RESV_QUEUED_BASE ? CLAIM_RECORD_OPEN
                                                                        : CLAIM_RECORD_QUEUED;
    j->out.orphaned = claimrun_orphaned(j);
    claimrun_done(j);
}

static void claimrun_record(claim_job *j)
{
    if (redis_command(j->run->redis, claimrun_on_record, j, "ZSCORE %s %s", j->rk.set,
                      j->rk.member) != QN_OK)
        claimrun_failed(j, QN_ERR);
}

/* ---- LOOKUP: the coupon a repeated /redeem made ---- */

static qn_status claimrun_work_lookup(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    return ucoupon_load_by_request(c, j->user, j->request_id, &j->item.c);
}

static void claimrun_on_db(qn_status st, void *arg)
{
    claim_job *j = arg;
    j->out.st = st;
    j->out.db = j->item.state;
    j->out.orphaned = claimrun_orphaned(j);
    claimrun_done(j);
}

static void claimrun_submit(claim_job *j, int ds, pgpool_work_fn work)
{
    if (pgpool_submit(service_pg(j->run->svc, ds), work, claimrun_on_db, j) != QN_OK)
        claimrun_failed(j, QN_EBUSY);
}

/* ---- TAKEOVER, RESOLVE: the template's database gives an attempt up unless it arrived ---- */

static qn_status claimrun_work_void(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    return claimdb_void(c, j->item.tpl_ds, &j->item, 1);
}

/* The orphaned attempt of this request id: as the sweeper would, by its reservation's time. */
static void claimrun_takeover(claim_job *j)
{
    claimdb_item *it = &j->item;
    memset(it, 0, sizeof(*it));
    it->c.user_id = j->user;
    it->c.template_id = j->tpl;
    it->c.shop_number = j->shop;
    it->c.receive_time_ms = j->gate.resv_ms;
    snprintf(it->c.request_id, sizeof(it->c.request_id), "%s", j->request_id);
    it->bkt = j->bkt;
    it->nbkt = j->nbkt;
    claimdb_route(it);
    claimrun_submit(j, it->tpl_ds, claimrun_work_void);
}

/* A write whose outcome is unknown: what it decided is forgotten, and the database asked. */
static void claimrun_resolve(claim_job *j)
{
    claimdb_set(&j->item, CLAIMDB_PENDING);
    claimrun_submit(j, j->item.tpl_ds, claimrun_work_void);
}

/* ---- COUPON, GIVE_BACK: /redeem's second database ---- */

static void claimrun_on_coupon(qn_status st, void *arg)
{
    claimrun_on_db(st, arg);
}

/* The coupon in the user's database, in a transaction shared with that database's others. */
static void claimrun_coupon(claim_job *j)
{
    j->batch = (claimbatch_claim){.item = &j->item, .done = claimrun_on_coupon, .arg = j};
    if (claimbatch_submit(j->run->batch, CLAIMBATCH_COUPON, &j->batch) != QN_OK)
        claimrun_failed(j, QN_EBUSY);
}

static qn_status claimrun_work_give_back(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    if (pgpool_begin(c) != QN_OK || claimdb_give_back(c, j->item.tpl_ds, &j->item, 1) != QN_OK) {
        (void)pgpool_rollback(c);
        return QN_ERR;
    }
    return pgpool_commit(c);
}

/* ---- TAKE_BACK, UNDO: the reservation back in Redis, once (its marker) ---- */

static void claimrun_on_taken_back(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_job *j = arg;
    (void)c;
    j->out.st =
        claimrun_redis_st(r, err) == QN_OK && r->type == REDIS_REPLY_INTEGER ? QN_OK : QN_ERR;
    claimrun_done(j);
}

static void claimrun_on_undone(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_job *j = arg;
    (void)c;
    if (err || !r || r->type == REDIS_REPLY_ERROR) {
        log_warnf(&j->rj.req->log,
                  ((log_field[]){LOG_I("template", j->tpl), LOG_I("user", j->user),
                                 LOG_S("error", err ? err
                                                : r ? r->str
                                                    : "no reply"),
                                 LOG_END}),
                  "claim: cannot give the reservation back (sent again)");
        char attempt[24] = "";
        if (j->item.c.receive_time_ms > 0)
            log_i64_str(attempt, j->item.c.receive_time_ms);
        resv_undo_again(j->run->resv, &j->rk, attempt);
    }
    j->out.st = QN_OK; /* answered all the same */
    claimrun_done(j);
}

/* Whoever reads the claim's result later finds the marker gone; the job may be gone by the
 * time this answers: nothing of it is used. */
static void claimrun_on_unmarked(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (err) /* its result reads PENDING until a query finds the claim ended */
        log_warnf(NULL, ((log_field[]){LOG_S("error", err), LOG_END}),
                  "claim: cannot clear the pending marker of a claim given back");
}

static void claimrun_give_back(claim_job *j, redis_cb done)
{
    /* The job's attempt only, once its time is known (the coupon it would have been): a retry
     * of the request id may hold the marker by now. */
    char attempt[24] = "";
    if (j->item.c.receive_time_ms > 0)
        log_i64_str(attempt, j->item.c.receive_time_ms);
    const char *keys[3] = RESV_UNDO_KEYS(&j->rk), *args[3] = RESV_UNDO_ARGS(&j->rk, attempt);
    if (REDIS_EVAL(j->run->redis, claim_undo, keys, args, done, j) != QN_OK)
        done(j->run->redis, NULL, "cannot issue", j);
}

static void claimrun_undo(claim_job *j)
{
    if (j->course.unmark) { /* no longer pending: no coupon will come of it */
        char key[KEYS_LEN];
        keys_claim_pending(key, j->user, j->request_id);
        if (redis_command(j->run->redis, claimrun_on_unmarked, NULL, "DEL %s", key) != QN_OK)
            claimrun_on_unmarked(j->run->redis, NULL, "cannot issue", NULL);
        j->course.unmark = 0;
    }
    claimrun_give_back(j, claimrun_on_undone);
}

/* ---- WALLET: the coupon into the user's wallet, then the answer ---- */

static void claimrun_on_wallet(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_job *j = arg;
    (void)c, (void)r;
    if (err) /* its outbox event adds it later */
        log_warn(&j->rj.req->log, "claim: wallet write failed (the safety net will add it): %s",
                 err);
    j->out.st = err ? QN_ERR : QN_OK;
    claimrun_done(j);
}

static void claimrun_wallet(claim_job *j)
{
    char key[KEYS_LEN], member[UCOUPON_MEMBER_LEN], score[24];
    keys_wallet(key, j->user);
    ucoupon_member(member, j->tpl, j->item.c.id);
    snprintf(score, sizeof(score), "%" PRId64, j->item.c.receive_time_ms);
    if (redis_command(j->run->redis, claimrun_on_wallet, j, "ZADD %s %s %s", key, score, member) !=
        QN_OK)
        claimrun_on_wallet(j->run->redis, NULL, "cannot issue", j);
}

/* ---- REPLY ---- */

static void claimrun_reply(claim_job *j)
{
    const claim_course *c = &j->course;
    int exchange = c->kind == CLAIM_EXCHANGE;
    if (c->label)
        metrics_inc_l(exchange ? &metric_quan_exchange_total : &metric_quan_claims_total, c->label);
    if (!c->ok) {
        reqjob_reply_error(&j->rj, c->err, "%s", c->msg);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (o && c->kind == CLAIM_MQ) {
        cJSON_AddStringToObject(o, "requestId", j->request_id);
    } else if (o) {
        cJSON_AddItemToObject(o, "userCouponId", jsonin_id_to_json(j->item.c.id));
        if (!exchange)
            cJSON_AddNumberToObject(o, "receiveCount", (double)j->item.c.receive_count);
    }
    j->rj.status = c->kind == CLAIM_MQ ? 202 : 200;
    j->rj.data = o;
    reqjob_reply(&j->rj, QN_OK);
}

/* ---- the steps ---- */

void claimrun_step(claim_job *j)
{
    switch (j->course.step) {
    case CLAIM_TOUCH:
        claimrun_touch(j);
        return;
    case CLAIM_GATE:
        claimrun_gate(j);
        return;
    case CLAIM_SEEK:
        claimrun_seek(j);
        return;
    case CLAIM_LOAD:
    case CLAIM_TEMPLATE:
        claimrun_load(j);
        return;
    case CLAIM_RECORD:
    case CLAIM_CODE_OWN:
        claimrun_record(j);
        return;
    case CLAIM_LOOKUP:
        claimrun_submit(j, ucoupon_ds(j->user), claimrun_work_lookup);
        return;
    case CLAIM_TAKEOVER:
        claimrun_takeover(j);
        return;
    case CLAIM_TAKE_BACK:
        claimrun_give_back(j, claimrun_on_taken_back);
        return;
    case CLAIM_COUPON:
        claimrun_coupon(j);
        return;
    case CLAIM_GIVE_BACK:
        claimrun_submit(j, j->item.tpl_ds, claimrun_work_give_back);
        return;
    case CLAIM_RESOLVE:
        claimrun_resolve(j);
        return;
    case CLAIM_UNDO:
        claimrun_undo(j);
        return;
    case CLAIM_DOUBT: /* this process settles it once the database answers */
        resv_doubt(j->run->resv, &j->item, j->course.kind == CLAIM_MQ);
        claimrun_done(j);
        return;
    case CLAIM_WALLET:
        claimrun_wallet(j);
        return;
    case CLAIM_REPLY:
    case CLAIM_DONE:
    case CLAIM_STEPS:
        claimrun_reply(j);
        return;
    case CLAIM_LOCK:
    case CLAIM_CODE:
    case CLAIM_WRITE:
    case CLAIM_PUBLISH:
        j->own(j);
        return;
    }
}

/* ---- life ---- */

claimrun *claimrun_new(service *s, int64_t wallet_check_ms)
{
    claimrun *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->svc = s;
    r->cfg = service_cfg(s);
    r->query = service_module_state(s, &query_module);
    r->resv = service_module_state(s, &resv_module);
    r->regen = service_module_state(s, &regen_module);
    r->restore = service_module_state(s, &restore_module);
    r->redis = service_redis(s);
    r->wallet_check_ms = wallet_check_ms;
    r->evals = turnbatch_new(service_base(s), sizeof(claim_job *), CLAIMRUN_EVAL_MAX,
                             claimrun_bucket_hash, claimrun_same_bucket, claimrun_eval_send, r);
    r->batch = claimbatch_new(s);
    if (!r->query || !r->resv || !r->regen || !r->restore) /* they start before the claim module */
        log_error(NULL, "claim: the query, resv, restore and regen modules must start first");
    if (!r->evals || !r->batch || !r->query || !r->resv || !r->regen || !r->restore) {
        claimrun_free(r);
        return NULL;
    }
    return r;
}

void claimrun_free(claimrun *r)
{
    if (!r)
        return;
    claimbatch_free(r->batch);
    turnbatch_free(r->evals); /* the requests are gone with the loop */
    free(r);
}
