/* What coupon-template create accepts (templates_create_parse): each field's bounds and the
 * 400's text, the discount rules of each template type, the validity window, and the rules as
 * stored; then increase-number's and terminate's refusals, and the LIKE patterns of the page's
 * filters. */
#include <stdint.h>
#include <string.h>

#include "../templates.h"
#include "body_help.h"
#include "testhelp.h"

#define NOW 1779940800000LL /* 2026-05-28 12:00:00 +08:00 */

/* A threshold template (type 1) of the shop's goods, valid now. */
static const char base_body[] =
    "{\"name\":\"100 off 10\",\"source\":0,\"target\":0,\"goods\":\"G-1\",\"type\":1,"
    "\"validStartTime\":\"2026-01-01 00:00:00\",\"validEndTime\":\"2099-01-01 00:00:00\","
    "\"stock\":100,\"receiveRule\":{\"limitPerPerson\":2,\"usageInstructions\":\"x\"},"
    "\"consumeRule\":{\"termsOfUse\":100,\"maximumDiscountAmount\":10,"
    "\"explanationOfUnmetConditions\":\"\",\"validityPeriod\":48}}";

/* templates_create_parse of base_body with the changes ch made. */
static qn_status parse(const body_change *ch, tpl *t, jsonin_err *err)
{
    cJSON *b = body_with(base_body, ch);
    memset(t, 0, sizeof(*t));
    err->msg[0] = '\0';
    qn_status st = templates_create_parse(b, NOW, t, err);
    cJSON_Delete(b);
    return st;
}

