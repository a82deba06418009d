/* What a chunk decides without a server: the outcomes dist_chunk.lua answers fitted onto the
 * chunk's rows (a replay of another cut of rows refused), the rows of a template that ended,
 * and each failure's cause as the report writes it. */
#include <stdlib.h>
#include <string.h>

#include "../chunk.h"
#include "testhelp.h"

#define MAX_ROWS 6

/* A chunk of rows with these user ids (0: not a valid one), its outcomes as chunk_reserve
 * leaves them before the script's answer: 0 for a user id, CHUNK_INVALID otherwise. */
static chunk chunk_of(const int64_t *users, size_t n)
{
    chunk c = {0};
    c.rows.rows = calloc(n ? n : 1, sizeof(*c.rows.rows));
    c.rows.n = c.rows.cap = n;
    c.outcome = calloc(n ? n : 1, sizeof(*c.outcome));
    c.cap = n;
    for (size_t i = 0; i < n; i++) {
        c.rows.rows[i].row = (int64_t)i + 2;
        c.rows.rows[i].user_id = users[i];
        c.outcome[i] = users[i] > 0 ? 0 : CHUNK_INVALID;
    }
    return c;
}

static void test_outcomes_read(void)
{
    static const struct {
        const char *what;
        int64_t users[MAX_ROWS];
        size_t n;
        const char *text;
        qn_status want;
        int outcome[MAX_ROWS]; /* when accepted */
    } v[] = {
        {"one each", {11, 12, 13}, 3, "1,-1,-3", QN_OK, {1, CHUNK_DUPLICATE, CHUNK_NO_STOCK}},
        {"rows without a user id are passed over",
         {0, 11, 0, 12},
         4,
         "2,-2",
         QN_OK,
         {CHUNK_INVALID, 2, CHUNK_INVALID, CHUNK_LIMIT}},
        {"no user id at all: nothing to read",
         {0, 0},
         2,
         "",
         QN_OK,
         {CHUNK_INVALID, CHUNK_INVALID}},
        {"an empty chunk", {0}, 0, "", QN_OK, {0}},
        {"every failure", {1, 2, 3, 4}, 4, "-1,-2,-3,-4", QN_OK, {-1, -2, -3, -4}},
        {"fewer outcomes than rows", {11, 12, 13}, 3, "1,1", QN_EINVAL, {0}},
        {"more outcomes than rows", {11, 12}, 2, "1,1,1", QN_EINVAL, {0}},
        {"nothing for a row", {11}, 1, "", QN_EINVAL, {0}},
        {"an outcome of 0", {11, 12}, 2, "1,0", QN_EINVAL, {0}},
        {"not a number", {11, 12}, 2, "1,x", QN_EINVAL, {0}},
        {"a trailing comma", {11}, 1, "1,", QN_EINVAL, {0}},
        {"another separator", {11, 12}, 2, "1;1", QN_EINVAL, {0}},
        {"beyond an int", {11}, 1, "4294967297", QN_EINVAL, {0}},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        chunk c = chunk_of(v[i].users, v[i].n);
        qn_status st = chunk_outcomes_read(&c, v[i].text);
        int bad = st != v[i].want;
        for (size_t k = 0; st == QN_OK && k < v[i].n; k++)
            bad |= c.outcome[k] != v[i].outcome[k];
        if (bad) {
            printf("  case \"%s\": %s,", v[i].what, qn_status_str(st));
            for (size_t k = 0; k < v[i].n; k++)
                printf(" %d", c.outcome[k]);
            printf("\n");
        }
        CHECK(!bad);
        chunk_free(&c);
    }
}

static void test_all_ended(void)
{
    static const int64_t users[] = {11, 0, 12, -3};
    chunk c = chunk_of(users, 4);
    c.outcome[0] = 1; /* whatever a row held before */
    chunk_all_ended(&c);
    CHECK_EQ_INT(c.outcome[0], CHUNK_ENDED);
    CHECK_EQ_INT(c.outcome[1], CHUNK_INVALID);
    CHECK_EQ_INT(c.outcome[2], CHUNK_ENDED);
    CHECK_EQ_INT(c.outcome[3], CHUNK_INVALID);
    chunk_free(&c);
}

static void test_causes(void)
{
    static const struct {
        int outcome;
        const char *cause; /* NULL: issued */
    } v[] = {
        {1, NULL},
        {7, NULL},
        {CHUNK_DUPLICATE, "duplicate in file"},
        {CHUNK_LIMIT, "limit reached"},
        {CHUNK_NO_STOCK, "out of stock"},
        {CHUNK_ENDED, "template ended"},
        {CHUNK_INVALID, "invalid user id"},
        {0, "internal error"}, /* never written: no outcome */
        {-9, "internal error"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        const char *got = chunk_cause(v[i].outcome);
        if (v[i].cause)
            CHECK_EQ_STR(got, v[i].cause);
        else
            CHECK(got == NULL);
    }
}

int main(void)
{
    RUN(test_outcomes_read);
    RUN(test_all_ended);
    RUN(test_causes);
    TEST_MAIN_END();
}
