/*
 * The Redis generation: is the Redis we talk to the one whose claim state (stocks, per-user
 * counters, reservations) was last rebuilt from the databases?
 *
 * Redis holds state, not only a cache: a template's stock and the users' counters live there
 * between the claim and the database write. A Redis server that restarted (empty, or from an
 * append-only file missing its last second) or failed over may have lost some of it, and
 * claims against it could then sell stock the database no longer has. So the engine that
 * finishes rebuilding that state writes RGEN_KEY = "<identity>:<ms>", the identity of the
 * servers it rebuilt. A service trusts its Redis only while that key names the current
 * identity, checked on every new connection and every interval: a restart or a failover
 * changes the identity and a loss may drop the key, so either way the generation is no longer
 * current until the next rebuild (services/engine/regen.h).
 *
 * The identity, computed the same way by the synchronous functions below and the checker on
 * the event loop:
 *   - one server: its run id (INFO server, "run_id:", 40 hex characters);
 *   - a Redis Cluster: the run ids of the masters (the nodes serving slots, from CLUSTER
 *     SLOTS), ordered by the first slot each serves, joined with "," (no spaces). Any master
 *     restarted (empty, or missing its last writes) or replaced by a promoted replica
 *     (replication is asynchronous: the promoted one may lack the last writes) changes it. A
 *     slot moving between masters does not, unless it is the first slot of one of them (then
 *     the order may change: a needless rebuild, never a missed one).
 * Run ids hold no ':', so "<identity>:<ms>" reads back unambiguously.
 */
#ifndef QUAN_RGEN_H
#define QUAN_RGEN_H

#include "keys.h"
#include "redis.h"
#include "redis_sync.h"
#include "status.h"

#define RGEN_KEY         KEYS_GEN
#define RGEN_MASTERS_MAX 64 /* masters of a cluster the identity can name */
/* An identity and its NUL: a run id is 40 hex characters, a cluster's are joined by ','. */
#define RGEN_RUN_MAX (RGEN_MASTERS_MAX * 41)

typedef struct rgen rgen;

/* Checks every interval_ms on base's loop through c (not owned). Owned; rgen_free. */
rgen *rgen_new(struct event_base *base, redis_client *c, int interval_ms) QN_MUSTCHECK;
void rgen_free(rgen *g);

/* 1 when the generation is current on the connection in use now. Loop thread. */
int rgen_ok(const rgen *g);
/* The same, as of the last check (without the connection test): any thread. */
int rgen_ok_any_thread(const rgen *g);

/* Synchronous helpers (threads, tools; rs borrowed). The identity of the servers now (the
 * cluster's slot map read afresh) into run (RGEN_RUN_MAX bytes). QN_ERR when a node does not
 * answer. */
qn_status rgen_sync_run_id(redis_sync *rs, char *run) QN_MUSTCHECK;
/* 1 when RGEN_KEY names the current identity, 0 when not, -1 on an I/O error. */
int rgen_sync_current(redis_sync *rs);
/* Writes RGEN_KEY for run, the identity the rebuild started on: its state is rebuilt. QN_ERR
 * when the servers are others by now (restarted or failed over during the rebuild). */
qn_status rgen_sync_mark(redis_sync *rs, const char *run) QN_MUSTCHECK;

#endif
