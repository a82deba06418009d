/* merchant-admin's statistics module: /coupon-template/stats and /stats/series (a template's
 * figures, kept by the databases' triggers: migrations/ds_0/0012_coupon_stats.sql) and the timer
 * that rolls the deltas up (QUAN_STATS_ROLLUP_MS). Below the descriptor, what the summary
 * (statsum.c) and the export (statexport.c) read the figures with: the summed columns, the
 * figures made of them, a template's figures read from both databases, and the job that reads
 * every database in turn. */
#ifndef QUAN_MADMIN_STATS_H
#define QUAN_MADMIN_STATS_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "jsonin.h"
#include "madmin.h"
#include "metrics.h"
#include "service.h"

extern const service_module stats_module;

/* The summed columns of t_template_stat and t_template_stat_delta, in the order read. */
#define STATS_COLS(X)                                                                              \
    X(issued_claim)                                                                                \
    X(issued_mq)                                                                                   \
    X(issued_dist)                                                                                 \
    X(issued_code)                                                                                 \
    X(issued_other)                                                                                \
    X(new_users)                                                                                   \
    X(locked)                                                                                      \
    X(unlocked)                                                                                    \
    X(used)                                                                                        \
    X(refunded)                                                                                    \
    X(expired)                                                                                     \
    X(revoked)                                                                                     \
    X(discount_cents)                                                                              \
    X(refund_discount_cents)                                                                       \
    X(st_unused)                                                                                   \
    X(st_locked)                                                                                   \
    X(st_used)                                                                                     \
    X(st_expired)                                                                                  \
    X(st_revoked)

#define STATS_ENUM_(c) SC_##c,
enum { STATS_COLS(STATS_ENUM_) STATS_NCOLS };
#undef STATS_ENUM_
/* The columns, each after ", ": as they are, and summed (SQL text). */
#define STATS_LIST_(c) ", " #c
#define STATS_SUM_(c)  ", coalesce(sum(" #c "), 0)::bigint"
#define STATS_LIST     STATS_COLS(STATS_LIST_)
#define STATS_SUMS     STATS_COLS(STATS_SUM_)

#define STATS_ISSUED(v)                                                                            \
    ((v)[SC_issued_claim] + (v)[SC_issued_mq] + (v)[SC_issued_dist] + (v)[SC_issued_code] +        \
     (v)[SC_issued_other])

/*
 * The figures of a template, in the order answered: X(key, group, name, series, cents, value)
 *   key     its flat name: the summary's `sort` and the export's column
 *   group   the object of the JSON answer it is in (NULL: the answer itself)
 *   name    its name there
 *   series  its name in a series point (NULL: not in the series)
 *   cents   an amount in cents, answered in yuan
 *   value   from v, the summed columns (SC_x), and stock, the template's stock left
 */
#define STATS_FIELDS(X)                                                                            \
    X(stock, NULL, "stock", NULL, 0, stock)                                                        \
    X(claim, "issued", "claim", "claim", 0, v[SC_issued_claim])                                    \
    X(mq, "issued", "mq", "mq", 0, v[SC_issued_mq])                                                \
    X(distribution, "issued", "distribution", "distribution", 0, v[SC_issued_dist])                \
    X(exchangeCode, "issued", "exchangeCode", "exchangeCode", 0, v[SC_issued_code])                \
    X(other, "issued", "other", NULL, 0, v[SC_issued_other])                                       \
    X(issuedTotal, "issued", "total", "issued", 0, STATS_ISSUED(v))                                \
    X(distinctUsers, NULL, "distinctUsers", NULL, 0, v[SC_new_users])                              \
    X(nowUnused, "now", "unused", NULL, 0, v[SC_st_unused])                                        \
    X(nowLocked, "now", "locked", NULL, 0, v[SC_st_locked])                                        \
    X(nowUsed, "now", "used", NULL, 0, v[SC_st_used])                                              \
    X(nowExpired, "now", "expired", NULL, 0, v[SC_st_expired])                                     \
    X(nowRevoked, "now", "revoked", NULL, 0, v[SC_st_revoked])                                     \
    X(locked, NULL, "locked", NULL, 0, v[SC_locked])                                               \
    X(unlocked, NULL, "unlocked", NULL, 0, v[SC_unlocked])                                         \
    X(used, NULL, "used", "used", 0, v[SC_used])                                                   \
    X(refunded, NULL, "refunded", "refunded", 0, v[SC_refunded])                                   \
    X(expired, NULL, "expired", "expired", 0, v[SC_expired])                                       \
    X(revoked, NULL, "revoked", NULL, 0, v[SC_revoked])                                            \
    X(discountAmount, NULL, "discountAmount", "discountAmount", 1, v[SC_discount_cents])           \
    X(refundedDiscountAmount, NULL, "refundedDiscountAmount", NULL, 1,                             \
      v[SC_refund_discount_cents])                                                                 \
    X(netDiscountAmount, NULL, "netDiscountAmount", NULL, 1,                                       \
      v[SC_discount_cents] - v[SC_refund_discount_cents])

