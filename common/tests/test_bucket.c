/* Stock buckets (common/coupon/bucket.h): the layout's pure parts, then the transfer scripts
 * and the sold-out verdict against a real Redis, crashes between steps and a sale run by
 * threads whose users mostly share one bucket. */
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "claimgate.h"
#include "log.h"
#include "now.h"
#include "redis_sync.h"
#include "rslot.h"
#include "testhelp.h"

static const char *g_host, *g_lua;
static int g_port;
static redis_sync *g_ctx;
static redis_scripts *g_scripts;

/* ---- pure ---- */

static void test_home_spreads_users(void)
{
    /* sequential ids, ids stepping by n, and generator-like ids stepping by 4096 */
    const int64_t steps[3] = {1, 3, 4096};
    for (int s = 0; s < 3; s++) {
        int count[3] = {0};
        for (int64_t i = 0; i < 30000; i++)
            count[bucket_home(1000000 + i * steps[s], 3)]++;
        for (int b = 0; b < 3; b++)
            CHECK(count[b] > 9700 && count[b] < 10300);
    }
    CHECK_EQ_INT(bucket_home(12345, 1), 0);
    CHECK_EQ_INT(bucket_home(12345, 0), 0);
    CHECK_EQ_INT(bucket_home(777, 5), bucket_home(777, 5)); /* every process alike */
}

static void test_tags_fall_on_different_slices(void)
{
    for (int64_t tpl_id = 1; tpl_id <= 300; tpl_id++) {
        for (int n = 2; n <= 8; n += 3) {
            int seen[8] = {0};
            for (int b = 0; b < n; b++) {
                char tag[KEYS_LEN];
                bucket_tag(tag, tpl_id, b, n);
                int slice = (int)((int64_t)rslot_of_key(tag, strlen(tag)) * n / RSLOT_COUNT);
                CHECK(!seen[slice]);
                seen[slice] = 1;
            }
        }
    }
    bucket_keys k;
    char want[KEYS_LEN];
    bucket_keys_of(&k, 42, 0, 3); /* bucket 0 is the template's own keys */
    keys_template(want, 42);
    CHECK_EQ_STR(k.hash, want);
    keys_template_users(want, 42);
    CHECK_EQ_STR(k.users, want);
    keys_template_resv(want, 42);
    CHECK_EQ_STR(k.resv, want);
    bucket_keys_of(&k, 42, 2, 3);
    CHECK(strncmp(k.hash, "quan:bkt:{42.2.", 15) == 0);
    size_t len = strlen(k.hash);
    CHECK(strncmp(k.users, k.hash, len) == 0 && strcmp(k.users + len, ":users") == 0);
    CHECK(strncmp(k.resv, k.hash, len) == 0 && strcmp(k.resv + len, ":resv") == 0);
}

static void test_shares_add_up(void)
{
    for (int64_t stock = 0; stock < 50; stock++)
        for (int n = 1; n <= 7; n++) {
            int64_t sum = 0, lo = INT64_MAX, hi = 0;
            for (int b = 0; b < n; b++) {
                int64_t s = bucket_share(stock, b, n);
                sum += s;
                lo = s < lo ? s : lo;
                hi = s > hi ? s : hi;
            }
            CHECK_EQ_INT(sum, stock);
            CHECK(hi - lo <= 1);
        }
    /* a repair's negative figure (more taken than there was) sums back too */
    for (int64_t stock = -9; stock < 0; stock++)
        for (int n = 1; n <= 7; n++) {
            int64_t sum = 0;
            for (int b = 0; b < n; b++)
                sum += bucket_share(stock, b, n);
            CHECK_EQ_INT(sum, stock);
        }
}

