/*
 * Running distribution tasks: the consumers of task.execute (queue distribution.task-execute).
 *
 * QUAN_DIST_WORKERS workers per replica, each a consumer of its own (prefetch 1: a message
 * waiting behind a long run stays in the queue for the other replicas) with its own
 * connections. A message runs its task to the end while the delivery stays unacked (the
 * consumer keeps the connection's heartbeats), so a process that dies has it redelivered:
 *
 *   guard      the consume guard of the message key (guard.h): consumed -> ack; held by a live
 *              consumer -> again later; held and redelivered (its holder died) -> go on.
 *   ownership  ONE conditional UPDATE of the task row: status 1 (in progress), not deleted,
 *              and no live lease -> execution_id = a new id of this run, lease_until = now +
 *              QUAN_DIST_LEASE_MS, chunk_rows fixed at the first run. A task not in progress is
 *              acked; a live lease held by another run comes back later (MQ_REQUEUE_LATER)
 *              until it runs out. A keeper thread renews the lease every third of it while the
 *              run goes on; a renewal that finds the task taken (or no longer in progress)
 *              stops the run. Every checkpoint is fenced by the execution id (chunk.h), so a
 *              run that lost its lease cannot commit.
 *   template   read from its shard: gone -> the task fails ("the coupon template does not
 *              exist"); ended before anything ran -> fails ("the coupon template has ended");
 *              ended later -> the remaining rows fail with "template ended". Its cache hash is
 *              written when absent (template_cache_put.lua), as the engine does.
 *   file       fileAddress through fetch.h (QUAN_FILE_* as merchant-admin), then taskrow.h; a
 *              file that cannot be read fails the task with the reason; a download that may
 *              succeed later (5xx, timeout) is retried, and fails the task at the last attempt.
 *              A resume passes over the rows of the committed chunks.
 *   chunks     two threads per run: the front reads chunk n+1 and makes its Redis reservation
 *              while the consumer's thread writes chunk n to the databases and commits it
 *              (chunk.h: the steps and why a crash at any of them is harmless). A step that
 *              fails is tried again (every step is idempotent) a few times, then the run
 *              stops, gives its lease up and the message comes back (MQ_RETRY).
 *   the end    after the last chunk committed: status 3 with completion_time and sendNum =
 *              the rows; a cancel asked while running (cancel_requested): at the next chunk
 *              boundary, after the chunk already reserved, status 4; a file or template
 *              failure: status 2 with fail_reason. Rows already issued stay issued and counted.
 *              The task's seen set is deleted; chunk records expire.
 *   SIGTERM    each run stops at its next chunk boundary, gives its lease up, and its message
 *              goes back to the queue at once (another replica, or this one restarted, resumes).
 *
 * Logs: a line when a run starts or resumes and when it ends, with the counts. Metrics:
 * quan_dist_* (metrics.h).
 */
#ifndef QUAN_TASKRUN_H
#define QUAN_TASKRUN_H

#include "dist.h"
#include "metrics.h"

/* A task run's rows, chunks, steps and ends, and the runs in progress. */
#define TASKRUN_METRICS(X)                                                                         \
    X(quan_dist_rows_read_total, COUNTER, "Spreadsheet data rows read by distribution runs.", "")  \
    X(quan_dist_rows_total, COUNTER,                                                               \
      "Distribution rows committed, by outcome (issued, invalid_user_id, duplicate_in_file, "      \
      "limit_reached, out_of_stock, template_ended).",                                             \
      "outcome")                                                                                   \
    X(quan_dist_chunk_duration_seconds, HISTOGRAM,                                                 \
      "Distribution chunk latency in seconds: its Redis step to its checkpoint.", "")              \
    X(quan_dist_step_duration_seconds, HISTOGRAM,                                                  \
      "Distribution time per chunk and step in seconds: read (the sheet), reserve (Redis), write " \
      "(the coupons, both databases), wallets (give-back and wallets), commit (the checkpoint).",  \
      "step")                                                                                      \
    X(quan_dist_tasks_total, COUNTER,                                                              \
      "Distribution tasks ended by this process, by final state (succeeded, failed, cancelled).",  \
      "state")                                                                                     \
    X(quan_dist_tasks_running, GAUGE, "Distribution task runs this process is executing now.", "") \
    X(quan_dist_progress_timestamp_seconds, GAUGE,                                                 \
      "When a task run of this process last started or committed a chunk, since the Unix epoch.",  \
      "")
METRICS_DECLARE(TASKRUN_METRICS)

#endif
