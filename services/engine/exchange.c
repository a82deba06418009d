/* Exchange-code redemption (see exchange.h). */
#include "exchange.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "claim.h"
#include "claimdb.h"
#include "claimgate.h"
#include "claimq.h"
#include "excode.h"
#include "jsonin.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "outbox.h"
#include "pgbatch.h"
#include "pgparam.h"
#include "query.h"
#include "regen.h"
#include "reqjob.h"
#include "resv.h"
#include "ucoupon.h"

#define EXCHANGE_LOCK_LEASE_MS 30000
#define EXCHANGE_ACQUIRE_MS    2000
#define EXCHANGE_MARKER_PREFIX CLAIMQ_EXCODE_PREFIX
/* Redemptions written in one transaction, each inside its own savepoint: at most 32, so that
 * a backend's subtransactions stay within PostgreSQL's cache of 64 (beyond it every snapshot
 * taken on the server gets slower). */
#define EXCHANGE_BATCH_MAX 32
#define EXCHANGE_WAIT_MAX  4096 /* redemptions waiting for a transaction; beyond, 503 at once */
/* Transactions of redemptions in flight per process: a redemption goes at once while fewer are
 * (alone, when nothing waits), so one slow transaction does not hold the others up; the rest
 * wait and share the next. Each holds a connection of ds_0's pool (QUAN_PG_POOL_SIZE, 4 by
 * default), and may borrow one of ds_1's: two leave room for the other work of the pools. */
#define EXCHANGE_INFLIGHT_MAX 2

typedef struct exchange_settings {
    const char *code_secret;
} exchange_settings;

static exchange_settings exchange_cfg;

typedef struct exchange_job exchange_job;

static struct {
    service *svc;
    query *query;
    resv *resv;
    regen *regen;
    /* Group commit (pgbatch.h): redemptions that reach the database step while
     * EXCHANGE_INFLIGHT_MAX transactions of them are in flight wait, and go together in the
     * next. One group: the transactions are ds_0's, whatever the templates. */
    pgbatch *batch;
} exchange_g;

/* One /exchange request, from the parse to the reply (reqjob.h); freed by the reply. */
struct exchange_job {
    reqjob rj; /* first: the request and the reply being prepared */
    int64_t user;
    char code[EXCODE_LEN + 1];
    char marker[UCOUPON_REQUEST_ID_MAX + 1]; /* "excode:<code>": claim marker and request id */
    lock_handle *lock;
    /* the code row */
    int found, code_status;
    int64_t tpl, shop, code_user;
    /* the claim */
    int64_t now, count, hours, tpl_end;
    int cache_retried, reserved;
    char k_tpl[KEYS_LEN], k_user[KEYS_LEN], k_req[KEYS_LEN];
    resv_keys rk; /* the reservation's record (resv.h) */
    int db_void;  /* the sweeper gave this attempt up (and its reservation back) */
    claimdb_item item;
    const claim_refused *db_refused; /* the database step refused the redemption: why */
    const char *outcome; /* quan_exchange_total's label of the error reply set to answer */
    /* the shared transaction */
    qn_status db_st; /* this redemption's own outcome in it */
    int alone;       /* nothing of it written (its savepoint rolled back, or never run): its
                        db_st stands, however the commit ends */
    int used_ds1;    /* part of it went to ds_1's transaction */
};

/* Code redeemed already: found so by the code row (step 3) or by the conditional update. */
static const claim_refused exchange_used = {ERRCODE_STATE,
                                            "this exchange code has already been used", "used"};

static redis_client *exchange_redis(void)
{
    return service_redis(exchange_g.svc);
}

/* ---------------------------------------------------------------- the end of a job */

/* The job's clear hook: the user's lock goes when the job does, whichever way it ends. */
static void exchange_clear(reqjob *rj)
{
    exchange_job *j = (exchange_job *)rj;
    if (j->lock)
        lock_release(j->lock, NULL, NULL);
}