static void test_verdict(void)
{
    bucket_look a[3], b[3];
    memset(a, 0, sizeof(a));
    memset(b, 0, sizeof(b));
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_SOLD_OUT);
    b[1].stock = 1; /* came back */
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_HAS_STOCK);
    b[1].stock = 0;
    b[2].gen = 1; /* rose and fell between the looks */
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_IN_DOUBT);
    b[2].gen = 0;
    a[0].open = 1; /* a reservation may be given back */
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_IN_DOUBT);
    a[0].open = 0;
    b[0].xo = 1; /* units on their way */
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_IN_DOUBT);
    b[0].xo = 0;
    a[2].missing = 1; /* not known */
    CHECK_EQ_INT(bucket_verdict(a, b, 3), BUCKET_IN_DOUBT);
}

/* ---- against Redis ---- */

#define TPL 9100001

static long long hget_int(const char *key, const char *field)
{
    redisReply *r = redis_sync_command(g_ctx, "HGET %s %s", key, field);
    long long v = r && r->type == REDIS_REPLY_STRING ? atoll(r->str) : -1000;
    if (r)
        freeReplyObject(r);
    return v;
}

static long long bucket_stock(int b, int n)
{
    bucket_keys k;
    bucket_keys_of(&k, TPL, b, n);
    return hget_int(k.hash, "stock");
}

/* Every bucket's stock plus the units on their way: what the template holds. */
static long long held(int n)
{
    long long sum = 0;
    for (int b = 0; b < n; b++) {
        bucket_keys k;
        bucket_keys_of(&k, TPL, b, n);
        sum += hget_int(k.hash, "stock");
        redisReply *r = redis_sync_command(g_ctx, "HGETALL %s", k.hash);
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2)
            if (strncmp(r->element[i]->str, "xo:", 3) == 0)
                sum += atoll(r->element[i + 1]->str);
        if (r)
            freeReplyObject(r);
    }
    return sum;
}

/* A template of n buckets holding the given stocks, limit one a user, open an hour. */
static void setup(int n, const long long *stocks)
{
    char s[24], e[24];
    snprintf(s, sizeof(s), "%" PRId64, now_wall_ms() - 1000);
    snprintf(e, sizeof(e), "%" PRId64, now_wall_ms() + 3600000);
    for (int b = 0; b < n; b++) {
        bucket_keys k;
        bucket_keys_of(&k, TPL, b, n);
        freeReplyObject(redis_sync_command(g_ctx, "DEL %s %s %s", k.hash, k.users, k.resv));
        redisReply *r = redis_sync_command(
            g_ctx,
            "HSET %s stock %lld status 0 validStartTime %s validEndTime %s shopNumber 77 "
            "limitPerPerson 1 validityHours 24 buckets %d",
            k.hash, stocks[b], s, e, n);
        CHECK(r && r->type == REDIS_REPLY_INTEGER);
        if (r)
            freeReplyObject(r);
    }
}

/* claim.lua for user at its home among n buckets, recording the reservation under request
 * id rid when given; returns the code. */
static int claim_at_home(redis_sync *rs, const redis_scripts *s, int64_t user, int n,
                         const char *rid)
{
    char member[KEYS_LEN] = "";
    if (rid)
        keys_resv_member(member, user, rid);
    return bucket_claim_sync(rs, s, TPL, n, user, "77", member);
}

/* A user whose home is b among n. */
static int64_t user_in(int b, int n, int64_t from)
{
    while (bucket_home(from, n) != b)
        from++;
    return from;
}

static void test_claim_runs_on_a_bucket(void)
{
    const long long stocks[3] = {1, 1, 1};
    setup(3, stocks);
    int64_t u = user_in(2, 3, 5000);
    CHECK_EQ_INT(claim_at_home(g_ctx, g_scripts, u, 3, NULL), CLAIMGATE_OK);
    CHECK_EQ_INT(bucket_stock(2, 3), 0);
    CHECK_EQ_INT(bucket_stock(0, 3) + bucket_stock(1, 3), 2);
    /* the home is dry: its own answer is "sold out" (the script looks at the stock before the
     * limit), which the engine must not pass on: stock comes, and the limit answers */
    CHECK_EQ_INT(claim_at_home(g_ctx, g_scripts, u, 3, NULL), CLAIMGATE_SOLD_OUT);
    CHECK_EQ_INT(claim_at_home(g_ctx, g_scripts, user_in(2, 3, u + 1), 3, NULL),
                 CLAIMGATE_SOLD_OUT);
    bucket_verdict_t v;
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 2, "c1", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_HAS_STOCK);
    CHECK_EQ_INT(claim_at_home(g_ctx, g_scripts, u, 3, NULL), CLAIMGATE_LIMIT_REACHED);
    CHECK_EQ_INT(bucket_stock(2, 3), 1);
}

