/* The one reader of claim.lua's answers (claimgate.h). */
#include "claimgate.h"

#include <string.h>

static int claimgate_int(const redisReply *r, size_t i, long long *out)
{
    if (r->elements <= i || !r->element[i] || r->element[i]->type != REDIS_REPLY_INTEGER)
        return 0;
    *out = r->element[i]->integer;
    return 1;
}

qn_status claimgate_parse(const redisReply *r, claimgate_reply *out)
{
    long long code;
    memset(out, 0, sizeof(*out));
    if (!r || r->type != REDIS_REPLY_ARRAY || !claimgate_int(r, 0, &code) ||
        !claimgate_int(r, 1, &out->count))
        return QN_EINVAL;
    out->reserved = code == CLAIMGATE_OK;
    if (code < 0 || code >= CLAIMGATE_RESULTS)
        return QN_EINVAL;
    out->code = (claimgate_result)code;
    switch (out->code) {
    case CLAIMGATE_OK: /* {0, n, h, e}: all four, or nothing of it can be written */
        if (!claimgate_int(r, 2, &out->hours) || !claimgate_int(r, 3, &out->end_ms))
            return QN_EINVAL;
        break;
    case CLAIMGATE_REPEATED: /* {7, n, t}: t from scripts that say it */
        if (!claimgate_int(r, 2, &out->resv_ms) || out->resv_ms < 0)
            out->resv_ms = 0;
        break;
    default:
        break;
    }
    return QN_OK;
}

const char *claimgate_name(claimgate_result r)
{
    static const char *const names[CLAIMGATE_RESULTS] = {
        "CLAIMGATE_OK",
        "CLAIMGATE_SOLD_OUT",
        "CLAIMGATE_LIMIT_REACHED",
        "CLAIMGATE_NOT_ACTIVE",
        "CLAIMGATE_OUTSIDE_WINDOW",
        "CLAIMGATE_CACHE_MISS",
        "CLAIMGATE_OTHER_SHOP",
        "CLAIMGATE_REPEATED",
        "CLAIMGATE_STOCK_IN_DOUBT",
        "CLAIMGATE_LIMIT_IN_DOUBT",
        "CLAIMGATE_WRONG_BUCKETS",
    };
    return (unsigned)r < CLAIMGATE_RESULTS ? names[r] : "unknown";
}
