/*
 * How a claim runs: one job per request, whose course (claimstep.h) says which step it is at.
 * claimrun_step starts that step's I/O; the I/O's callback records what came of it in the job's
 * outcome and calls claimrun_done, which asks claimstep_next for the next step, does what the
 * decision leaves to do (a copy of the template marked or filled, a reservation's record ended or
 * marked queued, the item's state), and runs that step. Nothing else decides.
 *
 * The runner does the steps the kinds share (TOUCH, GATE, LOAD and TEMPLATE, RECORD and CODE_OWN,
 * LOOKUP, TAKEOVER, TAKE_BACK, COUPON, GIVE_BACK, RESOLVE, UNDO, DOUBT, WALLET, REPLY); a job's
 * own hook does the others: /redeem's and /exchange's WRITE, /redeem-mq's PUBLISH (claim.c),
 * /exchange's LOCK and CODE (exchange.c).
 *
 * The claim gate (claim.lua) is called once per stock bucket of a template per loop turn for all
 * the claims that reach it in that turn, whatever their kind: requests arrive in bursts, and one
 * call holds Redis for less than one each. A claim runs at its user's home bucket (bucket.h)
 * among the template's buckets as this process knows them (claimrun_buckets); the gate's
 * CLAIMGATE_WRONG_BUCKETS teaches it the right number. A dry home seeks stock in the others
 * (SEEK, seek.h).
 *
 * Loop thread only.
 */
#ifndef QUAN_CLAIMRUN_H
#define QUAN_CLAIMRUN_H

#include <stdint.h>

#include "claimbatch.h"
#include "claimdb.h"
#include "claimgate.h"
#include "claimstep.h"
#include "keys.h"
#include "metrics.h"
#include "reqjob.h"
#include "resv.h"
#include "service.h"
#include "turnbatch.h"
#include "ucoupon.h"

#define CLAIM_REQUEST_ID_MAX  64
#define CLAIMRUN_BUCKET_SLOTS 1024 /* templates whose number of buckets a process remembers */

/* What the claims of a process share: the service's handles, the group commit of /redeem's
 * transactions, the gate's gathering. The claim module's state (claim.c); the exchange module
 * takes it from there. */
typedef struct claimrun {
    service *svc;
    const service_config *cfg;
    struct query *query;     /* the template query's (the chain, the engine's copies) */
    struct resv *resv;       /* the reservations' records and doubts */
    struct regen *regen;     /* whether claims may reserve now */
    struct restore *restore; /* the restore epoch a /redeem-mq claim is accepted under */
    redis_client *redis;     /* the service's */
    claimbatch *batch;       /* /redeem's transactions, shared (claimbatch.h) */
    turnbatch *evals;        /* the claims of a loop turn waiting for claim.lua, by template */
    metrics_handle
        gate_lookups[2];     /* the engine's copy asked before the gate (claim.c): miss, hit */
    int64_t wallet_check_ms; /* QUAN_CLAIM_WALLET_CHECK_MS: when a synchronous claim's or an
                                exchange's check is due after it */
    /* The templates' numbers of stock buckets the gate told (by template id modulo the slots:
     * one forgotten costs a CLAIMGATE_WRONG_BUCKETS answer, nothing else). */
    struct {
        int64_t tpl;
        int n;
    } buckets[CLAIMRUN_BUCKET_SLOTS];
    uint64_t seeks; /* seeks begun: their transfer ids */
} claimrun;

typedef struct claim_job claim_job;

/* A job's own steps (see above): starts the I/O of j's current step, whose callback ends in
 * claimrun_done. */
typedef void (*claim_own_fn)(claim_job *j);

/* One claim, from its request to its answer (reqjob.h: the runner answers and frees it). A kind
 * with more to carry embeds it as its first member, so the three are one address. */
struct claim_job {
    reqjob rj; /* first */
    claimrun *run;
    claim_own_fn own;
    claim_course course;
    claim_outcome out; /* the step that just ran */
    int64_t user, tpl, shop;
    int source;
    /* the claim's request id: the client's, one made up, or an exchange's "excode:<code>" */
    char request_id[UCOUPON_REQUEST_ID_MAX + 1];
    char k_tpl[KEYS_LEN];
    int bkt, nbkt;          /* the user's home bucket among the template's nbkt (bucket.h) */
    resv_keys rk;           /* the reservation's record (resv.h), in bucket bkt */
    int64_t now;            /* the reservation's time: when claim.lua was called */
    claimgate_reply gate;   /* claim.lua's last answer */
    int64_t tpl_hours;      /* TEMPLATE: the template's validity in hours */
    uint64_t local_serial;  /* the engine's copy that showed no stock, if any (claim.c) */
    claimdb_item item;      /* the coupon being written, or the attempt being asked about */
    claimbatch_claim batch; /* its group commit's (claimbatch.h), borrowed until done */
};

/* Owned by the caller (the claim module): free with claimrun_free after the service drained.
 * NULL when out of memory. */
claimrun *claimrun_new(service *s, int64_t wallet_check_ms) QN_MUSTCHECK;
void claimrun_free(claimrun *r);

/* A job of kind for req (size bytes: the kind's struct, claim_job its first member), its
 * course at the kind's first step; own runs its own steps. NULL (req answered 500) when out of
 * memory. */
void *claimrun_job_new(claimrun *r, http_req *req, size_t size, claim_kind kind, claim_own_fn own,
                       void (*clear)(reqjob *rj)) QN_MUSTCHECK;

/* Names the claim's keys once its user, template and request id are known: those of the user's
 * home bucket among the template's buckets (claimrun_buckets). */
void claimrun_job_keys(claim_job *j);

/* The number of stock buckets of template tpl as this process knows it: the gate's last word,
 * else the engine's copy of the template, else 1. */
int claimrun_buckets(claimrun *r, int64_t tpl_id);

/* Runs j's current step. */
void claimrun_step(claim_job *j);

/* The current step's outcome is in j->out: the next step, run. */
void claimrun_done(claim_job *j);

/* The claim gate's calls, one per template and loop turn, and the claims they took. */
#define CLAIMRUN_METRICS(X)                                                                        \
    X(quan_claim_gate_calls_total, COUNTER,                                                        \
      "claim.lua calls of /redeem, /redeem-mq and /exchange (the claims of one template in a "     \
      "loop turn go in one call).",                                                                \
      "")                                                                                          \
    X(quan_claim_gate_claims_total, COUNTER,                                                       \
      "Claims those calls took: divided by quan_claim_gate_calls_total, the claims per call.", "")
METRICS_DECLARE(CLAIMRUN_METRICS)

#endif
