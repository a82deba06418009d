/* One chunk of a distribution task through Redis and the databases (chunk.h). */
#include "chunk.h"

#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cellrow.h"
#include "events.h"
#include "keys.h"
#include "log.h"
#include "now.h"
#include "outbox.h"
#include "pgparam.h"
#include "shard.h"
#include "task.h"

#define CHUNK_NUM_LEN 24

/* ---------------------------------------------------------------- text built in bulk */

/* A chunk writes thousands of keys, numbers and JSON strings: appended to a growable buffer,
 * numbers without printf. *oom is set when an append ran out of memory. */
static void chunk_put(cellrow_buf *b, int *oom, const char *s, size_t n)
{
    if (cellrow_buf_append(b, s, n) != 0)
        *oom = 1;
}

static void chunk_put_str(cellrow_buf *b, int *oom, const char *s)
{
    chunk_put(b, oom, s, strlen(s));
}

static void chunk_put_i64(cellrow_buf *b, int *oom, int64_t v)
{
    char num[PGPARAM_NUM_LEN];
    chunk_put(b, oom, num, pgparam_fmt_i64(num, v));
}

/* s as the content of a JSON string. */
static void chunk_put_json(cellrow_buf *b, int *oom, const char *s)
{
    char esc[6 * TASKROW_TEXT_MAX + 8];
    chunk_put(b, oom, esc, log_json_escape(esc, sizeof(esc), s));
}

/* One RESP bulk string (a command's argument). */
static void chunk_put_arg(cellrow_buf *b, int *oom, const char *s, size_t n)
{
    chunk_put(b, oom, "$", 1);
    chunk_put_i64(b, oom, (int64_t)n);
    chunk_put(b, oom, "\r\n", 2);
    chunk_put(b, oom, s, n);
    chunk_put(b, oom, "\r\n", 2);
}

void chunk_free(chunk *c)
{
    taskrow_chunk_free(&c->rows);
    free(c->outcome);
    free(c->coupons);
    free(c->issued);
    free(c->order);
    memset(c, 0, sizeof(*c));
}

/* Room for c->rows.n rows in the per-row arrays. */
static qn_status chunk_fit(chunk *c)
{
    size_t n = c->rows.n;
    if (n <= c->cap)
        return QN_OK;
    int *o = realloc(c->outcome, n * sizeof(*o));
    if (o)
        c->outcome = o;
    ucoupon *u = realloc(c->coupons, n * sizeof(*u));
    if (u)
        c->coupons = u;
    char *is = realloc(c->issued, n);
    if (is)
        c->issued = is;
    if (!o || !u || !is)
        return QN_ENOMEM;
    c->cap = n;
    return QN_OK;
}

const char *chunk_cause(int outcome)
{
    switch (outcome) {
    case CHUNK_DUPLICATE:
        return "duplicate in file";
    case CHUNK_LIMIT:
        return "limit reached";
    case CHUNK_NO_STOCK:
        return "out of stock";
    case CHUNK_ENDED:
        return "template ended";
    case CHUNK_INVALID:
        return "invalid user id";
    default:
        return outcome >= 1 ? NULL : "internal error";
    }
}

/* ---------------------------------------------------------------- 1. Redis reservation */

/* The outcomes of the rows idx[0..m) (in that order) from text ("o1,o2,..."), as
 * chunk_outcomes_read. */
static qn_status chunk_outcomes_of(chunk *c, const size_t *idx, size_t m, const char *text)
{
    const char *p = text;
    for (size_t k = 0; k < m; k++) {
        char *end;
        long v = strtol(p, &end, 10);
        /* Past the list's end, not an integer, 0 (no outcome) or out of int's range. */
        if (end == p || v == 0 || v < INT_MIN || v > INT_MAX || (*end != ',' && *end != '\0'))
            return QN_EINVAL;
        c->outcome[idx[k]] = (int)v;
        p = *end ? end + 1 : end;
    }
    /* Outcomes left over (more rows than these), or a comma that ends the list. */
    return *p || (p > text && p[-1] == ',') ? QN_EINVAL : QN_OK;
}

qn_status chunk_outcomes_read(chunk *c, const char *text)
{
    size_t m = 0;
    size_t *idx = malloc((c->rows.n ? c->rows.n : 1) * sizeof(*idx));
    if (!idx)
        return QN_ENOMEM;
    for (size_t i = 0; i < c->rows.n; i++)
        if (c->outcome[i] == 0) /* no user id: not sent to the script */
            idx[m++] = i;
    qn_status st = chunk_outcomes_of(c, idx, m, text);
    free(idx);
    return st;
}

