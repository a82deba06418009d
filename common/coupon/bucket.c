/* Stock buckets (bucket.h). */
#include "bucket.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claimgate.h"
#include "hash.h"
#include "log.h"
#include "now.h"
#include "rslot.h"

#define BUCKET_SEEK_ROUNDS      3    /* looks before "in doubt": stock moving under the look */
#define BUCKET_TRANSFER_LIFE_MS 5000 /* a transfer older than this was left by a crash */

int bucket_home(int64_t user, int n)
{
    if (n <= 1)
        return 0;
    return (int)(hash_mix64((uint64_t)user) % (uint64_t)n);
}

int64_t bucket_share(int64_t stock, int b, int n)
{
    if (n <= 1)
        return stock;
    if (stock < 0) /* more taken than there was (a repair's figure): bucket 0 holds the debt */
        return b == 0 ? stock : 0;
    return stock / n + (b < stock % n ? 1 : 0);
}

/* ---- cache hashes ---- */

int bucket_cache_args(const tpl *t, int64_t stock, int b, const char **argv, tpl_cache_bufs *bufs,
                      char exp[24])
{
    tpl share = *t; /* shallow: only the stock differs */
    int n = t->buckets >= 1 ? t->buckets : 1;
    share.stock = bucket_share(stock, b, n);
    snprintf(exp, 24, "%" PRId64, t->valid_end_ms);
    argv[0] = exp;
    return 1 + tpl_cache_fields(&share, argv + 1, bufs);
}

/* One bucket's template_cache_put.lua call: its key and arguments (pointing into the struct and
 * into t, which must outlive the call's sending). */
typedef struct bucket_put_call {
    bucket_keys k;
    const char *keys[1];
    const char *argv[1 + 2 * TPL_CACHE_FIELDS];
    int argc;
    tpl_cache_bufs bufs;
    char exp[24];
} bucket_put_call;

static void bucket_put_call_of(bucket_put_call *pc, const tpl *t, int64_t stock, int b)
{
    int n = t->buckets >= 1 ? t->buckets : 1;
    bucket_keys_of(&pc->k, t->id, b, n);
    pc->keys[0] = pc->k.hash;
    pc->argc = bucket_cache_args(t, stock, b, pc->argv, &pc->bufs, pc->exp);
}

qn_status bucket_cache_put_sync(redis_sync *rs, const redis_scripts *s, const tpl *t, int64_t stock,
                                int *written)
{
    int n = t->buckets >= 1 ? t->buckets : 1;
    if (written)
        *written = 0;
    if (t->relayout_from > 0) /* the keys are the engine's to rebuild (bucket.h) */
        return QN_OK;
    for (int b = n - 1; b >= 0; b--) {
        bucket_put_call pc;
        bucket_put_call_of(&pc, t, stock, b);
        redisReply *r =
            REDIS_SYNC_SCRIPT_N(rs, s, template_cache_put, 1, pc.keys, pc.argc, pc.argv);
        int ok = r && r->type == REDIS_REPLY_INTEGER;
        if (ok && written)
            *written += r->integer == 1;
        freeReplyObject(r);
        if (!ok)
            return QN_ERR;
    }
    return QN_OK;
}

/* A blocking command's reply: QN_OK when there is one and it is no error; freed. */
static qn_status bucket_reply_ok(redisReply *r)
{
    qn_status st = r && r->type != REDIS_REPLY_ERROR ? QN_OK : QN_ERR;
    freeReplyObject(r);
    return st;
}

qn_status bucket_rewrite_sync(redis_sync *rs, const tpl *t, int64_t stock, int b)
{
    int n = t->buckets >= 1 ? t->buckets : 1;
    const char *argv[2 + 2 * TPL_CACHE_FIELDS];
    tpl_cache_bufs bufs;
    char exp[24];
    bucket_keys k;
    bucket_keys_of(&k, t->id, b, n);
    /* argv[1..]: the expiry, then the fields; argv[0] becomes HSET, [1] the key */
    int argc = bucket_cache_args(t, stock, b, argv + 1, &bufs, exp);
    argv[0] = "HSET";
    argv[1] = k.hash;
    if (bucket_reply_ok(redis_sync_command_argv(rs, argc + 1, argv, NULL)) != QN_OK ||
        bucket_reply_ok(redis_sync_command(rs, "HINCRBY %s gen 1", k.hash)) != QN_OK ||
        bucket_reply_ok(redis_sync_command(rs, "HDEL %s rebuilding", k.hash)) != QN_OK ||
        bucket_reply_ok(redis_sync_command(rs, "PEXPIREAT %s %s", k.hash, exp)) != QN_OK)
        return QN_ERR;
    return QN_OK;
}

