#include "nodup.h"

#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keys.h"
#include "log.h"

typedef struct nodup_ent {
    nodup *nd;
    http_handler fn;
    void *arg;
    struct nodup_ent *next;
} nodup_ent;

struct nodup {
    redis_client *redis;
    int64_t window_ms, inflight_ms;
    uint64_t seq;
    nodup_ent *ents;
};

/* One guarded request, from the SET until the release command is sent. */
typedef struct nodup_req {
    nodup_ent *ent;
    http_req *req;
    char key[KEYS_NODUP_LEN];
    char token[64];
} nodup_req;

nodup *nodup_new(redis_client *redis, int64_t window_ms, int64_t inflight_ms)
{
    if (!redis || window_ms < 0 || inflight_ms <= 0)
        return NULL;
    nodup *nd = calloc(1, sizeof(*nd));
    if (!nd)
        return NULL;
    nd->redis = redis;
    nd->window_ms = window_ms;
    nd->inflight_ms = inflight_ms;
    return nd;
}

void nodup_free(nodup *nd)
{
    if (!nd)
        return;
    while (nd->ents) {
        nodup_ent *e = nd->ents;
        nd->ents = e->next;
        free(e);
    }
    free(nd);
}

qn_status nodup_digest(int64_t shop_number, const char *query, const char *body, size_t body_len,
                       char out[65])
{
    qn_status st = QN_ERR;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char head[32];
    int hl = snprintf(head, sizeof(head), "%" PRId64 "\n", shop_number);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return QN_ENOMEM;
    /* The separators keep "a" + "b\n" and "a\nb" + "" apart. */
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
        EVP_DigestUpdate(ctx, head, (size_t)hl) != 1 ||
        EVP_DigestUpdate(ctx, query ? query : "", query ? strlen(query) : 0) != 1 ||
        EVP_DigestUpdate(ctx, "\n", 1) != 1 || EVP_DigestUpdate(ctx, body, body_len) != 1 ||
        EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != 32)
        goto done;
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    st = QN_OK;
done:
    EVP_MD_CTX_free(ctx);
    return st;
}

static void nodup_on_released(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c, (void)reply, (void)arg;
    if (err)
        log_warn(NULL, "duplicate-submit guard: release failed: %s", err);
}

/* The handler replied: keep the key for the window, or drop it after a failure. */
static void nodup_on_reply(http_req *req, int status, void *arg)
{
    (void)req;
    nodup_req *nr = arg;
    nodup *nd = nr->ent->nd;
    char ms[24];
    snprintf(ms, sizeof(ms), "%" PRId64, status >= 400 ? (int64_t)0 : nd->window_ms);
    const char *keys[] = {nr->key};
    const char *args[] = {nr->token, ms};
    if (REDIS_EVAL_N(nd->redis, nodup_release, 1, keys, 2, args, nodup_on_released, NULL) != QN_OK)
        log_warn(NULL, "duplicate-submit guard: cannot send the release of %s", nr->key);
    free(nr);
}

static void nodup_on_set(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    nodup_req *nr = arg;
    http_req *req = nr->req;
    if (err || !reply) {
        log_warn(&req->log, "duplicate-submit guard unavailable: %s", err ? err : "no reply");
        http_reply_error(req, ERRCODE_UNAVAILABLE, "dependency unavailable (redis)");
        free(nr);
        return;
    }
    if (reply->type == REDIS_REPLY_NIL) {
        http_reply_error(req, ERRCODE_AGAIN,
                         "duplicate submit: the same request is in progress or was just made; "
                         "wait %" PRId64 " ms",
                         nr->ent->nd->window_ms);
        free(nr);
        return;
    }
    nodup_ent *ent = nr->ent;
    http_req_on_reply(req, nodup_on_reply, nr); /* nr is freed there */
    ent->fn(req, ent->arg);
}

static void nodup_handler(http_req *req, void *arg)
{
    nodup_ent *ent = arg;
    nodup *nd = ent->nd;
    char digest[65];
    size_t blen;
    const char *body = http_body_raw(req, &blen);
    nodup_req *nr = calloc(1, sizeof(*nr));
    if (!nr) {
        http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    if (nodup_digest(req->shop_number, http_query_raw(req), body, blen, digest) != QN_OK) {
        http_reply_error(req, ERRCODE_INTERNAL, "cannot digest the request");
        free(nr);
        return;
    }
    nr->ent = ent;
    nr->req = req;
    keys_nodup(nr->key, req->path, req->user_id, digest);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(nr->token, sizeof(nr->token), "%ld:%" PRIu64 ":%ld.%09ld", (long)getpid(), ++nd->seq,
             (long)ts.tv_sec, ts.tv_nsec);
    char px[24];
    snprintf(px, sizeof(px), "%" PRId64, nd->inflight_ms);
    const char *argv[] = {"SET", nr->key, nr->token, "NX", "PX", px};
    if (redis_command_argv(nd->redis, nodup_on_set, nr, 6, argv, NULL) != QN_OK) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "dependency unavailable (redis)");
        free(nr);
    }
}

qn_status nodup_route(nodup *nd, http_server *srv, int method, const char *path, http_handler fn,
                      void *arg, unsigned flags)
{
    nodup_ent *e = calloc(1, sizeof(*e));
    if (!e)
        return QN_ENOMEM;
    e->nd = nd;
    e->fn = fn;
    e->arg = arg;
    qn_status st = http_route(srv, method, path, nodup_handler, e, flags);
    if (st != QN_OK) {
        free(e);
        return st;
    }
    e->next = nd->ents;
    nd->ents = e;
    return QN_OK;
}