qn_status chunk_split(chunk *c, int n)
{
    size_t rows = c->rows.n;
    if (n < 1)
        n = 1;
    if (n > BUCKET_MAX)
        n = BUCKET_MAX;
    if (rows > c->order_cap) {
        size_t *o = realloc(c->order, rows * sizeof(*o));
        if (!o)
            return QN_ENOMEM;
        c->order = o;
        c->order_cap = rows;
    }
    /* a counting sort: the rows per bucket, then each row at its bucket's next place */
    size_t count[BUCKET_MAX] = {0};
    for (size_t i = 0; i < rows; i++)
        if (c->rows.rows[i].user_id > 0)
            count[bucket_home(c->rows.rows[i].user_id, n)]++;
    c->start[0] = 0;
    for (int b = 0; b < n; b++)
        c->start[b + 1] = c->start[b] + count[b];
    size_t next[BUCKET_MAX];
    memcpy(next, c->start, sizeof(next));
    for (size_t i = 0; i < rows; i++)
        if (c->rows.rows[i].user_id > 0)
            c->order[next[bucket_home(c->rows.rows[i].user_id, n)]++] = i;
    c->nbuckets = n;
    memset(c->passes, 0, sizeof(c->passes));
    return QN_OK;
}

void chunk_keys(const chunk_task *t, int64_t no, int b, int p, char *rec, char *seen)
{
    int n = t->buckets > 1 ? t->buckets : 1;
    if (b <= 0 || n <= 1) {
        keys_task_chunk(rec, t->tpl_id, t->id, no);
        if (seen)
            keys_task_seen(seen, t->tpl_id, t->id);
    } else {
        bucket_keys k;
        bucket_keys_of(&k, t->tpl_id, b, n);
        /* quan:bkt:{tag}:task:<task>:chunk:<no> and ...:seen (keys_cat cuts as snprintf) */
        size_t len = keys_cat_i64(k.hash, keys_cat(k.hash, strlen(k.hash), ":task:"), t->id);
        if (seen)
            keys_cat(memcpy(seen, k.hash, len + 1), len, ":seen");
        keys_cat_i64(rec, keys_cat(memcpy(rec, k.hash, len + 1), len, ":chunk:"), no);
    }
    if (p > 0) /* a later pass: a record of its own */
        keys_cat_i64(rec, keys_cat(rec, strlen(rec), ":"), p);
}

/* One dist_chunk.lua call: bucket b's pass p over the rows idx[0..m) in mode; their outcomes
 * read into c for RESERVED and REPLAYED. */
static qn_status chunk_pass(redis_sync *rs, const redis_scripts *sc, const chunk_task *t, chunk *c,
                            int b, int p, const char *mode, const size_t *idx, size_t m,
                            chunk_reply *reply)
{
    int n = t->buckets > 1 ? t->buckets : 1;
    const char *keys[4], **args = NULL;
    char *buf = NULL;
    redisReply *r = NULL;
    bucket_keys bk;
    qn_status st = QN_ENOMEM;

    /* KEYS: the bucket's hash, the pass's record, the bucket's seen set, its users hash (its
     * counts are fields named by the user ids, so the ids are the only per-row texts); ARGV:
     * now, ttl, mode, limit, one user id per row. Their texts in one buffer. */
    args = malloc((4 + m) * sizeof(*args));
    buf = malloc(4 * KEYS_LEN + (4 + m) * CHUNK_NUM_LEN);
    if (!args || !buf)
        goto out;
    char *kb = buf, *ab = buf + 4 * KEYS_LEN;
    for (size_t i = 0; i < 4; i++)
        keys[i] = kb + i * KEYS_LEN;
    for (size_t i = 0; i < 4 + m; i++)
        args[i] = ab + i * CHUNK_NUM_LEN;
    bucket_keys_of(&bk, t->tpl_id, b, n);
    memcpy(kb, bk.hash, KEYS_LEN);
    chunk_keys(t, c->no, b, p, kb + KEYS_LEN, kb + 2 * KEYS_LEN);
    memcpy(kb + 3 * KEYS_LEN, bk.users, KEYS_LEN);
    snprintf(ab, CHUNK_NUM_LEN, "%" PRId64, now_wall_ms());
    snprintf(ab + CHUNK_NUM_LEN, CHUNK_NUM_LEN, "%lld", CHUNK_STATE_TTL_MS);
    snprintf(ab + 2 * CHUNK_NUM_LEN, CHUNK_NUM_LEN, "%s", mode);
    snprintf(ab + 3 * CHUNK_NUM_LEN, CHUNK_NUM_LEN, "%d", t->limit);
    /* The user id as keys_user_field writes it (its field in the users hash). */
    for (size_t k = 0; k < m; k++)
        pgparam_fmt_i64(ab + (4 + k) * CHUNK_NUM_LEN, c->rows.rows[idx[k]].user_id);
    st = QN_ERR;
    r = REDIS_SYNC_SCRIPT_N(rs, sc, dist_chunk, 4, keys, (int)(4 + m), args);
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        log_warn(NULL, "task %" PRId64 " chunk %" PRId64 " bucket %d: dist_chunk.lua: %s", t->id,
                 c->no, b,
                 !r                             ? redis_sync_errstr(rs)
                 : r->type == REDIS_REPLY_ERROR ? r->str
                                                : "bad reply");
        goto out;
    }
    *reply = (chunk_reply)r->element[0]->integer;
    st = QN_OK;
    if (*reply != CHUNK_RESERVED && *reply != CHUNK_REPLAYED)
        goto out;
    st = QN_EINVAL;
    if (r->elements != 2 || r->element[1]->type != REDIS_REPLY_STRING)
        goto out;
    st = chunk_outcomes_of(c, idx, m, r->element[1]->str);
