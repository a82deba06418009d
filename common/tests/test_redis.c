/* redis.c against a real Redis: QUAN_REDIS_HOST / QUAN_REDIS_PORT, QUAN_LUA_DIR (or ./lua-scripts).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "log.h"
#include "now.h"
#include "redis.h"
#include "redis_seen.h"
#include "testhelp.h"

static const char *g_host;
static int g_port;
static const char *g_lua_dir;

static int wait_ready(struct event_base *base, redis_client *c, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    while (!redis_client_ready(c) && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    return redis_client_ready(c);
}

static redis_client *new_client(struct event_base *base, const char *lua_dir, int cmd_timeout)
{
    redis_opts o = {.host = g_host,
                    .port = g_port,
                    .connect_timeout_ms = 500,
                    .command_timeout_ms = cmd_timeout,
                    .lua_dir = lua_dir};
    return redis_client_new(base, &o);
}

static redisContext *sync_ctx(void)
{
    struct timeval tv = {2, 0};
    redisContext *ctx = redisConnectWithTimeout(g_host, g_port, tv);
    if (ctx && ctx->err) {
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

static void sync_do(const char *cmd)
{
    redisContext *ctx = sync_ctx();
    redisReply *r = ctx ? redisCommand(ctx, cmd) : NULL;
    CHECK(r != NULL);
    if (r)
        freeReplyObject(r);
    if (ctx)
        redisFree(ctx);
}

static void write_file(const char *path, const char *content)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(content, f);
    fclose(f);
}

/* ---------------------------------------------------------------- tests */

