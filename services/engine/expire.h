/*
 * User-coupon expiry: a sweeper, not a timer per coupon. Every QUAN_EXPIRE_INTERVAL_MS the
 * loop submits one job per database to its pgpool; the job walks that database's
 * t_user_coupon_N tables and, per batch of QUAN_EXPIRE_BATCH rows, in ONE transaction:
 *
 *   SELECT id, user_id, coupon_template_id FROM t WHERE status = 0 AND valid_end_time <= now()
 *     LIMIT n FOR UPDATE SKIP LOCKED          -- replicas take disjoint rows
 *   ZREM quan:wallet:{user} "<tpl>_<id>"      -- pipelined, while the rows are locked
 *   UPDATE t SET status = 3 WHERE id = ANY(...) AND status = 0
 *   COMMIT
 *
 * Why ZREM before the UPDATE (inside the transaction): whatever step fails or crashes, the
 * rows stay status 0 and due, so the next sweep selects them again and repeats both steps;
 * ZREM of an absent member is harmless. The opposite order ("DB first") would leave a
 * stale wallet member whenever the process died between COMMIT and ZREM, and no later sweep
 * could find it (the row is no longer status 0). The only effect of a crash here is that a
 * coupon past its end leaves the wallet a few seconds before its row says EXPIRED, which is
 * what should happen anyway. If Redis is down the batch rolls back and the next sweep retries.
 *
 * Sweeping covers every coupon whatever wrote it (claims, MQ claims, distribution, exchange
 * codes): no producer has to remember an expiry event and no broker delay limit applies. The
 * user id comes from the row, never from a request context. Locked coupons
 * (status 1, in an order being paid) are left to the payment lifecycle.
 *
 * The queue engine.coupon-expire (event coupon.expire) is still consumed for compatibility:
 * a message {"userId", "userCouponId", "couponTemplateId"} expires that one coupon at once if
 * it is due (conditional UPDATE, then ZREM; both idempotent), and is acknowledged otherwise;
 * producers need not send it.
 */
#ifndef QUAN_EXPIRE_H
#define QUAN_EXPIRE_H

#include "metrics.h"
#include "service.h"
#include "status.h"

/* The sweep timer, QUAN_EXPIRE_INTERVAL_MS / _BATCH, and the coupon.expire consumer. */
extern const service_module expire_module;

/* The sweeper's expiries. */
#define EXPIRE_METRICS(X)                                                                          \
    X(quan_coupons_expired_total, COUNTER,                                                         \
      "User coupons marked expired and removed from the wallet by the sweeper.", "")
METRICS_DECLARE(EXPIRE_METRICS)

#endif
