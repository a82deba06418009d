/* bloom: sizing, positions, and the two scripts against a real Redis (a private key). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloom.h"
#include "log.h"
#include "nodup.h"
#include "testhelp.h"

static redis_sync *g_ctx;
static redis_scripts *g_scripts;
static char g_key[64];

static void test_params(void)
{
    bloom_params p;
    CHECK(bloom_params_for(1000000, 1000, &p) == QN_OK);
    /* -n ln(0.001) / ln(2)^2 = 14,377,588 bits (about 1.7 MiB), k = 10 */
    CHECK(p.m >= 14377580 && p.m <= 14377600);
    CHECK_EQ_INT(p.k, 10);
    CHECK(bloom_params_for(0, 1000, &p) == QN_EINVAL);
    CHECK(bloom_params_for(10, 0, &p) == QN_EINVAL);
    CHECK(bloom_params_for(10, 1000000, &p) == QN_EINVAL);
    CHECK(bloom_params_for(1000000000, 1, &p) == QN_OK);
    CHECK(p.m == BLOOM_MAX_BITS && p.k >= 1 && p.k <= BLOOM_MAX_K);
    char h[BLOOM_HEADER_LEN + 1];
    CHECK(bloom_params_for(1000000, 1000, &p) == QN_OK);
    bloom_header(&p, h);
    CHECK_EQ_INT((int)strlen(h), BLOOM_HEADER_LEN);
    CHECK(strncmp(h, "QBLOOM1 m=", 10) == 0);
}

static void test_positions(void)
{
    bloom_params p;
    uint64_t a[BLOOM_MAX_K], b[BLOOM_MAX_K];
    CHECK(bloom_params_for(1000, 1000, &p) == QN_OK);
    bloom_positions(&p, 385531493318840320LL, a);
    bloom_positions(&p, 385531493318840320LL, b);
    CHECK(memcmp(a, b, sizeof(uint64_t) * (size_t)p.k) == 0);
    for (int i = 0; i < p.k; i++)
        CHECK(a[i] >= BLOOM_HEADER_BITS && a[i] < BLOOM_HEADER_BITS + p.m);
    bloom_positions(&p, 385531493318840321LL, b); /* a neighbouring snowflake differs */
    CHECK(memcmp(a, b, sizeof(uint64_t) * (size_t)p.k) != 0);
}

static void test_add_and_check(void)
{
    bloom_params p, other;
    CHECK(bloom_params_for(1000, 1000, &p) == QN_OK);
    CHECK(bloom_params_for(2000, 1000, &other) == QN_OK);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", g_key));
    /* no filter: unknown, and checking never creates the key */
    CHECK_EQ_INT(bloom_check_sync(g_ctx, g_scripts, g_key, &p, 42), BLOOM_UNKNOWN);
    redisReply *r = redis_sync_command(g_ctx, "EXISTS %s", g_key);
    CHECK(r && r->integer == 0);
    freeReplyObject(r);
    for (int64_t id = 1; id <= 500; id++)
        CHECK(bloom_add_sync(g_ctx, g_scripts, g_key, &p, id * 7919) == QN_OK);
    for (int64_t id = 1; id <= 500; id++)
        CHECK_EQ_INT(bloom_check_sync(g_ctx, g_scripts, g_key, &p, id * 7919), BLOOM_PRESENT);
    int fp = 0;
    for (int64_t id = 1; id <= 1000; id++)
        fp += bloom_check_sync(g_ctx, g_scripts, g_key, &p, id * 7919 + 1) == BLOOM_PRESENT;
    CHECK(fp <= 10); /* p = 0.001 at 1000 items; half full here */
    /* another sizing neither reads nor writes this filter */
    CHECK_EQ_INT(bloom_check_sync(g_ctx, g_scripts, g_key, &other, 7919), BLOOM_UNKNOWN);
    CHECK(bloom_add_sync(g_ctx, g_scripts, g_key, &other, 7919) == QN_ECONFLICT);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", g_key));
}

static void test_nodup_digest(void)
{
    char a[65], b[65];
    CHECK(nodup_digest(1, "", "{\"a\":1}", 7, a) == QN_OK);
    CHECK_EQ_INT((int)strlen(a), 64);
    CHECK(nodup_digest(1, "", "{\"a\":1}", 7, b) == QN_OK);
    CHECK_EQ_STR(a, b);
    CHECK(nodup_digest(2, "", "{\"a\":1}", 7, b) == QN_OK); /* another shop */
    CHECK(strcmp(a, b) != 0);
    CHECK(nodup_digest(1, "x=1", "", 0, a) == QN_OK); /* query and body kept apart */
    CHECK(nodup_digest(1, "", "x=1", 3, b) == QN_OK);
    CHECK(strcmp(a, b) != 0);
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    const char *host = th_env("QUAN_REDIS_HOST");
    int port = atoi(th_env("QUAN_REDIS_PORT"));

    log_init("test_bloom", LOGL_ERROR);
    snprintf(g_key, sizeof(g_key), "quan:test:bloom:%ld", (long)getpid());
    g_ctx = redis_sync_new(&(redis_sync_opts){.host = host, .port = port, .timeout_ms = 2000});
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_ctx || !g_scripts) {
        printf("  FAIL: no Redis connection or no Lua scripts\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_params);
    RUN(test_positions);
    RUN(test_add_and_check);
    RUN(test_nodup_digest);
    redis_scripts_free(g_scripts);
    redis_sync_free(g_ctx);
    TEST_MAIN_END();
}
