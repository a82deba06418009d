/* What a chunk decides without a server: the outcomes dist_chunk.lua answers fitted onto the
 * chunk's rows (a replay of another cut of rows refused), the rows of a template that ended,
 * each failure's cause as the report writes it, and the split of a chunk's rows by stock
 * bucket with the keys of each bucket's records. */
#include <stdlib.h>
#include <string.h>

#include "../chunk.h"
#include "keys.h"
#include "rslot.h"
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
    chunk_all_ended(&c); /* step 1 decided nothing: every row */
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

/* The rows of a chunk of 300 users (every seventh row without a user id) split among n
 * buckets: each row with a user id once, at its user's home bucket, in sheet order within it;
 * with one bucket, all of them in sheet order. */
static void check_split(int n)
{
    enum { ROWS = 300 };
    int64_t users[ROWS];
    for (size_t i = 0; i < ROWS; i++)
        users[i] = i % 7 == 3 ? 0 : 1000 + (int64_t)i * 3; /* ids stepping by n still spread */
    chunk c = chunk_of(users, ROWS);
    char seen[ROWS] = {0};
    size_t valid = 0;
    CHECK(chunk_split(&c, n) == QN_OK);
    CHECK_EQ_INT(c.nbuckets, n);
    CHECK_EQ_INT((int)c.start[0], 0);
    for (size_t i = 0; i < ROWS; i++)
        valid += users[i] > 0;
    CHECK_EQ_INT((int)c.start[n], (int)valid);
    for (int b = 0; b < n; b++) {
        if (n > 1 && n < 8)
            CHECK(c.start[b + 1] > c.start[b]); /* 257 users: every bucket of a few has some */
        for (size_t j = c.start[b]; j < c.start[b + 1]; j++) {
            size_t i = c.order[j];
            CHECK(i < ROWS && users[i] > 0 && !seen[i]);
            seen[i] = 1;
            CHECK_EQ_INT(bucket_home(users[i], n), b);
            if (j > c.start[b])
                CHECK(c.order[j - 1] < i);
        }
    }
    if (n == 1)
        for (size_t j = 0, i = 0; i < ROWS; i++)
            if (users[i] > 0)
                CHECK(c.order[j++] == i);
    chunk_free(&c);
}

static void test_split(void)
{
    check_split(1);
    check_split(3);
    check_split(BUCKET_MAX);
    /* a chunk reused with fewer buckets: nothing of the last split stays */
    int64_t users[3] = {5, 0, 9};
    chunk c = chunk_of(users, 3);
    CHECK(chunk_split(&c, 4) == QN_OK);
    CHECK(chunk_split(&c, 1) == QN_OK);
    CHECK_EQ_INT((int)c.start[1], 2);
    CHECK(c.order[0] == 0 && c.order[1] == 2);
    chunk_free(&c);
}

/* One bucket's records are the chunk's as they always were; bucket b's lie in its slot. */
static void test_keys(void)
{
    chunk_task t = {.id = 77, .tpl_id = 424242, .buckets = 1};
    char rec[KEYS_LEN], seen[KEYS_LEN], want[KEYS_LEN];
    chunk_keys(&t, 5, 0, 0, rec, seen);
    keys_task_chunk(want, t.tpl_id, t.id, 5);
    CHECK_EQ_STR(rec, want);
    keys_task_seen(want, t.tpl_id, t.id);
    CHECK_EQ_STR(seen, want);
    t.buckets = 3;
    chunk_keys(&t, 5, 0, 0, rec, NULL);
    keys_task_chunk(want, t.tpl_id, t.id, 5);
    CHECK_EQ_STR(rec, want);
    chunk_keys(&t, 5, 0, 2, rec, NULL);
    CHECK_EQ_STR(rec, "quan:tpl:{424242}:task:77:chunk:5:2");
    for (int b = 1; b < 3; b++) {
        bucket_keys k;
        bucket_keys_of(&k, t.tpl_id, b, 3);
        int slot = rslot_of_key(k.hash, strlen(k.hash));
        for (int p = 0; p < 3; p++) {
            chunk_keys(&t, 5, b, p, rec, seen);
            CHECK(strncmp(rec, k.hash, strlen(k.hash)) == 0);
            CHECK(strstr(rec, ":task:77:chunk:5") != NULL);
            CHECK_EQ_INT(rslot_of_key(rec, strlen(rec)), slot);
            CHECK_EQ_INT(rslot_of_key(seen, strlen(seen)), slot);
            CHECK(strcmp(rec + strlen(rec) - 5, ":seen") != 0);
        }
        chunk_keys(&t, 5, b, 0, rec, seen);
        CHECK(snprintf(want, sizeof(want), "%s:task:77:seen", k.hash) < (int)sizeof(want));
        CHECK_EQ_STR(seen, want);
    }
}

/* Rows a bucket left undecided (its hash gone) end; those decided keep their outcome. */
static void test_all_ended_partly(void)
{
    int64_t users[4] = {11, 12, 0, 13};
    chunk c = chunk_of(users, 4);
    c.outcome[0] = 1;
    c.outcome[1] = CHUNK_NO_STOCK;
    chunk_all_ended(&c);
    CHECK_EQ_INT(c.outcome[0], 1);
    CHECK_EQ_INT(c.outcome[1], CHUNK_NO_STOCK);
    CHECK_EQ_INT(c.outcome[2], CHUNK_INVALID);
    CHECK_EQ_INT(c.outcome[3], CHUNK_ENDED);
    chunk_free(&c);
}

int main(void)
{
    RUN(test_split);
    RUN(test_keys);
    RUN(test_all_ended_partly);
    RUN(test_outcomes_read);
    RUN(test_all_ended);
    RUN(test_causes);
    TEST_MAIN_END();
}
