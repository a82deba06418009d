/* lua-scripts/dist_chunk.lua and dist_chunk_undo.lua run directly against a real Redis
 * (synchronous): the outcomes of a chunk, their replay, peek, the template's end, cache misses,
 * the give-back once per chunk, the closed record, and the users hash they count in (its
 * expiry only pushed out). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keys.h"
#include "log.h"
#include "now.h"
#include "redis.h"
#include "redis_sync.h"
#include "testhelp.h"

#define TPL_ID  424242
#define TASK_ID 77
#define TTL_MS  600000

static redis_sync *g_ctx;
static redis_scripts *g_scripts;

static void cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redis_sync_vcommand(g_ctx, fmt, ap);
    va_end(ap);
    CHECK(r && r->type != REDIS_REPLY_ERROR);
    if (r)
        freeReplyObject(r);
}

static long long get_int(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redis_sync_vcommand(g_ctx, fmt, ap);
    va_end(ap);
    long long v = -1000; /* absent */
    if (r && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r && r->type == REDIS_REPLY_STRING)
        v = atoll(r->str);
    if (r)
        freeReplyObject(r);
    return v;
}

static long long stock(void)
{
    char k[KEYS_LEN];
    keys_template(k, TPL_ID);
    return get_int("HGET %s stock", k);
}

/* The hash's generation (0: none yet): every script that raises the stock raises it. */
static long long gen(void)
{
    char k[KEYS_LEN];
    keys_template(k, TPL_ID);
    long long v = get_int("HGET %s gen", k);
    return v == -1000 ? 0 : v;
}

/* The user's count: its field in the template's users hash (-1000: none). */
static long long counter(int64_t user)
{
    char k[KEYS_LEN], f[KEYS_LEN];
    keys_template_users(k, TPL_ID);
    keys_user_field(f, user);
    return get_int("HGET %s %s", k, f);
}

/* Sets the user's count, as a claim would have. */
static void counter_set(int64_t user, long long n)
{
    char k[KEYS_LEN], f[KEYS_LEN];
    keys_template_users(k, TPL_ID);
    keys_user_field(f, user);
    cmd("HSET %s %s %lld", k, f, n);
}

/* When the users hash expires (PEXPIRETIME: -1 none, -2 no hash). */
static long long users_expire_at(void)
{
    char k[KEYS_LEN];
    keys_template_users(k, TPL_ID);
    return get_int("PEXPIRETIME %s", k);
}

/* A fresh template hash (stock, status, end in end_off ms), no counts and no task state;
 * returns the end (ms). */
static int64_t setup(long long stk, int status, int64_t end_off)
{
    char t[KEYS_LEN], seen[KEYS_LEN], users[KEYS_LEN];
    keys_template(t, TPL_ID);
    keys_task_seen(seen, TPL_ID, TASK_ID);
    keys_template_users(users, TPL_ID);
    cmd("DEL %s %s %s", t, seen, users);
    for (int n = 0; n < 8; n++) {
        char c[KEYS_LEN];
        keys_task_chunk(c, TPL_ID, TASK_ID, n);
        cmd("DEL %s", c);
    }
    int64_t end = now_wall_ms() + end_off;
    cmd("HSET %s stock %lld status %d validStartTime 0 validEndTime %lld", t, stk, status,
        (long long)end);
    return end;
}

/* dist_chunk for chunk n of users[0..m) in mode; the reply's integers in out (first = code);
 * returns how many. */
