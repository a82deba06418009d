/*
 * Idempotent-consume guard, for consumer threads with their own blocking Redis client.
 * One key per message (e.g. "quan:guard:{remind}:<message key>"; the claim consumer's,
 * pipelined in services/engine/claimq.c, one per delivery, a pack's named by its content):
 *
 *   guard_begin   SET key "0" NX GET PX ttl   (consume_guard.lua, atomic)
 *       GUARD_RUN   nil: the key is ours ("0" = CONSUMING): run the business logic, then
 *                   guard_commit on success or guard_abort on failure
 *       GUARD_BUSY  "0": another consumer is at it: retry later and do NOT ack
 *       GUARD_DONE  "1": consumed already: ack and skip
 *       GUARD_ERROR Redis failed: treat as a failure (retry later, no ack)
 *   guard_commit  SET key "1" PX ttl          (CONSUMED)
 *   guard_abort   DEL key                     (give the key back so a redelivery can run)
 *
 * The guard is the fast path only: the DB unique key behind it is what makes a redelivery
 * after the TTL harmless.
 */
#ifndef QUAN_GUARD_H
#define QUAN_GUARD_H

#include <stdint.h>

#include "redis.h"
#include "redis_sync.h"
#include "status.h"

typedef enum { GUARD_RUN = 0, GUARD_BUSY, GUARD_DONE, GUARD_ERROR } guard_result;

/* rs and scripts are borrowed (scripts must hold consume_guard.lua). ttl_ms > 0. */
guard_result guard_begin(redis_sync *rs, const redis_scripts *scripts, const char *key,
                         int64_t ttl_ms) QN_MUSTCHECK;
qn_status guard_commit(redis_sync *rs, const char *key, int64_t ttl_ms) QN_MUSTCHECK;
qn_status guard_abort(redis_sync *rs, const char *key) QN_MUSTCHECK;
/* "run", "busy", "done", "error". */
const char *guard_result_str(guard_result r);

#endif
