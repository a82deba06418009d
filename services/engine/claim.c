/*
 * Claims over HTTP (claim.h). The file reads in the order a request runs: the route handlers,
 * then each step in call order, then the helpers, then the module descriptor.
 *
 *   POST /redeem (claim_handle_sync)
 *     claim_parse          the body: source, shopNumber, couponTemplateId, requestId
 *     claim_eval           claim.lua, one Redis step (claimgate.h): status, window, stock,
 *                          per-user limit, the request's marker
 *       CACHE_MISS         claim_on_loaded: the query chain loads the template, claim.lua once
 *                          more
 *       REPEATED           claim_work_lookup: the coupon of that request id, the same answer
 *       refused            claim_refusal: 409 or 404; nothing was taken
 *     claim_write          the database steps (claimdb.h), in one or two databases; the
 *                          template's transaction is shared by the template's claims arriving
 *                          meanwhile (claimbatch.h):
 *                            same:  stock ledger, coupon row and check in that transaction
 *                            two:   stock ledger and check in it, then the coupon row in the
 *                                   user's (also shared, by that database's claims), and when
 *                                   that failed or was refused claim_work_give_back
 *                                   (template's: stock back)
 *     claim_db_outcome     a coupon row (new, or this request's own from before): on to the
 *                          wallet; anything else gives the reservation back
 *     claim_committed      wallet ZADD, then 200 {userCouponId, receiveCount}
 *
 *   POST /redeem-mq (claim_handle_mq)
 *     claim_parse, claim_eval   as above (REPEATED: 202 again)
 *     claim_publish        coupon.redeem, and at the same time the pending marker
 *                          (keys_claim_pending)
 *     claim_mq_joined      the broker's confirm and the marker both answered: 202 {requestId}
 *
 *   GET /redeem-result (result_handle)
 *     the pending marker, then the coupon of the request id (user's database), then its FAILED
 *     row (t_claim_result, ds_0): PENDING | SUCCESS | FAILED, or 404; a marker older than
 *     30 s whose claim's record is gone with no outcome written is removed (result_on_record)
 *
 * The reservation claim.lua made is given back (claim_undo: claim_undo.lua with the marker,
 * then the error reply) when the claim does not become a coupon or a queued message: no id,
 * an unexpected reply, the database busy or refused (stock, receive-count slot), the claim
 * queue full. When the outcome is unknown (a stock transaction or a publish that failed after
 * it may have reached the other side), claim_resolve asks the template's database, which gives
 * the attempt up unless it arrived (claimdb_void): given back, or completed. A coupon step
 * that failed is left to the check written with the stock (claim_unknown: 503, retry with the
 * same requestId). Before claim.lua, resv_touch names the template in the sweeper's index;
 * claim.lua records the reservation, and resv_done ends the record once it is complete.
 */
#include "claim.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claimbatch.h"
#include "claimdb.h"
#include "claimgate.h"
#include "claimq.h"
#include "events.h"
#include "hash.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "outbox.h"
#include "pgparam.h"
#include "query.h"
#include "regen.h"
#include "reqjob.h"
#include "resv.h"
#include "turnbatch.h"
#include "ucoupon.h"

typedef struct claim_settings {
    int64_t claim_wallet_check_ms; /* when the sync claim's wallet safety net is checked */
} claim_settings;

static claim_settings claim_cfg;

#define CLAIM_EVAL_MAX 64 /* claims in one claim.lua call: the script holds Redis while it runs */

/* A pending marker older than this, with no outcome, has its claim's record looked up
 * (result_reply). */
#define CLAIM_PENDING_CHECK_AFTER_MS 30000

typedef struct claim_job claim_job;

static struct {
    engine *e;
    redis_client *redis;
    claimbatch *batch;              /* the /redeem transactions, shared (claimbatch.h) */
    metrics_handle gate_lookups[2]; /* claim_gate_local: miss, hit */
    /* the claims of this loop turn waiting for claim.lua, sent together at its end (loop
     * thread only): requests arrive in bursts, and one call per template holds Redis for less
     * than one each */
    turnbatch *evals; /* of claim_job *, by template */
} claim_g;

/* One /redeem or /redeem-mq request, from the parse to the reply (reqjob.h); freed by the
 * reply. */
struct claim_job {
    reqjob rj; /* first: the request and the reply being prepared */
    int mq;    /* /redeem-mq */
    int64_t user, tpl, shop;
    int source;
    char request_id[CLAIM_REQUEST_ID_MAX + 1];
    char k_tpl[KEYS_LEN], k_user[KEYS_LEN], k_req[KEYS_LEN];
    resv_keys rk;        /* the reservation's record (resv.h) */
    int64_t repeat_ms;   /* REPEATED: the time of the reservation the request id made before */
    int took_over;       /* that reservation was orphaned and given up: this is a new attempt */
    int mq_waits;        /* /redeem-mq: the answers still awaited (claim_mq_joined) */
    int queued;          /* mq_publish took the message */
    qn_status published; /* the broker's confirm (QN_OK) or why not */
    int marked;          /* the pending marker is set: a give-back deletes it */
    int reloaded;
    int gate_missed;      /* claim_gate_local was asked and had no answer */
    uint64_t gate_serial; /* the copy that showed no stock without knowing it final, if any */
    int64_t now;
    long long count, hours;
    claimdb_item item;
    claimbatch_claim batch; /* its database step's, borrowed by claimbatch until done */
};

