/* The payment lifecycle's state machine (paymove.h), every kind of call against every state of
 * the two rows it may find: what it does, and that a crash between the two databases is
 * finished by the next call rather than refused. */
#include "../paymove.h"
#include "testhelp.h"
#include "ucoupon.h"

enum { L = SETTLE_LOCKED, C = SETTLE_CANCELLED, P = SETTLE_PAID, R = SETTLE_REFUNDED };
enum { U = UCOUPON_UNUSED, K = UCOUPON_LOCKED, S = UCOUPON_USED, X = UCOUPON_EXPIRED };

static void test_moves(void)
{
    /* Each move leaves the coupon where the next move starts: lock -> pay -> refund. */
    CHECK_EQ_INT(paymove_of(PAY_CREATE)->c_to, paymove_of(PAY_PROCESS)->c_from);
    CHECK_EQ_INT(paymove_of(PAY_PROCESS)->c_to, paymove_of(PAY_REFUND)->c_from);
    CHECK_EQ_INT(paymove_of(PAY_REFUND)->c_to, paymove_of(PAY_CREATE)->c_from);
    CHECK_EQ_INT(paymove_of(PAY_CREATE)->s_to, paymove_of(PAY_CANCEL)->s_from);
    /* The timeout is a cancel. */
    CHECK_EQ_INT(paymove_of(PAY_TIMEOUT)->s_to, paymove_of(PAY_CANCEL)->s_to);
    CHECK_EQ_INT(paymove_of(PAY_TIMEOUT)->c_to, paymove_of(PAY_CANCEL)->c_to);
    CHECK_EQ_STR(paymove_of(PAY_REFUND)->verb, "refund");
}

static void test_decisions(void)
{
    static const struct {
        pay_kind kind;
        int found, settle, other, coupon, two_dbs;
        paymove_plan want;
    } v[] = {
        /* Nothing to act on. */
        {PAY_PROCESS, 0, L, 0, K, 0, PAYMOVE_NOT_FOUND},
        {PAY_TIMEOUT, 0, L, 0, K, 1, PAYMOVE_NOT_FOUND},
        /* The moves, from their states, in one database or two. */
        {PAY_PROCESS, 1, L, 0, K, 0, PAYMOVE_BOTH},
        {PAY_PROCESS, 1, L, 0, K, 1, PAYMOVE_BOTH},
        {PAY_REFUND, 1, P, 0, S, 1, PAYMOVE_BOTH},
        {PAY_CANCEL, 1, L, 0, K, 0, PAYMOVE_BOTH},
        {PAY_TIMEOUT, 1, L, 0, K, 1, PAYMOVE_BOTH},
        /* Stopped between the databases: the settlement moved, the coupon did not. */
        {PAY_PROCESS, 1, P, 0, K, 1, PAYMOVE_COUPON_ONLY},
        {PAY_REFUND, 1, R, 0, S, 1, PAYMOVE_COUPON_ONLY},
        {PAY_CANCEL, 1, C, 0, K, 1, PAYMOVE_COUPON_ONLY},
        {PAY_TIMEOUT, 1, C, 0, K, 1, PAYMOVE_COUPON_ONLY}, /* the timer fired twice */
        /* ... but not when another settlement holds the coupon now, nor in one database (one
         * transaction: a half-done state cannot be). */
        {PAY_CANCEL, 1, C, 1, K, 1, PAYMOVE_REFUSE},
        {PAY_PROCESS, 1, P, 0, K, 0, PAYMOVE_REFUSE},
        /* A create stopped between the databases: locked settlement, unused coupon. */
        {PAY_CANCEL, 1, L, 0, U, 1, PAYMOVE_SETTLEMENT_ONLY},
        {PAY_TIMEOUT, 1, L, 0, U, 1, PAYMOVE_SETTLEMENT_ONLY},
        {PAY_PROCESS, 1, L, 0, U, 1, PAYMOVE_REFUSE}, /* not paid: the coupon was never locked */
        {PAY_CANCEL, 1, L, 0, U, 0, PAYMOVE_REFUSE},
        /* Settled facts: refused. */
        {PAY_PROCESS, 1, P, 0, S, 1, PAYMOVE_REFUSE}, /* paid already */
        {PAY_REFUND, 1, L, 0, K, 0, PAYMOVE_REFUSE},  /* not paid */
        {PAY_REFUND, 1, R, 0, U, 1, PAYMOVE_REFUSE},  /* refunded already */
        {PAY_CANCEL, 1, P, 0, S, 0, PAYMOVE_REFUSE},  /* paid: refund it instead */
        {PAY_TIMEOUT, 1, P, 0, S, 1, PAYMOVE_REFUSE}, /* paid before the timer fired */
        {PAY_PROCESS, 1, L, 0, X, 0, PAYMOVE_REFUSE}, /* the coupon expired meanwhile */
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        paymove_plan got = paymove_decide(v[i].kind, v[i].found, v[i].settle, v[i].other,
                                          v[i].coupon, v[i].two_dbs);
        if (got != v[i].want)
            printf("  case %zu: %s, settlement %s, coupon %s\n", i, paymove_of(v[i].kind)->verb,
                   paymove_settle_name(v[i].settle), paymove_coupon_name(v[i].coupon));
        CHECK_EQ_INT(got, v[i].want);
    }
}

/* Every state a call can meet: it acts, finishes a half-done move, or refuses; it acts on
 * both rows only from its move's own starting states. */
static void test_every_state(void)
{
    for (int kind = PAY_PROCESS; kind <= PAY_TIMEOUT; kind++)
        for (int s = L; s <= R; s++)
            for (int c = U; c <= UCOUPON_REVOKED; c++)
                for (int two = 0; two < 2; two++) {
                    const paymove *m = paymove_of((pay_kind)kind);
                    paymove_plan p = paymove_decide((pay_kind)kind, 1, s, 0, c, two);
                    CHECK((p == PAYMOVE_BOTH) == (s == m->s_from && c == m->c_from));
                    if (p == PAYMOVE_COUPON_ONLY)
                        CHECK(two && s == m->s_to && c == m->c_from);
                    if (!two)
                        CHECK(p == PAYMOVE_BOTH || p == PAYMOVE_REFUSE);
                }
    CHECK_EQ_STR(paymove_settle_name(9), "unknown");
    CHECK_EQ_STR(paymove_coupon_name(UCOUPON_REVOKED), "revoked");
}

int main(void)
{
    RUN(test_moves);
    RUN(test_decisions);
    RUN(test_every_state);
    TEST_MAIN_END();
}