static void test_transfer_moves_half_once(void)
{
    const long long stocks[3] = {0, 9, 0};
    setup(3, stocks);
    int64_t moved = -1;
    CHECK(bucket_transfer_sync(g_ctx, g_scripts, TPL, 3, 1, 0, 1000, "x1", &moved) == QN_OK);
    CHECK_EQ_INT(moved, 5); /* half of 9, rounded up */
    CHECK_EQ_INT(bucket_stock(0, 3), 5);
    CHECK_EQ_INT(bucket_stock(1, 3), 4);
    /* the same transfer again (a retry): nothing moves twice */
    CHECK(bucket_transfer_sync(g_ctx, g_scripts, TPL, 3, 1, 0, 1000, "x1", &moved) == QN_OK);
    CHECK_EQ_INT(bucket_stock(0, 3), 5);
    CHECK_EQ_INT(bucket_stock(1, 3), 4);
    CHECK_EQ_INT(held(3), 9);
    bucket_keys k;
    bucket_keys_of(&k, TPL, 1, 3);
    CHECK_EQ_INT(hget_int(k.hash, "xo"), 0);
}

/* Runs bucket_give.lua alone: a process that died right after it. */
static int64_t give_only(int from, int to, const char *xid)
{
    bucket_keys k;
    char h[8], t[24];
    bucket_keys_of(&k, TPL, from, 3);
    snprintf(h, sizeof(h), "%d", to);
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms() - 60000); /* a minute ago */
    const char *keys[2] = {k.hash, k.resv};
    const char *args[4] = {xid, "1000", h, t};
    redisReply *r = REDIS_SYNC_SCRIPT(g_ctx, g_scripts, bucket_give, keys, args);
    bucket_look l;
    int64_t given = bucket_look_parse(r, &l) == QN_OK ? l.given : -1;
    if (r)
        freeReplyObject(r);
    return given;
}

static void test_crash_between_steps_loses_nothing(void)
{
    const long long stocks[3] = {0, 8, 6};
    int finished;
    bucket_verdict_t v;
    setup(3, stocks);
    /* died after the give: the units are on their way, so nobody is told "sold out" */
    CHECK_EQ_INT(give_only(1, 0, "dead1"), 4);
    CHECK_EQ_INT(held(3), 14);
    CHECK_EQ_INT(bucket_stock(0, 3) + bucket_stock(1, 3) + bucket_stock(2, 3), 10);
    /* whoever comes next finishes it: once, however many times it is asked */
    CHECK(bucket_finish_sync(g_ctx, g_scripts, TPL, 3, 1, 1000, &finished) == QN_OK);
    CHECK_EQ_INT(finished, 1);
    CHECK(bucket_finish_sync(g_ctx, g_scripts, TPL, 3, 1, 1000, &finished) == QN_OK);
    CHECK_EQ_INT(finished, 0);
    CHECK_EQ_INT(bucket_stock(0, 3), 4);
    CHECK_EQ_INT(held(3), 14);

    /* died after the take, before the settle: finishing takes nothing again */
    CHECK_EQ_INT(give_only(2, 0, "dead2"), 3);
    bucket_keys home;
    bucket_keys_of(&home, TPL, 0, 3);
    const char *keys[1] = {home.hash};
    const char *args[3] = {"dead2", "3", "1"};
    redisReply *r = REDIS_SYNC_SCRIPT(g_ctx, g_scripts, bucket_take, keys, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 3);
    freeReplyObject(r);
    CHECK_EQ_INT(bucket_stock(0, 3), 7);
    CHECK_EQ_INT(held(3), 17); /* counted at home and still on its way at the donor */
    CHECK(bucket_finish_sync(g_ctx, g_scripts, TPL, 3, 2, 1000, &finished) == QN_OK);
    CHECK_EQ_INT(finished, 1);
    CHECK_EQ_INT(bucket_stock(0, 3), 7);
    CHECK_EQ_INT(held(3), 14);

    /* a transfer younger than a transfer lives is left to its maker; the seek says "in doubt"
     * while it is on its way, whatever the stocks */
    const long long none[3] = {0, 0, 0};
    setup(3, none);
    bucket_keys d;
    bucket_keys_of(&d, TPL, 1, 3);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s stock 2", d.hash));
    char t[24];
    snprintf(t, sizeof(t), "%" PRId64, now_wall_ms());
    const char *gk[2] = {d.hash, d.resv};
    const char *ga[4] = {"young", "2", "0", t};
    r = REDIS_SYNC_SCRIPT(g_ctx, g_scripts, bucket_give, gk, ga);
    freeReplyObject(r);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s stock 0", d.hash)); /* taken by claims */
    CHECK(bucket_finish_sync(g_ctx, g_scripts, TPL, 3, 1, 1000, &finished) == QN_OK);
    CHECK_EQ_INT(finished, 0);
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 2, "s1", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_IN_DOUBT);
}

