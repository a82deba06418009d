/* Redis claim state against the databases (reconcile.h). */
#include "reconcile.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bucket.h"
#include "bucketsum.h"
#include "claimdb.h"
#include "grow.h"
#include "keys.h"
#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "resv.h"
#include "shard.h"
#include "template.h"

#define RC_SETTLE_WAIT_MS 10000 /* open synchronous claims end within the request timeout */
#define RC_SCAN_COUNT     1000

/* One user's counter of one template: what the databases say, what Redis has. */
typedef struct rc_count {
    int64_t tpl, user;
    long long want, have; /* have -1: no key */
} rc_count;

/* Everything one run gathers. */
typedef struct rc_run {
    redis_sync *rs;
    const redis_scripts *scripts;
    pgpool_conn **pg;
    const reconcile_opts *o;
    reconcile_tpl *t;
    size_t n;
    tpl *rows;           /* the template rows, by index of t */
    claimdb_item *items; /* the open reservations of every template */
    size_t nitems, capitems;
    size_t *item_tpl;        /* index in t of each item */
    int *item_bkt;           /* the bucket whose reservation set holds it */
    bucketsum_bucket **sums; /* N > 1: each template's buckets as read (rc_read_redis) */
    rc_count *counts;
    size_t ncounts, capcounts;
} rc_run;

static int rc_by_id(const void *a, const void *b)
{
    const reconcile_tpl *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static int rc_by_count(const void *a, const void *b)
{
    const rc_count *x = a, *y = b;
    if (x->tpl != y->tpl)
        return (x->tpl > y->tpl) - (x->tpl < y->tpl);
    return (x->user > y->user) - (x->user < y->user);
}

static reconcile_tpl *rc_find_tpl(rc_run *r, int64_t id)
{
    reconcile_tpl key = {.id = id};
    return bsearch(&key, r->t, r->n, sizeof(*r->t), rc_by_id);
}

/* The counter entry of (tpl, user), added when absent (the array is sorted by rc_sort). */
static rc_count *rc_count_add(rc_run *r, int64_t tpl_id, int64_t user)
{
    if (grow(&r->counts, &r->capcounts, r->ncounts + 1, sizeof(*r->counts), 256) != QN_OK)
        return NULL;
    rc_count *c = &r->counts[r->ncounts++];
    *c = (rc_count){.tpl = tpl_id, .user = user, .want = 0, .have = -1};
    return c;
}

/* Sorts the counters and merges duplicates (their wants add up, a known have wins). */
static void rc_sort(rc_run *r)
{
    size_t k = 0;
    if (r->ncounts == 0)
        return; /* counts may be NULL then, which qsort must not be given */
    qsort(r->counts, r->ncounts, sizeof(*r->counts), rc_by_count);
    for (size_t i = 0; i < r->ncounts; i++) {
        if (k > 0 && r->counts[k - 1].tpl == r->counts[i].tpl &&
            r->counts[k - 1].user == r->counts[i].user) {
            r->counts[k - 1].want += r->counts[i].want;
            if (r->counts[i].have >= 0)
                r->counts[k - 1].have = r->counts[i].have;
            continue;
        }
        r->counts[k++] = r->counts[i];
    }
    r->ncounts = k;
}

/* The stock buckets of template i (bucket.h): the row's; 1 when there is no row. */
static int rc_n(const rc_run *r, size_t i)
{
    return r->rows[i].buckets >= 1 ? r->rows[i].buckets : 1;
}

/* The keys of the home bucket of user among template tpl_id's buckets. */
static void rc_home(const rc_run *r, int64_t tpl_id, int64_t user, bucket_keys *k)
{
    const reconcile_tpl *t = rc_find_tpl((rc_run *)r, tpl_id);
    int n = t ? rc_n(r, (size_t)(t - r->t)) : 1;
    bucket_keys_of(k, tpl_id, bucket_home(user, n), n);
}

/* ---- steps ---- */

/* The template rows (the end time bounds the keys' lives). */
static qn_status rc_load_rows(rc_run *r)
{
    for (size_t i = 0; i < r->n; i++) {
        shard_route route;
        if (shard_route_for("t_coupon_template", r->t[i].shop, &route) != QN_OK)
            return QN_EINVAL;
        qn_status st = tpl_db_load(r->pg[route.ds], r->t[i].shop, r->t[i].id, &r->rows[i]);
        if (st == QN_ENOTFOUND)
            continue;
        if (st != QN_OK)
            return st;
        /* A change of its stock buckets is under way: Redis holds the old number's buckets,
         * closed, and claims of the old number may be in flight there. The re-layout
         * (relayout.h) rebuilds it once they ended; this run leaves it alone (as absent). */
        if (r->rows[i].relayout_from > 0)
            continue;
        r->t[i].found = 1;
        r->t[i].buckets = rc_n(r, i);
    }
    return QN_OK;
}

/* Reads n pipelined replies; QN_ERR if one failed (all are read). */
static qn_status rc_replies(redis_sync *rs, size_t n)
{
    qn_status st = QN_OK;
    for (size_t i = 0; i < n; i++)
        if (redis_sync_get_reply(rs, NULL) != QN_OK)
            st = QN_ERR;
    return st;
}

/* Closes the templates to claims: a hash without its stock field reads "not cached". Every
 * bucket: a closed donor gives nothing and a closed home takes nothing (bucket_give.lua,
 * bucket_take.lua), so no transfer moves stock while the run reads it. */
static qn_status rc_close(rc_run *r)
{
    bucket_keys k;
    size_t sent = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (!r->t[i].found)
            continue;
        for (int b = 0; b < rc_n(r, i); b++) {
            bucket_keys_of(&k, r->t[i].id, b, rc_n(r, i));
            redis_sync_append(r->rs, "HDEL %s stock", k.hash);
            redis_sync_append(r->rs, "HSET %s rebuilding 1", k.hash);
            redis_sync_append(r->rs, "PEXPIREAT %s %lld", k.hash,
                              (long long)r->rows[i].valid_end_ms);
            sent += 3;
        }
    }
    return rc_replies(r->rs, sent);
}

