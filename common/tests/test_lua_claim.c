/* lua-scripts/claim.lua and claim_undo.lua run directly against a real Redis (synchronous). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claimgate.h"
#include "log.h"
#include "now.h"
#include "redis.h"
#include "redis_sync.h"
#include "testhelp.h"

#define TPL   "quan:tpl:{t-claim}"
#define USERS "quan:tpl:{t-claim}:users" /* counts and markers (keys.h) */
#define USER  "1"                        /* user 1's count field */
#define REQ   "1:r1"                     /* the marker field of user 1's request r1 */

static redis_sync *g_ctx;
static redis_scripts *g_scripts;

static long long cmd_int(const char *fmt, const char *key)
{
    redisReply *r = redis_sync_command(g_ctx, fmt, key);
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

/* A field of the users hash as a number; -1000 when absent. */
static long long hget(const char *field)
{
    redisReply *r = redis_sync_command(g_ctx, "HGET %s %s", USERS, field);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

/* The field's text ("-" when absent), in buf. */
static const char *hstr(const char *field, char *buf, size_t len)
{
    redisReply *r = redis_sync_command(g_ctx, "HGET %s %s", USERS, field);
    snprintf(buf, len, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "-");
    if (r)
        freeReplyObject(r);
    return buf;
}

static long long hexists(const char *field)
{
    redisReply *r = redis_sync_command(g_ctx, "HEXISTS %s %s", USERS, field);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

static long long stock(void)
{
    redisReply *r = redis_sync_command(g_ctx, "HGET %s stock", TPL);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

/* The hash's generation (0: none yet): every script that raises the stock raises it. */
static long long gen(void)
{
    long long v = cmd_int("HGET %s gen", TPL);
    return v == -1000 ? 0 : v;
}

/* template_stock_add.lua: the stock and the generation rise together, nothing when the hash is
 * gone. */
static long long stock_add(const char *units)
{
    const char *keys[1] = {TPL}, *args[1] = {units};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "template_stock_add", 1, keys, 1, args);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer
                  : r && r->type == REDIS_REPLY_NIL   ? -1
                                                      : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

/* The same with the caller's number of buckets. */
static long long stock_add_on(const char *units, const char *buckets)
{
    const char *keys[1] = {TPL}, *args[2] = {units, buckets};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "template_stock_add", 1, keys, 2, args);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer
                  : r && r->type == REDIS_REPLY_NIL   ? -1
                                                      : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

/* Fresh template hash of shop 77: window [now+start_off, now+end_off], given stock, status and
 * limitPerPerson (0: no receiveRule field in the JSON, so the default 1 applies). */
static void setup_limit(long long stk, int status, int64_t start_off, int64_t end_off, int limit)
{
    int64_t now = now_wall_ms();
    redisReply *r;
    char s[24], e[24];

    snprintf(s, sizeof(s), "%" PRId64, now + start_off);
    snprintf(e, sizeof(e), "%" PRId64, now + end_off);
    char rr[64];
    if (limit > 0)
        snprintf(rr, sizeof(rr), "{\"limitPerPerson\":%d,\"usageInstructions\":\"x\"}", limit);
    else
        snprintf(rr, sizeof(rr), "{}");
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s %s", TPL, USERS));
    r = redis_sync_command(g_ctx,
                           "HSET %s stock %lld status %d validStartTime %s validEndTime %s name x "
                           "shopNumber 77 receiveRule %s consumeRule {\"validityPeriod\":48}",
                           TPL, stk, status, s, e, rr);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    if (r)
        freeReplyObject(r);
}

static void setup(long long stk, int status, int64_t start_off, int64_t end_off)
{
    setup_limit(stk, status, start_off, end_off, 5);
}

static int64_t tpl_end(void)
{
    redisReply *r = redis_sync_command(g_ctx, "HGET %s validEndTime", TPL);
    int64_t v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
    if (r)
        freeReplyObject(r);
    return v;
}

/* Runs claim.lua as user 1 naming shop `shop` (with the request marker when req);
 * returns its code (claimgate_result), stores count (and the validity hours when hours). -100 on an
 * unexpected reply shape, -200 on an error reply. */
static long long claim_ex(int64_t now, const char *shop, int req, long long *count,
                          long long *hours)
{
    char n[24];
    const char *keys[2] = {TPL, USERS};
    const char *args[6] = {"", "", n, shop, USER, req ? REQ : ""};
    redisReply *r;
    long long res = -100;

    snprintf(n, sizeof(n), "%" PRId64, now);
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 2, keys, 6, args);
    *count = -1;
    claimgate_reply g;
    if (r && r->type == REDIS_REPLY_ERROR) {
        res = -200;
    } else if (claimgate_parse(r, &g) == QN_OK) { /* the engine's reader */
        res = g.code;
        *count = g.count;
        if (g.code == CLAIMGATE_OK && hours)
            *hours = g.hours;
    }
    if (r)
        freeReplyObject(r);
    return res;
}

static long long claim(int64_t now, long long *count)
{
    return claim_ex(now, "77", 0, count, NULL);
}

static long long undo_ex(int req)
{
    const char *keys[2] = {TPL, USERS}, *args[2] = {USER, req ? REQ : ""};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim_undo", 2, keys, 2, args);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

static long long undo(void)
{
    return undo_ex(0);
}

static void test_success_counts_from_one_and_pexpireat(void)
{
    long long cnt, hours = 0;
    int64_t end, now;
    long long pttl;

    setup_limit(10, 0, -1000, 60000, 2);
    end = tpl_end();
    now = now_wall_ms();
    CHECK_EQ_INT(claim_ex(now, "77", 0, &cnt, &hours), CLAIMGATE_OK);
    CHECK_EQ_INT(cnt, 1);    /* receive_count starts at 1, as in distribution */
    CHECK_EQ_INT(hours, 48); /* validityPeriod read from consumeRule in the hash */
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(hget(USER), 1);
    /* PEXPIREAT at the end of the window (not EXPIRE with a ms value: a TTL of millennia). */
    pttl = cmd_int("PTTL %s", USERS);
    CHECK(pttl > 0);
    CHECK(pttl <= end - now + 5);
    CHECK(pttl >= end - now_wall_ms() - 1000);

    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(cnt, 2);
    CHECK_EQ_INT(stock(), 8);
    CHECK(cmd_int("PTTL %s", USERS) > 50000);
}

static void test_limit_reached(void)
{
    long long cnt;

    setup_limit(10, 0, -1000, 60000, 1);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_LIMIT_REACHED);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(stock(), 9); /* untouched by the refused claim */
    CHECK_EQ_INT(hget(USER), 1);

    /* No limitPerPerson in receiveRule: the default, 1. */
    setup_limit(10, 0, -1000, 60000, 0);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_LIMIT_REACHED);
    CHECK_EQ_INT(stock(), 9);
}

/* The hash's rule numbers (template.h) are read before the rules' JSON, which is decoded only
 * when a number is missing or not a count. */
static void test_rule_numbers_before_the_json(void)
{
    long long cnt, hours = 0;
    setup_limit(10, 0, -1000, 60000, 5); /* the JSON says 5 and 48 hours */
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s limitPerPerson 2 validityHours 7", TPL));
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "77", 0, &cnt, &hours), CLAIMGATE_OK);
    CHECK_EQ_INT(hours, 7);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_LIMIT_REACHED);
    CHECK_EQ_INT(cnt, 2);
    /* one number unusable: both from the JSON */
    setup_limit(10, 0, -1000, 60000, 1);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s limitPerPerson 3 validityHours 0", TPL));
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "77", 0, &cnt, &hours), CLAIMGATE_OK);
    CHECK_EQ_INT(hours, 48);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_LIMIT_REACHED);
}