/* One /redeem-result request. */
typedef struct result_job {
    reqjob rj; /* first */
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

/* The steps, in the order they are defined below. */
static void claim_parse(http_req *req, int mq);
static void claim_on_touched(qn_status st, void *arg);
static void claim_eval(claim_job *j);
static void claim_on_eval(redis_client *c, const redisReply *r, const char *err, void *arg);
static void claim_on_loaded(qn_status st, const tpl *t, void *arg);
/* /redeem: the database, the wallet, the reply */
static void claim_write(claim_job *j);
static void claim_stock_written(qn_status st, void *arg);
static void claim_one_db_done(qn_status st, void *arg);
static void claim_stock_done(qn_status st, void *arg);
static void claim_coupon_done(qn_status st, void *arg);
static qn_status claim_work_give_back(pgpool_conn *c, void *arg);
static void claim_give_back_done(qn_status st, void *arg);
static void claim_resolve(claim_job *j);
static qn_status claim_work_resolve(pgpool_conn *c, void *arg);
static void claim_resolve_done(qn_status st, void *arg);
static void claim_db_outcome(claim_job *j, qn_status st);
static void claim_committed(claim_job *j);
static void claim_on_wallet(redis_client *c, const redisReply *r, const char *err, void *arg);
static void claim_reply_coupon(claim_job *j, int64_t coupon_id, long long count);
static qn_status claim_work_lookup(pgpool_conn *c, void *arg);
static void claim_lookup_done(qn_status st, void *arg);
static void claim_on_repeat_record(redis_client *c, const redisReply *r, const char *err,
                                   void *arg);
static int claim_orphaned(const claim_job *j);
static void claim_takeover(claim_job *j);
static void claim_takeover_done(qn_status st, void *arg);
static void claim_on_taken_back(redis_client *c, const redisReply *r, const char *err, void *arg);
/* /redeem-mq */
static void claim_publish(claim_job *j);
static void claim_on_published(qn_status st, void *arg);
static void claim_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg);
static void claim_mq_joined(claim_job *j);
static void claim_reply_accepted(claim_job *j);
/* /redeem-result */
static void result_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg);
static qn_status result_work_coupon(pgpool_conn *c, void *arg);
static void result_coupon_done(qn_status st, void *arg);
static qn_status result_work_failed_fn(pgpool_conn *c, void *arg);
static void result_failed_done(qn_status st, void *arg);
static void result_reply(result_job *j);
static void result_on_record(redis_client *c, const redisReply *r, const char *err, void *arg);
/* giving the reservation back */
static void claim_undo(claim_job *j, errcode e, const char *msg);
static void claim_unknown(claim_job *j);
static void claim_on_undone(redis_client *c, const redisReply *r, const char *err, void *arg);
static void claim_on_unmarked(redis_client *c, const redisReply *r, const char *err, void *arg);
/* helpers */
static qn_status result_work_failed(pgpool_conn *c, result_job *j);
static void claim_refuse(claim_job *j, const claim_refused *f);
static claimgate_result claim_gate_local(claim_job *j);

/* ---- the route handlers ---- */

static void claim_handle_sync(http_req *req, void *arg)
{
    (void)arg;
    claim_parse(req, 0);
}

static void claim_handle_mq(http_req *req, void *arg)
{
    (void)arg;
    claim_parse(req, 1);
}

static void result_handle(http_req *req, void *arg)
{
    (void)arg;
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
    j->user = req->user_id;
    snprintf(j->request_id, sizeof(j->request_id), "%s", rid);
    /* The marker first, then the database: the consumer writes the outcome before it deletes
     * the marker, so one of the two always tells. */
    char key[KEYS_LEN];
    keys_claim_pending(key, j->user, j->request_id);
    if (redis_command(claim_g.redis, result_on_pending, j, "GET %s", key) != QN_OK)
        result_on_pending(claim_g.redis, NULL, "cannot issue", j);
}

/* ---- parse, then the claim script ---- */

