/*
 * Values kept in the process by id, in front of Redis keys (a user's coupon rows behind the
 * wallet key, a template behind its hash): each valid for the tracking epoch it was read under
 * (common/redis/rtrack.h), dropped when the key behind it changes, and at most max_entries of them
 * (least recently used go first).
 *
 * A value may be kept only if its key was not invalidated while it was being read: take a
 * ticket (rcopy_ticket) before sending the read of the key, and hand it to rcopy_put with the
 * value; an invalidation in between makes the put drop the value instead.
 *
 * Values are reference-counted by their owner: the cache calls release once when it lets one
 * go. Loop thread only.
 */
#ifndef QUAN_RCOPY_H
#define QUAN_RCOPY_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"
#include "status.h"

typedef struct rcopy rcopy;
typedef void (*rcopy_release_fn)(void *value);

/* Owned; free with rcopy_free. NULL on allocation failure. */
rcopy *rcopy_new(size_t max_entries, rcopy_release_fn release) QN_MUSTCHECK;
/* Releases every value. NULL is a no-op. */
void rcopy_free(rcopy *c);

/* The value kept for id under epoch and before its stale time, or NULL. Borrowed: take a
 * reference to keep it past the next call into the cache. */
void *rcopy_get(rcopy *c, int64_t id, uint64_t epoch, int64_t now_ms);
/* Taken before the key of id is read; 0 when nothing can be kept (no memory). */
uint64_t rcopy_ticket(rcopy *c, int64_t id);
/* Keeps value for id until stale_at_ms if nothing invalidated id since ticket and epoch is not
 * 0; the value is the cache's (one reference) either way: released at once when not kept. */
void rcopy_put(rcopy *c, int64_t id, uint64_t ticket, uint64_t epoch, int64_t stale_at_ms,
               void *value);
/* The key of id changed. */
void rcopy_invalidate(rcopy *c, int64_t id);
/* Every key may have changed. */
void rcopy_clear(rcopy *c);
size_t rcopy_count(const rcopy *c);

/* Lookups of the values kept, counted by their users (what: the value kept, result: hit or miss),
 * who name this list in their modules' metrics. */
#define RCOPY_METRICS(X)                                                                           \
    X(quan_rcopy_lookups_total, COUNTER,                                                           \
      "Lookups of values kept in the process in front of Redis keys, by what (rows: a user's "     \
      "coupons, template: both coupon-query's; template_query: the engine's; claim_gate: the "     \
      "engine's refusals answered from its copy) and result (hit, miss).",                         \
      "what,result")
METRICS_DECLARE(RCOPY_METRICS)

#endif
