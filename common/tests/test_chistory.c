/* A coupon's history as answered (chistory): every (from, to) named, the channels and statuses,
 * and the answer's JSON (issued first, the changes in order, absent texts as null, the user
 * only for the shop, money and times as elsewhere). The reads need a database: the engine and
 * merchant-admin suites run them. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "chistory.h"
#include "testhelp.h"

static void test_chistory_event_names(void)
{
    static const char *const want[5][5] = {
        /* to: unused     locked     used      expired    revoked */
        {"changed", "locked", "changed", "expired", "revoked"},   /* from unused */
        {"unlocked", "changed", "paid", "expired", "revoked"},    /* from locked */
        {"refunded", "changed", "changed", "expired", "revoked"}, /* from used */
        {"changed", "changed", "changed", "expired", "revoked"},  /* from expired */
        {"changed", "changed", "changed", "expired", "revoked"},  /* from revoked */
    };
    for (int f = 0; f < 5; f++)
        for (int t = 0; t < 5; t++)
            CHECK_EQ_STR(chistory_event_name(f, t), want[f][t]);
    CHECK_EQ_STR(chistory_event_name(7, 0), "changed");
}

static void test_chistory_names(void)
{
    CHECK_EQ_STR(chistory_status_name(UCOUPON_UNUSED), "unused");
    CHECK_EQ_STR(chistory_status_name(UCOUPON_LOCKED), "locked");
    CHECK_EQ_STR(chistory_status_name(UCOUPON_USED), "used");
    CHECK_EQ_STR(chistory_status_name(UCOUPON_EXPIRED), "expired");
    CHECK_EQ_STR(chistory_status_name(UCOUPON_REVOKED), "revoked");
    CHECK_EQ_STR(chistory_status_name(5), "unknown");
    CHECK_EQ_STR(chistory_status_name(-1), "unknown");
    CHECK_EQ_STR(chistory_channel_name(UCOUPON_CH_CLAIM), "claim");
    CHECK_EQ_STR(chistory_channel_name(UCOUPON_CH_MQ), "mq");
    CHECK_EQ_STR(chistory_channel_name(UCOUPON_CH_TASK), "distribution");
    CHECK_EQ_STR(chistory_channel_name(UCOUPON_CH_CODE), "exchangeCode");
    CHECK_EQ_STR(chistory_channel_name(-1), "unknown");
    CHECK_EQ_STR(chistory_channel_name(4), "unknown");
}

static char *chistory_text(const chistory *h, int with_user)
{
    cJSON *j = chistory_to_json(h, with_user);
    char *s = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return s;
}

static void test_chistory_json(void)
{
    chistory_change ch[2] = {
        {.id = 5,
         .from = 0,
         .to = 1,
         .discount_cents = 0,
         .time_ms = 1000,
         .has_ref = 1,
         .ref = "order:9",
         .has_actor = 1,
         .actor = "payment"},
        {.id = 8,
         .from = 1,
         .to = 2,
         .discount_cents = 1550,
         .time_ms = 61000,
         .has_ref = 1,
         .ref = "order:9",
         .has_actor = 0},
    };
    chistory h = {.id = 1810966706881941507,
                  .user_id = 42,
                  .template_id = 7,
                  .shop_number = 3,
                  .status = UCOUPON_USED,
                  .channel = UCOUPON_CH_MQ,
                  .receive_time_ms = 0,
                  .changes = ch,
                  .n = 2};
    /* The configured zone's default is UTC+8. */
    char *s = chistory_text(&h, 0);
    CHECK_EQ_STR(s, "{\"couponId\":\"1810966706881941507\",\"couponTemplateId\":\"7\","
                    "\"shopNumber\":\"3\",\"status\":\"used\",\"truncated\":false,\"events\":["
                    "{\"event\":\"issued\",\"channel\":\"mq\",\"ref\":null,"
                    "\"time\":\"1970-01-01 08:00:00\"},"
                    "{\"event\":\"locked\",\"from\":\"unused\",\"to\":\"locked\","
                    "\"ref\":\"order:9\",\"actor\":\"payment\",\"discountAmount\":0,"
                    "\"time\":\"1970-01-01 08:00:01\"},"
                    "{\"event\":\"paid\",\"from\":\"locked\",\"to\":\"used\",\"ref\":\"order:9\","
                    "\"actor\":null,\"discountAmount\":15.5,\"time\":\"1970-01-01 08:01:01\"}]}");
    free(s);
    /* The shop's answer names the user; a request id is the ref. */
    snprintf(h.request_id, sizeof(h.request_id), "r-1");
    h.channel = -1;
    h.n = 0;
    h.truncated = 1;
    s = chistory_text(&h, 1);
    CHECK_EQ_STR(s, "{\"couponId\":\"1810966706881941507\",\"userId\":\"42\","
                    "\"couponTemplateId\":\"7\",\"shopNumber\":\"3\",\"status\":\"used\","
                    "\"truncated\":true,\"events\":[{\"event\":\"issued\",\"channel\":\"unknown\","
                    "\"ref\":\"r-1\",\"time\":\"1970-01-01 08:00:00\"}]}");
    free(s);
    /* clear frees what a read allocated and leaves a zeroed history */
    chistory z = {0};
    z.changes = calloc(3, sizeof(*z.changes));
    z.n = 3;
    chistory_clear(&z);
    CHECK(z.changes == NULL && z.n == 0);
}

int main(void)
{
    RUN(test_chistory_event_names);
    RUN(test_chistory_names);
    RUN(test_chistory_json);
    TEST_MAIN_END();
}
