/* The shared discount function: a table of rules and base amounts with the expected outcome,
 * including the rounding edges, caps, equal thresholds, zero and values near INT64_MAX. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discount.h"
#include "testhelp.h"

typedef struct base_case {
    const char *what;
    int type;
    int64_t terms, max;
    int rate; /* fraction paid x 10000 */
    int64_t base;
    discount_reason want_reason;
    int64_t want;
} base_case;

static const base_case base_cases[] = {
    /* type 0: min(max, base), no threshold */
    {"fixed under base", TPL_TYPE_FIXED, 0, 500, 0, 10000, DISCOUNT_OK, 500},
    {"fixed capped at base", TPL_TYPE_FIXED, 0, 500, 0, 300, DISCOUNT_OK, 300},
    {"fixed ignores terms", TPL_TYPE_FIXED, 99999, 500, 0, 100, DISCOUNT_OK, 100},
    {"fixed zero base", TPL_TYPE_FIXED, 0, 500, 0, 0, DISCOUNT_OK, 0},
    {"fixed zero max", TPL_TYPE_FIXED, 0, 0, 0, 800, DISCOUNT_OK, 0},
    {"fixed huge", TPL_TYPE_FIXED, 0, INT64_MAX, 0, INT64_MAX, DISCOUNT_OK, INT64_MAX},
    /* type 1: base >= terms -> min(max, base) */
    {"threshold one cent short", TPL_TYPE_THRESHOLD, 10000, 1000, 0, 9999,
     DISCOUNT_THRESHOLD_NOT_MET, 0},
    {"threshold equal", TPL_TYPE_THRESHOLD, 10000, 1000, 0, 10000, DISCOUNT_OK, 1000},
    {"threshold above", TPL_TYPE_THRESHOLD, 10000, 1000, 0, 25000, DISCOUNT_OK, 1000},
    {"threshold zero terms capped at base", TPL_TYPE_THRESHOLD, 0, 1000, 0, 600, DISCOUNT_OK, 600},
    {"threshold zero base zero terms", TPL_TYPE_THRESHOLD, 0, 1000, 0, 0, DISCOUNT_OK, 0},
    /* type 2: rate is the fraction paid; discount = base x (1 - rate) half-up, capped */
    {"percent 0.85 of 33.33 (499.95 -> 500)", TPL_TYPE_PERCENT, 0, 100000, 8500, 3333, DISCOUNT_OK,
     500},
    {"percent 0.85 of 33.30 (499.5 -> 500)", TPL_TYPE_PERCENT, 0, 100000, 8500, 3330, DISCOUNT_OK,
     500},
    {"percent 0.85 of 33.29 (499.35 -> 499)", TPL_TYPE_PERCENT, 0, 100000, 8500, 3329, DISCOUNT_OK,
     499},
    {"percent 0.8 of 100.00", TPL_TYPE_PERCENT, 0, 100000, 8000, 10000, DISCOUNT_OK, 2000},
    {"percent 0.8 of 1.00 (0.8 is paid, not off)", TPL_TYPE_PERCENT, 0, 100000, 8000, 100,
     DISCOUNT_OK, 20},
    {"percent 0.95 of 0.10 (0.5 -> 1)", TPL_TYPE_PERCENT, 0, 100, 9500, 10, DISCOUNT_OK, 1},
    {"percent 0.9999 of 0.01 (0.0001 -> 0)", TPL_TYPE_PERCENT, 0, 100, 9999, 1, DISCOUNT_OK, 0},
    {"percent 0.0001 of 0.01 (0.9999 -> 1)", TPL_TYPE_PERCENT, 0, 100, 1, 1, DISCOUNT_OK, 1},
    {"percent capped at max", TPL_TYPE_PERCENT, 0, 3000, 5000, 10000, DISCOUNT_OK, 3000},
    {"percent equal to max", TPL_TYPE_PERCENT, 0, 5000, 5000, 10000, DISCOUNT_OK, 5000},
    {"percent threshold equal", TPL_TYPE_PERCENT, 10000, 100000, 9000, 10000, DISCOUNT_OK, 1000},
    {"percent threshold short", TPL_TYPE_PERCENT, 10000, 100000, 9000, 9999,
     DISCOUNT_THRESHOLD_NOT_MET, 0},
    {"percent zero base", TPL_TYPE_PERCENT, 0, 100000, 9000, 0, DISCOUNT_OK, 0},
    /* INT64_MAX / 2 = 4611686018427387903.5 -> 4611686018427387904 */
    {"percent huge half-up", TPL_TYPE_PERCENT, 0, INT64_MAX, 5000, INT64_MAX, DISCOUNT_OK,
     4611686018427387904LL},
    {"percent huge capped", TPL_TYPE_PERCENT, 0, 12345, 1, INT64_MAX, DISCOUNT_OK, 12345},
    /* rules the function refuses */
    {"percent rate 0", TPL_TYPE_PERCENT, 0, 1000, 0, 1000, DISCOUNT_BAD_RULE, 0},
    {"percent rate 1", TPL_TYPE_PERCENT, 0, 1000, 10000, 1000, DISCOUNT_BAD_RULE, 0},
    {"unknown type", 7, 0, 1000, 0, 1000, DISCOUNT_BAD_RULE, 0},
    {"negative base", TPL_TYPE_FIXED, 0, 1000, 0, -1, DISCOUNT_BAD_RULE, 0},
    {"negative max", TPL_TYPE_FIXED, 0, -5, 0, 100, DISCOUNT_BAD_RULE, 0},
};

