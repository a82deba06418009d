/*
 * Group commit on a PostgreSQL pool (pgpool.h).
 *
 * Items of one group (the caller's key: a template, a database) that arrive while the group has
 * inflight_max transactions in flight wait, and go together in its next transaction, at most
 * batch_max of them. With nothing in flight an item goes at once and alone, so the batches grow
 * with the load and cost no waiting without it. What the items share (a template's stock row,
 * a commit) is then written once per transaction instead of once per item.
 *
 *     submit(a)  -> work(conn, [a])                       nothing in flight: at once
 *     submit(b), submit(c)  (wait: a is in flight)
 *     a's work ends -> work(conn, [b, c]) is handed to the pool, then done([a])
 *
 * Items are the caller's pointers, borrowed until done runs for them. work runs on a pool
 * thread with a batch in arrival order and owns the transaction (begins and commits it); done
 * runs on the loop thread with work's status, after the group's next batch was handed to the
 * pool, so that the database is not idle while the answers go out. A later batch the pool
 * refuses goes to done with QN_EBUSY (or QN_ENOMEM) and work never runs for it; work returns
 * neither, so that done can tell a transaction that never ran.
 *
 * Loop thread only; work alone runs on the pool's threads. Groups exist only while they have
 * items waiting or in flight.
 */
#ifndef QUAN_PGBATCH_H
#define QUAN_PGBATCH_H

#include <stddef.h>
#include <stdint.h>

#include "pgpool.h"
#include "status.h"

/* On a pool thread: items[0..n), 1 <= n <= batch_max, one group's, in their order of arrival. */
typedef qn_status (*pgbatch_work_fn)(pgpool_conn *conn, void *const *items, size_t n, void *arg);
/* On the loop thread: the same items, with work's status or the pool's refusal. */
typedef void (*pgbatch_done_fn)(qn_status st, void *const *items, size_t n, void *arg);

typedef struct pgbatch_opts {
    size_t batch_max;    /* items per transaction */
    size_t wait_max;     /* items waiting per group; beyond, pgbatch_submit refuses at once */
    size_t inflight_max; /* transactions in flight per group */
    pgbatch_work_fn work;
    pgbatch_done_fn done;
    void *arg; /* passed to both; borrowed */
} pgbatch_opts;

typedef struct pgbatch pgbatch;

/* Owned by the caller; free with pgbatch_free. NULL on zero limits or when out of memory. */
pgbatch *pgbatch_new(const pgbatch_opts *opts) QN_MUSTCHECK;
/* Once nothing is waiting or in flight (the service drained). NULL is allowed. */
void pgbatch_free(pgbatch *b);

/*
 * Queues item for the next transaction of group key, run on pool (the pool its group's first
 * item named), or starts one at once when the group has fewer than inflight_max in flight.
 * QN_EBUSY when wait_max items wait in the group already or the pool refused the transaction,
 * QN_ENOMEM: then done will not run for item.
 */
qn_status pgbatch_submit(pgbatch *b, pgpool *pool, int64_t key, void *item) QN_MUSTCHECK;

#endif