/* Counts the error reply set on j under j->outcome, answers it, frees j. */
static void exchange_end_failed(exchange_job *j)
{
    metrics_inc_l(METRIC_quan_exchange_total, j->outcome);
    reqjob_reply(&j->rj, QN_OK);
}

static void exchange_fail(exchange_job *j, const char *outcome, errcode e, const char *msg)
{
    j->outcome = outcome;
    reqjob_fail(&j->rj, e, "%s", msg);
    exchange_end_failed(j);
}

static void exchange_refuse(exchange_job *j, const claim_refused *f)
{
    exchange_fail(j, f->outcome, f->err, f->msg);
}

static void exchange_on_undone(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    exchange_job *j = arg;
    (void)c;
    (void)r;
    if (err)
        log_error(&j->rj.req->log, "exchange: reservation not given back: %s", err);
    exchange_end_failed(j);
}

/* Gives the Redis reservation back (exactly once, through the marker), then fails. */
static void exchange_undo_fail(exchange_job *j, const char *outcome, errcode e, const char *msg)
{
    const char *keys[5] = {j->k_tpl, j->k_user, j->k_req, j->rk.set, j->rk.who};
    const char *args[1] = {j->rk.member};

    if (!j->reserved) {
        exchange_fail(j, outcome, e, msg);
        return;
    }
    j->outcome = outcome;
    reqjob_fail(&j->rj, e, "%s", msg); /* answered once given back */
    if (REDIS_EVAL(exchange_redis(), claim_undo, keys, args, exchange_on_undone, j) != QN_OK)
        exchange_on_undone(exchange_redis(), NULL, "cannot issue", j);
}

/* ---------------------------------------------------------------- step 5: the database */

/* A redemption refused after its code was marked: in the same transaction the code is usable
 * again and its check (written just before, so no relay holds it) is withdrawn. */
static qn_status exchange_unmark_code(pgpool_conn *c0, const exchange_job *j)
{
    char key[CLAIMQ_ATTEMPT_KEY];
    if (claimdb_free_code(c0, j->code, &j->item.c, NULL) != QN_OK)
        return QN_ERR;
    claimq_attempt_key(key, sizeof(key), &j->item.c, 1);
    return outbox_cancel(c0, key, NULL);
}

/* The stock and coupon steps of the redemptions pend[0..m) (their codes marked), all at once
 * on the connections of their databases: one ledger insert and one stock UPDATE per template,
 * one coupon insert per database, as /redeem's shared transactions do (one UPDATE of the
 * template's row per redemption cost PostgreSQL more than all the rest of it). Sets db_refused
 * (answered as the claim gate's sold out and limit) or db_void on the ones refused, whose
 * codes are unmarked. QN_ERR on a database error. */
static qn_status exchange_claim_steps(pgpool_conn *conns[2], exchange_job **pend, size_t m)
{
    claimdb_item *items = calloc(m ? m : 1, sizeof(*items));
    qn_status st = QN_ENOMEM;

    if (!items)
        return st;
    for (size_t k = 0; k < m; k++)
        items[k] = pend[k]->item;
    st = QN_ERR;
    for (int ds = 0; ds < 2; ds++)
        if (conns[ds] && claimdb_take_stock(conns[ds], ds, items, m) != QN_OK)
            goto out;
    for (int ds = 0; ds < 2; ds++)
        if (conns[ds] && claimdb_insert_coupons(conns[ds], ds, items, m) != QN_OK)
            goto out;
    for (int ds = 0; ds < 2; ds++) /* the stock of a taken receive-count slot goes back */
        if (conns[ds] && claimdb_give_back(conns[ds], ds, items, m) != QN_OK)
            goto out;
    for (size_t k = 0; k < m; k++) {
        exchange_job *j = pend[k];
        j->item = items[k];
        if (items[k].state == CLAIMDB_VOID)
            j->db_void = 1;
        else if (items[k].state == CLAIMDB_REFUSED_STOCK)
            j->db_refused = claim_refusal(CLAIMGATE_SOLD_OUT);
        else if (items[k].state == CLAIMDB_REFUSED_SLOT)
            j->db_refused = claim_refusal(CLAIMGATE_LIMIT_REACHED);
        if ((j->db_void || j->db_refused) && exchange_unmark_code(conns[0], j) != QN_OK)
            goto out;
    }
    st = QN_OK;
out:
    free(items);
    return st;
}

