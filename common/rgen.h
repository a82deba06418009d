/*
 * The Redis generation: is the Redis we talk to the one whose claim state (stocks, per-user
 * counters, reservations) was last rebuilt from the databases?
 *
 * Redis holds state, not only a cache: a template's stock and the users' counters live there
 * between the claim and the database write. A Redis server that restarted (empty, or from an
 * append-only file missing its last second) or failed over may have lost some of it, and
 * claims against it could then sell stock the database no longer has. So the engine that
 * finishes rebuilding that state writes RGEN_KEY = "<run_id>:<ms>", the run id of the server
 * it rebuilt (INFO server). A service trusts its Redis only while that key names the current
 * server's run id, checked on every new connection and every interval: a restart changes the
 * run id and a loss may drop the key, so either way the generation is no longer current until
 * the next rebuild (services/engine/regen.h).
 */
#ifndef QUAN_RGEN_H
#define QUAN_RGEN_H

#include "redis.h"
#include "status.h"

#define RGEN_KEY     "quan:gen"
#define RGEN_RUN_MAX 1024 /* a run id is 40 hex characters; a cluster names every master */

typedef struct rgen rgen;

/* Checks every interval_ms on base's loop through c (not owned). Owned; rgen_free. */
rgen *rgen_new(struct event_base *base, redis_client *c, int interval_ms) QN_MUSTCHECK;
void rgen_free(rgen *g);

/* 1 when the generation is current on the connection in use now. Loop thread. */
int rgen_ok(const rgen *g);
/* The same, as of the last check (without the connection test): any thread. */
int rgen_ok_any_thread(const rgen *g);

/* Synchronous helpers (threads, tools). The server's run id into run (RGEN_RUN_MAX bytes). */
qn_status rgen_sync_run_id(redisContext *ctx, char *run) QN_MUSTCHECK;
/* 1 when RGEN_KEY names the server's current run id, 0 when not, -1 on an I/O error. */
int rgen_sync_current(redisContext *ctx);
/* Writes RGEN_KEY for run, the run id the rebuild started on: its state is rebuilt. QN_ERR
 * when the server is another one by now (restarted during the rebuild). */
qn_status rgen_sync_mark(redisContext *ctx, const char *run) QN_MUSTCHECK;

#endif
