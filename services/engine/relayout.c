/* A change of a live template's stock buckets: the Redis re-layout (relayout.h). */
#include "relayout.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bucket.h"
#include "bucketsum.h"
#include "grow.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "regen.h"
#include "shard.h"
#include "template.h"

METRICS_DEFINE(RELAYOUT_METRICS)

#define RL_LOCK        KEYS_RELAYOUT_LOCK
#define RL_LOCK_MS     15000 /* renewed while working: a dead replica's expires soon */
#define RL_ACQUIRE_MS  5000
#define RL_POLL_MS     200 /* the wait's look at the reservation sets */
#define RL_SCAN_COUNT  1000
#define RL_MARKER_KEEP 3600000 /* a claim's marker lives at least this long (claim.lua) */
#define RL_CLOSED_KEEP 3600000 /* a closed bucket of an ended template, until rewritten */

/* ---- one template's run ---- */

/* One bucket's keys in either layout. */
typedef struct rl_key {
    bucket_keys k;
    int new_b; /* its bucket among the new number; -1: a bucket of the old number only */
} rl_key;

/* A field of a users hash that names a user: the count "U", a marker "U:R", the list "U#". */
typedef enum { RL_COUNT, RL_MARKER, RL_LIST } rl_kind;

typedef struct rl_field {
    size_t key; /* index in rl_run.keys of the hash it is in */
    int64_t user;
    rl_kind kind;
    char *name, *value; /* owned */
} rl_field;

/* A transfer record "xo:X" found in a bucket's hash. */
typedef struct rl_xo {
    size_t key; /* the donor */
    int home;   /* among the number it was given on (old, or new after a run cut short) */
    char *id;   /* owned */
} rl_xo;

/* A user's coupons of the template. */
typedef struct rl_count {
    int64_t user;
    long long coupons;
} rl_count;

typedef struct rl_run {
    redis_sync *rs;
    const redis_scripts *s;
    pgpool_conn **pg;
    relayout_hold_fn hold;
    void *arg;
    relayout_tpl t; /* as the row says */
    tpl row;
    int have_row;
    rl_key keys[2 * BUCKET_MAX];
    size_t nkeys;
    rl_field *fields;
    size_t nfields, capfields;
    rl_xo *xo;
    size_t nxo, capxo;
    rl_count *counts;
    size_t ncounts, capcounts;
} rl_run;

static int rl_by_user(const void *a, const void *b)
{
    const rl_count *x = a, *y = b;
    return (x->user > y->user) - (x->user < y->user);
}

/* The user's coupons (0 when none). */
static long long rl_coupons(const rl_run *r, int64_t user)
{
    rl_count key = {.user = user};
    const rl_count *c =
        r->ncounts ? bsearch(&key, r->counts, r->ncounts, sizeof(*r->counts), rl_by_user) : NULL;
    return c ? c->coupons : 0;
}

/* The index in r->keys of the hash named hash; -1 when none. */
static int rl_key_of(const rl_run *r, const char *hash)
{
    for (size_t i = 0; i < r->nkeys; i++)
        if (strcmp(r->keys[i].k.hash, hash) == 0)
            return (int)i;
    return -1;
}

/* The buckets of both numbers, each once (a bucket of one number may be a bucket of the
 * other: bucket 0 always is, and a tag can fall in both slices). */
static void rl_layouts(rl_run *r)
{
    r->nkeys = 0;
    for (int layout = 0; layout < 2; layout++) {
        int n = layout == 0 ? r->t.from : r->t.to;
        for (int b = 0; b < n; b++) {
            bucket_keys k;
            bucket_keys_of(&k, r->t.id, b, n);
            int i = rl_key_of(r, k.hash);
            if (i < 0) {
                i = (int)r->nkeys++;
                r->keys[i] = (rl_key){.k = k, .new_b = -1};
            }
            if (layout == 1)
                r->keys[i].new_b = b;
        }
    }
}