/* One redemption's own statements in ds_0: the code first (of two users racing one code, the
 * second waits on this row and then finds it redeemed: db_refused), then the safety net
 * (claimq.h), which commits with the code in ds_0, committed first: if this process dies before
 * ds_1's commit, it completes the redemption later. QN_ERR on a database error. */
static qn_status exchange_redeem_steps(pgpool_conn *c0, exchange_job *j)
{
    claimdb_item *it = &j->item;
    int marked = 0;

    if (claimdb_mark_code(c0, j->code, &it->c, &marked) != QN_OK)
        return QN_ERR;
    if (!marked) {
        j->db_refused = &exchange_used;
        return QN_OK;
    }
    return claimq_add_check(c0, &it->c, j->rj.request_id, now_wall_ms() + claim_wallet_check_ms());
}

/* Rows are locked in this order (template, then code) by every process, so that two batches
 * never wait on each other's rows in a cycle. */
static int exchange_job_cmp(const void *a, const void *b)
{
    const exchange_job *x = *(exchange_job *const *)a, *y = *(exchange_job *const *)b;
    if (x->tpl != y->tpl)
        return x->tpl < y->tpl ? -1 : 1;
    return strcmp(x->code, y->code);
}

/* Worker of ds_0: the batch's redemptions in one transaction of ds_0 (the codes, their checks,
 * and the templates' or the coupons' parts that live there) and one of ds_1 (the rest), ds_0
 * committed first. Each code is marked inside its own savepoint: a code another user took first,
 * or an error of that redemption's own, rolls it back alone (db_st and `alone` say so); the
 * stock and coupon steps then run once for all the others. Returns QN_OK when the commits were
 * reached (each job's outcome in db_st; QN_EUNKNOWN for those with a part in ds_1 when only
 * ds_1's commit failed: ds_0's part is in, and the check completes the rest); otherwise the
 * batch's status, for every job not rolled back alone: QN_EUNKNOWN when ds_0 may have
 * committed, any other failure when nothing committed (never QN_EBUSY or QN_ENOMEM: pgbatch.h). */
static qn_status exchange_batch_work(pgpool_conn *c0, void *const *items, size_t n, void *arg)
{
    exchange_job *jobs[EXCHANGE_BATCH_MAX], *pend[EXCHANGE_BATCH_MAX];
    pgpool_conn *conns[2] = {c0, NULL};
    qn_status st = QN_ERR;
    size_t m = 0;
    int ds1_down = 0; /* tried once: the batch's other redemptions needing it do not wait again */

    (void)arg;
    memcpy(jobs, items, n * sizeof(jobs[0]));
    qsort(jobs, n, sizeof(jobs[0]), exchange_job_cmp);
    if (pgpool_begin(c0) != QN_OK)
        goto done;
    for (size_t k = 0; k < n; k++) {
        exchange_job *j = jobs[k];
        if ((j->item.tpl_ds == 1 || j->item.user_ds == 1) && !conns[1]) {
            if (!ds1_down)
                conns[1] = pgpool_acquire(service_pg(exchange_g.svc, 1), EXCHANGE_ACQUIRE_MS);
            if (conns[1] && pgpool_begin(conns[1]) != QN_OK) {
                pgpool_release(conns[1]);
                conns[1] = NULL;
            }
            if (!conns[1]) { /* ds_1 unreachable: only the redemptions needing it fail */
                ds1_down = 1;
                j->db_st = QN_ERR;
                j->alone = 1;
                continue;
            }
        }
        if (pgpool_exec_cmd(c0, "SAVEPOINT x", 0, NULL, NULL) != QN_OK)
            goto done;
        j->db_st = exchange_redeem_steps(c0, j);
        if (j->db_st != QN_OK || j->db_refused) {
            /* Nothing of it stays; a transaction an error aborted is usable again after this.
             * When even that fails, the connection is gone: the whole batch goes. */
            if (pgpool_exec_cmd(c0, "ROLLBACK TO SAVEPOINT x", 0, NULL, NULL) != QN_OK)
                goto done;
            j->alone = 1;
            continue;
        }
        pend[m++] = j;
    }
    if (exchange_claim_steps(conns, pend, m) != QN_OK)
        goto done;
    for (size_t k = 0; k < m; k++)
        pend[k]->used_ds1 = !pend[k]->db_refused && !pend[k]->db_void &&
                            (pend[k]->item.tpl_ds == 1 || pend[k]->item.user_ds == 1);
    if ((st = pgpool_commit(c0)) != QN_OK)
        goto done;
    if (conns[1] && pgpool_commit(conns[1]) != QN_OK)
        for (size_t k = 0; k < m; k++)
            if (pend[k]->used_ds1)
                pend[k]->db_st = QN_EUNKNOWN;
done:
    if (st != QN_OK) {
        (void)pgpool_rollback(c0);
        if (conns[1])
            (void)pgpool_rollback(conns[1]);
    }
    if (conns[1])
        pgpool_release(conns[1]);
    return st;
}