static void test_stock_exhausted(void)
{
    long long cnt;

    setup(1, 0, -1000, 60000);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(stock(), 0);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_SOLD_OUT);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(stock(), 0); /* never below zero */
    CHECK_EQ_INT(hget(USER), 1);
}

static void test_not_active(void)
{
    long long cnt;

    setup(10, 1, -1000, 60000); /* terminated: not claimable */
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_NOT_ACTIVE);
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(hexists(USER), 0);
}

static void test_outside_window(void)
{
    long long cnt;
    int64_t end;

    setup(10, 0, 10000, 60000); /* not started */
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OUTSIDE_WINDOW);
    setup(10, 0, -60000, -1000); /* ended */
    end = tpl_end();
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OUTSIDE_WINDOW);
    CHECK_EQ_INT(claim(end + 1, &cnt), CLAIMGATE_OUTSIDE_WINDOW);
    CHECK_EQ_INT(claim(end, &cnt), CLAIMGATE_OK); /* inclusive bounds */
    CHECK_EQ_INT(stock(), 9);
}

static void test_other_shop(void)
{
    long long cnt;

    setup(10, 0, -1000, 60000);
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "78", 0, &cnt, NULL),
                 CLAIMGATE_OTHER_SHOP); /* not this shop's template */
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(hexists(USER), 0);
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "", 0, &cnt, NULL),
                 CLAIMGATE_OK); /* no shop named: no check */
}

static void test_cache_missing(void)
{
    long long cnt;
    redisReply *r;

    freeReplyObject(redis_sync_command(g_ctx, "DEL %s %s", TPL, USERS));
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_CACHE_MISS);
    CHECK_EQ_INT(cnt, 0);
    CHECK_EQ_INT(cmd_int("EXISTS %s", TPL), 0); /* nothing created */
    CHECK_EQ_INT(hexists(USER), 0);

    /* A partial hash (what a bare HINCRBY creates): missing dates -> reload. */
    r = redis_sync_command(g_ctx, "HSET %s stock 5", TPL);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_CACHE_MISS);
    CHECK_EQ_INT(stock(), 5);
    /* Non-numeric stock is treated as missing, not as a Lua error. */
    setup(10, 0, -1000, 60000);
    r = redis_sync_command(g_ctx, "HSET %s stock abc", TPL);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_CACHE_MISS);
}