/* Reads n pipelined replies; QN_ERR when one failed or is an error (all are read). */
static qn_status rl_replies(redis_sync *rs, size_t n)
{
    qn_status st = QN_OK;
    for (size_t i = 0; i < n; i++) {
        redisReply *x = NULL;
        if (redis_sync_get_reply(rs, &x) != QN_OK)
            return QN_ERR; /* no reply: the rest is dropped by the next command */
        if (x->type == REDIS_REPLY_ERROR)
            st = QN_ERR;
        freeReplyObject(x);
    }
    return st;
}

/* One command's reply checked to be no error. */
static qn_status rl_ok(redisReply *x)
{
    qn_status st = x && x->type != REDIS_REPLY_ERROR ? QN_OK : QN_ERR;
    freeReplyObject(x);
    return st;
}

/* The row: QN_ENOTFOUND when it is gone; r->t follows it. */
static qn_status rl_load_row(rl_run *r)
{
    shard_route route;
    if (r->have_row)
        tpl_clear(&r->row);
    r->have_row = 0;
    if (shard_route_for("t_coupon_template", r->t.shop, &route) != QN_OK)
        return QN_EINVAL;
    qn_status st = tpl_db_load(r->pg[route.ds], r->t.shop, r->t.id, &r->row);
    if (st != QN_OK)
        return st;
    r->have_row = 1;
    r->t.from = r->row.relayout_from;
    r->t.to = r->row.buckets >= 1 ? r->row.buckets : 1;
    return QN_OK;
}

/* The expiry of a closed bucket: the template's end, or an hour when that has passed (the run
 * that rewrites it sets the end again). */
static long long rl_closed_until(const rl_run *r)
{
    int64_t now = now_wall_ms();
    return (long long)(r->row.valid_end_ms > now ? r->row.valid_end_ms : now + RL_CLOSED_KEEP);
}

/* Step 1: every bucket of both numbers closed; a missing one created closed. */
static qn_status rl_close(rl_run *r)
{
    for (size_t i = 0; i < r->nkeys; i++) {
        redis_sync_append(r->rs, "HDEL %s stock", r->keys[i].k.hash);
        redis_sync_append(r->rs, "HSET %s rebuilding 1", r->keys[i].k.hash);
        redis_sync_append(r->rs, "PEXPIREAT %s %lld", r->keys[i].k.hash, rl_closed_until(r));
    }
    return rl_replies(r->rs, 3 * r->nkeys);
}

/* The reservations still open in every bucket's set; -1 when Redis did not answer. */
static long long rl_open(rl_run *r)
{
    long long open = 0;
    for (size_t i = 0; i < r->nkeys; i++)
        redis_sync_append(r->rs, "ZCARD %s", r->keys[i].k.resv);
    for (size_t i = 0; i < r->nkeys; i++) {
        redisReply *x = NULL;
        if (redis_sync_get_reply(r->rs, &x) != QN_OK)
            return -1;
        if (x->type == REDIS_REPLY_INTEGER)
            open += x->integer;
        else
            open = -1000000000LL; /* an error: not "empty" */
        freeReplyObject(x);
    }
    return open < 0 ? -1 : open;
}

/* Step 2: QN_OK once no reservation is open, QN_EAGAIN after wait_max_ms, QN_ERR when the hold
 * is gone or Redis failed. */
static qn_status rl_wait(rl_run *r, int64_t wait_max_ms)
{
    int64_t until = now_wall_ms() + wait_max_ms;
    int said = 0;
    for (;;) {
        long long open = rl_open(r);
        if (open == 0)
            return QN_OK;
        if (open < 0 || !r->hold(r->arg))
            return QN_ERR;
        if (now_wall_ms() >= until)
            return QN_EAGAIN;
        if (!said++)
            log_infof(NULL,
                      ((log_field[]){LOG_I("template_id", r->t.id), LOG_I("open", open), LOG_END}),
                      "relayout: waiting for the claims in flight");
        usleep(RL_POLL_MS * 1000);
    }
}

