/* Template query chain (query.h). */
#include "query.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloom.h"
#include "bucket.h"
#include "bucketsum.h"
#include "jsonout.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "rcopy.h"
#include "rtrack.h"
#include "shard.h"

METRICS_DEFINE(QUERY_METRICS)

#define QUERY_LOCK_WAIT_MS  3000
#define QUERY_LOCK_LEASE_MS 10000 /* a database read takes far less; no watchdog needed */
#define QUERY_FILLS_MAX     8     /* background reads of copies (query_copy_fill) in flight */

/* A template as its cache hash had it, with its answer's data written once. */
typedef struct query_copy {
    int refs;
    uint64_t serial; /* this copy among all the process made (query_copy_settled names it) */
    int settled;     /* claim.lua said "sold out" with nothing in doubt, of this copy's stock */
    tpl t;
    char *json; /* tpl_json_write's text */
    size_t len;
} query_copy;

typedef struct query_settings {
    int64_t null_ttl_ms;    /* how long a miss is remembered */
    int64_t query_copies;   /* templates kept in the process (0: none) */
    int64_t bloom_expected; /* as merchant-admin's: both compute one bloom_params */
    int64_t bloom_fp_per_million;
} query_settings;

/* Read at start; the running module reads them through its context. */
static query_settings query_cfg;

struct query {
    service *svc;
    const service_config *common;
    const query_settings *cfg;
    redis_client *redis; /* the service's */
    bloom_params bloom;
    /* Step 1 kept in the process: the hashes read on a connection of their own (scripts read
     * keys too, and tracking the engine's own connection would have Redis tell of every key a
     * claim touches), told of changes by rtrack. NULL when QUAN_QUERY_COPIES is 0. */
    redis_client *reader;
    rtrack *track;
    rcopy *copies;
    int closing;
    int fills;                 /* query_copy_fill's reads in flight */
    uint64_t serials;          /* the copies made so far (query_copy.serial) */
    metrics_handle lookups[2]; /* miss, hit */
};

typedef struct query_job {
    query *q;
    int64_t shop, id;
    query_cb cb;
    void *arg;
    lock_handle *lock;
    qn_status st; /* outcome carried to the release callback */
    tpl t;        /* the template once found (owned) */
    int have_t;
    query_copy *copy; /* or there (one reference) */
    uint64_t epoch, ticket;
    query_copy *tracking; /* a copy of N > 1 buckets waiting for its buckets' reads (below) */
    int bucket_reads;     /* ... those still unanswered */
    int bucket_failed;    /* ... one failed: the copy answers, but is not kept */
    char key[KEYS_LEN], null_key[KEYS_LEN];
} query_job;

static void query_copy_release(void *p)
{
    query_copy *c = p;
    if (c && --c->refs == 0) {
        tpl_clear(&c->t);
        free(c->json);
        free(c);
    }
}

/* Takes over t's strings (t is left cleared either way). NULL on allocation failure. */
static query_copy *query_copy_new(query *q, tpl *t)
{
    query_copy *c = calloc(1, sizeof(*c));
    if (!c) {
        tpl_clear(t);
        return NULL;
    }
    c->refs = 1;
    c->serial = ++q->serials;
    c->t = *t;
    memset(t, 0, sizeof(*t));
    if (!(c->json = jsonout_render(tpl_json_write, &c->t, &c->len))) {
        query_copy_release(c);
        return NULL;
    }
    return c;
}

static int query_copy_write(struct evbuffer *b, const void *arg)
{
    const query_copy *c = arg;
    return evbuffer_add(b, c->json, c->len);
}

static void query_finish(query_job *j, qn_status st)
{
    j->cb(st, st != QN_OK ? NULL : j->copy ? &j->copy->t : &j->t, j->arg);
    if (j->have_t)
        tpl_clear(&j->t);
    query_copy_release(j->copy);
    free(j);
}

static void query_on_released(int released, void *arg)
{
    (void)released;
    query_job *j = arg;
    query_finish(j, j->st);
}

/* Gives the lock back (if held), then answers. */
static void query_end(query_job *j, qn_status st)
{
    j->st = st;
    if (j->lock) {
        lock_handle *h = j->lock;
        j->lock = NULL;
        lock_release(h, query_on_released, j);
        return;
    }
    query_finish(j, st);
}

