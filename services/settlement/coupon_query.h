/*
 * POST /api/settlement/coupon-query (docs/api.md): the caller's coupons that apply to an
 * order, each with the discount it gives, and those that do not, each with why.
 *
 * Steps of one request (never blocking the loop):
 *   1. One pgpool job on the user's database: the unused, unexpired rows of the user's shard
 *      table (status 0 AND valid_end_time > now(), at most COUPON_QUERY_MAX_COUPONS, soonest
 *      expiry first). The database, not the wallet sorted set, decides which coupons count:
 *      the wallet does not know when a coupon expires and lags the row after a claim, refund
 *      or cancel, and payment (the engine) checks the row too, so both agree.
 *   2. The templates, one HGETALL per distinct template on the async Redis client, issued back
 *      to back (hiredis pipelines them: one round trip).
 *   3. Templates missing from the cache (or Redis down) are loaded from their shard with
 *      tpl_db_load, one pgpool job per database holding any of them; the row's shop_number
 *      routes to the template shard. The cache is not rebuilt here (settlement only reads;
 *      the engine's query chain owns the rebuild and its lock).
 *   4. discount_apply (common/discount.h, the function payment uses) on each coupon.
 *
 * Response entries carry userCouponId and couponTemplateId (the reference answered the
 * template id only), name, target, goods, type, consumeRule, couponAmount (yuan; 0 when not
 * available) and the coupon's validEndTime; not-available entries add reason: "threshold not
 * met", "goods not in order", "other shop", "invalid rule" or "template ended". A coupon
 * whose template exists nowhere is left out (logged), not a crash. Available entries are
 * sorted by couponAmount descending, then validEndTime ascending, then userCouponId; the
 * not-available ones by validEndTime, then userCouponId.
 */
#ifndef QUAN_COUPON_QUERY_H
#define QUAN_COUPON_QUERY_H

#include "service.h"
#include "status.h"

#define COUPON_QUERY_MAX_COUPONS 1000 /* rows considered per request */

/* The route above. */
extern const service_module coupon_query_module;

#endif
