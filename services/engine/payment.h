/*
 * The payment lifecycle of a user coupon:
 *
 *   POST /api/engine/user-coupon/create-payment-record   coupon UNUSED -> LOCKED, settlement 0
 *   POST /api/engine/user-coupon/process-payment         LOCKED -> USED,   settlement 0 -> 2
 *   POST /api/engine/user-coupon/process-refund          USED -> UNUSED,   settlement 2 -> 3
 *   POST /api/engine/user-coupon/cancel-payment          LOCKED -> UNUSED, settlement 0 -> 1
 *   event payment.timeout (queue engine.payment-timeout) the same as cancel, for a settlement
 *                                                        still locked QUAN_PAYMENT_LOCK_TIMEOUT_S
 *                                                        after it was created
 *
 * Every step runs under the per-coupon lock quan:lock:coupon:{<couponId>} (keys.h), taken
 * before and released after the database work (never released inside the transaction);
 * HTTP calls use FAIL_FAST (busy: 429 A000429, never a silent success), the timeout consumer
 * waits up to 2 s and otherwise requeues. Each state change is a conditional UPDATE whose row
 * count is checked (0 rows: the state did not allow it, and the transaction rolls back); the
 * partial unique index on t_coupon_settlement_N (coupon_id) WHERE status IN (0, 2) allows one
 * active settlement per coupon. The discount is common/coupon/discount.h's, the one settlement
 * uses.
 *
 * Two databases: t_user_coupon (32 tables) and t_coupon_settlement (16 tables) are both keyed
 * by user_id but split differently, so for about half of the users the two rows live in
 * different databases. Same database: one transaction changes both rows (and adds or cancels
 * the timeout timer). Different databases: the settlement row changes first (with the timer,
 * in its database's outbox), then the coupon row; if the coupon step of a create fails the
 * settlement is cancelled again. A crash between the two leaves a state the next call (or the
 * timeout) completes: a settlement already in its target state whose coupon is still in the
 * source state, with no other active settlement, gets only the coupon step.
 *
 * The wallet (ZREM on lock, ZADD with score = receive time when the coupon is unused again) is
 * updated after the commit, before the lock is released and the client answered.
 */
#ifndef QUAN_PAYMENT_H
#define QUAN_PAYMENT_H

#include "service.h"
#include "status.h"

/* The four routes, the payment-timeout consumer and QUAN_PAYMENT_LOCK_TIMEOUT_S. */
extern const service_module payment_module;

#endif