/* Step 3: each user's coupons of the template, from every coupon table. */
static qn_status rl_read_coupons(rl_run *r)
{
    int ntables = shard_table_count("t_user_coupon");
    r->ncounts = 0;
    for (int idx = 0; idx < ntables; idx++) {
        shard_route route;
        char sql[200];
        pgparam p = {0};
        if (shard_route_index("t_user_coupon", idx, &route) != QN_OK)
            return QN_EINVAL;
        snprintf(sql, sizeof(sql),
                 "SELECT user_id, count(*) FROM %s WHERE coupon_template_id = $1 GROUP BY 1",
                 route.table);
        pgparam_i64(&p, r->t.id);
        PGresult *x = pgpool_exec(r->pg[route.ds], sql, p.n, p.v);
        if (!x)
            return QN_ERR;
        for (int row = 0; row < PQntuples(x); row++) {
            if (grow(&r->counts, &r->capcounts, r->ncounts + 1, sizeof(*r->counts), 256) != QN_OK) {
                PQclear(x);
                return QN_ENOMEM;
            }
            r->counts[r->ncounts++] = (rl_count){
                .user = strtoll(PQgetvalue(x, row, 0), NULL, 10),
                .coupons = strtoll(PQgetvalue(x, row, 1), NULL, 10),
            };
        }
        PQclear(x);
    }
    if (r->ncounts > 1) { /* a user's coupons may lie in several tables: add them up */
        size_t k = 0;
        qsort(r->counts, r->ncounts, sizeof(*r->counts), rl_by_user);
        for (size_t i = 0; i < r->ncounts; i++) {
            if (k > 0 && r->counts[k - 1].user == r->counts[i].user)
                r->counts[k - 1].coupons += r->counts[i].coupons;
            else
                r->counts[k++] = r->counts[i];
        }
        r->ncounts = k;
    }
    return QN_OK;
}

/* A users hash field that names a user: its kind and user; 0 for any other field. */
static int rl_field_kind(const char *name, int64_t *user, rl_kind *kind)
{
    char *end = NULL;
    if (!name || *name < '0' || *name > '9')
        return 0;
    *user = (int64_t)strtoll(name, &end, 10);
    if (*end == '\0')
        *kind = RL_COUNT;
    else if (*end == ':')
        *kind = RL_MARKER;
    else if (*end == '#' && end[1] == '\0')
        *kind = RL_LIST;
    else
        return 0;
    return 1;
}

/* The fields naming users of key i's users hash (an HSCAN, in the bucket's slot). */
static qn_status rl_scan_users(rl_run *r, size_t i)
{
    char cursor[32] = "0";
    do {
        redisReply *x = redis_sync_command(r->rs, "HSCAN %s %s COUNT %d", r->keys[i].k.users,
                                           cursor, RL_SCAN_COUNT);
        if (!x || x->type != REDIS_REPLY_ARRAY || x->elements != 2 ||
            x->element[0]->type != REDIS_REPLY_STRING) {
            freeReplyObject(x);
            return QN_ERR;
        }
        snprintf(cursor, sizeof(cursor), "%s", x->element[0]->str);
        const redisReply *kv = x->element[1];
        for (size_t k = 0; k + 1 < kv->elements; k += 2) {
            int64_t user;
            rl_kind kind;
            if (!rl_field_kind(kv->element[k]->str, &user, &kind))
                continue;
            if (grow(&r->fields, &r->capfields, r->nfields + 1, sizeof(*r->fields), 256) != QN_OK) {
                freeReplyObject(x);
                return QN_ENOMEM;
            }
            rl_field *f = &r->fields[r->nfields];
            *f = (rl_field){.key = i, .user = user, .kind = kind};
            f->name = strdup(kv->element[k]->str);
            f->value = strdup(kv->element[k + 1]->str ? kv->element[k + 1]->str : "");
            r->nfields++;
            if (!f->name || !f->value) {
                freeReplyObject(x);
                return QN_ENOMEM;
            }
        }
        freeReplyObject(x);
    } while (strcmp(cursor, "0") != 0);
    return QN_OK;
}

