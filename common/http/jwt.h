/*
 * The callers' tokens: JSON Web Tokens (RFC 7519) signed with HMAC-SHA256 ("HS256"), as the
 * gateway verifies them (deploy/gateway/quan_auth.js) and quan-token mints them.
 *
 *   header   {"alg":"HS256","typ":"JWT"}
 *   payload  {"sub":"42","shop":"1810714735922956666","name":"alice","iat":...,"exp":...}
 *   token    base64url(header) "." base64url(payload) "." base64url(HMAC-SHA256(key, the two))
 *            (base64url without padding, RFC 7515)
 *
 * Claims: sub is the user id and shop the shop number (optional), each a positive decimal
 * int64 written as a string (JSON numbers lose digits past 2^53 in JavaScript); name the
 * username (optional): 1 to JWT_NAME_MAX characters (UTF-16 units, as JavaScript counts), no
 * control character, since it becomes the X-Username header. exp is required and nbf
 * optional, in seconds since the epoch; a token is good from nbf up to, not including, exp.
 *
 * Verified as the gateway does (the same rules, the same order, so that both refuse a token
 * for the same reason): alg exactly HS256 (never "none", and no crit), the signature compared
 * in constant time against the canonical encoding, then exp, nbf and the claims. The key is
 * QUAN_GATEWAY_JWT_SECRET's bytes, at least JWT_KEY_MIN of them. Thread-safe, no state.
 */
#ifndef QUAN_JWT_H
#define QUAN_JWT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define JWT_TOKEN_MAX 4096 /* characters of a whole token; longer is refused */
#define JWT_KEY_MIN   16
#define JWT_NAME_MAX  64  /* UTF-16 units */
#define JWT_NAME_BUF  257 /* 64 units are at most 256 bytes of UTF-8 */

typedef struct {
    int64_t user_id;         /* sub, > 0 */
    int64_t shop_number;     /* shop; 0: none */
    char name[JWT_NAME_BUF]; /* name; "": none */
    int64_t iat;             /* 0: none (written by jwt_sign, read by nothing else) */
    int64_t exp;             /* required */
    int64_t nbf;             /* 0: none */
} jwt_claims;

/* Characters of base64url without padding for n bytes. */
size_t jwt_b64url_len(size_t n);

/* Writes in[0..n) as base64url without padding, NUL-terminated, into out, which holds at
 * least jwt_b64url_len(n) + 1 bytes. */
void jwt_b64url_encode(const unsigned char *in, size_t n, char *out);

/* Decodes n characters of base64url without padding into out (cap bytes). QN_EINVAL: a
 * character outside the alphabet, a length no encoding has (n % 4 == 1), or trailing bits that
 * are not zero (only the canonical encoding of a value is accepted); QN_ERR: cap too small. */
QN_MUSTCHECK qn_status jwt_b64url_decode(const char *in, size_t n, unsigned char *out, size_t cap,
                                         size_t *outlen);

/* True if s is a name the claims may carry (see above). */
bool jwt_name_ok(const char *s);

/* Mints the token of c (user_id > 0 required; shop_number 0, name "", iat 0 and nbf 0 are left
 * out) under key into out (outlen bytes). QN_EINVAL with err: a claim or the key is not
 * acceptable; QN_ERR: out too small or the HMAC failed. */
QN_MUSTCHECK qn_status jwt_sign(const char *key, size_t keylen, const jwt_claims *c, char *out,
                                size_t outlen, char *err, size_t errlen);

/* Verifies token under key at time now (seconds since the epoch) and fills c. QN_EINVAL with
 * err the gateway's message for the same token ("bad token signature", "token expired", ...);
 * QN_ENOMEM when parsing ran out of memory. */
QN_MUSTCHECK qn_status jwt_verify(const char *key, size_t keylen, const char *token, int64_t now,
                                  jwt_claims *c, char *err, size_t errlen);

#endif