out:
    if (r)
        freeReplyObject(r);
    free(args);
    free(buf);
    return st;
}

/* Of the rows idx[0..*m), keeps those out of stock for now (-3) in idx, in order, and *m their
 * number; those out of stock for good (-6) become CHUNK_NO_STOCK. */
static void chunk_dry_rows(chunk *c, size_t *idx, size_t *m)
{
    size_t k = 0;
    for (size_t i = 0; i < *m; i++) {
        int *o = &c->outcome[idx[i]];
        if (*o == CHUNK_NO_STOCK)
            idx[k++] = idx[i];
        else if (*o == CHUNK_SOLD_OUT)
            *o = CHUNK_NO_STOCK;
    }
    *m = k;
}

#define CHUNK_DOUBT_TRIES    25  /* looks while the verdict is "in doubt" ... */
#define CHUNK_DOUBT_PAUSE_MS 200 /* ... this long apart: longer than a transfer lives */

static void chunk_sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The next pass's mode for bucket b's rows out of stock: "again" once stock came home,
 * "out" when every bucket is empty (bucket_seek_sync). QN_EBUSY while in doubt. */
static qn_status chunk_seek(redis_sync *rs, const redis_scripts *sc, const chunk_task *t,
                            const chunk *c, int b, int p, const char **mode)
{
    char prefix[KEYS_LEN];
    for (int i = 0; i < CHUNK_DOUBT_TRIES; i++) {
        bucket_verdict_t v;
        if (i > 0)
            chunk_sleep_ms(CHUNK_DOUBT_PAUSE_MS);
        /* unique per run, chunk, bucket, pass and look; the same again when the chunk is
         * tried again, which finishes a transfer a failure cut short (bucket.h) */
        snprintf(prefix, sizeof(prefix), "d%" PRId64 ".%" PRId64 ".%d.%d.%s.%d", t->id, c->no, b, p,
                 t->exec_id ? t->exec_id : "", i);
        if (bucket_seek_sync(rs, sc, t->tpl_id, t->buckets, b, prefix, &v) != QN_OK) {
            log_warn(NULL, "task %" PRId64 " chunk %" PRId64 " bucket %d: seeking stock: %s", t->id,
                     c->no, b, redis_sync_errstr(rs));
            return QN_ERR;
        }
        if (v == BUCKET_HAS_STOCK) {
            *mode = "again";
            return QN_OK;
        }
        if (v == BUCKET_SOLD_OUT) {
            *mode = "out";
            return QN_OK;
        }
    }
    log_warnf(NULL, ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no), LOG_END}),
              "distribution: whether the template is sold out stays in doubt (reservations or "
              "transfers open); the chunk is tried again");
    return QN_EBUSY;
}

/* Bucket b's passes after its first, over its rows out of stock (dry[0..m), changed): each
 * replayed when recorded, else run after a seek, until none is out of stock for now. */
static qn_status chunk_refill(redis_sync *rs, const redis_scripts *sc, const chunk_task *t,
                              chunk *c, int b, size_t *dry, size_t m, chunk_reply *reply)
{
    *reply = CHUNK_REPLAYED;
    for (int p = 1; m > 0; p++) {
        chunk_reply r = CHUNK_NONE;
        const char *mode = NULL;
        qn_status st;
        if (p > CHUNK_PASSES_MAX)
            return QN_EBUSY;
        /* a pass recorded (an earlier run) is the pass: never decided twice */
        if ((st = chunk_pass(rs, sc, t, c, b, p, "peek", dry, m, &r)) != QN_OK)
            return st;
        if (r == CHUNK_NONE) {
            if ((st = chunk_seek(rs, sc, t, c, b, p, &mode)) != QN_OK ||
                (st = chunk_pass(rs, sc, t, c, b, p, mode, dry, m, &r)) != QN_OK)
                return st;
        }
        c->passes[b] = p + 1;
        if (r != CHUNK_RESERVED && r != CHUNK_REPLAYED) {
            *reply = r; /* closed, or the bucket's hash gone: these rows undecided */
            for (size_t k = 0; k < m; k++)
                c->outcome[dry[k]] = 0;
            return QN_OK;
        }
        if (r == CHUNK_RESERVED)
            *reply = CHUNK_RESERVED;
        chunk_dry_rows(c, dry, &m);
    }
    return QN_OK;
}

