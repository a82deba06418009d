/*
 * Copies of Redis keys kept in the process, told when the keys change: Redis' server-assisted
 * client-side caching (CLIENT TRACKING in its RESP2 redirect mode).
 *
 * rtrack opens a connection of its own to each server the reader (a redis_client of the
 * caller's) reads from, SUBSCRIBEs it to __redis__:invalidate and turns tracking on for the
 * reader's connection to that server with REDIRECT to it (tracking is per server: in a Redis
 * Cluster, one such pair per master). Redis then remembers every key the reader reads, and the
 * first change to such a key afterwards (a write by anyone, an expiry, an eviction) is sent
 * here once: the callback gets the key. A key read again is remembered again.
 *
 * The rule for a copy: take the epoch (rtrack_epoch; 0 means tracking is not on, keep nothing)
 * before sending the read on the reader, and keep what the read gave only if, when it arrives,
 * the epoch is still the same and no invalidation of the key came in between. The epoch moves,
 * and the callback is called with key NULL (drop every copy), whenever a change may have gone
 * unheard: one of rtrack's connections was lost, the reader lost or changed a connection
 * (Redis forgets a connection's tracking with it), Redis flushed its data, or (cluster) the
 * slot map changed: a promoted replica or a slot's new master never saw the reads.
 *
 * When the state behind a key lives elsewhere too (a database row), a writer that changes it
 * and then writes the key makes every copy taken before the write invalid, provided the copy's
 * key was read before the other state was. That is how settlement keeps users' coupon rows.
 *
 * Loop thread only. Connection loss is seen from the socket (TCP keepalive on).
 */
#ifndef QUAN_RTRACK_H
#define QUAN_RTRACK_H

#include <stddef.h>
#include <stdint.h>

#include <event2/event.h>

#include "redis.h"
#include "status.h"

typedef struct rtrack rtrack;

/* key: the changed key (not NUL-terminated: len bytes), or NULL for "everything". */
typedef void (*rtrack_invalidate_cb)(const char *key, size_t len, void *arg);

typedef struct rtrack_opts {
    const char *password; /* NULL or "" -> no AUTH; copied (the servers are the reader's) */
    redis_client *reader; /* borrowed: its reads are the tracked ones */
    rtrack_invalidate_cb cb;
    void *arg;
} rtrack_opts;

/* Owned; free with rtrack_free. Starts connecting at once. NULL on allocation failure. */
rtrack *rtrack_new(struct event_base *base, const rtrack_opts *opts) QN_MUSTCHECK;
/* Calls nothing back. NULL is a no-op. */
void rtrack_free(rtrack *t);

/* The current epoch, 0 while tracking is not on (for every master). First applies the
 * invalidations that have arrived (a read of each of rtrack's sockets), so that a writer who
 * got its write's reply and then asks is answered with its write seen; and looks at the
 * reader's connections (a lost or new one ends the epoch, and tracking is turned on for the
 * new one). */
uint64_t rtrack_epoch(rtrack *t);

/* The id of key (len bytes, as the callback gets it) when it is exactly prefix "{<id>}" with
 * a positive decimal id: 1 and *id set, else 0. */
int rtrack_key_id(const char *key, size_t len, const char *prefix, int64_t *id);

#endif