/* Open synchronous reservations (scores below RESV_QUEUED_BASE) of the templates. */
static long long rc_open_sync(rc_run *r)
{
    bucket_keys k;
    long long open = 0;
    for (size_t i = 0; i < r->n; i++)
        for (int b = 0; b < rc_n(r, i); b++) {
            bucket_keys_of(&k, r->t[i].id, b, rc_n(r, i));
            redisReply *x =
                redis_sync_command(r->rs, "ZCOUNT %s -inf (%lld", k.resv, RESV_QUEUED_BASE);
            if (!x)
                return -1;
            if (x->type == REDIS_REPLY_INTEGER)
                open += x->integer;
            freeReplyObject(x);
        }
    return open;
}

/* The open reservations in bucket b's set of template i. */
static qn_status rc_read_open_bucket(rc_run *r, size_t i, int b)
{
    bucket_keys bk;
    bucket_keys_of(&bk, r->t[i].id, b, rc_n(r, i));
    redisReply *x = redis_sync_command(r->rs, "ZRANGE %s 0 -1 WITHSCORES", bk.resv);
    if (!x || x->type != REDIS_REPLY_ARRAY) {
        if (x)
            freeReplyObject(x);
        return QN_ERR;
    }
    for (size_t k = 0; k + 1 < x->elements; k += 2) {
        int64_t user;
        char rid[UCOUPON_REQUEST_ID_MAX + 1];
        if (sscanf(x->element[k]->str, "%" SCNd64 ":%64s", &user, rid) != 2)
            continue;
        size_t cap = r->capitems, cap2 = r->capitems;
        if (grow(&r->items, &r->capitems, r->nitems + 1, sizeof(*r->items), 64) != QN_OK ||
            grow(&r->item_tpl, &cap, r->nitems + 1, sizeof(*r->item_tpl), 64) != QN_OK ||
            grow(&r->item_bkt, &cap2, r->nitems + 1, sizeof(*r->item_bkt), 64) != QN_OK) {
            freeReplyObject(x);
            return QN_ENOMEM;
        }
        claimdb_item *it = &r->items[r->nitems];
        memset(it, 0, sizeof(*it));
        it->c.template_id = r->t[i].id;
        it->c.shop_number = r->t[i].shop;
        it->c.user_id = user;
        long long score = strtoll(x->element[k + 1]->str, NULL, 10);
        it->c.receive_time_ms = score >= RESV_QUEUED_BASE ? score - RESV_QUEUED_BASE : score;
        snprintf(it->c.request_id, sizeof(it->c.request_id), "%s", rid);
        claimdb_route(it);
        r->item_tpl[r->nitems] = i;
        r->item_bkt[r->nitems++] = b;
    }
    freeReplyObject(x);
    return QN_OK;
}

