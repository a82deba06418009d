/*
 * The one discount function of Quan (docs/architecture.md, rule 7), shared by
 * settlement (which coupons fit an order) and engine payment (the payable amount a client
 * sends must match). Pure integer arithmetic in cents, no allocation, thread-safe.
 *
 * The base amount is the order amount for a whole-shop coupon (target 1), or the amount of the
 * order's goods item whose goodsNumber equals the template's goods for a goods coupon
 * (target 0; the first such item when a number repeats). Then, with T = termsOfUse,
 * M = maximumDiscountAmount and r = discountRate (the fraction PAID, x 10000):
 *
 *   type 0 fixed      always          discount = min(M, base)
 *   type 1 threshold  base >= T       discount = min(M, base)
 *   type 2 percent    base >= T       discount = min(round_half_up(base x (1 - r)), M)
 *
 * A shop coupon (source 0) applies only to orders of its own shop. The discount never
 * exceeds the base, so the payable amount is never negative.
 */
#ifndef QUAN_DISCOUNT_H
#define QUAN_DISCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include "jsonin.h"
#include "status.h"
#include "template.h"

/* Why a coupon does not apply (DISCOUNT_OK when it does). */
typedef enum {
    DISCOUNT_OK = 0,
    DISCOUNT_THRESHOLD_NOT_MET, /* base below termsOfUse */
    DISCOUNT_GOODS_NOT_IN_ORDER,
    DISCOUNT_OTHER_SHOP, /* a shop coupon of another shop */
    DISCOUNT_BAD_RULE,   /* unknown type/target, rate out of (0, 1), negative amounts */
} discount_reason;

/* The parts of a template the computation reads. goods is borrowed. */
typedef struct discount_rule {
    int type;   /* TPL_TYPE_* */
    int target; /* TPL_TARGET_* */
    int source; /* TPL_SOURCE_* */
    int64_t shop_number;
    const char *goods; /* target 0: the goods number; may be NULL otherwise */
    int64_t terms_cents;
    int64_t max_discount_cents;
    int discount_rate; /* fraction paid x TPL_RATE_SCALE, type 2 only */
} discount_rule;

#define DISCOUNT_MAX_CENTS 100000000000000LL /* 1e12 yuan: far beyond any order */
#define DISCOUNT_MAX_GOODS 1000

/* One order line; goods_number borrowed. */
typedef struct discount_goods {
    const char *goods_number;
    int64_t amount_cents;
    int64_t payable_cents; /* goodsPayableAmount, -1 when not given (payment checks it) */
} discount_goods;

/* goods borrowed (n_goods entries, may be NULL when n_goods is 0). */
typedef struct discount_order {
    int64_t amount_cents;
    int64_t shop_number;
    const discount_goods *goods;
    size_t n_goods;
} discount_order;

typedef struct discount_result {
    discount_reason reason;
    int64_t base_cents;     /* the amount the rule was applied to (0 when not found) */
    int64_t discount_cents; /* 0 unless reason is DISCOUNT_OK */
    long goods_index;       /* target 0: index of the matched item in order->goods, else -1 */
} discount_result;

/*
 * Reads the API's goodsList (an optional array of {goodsNumber, goodsAmount,
 * goodsPayableAmount?}, at most DISCOUNT_MAX_GOODS items) from body. *goods is owned by the
 * caller (free), NULL when the list is absent or empty; goods_number strings are borrowed from
 * body. Errors name the item and field: "goodsList[1].goodsAmount: ...".
 */
qn_status discount_read_goods(const cJSON *body, discount_goods **goods, size_t *n,
                              jsonin_err *err) QN_MUSTCHECK;

/* Fills r from a parsed template; r->goods borrows t->goods (valid while t lives). */
void discount_rule_from_tpl(const tpl *t, discount_rule *r);

/*
 * The discount of a rule on a base amount alone (no shop or goods lookup). Returns
 * DISCOUNT_OK with *discount_cents set, or the reason it does not apply (*discount_cents 0).
 * No overflow for any base in [0, INT64_MAX].
 */
discount_reason discount_on_base(const discount_rule *r, int64_t base_cents,
                                 int64_t *discount_cents) QN_MUSTCHECK;

/* The full check of a coupon against an order. Returns out->reason. */
discount_reason discount_apply(const discount_rule *r, const discount_order *o,
                               discount_result *out) QN_MUSTCHECK;

/* round_half_up(base x (TPL_RATE_SCALE - rate_paid) / TPL_RATE_SCALE), overflow-free for any
 * base >= 0 and rate_paid in [0, TPL_RATE_SCALE]. */
int64_t discount_percent_off(int64_t base_cents, int rate_paid);

/* Stable short text of a reason: "threshold not met", "goods not in order", "other shop",
 * "invalid rule", "ok". */
const char *discount_reason_str(discount_reason r);

#endif