static void test_seek_refills_then_sells_out(void)
{
    const long long stocks[3] = {0, 0, 3};
    bucket_verdict_t v;
    setup(3, stocks);
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 0, "a", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_HAS_STOCK);
    CHECK_EQ_INT(bucket_stock(0, 3), 2);
    CHECK_EQ_INT(bucket_stock(2, 3), 1);
    /* a reservation open in another bucket: the stock may come back */
    int64_t u = user_in(2, 3, 1);
    CHECK_EQ_INT(claim_at_home(g_ctx, g_scripts, u, 3, "r1"), CLAIMGATE_OK);
    bucket_keys k0;
    bucket_keys_of(&k0, TPL, 0, 3);
    freeReplyObject(redis_sync_command(g_ctx, "HSET %s stock 0", k0.hash));
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 0, "b", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_IN_DOUBT);
    /* settled: final */
    bucket_keys k2;
    bucket_keys_of(&k2, TPL, 2, 3);
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", k2.resv));
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 0, "c", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_SOLD_OUT);
    /* a bucket not loaded is not "empty" */
    freeReplyObject(redis_sync_command(g_ctx, "DEL %s", k2.hash));
    CHECK(bucket_seek_sync(g_ctx, g_scripts, TPL, 3, 0, "d", &v) == QN_OK);
    CHECK_EQ_INT(v, BUCKET_IN_DOUBT);
}

/* ---- a sale: threads, demand twice the stock, 80 % of users in one bucket ---- */

#define SALE_THREADS 4
#define SALE_USERS   600 /* per the whole sale; the stock is half */
#define SALE_STOCK   300

typedef struct sale_arg {
    int index;
    int64_t *users;
    int yes, no, doubts, errors, false_no;
} sale_arg;

static void *sale_thread(void *p)
{
    sale_arg *a = p;
    redis_sync *rs =
        redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 5000});
    redis_scripts *s = redis_scripts_load_dir(g_lua);
    if (!rs || !s) {
        a->errors++;
        goto out;
    }
    for (int i = a->index; i < SALE_USERS; i += SALE_THREADS) {
        int64_t u = a->users[i];
        char xid[64];
        for (int attempt = 0;; attempt++) {
            if (attempt > 2000) {
                a->errors++;
                break;
            }
            int code = claim_at_home(rs, s, u, 3, NULL);
            if (code == CLAIMGATE_OK) {
                a->yes++;
                break;
            }
            if (code != CLAIMGATE_SOLD_OUT && code != CLAIMGATE_STOCK_IN_DOUBT) {
                a->errors++;
                break;
            }
            bucket_verdict_t v;
            snprintf(xid, sizeof(xid), "t%d.u%" PRId64 ".%d", a->index, u, attempt);
            if (bucket_seek_sync(rs, s, TPL, 3, bucket_home(u, 3), xid, &v) != QN_OK) {
                a->errors++;
                break;
            }
            if (v == BUCKET_SOLD_OUT) {
                a->no++;
                break;
            }
            if (v == BUCKET_IN_DOUBT)
                a->doubts++;
        }
    }