/* The transfer records of key i's hash. */
static qn_status rl_read_transfers(rl_run *r, size_t i)
{
    bucketsum_bucket b;
    redisReply *x = redis_sync_command(r->rs, "HGETALL %s", r->keys[i].k.hash);
    qn_status st = x ? bucketsum_read(&b, x) : QN_ERR;
    freeReplyObject(x);
    if (st != QN_OK)
        return st;
    for (size_t k = 0; k < b.nxo && st == QN_OK; k++) {
        if ((st = grow(&r->xo, &r->capxo, r->nxo + 1, sizeof(*r->xo), 16)) != QN_OK)
            break;
        r->xo[r->nxo] = (rl_xo){.key = i, .home = b.xo[k].home, .id = strdup(b.xo[k].id)};
        if (!r->xo[r->nxo++].id)
            st = QN_ENOMEM;
    }
    bucketsum_clear(&b);
    return st;
}

/* Step 4a: the transfers on their way end, their units counted by the row's stock. A record's
 * home is a bucket of the number it was given on: the old one, or the new one when a run cut
 * short had opened the new buckets; both are marked taken where they are buckets of the new
 * number (a late take adds nothing; a bucket of the old number only is deleted below, and a
 * take finds no hash). The donor settles it when it stays. */
static qn_status rl_end_transfers(rl_run *r)
{
    char now[24];
    snprintf(now, sizeof(now), "%" PRId64, now_wall_ms());
    for (size_t x = 0; x < r->nxo; x++) {
        const rl_xo *xo = &r->xo[x];
        for (int layout = 0; layout < 2; layout++) {
            int n = layout == 0 ? r->t.from : r->t.to;
            bucket_keys home;
            if (xo->home < 0 || xo->home >= n)
                continue;
            bucket_keys_of(&home, r->t.id, xo->home, n);
            int h = rl_key_of(r, home.hash);
            if (h < 0 || r->keys[h].new_b < 0)
                continue;
            if (rl_ok(redis_sync_command(r->rs, "HSETNX %s xi:%s %s", home.hash, xo->id, now)) !=
                QN_OK)
                return QN_ERR;
        }
        if (r->keys[xo->key].new_b >= 0) {
            const char *keys[1] = {r->keys[xo->key].k.hash}, *args[1] = {xo->id};
            if (rl_ok(REDIS_SYNC_SCRIPT(r->rs, r->s, bucket_settle, keys, args)) != QN_OK)
                return QN_ERR;
        }
    }
    return QN_OK;
}

/* Whether field f is where it belongs: a bucket of the new number that is its user's home. */
static int rl_at_home(const rl_run *r, const rl_field *f)
{
    int b = r->keys[f->key].new_b;
    return b >= 0 && bucket_home(f->user, r->t.to) == b;
}

/* Step 4b: each user's counter (its coupons: nothing is in flight) and claim markers at the
 * user's home among the new number; then, in the buckets of the new number, what no longer
 * belongs there removed. The markers keep "this request id claimed once" across the change.
 * A list of open reservations ("U#") is not carried: none is open. */