static void claim_parse(http_req *req, int mq)
{
    static const int sources[] = {0, 1, 2};
    const cJSON *body = http_body_json(req);
    jsonin_err err;
    const char *rid = NULL;
    claim_job *j = reqjob_new(req, sizeof(*j), NULL);
    if (!j)
        return;
    j->mq = mq;
    j->user = req->user_id;
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
    if (!regen_ok()) { /* Redis may have lost stock and counters: nothing is reserved */
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                           "claims are paused while the claim state is rebuilt; try again");
        return;
    }
    j->now = now_wall_ms();
    if (!rid) { /* before an id and keys are made: a sold-out sale refuses most claims here */
        const claim_refused *f = claim_refusal(claim_gate_local(j));
        if (f) {
            claim_refuse(j, f);
            return;
        }
        j->gate_missed = 1;
    }
    if (rid) {
        snprintf(j->request_id, sizeof(j->request_id), "%s", rid);
    } else {
        int64_t id;
        if (ids_next(service_ids(claim_g.e->svc), &id) != QN_OK) {
            reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "no id available; try again");
            return;
        }
        j->request_id[0] = 'g';
        log_i64_str(j->request_id + 1, id);
    }
    keys_template(j->k_tpl, j->tpl);
    keys_template_user(j->k_user, j->tpl, j->user);
    keys_template_req(j->k_req, j->tpl, j->user, j->request_id);
    resv_keys_of(&j->rk, j->tpl, j->user, j->request_id);
    if (mq && !mq_publisher_ready(service_publisher(claim_g.e->svc))) { /* no reserve-then-undo */
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                           "the claim queue is unavailable; try again");
        return;
    }
    resv_touch(j->tpl, j->shop, claim_on_touched, j);
}

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
    const tpl *t = query_copy_peek(j->tpl, &serial, &settled);
    claimgate_result r = CLAIMGATE_OK;
    if (t && t->shop_number == j->shop) {
        if (t->status != 0)
            r = CLAIMGATE_NOT_ACTIVE;
        else if (j->now < t->valid_start_ms || j->now > t->valid_end_ms)
            r = CLAIMGATE_OUTSIDE_WINDOW;
        else if (t->stock <= 0 && settled)
            r = CLAIMGATE_SOLD_OUT;
        else if (t->stock <= 0)
            j->gate_serial = serial;
    }
    metrics_series_add(
        metrics_handle_series(
            &claim_g.gate_lookups[r != CLAIMGATE_OK], METRIC_quan_rcopy_lookups_total,
            (const char *const[]){"claim_gate", r != CLAIMGATE_OK ? "hit" : "miss", NULL}),
        1);
    return r;
}

/* The sweeper knows where to look if this process dies holding the reservation. */
static void claim_on_touched(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st != QN_OK)
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "claim store unavailable");
    else
        claim_eval(j);
}

/* claim.lua for this claim, with the others of the loop turn (claim_eval_send). */
static void claim_eval(claim_job *j)
{
    j->now = now_wall_ms();
    claim_job **slot = turnbatch_add(claim_g.evals);
    if (!slot) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "out of memory");
        return;
    }
    *slot = j;
}

/* One claim.lua call answering several claims: its answers, in the claims' order. */
typedef struct claim_evals {
    size_t n;
    claim_job *jobs[CLAIM_EVAL_MAX];
} claim_evals;

static void claim_on_evals(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    claim_evals *b = arg;
    if (!err && (r->type != REDIS_REPLY_ARRAY || r->elements != b->n))
        err = r->type == REDIS_REPLY_ERROR ? r->str : "bad reply";
    for (size_t i = 0; i < b->n; i++)
        claim_on_eval(c, err ? NULL : r->element[i], err, b->jobs[i]);
    free(b);
}

/* turnbatch: the claims of a loop turn go by template. */
static uint64_t claim_template_hash(const void *x)
{
    return hash_mix64((uint64_t)(*(claim_job *const *)x)->tpl);
}

static int claim_same_template(const void *x, const void *y)
{
    return (*(claim_job *const *)x)->tpl == (*(claim_job *const *)y)->tpl;
}

/* jobs[0..n), claims of one template, in their order of arrival (turnbatch): one call of
 * claim.lua (its batch form when n > 1). A claim answered may wait again (a cache miss). */
static void claim_eval_send(void *items, size_t n, void *arg)
{
    (void)arg;
    claim_job **jobs = items;
    const char *keys[5 + 2 * (CLAIM_EVAL_MAX - 1)], *args[4 + 3 * (CLAIM_EVAL_MAX - 1)];
    char now[CLAIM_EVAL_MAX][24], shop[CLAIM_EVAL_MAX][24];
    int nk = 0, na = 0;
    claim_evals *b = NULL;
    for (size_t i = 0; i < n; i++) {
        claim_job *j = jobs[i];
        log_i64_str(now[i], j->now);
        log_i64_str(shop[i], j->shop);
        if (i == 0) {
            keys[nk++] = j->k_tpl, keys[nk++] = j->k_user, keys[nk++] = j->k_req;
            keys[nk++] = j->rk.set, keys[nk++] = j->rk.who;
            args[na++] = now[i], args[na++] = shop[i], args[na++] = j->rk.member;
            args[na++] = resv_owner();
        } else {
            keys[nk++] = j->k_user, keys[nk++] = j->k_req;
            args[na++] = now[i], args[na++] = shop[i], args[na++] = j->rk.member;
        }
    }
    metrics_inc(METRIC_quan_claim_gate_calls_total);
    metrics_add(METRIC_quan_claim_gate_claims_total, (int64_t)n);
    qn_status st = QN_ENOMEM;
    if (n == 1) {
        st = REDIS_EVAL_N(claim_g.redis, claim, nk, keys, na, args, claim_on_eval, jobs[0]);
    } else if ((b = malloc(sizeof(*b)))) {
        b->n = n;
        memcpy(b->jobs, jobs, n * sizeof(*jobs));
        st = REDIS_EVAL_N(claim_g.redis, claim, nk, keys, na, args, claim_on_evals, b);
    }
    if (st == QN_OK)
        return;
    free(b);
    for (size_t i = 0; i < n; i++)
        reqjob_reply_error(&jobs[i]->rj, ERRCODE_UNAVAILABLE, "claim store unavailable");
}