static size_t chunk(int n, const char *mode, int limit, const int64_t *users, size_t m,
                    long long *out)
{
    char keybuf[4][KEYS_LEN], argbuf[4 + 16][24];
    const char *keys[4], *args[4 + 16];
    keys_template(keybuf[0], TPL_ID);
    keys_task_chunk(keybuf[1], TPL_ID, TASK_ID, n);
    keys_task_seen(keybuf[2], TPL_ID, TASK_ID);
    keys_template_users(keybuf[3], TPL_ID);
    snprintf(argbuf[0], 24, "%" PRId64, now_wall_ms());
    snprintf(argbuf[1], 24, "%d", TTL_MS);
    snprintf(argbuf[2], 24, "%s", mode);
    snprintf(argbuf[3], 24, "%d", limit);
    for (size_t i = 0; i < m; i++)
        keys_user_field(argbuf[4 + i], users[i]);
    for (size_t i = 0; i < 4; i++)
        keys[i] = keybuf[i];
    for (size_t i = 0; i < 4 + m; i++)
        args[i] = argbuf[i];
    redisReply *r =
        redis_sync_run_script(g_ctx, g_scripts, "dist_chunk", 4, keys, (int)(4 + m), args);
    size_t k = 0;
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 1) {
        out[k++] = r->element[0]->integer;
        /* the outcomes: one string "o1,o2,..." */
        CHECK(r->elements == 1 || (r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING));
        for (const char *p = r->elements == 2 ? r->element[1]->str : ""; *p && k < 17;) {
            char *end;
            out[k++] = strtoll(p, &end, 10);
            p = *end == ',' ? end + 1 : end;
        }
    }
    if (r)
        freeReplyObject(r);
    return k;
}

