/* Payment lifecycle of a user coupon: see payment.h for the states, locks and the two-database
 * ordering. One pay_op per call (HTTP request or timeout message) walks this chain on the loop
 * thread, each database step a pgpool job:
 *
 *   lock -> load coupon -> [create: template (cache, else DB) -> discount -> checks]
 *        -> [others: load settlement -> decide] -> write (one or two transactions)
 *        -> wallet -> unlock -> reply
 */
#include "payment.h"
#include "paymove.h"

#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "discount.h"
#include "events.h"
#include "jsonin.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "reqjob.h"
#include "shard.h"
#include "template.h"
#include "ucoupon.h"

#define PAY_CONSUMER_WAIT  30 /* s a timeout message waits for the loop to finish its op */
#define PAY_TIMEOUT_LOCK_W 2000

enum { PAY_WALLET_NONE, PAY_WALLET_REMOVE, PAY_WALLET_ADD };

typedef struct pay_settings {
    int64_t payment_lock_timeout_s;
} pay_settings;

/* Read at start; the running module reads them through its context. */
static pay_settings pay_cfg;

/* The module's context: its routes' and its consumer's arg. */
typedef struct payment {
    service *svc;
    const service_config *common;
    const pay_settings *cfg;
    redis_client *redis; /* the service's: locks, the wallet, the template cache */
} payment;

/* A timeout message's consumer thread waits for the loop-side op through this; two owners
 * (thread and op), freed by whichever lets go last. */
typedef struct pay_waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int done;
    int status; /* the op's outcome as an HTTP status */
} pay_waiter;

/* One call: an HTTP request (rj.req) or a timeout message (rj.req NULL, waiter set). The
 * answer is rj's reply (reqjob.h); the op is freed once it is given. */
typedef struct pay_op {
    reqjob rj; /* first: the request and the answer being prepared */
    payment *pay;
    pay_kind kind;
    pay_waiter *waiter; /* timeout messages */
    int64_t user_id, coupon_id, order_id;
    int64_t order_amount, payable_amount, shop_number; /* create */
    int64_t discount_cents;                            /* create: what the order saves */
    discount_goods *goods; /* owned array; goods numbers borrowed from the request body */
    size_t n_goods;
    int uc_ds, st_ds;
    char st_table[64];
    lock_handle *lock;
    /* loaded */
    ucoupon uc;
    int uc_found;
    tpl t;
    int have_tpl;
    int64_t settlement_id; /* create: new; timeout: from the message; else found */
    int st_found, st_status, st_other_active;
    /* a job's outcome */
    qn_status db_st;
    int64_t rows_s, rows_c;
    int coupon_only;     /* completing an interrupted two-database step: coupon row only */
    int settlement_only; /* a create interrupted between the databases: settlement only */
    int wallet;          /* the wallet change a success makes */
} pay_op;

static void pay_finish(pay_op *op);
static void pay_write(pay_op *op);

/* "12.30" for 1230 cents (amounts are never negative here). */
static const char *pay_yuan(char buf[32], int64_t cents)
{
    snprintf(buf, 32, "%" PRId64 ".%02" PRId64, cents / 100, cents % 100);
    return buf;
}

static void pay_timer_key(char buf[64], int64_t settlement_id)
{
    snprintf(buf, 64, EVENT_PAYMENT_TIMEOUT ":%" PRId64, settlement_id);
}

static void pay_waiter_unref(pay_waiter *w);

/* The op's clear hook, once it is answered: a timeout message's thread hears the outcome. */
static void pay_clear(reqjob *rj)
{
    pay_op *op = (pay_op *)rj;
    if (op->waiter) {
        pthread_mutex_lock(&op->waiter->mu);
        op->waiter->status = op->rj.status;
        op->waiter->done = 1;
        pthread_cond_signal(&op->waiter->cv);
        pthread_mutex_unlock(&op->waiter->mu);
        pay_waiter_unref(op->waiter);
    }
    tpl_clear(&op->t);
    free(op->goods);
}

/* Ends the op with an error (errcode.h, message): still goes through unlock and reply. */
__attribute__((format(printf, 3, 4))) static void pay_fail(pay_op *op, errcode e, const char *fmt,
                                                           ...)
{
    va_list ap;
    va_start(ap, fmt);
    reqjob_vfail(&op->rj, e, fmt, ap);
    va_end(ap);
    op->wallet = PAY_WALLET_NONE;
    pay_finish(op);
}

