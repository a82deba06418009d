/*
 * Reservations (claim.lua's) until they are settled, and who settles the ones in doubt.
 *
 * A claim reserves in Redis first (stock - 1, the user's count + 1, its marker) and writes the
 * database after. claim.lua also records the reservation in the template's slot
 * (keys_template_resv: member "<userId>:<requestId>", score = its time; the claim's marker in
 * the users hash names its owner, the engine process that made it, and the user's list of
 * open request ids gets this one); whoever settles it (the coupon's commit, the consumer of an
 * MQ claim, a give-back) ends the record (resv_done and the consumer: a ZREM; claim_undo.lua).
 * While a record is open the claim is IN DOUBT: claim.lua then refuses neither "sold out" (the
 * stock it holds may come back) nor "limit reached" for its user (the claim may not become a
 * coupon); it answers "in doubt", a retryable 429. So doubt must be short, and three things end it:
 *
 *   1. The owner itself. A request whose database write may or may not have committed (the
 *      COMMIT sent, the answer lost; a publish the broker never confirmed and the database
 *      could not be asked about) hands the claim to resv_doubt: this process asks the
 *      template's database again every RESV_DOUBT_MS until it answers (a reconnect is tried at
 *      least every second), and settles the claim then.
 *   2. The others, when the owner is gone. Each engine process holds a lease,
 *      quan:resv:live:{<instance>} = its run id, renewed every third of QUAN_RESV_LEASE_MS. The
 *      sweeper (one replica per round, every QUAN_RESV_SWEEP_MS) settles every open record
 *      whose owner's lease is gone or names another run: a process that died, or, at once, the
 *      previous run of a process started again under the same QUAN_INSTANCE_ID.
 *   3. Age, as a safety net: a record open longer than QUAN_RESV_ABANDON_MS whatever its owner.
 *
 * Settling one, by whoever does it, always asks the database first, with a write that waits
 * for a writer of the same claim still in its transaction: a claim gives its attempt up in the
 * template's database (claimdb_void: a ledger row marked void, so that no late writer of that
 * attempt takes stock); an exchange redemption locks its code row (FOR UPDATE). An attempt that
 * never reached the database is then recorded FAILED (for /redeem-result) and given back in
 * Redis (claim_undo.lua, once per marker): the user may claim again at once. One that did reach
 * it has its safety-net check (claimq.h) made due now, and the check's consumer completes it
 * (coupon, wallet) and ends the record.
 *
 * Queued MQ claims (the broker confirmed them) stay open, marked queued, until the consumer has
 * written them; nobody but the consumer gives those up (redelivery finishes them). One still
 * open past the abandon age is only looked up: if its ledger row took stock (the consumer
 * wrote it but could not end the record), the sweep ends the record; if the consumer recorded
 * that attempt FAILED (its give-back in Redis, after the commit, may have been lost), the sweep
 * gives it back again (once per marker and attempt); if neither, its message may still be in
 * the broker, and it is left to its consumer.
 *
 * Where to look: before reserving on a template, the engine says so in the index
 * KEYS_RESV_INDEX (at most once a minute per template and process, so it costs nothing); the
 * sweeper walks the index. Every key a script touches stays in one slot (cluster-safe).
 */
#ifndef QUAN_RESV_H
#define QUAN_RESV_H

#include <stdint.h>

#include "claimdb.h"
#include "keys.h"
#include "metrics.h"
#include "service.h"
#include "status.h"

/* The module's context: made by its start hook, freed by its free hook; other modules reach it
 * with service_module_state(s, &resv_module) and pass it to the calls below. */
typedef struct resv resv;

/* The keys and arguments that name one claim's reservation for claim.lua, claim_undo.lua and
 * the record's ZREM. */
typedef struct resv_keys {
    char tpl[KEYS_LEN];    /* keys_template */
    char users[KEYS_LEN];  /* keys_template_users: the count and the marker */
    char set[KEYS_LEN];    /* keys_template_resv */
    char member[KEYS_LEN]; /* keys_resv_member, also the marker's field */
    char user[24];         /* keys_user_field: the user's count field */
    int bkt, nbkt;         /* the stock bucket of the three keys, among nbkt (bucket.h) */
} resv_keys;

/* claim_undo.lua's keys and arguments for the claim k names: its give-back, once per marker;
 * attempt: the time (ms, text) of the attempt given back, "" for whichever the marker is. */