static void claim_on_eval(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    claim_job *j = arg;
    if (err || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        log_warn(&j->rj.req->log, "claim: claim.lua failed: %s", err ? err : "bad reply");
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "claim store unavailable");
        return;
    }
    long long code = r->element[0]->integer;
    j->count = r->element[1]->integer;
    switch (code) {
    case CLAIMGATE_OK:
        if (r->elements < 3 || r->element[2]->type != REDIS_REPLY_INTEGER) {
            claim_undo(j, ERRCODE_INTERNAL, "unexpected claim reply");
            return;
        }
        j->hours = r->element[2]->integer;
        if (j->mq)
            claim_publish(j);
        else
            claim_write(j);
        return;
    case CLAIMGATE_SOLD_OUT:
        /* Final: the copy that showed no stock may say so from now on (claim_gate_local). */
        if (j->gate_serial)
            query_copy_settled(j->tpl, j->gate_serial);
        /* fall through */
    case CLAIMGATE_LIMIT_REACHED:
    case CLAIMGATE_NOT_ACTIVE:
    case CLAIMGATE_OUTSIDE_WINDOW:
    case CLAIMGATE_OTHER_SHOP:
    case CLAIMGATE_STOCK_IN_DOUBT:
    case CLAIMGATE_LIMIT_IN_DOUBT:
        /* The next refusals of this template may be answered from its copy (claim_gate_local). */
        if (j->gate_missed && !j->gate_serial && code != CLAIMGATE_LIMIT_REACHED &&
            code != CLAIMGATE_OTHER_SHOP && code != CLAIMGATE_LIMIT_IN_DOUBT)
            query_copy_fill(j->shop, j->tpl);
        claim_refuse(j, claim_refusal((claimgate_result)code));
        return;
    case CLAIMGATE_CACHE_MISS:
        if (j->reloaded) {
            reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                               "template cache unavailable; try again");
        } else if (query_template(j->shop, j->tpl, claim_on_loaded, j) != QN_OK) {
            reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "template store unavailable");
        }
        return;
    case CLAIMGATE_REPEATED:
        /* the same request id claimed before: the same answer, no second claim */
        j->repeat_ms = r->elements >= 3 && r->element[2]->type == REDIS_REPLY_INTEGER
                           ? r->element[2]->integer
                           : 0;
        if (j->mq) {
            if (redis_command(claim_g.redis, claim_on_repeat_record, j, "ZSCORE %s %s", j->rk.set,
                              j->rk.member) != QN_OK)
                claim_reply_accepted(j);
        } else {
            reqjob_submit(&j->rj, service_pg(claim_g.e->svc, ucoupon_ds(j->user)),
                          claim_work_lookup, claim_lookup_done);
        }
        return;
    default:
        reqjob_reply_error(&j->rj, ERRCODE_INTERNAL, "unexpected claim result");
        return;
    }
}

/* The template was not in the cache: loaded (the query chain fills the cache), claim.lua once
 * more. */
static void claim_on_loaded(qn_status st, const tpl *t, void *arg)
{
    (void)t;
    claim_job *j = arg;
    if (st == QN_OK) {
        j->reloaded = 1;
        claim_eval(j);
    } else if (st == QN_ENOTFOUND) {
        reqjob_reply_error(&j->rj, ERRCODE_NOT_FOUND, "coupon template not found");
    } else if (st == QN_EBUSY) {
        reqjob_reply_error(&j->rj, ERRCODE_BUSY, "the template is being loaded; try again");
    } else {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "template store unavailable");
    }
}

/* ---- /redeem: the database steps ---- */

static void claim_write(claim_job *j)
{
    claimdb_item *it = &j->item;
    int64_t id;
    memset(it, 0, sizeof(*it));
    if (ids_next(service_ids(claim_g.e->svc), &id) != QN_OK) {
        claim_undo(j, ERRCODE_UNAVAILABLE, "no id available; try again");
        return;
    }
    ucoupon_claimed(&it->c, id, j->user, j->tpl, j->shop, j->source, UCOUPON_CH_CLAIM,
                    (int)j->count, j->now, j->hours, j->request_id);
    claimdb_route(it);
    j->batch = (claimbatch_claim){.item = it,
                                  .request_id = j->rj.request_id,
                                  .check_due_ms = now_wall_ms() + claim_cfg.claim_wallet_check_ms,
                                  .done = claim_stock_written,
                                  .arg = j};
    if (claimbatch_submit(claim_g.batch, CLAIMBATCH_STOCK, &j->batch) != QN_OK)
        claim_undo(j, ERRCODE_UNAVAILABLE, "database busy; nothing was taken");
}

