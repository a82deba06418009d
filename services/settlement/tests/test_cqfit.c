/* coupon-query's decisions (cqfit.h), as tables: the request's order and its 400s, each
 * template's verdict on an order (its window, its shop, its goods and threshold, the discount
 * of each type with its caps and rounding), which coupons the answer lists and in which order,
 * and how long a user's rows are kept. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cqfit.h"
#include "testhelp.h"

/* ------------------------------------------------------------------ the request */

static void test_read_order(void)
{
    static const struct {
        const char *body;
        qn_status want;
        const char *err; /* the 400's text; or, accepted: NULL */
        int64_t amount, shop;
        size_t ngoods;
    } v[] = {
        {"{\"orderAmount\":100.5,\"shopNumber\":7}", QN_OK, NULL, 10050, 7, 0},
        {"{\"orderAmount\":\"0.01\",\"shopNumber\":\"0\"}", QN_OK, NULL, 1, 0, 0},
        {"{\"orderAmount\":0,\"shopNumber\":1,\"goodsList\":null}", QN_OK, NULL, 0, 1, 0},
        {"{\"orderAmount\":1000000000000,\"shopNumber\":1,\"goodsList\":[]}", QN_OK, NULL,
         DISCOUNT_MAX_CENTS, 1, 0},
        {"{\"orderAmount\":30,\"shopNumber\":1,\"goodsList\":[{\"goodsNumber\":\"a\","
         "\"goodsAmount\":10},{\"goodsNumber\":\"b\",\"goodsAmount\":20,"
         "\"goodsPayableAmount\":18}]}",
         QN_OK, NULL, 3000, 1, 2},
        /* each field's bounds, named in the answer */
        {"{\"shopNumber\":1}", QN_EINVAL, "orderAmount: required", 0, 0, 0},
        {"{\"orderAmount\":-0.01,\"shopNumber\":1}", QN_EINVAL,
         "orderAmount: must be between 0.00 and 1000000000000.00", 0, 0, 0},
        {"{\"orderAmount\":1000000000000.01,\"shopNumber\":1}", QN_EINVAL,
         "orderAmount: must be between 0.00 and 1000000000000.00", 0, 0, 0},
        {"{\"orderAmount\":1.001,\"shopNumber\":1}", QN_EINVAL,
         "orderAmount: must have at most two decimals", 0, 0, 0},
        {"{\"orderAmount\":\"ten\",\"shopNumber\":1}", QN_EINVAL,
         "orderAmount: must be an amount in yuan, like 100.5 or \"100.50\"", 0, 0, 0},
        {"{\"orderAmount\":1}", QN_EINVAL, "shopNumber: required", 0, 0, 0},
        {"{\"orderAmount\":1,\"shopNumber\":-1}", QN_EINVAL, "shopNumber: must be at least 0", 0, 0,
         0},
        {"{\"orderAmount\":1,\"shopNumber\":1.5}", QN_EINVAL, "shopNumber: must be an integer", 0,
         0, 0},
        {"{\"orderAmount\":1,\"shopNumber\":1,\"goodsList\":{}}", QN_EINVAL,
         "goodsList: must be an array", 0, 0, 0},
        {"{\"orderAmount\":1,\"shopNumber\":1,\"goodsList\":[7]}", QN_EINVAL,
         "goodsList[0]: must be an object", 0, 0, 0},
        {"{\"orderAmount\":1,\"shopNumber\":1,\"goodsList\":[{\"goodsNumber\":\"a\","
         "\"goodsAmount\":1},{\"goodsNumber\":\" \",\"goodsAmount\":1}]}",
         QN_EINVAL, "goodsList[1].goodsNumber: required", 0, 0, 0}, /* blank is none */
        {"{\"orderAmount\":1,\"shopNumber\":1,\"goodsList\":[{\"goodsNumber\":\"a\"}]}", QN_EINVAL,
         "goodsList[0].goodsAmount: required", 0, 0, 0},
        {"{\"orderAmount\":1,\"shopNumber\":1,\"goodsList\":[{\"goodsNumber\":\"a\","
         "\"goodsAmount\":-1}]}",
         QN_EINVAL, "goodsList[0].goodsAmount: must be between 0.00 and 1000000000000.00", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        cJSON *body = cJSON_Parse(v[i].body);
        discount_order o;
        discount_goods *goods = NULL;
        jsonin_err err = {{0}};
        qn_status st = cqfit_read_order(body, &o, &goods, &err);
        int bad = st != v[i].want || (v[i].err && strcmp(err.msg, v[i].err) != 0) ||
                  (!v[i].err && (o.amount_cents != v[i].amount || o.shop_number != v[i].shop ||
                                 o.n_goods != v[i].ngoods || o.goods != goods));
        if (bad)
            printf("  case %zu %s: %s \"%s\", amount %lld, shop %lld, %zu goods\n", i, v[i].body,
                   qn_status_str(st), err.msg, (long long)o.amount_cents, (long long)o.shop_number,
                   o.n_goods);
        CHECK(!bad);
        free(goods);
        cJSON_Delete(body);
    }
}

/* The goods of a whole list, when there are more than one. */
static void test_read_order_goods(void)
{
    cJSON *body = cJSON_Parse("{\"orderAmount\":30,\"shopNumber\":1,\"goodsList\":["
                              "{\"goodsNumber\":\"a\",\"goodsAmount\":10},"
                              "{\"goodsNumber\":\"b\",\"goodsAmount\":20.5,"
                              "\"goodsPayableAmount\":18}]}");
    discount_order o;
    discount_goods *goods = NULL;
    jsonin_err err = {{0}};
    CHECK_EQ_INT(cqfit_read_order(body, &o, &goods, &err), QN_OK);
    CHECK_EQ_INT(o.n_goods, 2);
    CHECK_EQ_STR(o.goods[1].goods_number, "b");
    CHECK_EQ_INT(o.goods[1].amount_cents, 2050);
    CHECK_EQ_INT(o.goods[1].payable_cents, 1800);
    CHECK_EQ_INT(o.goods[0].payable_cents, -1); /* not given */
    free(goods);
    cJSON_Delete(body);
}

/* ------------------------------------------------------------------ a template's verdict */

#define NOW  1700000000000LL
#define SHOP 42
enum { ACTIVE = TPL_STATUS_ACTIVE, ENDED = TPL_STATUS_ENDED };
enum { FIXED = TPL_TYPE_FIXED, THRESHOLD = TPL_TYPE_THRESHOLD, PERCENT = TPL_TYPE_PERCENT };
enum { GOODS = TPL_TARGET_GOODS, WHOLE = TPL_TARGET_SHOP };
enum { OWN = TPL_SOURCE_SHOP, PLATFORM = TPL_SOURCE_PLATFORM };

static const discount_goods order_goods[] = {
    {"sku-a", 5000, -1},
    {"sku-b", 3333, -1},
    {"sku-b", 100, -1}, /* a repeated number: the first item counts */
};

static void test_judge(void)
{
    static const struct {
        const char *what;
        int status;
        int64_t end; /* relative to NOW */
        int type, target, source;
        int64_t shop;
        const char *goods;
        int64_t terms, max;
        int rate;
        int64_t order; /* the order's amount; its shop is SHOP, its goods order_goods */
        const char *reason;
        int64_t want;
    } v[] = {
        /* the template's window and status */
        {"active, ends later", ACTIVE, 1, FIXED, WHOLE, OWN, SHOP, "", 0, 500, 0, 8433, NULL, 500},
        {"its last millisecond", ACTIVE, 0, FIXED, WHOLE, OWN, SHOP, "", 0, 500, 0, 8433, NULL,
         500},
        {"past its end", ACTIVE, -1, FIXED, WHOLE, OWN, SHOP, "", 0, 500, 0, 8433, "template ended",
         0},
        {"terminated before its end", ENDED, 3600000, FIXED, WHOLE, OWN, SHOP, "", 0, 500, 0, 8433,
         "template ended", 0},
        {"ended goes before not fitting", ENDED, 1, FIXED, WHOLE, OWN, SHOP + 1, "", 0, 500, 0,
         8433, "template ended", 0},
        /* the shop */
        {"a shop's coupon, another shop", ACTIVE, 1, FIXED, WHOLE, OWN, SHOP + 1, "", 0, 500, 0,
         8433, "other shop", 0},
        {"a platform coupon, any shop", ACTIVE, 1, FIXED, WHOLE, PLATFORM, SHOP + 1, "", 0, 500, 0,
         8433, NULL, 500},
        /* the goods: the base is the first item of the number */
        {"goods not in the order", ACTIVE, 1, FIXED, GOODS, OWN, SHOP, "sku-z", 0, 500, 0, 8433,
         "goods not in order", 0},
        {"goods capped at its item", ACTIVE, 1, FIXED, GOODS, OWN, SHOP, "sku-b", 0, 99999, 0, 8433,
         NULL, 3333},
        {"goods threshold on the item, not the order", ACTIVE, 1, THRESHOLD, GOODS, OWN, SHOP,
         "sku-b", 3334, 100, 0, 8433, "threshold not met", 0},
        {"goods without a number", ACTIVE, 1, FIXED, GOODS, OWN, SHOP, "", 0, 500, 0, 8433,
         "invalid rule", 0},
        /* amount off: min(max, base) */
        {"fixed above the order", ACTIVE, 1, FIXED, WHOLE, OWN, SHOP, "", 0, 9000, 0, 8433, NULL,
         8433},
        {"fixed on a zero order", ACTIVE, 1, FIXED, WHOLE, OWN, SHOP, "", 0, 500, 0, 0, NULL, 0},
        /* threshold amount off */
        {"threshold equal", ACTIVE, 1, THRESHOLD, WHOLE, OWN, SHOP, "", 8433, 1000, 0, 8433, NULL,
         1000},
        {"threshold one cent short", ACTIVE, 1, THRESHOLD, WHOLE, OWN, SHOP, "", 8434, 1000, 0,
         8433, "threshold not met", 0},
        /* percent off: rate is the fraction paid; half up, capped */
        {"percent 0.85 of 33.33 (4.9995 -> 5.00)", ACTIVE, 1, PERCENT, WHOLE, OWN, SHOP, "", 0,
         100000, 8500, 3333, NULL, 500},
        {"percent 0.85 of 33.29 (4.9935 -> 4.99)", ACTIVE, 1, PERCENT, WHOLE, OWN, SHOP, "", 0,
         100000, 8500, 3329, NULL, 499},
        {"percent capped", ACTIVE, 1, PERCENT, WHOLE, OWN, SHOP, "", 0, 300, 5000, 8433, NULL, 300},
        {"percent threshold short", ACTIVE, 1, PERCENT, WHOLE, OWN, SHOP, "", 10000, 100000, 9000,
         8433, "threshold not met", 0},
        {"percent of a goods item", ACTIVE, 1, PERCENT, GOODS, OWN, SHOP, "sku-a", 0, 100000, 9000,
         8433, NULL, 500},
        {"percent rate 1: no discount is no rule", ACTIVE, 1, PERCENT, WHOLE, OWN, SHOP, "", 0, 100,
         10000, 8433, "invalid rule", 0},
        {"an unknown type", ACTIVE, 1, 9, WHOLE, OWN, SHOP, "", 0, 100, 0, 8433, "invalid rule", 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tpl t = {.id = 1,
                 .shop_number = v[i].shop,
                 .source = v[i].source,
                 .target = v[i].target,
                 .type = v[i].type,
                 .status = v[i].status,
                 .goods = (char *)v[i].goods,
                 .valid_end_ms = NOW + v[i].end,
                 .terms_cents = v[i].terms,
                 .max_discount_cents = v[i].max,
                 .discount_rate = v[i].rate};
        discount_rule r;
        discount_order o = {.amount_cents = v[i].order,
                            .shop_number = SHOP,
                            .goods = order_goods,
                            .n_goods = sizeof(order_goods) / sizeof(order_goods[0])};
        cqfit_verdict got;
        discount_rule_from_tpl(&t, &r);
        cqfit_judge(&t, &r, &o, NOW, &got);
        int bad = !got.found || got.amount_cents != v[i].want ||
                  (got.reason ? !v[i].reason || strcmp(got.reason, v[i].reason) != 0
                              : v[i].reason != NULL);
        if (bad)
            printf("  case \"%s\": %s, %lld; want %s, %lld\n", v[i].what,
                   got.reason ? got.reason : "available", (long long)got.amount_cents,
                   v[i].reason ? v[i].reason : "available", (long long)v[i].want);
        CHECK(!bad);
    }
}

/* ------------------------------------------------------------------ the lists */

#define MAX_ROWS 8
#define MAX_TPLS 4
#define END      -1 /* ends a list of ids */
#define MISSING  -1 /* a template found nowhere */
#define NO       -2 /* a template that does not fit */

static void test_order(void)
{
    /* Coupons as the database lists them (ending first, then by id): id, end (relative to NOW),
     * template; each template's amount (MISSING, NO, or what it saves); the lists' ids. */
    static const struct {
        const char *what;
        struct {
            int64_t id, end;
            uint32_t k;
        } c[MAX_ROWS];
        size_t n, ntpl;
        int64_t amount[MAX_TPLS];
        int64_t ok[MAX_ROWS + 1], no[MAX_ROWS + 1]; /* ids, END-terminated */
    } v[] = {
        {"none", {{0}}, 0, 0, {0}, {END}, {END}},
        {"largest amount first",
         {{1, 10, 0}, {2, 20, 1}, {3, 30, 2}},
         3,
         3,
         {100, 300, 200},
         {2, 3, 1, END},
         {END}},
        {"listed smallest first, answered largest first",
         {{1, 10, 0}, {2, 20, 1}, {3, 30, 2}, {4, 40, 3}},
         4,
         4,
         {100, 200, 300, 400},
         {4, 3, 2, 1, END},
         {END}},
        {"equal amounts keep ending first, then id",
         {{5, 10, 1}, {4, 20, 0}, {6, 20, 1}, {3, 30, 0}},
         4,
         2,
         {700, 700},
         {5, 4, 6, 3, END},
         {END}},
        {"a template's coupons together only by amount",
         {{1, 10, 0}, {2, 11, 1}, {3, 12, 0}, {4, 13, 1}},
         4,
         2,
         {100, 900},
         {2, 4, 1, 3, END},
         {END}},
        {"not available ones keep the listed order",
         {{9, 10, 1}, {8, 20, 0}, {7, 30, 1}},
         3,
         2,
         {50, NO},
         {8, END},
         {9, 7, END}},
        {"a zero discount is still available, last",
         {{1, 10, 0}, {2, 20, 1}},
         2,
         2,
         {0, 1},
         {2, 1, END},
         {END}},
        {"ended since read: left out of both lists",
         {{1, 0, 0}, {2, -5, 1}, {3, 1, 0}, {4, 1, 1}},
         4,
         2,
         {10, NO},
         {3, END},
         {4, END}},
        {"a template found nowhere: its coupons left out",
         {{1, 10, 0}, {2, 20, 1}, {3, 30, 2}},
         3,
         3,
         {MISSING, 5, NO},
         {2, END},
         {3, END}},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        cqfit_coupon c[MAX_ROWS];
        cqfit_verdict vd[MAX_TPLS];
        size_t ok[MAX_ROWS], no[MAX_ROWS], nok = 99, nno = 99;
        void *scratch = malloc(cqfit_scratch_size(v[i].ntpl));
        int bad = 0;
        for (size_t k = 0; k < v[i].n; k++)
            c[k] = (cqfit_coupon){.id = v[i].c[k].id,
                                  .tpl_id = 100 + v[i].c[k].k,
                                  .valid_end_ms = NOW + v[i].c[k].end,
                                  .k = v[i].c[k].k};
        for (size_t k = 0; k < v[i].ntpl; k++)
            vd[k] = v[i].amount[k] == MISSING ? (cqfit_verdict){.found = 0}
                    : v[i].amount[k] == NO
                        ? (cqfit_verdict){.found = 1, .reason = "other shop"}
                        : (cqfit_verdict){.found = 1, .amount_cents = v[i].amount[k]};
        cqfit_order(c, v[i].n, vd, v[i].ntpl, NOW, scratch, ok, &nok, no, &nno);
        size_t k = 0;
        for (; v[i].ok[k] != END; k++)
            bad |= k >= nok || c[ok[k]].id != v[i].ok[k];
        bad |= k != nok;
        for (k = 0; v[i].no[k] != END; k++)
            bad |= k >= nno || c[no[k]].id != v[i].no[k];
        bad |= k != nno;
        if (bad) {
            printf("  case \"%s\": available", v[i].what);
            for (k = 0; k < nok && k < MAX_ROWS; k++)
                printf(" %lld", (long long)c[ok[k]].id);
            printf("; not available");
            for (k = 0; k < nno && k < MAX_ROWS; k++)
                printf(" %lld", (long long)c[no[k]].id);
            printf("\n");
        }
        CHECK(!bad);
        free(scratch);
    }
}

/* The rank of each available template: its place among the distinct amounts. */
static void test_ranks(void)
{
    cqfit_coupon c[1] = {{.id = 1, .valid_end_ms = NOW + 1, .k = 0}};
    cqfit_verdict vd[5] = {
        {.found = 1, .amount_cents = 300},           {.found = 1, .amount_cents = 500},
        {.found = 1, .amount_cents = 300},           {.found = 1, .amount_cents = 100},
        {.found = 1, .reason = "threshold not met"},
    };
    size_t ok[1], no[1], nok, nno;
    void *scratch = malloc(cqfit_scratch_size(5));
    cqfit_order(c, 1, vd, 5, NOW, scratch, ok, &nok, no, &nno);
    CHECK_EQ_INT(vd[0].rank, 1);
    CHECK_EQ_INT(vd[1].rank, 0);
    CHECK_EQ_INT(vd[2].rank, 1);
    CHECK_EQ_INT(vd[3].rank, 2);
    CHECK_EQ_INT(nok, 1);
    CHECK_EQ_INT(nno, 0);
    free(scratch);
}

/* The database's order, on milliseconds: ending first, then by id. */
static void test_cmp(void)
{
    cqfit_coupon c[] = {
        {.id = 9, .valid_end_ms = 2000}, {.id = 3, .valid_end_ms = 1000},
        {.id = 1, .valid_end_ms = 2000}, {.id = 7, .valid_end_ms = 1000},
        {.id = 5, .valid_end_ms = 1999}, {.id = INT64_MAX, .valid_end_ms = 1},
    };
    static const int64_t want[] = {INT64_MAX, 3, 7, 5, 1, 9};
    qsort(c, 6, sizeof(c[0]), cqfit_cmp);
    for (size_t i = 0; i < 6; i++)
        CHECK_EQ_INT(c[i].id, want[i]);
    CHECK_EQ_INT(cqfit_cmp(&c[0], &c[0]), 0);
}

/* A list cut at its limit is kept until its first coupon ends; a whole one until it changes. */
static void test_kept_until(void)
{
    static const cqfit_coupon c[] = {
        {.id = 1, .valid_end_ms = 3000},
        {.id = 2, .valid_end_ms = 1000},
        {.id = 3, .valid_end_ms = 2000},
    };
    static const struct {
        size_t n, limit;
        int64_t want;
    } v[] = {
        {0, 3, INT64_MAX}, {2, 3, INT64_MAX}, {3, 4, INT64_MAX},
        {3, 3, 1000},      {1, 1, 3000},      {0, 0, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int64_t got = cqfit_kept_until(c, v[i].n, v[i].limit);
        if (got != v[i].want)
            printf("  case %zu: %zu rows, limit %zu: %lld\n", i, v[i].n, v[i].limit,
                   (long long)got);
        CHECK_EQ_INT(got, v[i].want);
    }
}

int main(void)
{
    RUN(test_read_order);
    RUN(test_read_order_goods);
    RUN(test_judge);
    RUN(test_order);
    RUN(test_ranks);
    RUN(test_cmp);
    RUN(test_kept_until);
    TEST_MAIN_END();
}
