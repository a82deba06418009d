/*
 * A Redis lock, asynchronous on the event loop: wait time, lease with watchdog renewal, and
 * five failure strategies (those of the platform Quan replaces), made safe:
 * - each acquisition has its own random 128-bit owner token; renewal and release act only
 *   while the key still holds that token (lua-scripts/lock_*.lua);
 * - failure to acquire is always reported to the caller, SKIP strategies included (never a
 *   silent success of an endpoint that did nothing);
 * - retries are timers on the loop (20-50 ms with jitter), never sleeps.
 * The lock name is the Redis key: build it per resource ("quan:lock:exchange:{<userId>}"),
 * never one global name for everything (one global lock would serialise every user).
 *
 * | strategy                      | attempts               | not acquired reports        |
 * |-------------------------------|------------------------|-----------------------------|
 * | LOCK_SKIP_FAST                | one                    | LOCK_SKIPPED                |
 * | LOCK_FAIL_FAST                | one                    | LOCK_FAILED_BUSY            |
 * | LOCK_SKIP_AFTER_RETRY_TIMEOUT | until wait_ms passed   | LOCK_SKIPPED                |
 * | LOCK_FAIL_AFTER_RETRY_TIMEOUT | until wait_ms passed   | LOCK_FAILED_TIMEOUT         |
 * | LOCK_KEEP_RETRY               | until acquired         | (only LOCK_FAILED_ERROR)    |
 * A Redis error (no reply, error reply) on the last attempt reports LOCK_FAILED_ERROR.
 */
#ifndef QUAN_LOCK_H
#define QUAN_LOCK_H

#include <stdint.h>

#include "redis.h"
#include "status.h"

typedef enum {
    LOCK_SKIP_FAST = 0,
    LOCK_FAIL_FAST,
    LOCK_SKIP_AFTER_RETRY_TIMEOUT,
    LOCK_FAIL_AFTER_RETRY_TIMEOUT, /* the default of the platform Quan replaces */
    LOCK_KEEP_RETRY,
} lock_strategy;

typedef enum {
    LOCK_ACQUIRED = 0,
    LOCK_SKIPPED,
    LOCK_FAILED_BUSY,
    LOCK_FAILED_TIMEOUT,
    LOCK_FAILED_ERROR,
} lock_outcome;

#define LOCK_WATCHDOG_LEASE_MS 30000

typedef struct lock_opts {
    const char *name;    /* Redis key; copied */
    int64_t wait_ms;     /* retry strategies: how long to keep trying; < 0 -> 1000 */
    int64_t lease_ms;    /* > 0: fixed lease, no renewal; <= 0 (-1): watchdog mode */
    int64_t watchdog_ms; /* watchdog lease, renewed every watchdog_ms / 3; 0 -> 30000 */
    lock_strategy strategy;
} lock_opts;

typedef struct lock_handle lock_handle;

/* h: owned by the caller when o == LOCK_ACQUIRED (give it back with lock_release), else NULL.
 * Called exactly once, on the loop thread, never from inside lock_acquire. */
typedef void (*lock_cb)(lock_handle *h, lock_outcome o, void *arg);
/* released: 1 if our token was deleted, 0 if the lock was no longer ours (lease ran out) or
 * Redis failed (then the lease frees it). */
typedef void (*lock_release_cb)(int released, void *arg);

/* c is borrowed and must outlive every acquisition and handle. QN_OK: cb will be called once.
 * Otherwise (QN_EINVAL, QN_ENOMEM, or the first command could not be issued) cb is not called. */
qn_status lock_acquire(redis_client *c, const lock_opts *o, lock_cb cb, void *arg) QN_MUSTCHECK;
/* Stops the watchdog, compare-and-deletes, frees h (after done runs, if given). NULL: no-op. */
void lock_release(lock_handle *h, lock_release_cb done, void *arg);
/* 1 once the watchdog found the key gone or owned by another token: the protected work may
 * no longer be exclusive. */
int lock_handle_lost(const lock_handle *h);
/* Borrowed, valid until lock_release. */
const char *lock_handle_token(const lock_handle *h);
const char *lock_handle_name(const lock_handle *h);

/* A fresh random owner token (32 hex digits), for holders that take a lock by hand on a
 * synchronous client (SET NX PX, then lock_renew.lua / lock_release.lua with this token).
 * QN_ERR if the kernel gives no randomness. */
#define LOCK_TOKEN_LEN 33
qn_status lock_token_new(char out[LOCK_TOKEN_LEN]) QN_MUSTCHECK;

const char *lock_outcome_str(lock_outcome o);
/* "skip_fast", "fail_fast", "skip_after_retry_timeout", "fail_after_retry_timeout",
 * "keep_retry" (case-insensitive, '-' accepted for '_'). QN_EINVAL if unknown. */
qn_status lock_strategy_parse(const char *s, lock_strategy *out) QN_MUSTCHECK;

#endif
