/*
 * quan_auth.js: the gateway's identity, from an HS256 JWT in "Authorization: Bearer <token>"
 * (njs 0.7, imported by nginx.conf). common/http/token.h describes the token; quan-token mints one.
 *
 * nginx.conf asks for the outcome through variables, evaluated per request for a token that
 * is not in its cache of verified tokens (a token found there is not verified again until
 * its entry ends, at most 30 s later and a second before its exp):
 *   $quan_js_auth_error    empty when the token is good, else why not (the 401's message)
 *   $quan_js_user_id       the claim sub: the user id (X-User-Id)
 *   $quan_js_shop_number   the claim shop, if any (X-Shop-Number)
 *   $quan_js_username      the claim name, if any (X-Username)
 * and answers a refused token with reject() (the services' error envelope).
 *
 * Variables rather than a subrequest (auth_request): the verification is a few string and
 * HMAC operations in the same request, needing no second location nor a round trip; and js_set
 * variables are what proxy_set_header and "if" read directly. The token is verified once per
 * request: the first of these handlers to run stores its outcome in $quan_auth_memo (a js_var)
 * and the others read it from there.
 *
 * The rules (the same as token_verify in common/http/token.c), in this order:
 *   - three base64url parts without padding, at most TOKEN_MAX characters in all;
 *   - the header is a JSON object whose alg is exactly "HS256" (so never "none"), without crit,
 *     and whose typ, when it is a string, is "JWT" in any case (as libjwt, which the C side
 *     uses, requires);
 *   - the payload is a JSON object;
 *   - the signature is HMAC-SHA256 of "header.payload" under QUAN_GATEWAY_JWT_SECRET (or the
 *     content of the file QUAN_GATEWAY_JWT_SECRET_FILE names, tokenKey), compared
 *     in time independent of where it differs;
 *   - exp is a number that has not passed, and nbf, when present, numeric and passed;
 *   - sub: a positive decimal int64 as a string; shop, when present, the same; name, when
 *     present, 1 to 64 characters and no control character (it becomes a header value, where
 *     a CR or LF would start a header of its own).
 */
var crypto = require('crypto');
var fs = require('fs');

var TOKEN_MAX = 4096;
var KEY_MIN = 16;
var KEY_FILE_MAX = 65536; /* as the services' NAME_FILE (common/core/config.h) */
var NAME_MAX = 64;
var B64URL = /^[A-Za-z0-9_-]+$/;
var INT64_MAX = '9223372036854775807';

/* A positive int64 in decimal, as the services read identity headers (http_parse_id). */
function positiveId(v) {
    if (typeof v !== 'string' || !/^[1-9][0-9]{0,18}$/.test(v)) {
        return false;
    }
    return v.length < 19 || v <= INT64_MAX; /* same length: string order is numeric order */
}

/* Equal strings, in time that depends on the length only. */
function sameString(a, b) {
    if (a.length !== b.length) {
        return false;
    }
    var diff = 0;
    for (var i = 0; i < a.length; i++) {
        diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
    }
    return diff === 0;
}

function jsonPart(part) {
    var bytes = Buffer.from(part, 'base64url');
    /* The canonical encoding only, as for the signature (Buffer.from skips what it cannot
     * decode). */
    if (bytes.toString('base64url') !== part) {
        throw new Error('not base64url');
    }
    var v = JSON.parse(bytes.toString());
    if (v === null || typeof v !== 'object' || Array.isArray(v)) {
        throw new Error('not an object');
    }
    return v;
}

function refused(message) {
    return {status: 401, error: message};
}

/* The token key: QUAN_GATEWAY_JWT_SECRET, or the content of the file QUAN_GATEWAY_JWT_SECRET_FILE
 * names, one trailing newline (LF or CR LF) dropped, as the services read a NAME_FILE. njs keeps
 * nothing from one request to the next, so the file is read for each request (once: verify's
 * answer is memoized); a Secret changed in place is then used without a restart.
 * {key: string} or {problem: why there is none} (never the key). */
function tokenKey() {
    var env = process.env.QUAN_GATEWAY_JWT_SECRET;
    var path = process.env.QUAN_GATEWAY_JWT_SECRET_FILE;
    if (env && path) {
        return {problem: 'QUAN_GATEWAY_JWT_SECRET and QUAN_GATEWAY_JWT_SECRET_FILE are both ' +
                         'set: give the key one way only'};
    }
    if (!path) {
        return env && env.length >= KEY_MIN ? {key: env}
            : {problem: 'QUAN_GATEWAY_JWT_SECRET is not set or shorter than ' + KEY_MIN +
                        ' characters'};
    }
    var bytes;
    try {
        bytes = fs.readFileSync(path);
    } catch (e) {
        return {problem: 'QUAN_GATEWAY_JWT_SECRET_FILE: cannot read ' + path + ': ' + e.message};
    }
    if (bytes.length > KEY_FILE_MAX) {
        return {problem: 'QUAN_GATEWAY_JWT_SECRET_FILE: ' + path + ' holds more than ' +
                         KEY_FILE_MAX + ' bytes (64 KiB)'};
    }
    var key = bytes.toString();
    if (key.endsWith('\r\n')) {
        key = key.slice(0, -2);
    } else if (key.endsWith('\n')) {
        key = key.slice(0, -1);
    }
    if (key.length < KEY_MIN) {
        return {problem: 'QUAN_GATEWAY_JWT_SECRET_FILE: ' + path + ' holds fewer than ' + KEY_MIN +
                         ' characters'};
    }
    return {key: key};
}

