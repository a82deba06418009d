/* guard.c (the idempotent-consume guard) against a real Redis, including two racing
 * consumers, each with its own connection. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "guard.h"
#include "log.h"
#include "redis.h"
#include "redis_sync.h"
#include "testhelp.h"

#define RACE_ROUNDS 300

static const char *g_host;
static int g_port;
static redis_scripts *g_scripts;

static long long pttl(redis_sync *ctx, const char *key)
{
    redisReply *r = redis_sync_command(ctx, "PTTL %s", key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

static void get_str(redis_sync *ctx, const char *key, char *out, size_t cap)
{
    redisReply *r = redis_sync_command(ctx, "GET %s", key);
    snprintf(out, cap, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "(nil)");
    if (r)
        freeReplyObject(r);
}

static void del(redis_sync *ctx, const char *key)
{
    redisReply *r = redis_sync_command(ctx, "DEL %s", key);
    if (r)
        freeReplyObject(r);
}

static void test_branches(void)
{
    redis_sync *ctx =
        redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 2000});
    const char *key = "quan:test:guard:{m1}";
    char v[32];
    long long t;

    CHECK(ctx != NULL);
    if (!ctx)
        return;
    del(ctx, key);
    /* nil -> RUN, the key now says CONSUMING ("0") with the TTL. */
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 60000), GUARD_RUN);
    get_str(ctx, key, v, sizeof(v));
    CHECK_EQ_STR(v, "0");
    t = pttl(ctx, key);
    CHECK(t > 55000 && t <= 60000);
    /* "0" -> BUSY, and the probe does not change the key. */
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 60000), GUARD_BUSY);
    get_str(ctx, key, v, sizeof(v));
    CHECK_EQ_STR(v, "0");
    /* commit -> "1" -> DONE. */
    CHECK(guard_commit(ctx, key, 30000) == QN_OK);
    get_str(ctx, key, v, sizeof(v));
    CHECK_EQ_STR(v, "1");
    t = pttl(ctx, key);
    CHECK(t > 25000 && t <= 30000);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 60000), GUARD_DONE);
    get_str(ctx, key, v, sizeof(v));
    CHECK_EQ_STR(v, "1");

    /* abort (business failed) gives the key back: the redelivery runs. */
    del(ctx, key);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 60000), GUARD_RUN);
    CHECK(guard_abort(ctx, key) == QN_OK);
    get_str(ctx, key, v, sizeof(v));
    CHECK_EQ_STR(v, "(nil)");
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 60000), GUARD_RUN);

    /* A crashed consumer's CONSUMING mark evaporates after the TTL. */
    del(ctx, key);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 80), GUARD_RUN);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 80), GUARD_BUSY);
    usleep(150 * 1000);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 80), GUARD_RUN);

    /* Errors: wrong key type, bad TTL, no script, broken connection. */
    del(ctx, key);
    freeReplyObject(redis_sync_command(ctx, "HSET %s f v", key));
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 1000), GUARD_ERROR);
    del(ctx, key);
    CHECK_EQ_INT(guard_begin(ctx, g_scripts, key, 0), GUARD_ERROR);
    CHECK_EQ_INT(guard_begin(ctx, NULL, key, 1000), GUARD_ERROR);
    CHECK(guard_commit(ctx, key, 0) == QN_EINVAL);
    CHECK_EQ_STR(guard_result_str(GUARD_BUSY), "busy");
    del(ctx, key);
    redis_sync_free(ctx);
}

/* ---------------------------------------------------------------- two racing consumers */

typedef struct {
    int id;
    pthread_barrier_t *barrier;
    guard_result first[RACE_ROUNDS];
    guard_result second[RACE_ROUNDS];
    int errors;
} racer;

static void *race_thread(void *arg)
{
    racer *me = arg;
    redis_sync *ctx =
        redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 2000});
    char key[64];

    if (!ctx)
        me->errors++;
    for (int i = 0; i < RACE_ROUNDS; i++) {
        snprintf(key, sizeof(key), "quan:test:guard:{race}:%d", i);
        pthread_barrier_wait(me->barrier); /* both start the round together */
        me->first[i] = ctx ? guard_begin(ctx, g_scripts, key, 10000) : GUARD_ERROR;
        pthread_barrier_wait(me->barrier); /* both have probed */
        if (me->first[i] == GUARD_RUN && guard_commit(ctx, key, 10000) != QN_OK)
            me->errors++;
        pthread_barrier_wait(me->barrier); /* the winner has committed */
        me->second[i] = ctx ? guard_begin(ctx, g_scripts, key, 10000) : GUARD_ERROR;
    }
    if (ctx)
        redis_sync_free(ctx);
    return NULL;
}

static void test_two_consumers_race(void)
{
    pthread_barrier_t barrier;
    pthread_t th[2];
    racer *r = calloc(2, sizeof(*r));
    redis_sync *ctx =
        redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 2000});
    int wins[2] = {0, 0}, bad_rounds = 0;

    CHECK(r && ctx);
    if (!r || !ctx)
        goto done;
    for (int i = 0; i < RACE_ROUNDS; i++) {
        char key[64];
        snprintf(key, sizeof(key), "quan:test:guard:{race}:%d", i);
        del(ctx, key);
    }
    pthread_barrier_init(&barrier, NULL, 2);
    for (int t = 0; t < 2; t++) {
        r[t].id = t;
        r[t].barrier = &barrier;
        pthread_create(&th[t], NULL, race_thread, &r[t]);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&barrier);

    CHECK_EQ_INT(r[0].errors + r[1].errors, 0);
    for (int i = 0; i < RACE_ROUNDS; i++) {
        guard_result a = r[0].first[i], b = r[1].first[i];
        /* Exactly one RUN; the other one saw CONSUMING and must not ack. */
        if (!((a == GUARD_RUN && b == GUARD_BUSY) || (a == GUARD_BUSY && b == GUARD_RUN)))
            bad_rounds++;
        if (r[0].second[i] != GUARD_DONE || r[1].second[i] != GUARD_DONE)
            bad_rounds++;
        wins[0] += a == GUARD_RUN;
        wins[1] += b == GUARD_RUN;
    }
    CHECK_EQ_INT(bad_rounds, 0);
    CHECK_EQ_INT(wins[0] + wins[1], RACE_ROUNDS);
    printf("  race: consumer 0 won %d rounds, consumer 1 won %d\n", wins[0], wins[1]);
    for (int i = 0; i < RACE_ROUNDS; i++) {
        char key[64];
        snprintf(key, sizeof(key), "quan:test:guard:{race}:%d", i);
        del(ctx, key);
    }
done:
    if (ctx)
        redis_sync_free(ctx);
    free(r);
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    g_host = th_env("QUAN_REDIS_HOST");
    g_port = atoi(th_env("QUAN_REDIS_PORT"));
    log_init("test_guard", LOGL_OFF);
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_scripts) {
        printf("  FAIL: no Lua scripts\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_branches);
    RUN(test_two_consumers_race);
    redis_scripts_free(g_scripts);
    TEST_MAIN_END();
}