/* The locally computed SHA1 equals what SCRIPT LOAD returns, across padding edge cases. */
static void test_scripts_sha1_matches_server(void)
{
    char dir[] = "/tmp/quan-test-lua-XXXXXX";
    static const int lens[] = {0, 11, 55, 56, 63, 64, 119, 120, 200};
    char path[128], body[256];
    redis_scripts *s;
    redisContext *ctx = sync_ctx();

    CHECK(ctx != NULL);
    CHECK(mkdtemp(dir) != NULL);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        int n = lens[i];
        memset(body, 0, sizeof(body));
        if (n > 0) {
            memcpy(body, "return 1 --", 11);
            memset(body + 11, 'x', (size_t)(n - 11));
        }
        snprintf(path, sizeof(path), "%s/s%03d.lua", dir, n);
        write_file(path, body);
    }
    snprintf(path, sizeof(path), "%s/notlua.txt", dir);
    write_file(path, "return 2");

    s = redis_scripts_load_dir(dir);
    CHECK(s != NULL);
    CHECK_EQ_INT(redis_scripts_count(s), sizeof(lens) / sizeof(lens[0]));
    CHECK_EQ_STR(redis_scripts_sha1(s, "s000"), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    CHECK(redis_scripts_sha1(s, "notlua") == NULL);
    {
        redis_scripts_sha1_ctx x;
        char hex[41];
        redis_scripts_sha1_init(&x);
        redis_scripts_sha1_update(&x, "ab", 2);
        redis_scripts_sha1_update(&x, "c", 1);
        redis_scripts_sha1_hex(&x, hex);
        CHECK_EQ_STR(hex, "a9993e364706816aba3e25717850c26c9cd0d89d"); /* FIPS 180-1's "abc" */
    }
    for (size_t i = 0; s && ctx && i < redis_scripts_count(s); i++) {
        const char *name = redis_scripts_name(s, i);
        const char *src = redis_scripts_source(s, name);
        redisReply *r = redisCommand(ctx, "SCRIPT LOAD %s", src);
        CHECK(r && r->type == REDIS_REPLY_STRING);
        if (r && r->type == REDIS_REPLY_STRING)
            CHECK_EQ_STR(r->str, redis_scripts_sha1(s, name));
        if (r)
            freeReplyObject(r);
        /* fed in pieces of every size across a block's edge: the same digest */
        for (size_t piece = 1; src && piece <= 65; piece += 8) {
            redis_scripts_sha1_ctx x;
            char hex[41];
            size_t len = strlen(src);
            redis_scripts_sha1_init(&x);
            for (size_t off = 0; off < len; off += piece)
                redis_scripts_sha1_update(&x, src + off, len - off < piece ? len - off : piece);
            redis_scripts_sha1_hex(&x, hex);
            CHECK_EQ_STR(hex, redis_scripts_sha1(s, name));
        }
        snprintf(path, sizeof(path), "%s/%s.lua", dir, name);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/notlua.txt", dir);
    unlink(path);
    rmdir(dir);
    redis_scripts_free(s);
    CHECK(redis_scripts_load_dir("/nonexistent/quan-lua") == NULL);
    if (ctx)
        redisFree(ctx);
}

/* scripts.h against lua-scripts/: the very scripts, each once; a directory with one more, or
 * one less, is refused; a call whose counts do not fit a listed script is refused before it is
 * sent, and a test's own script (not listed) is not checked. */
static void test_scripts_table(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    char err[160] = "", dir[] = "/tmp/quan-test-lua-XXXXXX", path[160];
    redis_scripts *s = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    CHECK(s != NULL);
    CHECK_EQ_INT(redis_scripts_check(s, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(redis_scripts_count(s), SCRIPTS_COUNT);
    redis_scripts_free(s);

    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/claim.lua", dir);
    write_file(path, "return 1");
    s = redis_scripts_load_dir(dir);
    CHECK_EQ_INT(redis_scripts_check(s, err, sizeof(err)), QN_EINVAL); /* the others missing */
    CHECK(strstr(err, "missing") != NULL);
    redis_scripts_free(s);
    unlink(path);
    rmdir(dir);

    /* claim.lua: an owner and the caller's number of buckets, then 4 a claim */
    CHECK(redis_scripts_call_ok(SCRIPT(claim), 3, 2 + 4));
    CHECK(redis_scripts_call_ok(SCRIPT(claim), 2, 2 + 4));
    CHECK(redis_scripts_call_ok(SCRIPT(claim), 3, 2 + 4 * 64)); /* a batch of 64: same keys */
    CHECK(!redis_scripts_call_ok(SCRIPT(claim), 4, 2 + 4));     /* the old four keys */
    CHECK(!redis_scripts_call_ok(SCRIPT(claim), 3, 1 + 4));     /* without the buckets */
    CHECK(redis_scripts_call_ok(SCRIPT(claim_undo), 3, 2));
    CHECK(!redis_scripts_call_ok(SCRIPT(claim_undo), 4, 2));
    CHECK(!redis_scripts_call_ok(SCRIPT(claim_undo), 6, 1));
    /* the users of a chunk are arguments (a list: no bound), its keys four */
    CHECK(redis_scripts_call_ok(SCRIPT(dist_chunk), 4, 4 + 500));
    CHECK(!redis_scripts_call_ok(SCRIPT(dist_chunk), 4 + 500, 4 + 500));
    CHECK(redis_scripts_call_ok(SCRIPT(dist_chunk_undo), 3, 0));
    CHECK(redis_scripts_call_ok(SCRIPT(dist_chunk_undo), 3, 500));
    CHECK(!redis_scripts_call_ok(SCRIPT(dist_chunk_undo), 2 + 500, 0));
    CHECK(redis_scripts_call_ok("a_test_script", 9, 9));
}

static void test_connect_command_ready(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base, g_lua_dir, 1000);
    seen set = {0}, get = {0}, argv_s = {0}, bad = {0};
    const char *argv[3] = {"SET", "quan:test:redis:argv", "va lue"};

    CHECK(c != NULL);
    CHECK(!redis_client_ready(c));
    CHECK(redis_client_scripts(c) && redis_scripts_count(redis_client_scripts(c)) >= 6);
    CHECK(redis_scripts_sha1(redis_client_scripts(c), "claim") != NULL);
    CHECK(wait_ready(base, c, 3000));
    CHECK(redis_client_connected(c));
    CHECK_EQ_INT(redis_client_connects(c), 1);

    CHECK(redis_command(c, record_cb, &set, "SET %s %s", "quan:test:redis:k", "v 1") == QN_OK);
    CHECK(redis_command(c, record_cb, &get, "GET %s", "quan:test:redis:k") == QN_OK);
    CHECK(redis_command_argv(c, record_cb, &argv_s, 3, argv, NULL) == QN_OK);
    CHECK(redis_command(c, record_cb, &bad, "NOSUCHCOMMAND") == QN_OK);
    CHECK_EQ_INT(set.calls + get.calls, 0); /* never called from inside the call */
    run_until(base, &bad.calls, 2000);
    run_for(base, 20);
    CHECK_EQ_INT(set.calls, 1);
    CHECK_EQ_STR(set.str, "OK");
    CHECK_EQ_STR(set.err, "");
    CHECK_EQ_INT(get.calls, 1);
    CHECK_EQ_STR(get.str, "v 1");
    CHECK_EQ_INT(argv_s.calls, 1);
    CHECK_EQ_STR(argv_s.str, "OK");
    CHECK_EQ_INT(bad.calls, 1);
    CHECK_EQ_INT(bad.type, REDIS_REPLY_ERROR);
    CHECK(strstr(bad.err, "unknown command") != NULL);

    /* Keys in two hash slots: refused on one server as on a cluster, never sent. */
    seen cross = {0}, still = {0};
    CHECK(redis_command(c, record_cb, &cross, "DEL %s %s", "quan:test:redis:k",
                        "quan:test:{other}") == QN_OK);
    CHECK(redis_command(c, record_cb, &still, "EXISTS %s", "quan:test:redis:k") == QN_OK);
    run_until(base, &still.calls, 2000);
    CHECK_EQ_INT(cross.calls, 1);
    CHECK(!cross.has_reply);
    CHECK(strncmp(cross.err, "CROSSSLOT", 9) == 0);
    CHECK_EQ_INT(still.integer, 1);

    /* A transaction goes to one server (a cluster refuses it, test_redis_cluster.c). */
    seen multi = {0}, discard = {0};
    CHECK(redis_command(c, record_cb, &multi, "MULTI") == QN_OK);
    CHECK(redis_command(c, record_cb, &discard, "DISCARD") == QN_OK);
    run_until(base, &discard.calls, 2000);
    CHECK_EQ_STR(multi.str, "OK");
    CHECK_EQ_STR(discard.str, "OK");

    redis_client_free(c);
    event_base_free(base);
}

/* A script that does not compile: connected, but never ready (what /readyz must see). */
static void test_not_ready_until_all_scripts_load(void)
{
    char dir[] = "/tmp/quan-test-lua-XXXXXX", p1[128], p2[128];
    struct event_base *base = event_base_new();
    redis_client *c;

    CHECK(mkdtemp(dir) != NULL);
    snprintf(p1, sizeof(p1), "%s/good.lua", dir);
    snprintf(p2, sizeof(p2), "%s/bad.lua", dir);
    write_file(p1, "return 1");
    write_file(p2, "return (((");
    c = new_client(base, dir, 1000);
    CHECK(c != NULL);
    for (int i = 0; i < 300 && !redis_client_connected(c); i++)
        run_for(base, 5);
    CHECK(redis_client_connected(c));
    run_for(base, 200);
    CHECK(redis_client_connected(c));
    CHECK(!redis_client_ready(c));
    redis_client_free(c);

    /* Fix the script: a new client becomes ready. */
    write_file(p2, "return 2");
    c = new_client(base, dir, 1000);
    CHECK(c != NULL);
    CHECK(wait_ready(base, c, 3000));
    redis_client_free(c);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
    event_base_free(base);
}

static void test_eval_and_noscript_recovery(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base, g_lua_dir, 1000);
    const char *keys[1] = {"quan:test:redis:lock{a}"};
    const char *args[2] = {"tok-1", "5000"};
    const char *args2[2] = {"tok-2", "5000"};
    seen e1 = {0}, flush = {0}, e2 = {0}, rel = {0}, unknown = {0};

    CHECK(wait_ready(base, c, 3000));
    sync_do("DEL quan:test:redis:lock{a}");
    CHECK(redis_eval(c, "lock_acquire", 1, keys, 2, args, record_cb, &e1) == QN_OK);
    run_until(base, &e1.calls, 2000);
    CHECK_EQ_INT(e1.calls, 1);
    CHECK_EQ_INT(e1.type, REDIS_REPLY_INTEGER);
    CHECK_EQ_INT(e1.integer, 1);

    CHECK(redis_command(c, record_cb, &flush, "SCRIPT FLUSH") == QN_OK);
    run_until(base, &flush.calls, 2000);
    CHECK_EQ_STR(flush.str, "OK");
    /* EVALSHA now answers NOSCRIPT; the client falls back to EVAL transparently. */
    CHECK(redis_eval(c, "lock_acquire", 1, keys, 2, args2, record_cb, &e2) == QN_OK);
    run_until(base, &e2.calls, 2000);
    CHECK_EQ_INT(e2.calls, 1);
    CHECK_EQ_STR(e2.err, "");
    CHECK_EQ_INT(e2.type, REDIS_REPLY_INTEGER);
    CHECK_EQ_INT(e2.integer, 0); /* held by tok-1, not by tok-2 */
    CHECK(redis_eval(c, "lock_release", 1, keys, 1, args, record_cb, &rel) == QN_OK);
    run_until(base, &rel.calls, 2000);
    CHECK_EQ_INT(rel.integer, 1);

    CHECK(redis_eval(c, "no_such_script", 0, NULL, 0, NULL, record_cb, &unknown) == QN_OK);
    CHECK_EQ_INT(unknown.calls, 0);
    run_until(base, &unknown.calls, 1000);
    run_for(base, 20);
    CHECK_EQ_INT(unknown.calls, 1);
    CHECK(!unknown.has_reply);
    CHECK_EQ_STR(unknown.err, "unknown script");

    redis_client_free(c);
    event_base_free(base);
}

static void test_reconnect_after_kill(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base, g_lua_dir, 5000);
    seen blocked = {0}, read = {0}, after = {0}, ev = {0};
    const char *keys[1] = {"quan:test:redis:guard"};
    const char *args[2] = {"0", "1000"};

    CHECK(wait_ready(base, c, 3000));
    /* In flight when the connection is killed: must fail once, not hang. On one server
     * nothing is sent again, not even a read (a cluster client's reads are: there another
     * master may answer while this one comes back). */
    CHECK(redis_command(c, record_cb, &blocked, "BLPOP quan:test:redis:empty 3") == QN_OK);
    CHECK(redis_command(c, record_cb, &read, "GET quan:test:redis:k") == QN_OK);
    run_for(base, 50);
    sync_do("CLIENT KILL TYPE normal");
    run_until(base, &read.calls, 2000);
    CHECK_EQ_INT(blocked.calls, 1);
    CHECK(!blocked.has_reply);
    CHECK(strstr(blocked.err, "outcome is unknown") != NULL);
    CHECK_EQ_INT(read.calls, 1);
    CHECK(!read.has_reply);
    CHECK_EQ_STR(read.err, "connection lost");
    CHECK(wait_ready(base, c, 3000));
    CHECK_EQ_INT(redis_client_connects(c), 2);

    CHECK(redis_command(c, record_cb, &after, "PING") == QN_OK);
    sync_do("DEL quan:test:redis:guard");
    CHECK(redis_eval(c, "consume_guard", 1, keys, 2, args, record_cb, &ev) == QN_OK);
    run_until(base, &ev.calls, 2000);
    CHECK_EQ_STR(after.str, "PONG");
    CHECK_EQ_INT(ev.calls, 1);
    CHECK_EQ_INT(ev.type, REDIS_REPLY_NIL);
    run_for(base, 20);
    CHECK_EQ_INT(blocked.calls, 1);
    CHECK_EQ_INT(after.calls, 1);
    redis_client_free(c);
    event_base_free(base);
}