qn_status chunk_reserve(redis_sync *rs, const redis_scripts *sc, const chunk_task *t, chunk *c,
                        int peek, chunk_reply *reply)
{
    int n = t->buckets > 1 ? t->buckets : 1, first = 1;
    size_t *dry = NULL;
    chunk_reply r = CHUNK_NONE;
    qn_status st = QN_ENOMEM;

    if (chunk_fit(c) != QN_OK)
        goto out;
    for (size_t i = 0; i < c->rows.n; i++)
        c->outcome[i] = c->rows.rows[i].user_id > 0 ? 0 : CHUNK_INVALID;
    if (chunk_split(c, n) != QN_OK)
        goto out;
    if (n > 1 && !(dry = malloc((c->rows.n ? c->rows.n : 1) * sizeof(*dry))))
        goto out;
    c->t0 = now_mono_s();
    *reply = CHUNK_REPLAYED;
    /* One bucket at a time, in order: a bucket is called only once those before it answered,
     * so when the first (with rows) was never reserved, none was. */
    for (int b = 0; b < n; b++) {
        size_t m = c->start[b + 1] - c->start[b];
        const size_t *idx = c->order + c->start[b];
        /* no row with a user id at all: the one empty call, as always (its record) */
        if (m == 0 && (b > 0 || c->start[n] > 0))
            continue;
        st = chunk_pass(rs, sc, t, c, b, 0, peek && first ? "peek" : "run", idx, m, &r);
        if (st != QN_OK)
            goto out;
        c->passes[b] = 1;
        first = 0;
        if (r == CHUNK_RESERVED)
            *reply = CHUNK_RESERVED;
        else if (r != CHUNK_REPLAYED)
            break;
        if (n == 1)
            continue; /* one bucket: out of stock is final, as it always was */
        memcpy(dry, idx, m * sizeof(*dry));
        chunk_dry_rows(c, dry, &m);
        if ((st = chunk_refill(rs, sc, t, c, b, dry, m, &r)) != QN_OK)
            goto out;
        if (r == CHUNK_RESERVED)
            *reply = CHUNK_RESERVED;
        else if (r != CHUNK_REPLAYED)
            break;
    }
    /* closed, nothing to do (peek), or a bucket's hash gone (its rows and those after it
     * undecided): that is the answer */
    if (r != CHUNK_RESERVED && r != CHUNK_REPLAYED)
        *reply = r;
    c->t_reserve = now_mono_s() - c->t0;
    st = QN_OK;
out:
    free(dry);
    return st;
}

void chunk_all_ended(chunk *c)
{
    if (chunk_fit(c) != QN_OK)
        return; /* cannot happen: chunk_reserve fitted it */
    for (size_t i = 0; i < c->rows.n; i++)
        if (c->rows.rows[i].user_id <= 0)
            c->outcome[i] = CHUNK_INVALID;
        else if (c->outcome[i] == 0)
            c->outcome[i] = CHUNK_ENDED;
}

/* ---------------------------------------------------------------- 2. the databases */

/* Inserts the step's marker; *fresh = 1 when it is new (the step was never done). */
static qn_status chunk_mark(pgpool_conn *conn, const chunk_task *t, const chunk *c,
                            const char *step, int64_t count, int *fresh)
{
    pgparam p = {0};
    int64_t n = 0;
    pgparam_i64(&p, t->id);
    pgparam_i64(&p, c->no);
    pgparam_str(&p, step);
    pgparam_i64(&p, count);
    qn_status st =
        pgpool_exec_cmd(conn,
                        "INSERT INTO t_coupon_task_mark (task_id, chunk_no, step, count) "
                        "VALUES ($1::bigint, $2::integer, $3, $4::integer) "
                        "ON CONFLICT DO NOTHING",
                        p.n, p.v, &n);
    *fresh = n == 1;
    return st;
}

typedef struct chunk_part {
    pgpool_conn *conn;
    const chunk_task *t;
    chunk *c;
    int ds;
    qn_status st;
} chunk_part;

/* The coupons of the chunk's users of one database, in one transaction with its marker; or,
 * when the marker is there, the coupons read back. Sets issued[] for those rows only (the other
 * database runs on another thread over the same chunk). */
