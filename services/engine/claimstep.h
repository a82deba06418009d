/*
 * Every decision of a claim, without I/O: which step comes next, given the step that just
 * ended and what came of it, and what the user is told at the end. nginx runs a request through
 * its phase handlers and PgBouncer switches on a client's state; a claim is run the same way
 * (claimrun.h): a step starts one piece of I/O, its callback records the outcome and nothing
 * else, and claimstep_next decides. The table test (tests/test_claimstep.c) walks every step
 * against every outcome.
 *
 * Four kinds of claim share it:
 *   CLAIM_SYNC      POST /redeem: reserve in Redis, write the coupon, answer 200 with it
 *   CLAIM_MQ        POST /redeem-mq: reserve, publish with a confirm, answer 202
 *   CLAIM_EXCHANGE  POST /exchange: the code's lock and row, then reserve and write as /redeem
 *   CLAIM_DRAIN     the engine.redeem consumer (claimq.h) writing an accepted MQ claim or a
 *                   check in a batch: only its database outcome is decided here, into what its
 *                   batch does in Redis for it
 *
 * The steps of the HTTP kinds, in the order a claim meets them:
 *
 *   LOCK, CODE      exchange: the user's exchange lock, then the code's row (ds_0)
 *   CODE_OWN        exchange: the code is used by this user: is that redemption still open?
 *   TEMPLATE        exchange: the code's template (the query chain), for its validity
 *   TOUCH           the sweeper's index names the template (resv.h); claims wait while the
 *                   Redis claim state is rebuilt (regen.h)
 *   GATE            claim.lua at the user's home bucket (bucket.h): status, window, stock, the
 *                   per-user limit, the request's marker; routed by another number of buckets
 *                   than the template's, TOUCH and GATE again by that number (once)
 *   SEEK            the home bucket is dry (sold out, or in doubt) and there are others: stock
 *                   moved home from another bucket (then GATE again, a bounded number of
 *                   times), or the verdict over every bucket (bucket_verdict): sold out, final,
 *                   or in doubt
 *   LOAD            the template was not in Redis: the query chain loads it, GATE again
 *   RECORD          a repeated request id: is its reservation's record open, queued, gone?
 *   LOOKUP          a repeated /redeem: the coupon of that request id
 *   TAKEOVER        the first attempt of that request id is orphaned: give it up in the
 *                   database (claimdb_void)
 *   TAKE_BACK       ... and its reservation back in Redis (claim_undo.lua), then GATE again
 *   WRITE           the database: the stock and, in one database, the coupon (exchange: the
 *                   code, the stock and the coupon)
 *   COUPON          /redeem with two databases: the coupon, in the user's
 *   GIVE_BACK       the coupon was not written: the stock back in the template's database
 *   RESOLVE         a write whose outcome is unknown: the template's database gives the attempt
 *                   up unless it arrived (claimdb_void), which tells which
 *   PUBLISH         /redeem-mq: the pending marker and the publish, both answered
 *   UNDO            the reservation back in Redis (claim_undo.lua), then the error answered
 *   DOUBT           the outcome is not known: the reservation stays, this process settles it
 *                   once the database answers (resv_doubt), 503 now
 *   WALLET          the coupon into the wallet (ZADD), then the success answered
 *   REPLY           the answer the claim holds
 *   DONE            answered
 */
#ifndef QUAN_CLAIMSTEP_H
#define QUAN_CLAIMSTEP_H

#include <stdint.h>

#include "bucket.h"
#include "claimdb.h"
#include "claimgate.h"
#include "errcode.h"
#include "metrics.h"
#include "status.h"

typedef enum claim_kind { CLAIM_SYNC, CLAIM_MQ, CLAIM_EXCHANGE, CLAIM_DRAIN } claim_kind;

