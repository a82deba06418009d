/* The claim keys built by copies (keys.h) are the ones snprintf made before. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "keys.h"
#include "testhelp.h"

static void test_same_as_printf(void)
{
    static const int64_t ids[] = {0, 1, 42, 1810714735922956666, INT64_MAX, -5, INT64_MIN};
    static const char *const rids[] = {
        "", "g123", "a.b_c:d-e",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"};
    char got[KEYS_LEN], want[KEYS_LEN];
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        int64_t t = ids[i], u = ids[(i + 3) % (sizeof(ids) / sizeof(ids[0]))];
        keys_template(got, t);
        snprintf(want, sizeof(want), "quan:tpl:{%" PRId64 "}", t);
        CHECK_EQ_STR(got, want);
        keys_template_users(got, t);
        snprintf(want, sizeof(want), "quan:tpl:{%" PRId64 "}:users", t);
        CHECK_EQ_STR(got, want);
        keys_user_field(got, u);
        snprintf(want, sizeof(want), "%" PRId64, u);
        CHECK_EQ_STR(got, want);
        keys_template_resv(got, t);
        snprintf(want, sizeof(want), "quan:tpl:{%" PRId64 "}:resv", t);
        CHECK_EQ_STR(got, want);
        for (size_t k = 0; k < sizeof(rids) / sizeof(rids[0]); k++) {
            keys_resv_member(got, u, rids[k]); /* also the claim's marker field */
            snprintf(want, sizeof(want), "%" PRId64 ":%s", u, rids[k]);
            CHECK_EQ_STR(got, want);
        }
    }
}

/* snprintf, cutting quietly (the point of the test below) */
__attribute__((format(printf, 3, 4))) static void cut(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

/* Too long for KEYS_LEN: cut where snprintf cuts, never past the buffer. */
static void test_cut(void)
{
    char rid[200], got[KEYS_LEN + 8], want[KEYS_LEN];
    memset(rid, 'r', sizeof(rid) - 1);
    rid[sizeof(rid) - 1] = '\0';
    memset(got, 'Z', sizeof(got));
    keys_resv_member(got, INT64_MIN, rid);
    cut(want, sizeof(want), "%" PRId64 ":%s", INT64_MIN, rid);
    CHECK_EQ_STR(got, want);
    CHECK_EQ_INT(strlen(got), KEYS_LEN - 1);
    CHECK(got[KEYS_LEN] == 'Z');
    keys_resv_member(got, 7, rid);
    cut(want, sizeof(want), "7:%s", rid);
    CHECK_EQ_STR(got, want);
}

int main(void)
{
    RUN(test_same_as_printf);
    RUN(test_cut);
    TEST_MAIN_END();
}