/* One asynchronous write of every bucket: the calls still unanswered. */
typedef struct bucket_put {
    int left;
    qn_status st;
    bucket_put_cb done;
    void *arg;
} bucket_put;

static void bucket_on_put(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    bucket_put *p = arg;
    if (err || !r || r->type != REDIS_REPLY_INTEGER)
        p->st = QN_ERR;
    if (--p->left > 0)
        return;
    bucket_put_cb done = p->done;
    void *done_arg = p->arg;
    qn_status st = p->st;
    free(p);
    done(st, done_arg);
}

qn_status bucket_cache_put(redis_client *c, const tpl *t, int64_t stock, bucket_put_cb done,
                           void *arg)
{
    int n = t->buckets >= 1 ? t->buckets : 1;
    if (t->relayout_from > 0) /* the keys are the engine's to rebuild (bucket.h) */
        return QN_EAGAIN;
    bucket_put *p = malloc(sizeof(*p));
    if (!p)
        return QN_ENOMEM;
    /* one more than the calls until all are sent, so no answer ends it early */
    *p = (bucket_put){.left = 1, .st = QN_OK, .done = done, .arg = arg};
    for (int b = n - 1; b >= 0; b--) {
        bucket_put_call pc;
        bucket_put_call_of(&pc, t, stock, b);
        p->left++;
        qn_status st =
            REDIS_EVAL_N(c, template_cache_put, 1, pc.keys, pc.argc, pc.argv, bucket_on_put, p);
        if (st != QN_OK) {
            p->left--;
            if (b == n - 1) { /* nothing sent */
                free(p);
                return st;
            }
            p->st = QN_ERR;
            break; /* those sent answer; the rest waits for the next writer */
        }
    }
    /* the answers come on a later loop turn: drop the extra one */
    if (--p->left == 0) {
        qn_status st = p->st;
        free(p);
        done(st, arg);
    }
    return QN_OK;
}

/* Which n-th of the slot space a tag's slot lies in. */
static int bucket_slice(const char *tag, int n)
{
    return (int)((int64_t)rslot_of_key(tag, strlen(tag)) * n / RSLOT_COUNT);
}

void bucket_tag(char *buf, int64_t tpl_id, int b, int n)
{
    size_t len = keys_cat_i64(buf, 0, tpl_id);
    if (b <= 0 || n <= 1)
        return;
    int want = (bucket_slice(buf, n) + b) % n;
    len = keys_cat_i64(buf, keys_cat(buf, len, "."), b);
    len = keys_cat(buf, len, ".");
    /* A tag falls in a given n-th once in n tries on average; 1 << 20 tries miss with a
     * chance of (1 - 1/64)^(1<<20) at n = 64: never. */
    for (int64_t k = 0; k < (1 << 20); k++) {
        keys_cat_i64(buf, len, k);
        if (bucket_slice(buf, n) == want)
            return;
    }
}

void bucket_keys_of(bucket_keys *k, int64_t tpl_id, int b, int n)
{
    char tag[KEYS_LEN];
    if (b <= 0 || n <= 1) {
        keys_template(k->hash, tpl_id);
        keys_template_users(k->users, tpl_id);
        keys_template_resv(k->resv, tpl_id);
        return;
    }
    bucket_tag(tag, tpl_id, b, n);
    size_t len = keys_cat(k->hash, keys_cat(k->hash, keys_cat(k->hash, 0, "quan:bkt:{"), tag), "}");
    memcpy(k->users, k->hash, len + 1);
    keys_cat(k->users, len, ":users");
    memcpy(k->resv, k->hash, len + 1);
    keys_cat(k->resv, len, ":resv");
}

static int bucket_int(const redisReply *e, int64_t *out)
{
    if (!e || e->type != REDIS_REPLY_INTEGER)
        return 0;
    *out = e->integer;
    return 1;
}

