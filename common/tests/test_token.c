/* Unit tests of the HS256 tokens: minting, and every refusal of the verification. */
#include "token.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "testhelp.h"

static const char KEY[] = "test-key-0123456789abcdef";
#define NOW 1800000000

/* base64url without padding of n bytes into out (OpenSSL's base64, its alphabet translated):
 * the tests' own encoder, so that forged tokens do not depend on the code under test. */
static void b64url(const unsigned char *in, size_t n, char *out)
{
    int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    for (int i = 0; i < len; i++)
        out[i] = out[i] == '+' ? '-' : out[i] == '/' ? '_' : out[i];
    while (len > 0 && out[len - 1] == '=')
        out[--len] = '\0';
}

/* ... and back (n characters, no padding), for reading what was minted. */
static size_t b64url_decode(const char *in, size_t n, unsigned char *out)
{
    char buf[1024];
    size_t k = 0;
    for (; k < n; k++)
        buf[k] = in[k] == '-' ? '+' : in[k] == '_' ? '/' : in[k];
    while (k % 4)
        buf[k++] = '=';
    int len = EVP_DecodeBlock(out, (const unsigned char *)buf, (int)k);
    return (size_t)len - (n % 4 == 2 ? 2 : n % 4 == 3 ? 1 : 0);
}

/* A token of any header and payload text, signed under key (what an attacker, or a careless
 * minter, could send). */
static void forge(const char *key, const char *header, const char *payload, char *out)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    size_t n;

    b64url((const unsigned char *)header, strlen(header), out);
    n = strlen(out);
    out[n++] = '.';
    b64url((const unsigned char *)payload, strlen(payload), out + n);
    n = strlen(out);
    HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)out, n, md, &mdlen);
    out[n++] = '.';
    b64url(md, mdlen, out + n);
}

/* token's signature made again for its first two parts, as they are now. */
static void resign(const char *key, char *token)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char *sig = strrchr(token, '.');
    HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)token, (size_t)(sig - token),
         md, &mdlen);
    b64url(md, mdlen, sig + 1);
}

/* The message token_verify gives for token ("" when it is good). */
static const char *verdict(const char *token)
{
    static char err[256];
    token_claims c;
    err[0] = '\0';
    if (token_verify(KEY, strlen(KEY), token, NOW, &c, err, sizeof(err)) == QN_OK)
        return "";
    return err;
}

static const char *payload_verdict(const char *payload)
{
    static char token[TOKEN_MAX + 64];
    forge(KEY, "{\"alg\":\"HS256\",\"typ\":\"JWT\"}", payload, token);
    return verdict(token);
}

