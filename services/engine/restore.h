/*
 * The restore epoch: were the databases restored from a backup since Redis, the queues and this
 * process's copies last agreed with them?
 *
 * Each database holds quan_restore (migrations/both/0014_restore_epoch.sql): epoch, bumped by
 * every restore (deploy/local/backup.sh, or `quan-recover --restored` after a restore made by
 * other means), and recovered_epoch, the epoch quan-recover last brought everything else back in
 * line with. While the two differ in either database, Redis may hold stock, counters, markers
 * and reservations of a future the databases no longer hold: claims (every kind, and the claim
 * consumer's batches) wait, answering 503 "try again", /readyz is 503, and the Redis rebuild
 * (regen.h) waits for quan-recover, which does more. Until the first read answers, the state is
 * unknown and treated as restored: an engine started on restored databases never serves a claim
 * before it has looked.
 *
 * When recovered_epoch changes, the template copies this process keeps are dropped (the Redis
 * flush quan-recover does tells the trackers too; this covers a copy whose key was not
 * tracked).
 */
#ifndef QUAN_RESTORE_H
#define QUAN_RESTORE_H

#include "metrics.h"
#include "service.h"

/* The module's context: made by its start hook, freed by its free hook; other modules reach it
 * with service_module_state(s, &restore_module). */
typedef struct restore restore;

/* 1 when the databases are known not to wait for quan-recover. Any thread. */
int restore_ok(const restore *r);
/* The restore epoch as last read (the sum of both databases' epochs; 0 before the first read
 * and on databases never restored): a /redeem-mq claim carries the one it was accepted under,
 * and the claim consumer dead-letters a claim of an earlier one (claimq.h). Any thread. */
int64_t restore_epoch(const restore *r);

extern const service_module restore_module;

#define RESTORE_METRICS(X)                                                                         \
    X(quan_restore_pending, GAUGE,                                                                 \
      "1 while the databases were restored and quan-recover has not run since (or the epoch "      \
      "was not read yet): claims wait (engine).",                                                  \
      "")
METRICS_DECLARE(RESTORE_METRICS)

#endif