static qn_status chunk_write_ds(pgpool_conn *conn, const chunk_task *t, chunk *c, int ds)
{
    size_t n = c->rows.n, m = 0;
    ucoupon **rows = NULL;
    size_t *idx = NULL;
    char *hit = NULL;
    int fresh = 0;
    qn_status st = QN_ENOMEM;

    for (size_t i = 0; i < n; i++)
        if (c->outcome[i] >= 1 && ucoupon_ds(c->rows.rows[i].user_id) == ds)
            m++;
    if (m == 0)
        return QN_OK;
    rows = malloc(m * sizeof(*rows));
    idx = malloc(m * sizeof(*idx));
    hit = malloc(m);
    if (!rows || !idx || !hit)
        goto out;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (c->outcome[i] >= 1 && ucoupon_ds(c->rows.rows[i].user_id) == ds) {
            rows[m] = &c->coupons[i];
            idx[m++] = i;
        }
    st = QN_ERR;
    if (pgpool_begin(conn) != QN_OK || chunk_mark(conn, t, c, "coupons", 0, &fresh) != QN_OK)
        goto out;
    if (fresh) {
        if (ucoupon_insert_many(conn, (const ucoupon *const *)rows, m, UCOUPON_ON_SLOT, hit) !=
            QN_OK)
            goto out;
        /* Not inserted: a unique key said no. Its own request (cannot be: the marker is new)
         * is read back like a replay; anything else is another coupon in the slot. */
        size_t k = 0, ins = 0;
        for (size_t j = 0; j < m; j++) {
            c->issued[idx[j]] = hit[j];
            ins += hit[j] != 0;
            if (!hit[j]) {
                rows[k] = rows[j];
                idx[k++] = idx[j];
            }
        }
        if (k > 0) {
            if (ucoupon_find_requests(conn, rows, k, hit) != QN_OK)
                goto out;
            for (size_t j = 0; j < k; j++)
                c->issued[idx[j]] = hit[j];
        }
        pgparam p = {0};
        pgparam_i64(&p, t->id);
        pgparam_i64(&p, c->no);
        pgparam_i64(&p, (int64_t)ins);
        if (pgpool_exec_cmd(conn,
                            "UPDATE t_coupon_task_mark SET count = $3::integer WHERE task_id = "
                            "$1::bigint AND chunk_no = $2::integer AND step = 'coupons'",
                            p.n, p.v, NULL) != QN_OK ||
            pgpool_commit(conn) != QN_OK)
            goto out;
    } else {
        /* Written before (by this task's run that died, or one running beside us): what exists
         * is what was issued. */
        (void)pgpool_rollback(conn);
        if (ucoupon_find_requests(conn, rows, m, hit) != QN_OK)
            goto out;
        for (size_t j = 0; j < m; j++)
            c->issued[idx[j]] = hit[j];
    }
    st = QN_OK;
out:
    if (st != QN_OK) {
        log_warnf(NULL,
                  ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no), LOG_I("ds", ds),
                                 LOG_S("error", pgpool_conn_error(conn)), LOG_END}),
                  "distribution: writing a chunk's coupons failed");
        (void)pgpool_rollback(conn);
    }
    free(rows);
    free(idx);
    free(hit);
    return st;
}

static void *chunk_write_ds1(void *arg)
{
    chunk_part *a = arg;
    a->st = chunk_write_ds(a->conn, a->t, a->c, 1);
    return NULL;
}

/* The template's stock, by the coupons that exist, once per chunk. */
static qn_status chunk_take_stock(pgpool_conn *conn, const chunk_task *t, const chunk *c)
{
    int fresh = 0;
    int64_t n = (int64_t)c->nissued, affected = 0;
    shard_route route;
    char sql[256];
    if (n == 0)
        return QN_OK;
    if (shard_route_for("t_coupon_template", t->shop, &route) != QN_OK)
        return QN_ERR;
    if (pgpool_begin(conn) != QN_OK || chunk_mark(conn, t, c, "stock", n, &fresh) != QN_OK)
        goto fail;
    if (fresh) {
        pgparam p = {0};
        pgparam_i64(&p, t->shop);
        pgparam_i64(&p, t->tpl_id);
        pgparam_i64(&p, n);
        /* Redis reserved these from a stock the database's can only exceed (claims take Redis
         * first); never below 0 all the same (a CHECK would refuse the chunk for ever). */
        snprintf(sql, sizeof(sql),
                 "UPDATE %s SET stock = stock - LEAST(stock, $3::integer), update_time = now() "
                 "WHERE shop_number = $1::bigint AND id = $2::bigint",
                 route.table);
        if (pgpool_exec_cmd(conn, sql, p.n, p.v, &affected) != QN_OK)
            goto fail;
        if (affected == 0) /* the template row is gone; the run notices at its next load */
            log_warnf(NULL,
                      ((log_field[]){LOG_I("task", t->id), LOG_I("template", t->tpl_id), LOG_END}),
                      "distribution: the template is gone from the database; no stock taken");
    }
    if (pgpool_commit(conn) != QN_OK)
        goto fail;
    return QN_OK;
fail:
    log_warnf(NULL,
              ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no),
                             LOG_S("error", pgpool_conn_error(conn)), LOG_END}),
              "distribution: taking a chunk's stock failed");
    (void)pgpool_rollback(conn);
    return QN_ERR;
}

qn_status chunk_write(pgpool_conn *pg[2], const chunk_task *t, chunk *c)
{
    size_t n = c->rows.n;
    int64_t now = now_wall_ms();
    int in[2] = {0, 0};
    char rid_prefix[UCOUPON_REQUEST_ID_MAX + 1];
    size_t rid_len = (size_t)snprintf(rid_prefix, sizeof(rid_prefix), "%s%" PRId64 ":",
                                      CHUNK_REQUEST_PREFIX, t->id);

    if (chunk_fit(c) != QN_OK)
        return QN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const taskrow *row = &c->rows.rows[i];
        c->issued[i] = 0;
        if (c->outcome[i] < 1)
            continue;
        int64_t id = 0;
        char rid[UCOUPON_REQUEST_ID_MAX + 1];
        if (ids_next(t->ids, &id) != QN_OK)
            return QN_ERR; /* the id lease is gone for now: the chunk is retried */
        memcpy(rid, rid_prefix, rid_len);
        pgparam_fmt_i64(rid + rid_len, row->row);
        ucoupon_claimed(&c->coupons[i], id, row->user_id, t->tpl_id, t->shop, t->source,
                        UCOUPON_CH_TASK, c->outcome[i], now, t->validity_hours, rid);
        in[ucoupon_ds(row->user_id)] = 1;
    }
    /* The two databases at once, each on its own connection. */
    chunk_part a = {pg[1], t, c, 1, QN_ERR};
    pthread_t th;
    int threaded = in[0] && in[1] && pthread_create(&th, NULL, chunk_write_ds1, &a) == 0;
    qn_status st = chunk_write_ds(pg[0], t, c, 0);
    if (threaded)
        pthread_join(th, NULL);
    else
        a.st = chunk_write_ds(pg[1], t, c, 1);
    if (st != QN_OK || a.st != QN_OK)
        return QN_ERR;
    c->nissued = c->nrefused = 0;
    for (size_t i = 0; i < n; i++) {
        if (c->outcome[i] < 1)
            continue;
        if (c->issued[i])
            c->nissued++;
        else
            c->nrefused++;
    }
    return chunk_take_stock(pg[t->tpl_ds], t, c);
}

