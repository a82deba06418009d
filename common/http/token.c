/* HS256 JSON Web Tokens: minting and the gateway's verification; the token in token.h. The JWT
 * machinery is libjwt's (jwt.h); what is here are the rules the gateway shares. */
#include "token.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <jwt.h>

#define TOKEN_B64URL "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

/* UTF-16 units of UTF-8 text, or -1 if it is not valid UTF-8 or holds a control character
 * (C0, DEL, C1). */
static long token_name_units(const char *s)
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

bool token_name_ok(const char *s)
{
    long units = s ? token_name_units(s) : -1;
    return units >= 1 && units <= TOKEN_NAME_MAX;
}

/* A positive int64 in decimal without sign, blanks or leading zeros: the claims' ids. */
static int64_t token_parse_id(const char *s)
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

qn_status token_sign(const char *key, size_t keylen, const token_claims *c, char *out,
                     size_t outlen, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    jwt_t *j = NULL;
    char *token = NULL, num[24];

    if (keylen < TOKEN_KEY_MIN) {
        qn_errf(err, errlen, "the key must hold at least %d bytes", TOKEN_KEY_MIN);
        goto out;
    }
    if (c->user_id <= 0 || c->shop_number < 0) {
        qn_errf(err, errlen, "%s must be a positive id", c->user_id <= 0 ? "sub" : "shop");
        goto out;
    }
    if (c->name[0] && !token_name_ok(c->name)) {
        qn_errf(err, errlen, "name must be 1 to %d characters without control characters",
                TOKEN_NAME_MAX);
        goto out;
    }
    if (c->exp <= 0 || c->nbf < 0 || c->iat < 0) {
        qn_errf(err, errlen, "exp must be a time after the epoch");
        goto out;
    }

    st = QN_ERR;
    if (jwt_new(&j) != 0 ||
        jwt_set_alg(j, JWT_ALG_HS256, (const unsigned char *)key, (int)keylen) != 0)
        goto out;
    snprintf(num, sizeof(num), "%" PRId64, c->user_id);
    if (jwt_add_grant(j, "sub", num) != 0)
        goto out;
    snprintf(num, sizeof(num), "%" PRId64, c->shop_number);
    if (c->shop_number && jwt_add_grant(j, "shop", num) != 0)
        goto out;
    if (c->name[0] && jwt_add_grant(j, "name", c->name) != 0)
        goto out;
    /* Seconds since the epoch: integers in JSON, exact in JavaScript's numbers too. */
    if ((c->iat && jwt_add_grant_int(j, "iat", (long)c->iat) != 0) ||
        (c->nbf && jwt_add_grant_int(j, "nbf", (long)c->nbf) != 0) ||
        jwt_add_grant_int(j, "exp", (long)c->exp) != 0)
        goto out;
    if (!(token = jwt_encode_str(j))) {
        qn_errf(err, errlen, "cannot sign the token");
        goto out;
    }
    if (strlen(token) > TOKEN_MAX || strlen(token) + 1 > outlen) {
        qn_errf(err, errlen, "the token would be too long");
        goto out;
    }
    memcpy(out, token, strlen(token) + 1);
    st = QN_OK;

out:
    free(token); /* libjwt's default allocator is malloc */
    jwt_free(j);
    return st;
}

/* len base64url characters at s that are the canonical encoding of their bytes: a length some
 * encoding has, and no bits set past the last byte (which decoders drop, so that two texts
 * would carry one value). */
static bool token_b64url_canonical(const char *s, size_t len)
{
    if (len % 4 == 1)
        return false;
    if (len % 4 == 0)
        return true;
    const char *at = strchr(TOKEN_B64URL, s[len - 1]);
    int v = at ? (int)(at - TOKEN_B64URL) : -1;
    return v >= 0 && (v & (len % 4 == 2 ? 0x0f : 0x03)) == 0;
}

/* A time claim: absent (*present false), a finite number, or not acceptable. */
static bool token_time(const cJSON *obj, const char *name, bool *present, double *v)
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

/* libjwt's decoding without a key (the signature not looked at) of text; 0 or an errno. */
static int token_decode_unsigned(const char *text, jwt_t **j)
{
    *j = NULL;
    return jwt_decode(j, text, NULL, 0);
}