static void test_bad_arguments(void)
{
    long long cnt;
    setup(10, 0, -1000, 60000);
    /* A malformed rule falls back to the defaults instead of failing the claim. */
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s receiveRule {oops", TPL));
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_LIMIT_REACHED); /* default limit 1 */
    /* now must be a number */
    {
        const char *keys[2] = {TPL, USERS};
        const char *args[6] = {"", "", "x", "77", USER, ""};
        redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 2, keys, 6, args);
        CHECK(r && r->type == REDIS_REPLY_ERROR);
        if (r)
            freeReplyObject(r);
    }
    CHECK_EQ_INT(stock(), 9);
}

static void test_request_marker_claims_once(void)
{
    long long cnt;

    setup(10, 0, -1000, 60000);
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "77", 1, &cnt, NULL), CLAIMGATE_OK);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(hget(REQ), 1);
    CHECK(cmd_int("PTTL %s", USERS) > 3000000); /* the marker: at least an hour */
    /* The same request id again (a client retry): the first answer, no second claim. */
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "77", 1, &cnt, NULL), CLAIMGATE_REPEATED);
    CHECK_EQ_INT(cnt, 1);
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(hget(USER), 1);

    /* Undo with the marker gives back exactly once. */
    CHECK_EQ_INT(undo_ex(1), 10);
    CHECK_EQ_INT(undo_ex(1), -2);
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(hget(USER), 0);
    CHECK_EQ_INT(hexists(REQ), 0);
    /* ... and the request id can claim again afterwards. */
    CHECK_EQ_INT(claim_ex(now_wall_ms(), "77", 1, &cnt, NULL), CLAIMGATE_OK);
    CHECK_EQ_INT(cnt, 1);
}

static void test_undo(void)
{
    long long cnt;

    setup(3, 0, -1000, 60000);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(stock(), 1);
    CHECK_EQ_INT(gen(), 0); /* a claim lowers the stock: no new generation */
    CHECK_EQ_INT(undo(), 2);
    CHECK_EQ_INT(stock(), 2);
    CHECK_EQ_INT(gen(), 1); /* a give-back raises it: the sold-out verdict's rule */
    CHECK_EQ_INT(hget(USER), 1);
    CHECK(cmd_int("PTTL %s", USERS) > 50000); /* DECR keeps the TTL */
    CHECK_EQ_INT(undo(), 3);
    CHECK_EQ_INT(gen(), 2);
    CHECK_EQ_INT(hget(USER), 0);
    CHECK_EQ_INT(undo(), 4); /* counter stays at 0, never negative */
    CHECK_EQ_INT(hget(USER), 0);

    /* The claim slot comes back: the user can claim again. */
    CHECK_EQ_INT(claim(now_wall_ms(), &cnt), CLAIMGATE_OK);
    CHECK_EQ_INT(cnt, 1);

    /* Hash gone: -1, nothing recreated; the user's quota still comes back. */
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", TPL));
    CHECK_EQ_INT(undo(), -1);
    CHECK_EQ_INT(cmd_int("EXISTS %s", TPL), 0); /* no partial hash holding a gen either */
    CHECK_EQ_INT(hget(USER), 0);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", USERS));
}

/* Added stock (increase-number) raises the generation with the stock. */
static void test_stock_add(void)
{
    setup(3, 0, -1000, 60000);
    CHECK_EQ_INT(stock_add("5"), 8);
    CHECK_EQ_INT(stock(), 8);
    CHECK_EQ_INT(gen(), 1);
    CHECK_EQ_INT(stock_add("2"), 10);
    CHECK_EQ_INT(gen(), 2);
    /* the caller's number of buckets must be the hash's (absent: 1): one rebuilt on another
     * number since counts the units already */
    CHECK_EQ_INT(stock_add_on("1", "1"), 11);
    CHECK_EQ_INT(stock_add_on("1", "3"), -1);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s buckets 3", TPL));
    CHECK_EQ_INT(stock_add_on("1", "3"), 12);
    CHECK_EQ_INT(stock_add_on("1", "1"), -1);
    CHECK_EQ_INT(stock(), 12);
    CHECK_EQ_INT(gen(), 4);
    freeReplyObject(redis_sync_command(g_ctx, "HDEL %s buckets", TPL));
    CHECK_EQ_INT(stock_add("-2"), 10);
    CHECK_EQ_INT(gen(), 5);
    /* closed (a rebuild or a change of buckets: no stock field): the stock is not reopened */
    freeReplyObject(redis_sync_command(g_ctx, "HDEL %s stock", TPL));
    CHECK_EQ_INT(stock_add("2"), -1);
    CHECK_EQ_INT(cmd_int("HEXISTS %s stock", TPL), 0);
    CHECK_EQ_INT(gen(), 5);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", TPL));
    CHECK_EQ_INT(stock_add("2"), -1); /* gone: nothing recreated */
    CHECK_EQ_INT(cmd_int("EXISTS %s", TPL), 0);
}

