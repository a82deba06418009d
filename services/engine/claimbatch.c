/* Group commit of synchronous claims (claimbatch.h). */
#include "claimbatch.h"

#include <stdlib.h>
#include <string.h>

#include "claimq.h"
#include "log.h"
#include "metrics.h"
#include "outbox.h"
#include "pgbatch.h"

METRICS_DEFINE(CLAIMBATCH_METRICS)

struct claimbatch {
    service *svc;
    pgbatch *steps[2]; /* by claimbatch_step */
};

static claimbatch_claim *cb_claim(void *const *claims, size_t i)
{
    return claims[i];
}

/* The claims' items side by side (as claimdb takes them), copied in; NULL when out of memory. */
static claimdb_item *cb_items_in(void *const *claims, size_t n)
{
    claimdb_item *items = malloc(n * sizeof(*items));
    for (size_t i = 0; items && i < n; i++)
        items[i] = *cb_claim(claims, i)->item;
    return items;
}

/* Each claim's outcome back into its own item (the loop thread reads it once done runs). */
static void cb_items_out(void *const *claims, claimdb_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        *cb_claim(claims, i)->item = items[i];
    free(items);
}

/* ---- the transaction (the pool's thread) ---- */

/* The checks of the claims whose stock was taken: of a coupon written here, and of a claim
 * whose coupon goes to the other database next. One statement. */
static qn_status cb_checks(pgpool_conn *c, int ds, void *const *claims, const claimdb_item *items,
                           size_t n)
{
    outbox_event *ev = calloc(n, sizeof(*ev));
    char(*data)[CLAIMQ_CLAIM_JSON] = malloc(n * sizeof(*data));
    char(*key)[CLAIMQ_ATTEMPT_KEY] = malloc(n * sizeof(*key));
    qn_status st = QN_ENOMEM;
    size_t m = 0;
    if (!ev || !data || !key)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const claimdb_item *it = &items[i];
        int same_db = it->user_ds == ds;
        if ((same_db && it->state == CLAIMDB_NEW) || (!same_db && it->state == CLAIMDB_PENDING)) {
            const claimbatch_claim *cl = cb_claim(claims, i);
            claimq_check_event(&ev[m], data[m], key[m], &it->c, it->bkt, it->nbkt, cl->request_id,
                               cl->check_due_ms);
            m++;
        }
    }
    st = outbox_add_many(c, ev, m);
out:
    free(ev);
    free(data);
    free(key);
    return st;
}

/* While PostgreSQL is down every shared transaction fails: one line a second of each kind (with how
 * many were held back) tells as much as one per transaction. */
static log_limit cb_stock_failed_log, cb_coupons_failed_log;

/* Work never returns QN_EBUSY or QN_ENOMEM: done takes those for a transaction the pool refused
 * (pgbatch.h), which did not run. */
static qn_status cb_work_stock(pgpool_conn *c, void *const *claims, size_t n, void *arg)
{
    (void)arg;
    claimdb_item *items = cb_items_in(claims, n);
    if (!items)
        return QN_ERR;
    int ds = items[0].tpl_ds;
    qn_status st;
    /* claimdb_insert_coupons takes only the items whose user is in this database, and
     * claimdb_give_back only those it refused: the others are still PENDING. */
    if (pgpool_begin(c) != QN_OK || claimdb_take_stock(c, ds, items, n) != QN_OK ||
        claimdb_insert_coupons(c, ds, items, n) != QN_OK ||
        claimdb_give_back(c, ds, items, n) != QN_OK ||
        cb_checks(c, ds, claims, items, n) != QN_OK) {
        log_warn_limited(&cb_stock_failed_log, NULL,
                         ((log_field[]){LOG_I("ds", ds), LOG_I("template", items[0].c.template_id),
                                        LOG_I("claims", (int64_t)n),
                                        LOG_S("error", pgpool_conn_error(c)), LOG_END}),
                         "claim: the claims' transaction failed; nothing of it was written");
        (void)pgpool_rollback(c);
        st = QN_ERR;
    } else {
        st = pgpool_commit(c); /* QN_EUNKNOWN: committed or not, the answer was lost */
    }
    cb_items_out(claims, items, n);
    return st;
}