/* BLPOP stands in for DEBUG SLEEP (disabled by default since Redis 7): the reply is overdue. */
static void test_command_timeout(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base, g_lua_dir, 100);
    seen slow = {0}, behind = {0}, later = {0};
    int64_t t0;

    CHECK(wait_ready(base, c, 3000));
    t0 = now_mono_ms();
    CHECK(redis_command(c, record_cb, &slow, "BLPOP quan:test:redis:empty 0.5") == QN_OK);
    CHECK(redis_command(c, record_cb, &behind, "PING") == QN_OK);
    run_until(base, &behind.calls, 2000);
    CHECK(now_mono_ms() - t0 < 400);
    CHECK_EQ_INT(slow.calls, 1);
    CHECK(!slow.has_reply);
    CHECK_EQ_STR(slow.err, "timeout");
    CHECK_EQ_INT(behind.calls, 1);
    CHECK(!behind.has_reply);
    CHECK(behind.err[0] != '\0');

    CHECK(wait_ready(base, c, 3000));
    CHECK(redis_command(c, record_cb, &later, "PING") == QN_OK);
    run_until(base, &later.calls, 2000);
    CHECK_EQ_STR(later.str, "PONG");
    run_for(base, 600); /* nothing is called twice, even when the old reply would be due */
    CHECK_EQ_INT(slow.calls, 1);
    CHECK_EQ_INT(behind.calls, 1);
    CHECK_EQ_INT(later.calls, 1);
    redis_client_free(c);
    event_base_free(base);
}