qn_status bucket_look_parse(const redisReply *r, bucket_look *out)
{
    memset(out, 0, sizeof(*out));
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        return QN_EINVAL;
    if (r->elements == 1 && r->element[0]->type == REDIS_REPLY_INTEGER &&
        r->element[0]->integer == -1) {
        out->missing = 1;
        return QN_OK;
    }
    if (r->elements < 5 || (r->elements - 5) % 2 != 0 || !bucket_int(r->element[0], &out->given) ||
        !bucket_int(r->element[1], &out->stock) || !bucket_int(r->element[2], &out->gen) ||
        !bucket_int(r->element[3], &out->open) || !bucket_int(r->element[4], &out->xo))
        return QN_EINVAL;
    /* the records "k:to:t": the oldest t */
    for (size_t i = 6; i < r->elements; i += 2) {
        const redisReply *v = r->element[i];
        const char *t = v->type == REDIS_REPLY_STRING ? strrchr(v->str, ':') : NULL;
        int64_t ms = t ? strtoll(t + 1, NULL, 10) : 0;
        if (ms > 0 && (out->xo_oldest_ms == 0 || ms < out->xo_oldest_ms))
            out->xo_oldest_ms = ms;
    }
    return QN_OK;
}

static int bucket_empty(const bucket_look *l)
{
    return !l->missing && l->stock <= 0 && l->open == 0 && l->xo == 0;
}

bucket_verdict_t bucket_verdict(const bucket_look *first, const bucket_look *second, int n)
{
    int doubt = 0;
    for (int b = 0; b < n; b++) {
        if (second[b].stock > 0)
            return BUCKET_HAS_STOCK;
        if (!bucket_empty(&first[b]) || !bucket_empty(&second[b]) || first[b].gen != second[b].gen)
            doubt = 1;
    }
    return doubt ? BUCKET_IN_DOUBT : BUCKET_SOLD_OUT;
}

/* ---- the steps, on the blocking client ---- */

int bucket_claim_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int64_t user,
                      const char *shop, const char *member)
{
    bucket_keys k;
    char now[24], u[24], nb[16];
    bucket_keys_of(&k, tpl_id, bucket_home(user, n), n);
    log_i64_str(now, now_wall_ms());
    log_i64_str(u, user);
    snprintf(nb, sizeof(nb), "%d", n > 1 ? n : 1);
    const char *keys[3] = {k.hash, k.users, k.resv};
    const char *args[6] = {"", nb, now, shop, u, member};
    redisReply *r = REDIS_SYNC_SCRIPT(rs, s, claim, keys, args);
    claimgate_reply g;
    int code = claimgate_parse(r, &g) == QN_OK ? (int)g.code : -1;
    if (r)
        freeReplyObject(r);
    return code;
}

qn_status bucket_give_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int b,
                           int home, int64_t want, const char *xid, bucket_look *out)
{
    bucket_keys k;
    char w[24], h[24], t[24];
    bucket_keys_of(&k, tpl_id, b, n);
    snprintf(w, sizeof(w), "%" PRId64, want);
    snprintf(h, sizeof(h), "%d", home);
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms());
    const char *keys[2] = {k.hash, k.resv};
    const char *args[4] = {want > 0 ? xid : "", w, h, t};
    redisReply *r = REDIS_SYNC_SCRIPT(rs, s, bucket_give, keys, args);
    qn_status st = r && r->type != REDIS_REPLY_ERROR ? bucket_look_parse(r, out) : QN_ERR;
    if (r)
        freeReplyObject(r);
    return st;
}

/* take, then settle: the rest of transfer xid of k units from bucket from to bucket to. */
static qn_status bucket_complete_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n,
                                      int from, int to, int64_t k, const char *xid, int64_t *moved)
{
    bucket_keys home, donor;
    char units[24], t[24];
    qn_status st = QN_ERR;
    redisReply *r;
    bucket_keys_of(&home, tpl_id, to, n);
    bucket_keys_of(&donor, tpl_id, from, n);
    snprintf(units, sizeof(units), "%" PRId64, k);
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms());
    const char *take_keys[1] = {home.hash};
    const char *take_args[3] = {xid, units, t};
    r = REDIS_SYNC_SCRIPT(rs, s, bucket_take, take_keys, take_args);
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer < 0)
        goto out; /* the home's hash is gone: the record stays for the rebuild to count */
    if (moved)
        *moved = r->integer;
    freeReplyObject(r);
    const char *settle_keys[1] = {donor.hash};
    const char *settle_args[1] = {xid};
    r = REDIS_SYNC_SCRIPT(rs, s, bucket_settle, settle_keys, settle_args);
    if (r && r->type == REDIS_REPLY_INTEGER)
        st = QN_OK;