static void exchange_on_wallet(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    exchange_job *j = arg;
    cJSON *o = cJSON_CreateObject();
    (void)c;
    (void)r;
    if (err)
        log_warn(&j->rj.req->log, "exchange: wallet write failed: %s", err);
    if (o)
        cJSON_AddItemToObject(o, "userCouponId", jsonin_id_to_json(j->item.c.id));
    metrics_inc_l(METRIC_quan_exchange_total, "success");
    j->rj.data = o;
    reqjob_reply(&j->rj, QN_OK);
}

static void exchange_db_done(qn_status st, void *arg)
{
    exchange_job *j = arg;
    char key[KEYS_LEN], member[UCOUPON_MEMBER_LEN], score[24];

    if (st == QN_EUNKNOWN) { /* the reservation stays in doubt, settled once ds_0 answers */
        j->reserved = 0;
        resv_doubt(exchange_g.resv, &j->item, 0);
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE,
                      "the redemption's outcome is not known yet; try again shortly");
        return;
    }
    if (st != QN_OK) {
        exchange_undo_fail(j, "error", ERRCODE_UNAVAILABLE,
                           "the redemption could not be written; nothing was taken");
        return;
    }
    if (j->db_void) { /* given back by the sweeper already */
        j->reserved = 0;
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE,
                      "the redemption took too long and was given up; nothing was taken");
        return;
    }
    if (j->db_refused) {
        exchange_undo_fail(j, j->db_refused->outcome, j->db_refused->err, j->db_refused->msg);
        return;
    }
    /* Committed: the reservation is now a coupon. */
    j->reserved = 0;
    resv_done(exchange_g.resv, &j->rk);
    keys_wallet(key, j->user);
    ucoupon_member(member, j->tpl, j->item.c.id);
    snprintf(score, sizeof(score), "%" PRId64, j->item.c.receive_time_ms);
    if (redis_command(exchange_redis(), exchange_on_wallet, j, "ZADD %s %s %s", key, score,
                      member) != QN_OK)
        exchange_on_wallet(exchange_redis(), NULL, "cannot issue", j);
}

/* Each redemption of the batch goes on as if written alone (pgbatch has handed the next batch
 * to the pool already). */
static void exchange_batch_done(qn_status st, void *const *items, size_t n, void *arg)
{
    (void)arg;
    if (st == QN_EBUSY || st == QN_ENOMEM) { /* the pool refused it: nothing ran */
        for (size_t k = 0; k < n; k++)
            exchange_undo_fail(items[k], "error", ERRCODE_UNAVAILABLE,
                               "database busy; nothing was taken");
        return;
    }
    metrics_inc_l(METRIC_quan_claim_transactions_total, "exchange");
    metrics_add_l(METRIC_quan_claim_transaction_claims_total, (int64_t)n, "exchange");
    for (size_t k = 0; k < n; k++) {
        exchange_job *j = items[k];
        exchange_db_done(st == QN_OK || j->alone ? j->db_st : st, j);
    }
}

