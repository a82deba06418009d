/*
 * A template's stock over its stock buckets (bucket.h), as shown and reconciled: the sum of the
 * buckets' stock plus the units on their way between two of them.
 *
 * A transfer X that left a donor ("xo:X" = "k:home:time", bucket_give.lua) is on its way until
 * its home took it ("xi:X", bucket_take.lua): counted from the donor's record only while the
 * home's hash, read after the donor's, has no "xi:X", so a transfer between the two reads is
 * counted once. Read from each bucket's HGETALL.
 */
#ifndef QUAN_BUCKETSUM_H
#define QUAN_BUCKETSUM_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* A transfer out of a bucket, on its way. */
typedef struct bucketsum_xo {
    char *id; /* X (owned) */
    int64_t units;
    int home;
} bucketsum_xo;

/* One bucket as its hash was read. Owns its arrays (bucketsum_clear). */
typedef struct bucketsum_bucket {
    int exists;    /* the hash is there */
    int has_stock; /* ... with its stock field (a closed one has none: reconcile.h) */
    int64_t stock;
    bucketsum_xo *xo;
    size_t nxo;
    char **xi; /* the transfers taken in (ids, owned) */
    size_t nxi;
} bucketsum_bucket;

/* Fills b (zeroed first) from an HGETALL reply. QN_EINVAL when it is not one, QN_ENOMEM. */
qn_status bucketsum_read(bucketsum_bucket *b, const redisReply *hgetall) QN_MUSTCHECK;
void bucketsum_clear(bucketsum_bucket *b);

/* Whether bucket b took transfer id. */
int bucketsum_took(const bucketsum_bucket *b, const char *id);

/* The units on their way out of the n buckets: records whose home (one of the n) did not
 * take them. */
int64_t bucketsum_on_way(const bucketsum_bucket *b, int n);

/* The stock of the n buckets: the stock of those that have a stock field, plus the units on
 * their way; -1 when none has one (the template is not cached). */
int64_t bucketsum_total(const bucketsum_bucket *b, int n);

#endif