function verify(r) {
    var k = tokenKey();
    if (!k.key) {
        /* Not the client's fault: a 500 with the reason in the error log. */
        r.error('quan_auth: ' + k.problem + ': every request is refused');
        return {status: 500, error: 'the gateway cannot verify tokens'};
    }
    var key = k.key;

    var auth = r.headersIn['Authorization'];
    if (!auth) {
        return refused('missing token: send Authorization: Bearer <token>');
    }
    var m = /^Bearer +([^ ]+) *$/i.exec(auth);
    if (!m) {
        return refused('malformed token: the Authorization header is not "Bearer <token>"');
    }
    var token = m[1];
    var parts = token.split('.');
    if (token.length > TOKEN_MAX || parts.length !== 3 || !B64URL.test(parts[0]) ||
        !B64URL.test(parts[1]) || !B64URL.test(parts[2])) {
        return refused('malformed token: not three base64url parts');
    }

    var header, claims;
    try {
        header = jsonPart(parts[0]);
    } catch (e) {
        header = null;
    }
    if (header === null || header.alg !== 'HS256' || header.crit !== undefined ||
        (typeof header.typ === 'string' && header.typ.toUpperCase() !== 'JWT')) {
        return refused('unsupported token: the header must be a JSON object with alg HS256, ' +
                       'no crit, typ JWT if any');
    }
    try {
        claims = jsonPart(parts[1]);
    } catch (e) {
        return refused('malformed token: the payload is not a JSON object');
    }

    var want = crypto.createHmac('sha256', key).update(parts[0] + '.' + parts[1])
                   .digest('base64url');
    /* The canonical encoding only: a signature with other trailing bits is refused too. */
    if (!sameString(want, parts[2])) {
        return refused('bad token signature');
    }

    var now = Date.now() / 1000;
    if (typeof claims.exp !== 'number' || !isFinite(claims.exp)) {
        return refused('malformed token: exp must be a number (seconds since the epoch)');
    }
    if (now >= claims.exp) {
        return refused('token expired');
    }
    if (claims.nbf !== undefined) {
        if (typeof claims.nbf !== 'number' || !isFinite(claims.nbf)) {
            return refused('malformed token: nbf must be a number (seconds since the epoch)');
        }
        if (now < claims.nbf) {
            return refused('token not valid yet (nbf)');
        }
    }
    if (!positiveId(claims.sub)) {
        return refused('bad token claim: sub must be a positive decimal user id, as a string');
    }
    if (claims.shop !== undefined && !positiveId(claims.shop)) {
        return refused('bad token claim: shop must be a positive decimal shop number, as a string');
    }
    if (claims.name !== undefined &&
        (typeof claims.name !== 'string' || claims.name.length < 1 ||
         claims.name.length > NAME_MAX || /[\u0000-\u001f\u007f-\u009f]/.test(claims.name))) {
        return refused('bad token claim: name must be 1 to ' + NAME_MAX +
                       ' characters without control characters');
    }
    /* exp last: nginx.conf's cache of verified tokens keeps the token until a second before
     * it (quan_gw.log reads this object, as JSON, in this order). */
    return {sub: claims.sub, shop: claims.shop || '', name: claims.name || '', exp: claims.exp};
}

function verified(r) {
    var memo = r.variables.quan_auth_memo;
    if (memo) {
        return JSON.parse(memo);
    }
    var v;
    try {
        v = verify(r);
    } catch (e) {
        /* Whatever went wrong, nothing is let through. */
        r.error('quan_auth: ' + e);
        v = refused('malformed token');
    }
    r.variables.quan_auth_memo = JSON.stringify(v);
    return v;
}

function error(r) {
    return verified(r).error || '';
}

function user_id(r) {
    var v = verified(r);
    return v.error ? '' : v.sub;
}

function shop_number(r) {
    var v = verified(r);
    return v.error ? '' : v.shop;
}

function username(r) {
    var v = verified(r);
    return v.error ? '' : v.name;
}

/* The answer to a refused token: the services' error envelope (common/http/http.c), field by field
 * in their order. */
function reject(r) {
    var v = verified(r);
    var status = v.status || 401;
    var rid = r.variables.quan_request_id;
    r.headersOut['Content-Type'] = 'application/json';
    r.headersOut['X-Request-Id'] = rid;
    if (status === 401) {
        r.headersOut['WWW-Authenticate'] = 'Bearer realm="quan"';
    }
    r.return(status, JSON.stringify({
        code: status === 401 ? 'A000401' : 'B000001',
        message: v.error || 'missing or invalid token',
        data: null,
        requestId: rid,
        success: false
    }));
}

export default {error, user_id, shop_number, username, reject};
