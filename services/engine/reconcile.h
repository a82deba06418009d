/*
 * Redis claim state against the databases, per template: the stock in the template hash and
 * every user's claim counter, compared with what the databases say they must be, and rebuilt
 * from them when asked.
 *
 *   want stock    = the template row's stock - the claims in flight
 *   want counter  = the user's coupons of the template (both databases) + their claims in flight
 *
 * A claim is in flight while its reservation is open (keys_template_resv) and its stock is not
 * in the template's database yet (no ledger row taking it). With `dead`, nothing is in flight
 * any more (the rebuild after a Redis loss waited for every claim to end): an open reservation
 * that did not reach the database is given up there (claimdb_void), so no late writer can take
 * stock after the rebuild read it.
 *
 * Repairing a template first closes it to claims (the hash loses its stock field: claim.lua and
 * dist_chunk.lua see a partial hash and answer "not cached", which the engine answers 503, try
 * again), then writes the counters, then the whole hash again, which opens it.
 *
 * A template of N stock buckets (bucket.h) is all of them: each closed, its reservation set
 * read, each user's counter at the user's home bucket, the stock in Redis the sum over the
 * buckets plus the units on their way (bucketsum.h), and the repair writes every bucket its
 * share of want stock, the template's own hash last.
 *
 * Blocking (redis_sync, libpq): threads and tools only. On a Redis Cluster every key of one
 * template is in its slot; the counters are the count fields of its users hash (keys.h).
 */
#ifndef QUAN_RECONCILE_H
#define QUAN_RECONCILE_H

#include <stddef.h>
#include <stdint.h>

#include "pgpool.h"
#include "redis.h"
#include "redis_sync.h"
#include "status.h"

typedef struct reconcile_tpl {
    int64_t id, shop; /* in */
    /* out */
    int found;                /* the template row exists */
    int buckets;              /* its stock buckets (bucket.h; reconcile_list_active too) */
    long long redis_stock;    /* -1: no stock in Redis */
    long long db_stock;       /* the row's */
    long long inflight;       /* open reservations not in the database */
    long long want_stock;     /* db_stock - inflight */
    long long counters;       /* users with coupons, claims in flight or a counter */
    long long counters_wrong; /* whose counter is not what it must be */
    long long voided;         /* (dead) open reservations given up */
    int repaired;             /* apply: written */
} reconcile_tpl;

typedef struct reconcile_opts {
    int apply; /* write what differs (else only compare) */
    int dead;  /* no claim is in flight any more (after a Redis loss and the settle) */
} reconcile_opts;

/* Compares (and with apply repairs) the n templates; pg[ds] are connections to both databases.
 * QN_ERR on a Redis or database error (what was repaired stays repaired; the rest is untouched
 * or still closed, and a second run finishes it). */
qn_status reconcile_run(redis_sync *rs, const redis_scripts *scripts, pgpool_conn *pg[2],
                        reconcile_tpl *t, size_t n, const reconcile_opts *o) QN_MUSTCHECK;

/* The templates that can be claimed now (status 0, not ended), from every template table:
 * *out (malloc'ed, the caller frees) with id and shop set. */
qn_status reconcile_list_active(pgpool_conn *pg[2], reconcile_tpl **out, size_t *n) QN_MUSTCHECK;
/* The shop of template id (QN_ENOTFOUND when no table has it). */
qn_status reconcile_find(pgpool_conn *pg[2], int64_t id, int64_t *shop) QN_MUSTCHECK;

/* 1 when t differs from what the databases say. */
int reconcile_differs(const reconcile_tpl *t);

#endif
