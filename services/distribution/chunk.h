/*
 * One chunk of a distribution task (QUAN_DIST_CHUNK_ROWS data rows, in sheet order) through
 * Redis and the two databases. Every row ends in exactly one outcome: a coupon, or a failure
 * with its cause. The steps, in this order, each idempotent, so that a chunk run again after a
 * crash at any point (or by a second run at the same time) ends the same, without a row issued
 * twice or stock or counters off by one:
 *
 *   1. chunk_reserve   ONE dist_chunk.lua call for the chunk: duplicates in the file, per-user
 *                      limit (the claims' counter), stock; reserves what passes and stores the
 *                      outcomes under the chunk's record. Again: the stored outcomes, nothing
 *                      reserved twice.
 *   2. chunk_write     per database of the users (both at once, one transaction each): the
 *                      chunk's coupons (ONE multi-row INSERT ... ON CONFLICT DO NOTHING, request
 *                      id "dist/<task>:<row>") and the marker (task, chunk, 'coupons') in the
 *                      same transaction; a database whose marker exists was written before: its
 *                      coupons are read back by request id instead. Then the template's
 *                      database: the stock taken by the number of coupons that exist, once (the
 *                      marker (task, chunk, 'stock') in the same transaction).
 *   3. chunk_settle    Redis: what was reserved but not written (a coupon row a unique key
 *                      refused: the user already holds that receive count) is given back, once
 *                      per chunk (dist_chunk_undo.lua); the issued coupons go into the wallets
 *                      (pipelined ZADD, idempotent; not a coupon since used or expired).
 *   4. chunk_commit    ds_0, ONE transaction fenced by the run's execution id: the task's
 *                      counters and processed_rows (its resume point), the checkpoint row
 *                      (unique per task and chunk), the failure rows, and the task.notify event
 *                      of the issued users (outbox). A run that lost its lease commits nothing.
 *                      Again after a COMMIT whose answer was lost: the fence finds the resume
 *                      point moved on, and the checkpoint row under this run's execution id
 *                      says it committed (the run goes on; without the row, the task is lost).
 *   5. chunk_close     the record keeps only "committed" (a late second run learns it has
 *                      nothing to do), until it expires.
 *
 * Where a crash leaves things: before 1 commits (Redis scripts are atomic) nothing; after 1, 2
 * finds the outcomes again; after one database of 2, the other is written and the first read
 * back; after 2, the stock marker says whether the stock was taken; after 3, the give-back flag
 * and ZADD make 3 harmless again; after 4 the task resumes after this chunk. Order matters:
 * coupons before stock (the stock is taken for rows that exist, counted after the fact), the
 * give-back before the checkpoint (a resume after the checkpoint never sees this chunk again).
 *
 * Stock buckets (bucket.h): a template of N > 1 buckets has step 1 split by the users' home
 * buckets, one dist_chunk.lua call per bucket on the bucket's keys, with a record and a seen
 * set of the bucket's own in its slot (chunk_keys; bucket 0's are the template's, so N = 1 is
 * the one call it always was). The rows a bucket found out of stock do not fail while other
 * buckets hold stock: bucket_seek_sync moves stock home and the rows run again ("again") on a
 * record of their own, pass after pass, until none is out of stock or bucket_verdict says sold
 * out, which the next pass's record says ("out": -6, for good). Each pass's record is written
 * once (the script), so a chunk run again after a crash, or by a second run at once, replays
 * the same passes, whatever the buckets hold by then. The give-back of step 3 is one call per
 * bucket (once per bucket: its first record's flag); step 5 closes every record.
 *
 * Blocking (redis_sync, libpq): a run's threads only (taskrun.c). On a Redis Cluster steps 1, 3
 * (the give-back) and 5 run in the buckets' slots; the wallets of step 3 go to their users'
 * nodes in one pipeline.
 */
#ifndef QUAN_CHUNK_H
#define QUAN_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "bucket.h"
#include "ids.h"
#include "pgpool.h"
#include "redis.h"
#include "redis_sync.h"
#include "status.h"
#include "taskrow.h"
#include "ucoupon.h"

#define CHUNK_STATE_TTL_MS (3LL * 24 * 3600 * 1000) /* chunk records and the task's seen set */
/* A coupon's request id: this, the task, ":", the row. '/' is not allowed in the request ids
 * clients give claims (api.md), so no claim can take a row's id. */
#define CHUNK_REQUEST_PREFIX "dist/"

/* A row's outcome: >= 1 issued (the user's receive count), else one of these. The first four
 * are dist_chunk.lua's. */
enum {
    CHUNK_DUPLICATE = -1, /* "duplicate in file" */
    CHUNK_LIMIT = -2,     /* "limit reached" (also: a coupon row refused by the database) */
    CHUNK_NO_STOCK = -3,  /* "out of stock" */
    CHUNK_ENDED = -4,     /* "template ended" */
    CHUNK_INVALID = -5,   /* "invalid user id" */
    CHUNK_SOLD_OUT = -6,  /* dist_chunk.lua's mode "out": out of stock for good; read as
                           * CHUNK_NO_STOCK */
};
/* Passes of one bucket's rows within a chunk before step 1 gives up for now (QN_EBUSY: stock
 * moving back and forth under it; the chunk is tried again, its passes replayed). */
#define CHUNK_PASSES_MAX 200

