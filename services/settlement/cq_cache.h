/*
 * The copies coupon-query keeps between requests: values by id (a user's coupon rows, a
 * template), each valid for the tracking epoch it was read under (common/rtrack.h), dropped
 * when the Redis key behind it changes, and at most max_entries of them (least recently used
 * go first).
 *
 * A value may be kept only if its key was not invalidated while it was being read: take a
 * ticket (cq_cache_ticket) before sending the read of the key, and hand it to cq_cache_put
 * with the value; an invalidation in between makes the put drop the value instead.
 *
 * Values are reference-counted by their owner: the cache calls release once when it lets one
 * go. Loop thread only.
 */
#ifndef QUAN_CQ_CACHE_H
#define QUAN_CQ_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct cq_cache cq_cache;
typedef void (*cq_cache_release_fn)(void *value);

/* Owned; free with cq_cache_free. NULL on allocation failure. */
cq_cache *cq_cache_new(size_t max_entries, cq_cache_release_fn release) QN_MUSTCHECK;
/* Releases every value. NULL is a no-op. */
void cq_cache_free(cq_cache *c);

/* The value kept for id under epoch and before its stale time, or NULL. Borrowed: take a
 * reference to keep it past the next call into the cache. */
void *cq_cache_get(cq_cache *c, int64_t id, uint64_t epoch, int64_t now_ms);
/* Taken before the key of id is read; 0 when nothing can be kept (no memory). */
uint64_t cq_cache_ticket(cq_cache *c, int64_t id);
/* Keeps value for id until stale_at_ms if nothing invalidated id since ticket and epoch is not
 * 0; the value is the cache's (one reference) either way: released at once when not kept. */
void cq_cache_put(cq_cache *c, int64_t id, uint64_t ticket, uint64_t epoch, int64_t stale_at_ms,
                  void *value);
/* The key of id changed. */
void cq_cache_invalidate(cq_cache *c, int64_t id);
/* Every key may have changed. */
void cq_cache_clear(cq_cache *c);
size_t cq_cache_count(const cq_cache *c);

#endif