static void pay_fail_db(pay_op *op)
{
    pay_fail(op, ERRCODE_UNAVAILABLE, "database unavailable, retry later");
}

/* ------------------------------------------------------------------ reply, unlock, wallet */

static void pay_waiter_unref(pay_waiter *w)
{
    int last;
    pthread_mutex_lock(&w->mu);
    last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
}

static void pay_on_unlocked(int released, void *arg)
{
    pay_op *op = arg;
    if (!released)
        log_warn(NULL, "payment: lock of coupon %" PRId64 " was no longer ours at release",
                 op->coupon_id);
    reqjob_reply(&op->rj, QN_OK);
}

static void pay_unlock(pay_op *op)
{
    lock_handle *h = op->lock;
    op->lock = NULL;
    if (h)
        lock_release(h, pay_on_unlocked, op); /* answer once the next caller can lock */
    else
        reqjob_reply(&op->rj, QN_OK);
}

static void pay_on_wallet(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    (void)reply;
    pay_op *op = arg;
    /* The database is the truth; a wallet write lost here is logged, not failed: the expiry
     * sweep and the next lifecycle step rewrite the member. */
    if (err)
        log_warn(NULL, "payment: wallet update of coupon %" PRId64 " failed: %s", op->coupon_id,
                 err);
    pay_unlock(op);
}

static void pay_finish(pay_op *op)
{
    char key[KEYS_LEN], member[UCOUPON_MEMBER_LEN], score[24];
    qn_status st = QN_ERR;
    if (!reqjob_failed(&op->rj) && op->wallet != PAY_WALLET_NONE) {
        keys_wallet(key, op->user_id);
        ucoupon_member(member, op->uc.template_id, op->coupon_id);
        if (op->wallet == PAY_WALLET_REMOVE) {
            st = redis_command(op->pay->redis, pay_on_wallet, op, "ZREM %s %s", key, member);
        } else {
            snprintf(score, sizeof(score), "%" PRId64, op->uc.receive_time_ms);
            st = redis_command(op->pay->redis, pay_on_wallet, op, "ZADD %s %s %s", key, score,
                               member);
        }
        if (st == QN_OK)
            return;
        log_warn(NULL, "payment: wallet update of coupon %" PRId64 " not sent", op->coupon_id);
    }
    pay_unlock(op);
}

/* ------------------------------------------------------------------ jobs */

static qn_status pay_submit(pay_op *op, int ds, pgpool_work_fn work, pgpool_done_fn done)
{
    qn_status st = pgpool_submit(service_pg(op->pay->svc, ds), work, done, op);
    if (st != QN_OK)
        pay_fail(op, ERRCODE_UNAVAILABLE, "database busy, retry later");
    return st;
}

static qn_status pay_work_load_coupon(pgpool_conn *c, void *arg)
{
    pay_op *op = arg;
    qn_status st = ucoupon_load(c, op->user_id, op->coupon_id, &op->uc);
    op->uc_found = st == QN_OK;
    return st == QN_ENOTFOUND ? QN_OK : st;
}

/* The settlement this call is about: by id (timeout), else the one of (coupon, order),
 * preferring the active one; and whether another active settlement holds the coupon. */
static qn_status pay_work_load_settlement(pgpool_conn *c, void *arg)
{
    pay_op *op = arg;
    char sql[768];
    pgparam p = {0};
    pgparam_i64(&p, op->user_id);
    pgparam_i64(&p, op->coupon_id);
    pgparam_i64(&p, op->kind == PAY_TIMEOUT ? op->settlement_id : op->order_id);
    snprintf(
        sql, sizeof(sql),
        "SELECT s.id, s.status, EXISTS (SELECT 1 FROM %s o WHERE o.user_id = $1 AND "
        "o.coupon_id = $2 AND o.status IN (" SETTLE_STATUS_TEXT(LOCKED) ", " SETTLE_STATUS_TEXT(
            PAID) ") AND o.id <> s.id) FROM %s s WHERE s.user_id = $1 AND s.coupon_id = $2 AND %s "
                  "= $3 "
                  "ORDER BY (s.status IN (" SETTLE_STATUS_TEXT(LOCKED) ", " SETTLE_STATUS_TEXT(
                      PAID) ")) DESC, s.create_time DESC, s.id DESC LIMIT 1",
        op->st_table, op->st_table, op->kind == PAY_TIMEOUT ? "s.id" : "s.order_id");
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    op->st_found = PQntuples(r) == 1;
    if (op->st_found) {
        op->settlement_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        op->st_status = atoi(PQgetvalue(r, 0, 1));
        op->st_other_active = PQgetvalue(r, 0, 2)[0] == 't';
    }
    PQclear(r);
    return QN_OK;
}

