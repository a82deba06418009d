/*
 * Duplicate-submit guard for HTTP routes, usable by any service (keyed by the real user, and
 * kept for a window after success: the platform Quan replaces keyed every user onto one
 * hard-coded id and released the lock on return, so it blocked only concurrent duplicates).
 *
 * A guarded route runs its handler only after
 *     SET quan:nodup:<path>:<user id>:<sha256(shop, query, body)> <token> NX PX inflight_ms
 * succeeded. The same user sending the same request while it is in flight, or within
 * window_ms after it was answered, gets 429 A000409; another user, shop or body is not
 * blocked. When the handler replies 2xx/3xx the key is kept for window_ms more; when it
 * replies 4xx/5xx the key is deleted, so a corrected (or retried) request is not blocked.
 * Both steps compare the token first, so a late reply never touches a newer request's key.
 * If Redis is unavailable the route answers 503 C000001 (fail closed: the guard is a promise).
 *
 * Everything runs on the loop thread, asynchronously (redis_client).
 */
#ifndef QUAN_NODUP_H
#define QUAN_NODUP_H

#include <stdint.h>

#include "http.h"
#include "redis.h"
#include "status.h"

typedef struct nodup nodup;

/* redis is borrowed (its scripts must hold nodup_release.lua) and must outlive nd.
 * window_ms >= 0: how long an answered request keeps blocking its duplicates (0: only while
 * in flight); inflight_ms > 0:
 * the key's lifetime while the handler runs (a crashed process frees it after that; make it
 * at least the request timeout). Owned; free with nodup_free after the HTTP server is gone.
 * NULL on bad arguments or out of memory. */
nodup *nodup_new(redis_client *redis, int64_t window_ms, int64_t inflight_ms) QN_MUSTCHECK;
void nodup_free(nodup *nd);

/* http_route with the guard in front of fn. path is copied; arg is borrowed. */
qn_status nodup_route(nodup *nd, http_server *srv, int method, const char *path, http_handler fn,
                      void *arg, unsigned flags) QN_MUSTCHECK;

/* The digest part of the key: sha256 hex (65 bytes with NUL) of shop, query and body. */
qn_status nodup_digest(int64_t shop_number, const char *query, const char *body, size_t body_len,
                       char out[65]) QN_MUSTCHECK;

#endif
