/* HS256 JSON Web Tokens: minting and the gateway's verification; the token in jwt.h. */
#include "jwt.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

static const char jwt_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* The header every token carries, and its encoding. */
static const char jwt_header[] = "{\"alg\":\"HS256\",\"typ\":\"JWT\"}";

#define JWT_SIG_LEN 43 /* base64url of 32 bytes */

size_t jwt_b64url_len(size_t n)
{
    return n / 3 * 4 + (n % 3 ? n % 3 + 1 : 0);
}

void jwt_b64url_encode(const unsigned char *in, size_t n, char *out)
{
    size_t i = 0, o = 0;

    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = jwt_alphabet[v >> 18 & 63];
        out[o++] = jwt_alphabet[v >> 12 & 63];
        out[o++] = jwt_alphabet[v >> 6 & 63];
        out[o++] = jwt_alphabet[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)in[i] << 16;
        out[o++] = jwt_alphabet[v >> 18 & 63];
        out[o++] = jwt_alphabet[v >> 12 & 63];
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = jwt_alphabet[v >> 18 & 63];
        out[o++] = jwt_alphabet[v >> 12 & 63];
        out[o++] = jwt_alphabet[v >> 6 & 63];
    }
    out[o] = '\0';
}

static int jwt_b64url_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

qn_status jwt_b64url_decode(const char *in, size_t n, unsigned char *out, size_t cap,
                            size_t *outlen)
{
    size_t o = 0, need = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
    uint32_t acc = 0;
    int bits = 0;

    if (n % 4 == 1)
        return QN_EINVAL;
    if (need > cap)
        return QN_ERR;
    for (size_t i = 0; i < n; i++) {
        int v = jwt_b64url_value(in[i]);
        if (v < 0)
            return QN_EINVAL;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* What is left must be zero: two encodings of one value would otherwise both pass. */
    if (acc != 0)
        return QN_EINVAL;
    *outlen = o;
    return QN_OK;
}

/* UTF-16 units of UTF-8 text, or -1 if it is not valid UTF-8 or holds a control character
 * (C0, DEL, C1). */
static long jwt_name_units(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    long units = 0;

    while (*p) {
        uint32_t cp;
        int len;
        if (*p < 0x80)
            cp = *p, len = 1;
        else if ((*p & 0xe0) == 0xc0)
            cp = *p & 0x1f, len = 2;
        else if ((*p & 0xf0) == 0xe0)
            cp = *p & 0x0f, len = 3;
        else if ((*p & 0xf8) == 0xf0)
            cp = *p & 0x07, len = 4;
        else
            return -1;
        for (int i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return -1;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        /* Overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return -1;
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
            return -1;
        units += cp >= 0x10000 ? 2 : 1;
        p += len;
    }
    return units;
}

bool jwt_name_ok(const char *s)
{
    long units = s ? jwt_name_units(s) : -1;
    return units >= 1 && units <= JWT_NAME_MAX;
}

/* A positive int64 in decimal without sign, blanks or leading zeros: the claims' ids. */
static int64_t jwt_parse_id(const char *s)
{
    size_t n = strspn(s, "0123456789");
    int64_t v = 0;

    if (n == 0 || n > 19 || s[n] != '\0' || s[0] == '0')
        return 0;
    for (size_t i = 0; i < n; i++) {
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    return v;
}

static qn_status jwt_mac(const char *key, size_t keylen, const char *msg, size_t n,
                         char sig[JWT_SIG_LEN + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;

    /* One-shot HMAC is not deprecated in OpenSSL 3 and has no shared state. */
    if (!HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, n, md, &mdlen) ||
        mdlen != 32)
        return QN_ERR;
    jwt_b64url_encode(md, mdlen, sig);
    return QN_OK;
}

qn_status jwt_sign(const char *key, size_t keylen, const jwt_claims *c, char *out, size_t outlen,
                   char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    cJSON *payload = NULL;
    char *json = NULL, num[24], sig[JWT_SIG_LEN + 1];

    if (keylen < JWT_KEY_MIN) {
        qn_errf(err, errlen, "the key must hold at least %d bytes", JWT_KEY_MIN);
        goto out;
    }
    if (c->user_id <= 0 || c->shop_number < 0) {
        qn_errf(err, errlen, "%s must be a positive id", c->user_id <= 0 ? "sub" : "shop");
        goto out;
    }
    if (c->name[0] && !jwt_name_ok(c->name)) {
        qn_errf(err, errlen, "name must be 1 to %d characters without control characters",
                JWT_NAME_MAX);
        goto out;
    }
    if (c->exp <= 0 || c->nbf < 0 || c->iat < 0) {
        qn_errf(err, errlen, "exp must be a time after the epoch");
        goto out;
    }

    st = QN_ERR;
    if (!(payload = cJSON_CreateObject()))
        goto out;
    snprintf(num, sizeof(num), "%" PRId64, c->user_id);
    if (!cJSON_AddStringToObject(payload, "sub", num))
        goto out;
    snprintf(num, sizeof(num), "%" PRId64, c->shop_number);
    if (c->shop_number && !cJSON_AddStringToObject(payload, "shop", num))
        goto out;
    if (c->name[0] && !cJSON_AddStringToObject(payload, "name", c->name))
        goto out;
    /* Seconds since the epoch are exact in a double (and in JavaScript's numbers). */
    if ((c->iat && !cJSON_AddNumberToObject(payload, "iat", (double)c->iat)) ||
        (c->nbf && !cJSON_AddNumberToObject(payload, "nbf", (double)c->nbf)) ||
        !cJSON_AddNumberToObject(payload, "exp", (double)c->exp))
        goto out;
    if (!(json = cJSON_PrintUnformatted(payload)))
        goto out;

    size_t hlen = jwt_b64url_len(sizeof(jwt_header) - 1), plen = jwt_b64url_len(strlen(json));
    if (hlen + 1 + plen + 1 + JWT_SIG_LEN + 1 > outlen ||
        hlen + 1 + plen + 1 + JWT_SIG_LEN > JWT_TOKEN_MAX) {
        qn_errf(err, errlen, "the token would be too long");
        goto out;
    }
    jwt_b64url_encode((const unsigned char *)jwt_header, sizeof(jwt_header) - 1, out);
    out[hlen] = '.';
    jwt_b64url_encode((const unsigned char *)json, strlen(json), out + hlen + 1);
    if (jwt_mac(key, keylen, out, hlen + 1 + plen, sig) != QN_OK) {
        qn_errf(err, errlen, "HMAC-SHA256 failed");
        goto out;
    }
    out[hlen + 1 + plen] = '.';
    memcpy(out + hlen + 1 + plen + 1, sig, JWT_SIG_LEN + 1);
    st = QN_OK;

out:
    free(json);
    cJSON_Delete(payload);
    return st;
}

/* Decodes one part (len characters at s) and parses it as a JSON object into *obj. */
static qn_status jwt_part_json(const char *s, size_t len, cJSON **obj)
{
    unsigned char *buf = malloc(len + 1);
    size_t n = 0;
    qn_status st = QN_ENOMEM;

    *obj = NULL;
    if (!buf)
        goto out;
    st = jwt_b64url_decode(s, len, buf, len, &n) == QN_OK ? QN_OK : QN_EINVAL;
    if (st != QN_OK)
        goto out;
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) { /* cJSON would stop there and read a shorter text */
        st = QN_EINVAL;
        goto out;
    }
    /* Through the NUL: nothing may follow the object (JSON.parse allows nothing either). */
    *obj = cJSON_ParseWithLengthOpts((const char *)buf, n + 1, NULL, 1);
    if (!*obj || !cJSON_IsObject(*obj)) {
        cJSON_Delete(*obj);
        *obj = NULL;
        st = QN_EINVAL;
    }

out:
    free(buf);
    return st;
}

/* A time claim: absent (*present false), a finite number, or not acceptable. */
static bool jwt_time(const cJSON *obj, const char *name, bool *present, double *v)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, name);
    *present = t != NULL;
    if (!t)
        return true;
    if (!cJSON_IsNumber(t) || !isfinite(t->valuedouble))
        return false;
    *v = t->valuedouble;
    return true;
}

qn_status jwt_verify(const char *key, size_t keylen, const char *token, int64_t now, jwt_claims *c,
                     char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    cJSON *header = NULL, *payload = NULL;
    const cJSON *v;
    char sig[JWT_SIG_LEN + 1];
    const char *dot1, *dot2;
    size_t len = strnlen(token, JWT_TOKEN_MAX + 1);
    bool present;
    double t;

    memset(c, 0, sizeof(*c));
    dot1 = memchr(token, '.', len);
    dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t)(dot1 + 1 - token)) : NULL;
    if (len > JWT_TOKEN_MAX || !dot2 || dot1 == token || dot2 == dot1 + 1 ||
        dot2 + 1 == token + len || memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - token)) ||
        strspn(token, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.") != len) {
        qn_errf(err, errlen, "malformed token: not three base64url parts");
        goto out;
    }

    if ((st = jwt_part_json(token, (size_t)(dot1 - token), &header)) != QN_OK) {
        if (st == QN_EINVAL)
            qn_errf(err, errlen, "malformed token: the header is not a JSON object");
        goto out;
    }
    st = QN_EINVAL;
    v = cJSON_GetObjectItemCaseSensitive(header, "alg");
    if (!cJSON_IsString(v) || strcmp(v->valuestring, "HS256") != 0) {
        qn_errf(err, errlen, "unsupported token: alg must be HS256");
        goto out;
    }
    if (cJSON_GetObjectItemCaseSensitive(header, "crit")) {
        qn_errf(err, errlen, "unsupported token: crit is not understood");
        goto out;
    }

    if (keylen < JWT_KEY_MIN || jwt_mac(key, keylen, token, (size_t)(dot2 - token), sig) != QN_OK ||
        token + len - (dot2 + 1) != JWT_SIG_LEN || CRYPTO_memcmp(sig, dot2 + 1, JWT_SIG_LEN) != 0) {
        qn_errf(err, errlen, "bad token signature");
        goto out;
    }

    if ((st = jwt_part_json(dot1 + 1, (size_t)(dot2 - dot1 - 1), &payload)) != QN_OK) {
        if (st == QN_EINVAL)
            qn_errf(err, errlen, "malformed token: the payload is not a JSON object");
        goto out;
    }
    st = QN_EINVAL;
    if (!jwt_time(payload, "exp", &present, &t) || !present) {
        qn_errf(err, errlen, "malformed token: exp must be a number (seconds since the epoch)");
        goto out;
    }
    if ((double)now >= t) {
        qn_errf(err, errlen, "token expired");
        goto out;
    }
    c->exp = (int64_t)t;
    if (!jwt_time(payload, "nbf", &present, &t)) {
        qn_errf(err, errlen, "malformed token: nbf must be a number (seconds since the epoch)");
        goto out;
    }
    if (present && (double)now < t) {
        qn_errf(err, errlen, "token not valid yet (nbf)");
        goto out;
    }
    c->nbf = present ? (int64_t)t : 0;
    if (jwt_time(payload, "iat", &present, &t) && present)
        c->iat = (int64_t)t;

    v = cJSON_GetObjectItemCaseSensitive(payload, "sub");
    if (!cJSON_IsString(v) || (c->user_id = jwt_parse_id(v->valuestring)) <= 0) {
        qn_errf(err, errlen,
                "bad token claim: sub must be a positive decimal user id, as a string");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(payload, "shop");
    if (v && (!cJSON_IsString(v) || (c->shop_number = jwt_parse_id(v->valuestring)) <= 0)) {
        qn_errf(err, errlen,
                "bad token claim: shop must be a positive decimal shop number, as a string");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(payload, "name");
    if (v && (!cJSON_IsString(v) || !jwt_name_ok(v->valuestring))) {
        qn_errf(err, errlen,
                "bad token claim: name must be 1 to %d characters without control "
                "characters",
                JWT_NAME_MAX);
        goto out;
    }
    if (v)
        snprintf(c->name, sizeof(c->name), "%s", v->valuestring);
    st = QN_OK;

out:
    cJSON_Delete(header);
    cJSON_Delete(payload);
    if (st != QN_OK)
        c->user_id = c->shop_number = 0, c->name[0] = '\0';
    return st;
}
