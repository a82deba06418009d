/* The one way a claim's database state changes (claimdb_set): the whole table, and that a
 * change it refuses keeps the state. */
#include "../claimdb.h"
#include "log.h"
#include "testhelp.h"

enum {
    P = CLAIMDB_PENDING,
    N = CLAIMDB_NEW,
    D = CLAIMDB_DUP,
    RS = CLAIMDB_REFUSED_STOCK,
    RL = CLAIMDB_REFUSED_SLOT,
    F = CLAIMDB_FAILED,
    V = CLAIMDB_VOID
};

static void test_table(void)
{
    /* from (row) -> to (column): 1 allowed */
    static const int ok[CLAIMDB_STATES][CLAIMDB_STATES] = {
        /*        P  N  D  RS RL F  V */
        [P] = {1, 1, 1, 1, 1, 1, 1}, /* decided once, into anything */
        [N] = {1, 0, 0, 0, 0, 1, 0}, /* its transaction failed: not written after all */
        [D] = {1, 0, 0, 0, 0, 1, 0},
        [RS] = {1, 0, 0, 0, 0, 0, 0}, /* refusals, failures and a void attempt are final, */
        [RL] = {1, 0, 0, 0, 0, 0, 0}, /* but for being forgotten (asked again) */
        [F] = {1, 0, 0, 0, 0, 0, 0},
        [V] = {1, 0, 0, 0, 0, 0, 0},
    };
    for (int from = 0; from < CLAIMDB_STATES; from++)
        for (int to = 0; to < CLAIMDB_STATES; to++) {
            int got = claimdb_change_ok((claimdb_state)from, (claimdb_state)to);
            if (got != ok[from][to])
                printf("  %s -> %s: %d\n", claimdb_state_name((claimdb_state)from),
                       claimdb_state_name((claimdb_state)to), got);
            CHECK_EQ_INT(got, ok[from][to]);
            claimdb_item it = {.state = (claimdb_state)from};
            claimdb_set(&it, (claimdb_state)to);
            CHECK_EQ_INT(it.state, ok[from][to] ? to : from);
        }
    CHECK(!claimdb_change_ok((claimdb_state)CLAIMDB_STATES, CLAIMDB_PENDING));
    CHECK(!claimdb_change_ok(CLAIMDB_PENDING, (claimdb_state)-1));
}

static void test_names(void)
{
    CHECK_EQ_STR(claimdb_state_name(CLAIMDB_REFUSED_SLOT), "refused_slot");
    CHECK_EQ_STR(claimdb_state_name((claimdb_state)CLAIMDB_STATES), "unknown");
}

int main(void)
{
    log_init("test", LOGL_OFF); /* the refused changes log an error each */
    RUN(test_table);
    RUN(test_names);
    TEST_MAIN_END();
}