/* A complete hash of the right shop; QN_ENOTFOUND for an empty hash or another shop's,
 * QN_EINVAL for a partial one (treated as a miss: never served). */
static qn_status query_from_hash(query_job *j, const redisReply *r)
{
    qn_status st = tpl_from_cache(r, &j->t);
    if (st != QN_OK)
        return st;
    j->have_t = 1;
    if (j->t.shop_number != j->shop || j->t.id != j->id) {
        tpl_clear(&j->t);
        j->have_t = 0;
        return QN_ENOTFOUND;
    }
    return QN_OK;
}

static int query_null_matches(const query_job *j, const redisReply *r)
{
    char shop[24];
    if (!r || r->type != REDIS_REPLY_STRING)
        return 0;
    snprintf(shop, sizeof(shop), "%" PRId64, j->shop);
    return strcmp(r->str, shop) == 0;
}

/* ---- step 4: under the lock ---- */

static void query_on_null_set(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r;
    query_job *j = arg;
    if (err)
        log_warn(NULL, "query: template %" PRId64 ": cannot set the null marker: %s", j->id, err);
    query_end(j, QN_ENOTFOUND);
}

static void query_on_put(qn_status st, void *arg)
{
    query_job *j = arg;
    if (st != QN_OK) /* the answer is still right; the next query tries again */
        log_warn(NULL, "query: template %" PRId64 ": cannot cache every bucket", j->id);
    query_end(j, QN_OK);
}

static qn_status query_db_work(pgpool_conn *conn, void *arg)
{
    query_job *j = arg;
    qn_status st = tpl_db_load(conn, j->shop, j->id, &j->t);
    if (st == QN_OK)
        j->have_t = 1;
    return st;
}

static void query_db_done(qn_status st, void *arg)
{
    query_job *j = arg;
    if (st == QN_OK) {
        metrics_inc_l(&metric_quan_template_db_loads_total, "found");
        if (bucket_cache_put(j->q->redis, &j->t, j->t.stock, query_on_put, j) != QN_OK)
            query_end(j, QN_OK);
        return;
    }
    if (st == QN_ENOTFOUND) {
        metrics_inc_l(&metric_quan_template_db_loads_total, "absent");
        char shop[24], ttl[24];
        snprintf(shop, sizeof(shop), "%" PRId64, j->shop);
        snprintf(ttl, sizeof(ttl), "%" PRId64, j->q->cfg->null_ttl_ms);
        if (redis_command(j->q->redis, query_on_null_set, j, "SET %s %s PX %s", j->null_key, shop,
                          ttl) != QN_OK)
            query_end(j, QN_ENOTFOUND);
        return;
    }
    if (j->have_t) {
        tpl_clear(&j->t);
        j->have_t = 0;
    }
    query_end(j, st == QN_EINVAL ? QN_ENOTFOUND : QN_ERR);
}

/* The hash step, before and after the lock: 1 when the reply settles j (a hit, another shop's
 * template: 404, or a Redis error) and j has ended. */
static int query_hash_settles(query_job *j, const redisReply *r, const char *err)
{
    if (err) {
        query_end(j, QN_ERR);
        return 1;
    }
    qn_status st = query_from_hash(j, r);
    if (st == QN_OK || (st == QN_ENOTFOUND && r->elements > 0)) {
        query_end(j, st);
        return 1;
    }
    return 0;
}

/* The null-marker step, before and after the lock: 1 when the reply settles j (marked absent,
 * or a Redis error) and j has ended. */
static int query_null_settles(query_job *j, const redisReply *r, const char *err)
{
    if (err) {
        query_end(j, QN_ERR);
        return 1;
    }
    if (query_null_matches(j, r)) {
        query_end(j, QN_ENOTFOUND);
        return 1;
    }
    return 0;
}

static void query_on_locked_hash(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    query_job *j = arg;
    if (query_hash_settles(j, r, err))
        return;
    shard_route route;
    if (shard_route_for("t_coupon_template", j->shop, &route) != QN_OK) {
        query_end(j, QN_ENOTFOUND);
        return;
    }
    if (pgpool_submit(service_pg(j->q->svc, route.ds), query_db_work, query_db_done, j) != QN_OK)
        query_end(j, QN_EAGAIN);
}

static void query_on_locked_null(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    query_job *j = arg;
    if (query_null_settles(j, r, err))
        return;
    if (redis_command(j->q->redis, query_on_locked_hash, j, "HGETALL %s", j->key) != QN_OK)
        query_end(j, QN_ERR);
}