/* The template's transaction (claimbatch.h) ended: with one database the coupon went with it. */
static void claim_stock_written(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (j->item.tpl_ds == j->item.user_ds)
        claim_one_db_done(st, j);
    else
        claim_stock_done(st, j);
}

static void claim_one_db_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st == QN_EUNKNOWN) {
        claim_resolve(j); /* committed with the answer lost, or not: ask */
        return;
    }
    if (st != QN_OK) { /* nothing was committed (pgpool_commit): given back at once */
        claim_undo(j, ERRCODE_UNAVAILABLE, "the claim could not be written; nothing was taken");
        return;
    }
    claim_db_outcome(j, st);
}

/* Two databases: the template's committed the stock with the check, so if this process dies
 * before the coupon's commit, the check completes the claim (or gives the stock back) later. */
static void claim_stock_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st == QN_EUNKNOWN) {
        claim_resolve(j);
        return;
    }
    if (st != QN_OK) {
        claim_undo(j, ERRCODE_UNAVAILABLE, "the claim could not be written; nothing was taken");
        return;
    }
    if (j->item.state != CLAIMDB_PENDING) {
        claim_db_outcome(j, st);
        return;
    }
    /* Then the user's: the coupon, in a transaction shared with the database's other coupons. */
    j->batch = (claimbatch_claim){.item = &j->item, .done = claim_coupon_done, .arg = j};
    if (claimbatch_submit(claim_g.batch, CLAIMBATCH_COUPON, &j->batch) != QN_OK) {
        j->item.state = CLAIMDB_FAILED;
        claim_coupon_done(QN_OK, j);
    }
}

static void claim_coupon_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st == QN_EUNKNOWN) {
        /* Rolled back or committed, we cannot tell: the stock's check (written with the stock)
         * completes the claim either way, so neither the stock nor the reservation goes back
         * here; it is made due now (resv_doubt). A retry with the same requestId answers the
         * coupon once it exists. */
        claim_unknown(j);
        return;
    }
    if (st != QN_OK) /* not written: the stock goes back in the template's database first */
        j->item.state = CLAIMDB_FAILED;
    if (j->item.state == CLAIMDB_FAILED || j->item.state == CLAIMDB_REFUSED_SLOT) {
        if (pgpool_submit(service_pg(claim_g.e->svc, j->item.tpl_ds), claim_work_give_back,
                          claim_give_back_done, j) != QN_OK)
            claim_give_back_done(QN_ERR, j);
        return;
    }
    claim_db_outcome(j, QN_OK);
}

/* And back to the template's when no coupon was written. */
static qn_status claim_work_give_back(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    if (pgpool_begin(c) != QN_OK || claimdb_give_back(c, j->item.tpl_ds, &j->item, 1) != QN_OK) {
        (void)pgpool_rollback(c);
        return QN_ERR;
    }
    return pgpool_commit(c);
}

static void claim_give_back_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st != QN_OK) {
        /* The ledger still holds the stock: the reservation stays, and the check completes
         * the claim (resv_doubt makes it due). Giving Redis back now would leave the database
         * a unit short of it. */
        log_warnf(&j->rj.req->log,
                  ((log_field[]){LOG_I("template", j->tpl), LOG_I("user", j->user), LOG_END}),
                  "claim: cannot give the database stock back; the claim's check completes it");
        claim_unknown(j);
        return;
    }
    claim_db_outcome(j, QN_OK);
}

/* A stock transaction failed: it may have committed all the same (the connection lost after
 * the COMMIT). The template's database says which, and gives the attempt up if it did not, so
 * that nothing of it can commit later. */
static void claim_resolve(claim_job *j)
{
    j->item.state = CLAIMDB_PENDING;
    if (pgpool_submit(service_pg(claim_g.e->svc, j->item.tpl_ds), claim_work_resolve,
                      claim_resolve_done, j) != QN_OK)
        claim_unknown(j);
}

static qn_status claim_work_resolve(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    return claimdb_void(c, j->item.tpl_ds, &j->item, 1);
}

static void claim_resolve_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st != QN_OK) {
        claim_unknown(j); /* asked again as soon as the database answers (resv_doubt) */
        return;
    }
    if (j->item.state == CLAIMDB_VOID) { /* nothing committed, and now nothing will */
        claim_undo(j, ERRCODE_UNAVAILABLE,
                   j->mq ? "the claim could not be queued; nothing was taken"
                         : "the claim could not be written; nothing was taken");
        return;
    }
    if (j->mq) { /* delivered after all, and written: the result tells which way */
        metrics_inc_l(METRIC_quan_claims_total, "success");
        resv_done(&j->rk);
        claim_reply_accepted(j);
        return;
    }
    /* The stock transaction committed. With one database the coupon went with it. */
    if (j->item.tpl_ds == j->item.user_ds) {
        j->item.state = CLAIMDB_NEW;
        claim_db_outcome(j, QN_OK);
    } else {
        claim_stock_done(QN_OK, j);
    }
}

