/* What coupon-query may keep: tickets against invalidations, epochs, stale times, the LRU
 * bound, and every value released exactly once. */
#include "keys.h"
#include "rcopy.h"
#include "rtrack.h"
#include "testhelp.h"

#include <stdlib.h>
#include <string.h>

/* A value that counts its releases. */
typedef struct val {
    int released;
} val;

static void val_release(void *p)
{
    ((val *)p)->released++;
}

static void test_kept_and_found(void)
{
    rcopy *c = rcopy_new(4, val_release);
    val a = {0};
    CHECK(c != NULL);
    CHECK(rcopy_get(c, 7, 1, 0) == NULL);
    uint64_t t = rcopy_ticket(c, 7);
    CHECK(t != 0);
    rcopy_put(c, 7, t, 1, 1000, &a);
    CHECK(rcopy_get(c, 7, 1, 999) == &a);
    CHECK(rcopy_get(c, 7, 2, 999) == NULL);  /* another epoch: tracking was interrupted */
    CHECK(rcopy_get(c, 7, 0, 999) == NULL);  /* tracking off */
    CHECK(rcopy_get(c, 7, 1, 1000) == NULL); /* stale from its time on */
    CHECK(rcopy_get(c, 8, 1, 0) == NULL);
    CHECK_EQ_INT(a.released, 0);
    rcopy_free(c);
    CHECK_EQ_INT(a.released, 1);
}

static void test_invalidated_while_read_is_not_kept(void)
{
    rcopy *c = rcopy_new(4, val_release);
    val a = {0}, b = {0};
    uint64_t t = rcopy_ticket(c, 7);
    rcopy_invalidate(c, 7); /* the key changed after the read was sent */
    rcopy_put(c, 7, t, 1, INT64_MAX, &a);
    CHECK_EQ_INT(a.released, 1); /* dropped at once */
    CHECK(rcopy_get(c, 7, 1, 0) == NULL);
    /* A ticket taken after the change works. */
    t = rcopy_ticket(c, 7);
    rcopy_put(c, 7, t, 1, INT64_MAX, &b);
    CHECK(rcopy_get(c, 7, 1, 0) == &b);
    /* Invalidated when kept: released, gone. */
    rcopy_invalidate(c, 7);
    CHECK_EQ_INT(b.released, 1);
    CHECK(rcopy_get(c, 7, 1, 0) == NULL);
    CHECK_EQ_INT((long long)rcopy_count(c), 0);
    rcopy_free(c);
    CHECK_EQ_INT(b.released, 1);
}

static void test_cleared_while_read_is_not_kept(void)
{
    rcopy *c = rcopy_new(4, val_release);
    val a = {0};
    uint64_t t = rcopy_ticket(c, 7);
    rcopy_clear(c);
    rcopy_put(c, 7, t, 1, INT64_MAX, &a);
    CHECK_EQ_INT(a.released, 1);
    CHECK(rcopy_get(c, 7, 1, 0) == NULL);
    /* Nor without a ticket or an epoch. */
    val b = {0}, d = {0};
    rcopy_put(c, 9, 0, 1, INT64_MAX, &b);
    t = rcopy_ticket(c, 9);
    rcopy_put(c, 9, t, 0, INT64_MAX, &d);
    CHECK_EQ_INT(b.released, 1);
    CHECK_EQ_INT(d.released, 1);
    CHECK(rcopy_get(c, 9, 1, 0) == NULL);
    rcopy_free(c);
}

static void test_two_reads_in_flight_and_replacement(void)
{
    rcopy *c = rcopy_new(4, val_release);
    val a = {0}, b = {0};
    uint64_t t1 = rcopy_ticket(c, 7), t2 = rcopy_ticket(c, 7);
    CHECK(t1 == t2);
    rcopy_put(c, 7, t1, 1, INT64_MAX, &a);
    rcopy_put(c, 7, t2, 1, INT64_MAX, &b); /* as good: replaces, releasing the first */
    CHECK_EQ_INT(a.released, 1);
    CHECK(rcopy_get(c, 7, 1, 0) == &b);
    rcopy_free(c);
    CHECK_EQ_INT(b.released, 1);
}

