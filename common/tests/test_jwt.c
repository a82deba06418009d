/* Unit tests of the HS256 tokens: base64url, minting, and every refusal of the verification. */
#include "jwt.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "testhelp.h"

static const char KEY[] = "test-key-0123456789abcdef";
#define NOW 1800000000

/* A token of any header and payload text, signed under key (what an attacker, or a careless
 * minter, could send). */
static void forge(const char *key, const char *header, const char *payload, char *out)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    size_t n;

    jwt_b64url_encode((const unsigned char *)header, strlen(header), out);
    n = strlen(out);
    out[n++] = '.';
    jwt_b64url_encode((const unsigned char *)payload, strlen(payload), out + n);
    n = strlen(out);
    HMAC(EVP_sha256(), key, (int)strlen(key), (const unsigned char *)out, n, md, &mdlen);
    out[n++] = '.';
    jwt_b64url_encode(md, mdlen, out + n);
}

/* The message jwt_verify gives for token ("" when it is good). */
static const char *verdict(const char *token)
{
    static char err[256];
    jwt_claims c;
    err[0] = '\0';
    if (jwt_verify(KEY, strlen(KEY), token, NOW, &c, err, sizeof(err)) == QN_OK)
        return "";
    return err;
}

static const char *payload_verdict(const char *payload)
{
    static char token[JWT_TOKEN_MAX + 64];
    forge(KEY, "{\"alg\":\"HS256\",\"typ\":\"JWT\"}", payload, token);
    return verdict(token);
}

static void test_b64url(void)
{
    /* RFC 4648's vectors, without the padding; then the two characters of the URL alphabet. */
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE", "Zm9vYmFy"};
    char out[64];
    unsigned char back[64];
    size_t n;

    for (int i = 0; i < 7; i++) {
        jwt_b64url_encode((const unsigned char *)plain[i], strlen(plain[i]), out);
        CHECK_EQ_STR(out, enc[i]);
        CHECK_EQ_INT(jwt_b64url_len(strlen(plain[i])), strlen(enc[i]));
        CHECK(jwt_b64url_decode(enc[i], strlen(enc[i]), back, sizeof(back), &n) == QN_OK);
        CHECK_EQ_INT(n, strlen(plain[i]));
        CHECK(memcmp(back, plain[i], n) == 0);
    }
    const unsigned char ff[] = {0xfb, 0xff};
    jwt_b64url_encode(ff, 2, out);
    CHECK_EQ_STR(out, "-_8");
    CHECK(jwt_b64url_decode("-_8", 3, back, sizeof(back), &n) == QN_OK && n == 2 &&
          back[0] == 0xfb && back[1] == 0xff);

    CHECK(jwt_b64url_decode("Zh", 2, back, sizeof(back), &n) == QN_EINVAL);    /* bits left */
    CHECK(jwt_b64url_decode("Zm9vY", 5, back, sizeof(back), &n) == QN_EINVAL); /* no length */
    CHECK(jwt_b64url_decode("Zg==", 4, back, sizeof(back), &n) == QN_EINVAL);  /* padding */
    CHECK(jwt_b64url_decode("Zm+v", 4, back, sizeof(back), &n) == QN_EINVAL);  /* base64's + */
    CHECK(jwt_b64url_decode("Zm9vYmFy", 8, back, 5, &n) == QN_ERR);            /* no room */
}