static long long undo(int n, const int64_t *users, size_t m)
{
    char keybuf[3][KEYS_LEN], argbuf[8][24];
    const char *keys[3] = {keybuf[0], keybuf[1], keybuf[2]}, *args[8];
    keys_template(keybuf[0], TPL_ID);
    keys_task_chunk(keybuf[1], TPL_ID, TASK_ID, n);
    keys_template_users(keybuf[2], TPL_ID);
    for (size_t i = 0; i < m; i++) {
        keys_user_field(argbuf[i], users[i]);
        args[i] = argbuf[i];
    }
    redisReply *r =
        redis_sync_run_script(g_ctx, g_scripts, "dist_chunk_undo", 3, keys, (int)m, args);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

static void test_outcomes(void)
{
    long long o[17];
    int64_t end = setup(3, 0, 3600000);
    char k[KEYS_LEN];
    counter_set(3, 1); /* user 3 claimed once already */
    int64_t users[] = {1, 2, 1, 3, 4, 5};
    CHECK_EQ_INT(chunk(0, "run", 1, users, 6, o), 7);
    CHECK_EQ_INT(o[0], 0);
    CHECK_EQ_INT(o[1], 1);  /* issued, first coupon */
    CHECK_EQ_INT(o[2], 1);  /* issued */
    CHECK_EQ_INT(o[3], -1); /* duplicate in the file */
    CHECK_EQ_INT(o[4], -2); /* limit reached (its claim counts) */
    CHECK_EQ_INT(o[5], 1);  /* the last of the stock */
    CHECK_EQ_INT(o[6], -3); /* out of stock */
    CHECK_EQ_INT(stock(), 0);
    CHECK_EQ_INT(counter(1), 1);
    CHECK_EQ_INT(counter(3), 1);
    CHECK_EQ_INT(counter(5), -1000); /* nothing reserved for it */
    /* the counts expire with the template, as claim.lua's */
    CHECK_EQ_INT(users_expire_at(), end);
    keys_task_chunk(k, TPL_ID, TASK_ID, 0);
    CHECK(get_int("PTTL %s", k) > TTL_MS - 10000);
    keys_task_seen(k, TPL_ID, TASK_ID);
    CHECK(get_int("PTTL %s", k) > TTL_MS - 10000);
}

static void test_replay_reserves_nothing(void)
{
    long long o[17], again[17];
    setup(10, 0, 3600000);
    int64_t users[] = {1, 2, 2};
    CHECK_EQ_INT(chunk(0, "run", 1, users, 3, o), 4);
    CHECK_EQ_INT(stock(), 8);
    /* the same chunk again (a crash, a second run), even in peek mode: the same outcomes */
    CHECK_EQ_INT(chunk(0, "run", 1, users, 3, again), 4);
    CHECK_EQ_INT(again[0], 1);
    CHECK(memcmp(o + 1, again + 1, 3 * sizeof(long long)) == 0);
    CHECK_EQ_INT(chunk(0, "peek", 1, users, 3, again), 4);
    CHECK_EQ_INT(again[0], 1);
    CHECK_EQ_INT(stock(), 8);
    CHECK_EQ_INT(counter(1), 1);
    CHECK_EQ_INT(counter(2), 1);
    /* a next chunk in peek mode (a cancelled task) reserves nothing */
    int64_t next[] = {3};
    CHECK_EQ_INT(chunk(1, "peek", 1, next, 1, o), 1);
    CHECK_EQ_INT(o[0], 2);
    CHECK_EQ_INT(counter(3), -1000);
    /* users of earlier chunks are duplicates in later ones */
    int64_t later[] = {3, 1};
    CHECK_EQ_INT(chunk(1, "run", 1, later, 2, o), 3);
    CHECK(o[0] == 0 && o[1] == 1 && o[2] == -1);
}

/* A bucket's rows found out of stock run again on a record of their own once stock came
 * (mode again: the seen set neither read nor added to), or end for good (mode out). */
static void test_again_and_out(void)
{
    long long o[17];
    char k[KEYS_LEN];
    setup(1, 0, 3600000);
    int64_t users[] = {1, 2, 3};
    CHECK_EQ_INT(chunk(0, "run", 5, users, 3, o), 4);
    CHECK(o[0] == 0 && o[1] == 1 && o[2] == -3 && o[3] == -3);
    keys_template(k, TPL_ID);
    cmd("HINCRBY %s stock 1", k); /* a transfer came */
    int64_t dry[] = {2, 3};
    CHECK_EQ_INT(chunk(1, "again", 5, dry, 2, o), 3);
    CHECK(o[0] == 0 && o[1] == 1 && o[2] == -3); /* not duplicates: seen by the first pass */
    CHECK_EQ_INT(stock(), 0);
    CHECK_EQ_INT(counter(2), 1);
    CHECK_EQ_INT(chunk(1, "again", 5, dry, 2, o), 3); /* replayed */
    CHECK(o[0] == 1 && o[1] == 1 && o[2] == -3);
    int64_t last[] = {3};
    CHECK_EQ_INT(chunk(2, "out", 5, last, 1, o), 2);
    CHECK(o[0] == 0 && o[1] == -6);
    cmd("HINCRBY %s stock 5", k);
    CHECK_EQ_INT(chunk(2, "again", 5, last, 1, o), 2); /* the verdict stays */
    CHECK(o[0] == 1 && o[1] == -6);
    CHECK_EQ_INT(counter(3), -1000);
    CHECK_EQ_INT(stock(), 5);
    /* again dedups within its own rows and adds nothing to the seen set */
    int64_t twice[] = {9, 9};
    CHECK_EQ_INT(chunk(3, "again", 5, twice, 2, o), 3);
    CHECK(o[1] == 1 && o[2] == -1);
    int64_t later[] = {9};
    CHECK_EQ_INT(chunk(4, "run", 5, later, 1, o), 2);
    CHECK(o[0] == 0 && o[1] == 2);
}

static void test_limit_counts_claims(void)
{
    long long o[17];
    setup(10, 0, 3600000);
    counter_set(7, 1);
    int64_t users[] = {7, 8};
    CHECK_EQ_INT(chunk(0, "run", 2, users, 2, o), 3);
    CHECK_EQ_INT(o[1], 2); /* its second coupon: receive count 2 */
    CHECK_EQ_INT(o[2], 1);
    CHECK_EQ_INT(counter(7), 2);
}

static void test_template_ended(void)
{
    long long o[17];
    int64_t users[] = {1, 2};
    setup(10, 1, 3600000); /* terminated */
    CHECK_EQ_INT(chunk(0, "run", 1, users, 2, o), 3);
    CHECK(o[0] == 0 && o[1] == -4 && o[2] == -4);
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(counter(1), -1000);
    setup(10, 0, -1000); /* past its end */
    CHECK_EQ_INT(chunk(0, "run", 1, users, 2, o), 3);
    CHECK(o[1] == -4 && o[2] == -4);
    char k[KEYS_LEN];
    keys_task_seen(k, TPL_ID, TASK_ID);
    CHECK_EQ_INT(get_int("EXISTS %s", k), 0); /* nobody was seen */
}

static void test_cache_miss(void)
{
    long long o[17];
    int64_t users[] = {1};
    char t[KEYS_LEN], c[KEYS_LEN];
    setup(10, 0, 3600000);
    keys_template(t, TPL_ID);
    cmd("DEL %s", t);
    CHECK_EQ_INT(chunk(0, "run", 1, users, 1, o), 1);
    CHECK_EQ_INT(o[0], 3);
    cmd("HSET %s stock 5", t); /* partial */
    CHECK_EQ_INT(chunk(0, "run", 1, users, 1, o), 1);
    CHECK_EQ_INT(o[0], 3);
    keys_task_chunk(c, TPL_ID, TASK_ID, 0);
    CHECK_EQ_INT(get_int("EXISTS %s", c), 0);
    CHECK_EQ_INT(counter(1), -1000);
}

static void test_undo_once(void)
{
    long long o[17];
    setup(10, 0, 3600000);
    int64_t users[] = {1, 2, 3};
    CHECK_EQ_INT(chunk(0, "run", 1, users, 3, o), 4);
    CHECK_EQ_INT(stock(), 7);
    CHECK_EQ_INT(gen(), 0); /* taking stock makes no new generation */
    int64_t back[] = {1, 3};
    CHECK_EQ_INT(undo(0, back, 2), 2);
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(gen(), 1); /* giving it back does: the sold-out verdict's rule */
    CHECK_EQ_INT(counter(1), 0);
    CHECK_EQ_INT(counter(2), 1);
    CHECK_EQ_INT(undo(0, back, 2), -2); /* a second call gives nothing back */
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(gen(), 1);
    CHECK_EQ_INT(counter(3), 0);
    CHECK_EQ_INT(undo(5, back, 2), -1); /* no such chunk */
    CHECK_EQ_INT(stock(), 9);
    /* the replay still answers the reserved outcomes */
    CHECK_EQ_INT(chunk(0, "run", 1, users, 3, o), 4);
    CHECK(o[0] == 1 && o[1] == 1 && o[3] == 1);
}

/* A user twice in the give-back list is given back twice, and a count never goes below 0. */
static void test_undo_twice(void)
{
    long long o[17];
    setup(10, 0, 3600000);
    counter_set(5, 1); /* user 5 claimed once already */
    int64_t users[] = {5, 6};
    CHECK_EQ_INT(chunk(0, "run", 5, users, 2, o), 3);
    CHECK(o[0] == 0 && o[1] == 2 && o[2] == 1);
    CHECK_EQ_INT(stock(), 8);
    int64_t back[] = {5, 5, 6, 6};
    CHECK_EQ_INT(undo(0, back, 4), 4);
    CHECK_EQ_INT(counter(5), 0);
    CHECK_EQ_INT(counter(6), 0); /* not -1 */
    CHECK_EQ_INT(stock(), 12);   /* stock + 1 per row of the list */
}

/* The users hash expires at the template's end at the earliest, and a chunk only pushes its
 * expiry out: a later one (a claim's marker keeps the hash an hour past its claim) stays. */
static void test_users_expiry(void)
{
    long long o[17];
    int64_t end = setup(10, 0, 3600000);
    int64_t one[] = {1};
    CHECK_EQ_INT(chunk(0, "run", 1, one, 1, o), 2);
    CHECK_EQ_INT(o[1], 1);
    CHECK_EQ_INT(users_expire_at(), end);
    /* kept longer by someone else: a later chunk does not shorten it */
    char k[KEYS_LEN], t[KEYS_LEN];
    keys_template_users(k, TPL_ID);
    cmd("PEXPIREAT %s %lld", k, (long long)(end + 7200000));
    int64_t two[] = {2};
    CHECK_EQ_INT(chunk(1, "run", 1, two, 1, o), 2);
    CHECK_EQ_INT(o[1], 1);
    CHECK_EQ_INT(users_expire_at(), end + 7200000);
    /* the template's end moved past it: the next chunk pushes the expiry out to the end */
    keys_template(t, TPL_ID);
    cmd("HSET %s validEndTime %lld", t, (long long)(end + 10800000));
    int64_t three[] = {3};
    CHECK_EQ_INT(chunk(2, "run", 1, three, 1, o), 2);
    CHECK_EQ_INT(users_expire_at(), end + 10800000);
    /* moved back before it: not shortened again */
    cmd("HSET %s validEndTime %lld", t, (long long)(end + 60000));
    int64_t four[] = {4};
    CHECK_EQ_INT(chunk(3, "run", 1, four, 1, o), 2);
    CHECK_EQ_INT(o[1], 1);
    CHECK_EQ_INT(users_expire_at(), end + 10800000);
    /* a give-back keeps it */
    CHECK_EQ_INT(undo(3, four, 1), 1);
    CHECK_EQ_INT(counter(4), 0);
    CHECK_EQ_INT(users_expire_at(), end + 10800000);
}

/* claim.lua and dist_chunk.lua count in the same field: a claim's count is a chunk's start, and
 * the hour its marker keeps the hash (past a near end) is not shortened by the chunk. */
static void test_shared_with_claim(void)
{
    long long o[17];
    int64_t end = setup(10, 0, 600000); /* ends in 10 minutes */
    char t[KEYS_LEN], u[KEYS_LEN], now[24];
    keys_template(t, TPL_ID);
    keys_template_users(u, TPL_ID);
    snprintf(now, sizeof(now), "%" PRId64, now_wall_ms());
    const char *keys[] = {t, u}, *args[] = {"", "", now, "", "1", "1:r1"};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 2, keys, 6, args);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 && r->element[0]->integer == 0 &&
          r->element[1]->integer == 1);
    if (r)
        freeReplyObject(r);
    long long kept = users_expire_at();
    CHECK(kept >= end + 3000000); /* the marker's hour (end + 50 min) */
    int64_t users[] = {1, 2};
    CHECK_EQ_INT(chunk(0, "run", 2, users, 2, o), 3);
    CHECK(o[0] == 0 && o[1] == 2 && o[2] == 1);
    CHECK_EQ_INT(counter(1), 2);
    CHECK_EQ_INT(users_expire_at(), kept);
    CHECK_EQ_INT(get_int("HEXISTS %s 1:r1", u), 1); /* the marker untouched */
    CHECK_EQ_INT(chunk(1, "run", 2, (int64_t[]){3}, 1, o), 2);
    CHECK_EQ_INT(users_expire_at(), kept);
}

