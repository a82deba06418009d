/* The MQ claim's message (claimq.h): what /redeem-mq writes is what the consumer reads back,
 * field for field and routed to the same databases; every malformed message is refused (its
 * delivery dead-lettered, never written); an attempt's key tells a retry from a redelivery; a
 * pack's guard key is named by its content. */
#include <string.h>

#include "../claimq.h"
#include "testhelp.h"

static ucoupon sample(void)
{
    ucoupon u = {.id = 1810714735922956700,
                 .user_id = 4200000001,
                 .template_id = 1810714735922956666,
                 .shop_number = 1810714735922956001,
                 .receive_time_ms = 1800000000123,
                 .valid_end_ms = 1800086400000,
                 .receive_count = 2,
                 .source = 1};
    strcpy(u.request_id, "req-7f3a");
    return u;
}

static int parse_text(const char *json, claimdb_item *it)
{
    cJSON *d = cJSON_Parse(json);
    int ok = d ? claimq_claim_parse(d, it) : 0;
    cJSON_Delete(d);
    return ok;
}

static void test_round_trip(void)
{
    for (int check = 0; check < 2; check++) {
        ucoupon u = sample();
        char buf[CLAIMQ_CLAIM_JSON];
        claimdb_item it;
        CHECK_EQ_INT(parse_text(claimq_claim_json(buf, &u, 0, 0, check, check ? 0 : 7), &it), 1);
        CHECK_EQ_INT(it.c.id, u.id);
        CHECK_EQ_INT(it.c.user_id, u.user_id);
        CHECK_EQ_INT(it.c.template_id, u.template_id);
        CHECK_EQ_INT(it.c.shop_number, u.shop_number);
        CHECK_EQ_INT(it.c.receive_time_ms, u.receive_time_ms);
        CHECK_EQ_INT(it.c.valid_start_ms, u.receive_time_ms); /* valid from the claim */
        CHECK_EQ_INT(it.c.valid_end_ms, u.valid_end_ms);
        CHECK_EQ_INT(it.c.receive_count, 2);
        CHECK_EQ_INT(it.c.source, 1);
        CHECK_EQ_INT(it.c.status, UCOUPON_UNUSED);
        CHECK_EQ_STR(it.c.request_id, "req-7f3a");
        CHECK_EQ_INT(it.check, check);
        CHECK_EQ_INT(it.epoch, check ? 0 : 7); /* the restore epoch a claim was accepted under */
        /* Routed: the coupon by its user, the stock by the template's shop. */
        CHECK(it.user_ds == 0 || it.user_ds == 1);
        CHECK(it.tpl_ds == 0 || it.tpl_ds == 1);
        claimdb_item again;
        CHECK_EQ_INT(parse_text(buf, &again), 1);
        CHECK_EQ_INT(again.user_ds, it.user_ds);
        CHECK_EQ_INT(again.tpl_ds, it.tpl_ds);
    }
}

static void test_malformed(void)
{
    static const char *const bad[] = {
        "{}",
        "[]",
        "{\"kind\":\"probe\",\"userId\":\"1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\","
        "\"shopNumber\":\"3\",\"receiveCount\":1,\"userCouponId\":\"4\"}",
        /* each required field missing or out of range in turn */
        "{\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\",\"receiveCount\":1,"
        "\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\",\"receiveCount\":1,"
        "\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1,\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"r\",\"shopNumber\":\"3\",\"receiveCount\":1,"
        "\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"receiveCount\":1,"
        "\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":0,\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1}",
        "{\"userId\":\"-1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1,\"userCouponId\":\"4\"}",
        "{\"userId\":\"1x\",\"requestId\":\"r\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1,\"userCouponId\":\"4\"}",
        /* a request id that would break the JSON it is written back into */
        "{\"userId\":\"1\",\"requestId\":\"r\\\"\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1,\"userCouponId\":\"4\"}",
        "{\"userId\":\"1\",\"requestId\":\"r\\\\\",\"couponTemplateId\":\"2\",\"shopNumber\":\"3\","
        "\"receiveCount\":1,\"userCouponId\":\"4\"}",
    };
    const char *good = "{\"userId\":\"1\",\"requestId\":\"r\",\"couponTemplateId\":\"2\","
                       "\"shopNumber\":\"3\",\"receiveCount\":1,\"userCouponId\":\"4\"}";
    claimdb_item it;
    CHECK_EQ_INT(parse_text(good, &it), 1); /* the shortest good one: the rest are near it */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int got = parse_text(bad[i], &it);
        if (got)
            printf("  accepted: %s\n", bad[i]);
        CHECK_EQ_INT(got, 0);
    }
}

static void test_attempt_keys(void)
{
    ucoupon u = sample();
    char a[CLAIMQ_ATTEMPT_KEY], b[CLAIMQ_ATTEMPT_KEY], c[CLAIMQ_ATTEMPT_KEY];
    claimq_attempt_key(a, sizeof(a), &u, 0);
    CHECK_EQ_STR(a, "4200000001:req-7f3a:1800000000123");
    claimq_attempt_key(b, sizeof(b), &u, 1);
    CHECK_EQ_STR(b, "check:4200000001:req-7f3a:1800000000123");
    /* A retry of the same request after a given-up attempt reserves anew, later: another
     * message, which the guard does not take for a redelivery. */
    u.receive_time_ms += 1;
    claimq_attempt_key(c, sizeof(c), &u, 0);
    CHECK(strcmp(a, c) != 0);
}

/* A pack's guard key is named by its whole content, in order: the same pack again (a
 * redelivery) is the same key; another pack sharing a claim with it, the same claims in
 * another order, or keys cut elsewhere are other keys. */
static void test_pack_keys(void)
{
    const char *ab[] = {"4200000001:req-7f3a:1800000000123", "4200000002:req-9:1800000000124"};
    const char *ba[] = {ab[1], ab[0]};
    const char *abc[] = {ab[0], ab[1], "4200000003:req-1:1800000000125"};
    const char *ac[] = {ab[0], abc[2]};
    const char *cut1[] = {"ab", "c"}, *cut2[] = {"a", "bc"};
    char k1[CLAIMQ_PACK_KEY], k2[CLAIMQ_PACK_KEY], k3[CLAIMQ_PACK_KEY];

    claimq_pack_key(k1, ab, 2);
    /* SHA1 of the keys, each with its NUL (Python's hashlib on the same bytes) */
    CHECK_EQ_STR(k1, "pack:a66b309ee6d6750a49979a1c70a54a7c65329a62");
    CHECK_EQ_INT(strlen(k1), CLAIMQ_PACK_KEY - 1);
    claimq_pack_key(k2, ab, 2);
    CHECK_EQ_STR(k1, k2);
    claimq_pack_key(k2, ba, 2);
    CHECK(strcmp(k1, k2) != 0);
    claimq_pack_key(k2, abc, 3);
    CHECK(strcmp(k1, k2) != 0);
    claimq_pack_key(k3, ac, 2);
    CHECK(strcmp(k1, k3) != 0 && strcmp(k2, k3) != 0);
    claimq_pack_key(k1, cut1, 2);
    claimq_pack_key(k2, cut2, 2);
    CHECK(strcmp(k1, k2) != 0);
    /* never a claim's attempt key (those start with a user id or "check:") */
    CHECK(strncmp(k1, "pack:", 5) == 0);
}

int main(void)
{
    RUN(test_round_trip);
    RUN(test_malformed);
    RUN(test_attempt_keys);
    RUN(test_pack_keys);
    TEST_MAIN_END();
}
