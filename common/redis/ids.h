/*
 * 64-bit snowflake ids, unique across replicas without configured worker ids.
 *
 *   bit 63      0 (ids are positive int64, written as JSON strings)
 *   bits 62..22 41 bits: milliseconds since IDS_EPOCH_MS (2024-01-01T00:00:00Z; lasts to 2093)
 *   bits 21..12 10 bits: worker id 0..1023
 *   bits 11..0  12 bits: sequence within the millisecond
 *
 * Uniqueness rests on two things: (1) no two live processes hold the same worker id — each
 * process leases one in Redis at start-up (ids_worker_claim_sync: SET NX PX on
 * "<prefix><n>", n tried from a random start) and keeps renewing it; (2) one generator per
 * worker id never issues the same (timestamp, sequence) twice — it keeps a logical clock
 * that never goes backwards.
 *
 * Clock handling, without ever sleeping:
 *   - sequence exhausted within a millisecond: spin (bounded, ~1 ms) until the wall clock ticks;
 *   - wall clock stepped back: keep issuing from the last timestamp, moving the logical clock
 *     one millisecond ahead when its sequence is exhausted, as long as it stays at most
 *     IDS_MAX_AHEAD_MS ahead of the wall clock; beyond that ids_next fails with QN_EAGAIN
 *     (the caller answers 503) until the wall clock catches up.
 * Because the logical clock is never more than IDS_MAX_AHEAD_MS ahead, a worker id released
 * (or expired) can be taken by another process without overlap, provided the lease outlives
 * that window: ids_worker_release_sync keeps the key for IDS_RELEASE_HOLD_MS instead of
 * deleting it, and the lease TTL (IDS_LEASE_TTL_MS) is far larger.
 */
#ifndef QUAN_IDS_H
#define QUAN_IDS_H

#include <stdbool.h>
#include <stdint.h>

#include "keys.h"
#include "redis.h"
#include "redis_sync.h"
#include "status.h"

#define IDS_EPOCH_MS        1704067200000LL /* 2024-01-01T00:00:00Z */
#define IDS_WORKER_BITS     10
#define IDS_SEQ_BITS        12
#define IDS_MAX_WORKER      ((1 << IDS_WORKER_BITS) - 1) /* 1023 */
#define IDS_MAX_SEQ         ((1 << IDS_SEQ_BITS) - 1)    /* 4095 */
#define IDS_MAX_AHEAD_MS    1000                         /* logical clock vs wall clock */
#define IDS_LEASE_TTL_MS    60000                        /* default lease of a worker id */
#define IDS_RELEASE_HOLD_MS (2 * IDS_MAX_AHEAD_MS)
#define IDS_TOKEN_LEN       33 /* 32 hex characters + NUL */
#define IDS_DEFAULT_PREFIX  KEYS_IDS_WORKER_PREFIX

typedef struct ids_gen ids_gen;

/* A generator for worker_id (0..IDS_MAX_WORKER); NULL if out of range or out of memory.
 * One generator per process: two generators with the same worker id would collide. */
ids_gen *ids_new(int worker_id) QN_MUSTCHECK;
void ids_free(ids_gen *g);

/*
 * The next id; thread-safe (one mutex). QN_EAGAIN when the clock went back by more than
 * IDS_MAX_AHEAD_MS or the lease deadline has passed; QN_ERR when the wall clock is outside the
 * 41-bit range (before 2024 or after 2093). *out is set only on QN_OK.
 */
qn_status ids_next(ids_gen *g, int64_t *out) QN_MUSTCHECK;

int ids_worker(const ids_gen *g);

/*
 * Issue ids under worker_id (0..IDS_MAX_WORKER) from now on, after the lease of the old one was
 * lost and a new one was leased (QN_EINVAL if out of range). Safe for the same reason as a
 * claim at start: the new id's previous holder stopped before its lease ran out, and every id
 * issued from now on is at least the wall clock's now.
 */
qn_status ids_set_worker(ids_gen *g, int worker_id) QN_MUSTCHECK;

/*
 * Stop issuing ids after deadline_wall_ms (epoch ms, CLOCK_REALTIME); 0 removes the deadline.
 * After each successful lease renewal set it to (time the renewal was sent + TTL - margin), so
 * a process that can no longer renew stops before another one may take its worker id.
 */
void ids_set_lease_deadline(ids_gen *g, int64_t deadline_wall_ms);
/* True while the lease deadline has not passed (or none is set): ids_next can issue ids. */
bool ids_leased(ids_gen *g);

/* For tests: replace the wall clock (epoch ms). fn NULL restores the real clock. */
void ids_set_clock(ids_gen *g, int64_t (*fn)(void *arg), void *arg);

/* The parts of an id. */
int64_t ids_time_ms(int64_t id); /* epoch ms */
int ids_worker_of(int64_t id);
int ids_seq_of(int64_t id);

/*
 * Worker-id leases in Redis, synchronous: call at start-up before the event loop runs, or
 * from a thread that is not the loop thread. prefix NULL means IDS_DEFAULT_PREFIX; ttl_ms 0
 * means IDS_LEASE_TTL_MS.
 *
 * claim: tries n = random start .. +1023 (mod 1024) with SET <prefix><n> <token> NX PX ttl;
 *   writes the worker and a fresh random token (caller's buffer of IDS_TOKEN_LEN).
 *   QN_EBUSY if all 1024 are taken; QN_ERR on a Redis error (redis_sync_errstr or the reply
 *   says why).
 * renew: PEXPIRE only if the key still holds our token (lock_renew.lua).
 *   QN_ECONFLICT if the lease was lost (expired and maybe taken): stop issuing ids and claim
 *   again.
 * release: shortens our lease to IDS_RELEASE_HOLD_MS (see above) if it still holds our token.
 */
qn_status ids_worker_claim_sync(redis_sync *rs, const char *prefix, int64_t ttl_ms, int *out_worker,
                                char token[IDS_TOKEN_LEN]) QN_MUSTCHECK;
qn_status ids_worker_renew_sync(redis_sync *rs, const redis_scripts *scripts, const char *prefix,
                                int worker, const char *token, int64_t ttl_ms) QN_MUSTCHECK;
qn_status ids_worker_release_sync(redis_sync *rs, const redis_scripts *scripts, const char *prefix,
                                  int worker, const char *token) QN_MUSTCHECK;
/* For a claim made elsewhere (the event loop's asynchronous client, with the same SET NX PX):
 * a fresh random token and a random first worker id to try. */
qn_status ids_claim_token(char token[IDS_TOKEN_LEN], int *first_worker) QN_MUSTCHECK;

/* The lease's compare-and-PEXPIRE is the lock's renewal script, lock_renew.lua (KEYS[1] key,
 * ARGV[1] token, ARGV[2] ttl ms; 1 if renewed, 0 if not ours), for the sync calls above and an
 * asynchronous renewal timer on the event loop. */

#endif