static void test_least_recently_used_go_first(void)
{
    rcopy *c = rcopy_new(3, val_release);
    val v[5] = {{0}};
    for (int i = 0; i < 3; i++)
        rcopy_put(c, i, rcopy_ticket(c, i), 1, INT64_MAX, &v[i]);
    CHECK(rcopy_get(c, 0, 1, 0) == &v[0]); /* 0 used: 1 is now the oldest */
    rcopy_put(c, 3, rcopy_ticket(c, 3), 1, INT64_MAX, &v[3]);
    CHECK_EQ_INT((long long)rcopy_count(c), 3);
    CHECK_EQ_INT(v[1].released, 1);
    CHECK(rcopy_get(c, 1, 1, 0) == NULL);
    CHECK(rcopy_get(c, 0, 1, 0) == &v[0]);
    CHECK(rcopy_get(c, 2, 1, 0) == &v[2]);
    CHECK(rcopy_get(c, 3, 1, 0) == &v[3]);
    /* Many ids through a small cache: bounded, each value released once. */
    val *many = calloc(1000, sizeof(*many));
    CHECK(many != NULL);
    for (int i = 0; i < 1000; i++)
        rcopy_put(c, 100 + i, rcopy_ticket(c, 100 + i), 1, INT64_MAX, &many[i]);
    CHECK_EQ_INT((long long)rcopy_count(c), 3);
    rcopy_free(c);
    for (int i = 0; i < 1000; i++)
        CHECK_EQ_INT(many[i].released, 1);
    for (int i = 0; i < 4; i++)
        CHECK_EQ_INT(v[i].released, 1);
    free(many);
}

/* The keys invalidations name, back to the ids the copies are kept by. */
static void test_invalidated_keys_to_ids(void)
{
    char key[KEYS_LEN];
    int64_t id = 0;
    keys_template(key, 1234567890123456789LL);
    CHECK(rtrack_key_id(key, strlen(key), KEYS_TEMPLATE_PREFIX, &id) &&
          id == 1234567890123456789LL);
    keys_wallet(key, 42);
    CHECK(rtrack_key_id(key, strlen(key), KEYS_WALLET_PREFIX, &id) && id == 42);
    CHECK(
        !rtrack_key_id(key, strlen(key), KEYS_TEMPLATE_PREFIX, &id)); /* a wallet is no template */
    keys_template_users(key, 7); /* the template's other keys are not it */
    CHECK(!rtrack_key_id(key, strlen(key), KEYS_TEMPLATE_PREFIX, &id));
    keys_template_null(key, 7);
    CHECK(!rtrack_key_id(key, strlen(key), KEYS_TEMPLATE_PREFIX, &id));
    static const char *const bad[] = {
        "quan:tpl:{}",   "quan:tpl:{12a}", "quan:tpl:12", "quan:tpl:{1",
        "quan:tpl:{-5}", "quan:tpl:{0}",   "quan:tp:{1}", "quan:tpl:{9223372036854775808}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(!rtrack_key_id(bad[i], strlen(bad[i]), KEYS_TEMPLATE_PREFIX, &id));
    /* The length given is what counts (invalidations are not NUL-terminated). */
    CHECK(rtrack_key_id("quan:tpl:{5}xyz", 12, KEYS_TEMPLATE_PREFIX, &id) && id == 5);
}

int main(void)
{
    RUN(test_invalidated_keys_to_ids);
    RUN(test_kept_and_found);
    RUN(test_invalidated_while_read_is_not_kept);
    RUN(test_cleared_while_read_is_not_kept);
    RUN(test_two_reads_in_flight_and_replacement);
    RUN(test_least_recently_used_go_first);
    TEST_MAIN_END();
}
