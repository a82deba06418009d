/* The reference's reminder bitmap (remind_bit): bit = type * 12 + remindTime / 5 - 1, with the
 * validation the reference lacked (type 0 or 1, remindTime a multiple of 5 up to 60). */
#include "../remind.h"
#include "testhelp.h"

static void test_bits_of_the_reference(void)
{
    CHECK_EQ_INT(remind_bit(0, 5), 0);
    CHECK_EQ_INT(remind_bit(0, 10), 1);
    CHECK_EQ_INT(remind_bit(0, 60), 11);
    CHECK_EQ_INT(remind_bit(1, 5), 12);
    CHECK_EQ_INT(remind_bit(1, 60), 23);
}

static void test_every_slot_distinct(void)
{
    unsigned long long seen = 0;
    for (int type = 0; type < REMIND_TYPES; type++)
        for (int m = 5; m <= 60; m += 5) {
            int b = remind_bit(type, m);
            CHECK(b >= 0 && b < 64);
            CHECK(!(seen & (1ULL << b)));
            seen |= 1ULL << b;
        }
    CHECK_EQ_INT(__builtin_popcountll(seen), 24);
}

static void test_refused_inputs(void)
{
    CHECK_EQ_INT(remind_bit(2, 5), -1); /* unknown type (the reference threw an NPE) */
    CHECK_EQ_INT(remind_bit(-1, 5), -1);
    CHECK_EQ_INT(remind_bit(0, 0), -1);
    CHECK_EQ_INT(remind_bit(0, 7), -1);  /* not a multiple of 5 (the reference accepted it) */
    CHECK_EQ_INT(remind_bit(0, 65), -1); /* earlier than 60 minutes before the start */
    CHECK_EQ_INT(remind_bit(1, -5), -1);
}

int main(void)
{
    RUN(test_bits_of_the_reference);
    RUN(test_every_slot_distinct);
    RUN(test_refused_inputs);
    TEST_MAIN_END();
}