static void exchange_write(exchange_job *j)
{
    claimdb_item *it = &j->item;
    int64_t id;

    memset(it, 0, sizeof(*it));
    if (ids_next(service_ids(exchange_g.svc), &id) != QN_OK) {
        exchange_undo_fail(j, "error", ERRCODE_UNAVAILABLE, "no id available; try again");
        return;
    }
    /* source 2, shop: the merchant issued the codes */
    ucoupon_claimed(&it->c, id, j->user, j->tpl, j->shop, 2, UCOUPON_CH_CODE, (int)j->count, j->now,
                    j->hours, j->marker);
    claimdb_route(it);
    if (pgbatch_submit(exchange_g.batch, service_pg(exchange_g.svc, 0), 0, j) != QN_OK)
        exchange_undo_fail(j, "error", ERRCODE_UNAVAILABLE, "database busy; nothing was taken");
}

/* ---------------------------------------------------------------- step 4: the claim gate */

static void exchange_claim(exchange_job *j);

static void exchange_on_template(qn_status st, const tpl *t, void *arg)
{
    exchange_job *j = arg;
    if (st == QN_OK)
        j->hours = t->validity_hours > 0 ? t->validity_hours : 24;
    if (st == QN_ENOTFOUND)
        exchange_fail(j, "not_found", ERRCODE_NOT_FOUND, "the code's coupon template is gone");
    else if (st == QN_EBUSY)
        exchange_fail(j, "busy", ERRCODE_BUSY, "busy; try again");
    else if (st != QN_OK)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "template unavailable");
    else
        exchange_claim(j);
}

static void exchange_on_repeated(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    exchange_job *j = arg;
    (void)c;
    if (err || !r || r->type == REDIS_REPLY_ERROR) {
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
    } else if (r->type != REDIS_REPLY_NIL) {
        exchange_fail(j, "in_doubt", ERRCODE_AGAIN,
                      "an earlier redemption of this code is still being settled; try again "
                      "shortly");
    } else {
        j->reserved = 1;
        exchange_write(j);
    }
}

static void exchange_on_claimed(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    exchange_job *j = arg;
    long long res;
    (void)c;

    if (err || !r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        log_warn(&j->rj.req->log, "exchange: claim.lua failed: %s", err ? err : "bad reply");
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
        return;
    }
    res = r->element[0]->integer;
    j->count = r->element[1]->integer;
    switch (res) {
    case CLAIMGATE_OK:
        if (r->elements < 4 || r->element[2]->type != REDIS_REPLY_INTEGER ||
            r->element[3]->type != REDIS_REPLY_INTEGER) {
            j->reserved = 1;
            exchange_undo_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
            return;
        }
        j->hours = r->element[2]->integer;
        j->tpl_end = r->element[3]->integer;
        j->reserved = 1;
        exchange_write(j);
        return;
    case CLAIMGATE_REPEATED:
        /* An earlier attempt of this user with this code reserved and did not finish (the code
         * is still unused, or we would not be here). While its record is open it is in doubt,
         * and whoever settles it must not meet this request writing it; once settled without
         * a give-back, it is finished here with that reservation, under its time, which names
         * it in the database. */
        if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_INTEGER &&
            r->element[2]->integer > 0)
            j->now = r->element[2]->integer;
        if (redis_command(exchange_redis(), exchange_on_repeated, j, "ZSCORE %s %s", j->rk.set,
                          j->rk.member) != QN_OK)
            exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
        return;
    case CLAIMGATE_SOLD_OUT:
    case CLAIMGATE_LIMIT_REACHED:
    case CLAIMGATE_NOT_ACTIVE:
    case CLAIMGATE_OUTSIDE_WINDOW:
    case CLAIMGATE_STOCK_IN_DOUBT:
    case CLAIMGATE_LIMIT_IN_DOUBT:
        exchange_refuse(j, claim_refusal((claimgate_result)res)); /* as a claim's */
        return;
    case CLAIMGATE_CACHE_MISS:
        if (!j->cache_retried) {
            j->cache_retried = 1;
            if (query_template(exchange_g.query, j->shop, j->tpl, exchange_on_template, j) == QN_OK)
                return;
        }
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "template cache unavailable");
        return;
    case CLAIMGATE_OTHER_SHOP:
        /* Not a claim's "coupon template not found": the code row named that template, so the
         * user is told about the code, as for an unknown one. */
    default:
        exchange_fail(j, "not_found", ERRCODE_NOT_FOUND, "no such exchange code");
        return;
    }
}

