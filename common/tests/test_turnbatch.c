/* turnbatch.h: a loop turn's items, sent by group at its end. */
#include <event2/event.h>
#include <stdio.h>
#include <string.h>

#include "hash.h"
#include "testhelp.h"
#include "turnbatch.h"

typedef struct item {
    char key;
    int seq;
} item;

/* What the sends saw: each group as its items' text ("A1A2A3"), in the order sent. */
typedef struct seen {
    char groups[16][64];
    size_t n;
    turnbatch *b;
    int add_during_send; /* the first send adds this many items of key 'Z' */
} seen;

static long same_calls;

static uint64_t key_hash(const void *a)
{
    return (uint64_t)((const item *)a)->key;
}

static int same_key(const void *a, const void *b)
{
    same_calls++;
    return ((const item *)a)->key == ((const item *)b)->key;
}

static void record(void *items, size_t n, void *arg)
{
    seen *s = arg;
    const item *it = items;
    char *out = s->groups[s->n++];
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(out + strlen(out), 64 - strlen(out), "%c%d", it[i].key, it[i].seq);
    for (; s->add_during_send > 0; s->add_during_send--) {
        item *z = turnbatch_add(s->b);
        CHECK(z != NULL);
        if (z)
            *z = (item){'Z', s->add_during_send};
    }
}

static void add(turnbatch *b, char key, int seq)
{
    item *it = turnbatch_add(b);
    CHECK(it != NULL);
    if (it)
        *it = (item){key, seq};
}

static void one_turn(struct event_base *base)
{
    event_base_loop(base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

static void test_groups_in_order_of_arrival_at_most_max(void)
{
    struct event_base *base = event_base_new();
    seen s = {0};
    turnbatch *b = turnbatch_new(base, sizeof(item), 3, key_hash, same_key, record, &s);
    CHECK(b != NULL);
    const char *keys = "ABACABA";
    for (int i = 0; keys[i]; i++)
        add(b, keys[i], i);
    CHECK_EQ_INT(s.n, 0); /* nothing before the turn ends */
    one_turn(base);
    CHECK_EQ_INT(s.n, 4);
    CHECK_EQ_STR(s.groups[0], "A0A2A4"); /* the first key's, up to the maximum */
    CHECK_EQ_STR(s.groups[1], "B1B5");
    CHECK_EQ_STR(s.groups[2], "C3");
    CHECK_EQ_STR(s.groups[3], "A6"); /* past the maximum: a call of its own */
    /* The list is used again: a second turn sends only its own items. */
    add(b, 'B', 7);
    add(b, 'B', 8);
    one_turn(base);
    CHECK_EQ_INT(s.n, 5);
    CHECK_EQ_STR(s.groups[4], "B7B8");
    one_turn(base);
    CHECK_EQ_INT(s.n, 5); /* an empty turn sends nothing */
    turnbatch_free(b);
    event_base_free(base);
}

static void test_added_while_sending_comes_after_the_round(void)
{
    struct event_base *base = event_base_new();
    seen s = {.add_during_send = 2};
    turnbatch *b = s.b = turnbatch_new(base, sizeof(item), 8, key_hash, same_key, record, &s);
    CHECK(b != NULL);
    add(b, 'A', 0);
    add(b, 'B', 1);
    one_turn(base);
    /* The Zs the first send added are not in the round being sent (B's group comes first),
     * and go as one group of their own after it. */
    CHECK_EQ_INT(s.n, 3);
    CHECK_EQ_STR(s.groups[0], "A0");
    CHECK_EQ_STR(s.groups[1], "B1");
    CHECK_EQ_STR(s.groups[2], "Z2Z1");
    turnbatch_free(b);
    event_base_free(base);
}

static void test_freed_with_items_waiting_sends_nothing(void)
{
    struct event_base *base = event_base_new();
    seen s = {0};
    turnbatch *b = turnbatch_new(base, sizeof(item), 4, key_hash, same_key, record, &s);
    CHECK(b != NULL);
    for (int i = 0; i < 100; i++) /* past the first allocation: the list grows */
        add(b, (char)('A' + i % 3), i);
    turnbatch_free(b);
    one_turn(base);
    CHECK_EQ_INT(s.n, 0);
    event_base_free(base);
}

/* A turn of many keys: every item sent once, in a group of its own key, in its order, groups of
 * at most the maximum, in order of their first item; and the split asks same() about once per
 * item, not once per item and key (2 000 items of 1 000 keys: two million calls by one pass
 * per group). */
typedef struct wide {
    int key;
    int seq;
} wide;

static uint64_t wide_hash(const void *a)
{
    return hash_mix64((uint64_t)((const wide *)a)->key);
}

static int wide_same(const void *a, const void *b)
{
    same_calls++;
    return ((const wide *)a)->key == ((const wide *)b)->key;
}

#define WIDE_N 2000
typedef struct wide_seen {
    int sent[WIDE_N];
    int last_seq_of_key[WIDE_N];
    int last_first_seq;
    int groups, bad;
} wide_seen;

static void wide_record(void *items, size_t n, void *arg)
{
    wide_seen *w = arg;
    const wide *it = items;
    if (n < 1 || n > 3 || it[0].seq <= w->last_first_seq)
        w->bad++;
    w->last_first_seq = it[0].seq;
    for (size_t i = 0; i < n; i++) {
        if (it[i].key != it[0].key || it[i].seq <= w->last_seq_of_key[it[i].key])
            w->bad++;
        w->last_seq_of_key[it[i].key] = it[i].seq;
        w->sent[it[i].seq]++;
    }
    w->groups++;
}

static void test_many_keys_split_in_one_pass(void)
{
    struct event_base *base = event_base_new();
    static wide_seen w;
    memset(&w, 0, sizeof(w));
    w.last_first_seq = -1;
    for (int k = 0; k < WIDE_N; k++)
        w.last_seq_of_key[k] = -1;
    turnbatch *b = turnbatch_new(base, sizeof(wide), 3, wide_hash, wide_same, wide_record, &w);
    CHECK(b != NULL);
    if (!b)
        return;
    for (int i = 0; i < WIDE_N; i++) {
        wide *it = turnbatch_add(b);
        CHECK(it != NULL);
        if (it) /* keys 0..999, each twice, the second half in another order; key 7 ten times */
            *it = (wide){i < WIDE_N / 2 ? i : (i % 10 == 0 ? 7 : (i * 7) % (WIDE_N / 2)), i};
    }
    same_calls = 0;
    one_turn(base);
    int all_once = 1;
    for (int i = 0; i < WIDE_N; i++)
        all_once &= w.sent[i] == 1;
    printf("  %d items in %d groups, %ld calls of same()\n", WIDE_N, w.groups, same_calls);
    CHECK(all_once);
    CHECK_EQ_INT(w.bad, 0);
    CHECK(same_calls <= 2 * WIDE_N);
    turnbatch_free(b);
    event_base_free(base);
}

int main(void)
{
    RUN(test_groups_in_order_of_arrival_at_most_max);
    RUN(test_added_while_sending_comes_after_the_round);
    RUN(test_freed_with_items_waiting_sends_nothing);
    RUN(test_many_keys_split_in_one_pass);
    TEST_MAIN_END();
}
