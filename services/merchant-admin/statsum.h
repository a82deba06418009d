/* merchant-admin's statistics summary: /coupon-template/stats/summary (every template of the
 * shop with its figures, sorted by any of them, paged; the figures are stats.h's). */
#ifndef QUAN_MADMIN_STATSUM_H
#define QUAN_MADMIN_STATSUM_H

#include "service.h"

extern const service_module statsum_module;

#endif