#define RESV  "quan:tpl:{t-claim}:resv"
#define INDEX "quan:resv:tpls:test"

/* claim.lua with three keys (no owner index); the reply's elements into out (up to 4), the code
 * returned. */
static long long claim_resv(int64_t now, long long out[4])
{
    char n[24];
    const char *keys[3] = {TPL, USERS, RESV}, *args[6] = {"", "1", n, "77", USER, REQ};
    long long res = -100;
    snprintf(n, sizeof(n), "%" PRId64, now);
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, args);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2) {
        for (size_t i = 0; i < 4; i++)
            out[i] = i < r->elements && r->element[i]->type == REDIS_REPLY_INTEGER
                         ? r->element[i]->integer
                         : -1;
        res = out[0];
    }
    if (r)
        freeReplyObject(r);
    return res;
}

/* claim_undo.lua with the attempt's time: a late give-back of a request id's given-up attempt
 * leaves the marker, record, count and stock of the retry that reserved under the same field
 * alone (-3); the retry's own give-back, with its time, gives back once. */
static long long undo_attempt(const char *attempt)
{
    const char *keys[3] = {TPL, USERS, RESV}, *args[3] = {USER, REQ, attempt};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim_undo", 3, keys, 3, args);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

static void test_undo_of_another_attempt(void)
{
    long long out[4];
    int64_t now = now_wall_ms();
    char first[24], retry[24];

    setup(10, 0, -1000, 60000);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", RESV));
    snprintf(first, sizeof(first), "%" PRId64, now - 20000);
    snprintf(retry, sizeof(retry), "%" PRId64, now);
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_OK); /* the retry's reservation */
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(undo_attempt(first), -3); /* the first attempt's, late */
    CHECK_EQ_INT(stock(), 9);
    CHECK_EQ_INT(gen(), 0); /* nothing given back: no new generation */
    CHECK_EQ_INT(hget(USER), 1);
    CHECK_EQ_INT(cmd_int("ZSCORE %s 1:r1", RESV), now);
    CHECK_EQ_INT(undo_attempt(retry), 10); /* the retry's own */
    CHECK_EQ_INT(hget(USER), 0);
    CHECK_EQ_INT(cmd_int("EXISTS %s", RESV), 0);
    CHECK_EQ_INT(undo_attempt(retry), -2); /* once */
    CHECK_EQ_INT(stock(), 10);
    CHECK_EQ_INT(gen(), 1);
    /* a marker that kept no time is given back whatever the time asked */
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_OK);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s %s 1", USERS, REQ));
    CHECK_EQ_INT(undo_attempt(first), 10);
}

/* The reservation's record: claim.lua adds it (score = the reservation's time, also in the
 * marker, which a repeated request reads back); claim_undo.lua removes it; resv_prune.lua drops
 * an index entry only while it is older than the cutoff. */
static void test_reservation_record(void)
{
    long long out[4];
    int64_t now = now_wall_ms();
    char marker[48];

    setup(10, 0, -1000, 60000);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", RESV)); /* two slots: two commands */
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", INDEX));
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_OK);
    CHECK_EQ_INT(cmd_int("ZSCORE %s 1:r1", RESV), now);
    /* It lives a day past the reservation's keep (here an hour from now, past the end). */
    CHECK_EQ_INT(cmd_int("PEXPIRETIME %s", RESV), now + 3600000 + 86400000);
    redisReply *r = redis_sync_command(g_ctx, "HGET %s %s", USERS, REQ);
    snprintf(marker, sizeof(marker), "1:%" PRId64, now);
    CHECK(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, marker) == 0);
    if (r)
        freeReplyObject(r);
    /* The marker is kept that hour (the end is sooner): the users' hash lives that long. */
    CHECK_EQ_INT(cmd_int("PEXPIRETIME %s", USERS), now + 3600000);
    /* A retry of the request: the count and the time of the reservation it made. */
    CHECK_EQ_INT(claim_resv(now + 5000, out), CLAIMGATE_REPEATED);
    CHECK_EQ_INT(out[1], 1);
    CHECK_EQ_INT(out[2], now);
    CHECK_EQ_INT(cmd_int("ZSCORE %s 1:r1", RESV), now); /* not moved by the retry */
    CHECK_EQ_INT(stock(), 9);

    const char *ukeys[3] = {TPL, USERS, RESV}, *uargs[2] = {USER, REQ};
    r = redis_sync_run_script(g_ctx, g_scripts, "claim_undo", 3, ukeys, 2, uargs);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 10);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(cmd_int("EXISTS %s", RESV), 0);
    CHECK_EQ_INT(hget(USER), 0);

    /* A marker written before the time was kept in it reads as time 0. */
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s %s 1", USERS, REQ));
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_REPEATED);
    CHECK_EQ_INT(out[2], 0);
    freeReplyObject(redis_sync_command(g_ctx, "HDEL %s %s", USERS, REQ));

    /* resv_prune.lua */
    freeReplyObject(redis_sync_command(g_ctx, "ZADD %s 1000 7:77", INDEX));
    const char *pkeys[1] = {INDEX}, *early[2] = {"7:77", "500"}, *late[2] = {"7:77", "2000"};
    r = redis_sync_run_script(g_ctx, g_scripts, "resv_prune", 1, pkeys, 2, early);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0); /* touched since the cutoff */
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(cmd_int("ZSCORE %s 7:77", INDEX), 1000);
    r = redis_sync_run_script(g_ctx, g_scripts, "resv_prune", 1, pkeys, 2, late);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    if (r)
        freeReplyObject(r);
    CHECK_EQ_INT(cmd_int("EXISTS %s", INDEX), 0);

    /* The expiry is written only when that moves it later, never earlier. */
    setup(10, 0, -1000, 60000);
    long long far = (long long)now + 400LL * 86400000;
    freeReplyObject(redis_sync_command(g_ctx, "ZADD %s 1 0:r0", RESV));
    freeReplyObject(redis_sync_command(g_ctx, "PEXPIREAT %s %lld", RESV, far));
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s 0 1", USERS));
    freeReplyObject(redis_sync_command(g_ctx, "PEXPIREAT %s %lld", USERS, far));
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_OK);
    CHECK_EQ_INT(cmd_int("PEXPIRETIME %s", RESV), far);
    CHECK_EQ_INT(cmd_int("PEXPIRETIME %s", USERS), far);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", RESV));

    /* An end more than an hour away: the counts and markers are kept until then. */
    setup(10, 0, -1000, 7200000);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", RESV));
    CHECK_EQ_INT(claim_resv(now, out), CLAIMGATE_OK);
    CHECK_EQ_INT(cmd_int("PEXPIRETIME %s", USERS), tpl_end());
    CHECK_EQ_INT(cmd_int("ZSCORE %s 1:r1", RESV), now);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", RESV));
}

