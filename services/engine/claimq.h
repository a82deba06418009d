/*
 * The engine.redeem consumer: turns accepted MQ claims (event coupon.redeem, published by
 * /redeem-mq) into coupon rows in BATCHES of up to QUAN_CLAIM_BATCH messages:
 *
 *   1. consume guard per message (SET NX GET PX, pipelined): CONSUMED -> ack and skip;
 *      CONSUMING by someone else -> handled only once the broker redelivers it (the holder
 *      died), relying on the database keys;
 *   2. the claimdb.h steps for the whole batch: one ledger insert + one stock UPDATE per
 *      template, one multi-row INSERT per coupon table, each database in one transaction;
 *   3. refused claims: given back in Redis (claim_undo.lua, once per claim) and recorded as
 *      FAILED with the reason in t_claim_result (ds_0);
 *   4. wallet ZADDs and guard commits (pipelined), then the acks.
 * Every step is idempotent, so a batch redelivered after a crash (kill -9 mid-batch) ends with
 * the same rows and no double stock.
 *
 * Messages of kind "wallet" (the synchronous claim's safety net) add an unused coupon to its
 * wallet if it is missing.
 *
 * The consumer runs on its own thread with its own RabbitMQ, PostgreSQL and Redis connections
 * (batches need manual acks of many deliveries, which the one-message runner of mq.h does
 * not do); it stops taking messages at the first SIGTERM and is joined at exit.
 */
#ifndef QUAN_CLAIMQ_H
#define QUAN_CLAIMQ_H

#include "engine.h"
#include "status.h"

#define CLAIMQ_QUEUE "quan.engine.redeem"

/* Starts the consumer thread. e is borrowed for the process life. */
qn_status claimq_start(engine *e) QN_MUSTCHECK;

#endif