#define CLAIM_STEP_LIST(X)                                                                         \
    X(LOCK)                                                                                        \
    X(CODE)                                                                                        \
    X(CODE_OWN)                                                                                    \
    X(TEMPLATE)                                                                                    \
    X(TOUCH)                                                                                       \
    X(GATE)                                                                                        \
    X(SEEK)                                                                                        \
    X(LOAD)                                                                                        \
    X(RECORD)                                                                                      \
    X(LOOKUP)                                                                                      \
    X(TAKEOVER)                                                                                    \
    X(TAKE_BACK)                                                                                   \
    X(WRITE)                                                                                       \
    X(COUPON)                                                                                      \
    X(GIVE_BACK)                                                                                   \
    X(RESOLVE)                                                                                     \
    X(PUBLISH)                                                                                     \
    X(UNDO)                                                                                        \
    X(DOUBT)                                                                                       \
    X(WALLET)                                                                                      \
    X(REPLY)                                                                                       \
    X(DONE)

#define CLAIM_STEP_ENUM_(name) CLAIM_##name,
typedef enum claim_step { CLAIM_STEP_LIST(CLAIM_STEP_ENUM_) CLAIM_STEPS } claim_step;
#undef CLAIM_STEP_ENUM_

/* What a reservation's record says (RECORD, CODE_OWN). */
typedef enum claim_record {
    CLAIM_RECORD_GONE = 0, /* settled: no record */
    CLAIM_RECORD_OPEN,     /* not settled yet */
    CLAIM_RECORD_QUEUED,   /* an MQ claim the broker confirmed: the consumer settles it */
} claim_record;

/* What came of the step that just ran: its callback fills what its step has, nothing else. */
typedef struct claim_outcome {
    /* Every step: QN_OK; QN_EUNKNOWN (it may have happened: a COMMIT or a publish whose answer
     * was lost); QN_ENOTFOUND, QN_EBUSY (a lock or a load not had in time; a pool or queue
     * full), QN_EAGAIN (claims paused: TOUCH); any other failure (nothing happened). */
    qn_status st;
    claimgate_reply gate;     /* GATE: claim.lua's answer (st QN_EINVAL: unreadable) */
    claimdb_state db;         /* WRITE, COUPON, GIVE_BACK, RESOLVE, TAKEOVER: the item's state */
    claim_record record;      /* RECORD, CODE_OWN */
    int orphaned;             /* RECORD, LOOKUP: the earlier attempt is older than any request
                                 lives, so its process died or never learnt its outcome */
    int code_status;          /* CODE: the code row's status (0: no row) */
    int code_own;             /* CODE: its redeemer is this user */
    int code_used;            /* WRITE (exchange): the code was taken by another redemption first */
    int no_id;                /* WRITE, PUBLISH: no coupon id could be made (nothing was sent) */
    int queued;               /* PUBLISH: the publisher took the message */
    bucket_verdict_t verdict; /* SEEK: stock moved home, sold out (final), or in doubt */
} claim_outcome;

#define CLAIM_SEEKS_MAX 3 /* SEEKs of one claim: past them, stock moving under it is "in doubt" */

/* A claim's course: its kind, where it is, the facts the decisions need, and, once decided,
 * its answer and what it leaves to do. Plain data: claimstep_next reads and writes nothing
 * else. */
