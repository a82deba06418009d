/* lua-scripts/claim.lua and claim_undo.lua run directly against a real Redis (synchronous). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "redis.h"
#include "testhelp.h"

#define TPL  "quan:tpl:{t-claim}"
#define USER "quan:tpl:{t-claim}:user:u1"

static redisContext *g_ctx;
static redis_scripts *g_scripts;

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long cmd_int(const char *fmt, const char *key)
{
    redisReply *r = redisCommand(g_ctx, fmt, key);
    long long v = -999;
    if (r && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r && r->type == REDIS_REPLY_STRING)
        v = atoll(r->str);
    else if (r && r->type == REDIS_REPLY_NIL)
        v = -1000; /* absent */
    if (r)
        freeReplyObject(r);
    return v;
}

static long long stock(void)
{
    redisReply *r = redisCommand(g_ctx, "HGET %s stock", TPL);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

/* Fresh template hash: window [now+start_off, now+end_off], given stock and status. */
static void setup(long long stk, int status, int64_t start_off, int64_t end_off)
{
    int64_t now = wall_ms();
    redisReply *r;
    char s[24], e[24];

    snprintf(s, sizeof(s), "%" PRId64, now + start_off);
    snprintf(e, sizeof(e), "%" PRId64, now + end_off);
    freeReplyObject(redisCommand(g_ctx, "DEL %s %s", TPL, USER));
    r = redisCommand(g_ctx, "HSET %s stock %lld status %d validStartTime %s validEndTime %s name x",
                     TPL, stk, status, s, e);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r)
        freeReplyObject(r);
}

static int64_t tpl_end(void)
{
    redisReply *r = redisCommand(g_ctx, "HGET %s validEndTime", TPL);
    int64_t v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
    if (r)
        freeReplyObject(r);
    return v;
}

/* Runs claim.lua; returns result, stores count. -100 on an unexpected reply shape. */
static long long claim(int64_t now, const char *limit, int64_t end, long long *count)
{
    char n[24], e[24];
    const char *keys[2] = {TPL, USER};
    const char *args[3] = {n, limit, e};
    redisReply *r;
    long long res = -100;

    snprintf(n, sizeof(n), "%" PRId64, now);
    snprintf(e, sizeof(e), "%" PRId64, end);
    r = redis_sync_eval(g_ctx, g_scripts, "claim", 2, keys, 3, args);
    *count = -1;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_INTEGER && r->element[1]->type == REDIS_REPLY_INTEGER) {
        res = r->element[0]->integer;
        *count = r->element[1]->integer;
    } else if (r && r->type == REDIS_REPLY_ERROR) {
        res = -200;
    }
    if (r)
        freeReplyObject(r);
    return res;
}

