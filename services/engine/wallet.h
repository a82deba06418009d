/*
 * The user's coupons: GET /api/engine/user-coupon/list[?status=0..4] answers the caller's
 * coupons, newest first (at most WALLET_LIST_MAX), each with the fields of its template
 * (name, shopNumber, target, goods, type, consumeRule) taken through the template query chain
 * (cache first). The rows come from the database, which holds every status; the wallet sorted
 * set quan:wallet:{<userId>} (member "<templateId>_<userCouponId>", score = claim time) holds
 * the unused ones for settlement.
 */
#ifndef QUAN_WALLET_H
#define QUAN_WALLET_H

#include "service.h"
#include "status.h"

#define WALLET_LIST_MAX 1000

/* The route above. */
extern const service_module wallet_module;

#endif
