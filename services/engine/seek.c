/* The seek of a claim whose home bucket is dry, on the loop (seek.h). One call in flight at a
 * time: each answer's callback sends the next. */
#include "seek.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "now.h"

#define SEEK_ROUNDS      3    /* rounds before "in doubt": stock moving under the looks */
#define SEEK_LIFE_MS     5000 /* a transfer older than this was left by a crash (bucket.c's) */
#define SEEK_PREFIX_MAX  118  /* with ".<round>.<donor>" within KEYS_LEN */
#define SEEK_RECORDS_MAX 64   /* stale transfers finished per bucket and look: the rest next time */

/* A transfer on its way out of a bucket, read from its record "xo:<xid>" = "k:to:t". */
#define SEEK_XID_MAX (SEEK_PREFIX_MAX + 32)

typedef struct seek_record {
    char xid[SEEK_XID_MAX];
    int64_t units;
    int to;
} seek_record;

typedef struct seek {
    redis_client *c;
    int64_t tpl;
    int n, home;
    int round;
    int at;    /* the bucket of the call in flight */
    int stale; /* stale transfers finished this round */
    int64_t given;
    seek_record *recs; /* the stale ones of bucket at, being finished */
    size_t nrec, rec;
    char prefix[SEEK_PREFIX_MAX + 1];
    char xid[SEEK_XID_MAX];
    bucket_look first[BUCKET_MAX], second[BUCKET_MAX];
    seek_cb done;
    void *arg;
} seek;

static void seek_round(seek *s);
static void seek_donor(seek *s, int i);
static void seek_look2(seek *s, int b);
static void seek_finish_next(seek *s);

static void seek_end(seek *s, qn_status st, bucket_verdict_t v)
{
    seek_cb done = s->done;
    void *arg = s->arg;
    free(s->recs);
    free(s);
    done(st, v, arg);
}

static int seek_reply_ok(const redisReply *r, const char *err)
{
    return !err && r && r->type != REDIS_REPLY_ERROR;
}

/* bucket_give.lua on bucket b: want units towards home as transfer xid, or a look (want 0). */
static qn_status seek_give(seek *s, int b, int64_t want, const char *xid, redis_cb cb)
{
    bucket_keys k;
    char w[24], h[16], t[24];
    bucket_keys_of(&k, s->tpl, b, s->n);
    snprintf(w, sizeof(w), "%" PRId64, want);
    snprintf(h, sizeof(h), "%d", s->home);
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms());
    const char *keys[2] = {k.hash, k.resv};
    const char *args[4] = {want > 0 ? xid : "", w, h, t};
    s->at = b;
    return REDIS_EVAL(s->c, bucket_give, keys, args, cb, s);
}

/* bucket_take.lua at bucket to: transfer xid's units. */
static qn_status seek_take(seek *s, int to, const char *xid, int64_t units, redis_cb cb)
{
    bucket_keys k;
    char u[24], t[24];
    bucket_keys_of(&k, s->tpl, to, s->n);
    snprintf(u, sizeof(u), "%" PRId64, units);
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms());
    const char *keys[1] = {k.hash};
    const char *args[3] = {xid, u, t};
    return REDIS_EVAL(s->c, bucket_take, keys, args, cb, s);
}

/* bucket_settle.lua at the donor bucket from: transfer xid arrived. */
static qn_status seek_settle(seek *s, int from, const char *xid, redis_cb cb)
{
    bucket_keys k;
    bucket_keys_of(&k, s->tpl, from, s->n);
    const char *keys[1] = {k.hash};
    const char *args[1] = {xid};
    return REDIS_EVAL(s->c, bucket_settle, keys, args, cb, s);
}

/* A take's answer: the units added (0: added before), or < 0: the home's hash is gone (the
 * record stays for the rebuild to count). */
static int seek_took(const redisReply *r, const char *err)
{
    return seek_reply_ok(r, err) && r->type == REDIS_REPLY_INTEGER && r->integer >= 0;
}

/* ---- the first pass: the home, then each donor in turn ---- */

static void seek_on_settled(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    (void)c;
    /* the units are home either way: an unsettled record is settled by a later finisher,
     * whose take adds nothing (xi:) */
    if (!seek_reply_ok(r, err))
        log_warn(NULL, "seek: a transfer's settle failed (finished later): %s", err ? err : r->str);
    seek_end(s, QN_OK, BUCKET_HAS_STOCK);
}

static void seek_on_taken(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    (void)c;
    if (!seek_took(r, err)) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    if (seek_settle(s, s->at, s->xid, seek_on_settled) != QN_OK)
        seek_end(s, QN_OK, BUCKET_HAS_STOCK); /* home has them; the record waits for a finisher */
}

