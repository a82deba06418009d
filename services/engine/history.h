/*
 * A coupon's history for its user: GET /api/engine/user-coupon/history?couponId=N answers the
 * caller's coupon (another user's, or none: 404) with its issue and every status change, in
 * order (common/coupon/chistory.h: the coupon and its log read in one statement on the user's
 * database).
 */
#ifndef QUAN_HISTORY_H
#define QUAN_HISTORY_H

#include "service.h"

/* The route above. */
extern const service_module history_module;

#endif