/* The open reservations of every template, in every bucket's set. */
static qn_status rc_read_open(rc_run *r)
{
    for (size_t i = 0; i < r->n; i++)
        for (int b = 0; b < rc_n(r, i); b++) {
            qn_status st = rc_read_open_bucket(r, i, b);
            if (st != QN_OK)
                return st;
        }
    return QN_OK;
}
/* In each template database, in one snapshot: the stock of its templates and which open
 * reservations took stock (a ledger row without void_resv_ms). Items that took it become
 * CLAIMDB_DUP ("in the database"); the others stay PENDING ("in flight"). */
static qn_status rc_read_stock(rc_run *r)
{
    for (int ds = 0; ds < 2; ds++) {
        pgpool_conn *c = r->pg[ds];
        if (pgpool_exec_cmd(c, "BEGIN ISOLATION LEVEL REPEATABLE READ", 0, NULL, NULL) != QN_OK)
            return QN_ERR;
        for (size_t i = 0; i < r->n; i++) {
            shard_route route;
            if (!r->t[i].found ||
                shard_route_for("t_coupon_template", r->t[i].shop, &route) != QN_OK ||
                route.ds != ds)
                continue;
            char sql[160];
            pgparam p = {0};
            snprintf(sql, sizeof(sql), "SELECT stock FROM %s WHERE shop_number = $1 AND id = $2",
                     route.table);
            pgparam_i64(&p, r->t[i].shop);
            pgparam_i64(&p, r->t[i].id);
            PGresult *x = pgpool_exec(c, sql, p.n, p.v);
            if (!x)
                goto fail;
            r->t[i].db_stock = PQntuples(x) == 1 ? strtoll(PQgetvalue(x, 0, 0), NULL, 10) : 0;
            PQclear(x);
        }
        for (size_t k = 0; k < r->nitems; k++) {
            claimdb_item *it = &r->items[k];
            if (it->tpl_ds != ds)
                continue;
            pgparam p = {0};
            pgparam_i64(&p, it->c.user_id);
            pgparam_str(&p, it->c.request_id);
            PGresult *x = pgpool_exec(c,
                                      "SELECT 1 FROM t_claim_ledger WHERE user_id = $1 AND "
                                      "request_id = $2 AND void_resv_ms IS NULL",
                                      p.n, p.v);
            if (!x)
                goto fail;
            if (PQntuples(x) == 1)
                claimdb_set(it, CLAIMDB_DUP);
            PQclear(x);
        }
        if (pgpool_commit(c) != QN_OK)
            return QN_ERR;
        continue;
    fail:
        (void)pgpool_rollback(c);
        return QN_ERR;
    }
    return QN_OK;
}

/* The coupons of the templates per user, from every coupon table. */
static qn_status rc_read_coupons(rc_run *r)
{
    pgparam_array ids = {0};
    qn_status st = QN_OK;
    for (size_t i = 0; i < r->n; i++)
        if (r->t[i].found)
            pgparam_array_i64(&ids, r->t[i].id);
    int ntables = shard_table_count("t_user_coupon");
    for (int idx = 0; idx < ntables && st == QN_OK && ids.n > 0; idx++) {
        shard_route route;
        char sql[200];
        pgparam p = {0};
        if ((st = shard_route_index("t_user_coupon", idx, &route)) != QN_OK ||
            (st = pgparam_array_bind(&p, &ids)) != QN_OK)
            break;
        snprintf(sql, sizeof(sql),
                 "SELECT coupon_template_id, user_id, count(*) FROM %s WHERE "
                 "coupon_template_id = ANY($1::bigint[]) GROUP BY 1, 2",
                 route.table);
        PGresult *x = pgpool_exec(r->pg[route.ds], sql, p.n, p.v);
        if (!x) {
            st = QN_ERR;
            break;
        }
        for (int row = 0; row < PQntuples(x) && st == QN_OK; row++) {
            rc_count *c = rc_count_add(r, strtoll(PQgetvalue(x, row, 0), NULL, 10),
                                       strtoll(PQgetvalue(x, row, 1), NULL, 10));
            if (!c)
                st = QN_ENOMEM;
            else
                c->want = strtoll(PQgetvalue(x, row, 2), NULL, 10);
        }
        PQclear(x);
    }
    pgparam_array_free(&ids);
    return st;
}

