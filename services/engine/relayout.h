/*
 * A change of a live template's stock buckets (bucket.h) from N to M: the Redis state laid out
 * on N is rebuilt on M from the databases, once nothing claimed on N is in flight.
 *
 * Merchant-admin's change writes, in one transaction on the template row, stock_buckets = M
 * and buckets_relayout_from = N (the change under way), and to Redis only the stock an
 * increase-number adds with it, to bucket 0 while that still says N. From then on
 * the template's Redis state is this module's: the engine's and distribution's only-if-absent
 * cache writes write nothing (bucket.h), increase-number is refused, and distribution does not
 * start a task. One engine replica at a time (a Redis lock with expiry, renewed between steps)
 * finds the changes under way in the databases and, per template:
 *   1. closes every bucket of N and of M (no stock field: claims answer "not cached", 503, try
 *      again; a missing one is created closed, so no cache write fills it);
 *   2. waits until every reservation set of those buckets is empty: the synchronous claims end
 *      within the request timeout, the queued ones when the claim consumer wrote them, those of
 *      a dead process when the sweeper settled them; each carries its (bucket, N) and finds its
 *      keys, which stay until here;
 *   3. reads the row again (its stock now counts every claim) and each user's coupons of the
 *      template, and every bucket's users hash and transfer records;
 *   4. ends the transfers on their way (marked taken at their home, settled at their donor, as
 *      reconcile does: their units are in the row's stock), writes each user's counter and
 *      claim markers at the user's home among M (and removes them where they no longer
 *      belong), deletes the buckets of N that are not buckets of M, writes every bucket of M
 *      its share of the row's stock, the template's own hash last;
 *   5. clears buckets_relayout_from under the row's lock (ending the template's buckets again
 *      when it was terminated meanwhile).
 * Every step is computed from the databases and from the keys of both layouts, so a replica
 * killed at any step leaves the change under way and closed, and the next attempt (this
 * replica's next tick, or another's once the lock expired) does it all again and finishes it.
 * A wait longer than QUAN_RELAYOUT_WAIT_MAX_MS gives the turn to the next template and tries
 * again on a later tick, the buckets still closed.
 *
 * Blocking (redis_sync, libpq): the module runs it on a database worker.
 */
#ifndef QUAN_RELAYOUT_H
#define QUAN_RELAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "pgpool.h"
#include "redis_scripts.h"
#include "redis_sync.h"
#include "service.h"
#include "status.h"

/* One change under way, as the template row says. */
typedef struct relayout_tpl {
    int64_t id, shop;
    int from, to; /* buckets_relayout_from, stock_buckets */
} relayout_tpl;

/* The changes under way in every template table: *out (malloc'ed, the caller frees). */
qn_status relayout_list(pgpool_conn *pg[2], relayout_tpl **out, size_t *n) QN_MUSTCHECK;

/* 1 while the caller may go on (its hold on the work is still there). */
typedef int (*relayout_hold_fn)(void *arg);

/* Steps 1 to 5 for t; pg[ds] are connections to both databases. hold is asked between the
 * steps and while waiting: 0 stops the run (QN_ERR). QN_EAGAIN when the reservations did not
 * empty within wait_max_ms; QN_OK when the change is over (also when another run ended it). */
qn_status relayout_run(redis_sync *rs, const redis_scripts *s, pgpool_conn *pg[2],
                       const relayout_tpl *t, int64_t wait_max_ms, relayout_hold_fn hold,
                       void *arg) QN_MUSTCHECK;

/* The module's context (made by its start hook, freed by its free hook). */
typedef struct relayout relayout;

extern const service_module relayout_module;

/* Changes of stock buckets waiting for their re-layout. */
#define RELAYOUT_METRICS(X)                                                                        \
    X(quan_relayout_pending, GAUGE,                                                                \
      "Templates whose change of stock buckets waits for its Redis re-layout (engine, as last "    \
      "seen by this replica).",                                                                    \
      "")                                                                                          \
    X(quan_relayouts_total, COUNTER,                                                               \
      "Re-layouts of a template's stock buckets by this replica, by result (done, waiting, "       \
      "failed).",                                                                                  \
      "result")
METRICS_DECLARE(RELAYOUT_METRICS)

#endif