static long long undo(void)
{
    const char *keys[2] = {TPL, USER};
    redisReply *r = redis_sync_eval(g_ctx, g_scripts, "claim_undo", 2, keys, 0, NULL);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

static void test_success_counts_from_one_and_pexpireat(void)
{
    long long cnt;
    int64_t end, now;
    long long pttl;

    setup(10, 0, -1000, 60000);
    end = tpl_end();
    now = wall_ms();
    CHECK_EQ_INT(claim(now, "2", end, &cnt), 0);
    CHECK_EQ_INT(cnt, 1); /* receive_count starts at 1 (D3) */
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(cmd_int("GET %s", USER), 1);
    /* PEXPIREAT at the end of the window (D1: not EXPIRE with a ms value). */
    pttl = cmd_int("PTTL %s", USER);
    CHECK(pttl > 0);
    CHECK(pttl <= end - now + 5);
    CHECK(pttl >= end - wall_ms() - 1000);

    CHECK_EQ_INT(claim(wall_ms(), "2", end, &cnt), 0);
    CHECK_EQ_INT(cnt, 2);
    CHECK_EQ_INT(stock(), 8);
    CHECK(cmd_int("PTTL %s", USER) > 50000);
}

static void test_limit_reached(void)
{
    long long cnt;
    int64_t end;

    setup(10, 0, -1000, 60000);
    end = tpl_end();
    CHECK_EQ_INT(claim(wall_ms(), "1", end, &cnt), 0);
    CHECK_EQ_INT(claim(wall_ms(), "1", end, &cnt), 2);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(stock(), 9); /* untouched by the refused claim */
    CHECK_EQ_INT(cmd_int("GET %s", USER), 1);
}

static void test_stock_exhausted(void)
{
    long long cnt;
    int64_t end;

    setup(1, 0, -1000, 60000);
    end = tpl_end();
    CHECK_EQ_INT(claim(wall_ms(), "5", end, &cnt), 0);
    CHECK_EQ_INT(stock(), 0);
    CHECK_EQ_INT(claim(wall_ms(), "5", end, &cnt), 1);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(stock(), 0); /* never below zero */
    CHECK_EQ_INT(cmd_int("GET %s", USER), 1);
}

static void test_not_active(void)
{
    long long cnt;

    setup(10, 1, -1000, 60000); /* terminated (D15) */
    CHECK_EQ_INT(claim(wall_ms(), "5", tpl_end(), &cnt), 3);
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(cmd_int("EXISTS %s", USER), 0);
}

static void test_outside_window(void)
{
    long long cnt;
    int64_t end;

    setup(10, 0, 10000, 60000); /* not started */
    CHECK_EQ_INT(claim(wall_ms(), "5", tpl_end(), &cnt), 4);
    setup(10, 0, -60000, -1000); /* ended */
    end = tpl_end();
    CHECK_EQ_INT(claim(wall_ms(), "5", end, &cnt), 4);
    CHECK_EQ_INT(claim(end + 1, "5", end, &cnt), 4);
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(cmd_int("EXISTS %s", USER), 0);
}

static void test_cache_missing(void)
{
    long long cnt;
    redisReply *r;

    freeReplyObject(redisCommand(g_ctx, "DEL %s %s", TPL, USER));
    CHECK_EQ_INT(claim(wall_ms(), "1", wall_ms() + 60000, &cnt), 5);
    CHECK_EQ_INT(cnt, 0);
    CHECK_EQ_INT(cmd_int("EXISTS %s", TPL), 0); /* nothing created */
    CHECK_EQ_INT(cmd_int("EXISTS %s", USER), 0);

    /* A partial hash (what a bare HINCRBY creates, D16): missing dates -> reload. */
    r = redisCommand(g_ctx, "HSET %s stock 5", TPL);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(claim(wall_ms(), "1", wall_ms() + 60000, &cnt), 5);
    CHECK_EQ_INT(stock(), 5);
    /* Non-numeric stock is treated as missing, not as a Lua error. */
    setup(10, 0, -1000, 60000);
    r = redisCommand(g_ctx, "HSET %s stock abc", TPL);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(claim(wall_ms(), "1", tpl_end(), &cnt), 5);
}

static void test_bad_arguments(void)
{
    long long cnt;
    setup(10, 0, -1000, 60000);
    CHECK_EQ_INT(claim(wall_ms(), "0", tpl_end(), &cnt), -200);
    CHECK_EQ_INT(claim(wall_ms(), "x", tpl_end(), &cnt), -200);
    CHECK_EQ_INT(stock(), 10);
}

static void test_undo(void)
{
    long long cnt;
    int64_t end;

    setup(3, 0, -1000, 60000);
    end = tpl_end();
    CHECK_EQ_INT(claim(wall_ms(), "3", end, &cnt), 0);
    CHECK_EQ_INT(claim(wall_ms(), "3", end, &cnt), 0);
    CHECK_EQ_INT(stock(), 1);
    CHECK_EQ_INT(undo(), 2);
    CHECK_EQ_INT(stock(), 2);
    CHECK_EQ_INT(cmd_int("GET %s", USER), 1);
    CHECK(cmd_int("PTTL %s", USER) > 50000); /* DECR keeps the TTL */
    CHECK_EQ_INT(undo(), 3);
    CHECK_EQ_INT(cmd_int("GET %s", USER), 0);
    CHECK_EQ_INT(undo(), 4); /* counter stays at 0, never negative */
    CHECK_EQ_INT(cmd_int("GET %s", USER), 0);

    /* The claim slot comes back: the user can claim again. */
    CHECK_EQ_INT(claim(wall_ms(), "1", end, &cnt), 0);
    CHECK_EQ_INT(cnt, 1);

    /* Hash gone: -1, nothing recreated, counter untouched. */
    freeReplyObject(redisCommand(g_ctx, "DEL %s", TPL));
    CHECK_EQ_INT(undo(), -1);
    CHECK_EQ_INT(cmd_int("EXISTS %s", TPL), 0);
    CHECK_EQ_INT(cmd_int("GET %s", USER), 1);
    freeReplyObject(redisCommand(g_ctx, "DEL %s", USER));
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    const char *host = th_env("QUAN_REDIS_HOST");
    int port = atoi(th_env("QUAN_REDIS_PORT"));

    log_init("test_lua_claim", LOGL_ERROR);
    g_ctx = redis_sync_connect(host, port, NULL, 2000);
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_ctx || !g_scripts) {
        printf("  FAIL: no Redis connection or no Lua scripts\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_success_counts_from_one_and_pexpireat);
    RUN(test_limit_reached);
    RUN(test_stock_exhausted);
    RUN(test_not_active);
    RUN(test_outside_window);
    RUN(test_cache_missing);
    RUN(test_bad_arguments);
    RUN(test_undo);
    freeReplyObject(redisCommand(g_ctx, "DEL %s %s", TPL, USER));
    redis_scripts_free(g_scripts);
    redisFree(g_ctx);
    TEST_MAIN_END();
}