qn_status token_verify(const char *key, size_t keylen, const char *token, int64_t now,
                       token_claims *c, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    jwt_t *j = NULL;
    cJSON *payload = NULL;
    char *grants = NULL, *crit = NULL, head[TOKEN_MAX + 8];
    const cJSON *v;
    const char *dot1, *dot2, *alg;
    size_t len = strnlen(token, TOKEN_MAX + 1);
    bool present;
    double t;
    int rc = 0;

    memset(c, 0, sizeof(*c));
    dot1 = memchr(token, '.', len);
    dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t)(dot1 + 1 - token)) : NULL;
    if (len > TOKEN_MAX || !dot2 || dot1 == token || dot2 == dot1 + 1 || dot2 + 1 == token + len ||
        memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - token)) ||
        strspn(token, TOKEN_B64URL ".") != len) {
        qn_errf(err, errlen, "malformed token: not three base64url parts");
        goto out;
    }

    /* The header alone: its part with an empty payload ("{}") and no signature. */
    snprintf(head, sizeof(head), "%.*s.e30.", (int)(dot1 - token), token);
    if (!token_b64url_canonical(token, (size_t)(dot1 - token)) ||
        (rc = token_decode_unsigned(head, &j)) != 0 || !(alg = jwt_get_header(j, "alg")) ||
        strcmp(alg, "HS256") != 0 || (crit = jwt_get_headers_json(j, "crit")) != NULL) {
        if (j == NULL && rc == ENOMEM)
            st = QN_ENOMEM;
        qn_errf(err, errlen,
                "unsupported token: the header must be a JSON object with alg "
                "HS256, no crit, typ JWT if any");
        goto out;
    }
    jwt_free(j);
    j = NULL;

    if (!token_b64url_canonical(dot1 + 1, (size_t)(dot2 - dot1 - 1)) ||
        (rc = token_decode_unsigned(token, &j)) != 0 || !(grants = jwt_get_grants_json(j, NULL)) ||
        !(payload = cJSON_Parse(grants)) || !cJSON_IsObject(payload)) {
        if (rc == ENOMEM)
            st = QN_ENOMEM;
        qn_errf(err, errlen, "malformed token: the payload is not a JSON object");
        goto out;
    }
    jwt_free(j);
    j = NULL;

    /* libjwt compares the encoded signature with the one it computes in constant time: another
     * encoding of the same bytes is refused with any other signature. */
    if (keylen < TOKEN_KEY_MIN ||
        jwt_decode(&j, token, (const unsigned char *)key, (int)keylen) != 0 ||
        jwt_get_alg(j) != JWT_ALG_HS256) {
        qn_errf(err, errlen, "bad token signature");
        goto out;
    }

    if (!token_time(payload, "exp", &present, &t) || !present) {
        qn_errf(err, errlen, "malformed token: exp must be a number (seconds since the epoch)");
        goto out;
    }
    if ((double)now >= t) {
        qn_errf(err, errlen, "token expired");
        goto out;
    }
    c->exp = (int64_t)t;
    if (!token_time(payload, "nbf", &present, &t)) {
        qn_errf(err, errlen, "malformed token: nbf must be a number (seconds since the epoch)");
        goto out;
    }
    if (present && (double)now < t) {
        qn_errf(err, errlen, "token not valid yet (nbf)");
        goto out;
    }
    c->nbf = present ? (int64_t)t : 0;
    if (token_time(payload, "iat", &present, &t) && present)
        c->iat = (int64_t)t;

    v = cJSON_GetObjectItemCaseSensitive(payload, "sub");
    if (!cJSON_IsString(v) || (c->user_id = token_parse_id(v->valuestring)) <= 0) {
        qn_errf(err, errlen,
                "bad token claim: sub must be a positive decimal user id, as a string");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(payload, "shop");
    if (v && (!cJSON_IsString(v) || (c->shop_number = token_parse_id(v->valuestring)) <= 0)) {
        qn_errf(err, errlen,
                "bad token claim: shop must be a positive decimal shop number, as a string");
        goto out;
    }
    v = cJSON_GetObjectItemCaseSensitive(payload, "name");
    if (v && (!cJSON_IsString(v) || !token_name_ok(v->valuestring))) {
        qn_errf(err, errlen,
                "bad token claim: name must be 1 to %d characters without control "
                "characters",
                TOKEN_NAME_MAX);
        goto out;
    }
    if (v)
        snprintf(c->name, sizeof(c->name), "%s", v->valuestring);
    st = QN_OK;

out:
    jwt_free(j);
    free(grants);
    free(crit);
    cJSON_Delete(payload);
    if (st != QN_OK)
        c->user_id = c->shop_number = 0, c->name[0] = '\0';
    return st;
}