/* Deletes the test template's per-user keys (counters, markers) and records, so that a test
 * starts from the same state on a Redis an earlier run used. */
static void clear_claims(void)
{
    redisReply *r = redis_sync_command(g_ctx, "KEYS quan:tpl:{t-claim}:*");
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        if (strcmp(r->element[i]->str, TPL) != 0)
            freeReplyObject(redis_sync_command(g_ctx, "DEL %s", r->element[i]->str));
    if (r)
        freeReplyObject(r);
}

/* claim.lua with all three keys as user u (requestId rid), owner "host:1/run"; the code. */
static long long claim_as(const char *u, const char *rid)
{
    char n[24], member[64];
    snprintf(n, sizeof(n), "%" PRId64, now_wall_ms());
    snprintf(member, sizeof(member), "%s:%s", u, rid);
    const char *keys[3] = {TPL, USERS, RESV};
    const char *args[6] = {"host:1/run", "", n, "77", u, member};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, args);
    long long res = r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
                            r->element[0]->type == REDIS_REPLY_INTEGER
                        ? r->element[0]->integer
                        : -100;
    if (r)
        freeReplyObject(r);
    return res;
}

/* Settles user u's claim rid: "end" (its coupon committed: the record's ZREM, as the engine
 * sends it) or "undo" (given back: claim_undo.lua); the integer answer. */
static long long settle_as(const char *how, const char *u, const char *rid)
{
    char member[64];
    snprintf(member, sizeof(member), "%s:%s", u, rid);
    const char *ukeys[3] = {TPL, USERS, RESV};
    const char *uargs[2] = {u, member};
    redisReply *r = !strcmp(how, "end")
                        ? redis_sync_command(g_ctx, "ZREM %s %s", RESV, member)
                        : redis_sync_run_script(g_ctx, g_scripts, "claim_undo", 3, ukeys, 2, uargs);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

/* A refusal only on a settled fact: no stock while reservations not settled hold some is "in
 * doubt", and so is the limit reached only with the user's own unsettled claims. One sale of
 * stock 2, limit 1, step by step: who claims or settles what, and what claim.lua answers. */
static void test_in_doubt(void)
{
    static const struct {
        const char *op, *user, *rid; /* op: "claim", "end", "undo" */
        long long want;              /* claim: the code; end/undo: the script's answer */
    } steps[] = {
        {"claim", "1", "r1", CLAIMGATE_OK},             /* stock 2 -> 1, 1 in flight */
        {"claim", "1", "r2", CLAIMGATE_LIMIT_IN_DOUBT}, /* 1's only claim may fail */
        {"claim", "11", "r1", CLAIMGATE_OK},            /* stock 1 -> 0 */
        {"claim", "2", "r1", CLAIMGATE_STOCK_IN_DOUBT}, /* two units held, not settled */
        {"end", "11", "r1", 1},                         /* 11's coupon committed */
        {"end", "11", "r1", 0},                         /* once */
        {"claim", "2", "r2", CLAIMGATE_STOCK_IN_DOUBT}, /* 1's unit may still come back */
        {"undo", "1", "r1", 1},                         /* it does: stock 0 -> 1 */
        {"claim", "11", "r2", CLAIMGATE_LIMIT_REACHED}, /* settled: 11 holds its coupon */
        {"claim", "1", "r3", CLAIMGATE_OK},             /* 1 again; stock 1 -> 0 */
        {"end", "1", "r3", 1},
        {"claim", "1", "r4", CLAIMGATE_SOLD_OUT}, /* nothing held: final */
        {"claim", "2", "r3", CLAIMGATE_SOLD_OUT},
    };
    setup_limit(2, 0, -1000, 60000, 1);
    clear_claims();
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        long long got = !strcmp(steps[i].op, "claim")
                            ? claim_as(steps[i].user, steps[i].rid)
                            : settle_as(steps[i].op, steps[i].user, steps[i].rid);
        if (got != steps[i].want)
            printf("  step %zu: %s %s %s: got %lld, want %lld\n", i, steps[i].op, steps[i].user,
                   steps[i].rid, got, steps[i].want);
        CHECK_EQ_INT(got, steps[i].want);
    }
    /* Every record went with its settling. A user's list of open request ids keeps the settled
     * ones until a claim of the user at the limit reads it: 11's was read (and is gone), 1's
     * not since its claims settled (sold out is answered first). */
    char buf[64];
    CHECK_EQ_INT(cmd_int("EXISTS %s", RESV), 0);
    CHECK_EQ_INT(hexists("11#") + hexists("2#"), 0);
    CHECK_EQ_STR(hstr("1#", buf, sizeof(buf)), ",r1,r3");
    CHECK_EQ_INT(stock(), 0);
}

