/*
 * Claims over HTTP (claim.h): the routes, what a request says, and the steps only /redeem and
 * /redeem-mq have; claimrun.h runs a claim and claimstep.h decides each of its steps.
 *
 *   POST /redeem (CLAIM_SYNC)       claim_parse, then TOUCH and GATE (claimrun.c); WRITE here:
 *                                   the stock, and in one database the coupon, in the
 *                                   template's transaction shared with the claims arriving
 *                                   meanwhile (claimbatch.h); the rest as claimstep decides
 *   POST /redeem-mq (CLAIM_MQ)      claim_parse, TOUCH, GATE; PUBLISH here: coupon.redeem with a
 *                                   confirm, and the pending marker (keys_claim_pending) at the
 *                                   same time unless the request id names the template (the
 *                                   claim's own marker tells then); 202 once both answered
 *   GET /redeem-result              the claim's marker (an id naming its template, as the
 *                                   engine's own do) or else the pending marker, then the coupon
 *                                   of the request id (the user's database), then its FAILED row
 *                                   (t_claim_result, ds_0):
 *                                   PENDING | SUCCESS | FAILED, or 404; a marker older than 30 s
 *                                   whose claim's record is gone with no outcome written is
 *                                   removed (result_on_record)
 */
#include "claim.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "claimbatch.h"
#include "claimdb.h"
#include "claimq.h"
#include "claimrun.h"
#include "events.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "query.h"
#include "rcopy.h"
#include "reqjob.h"
#include "restore.h"
#include "resv.h"
#include "ucoupon.h"

typedef struct claim_settings {
    int64_t claim_wallet_check_ms; /* when the sync claim's wallet safety net is checked */
} claim_settings;

static claim_settings claim_cfg;

/* A pending marker older than this, with no outcome, has its claim's record looked up
 * (result_reply). */
#define CLAIM_PENDING_CHECK_AFTER_MS 30000

/* One /redeem-result request. */
typedef struct result_job {
    reqjob rj; /* first */
    claimrun *run;
    int64_t user;
    char request_id[CLAIM_REQUEST_ID_MAX + 1];
    ucoupon c;
    int found;   /* 1 coupon, 2 failed */
    int pending; /* the claim is accepted and not written yet (read before the database) */
    /* the marker's value, "<template>:<reservation ms>": which record to look at when the
     * database has no outcome yet ("" from a marker written before it said so) */
    char marker[48];
    int64_t marker_tpl, marker_ms;
    char reason[256];
} result_job;

/* A /redeem-mq claim: its PUBLISH waits for two answers. */
typedef struct claim_mq_job {
    claim_job j; /* first */
    int waits;   /* the answers still awaited (claim_mq_joined) */
} claim_mq_job;

static void claim_own(claim_job *j);
static void result_ask_pending(result_job *j);
static void result_on_claim_marker(redis_client *c, const redisReply *r, const char *err,
                                   void *arg);
static void result_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg);
static qn_status result_work_coupon(pgpool_conn *c, void *arg);
static void result_coupon_done(qn_status st, void *arg);
static qn_status result_work_failed_fn(pgpool_conn *c, void *arg);
static void result_failed_done(qn_status st, void *arg);
static void result_reply(result_job *j);
static void result_on_record(redis_client *c, const redisReply *r, const char *err, void *arg);
static void result_on_buckets(redis_client *c, const redisReply *r, const char *err, void *arg);
static qn_status result_work_failed(pgpool_conn *c, result_job *j);

/* ---- the engine's copy of the template: refusals without Redis ---- */

/*
 * The refusal the template's copy already tells, without Redis: once a flash sale is sold out,
 * every further claim is refused here instead of by a script call on the template's one Redis
 * slot. The copy is the query's (query_copy_peek): current, told of every change of the hash,
 * so it holds the stock claim.lua would read, give or take an invalidation still in flight
 * (a claim refused a moment after a give-back, as it would have been a moment before). The
 * checks are the script's, in its order, short of the per-user limit, which the copy does not
 * hold. "Sold out" is answered here only once claim.lua said it of this very copy's stock with
 * no reservation left in doubt (query_copy_settled): until then stock held by claims not yet
 * settled may come back, which only the script sees. Only for claims without a request id: a
 * request id may have claimed before, and its answer is that claim's, which only the script
 * knows. CLAIMGATE_OK: the script decides.
 */