/* The end of the database part: answer, giving the reservation back unless a coupon exists. */
static void claim_db_outcome(claim_job *j, qn_status st)
{
    const claim_refused *f;
    switch (st != QN_OK ? CLAIMDB_FAILED : j->item.state) {
    case CLAIMDB_NEW:
    case CLAIMDB_DUP:
        claim_committed(j);
        break;
    case CLAIMDB_REFUSED_STOCK: /* the database had none left: answered as sold out */
        f = claim_refusal(CLAIMGATE_SOLD_OUT);
        claim_undo(j, f->err, f->msg);
        break;
    case CLAIMDB_REFUSED_SLOT:
        claim_undo(j, ERRCODE_LIMIT, "the user already holds this coupon (receive count taken)");
        break;
    case CLAIMDB_VOID: /* the sweeper gave this attempt up, and its reservation back */
        metrics_inc_l(METRIC_quan_claims_total, "error");
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                           "the claim took too long and was given up; nothing was taken");
        break;
    default:
        claim_undo(j, ERRCODE_UNAVAILABLE, "the claim could not be written; nothing was taken");
        break;
    }
}

/* ---- /redeem: the wallet, then the reply ---- */

static void claim_committed(claim_job *j)
{
    char key[KEYS_LEN], member[UCOUPON_MEMBER_LEN], score[24];
    metrics_inc_l(METRIC_quan_claims_total, "success");
    resv_done(&j->rk);
    keys_wallet(key, j->user);
    ucoupon_member(member, j->tpl, j->item.c.id);
    snprintf(score, sizeof(score), "%" PRId64, j->item.c.receive_time_ms);
    if (redis_command(claim_g.redis, claim_on_wallet, j, "ZADD %s %s %s", key, score, member) !=
        QN_OK)
        claim_on_wallet(claim_g.redis, NULL, "cannot issue", j);
}

static void claim_on_wallet(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r;
    claim_job *j = arg;
    if (err) /* the outbox event adds it later */
        log_warn(&j->rj.req->log, "claim: wallet write failed (the safety net will add it): %s",
                 err);
    claim_reply_coupon(j, j->item.c.id, j->item.c.receive_count);
}

static void claim_reply_coupon(claim_job *j, int64_t coupon_id, long long count)
{
    cJSON *o = cJSON_CreateObject();
    if (o) {
        cJSON_AddItemToObject(o, "userCouponId", jsonin_id_to_json(coupon_id));
        cJSON_AddNumberToObject(o, "receiveCount", (double)count);
    }
    j->rj.data = o;
    reqjob_reply(&j->rj, QN_OK);
}

/* ---- /redeem: a repeated request id answers with the coupon it made ---- */

static qn_status claim_work_lookup(pgpool_conn *c, void *arg)
{
    claim_job *j = arg;
    return ucoupon_load_by_request(c, j->user, j->request_id, &j->item.c);
}

static void claim_lookup_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st == QN_OK)
        claim_reply_coupon(j, j->item.c.id, j->item.c.receive_count);
    else if (st == QN_ENOTFOUND && claim_orphaned(j))
        claim_takeover(j);
    else if (st == QN_ENOTFOUND)
        reqjob_reply_error(&j->rj, ERRCODE_AGAIN,
                           "a claim with this requestId is still in progress");
    else
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "database unavailable");
}

/* A repeated MQ request id: queued (the broker confirmed it: its reservation's record is
 * marked queued, or the consumer already ended it) answers 202 again; one whose first request
 * is gone before the confirm is taken over. The pending marker cannot tell these apart: it is
 * set while the publish is in flight (claim_publish). */
static void claim_on_repeat_record(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    claim_job *j = arg;
    int unqueued = !err && r && r->type == REDIS_REPLY_STRING &&
                   strtod(r->str, NULL) < (double)RESV_QUEUED_BASE; /* a score: maybe "1e+15" */
    if (unqueued && claim_orphaned(j))
        claim_takeover(j);
    else
        claim_reply_accepted(j);
}

/* The first request of this request id reserved and is gone (older than any request lives):
 * its process died, or its outcome was never learnt. Rather than "in progress" until the
 * sweeper comes, this request settles it now. */
static int claim_orphaned(const claim_job *j)
{
    return !j->took_over && j->repeat_ms > 0 &&
           now_wall_ms() - j->repeat_ms > claim_g.e->cfg->http_request_timeout_ms;
}

/* Asks the template's database to give that attempt up (claimdb_void, as the sweeper does). */
static void claim_takeover(claim_job *j)
{
    claimdb_item *it = &j->item;
    memset(it, 0, sizeof(*it));
    it->c.user_id = j->user;
    it->c.template_id = j->tpl;
    it->c.shop_number = j->shop;
    it->c.receive_time_ms = j->repeat_ms;
    snprintf(it->c.request_id, sizeof(it->c.request_id), "%s", j->request_id);
    claimdb_route(it);
    j->took_over = 1;
    if (pgpool_submit(service_pg(claim_g.e->svc, it->tpl_ds), claim_work_resolve,
                      claim_takeover_done, j) != QN_OK)
        reqjob_reply_error(&j->rj, ERRCODE_AGAIN,
                           "a claim with this requestId is still in progress");
}

