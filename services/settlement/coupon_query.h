/*
 * POST /api/settlement/coupon-query (docs/api.md): the caller's coupons that apply to an
 * order, each with the discount it gives, and those that do not, each with why.
 *
 * Steps of one request (never blocking the loop):
 *   1. The user's coupons: the unused, unexpired rows of the user's shard table (UCOUPON_UNUSED AND
 *      valid_end_time > now(), at most COUPON_QUERY_MAX_COUPONS, soonest expiry first), read
 *      by one pgpool job on the user's database. The database, not the wallet sorted set,
 *      decides which coupons count (the wallet does not know when a coupon expires), and
 *      payment (the engine) checks the row too, so both agree.
 *      The rows are kept in the process (cpq_cache) and reused until the user's wallet key
 *      changes in Redis: every writer of a user's coupons (claim, queued claim, distribution,
 *      exchange code, lock, cancel, refund, expiry) writes the wallet after the row commits,
 *      and Redis tells of that write (common/redis/rtrack.h) because the wallet key was read on the
 *      tracked connection before the rows were. A wallet write that fails (logged by its
 *      writer, repaired by the claim's safety net) leaves the kept rows stale until the next
 *      change of that wallet; a lost Redis connection drops every kept row.
 *   2. The templates: kept in the process the same way (their cache hash changes with every
 *      claim, status change or rebuild), else one HGETALL per missing template on the async
 *      Redis client, issued back to back (hiredis pipelines them: one round trip).
 *   3. Templates missing from the cache (or Redis down) are loaded from their shard with
 *      tpl_db_load, one pgpool job per database holding any of them; the row's shop_number
 *      routes to the template shard. These are not kept, and the cache is not rebuilt here
 *      (settlement only reads; the engine's query chain owns the rebuild and its lock).
 *   4. The decisions of cqfit.h, without I/O: each template judged once (tpl_ended, then
 *      discount_apply of common/coupon/discount.h, the function payment uses), the lists and
 *      their order. The answer is written in one piece (each template's part prepared once,
 *      when it is read), into a block kept between requests and lent to the reply's buffer,
 *      not copied.
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