static qn_status rl_write_users(rl_run *r)
{
    size_t sent = 0;
    long long keep = (long long)r->row.valid_end_ms;
    if (keep < now_wall_ms() + RL_MARKER_KEEP)
        keep = now_wall_ms() + RL_MARKER_KEEP;
    for (size_t c = 0; c < r->ncounts; c++) {
        bucket_keys k;
        char field[24];
        if (r->counts[c].coupons <= 0)
            continue;
        bucket_keys_of(&k, r->t.id, bucket_home(r->counts[c].user, r->t.to), r->t.to);
        keys_user_field(field, r->counts[c].user);
        redis_sync_append(r->rs, "HSET %s %s %lld", k.users, field, r->counts[c].coupons);
        sent++;
    }
    for (size_t i = 0; i < r->nfields; i++) {
        const rl_field *f = &r->fields[i];
        bucket_keys k;
        if (f->kind != RL_MARKER || rl_at_home(r, f))
            continue;
        bucket_keys_of(&k, r->t.id, bucket_home(f->user, r->t.to), r->t.to);
        redis_sync_append(r->rs, "HSETNX %s %s %s", k.users, f->name, f->value);
        sent++;
    }
    for (int b = 0; b < r->t.to; b++) {
        bucket_keys k;
        bucket_keys_of(&k, r->t.id, b, r->t.to);
        /* at least the template's end, and an hour for the markers (as claim.lua keeps them):
         * set when there is none, pushed out when earlier, never shortened */
        redis_sync_append(r->rs, "PEXPIREAT %s %lld NX", k.users, keep);
        redis_sync_append(r->rs, "PEXPIREAT %s %lld GT", k.users, keep);
        sent += 2;
    }
    if (rl_replies(r->rs, sent) != QN_OK || !r->hold(r->arg))
        return QN_ERR;
    sent = 0;
    for (size_t i = 0; i < r->nfields; i++) {
        const rl_field *f = &r->fields[i];
        if (r->keys[f->key].new_b < 0)
            continue; /* deleted whole below */
        int drop = !rl_at_home(r, f) || (f->kind == RL_COUNT && rl_coupons(r, f->user) <= 0);
        if (!drop)
            continue;
        redis_sync_append(r->rs, "HDEL %s %s", r->keys[f->key].k.users, f->name);
        sent++;
    }
    return rl_replies(r->rs, sent);
}

/* Step 4c: the buckets of the old number that are not buckets of the new one, all three keys
 * (one slot: one DEL). */
static qn_status rl_drop_old(rl_run *r)
{
    size_t sent = 0;
    for (size_t i = 0; i < r->nkeys; i++) {
        if (r->keys[i].new_b >= 0)
            continue;
        redis_sync_append(r->rs, "DEL %s %s %s", r->keys[i].k.hash, r->keys[i].k.users,
                          r->keys[i].k.resv);
        sent++;
    }
    return rl_replies(r->rs, sent);
}

/* Step 4d: every bucket of the new number written in place with its share of the row's stock
 * (a bucket keeps its "xi:X": a late take adds nothing), the template's own hash last, which
 * opens the template as bucket_cache_put does; a bucket's generation rises. */
static qn_status rl_write_buckets(rl_run *r)
{
    for (int b = r->t.to - 1; b >= 0; b--) {
        /* a bucket written opens: not once another replica may have closed them again for its
         * own run (two runs would open what the other reads as closed) */
        if (!r->hold(r->arg))
            return QN_ERR;
        if (bucket_rewrite_sync(r->rs, &r->row, r->row.stock, b) != QN_OK)
            return QN_ERR;
    }
    return QN_OK;
}

/* Step 5: the change is over in the row, under its lock. A terminate (or the end) that
 * committed while the buckets were written from the row read before it is written once more:
 * its own Redis write may have found them closed and been overwritten. Nothing is cleared when
 * the row no longer names this change (another run ended it). */
