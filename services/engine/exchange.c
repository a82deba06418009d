/*
 * Exchange-code redemption (exchange.h). Its claim runs as every claim does (claimrun.h,
 * CLAIM_EXCHANGE): this file has the request's parse and the steps only an exchange has, LOCK
 * (the user's exchange lock), CODE (the code's row) and WRITE (the code, the stock and the
 * coupon in one transaction of ds_0 shared by the redemptions arriving together, and ds_1's).
 */
#include "exchange.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "claim.h"
#include "claimdb.h"
#include "claimq.h"
#include "claimrun.h"
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
#include "reqjob.h"
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

/* The module's context: the claims' runner it shares, and its group commit (pgbatch.h):
 * redemptions that reach the database while EXCHANGE_INFLIGHT_MAX transactions of them are in
 * flight wait, and go together in the next. One group: the transactions are ds_0's, whatever
 * the templates. */
typedef struct exchange {
    claimrun *run;
    pgbatch *batch;
    const char *code_secret;
} exchange;

/* One /exchange request: a claim, and what only a redemption has. */
typedef struct exchange_job {
    claim_job j; /* first */
    char code[EXCODE_LEN + 1];
    lock_handle *lock;
    pgbatch *batch;
    /* the shared transaction */
    qn_status db_st; /* this redemption's own outcome in it */
    int alone;       /* nothing of it written (its savepoint rolled back, or never run): its
                        db_st stands, however the commit ends */
    int used_ds1;    /* part of it went to ds_1's transaction */
    int code_used;   /* its code was taken by another redemption first */
} exchange_job;

/* The job's clear hook: the user's lock goes when the job does, whichever way it ends. */
static void exchange_clear(reqjob *rj)
{
    exchange_job *x = (exchange_job *)rj;
    if (x->lock)
        lock_release(x->lock, NULL, NULL);
}

/* ---------------------------------------------------------------- WRITE: the database */

/* A redemption refused after its code was marked: in the same transaction the code is usable
 * again and its check (written just before, so no relay holds it) is withdrawn. */
static qn_status exchange_unmark_code(pgpool_conn *c0, const exchange_job *x)
{
    const claim_job *j = &x->j;
    char key[CLAIMQ_ATTEMPT_KEY];
    if (claimdb_free_code(c0, x->code, &j->item.c, NULL) != QN_OK)
        return QN_ERR;
    claimq_attempt_key(key, sizeof(key), &j->item.c, 1);
    return outbox_cancel(c0, key, NULL);
}

/* The stock and coupon steps of the redemptions pend[0..m) (their codes marked), all at once
 * on the connections of their databases: one ledger insert and one stock UPDATE per template,
 * one coupon insert per database, as /redeem's shared transactions do (one UPDATE of the
 * template's row per redemption cost PostgreSQL more than all the rest of it). The ones the
 * database refuses or finds given up have their codes unmarked. QN_ERR on a database error. */
static qn_status exchange_claim_steps(pgpool_conn *conns[2], exchange_job **pend, size_t m)
{
    claimdb_item *items = calloc(m ? m : 1, sizeof(*items));
    qn_status st = QN_ENOMEM;

    if (!items)
        return st;
    for (size_t k = 0; k < m; k++)
        items[k] = pend[k]->j.item;
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
        exchange_job *x = pend[k];
        x->j.item = items[k];
        if (!claimdb_succeeded(&items[k]) && exchange_unmark_code(conns[0], x) != QN_OK)
            goto out;
    }
    st = QN_OK;
out:
    free(items);
    return st;
}

/* One redemption's own statements in ds_0: the code first (of two users racing one code, the
 * second waits on this row and then finds it redeemed: code_used), then the safety net
 * (claimq.h), which commits with the code in ds_0, committed first: if this process dies before
 * ds_1's commit, it completes the redemption later. QN_ERR on a database error. */
static qn_status exchange_redeem_steps(pgpool_conn *c0, exchange_job *x)
{
    claim_job *j = &x->j;
    claimdb_item *it = &j->item;
    int marked = 0;

    if (claimdb_mark_code(c0, x->code, &it->c, &marked) != QN_OK)
        return QN_ERR;
    if (!marked) {
        x->code_used = 1;
        return QN_OK;
    }
    return claimq_add_check(c0, &it->c, it->bkt, it->nbkt, j->rj.request_id,
                            now_wall_ms() + j->run->wallet_check_ms);
}