/* The counters Redis has for these templates: the count fields of each bucket's users hash (an
 * HSCAN each, in the bucket's slot; the markers' fields "U:R" are not counters). */
static qn_status rc_scan_counters(rc_run *r)
{
    bucket_keys bk;
    const char *key = bk.users;
    for (size_t i = 0; i < r->n; i++)
        for (int b = 0; b < rc_n(r, i); b++) {
            char cursor[32] = "0";
            bucket_keys_of(&bk, r->t[i].id, b, rc_n(r, i));
            do {
                redisReply *x =
                    redis_sync_command(r->rs, "HSCAN %s %s COUNT %d", key, cursor, RC_SCAN_COUNT);
                if (!x || x->type != REDIS_REPLY_ARRAY || x->elements != 2 ||
                    x->element[0]->type != REDIS_REPLY_STRING) {
                    freeReplyObject(x);
                    return QN_ERR;
                }
                snprintf(cursor, sizeof(cursor), "%s", x->element[0]->str);
                /* field, value, field, value... */
                for (size_t k = 0; k + 1 < x->element[1]->elements; k += 2) {
                    const char *field = x->element[1]->element[k]->str;
                    char *end = NULL;
                    int64_t user = field ? (int64_t)strtoll(field, &end, 10) : 0;
                    if (!end || end == field || *end != '\0')
                        continue;
                    if (!rc_count_add(r, r->t[i].id, user)) {
                        freeReplyObject(x);
                        return QN_ENOMEM;
                    }
                }
                freeReplyObject(x);
            } while (strcmp(cursor, "0") != 0);
        }
    return QN_OK;
}

/* A template of N > 1 buckets: every bucket's hash, its stock the sum over them plus the units
 * on their way (bucketsum.h); the buckets kept for rc_write. */
static qn_status rc_read_buckets(rc_run *r, size_t i)
{
    int n = rc_n(r, i);
    bucket_keys k;
    if (!(r->sums[i] = calloc((size_t)n, sizeof(*r->sums[i]))))
        return QN_ENOMEM;
    for (int b = 0; b < n; b++) {
        bucket_keys_of(&k, r->t[i].id, b, n);
        redisReply *x = redis_sync_command(r->rs, "HGETALL %s", k.hash);
        qn_status st = x ? bucketsum_read(&r->sums[i][b], x) : QN_ERR;
        freeReplyObject(x);
        if (st != QN_OK)
            return st;
    }
    int64_t total = bucketsum_total(r->sums[i], n);
    r->t[i].redis_stock = total;
    return QN_OK;
}

/* What Redis has: the stock of each template, the value of each counter at the user's home
 * bucket (pipelined). */
static qn_status rc_read_redis(rc_run *r)
{
    char key[KEYS_LEN];
    for (size_t i = 0; i < r->n; i++) {
        if (rc_n(r, i) > 1) {
            qn_status st = rc_read_buckets(r, i);
            if (st != QN_OK)
                return st;
        }
    }
    for (size_t i = 0; i < r->n; i++) {
        keys_template(key, r->t[i].id);
        redis_sync_append(r->rs, "HGET %s stock", key);
    }
    for (size_t k = 0; k < r->ncounts; k++) {
        char field[24];
        bucket_keys bk;
        rc_home(r, r->counts[k].tpl, r->counts[k].user, &bk);
        keys_user_field(field, r->counts[k].user);
        redis_sync_append(r->rs, "HGET %s %s", bk.users, field);
    }
    for (size_t i = 0; i < r->n + r->ncounts; i++) {
        redisReply *x = NULL;
        if (redis_sync_get_reply(r->rs, &x) != QN_OK)
            return QN_ERR; /* the rest is dropped by the next command */
        long long v = x->type == REDIS_REPLY_STRING ? strtoll(x->str, NULL, 10) : -1;
        if (i < r->n) {
            if (rc_n(r, i) == 1) /* else the sum over the buckets, read above */
                r->t[i].redis_stock = v;
        } else
            r->counts[i - r->n].have = v;
        freeReplyObject(x);
    }
    return QN_OK;
}