static void test_discount_on_base_table(void)
{
    for (size_t i = 0; i < sizeof(base_cases) / sizeof(base_cases[0]); i++) {
        const base_case *c = &base_cases[i];
        discount_rule r = {.type = c->type,
                           .target = TPL_TARGET_SHOP,
                           .source = TPL_SOURCE_PLATFORM,
                           .terms_cents = c->terms,
                           .max_discount_cents = c->max,
                           .discount_rate = c->rate};
        int64_t d = -1;
        discount_reason why = discount_on_base(&r, c->base, &d);
        if (why != c->want_reason || d != c->want)
            printf("  case \"%s\": reason %s discount %lld, want %s %lld\n", c->what,
                   discount_reason_str(why), (long long)d, discount_reason_str(c->want_reason),
                   (long long)c->want);
        CHECK_EQ_INT(why, c->want_reason);
        CHECK_EQ_INT(d, c->want);
    }
}

static void test_discount_percent_off_exhaustive_small(void)
{
    /* Against the definition in exact integer arithmetic: off = base*(S-r)/S half-up. */
    for (int rate = 1; rate < TPL_RATE_SCALE; rate += 37) {
        for (int64_t base = 0; base < 3000; base += 7) {
            int64_t num = base * (TPL_RATE_SCALE - rate);
            int64_t want = (2 * num + TPL_RATE_SCALE) / (2 * TPL_RATE_SCALE);
            if (discount_percent_off(base, rate) != want) {
                printf("  base %lld rate %d: %lld != %lld\n", (long long)base, rate,
                       (long long)discount_percent_off(base, rate), (long long)want);
                CHECK(0);
                return;
            }
        }
    }
}

static const discount_goods order_goods[] = {
    {"sku-a", 5000}, {"sku-b", 3333}, {"sku-b", 100}, /* a repeated number: the first item counts */
};

static void test_discount_apply_targets_and_shops(void)
{
    discount_order o = {
        .amount_cents = 8433, .shop_number = 42, .goods = order_goods, .n_goods = 3};
    discount_result res;

    /* whole shop: base is the order amount */
    discount_rule whole = {.type = TPL_TYPE_THRESHOLD,
                           .target = TPL_TARGET_SHOP,
                           .source = TPL_SOURCE_SHOP,
                           .shop_number = 42,
                           .terms_cents = 8433,
                           .max_discount_cents = 1000};
    CHECK_EQ_INT(discount_apply(&whole, &o, &res), DISCOUNT_OK);
    CHECK_EQ_INT(res.base_cents, 8433);
    CHECK_EQ_INT(res.discount_cents, 1000);
    CHECK_EQ_INT(res.goods_index, -1);

    /* a shop coupon of another shop */
    whole.shop_number = 43;
    CHECK_EQ_INT(discount_apply(&whole, &o, &res), DISCOUNT_OTHER_SHOP);
    CHECK_EQ_INT(res.discount_cents, 0);
    CHECK_EQ_STR(discount_reason_str(res.reason), "other shop");
    /* a platform coupon fits any shop */
    whole.source = TPL_SOURCE_PLATFORM;
    CHECK_EQ_INT(discount_apply(&whole, &o, &res), DISCOUNT_OK);

    /* goods coupon: base is the matched item's amount, first match wins */
    discount_rule goods = {.type = TPL_TYPE_PERCENT,
                           .target = TPL_TARGET_GOODS,
                           .source = TPL_SOURCE_SHOP,
                           .shop_number = 42,
                           .goods = "sku-b",
                           .terms_cents = 0,
                           .max_discount_cents = 100000,
                           .discount_rate = 8500};
    CHECK_EQ_INT(discount_apply(&goods, &o, &res), DISCOUNT_OK);
    CHECK_EQ_INT(res.goods_index, 1);
    CHECK_EQ_INT(res.base_cents, 3333);
    CHECK_EQ_INT(res.discount_cents, 500);

    /* threshold checked against the item, not the order */
    goods.terms_cents = 3334;
    CHECK_EQ_INT(discount_apply(&goods, &o, &res), DISCOUNT_THRESHOLD_NOT_MET);
    CHECK_EQ_STR(discount_reason_str(res.reason), "threshold not met");

    goods.goods = "sku-zzz";
    CHECK_EQ_INT(discount_apply(&goods, &o, &res), DISCOUNT_GOODS_NOT_IN_ORDER);
    CHECK_EQ_STR(discount_reason_str(res.reason), "goods not in order");
    CHECK_EQ_INT(res.goods_index, -1);

    /* an empty goods list, and a goods coupon without goods */
    discount_order empty = {.amount_cents = 100, .shop_number = 42};
    goods.goods = "sku-a";
    CHECK_EQ_INT(discount_apply(&goods, &empty, &res), DISCOUNT_GOODS_NOT_IN_ORDER);
    goods.goods = "";
    CHECK_EQ_INT(discount_apply(&goods, &o, &res), DISCOUNT_BAD_RULE);
    goods.target = 5;
    CHECK_EQ_INT(discount_apply(&goods, &o, &res), DISCOUNT_BAD_RULE);
}

