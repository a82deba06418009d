/* merchant-admin's statistics export: /coupon-template/stats/export (a template's totals and
 * series as .xlsx or .csv, streamed by export.h; the figures are stats.h's). */
#ifndef QUAN_MADMIN_STATEXPORT_H
#define QUAN_MADMIN_STATEXPORT_H

#include "service.h"

extern const service_module statexport_module;

#endif