static void test_sign_verify(void)
{
    token_claims c = {
        .user_id = 42, .shop_number = 1810714735922956666, .iat = NOW - 5, .exp = NOW + 3600};
    char token[TOKEN_MAX + 1], err[128];
    snprintf(c.name, sizeof(c.name), "%s", "alice 李");

    CHECK(token_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_OK);
    /* The header every token starts with: {"alg":"HS256","typ":"JWT"}. */
    CHECK(strncmp(token, "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.", 37) == 0);

    token_claims got;
    CHECK(token_verify(KEY, strlen(KEY), token, NOW, &got, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(got.user_id, 42);
    CHECK_EQ_INT(got.shop_number, 1810714735922956666);
    CHECK_EQ_STR(got.name, "alice 李");
    CHECK_EQ_INT(got.exp, NOW + 3600);
    CHECK_EQ_INT(got.iat, NOW - 5);

    /* The payload as written: ids as strings, times as numbers. */
    const char *p = strchr(token, '.') + 1;
    unsigned char json[512];
    size_t n = b64url_decode(p, (size_t)(strchr(p, '.') - p), json);
    json[n] = '\0';
    CHECK_EQ_STR((char *)json, "{\"exp\":1800003600,\"iat\":1799999995,\"name\":\"alice 李\","
                               "\"shop\":\"1810714735922956666\",\"sub\":\"42\"}");

    /* Only sub and exp are required. */
    token_claims bare = {.user_id = 7, .exp = NOW + 1};
    CHECK(token_sign(KEY, strlen(KEY), &bare, token, sizeof(token), err, sizeof(err)) == QN_OK);
    CHECK(token_verify(KEY, strlen(KEY), token, NOW, &got, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(got.user_id, 7);
    CHECK_EQ_INT(got.shop_number, 0);
    CHECK_EQ_STR(got.name, "");
    /* Good up to, not including, exp. */
    CHECK(token_verify(KEY, strlen(KEY), token, NOW + 1, &got, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "token expired");
    CHECK_EQ_INT(got.user_id, 0);
}

static void test_sign_refuses(void)
{
    token_claims c = {.user_id = 42, .exp = NOW + 60};
    char token[TOKEN_MAX + 1], err[128];

    CHECK(token_sign("short", 5, &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.user_id = 0;
    CHECK(token_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.user_id = 42;
    snprintf(c.name, sizeof(c.name), "%s", "eve\r\nX-User-Id: 1");
    CHECK(token_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.name[0] = '\0';
    CHECK(token_sign(KEY, strlen(KEY), &c, token, 40, err, sizeof(err)) == QN_ERR);
}

static void test_names(void)
{
    char name[300];
    CHECK(token_name_ok("alice"));
    CHECK(token_name_ok("李雷"));
    CHECK(!token_name_ok(""));
    CHECK(!token_name_ok("a\tb"));
    CHECK(!token_name_ok("a\x7f"));
    CHECK(!token_name_ok("a\xc2\x85")); /* U+0085, a C1 control (next line) */
    CHECK(!token_name_ok("a\xc0\xaf")); /* overlong '/' */
    CHECK(!token_name_ok("a\xff"));
    memset(name, 'a', 64), name[64] = '\0';
    CHECK(token_name_ok(name));
    name[64] = 'a', name[65] = '\0';
    CHECK(!token_name_ok(name));
    /* 32 characters beyond the BMP are 64 UTF-16 units, as JavaScript counts them. */
    name[0] = '\0';
    for (int i = 0; i < 32; i++)
        strcat(name, "\xf0\x9f\x98\x80");
    CHECK(token_name_ok(name));
    strcat(name, "a");
    CHECK(!token_name_ok(name));
}

#define HEADER_MSG                                                                                 \
    "unsupported token: the header must be a JSON object with alg HS256, no crit, typ JWT if any"

static void test_refusals(void)
{
    char token[TOKEN_MAX + 64];
    token_claims c = {.user_id = 42, .exp = NOW + 60};
    char err[128];

    /* The jwt.io example: signed right (the key is checked before the claims), but no exp. */
    const char *example =
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
        "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";
    token_claims got;
    CHECK(token_verify("your-256-bit-secret", 19, example, NOW, &got, err, sizeof(err)) ==
          QN_EINVAL);
    CHECK_EQ_STR(err, "malformed token: exp must be a number (seconds since the epoch)");
    CHECK_EQ_STR(verdict(example), "bad token signature");

    CHECK(token_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(verdict(token), "");
    /* Another key; a changed payload; a changed last character of the signature. */
    CHECK(token_verify("another-key-0123456789", 22, token, NOW, &got, err, sizeof(err)) ==
          QN_EINVAL);
    CHECK_EQ_STR(err, "bad token signature");
    char other[TOKEN_MAX + 64], *sig = strrchr(token, '.');
    forge(KEY, "{\"alg\":\"HS256\",\"typ\":\"JWT\"}", "{\"sub\":\"43\",\"exp\":1900000000}", other);
    strcpy(strrchr(other, '.'), sig); /* the other payload under this token's signature */
    CHECK_EQ_STR(verdict(other), "bad token signature");
    /* The same 32 bytes written with other trailing bits (the last character's two low bits
     * are not part of the value): not the canonical encoding, refused. */
    size_t n = strlen(token);
    const char *alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    char last = token[n - 1];
    token[n - 1] = alpha[(strchr(alpha, last) - alpha) ^ 1];
    CHECK_EQ_STR(verdict(token), "bad token signature");
    token[n - 1] = last;
    CHECK_EQ_STR(verdict(token), "");

    CHECK_EQ_STR(verdict(""), "malformed token: not three base64url parts");
    CHECK_EQ_STR(verdict("a.b"), "malformed token: not three base64url parts");
    CHECK_EQ_STR(verdict("a.b.c.d"), "malformed token: not three base64url parts");
    CHECK_EQ_STR(verdict("a..c"), "malformed token: not three base64url parts");
    CHECK_EQ_STR(verdict("a+b.c.d"), "malformed token: not three base64url parts");
    CHECK_EQ_STR(verdict("bm90IGpzb24.e30.x"), HEADER_MSG);

    /* alg: exactly HS256; never none, even with an empty signature part filled in. */
    forge(KEY, "{\"alg\":\"none\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"alg\":\"HS512\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"alg\":\"hs256\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"typ\":\"JWT\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"alg\":\"HS256\",\"crit\":[\"exp\"]}", "{\"sub\":\"1\",\"exp\":1900000000}",
          token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);

    /* typ, when a string, is JWT in any case; another kind of object is refused. */
    forge(KEY, "{\"alg\":\"HS256\",\"typ\":\"JWS\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"alg\":\"HS256\",\"typ\":\"jwt\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "");
    forge(KEY, "{\"alg\":\"HS256\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "");

    /* The header and the payload only in their canonical encoding: the last character of a
     * part whose length is not a multiple of 4 has bits that are not part of the value, and
     * another value of them decodes to the same bytes. Signed again, so that only the
     * encoding is wrong. */
    forge(KEY, "{\"alg\":\"HS256\",\"ab\":1}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "");
    char *dot = strchr(token, '.');
    CHECK((dot - token) % 4 == 2);
    dot[-1] = alpha[strchr(alpha, dot[-1]) - alpha + 1];
    resign(KEY, token);
    CHECK_EQ_STR(verdict(token), HEADER_MSG);
    forge(KEY, "{\"alg\":\"HS256\",\"ab\":1}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    dot = strrchr(token, '.');
    CHECK((dot - strchr(token, '.') - 1) % 4 == 2);
    dot[-1] = alpha[strchr(alpha, dot[-1]) - alpha + 1];
    resign(KEY, token);
    CHECK_EQ_STR(verdict(token), "malformed token: the payload is not a JSON object");

    /* The payload is read before the signature is checked (as the gateway does). */
    forge("another-key-0123456789", "{\"alg\":\"HS256\"}", "not json", token);
    CHECK_EQ_STR(verdict(token), "malformed token: the payload is not a JSON object");

    CHECK_EQ_STR(payload_verdict("[1]"), "malformed token: the payload is not a JSON object");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\"}"),
                 "malformed token: exp must be a number (seconds since the epoch)");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":\"1900000000\"}"),
                 "malformed token: exp must be a number (seconds since the epoch)");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1799999999}"), "token expired");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1800000000}"), "token expired");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1800000001}"), "");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1900000000,\"nbf\":1800000001}"),
                 "token not valid yet (nbf)");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1900000000,\"nbf\":1800000000}"), "");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"exp\":1900000000,\"nbf\":null}"),
                 "malformed token: nbf must be a number (seconds since the epoch)");

    const char *sub_msg = "bad token claim: sub must be a positive decimal user id, as a string";
    CHECK_EQ_STR(payload_verdict("{\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":42,\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"0\",\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"-1\",\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"042\",\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\" 42\",\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"9223372036854775808\",\"exp\":1900000000}"), sub_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"9223372036854775807\",\"exp\":1900000000}"), "");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"shop\":12,\"exp\":1900000000}"),
                 "bad token claim: shop must be a positive decimal shop number, as a string");
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"shop\":\"0\",\"exp\":1900000000}"),
                 "bad token claim: shop must be a positive decimal shop number, as a string");
    const char *name_msg = "bad token claim: name must be 1 to 64 characters without control "
                           "characters";
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"name\":\"a\\r\\nX-User-Id: 2\","
                                 "\"exp\":1900000000}"),
                 name_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"name\":\"\",\"exp\":1900000000}"), name_msg);
    CHECK_EQ_STR(payload_verdict("{\"sub\":\"1\",\"name\":7,\"exp\":1900000000}"), name_msg);
}

int main(void)
{
    RUN(test_sign_verify);
    RUN(test_sign_refuses);
    RUN(test_names);
    RUN(test_refusals);
    TEST_MAIN_END();
}