static claimgate_result claim_gate_local(claim_job *j)
{
    uint64_t serial = 0;
    int settled = 0;
    const tpl *t = query_copy_peek(j->run->query, j->tpl, &serial, &settled);
    claimgate_result r = CLAIMGATE_OK;
    if (t && t->shop_number == j->shop) {
        if (t->status != TPL_STATUS_ACTIVE)
            r = CLAIMGATE_NOT_ACTIVE;
        else if (j->now < t->valid_start_ms || j->now > t->valid_end_ms)
            r = CLAIMGATE_OUTSIDE_WINDOW;
        else if (t->stock <= 0 && settled)
            r = CLAIMGATE_SOLD_OUT;
        else if (t->stock <= 0)
            j->local_serial = serial;
    }
    metrics_series_add(
        metrics_handle_series(
            &j->run->gate_lookups[r != CLAIMGATE_OK], &metric_quan_rcopy_lookups_total,
            (const char *const[]){"claim_gate", r != CLAIMGATE_OK ? "hit" : "miss", NULL}),
        1);
    return r;
}

/* ---- the route handlers: what a request says, then its first step ---- */

static void claim_parse(claimrun *run, http_req *req, claim_kind kind)
{
    static const int sources[] = {0, 1, 2};
    const cJSON *body = http_body_json(req);
    jsonin_err err;
    const char *rid = NULL;
    size_t size = kind == CLAIM_MQ ? sizeof(claim_mq_job) : sizeof(claim_job);
    claim_job *j = claimrun_job_new(run, req, size, kind, claim_own, NULL);
    if (!j)
        return;
    if (jsonin_enum_int(body, "source", JSONIN_OPTIONAL, 0, sources, 3, &j->source, &err) ||
        jsonin_int64(body, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &j->shop, &err) ||
        jsonin_int64(body, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &j->tpl, &err) ||
        jsonin_string(body, "requestId", JSONIN_OPTIONAL, 1, CLAIM_REQUEST_ID_MAX, &rid, &err)) {
        reqjob_reply_error(&j->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    if (rid && !claim_request_id_ok(rid)) {
        reqjob_reply_error(&j->rj, ERRCODE_INVALID,
                           "requestId: only letters, digits and . _ : - allowed");
        return;
    }
    j->now = now_wall_ms();
    if (!rid) { /* before an id and keys are made: a sold-out sale refuses most claims here */
        const claim_refused *f = claim_refusal(claim_gate_local(j));
        if (f) {
            if (f->outcome)
                metrics_inc_l(&metric_quan_claims_total, f->outcome);
            reqjob_reply_error(&j->rj, f->err, "%s", f->msg);
            return;
        }
        j->course.local_miss = 1;
        j->course.local_zero = j->local_serial != 0;
        int64_t id;
        if (ids_next(service_ids(run->svc), &id) != QN_OK) {
            reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "no id available; try again");
            return;
        }
        /* "g<id>.<templateId>": an id that names its template needs no pending marker
         * (keys_claim_pending_used) */
        size_t n = 1 + log_i64_str(j->request_id + 1, id);
        j->request_id[0] = 'g';
        j->request_id[n++] = '.';
        log_i64_str(j->request_id + n, j->tpl);
    } else {
        snprintf(j->request_id, sizeof(j->request_id), "%s", rid);
    }
    claimrun_job_keys(j);
    if (kind == CLAIM_MQ && !mq_publisher_ready(service_publisher(run->svc))) {
        /* no reserve-then-undo */
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                           "the claim queue is unavailable; try again");
        return;
    }
    claimrun_step(j);
}

static void claim_handle_sync(http_req *req, void *arg)
{
    claim_parse(arg, req, CLAIM_SYNC);
}

static void claim_handle_mq(http_req *req, void *arg)
{
    claim_parse(arg, req, CLAIM_MQ);
}