#define STATS_F_ENUM_(key, group, name, series, cents, value) SF_##key,
enum { STATS_FIELDS(STATS_F_ENUM_) STATS_NFIELDS };
#undef STATS_F_ENUM_

typedef struct stats_field {
    const char *key, *group, *name, *series;
    int cents;
} stats_field;

/* The figures' names, SF_x in order. */
extern const stats_field stats_fields[STATS_NFIELDS];

/* The figures (SF_x) of the sums v and the stock, into out. */
void stats_values(const int64_t *v, int64_t stock, int64_t *out);
/* A figure as the export writes it: a count, or an amount in yuan ("-12.05"). */
void stats_value_text(const stats_field *f, int64_t x, char *buf, size_t len);
/* A template's answer (the totals' data, a record of the summary): its ids, name and status,
 * then its figures. NULL when out of memory. */
cJSON *stats_template_json(int64_t id, int64_t shop, const char *name, int status, const int64_t *v,
                           int64_t stock) QN_MUSTCHECK;

/* ---------------------------------------------------------------- a template's figures */

enum { STATS_GRAIN_MINUTE, STATS_GRAIN_HOUR, STATS_GRAIN_DAY, STATS_NGRAINS };

typedef struct stats_point {
    int64_t ms;
    int64_t v[STATS_NCOLS];
} stats_point;

/* A template's figures as read: its totals and (the series, the export) its points. */
typedef struct stats_data {
    int64_t id; /* the template */
    int64_t stock;
    int64_t tot[STATS_NCOLS];
    int grain;
    int64_t from_ms, to_ms; /* from_ms at the start of its bucket */
    stats_point *pts;       /* every database's points; one per bucket once merged */
    size_t npts;
} stats_data;

/* A template as its statistics' answers name it, and its figures as read. */
typedef struct stats_tpl {
    char *name;
    int status;
    stats_data d;
} stats_tpl;

/* Inside a work function, on the shop's template database: j's template (j->id) of j's shop
 * into t (its name, status and stock; t->d.id). QN_OK with a 404 reply set when the shop has
 * none; a database failure as its status (the caller logs it). */
qn_status stats_tpl_load(pgpool_conn *conn, madmin_job *j, stats_tpl *t) QN_MUSTCHECK;
void stats_tpl_clear(stats_tpl *t);

/* grain, from and to of a series (grains from `first` on: the export has no minutes), from the
 * request's query and the clock (stats_series_range); QN_EINVAL with err set. */
qn_status stats_series_params(http_req *req, stats_data *d, int first,
                              jsonin_err *err) QN_MUSTCHECK;
/* The same from the texts of grain, from and to (NULL or "": absent) as of now_ms, without I/O:
 * grain `first` when absent; to now_ms and from a day before to when absent; from
 * not after to and within the grain's widest range (24 hours of minutes, 31 days of hours, 366
 * days); from moved back to the start of its bucket (a day starts at midnight in the configured
 * zone, jsonin.h). */
qn_status stats_series_range(const char *grain, const char *from, const char *to, int first,
                             int64_t now_ms, stats_data *d, jsonin_err *err) QN_MUSTCHECK;
/* This database's totals of the template, added to d->tot. QN_ERR: the database failed. */
qn_status stats_read_totals(pgpool_conn *conn, stats_data *d) QN_MUSTCHECK;
/* This database's points, appended to d->pts. QN_ERR: the database failed; QN_ENOMEM. */
qn_status stats_read_series(pgpool_conn *conn, stats_data *d) QN_MUSTCHECK;
/* The points in time order, those of one bucket (one per database) added up. */
void stats_series_merge(stats_data *d);

/* ---------------------------------------------------------------- every database in turn */

/* The head of a request job that reads every database in turn, the one of the shop's templates
 * first: work runs on each, the answer follows the last. */
typedef struct stats_walk {
    madmin_job job; /* first */
    int ds[SERVICE_DS_COUNT];
    int step;       /* the index in ds of the one being read */
    char table[64]; /* the shop's template table */
    pgpool_work_fn work;
} stats_walk;

/* A job of size bytes (stats_walk first) for req, of the module whose context is mod; NULL
 * after replying. */
void *stats_walk_new(const madmin_ctx *mod, http_req *req, size_t size, void (*clear)(reqjob *j),
                     pgpool_work_fn work) QN_MUSTCHECK;
/* The job's first database; the others follow its work, then the reply. */
void stats_walk_start(stats_walk *w);
/* The end of a work function: out of memory is a 500; a database failure is logged (what, id)
 * and answered as reqjob_db_fail. */
qn_status stats_work_end(pgpool_conn *conn, stats_walk *w, qn_status st, const char *what,
                         int64_t id) QN_MUSTCHECK;

/* The rollup's deltas. */
#define STATS_METRICS(X)                                                                           \
    X(quan_stats_rolled_total, COUNTER,                                                            \
      "Template statistics deltas this process rolled up into the per-template rows "              \
      "(merchant-admin).",                                                                         \
      "")
METRICS_DECLARE(STATS_METRICS)

#endif