/* ---------------------------------------------------------------- 3. Redis after the writes */

/* Reads n pipelined replies; QN_ERR if one failed (all are read, so the next command gets its
 * own). Only whether each failed matters: read without a reply object (on one node, none is
 * made at all: thousands of allocations less per chunk). */
static qn_status chunk_replies(redis_sync *rs, size_t n)
{
    qn_status st = QN_OK;
    for (size_t i = 0; i < n; i++)
        if (redis_sync_get_reply(rs, NULL) != QN_OK)
            st = QN_ERR;
    return st;
}

/* Gives back the reservations of the refused rows (c->nrefused > 0), once per bucket: KEYS the
 * bucket's hash, its first record, its users hash; ARGV the user id of each refused row of the
 * bucket (its count's field), whichever pass reserved it. */
static qn_status chunk_give_back(redis_sync *rs, const redis_scripts *sc, const chunk_task *t,
                                 const chunk *c)
{
    int n = t->buckets > 1 ? t->buckets : 1;
    const char **args = malloc(c->nrefused * sizeof(*args));
    char *buf = malloc(c->nrefused * CHUNK_NUM_LEN);
    qn_status st = args && buf ? QN_OK : QN_ENOMEM;
    for (int b = 0; b < n && st == QN_OK && b < c->nbuckets; b++) {
        char kb[3][KEYS_LEN];
        const char *keys[3] = {kb[0], kb[1], kb[2]};
        bucket_keys bk;
        size_t k = 0;
        for (size_t j = c->start[b]; j < c->start[b + 1] && k < c->nrefused; j++) {
            size_t i = c->order[j];
            if (c->outcome[i] >= 1 && !c->issued[i]) {
                args[k] = buf + k * CHUNK_NUM_LEN;
                pgparam_fmt_i64(buf + k++ * CHUNK_NUM_LEN, c->rows.rows[i].user_id);
            }
        }
        if (k == 0)
            continue;
        bucket_keys_of(&bk, t->tpl_id, b, n);
        memcpy(kb[0], bk.hash, KEYS_LEN);
        chunk_keys(t, c->no, b, 0, kb[1], NULL);
        memcpy(kb[2], bk.users, KEYS_LEN);
        redisReply *r = REDIS_SYNC_SCRIPT_N(rs, sc, dist_chunk_undo, 3, keys, (int)k, args);
        st = r && r->type == REDIS_REPLY_INTEGER ? QN_OK : QN_ERR;
        if (st == QN_OK && r->integer >= 0)
            log_warnf(NULL,
                      ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no),
                                     LOG_I("bucket", b), LOG_I("given_back", r->integer), LOG_END}),
                      "distribution: coupons the database refused (the users hold them already); "
                      "their reservations are given back");
        if (r)
            freeReplyObject(r);
    }
    free(args);
    free(buf);
    return st;
}

qn_status chunk_settle(redis_sync *rs, const redis_scripts *sc, const chunk_task *t, const chunk *c)
{
    char key[KEYS_LEN], member[UCOUPON_MEMBER_LEN];
    cellrow_buf b = {0};
    int oom = 0;
    size_t sent = 0;
    qn_status st = QN_ERR;
    if (c->nrefused > 0 && chunk_give_back(rs, sc, t, c) != QN_OK)
        return QN_ERR;
    /* ZADD quan:wallet:{user} <receive time> <template>_<id>, every one in one buffer (each to
     * its user's node on a cluster). */
    for (size_t i = 0; i < c->rows.n; i++) {
        const ucoupon *u = &c->coupons[i];
        char score[PGPARAM_NUM_LEN];
        if (c->outcome[i] < 1 || !c->issued[i] || u->status != UCOUPON_UNUSED)
            continue;
        keys_wallet(key, u->user_id);
        ucoupon_member(member, u->template_id, u->id);
        chunk_put(&b, &oom, "*4\r\n$4\r\nZADD\r\n", 14);
        chunk_put_arg(&b, &oom, key, strlen(key));
        chunk_put_arg(&b, &oom, score, pgparam_fmt_i64(score, u->receive_time_ms));
        chunk_put_arg(&b, &oom, member, strlen(member));
        sent++;
    }
    if (oom)
        st = QN_ENOMEM;
    else if (sent == 0 || redis_sync_append_formatted(rs, b.p, b.len) == sent)
        st = chunk_replies(rs, sent);
    else
        redis_sync_discard(rs);
    cellrow_buf_free(&b);
    return st;
}