static void query_on_lock(lock_handle *h, lock_outcome o, void *arg)
{
    query_job *j = arg;
    if (o != LOCK_ACQUIRED) {
        query_end(j, o == LOCK_FAILED_ERROR ? QN_ERR : QN_EBUSY);
        return;
    }
    j->lock = h;
    if (redis_command(j->q->redis, query_on_locked_null, j, "GET %s", j->null_key) != QN_OK)
        query_end(j, QN_ERR);
}

/* ---- steps 1-3: no lock ---- */

static void query_on_null(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    query_job *j = arg;
    char lock_key[KEYS_LEN];
    if (query_null_settles(j, r, err))
        return;
    keys_template_lock(lock_key, j->id);
    lock_opts lo = {.name = lock_key,
                    .wait_ms = QUERY_LOCK_WAIT_MS,
                    .lease_ms = QUERY_LOCK_LEASE_MS,
                    .strategy = LOCK_FAIL_AFTER_RETRY_TIMEOUT};
    if (lock_acquire(j->q->redis, &lo, query_on_lock, j) != QN_OK)
        query_end(j, QN_ERR);
}

static void query_on_bloom(int result, void *arg)
{
    query_job *j = arg;
    if (result == BLOOM_ABSENT) {
        query_end(j, QN_ENOTFOUND);
        return;
    }
    if (redis_command(j->q->redis, query_on_null, j, "GET %s", j->null_key) != QN_OK)
        query_end(j, QN_ERR);
}

static void query_on_hash(redis_client *c, const redisReply *r, const char *err, void *arg);

/* The copy of a template of N > 1 buckets is kept only once the reader has read every bucket's
 * hash too: Redis then tells of a change to any of them (query_on_invalidate), and a stock
 * given back into bucket 2 drops the copy as a change of bucket 0's hash does. Without that, a
 * copy marked sold out would go on refusing while another bucket holds stock again. */
static void query_keep_copy(query_job *j)
{
    query_copy *copy = j->tracking;
    j->tracking = NULL;
    if (!j->bucket_failed)
        rcopy_put(j->q->copies, j->id, j->ticket, j->epoch, copy->t.valid_end_ms, copy);
    else
        query_copy_release(copy);
}

static void query_on_bucket_read(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r;
    query_job *j = arg;
    if (err)
        j->bucket_failed = 1;
    if (--j->bucket_reads == 0) {
        query_keep_copy(j);
        query_end(j, QN_OK);
    }
}

/* Reads buckets 1 .. N-1 of copy's template on the reader, then keeps the copy (unless a read
 * failed) and ends j, answered from j->copy. 0 when nothing could be sent: nothing is kept and
 * the caller ends j. */
static int query_track_buckets(query_job *j, query_copy *copy)
{
    int n = copy->t.buckets > BUCKET_MAX ? BUCKET_MAX : copy->t.buckets;
    copy->refs++;
    j->tracking = copy;
    j->bucket_reads = 1; /* until every read is sent */
    for (int b = 1; b < n; b++) {
        bucket_keys k;
        bucket_keys_of(&k, j->id, b, n);
        j->bucket_reads++;
        if (redis_command(j->q->reader, query_on_bucket_read, j, "HGET %s stock", k.hash) !=
            QN_OK) {
            j->bucket_reads--;
            j->bucket_failed = 1;
        }
    }
    if (--j->bucket_reads > 0)
        return 1;
    j->tracking = NULL;
    copy->refs--;
    return 0;
}

/* Step 1 on the tracked reader: a complete hash is kept (if nothing changed it meanwhile)
 * until it changes or the template ends, when Redis expires it. */
