/* jsonout.c: the text it writes parses back to what cJSON would have printed: strings with
 * quotes, control characters and UTF-8 (longer than one escape slice), numbers at the limits,
 * ids as strings, and amounts in cents against cJSON's own print of cents / 100.0. */
#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsonout.h"
#include "testhelp.h"

/* b's text, NUL-terminated, then b emptied (caller frees). */
static char *take(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    return s;
}

static void test_strings(void)
{
    struct evbuffer *b = evbuffer_new();
    char long_s[2000];
    for (size_t i = 0; i < sizeof(long_s) - 1; i++)
        long_s[i] = "a\"\\\n\x01\xe6\xbb\xa1"[i % 8];
    long_s[sizeof(long_s) - 1] = '\0';
    const char *cases[] = {"", "plain", "满100减10 \"quoted\"", "tab\tcr\r", long_s, NULL};
    for (size_t i = 0; cases[i]; i++) {
        CHECK(jsonout_str(b, cases[i]) == 0);
        char *s = take(b);
        cJSON *v = cJSON_Parse(s);
        CHECK(cJSON_IsString(v) && strcmp(v->valuestring, cases[i]) == 0);
        cJSON_Delete(v);
        free(s);
    }
    CHECK(jsonout_str(b, NULL) == 0);
    char *s = take(b);
    CHECK_EQ_STR(s, "\"\"");
    free(s);
    evbuffer_free(b);
}

static void test_numbers(void)
{
    struct evbuffer *b = evbuffer_new();
    CHECK(jsonout_i64(b, INT64_MIN) == 0 && evbuffer_add(b, " ", 1) == 0 &&
          jsonout_id(b, INT64_MAX) == 0);
    char *s = take(b);
    CHECK_EQ_STR(s, "-9223372036854775808 \"9223372036854775807\"");
    free(s);
    const int64_t cents[] = {0, 1, 5, 10, 99, 100, 1900, 1990, 1999, -5, -1999, 123456789012};
    for (size_t i = 0; i < sizeof(cents) / sizeof(cents[0]); i++) {
        CHECK(jsonout_cents(b, cents[i]) == 0);
        s = take(b);
        cJSON *n = cJSON_CreateNumber((double)cents[i] / 100.0);
        char *want = cJSON_PrintUnformatted(n);
        CHECK_EQ_STR(s, want);
        free(want);
        cJSON_Delete(n);
        free(s);
    }
    CHECK(evbuffer_add(b, "{", 1) == 0 && jsonout_key(b, "a", 1) == 0 &&
          jsonout_raw(b, "{\"x\":[1]}") == 0 && jsonout_key(b, "b", 0) == 0 &&
          jsonout_i64(b, 2) == 0 && evbuffer_add(b, "}", 1) == 0);
    s = take(b);
    CHECK_EQ_STR(s, "{\"a\":{\"x\":[1]},\"b\":2}");
    free(s);
    evbuffer_free(b);
}

static int render_obj(struct evbuffer *b, const void *arg)
{
    return evbuffer_add(b, "{", 1) || jsonout_key(b, "name", 1) || jsonout_str(b, arg) ||
                   evbuffer_add(b, "}", 1)
               ? -1
               : 0;
}

static int render_fail(struct evbuffer *b, const void *arg)
{
    (void)b;
    (void)arg;
    return -1;
}

static void test_render(void)
{
    size_t len = 0;
    char *t = jsonout_render(render_obj, "a\"b", &len);
    CHECK(t != NULL);
    CHECK_EQ_STR(t, "{\"name\":\"a\\\"b\"}");
    CHECK_EQ_INT((long long)len, (long long)strlen(t));
    free(t);
    CHECK(jsonout_render(render_fail, NULL, &len) == NULL);
}

/* What PostgreSQL prints for a jsonb value, squeezed: the same value, no whitespace outside
 * strings, the strings' own spaces, tabs and escaped quotes and backslashes kept. */
static void test_squeeze(void)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"{\"termsOfUse\": 0, \"discountRate\": 0.8, \"validityPeriod\": 48}",
         "{\"termsOfUse\":0,\"discountRate\":0.8,\"validityPeriod\":48}"},
        {" {\"a\" :\t[1 ,\n 2 ],\r\n \"b\": \" x \\\" y \"} ",
         "{\"a\":[1,2],\"b\":\" x \\\" y \"}"},
        {"[\"a\\\\\", \"b c\"]", "[\"a\\\\\",\"b c\"]"}, /* "a\\" ends at its quote */
        {"{}", "{}"},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *s = strdup(cases[i].in);
        CHECK_EQ_INT(jsonout_squeeze(s), strlen(cases[i].out));
        CHECK_EQ_STR(s, cases[i].out);
        cJSON *a = cJSON_Parse(cases[i].in), *b = cJSON_Parse(s);
        CHECK(cJSON_Compare(a, b, 1) || (!a && !b));
        cJSON_Delete(a);
        cJSON_Delete(b);
        free(s);
    }
}

int main(void)
{
    RUN(test_render);
    RUN(test_strings);
    RUN(test_numbers);
    RUN(test_squeeze);
    TEST_MAIN_END();
}