/* One command on the blocking client, its reply checked to be no error. */
static qn_status rc_ok(redisReply *x)
{
    qn_status st = x && x->type != REDIS_REPLY_ERROR ? QN_OK : QN_ERR;
    freeReplyObject(x);
    return st;
}

/* The buckets of template i (N > 1), closed, written in place with their shares of
 * rows[i].stock, the template's own last (which opens it as bucket_cache_put does). Not DEL and
 * write afresh as one bucket is: a bucket keeps its "xi:X", so a late finisher of a transfer
 * adds nothing. The transfers still on their way are ended first, their units counted by the
 * databases' stock like every other: each is marked taken at its home (a late take adds
 * nothing) and settled at its donor. A bucket's generation rises (its stock may). */
static qn_status rc_write_buckets(rc_run *r, size_t i)
{
    int n = rc_n(r, i);
    const tpl *row = &r->rows[i];
    bucket_keys k, home;
    char now[24];
    snprintf(now, sizeof(now), "%" PRId64, now_wall_ms());
    for (int d = 0; d < n; d++) {
        const bucketsum_bucket *b = &r->sums[i][d];
        bucket_keys_of(&k, row->id, d, n);
        for (size_t x = 0; x < b->nxo; x++) {
            const bucketsum_xo *xo = &b->xo[x];
            if (xo->home >= 0 && xo->home < n) {
                bucket_keys_of(&home, row->id, xo->home, n);
                if (rc_ok(redis_sync_command(r->rs, "HSETNX %s xi:%s %s", home.hash, xo->id,
                                             now)) != QN_OK)
                    return QN_ERR;
            }
            const char *keys[1] = {k.hash}, *args[1] = {xo->id};
            if (rc_ok(REDIS_SYNC_SCRIPT(r->rs, r->scripts, bucket_settle, keys, args)) != QN_OK)
                return QN_ERR;
        }
    }
    for (int b = n - 1; b >= 0; b--)
        if (bucket_rewrite_sync(r->rs, row, row->stock, b) != QN_OK)
            return QN_ERR;
    return QN_OK;
}

/* Writes the counters that differ, ends the reservations resolved, then the hash (opening the
 * template). */