static void query_on_tracked_hash(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    query_job *j = arg;
    query *q = j->q;
    if (err) { /* the reader's trouble, not the template's: the engine's connection answers */
        if (q->closing || redis_command(q->redis, query_on_hash, j, "HGETALL %s", j->key) != QN_OK)
            query_end(j, QN_ERR);
        return;
    }
    tpl t = {0};
    if (tpl_from_cache(r, &t) == QN_OK && t.id == j->id) {
        int64_t end = t.valid_end_ms;
        query_copy *copy = query_copy_new(q, &t);
        if (copy) {
            int mine = copy->t.shop_number == j->shop;
            if (copy->t.buckets > 1) {
                /* kept once every bucket is read, by a job that answers from it */
                if (mine) {
                    j->copy = copy;
                    if (!query_track_buckets(j, copy))
                        query_end(j, QN_OK); /* answered; not kept */
                    return;
                }
            } else {
                copy->refs++;
                rcopy_put(q->copies, j->id, j->ticket, j->epoch, end, copy);
                if (mine) {
                    j->copy = copy;
                    query_end(j, QN_OK);
                    return;
                }
            }
            query_copy_release(copy);
        }
    } else {
        tpl_clear(&t);
    }
    query_on_hash(c, r, err, arg);
}

static void query_on_hash(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    query_job *j = arg;
    if (query_hash_settles(j, r, err))
        return;
    /* A hash that is there but cannot be read proves the id was created: the database decides,
     * not the bloom filter (which may have been built without it). */
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        query_on_bloom(BLOOM_PRESENT, j);
        return;
    }
    if (bloom_check(j->q->redis, KEYS_TEMPLATE_BLOOM, &j->q->bloom, j->id, query_on_bloom, j) !=
        QN_OK)
        query_on_bloom(BLOOM_UNKNOWN, j);
}

qn_status query_template(query *q, int64_t shop_number, int64_t id, query_cb cb, void *arg)
{
    query_job *j = calloc(1, sizeof(*j));
    if (!j)
        return QN_ENOMEM;
    j->q = q;
    j->shop = shop_number;
    j->id = id;
    j->cb = cb;
    j->arg = arg;
    keys_template(j->key, id);
    keys_template_null(j->null_key, id);
    j->epoch = q->track ? rtrack_epoch(q->track) : 0;
    if (j->epoch) {
        j->ticket = rcopy_ticket(q->copies, id);
        if (redis_command(q->reader, query_on_tracked_hash, j, "HGETALL %s", j->key) == QN_OK)
            return QN_OK;
    }
    if (redis_command(q->redis, query_on_hash, j, "HGETALL %s", j->key) != QN_OK) {
        free(j);
        return QN_ERR;
    }
    return QN_OK;
}

/* ---- HTTP ---- */

/* The answer of a template of N > 1 stock buckets: its stock as shown is the sum over the
 * buckets plus the units on their way (bucketsum.h), read now, one HGETALL a bucket. The copy
 * and the claims keep reading bucket 0's hash alone; a template of one bucket answers as it
 * is, with no read more. */
typedef struct query_sum {
    http_req *req;
    tpl t; /* owned: the strings copied, the stock replaced by the sum */
    int n, left, failed;
    struct query_sum_slot {
        struct query_sum *s;
        int b;
    } slot[BUCKET_MAX];
    bucketsum_bucket b[BUCKET_MAX];
} query_sum;

static void query_sum_free(query_sum *s)
{
    for (int b = 0; b < s->n; b++)
        bucketsum_clear(&s->b[b]);
    tpl_clear(&s->t);
    free(s);
}

/* One read fewer to wait for; the answer after the last. */
static void query_sum_done(query_sum *s)
{
    if (--s->left > 0)
        return;
    int64_t stock = s->failed ? -1 : bucketsum_total(s->b, s->n);
    if (stock < 0) {
        http_reply_error(s->req, ERRCODE_UNAVAILABLE, "template store unavailable");
    } else {
        s->t.stock = stock;
        http_reply_ok_write(s->req, tpl_json_write, &s->t);
    }
    query_sum_free(s);
}

static void query_sum_on_hash(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    struct query_sum_slot *slot = arg;
    query_sum *s = slot->s;
    if (err || bucketsum_read(&s->b[slot->b], r) != QN_OK)
        s->failed = 1;
    query_sum_done(s);
}

/* Answers req with t (N > 1 buckets) once every bucket is read. QN_OK: it will; else nothing
 * was sent and the caller answers. */