typedef struct claim_course {
    claim_kind kind;
    claim_step step;
    unsigned two_dbs : 1;       /* template and coupon live in different databases */
    unsigned reloaded : 1;      /* LOAD ran once already */
    unsigned took_over : 1;     /* TAKEOVER ran once already: this is a new attempt */
    unsigned local_miss : 1;    /* the engine's copy of the template was asked and could not answer
                                   (claim.c): a refusal from the script may fill it */
    unsigned local_zero : 1;    /* ... it showed no stock, not known final: a SOLD_OUT settles it */
    unsigned marked : 1;        /* /redeem-mq: the pending marker was set */
    unsigned check : 1;         /* DRAIN: the safety net of a synchronous claim, not a new claim */
    unsigned coupon_unused : 1; /* DRAIN: a coupon found already written is still unused */
    unsigned exchange : 1;      /* DRAIN: the check of an exchange redemption */
    unsigned bucketed : 1;      /* the template has more than one stock bucket: a dry home seeks
                                   (set by the runner before GATE's decision) */
    unsigned rerouted : 1;      /* GATE ran again by the template's number of buckets */
    unsigned seeks : 2;         /* SEEKs run (CLAIM_SEEKS_MAX) */
    /* What the claim does beside its answer (claimrun.c does it): */
    unsigned copy_settled : 1; /* the copy's zero stock is final (query_copy_settled) */
    unsigned copy_fill : 1;    /* fill the copy for the refusals to come (query_copy_fill) */
    unsigned end_record : 1;   /* the reservation is settled: its record ends (resv_done) */
    unsigned mark_queued : 1;  /* the broker has it: its record is marked queued (resv_queued) */
    unsigned unmark : 1;       /* the pending marker goes (DEL): no coupon will come of it, or it
                                  came */
    unsigned release_code : 1; /* DRAIN: the exchange code is usable again (claimdb_free_code) */
    unsigned item_set : 1;     /* the claim's item becomes item_to (claimdb_set): its coupon was
                                  not written after all, or was written with its stock */
    claimdb_state item_to;
    /* The answer (REPLY, UNDO, DOUBT, WALLET). */
    int ok;            /* a success: 200 with the coupon (202 for MQ) */
    errcode err;       /* else the error */
    const char *msg;   /* its message (static) */
    const char *label; /* the outcome counted (quan_claims_total, quan_exchange_total), NULL:
                          not counted */
} claim_course;

/* A claim of kind at its first step: TOUCH, or LOCK for an exchange, or WRITE for a drained
 * claim (whose database outcome comes next). */
void claimstep_begin(claim_course *c, claim_kind kind);

/* The step after c->step given what came of it: sets c->step (and the answer, and what is left
 * to do, when it ends the claim). Pure. */
void claimstep_next(claim_course *c, const claim_outcome *o);

/* The step's name ("GATE"), for logs and tests. */
const char *claimstep_name(claim_step s);

/* How a refusal of the claim gate is answered. */
typedef struct claim_refused {
    errcode err;         /* the answer's status and code (errcode.h) */
    const char *msg;     /* the envelope's message */
    const char *outcome; /* label of quan_claims_total and quan_exchange_total; NULL: not one of
                            the claims' outcomes (not counted there) */
} claim_refused;

/* The answer to a refusal of claim.lua: sold out and limit 409 B000100 / B000101, outside the
 * window 409 B000102, not active 409 B000103, another shop's template 404 A000404, in doubt 429
 * A000409. One mapping for every kind (an exchange answers another shop's template as an unknown
 * code). NULL for the results that are not refusals (OK, cache miss, repeated) and unknown
 * ones. The row is static. */
const claim_refused *claim_refusal(claimgate_result r);

/* The claims' outcomes, by the labels decided here (claim_course.label, claim_refused.outcome):
 * counted by the runner at the reply (claimrun.c), by claim.c for a claim refused before it runs,
 * by the consumer (claimq.c) for one refused in its batch. */
#define CLAIMSTEP_METRICS(X)                                                                       \
    X(quan_claims_total, COUNTER,                                                                  \
      "Coupon claims by outcome (success, sold_out, limit, window, ended, in_doubt: told to "      \
      "retry while other claims are not settled, error).",                                         \
      "outcome")                                                                                   \
    X(quan_exchange_total, COUNTER,                                                                \
      "Exchange-code redemptions by outcome (success, forged, not_found, used, busy, sold_out, "   \
      "limit, window, ended, in_doubt, error).",                                                   \
      "outcome")
METRICS_DECLARE(CLAIMSTEP_METRICS)

#endif
