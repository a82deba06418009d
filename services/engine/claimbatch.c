/* Group commit of synchronous claims (claimbatch.h). */
#include "claimbatch.h"

#include <stdlib.h>
#include <string.h>

#include "claimq.h"
#include "grow.h"
#include "log.h"
#include "metrics.h"
#include "outbox.h"

#define CB_BUCKETS 64 /* a flash sale has a few hot templates; the chains stay short */

typedef struct cb_group cb_group;

/* One transaction: copies of its claims and of their items, read and written by the pool's
 * thread while it runs; the loop thread leaves them alone until cb_done. */
typedef struct cb_batch {
    claimbatch *b;
    cb_group *g;
    int ds;
    size_t n;
    claimbatch_claim *claims;
    claimdb_item *items;
} cb_batch;

/* A template (or a database's coupons) with claims in flight: one transaction (busy) and those
 * waiting for the next. */
struct cb_group {
    claimbatch_step step;
    int64_t key;    /* the template, or the coupons' database */
    cb_group *next; /* bucket chain */
    int busy;
    claimbatch_claim *wait;
    size_t nwait, cap;
};

struct claimbatch {
    service *svc;
    cb_group *buckets[CB_BUCKETS];
};

static size_t cb_bucket(claimbatch_step step, int64_t key)
{
    uint64_t h = ((uint64_t)key + (uint64_t)step) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 58); /* 6 bits: CB_BUCKETS */
}

claimbatch *claimbatch_new(service *svc)
{
    claimbatch *b = calloc(1, sizeof(*b));
    if (b)
        b->svc = svc;
    return b;
}

void claimbatch_free(claimbatch *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < CB_BUCKETS; i++)
        for (cb_group *g = b->buckets[i], *next; g; g = next) {
            next = g->next;
            free(g->wait);
            free(g);
        }
    free(b);
}

static void cb_batch_free(cb_batch *bt)
{
    if (!bt)
        return;
    free(bt->claims);
    free(bt->items);
    free(bt);
}

/* ---- the transaction (the pool's thread) ---- */

/* The checks of the claims whose stock was taken: of a coupon written here, and of a claim
 * whose coupon goes to the other database next. One statement. */