static void seek_on_given(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    bucket_look *l = &s->first[s->at];
    (void)c;
    if (!seek_reply_ok(r, err) || bucket_look_parse(r, l) != QN_OK) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    if (l->given > 0) {
        if (seek_take(s, s->home, s->xid, l->given, seek_on_taken) != QN_OK)
            seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    seek_donor(s, (s->at - s->home + s->n) % s->n + 1);
}

/* The i-th bucket after home (1 .. n - 1) asked to give; past them, the second pass. */
static void seek_donor(seek *s, int i)
{
    if (i >= s->n) {
        s->stale = 0;
        seek_look2(s, 0);
        return;
    }
    int d = (s->home + i) % s->n;
    snprintf(s->xid, sizeof(s->xid), "%s.%d.%d", s->prefix, s->round, d);
    if (seek_give(s, d, INT64_MAX / 2, s->xid, seek_on_given) != QN_OK)
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
}

static void seek_on_home(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    bucket_look *l = &s->first[s->home];
    (void)c;
    if (!seek_reply_ok(r, err) || bucket_look_parse(r, l) != QN_OK) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    if (l->stock > 0) { /* another claim's transfer came first */
        seek_end(s, QN_OK, BUCKET_HAS_STOCK);
        return;
    }
    seek_donor(s, 1);
}

static void seek_round(seek *s)
{
    if (seek_give(s, s->home, 0, "", seek_on_home) != QN_OK)
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
}

/* ---- the second pass: a look at every bucket, stale transfers finished ---- */

static void seek_verdict(seek *s)
{
    bucket_verdict_t v = s->stale ? BUCKET_IN_DOUBT : bucket_verdict(s->first, s->second, s->n);
    if (v != BUCKET_HAS_STOCK) {
        seek_end(s, QN_OK, v);
        return;
    }
    if (++s->round >= SEEK_ROUNDS) {
        seek_end(s, QN_OK, BUCKET_IN_DOUBT);
        return;
    }
    seek_round(s);
}

static void seek_on_fin_settled(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    (void)c;
    if (!seek_reply_ok(r, err)) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    s->stale++;
    s->rec++;
    seek_finish_next(s);
}

static void seek_on_fin_taken(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    (void)c;
    if (!seek_took(r, err) ||
        seek_settle(s, s->at, s->recs[s->rec].xid, seek_on_fin_settled) != QN_OK)
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
}

/* The next stale record of bucket at: take at its home, settle; past them, the next look. */
static void seek_finish_next(seek *s)
{
    if (s->rec >= s->nrec) {
        free(s->recs);
        s->recs = NULL;
        s->nrec = s->rec = 0;
        seek_look2(s, s->at + 1);
        return;
    }
    const seek_record *x = &s->recs[s->rec];
    if (seek_take(s, x->to, x->xid, x->units, seek_on_fin_taken) != QN_OK)
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
}

/* Bucket at's hash: its records older than a transfer lives (bucket_finish_sync's choice). */
static void seek_on_scanned(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    (void)c;
    if (!seek_reply_ok(r, err) || r->type != REDIS_REPLY_ARRAY) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    s->recs = calloc(SEEK_RECORDS_MAX, sizeof(*s->recs));
    if (!s->recs) {
        seek_end(s, QN_ENOMEM, BUCKET_IN_DOUBT);
        return;
    }
    int64_t now = now_wall_ms();
    for (size_t i = 0; i + 1 < r->elements && s->nrec < SEEK_RECORDS_MAX; i += 2) {
        const redisReply *f = r->element[i], *v = r->element[i + 1];
        int64_t units, to, at;
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            strncmp(f->str, "xo:", 3) != 0 || strlen(f->str + 3) >= SEEK_XID_MAX ||
            sscanf(v->str, "%" SCNd64 ":%" SCNd64 ":%" SCNd64, &units, &to, &at) != 3)
            continue;
        if (now - at < SEEK_LIFE_MS || to < 0 || to >= s->n || units < 1)
            continue;
        seek_record *x = &s->recs[s->nrec++];
        snprintf(x->xid, sizeof(x->xid), "%s", f->str + 3);
        x->units = units;
        x->to = (int)to;
    }
    s->rec = 0;
    seek_finish_next(s);
}

static void seek_on_look2(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seek *s = arg;
    bucket_look *l = &s->second[s->at];
    (void)c;
    if (!seek_reply_ok(r, err) || bucket_look_parse(r, l) != QN_OK) {
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    if (l->xo > 0 && l->xo_oldest_ms > 0 && now_wall_ms() - l->xo_oldest_ms > SEEK_LIFE_MS) {
        bucket_keys k; /* a transfer left by a crash: finished here */
        bucket_keys_of(&k, s->tpl, s->at, s->n);
        if (redis_command(s->c, seek_on_scanned, s, "HGETALL %s", k.hash) != QN_OK)
            seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
        return;
    }
    seek_look2(s, s->at + 1);
}

static void seek_look2(seek *s, int b)
{
    if (b >= s->n) {
        seek_verdict(s);
        return;
    }
    if (seek_give(s, b, 0, "", seek_on_look2) != QN_OK)
        seek_end(s, QN_ERR, BUCKET_IN_DOUBT);
}

qn_status seek_start(redis_client *c, int64_t tpl_id, int n, int home, const char *prefix,
                     seek_cb done, void *arg)
{
    if (n < 2 || n > BUCKET_MAX || home < 0 || home >= n)
        return QN_EINVAL;
    seek *s = calloc(1, sizeof(*s));
    if (!s)
        return QN_ENOMEM;
    s->c = c;
    s->tpl = tpl_id;
    s->n = n;
    s->home = home;
    s->done = done;
    s->arg = arg;
    snprintf(s->prefix, sizeof(s->prefix), "%s", prefix);
    qn_status st = seek_give(s, home, 0, "", seek_on_home);
    if (st != QN_OK)
        free(s);
    return st;
}