static qn_status rl_finish(rl_run *r)
{
    shard_route route;
    char sql[256];
    pgparam p = {0};
    qn_status st = QN_ERR;
    if (shard_route_for("t_coupon_template", r->t.shop, &route) != QN_OK)
        return QN_EINVAL;
    pgpool_conn *c = r->pg[route.ds];
    if (pgpool_begin(c) != QN_OK)
        return QN_ERR;
    snprintf(sql, sizeof(sql),
             "SELECT status, coalesce(buckets_relayout_from, 0), stock_buckets FROM %s WHERE "
             "shop_number = $1 AND id = $2 FOR UPDATE",
             route.table);
    pgparam_i64(&p, r->t.shop);
    pgparam_i64(&p, r->t.id);
    PGresult *x = pgpool_exec(c, sql, p.n, p.v);
    if (!x)
        goto fail;
    int same = PQntuples(x) == 1 && atoi(PQgetvalue(x, 0, 1)) == r->t.from &&
               atoi(PQgetvalue(x, 0, 2)) == r->t.to;
    int ended = PQntuples(x) == 1 && atoi(PQgetvalue(x, 0, 0)) != TPL_STATUS_ACTIVE;
    PQclear(x);
    if (!same) { /* another run ended it: nothing of ours to clear */
        (void)pgpool_rollback(c);
        return QN_OK;
    }
    if (ended && r->row.status == TPL_STATUS_ACTIVE) {
        const char *args[1] = {TPL_STATUS_TEXT(ENDED)};
        for (int b = 0; b < r->t.to; b++) {
            bucket_keys k;
            bucket_keys_of(&k, r->t.id, b, r->t.to);
            const char *keys[1] = {k.hash};
            if (rl_ok(REDIS_SYNC_SCRIPT(r->rs, r->s, template_status_set, keys, args)) != QN_OK)
                goto fail;
        }
    }
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET buckets_relayout_from = NULL WHERE shop_number = $1 AND id = $2",
             route.table);
    if (pgpool_exec_cmd(c, sql, p.n, p.v, NULL) != QN_OK || pgpool_commit(c) != QN_OK)
        goto fail;
    st = QN_OK;
    return st;
fail:
    (void)pgpool_rollback(c);
    return st;
}

static void rl_run_clear(rl_run *r)
{
    for (size_t i = 0; i < r->nfields; i++) {
        free(r->fields[i].name);
        free(r->fields[i].value);
    }
    free(r->fields);
    for (size_t i = 0; i < r->nxo; i++)
        free(r->xo[i].id);
    free(r->xo);
    free(r->counts);
    if (r->have_row)
        tpl_clear(&r->row);
}

qn_status relayout_run(redis_sync *rs, const redis_scripts *s, pgpool_conn *pg[2],
                       const relayout_tpl *t, int64_t wait_max_ms, relayout_hold_fn hold, void *arg)
{
    rl_run r = {.rs = rs, .s = s, .pg = pg, .hold = hold, .arg = arg, .t = *t};
    const char *step = "reading the template";
    qn_status st = rl_load_row(&r);
    if (st == QN_ENOTFOUND || (st == QN_OK && r.t.from <= 0)) {
        st = QN_OK; /* gone, or the change is over (another run) */
        goto out;
    }
    if (st != QN_OK)
        goto out;
    rl_layouts(&r);
    step = "closing the buckets";
    if ((st = rl_close(&r)) != QN_OK)
        goto out;
    step = "waiting for the claims in flight";
    if ((st = rl_wait(&r, wait_max_ms)) != QN_OK)
        goto out;
    /* The row again: its stock now counts every claim that was in flight. Still the same
     * change (nothing else changes the buckets while one is under way). */
    step = "reading the template again";
    if ((st = rl_load_row(&r)) != QN_OK || r.t.from != t->from || r.t.to != t->to) {
        if (st == QN_OK || st == QN_ENOTFOUND)
            st = r.t.from <= 0 ? QN_OK : QN_EAGAIN;
        goto out;
    }
    step = "reading the coupons and the buckets";
    if ((st = rl_read_coupons(&r)) != QN_OK)
        goto out;
    for (size_t i = 0; i < r.nkeys; i++)
        if ((st = rl_scan_users(&r, i)) != QN_OK || (st = rl_read_transfers(&r, i)) != QN_OK)
            goto out;
    if (!r.hold(r.arg)) {
        st = QN_ERR;
        goto out;
    }
    step = "writing the new buckets";
    if ((st = rl_end_transfers(&r)) != QN_OK || (st = rl_write_users(&r)) != QN_OK ||
        (st = rl_drop_old(&r)) != QN_OK || (st = rl_write_buckets(&r)) != QN_OK)
        goto out;
    step = "ending the change in the database";
    if ((st = rl_finish(&r)) != QN_OK)
        goto out;
    log_infof(
        NULL,
        ((log_field[]){LOG_I("template_id", r.t.id), LOG_I("from", r.t.from), LOG_I("to", r.t.to),
                       LOG_I("stock", r.row.stock), LOG_I("users", (int64_t)r.ncounts), LOG_END}),
        "relayout: the template's stock buckets changed");
out:
    if (st != QN_OK && st != QN_EAGAIN)
        log_warnf(NULL, ((log_field[]){LOG_I("template_id", t->id), LOG_S("step", step), LOG_END}),
                  "relayout: the change of stock buckets failed; trying again");
    rl_run_clear(&r);
    return st;
}