static qn_status cb_checks(pgpool_conn *c, const cb_batch *bt)
{
    outbox_event *ev = calloc(bt->n, sizeof(*ev));
    char(*data)[CLAIMQ_CLAIM_JSON] = malloc(bt->n * sizeof(*data));
    char(*key)[CLAIMQ_ATTEMPT_KEY] = malloc(bt->n * sizeof(*key));
    qn_status st = QN_ENOMEM;
    size_t m = 0;
    if (!ev || !data || !key)
        goto out;
    for (size_t i = 0; i < bt->n; i++) {
        const claimdb_item *it = &bt->items[i];
        int same_db = it->user_ds == bt->ds;
        if ((same_db && it->state == CLAIMDB_NEW) || (!same_db && it->state == CLAIMDB_PENDING)) {
            claimq_check_event(&ev[m], data[m], key[m], &it->c, bt->claims[i].request_id,
                               bt->claims[i].check_due_ms);
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

static qn_status cb_work_stock(pgpool_conn *c, void *arg)
{
    cb_batch *bt = arg;
    /* claimdb_insert_coupons takes only the items whose user is in this database, and
     * claimdb_give_back only those it refused: the others are still PENDING. */
    if (pgpool_begin(c) != QN_OK || claimdb_take_stock(c, bt->ds, bt->items, bt->n) != QN_OK ||
        claimdb_insert_coupons(c, bt->ds, bt->items, bt->n) != QN_OK ||
        claimdb_give_back(c, bt->ds, bt->items, bt->n) != QN_OK || cb_checks(c, bt) != QN_OK) {
        log_warn_limited(&cb_stock_failed_log, NULL,
                         ((log_field[]){LOG_I("ds", bt->ds), LOG_I("template", bt->g->key),
                                        LOG_I("claims", (int64_t)bt->n),
                                        LOG_S("error", pgpool_conn_error(c)), LOG_END}),
                         "claim: the claims' transaction failed; nothing of it was written");
        (void)pgpool_rollback(c);
        return QN_ERR;
    }
    return pgpool_commit(c); /* QN_EUNKNOWN: committed or not, the answer was lost */
}

static qn_status cb_work_coupons(pgpool_conn *c, void *arg)
{
    cb_batch *bt = arg;
    if (pgpool_begin(c) != QN_OK || claimdb_insert_coupons(c, bt->ds, bt->items, bt->n) != QN_OK) {
        log_warn_limited(&cb_coupons_failed_log, NULL,
                         ((log_field[]){LOG_I("ds", bt->ds), LOG_I("claims", (int64_t)bt->n),
                                        LOG_S("error", pgpool_conn_error(c)), LOG_END}),
                         "claim: the coupons' transaction failed; nothing of it was written");
        (void)pgpool_rollback(c);
        return QN_ERR;
    }
    return pgpool_commit(c);
}

/* ---- the loop thread ---- */

static cb_group *cb_find(claimbatch *b, claimbatch_step step, int64_t key)
{
    for (cb_group *g = b->buckets[cb_bucket(step, key)]; g; g = g->next)
        if (g->step == step && g->key == key)
            return g;
    return NULL;
}

static void cb_drop(claimbatch *b, cb_group *g)
{
    cb_group **p = &b->buckets[cb_bucket(g->step, g->key)];
    while (*p != g)
        p = &(*p)->next;
    *p = g->next;
    free(g->wait);
    free(g);
}

static void cb_done(qn_status st, void *arg);

/* Starts a transaction with the first waiting claims of g. On failure the queue is as it was. */
static qn_status cb_start(claimbatch *b, cb_group *g)
{
    size_t n = g->nwait < CLAIMBATCH_MAX ? g->nwait : CLAIMBATCH_MAX;
    cb_batch *bt = calloc(1, sizeof(*bt));
    if (!bt || !(bt->claims = malloc(n * sizeof(*bt->claims))) ||
        !(bt->items = malloc(n * sizeof(*bt->items)))) {
        cb_batch_free(bt);
        return QN_ENOMEM;
    }
    bt->b = b;
    bt->g = g;
    bt->n = n;
    memcpy(bt->claims, g->wait, n * sizeof(*bt->claims));
    for (size_t i = 0; i < n; i++)
        bt->items[i] = *bt->claims[i].item;
    int stock = g->step == CLAIMBATCH_STOCK;
    bt->ds = stock ? bt->items[0].tpl_ds : bt->items[0].user_ds;
    qn_status st = pgpool_submit(service_pg(b->svc, bt->ds),
                                 stock ? cb_work_stock : cb_work_coupons, cb_done, bt);
    if (st != QN_OK) {
        cb_batch_free(bt);
        return st;
    }
    g->busy = 1;
    g->nwait -= n;
    memmove(g->wait, g->wait + n, g->nwait * sizeof(*g->wait));
    return QN_OK;
}

/* g has no transaction in flight: the next one for its waiting claims; those the pool will not
 * take fail (busy). A done called here may submit again (the loop sees it); g goes once idle. */
static void cb_next(claimbatch *b, cb_group *g)
{
    while (!g->busy && g->nwait > 0) {
        qn_status st = cb_start(b, g);
        if (st == QN_OK)
            break;
        size_t n = g->nwait < CLAIMBATCH_MAX ? g->nwait : CLAIMBATCH_MAX;
        claimbatch_claim *failed = malloc(n * sizeof(*failed));
        if (!failed) /* cannot even fail them in order: fail one at a time */
            n = 1;
        claimbatch_claim one = g->wait[0];
        if (failed)
            memcpy(failed, g->wait, n * sizeof(*failed));
        g->nwait -= n;
        memmove(g->wait, g->wait + n, g->nwait * sizeof(*g->wait));
        for (size_t i = 0; i < n; i++) {
            const claimbatch_claim *c = failed ? &failed[i] : &one;
            c->done(st == QN_ENOMEM ? QN_ENOMEM : QN_EBUSY, c->arg);
        }
        free(failed);
    }
    if (!g->busy && g->nwait == 0)
        cb_drop(b, g);
}

static void cb_done(qn_status st, void *arg)
{
    cb_batch *bt = arg;
    bt->g->busy = 0;
    log_at(LOGL_DEBUG, NULL,
           ((log_field[]){LOG_I("step", bt->g->step), LOG_I("key", bt->g->key),
                          LOG_I("claims", (int64_t)bt->n), LOG_I("waiting", (int64_t)bt->g->nwait),
                          LOG_END}),
           "claim: a transaction of claims ended");
    const char *step = bt->g->step == CLAIMBATCH_STOCK ? "stock" : "coupon";
    metrics_inc_l(METRIC_quan_claim_transactions_total, step);
    metrics_add_l(METRIC_quan_claim_transaction_claims_total, (int64_t)bt->n, step);
    cb_next(bt->b, bt->g); /* the database is given the next ones before these are answered */
    for (size_t i = 0; i < bt->n; i++) {
        *bt->claims[i].item = bt->items[i];
        bt->claims[i].done(st, bt->claims[i].arg);
    }
    cb_batch_free(bt);
}

qn_status claimbatch_submit(claimbatch *b, claimbatch_step step, const claimbatch_claim *c)
{
    int64_t key = step == CLAIMBATCH_STOCK ? c->item->c.template_id : c->item->user_ds;
    cb_group *g = cb_find(b, step, key);
    if (!g) {
        if (!(g = calloc(1, sizeof(*g))))
            return QN_ENOMEM;
        g->step = step;
        g->key = key;
        size_t k = cb_bucket(step, key);
        g->next = b->buckets[k];
        b->buckets[k] = g;
    }
    if (g->nwait >= CLAIMBATCH_WAIT_MAX)
        return QN_EBUSY;
    if (grow(&g->wait, &g->cap, g->nwait + 1, sizeof(*g->wait), 16) != QN_OK) {
        if (!g->busy && g->nwait == 0)
            cb_drop(b, g);
        return QN_ENOMEM;
    }
    g->wait[g->nwait++] = *c;
    if (g->busy || g->nwait > 1) /* the transaction in flight, or cb_next, takes it next */
        return QN_OK;
    qn_status st = cb_start(b, g);
    if (st != QN_OK) {
        g->nwait = 0;
        cb_drop(b, g);
    }
    return st;
}