/* ---------------------------------------------------------------- 4. the checkpoint */

/* The task.notify event of the chunk's issued users (data of docs/events.md), into b: each
 * user's phone only when the task sends SMS (3), the mail only when it sends e-mail (2). */
static void chunk_notify_json(cellrow_buf *b, int *oom, const chunk_task *t, const chunk *c)
{
    int first = 1;
    int sms = strchr(t->notify, '3') != NULL, email = strchr(t->notify, '2') != NULL;
    chunk_put_str(b, oom, "{\"taskId\":\"");
    chunk_put_i64(b, oom, t->id);
    chunk_put_str(b, oom, "\",\"couponTemplateId\":\"");
    chunk_put_i64(b, oom, t->tpl_id);
    chunk_put_str(b, oom, "\",\"shopNumber\":\"");
    chunk_put_i64(b, oom, t->shop);
    chunk_put_str(b, oom, "\",\"notifyType\":\"");
    chunk_put_json(b, oom, t->notify);
    chunk_put_str(b, oom, "\",\"users\":[");
    for (size_t i = 0; i < c->rows.n; i++) {
        const taskrow *row = &c->rows.rows[i];
        if (c->outcome[i] < 1 || !c->issued[i])
            continue;
        chunk_put_str(b, oom, first ? "{\"userId\":\"" : ",{\"userId\":\"");
        first = 0;
        chunk_put_i64(b, oom, row->user_id);
        if (sms && row->phone) {
            chunk_put_str(b, oom, "\",\"phone\":\"");
            chunk_put_json(b, oom, taskrow_text(&c->rows, row->phone));
        }
        if (email && row->mail) {
            chunk_put_str(b, oom, "\",\"mail\":\"");
            chunk_put_json(b, oom, taskrow_text(&c->rows, row->mail));
        }
        chunk_put_str(b, oom, "\"}");
    }
    chunk_put(b, oom, "]}", 3); /* with the NUL */
}

static qn_status chunk_notify(pgpool_conn *conn, const chunk_task *t, const chunk *c)
{
    char key[96];
    cellrow_buf b = {0};
    int oom = 0;
    if (!t->notify[0] || c->nissued == 0)
        return QN_OK;
    chunk_notify_json(&b, &oom, t, c);
    snprintf(key, sizeof(key), EVENT_TASK_NOTIFY ":%" PRId64 ":%" PRId64, t->id, c->no);
    outbox_event ev = {.routing_key = EVENT_TASK_NOTIFY, .key = key, .data_json = b.p};
    qn_status st = oom ? QN_ENOMEM : outbox_add(conn, &ev);
    cellrow_buf_free(&b);
    return st;
}