out:
    if (s)
        redis_scripts_free(s);
    if (rs)
        redis_sync_free(rs);
    return NULL;
}

static void test_uneven_sale_sells_out_exactly(void)
{
    long long stocks[3];
    for (int b = 0; b < 3; b++)
        stocks[b] = bucket_share(SALE_STOCK, b, 3);
    setup(3, stocks);
    /* 80 % of the users hash to bucket 0 */
    int64_t users[SALE_USERS], next = 7000000;
    for (int i = 0; i < SALE_USERS; i++) {
        users[i] = user_in(i % 5 == 4 ? 1 + (i / 5) % 2 : 0, 3, next);
        next = users[i] + 1;
    }
    pthread_t th[SALE_THREADS];
    sale_arg args[SALE_THREADS];
    for (int t = 0; t < SALE_THREADS; t++) {
        args[t] = (sale_arg){.index = t, .users = users};
        CHECK(pthread_create(&th[t], NULL, sale_thread, &args[t]) == 0);
    }
    int yes = 0, no = 0, errors = 0, doubts = 0;
    for (int t = 0; t < SALE_THREADS; t++) {
        pthread_join(th[t], NULL);
        yes += args[t].yes, no += args[t].no, errors += args[t].errors, doubts += args[t].doubts;
    }
    printf("  sale: %d yes, %d sold out, %d in doubt on the way, %d errors\n", yes, no, doubts,
           errors);
    CHECK_EQ_INT(errors, 0);
    CHECK_EQ_INT(yes, SALE_STOCK);             /* to the last coupon, and not one more */
    CHECK_EQ_INT(no, SALE_USERS - SALE_STOCK); /* every other user told, once */
    CHECK_EQ_INT(held(3), 0);
    /* every user's count in their home bucket: at most the limit, and the counts add up */
    long long counted = 0;
    for (int b = 0; b < 3; b++) {
        bucket_keys k;
        bucket_keys_of(&k, TPL, b, 3);
        redisReply *r = redis_sync_command(g_ctx, "HVALS %s", k.users);
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            CHECK(atoll(r->element[i]->str) <= 1);
            counted += atoll(r->element[i]->str);
        }
        if (r)
            freeReplyObject(r);
    }
    CHECK_EQ_INT(counted, SALE_STOCK);
}

int main(void)
{
    g_lua = getenv("QUAN_LUA_DIR");
    g_lua = g_lua && *g_lua ? g_lua : "lua-scripts";
    g_host = th_env("QUAN_REDIS_HOST");
    g_port = atoi(th_env("QUAN_REDIS_PORT"));
    log_init("test_bucket", LOGL_ERROR);
    RUN(test_home_spreads_users);
    RUN(test_tags_fall_on_different_slices);
    RUN(test_shares_add_up);
    RUN(test_verdict);
    g_ctx = redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 2000});
    g_scripts = redis_scripts_load_dir(g_lua);
    if (!g_ctx || !g_scripts) {
        printf("  FAIL: no Redis connection or no Lua scripts\n");
        th_failed++;
    } else {
        RUN(test_claim_runs_on_a_bucket);
        RUN(test_transfer_moves_half_once);
        RUN(test_crash_between_steps_loses_nothing);
        RUN(test_seek_refills_then_sells_out);
        RUN(test_uneven_sale_sells_out_exactly);
        for (int b = 0; b < 3; b++) {
            bucket_keys k;
            bucket_keys_of(&k, TPL, b, 3);
            freeReplyObject(redis_sync_command(g_ctx, "DEL %s %s %s", k.hash, k.users, k.resv));
        }
    }
    if (g_scripts)
        redis_scripts_free(g_scripts);
    if (g_ctx)
        redis_sync_free(g_ctx);
    TEST_MAIN_END();
}