static qn_status query_sum_start(query *q, http_req *req, const tpl *t)
{
    int n = t->buckets > BUCKET_MAX ? BUCKET_MAX : t->buckets;
    query_sum *s = calloc(1, sizeof(*s));
    if (!s)
        return QN_ENOMEM;
    s->req = req;
    s->t = *t;
    s->t.name = strdup(t->name);
    s->t.goods = strdup(t->goods);
    s->t.receive_rule = strdup(t->receive_rule);
    s->t.consume_rule = strdup(t->consume_rule);
    if (!s->t.name || !s->t.goods || !s->t.receive_rule || !s->t.consume_rule) {
        query_sum_free(s);
        return QN_ENOMEM;
    }
    s->left = 1; /* one more than the reads until all are sent */
    for (int b = 0; b < n; b++) {
        bucket_keys k;
        bucket_keys_of(&k, t->id, b, n);
        s->slot[b] = (struct query_sum_slot){.s = s, .b = b};
        s->left++;
        s->n = b + 1;
        if (redis_command(q->redis, query_sum_on_hash, &s->slot[b], "HGETALL %s", k.hash) !=
            QN_OK) {
            s->left--;
            s->failed = 1;
            if (b == 0) {
                query_sum_free(s);
                return QN_ERR;
            }
            break;
        }
    }
    query_sum_done(s); /* the extra one */
    return QN_OK;
}

/* The HTTP query's chain: its request and the module. */
typedef struct query_http {
    query *q;
    http_req *req;
} query_http;

static void query_replied(qn_status st, const tpl *t, void *arg)
{
    query_http *h = arg;
    http_req *req = h->req;
    query *q = h->q;
    free(h);
    switch (st) {
    case QN_OK:
        if (t->buckets > 1 && query_sum_start(q, req, t) == QN_OK)
            break;
        http_reply_ok_write(req, tpl_json_write, t);
        break;
    case QN_ENOTFOUND:
        http_reply_error(req, ERRCODE_NOT_FOUND, "coupon template not found");
        break;
    case QN_EBUSY:
        http_reply_error(req, ERRCODE_BUSY, "the template is being loaded; try again");
        break;
    default:
        http_reply_error(req, ERRCODE_UNAVAILABLE, "template store unavailable");
        break;
    }
}

static qn_status query_read_id(http_req *req, const char *field, int64_t *out)
{
    qn_status st = http_param_i64(req, field, out);
    if (st == QN_ENOTFOUND) {
        http_reply_error(req, ERRCODE_INVALID, "%s: required", field);
        return st;
    }
    if (st != QN_OK || *out <= 0) {
        http_reply_error(req, ERRCODE_INVALID, "%s: must be a positive integer id", field);
        return QN_EINVAL;
    }
    return QN_OK;
}

/* The copy of id that is current now, or NULL. */
static const query_copy *query_copy_current(query *q, int64_t id)
{
    uint64_t epoch = q->track ? rtrack_epoch(q->track) : 0;
    return epoch ? rcopy_get(q->copies, id, epoch, now_wall_ms()) : NULL;
}

static void query_handle(http_req *req, void *arg)
{
    query *q = arg;
    int64_t shop, id;
    if (query_read_id(req, "shopNumber", &shop) != QN_OK ||
        query_read_id(req, "couponTemplateId", &id) != QN_OK)
        return;
    const query_copy *c = query_copy_current(q, id);
    if (q->track)
        metrics_series_add(metrics_handle_series(
                               &q->lookups[c != NULL], &metric_quan_rcopy_lookups_total,
                               (const char *const[]){"template_query", c ? "hit" : "miss", NULL}),
                           1);
    if (c && c->t.shop_number == shop) {
        if (c->t.buckets <= 1 || query_sum_start(q, req, &c->t) != QN_OK)
            http_reply_ok_write(req, query_copy_write, c);
        return;
    }
    query_http *h = malloc(sizeof(*h));
    if (h)
        *h = (query_http){.q = q, .req = req};
    if (!h || query_template(q, shop, id, query_replied, h) != QN_OK) {
        free(h);
        http_reply_error(req, ERRCODE_UNAVAILABLE, "template store unavailable");
    }
}

const tpl *query_copy_peek(query *q, int64_t id, uint64_t *serial, int *settled)
{
    const query_copy *c = query_copy_current(q, id);
    *serial = c ? c->serial : 0;
    *settled = c ? c->settled : 0;
    return c ? &c->t : NULL;
}

void query_copy_settled(query *q, int64_t id, uint64_t serial)
{
    query_copy *c = (query_copy *)query_copy_current(q, id);
    if (c && c->serial == serial)
        c->settled = 1;
}

static void query_on_filled(qn_status st, const tpl *t, void *arg)
{
    (void)st, (void)t;
    query *q = arg;
    q->fills--;
}