static qn_status pay_work_load_template(pgpool_conn *c, void *arg)
{
    pay_op *op = arg;
    int64_t shop = op->uc.shop_number ? op->uc.shop_number : op->shop_number;
    qn_status st = tpl_db_load(c, shop, op->uc.template_id, &op->t);
    op->have_tpl = st == QN_OK;
    return st == QN_ENOTFOUND ? QN_OK : st;
}

/* The settlement half of a move, inside the caller's transaction. */
static qn_status pay_step_settlement(pgpool_conn *c, pay_op *op)
{
    char sql[256], timer_key[64], data[256];
    pgparam p = {0};
    qn_status st;
    pgparam_i64(&p, op->settlement_id);
    pay_timer_key(timer_key, op->settlement_id);
    if (op->kind == PAY_CREATE) {
        pgparam_i64(&p, op->order_id);
        pgparam_i64(&p, op->user_id);
        pgparam_i64(&p, op->coupon_id);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO %s (id, order_id, user_id, coupon_id, status) "
                 "VALUES ($1, $2, $3, $4, " SETTLE_STATUS_TEXT(LOCKED) ")",
                 op->st_table);
        st = pgpool_exec_cmd(c, sql, p.n, p.v, &op->rows_s);
        if (st != QN_OK)
            return st; /* QN_ECONFLICT: the coupon already has an active settlement */
        /* The timer that gives the coupon back if the order is never paid. */
        snprintf(data, sizeof(data),
                 "{\"settlementId\":\"%" PRId64 "\",\"userId\":\"%" PRId64
                 "\",\"couponId\":\"%" PRId64 "\",\"orderId\":\"%" PRId64 "\"}",
                 op->settlement_id, op->user_id, op->coupon_id, op->order_id);
        outbox_event ev = {
            .routing_key = EVENT_PAYMENT_TIMEOUT,
            .key = timer_key,
            .data_json = data,
            .request_id = op->rj.request_id[0] ? op->rj.request_id : NULL,
            .traceparent = op->rj.traceparent[0] ? op->rj.traceparent : NULL,
            .due_at_ms = now_wall_ms() + op->pay->cfg->payment_lock_timeout_s * 1000,
        };
        return outbox_add(c, &ev);
    }
    pgparam_i64(&p, paymove_of(op->kind)->s_to);
    pgparam_i64(&p, paymove_of(op->kind)->s_from);
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET status = $2, update_time = now() WHERE id = $1 AND status = $3",
             op->st_table);
    st = pgpool_exec_cmd(c, sql, p.n, p.v, &op->rows_s);
    if (st != QN_OK || op->rows_s != 1)
        return st;
    /* Leaving "locked": the timer has nothing left to do. */
    if (paymove_of(op->kind)->s_from == SETTLE_LOCKED)
        st = outbox_cancel(c, timer_key, NULL);
    return st;
}

static qn_status pay_step_coupon(pgpool_conn *c, pay_op *op)
{
    char ref[48];
    if (op->order_id)
        snprintf(ref, sizeof(ref), "order:%" PRId64, op->order_id);
    else
        snprintf(ref, sizeof(ref), "settlement:%" PRId64, op->settlement_id);
    ucoupon_why why = {.ref = ref,
                       .actor = op->kind == PAY_TIMEOUT ? "payment-timeout" : "payment",
                       .discount_cents = op->discount_cents};
    return ucoupon_set_status(c, op->user_id, op->coupon_id, paymove_of(op->kind)->c_from,
                              paymove_of(op->kind)->c_to, &why, &op->rows_c);
}

/* One transaction: the settlement row (and the timer) and, when with_coupon (both rows in the
 * same database), the coupon row; every row count checked. The outcome is in op; QN_OK keeps
 * the pool from reporting a failed job. */
