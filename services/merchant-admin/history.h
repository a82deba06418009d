/* merchant-admin's coupon history: GET /coupon/history?couponId=N, a coupon of one of the
 * shop's templates with its user, its issue and every status change, in order
 * (common/coupon/chistory.h). The shop does not know the coupon's user, so the coupon is looked
 * up by id on each database in turn (one statement over its coupon tables); another shop's
 * coupon, or none: 404. */
#ifndef QUAN_MADMIN_HISTORY_H
#define QUAN_MADMIN_HISTORY_H

#include "service.h"

extern const service_module history_module;

#endif