static void claim_takeover_done(qn_status st, void *arg)
{
    claim_job *j = arg;
    if (st == QN_OK && j->item.state == CLAIMDB_VOID) {
        /* given up: its reservation back (once, by the marker), then a new attempt */
        const char *keys[5] = {j->k_tpl, j->k_user, j->k_req, j->rk.set, j->rk.who};
        const char *args[1] = {j->rk.member};
        if (REDIS_EVAL(claim_g.redis, claim_undo, keys, args, claim_on_taken_back, j) != QN_OK)
            reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "claim store unavailable");
        return;
    }
    if (st == QN_OK && j->mq) { /* it reached the database: the consumer wrote it */
        claim_reply_accepted(j);
        return;
    }
    if (st == QN_OK) { /* its stock was taken: the coupon is there or its check completes it */
        reqjob_submit(&j->rj, service_pg(claim_g.e->svc, ucoupon_ds(j->user)), claim_work_lookup,
                      claim_lookup_done);
        return;
    }
    reqjob_reply_error(&j->rj, ERRCODE_AGAIN, "a claim with this requestId is still in progress");
}

static void claim_on_taken_back(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    claim_job *j = arg;
    if (err || !r || r->type != REDIS_REPLY_INTEGER) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE, "claim store unavailable");
        return;
    }
    claim_eval(j);
}

/* ---- /redeem-mq: publish with confirm and the pending marker together, then 202 ---- */

