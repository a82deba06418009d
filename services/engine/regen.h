/*
 * The rebuild of the Redis claim state after Redis lost it (rgen.h says how a loss is noticed).
 *
 * While the generation is not current, claims and exchanges answer 503 "try again" and
 * /readyz is 503. One engine replica (a Redis lock) rebuilds, on a database worker:
 *   1. closes every template that can be claimed (valid, not ended) in Redis, so that
 *      neither an engine nor distribution reserves on it (reconcile.h);
 *   2. waits for the claims that were in flight when Redis went: QUAN_REGEN_SETTLE_MS (at
 *      least the request timeout: synchronous claims end by then), then until the claim queue
 *      and its retry queue are empty twice in a row (the consumers wrote everything accepted),
 *      at most QUAN_REGEN_DRAIN_MAX_MS;
 *   3. rebuilds each template's stock and counters from the databases (reconcile_run, dead:
 *      reservations that survived and never reached the database are given up there first);
 *   4. marks the generation current (rgen_sync_mark), which reopens claims everywhere.
 * The lock is renewed between the steps; a rebuilder whose hold is gone (expired, lost) stops
 * there, and an attempt that fails says at which step and starts again on the next tick.
 * The wallet list and reminders are read from the databases, so they are right at once.
 */
#ifndef QUAN_REGEN_H
#define QUAN_REGEN_H

#include "metrics.h"
#include "service.h"

/* The module's context: made by its start hook, freed by its free hook; other modules reach it
 * with service_module_state(s, &regen_module). */
typedef struct regen regen;

/* 1 when claims may reserve in Redis now: the generation is current and no database restore
 * waits for quan-recover (restore.h). Loop thread. */
int regen_ok(const regen *g);

extern const service_module regen_module;

/* Whether claims wait for a rebuild. */
#define REGEN_METRICS(X)                                                                           \
    X(quan_redis_rebuild_in_progress, GAUGE,                                                       \
      "1 while the Redis claim state is not current and claims wait for its rebuild (engine).",    \
      "")
METRICS_DECLARE(REGEN_METRICS)

#endif
