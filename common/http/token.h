/*
 * The callers' tokens: JSON Web Tokens (RFC 7519) signed with HMAC-SHA256 ("HS256"), as the
 * gateway verifies them (deploy/gateway/quan_auth.js) and quan-token mints them. The JWT
 * itself (base64url, the HMAC, the constant-time comparison of signatures) is Debian's libjwt
 * (1.10, on OpenSSL); this module holds the claim rules the gateway shares.
 *
 *   header   {"alg":"HS256","typ":"JWT"}
 *   payload  {"sub":"42","shop":"1810714735922956666","name":"alice","iat":...,"exp":...}
 *   token    base64url(header) "." base64url(payload) "." base64url(HMAC-SHA256(key, the two))
 *            (base64url without padding, RFC 7515)
 *
 * Claims: sub is the user id and shop the shop number (optional), each a positive decimal
 * int64 written as a string (JSON numbers lose digits past 2^53 in JavaScript); name the
 * username (optional): 1 to TOKEN_NAME_MAX characters (UTF-16 units, as JavaScript counts), no
 * control character, since it becomes the X-Username header. exp is required and nbf
 * optional, in seconds since the epoch; a token is good from nbf up to, not including, exp.
 *
 * Verified as the gateway does (the same rules, the same order, so that both refuse a token
 * for the same reason): three base64url parts, each the canonical encoding of its bytes; a
 * header that is a JSON object with alg exactly HS256 (never "none"), no crit, and typ, when a
 * string, "JWT" in any case; a payload that is a JSON object; the signature; then exp, nbf and
 * the claims. The key is
 * QUAN_GATEWAY_JWT_SECRET's bytes, at least TOKEN_KEY_MIN of them. Thread-safe, no state.
 */
#ifndef QUAN_TOKEN_H
#define QUAN_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define TOKEN_MAX      4096 /* characters of a whole token; longer is refused */
#define TOKEN_KEY_MIN  16
#define TOKEN_NAME_MAX 64  /* UTF-16 units */
#define TOKEN_NAME_BUF 257 /* 64 units are at most 256 bytes of UTF-8 */

typedef struct {
    int64_t user_id;           /* sub, > 0 */
    int64_t shop_number;       /* shop; 0: none */
    char name[TOKEN_NAME_BUF]; /* name; "": none */
    int64_t iat;               /* 0: none (written by token_sign, read by nothing else) */
    int64_t exp;               /* required */
    int64_t nbf;               /* 0: none */
} token_claims;

/* True if s is a name the claims may carry (see above). */
bool token_name_ok(const char *s);

/* Mints the token of c (user_id > 0 required; shop_number 0, name "", iat 0 and nbf 0 are left
 * out) under key into out (outlen bytes). QN_EINVAL with err: a claim or the key is not
 * acceptable; QN_ERR: out too small or the HMAC failed. */
QN_MUSTCHECK qn_status token_sign(const char *key, size_t keylen, const token_claims *c, char *out,
                                  size_t outlen, char *err, size_t errlen);

/* Verifies token under key at time now (seconds since the epoch) and fills c. QN_EINVAL with
 * err the gateway's message for the same token ("bad token signature", "token expired", ...);
 * QN_ENOMEM when parsing ran out of memory. */
QN_MUSTCHECK qn_status token_verify(const char *key, size_t keylen, const char *token, int64_t now,
                                    token_claims *c, char *err, size_t errlen);

#endif