static void claim_publish(claim_job *j)
{
    char data[CLAIMQ_CLAIM_JSON], key[CLAIMQ_ATTEMPT_KEY], pending[KEYS_LEN];
    ucoupon *u = &j->item.c;
    int64_t id;
    if (ids_next(service_ids(claim_g.e->svc), &id) != QN_OK) {
        claim_undo(j, ERRCODE_UNAVAILABLE, "no id available; try again");
        return;
    }
    memset(&j->item, 0, sizeof(j->item));
    ucoupon_claimed(u, id, j->user, j->tpl, j->shop, j->source, UCOUPON_CH_MQ, (int)j->count,
                    j->now, j->hours, j->request_id);
    claimdb_route(&j->item); /* for claim_resolve, if the broker's answer is lost */
    claimq_claim_json(data, u, 0);
    claimq_attempt_key(key, sizeof(key), u, 0);
    mq_msg m = {.routing_key = EVENT_COUPON_REDEEM,
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
     * claim is given back, the marker goes with it (claim_undo, or the sweeper's give-back). */
    j->mq_waits = 1; /* this function's own share, released at its end */
    keys_claim_pending(pending, j->user, j->request_id);
    /* It names the attempt (template, reservation time): a result query that finds the marker
     * but no record and no outcome knows the marker outlived its claim (result_on_record). */
    if (redis_command(claim_g.redis, claim_on_pending, j, "SET %s %lld:%lld PX %d", pending,
                      (long long)j->tpl, (long long)j->now, CLAIM_PENDING_TTL_MS) == QN_OK)
        j->mq_waits++;
    else
        log_warn(&j->rj.req->log, "claim: cannot mark the claim pending: cannot issue");
    j->queued = mq_publish(service_publisher(claim_g.e->svc), &m, claim_on_published, j) == QN_OK;
    j->mq_waits += j->queued;
    claim_mq_joined(j);
}

static void claim_on_published(qn_status st, void *arg)
{
    claim_job *j = arg;
    j->published = st;
    if (st == QN_OK) {
        metrics_inc_l(METRIC_quan_claims_total, "success");
        resv_queued(&j->rk, j->now); /* the broker has it: the consumer ends it */
    }
    claim_mq_joined(j);
}

static void claim_on_pending(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r;
    claim_job *j = arg;
    if (err) /* the claim goes on all the same; its result reads 404 until it is written */
        log_warn(&j->rj.req->log, "claim: cannot mark the claim pending: %s", err);
    j->marked = !err;
    claim_mq_joined(j);
}

/* Both answers are in (the marker's first, so that a give-back's DEL comes after its SET). */
static void claim_mq_joined(claim_job *j)
{
    if (--j->mq_waits > 0)
        return;
    if (!j->queued) {
        claim_undo(j, ERRCODE_UNAVAILABLE, "the claim queue is full; nothing was taken");
        return;
    }
    if (j->published != QN_OK) {
        /* Nacked, or the connection lost after sending: the broker may deliver it all the
         * same. The database decides before anything is given back. */
        log_warnf(&j->rj.req->log,
                  ((log_field[]){LOG_S("status", qn_status_str(j->published)), LOG_END}),
                  "claim: publish not confirmed; resolving the claim in the database");
        claim_resolve(j);
        return;
    }
    claim_reply_accepted(j);
}

/* 202 {requestId}: the claim is queued (or was, for a retried request id). */
static void claim_reply_accepted(claim_job *j)
{
    cJSON *o = cJSON_CreateObject();
    if (o)
        cJSON_AddStringToObject(o, "requestId", j->request_id);
    j->rj.status = 202;
    j->rj.data = o;
    reqjob_reply(&j->rj, QN_OK);
}

/* ---- /redeem-result: the pending marker, the coupon, the FAILED row ---- */

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
    reqjob_submit(&j->rj, service_pg(claim_g.e->svc, ucoupon_ds(j->user)), result_work_coupon,
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
    reqjob_submit(&j->rj, service_pg(claim_g.e->svc, 0), result_work_failed_fn, result_failed_done);
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
        resv_keys k;
        resv_keys_of(&k, j->marker_tpl, j->user, j->request_id);
        if (redis_command(claim_g.redis, result_on_record, j, "ZSCORE %s %s", k.set, k.member) ==
            QN_OK)
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
        if (REDIS_EVAL(claim_g.redis, lock_release, keys, args, claim_on_unmarked, NULL) != QN_OK)
            claim_on_unmarked(claim_g.redis, NULL, "cannot issue", NULL);
    }
    result_reply(j);
}

/* ---- giving the reservation back ---- */

/* Gives the Redis reservation back (once: the marker), then answers the error. */
static void claim_undo(claim_job *j, errcode e, const char *msg)
{
    const char *keys[5] = {j->k_tpl, j->k_user, j->k_req, j->rk.set, j->rk.who};
    const char *args[1] = {j->rk.member};
    reqjob_fail(&j->rj, e, "%s", msg); /* answered once given back */
    metrics_inc_l(METRIC_quan_claims_total, "error");
    if (j->marked) { /* no longer pending: no coupon will come of it */
        char key[KEYS_LEN];
        keys_claim_pending(key, j->user, j->request_id);
        if (redis_command(claim_g.redis, claim_on_unmarked, NULL, "DEL %s", key) != QN_OK)
            claim_on_unmarked(claim_g.redis, NULL, "cannot issue", NULL);
        j->marked = 0;
    }
    if (REDIS_EVAL(claim_g.redis, claim_undo, keys, args, claim_on_undone, j) != QN_OK)
        claim_on_undone(claim_g.redis, NULL, "cannot issue", j);
}

/* The job may be gone by now (answered once given back): nothing of it is used. */
static void claim_on_unmarked(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (err) /* its result reads PENDING until a query finds the claim ended (result_on_record) */
        log_warnf(NULL, ((log_field[]){LOG_S("error", err), LOG_END}),
                  "claim: cannot clear the pending marker of a claim given back");
}

static void claim_on_undone(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r;
    claim_job *j = arg;
    if (err)
        log_errorf(&j->rj.req->log,
                   ((log_field[]){LOG_I("template", j->tpl), LOG_I("user", j->user),
                                  LOG_S("error", err), LOG_END}),
                   "claim: cannot give the reservation back");
    reqjob_reply(&j->rj, QN_OK);
}

/* The claim's outcome is not known yet: its reservation stays, in doubt, and this process
 * settles it as soon as the database answers (resv_doubt). The same requestId tells later;
 * without one, the user's next claim hears "in doubt" (429) until then. */
static void claim_unknown(claim_job *j)
{
    metrics_inc_l(METRIC_quan_claims_total, "error");
    resv_doubt(&j->item, j->mq);
    reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                       "the claim's outcome is not known yet; retry with the same requestId");
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
                              "AND request_id = $2 AND status = 2",
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

/* Answers a refusal of the claim gate: nothing was reserved, nothing to give back. */
static void claim_refuse(claim_job *j, const claim_refused *f)
{
    if (f->outcome)
        metrics_inc_l(METRIC_quan_claims_total, f->outcome);
    reqjob_reply_error(&j->rj, f->err, "%s", f->msg);
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
    engine *e = engine_of(s);
    claim_g.e = e;
    claim_g.redis = service_redis(s);
    *state = &claim_g;
    claim_g.evals = turnbatch_new(service_base(s), sizeof(claim_job *), CLAIM_EVAL_MAX,
                                  claim_template_hash, claim_same_template, claim_eval_send, NULL);
    return (claim_g.batch = claimbatch_new(s)) && claim_g.evals ? QN_OK : QN_ENOMEM;
}

static void claim_free(void *arg)
{
    (void)arg;
    claimbatch_free(claim_g.batch);
    claim_g.batch = NULL;
    turnbatch_free(claim_g.evals); /* the requests are gone with the loop */
    claim_g.evals = NULL;
}

static const config_var claim_vars[] = {
    {"QUAN_CLAIM_WALLET_CHECK_MS", CONFIG_INT, offsetof(claim_settings, claim_wallet_check_ms),
     "30000", 0, 86400000, NULL, 0,
     "after a sync claim or exchange, when its outbox check completes or undoes it if half-done"},
};

int64_t claim_wallet_check_ms(void)
{
    return claim_cfg.claim_wallet_check_ms;
}

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
    .start = claim_start,
    .free = claim_free,
};