static void test_discount_rule_from_tpl(void)
{
    tpl t = {0};
    t.type = TPL_TYPE_PERCENT;
    t.target = TPL_TARGET_GOODS;
    t.source = TPL_SOURCE_SHOP;
    t.shop_number = 7;
    t.goods = (char *)"g1";
    t.consume_rule = (char *)"{\"termsOfUse\":\"10.00\",\"maximumDiscountAmount\":3,"
                             "\"discountRate\":\"0.85\",\"validityPeriod\":48}";
    t.receive_rule = (char *)"{}";
    CHECK_EQ_INT(tpl_parse_rules(&t), QN_OK);
    discount_rule r;
    discount_rule_from_tpl(&t, &r);
    CHECK_EQ_INT(r.terms_cents, 1000);
    CHECK_EQ_INT(r.max_discount_cents, 300);
    CHECK_EQ_INT(r.discount_rate, 8500);
    CHECK_EQ_STR(r.goods, "g1");
    discount_goods g[] = {{"g1", 1000}};
    discount_order o = {.amount_cents = 1000, .shop_number = 7, .goods = g, .n_goods = 1};
    discount_result res;
    CHECK_EQ_INT(discount_apply(&r, &o, &res), DISCOUNT_OK);
    CHECK_EQ_INT(res.discount_cents, 150); /* 10.00 x 0.15 under the 3.00 cap */
}

/* Reads body with jsonin_parse, then discount_read_goods; returns its status. */
static qn_status read_goods(const char *body, discount_goods **g, size_t *n, jsonin_err *err)
{
    jsonin_err perr;
    cJSON *j = jsonin_parse(body, strlen(body), &perr);
    if (!j)
        return QN_ERR;
    qn_status st = discount_read_goods(j, g, n, err);
    /* goods numbers are borrowed from j: compare them before it goes */
    if (st == QN_OK && *n == 2) {
        CHECK_EQ_STR((*g)[0].goods_number, "A-1");
        CHECK_EQ_STR((*g)[1].goods_number, "B-2");
    }
    cJSON_Delete(j);
    return st;
}

static void test_discount_read_goods(void)
{
    discount_goods *g = NULL;
    size_t n = 99;
    jsonin_err err = {{0}};
    CHECK(read_goods("{}", &g, &n, &err) == QN_OK);
    CHECK(g == NULL && n == 0);
    CHECK(read_goods("{\"goodsList\":[{\"goodsNumber\":\"A-1\",\"goodsAmount\":19.99},"
                     "{\"goodsNumber\":\"B-2\",\"goodsAmount\":\"5\","
                     "\"goodsPayableAmount\":4.5}]}",
                     &g, &n, &err) == QN_OK);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK_EQ_INT(g[0].amount_cents, 1999);
        CHECK_EQ_INT(g[0].payable_cents, -1);
        CHECK_EQ_INT(g[1].amount_cents, 500);
        CHECK_EQ_INT(g[1].payable_cents, 450);
    }
    free(g);
    g = NULL;

    CHECK(read_goods("{\"goodsList\":{}}", &g, &n, &err) == QN_EINVAL);
    CHECK(strncmp(err.msg, "goodsList:", 10) == 0);
    CHECK(read_goods("{\"goodsList\":[{\"goodsNumber\":\"A-1\",\"goodsAmount\":1},"
                     "{\"goodsNumber\":\"B-2\",\"goodsAmount\":1.005}]}",
                     &g, &n, &err) == QN_EINVAL);
    CHECK(strncmp(err.msg, "goodsList[1].goodsAmount:", 25) == 0);
    CHECK(g == NULL);
    CHECK(read_goods("{\"goodsList\":[7]}", &g, &n, &err) == QN_EINVAL);
    CHECK(strncmp(err.msg, "goodsList[0]:", 13) == 0);

    /* one item over the limit */
    size_t cap = 32 + (DISCOUNT_MAX_GOODS + 1) * 40;
    char *big = malloc(cap), *p = big;
    p += sprintf(p, "{\"goodsList\":[");
    for (int i = 0; i <= DISCOUNT_MAX_GOODS; i++)
        p += sprintf(p, "%s{\"goodsNumber\":\"g%d\",\"goodsAmount\":1}", i ? "," : "", i);
    sprintf(p, "]}");
    CHECK(read_goods(big, &g, &n, &err) == QN_EINVAL);
    CHECK(strstr(err.msg, "at most") != NULL);
    free(big);
}

int main(void)
{
    RUN(test_discount_read_goods);
    RUN(test_discount_on_base_table);
    RUN(test_discount_percent_off_exhaustive_small);
    RUN(test_discount_apply_targets_and_shops);
    RUN(test_discount_rule_from_tpl);
    TEST_MAIN_END();
}