static void test_sign_verify(void)
{
    jwt_claims c = {
        .user_id = 42, .shop_number = 1810714735922956666, .iat = NOW - 5, .exp = NOW + 3600};
    char token[JWT_TOKEN_MAX + 1], err[128];
    snprintf(c.name, sizeof(c.name), "%s", "alice 李");

    CHECK(jwt_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_OK);
    /* The header every token starts with: {"alg":"HS256","typ":"JWT"}. */
    CHECK(strncmp(token, "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.", 37) == 0);

    jwt_claims got;
    CHECK(jwt_verify(KEY, strlen(KEY), token, NOW, &got, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(got.user_id, 42);
    CHECK_EQ_INT(got.shop_number, 1810714735922956666);
    CHECK_EQ_STR(got.name, "alice 李");
    CHECK_EQ_INT(got.exp, NOW + 3600);
    CHECK_EQ_INT(got.iat, NOW - 5);

    /* The payload as written: ids as strings, times as numbers. */
    const char *p = strchr(token, '.') + 1;
    unsigned char json[512];
    size_t n;
    CHECK(jwt_b64url_decode(p, (size_t)(strchr(p, '.') - p), json, sizeof(json) - 1, &n) == QN_OK);
    json[n] = '\0';
    CHECK_EQ_STR((char *)json, "{\"sub\":\"42\",\"shop\":\"1810714735922956666\",\"name\":\"alice "
                               "李\",\"iat\":1799999995,\"exp\":1800003600}");

    /* Only sub and exp are required. */
    jwt_claims bare = {.user_id = 7, .exp = NOW + 1};
    CHECK(jwt_sign(KEY, strlen(KEY), &bare, token, sizeof(token), err, sizeof(err)) == QN_OK);
    CHECK(jwt_verify(KEY, strlen(KEY), token, NOW, &got, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(got.user_id, 7);
    CHECK_EQ_INT(got.shop_number, 0);
    CHECK_EQ_STR(got.name, "");
    /* Good up to, not including, exp. */
    CHECK(jwt_verify(KEY, strlen(KEY), token, NOW + 1, &got, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "token expired");
    CHECK_EQ_INT(got.user_id, 0);
}

static void test_sign_refuses(void)
{
    jwt_claims c = {.user_id = 42, .exp = NOW + 60};
    char token[JWT_TOKEN_MAX + 1], err[128];

    CHECK(jwt_sign("short", 5, &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.user_id = 0;
    CHECK(jwt_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.user_id = 42;
    snprintf(c.name, sizeof(c.name), "%s", "eve\r\nX-User-Id: 1");
    CHECK(jwt_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_EINVAL);
    c.name[0] = '\0';
    CHECK(jwt_sign(KEY, strlen(KEY), &c, token, 40, err, sizeof(err)) == QN_ERR);
}

static void test_names(void)
{
    char name[300];
    CHECK(jwt_name_ok("alice"));
    CHECK(jwt_name_ok("李雷"));
    CHECK(!jwt_name_ok(""));
    CHECK(!jwt_name_ok("a\tb"));
    CHECK(!jwt_name_ok("a\x7f"));
    CHECK(!jwt_name_ok("a\xc2\x85")); /* U+0085, a C1 control (next line) */
    CHECK(!jwt_name_ok("a\xc0\xaf")); /* overlong '/' */
    CHECK(!jwt_name_ok("a\xff"));
    memset(name, 'a', 64), name[64] = '\0';
    CHECK(jwt_name_ok(name));
    name[64] = 'a', name[65] = '\0';
    CHECK(!jwt_name_ok(name));
    /* 32 characters beyond the BMP are 64 UTF-16 units, as JavaScript counts them. */
    name[0] = '\0';
    for (int i = 0; i < 32; i++)
        strcat(name, "\xf0\x9f\x98\x80");
    CHECK(jwt_name_ok(name));
    strcat(name, "a");
    CHECK(!jwt_name_ok(name));
}

static void test_refusals(void)
{
    char token[JWT_TOKEN_MAX + 64];
    jwt_claims c = {.user_id = 42, .exp = NOW + 60};
    char err[128];

    /* The jwt.io example: signed right (the key is checked before the claims), but no exp. */
    const char *example =
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
        "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";
    jwt_claims got;
    CHECK(jwt_verify("your-256-bit-secret", 19, example, NOW, &got, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "malformed token: exp must be a number (seconds since the epoch)");
    CHECK_EQ_STR(verdict(example), "bad token signature");

    CHECK(jwt_sign(KEY, strlen(KEY), &c, token, sizeof(token), err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(verdict(token), "");
    /* Another key; a changed payload; a changed last character of the signature. */
    CHECK(jwt_verify("another-key-0123456789", 22, token, NOW, &got, err, sizeof(err)) ==
          QN_EINVAL);
    CHECK_EQ_STR(err, "bad token signature");
    char *p = strchr(token, '.') + 1;
    char was = p[2];
    p[2] = was == 'A' ? 'B' : 'A';
    CHECK_EQ_STR(verdict(token), "bad token signature");
    p[2] = was;
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
    CHECK_EQ_STR(verdict("bm90IGpzb24.e30.x"), "malformed token: the header is not a JSON object");

    /* alg: exactly HS256; never none, even with an empty signature part filled in. */
    forge(KEY, "{\"alg\":\"none\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "unsupported token: alg must be HS256");
    forge(KEY, "{\"alg\":\"HS512\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "unsupported token: alg must be HS256");
    forge(KEY, "{\"alg\":\"hs256\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "unsupported token: alg must be HS256");
    forge(KEY, "{\"typ\":\"JWT\"}", "{\"sub\":\"1\",\"exp\":1900000000}", token);
    CHECK_EQ_STR(verdict(token), "unsupported token: alg must be HS256");
    forge(KEY, "{\"alg\":\"HS256\",\"crit\":[\"exp\"]}", "{\"sub\":\"1\",\"exp\":1900000000}",
          token);
    CHECK_EQ_STR(verdict(token), "unsupported token: crit is not understood");

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
    RUN(test_b64url);
    RUN(test_sign_verify);
    RUN(test_sign_refuses);
    RUN(test_names);
    RUN(test_refusals);
    TEST_MAIN_END();
}