static qn_status pay_txn(pgpool_conn *c, pay_op *op, int with_coupon)
{
    op->rows_s = 0;
    if (with_coupon)
        op->rows_c = 0;
    op->db_st = pgpool_begin(c);
    if (op->db_st != QN_OK)
        goto fail;
    op->db_st = pay_step_settlement(c, op);
    if (op->db_st != QN_OK || op->rows_s != 1)
        goto fail;
    if (with_coupon) {
        op->db_st = pay_step_coupon(c, op);
        if (op->db_st != QN_OK || op->rows_c != 1)
            goto fail;
    }
    op->db_st = pgpool_commit(c);
    return QN_OK;
fail:
    (void)pgpool_rollback(c);
    return QN_OK;
}

/* Same database: both rows (and the timer) in one transaction. */
static qn_status pay_work_both(pgpool_conn *c, void *arg)
{
    return pay_txn(c, arg, 1);
}

/* Different databases, first transaction: the settlement row (and the timer). */
static qn_status pay_work_settlement(pgpool_conn *c, void *arg)
{
    return pay_txn(c, arg, 0);
}

/* Different databases, second step: the coupon row alone (one statement). */
static qn_status pay_work_coupon(pgpool_conn *c, void *arg)
{
    pay_op *op = arg;
    op->rows_c = 0;
    op->db_st = pay_step_coupon(c, op);
    return QN_OK;
}

/* A create whose coupon step failed on the other database: cancel its settlement again. */
static qn_status pay_work_undo_create(pgpool_conn *c, void *arg)
{
    pay_op *op = arg;
    char sql[160], timer_key[64];
    pgparam p = {0};
    int64_t rows = 0;
    pgparam_i64(&p, op->settlement_id);
    pay_timer_key(timer_key, op->settlement_id);
    snprintf(
        sql, sizeof(sql),
        "UPDATE %s SET status = " SETTLE_STATUS_TEXT(CANCELLED) ", update_time = now() WHERE id = "
                                                                "$1 AND status "
                                                                "= " SETTLE_STATUS_TEXT(LOCKED),
        op->st_table);
    qn_status st = pgpool_begin(c);
    if (st == QN_OK)
        st = pgpool_exec_cmd(c, sql, p.n, p.v, &rows);
    if (st == QN_OK)
        st = outbox_cancel(c, timer_key, NULL);
    if (st == QN_OK)
        st = pgpool_commit(c);
    else
        (void)pgpool_rollback(c);
    return st; /* if this fails the timer cancels the settlement later */
}

/* ------------------------------------------------------------------ write phase */

static void pay_written(pay_op *op)
{
    const char *verb = paymove_of(op->kind)->verb;
    op->wallet = paymove_of(op->kind)->c_to == UCOUPON_UNUSED     ? PAY_WALLET_ADD
                 : paymove_of(op->kind)->c_from == UCOUPON_UNUSED ? PAY_WALLET_REMOVE
                                                                  : PAY_WALLET_NONE;
    log_infof(op->rj.req ? &op->rj.req->log : NULL,
              ((log_field[]){LOG_I("couponId", op->coupon_id), LOG_I("userId", op->user_id),
                             LOG_I("settlementId", op->settlement_id), LOG_END}),
              "payment: %s done%s", verb,
              op->coupon_only       ? " (coupon step completed)"
              : op->settlement_only ? " (settlement only)"
                                    : "");
    pay_finish(op);
}

/* A failed write: a unique violation on create, a row count that was not 1, a DB error. */
static void pay_write_failed(pay_op *op, int settlement_step)
{
    if (op->db_st == QN_ECONFLICT)
        pay_fail(op, ERRCODE_STATE, "couponId: the coupon already has an active settlement");
    else if (op->db_st != QN_OK)
        pay_fail_db(op);
    else
        pay_fail(op, ERRCODE_STATE, "couponId: the %s changed meanwhile, cannot %s",
                 settlement_step ? "settlement" : "coupon", paymove_of(op->kind)->verb);
}

static void pay_done_both(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st != QN_OK || op->db_st != QN_OK || op->rows_s != 1 || op->rows_c != 1) {
        if (st != QN_OK)
            op->db_st = st;
        pay_write_failed(op, op->rows_s != 1);
        return;
    }
    pay_written(op);
}

static void pay_done_undo_create(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st != QN_OK)
        log_warn(NULL, "payment: settlement %" PRId64 " left locked, its timer will cancel it",
                 op->settlement_id);
    pay_fail(op, ERRCODE_STATE, "couponId: the coupon is no longer unused");
}