qn_status relayout_list(pgpool_conn *pg[2], relayout_tpl **out, size_t *n)
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
                 "SELECT id, shop_number, buckets_relayout_from, stock_buckets FROM %s WHERE "
                 "buckets_relayout_from IS NOT NULL",
                 route.table);
        PGresult *r = pgpool_exec(pg[route.ds], sql, 0, NULL);
        if (!r)
            return QN_ERR;
        for (int i = 0; i < PQntuples(r); i++) {
            if (grow(out, &cap, *n + 1, sizeof(**out), 16) != QN_OK) {
                PQclear(r);
                return QN_ENOMEM;
            }
            (*out)[(*n)++] = (relayout_tpl){
                .id = strtoll(PQgetvalue(r, i, 0), NULL, 10),
                .shop = strtoll(PQgetvalue(r, i, 1), NULL, 10),
                .from = atoi(PQgetvalue(r, i, 2)),
                .to = atoi(PQgetvalue(r, i, 3)),
            };
        }
        PQclear(r);
    }
    return QN_OK;
}

/* ---- the module ---- */

typedef struct relayout_settings {
    int64_t check_ms;
    int64_t wait_max_ms;
} relayout_settings;

/* Read at start; the running module reads them through its context. */
static relayout_settings relayout_cfg;

struct relayout {
    service *svc;
    const relayout_settings *cfg;
    const regen *regen; /* a rebuild after a Redis loss goes first */
    int running;
    redis_sync *sync; /* the worker's client */
    const redis_scripts *scripts;
    char token[LOCK_TOKEN_LEN]; /* this attempt's hold on the lock */
};

/* The hold is still ours: renewed (the lock's value is this attempt's token). A reply that did
 * not come is not a loss: the next renewal finds out. */
static int relayout_renew(void *arg)
{
    relayout *g = arg;
    const char *keys[1] = {RL_LOCK};
    char lease[16];
    snprintf(lease, sizeof(lease), "%d", RL_LOCK_MS);
    const char *args[2] = {g->token, lease};
    redisReply *r = REDIS_SYNC_SCRIPT(g->sync, g->scripts, lock_renew, keys, args);
    int held = !r || r->type != REDIS_REPLY_INTEGER || r->integer == 1;
    freeReplyObject(r);
    return held;
}