#define RESV_UNDO_KEYS(k)                                                                          \
    {                                                                                              \
        (k)->tpl, (k)->users, (k)->set                                                             \
    }
#define RESV_UNDO_ARGS(k, attempt)                                                                 \
    {                                                                                              \
        (k)->user, (k)->member, (attempt)                                                          \
    }

/* The keys of user's claim request_id of template tpl_id in its stock bucket b among n (bucket.h:
 * the user's home; b 0 of n <= 1: the template's own keys). */
void resv_keys_of(resv_keys *k, int64_t tpl_id, int b, int n, int64_t user, const char *request_id);

/* This process as the owner of the reservations it makes: "<instance>/<run id>", claim.lua's
 * ARGV[1]. Borrowed from r. */
const char *resv_owner(const resv *r);

/* Called with QN_OK once the index names the template (at once when it did recently), else an
 * error status: then nothing may be reserved. n: the template's stock buckets, named in the
 * index when more than one ("<tpl>:<shop>:<n>"), so that the sweeper walks each bucket's
 * reservation set. On the loop thread. */
typedef void (*resv_touch_cb)(qn_status st, void *arg);
void resv_touch(resv *r, int64_t tpl_id, int64_t shop, int n, resv_touch_cb cb, void *arg);

/* The reservation is settled (its coupon committed): its record goes (a ZREM). Fire and
 * forget: a ZREM that fails (a master moving, a connection lost) is sent again every
 * RESV_DOUBT_MS for 10 s, since an open record keeps its user and the stock "in doubt"; one
 * still left after that is ended by the sweep once it is old. */
void resv_done(resv *r, const resv_keys *k);

/* A give-back (claim_undo.lua of k's claim, attempt: its reservation's time, as text) that got
 * no answer or an error: sent again every RESV_DOUBT_MS for 10 s, as resv_done's ZREM, so that
 * its stock and the user's count do not wait for the sweep's abandon age. claim_undo.lua gives
 * back once per marker and attempt: one that did happen and lost only its answer gives nothing
 * twice, and a retry of the request id that holds the marker since keeps it. Nothing is sent
 * for an empty attempt. */
void resv_undo_again(resv *r, const resv_keys *k, const char *attempt);

/* An MQ claim the broker confirmed: its record stays, marked queued (score RESV_QUEUED_BASE +
 * the reservation's time), until the consumer has written it. The sweeper leaves queued
 * records alone (redelivery finishes them); reconcile.h counts them in flight. Fire and
 * forget: sent at the end of the loop turn, one ZADD per template with the turn's other marks
 * (a confirm answers a whole pack of claims). */
#define RESV_QUEUED_BASE 1000000000000000LL
void resv_queued(resv *r, const resv_keys *k, int64_t reserved_ms);
/* What a /redeem-mq claim costs Redis beside claim.lua was looked at for cuts, and kept:
 *   - this mark: a record written queued by claim.lua itself would, if the process died before
 *     the broker confirmed, hold its stock with nobody to settle it (the sweeper never gives
 *     a queued record up); carried into the next claim.lua call of the template, it would
 *     wait for a claim that may not come, and a script's redis.call costs more than the
 *     turn's one ZADD shares among the claims it marks;
 *   - the drain's ZREM is already one per template and pack (claimq.c), and its wallet ZADD is
 *     in the user's slot, so claims of different users cannot share it in a cluster; it is the
 *     coupon the wallet shows, not bookkeeping. */

/* A claim of this process whose outcome is not known: its write may have committed, and the
 * database could not be asked (it, or the connection, went away). It stays reserved; this
 * process settles it as soon as the database answers (see above). it: the claim as written
 * (user, template, shop, request id, reservation time in receive_time_ms, routed); copied. mq:
 * a /redeem-mq claim (its pending marker goes too when it is given back). On the loop thread. */
void resv_doubt(resv *r, const claimdb_item *it, int mq);

extern const service_module resv_module;

/* The sweeper's settlements and this process's claims in doubt. */
#define RESV_METRICS(X)                                                                            \
    X(quan_claim_reservations_swept_total, COUNTER,                                                \
      "Claim reservations in doubt settled (given_back: never reached the database; completed: "   \
      "took stock, their check made due).",                                                        \
      "outcome")                                                                                   \
    X(quan_claims_in_doubt, GAUGE,                                                                 \
      "This process's claims whose outcome is not known yet, waiting for the database to answer.", \
      "")
METRICS_DECLARE(RESV_METRICS)

#endif