static void pay_done_coupon(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st == QN_OK && op->db_st == QN_OK && op->rows_c == 1) {
        pay_written(op);
        return;
    }
    if (op->kind == PAY_CREATE && !op->coupon_only) {
        (void)pay_submit(op, op->st_ds, pay_work_undo_create, pay_done_undo_create);
        return;
    }
    /* The settlement already moved; the next call (or the timer) completes the coupon. */
    log_warn(NULL, "payment: coupon %" PRId64 " step of settlement %" PRId64 " did not apply",
             op->coupon_id, op->settlement_id);
    if (st != QN_OK)
        op->db_st = st;
    pay_write_failed(op, 0);
}

static void pay_done_settlement(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st != QN_OK || op->db_st != QN_OK || op->rows_s != 1) {
        if (st != QN_OK)
            op->db_st = st;
        pay_write_failed(op, 1);
        return;
    }
    if (op->settlement_only)
        pay_written(op);
    else
        (void)pay_submit(op, op->uc_ds, pay_work_coupon, pay_done_coupon);
}

static void pay_write(pay_op *op)
{
    if (op->coupon_only)
        (void)pay_submit(op, op->uc_ds, pay_work_coupon, pay_done_coupon);
    else if (op->uc_ds == op->st_ds && !op->settlement_only)
        (void)pay_submit(op, op->st_ds, pay_work_both, pay_done_both);
    else
        (void)pay_submit(op, op->st_ds, pay_work_settlement, pay_done_settlement);
}

/* ------------------------------------------------------------------ create: checks */

static void pay_create_check(pay_op *op)
{
    char a[32], b[32], c[32];
    discount_rule rule;
    discount_result res;

    if (!op->have_tpl || op->t.id != op->uc.template_id) {
        pay_fail(op, ERRCODE_NOT_FOUND, "couponId: the coupon's template does not exist");
        return;
    }
    discount_rule_from_tpl(&op->t, &rule);
    discount_order order = {.amount_cents = op->order_amount,
                            .shop_number = op->shop_number,
                            .goods = op->goods,
                            .n_goods = op->n_goods};
    discount_reason why = discount_apply(&rule, &order, &res);
    switch (why) {
    case DISCOUNT_OK:
        break;
    case DISCOUNT_OTHER_SHOP:
        pay_fail(op, ERRCODE_INVALID, "shopNumber: the coupon belongs to another shop");
        return;
    case DISCOUNT_GOODS_NOT_IN_ORDER:
        pay_fail(op, ERRCODE_INVALID, "goodsList: no item with the coupon's goodsNumber %s",
                 op->t.goods);
        return;
    case DISCOUNT_THRESHOLD_NOT_MET:
        if (res.goods_index >= 0)
            pay_fail(op, ERRCODE_INVALID,
                     "goodsList[%ld].goodsAmount: below the coupon's threshold %s", res.goods_index,
                     pay_yuan(a, rule.terms_cents));
        else
            pay_fail(op, ERRCODE_INVALID, "orderAmount: below the coupon's threshold %s",
                     pay_yuan(a, rule.terms_cents));
        return;
    case DISCOUNT_BAD_RULE:
        pay_fail(op, ERRCODE_STATE, "couponId: the coupon's rule cannot be applied");
        return;
    }
    if (res.goods_index >= 0) {
        const discount_goods *g = &op->goods[res.goods_index];
        int64_t want = g->amount_cents - res.discount_cents;
        if (g->payable_cents < 0) {
            pay_fail(op, ERRCODE_INVALID, "goodsList[%ld].goodsPayableAmount: required",
                     res.goods_index);
            return;
        }
        if (g->payable_cents != want) {
            pay_fail(op, ERRCODE_INVALID,
                     "goodsList[%ld].goodsPayableAmount: must be %s (goodsAmount %s - discount "
                     "%s)",
                     res.goods_index, pay_yuan(a, want), pay_yuan(b, g->amount_cents),
                     pay_yuan(c, res.discount_cents));
            return;
        }
    }
    if (op->order_amount < res.discount_cents) {
        pay_fail(op, ERRCODE_INVALID, "orderAmount: smaller than the discount %s",
                 pay_yuan(a, res.discount_cents));
        return;
    }
    if (op->payable_amount != op->order_amount - res.discount_cents) {
        pay_fail(op, ERRCODE_INVALID, "payableAmount: must be %s (orderAmount %s - discount %s)",
                 pay_yuan(a, op->order_amount - res.discount_cents), pay_yuan(b, op->order_amount),
                 pay_yuan(c, res.discount_cents));
        return;
    }
    op->discount_cents = res.discount_cents;
    if (ids_next(service_ids(op->pay->svc), &op->settlement_id) != QN_OK) {
        pay_fail(op, ERRCODE_UNAVAILABLE, "id generator unavailable, retry later");
        return;
    }
    pay_write(op);
}