static void test_closed_record(void)
{
    long long o[17];
    setup(10, 0, 3600000);
    int64_t users[] = {1};
    CHECK_EQ_INT(chunk(0, "run", 1, users, 1, o), 2);
    char c[KEYS_LEN];
    keys_task_chunk(c, TPL_ID, TASK_ID, 0);
    cmd("HSET %s c 1", c); /* committed: what chunk.c writes after the checkpoint */
    cmd("HDEL %s o", c);
    CHECK_EQ_INT(chunk(0, "run", 1, users, 1, o), 1);
    CHECK_EQ_INT(o[0], 4);
    CHECK_EQ_INT(stock(), 9);
}

/* More users than one MGET / SMISMEMBER / SADD slice (4000): every 10th row repeats the row
 * before it; stock for all but the last 100 distinct users. */
static void test_large_chunk(void)
{
    enum { N = 9000 };
    static char keybuf[4][KEYS_LEN], argbuf[4 + N][24];
    static const char *keys[4], *args[4 + N];
    int distinct = 0;
    int64_t tpl_end = setup(0, 0, 3600000);
    keys_template(keybuf[0], TPL_ID);
    keys_task_chunk(keybuf[1], TPL_ID, TASK_ID, 3);
    keys_task_seen(keybuf[2], TPL_ID, TASK_ID);
    keys_template_users(keybuf[3], TPL_ID);
    snprintf(argbuf[0], 24, "%" PRId64, now_wall_ms());
    snprintf(argbuf[1], 24, "%d", TTL_MS);
    snprintf(argbuf[2], 24, "run");
    snprintf(argbuf[3], 24, "1");
    for (int i = 0; i < N; i++) {
        int64_t u = 1000000 + (i % 10 == 9 ? i - 1 : i);
        distinct += i % 10 != 9;
        keys_user_field(argbuf[4 + i], u);
    }
    for (int i = 0; i < 4; i++)
        keys[i] = keybuf[i];
    for (int i = 0; i < 4 + N; i++)
        args[i] = argbuf[i];
    char t[KEYS_LEN];
    keys_template(t, TPL_ID);
    cmd("HSET %s stock %d", t, distinct - 100);
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "dist_chunk", 4, keys, 4 + N, args);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    int issued = 0, dup = 0, sold = 0, n = 0;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2) {
        for (const char *p = r->element[1]->str; *p; n++) {
            char *end;
            long v = strtol(p, &end, 10);
            issued += v == 1;
            dup += v == -1;
            sold += v == -3;
            if (n % 10 == 9)
                CHECK(v == -1);
            p = *end == ',' ? end + 1 : end;
        }
    }
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(n, N);
    CHECK_EQ_INT(dup, N - distinct);
    CHECK_EQ_INT(issued, distinct - 100);
    CHECK_EQ_INT(sold, 100);
    CHECK_EQ_INT(stock(), 0);
    keys_task_seen(t, TPL_ID, TASK_ID);
    CHECK_EQ_INT(get_int("SCARD %s", t), distinct);
    /* every count written (more than one HSET slice), each a first coupon */
    keys_template_users(t, TPL_ID);
    CHECK_EQ_INT(get_int("HLEN %s", t), distinct - 100);
    CHECK_EQ_INT(counter(1000000), 1);
    CHECK_EQ_INT(counter(1000000 + 5000), 1); /* past the first slices */
    CHECK_EQ_INT(users_expire_at(), tpl_end); /* the counts expire at the end */
    cmd("DEL %s", t);
    keys_task_chunk(t, TPL_ID, TASK_ID, 3);
    cmd("DEL %s", t);
}