/* What chunk_reserve found (dist_chunk.lua's first element). */
typedef enum {
    CHUNK_RESERVED = 0, /* reserved now */
    CHUNK_REPLAYED = 1, /* reserved before: the same outcomes */
    CHUNK_NONE = 2,     /* peek: never reserved, nothing done */
    CHUNK_MISS = 3,     /* the template is not in Redis: load it, call again */
    CHUNK_CLOSED = 4,   /* committed before: nothing to do */
} chunk_reply;

/* What a chunk needs of its task; read-only during a run, borrowed strings. */
typedef struct chunk_task {
    int64_t id, batch_id, shop, tpl_id;
    int tpl_ds;             /* database of the template's shard */
    int source;             /* of the coupons: ucoupon.h's (2 shop, 1 platform) */
    int limit;              /* limitPerPerson */
    int buckets;            /* stockBuckets (bucket.h), fixed at the template's creation; <= 1:
                             * one bucket, the template's own keys */
    int64_t validity_hours; /* a coupon is valid this long from its issue */
    const char *exec_id;    /* the run's execution id (the checkpoint's fence) */
    const char *notify;     /* notify_type ("0,2"); "" when none */
    int64_t lease_ms;       /* each checkpoint renews the lease by this */
    ids_gen *ids;           /* coupon ids */
} chunk_task;

/* One chunk, reused from chunk to chunk (its memory is that of the largest). */
typedef struct chunk {
    int64_t no;         /* chunk number (from 0) */
    int64_t first;      /* data rows before it */
    taskrow_chunk rows; /* its rows, filled by taskrow_read */
    int *outcome;       /* per row */
    ucoupon *coupons;   /* per row where outcome >= 1: the coupon (as stored, once written) */
    char *issued;       /* per row: its coupon exists */
    size_t cap;
    size_t nissued, nrefused; /* after chunk_write */
    double t0;                /* monotonic seconds when its Redis step began */
    double t_reserve;         /* seconds in step 1 (the debug line of a chunk) */
    double t_write;           /* seconds in step 2 */
    /* step 1's split (chunk_split): the rows with a user id, by home bucket, in sheet order
     * within one: those of bucket b are order[start[b] .. start[b + 1]) */
    size_t *order;
    size_t order_cap;
    size_t start[BUCKET_MAX + 1];
    int nbuckets;
    int passes[BUCKET_MAX]; /* per bucket: its records (passes) step 1 reached */
} chunk;

void chunk_free(chunk *c);

/* Splits c's rows with a user id by home bucket among n (bucket_home; n <= 1: one, in sheet
 * order) into c->order and c->start. QN_ENOMEM. */
qn_status chunk_split(chunk *c, int n) QN_MUSTCHECK;
/* The record of bucket b's pass p of chunk no, and the task's seen set in that bucket, each in
 * the bucket's slot (KEYS_LEN each; seen may be NULL). Bucket 0's pass 0 is keys_task_chunk. */
void chunk_keys(const chunk_task *t, int64_t no, int b, int p, char *rec, char *seen);

/* Step 1 for c's rows (invalid user ids are CHUNK_INVALID without a Redis call), in mode "run"
 * or, with peek, only a replay. *reply says what happened; outcomes are set for RESERVED and
 * REPLAYED. QN_EINVAL when a replay does not fit the rows (the file changed), QN_ERR on a Redis
 * failure (redis_sync_errstr tells; the client connects again by itself), QN_EBUSY when a dry
 * bucket's verdict stayed "in doubt" (or its passes ran out): call again. With peek, a chunk
 * whose first bucket was reserved is finished (the buckets not reserved yet are, now): begun,
 * it is written. On CHUNK_MISS the rows decided so far keep their outcomes, the others are 0. */
qn_status chunk_reserve(redis_sync *rs, const redis_scripts *sc, const chunk_task *t, chunk *c,
                        int peek, chunk_reply *reply) QN_MUSTCHECK;
/* The outcomes dist_chunk.lua answered ("o1,o2,...", one per row with a user id, in order) into
 * c's outcomes, which chunk_reserve set to 0 for those rows (the others keep theirs). QN_EINVAL
 * when they do not fit these rows (another count, a 0, anything but integers): the replay of
 * another cut of rows, the file having changed. */
qn_status chunk_outcomes_read(chunk *c, const char *text) QN_MUSTCHECK;
/* Every row of c that step 1 left undecided (0: its bucket's hash was gone) fails with
 * "template ended" (its end passed while the cache was gone); one without a user id is an
 * invalid one. */
void chunk_all_ended(chunk *c);

/* Step 2 on pg[0] and pg[1] (the worker's own connections). QN_ERR on a database failure (the
 * transactions are rolled back; the step can be run again). */
qn_status chunk_write(pgpool_conn *pg[2], const chunk_task *t, chunk *c) QN_MUSTCHECK;
/* Step 3. QN_ERR on a Redis failure. */
qn_status chunk_settle(redis_sync *rs, const redis_scripts *sc, const chunk_task *t,
                       const chunk *c) QN_MUSTCHECK;
/* Step 4 on pg0 (ds_0). QN_OK with *cancel = the task's cancel_requested, also when this run's
 * checkpoint of c had committed before (a retry after a lost answer); QN_ECONFLICT when this run
 * does not own the task any more (nothing committed); QN_ERR (nothing committed, or not known:
 * run it again). */
qn_status chunk_commit(pgpool_conn *pg0, const chunk_task *t, const chunk *c,
                       int *cancel) QN_MUSTCHECK;
/* Step 5; best effort (the record expires anyway). */
void chunk_close(redis_sync *rs, const chunk_task *t, const chunk *c);

/* The cause of a failed outcome, as the failure report writes it; NULL for an issued one. */
const char *chunk_cause(int outcome);

#endif