/* The chunk's failure rows, one statement. */
static qn_status chunk_failures(pgpool_conn *conn, const chunk_task *t, const chunk *c,
                                int64_t nfail)
{
    pgparam_array a[3] = {{0}};
    pgparam p = {0};
    qn_status st = QN_ENOMEM;
    if (nfail == 0)
        return QN_OK;
    for (size_t i = 0; i < c->rows.n; i++) {
        const taskrow *row = &c->rows.rows[i];
        int o = c->outcome[i] >= 1 && !c->issued[i] ? CHUNK_LIMIT : c->outcome[i];
        if (o >= 1)
            continue;
        pgparam_array_i64(&a[0], row->row);
        pgparam_array_str(&a[1], row->raw ? taskrow_text(&c->rows, row->raw) : NULL);
        pgparam_array_str(&a[2], chunk_cause(o));
    }
    pgparam_i64(&p, t->batch_id);
    pgparam_i64(&p, t->id);
    for (int k = 0; k < 3; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    st = pgpool_exec_cmd(conn,
                         "INSERT INTO t_coupon_task_fail (batch_id, task_id, row_num, user_id, "
                         "cause) SELECT $1::bigint, $2::bigint, r, u, c FROM unnest($3::int[], "
                         "$4::text[], $5::text[]) AS x(r, u, c)",
                         p.n, p.v, NULL);
out:
    for (int k = 0; k < 3; k++)
        pgparam_array_free(&a[k]);
    return st;
}

/* The fence matched nothing: another run owns the task, or this run's own checkpoint of c
 * committed before and its answer was lost (processed_rows has moved past c since). The chunk's
 * checkpoint row tells: written under this run's execution id, c is done (QN_OK, *cancel as the
 * task row has it now), else QN_ECONFLICT. Inside the caller's transaction. */
static qn_status chunk_committed_before(pgpool_conn *pg0, const chunk_task *t, const chunk *c,
                                        int *cancel)
{
    pgparam p = {0};
    pgparam_i64(&p, t->id);
    pgparam_i64(&p, c->no);
    pgparam_str(&p, t->exec_id);
    PGresult *r = pgpool_exec(pg0,
                              "SELECT t.cancel_requested FROM t_coupon_task_chunk k JOIN "
                              "t_coupon_task t ON t.id = k.task_id WHERE k.task_id = $1::bigint "
                              "AND k.chunk_no = $2::integer AND k.execution_id = $3",
                              p.n, p.v);
    qn_status st = !r ? QN_ERR : PQntuples(r) == 1 ? QN_OK : QN_ECONFLICT;
    if (st == QN_OK)
        *cancel = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return st;
}

qn_status chunk_commit(pgpool_conn *pg0, const chunk_task *t, const chunk *c, int *cancel)
{
    int64_t rows = (int64_t)c->rows.n, ok = (int64_t)c->nissued, fail = rows - ok;
    pgparam p = {0};
    PGresult *r = NULL;
    qn_status st = QN_ERR;

    pgparam_i64(&p, t->id);
    pgparam_str(&p, t->exec_id);
    pgparam_i64(&p, c->first);
    pgparam_i64(&p, c->first + rows);
    pgparam_i64(&p, ok);
    pgparam_i64(&p, fail);
    pgparam_i64(&p, t->lease_ms);
    if (pgpool_begin(pg0) != QN_OK)
        goto out;
    /* The fence: only the run that owns the task, at this very resume point. */
    r = pgpool_exec(pg0,
                    "UPDATE t_coupon_task SET processed_rows = $4::integer, success_num = "
                    "success_num + $5::integer, fail_num = fail_num + $6::integer, lease_until = "
                    "now() + $7::bigint * interval '1 millisecond', update_time = now() WHERE id "
                    "= $1::bigint AND execution_id = $2 AND status = " TASK_STATUS_TEXT(
                        RUNNING) " AND processed_rows = "
                                 "$3::integer RETURNING cancel_requested",
                    p.n, p.v);
    if (!r)
        goto out;
    if (PQntuples(r) != 1) {
        /* A retry after a COMMIT whose answer was lost lands here too: that was no lost task,
         * and stopping would leave the task waiting for this run's own lease to run out. */
        st = chunk_committed_before(pg0, t, c, cancel);
        if (st == QN_OK) {
            log_infof(NULL, ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no), LOG_END}),
                      "distribution: a chunk's checkpoint had committed (its answer was lost)");
            (void)pgpool_rollback(pg0); /* this attempt wrote nothing */
        }
        goto out;
    }
    *cancel = PQgetvalue(r, 0, 0)[0] == 't';
    pgparam q = {0};
    pgparam_i64(&q, t->id);
    pgparam_i64(&q, c->no);
    pgparam_i64(&q, c->first);
    pgparam_i64(&q, rows);
    pgparam_i64(&q, ok);
    pgparam_i64(&q, fail);
    pgparam_str(&q, t->exec_id);
    if (pgpool_exec_cmd(pg0,
                        "INSERT INTO t_coupon_task_chunk (task_id, chunk_no, first_row, row_count, "
                        "issued, failed, execution_id) VALUES ($1::bigint, $2::integer, "
                        "$3::integer, $4::integer, $5::integer, $6::integer, $7)",
                        q.n, q.v, NULL) != QN_OK ||
        chunk_failures(pg0, t, c, fail) != QN_OK || chunk_notify(pg0, t, c) != QN_OK ||
        pgpool_commit(pg0) != QN_OK)
        goto out;
    st = QN_OK;
out:
    if (st != QN_OK) {
        if (st != QN_ECONFLICT)
            log_warnf(NULL,
                      ((log_field[]){LOG_I("task", t->id), LOG_I("chunk", c->no),
                                     LOG_S("error", pgpool_conn_error(pg0)), LOG_END}),
                      "distribution: a chunk's checkpoint failed");
        (void)pgpool_rollback(pg0);
    }
    PQclear(r);
    return st;
}

void chunk_close(redis_sync *rs, const chunk_task *t, const chunk *c)
{
    char key[KEYS_LEN];
    int n = t->buckets > 1 ? t->buckets : 1, none = c->nbuckets < 1 || c->start[c->nbuckets] == 0;
    /* Every record step 1 reached, and the first record of every bucket with rows (it may have
     * none: all rows ended). One bucket at a time, in step 1's order, so that a close cut short
     * leaves the first bucket's closed: a late run asks it first and learns the chunk is done. */
    for (int b = 0; b < n && b < BUCKET_MAX; b++) {
        int rows = b < c->nbuckets && c->start[b + 1] > c->start[b];
        int passes = c->passes[b] > 1 ? c->passes[b] : 1;
        if (!rows && !(b == 0 && none))
            continue;
        for (int p = 0; p < passes; p++) {
            chunk_keys(t, c->no, b, p, key, NULL);
            /* The expiry again: a chunk that never reserved (all rows ended) has no record
             * until now. */
            redis_sync_append(rs, "HSET %s c 1", key);
            redis_sync_append(rs, "HDEL %s o", key);
            redis_sync_append(rs, "PEXPIRE %s %lld", key, CHUNK_STATE_TTL_MS);
        }
        if (chunk_replies(rs, 3 * (size_t)passes) != QN_OK) {
            log_warn(NULL,
                     "task %" PRId64 " chunk %" PRId64 ": its records stay open (they expire)",
                     t->id, c->no);
            return;
        }
    }
}
