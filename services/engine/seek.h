/*
 * The seek of a claim whose home stock bucket is dry (bucket.h), on the loop's Redis client:
 * bucket_seek_sync's steps, each one script in one slot, each sent from the previous one's
 * answer, so the loop never waits.
 *
 * A round looks at the home (another claim's transfer may have filled it), then asks each
 * other bucket in turn to give half of what it holds (bucket_give.lua); the first that gives
 * ends it: the units are taken home (bucket_take.lua) and the donor's record settled
 * (bucket_settle.lua): BUCKET_HAS_STOCK. When none gives, a second look at every bucket,
 * begun after the first ended, decides (bucket_verdict); a transfer on its way older than a
 * transfer lives (a process that died between give and take) is finished on the way (take at
 * its recorded home, settle), and the round's verdict is then "in doubt". A verdict of stock
 * (stock came back under the looks) starts another round, a bounded number of times.
 *
 * The transfer ids are "<prefix>.<round>.<donor>": the caller makes prefix unique per seek.
 *
 * Loop thread only.
 */
#ifndef QUAN_SEEK_H
#define QUAN_SEEK_H

#include <stdint.h>

#include "bucket.h"
#include "redis.h"
#include "status.h"

/* Called once with the outcome: QN_OK and the verdict, or QN_ERR when a call failed (a
 * transfer cut short is finished by a later seek once older than a transfer lives). */
typedef void (*seek_cb)(qn_status st, bucket_verdict_t v, void *arg);

/* Starts the seek of bucket home among n of template tpl_id. done is called on a later loop turn,
 * never before this returns QN_OK; QN_EINVAL (a home out of 0..n-1, n out of 2..BUCKET_MAX) or
 * QN_ENOMEM, done never called, otherwise. prefix is copied (at most 118 characters used: make it
 * unique within them). */
qn_status seek_start(redis_client *c, int64_t tpl_id, int n, int home, const char *prefix,
                     seek_cb done, void *arg) QN_MUSTCHECK;

#endif