/* The marker carries the owner (the sweeper reads it there), and the user's list names each
 * record's request id once; settling writes nothing there, and a claim at the limit keeps only
 * the ids whose records are still open (in doubt while one is), or drops the list. A list in
 * another format (a count, as an older version wrote) is found again from the records. */
static void test_owner_recorded(void)
{
    char buf[64];
    setup_limit(10, 0, -1000, 60000, 3);
    clear_claims();
    CHECK_EQ_INT(claim_as("7", "x.1"), CLAIMGATE_OK);
    CHECK_EQ_INT(claim_as("7", "x.2"), CLAIMGATE_OK);
    redisReply *r = redis_sync_command(g_ctx, "HGET %s 7:x.1", USERS);
    const char *tail = r && r->type == REDIS_REPLY_STRING ? strchr(r->str, ':') : NULL;
    CHECK(tail && !strncmp(r->str, "1:", 2) && (tail = strchr(tail + 1, ':')) &&
          !strcmp(tail, ":host:1/run"));
    if (r)
        freeReplyObject(r);
    CHECK_EQ_STR(hstr("7#", buf, sizeof(buf)), ",x.1,x.2");
    CHECK_EQ_INT(settle_as("undo", "7", "x.1"), 9);  /* the stock, given back: 8 -> 9 */
    CHECK_EQ_INT(settle_as("undo", "7", "x.1"), -2); /* once */
    CHECK_EQ_INT(settle_as("end", "7", "x.2"), 1);
    CHECK_EQ_INT(settle_as("end", "7", "x.2"), 0);
    CHECK_EQ_STR(hstr("7#", buf, sizeof(buf)), ",x.1,x.2"); /* settling wrote nothing here */
    CHECK_EQ_INT(claim_as("7", "x.3"), CLAIMGATE_OK);       /* count 2 after the undo: 3 */
    CHECK_EQ_INT(claim_as("7", "x.4"), CLAIMGATE_OK);
    CHECK_EQ_STR(hstr("7#", buf, sizeof(buf)), ",x.1,x.2,x.3,x.4");
    CHECK_EQ_INT(settle_as("end", "7", "x.3"), 1);
    /* at the limit (3): x.4 is open, so in doubt; the list keeps x.4 alone */
    CHECK_EQ_INT(claim_as("7", "x.5"), CLAIMGATE_LIMIT_IN_DOUBT);
    CHECK_EQ_STR(hstr("7#", buf, sizeof(buf)), ",x.4");
    CHECK_EQ_INT(settle_as("end", "7", "x.4"), 1);
    CHECK_EQ_INT(claim_as("7", "x.5"), CLAIMGATE_LIMIT_REACHED); /* settled: final */
    CHECK_EQ_INT(hexists("7#"), 0);
    CHECK_EQ_INT(claim_as("7", "x.6"), CLAIMGATE_LIMIT_REACHED); /* no list: nothing read */
    /* An older count in the field: the user's records are scanned for, and the list written. */
    CHECK_EQ_INT(claim_as("9", "z.1"), CLAIMGATE_OK);
    CHECK_EQ_INT(claim_as("9", "z.2"), CLAIMGATE_OK);
    CHECK_EQ_INT(claim_as("9", "z.3"), CLAIMGATE_OK);
    CHECK_EQ_INT(settle_as("end", "9", "z.1"), 1);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s 9# 2", USERS));
    CHECK_EQ_INT(claim_as("9", "z.4"), CLAIMGATE_LIMIT_IN_DOUBT);
    CHECK_EQ_STR(hstr("9#", buf, sizeof(buf)), ",z.2,z.3");
    /* A users hash gone (expired) while a record is open: ending the record makes no hash. */
    CHECK_EQ_INT(claim_as("8", "y.1"), CLAIMGATE_OK);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", USERS));
    CHECK_EQ_INT(settle_as("end", "8", "y.1"), 1);
    CHECK_EQ_INT(cmd_int("EXISTS %s", USERS), 0);
}