static void test_bad_arguments(void)
{
    char t[KEYS_LEN], c[KEYS_LEN], s[KEYS_LEN], u[KEYS_LEN];
    keys_template(t, TPL_ID);
    keys_task_chunk(c, TPL_ID, TASK_ID, 0);
    keys_task_seen(s, TPL_ID, TASK_ID);
    keys_template_users(u, TPL_ID);
    const char *keys[] = {t, c, s, u};
    const char *args[] = {"now", "1", "run", "1"};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "dist_chunk", 4, keys, 4, args);
    CHECK(r && r->type == REDIS_REPLY_ERROR);
    if (r)
        freeReplyObject(r);
    const char *args2[] = {"1", "1", "later", "1"};
    r = redis_sync_run_script(g_ctx, g_scripts, "dist_chunk", 4, keys, 4, args2);
    CHECK(r && r->type == REDIS_REPLY_ERROR);
    if (r)
        freeReplyObject(r);
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    const char *host = th_env("QUAN_REDIS_HOST");
    int port = atoi(th_env("QUAN_REDIS_PORT"));

    log_init("test_lua_dist", LOGL_ERROR);
    g_ctx = redis_sync_new(&(redis_sync_opts){.host = host, .port = port, .timeout_ms = 2000});
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_ctx || !g_scripts) {
        printf("  FAIL: no Redis connection or no Lua scripts\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_outcomes);
    RUN(test_replay_reserves_nothing);
    RUN(test_again_and_out);
    RUN(test_limit_counts_claims);
    RUN(test_template_ended);
    RUN(test_cache_miss);
    RUN(test_undo_once);
    RUN(test_undo_twice);
    RUN(test_users_expiry);
    RUN(test_shared_with_claim);
    RUN(test_closed_record);
    RUN(test_large_chunk);
    RUN(test_bad_arguments);
    setup(0, 0, 0);
    redis_sync_free(g_ctx);
    redis_scripts_free(g_scripts);
    TEST_MAIN_END();
}
