/* The payment lifecycle's state machine (see paymove.h). */
#include "paymove.h"

#include <stddef.h>

#include "ucoupon.h"

static const paymove paymoves[] = {
    [PAY_CREATE] = {-1, SETTLE_LOCKED, UCOUPON_UNUSED, UCOUPON_LOCKED, "lock"},
    [PAY_PROCESS] = {SETTLE_LOCKED, SETTLE_PAID, UCOUPON_LOCKED, UCOUPON_USED, "pay"},
    [PAY_REFUND] = {SETTLE_PAID, SETTLE_REFUNDED, UCOUPON_USED, UCOUPON_UNUSED, "refund"},
    [PAY_CANCEL] = {SETTLE_LOCKED, SETTLE_CANCELLED, UCOUPON_LOCKED, UCOUPON_UNUSED, "cancel"},
    [PAY_TIMEOUT] = {SETTLE_LOCKED, SETTLE_CANCELLED, UCOUPON_LOCKED, UCOUPON_UNUSED, "time out"},
};

static const char *const paymove_settle_names[] = {"locked", "cancelled", "paid", "refunded"};
static const char *const paymove_coupon_names[] = {"unused", "locked", "used", "expired",
                                                   "revoked"};

const paymove *paymove_of(pay_kind kind)
{
    return &paymoves[kind];
}

paymove_plan paymove_decide(pay_kind kind, bool found, int settle_status, bool other_active,
                            int coupon_status, bool two_databases)
{
    const paymove *m = &paymoves[kind];
    if (!found)
        return PAYMOVE_NOT_FOUND;
    if (settle_status == m->s_from && coupon_status == m->c_from)
        return PAYMOVE_BOTH;
    /* Interrupted between the two databases (or the timer fired twice): the settlement moved,
     * the coupon did not, and no other settlement holds it. */
    if (settle_status == m->s_to && coupon_status == m->c_from && !other_active && two_databases)
        return PAYMOVE_COUPON_ONLY;
    /* A create interrupted between the databases left a locked settlement beside an unused
     * coupon: cancelling (by hand or by the timer) ends the settlement alone. */
    if ((kind == PAY_CANCEL || kind == PAY_TIMEOUT) && settle_status == SETTLE_LOCKED &&
        coupon_status == UCOUPON_UNUSED && two_databases)
        return PAYMOVE_SETTLEMENT_ONLY;
    return PAYMOVE_REFUSE;
}

const char *paymove_settle_name(int s)
{
    return s >= 0 && s <= 3 ? paymove_settle_names[s] : "unknown";
}

const char *paymove_coupon_name(int s)
{
    return s >= 0 && s <= 4 ? paymove_coupon_names[s] : "unknown";
}