/* Rows are locked in this order (template, then code) by every process, so that two batches
 * never wait on each other's rows in a cycle. */
static int exchange_job_cmp(const void *a, const void *b)
{
    const exchange_job *x = *(exchange_job *const *)a, *y = *(exchange_job *const *)b;
    if (x->j.tpl != y->j.tpl)
        return x->j.tpl < y->j.tpl ? -1 : 1;
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

    exchange *xm = arg;
    memcpy(jobs, items, n * sizeof(jobs[0]));
    qsort(jobs, n, sizeof(jobs[0]), exchange_job_cmp);
    if (pgpool_begin(c0) != QN_OK)
        goto done;
    for (size_t k = 0; k < n; k++) {
        exchange_job *j = jobs[k];
        const claimdb_item *it = &j->j.item;
        if ((it->tpl_ds == 1 || it->user_ds == 1) && !conns[1]) {
            if (!ds1_down)
                conns[1] = pgpool_acquire(service_pg(xm->run->svc, 1), EXCHANGE_ACQUIRE_MS);
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
        if (j->db_st != QN_OK || j->code_used) {
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
        pend[k]->used_ds1 = claimdb_succeeded(&pend[k]->j.item) &&
                            (pend[k]->j.item.tpl_ds == 1 || pend[k]->j.item.user_ds == 1);
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

/* Each redemption of the batch goes on as if written alone (pgbatch has handed the next batch
 * to the pool already). */
static void exchange_batch_done(qn_status st, void *const *items, size_t n, void *arg)
{
    (void)arg;
    if (st != QN_EBUSY && st != QN_ENOMEM) {
        metrics_inc_l(&metric_quan_claim_transactions_total, "exchange");
        metrics_add_l(&metric_quan_claim_transaction_claims_total, (int64_t)n, "exchange");
    }
    for (size_t k = 0; k < n; k++) {
        exchange_job *x = items[k];
        claim_job *j = &x->j;
        if (st == QN_EBUSY || st == QN_ENOMEM) /* the pool refused it: nothing ran */
            j->out.st = QN_EBUSY;
        else
            j->out.st = st == QN_OK || x->alone ? x->db_st : st;
        j->out.db = j->item.state;
        j->out.code_used = x->code_used;
        claimrun_done(j);
    }
}

static void exchange_write(exchange_job *x)
{
    claim_job *j = &x->j;
    claimdb_item *it = &j->item;
    int repeated = j->gate.code == CLAIMGATE_REPEATED;
    int64_t id;

    memset(it, 0, sizeof(*it));
    if (ids_next(service_ids(j->run->svc), &id) != QN_OK) {
        j->out.no_id = 1;
        claimrun_done(j);
        return;
    }
    /* Source 2, shop: the merchant issued the codes. An earlier attempt of this redemption
     * that reserved and was settled without a give-back is finished under its reservation,
     * whose time names it in the database. */
    ucoupon_claimed(&it->c, id, j->user, j->tpl, j->shop, 2, UCOUPON_CH_CODE, (int)j->gate.count,
                    repeated && j->gate.resv_ms > 0 ? j->gate.resv_ms : j->now,
                    repeated ? j->tpl_hours : j->gate.hours, j->request_id);
    it->bkt = j->bkt;
    it->nbkt = j->nbkt;
    claimdb_route(it);
    if (pgbatch_submit(x->batch, service_pg(j->run->svc, 0), 0, x) != QN_OK) {
        j->out.st = QN_EBUSY;
        claimrun_done(j);
    }
}

/* ---------------------------------------------------------------- CODE: the code's row */

static qn_status exchange_find_work(pgpool_conn *c, void *arg)
{
    exchange_job *x = arg;
    claim_outcome *o = &x->j.out;
    pgparam p = {0};
    pgparam_str(&p, x->code);
    PGresult *res = pgpool_exec(c,
                                "SELECT coupon_template_id, shop_number, status, "
                                "coalesce(user_id, 0) FROM t_exchange_code WHERE code = $1",
                                p.n, p.v);
    if (!res)
        return QN_ERR;
    if (PQntuples(res) == 1) {
        x->j.tpl = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        x->j.shop = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        o->code_status = atoi(PQgetvalue(res, 0, 2));
        o->code_own = strtoll(PQgetvalue(res, 0, 3), NULL, 10) == x->j.user;
    }
    PQclear(res);
    return QN_OK;
}

static void exchange_on_code(qn_status st, void *arg)
{
    exchange_job *x = arg;
    x->j.out.st = st;
    if (st == QN_OK && x->j.out.code_status)
        claimrun_job_keys(&x->j); /* its template's, for the steps to come */
    claimrun_done(&x->j);
}

/* ---------------------------------------------------------------- LOCK */

static void exchange_on_locked(lock_handle *h, lock_outcome o, void *arg)
{
    exchange_job *x = arg;
    if (o == LOCK_ACQUIRED)
        x->lock = h;
    x->j.out.st = o == LOCK_ACQUIRED ? QN_OK : o == LOCK_FAILED_ERROR ? QN_ERR : QN_EBUSY;
    claimrun_done(&x->j);
}

/* The steps only an exchange has. */
static void exchange_own(claim_job *j)
{
    exchange_job *x = (exchange_job *)j;
    switch (j->course.step) {
    case CLAIM_LOCK: {
        char lock_name[KEYS_LEN];
        keys_exchange_lock(lock_name, j->user);
        lock_opts lo = {.name = lock_name,
                        .wait_ms = 0,
                        .lease_ms = EXCHANGE_LOCK_LEASE_MS,
                        .strategy = LOCK_FAIL_FAST};
        if (lock_acquire(j->run->redis, &lo, exchange_on_locked, x) != QN_OK) {
            j->out.st = QN_ERR;
            claimrun_done(j);
        }
        return;
    }
    case CLAIM_CODE:
        if (pgpool_submit(service_pg(j->run->svc, 0), exchange_find_work, exchange_on_code, x) !=
            QN_OK) {
            j->out.st = QN_EBUSY;
            claimrun_done(j);
        }
        return;
    default:
        exchange_write(x);
        return;
    }
}

/* ---------------------------------------------------------------- the request */

static void exchange_on_request(http_req *req, void *arg)
{
    exchange *xm = arg;
    const char *code = NULL;
    jsonin_err err;

    if (jsonin_string(http_body_json(req), "code", JSONIN_REQUIRED, 1, 64, &code, &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    /* The keyed check before anything touches Redis or the database; a code that passes it is
     * normalized (it cannot fail then). */
    char normal[EXCODE_LEN + 1];
    if (!excode_verify(xm->code_secret, code) || excode_normalize(code, normal) != QN_OK) {
        metrics_inc_l(&metric_quan_exchange_total, "forged");
        http_reply_error(req, ERRCODE_NOT_FOUND, "no such exchange code");
        return;
    }
    exchange_job *x =
        claimrun_job_new(xm->run, req, sizeof(*x), CLAIM_EXCHANGE, exchange_own, exchange_clear);
    if (!x)
        return;
    x->batch = xm->batch;
    memcpy(x->code, normal, sizeof(x->code));
    snprintf(x->j.request_id, sizeof(x->j.request_id), EXCHANGE_MARKER_PREFIX "%s", x->code);
    claimrun_step(&x->j);
}

/* ---------------------------------------------------------------- the module */

static qn_status exchange_start(service *s, void **state)
{
    exchange *xm = calloc(1, sizeof(*xm));
    if (!xm)
        return QN_ENOMEM;
    *state = xm;
    xm->run = service_module_state(s, &claim_module);
    xm->code_secret = exchange_cfg.code_secret;
    if (!xm->run) {
        log_error(NULL, "exchange: the claim module must start first");
        return QN_ERR;
    }
    pgbatch_opts o = {.batch_max = EXCHANGE_BATCH_MAX,
                      .wait_max = EXCHANGE_WAIT_MAX,
                      .inflight_max = EXCHANGE_INFLIGHT_MAX,
                      .work = exchange_batch_work,
                      .done = exchange_batch_done,
                      .arg = xm};
    return (xm->batch = pgbatch_new(&o)) ? QN_OK : QN_ENOMEM;
}

static void exchange_free(void *state)
{
    exchange *xm = state;
    if (!xm)
        return;
    pgbatch_free(xm->batch);
    free(xm);
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
    .metrics =
        (metrics_family *const[]){
            METRICS_REFS(CLAIMSTEP_METRICS)  /* the redemptions' outcomes */
            METRICS_REFS(CLAIMRUN_METRICS)   /* the gate's calls */
            METRICS_REFS(CLAIMBATCH_METRICS) /* the shared transactions */
            NULL,
        },
    .start = exchange_start,
    .free = exchange_free,
};
