/* merchant-admin's statistics summary: /coupon-template/stats/summary (every template of the
 * shop with its figures, sorted by any of them, paged; the figures are stats.h's). */
#ifndef QUAN_MADMIN_STATSUM_H
#define QUAN_MADMIN_STATSUM_H

#include <stddef.h>
#include <stdint.h>

#include "jsonin.h"
#include "service.h"
#include "stats.h"

extern const service_module statsum_module;

/* What the summary decides without I/O, for its tests. */

/* A template of the shop and its sums. */
typedef struct statsum_row {
    int64_t id, stock;
    int64_t key; /* the sorted figure, negated for a descending order */
    char *name;
    int status;
    int64_t v[STATS_NCOLS];
} statsum_row;

/* `sort` (a figure's key of stats_fields; issuedTotal when absent) and `order` (desc when absent,
 * or asc) from their texts (NULL or "": absent): *sort_out a SF_x, *asc 1 for ascending.
 * QN_EINVAL with err set (the outputs untouched). */
qn_status statsum_sort_parse(const char *sort, const char *order, int *sort_out, int *asc,
                             jsonin_err *err) QN_MUSTCHECK;
/* rows in the order answered: by figure sort (SF_x), ascending when asc, ties newest (highest
 * id) first. */
void statsum_sort_rows(statsum_row *rows, size_t n, int sort, int asc);

#endif
