/* Group commit on a PostgreSQL pool (pgbatch.h). */
#include "pgbatch.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

#define PB_BUCKETS 64 /* a flash sale has a few hot templates; the chains stay short */

/* A group with items waiting or in flight. */
typedef struct pb_group pb_group;
struct pb_group {
    int64_t key;
    pgpool *pool;
    pb_group *next; /* bucket chain */
    size_t inflight;
    int held; /* a call on the stack uses it: not freed even when idle */
    void **wait;
    size_t nwait, cap;
};

/* One transaction; the loop thread leaves its items alone until pb_done. */
typedef struct pb_batch {
    pgbatch *b;
    pb_group *g;
    size_t n;
    void *items[];
} pb_batch;

struct pgbatch {
    pgbatch_opts o;
    pb_group *buckets[PB_BUCKETS];
};

static size_t pb_bucket(int64_t key)
{
    return (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 58); /* 6 bits: PB_BUCKETS */
}

pgbatch *pgbatch_new(const pgbatch_opts *opts)
{
    if (!opts->batch_max || !opts->wait_max || !opts->inflight_max || !opts->work || !opts->done)
        return NULL;
    pgbatch *b = calloc(1, sizeof(*b));
    if (b)
        b->o = *opts;
    return b;
}

void pgbatch_free(pgbatch *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < PB_BUCKETS; i++)
        for (pb_group *g = b->buckets[i], *next; g; g = next) {
            next = g->next;
            free(g->wait);
            free(g);
        }
    free(b);
}

static pb_group *pb_find(pgbatch *b, int64_t key)
{
    for (pb_group *g = b->buckets[pb_bucket(key)]; g; g = g->next)
        if (g->key == key)
            return g;
    return NULL;
}

/* Frees g once nothing waits or flies and no call holds it. */
static void pb_drop_idle(pgbatch *b, pb_group *g)
{
    if (g->inflight || g->nwait || g->held)
        return;
    pb_group **p = &b->buckets[pb_bucket(g->key)];
    while (*p != g)
        p = &(*p)->next;
    *p = g->next;
    free(g->wait);
    free(g);
}

/* Takes n items off the front of g's queue. */
static void pb_shift(pb_group *g, size_t n)
{
    g->nwait -= n;
    memmove(g->wait, g->wait + n, g->nwait * sizeof(*g->wait));
}

static qn_status pb_work(pgpool_conn *conn, void *arg)
{
    pb_batch *bt = arg;
    return bt->b->o.work(conn, bt->items, bt->n, bt->b->o.arg);
}

static void pb_done(qn_status st, void *arg);

/* A transaction of the first waiting items of g. On failure the queue is as it was. */
static qn_status pb_start(pgbatch *b, pb_group *g)
{
    size_t n = g->nwait < b->o.batch_max ? g->nwait : b->o.batch_max;
    pb_batch *bt = malloc(sizeof(*bt) + n * sizeof(bt->items[0]));
    if (!bt)
        return QN_ENOMEM;
    bt->b = b;
    bt->g = g;
    bt->n = n;
    memcpy(bt->items, g->wait, n * sizeof(bt->items[0]));
    qn_status st = pgpool_submit(g->pool, pb_work, pb_done, bt);
    if (st != QN_OK) {
        free(bt);
        return st;
    }
    g->inflight++;
    pb_shift(g, n);
    return QN_OK;
}

/* Starts what g may have in flight; the items a transaction cannot be started for are answered
 * with the reason (a batch at a time, one at a time when even their list cannot be had). */
static void pb_next(pgbatch *b, pb_group *g)
{
    while (g->inflight < b->o.inflight_max && g->nwait > 0) {
        qn_status st = pb_start(b, g);
        if (st == QN_OK)
            continue;
        size_t n = g->nwait < b->o.batch_max ? g->nwait : b->o.batch_max;
        void **failed = malloc(n * sizeof(*failed));
        if (!failed)
            n = 1;
        void *one = g->wait[0];
        if (failed)
            memcpy(failed, g->wait, n * sizeof(*failed));
        pb_shift(g, n);
        b->o.done(st == QN_ENOMEM ? QN_ENOMEM : QN_EBUSY, failed ? failed : &one, n, b->o.arg);
        free(failed);
    }
}

static void pb_done(qn_status st, void *arg)
{
    pb_batch *bt = arg;
    pgbatch *b = bt->b;
    pb_group *g = bt->g;
    g->inflight--;
    g->held++; /* done may submit to g again, or fail its last item */
    pb_next(b, g);
    b->o.done(st, bt->items, bt->n, b->o.arg);
    g->held--;
    free(bt);
    pb_drop_idle(b, g);
}

qn_status pgbatch_submit(pgbatch *b, pgpool *pool, int64_t key, void *item)
{
    pb_group *g = pb_find(b, key);
    if (!g) {
        if (!(g = calloc(1, sizeof(*g))))
            return QN_ENOMEM;
        g->key = key;
        g->pool = pool;
        size_t k = pb_bucket(key);
        g->next = b->buckets[k];
        b->buckets[k] = g;
    }
    qn_status st = QN_EBUSY;
    if (g->nwait >= b->o.wait_max)
        goto refused;
    if ((st = grow(&g->wait, &g->cap, g->nwait + 1, sizeof(*g->wait), 16)) != QN_OK)
        goto refused;
    g->wait[g->nwait++] = item;
    if (g->inflight >= b->o.inflight_max) /* the transaction in flight ending takes it */
        return QN_OK;
    /* A free slot means nothing waited (pb_next fills slots first), so the batch is item
     * alone; only inside a done that pb_next calls can older items still be ahead of it. */
    if ((st = pb_start(b, g)) == QN_OK)
        return QN_OK;
    g->nwait--; /* the last one is item */
refused:
    pb_drop_idle(b, g);
    return st;
}
