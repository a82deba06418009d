/* coupon-query's decisions (cqfit.h). */
#include "cqfit.h"

#include <string.h>

qn_status cqfit_read_order(const cJSON *body, discount_order *o, discount_goods **goods,
                           jsonin_err *err)
{
    qn_status st;
    memset(o, 0, sizeof(*o));
    *goods = NULL;
    if ((st = jsonin_money_cents(body, "orderAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS,
                                 &o->amount_cents, err)) != QN_OK ||
        (st = jsonin_int64(body, "shopNumber", JSONIN_REQUIRED, 0, 0, INT64_MAX, &o->shop_number,
                           err)) != QN_OK ||
        (st = discount_read_goods(body, goods, &o->n_goods, err)) != QN_OK)
        return st;
    o->goods = *goods;
    return QN_OK;
}

void cqfit_judge(const tpl *t, const discount_rule *r, const discount_order *o, int64_t now_ms,
                 cqfit_verdict *v)
{
    discount_result res;
    discount_reason why;
    *v = (cqfit_verdict){.found = 1};
    if (tpl_ended(t, now_ms))
        v->reason = CQFIT_TEMPLATE_ENDED;
    else if ((why = discount_apply(r, o, &res)) != DISCOUNT_OK)
        v->reason = discount_reason_str(why);
    else
        v->amount_cents = res.discount_cents;
}

int cqfit_cmp(const void *a, const void *b)
{
    const cqfit_coupon *x = a, *y = b;
    if (x->valid_end_ms != y->valid_end_ms)
        return x->valid_end_ms < y->valid_end_ms ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int64_t cqfit_kept_until(const cqfit_coupon *c, size_t n, size_t limit)
{
    int64_t until = INT64_MAX;
    if (n < limit)
        return until; /* the whole list: a new coupon changes the wallet */
    for (size_t i = 0; i < n; i++)
        if (c[i].valid_end_ms < until)
            until = c[i].valid_end_ms;
    return until;
}

size_t cqfit_scratch_size(size_t ntpl)
{
    return ntpl * sizeof(int64_t) + (ntpl + 1) * sizeof(size_t);
}

/* Available at now_ms: its coupon has not ended, its template was found and fits. */
static int cqfit_listed_ok(const cqfit_coupon *c, const cqfit_verdict *vd, int64_t now_ms)
{
    return c->valid_end_ms > now_ms && vd[c->k].found && !vd[c->k].reason;
}

void cqfit_order(const cqfit_coupon *c, size_t n, cqfit_verdict *vd, size_t ntpl, int64_t now_ms,
                 void *scratch, size_t *ok, size_t *nok, size_t *no, size_t *nno)
{
    int64_t *amounts = scratch; /* [ntpl]: the available amounts, then the distinct */
    size_t *next = (size_t *)(amounts + ntpl); /* [ntpl + 1]: per rank, where its next goes */
    size_t namounts = 0, distinct = 0;

    for (size_t k = 0; k < ntpl; k++)
        if (vd[k].found && !vd[k].reason)
            amounts[namounts++] = vd[k].amount_cents;
    for (size_t i = 1; i < namounts; i++) { /* largest first; a few, one per template */
        int64_t a = amounts[i];
        size_t at = i;
        for (; at > 0 && amounts[at - 1] < a; at--)
            amounts[at] = amounts[at - 1];
        amounts[at] = a;
    }
    for (size_t i = 0; i < namounts; i++)
        if (i == 0 || amounts[i] != amounts[distinct - 1])
            amounts[distinct++] = amounts[i];
    for (size_t k = 0; k < ntpl; k++) {
        if (!vd[k].found || vd[k].reason)
            continue;
        size_t lo = 0, hi = distinct; /* amounts[0..distinct) is strictly decreasing */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (amounts[mid] > vd[k].amount_cents)
                lo = mid + 1;
            else
                hi = mid;
        }
        vd[k].rank = lo;
    }

    /* Count the available coupons per rank (next[r + 1]), then turn the counts into where
     * each rank's first coupon goes (next[r]). */
    memset(next, 0, (distinct + 1) * sizeof(*next));
    for (size_t i = 0; i < n; i++)
        if (cqfit_listed_ok(&c[i], vd, now_ms))
            next[vd[c[i].k].rank + 1]++;
    for (size_t r = 1; r <= distinct; r++)
        next[r] += next[r - 1];
    *nok = *nno = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i].valid_end_ms <= now_ms || !vd[c[i].k].found)
            continue; /* ended since the rows were read; or no template: no option */
        if (vd[c[i].k].reason) {
            no[(*nno)++] = i;
        } else {
            ok[next[vd[c[i].k].rank]++] = i;
            (*nok)++;
        }
    }
}
