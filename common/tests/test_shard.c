#include <stdint.h>

#include "shard.h"
#include "testhelp.h"

/* The Java expression evaluated independently of shard.c: abs of Long.hashCode as a long,
 * then (int) cast; the only value that cast changes is 2^31, which becomes INT_MIN -> 0. */
static int ref_index(int64_t v, int n)
{
    uint64_t u = (uint64_t)v;
    uint32_t low = (uint32_t)(u ^ (u >> 32));
    int64_t h = low >= 0x80000000u ? (int64_t)low - 0x100000000LL : (int64_t)low;
    int64_t a = h < 0 ? -h : h;
    if (a == 0x80000000LL)
        return 0;
    return (int)(a % n);
}

static void check_route(const char *table, int64_t key, int ds, int idx, const char *phys)
{
    shard_route r;
    memset(&r, 0x5a, sizeof(r));
    CHECK(shard_route_for(table, key, &r) == QN_OK);
    CHECK_EQ_INT(r.ds, ds);
    CHECK_EQ_INT(r.index, idx);
    CHECK_EQ_STR(r.table, phys);
}

/* Verified vectors (computed with the Java expressions under JDK 17). */
static void test_reference_vectors(void)
{
    /* shop 1810714735922956666: hash 1767913999 */
    CHECK_EQ_INT(shard_index(1810714735922956666LL, 16), 15);
    CHECK_EQ_INT(shard_index(1810714735922956666LL, 32), 15);
    CHECK_EQ_INT(shard_db_of_index(15, 16), 1);
    CHECK_EQ_INT(shard_db_of_index(15, 32), 0);
    CHECK_EQ_INT(1767913999 % 16, 15); /* the vector's hash is consistent with the index */
    /* user 1810518709471555585: hash 1616933165 */
    CHECK_EQ_INT(shard_index(1810518709471555585LL, 16), 13);
    CHECK_EQ_INT(shard_index(1810518709471555585LL, 32), 13);
    CHECK_EQ_INT(shard_db_of_index(13, 16), 1);
    CHECK_EQ_INT(shard_db_of_index(13, 32), 0);
    /* 1810966706881941507: hash 421525348 -> _4, ds_0 at N=16 */
    CHECK_EQ_INT(shard_index(1810966706881941507LL, 16), 4);
    CHECK_EQ_INT(shard_db_of_index(4, 16), 0);
    /* 0, 1, -1 */
    CHECK_EQ_INT(shard_index(0, 16), 0);
    CHECK_EQ_INT(shard_index(1, 16), 1);
    CHECK_EQ_INT(shard_index(-1, 16), 0);
    CHECK_EQ_INT(shard_index(0, 32), 0);
    CHECK_EQ_INT(shard_index(1, 32), 1);
    CHECK_EQ_INT(shard_index(-1, 32), 0);
    /* Long.MIN_VALUE and 2^31: hash 2147483648, the (int) cast gives INT_MIN, % N gives 0 */
    CHECK_EQ_INT(shard_index(INT64_MIN, 16), 0);
    CHECK_EQ_INT(shard_index(INT64_MIN, 32), 0);
    CHECK_EQ_INT(shard_index(2147483648LL, 16), 0);
    CHECK_EQ_INT(shard_index(2147483648LL, 32), 0);
    CHECK_EQ_INT(shard_db_of_index(0, 16), 0);
}