/* Every field's bounds and what the 400 says. */
static void test_fields(void)
{
    static const body_case v[] = {
        {{{NULL, NULL}}, NULL},
        {{{"name", NULL}}, "name: required"},
        {{{"name", "\"  \""}}, "name: required"}, /* white space alone is no name */
        {{{"name", "256"}}, "name: must be a string"},
        {{{"source", "2"}}, "source: must be one of 0, 1"},
        {{{"source", NULL}}, "source: required"},
        {{{"target", "2"}}, "target: must be one of 0, 1"},
        {{{"type", "3"}}, "type: must be one of 0, 1, 2"},
        {{{"stock", "0"}}, "stock: must be between 1 and 20000000"},
        {{{"stock", "20000000"}}, NULL},
        {{{"stock", "20000001"}}, "stock: must be between 1 and 20000000"},
        /* goods if and only if the template is of goods. */
        {{{"goods", NULL}}, "goods: required when target is 0 (goods-specific)"},
        {{{"goods", "\" \\t \""}}, "goods: required when target is 0 (goods-specific)"},
        {{{"target", "1"}}, "goods: must be empty when target is 1 (whole shop)"},
        {{{"target", "1"}, {"goods", "\"\""}}, NULL},
        {{{"target", "1"}, {"goods", NULL}}, NULL},
        {{{"receiveRule", NULL}}, "receiveRule: required"},
        {{{"receiveRule", "\"{\\\"limitPerPerson\\\":1}\""}}, NULL}, /* an object as a string */
        {{{"receiveRule.limitPerPerson", "0"}},
         "receiveRule.limitPerPerson: must be between 1 and 1000"},
        {{{"receiveRule.limitPerPerson", "1000"}}, NULL},
        {{{"receiveRule.limitPerPerson", "1001"}},
         "receiveRule.limitPerPerson: must be between 1 and 1000"},
        {{{"consumeRule", NULL}}, "consumeRule: required"},
        {{{"consumeRule.maximumDiscountAmount", "0"}},
         "consumeRule.maximumDiscountAmount: must be between 0.01 and 100000000.00"},
        {{{"consumeRule.maximumDiscountAmount", "100000000.01"}},
         "consumeRule.maximumDiscountAmount: must be between 0.01 and 100000000.00"},
        {{{"consumeRule.maximumDiscountAmount", "1.005"}},
         "consumeRule.maximumDiscountAmount: must have at most two decimals"},
        {{{"consumeRule.validityPeriod", "0"}},
         "consumeRule.validityPeriod: must be between 1 and 87600"},
        {{{"consumeRule.validityPeriod", "87600"}}, NULL},
        {{{"consumeRule.validityPeriod", "87601"}},
         "consumeRule.validityPeriod: must be between 1 and 87600"},
        {{{"consumeRule.validityPeriod", NULL}}, "consumeRule.validityPeriod: required"},
        {{{"stockBuckets", "1"}}, NULL},
        {{{"stockBuckets", "64"}}, NULL},
        {{{"stockBuckets", "null"}}, NULL}, /* as absent: 1 */
        {{{"stockBuckets", "0"}}, "stockBuckets: must be between 1 and 64"},
        {{{"stockBuckets", "65"}}, "stockBuckets: must be between 1 and 64"},
        {{{"stockBuckets", "-3"}}, "stockBuckets: must be between 1 and 64"},
        {{{"stockBuckets", "2.5"}}, "stockBuckets: must be an integer"},
        {{{"stockBuckets", "true"}}, "stockBuckets: must be an integer"},
        {{{"stockBuckets", "\"x\""}}, "stockBuckets: must be an integer"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tpl t;
        jsonin_err err;
        body_expect(i, parse(v[i].ch, &t, &err), &err, v[i].err);
        tpl_clear(&t);
    }
}

/* The texts' lengths in characters, at the bound and past it. */
static void test_text_lengths(void)
{
    static const struct {
        const char *field;
        char c;
        int n;
        const char *err;
    } v[] = {
        {"name", 'n', 256, NULL},
        {"name", 'n', 257, "name: must be 1 to 256 characters long"},
        {"goods", 'g', 64, NULL},
        {"goods", 'g', 65, "goods: must be at most 64 characters long"},
        {"receiveRule.usageInstructions", 'u', 1024, NULL},
        {"receiveRule.usageInstructions", 'u', 1025,
         "receiveRule.usageInstructions: must be at most 1024 characters long"},
        {"consumeRule.explanationOfUnmetConditions", 'e', 1025,
         "consumeRule.explanationOfUnmetConditions: must be at most 1024 characters long"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        body_change ch[BODY_CHANGES] = {{v[i].field, body_text(v[i].c, v[i].n)}};
        tpl t;
        jsonin_err err;
        body_expect(i, parse(ch, &t, &err), &err, v[i].err);
        tpl_clear(&t);
    }
}

/* The validity window: after its start, and not over yet. */
static void test_window(void)
{
    static const struct {
        const char *start, *end, *err;
    } v[] = {
        {"\"2026-01-01 00:00:00\"", "\"2026-01-01 00:00:00\"",
         "validEndTime: must be after validStartTime"},
        {"\"2026-02-01 00:00:00\"", "\"2026-01-31 23:59:59\"",
         "validEndTime: must be after validStartTime"},
        /* Ends now (NOW), or before: over. */
        {"\"2026-01-01 00:00:00\"", "\"2026-05-28 12:00:00\"",
         "validEndTime: must be in the future"},
        {"\"2026-01-01 00:00:00\"", "\"2026-05-28 11:59:59\"",
         "validEndTime: must be in the future"},
        {"\"2026-01-01 00:00:00\"", "\"2026-05-28 12:00:01\"", NULL},
        /* Starting later is fine. */
        {"\"2027-01-01 00:00:00\"", "\"2027-01-02 00:00:00\"", NULL},
        {"\"2026-13-01 00:00:00\"", "\"2027-01-02 00:00:00\"",
         "validStartTime: is not a valid date and time"},
        {NULL, "\"2027-01-02 00:00:00\"", "validStartTime: required"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        body_change ch[BODY_CHANGES] = {{"validStartTime", v[i].start}, {"validEndTime", v[i].end}};
        tpl t;
        jsonin_err err;
        if (body_expect(i, parse(ch, &t, &err), &err, v[i].err) && !v[i].err)
            CHECK(t.valid_end_ms > NOW && t.valid_start_ms < t.valid_end_ms);
        tpl_clear(&t);
    }
}

/* The discount rules of each type: which fields each needs and accepts, and the rules stored
 * (only the fields that mean something for the type, money in yuan). */
static void test_discount_rules(void)
{
#define RATE_MSG                                                                                   \
    "consumeRule.discountRate: must be a fraction paid between 0 and 1 (exclusive), at most 4 "    \
    "decimals"
#define RULE_TAIL "\"explanationOfUnmetConditions\":\"\",\"validityPeriod\":48}"
    static const struct {
        body_change ch[BODY_CHANGES];
        const char *err;
        int64_t terms, max_discount; /* cents, when accepted */
        int rate;                    /* parts per TPL_RATE_SCALE */
        const char *consume_rule;    /* as stored; NULL: not checked */
    } v[] = {
        /* clang-format off */
        /* Type 0, amount off: a threshold is optional, a rate means nothing (not stored). */
        {{{"type", "0"}, {"consumeRule.termsOfUse", NULL}}, NULL, 0, 1000, 0,
         "{\"maximumDiscountAmount\":10," RULE_TAIL},
        {{{"type", "0"}, {"consumeRule.termsOfUse", "0"}}, NULL, 0, 1000, 0,
         "{\"termsOfUse\":0,\"maximumDiscountAmount\":10," RULE_TAIL},
        {{{"type", "0"}, {"consumeRule.discountRate", "0.5"}}, NULL, 10000, 1000, 0,
         "{\"termsOfUse\":100,\"maximumDiscountAmount\":10," RULE_TAIL},
        /* Type 1, threshold: a threshold above 0 is required. */
        {{{NULL, NULL}}, NULL, 10000, 1000, 0,
         "{\"termsOfUse\":100,\"maximumDiscountAmount\":10," RULE_TAIL},
        {{{"consumeRule.termsOfUse", NULL}}, "consumeRule.termsOfUse: required", 0, 0, 0, NULL},
        {{{"consumeRule.termsOfUse", "0"}},
         "consumeRule.termsOfUse: must be between 0.01 and 100000000.00", 0, 0, 0, NULL},
        {{{"consumeRule.termsOfUse", "\"99.99\""}, {"consumeRule.maximumDiscountAmount", "0.01"}},
         NULL, 9999, 1, 0,
         "{\"termsOfUse\":99.99,\"maximumDiscountAmount\":0.01," RULE_TAIL},
        /* Type 2, percent off: a threshold (0 allowed) and a rate strictly between 0 and 1. */
        {{{"type", "2"}, {"consumeRule.discountRate", "0.85"}, {"consumeRule.termsOfUse", "0"}},
         NULL, 0, 1000, 8500,
         "{\"termsOfUse\":0,\"maximumDiscountAmount\":10,\"discountRate\":0.85," RULE_TAIL},
        {{{"type", "2"}, {"consumeRule.discountRate", "\"0.0001\""}}, NULL, 10000, 1000, 1, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "0.9999"}}, NULL, 10000, 1000, 9999, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "0.5"}, {"consumeRule.termsOfUse", NULL}},
         "consumeRule.termsOfUse: required", 0, 0, 0, NULL},
        {{{"type", "2"}},
         "consumeRule.discountRate: required when type is 2 (percent off)", 0, 0, 0, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "\"\""}},
         "consumeRule.discountRate: required when type is 2 (percent off)", 0, 0, 0, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "0"}}, RATE_MSG, 0, 0, 0, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "1"}}, RATE_MSG, 0, 0, 0, NULL},
        {{{"type", "2"}, {"consumeRule.discountRate", "0.12345"}}, RATE_MSG, 0, 0, 0, NULL},
        /* clang-format on */
    };