static qn_status relayout_work(pgpool_conn *conn0, void *arg)
{
    relayout *g = arg;
    pgpool_conn *pg[2] = {conn0, NULL};
    relayout_tpl *t = NULL;
    size_t n = 0;
    qn_status st = QN_OK;
    if (!(pg[1] = pgpool_acquire(service_pg(g->svc, 1), RL_ACQUIRE_MS)))
        return QN_ERR;
    if ((st = relayout_list(pg, &t, &n)) != QN_OK || n == 0)
        goto out;
    metrics_set(&metric_quan_relayout_pending, (double)n);
    if ((st = redis_sync_open(g->sync)) != QN_OK || (st = lock_token_new(g->token)) != QN_OK)
        goto out;
    g->scripts = redis_client_scripts(service_redis(g->svc));
    redisReply *r =
        redis_sync_command(g->sync, "SET %s %s NX PX %d", RL_LOCK, g->token, RL_LOCK_MS);
    int ours = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!ours)
        goto out; /* another replica is at it */
    for (size_t i = 0; i < n; i++) {
        qn_status one =
            relayout_run(g->sync, g->scripts, pg, &t[i], g->cfg->wait_max_ms, relayout_renew, g);
        metrics_inc_l(&metric_quan_relayouts_total, one == QN_OK       ? "done"
                                                    : one == QN_EAGAIN ? "waiting"
                                                                       : "failed");
        if (one != QN_OK && one != QN_EAGAIN) {
            st = one;
            break; /* the next tick starts again */
        }
        if (!relayout_renew(g))
            break;
    }
    if (!redis_sync_broken(g->sync)) {
        const char *keys[1] = {RL_LOCK}, *args[1] = {g->token};
        freeReplyObject(REDIS_SYNC_SCRIPT(g->sync, g->scripts, lock_release, keys, args));
    }
out:
    if (n == 0 && st == QN_OK)
        metrics_set(&metric_quan_relayout_pending, 0);
    pgpool_release(pg[1]);
    free(t);
    return st;
}

static void relayout_done(qn_status st, void *arg)
{
    (void)st;
    relayout *g = arg;
    g->running = 0;
}

static void relayout_on_tick(void *state)
{
    relayout *g = state;
    pgpool *pool = service_pg(g->svc, 0);
    if (g->running || !regen_ok(g->regen) || !pool ||
        !redis_client_connected(service_redis(g->svc)))
        return;
    if (pgpool_submit(pool, relayout_work, relayout_done, g) == QN_OK)
        g->running = 1;
}

static qn_status relayout_start(service *s, void **state)
{
    relayout *g = calloc(1, sizeof(*g));
    if (!g)
        return QN_ENOMEM;
    *state = g; /* freed by relayout_free from here on, whatever happens below */
    g->svc = s;
    g->cfg = &relayout_cfg;
    g->regen = service_module_state(s, &regen_module);
    if (!g->regen) { /* it starts before this module */
        log_error(NULL, "relayout: the regen module must start first");
        return QN_ERR;
    }
    /* A run's pipelines are long: five times a command's timeout. */
    const service_config *common = service_cfg(s);
    g->sync = service_redis_sync_new(common, (int)common->redis_timeout_ms * 5);
    return g->sync ? QN_OK : QN_ENOMEM;
}

static void relayout_free(void *state)
{
    relayout *g = state;
    if (!g)
        return;
    redis_sync_free(g->sync);
    free(g);
}

static const config_var relayout_vars[] = {
    {"QUAN_RELAYOUT_CHECK_MS", CONFIG_INT, offsetof(relayout_settings, check_ms), "1000", 100,
     60000, NULL, 0,
     "how often an engine looks for a template whose change of stock buckets waits for its "
     "Redis re-layout"},
    {"QUAN_RELAYOUT_WAIT_MAX_MS", CONFIG_INT, offsetof(relayout_settings, wait_max_ms), "60000",
     1000, 86400000, NULL, 0,
     "how long one re-layout attempt waits for the claims in flight on the old buckets before "
     "giving the turn to the next template (the buckets stay closed; a later tick goes on)"},
};

const service_module relayout_module = {
    .name = "relayout",
    .vars = relayout_vars,
    .nvars = sizeof(relayout_vars) / sizeof(relayout_vars[0]),
    .settings = &relayout_cfg,
    .timers =
        (const service_timer[]){
            {"relayout", offsetof(relayout_settings, check_ms), relayout_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(RELAYOUT_METRICS) NULL},
    .start = relayout_start,
    .free = relayout_free,
};
