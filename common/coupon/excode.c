/* Exchange codes with a keyed check; layout and rationale in excode.h. */
#include "excode.h"

#include <string.h>
#include <sys/random.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

static const char excode_alphabet[] = EXCODE_ALPHABET;
static const char excode_context[] = "quan.excode.v1";

#define EXCODE_RANDOM_MASK ((UINT64_C(1) << EXCODE_RANDOM_BITS) - 1)
#define EXCODE_CHECK_MASK  ((UINT64_C(1) << EXCODE_CHECK_BITS) - 1)

/* Value of one alphabet character (either case), or -1. */
static int excode_char_value(char c)
{
    if (c >= 'a' && c <= 'z')
        c = (char)(c - 'a' + 'A');
    const char *p = c ? strchr(excode_alphabet, c) : NULL;
    return p ? (int)(p - excode_alphabet) : -1;
}

static uint32_t excode_check(const char *secret, uint32_t random_bits)
{
    unsigned char msg[sizeof(excode_context) - 1 + 4];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;

    memcpy(msg, excode_context, sizeof(excode_context) - 1);
    msg[sizeof(msg) - 4] = (unsigned char)(random_bits >> 24);
    msg[sizeof(msg) - 3] = (unsigned char)(random_bits >> 16);
    msg[sizeof(msg) - 2] = (unsigned char)(random_bits >> 8);
    msg[sizeof(msg) - 1] = (unsigned char)random_bits;
    /* One-shot HMAC is not deprecated in OpenSSL 3 and has no shared state. */
    if (!HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, sizeof(msg), md, &mdlen) || mdlen < 3)
        return UINT32_MAX; /* never equal to a 20-bit check: verification fails closed */
    return (((uint32_t)md[0] << 16 | (uint32_t)md[1] << 8 | md[2]) >> (24 - EXCODE_CHECK_BITS)) &
           (uint32_t)EXCODE_CHECK_MASK;
}

void excode_make(const char *secret, uint64_t random_bits, char out[EXCODE_LEN + 1])
{
    uint32_t r = (uint32_t)(random_bits & EXCODE_RANDOM_MASK);
    uint64_t v = (uint64_t)r << EXCODE_CHECK_BITS | (excode_check(secret, r) & EXCODE_CHECK_MASK);

    for (int i = EXCODE_LEN - 1; i >= 0; i--) {
        out[i] = excode_alphabet[v & 31];
        v >>= 5;
    }
    out[EXCODE_LEN] = '\0';
}

qn_status excode_generate(const char *secret, char out[EXCODE_LEN + 1])
{
    uint64_t r = 0;

    if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
        return QN_ERR;
    excode_make(secret, r, out);
    return QN_OK;
}

/* Decodes 10 alphabet characters into the 50-bit value; false on bad length or character. */
static bool excode_decode(const char *code, uint64_t *value)
{
    uint64_t v = 0;

    if (!code || strnlen(code, EXCODE_LEN + 1) != EXCODE_LEN)
        return false;
    for (int i = 0; i < EXCODE_LEN; i++) {
        int d = excode_char_value(code[i]);
        if (d < 0)
            return false;
        v = v << 5 | (uint64_t)d;
    }
    *value = v;
    return true;
}

bool excode_verify(const char *secret, const char *code)
{
    uint64_t v;

    if (!secret || !excode_decode(code, &v))
        return false;
    uint32_t r = (uint32_t)(v >> EXCODE_CHECK_BITS);
    uint32_t given = (uint32_t)(v & EXCODE_CHECK_MASK);
    uint32_t want = excode_check(secret, r);
    return given == want; /* one integer compare: no early exit to time */
}

qn_status excode_normalize(const char *code, char out[EXCODE_LEN + 1])
{
    uint64_t v;

    if (!excode_decode(code, &v))
        return QN_EINVAL;
    for (int i = 0; i < EXCODE_LEN; i++)
        out[i] = excode_alphabet[excode_char_value(code[i])];
    out[EXCODE_LEN] = '\0';
    return QN_OK;
}
