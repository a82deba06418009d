/* Idempotent-consume guard, see guard.h. */
#include "guard.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

#define GUARD_CONSUMING "0"
#define GUARD_CONSUMED  "1"

guard_result guard_begin(redis_sync *rs, const redis_scripts *scripts, const char *key,
                         int64_t ttl_ms)
{
    char ttl[24];
    const char *keys[1] = {key};
    const char *args[2] = {GUARD_CONSUMING, ttl};
    redisReply *r = NULL;
    guard_result res = GUARD_ERROR;

    if (!rs || !key || ttl_ms <= 0)
        goto done;
    snprintf(ttl, sizeof(ttl), "%" PRId64, ttl_ms);
    r = REDIS_SYNC_SCRIPT(rs, scripts, consume_guard, keys, args);
    if (!r) {
        log_warn(NULL, "guard: %s: %s", key, redis_sync_errstr(rs));
        goto done;
    }
    if (r->type == REDIS_REPLY_NIL)
        res = GUARD_RUN;
    else if (r->type == REDIS_REPLY_STRING && strcmp(r->str, GUARD_CONSUMING) == 0)
        res = GUARD_BUSY;
    else if (r->type == REDIS_REPLY_STRING && strcmp(r->str, GUARD_CONSUMED) == 0)
        res = GUARD_DONE;
    else
        log_warn(NULL, "guard: %s: unexpected reply (type %d%s%s)", key, r->type,
                 r->type == REDIS_REPLY_ERROR ? ": " : "",
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
done:
    if (r)
        freeReplyObject(r);
    return res;
}

qn_status guard_commit(redis_sync *rs, const char *key, int64_t ttl_ms)
{
    redisReply *r;
    qn_status st = QN_ERR;

    if (!rs || !key || ttl_ms <= 0)
        return QN_EINVAL;
    r = redis_sync_command(rs, "SET %s %s PX %lld", key, GUARD_CONSUMED, (long long)ttl_ms);
    if (r && r->type == REDIS_REPLY_STATUS)
        st = QN_OK;
    else
        log_warn(NULL, "guard: commit %s failed: %s", key,
                 r ? (r->str ? r->str : "unexpected reply") : redis_sync_errstr(rs));
    if (r)
        freeReplyObject(r);
    return st;
}

qn_status guard_abort(redis_sync *rs, const char *key)
{
    redisReply *r;
    qn_status st = QN_ERR;

    if (!rs || !key)
        return QN_EINVAL;
    r = redis_sync_command(rs, "DEL %s", key);
    if (r && r->type == REDIS_REPLY_INTEGER)
        st = QN_OK;
    else
        log_warn(NULL, "guard: abort %s failed: %s", key,
                 r ? (r->str ? r->str : "unexpected reply") : redis_sync_errstr(rs));
    if (r)
        freeReplyObject(r);
    return st;
}

const char *guard_result_str(guard_result r)
{
    switch (r) {
    case GUARD_RUN:
        return "run";
    case GUARD_BUSY:
        return "busy";
    case GUARD_DONE:
        return "done";
    case GUARD_ERROR:
        return "error";
    }
    return "?";
}
