/* Exchange-code batches (codes.h): what create accepts, how much each chunk of the generator
 * writes until the batch is complete, and the keys of its codes.generate events. */
#include <stdint.h>
#include <string.h>

#include "../codes.h"
#include "body_help.h"
#include "events.h"
#include "testhelp.h"

static void test_create_body(void)
{
    static const struct {
        const char *body, *err; /* err NULL: accepted */
        int64_t tpl_id, count;
    } v[] = {
        {"{\"couponTemplateId\":\"1810966706881941507\",\"count\":500}", NULL,
         1810966706881941507LL, 500},
        {"{\"couponTemplateId\":7,\"count\":1}", NULL, 7, 1},
        {"{\"couponTemplateId\":7,\"count\":\"1000000\"}", NULL, 7, 1000000},
        {"{\"couponTemplateId\":7,\"count\":1000001}", "count: must be between 1 and 1000000", 0,
         0},
        {"{\"couponTemplateId\":7,\"count\":0}", "count: must be between 1 and 1000000", 0, 0},
        {"{\"couponTemplateId\":7,\"count\":1.5}", "count: must be an integer", 0, 0},
        {"{\"couponTemplateId\":7}", "count: required", 0, 0},
        {"{\"count\":5}", "couponTemplateId: required", 0, 0},
        {"{\"couponTemplateId\":0,\"count\":5}", "couponTemplateId: must be at least 1", 0, 0},
        {"{\"couponTemplateId\":\"\",\"count\":5}", "couponTemplateId: required", 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        jsonin_err err = {{0}};
        cJSON *b = jsonin_parse(v[i].body, strlen(v[i].body), &err);
        int64_t tpl = -1, count = -1;
        qn_status st = codes_create_parse(b, &tpl, &count, &err);
        if (body_expect(i, st, &err, v[i].err) && !v[i].err) {
            CHECK_EQ_INT(tpl, v[i].tpl_id);
            CHECK_EQ_INT(count, v[i].count);
        }
        cJSON_Delete(b);
    }
}

/* Each chunk writes what is missing, at most CODES_CHUNK; a batch that has them all (or more,
 * which the row lock keeps from happening) gets none. */
static void test_chunk_want(void)
{
    static const struct {
        int64_t count, generated, want;
    } v[] = {
        {5, 0, 5},           {10000, 0, 10000},    {10001, 0, 10000}, {10001, 10000, 1},
        {1000000, 0, 10000}, {1000000, 999999, 1}, {10, 10, 0},       {10, 12, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int64_t got = codes_chunk_want(v[i].count, v[i].generated);
        if (got != v[i].want)
            printf("  case %zu: %lld of %lld\n", i, (long long)v[i].generated,
                   (long long)v[i].count);
        CHECK_EQ_INT(got, v[i].want);
    }
    /* Chunk after chunk, a batch of the most codes is complete in count / CODES_CHUNK. */
    int64_t generated = 0, chunks = 0;
    while (codes_chunk_want(CODES_COUNT_MAX, generated) > 0 && chunks < 1000) {
        generated += codes_chunk_want(CODES_COUNT_MAX, generated);
        chunks++;
    }
    CHECK_EQ_INT(generated, CODES_COUNT_MAX);
    CHECK_EQ_INT(chunks, CODES_COUNT_MAX / CODES_CHUNK);
}

/* The first event of a batch and each continuation have keys of their own. */
static void test_generate_key(void)
{
    char a[CODES_KEY_LEN], b[CODES_KEY_LEN], c[CODES_KEY_LEN];
    codes_generate_key(a, sizeof(a), 42, 0);
    codes_generate_key(b, sizeof(b), 42, 10000);
    codes_generate_key(c, sizeof(c), 42, 20000);
    CHECK_EQ_STR(a, EVENT_CODES_GENERATE ":42");
    CHECK_EQ_STR(b, EVENT_CODES_GENERATE ":42:10000");
    CHECK(strcmp(b, c) != 0);
    codes_generate_key(a, sizeof(a), INT64_MAX, CODES_COUNT_MAX);
    CHECK_EQ_STR(a, EVENT_CODES_GENERATE ":9223372036854775807:1000000");
}

int main(void)
{
    RUN(test_create_body);
    RUN(test_chunk_want);
    RUN(test_generate_key);
    TEST_MAIN_END();
}