/* A high limit: the list drops its settled ids before it grows past a few hundred bytes. */
static void test_long_list_is_pruned(void)
{
    char rid[24];
    setup_limit(200, 0, -1000, 60000, 100);
    clear_claims();
    for (int i = 0; i < 60; i++) {
        snprintf(rid, sizeof(rid), "long.%d", i);
        CHECK_EQ_INT(claim_as("5", rid), CLAIMGATE_OK);
        if (i != 59)
            CHECK_EQ_INT(settle_as("end", "5", rid), 1);
    }
    redisReply *r = redis_sync_command(g_ctx, "HSTRLEN %s 5#", USERS);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 && r->integer <= 256 + 16);
    if (r)
        freeReplyObject(r);
}

/* Claims of one template in one call (the engine's loop turn): each answered exactly as if it
 * were called alone, in order. The same claims are run one call each, then all in one call,
 * from the same start; the answers and what is left in Redis must be the same. */
#define BATCH_N 7
static void batch_run(int batched, long long codes[BATCH_N], long long state[5])
{
    static const char *const who[BATCH_N][2] = {
        {"1", "r1"}, {"1", "r1"}, {"1", "r2"}, {"2", "r1"}, {"3", "r1"}, {"2", "r1"}, {"4", "r1"},
    };
    char now[BATCH_N][24], member[BATCH_N][64];
    const char *keys[3] = {TPL, USERS, RESV}, *args[2 + 4 * BATCH_N];
    int64_t t0 = now_wall_ms();
    setup_limit(2, 0, -1000, 7200000, 1);
    clear_claims();
    for (int i = 0; i < BATCH_N; i++) {
        snprintf(now[i], sizeof(now[i]), "%" PRId64, t0 + i);
        snprintf(member[i], sizeof(member[i]), "%s:%s", who[i][0], who[i][1]);
        codes[i] = -100;
    }
    for (int i = 0; i < BATCH_N; i++) {
        int na = 0;
        args[na++] = "host:1/run";
        args[na++] = "1";
        for (int k = i; k < BATCH_N && (k == i || batched); k++) {
            args[na++] = now[k], args[na++] = "77", args[na++] = who[k][0];
            args[na++] = member[k];
        }
        redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, na, args);
        int n = batched ? BATCH_N : 1;
        for (int k = 0; k < n; k++) {
            const redisReply *one = !r || r->type != REDIS_REPLY_ARRAY ? NULL
                                    : batched ? (size_t)k < r->elements ? r->element[k] : NULL
                                              : r;
            if (one && one->type == REDIS_REPLY_ARRAY && one->elements >= 2 &&
                one->element[0]->type == REDIS_REPLY_INTEGER)
                codes[i + k] = one->element[0]->integer;
        }
        if (r)
            freeReplyObject(r);
        if (batched)
            break;
    }
    state[0] = stock();
    state[1] = cmd_int("ZCARD %s", RESV);
    char l1[64], l2[64];
    /* the users' lists: ids listed, 1's and 2's */
    state[2] = (long long)strlen(hstr("1#", l1, sizeof(l1))) * 100 +
               (long long)strlen(hstr("2#", l2, sizeof(l2)));
    state[3] = cmd_int("PEXPIRETIME %s", RESV) - tpl_end(); /* each run has its own end */
    state[4] = hget("1") * 10 + hget("2");
}

static void test_batch_is_each_in_turn(void)
{
    static const long long want[BATCH_N] = {
        CLAIMGATE_OK,             /* 1: stock 2 -> 1 */
        CLAIMGATE_REPEATED,       /* the same request again */
        CLAIMGATE_LIMIT_IN_DOUBT, /* 1's only claim is not settled */
        CLAIMGATE_OK,             /* 2: stock 1 -> 0 */
        CLAIMGATE_STOCK_IN_DOUBT, /* both units held, not settled */
        CLAIMGATE_REPEATED,       /* 2's request again */
        CLAIMGATE_STOCK_IN_DOUBT,
    };
    long long alone[BATCH_N], together[BATCH_N], s_alone[5], s_together[5];
    batch_run(0, alone, s_alone);
    batch_run(1, together, s_together);
    for (int i = 0; i < BATCH_N; i++) {
        CHECK_EQ_INT(alone[i], want[i]);
        CHECK_EQ_INT(together[i], want[i]);
    }
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(s_together[i], s_alone[i]);
    CHECK_EQ_INT(s_together[0], 0);        /* stock */
    CHECK_EQ_INT(s_together[1], 2);        /* two records */
    CHECK_EQ_INT(s_together[2], 303);      /* ",r1" each for 1 and 2 */
    CHECK_EQ_INT(s_together[4], 11);       /* 1 and 2 counted once each */
    CHECK_EQ_INT(s_together[3], 86400000); /* the records' set: a day past the end */

    /* A batch's shape is checked: a claim without all four of its arguments is an error, and
     * so is a user id that is not one (its count field would read as a marker's). */
    const char *keys[3] = {TPL, USERS, RESV};
    const char *args[9] = {"o", "", "1", "77", "1", "1:r1", "2", "77", "2"};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 9, args);
    CHECK(r && r->type == REDIS_REPLY_ERROR);
    if (r)
        freeReplyObject(r);
    const char *bad[6] = {"o", "", "1", "77", "1:x", "1:x:r1"};
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, bad);
    CHECK(r && r->type == REDIS_REPLY_ERROR);
    if (r)
        freeReplyObject(r);
    clear_claims();
}

