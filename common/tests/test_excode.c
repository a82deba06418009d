/* Unit tests of exchange codes: format, round trip, tampering, forgery rate, secrets. */
#include "excode.h"

#include <ctype.h>
#include <sys/random.h>

#include "testhelp.h"

static const char *const SECRET = "test-secret-0123456789abcdef";

static int in_alphabet(const char *s)
{
    for (; *s; s++)
        if (!strchr(EXCODE_ALPHABET, *s))
            return 0;
    return 1;
}

static void test_alphabet(void)
{
    CHECK_EQ_INT(strlen(EXCODE_ALPHABET), 32);
    CHECK(!strpbrk(EXCODE_ALPHABET, "01IO"));
}

static void test_round_trip(void)
{
    char code[EXCODE_LEN + 1];
    for (int i = 0; i < 2000; i++) {
        CHECK(excode_generate(SECRET, code) == QN_OK);
        CHECK_EQ_INT(strlen(code), EXCODE_LEN);
        CHECK(in_alphabet(code));
        CHECK(excode_verify(SECRET, code));
    }
    /* Deterministic for given bits; bits above the random part are ignored. */
    char a[EXCODE_LEN + 1], b[EXCODE_LEN + 1];
    excode_make(SECRET, 12345, a);
    excode_make(SECRET, 12345 | (UINT64_C(1) << 40), b);
    CHECK_EQ_STR(a, b);
    CHECK(excode_verify(SECRET, a));
    excode_make(SECRET, 0, a);
    CHECK(excode_verify(SECRET, a));
    excode_make(SECRET, (UINT64_C(1) << EXCODE_RANDOM_BITS) - 1, a);
    CHECK(excode_verify(SECRET, a));
}

static void test_case_insensitive(void)
{
    char code[EXCODE_LEN + 1], lower[EXCODE_LEN + 1], norm[EXCODE_LEN + 1];
    CHECK(excode_generate(SECRET, code) == QN_OK);
    for (int i = 0; i <= EXCODE_LEN; i++)
        lower[i] = (char)tolower((unsigned char)code[i]);
    CHECK(excode_verify(SECRET, lower));
    CHECK(excode_normalize(lower, norm) == QN_OK);
    CHECK_EQ_STR(norm, code);
    CHECK(excode_normalize("ABC", norm) == QN_EINVAL);
    CHECK(excode_normalize("ABCDEFGHI0", norm) == QN_EINVAL);
}

/* Changing any one character to any other alphabet character must break the check, for
 * every position: each 20-bit check is recomputed, so a single change passes only if it
 * lands on another valid code (2^-20 per try; over 31*10*200 tries that is ~0.06 expected,
 * bound 3 leaves the test essentially never flaky). */
static void test_flipped_character(void)
{
    char code[EXCODE_LEN + 1];
    int passed = 0, tried = 0;
    for (int n = 0; n < 200; n++) {
        CHECK(excode_generate(SECRET, code) == QN_OK);
        for (int i = 0; i < EXCODE_LEN; i++) {
            char orig = code[i];
            for (const char *c = EXCODE_ALPHABET; *c; c++) {
                if (*c == orig)
                    continue;
                code[i] = *c;
                passed += excode_verify(SECRET, code);
                tried++;
            }
            code[i] = orig;
        }
        CHECK(excode_verify(SECRET, code));
    }
    CHECK_EQ_INT(tried, 200 * 10 * 31);
    printf("  flipped: %d of %d passed\n", passed, tried);
    CHECK(passed <= 3);
}

/* 100,000 uniformly random alphabet strings: expected passes 100000 / 2^20 ~= 0.095.
 * P(X >= 4) for Poisson(0.095) is ~3e-6, so "at most 3" fails only if the check is broken. */
static void test_random_strings_rejected(void)
{
    unsigned char rnd[EXCODE_LEN];
    char code[EXCODE_LEN + 1];
    int passed = 0;
    for (int n = 0; n < 100000; n++) {
        CHECK(getrandom(rnd, sizeof(rnd), 0) == (ssize_t)sizeof(rnd));
        for (int i = 0; i < EXCODE_LEN; i++)
            code[i] = EXCODE_ALPHABET[rnd[i] & 31];
        code[EXCODE_LEN] = '\0';
        passed += excode_verify(SECRET, code);
    }
    printf("  random strings: %d of 100000 passed (expected ~0.1)\n", passed);
    CHECK(passed <= 3);
}

static void test_wrong_secret(void)
{
    char code[EXCODE_LEN + 1];
    int passed = 0;
    for (int n = 0; n < 10000; n++) {
        CHECK(excode_generate(SECRET, code) == QN_OK);
        passed += excode_verify("another-secret-0123456789", code);
    }
    printf("  wrong secret: %d of 10000 passed\n", passed);
    CHECK(passed <= 2);
}

static void test_malformed(void)
{
    char code[EXCODE_LEN + 1];
    CHECK(excode_generate(SECRET, code) == QN_OK);
    CHECK(!excode_verify(SECRET, NULL));
    CHECK(!excode_verify(NULL, code));
    CHECK(!excode_verify(SECRET, ""));
    char longer[EXCODE_LEN + 2];
    memcpy(longer, code, EXCODE_LEN);
    longer[EXCODE_LEN] = '2';
    longer[EXCODE_LEN + 1] = '\0';
    CHECK(!excode_verify(SECRET, longer));
    code[EXCODE_LEN - 1] = '\0';
    CHECK(!excode_verify(SECRET, code));
    CHECK(!excode_verify(SECRET, "ABCDEFGHJ0"));
    CHECK(!excode_verify(SECRET, "ABCDEFGHJ "));
    CHECK(!excode_verify(SECRET, "ABCDEFGHJ\xc3"));
}

int main(void)
{
    RUN(test_alphabet);
    RUN(test_round_trip);
    RUN(test_case_insensitive);
    RUN(test_flipped_character);
    RUN(test_random_strings_rejected);
    RUN(test_wrong_secret);
    RUN(test_malformed);
    TEST_MAIN_END();
}