static void result_handle(http_req *req, void *arg)
{
    const char *rid = http_param_str(req, "requestId");
    if (!rid || !*rid) {
        http_reply_error(req, ERRCODE_INVALID, "requestId: required");
        return;
    }
    if (!claim_request_id_ok(rid)) {
        http_reply_error(req, ERRCODE_INVALID,
                         "requestId: 1-64 letters, digits and . _ : - expected");
        return;
    }
    result_job *j = reqjob_new(req, sizeof(*j), NULL);
    if (!j)
        return;
    j->run = arg;
    j->user = req->user_id;
    snprintf(j->request_id, sizeof(j->request_id), "%s", rid);
    /* The marker first, then the database: the consumer writes the outcome before it deletes
     * the marker, so one of the two always tells. An id that names a template is looked up
     * there first, as the claim's marker; without one, as a pending marker (the claim may be of
     * another template than its id names). */
    int64_t named = keys_request_template(j->request_id);
    if (named > 0) {
        char key[KEYS_LEN], field[KEYS_LEN];
        keys_template_users(key, named);
        keys_resv_member(field, j->user, j->request_id);
        if (redis_command(j->run->redis, result_on_claim_marker, j, "HEXISTS %s %s", key, field) ==
            QN_OK)
            return;
    }
    result_ask_pending(j);
}

static void result_ask_pending(result_job *j)
{
    char key[KEYS_LEN];
    keys_claim_pending(key, j->user, j->request_id);
    if (redis_command(j->run->redis, result_on_pending, j, "GET %s", key) != QN_OK)
        result_on_pending(j->run->redis, NULL, "cannot issue", j);
}

/* ---- /redeem's WRITE: the template's transaction (claimbatch.h) ---- */

/* The template's transaction ended: with one database the coupon went with it. */
static void claim_on_written(qn_status st, void *arg)
{
    claim_job *j = arg;
    j->out.st = st;
    j->out.db = j->item.state;
    claimrun_done(j);
}

static void claim_write(claim_job *j)
{
    claimdb_item *it = &j->item;
    claimrun *run = j->run;
    int64_t id;
    memset(it, 0, sizeof(*it));
    if (ids_next(service_ids(run->svc), &id) != QN_OK) {
        j->out.no_id = 1;
        claimrun_done(j);
        return;
    }
    ucoupon_claimed(&it->c, id, j->user, j->tpl, j->shop, j->source, UCOUPON_CH_CLAIM,
                    (int)j->gate.count, j->now, j->gate.hours, j->request_id);
    it->bkt = j->bkt;
    it->nbkt = j->nbkt;
    claimdb_route(it);
    j->course.two_dbs = it->tpl_ds != it->user_ds;
    j->batch = (claimbatch_claim){.item = it,
                                  .request_id = j->rj.request_id,
                                  .check_due_ms = now_wall_ms() + run->wallet_check_ms,
                                  .done = claim_on_written,
                                  .arg = j};
    if (claimbatch_submit(run->batch, CLAIMBATCH_STOCK, &j->batch) != QN_OK) {
        j->out.st = QN_EBUSY;
        claimrun_done(j);
    }
}

/* ---- /redeem-mq's PUBLISH: the confirm and the pending marker together ---- */

/* Both answers are in (the marker's first, so that a give-back's DEL comes after its SET). */
static void claim_mq_joined(claim_mq_job *m)
{
    if (--m->waits > 0)
        return;
    claimrun_done(&m->j);
}

static void claim_on_published(qn_status st, void *arg)
{
    claim_mq_job *m = arg;
    m->j.out.st = st;
    claim_mq_joined(m);
}

static void claim_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_mq_job *m = arg;
    (void)c, (void)r;
    if (err) /* the claim goes on all the same; its result reads 404 until it is written */
        log_warn(&m->j.rj.req->log, "claim: cannot mark the claim pending: %s", err);
    m->j.course.marked = !err;
    claim_mq_joined(m);
}