#undef RATE_MSG
#undef RULE_TAIL
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tpl t;
        jsonin_err err;
        if (body_expect(i, parse(v[i].ch, &t, &err), &err, v[i].err) && !v[i].err) {
            CHECK_EQ_INT(t.terms_cents, v[i].terms);
            CHECK_EQ_INT(t.max_discount_cents, v[i].max_discount);
            CHECK_EQ_INT(t.discount_rate, v[i].rate);
            if (v[i].consume_rule)
                CHECK_EQ_STR(t.consume_rule, v[i].consume_rule);
        }
        tpl_clear(&t);
    }
}

/* What an accepted body becomes. */
static void test_accepted(void)
{
    static const body_change none[BODY_CHANGES] = {{NULL, NULL}};
    tpl t;
    jsonin_err err;
    CHECK_EQ_INT(parse(none, &t, &err), QN_OK);
    CHECK_EQ_STR(t.name, "100 off 10");
    CHECK_EQ_STR(t.goods, "G-1");
    CHECK_EQ_INT(t.type, TPL_TYPE_THRESHOLD);
    CHECK_EQ_INT(t.target, TPL_TARGET_GOODS);
    CHECK_EQ_INT(t.status, TPL_STATUS_ACTIVE);
    CHECK_EQ_INT(t.stock, 100);
    CHECK_EQ_INT(t.limit_per_person, 2);
    CHECK_EQ_INT(t.validity_hours, 48);
    CHECK_EQ_STR(t.receive_rule, "{\"limitPerPerson\":2,\"usageInstructions\":\"x\"}");
    CHECK_EQ_INT(t.buckets, 1); /* stockBuckets absent */
    tpl_clear(&t);
    static const body_change three[BODY_CHANGES] = {{"stockBuckets", "3"}};
    CHECK_EQ_INT(parse(three, &t, &err), QN_OK);
    CHECK_EQ_INT(t.buckets, 3);
    tpl_clear(&t);
    /* Not an object at all. */
    memset(&t, 0, sizeof(t));
    cJSON *arr = cJSON_CreateArray();
    CHECK_EQ_INT(templates_create_parse(arr, NOW, &t, &err), QN_EINVAL);
    CHECK_EQ_STR(err.msg, "body: must be a JSON object");
    CHECK_EQ_INT(templates_create_parse(NULL, NOW, &t, &err), QN_EINVAL);
    cJSON_Delete(arr);
    tpl_clear(&t);
}

