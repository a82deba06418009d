/* grow.h: the one growing array. */
#include <stdint.h>
#include <stdlib.h>

#include "grow.h"
#include "testhelp.h"

static void test_doubles_from_first(void)
{
    static const struct {
        size_t cap, need, first, want; /* capacity before, room asked, first size, after */
    } cases[] = {
        {0, 1, 16, 16},    {0, 17, 16, 32}, {16, 16, 16, 16}, {16, 17, 16, 32},
        {16, 100, 8, 128}, {0, 1, 0, 1},    {3, 4, 99, 6},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t cap = cases[i].cap;
        int64_t *v = cap ? calloc(cap, sizeof(*v)) : NULL;
        CHECK_EQ_INT(grow(&v, &cap, cases[i].need, sizeof(*v), cases[i].first), QN_OK);
        CHECK_EQ_INT(cap, cases[i].want);
        CHECK(v != NULL);
        for (size_t k = 0; v && k < cases[i].need; k++)
            v[k] = (int64_t)k; /* the room is there (ASan) */
        free(v);
    }
}

static void test_failure_changes_nothing(void)
{
    size_t cap = 4;
    char *v = malloc(4), *before = v;
    CHECK_EQ_INT(grow(&v, &cap, (size_t)-1 / 2, 4, 4), QN_ENOMEM); /* too large to ask */
    CHECK_EQ_INT(grow(&v, &cap, (size_t)-1, 1, 4), QN_ENOMEM);     /* past any doubling */
    CHECK(v == before);
    CHECK_EQ_INT(cap, 4);
    free(v);
}

int main(void)
{
    RUN(test_doubles_from_first);
    RUN(test_failure_changes_nothing);
    TEST_MAIN_END();
}
