#include "bloom.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "log.h"

qn_status bloom_params_for(int64_t n, int64_t fp_per_million, bloom_params *out)
{
    if (n < 1 || fp_per_million <= 0 || fp_per_million >= 1000000)
        return QN_EINVAL;
    double p = (double)fp_per_million / 1e6;
    double m = ceil(-(double)n * log(p) / (M_LN2 * M_LN2));
    if (m < 64)
        m = 64;
    if (m > (double)BLOOM_MAX_BITS)
        m = (double)BLOOM_MAX_BITS;
    int k = (int)lround(m / (double)n * M_LN2);
    out->m = (uint64_t)m;
    out->k = k < 1 ? 1 : k > BLOOM_MAX_K ? BLOOM_MAX_K : k;
    return QN_OK;
}

void bloom_header(const bloom_params *p, char out[BLOOM_HEADER_LEN + 1])
{
    /* Fixed width: 8 + 2 + 14 + 3 + 2 + 3 = 32. */
    snprintf(out, BLOOM_HEADER_LEN + 1, "QBLOOM1 m=%014" PRIx64 " k=%02d   ", p->m, p->k);
}

void bloom_positions(const bloom_params *p, int64_t id, uint64_t out[BLOOM_MAX_K])
{
    uint64_t h1 = hash_mix64((uint64_t)id); /* snowflake ids differ in few low bits */
    uint64_t h2 = hash_mix64(h1) | 1;       /* odd: the k probes never collapse onto one bit */
    for (int i = 0; i < p->k; i++)
        out[i] = BLOOM_HEADER_BITS + (h1 + (uint64_t)i * h2) % p->m;
}

/* ARGV of both scripts: header, then the k offsets. */
typedef struct bloom_argv {
    char header[BLOOM_HEADER_LEN + 1];
    char pos[BLOOM_MAX_K][24];
    const char *argv[BLOOM_MAX_K + 1];
} bloom_argv;

static int bloom_argv_fill(bloom_argv *a, const bloom_params *p, int64_t id)
{
    uint64_t pos[BLOOM_MAX_K];
    bloom_header(p, a->header);
    bloom_positions(p, id, pos);
    a->argv[0] = a->header;
    for (int i = 0; i < p->k; i++) {
        snprintf(a->pos[i], sizeof(a->pos[i]), "%" PRIu64, pos[i]);
        a->argv[i + 1] = a->pos[i];
    }
    return p->k + 1;
}

typedef struct bloom_call {
    bloom_add_cb add_cb;
    bloom_check_cb check_cb;
    void *arg;
} bloom_call;

static void bloom_on_reply(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    bloom_call *call = arg;
    long long v = 0;
    int ok = !err && reply && reply->type == REDIS_REPLY_INTEGER;
    if (ok)
        v = reply->integer;
    else
        log_warn(NULL, "bloom filter script failed: %s", err ? err : "unexpected reply");
    if (call->add_cb)
        call->add_cb(!ok ? QN_ERR : v == 1 ? QN_OK : QN_ECONFLICT, call->arg);
    if (call->check_cb)
        call->check_cb(!ok      ? BLOOM_UNKNOWN
                       : v == 1 ? BLOOM_PRESENT
                       : v == 0 ? BLOOM_ABSENT
                                : BLOOM_UNKNOWN,
                       call->arg);
    free(call);
}

/* script: SCRIPT(bloom_add) or SCRIPT(bloom_check) (scripts.h). */
static qn_status bloom_call_script(redis_client *c, const char *script, const char *key,
                                   const bloom_params *p, int64_t id, bloom_call *call)
{
    bloom_argv a;
    int n = bloom_argv_fill(&a, p, id);
    qn_status st = redis_eval(c, script, 1, &key, n, a.argv, bloom_on_reply, call);
    if (st != QN_OK)
        free(call);
    return st;
}

qn_status bloom_add(redis_client *c, const char *key, const bloom_params *p, int64_t id,
                    bloom_add_cb cb, void *arg)
{
    bloom_call *call = calloc(1, sizeof(*call));
    if (!call)
        return QN_ENOMEM;
    /* A NULL cb still needs the reply freed: the call struct carries nothing then. */
    call->add_cb = cb;
    call->arg = arg;
    return bloom_call_script(c, SCRIPT(bloom_add), key, p, id, call);
}

qn_status bloom_check(redis_client *c, const char *key, const bloom_params *p, int64_t id,
                      bloom_check_cb cb, void *arg)
{
    if (!cb)
        return QN_EINVAL;
    bloom_call *call = calloc(1, sizeof(*call));
    if (!call)
        return QN_ENOMEM;
    call->check_cb = cb;
    call->arg = arg;
    return bloom_call_script(c, SCRIPT(bloom_check), key, p, id, call);
}

static long long bloom_sync(redis_sync *rs, const redis_scripts *s, const char *script,
                            const char *key, const bloom_params *p, int64_t id, int *ok)
{
    bloom_argv a;
    int n = bloom_argv_fill(&a, p, id);
    redisReply *r = redis_sync_run_script(rs, s, script, 1, &key, n, a.argv);
    long long v = 0;
    *ok = r && r->type == REDIS_REPLY_INTEGER;
    if (*ok)
        v = r->integer;
    else
        log_warn(NULL, "bloom filter script %s failed: %s", script,
                 r && r->type == REDIS_REPLY_ERROR ? r->str : redis_sync_errstr(rs));
    if (r)
        freeReplyObject(r);
    return v;
}

qn_status bloom_add_sync(redis_sync *rs, const redis_scripts *s, const char *key,
                         const bloom_params *p, int64_t id)
{
    int ok;
    long long v = bloom_sync(rs, s, SCRIPT(bloom_add), key, p, id, &ok);
    return !ok ? QN_ERR : v == 1 ? QN_OK : QN_ECONFLICT;
}

int bloom_check_sync(redis_sync *rs, const redis_scripts *s, const char *key, const bloom_params *p,
                     int64_t id)
{
    int ok;
    long long v = bloom_sync(rs, s, SCRIPT(bloom_check), key, p, id, &ok);
    return !ok ? BLOOM_UNKNOWN : v == 1 ? BLOOM_PRESENT : v == 0 ? BLOOM_ABSENT : BLOOM_UNKNOWN;
}