/* increase-number (number > 0) and terminate (0) on the row as found. */
static void test_change(void)
{
    static const struct {
        int status;
        int64_t stock, number;
        int allowed;
        errcode code;
        const char *msg;
    } v[] = {
        {TPL_STATUS_ACTIVE, 100, 0, 1, 0, NULL},
        {TPL_STATUS_ACTIVE, 100, 5, 1, 0, NULL},
        {TPL_STATUS_ACTIVE, 19999995, 5, 1, 0, NULL}, /* exactly the most */
        {TPL_STATUS_ACTIVE, 19999995, 6, 0, ERRCODE_INVALID,
         "number: the stock would exceed 20000000"},
        {TPL_STATUS_ACTIVE, 20000000, 0, 1, 0, NULL}, /* terminate adds nothing */
        {TPL_STATUS_ENDED, 100, 0, 0, ERRCODE_ENDED, "the coupon template has ended"},
        {TPL_STATUS_ENDED, 100, 5, 0, ERRCODE_ENDED, "the coupon template has ended"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        errcode code = ERRCODE_COUNT;
        char msg[96] = "";
        int ok =
            templates_change_allowed(v[i].status, v[i].stock, v[i].number, &code, msg, sizeof(msg));
        if (ok != v[i].allowed)
            printf("  case %zu\n", i);
        CHECK_EQ_INT(ok, v[i].allowed);
        if (!v[i].allowed) {
            CHECK_EQ_INT(code, v[i].code);
            CHECK_EQ_STR(msg, v[i].msg);
        }
    }
}

/* stockBuckets in increase-number's, change-buckets' or terminate's body: the template's or
 * none keeps them; another starts a change, except in terminate (400) and while a change is
 * under way (409, also for a plain increase-number). */
static void test_buckets_change(void)
{
    static const struct {
        int stored, from, asked, terminate, want;
        errcode code;
    } v[] = {
        {1, 0, 0, 0, TEMPLATES_BUCKETS_KEPT, 0},
        {3, 0, 3, 0, TEMPLATES_BUCKETS_KEPT, 0},
        {3, 0, 0, 1, TEMPLATES_BUCKETS_KEPT, 0},
        {3, 0, 3, 1, TEMPLATES_BUCKETS_KEPT, 0},
        {3, 0, 1, 0, TEMPLATES_BUCKETS_CHANGED, 0},
        {1, 0, 2, 0, TEMPLATES_BUCKETS_CHANGED, 0},
        {64, 0, 63, 0, TEMPLATES_BUCKETS_CHANGED, 0},
        {3, 0, 1, 1, TEMPLATES_BUCKETS_REFUSED, ERRCODE_INVALID},
        {3, 1, 0, 0, TEMPLATES_BUCKETS_REFUSED, ERRCODE_STATE},
        {3, 1, 3, 0, TEMPLATES_BUCKETS_REFUSED, ERRCODE_STATE},
        {3, 1, 2, 0, TEMPLATES_BUCKETS_REFUSED, ERRCODE_STATE},
        {3, 1, 0, 1, TEMPLATES_BUCKETS_KEPT, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        errcode code = ERRCODE_COUNT;
        char msg[160] = "";
        int got = templates_buckets_change(v[i].stored, v[i].from, v[i].asked, v[i].terminate,
                                           &code, msg, sizeof(msg));
        if (got != v[i].want)
            printf("  case %zu\n", i);
        CHECK_EQ_INT(got, v[i].want);
        if (v[i].want == TEMPLATES_BUCKETS_REFUSED) {
            CHECK_EQ_INT(code, v[i].code);
            CHECK(strncmp(msg, "stockBuckets: ", 14) == 0);
        }
    }
}

/* The stock buckets a peak asks for: masters' worth, never more masters than there are, never
 * a bucket of less than TEMPLATES_BUCKET_SHARE_MIN units, one when nothing asks for more. */
static void test_auto_buckets(void)
{
    static const struct {
        int64_t stock, peak;
        int masters;
        int64_t per_master;
        int want;
    } v[] = {
        {100000, 0, 3, 12000, 1},             /* no peak given */
        {100000, 30000, 1, 12000, 1},         /* one Redis: nothing to spread over */
        {100000, 12000, 3, 12000, 1},         /* one master's worth */
        {100000, 12001, 3, 12000, 2},         /* a little more */
        {100000, 30000, 3, 12000, 3},         /* three masters' worth */
        {100000, 100000, 3, 12000, 3},        /* more than there are masters */
        {100000, 100000, 12, 12000, 9},       /* 100 000 / 12 000, rounded up */
        {2500, 100000, 12, 12000, 2},         /* a small stock: 1 000 units a bucket at least */
        {999, 100000, 12, 12000, 1},          /* below one share */
        {10000000, 10000000, 200, 12000, 64}, /* at most TPL_BUCKETS_MAX */
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int got = templates_auto_buckets(v[i].stock, v[i].peak, v[i].masters, v[i].per_master);
        if (got != v[i].want)
            printf("  case %zu\n", i);
        CHECK_EQ_INT(got, v[i].want);
    }
}

static void test_like_pattern(void)
{
    static const struct {
        const char *in, *out;
    } v[] = {
        {"", "%%"},         {"tea", "%tea%"},       {"50%", "%50\\%%"},
        {"a_b", "%a\\_b%"}, {"c:\\x", "%c:\\\\x%"}, {"%_\\", "%\\%\\_\\\\%"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char *p = templates_like_pattern(v[i].in);
        CHECK_EQ_STR(p, v[i].out);
        free(p);
    }
}

int main(void)
{
    RUN(test_fields);
    RUN(test_text_lengths);
    RUN(test_window);
    RUN(test_discount_rules);
    RUN(test_accepted);
    RUN(test_change);
    RUN(test_buckets_change);
    RUN(test_auto_buckets);
    RUN(test_like_pattern);
    TEST_MAIN_END();
}