void query_copy_fill(query *q, int64_t shop_number, int64_t id)
{
    if (!q->track || q->closing || q->fills >= QUERY_FILLS_MAX)
        return;
    if (query_template(q, shop_number, id, query_on_filled, q) == QN_OK)
        q->fills++;
}

void query_copies_drop(query *q)
{
    if (q && q->copies)
        rcopy_clear(q->copies);
}

/* The template of a bucket's hash key "quan:bkt:{<id>.<b>.<k>}" (bucket.h). 1 when it is one. */
static int query_bucket_key_id(const char *key, size_t len, int64_t *id)
{
    static const char prefix[] = "quan:bkt:{";
    size_t n = sizeof(prefix) - 1, i = n;
    int64_t v = 0;
    if (len <= n || memcmp(key, prefix, n) != 0)
        return 0;
    for (; i < len && key[i] >= '0' && key[i] <= '9' && i - n < 19; i++)
        v = v * 10 + (key[i] - '0');
    if (i == n || i >= len || key[i] != '.')
        return 0;
    *id = v;
    return v > 0;
}

/* rtrack: quan:tpl:{id} or one of its other buckets' hashes changed (NULL: anything may
 * have). */
static void query_on_invalidate(const char *key, size_t len, void *arg)
{
    query *q = arg;
    int64_t id;
    if (!key)
        rcopy_clear(q->copies);
    else if (rtrack_key_id(key, len, KEYS_TEMPLATE_PREFIX, &id) ||
             query_bucket_key_id(key, len, &id))
        rcopy_invalidate(q->copies, id);
}

static qn_status query_start(service *s, void **state)
{
    query *q = calloc(1, sizeof(*q));
    if (!q)
        return QN_ENOMEM;
    *state = q; /* freed by query_free from here on, whatever happens below */
    q->svc = s;
    q->common = service_cfg(s);
    q->cfg = &query_cfg;
    q->redis = service_redis(s);
    if (bloom_params_for(q->cfg->bloom_expected, q->cfg->bloom_fp_per_million, &q->bloom) != QN_OK)
        return QN_EINVAL;
    if (q->cfg->query_copies == 0)
        return QN_OK;
    redis_opts ro = service_redis_opts(q->common);
    if (!(q->reader = redis_client_new(service_base(s), &ro)))
        return QN_ENOMEM;
    rtrack_opts to = {.password = q->common->redis_password,
                      .reader = q->reader,
                      .cb = query_on_invalidate,
                      .arg = q};
    if (!(q->copies = rcopy_new((size_t)q->cfg->query_copies, query_copy_release)) ||
        !(q->track = rtrack_new(service_base(s), &to)))
        return QN_ENOMEM;
    return QN_OK;
}

/* After the service's connections: the reader's callbacks have run (failed) by now. */
static void query_free(void *state)
{
    query *q = state;
    if (!q)
        return;
    q->closing = 1; /* the engine's client is gone: what the reader fails now ends there */
    redis_client_free(q->reader);
    rtrack_free(q->track);
    rcopy_free(q->copies);
    free(q);
}

static const config_var query_vars[] = {
    {"QUAN_NULL_TTL_MS", CONFIG_INT, offsetof(query_settings, null_ttl_ms), "1800000", 1000,
     86400000, NULL, 0, "how long an unknown template id is remembered as absent"},
    BLOOM_CONFIG_VARS(query_settings),
    {"QUAN_QUERY_COPIES", CONFIG_INT, offsetof(query_settings, query_copies), "10000", 0, 10000000,
     NULL, 0,
     "templates the query keeps in the process, each until its cache hash changes (Redis "
     "CLIENT TRACKING on a connection of their own) or the template ends (0: none)"},
};

const service_module query_module = {
    .name = "query",
    .vars = query_vars,
    .nvars = sizeof(query_vars) / sizeof(query_vars[0]),
    .settings = &query_cfg,
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/engine/coupon-template/query", query_handle, HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/coupon-template/query", query_handle, HTTP_NEED_USER},
            {0},
        },
    .metrics =
        (metrics_family *const[]){
            METRICS_REFS(QUERY_METRICS) /* the database reads */
            METRICS_REFS(RCOPY_METRICS) /* the copies' lookups */
            NULL,
        },
    .start = query_start,
    .free = query_free,
};
