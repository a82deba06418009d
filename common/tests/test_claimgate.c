/* The reader of claim.lua's answers (claimgate.h), against answers of every shape: each code
 * with what the script sends, short ones, wrong types, codes past the list. */
#include <stdarg.h>
#include <stdint.h>

#include "claimgate.h"
#include "testhelp.h"

/* An answer of n integers (a string where the value is S). */
#define S -999999
static redisReply *answer(size_t n, ...)
{
    static redisReply el[8];
    static redisReply *els[8];
    static redisReply r;
    va_list ap;
    va_start(ap, n);
    memset(&r, 0, sizeof(r));
    r.type = REDIS_REPLY_ARRAY;
    r.elements = n;
    r.element = els;
    for (size_t i = 0; i < n; i++) {
        long long v = va_arg(ap, long long);
        memset(&el[i], 0, sizeof(el[i]));
        el[i].type = v == S ? REDIS_REPLY_STRING : REDIS_REPLY_INTEGER;
        el[i].integer = v == S ? 0 : v;
        el[i].str = v == S ? (char *)(uintptr_t) "x" : NULL;
        el[i].len = v == S ? 1 : 0;
        els[i] = &el[i];
    }
    va_end(ap);
    return &r;
}

static void test_shapes(void)
{
    static const struct {
        size_t n;
        long long v[4];
        qn_status st;
        int reserved;
        long long code, count, hours, end, resv;
    } v[] = {
        /* What the script answers. */
        {4, {0, 1, 24, 5000}, QN_OK, 1, CLAIMGATE_OK, 1, 24, 5000, 0},
        {2, {1, 3}, QN_OK, 0, CLAIMGATE_SOLD_OUT, 3, 0, 0, 0},
        {2, {2, 1}, QN_OK, 0, CLAIMGATE_LIMIT_REACHED, 1, 0, 0, 0},
        {2, {3, 0}, QN_OK, 0, CLAIMGATE_NOT_ACTIVE, 0, 0, 0, 0},
        {2, {4, 0}, QN_OK, 0, CLAIMGATE_OUTSIDE_WINDOW, 0, 0, 0, 0},
        {2, {5, 0}, QN_OK, 0, CLAIMGATE_CACHE_MISS, 0, 0, 0, 0},
        {2, {6, 0}, QN_OK, 0, CLAIMGATE_OTHER_SHOP, 0, 0, 0, 0},
        {3, {7, 2, 1700}, QN_OK, 0, CLAIMGATE_REPEATED, 2, 0, 0, 1700},
        {2, {7, 2}, QN_OK, 0, CLAIMGATE_REPEATED, 2, 0, 0, 0},     /* no time said */
        {3, {7, 2, -5}, QN_OK, 0, CLAIMGATE_REPEATED, 2, 0, 0, 0}, /* a nonsense time */
        {3, {7, 2, S}, QN_OK, 0, CLAIMGATE_REPEATED, 2, 0, 0, 0},  /* not a number */
        {2, {8, 0}, QN_OK, 0, CLAIMGATE_STOCK_IN_DOUBT, 0, 0, 0, 0},
        {2, {9, 1}, QN_OK, 0, CLAIMGATE_LIMIT_IN_DOUBT, 1, 0, 0, 0},
        {2, {10, 3}, QN_OK, 0, CLAIMGATE_WRONG_BUCKETS, 3, 0, 0, 0},
        /* A reservation whose answer is short: unreadable, but reserved all the same. */
        {3, {0, 1, 24}, QN_EINVAL, 1, 0, 0, 0, 0, 0},
        {2, {0, 1}, QN_EINVAL, 1, 0, 0, 0, 0, 0},
        {4, {0, 1, S, 5000}, QN_EINVAL, 1, 0, 0, 0, 0, 0},
        /* Not an answer. */
        {1, {1}, QN_EINVAL, 0, 0, 0, 0, 0, 0},
        {0, {0}, QN_EINVAL, 0, 0, 0, 0, 0, 0},
        {2, {S, 1}, QN_EINVAL, 0, 0, 0, 0, 0, 0},
        {2, {1, S}, QN_EINVAL, 0, 0, 0, 0, 0, 0},
        {2, {11, 0}, QN_EINVAL, 0, 0, 0, 0, 0, 0}, /* a code this engine does not know */
        {2, {-1, 0}, QN_EINVAL, 0, 0, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        claimgate_reply g;
        redisReply *r = answer(v[i].n, v[i].v[0], v[i].v[1], v[i].v[2], v[i].v[3]);
        qn_status st = claimgate_parse(r, &g);
        int bad = st != v[i].st || g.reserved != v[i].reserved ||
                  (st == QN_OK &&
                   (g.code != v[i].code || g.count != v[i].count || g.hours != v[i].hours ||
                    g.end_ms != v[i].end || g.resv_ms != v[i].resv));
        if (bad)
            printf("  case %zu: st %d reserved %d code %d count %lld hours %lld end %lld resv "
                   "%lld\n",
                   i, st, g.reserved, g.code, g.count, g.hours, g.end_ms, g.resv_ms);
        CHECK(!bad);
    }
}

static void test_not_arrays(void)
{
    char noscript[] = "NOSCRIPT";
    redisReply r = {.type = REDIS_REPLY_ERROR, .str = noscript, .len = 8};
    claimgate_reply g;
    CHECK_EQ_INT(claimgate_parse(&r, &g), QN_EINVAL);
    CHECK_EQ_INT(g.reserved, 0);
    r.type = REDIS_REPLY_NIL;
    CHECK_EQ_INT(claimgate_parse(&r, &g), QN_EINVAL);
    CHECK_EQ_INT(claimgate_parse(NULL, &g), QN_EINVAL);
}

static void test_names(void)
{
    CHECK_EQ_STR(claimgate_name(CLAIMGATE_OK), "CLAIMGATE_OK");
    CHECK_EQ_STR(claimgate_name(CLAIMGATE_LIMIT_IN_DOUBT), "CLAIMGATE_LIMIT_IN_DOUBT");
    CHECK_EQ_STR(claimgate_name((claimgate_result)CLAIMGATE_RESULTS), "unknown");
}

int main(void)
{
    RUN(test_shapes);
    RUN(test_not_arrays);
    RUN(test_names);
    TEST_MAIN_END();
}
