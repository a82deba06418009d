/*
 * The engine.redeem consumer: turns accepted MQ claims (event coupon.redeem, published by
 * /redeem-mq, one claim or a pack of them per message: mq.h) into coupon rows in BATCHES of
 * about QUAN_CLAIM_BATCH claims (whole messages: a batch ends after the message that reaches
 * the size):
 *
 *   1. consume guard per message, not per claim (SET NX GET PX, pipelined; a pack's key is
 *      a digest of its claims, claimq_pack_key): CONSUMED -> ack and skip; CONSUMING by
 *      someone else -> handled only once the broker redelivers it (the holder died), relying
 *      on the database keys;
 *   2. the claimdb.h steps for the whole batch: one ledger insert + one stock UPDATE per
 *      template, one multi-row INSERT per coupon table, each database in one transaction;
 *   3. refused claims: given back in Redis (claim_undo.lua, once per claim) and recorded as
 *      FAILED with the reason in t_claim_result (ds_0);
 *   4. wallet ZADDs and guard commits (pipelined), then the acks. A message is marked
 *      CONSUMED only when it is acked whole; one going back (a later attempt of a request id
 *      in the batch: the earlier is written first) has its guard key deleted.
 * Every step is idempotent, so a batch redelivered after a crash (kill -9 mid-batch) ends with
 * the same rows and no double stock.
 *
 * Messages with "check": true are the safety net of synchronous claims (below): a check
 * whose claim marker is gone in Redis becomes a probe (claimdb.h) instead of a claim. A coupon
 * found already written goes (back) into the wallet only while it is unused.
 *
 * QUAN_CLAIM_CONSUMERS workers (0: none on this replica), each a batch consumer (mq_consumer.h:
 * its own thread and RabbitMQ connections, acks of a batch together, heartbeats kept while a
 * batch runs, reconnects) with its own PostgreSQL and Redis connections, so that one worker's
 * batch is in the database while another receives. A claim someone else holds sends its
 * delivery back at once; a malformed one sends its delivery to the dead-letter queue; a batch
 * that fails (a database down) comes back whole. They stop taking messages at the first
 * SIGTERM (each finishes the batch in hand) and are freed at exit.
 */
#ifndef QUAN_CLAIMQ_H
#define QUAN_CLAIMQ_H

#include <cJSON.h>

#include "claimdb.h"
#include "service.h"
#include "outbox.h"
#include "pgpool.h"
#include "status.h"
#include "ucoupon.h"
#include "metrics.h"

#define CLAIMQ_EXCODE_PREFIX "excode:" /* request id of an exchange redemption: + the code */
#define CLAIMQ_CLAIM_JSON    640       /* room for claimq_claim_json */
/* x-dead-reason of a /redeem-mq claim accepted before a database restore (consumer and
 * quan-recover alike). */
#define CLAIMQ_RESTORED_REASON                                                                     \
    "restored: accepted before a database restore, its reservation is gone; not applied (the "     \
    "user may claim again)"

/* The data of a coupon.redeem claim for coupon u (request_id, ids, times, count, source):
 * everything the consumer needs, so it reads no template and makes no id, and a redelivery
 * writes the same row. bkt, nbkt: the stock bucket of its reservation among the template's
 * (bucket.h; "bucket" and "buckets", written when nbkt > 1; a message without them is of
 * bucket 0 of 1). check = 1 for the safety net below. epoch: the restore epoch the claim
 * was accepted under (restore.h; written when > 0): a claim of an earlier epoch reserved in a
 * Redis that quan-recover has since flushed, and the consumer dead-letters it ("restored")
 * instead of writing it, wherever it was while the restore happened. Returns buf. */
char *claimq_claim_json(char buf[CLAIMQ_CLAIM_JSON], const ucoupon *u, int bkt, int nbkt, int check,
                        int64_t epoch);

/* The message key of one attempt of a claim ("<userId>:<requestId>:<receiveTime>", "check:"
 * first for a check), which the consumer's guard deduplicates a message of one claim by, and
 * the batch its claims by: a retry after a given-up attempt reserves anew, at another time,
 * and is another message. */
#define CLAIMQ_ATTEMPT_KEY 128
void claimq_attempt_key(char *buf, size_t size, const ucoupon *u, int check);

/* The consume guard's key of a pack of n claims (keys: their attempt keys, or a malformed
 * one's message key, in order): "pack:" and the SHA1 (hex) of them. The guard of a pack costs
 * one key for its couple of dozen claims. Its content names it, not its first claim: should one
 * claim travel in two packs (a publish repeated after an unconfirmed one), neither may be
 * skipped because the other was consumed; the same content is the same work (a redelivery). */
#define CLAIMQ_PACK_KEY 46
void claimq_pack_key(char buf[CLAIMQ_PACK_KEY], const char *const *keys, size_t n);

/* Reads the data of a coupon.redeem message (claimq_claim_json's) into *it, zeroed first:
 * the coupon, check and the route. 1 when it is a claim the consumer can write; 0 when it is
 * malformed (its delivery goes to the dead-letter queue). The data comes off the queue: any
 * JSON must be read safely. */
int claimq_claim_parse(const cJSON *data, claimdb_item *it);

/* The safety net of a claim written synchronously (/redeem, exchange), in the transaction that
 * commits first (its stock, or its exchange code): a coupon.redeem "check" of the same claim,
 * due after QUAN_CLAIM_WALLET_CHECK_MS, key "check:<user>:<request id>". When it comes, the
 * consumer completes the claim if its Redis marker still holds the reservation (ledger, coupon
 * and wallet are idempotent: a claim that went through only gets its wallet entry checked),
 * and otherwise gives the database stock back if the ledger still holds it (the request failed
 * and gave Redis back), releasing an exchange code whose claim did not complete. So a process
 * that dies between the two databases' commits leaves nothing half-done. */
qn_status claimq_add_check(pgpool_conn *c, const ucoupon *u, int bkt, int nbkt,
                           const char *request_id, int64_t due_at_ms) QN_MUSTCHECK;
/* The check's outbox event alone, for outbox_add_many: its text goes into data and key, which
 * *ev borrows. */
void claimq_check_event(outbox_event *ev, char data[CLAIMQ_CLAIM_JSON],
                        char key[CLAIMQ_ATTEMPT_KEY], const ucoupon *u, int bkt, int nbkt,
                        const char *request_id, int64_t due_at_ms);

/* The engine.redeem queue, its batch workers (QUAN_CLAIM_CONSUMERS, QUAN_CLAIM_BATCH). */
extern const service_module claimq_module;

/* The consumer's messages by outcome (its claims' outcomes count in CLAIMSTEP_METRICS). */
#define CLAIMQ_METRICS(X)                                                                          \
    X(quan_mq_consumed_total, COUNTER,                                                             \
      "Messages consumed, by queue and outcome (ack, retry, dead, skip).", "queue,outcome")
METRICS_DECLARE(CLAIMQ_METRICS)

#endif