static void exchange_on_touched(qn_status st, void *arg)
{
    exchange_job *j = arg;
    const char *keys[5] = {j->k_tpl, j->k_user, j->k_req, j->rk.set, j->rk.who};
    char now[24], shop[24];
    const char *args[4] = {now, shop, j->rk.member, resv_owner(exchange_g.resv)};

    if (st != QN_OK) {
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
        return;
    }
    j->now = now_wall_ms();
    snprintf(now, sizeof(now), "%" PRId64, j->now);
    snprintf(shop, sizeof(shop), "%" PRId64, j->shop);
    if (REDIS_EVAL(exchange_redis(), claim, keys, args, exchange_on_claimed, j) != QN_OK)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
}

/* The sweeper knows where to look (resv.h), then claim.lua. */
static void exchange_claim(exchange_job *j)
{
    /* Redis may have lost stock and counters: nothing is reserved */
    if (!regen_ok(exchange_g.regen)) {
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE,
                      "redemptions are paused while the claim state is rebuilt; try again");
        return;
    }
    resv_touch(exchange_g.resv, j->tpl, j->shop, exchange_on_touched, j);
}

/* ---------------------------------------------------------------- step 3: the code row */

static qn_status exchange_find_work(pgpool_conn *c, void *arg)
{
    exchange_job *j = arg;
    pgparam p = {0};
    pgparam_str(&p, j->code);
    PGresult *res = pgpool_exec(c,
                                "SELECT coupon_template_id, shop_number, status, "
                                "coalesce(user_id, 0) FROM t_exchange_code WHERE code = $1",
                                p.n, p.v);
    if (!res)
        return QN_ERR;
    if (PQntuples(res) == 1) {
        j->found = 1;
        j->tpl = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        j->shop = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        j->code_status = atoi(PQgetvalue(res, 0, 2));
        j->code_user = strtoll(PQgetvalue(res, 0, 3), NULL, 10);
    }
    PQclear(res);
    return QN_OK;
}

/* The code is redeemed by this user: "used" is final once the redemption is settled (its
 * coupon committed, or completed by its check); while its reservation is open it is in doubt. */
static void exchange_on_own_used(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    exchange_job *j = arg;
    (void)c;
    if (err || !r || r->type == REDIS_REPLY_ERROR)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
    else if (r->type != REDIS_REPLY_NIL)
        exchange_fail(j, "in_doubt", ERRCODE_AGAIN,
                      "this code's redemption is still being completed; try again shortly");
    else
        exchange_refuse(j, &exchange_used);
}

static void exchange_find_done(qn_status st, void *arg)
{
    exchange_job *j = arg;

    if (st != QN_OK) {
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "database unavailable");
        return;
    }
    if (!j->found) {
        exchange_fail(j, "not_found", ERRCODE_NOT_FOUND, "no such exchange code");
        return;
    }
    keys_template(j->k_tpl, j->tpl);
    keys_template_user(j->k_user, j->tpl, j->user);
    keys_template_req(j->k_req, j->tpl, j->user, j->marker);
    resv_keys_of(&j->rk, j->tpl, j->user, j->marker);
    if (j->code_status == 2 && j->code_user == j->user) {
        /* This user's own redemption: settled unless its reservation is still open. */
        if (redis_command(exchange_redis(), exchange_on_own_used, j, "ZSCORE %s %s", j->rk.set,
                          j->rk.member) != QN_OK)
            exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "claim unavailable");
        return;
    }
    if (j->code_status == 2) {
        exchange_refuse(j, &exchange_used);
        return;
    }
    if (j->code_status != 1) {
        exchange_fail(j, "ended", ERRCODE_ENDED, "the exchange campaign has ended");
        return;
    }
    if (query_template(exchange_g.query, j->shop, j->tpl, exchange_on_template, j) != QN_OK)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "template unavailable");
}