static void test_fail_fast_when_disconnected(void)
{
    struct event_base *base = event_base_new();
    redis_opts o = {.host = "127.0.0.1", .port = 1, .connect_timeout_ms = 200};
    redis_client *c = redis_client_new(base, &o);
    seen s1 = {0}, s2 = {0};
    int64_t t0 = now_mono_ms();

    CHECK(c != NULL);
    CHECK(redis_command(c, record_cb, &s1, "PING") == QN_OK);
    run_until(base, &s1.calls, 1000);
    CHECK(now_mono_ms() - t0 < 200);
    CHECK_EQ_INT(s1.calls, 1);
    CHECK_EQ_STR(s1.err, "not connected");
    run_for(base, 400); /* a few failed reconnects with backoff */
    CHECK(!redis_client_connected(c));
    CHECK_EQ_INT(redis_client_connects(c), 0);
    CHECK(redis_command(c, record_cb, &s2, "PING") == QN_OK);
    redis_client_free(c); /* a deferred failure still pending: reported at free */
    CHECK_EQ_INT(s2.calls, 1);
    CHECK_EQ_STR(s2.err, "client closed");
    event_base_free(base);
}

static void test_free_with_pending_and_max_pending(void)
{
    struct event_base *base = event_base_new();
    redis_opts o = {.host = g_host, .port = g_port, .max_pending = 2, .lua_dir = NULL};
    redis_client *c = redis_client_new(base, &o);
    seen b1 = {0}, b2 = {0}, b3 = {0};

    CHECK(wait_ready(base, c, 3000));
    CHECK(redis_command(c, record_cb, &b1, "BLPOP quan:test:redis:empty 0.8") == QN_OK);
    CHECK(redis_command(c, record_cb, &b2, "PING") == QN_OK);
    CHECK(redis_command(c, record_cb, &b3, "PING") == QN_OK);
    run_until(base, &b3.calls, 500);
    CHECK_EQ_INT(b3.calls, 1);
    CHECK_EQ_STR(b3.err, "too many pending commands");
    CHECK_EQ_INT(b1.calls + b2.calls, 0);
    redis_client_free(c);
    CHECK_EQ_INT(b1.calls, 1);
    CHECK_EQ_STR(b1.err, "client closed");
    CHECK_EQ_INT(b2.calls, 1);
    CHECK_EQ_STR(b2.err, "client closed");
    CHECK_EQ_INT(b3.calls, 1);
    event_base_free(base);
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    g_host = th_env("QUAN_REDIS_HOST");
    g_port = atoi(th_env("QUAN_REDIS_PORT"));
    g_lua_dir = lua && *lua ? lua : "lua-scripts";
    log_init("test_redis", LOGL_ERROR);

    RUN(test_scripts_sha1_matches_server);
    RUN(test_scripts_table);
    RUN(test_connect_command_ready);
    RUN(test_not_ready_until_all_scripts_load);
    RUN(test_eval_and_noscript_recovery);
    RUN(test_reconnect_after_kill);
    RUN(test_command_timeout);
    RUN(test_fail_fast_when_disconnected);
    RUN(test_free_with_pending_and_max_pending);
    TEST_MAIN_END();
}
