/* merchant-admin's statistics module: /coupon-template/stats, /stats/series, /stats/summary
 * and /stats/export (a template's figures, every template of the shop, a template's file; kept
 * by the databases' triggers: migrations/ds_0/0012_coupon_stats.sql) and the timer that rolls
 * the deltas up (QUAN_STATS_ROLLUP_MS). */
#ifndef QUAN_MADMIN_STATS_H
#define QUAN_MADMIN_STATS_H

#include "service.h"

extern const service_module stats_module;

#endif