/* ---------------------------------------------------------------- steps 1 and 2 */

static void exchange_on_locked(lock_handle *h, lock_outcome o, void *arg)
{
    exchange_job *j = arg;

    if (o != LOCK_ACQUIRED) {
        if (o == LOCK_FAILED_ERROR)
            exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "lock service unavailable");
        else
            exchange_fail(j, "busy", ERRCODE_BUSY,
                          "another exchange of this user is in progress; try again");
        return;
    }
    j->lock = h;
    if (pgpool_submit(service_pg(exchange_g.svc, 0), exchange_find_work, exchange_find_done, j) !=
        QN_OK)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "database busy, retry later");
}

static void exchange_on_request(http_req *req, void *arg)
{
    const char *code = NULL;
    jsonin_err err;
    exchange_job *j;
    char lock_name[KEYS_LEN];
    (void)arg;

    if (jsonin_string(http_body_json(req), "code", JSONIN_REQUIRED, 1, 64, &code, &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    /* The keyed check before anything touches Redis or the database. */
    if (!excode_verify(exchange_cfg.code_secret, code)) {
        metrics_inc_l(METRIC_quan_exchange_total, "forged");
        http_reply_error(req, ERRCODE_NOT_FOUND, "no such exchange code");
        return;
    }
    j = reqjob_new(req, sizeof(*j), exchange_clear);
    if (!j)
        return;
    j->user = req->user_id;
    if (excode_normalize(code, j->code) != QN_OK) { /* cannot happen after verify */
        exchange_fail(j, "forged", ERRCODE_NOT_FOUND, "no such exchange code");
        return;
    }
    snprintf(j->marker, sizeof(j->marker), EXCHANGE_MARKER_PREFIX "%s", j->code);
    keys_exchange_lock(lock_name, j->user);
    lock_opts lo = {.name = lock_name,
                    .wait_ms = 0,
                    .lease_ms = EXCHANGE_LOCK_LEASE_MS,
                    .strategy = LOCK_FAIL_FAST};
    if (lock_acquire(exchange_redis(), &lo, exchange_on_locked, j) != QN_OK)
        exchange_fail(j, "error", ERRCODE_UNAVAILABLE, "lock service unavailable");
}

static qn_status exchange_start(service *s, void **state)
{
    pgbatch_opts o = {.batch_max = EXCHANGE_BATCH_MAX,
                      .wait_max = EXCHANGE_WAIT_MAX,
                      .inflight_max = EXCHANGE_INFLIGHT_MAX,
                      .work = exchange_batch_work,
                      .done = exchange_batch_done};
    exchange_g.svc = s;
    exchange_g.query = service_module_state(s, &query_module);
    exchange_g.resv = service_module_state(s, &resv_module);
    exchange_g.regen = service_module_state(s, &regen_module);
    *state = &exchange_g;
    return (exchange_g.batch = pgbatch_new(&o)) ? QN_OK : QN_ENOMEM;
}

static void exchange_free(void *arg)
{
    (void)arg;
    pgbatch_free(exchange_g.batch);
    exchange_g.batch = NULL;
}

static const config_var exchange_vars[] = {
    EXCODE_CONFIG_VAR(exchange_settings),
};

const service_module exchange_module = {
    .name = "exchange",
    .vars = exchange_vars,
    .nvars = sizeof(exchange_vars) / sizeof(exchange_vars[0]),
    .settings = &exchange_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/engine/user-coupon/exchange", exchange_on_request, HTTP_NEED_USER},
            {0},
        },
    .start = exchange_start,
    .free = exchange_free,
};