static void test_routes_per_table(void)
{
    check_route("t_coupon_template", 1810714735922956666LL, 1, 15, "t_coupon_template_15");
    check_route("t_coupon_template_log", 1810714735922956666LL, 1, 15, "t_coupon_template_log_15");
    /* The same shop with the 32-table count lands in ds_0: each table keeps its own count. */
    check_route("t_user_coupon", 1810714735922956666LL, 0, 15, "t_user_coupon_15");
    check_route("t_user_coupon", 1810518709471555585LL, 0, 13, "t_user_coupon_13");
    check_route("t_coupon_settlement", 1810518709471555585LL, 1, 13, "t_coupon_settlement_13");
    check_route("t_coupon_template", 1810966706881941507LL, 0, 4, "t_coupon_template_4");
    check_route("t_coupon_template", INT64_MIN, 0, 0, "t_coupon_template_0");
    check_route("t_user_coupon", 2147483648LL, 0, 0, "t_user_coupon_0");
    check_route("t_user_coupon", -1, 0, 0, "t_user_coupon_0");
    check_route("t_user_coupon", 1, 0, 1, "t_user_coupon_1");

    CHECK_EQ_INT(shard_table_count("t_coupon_template"), 16);
    CHECK_EQ_INT(shard_table_count("t_coupon_template_log"), 16);
    CHECK_EQ_INT(shard_table_count("t_user_coupon"), 32);
    CHECK_EQ_INT(shard_table_count("t_coupon_settlement"), 16);
    CHECK_EQ_INT(shard_table_count("t_coupon_task"), 0);
    CHECK_EQ_INT(shard_table_count("t_nope"), -1);
    CHECK_EQ_INT(shard_table_count(NULL), -1);
    CHECK_EQ_STR(shard_key_column("t_coupon_template"), "shop_number");
    CHECK_EQ_STR(shard_key_column("t_user_coupon"), "user_id");
    CHECK_EQ_STR(shard_key_column("t_coupon_settlement"), "user_id");
    CHECK(shard_key_column("t_coupon_task") == NULL);
}

static void test_unsharded_and_unknown(void)
{
    static const char *const single[] = {"t_coupon_task", "t_coupon_task_fail",
                                         "t_coupon_template_remind", "t_exchange_code"};
    for (size_t i = 0; i < sizeof(single) / sizeof(single[0]); i++)
        check_route(single[i], 1810714735922956666LL, 0, -1, single[i]);

    shard_route r = {.ds = 7, .index = 7, .table = "untouched"};
    CHECK(shard_route_for("t_unknown", 1, &r) == QN_EINVAL);
    CHECK(shard_route_for(NULL, 1, &r) == QN_EINVAL);
    CHECK(shard_route_for("t_user_coupon_3", 1, &r) == QN_EINVAL); /* physical, not logical */
    CHECK_EQ_STR(r.table, "untouched");
    CHECK_EQ_INT(r.ds, 7);
}

static void test_route_index(void)
{
    shard_route r;
    CHECK(shard_route_index("t_user_coupon", 16, &r) == QN_OK);
    CHECK_EQ_INT(r.ds, 1);
    CHECK_EQ_STR(r.table, "t_user_coupon_16");
    CHECK(shard_route_index("t_user_coupon", 15, &r) == QN_OK);
    CHECK_EQ_INT(r.ds, 0);
    CHECK(shard_route_index("t_coupon_template", 8, &r) == QN_OK);
    CHECK_EQ_INT(r.ds, 1);
    CHECK(shard_route_index("t_coupon_template", 7, &r) == QN_OK);
    CHECK_EQ_INT(r.ds, 0);
    CHECK(shard_route_index("t_coupon_template", 16, &r) == QN_EINVAL);
    CHECK(shard_route_index("t_coupon_template", -1, &r) == QN_EINVAL);
    CHECK(shard_route_index("t_coupon_task", 0, &r) == QN_EINVAL);
}

/* A few thousand keys, spread over the whole int64 range: idx in [0, N), db == idx / (N/2),
 * and the index equals the independent reference computation. Also each table is hit. */
static void test_brute(void)
{
    static const int ns[] = {16, 32};
    uint64_t x = 0x9E3779B97F4A7C15ULL; /* xorshift64 state: deterministic keys */
    for (size_t k = 0; k < 2; k++) {
        int n = ns[k];
        int hits[32] = {0};
        int bad = 0;
        for (int i = 0; i < 5000; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int64_t v = (int64_t)x;
            if (i % 5 == 1)
                v = (int64_t)(x >> 40); /* small positive keys too */
            else if (i % 5 == 2)
                v = -(int64_t)(x >> 40);
            int idx = shard_index(v, n);
            int db = shard_db_of_index(idx, n);
            if (idx < 0 || idx >= n || db != idx / (n / 2) || idx != ref_index(v, n) ||
                (db != 0 && db != 1))
                bad++;
            else
                hits[idx]++;
        }
        CHECK_EQ_INT(bad, 0);
        for (int i = 0; i < n; i++)
            CHECK(hits[i] > 0);
    }
}

int main(void)
{
    RUN(test_reference_vectors);
    RUN(test_routes_per_table);
    RUN(test_unsharded_and_unknown);
    RUN(test_route_index);
    RUN(test_brute);
    TEST_MAIN_END();
}