static void claim_publish(claim_job *j)
{
    claim_mq_job *m = (claim_mq_job *)j;
    char data[CLAIMQ_CLAIM_JSON], key[CLAIMQ_ATTEMPT_KEY], pending[KEYS_LEN];
    service *svc = j->run->svc;
    ucoupon *u = &j->item.c;
    int64_t id;
    if (ids_next(service_ids(svc), &id) != QN_OK) {
        j->out.no_id = 1;
        claimrun_done(j);
        return;
    }
    memset(&j->item, 0, sizeof(j->item));
    ucoupon_claimed(u, id, j->user, j->tpl, j->shop, j->source, UCOUPON_CH_MQ, (int)j->gate.count,
                    j->now, j->gate.hours, j->request_id);
    j->item.bkt = j->bkt;
    j->item.nbkt = j->nbkt;
    claimdb_route(&j->item); /* for RESOLVE, if the broker's answer is lost */
    claimq_claim_json(data, u, j->bkt, j->nbkt, 0, restore_epoch(j->run->restore));
    claimq_attempt_key(key, sizeof(key), u, 0);
    mq_msg msg = {.routing_key = EVENT_COUPON_REDEEM,
                  .key = key,
                  .request_id = j->rj.request_id,
                  .traceparent = j->rj.traceparent,
                  .ts_ms = j->now,
                  .data_json = data,
                  .packable = 1, /* claimq reads packs */
                  .data_own = 1};
    /* The marker makes a result query after the 202 find the claim pending. It is set while
     * the broker confirms, not after: the 202 waits for the later of the two answers instead of
     * both in turn. Until the confirm it says what is true, a claim not settled yet; if the
     * claim is given back, the marker goes with it (UNDO, or the sweeper's give-back). */
    m->waits = 1; /* this function's own share, released at its end */
    keys_claim_pending(pending, j->user, j->request_id);
    /* It names the attempt (template, reservation time): a result query that finds the marker
     * but no record and no outcome knows the marker outlived its claim (result_on_record). */
    if (keys_claim_pending_used(j->tpl, j->request_id)) { /* else the claim's marker tells */
        if (redis_command(j->run->redis, claim_on_pending, m, "SET %s %lld:%lld PX %d", pending,
                          (long long)j->tpl, (long long)j->now, CLAIM_PENDING_TTL_MS) == QN_OK)
            m->waits++;
        else
            log_warn(&j->rj.req->log, "claim: cannot mark the claim pending: cannot issue");
    }
    j->out.queued = mq_publish(service_publisher(svc), &msg, claim_on_published, m) == QN_OK;
    m->waits += j->out.queued;
    claim_mq_joined(m);
}

/* The steps /redeem and /redeem-mq run themselves. */
static void claim_own(claim_job *j)
{
    if (j->course.step == CLAIM_PUBLISH)
        claim_publish(j);
    else
        claim_write(j);
}

/* ---- /redeem-result: the pending marker, the coupon, the FAILED row ---- */

/* The job may be gone by now: nothing of it is used. */
static void result_on_unmarked(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (err)
        log_warnf(NULL, ((log_field[]){LOG_S("error", err), LOG_END}),
                  "claim: cannot remove a pending marker that outlived its claim");
}

/* The claim's marker is there from its reservation until its give-back: pending unless the
 * database has its outcome. It stays after its claim only beside the claim's coupon, so it is
 * never looked into as a pending marker is (result_on_record). */
static void result_on_claim_marker(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    result_job *j = arg;
    if (err || !r || r->type != REDIS_REPLY_INTEGER) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "cache unavailable");
        return;
    }
    if (!r->integer) {
        result_ask_pending(j);
        return;
    }
    j->pending = 1;
    reqjob_submit(&j->rj, service_pg(j->run->svc, ucoupon_ds(j->user)), result_work_coupon,
                  result_coupon_done);
}