static void pay_done_template_db(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st != QN_OK) {
        pay_fail_db(op);
        return;
    }
    pay_create_check(op);
}

static void pay_on_template_cache(redis_client *c, const redisReply *reply, const char *err,
                                  void *arg)
{
    (void)c;
    pay_op *op = arg;
    if (!err && tpl_from_cache(reply, &op->t) == QN_OK) {
        op->have_tpl = 1;
        pay_create_check(op);
        return;
    }
    /* Not cached (or Redis failed): the template's own database, by its shop. */
    int64_t shop = op->uc.shop_number ? op->uc.shop_number : op->shop_number;
    shard_route r;
    if (shard_route_for("t_coupon_template", shop, &r) != QN_OK) {
        pay_fail(op, ERRCODE_NOT_FOUND, "couponId: the coupon's template does not exist");
        return;
    }
    (void)pay_submit(op, r.ds, pay_work_load_template, pay_done_template_db);
}

/* ------------------------------------------------------------------ after the loads */

/* Every kind but create: the coupon and the settlement are loaded; choose the move. */
static void pay_decide(pay_op *op)
{
    switch (paymove_decide(op->kind, op->st_found, op->st_status, op->st_other_active,
                           op->uc.status, op->uc_ds != op->st_ds)) {
    case PAYMOVE_NOT_FOUND:
        if (op->kind == PAY_TIMEOUT)
            pay_fail(op, ERRCODE_NOT_FOUND, "settlement gone");
        else
            pay_fail(op, ERRCODE_NOT_FOUND,
                     "orderId: no settlement of coupon %" PRId64 " for order %" PRId64,
                     op->coupon_id, op->order_id);
        return;
    case PAYMOVE_COUPON_ONLY:
        op->coupon_only = 1;
        pay_write(op);
        return;
    case PAYMOVE_SETTLEMENT_ONLY:
        op->settlement_only = 1;
        pay_write(op);
        return;
    case PAYMOVE_BOTH:
        pay_write(op);
        return;
    case PAYMOVE_REFUSE:
        break;
    }
    pay_fail(op, ERRCODE_STATE, "couponId: cannot %s: settlement is %s, coupon is %s",
             paymove_of(op->kind)->verb, paymove_settle_name(op->st_status),
             paymove_coupon_name(op->uc.status));
}

static void pay_done_load_settlement(qn_status st, void *arg)
{
    pay_op *op = arg;
    if (st != QN_OK) {
        pay_fail_db(op);
        return;
    }
    pay_decide(op);
}

static void pay_done_load_coupon(qn_status st, void *arg)
{
    pay_op *op = arg;
    char key[KEYS_LEN];
    if (st != QN_OK) {
        pay_fail_db(op);
        return;
    }
    if (!op->uc_found) {
        pay_fail(op, ERRCODE_NOT_FOUND, "couponId: no such coupon");
        return;
    }
    if (op->kind != PAY_CREATE) {
        (void)pay_submit(op, op->st_ds, pay_work_load_settlement, pay_done_load_settlement);
        return;
    }
    if (op->uc.status != UCOUPON_UNUSED) {
        pay_fail(op, ERRCODE_STATE, "couponId: the coupon is %s",
                 paymove_coupon_name(op->uc.status));
        return;
    }
    int64_t now = now_wall_ms();
    if (op->uc.valid_end_ms <= now) {
        pay_fail(op, ERRCODE_STATE, "couponId: the coupon has expired");
        return;
    }
    if (op->uc.valid_start_ms > now) {
        pay_fail(op, ERRCODE_STATE, "couponId: the coupon is not valid yet");
        return;
    }
    keys_template(key, op->uc.template_id);
    if (redis_command(op->pay->redis, pay_on_template_cache, op, "HGETALL %s", key) != QN_OK)
        pay_on_template_cache(NULL, NULL, "not sent", op);
}

