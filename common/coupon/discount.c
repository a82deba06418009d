#include "discount.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void discount_rule_from_tpl(const tpl *t, discount_rule *r)
{
    memset(r, 0, sizeof(*r));
    r->type = t->type;
    r->target = t->target;
    r->source = t->source;
    r->shop_number = t->shop_number;
    r->goods = t->goods;
    r->terms_cents = t->terms_cents;
    r->max_discount_cents = t->max_discount_cents;
    r->discount_rate = t->discount_rate;
}

int64_t discount_percent_off(int64_t base_cents, int rate_paid)
{
    /* base = q * S + rem, so base * off / S = q * off + rem * off / S: q * off <= base and
     * rem * off < S * S, so nothing overflows even for base near INT64_MAX. */
    const int64_t scale = TPL_RATE_SCALE;
    int64_t off = scale - rate_paid;
    int64_t q = base_cents / scale, rem = base_cents % scale;
    return q * off + (rem * off + scale / 2) / scale;
}

static int64_t discount_min(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

discount_reason discount_on_base(const discount_rule *r, int64_t base_cents,
                                 int64_t *discount_cents)
{
    int64_t d;
    *discount_cents = 0;
    if (base_cents < 0 || r->max_discount_cents < 0 || r->terms_cents < 0)
        return DISCOUNT_BAD_RULE;
    switch (r->type) {
    case TPL_TYPE_FIXED:
        d = discount_min(r->max_discount_cents, base_cents);
        break;
    case TPL_TYPE_THRESHOLD:
        if (base_cents < r->terms_cents)
            return DISCOUNT_THRESHOLD_NOT_MET;
        d = discount_min(r->max_discount_cents, base_cents);
        break;
    case TPL_TYPE_PERCENT:
        /* The API allows 0 < rate < 1 only: 0 would be "free", 1 "no discount". */
        if (r->discount_rate <= 0 || r->discount_rate >= TPL_RATE_SCALE)
            return DISCOUNT_BAD_RULE;
        if (base_cents < r->terms_cents)
            return DISCOUNT_THRESHOLD_NOT_MET;
        d = discount_min(discount_percent_off(base_cents, r->discount_rate), r->max_discount_cents);
        break;
    default:
        return DISCOUNT_BAD_RULE;
    }
    *discount_cents = d;
    return DISCOUNT_OK;
}

discount_reason discount_apply(const discount_rule *r, const discount_order *o,
                               discount_result *out)
{
    memset(out, 0, sizeof(*out));
    out->goods_index = -1;
    if (r->source == TPL_SOURCE_SHOP && o->shop_number != r->shop_number) {
        out->reason = DISCOUNT_OTHER_SHOP;
        return out->reason;
    }
    if (r->target == TPL_TARGET_SHOP) {
        out->base_cents = o->amount_cents;
    } else if (r->target == TPL_TARGET_GOODS) {
        if (!r->goods || !r->goods[0]) {
            out->reason = DISCOUNT_BAD_RULE;
            return out->reason;
        }
        for (size_t i = 0; i < o->n_goods; i++) {
            if (o->goods[i].goods_number && strcmp(o->goods[i].goods_number, r->goods) == 0) {
                out->goods_index = (long)i;
                out->base_cents = o->goods[i].amount_cents;
                break;
            }
        }
        if (out->goods_index < 0) {
            out->reason = DISCOUNT_GOODS_NOT_IN_ORDER;
            return out->reason;
        }
    } else {
        out->reason = DISCOUNT_BAD_RULE;
        return out->reason;
    }
    out->reason = discount_on_base(r, out->base_cents, &out->discount_cents);
    return out->reason;
}

const char *discount_reason_str(discount_reason r)
{
    switch (r) {
    case DISCOUNT_OK:
        return "ok";
    case DISCOUNT_THRESHOLD_NOT_MET:
        return "threshold not met";
    case DISCOUNT_GOODS_NOT_IN_ORDER:
        return "goods not in order";
    case DISCOUNT_OTHER_SHOP:
        return "other shop";
    case DISCOUNT_BAD_RULE:
        return "invalid rule";
    }
    return "invalid rule";
}

qn_status discount_read_goods(const cJSON *body, discount_goods **goods, size_t *n, jsonin_err *err)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(body, "goodsList");
    char prefix[32];
    *goods = NULL;
    *n = 0;
    if (!list || cJSON_IsNull(list))
        return QN_OK;
    if (!cJSON_IsArray(list)) {
        jsonin_errf(err, "goodsList", "must be an array");
        return QN_EINVAL;
    }
    int count = cJSON_GetArraySize(list);
    if (count > DISCOUNT_MAX_GOODS) {
        jsonin_errf(err, "goodsList", "at most %d items", DISCOUNT_MAX_GOODS);
        return QN_EINVAL;
    }
    if (count == 0)
        return QN_OK;
    discount_goods *g = calloc((size_t)count, sizeof(*g));
    if (!g) {
        jsonin_errf(err, "goodsList", "too large");
        return QN_ENOMEM;
    }
    for (int i = 0; i < count; i++) {
        const cJSON *it = cJSON_GetArrayItem(list, i);
        snprintf(prefix, sizeof(prefix), "goodsList[%d]", i);
        if (!cJSON_IsObject(it)) {
            jsonin_errf(err, prefix, "must be an object");
            goto fail;
        }
        if (jsonin_string(it, "goodsNumber", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, TPL_GOODS_MAX,
                          &g[i].goods_number, err) ||
            jsonin_money_cents(it, "goodsAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS,
                               &g[i].amount_cents, err) ||
            jsonin_money_cents(it, "goodsPayableAmount", JSONIN_OPTIONAL, -1, 0, DISCOUNT_MAX_CENTS,
                               &g[i].payable_cents, err)) {
            jsonin_err_prefix(err, prefix);
            goto fail;
        }
    }
    *goods = g;
    *n = (size_t)count;
    return QN_OK;
fail:
    free(g);
    return QN_EINVAL;
}