static void result_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    result_job *j = arg;
    if (err || !r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "cache unavailable");
        return;
    }
    j->pending = r->type == REDIS_REPLY_STRING;
    long long tpl_id = 0, ms = 0;
    int end = 0;
    if (j->pending && sscanf(r->str, "%lld:%lld%n", &tpl_id, &ms, &end) == 2 &&
        (size_t)end == r->len && tpl_id > 0 && r->len < sizeof(j->marker)) {
        memcpy(j->marker, r->str, r->len + 1);
        j->marker_tpl = tpl_id;
        j->marker_ms = ms;
    }
    reqjob_submit(&j->rj, service_pg(j->run->svc, ucoupon_ds(j->user)), result_work_coupon,
                  result_coupon_done);
}

/* The coupon (user's database); on ds_0 the FAILED row too, on the same connection. */
static qn_status result_work_coupon(pgpool_conn *c, void *arg)
{
    result_job *j = arg;
    qn_status st = ucoupon_load_by_request(c, j->user, j->request_id, &j->c);
    if (st == QN_OK) {
        j->found = 1;
        return QN_OK;
    }
    if (st != QN_ENOTFOUND)
        return st;
    return ucoupon_ds(j->user) == 0 ? result_work_failed(c, j) : QN_OK;
}

static void result_coupon_done(qn_status st, void *arg)
{
    result_job *j = arg;
    if (st != QN_OK) {
        result_failed_done(st, j);
        return;
    }
    if (j->found || ucoupon_ds(j->user) == 0) {
        result_reply(j);
        return;
    }
    reqjob_submit(&j->rj, service_pg(j->run->svc, 0), result_work_failed_fn, result_failed_done);
}

/* The FAILED row (t_claim_result lives in ds_0), for a user whose coupons are in ds_1. */
static qn_status result_work_failed_fn(pgpool_conn *c, void *arg)
{
    return result_work_failed(c, arg);
}

static void result_failed_done(qn_status st, void *arg)
{
    result_job *j = arg;
    if (st != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "database unavailable");
        return;
    }
    result_reply(j);
}

static void result_reply(result_job *j)
{
    /* Is its claim still open? Asked only of a marker older than 30 s: a marker left behind is
     * rare, and saying PENDING a little longer costs it nothing, while the clients that poll
     * during a sale would pay a command on each poll. */
    if (!j->found && j->pending && j->marker_tpl &&
        now_wall_ms() - j->marker_ms > CLAIM_PENDING_CHECK_AFTER_MS) {
        /* The marker names no bucket: the record is at the user's home among the template's
         * buckets, as its hash says now (this process may never have claimed on it, or known
         * an older number: a change of buckets, relayout.h). */
        char key[KEYS_LEN];
        keys_template(key, j->marker_tpl);
        if (redis_command(j->run->redis, result_on_buckets, j, "HGET %s buckets", key) == QN_OK)
            return;
    }
    if (!j->found && !j->pending) {
        reqjob_reply_error(&j->rj, ERRCODE_NOT_FOUND, "no claim with this requestId");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddStringToObject(o, "requestId", j->request_id);
        cJSON_AddStringToObject(o, "status",
                                j->found == 1   ? "SUCCESS"
                                : j->found == 2 ? "FAILED"
                                                : "PENDING");
        cJSON_AddItemToObject(o, "userCouponId",
                              j->found == 1 ? jsonin_id_to_json(j->c.id) : cJSON_CreateNull());
        if (j->found == 2)
            cJSON_AddStringToObject(o, "reason", j->reason);
        else
            cJSON_AddNullToObject(o, "reason");
    }
    j->rj.data = o;
    reqjob_reply(&j->rj, QN_OK);
}

/* The template's number of buckets (absent: 1; no answer: as this process knows it), then its
 * record's ZSCORE at the user's home. */
static void result_on_buckets(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    result_job *j = arg;
    int n = !err && r && r->type == REDIS_REPLY_STRING ? atoi(r->str)
            : !err && r && r->type == REDIS_REPLY_NIL  ? 1
                                                       : claimrun_buckets(j->run, j->marker_tpl);
    if (n < 1 || n > BUCKET_MAX)
        n = 1;
    resv_keys k;
    resv_keys_of(&k, j->marker_tpl, bucket_home(j->user, n), n, j->user, j->request_id);
    if (redis_command(j->run->redis, result_on_record, j, "ZSCORE %s %s", k.set, k.member) !=
        QN_OK) {
        j->marker_tpl = 0; /* not asked: PENDING, as it was */
        result_reply(j);
    }
}

