/*
 * Dead coupons leave the hot tables. A coupon used, expired or revoked more than
 * QUAN_ARCHIVE_AFTER_DAYS ago (by its last change, update_time) moves, with its history, from
 * t_user_coupon_N and t_user_coupon_log_N to t_user_coupon_archive_N and
 * t_user_coupon_log_archive_N of the same database (migrations/both/0015_coupon_archive.sql).
 *
 * A batch is ONE statement in ONE transaction on one shard: at most `batch` candidates in
 * (update_time, id) order after the pass's cursor, the movable ones deleted (their log rows
 * with them) and inserted into the archive by data-modifying CTEs; statement and lock timeouts
 * bound it (SET LOCAL). A crash anywhere loses or doubles nothing: the transaction commits or
 * not, and the archive's primary key would refuse a second copy. Replicas running at once
 * delete the same row at most once (the second waits, then finds it gone).
 *
 * What never moves:
 *   - an unused or locked coupon (status < 2), whatever its age;
 *   - a coupon of a template that can still be claimed (status active, before its end). The
 *     per-user limit rests on the user's rows of the template: the unique key
 *     (user_id, coupon_template_id, receive_count) and the counters the Redis rebuild and
 *     quan-reconcile count from the hot table. An ended template takes no claim again, so its
 *     coupons may go. The list of claimable templates is read at the start of each pass; a
 *     template ended then stays ended, and one created later has no coupon old enough.
 * Nothing fires on DELETE, so a move writes no history row and no statistics delta: the
 * statistics are the deltas, which do not depend on where the rows are.
 *
 * A restore moves a coupon (or every archived coupon of a user) back in one transaction, with
 * quan.archive_restore set so that the issue trigger counts nothing, and update_time now: the
 * restored coupon stays for another retention period.
 *
 * The functions are blocking (libpq): pool work functions, threads and tools. pg[ds] are
 * connections to ds_0 and ds_1.
 */
#ifndef QUAN_ARCHIVE_H
#define QUAN_ARCHIVE_H

#include <stdint.h>

#include "metrics.h"
#include "pgpool.h"
#include "service.h"
#include "status.h"

#define ARCHIVE_TIME_LEN 48 /* a timestamptz as text */

typedef struct archive_opts {
    int64_t after_days;   /* dead for longer than this (> 0) */
    int64_t batch;        /* candidates a batch looks at (and at most moves) */
    int64_t statement_ms; /* statement_timeout and lock_timeout of a batch */
} archive_opts;

/* Where a pass is: the shard it is on and the last candidate looked at there. Zeroed: the
 * start of a pass. */
typedef struct archive_cursor {
    int idx; /* t_user_coupon index */
    char time[ARCHIVE_TIME_LEN];
    int64_t id;
} archive_cursor;

typedef struct archive_totals {
    int64_t coupons, logs, batches;
    double max_batch_s, sum_batch_s;
} archive_totals;

/* Called after every committed batch, with its time in seconds. */
typedef void (*archive_batch_fn)(double seconds, void *arg);

/* The templates that can still be claimed (status active, valid_end_time in the future) from
 * every template table: *keep gets their ids. */
qn_status archive_keep_list(pgpool_conn *pg[2], pgparam_array *keep) QN_MUSTCHECK;

/* Runs batches from *cur on, shard after shard, until every shard is done (*done 1, *cur
 * zeroed) or budget_ms passed (budget_ms <= 0: no limit), adding to *t. keep is what
 * archive_keep_list read at the start of the pass. On an error *cur stays at the failed batch. */
qn_status archive_pass(pgpool_conn *pg[2], const archive_opts *o, const char *keep,
                       archive_cursor *cur, int64_t budget_ms, archive_batch_fn on_batch, void *arg,
                       archive_totals *t, int *done) QN_MUSTCHECK;

/* Moves the archived coupon id (any user, either database) back with its history. *coupons
 * and *logs get what moved; QN_ENOTFOUND when no archive table holds it; QN_ECONFLICT when the
 * hot table has a coupon in its way (nothing moved). */
qn_status archive_restore_coupon(pgpool_conn *pg[2], int64_t id, int64_t *coupons,
                                 int64_t *logs) QN_MUSTCHECK;
/* Every archived coupon of user_id back, as archive_restore_coupon (QN_ENOTFOUND: none). */
qn_status archive_restore_user(pgpool_conn *pg[2], int64_t user_id, int64_t *coupons,
                               int64_t *logs) QN_MUSTCHECK;

/* The archiver in the engine: every QUAN_ARCHIVE_INTERVAL_MS one job on a ds_0 pool worker
 * (with a ds_1 connection borrowed) runs a pass for at most ARCHIVE_JOB_BUDGET_MS and goes on
 * from there at the next tick. */
extern const service_module archive_module;

#define ARCHIVE_METRICS(X)                                                                         \
    X(quan_archive_coupons_total, COUNTER,                                                         \
      "Dead user coupons moved to the archive tables (with their history rows).", "")              \
    X(quan_archive_batch_duration_seconds, HISTOGRAM,                                              \
      "Time of one archive batch in seconds (one statement, one transaction).", "")                \
    X(quan_archive_failures_total, COUNTER,                                                        \
      "Archive passes stopped by an error (retried at the next tick).", "")
METRICS_DECLARE(ARCHIVE_METRICS)

#endif