static void pay_on_locked(lock_handle *h, lock_outcome o, void *arg)
{
    pay_op *op = arg;
    if (o != LOCK_ACQUIRED) {
        if (o == LOCK_FAILED_ERROR)
            pay_fail(op, ERRCODE_UNAVAILABLE, "lock service unavailable, retry later");
        else
            pay_fail(op, ERRCODE_BUSY,
                     "couponId: coupon %" PRId64 " is being processed by another request, "
                     "retry later",
                     op->coupon_id);
        return;
    }
    op->lock = h;
    (void)pay_submit(op, op->uc_ds, pay_work_load_coupon, pay_done_load_coupon);
}

/* Routes, then the lock; the op is answered exactly once from here on. */
static void pay_start(pay_op *op)
{
    char name[KEYS_LEN];
    shard_route r;
    op->uc_ds = ucoupon_ds(op->user_id);
    if (shard_route_for("t_coupon_settlement", op->user_id, &r) != QN_OK) {
        pay_fail(op, ERRCODE_INTERNAL, "no route for the settlement");
        return;
    }
    op->st_ds = r.ds;
    snprintf(op->st_table, sizeof(op->st_table), "%s", r.table);
    keys_lock_coupon(name, op->coupon_id);
    lock_opts lo = {.name = name,
                    .wait_ms = op->kind == PAY_TIMEOUT ? PAY_TIMEOUT_LOCK_W : 0,
                    .lease_ms = -1, /* watchdog: held as long as the steps take */
                    .watchdog_ms = 0,
                    .strategy =
                        op->kind == PAY_TIMEOUT ? LOCK_FAIL_AFTER_RETRY_TIMEOUT : LOCK_FAIL_FAST};
    if (lock_acquire(op->pay->redis, &lo, pay_on_locked, op) != QN_OK)
        pay_fail(op, ERRCODE_UNAVAILABLE, "lock service unavailable, retry later");
}

/* ------------------------------------------------------------------ HTTP handlers */

static pay_op *pay_op_new(http_req *req, payment *pay, pay_kind kind)
{
    pay_op *op = reqjob_new(req, sizeof(*op), pay_clear);
    if (!op)
        return NULL;
    op->pay = pay;
    op->kind = kind;
    op->user_id = req->user_id;
    return op;
}