/* The marker said PENDING and the database has no outcome. With the claim's record gone too,
 * the claim ended without a coupon and its marker was left behind (the give-back's DEL refused,
 * Redis failing just then): it goes now, if it still names the same attempt (a retry's new
 * attempt writes its own), and the next query answers 404. This one still says PENDING: an
 * outcome may have been written since the database was read. */
static void result_on_record(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    result_job *j = arg;
    j->marker_tpl = 0; /* asked once */
    if (!err && r && r->type == REDIS_REPLY_NIL) {
        char key[KEYS_LEN];
        const char *keys[1] = {key}, *args[1] = {j->marker};
        keys_claim_pending(key, j->user, j->request_id);
        log_infof(&j->rj.req->log, ((log_field[]){LOG_S("request_id", j->request_id), LOG_END}),
                  "claim: a pending marker outlived its claim; removing it");
        /* lock_release.lua is compare-and-delete, whatever the key holds */
        if (REDIS_EVAL(j->run->redis, lock_release, keys, args, result_on_unmarked, NULL) != QN_OK)
            result_on_unmarked(j->run->redis, NULL, "cannot issue", NULL);
    }
    result_reply(j);
}

/* ---- helpers ---- */

/* The FAILED row of the request id, if any (t_claim_result, ds_0). */
static qn_status result_work_failed(pgpool_conn *c, result_job *j)
{
    pgparam p = {0};
    pgparam_i64(&p, j->user);
    pgparam_str(&p, j->request_id);
    PGresult *r = pgpool_exec(c,
                              "SELECT coalesce(reason, '') FROM t_claim_result WHERE user_id = $1 "
                              "AND request_id = $2 AND status = " CLAIMDB_RESULT_TEXT(FAILED),
                              p.n, p.v);
    if (!r)
        return QN_ERR;
    if (PQntuples(r) == 1) {
        j->found = 2;
        snprintf(j->reason, sizeof(j->reason), "%s", PQgetvalue(r, 0, 0));
    }
    PQclear(r);
    return QN_OK;
}

int claim_request_id_ok(const char *s)
{
    size_t n = 0;
    if (!s)
        return 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == ':' || ch == '-'))
            return 0;
    }
    return n >= 1 && n <= CLAIM_REQUEST_ID_MAX;
}

/* ---- the module ---- */

static qn_status claim_start(service *s, void **state)
{
    claimrun *run = claimrun_new(s, claim_cfg.claim_wallet_check_ms);
    *state = run;
    return run ? QN_OK : QN_ENOMEM;
}

static void claim_free(void *state)
{
    claimrun_free(state);
}

static const config_var claim_vars[] = {
    {"QUAN_CLAIM_WALLET_CHECK_MS", CONFIG_INT, offsetof(claim_settings, claim_wallet_check_ms),
     "30000", 0, 86400000, NULL, 0,
     "after a sync claim or exchange, when its outbox check completes or undoes it if half-done"},
};

const service_module claim_module = {
    .name = "claim",
    .vars = claim_vars,
    .nvars = sizeof(claim_vars) / sizeof(claim_vars[0]),
    .settings = &claim_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/engine/user-coupon/redeem", claim_handle_sync, HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/user-coupon/redeem-mq", claim_handle_mq, HTTP_NEED_USER},
            {HTTP_GET, "/api/engine/user-coupon/redeem-result", result_handle, HTTP_NEED_USER},
            {0},
        },
    .metrics =
        (metrics_family *const[]){
            METRICS_REFS(CLAIMSTEP_METRICS)  /* the claims' outcomes */
            METRICS_REFS(CLAIMRUN_METRICS)   /* the gate's calls */
            METRICS_REFS(CLAIMBATCH_METRICS) /* /redeem's shared transactions */
            METRICS_REFS(RCOPY_METRICS)      /* claim_gate_local's lookups */
            NULL,
        },
    .start = claim_start,
    .free = claim_free,
};