static qn_status rc_write(rc_run *r)
{
    char key[KEYS_LEN], k2[KEYS_LEN];
    size_t sent = 0;
    for (size_t k = 0; k < r->ncounts; k++) {
        const rc_count *c = &r->counts[k];
        const reconcile_tpl *t = rc_find_tpl(r, c->tpl);
        if (c->have == c->want || (c->have < 0 && c->want == 0) || !t || !t->found)
            continue;
        bucket_keys bk;
        rc_home(r, c->tpl, c->user, &bk);
        snprintf(key, sizeof(key), "%s", bk.users);
        keys_user_field(k2, c->user);
        if (c->want == 0) {
            redis_sync_append(r->rs, "HDEL %s %s", key, k2);
        } else {
            /* the hash lives at least to the template's end: set when it has no expiry, pushed
             * out when it has an earlier one (never shortened: markers may need longer) */
            long long end = (long long)r->rows[t - r->t].valid_end_ms;
            redis_sync_append(r->rs, "HSET %s %s %lld", key, k2, c->want);
            redis_sync_append(r->rs, "PEXPIREAT %s %lld NX", key, end);
            redis_sync_append(r->rs, "PEXPIREAT %s %lld GT", key, end);
            sent += 2;
        }
        sent++;
    }
    for (size_t k = 0; k < r->nitems; k++) {
        const claimdb_item *it = &r->items[k];
        const ucoupon *u = &it->c;
        if (it->state == CLAIMDB_PENDING)
            continue;                    /* in flight: its writer ends it; the records end below */
        if (it->state == CLAIMDB_VOID) { /* given up: retries claim afresh */
            /* the claim's marker is in the template's slot, the pending claim (if any) in the
             * user's: two commands */
            char field[KEYS_LEN];
            bucket_keys bk;
            rc_home(r, u->template_id, u->user_id, &bk);
            snprintf(key, sizeof(key), "%s", bk.users);
            keys_resv_member(field, u->user_id, u->request_id);
            redis_sync_append(r->rs, "HDEL %s %s", key, field);
            sent++;
            if (keys_claim_pending_used(u->template_id, u->request_id)) {
                keys_claim_pending(k2, u->user_id, u->request_id);
                redis_sync_append(r->rs, "DEL %s", k2);
                sent++;
            }
        }
    }
    if (rc_replies(r->rs, sent) != QN_OK)
        return QN_ERR;
    /* The records of the reservations resolved end (a ZREM: the user's list of open ids follows
     * by itself, claim.lua). */
    for (size_t k = 0; k < r->nitems; k++) {
        const ucoupon *u = &r->items[k].c;
        bucket_keys bk;
        char member[KEYS_LEN];
        if (r->items[k].state == CLAIMDB_PENDING)
            continue;
        size_t i = r->item_tpl[k];
        bucket_keys_of(&bk, u->template_id, r->item_bkt[k], rc_n(r, i)); /* where it was read */
        keys_resv_member(member, u->user_id, u->request_id);
        redisReply *x = redis_sync_command(r->rs, "ZREM %s %s", bk.resv, member);
        int ok = x && x->type == REDIS_REPLY_INTEGER;
        freeReplyObject(x);
        if (!ok)
            return QN_ERR;
    }
    for (size_t i = 0; i < r->n; i++) {
        reconcile_tpl *t = &r->t[i];
        if (!t->found)
            continue;
        if (rc_n(r, i) > 1) {
            r->rows[i].stock = t->want_stock;
            if (rc_write_buckets(r, i) != QN_OK)
                return QN_ERR;
            t->repaired = 1;
            continue;
        }
        const char *argv[1 + 2 * TPL_CACHE_FIELDS], *keys[1] = {key};
        tpl_cache_bufs bufs;
        char exp[24];
        r->rows[i].stock = t->want_stock;
        keys_template(key, t->id);
        snprintf(exp, sizeof(exp), "%" PRId64, r->rows[i].valid_end_ms);
        argv[0] = exp;
        int nf = tpl_cache_fields(&r->rows[i], argv + 1, &bufs);
        freeReplyObject(redis_sync_command(r->rs, "DEL %s", key));
        redisReply *x =
            REDIS_SYNC_SCRIPT_N(r->rs, r->scripts, template_cache_put, 1, keys, nf + 1, argv);
        int ok = x && x->type == REDIS_REPLY_INTEGER;
        if (x)
            freeReplyObject(x);
        if (!ok)
            return QN_ERR;
        t->repaired = 1;
    }
    return QN_OK;
}

/* ---- listing ---- */

qn_status reconcile_list_active(pgpool_conn *pg[2], reconcile_tpl **out, size_t *n)
{
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    for (int idx = 0; idx < shard_table_count("t_coupon_template"); idx++) {
        shard_route route;
        char sql[200];
        if (shard_route_index("t_coupon_template", idx, &route) != QN_OK)
            return QN_EINVAL;
        snprintf(sql, sizeof(sql),
                 "SELECT id, shop_number, stock_buckets FROM %s WHERE status = " TPL_STATUS_TEXT(
                     ACTIVE) " AND valid_end_time > now()",
                 route.table);
        PGresult *r = pgpool_exec(pg[route.ds], sql, 0, NULL);
        if (!r)
            return QN_ERR;
        for (int i = 0; i < PQntuples(r); i++) {
            if (grow(out, &cap, *n + 1, sizeof(**out), 64) != QN_OK) {
                PQclear(r);
                return QN_ENOMEM;
            }
            memset(&(*out)[*n], 0, sizeof(**out));
            (*out)[*n].id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
            (*out)[*n].shop = strtoll(PQgetvalue(r, i, 1), NULL, 10);
            (*out)[*n].buckets = atoi(PQgetvalue(r, i, 2));
            (*n)++;
        }
        PQclear(r);
    }
    return QN_OK;
}