/* The caller's number of buckets must be the hash's ("buckets", absent: 1): a claim routed by
 * another number answers {10, n} for every claim of the call and writes nothing, for its user's
 * home bucket is another one (bucket.h); routed by n, it claims. */
static void test_wrong_buckets(void)
{
    char now[24];
    const char *keys[3] = {TPL, USERS, RESV};
    setup_limit(5, 0, -1000, 7200000, 1);
    clear_claims();
    snprintf(now, sizeof(now), "%" PRId64, now_wall_ms());
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s buckets 3", TPL));
    const char *one[6] = {"host:1/run", "", now, "77", "1", "1:r1"};
    const char *two[10] = {"host:1/run", "1", now, "77", "1", "1:r1", now, "77", "2", "2:r1"};
    const char *right[6] = {"host:1/run", "3", now, "77", "1", "1:r1"};
    redisReply *r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, one);
    claimgate_reply g;
    CHECK(claimgate_parse(r, &g) == QN_OK && g.code == CLAIMGATE_WRONG_BUCKETS && g.count == 3);
    freeReplyObject(r);
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 10, two);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        CHECK(claimgate_parse(r->element[i], &g) == QN_OK && g.code == CLAIMGATE_WRONG_BUCKETS &&
              g.count == 3);
    freeReplyObject(r);
    CHECK_EQ_INT(stock(), 5); /* nothing written */
    CHECK_EQ_INT(cmd_int("EXISTS %s", USERS), 0);
    CHECK_EQ_INT(cmd_int("ZCARD %s", RESV), 0);
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, right);
    CHECK(claimgate_parse(r, &g) == QN_OK && g.code == CLAIMGATE_OK);
    freeReplyObject(r);
    CHECK_EQ_INT(stock(), 4);
    /* a hash of one bucket and a caller of "" or "1": as always */
    freeReplyObject(redis_sync_command(g_ctx, "HDEL %s buckets", TPL));
    const char *again[6] = {"host:1/run", "1", now, "77", "2", "2:r1"};
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, again);
    CHECK(claimgate_parse(r, &g) == QN_OK && g.code == CLAIMGATE_OK);
    freeReplyObject(r);
    /* a bucket's hash missing (or holding no template: a rebuild's mark) is not cached, whatever
     * the caller routed by: load it, not route again by a number the hash does not hold */
    const char *fresh[6] = {"host:1/run", "3", now, "77", "3", "3:r1"};
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", TPL));
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, fresh);
    CHECK(claimgate_parse(r, &g) == QN_OK && g.code == CLAIMGATE_CACHE_MISS);
    freeReplyObject(r);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s rebuilding 1", TPL));
    r = redis_sync_run_script(g_ctx, g_scripts, "claim", 3, keys, 6, fresh);
    CHECK(claimgate_parse(r, &g) == QN_OK && g.code == CLAIMGATE_CACHE_MISS);
    freeReplyObject(r);
    clear_claims();
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    const char *host = th_env("QUAN_REDIS_HOST");
    int port = atoi(th_env("QUAN_REDIS_PORT"));

    log_init("test_lua_claim", LOGL_ERROR);
    g_ctx = redis_sync_new(&(redis_sync_opts){.host = host, .port = port, .timeout_ms = 2000});
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_ctx || !g_scripts) {
        printf("  FAIL: no Redis connection or no Lua scripts\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_success_counts_from_one_and_pexpireat);
    RUN(test_limit_reached);
    RUN(test_rule_numbers_before_the_json);
    RUN(test_stock_exhausted);
    RUN(test_not_active);
    RUN(test_outside_window);
    RUN(test_other_shop);
    RUN(test_cache_missing);
    RUN(test_bad_arguments);
    RUN(test_request_marker_claims_once);
    RUN(test_undo);
    RUN(test_stock_add);
    RUN(test_reservation_record);
    RUN(test_undo_of_another_attempt);
    RUN(test_in_doubt);
    RUN(test_owner_recorded);
    RUN(test_long_list_is_pruned);
    RUN(test_batch_is_each_in_turn);
    RUN(test_wrong_buckets);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s %s %s", TPL, USER, REQ));
    redis_scripts_free(g_scripts);
    redis_sync_free(g_ctx);
    TEST_MAIN_END();
}