out:
    if (r)
        freeReplyObject(r);
    return st;
}

qn_status bucket_transfer_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n,
                               int from, int to, int64_t want, const char *xid, int64_t *moved)
{
    bucket_look l;
    *moved = 0;
    if (bucket_give_sync(rs, s, tpl_id, n, from, to, want, xid, &l) != QN_OK || l.missing)
        return QN_ERR;
    if (l.given == 0)
        return QN_OK;
    int64_t took = 0;
    if (bucket_complete_sync(rs, s, tpl_id, n, from, to, l.given, xid, &took) != QN_OK)
        return QN_ERR;
    *moved = l.given; /* took is 0 when an earlier attempt of xid took them: they are there */
    return QN_OK;
}

qn_status bucket_finish_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n,
                             int from, int64_t min_age_ms, int *finished)
{
    bucket_keys k;
    qn_status st = QN_OK;
    bucket_keys_of(&k, tpl_id, from, n);
    *finished = 0;
    redisReply *r = redis_sync_command(rs, "HGETALL %s", k.hash);
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        st = QN_ERR;
        goto out;
    }
    int64_t now = now_wall_ms();
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        const char *f = r->element[i]->str, *v = r->element[i + 1]->str;
        int64_t units, to, at;
        if (strncmp(f, "xo:", 3) != 0 ||
            sscanf(v, "%" SCNd64 ":%" SCNd64 ":%" SCNd64, &units, &to, &at) != 3)
            continue;
        if (now - at < min_age_ms || to < 0 || to >= n || units < 1)
            continue;
        if (bucket_complete_sync(rs, s, tpl_id, n, from, (int)to, units, f + 3, NULL) != QN_OK) {
            st = QN_ERR;
            goto out;
        }
        ++*finished;
    }
out:
    if (r)
        freeReplyObject(r);
    return st;
}

qn_status bucket_seek_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int home,
                           const char *xid_prefix, bucket_verdict_t *v)
{
    bucket_look first[BUCKET_MAX], second[BUCKET_MAX];
    char xid[KEYS_LEN];
    if (n < 1 || n > BUCKET_MAX || home < 0 || home >= n)
        return QN_EINVAL;
    *v = BUCKET_IN_DOUBT;
    for (int round = 0; round < BUCKET_SEEK_ROUNDS; round++) {
        if (bucket_give_sync(rs, s, tpl_id, n, home, home, 0, "", &first[home]) != QN_OK)
            return QN_ERR;
        if (first[home].stock > 0) { /* another claim's transfer came first */
            *v = BUCKET_HAS_STOCK;
            return QN_OK;
        }
        for (int i = 1; i < n; i++) {
            int d = (home + i) % n;
            snprintf(xid, sizeof(xid), "%s.%d.%d", xid_prefix, round, d);
            if (bucket_give_sync(rs, s, tpl_id, n, d, home, INT64_MAX / 2, xid, &first[d]) != QN_OK)
                return QN_ERR;
            if (first[d].given > 0) {
                int64_t took;
                if (bucket_complete_sync(rs, s, tpl_id, n, d, home, first[d].given, xid, &took) !=
                    QN_OK)
                    return QN_ERR;
                *v = BUCKET_HAS_STOCK;
                return QN_OK;
            }
        }
        int stale = 0;
        for (int b = 0; b < n; b++) {
            if (bucket_give_sync(rs, s, tpl_id, n, b, home, 0, "", &second[b]) != QN_OK)
                return QN_ERR;
            if (second[b].xo > 0 && second[b].xo_oldest_ms > 0 &&
                now_wall_ms() - second[b].xo_oldest_ms > BUCKET_TRANSFER_LIFE_MS) {
                int done;
                if (bucket_finish_sync(rs, s, tpl_id, n, b, BUCKET_TRANSFER_LIFE_MS, &done) !=
                    QN_OK)
                    return QN_ERR;
                stale += done;
            }
        }
        *v = stale ? BUCKET_IN_DOUBT : bucket_verdict(first, second, n);
        if (*v != BUCKET_HAS_STOCK)
            return QN_OK;
    }
    *v = BUCKET_IN_DOUBT;
    return QN_OK;
}