qn_status reconcile_find(pgpool_conn *pg[2], int64_t id, int64_t *shop)
{
    for (int idx = 0; idx < shard_table_count("t_coupon_template"); idx++) {
        shard_route route;
        char sql[160];
        pgparam p = {0};
        if (shard_route_index("t_coupon_template", idx, &route) != QN_OK)
            return QN_EINVAL;
        snprintf(sql, sizeof(sql), "SELECT shop_number FROM %s WHERE id = $1", route.table);
        pgparam_i64(&p, id);
        PGresult *r = pgpool_exec(pg[route.ds], sql, p.n, p.v);
        if (!r)
            return QN_ERR;
        int found = PQntuples(r) == 1;
        if (found)
            *shop = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        if (found)
            return QN_OK;
    }
    return QN_ENOTFOUND;
}

/* ---- the run ---- */

int reconcile_differs(const reconcile_tpl *t)
{
    /* A template not cached (no stock in Redis) is loaded from the database on its next claim:
     * only its counters can be wrong. */
    return t->found &&
           ((t->redis_stock >= 0 && t->redis_stock != t->want_stock) || t->counters_wrong > 0);
}

qn_status reconcile_run(redis_sync *rs, const redis_scripts *scripts, pgpool_conn *pg[2],
                        reconcile_tpl *t, size_t n, const reconcile_opts *o)
{
    rc_run r = {.rs = rs, .scripts = scripts, .pg = pg, .o = o, .t = t, .n = n};
    qn_status st = QN_ENOMEM;
    if (n == 0)
        return QN_OK;
    qsort(t, n, sizeof(*t), rc_by_id);
    for (size_t i = 0; i < n; i++) {
        int64_t id = t[i].id, shop = t[i].shop;
        t[i] = (reconcile_tpl){.id = id, .shop = shop, .redis_stock = -1};
    }
    if (!(r.rows = calloc(n, sizeof(*r.rows))) || !(r.sums = calloc(n, sizeof(*r.sums))))
        goto out;
    if ((st = rc_load_rows(&r)) != QN_OK)
        goto out;
    if (o->apply) {
        if ((st = rc_close(&r)) != QN_OK)
            goto out;
        /* Claims that reserved before the close end by themselves, soon. */
        int64_t until = now_wall_ms() + (o->dead ? 0 : RC_SETTLE_WAIT_MS);
        long long open;
        while ((open = rc_open_sync(&r)) > 0 && now_wall_ms() < until)
            usleep(100000);
    }
    if ((st = rc_read_open(&r)) != QN_OK || (st = rc_read_stock(&r)) != QN_OK)
        goto out;
    if (o->apply && o->dead) {
        for (int ds = 0; ds < 2; ds++)
            if ((st = claimdb_void(pg[ds], ds, r.items, r.nitems)) != QN_OK)
                goto out;
    }
    /* In flight: still PENDING (neither in the database nor given up). */
    for (size_t k = 0; k < r.nitems; k++) {
        if (r.items[k].state == CLAIMDB_VOID) {
            t[r.item_tpl[k]].voided++;
            continue;
        }
        if (r.items[k].state != CLAIMDB_PENDING)
            continue;
        t[r.item_tpl[k]].inflight++;
        rc_count *c = rc_count_add(&r, r.items[k].c.template_id, r.items[k].c.user_id);
        if (!c) {
            st = QN_ENOMEM;
            goto out;
        }
        c->want = 1;
    }
    if ((st = rc_read_coupons(&r)) != QN_OK || (st = rc_scan_counters(&r)) != QN_OK)
        goto out;
    rc_sort(&r);
    if ((st = rc_read_redis(&r)) != QN_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        t[i].want_stock = t[i].db_stock - t[i].inflight;
    for (size_t k = 0; k < r.ncounts; k++) {
        reconcile_tpl *x = rc_find_tpl(&r, r.counts[k].tpl);
        const rc_count *c = &r.counts[k];
        if (!x)
            continue;
        x->counters++;
        if (!(c->have == c->want || (c->have < 0 && c->want == 0)))
            x->counters_wrong++;
    }
    if (o->apply)
        st = rc_write(&r);
out:
    for (size_t i = 0; r.sums && i < n; i++) {
        for (int b = 0; r.sums[i] && b < rc_n(&r, i); b++)
            bucketsum_clear(&r.sums[i][b]);
        free(r.sums[i]);
    }
    free(r.sums);
    if (r.rows)
        for (size_t i = 0; i < n; i++)
            tpl_clear(&r.rows[i]);
    free(r.rows);
    free(r.items);
    free(r.item_tpl);
    free(r.item_bkt);
    free(r.counts);
    return st;
}