static qn_status cb_work_coupons(pgpool_conn *c, void *const *claims, size_t n, void *arg)
{
    (void)arg;
    claimdb_item *items = cb_items_in(claims, n);
    if (!items)
        return QN_ERR;
    int ds = items[0].user_ds;
    qn_status st;
    if (pgpool_begin(c) != QN_OK || claimdb_insert_coupons(c, ds, items, n) != QN_OK) {
        log_warn_limited(&cb_coupons_failed_log, NULL,
                         ((log_field[]){LOG_I("ds", ds), LOG_I("claims", (int64_t)n),
                                        LOG_S("error", pgpool_conn_error(c)), LOG_END}),
                         "claim: the coupons' transaction failed; nothing of it was written");
        (void)pgpool_rollback(c);
        st = QN_ERR;
    } else {
        st = pgpool_commit(c);
    }
    cb_items_out(claims, items, n);
    return st;
}

/* ---- the loop thread ---- */

/* Each claim of a transaction goes on as if written alone. */
static void cb_done(qn_status st, void *const *claims, size_t n, claimbatch_step step)
{
    const char *name = step == CLAIMBATCH_STOCK ? "stock" : "coupon";
    if (st != QN_EBUSY && st != QN_ENOMEM) { /* it ran */
        log_at(LOGL_DEBUG, NULL,
               ((log_field[]){LOG_S("step", name),
                              LOG_I("key", step == CLAIMBATCH_STOCK
                                               ? cb_claim(claims, 0)->item->c.template_id
                                               : cb_claim(claims, 0)->item->user_ds),
                              LOG_I("claims", (int64_t)n), LOG_END}),
               "claim: a transaction of claims ended");
        metrics_inc_l(&metric_quan_claim_transactions_total, name);
        metrics_add_l(&metric_quan_claim_transaction_claims_total, (int64_t)n, name);
    }
    for (size_t i = 0; i < n; i++) {
        const claimbatch_claim *c = cb_claim(claims, i);
        c->done(st, c->arg);
    }
}

static void cb_done_stock(qn_status st, void *const *claims, size_t n, void *arg)
{
    (void)arg;
    cb_done(st, claims, n, CLAIMBATCH_STOCK);
}

static void cb_done_coupons(qn_status st, void *const *claims, size_t n, void *arg)
{
    (void)arg;
    cb_done(st, claims, n, CLAIMBATCH_COUPON);
}

claimbatch *claimbatch_new(service *svc)
{
    claimbatch *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->svc = svc;
    pgbatch_opts o = {.batch_max = CLAIMBATCH_MAX,
                      .wait_max = CLAIMBATCH_WAIT_MAX,
                      .inflight_max = 1,
                      .work = cb_work_stock,
                      .done = cb_done_stock};
    b->steps[CLAIMBATCH_STOCK] = pgbatch_new(&o);
    o.work = cb_work_coupons;
    o.done = cb_done_coupons;
    b->steps[CLAIMBATCH_COUPON] = pgbatch_new(&o);
    if (!b->steps[CLAIMBATCH_STOCK] || !b->steps[CLAIMBATCH_COUPON]) {
        claimbatch_free(b);
        return NULL;
    }
    return b;
}

void claimbatch_free(claimbatch *b)
{
    if (!b)
        return;
    pgbatch_free(b->steps[CLAIMBATCH_STOCK]);
    pgbatch_free(b->steps[CLAIMBATCH_COUPON]);
    free(b);
}

qn_status claimbatch_submit(claimbatch *b, claimbatch_step step, claimbatch_claim *c)
{
    int stock = step == CLAIMBATCH_STOCK;
    int ds = stock ? c->item->tpl_ds : c->item->user_ds;
    int64_t key = stock ? c->item->c.template_id : ds;
    return pgbatch_submit(b->steps[step], service_pg(b->svc, ds), key, c);
}