/* couponId and orderId: every endpoint has them. */
static qn_status pay_read_ids(const cJSON *body, pay_op *op, jsonin_err *err)
{
    if (jsonin_int64(body, "couponId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &op->coupon_id, err) ||
        jsonin_int64(body, "orderId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &op->order_id, err))
        return QN_EINVAL;
    return QN_OK;
}

static void pay_handle_create(http_req *req, void *arg)
{
    jsonin_err err = {{0}};
    const cJSON *body = http_body_json(req);
    pay_op *op = pay_op_new(req, arg, PAY_CREATE);
    if (!op)
        return;
    if (pay_read_ids(body, op, &err) ||
        jsonin_money_cents(body, "orderAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS,
                           &op->order_amount, &err) ||
        jsonin_money_cents(body, "payableAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS,
                           &op->payable_amount, &err) ||
        jsonin_int64(body, "shopNumber", JSONIN_REQUIRED, 0, 0, INT64_MAX, &op->shop_number,
                     &err) ||
        discount_read_goods(body, &op->goods, &op->n_goods, &err)) {
        reqjob_reply_error(&op->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    pay_start(op);
}

static void pay_handle_move(http_req *req, payment *pay, pay_kind kind)
{
    jsonin_err err = {{0}};
    pay_op *op = pay_op_new(req, pay, kind);
    if (!op)
        return;
    if (pay_read_ids(http_body_json(req), op, &err)) {
        reqjob_reply_error(&op->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    pay_start(op);
}

static void pay_handle_process(http_req *req, void *arg)
{
    pay_handle_move(req, arg, PAY_PROCESS);
}

static void pay_handle_refund(http_req *req, void *arg)
{
    pay_handle_move(req, arg, PAY_REFUND);
}

static void pay_handle_cancel(http_req *req, void *arg)
{
    pay_handle_move(req, arg, PAY_CANCEL);
}

/* ------------------------------------------------------------------ timeout consumer */

static void pay_timeout_start(void *arg)
{
    pay_start(arg);
}

/* Consumer thread: hands the message to the loop (the same chain as cancel-payment, under the
 * same lock) and waits for its outcome. Conditional at every step, so a redelivery, a second
 * timer or a settlement already paid or cancelled changes nothing. */
static mq_handler_result pay_on_timeout(const mq_envelope *env, const mq_delivery_info *info,
                                        void *arg)
{
    payment *pay = arg;
    jsonin_err err = {{0}};
    int64_t sid, uid, cid;
    (void)info;
    if (jsonin_int64(env->data, "settlementId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &sid, &err) ||
        jsonin_int64(env->data, "userId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &uid, &err) ||
        jsonin_int64(env->data, "couponId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &cid, &err)) {
        log_error(NULL, "payment: bad %s message %s: %s", EVENT_PAYMENT_TIMEOUT, env->key, err.msg);
        return MQ_DEAD;
    }
    pay_waiter *w = calloc(1, sizeof(*w));
    pay_op *op = reqjob_new(NULL, sizeof(*op), pay_clear);
    if (!w || !op) {
        free(w);
        reqjob_free((reqjob *)op); /* NULL is fine */
        return MQ_RETRY;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->refs = 2;
    op->pay = pay;
    op->kind = PAY_TIMEOUT;
    op->waiter = w;
    op->user_id = uid;
    op->coupon_id = cid;
    op->settlement_id = sid;
    if (env->request_id)
        snprintf(op->rj.request_id, sizeof(op->rj.request_id), "%s", env->request_id);
    if (bridge_post(service_bridge(pay->svc), pay_timeout_start, op) != QN_OK) {
        op->waiter = NULL; /* never started: nothing to hear */
        reqjob_free(&op->rj);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return MQ_RETRY;
    }
    struct timespec until = now_deadline(CLOCK_REALTIME, PAY_CONSUMER_WAIT * 1000);
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        if (pthread_cond_timedwait(&w->cv, &w->mu, &until) != 0)
            break;
    int done = w->done, status = w->status;
    pthread_mutex_unlock(&w->mu);
    pay_waiter_unref(w);
    if (!done)
        return MQ_RETRY; /* the op finishes on the loop anyway; the redelivery finds it done */
    if (status == 200)
        log_info(NULL, "payment: settlement %" PRId64 " timed out, coupon %" PRId64 " released",
                 sid, cid);
    if (status == 429)
        return MQ_REQUEUE_LATER;
    if (status >= 500)
        return MQ_RETRY;
    return MQ_ACK; /* done, or nothing to do (paid, cancelled, gone) */
}

/* ------------------------------------------------------------------ init */

static qn_status payment_start(service *s, void **state)
{
    payment *pay = calloc(1, sizeof(*pay));
    if (!pay)
        return QN_ENOMEM;
    *state = pay;
    pay->svc = s;
    pay->common = service_cfg(s);
    pay->cfg = &pay_cfg;
    pay->redis = service_redis(s);
    return QN_OK;
}

/* After the consumer thread stopped and the loop's ops are gone. */
static void payment_free(void *state)
{
    free(state);
}

static const config_var payment_vars[] = {
    {"QUAN_PAYMENT_LOCK_TIMEOUT_S", CONFIG_INT, offsetof(pay_settings, payment_lock_timeout_s),
     "900", 10, 86400, NULL, 0, "a coupon locked for an order returns to unused after this"},
};

const service_module payment_module = {
    .name = "payment",
    .vars = payment_vars,
    .nvars = sizeof(payment_vars) / sizeof(payment_vars[0]),
    .settings = &pay_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/engine/user-coupon/create-payment-record", pay_handle_create,
             HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/user-coupon/process-payment", pay_handle_process,
             HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/user-coupon/process-refund", pay_handle_refund,
             HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/user-coupon/cancel-payment", pay_handle_cancel,
             HTTP_NEED_USER},
            {0},
        },
    .consumers =
        (const service_consumer[]){
            /* a coupon still locked for an order when its lock times out: back to unused */
            {"engine.payment-timeout", (const char *const[]){EVENT_PAYMENT_TIMEOUT, NULL},
             pay_on_timeout},
            {0},
        },
    .start = payment_start,
    .free = payment_free,
};
