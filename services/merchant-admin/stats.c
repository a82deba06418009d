/*
 * Template statistics of merchant-admin: /coupon-template/stats (a template's totals),
 * /coupon-template/stats/series (per minute, hour or day), /coupon-template/stats/summary
 * (every template of the shop with its totals, sorted by any of them, paged),
 * /coupon-template/stats/export (a template's totals and series as .xlsx or .csv) and the
 * rollup timer.
 *
 * The databases keep the figures themselves (migrations/ds_0/0012_coupon_stats.sql): triggers
 * on t_user_coupon_N append deltas to t_template_stat_delta in the transaction of the change,
 * and quan_template_stat_rollup() moves them into t_template_stat (grain 0 since the start,
 * 1 per minute, 2 per hour). The timer calls it on each database every QUAN_STATS_ROLLUP_MS,
 * on a pool worker; the function lets one caller at a time through, so replicas may all call.
 *
 * A template's coupons live in both databases (sharded by user): a read sums the rolled-up rows
 * and the deltas not rolled up yet in ONE statement per database (one snapshot, and a rollup
 * moves a delta in one transaction), so each database's figure is exact whether the rollup ran
 * or not. The shop's template database is read first, with the check that the template is the
 * caller's shop's (404 otherwise, like coupon-template/find) or, for the summary, the list of
 * the shop's templates; then the other one.
 *
 * STATS_COLS names the summed columns, STATS_FIELDS the figures the answers and exports give
 * (their names and how each comes from the columns): the totals, the summary, the series and
 * the export all go through them.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <libpq-fe.h>

#include "stats.h"
#include "export.h"
#include "jsonin.h"
#include "log.h"
#include "madmin.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"
#include "template.h"

#define STATS_MINUTE_MS   60000LL
#define STATS_HOUR_MS     (60 * STATS_MINUTE_MS)
#define STATS_DAY_MS      (24 * STATS_HOUR_MS)
#define STATS_LOG_EVERY   60    /* a rollup failing every tick is logged once per this many */
#define STATS_POINTS_MAX  2000  /* per database: the widest range has 1,441 minutes */
#define STATS_SUMMARY_MAX 10000 /* templates of a shop the summary sorts (more: 409) */
#define STATS_PAGE_MAX    1000000
#define STATS_SIZE_MAX    100

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
#define STATS_LIST_(c) ", " #c
#define STATS_SUM_(c)  ", coalesce(sum(" #c "), 0)::bigint"
#define STATS_LIST     STATS_COLS(STATS_LIST_)
#define STATS_SUMS     STATS_COLS(STATS_SUM_)
#define STATS_MS(n)    "'epoch'::timestamptz + $" #n "::bigint * interval '1 millisecond'"

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

#define STATS_F_ROW_(key, group, name, series, cents, value) {#key, group, name, series, cents},
static const stats_field stats_fields[STATS_NFIELDS] = {STATS_FIELDS(STATS_F_ROW_)};
#undef STATS_F_ROW_

/* clang-format off */
/* $1 the template: one row, a count then the sums (column 1 + SC_x). */
static const char stats_totals_sql[] =
    "SELECT count(*)" STATS_SUMS " FROM ("
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat "
    "WHERE coupon_template_id = $1 AND grain = 0 "
    "UNION ALL "
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat_delta "
    "WHERE coupon_template_id = $1) u";

/* $1 the shop: a row per template with figures, its id then the sums (column 1 + SC_x). */
static const char stats_shop_sql[] =
    "SELECT coupon_template_id" STATS_SUMS " FROM ("
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat "
    "WHERE shop_number = $1 AND grain = 0 "
    "UNION ALL "
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat_delta "
    "WHERE shop_number = $1) u "
    "GROUP BY coupon_template_id";

/* printf format, %s the bucket of a row's minute or hour h ("h", or its day). $1 the template,
 * $2 the grain of the rolled-up rows (1 minute, 2 hour), $3 / $4 the range (ms since the epoch,
 * both included), $5 the date_trunc unit the deltas are bucketed by, as the rollup does
 * (matching $2). Rows: the bucket's ms, then the sums (column 1 + SC_x), in time order. */
static const char stats_series_fmt[] =
    "SELECT (extract(epoch FROM b) * 1000)::bigint" STATS_SUMS " FROM ("
    "SELECT %s AS b" STATS_LIST " FROM ("
    "SELECT bucket AS h" STATS_LIST " FROM t_template_stat "
    "WHERE coupon_template_id = $1 AND grain = $2::smallint "
    "UNION ALL "
    "SELECT date_trunc($5::text, at) AS h" STATS_LIST " FROM t_template_stat_delta "
    "WHERE coupon_template_id = $1) r "
    "WHERE h >= " STATS_MS(3) " AND h <= " STATS_MS(4) ") u "
    "GROUP BY b ORDER BY b";
/* clang-format on */
/* The day (in the configured zone, $6 its offset in seconds) of an hour h. */
#define STATS_DAY_EXPR                                                                             \
    "date_trunc('day', h + $6::bigint * interval '1 second') - $6::bigint * interval '1 second'"

typedef struct stats_settings {
    int64_t rollup_ms; /* QUAN_STATS_ROLLUP_MS; 0: no rollup timer */
} stats_settings;

static stats_settings stats_cfg;

/* ================================================================ rollup */

typedef struct stats_rollup {
    int ds;
    int running;   /* a rollup job of this database is queued or running */
    int64_t moved; /* the job's: deltas moved */
    int64_t fails; /* failures in a row */
    char err[256]; /* the job's: why it failed */
} stats_rollup;

/* One per process (static: the pools join the running jobs before the module is freed). */
static struct {
    service *svc;
    stats_rollup rollups[SERVICE_DS_COUNT];
} stats_g;

/* Pool worker. */
static qn_status stats_rollup_work(pgpool_conn *conn, void *arg)
{
    stats_rollup *r = arg;
    r->moved = 0;
    r->err[0] = '\0';
    PGresult *res = pgpool_exec(conn, "SELECT quan_template_stat_rollup()", 0, NULL);
    if (!res) {
        snprintf(r->err, sizeof(r->err), "%s", pgpool_conn_error(conn));
        return QN_ERR;
    }
    if (PQntuples(res) == 1)
        r->moved = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return QN_OK;
}

/* Loop thread. A failure is tried again on the next tick; logged once per STATS_LOG_EVERY so
 * that a database down for long does not fill the log. */
static void stats_rollup_done(qn_status st, void *arg)
{
    stats_rollup *r = arg;
    r->running = 0;
    if (st == QN_OK) {
        if (r->moved > 0)
            metrics_add(METRIC_quan_stats_rolled_total, r->moved);
        if (r->fails > 0)
            log_info(NULL, "stats: rollup on ds_%d works again after %" PRId64 " failures", r->ds,
                     r->fails);
        r->fails = 0;
        return;
    }
    if (r->fails++ % STATS_LOG_EVERY == 0)
        log_warn(NULL, "stats: rollup on ds_%d failed (%" PRId64 " in a row, tried every tick): %s",
                 r->ds, r->fails, r->err[0] ? r->err : "not run");
}

/* Every QUAN_STATS_ROLLUP_MS, on the loop thread. */
static void stats_on_tick(void *state)
{
    (void)state;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++) {
        stats_rollup *r = &stats_g.rollups[ds];
        pgpool *pool = service_pg(stats_g.svc, ds);
        if (r->running || !pool)
            continue;
        /* A full queue or a pool shutting down: the next tick tries again. */
        if (pgpool_submit(pool, stats_rollup_work, stats_rollup_done, r) == QN_OK)
            r->running = 1;
    }
}

/* ================================================================ reads */

enum { STATS_GRAIN_MINUTE, STATS_GRAIN_HOUR, STATS_GRAIN_DAY, STATS_NGRAINS };

static const struct {
    const char *name;
    int64_t bucket_ms; /* for the start of the range */
    int64_t max_range_ms;
    const char *max_text;
} stats_grains[STATS_NGRAINS] = {
    {"minute", STATS_MINUTE_MS, STATS_DAY_MS, "24 hours"},
    {"hour", STATS_HOUR_MS, 31 * STATS_DAY_MS, "31 days"},
    {"day", STATS_DAY_MS, 366 * STATS_DAY_MS, "366 days"},
};

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

static int64_t stats_floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b < 0);
}

/* The figures (SF_x) of the sums v and the stock. */
static void stats_values(const int64_t *v, int64_t stock, int64_t *out)
{
#define STATS_F_VALUE_(key, group, name, series, cents, value) out[SF_##key] = (value);
    STATS_FIELDS(STATS_F_VALUE_)
#undef STATS_F_VALUE_
}

/* A figure as the export writes it: a count, or an amount in yuan ("-12.05"). */
static void stats_value_text(const stats_field *f, int64_t x, char *buf, size_t len)
{
    if (!f->cents) {
        snprintf(buf, len, "%" PRId64, x);
        return;
    }
    uint64_t a = x < 0 ? -(uint64_t)x : (uint64_t)x;
    snprintf(buf, len, "%s%" PRIu64 ".%02u", x < 0 ? "-" : "", a / 100, (unsigned)(a % 100));
}

/* x added to o as name; 0 when out of memory (x freed, NULL tolerated). */
static int stats_add(cJSON *o, const char *name, cJSON *x)
{
    if (x && cJSON_AddItemToObject(o, name, x))
        return 1;
    cJSON_Delete(x);
    return 0;
}

/* Figure i of f as JSON (amounts in yuan). */
static cJSON *stats_value_json(int i, const int64_t *f)
{
    return stats_fields[i].cents ? jsonin_cents_to_json(f[i]) : cJSON_CreateNumber((double)f[i]);
}

/* The figures f into d, each in its group. QN_ENOMEM. */
static qn_status stats_fields_json(cJSON *d, const int64_t *f)
{
    for (int i = 0; i < STATS_NFIELDS; i++) {
        const stats_field *sf = &stats_fields[i];
        cJSON *o = sf->group ? cJSON_GetObjectItemCaseSensitive(d, sf->group) : d;
        if (!o && !(o = cJSON_AddObjectToObject(d, sf->group)))
            return QN_ENOMEM;
        if (!stats_add(o, sf->name, stats_value_json(i, f)))
            return QN_ENOMEM;
    }
    return QN_OK;
}

/* A template's answer (the totals' data, a record of the summary): its ids, name and status,
 * then its figures. NULL when out of memory. */
static cJSON *stats_template_json(int64_t id, int64_t shop, const char *name, int status,
                                  const int64_t *v, int64_t stock)
{
    int64_t f[STATS_NFIELDS];
    cJSON *d = cJSON_CreateObject();
    stats_values(v, stock, f);
    if (!d || !stats_add(d, "couponTemplateId", jsonin_id_to_json(id)) ||
        !stats_add(d, "shopNumber", jsonin_id_to_json(shop)) ||
        !cJSON_AddStringToObject(d, "name", name ? name : "") ||
        !cJSON_AddNumberToObject(d, "status", status) || stats_fields_json(d, f) != QN_OK) {
        cJSON_Delete(d);
        return NULL;
    }
    return d;
}

static int stats_point_cmp(const void *a, const void *b)
{
    int64_t x = ((const stats_point *)a)->ms, y = ((const stats_point *)b)->ms;
    return (x > y) - (x < y);
}

/* The points in time order, those of one bucket (one per database) added up. */
static void stats_series_merge(stats_data *d)
{
    size_t n = 0;
    if (d->npts > 0)
        qsort(d->pts, d->npts, sizeof(*d->pts), stats_point_cmp);
    for (size_t i = 0; i < d->npts; i++) {
        if (n > 0 && d->pts[n - 1].ms == d->pts[i].ms) {
            for (int c = 0; c < STATS_NCOLS; c++)
                d->pts[n - 1].v[c] += d->pts[i].v[c];
        } else {
            d->pts[n++] = d->pts[i];
        }
    }
    d->npts = n;
}

/* The series' answer. NULL when out of memory. */
static cJSON *stats_series_json(stats_data *sd)
{
    int64_t f[STATS_NFIELDS];
    cJSON *d = cJSON_CreateObject(), *arr = NULL;
    if (!d || !cJSON_AddStringToObject(d, "grain", stats_grains[sd->grain].name) ||
        !(arr = cJSON_AddArrayToObject(d, "points")))
        goto fail;
    stats_series_merge(sd);
    for (size_t i = 0; i < sd->npts; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            goto fail;
        }
        if (!stats_add(o, "time", jsonin_time_to_json(sd->pts[i].ms)))
            goto fail;
        stats_values(sd->pts[i].v, 0, f);
        for (int k = 0; k < STATS_NFIELDS; k++)
            if (stats_fields[k].series &&
                !stats_add(o, stats_fields[k].series, stats_value_json(k, f)))
                goto fail;
    }
    return d;
fail:
    cJSON_Delete(d);
    return NULL;
}

/* This database's totals of the template, added to d->tot. QN_ERR: the database failed. */
static qn_status stats_read_totals(pgpool_conn *conn, stats_data *d)
{
    pgparam p = {0};
    pgparam_i64(&p, d->id);
    PGresult *r = pgpool_exec(conn, stats_totals_sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    for (int c = 0; c < STATS_NCOLS && PQntuples(r) == 1; c++)
        d->tot[c] += strtoll(PQgetvalue(r, 0, 1 + c), NULL, 10);
    PQclear(r);
    return QN_OK;
}

/* This database's points, appended to d->pts. QN_ERR: the database failed; QN_ENOMEM. */
static qn_status stats_read_series(pgpool_conn *conn, stats_data *d)
{
    char sql[sizeof(stats_series_fmt) + sizeof(STATS_DAY_EXPR)];
    pgparam p = {0};
    qn_status st = QN_ENOMEM;
    int day = d->grain == STATS_GRAIN_DAY;
    snprintf(sql, sizeof(sql), stats_series_fmt, day ? STATS_DAY_EXPR : "h");
    pgparam_i64(&p, d->id);
    pgparam_i64(&p, d->grain == STATS_GRAIN_MINUTE ? 1 : 2); /* a day is its hours */
    pgparam_i64(&p, d->from_ms);
    pgparam_i64(&p, d->to_ms);
    pgparam_str(&p, d->grain == STATS_GRAIN_MINUTE ? "minute" : "hour");
    if (day)
        pgparam_i64(&p, jsonin_zone_offset_s());
    PGresult *r = pgpool_exec(conn, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    size_t n = (size_t)PQntuples(r);
    if (n > STATS_POINTS_MAX)
        n = STATS_POINTS_MAX; /* not reached: the range bounds the buckets */
    stats_point *pts = realloc(d->pts, (d->npts + n + 1) * sizeof(*pts));
    if (!pts)
        goto done;
    d->pts = pts;
    for (size_t i = 0; i < n; i++) {
        stats_point *pt = &d->pts[d->npts++];
        pt->ms = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        for (int c = 0; c < STATS_NCOLS; c++)
            pt->v[c] = strtoll(PQgetvalue(r, (int)i, 1 + c), NULL, 10);
    }
    st = QN_OK;
done:
    PQclear(r);
    return st;
}

/* grain, from and to of a series (grains from `first` on: the export has no minutes); QN_EINVAL
 * with err set. */
static qn_status stats_series_params(http_req *req, stats_data *d, int first, jsonin_err *err)
{
    const char *g = http_query(req, "grain");
    d->grain = -1;
    if (!g || !*g)
        d->grain = first;
    for (int i = first; g && *g && i < STATS_NGRAINS; i++)
        if (strcmp(g, stats_grains[i].name) == 0)
            d->grain = i;
    if (d->grain < 0) {
        jsonin_errf(err, "grain", "must be %s",
                    first == STATS_GRAIN_MINUTE ? "minute, hour or day" : "hour or day");
        return QN_EINVAL;
    }
    if (jsonin_parse_time_str("to", http_query(req, "to"), JSONIN_OPTIONAL, now_wall_ms(),
                              &d->to_ms, err) != QN_OK ||
        jsonin_parse_time_str("from", http_query(req, "from"), JSONIN_OPTIONAL,
                              d->to_ms - STATS_DAY_MS, &d->from_ms, err) != QN_OK)
        return QN_EINVAL;
    if (d->from_ms > d->to_ms) {
        jsonin_errf(err, "from", "must not be after to");
        return QN_EINVAL;
    }
    if (d->to_ms - d->from_ms > stats_grains[d->grain].max_range_ms) {
        jsonin_errf(err, "to", "at most %s after from for grain %s",
                    stats_grains[d->grain].max_text, stats_grains[d->grain].name);
        return QN_EINVAL;
    }
    /* The bucket holding from is in: a day starts at midnight in the configured zone. */
    int64_t b = stats_grains[d->grain].bucket_ms;
    int64_t off = d->grain == STATS_GRAIN_DAY ? (int64_t)jsonin_zone_offset_s() * 1000 : 0;
    d->from_ms = stats_floor_div(d->from_ms + off, b) * b - off;
    return QN_OK;
}

/* ================================================================ requests */

/* The head of a request job that reads every database in turn, the one of the shop's templates
 * first: work runs on each, the answer follows the last. */
typedef struct stats_walk {
    madmin_job job; /* first */
    int ds[SERVICE_DS_COUNT];
    int step;       /* the index in ds of the one being read */
    char table[64]; /* the shop's template table */
    pgpool_work_fn work;
} stats_walk;

/* Loop thread: the next database, or the answer. */
static void stats_walk_done(qn_status st, void *arg)
{
    stats_walk *w = arg;
    if (st != QN_OK || reqjob_failed(&w->job.rj) || ++w->step >= SERVICE_DS_COUNT) {
        reqjob_reply(&w->job.rj, st);
        return;
    }
    madmin_job_submit(&w->job, w->ds[w->step], w->work, stats_walk_done);
}

/* A job of size bytes (stats_walk first) for req; NULL after replying. */
static void *stats_walk_new(service *svc, http_req *req, size_t size, void (*clear)(reqjob *j),
                            pgpool_work_fn work)
{
    shard_route r;
    stats_walk *w = madmin_job_new(svc, req, size, clear);
    if (!w)
        return NULL;
    if (shard_route_for("t_coupon_template", w->job.shop, &r) != QN_OK) {
        reqjob_reply_error(&w->job.rj, ERRCODE_INTERNAL, "no shard for the shop");
        return NULL;
    }
    for (int i = 0; i < SERVICE_DS_COUNT; i++)
        w->ds[i] = (r.ds + i) % SERVICE_DS_COUNT;
    snprintf(w->table, sizeof(w->table), "%s", r.table);
    w->work = work;
    return w;
}

static void stats_walk_start(stats_walk *w)
{
    madmin_job_submit(&w->job, w->ds[0], w->work, stats_walk_done);
}

/* The end of a work function: out of memory is a 500; a database failure is logged (what, id)
 * and answered as reqjob_db_fail. */
static qn_status stats_work_end(pgpool_conn *conn, stats_walk *w, qn_status st, const char *what,
                                int64_t id)
{
    if (st == QN_OK)
        return QN_OK;
    if (st == QN_ENOMEM) {
        reqjob_fail(&w->job.rj, ERRCODE_INTERNAL, "out of memory");
        return QN_OK;
    }
    log_error(NULL, "stats: reading %s %" PRId64 " on ds_%d failed: %s", what, id, w->ds[w->step],
              pgpool_conn_error(conn));
    return reqjob_db_fail(conn);
}

/* ---------------------------------------------------------------- one template */

typedef struct stats_job {
    stats_walk w; /* first; w.job.id is the template */
    int series;   /* 0: the totals; 1: the series */
    char *name;
    int status;
    stats_data d;
} stats_job;

static void stats_job_clear(reqjob *rj)
{
    stats_job *j = (stats_job *)rj;
    free(j->name);
    free(j->d.pts);
}

/* Pool worker: one database's part; on the template's database first the template (the
 * caller's shop's, else 404, and its stock); after the last database, the answer. */
static qn_status stats_work(pgpool_conn *conn, void *arg)
{
    stats_job *j = arg;
    qn_status st = QN_OK;
    if (j->w.step == 0) {
        tpl t = {0};
        st = tpl_db_load(conn, j->w.job.shop, j->w.job.id, &t);
        j->d.stock = t.stock;
        j->status = t.status;
        j->name = t.name;
        t.name = NULL; /* kept */
        tpl_clear(&t);
        if (st == QN_ENOTFOUND) {
            reqjob_fail(&j->w.job.rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template");
            return QN_OK;
        }
        if (st != QN_OK)
            goto out;
    }
    if ((st = j->series ? stats_read_series(conn, &j->d) : stats_read_totals(conn, &j->d)) != QN_OK)
        goto out;
    if (j->w.step + 1 < SERVICE_DS_COUNT)
        return QN_OK;
    j->w.job.rj.data = j->series ? stats_series_json(&j->d)
                                 : stats_template_json(j->w.job.id, j->w.job.shop, j->name,
                                                       j->status, j->d.tot, j->d.stock);
    if (!j->w.job.rj.data)
        st = QN_ENOMEM;
out:
    return stats_work_end(conn, &j->w, st, "template", j->w.job.id);
}

/* The job of a one-template route (the template id read); NULL after replying. */
static stats_job *stats_job_start(service *svc, http_req *req)
{
    jsonin_err err = {{0}};
    stats_job *j = stats_walk_new(svc, req, sizeof(*j), stats_job_clear, stats_work);
    if (!j)
        return NULL;
    if (madmin_param_id(req, "couponTemplateId", &j->w.job.id, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return NULL;
    }
    j->d.id = j->w.job.id;
    return j;
}

static void stats_h_totals(http_req *req, void *arg)
{
    stats_job *j = stats_job_start(arg, req);
    if (j)
        stats_walk_start(&j->w);
}

static void stats_h_series(http_req *req, void *arg)
{
    jsonin_err err = {{0}};
    stats_job *j = stats_job_start(arg, req);
    if (!j)
        return;
    j->series = 1;
    if (stats_series_params(req, &j->d, STATS_GRAIN_MINUTE, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    stats_walk_start(&j->w);
}

/* ---------------------------------------------------------------- the shop's summary */

/* A template of the shop and its sums. */
typedef struct stats_row {
    int64_t id, stock;
    int64_t key; /* the sorted figure, negated for a descending order */
    char *name;
    int status;
    int64_t v[STATS_NCOLS];
} stats_row;

typedef struct stats_sum_job {
    stats_walk w; /* first */
    int sort;     /* SF_x */
    int asc;
    int64_t current, size;
    stats_row *rows; /* the shop's templates, by id */
    size_t nrows;
} stats_sum_job;

static void stats_sum_clear(reqjob *rj)
{
    stats_sum_job *j = (stats_sum_job *)rj;
    for (size_t i = 0; i < j->nrows; i++)
        free(j->rows[i].name);
    free(j->rows);
}

/* The shop's templates, by id (at most STATS_SUMMARY_MAX, else a 409 reply). */
static qn_status stats_sum_templates(pgpool_conn *conn, stats_sum_job *j)
{
    char sql[256];
    pgparam p = {0};
    qn_status st = QN_ENOMEM;
    snprintf(sql, sizeof(sql),
             "SELECT id, name, status, stock FROM %s WHERE shop_number = $1 AND del_flag = 0 "
             "ORDER BY id LIMIT $2",
             j->w.table);
    pgparam_i64(&p, j->w.job.shop);
    pgparam_i64(&p, STATS_SUMMARY_MAX + 1);
    PGresult *r = pgpool_exec(conn, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    size_t n = (size_t)PQntuples(r);
    if (n > STATS_SUMMARY_MAX) {
        reqjob_fail(&j->w.job.rj, ERRCODE_STATE,
                    "the shop has more than %d templates, more than the summary sorts",
                    STATS_SUMMARY_MAX);
        st = QN_OK;
        goto done;
    }
    if (!(j->rows = calloc(n ? n : 1, sizeof(*j->rows)))) /* never NULL: bsearch's base */
        goto done;
    for (size_t i = 0; i < n; i++) {
        stats_row *row = &j->rows[j->nrows++];
        row->id = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        if (!(row->name = strdup(PQgetvalue(r, (int)i, 1))))
            goto done;
        row->status = atoi(PQgetvalue(r, (int)i, 2));
        row->stock = strtoll(PQgetvalue(r, (int)i, 3), NULL, 10);
    }
    st = QN_OK;
done:
    PQclear(r);
    return st;
}

static int stats_row_by_id(const void *key, const void *elem)
{
    int64_t a = *(const int64_t *)key, b = ((const stats_row *)elem)->id;
    return (a > b) - (a < b);
}

/* This database's sums of the shop's templates, added to theirs. QN_ERR: the database failed. */
static qn_status stats_sum_read(pgpool_conn *conn, stats_sum_job *j)
{
    pgparam p = {0};
    pgparam_i64(&p, j->w.job.shop);
    PGresult *r = pgpool_exec(conn, stats_shop_sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        stats_row *row = bsearch(&id, j->rows, j->nrows, sizeof(*j->rows), stats_row_by_id);
        if (!row)
            continue; /* a deleted template's */
        for (int c = 0; c < STATS_NCOLS; c++)
            row->v[c] += strtoll(PQgetvalue(r, i, 1 + c), NULL, 10);
    }
    PQclear(r);
    return QN_OK;
}

static int stats_row_cmp(const void *a, const void *b)
{
    const stats_row *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->id < y->id) - (x->id > y->id); /* ties: the newest first */
}

/* The page asked for, of every template sorted. NULL when out of memory. */
static cJSON *stats_sum_json(stats_sum_job *j)
{
    int64_t f[STATS_NFIELDS];
    for (size_t i = 0; i < j->nrows; i++) {
        stats_values(j->rows[i].v, j->rows[i].stock, f);
        j->rows[i].key = j->asc ? f[j->sort] : -f[j->sort];
    }
    qsort(j->rows, j->nrows, sizeof(*j->rows), stats_row_cmp);
    cJSON *d = cJSON_CreateObject(), *recs = NULL;
    if (!d || !(recs = cJSON_AddArrayToObject(d, "records")))
        goto fail;
    size_t total = j->nrows, from = (size_t)((j->current - 1) * j->size);
    for (size_t i = from; i < total && i < from + (size_t)j->size; i++) {
        const stats_row *row = &j->rows[i];
        cJSON *o =
            stats_template_json(row->id, j->w.job.shop, row->name, row->status, row->v, row->stock);
        if (!o || !cJSON_AddItemToArray(recs, o)) {
            cJSON_Delete(o);
            goto fail;
        }
    }
    if (!cJSON_AddNumberToObject(d, "total", (double)total) ||
        !cJSON_AddNumberToObject(d, "size", (double)j->size) ||
        !cJSON_AddNumberToObject(d, "current", (double)j->current) ||
        !cJSON_AddNumberToObject(d, "pages", (double)((total + j->size - 1) / j->size)))
        goto fail;
    return d;
fail:
    cJSON_Delete(d);
    return NULL;
}

/* Pool worker: on the shop's template database first its templates; on each, their sums;
 * after the last, the answer. */
static qn_status stats_sum_work(pgpool_conn *conn, void *arg)
{
    stats_sum_job *j = arg;
    qn_status st = QN_OK;
    if (j->w.step == 0 &&
        ((st = stats_sum_templates(conn, j)) != QN_OK || reqjob_failed(&j->w.job.rj)))
        goto out;
    if ((st = stats_sum_read(conn, j)) != QN_OK || j->w.step + 1 < SERVICE_DS_COUNT)
        goto out;
    if (!(j->w.job.rj.data = stats_sum_json(j)))
        st = QN_ENOMEM;
out:
    return stats_work_end(conn, &j->w, st, "the summary of shop", j->w.job.shop);
}

/* sort (a figure's key, default issuedTotal) and order (desc, the default, or asc). */
static qn_status stats_sort_params(http_req *req, stats_sum_job *j, jsonin_err *err)
{
    const char *s = http_query(req, "sort"), *o = http_query(req, "order");
    j->sort = SF_issuedTotal;
    if (s && *s) {
        j->sort = -1;
        for (int i = 0; i < STATS_NFIELDS; i++)
            if (strcmp(s, stats_fields[i].key) == 0)
                j->sort = i;
        if (j->sort < 0) {
            jsonin_errf(err, "sort",
                        "must name a figure of the records, e.g. issuedTotal, claim, used, "
                        "refunded, distinctUsers, discountAmount, stock (docs/api.md)");
            return QN_EINVAL;
        }
    }
    if (o && *o && strcmp(o, "desc") != 0) {
        if (strcmp(o, "asc") != 0) {
            jsonin_errf(err, "order", "must be desc or asc");
            return QN_EINVAL;
        }
        j->asc = 1;
    }
    return QN_OK;
}

static void stats_h_summary(http_req *req, void *arg)
{
    jsonin_err err = {{0}};
    stats_sum_job *j = stats_walk_new(arg, req, sizeof(*j), stats_sum_clear, stats_sum_work);
    if (!j)
        return;
    if (stats_sort_params(req, j, &err) != QN_OK ||
        jsonin_parse_int64_str("current", http_query(req, "current"), JSONIN_OPTIONAL, 1, 1,
                               STATS_PAGE_MAX, &j->current, &err) != QN_OK ||
        jsonin_parse_int64_str("size", http_query(req, "size"), JSONIN_OPTIONAL, 10, 1,
                               STATS_SIZE_MAX, &j->size, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    stats_walk_start(&j->w);
}

/* ---------------------------------------------------------------- export */

/* The totals' columns (a header row and the template's row), then a header row of the series'
 * columns and a row per bucket, fewer cells. */
#define STATS_F_KEY_(key, group, name, series, cents, value) #key,
static const char *const stats_export_header[] = {"couponTemplateId", "shopNumber", "name",
                                                  "status", STATS_FIELDS(STATS_F_KEY_)};
#undef STATS_F_KEY_
enum { STATS_XFIXED = 4, STATS_XCOLS = STATS_XFIXED + STATS_NFIELDS };
_Static_assert(STATS_XCOLS <= EXPORT_COLS_MAX, "the export's columns");
_Static_assert(sizeof(stats_export_header) / sizeof(stats_export_header[0]) == STATS_XCOLS,
               "the export's header");

typedef struct stats_export {
    export_job e; /* first; e.job.id is the template */
    int read;     /* databases read */
    char *name;
    int status;
    stats_data d;
} stats_export;

static void stats_export_clear(export_job *e)
{
    stats_export *x = (stats_export *)e;
    free(x->name);
    free(x->d.pts);
}

static qn_status stats_export_params(http_req *req, export_job *e, jsonin_err *err)
{
    return stats_series_params(req, &((stats_export *)e)->d, STATS_GRAIN_HOUR, err);
}

/* On the shop's template database: the template is the caller's shop's (else 404). */
static qn_status stats_export_prepare(pgpool_conn *conn, export_job *e)
{
    stats_export *x = (stats_export *)e;
    tpl t = {0};
    qn_status st = tpl_db_load(conn, e->job.shop, e->job.id, &t);
    if (st == QN_OK) {
        x->d.id = e->job.id;
        x->d.stock = t.stock;
        x->status = t.status;
        x->name = t.name;
        t.name = NULL; /* kept */
        snprintf(e->filename, sizeof(e->filename), "template-%" PRId64 "-stats", e->job.id);
    } else if (st == QN_ENOTFOUND) {
        reqjob_fail(&e->job.rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template");
        st = QN_OK;
    } else {
        log_error(NULL, "stats: reading template %" PRId64 " on ds_%d failed: %s", e->job.id, e->ds,
                  pgpool_conn_error(conn));
        st = reqjob_db_fail(conn);
    }
    tpl_clear(&t);
    return st;
}

/* Every row of the file, once every database is read. */
static qn_status stats_export_rows(stats_export *x)
{
    const char *cells[STATS_XCOLS] = {0};
    char text[STATS_XCOLS][32];
    int64_t f[STATS_NFIELDS];
    int n = 0;
    stats_values(x->d.tot, x->d.stock, f);
    snprintf(text[0], sizeof(text[0]), "%" PRId64, x->e.job.id);
    snprintf(text[1], sizeof(text[1]), "%" PRId64, x->e.job.shop);
    snprintf(text[3], sizeof(text[3]), "%d", x->status);
    cells[0] = text[0];
    cells[1] = text[1];
    cells[2] = x->name;
    cells[3] = text[3];
    for (int i = 0; i < STATS_NFIELDS; i++) {
        stats_value_text(&stats_fields[i], f[i], text[STATS_XFIXED + i], sizeof(text[0]));
        cells[STATS_XFIXED + i] = text[STATS_XFIXED + i];
    }
    /* ids stay text (a spreadsheet keeps 15 digits of a number); the figures are numbers */
    qn_status st = export_row(&x->e, cells, ((1u << STATS_XCOLS) - 1) & ~7u);
    memset(cells, 0, sizeof(cells));
    cells[n++] = "time";
    for (int i = 0; i < STATS_NFIELDS; i++)
        if (stats_fields[i].series)
            cells[n++] = stats_fields[i].series;
    if (st == QN_OK)
        st = export_row(&x->e, cells, 0);
    stats_series_merge(&x->d);
    for (size_t p = 0; p < x->d.npts && st == QN_OK; p++) {
        jsonin_time_format(x->d.pts[p].ms, text[0]);
        cells[0] = text[0];
        stats_values(x->d.pts[p].v, 0, f);
        n = 1;
        for (int i = 0; i < STATS_NFIELDS; i++)
            if (stats_fields[i].series) {
                stats_value_text(&stats_fields[i], f[i], text[n], sizeof(text[n]));
                cells[n] = text[n];
                n++;
            }
        st = export_row(&x->e, cells, ((1u << n) - 1) & ~1u);
    }
    return st;
}

/* A page: this database's totals and points; after the last database, the whole file. */
static qn_status stats_export_page(pgpool_conn *conn, export_job *e)
{
    stats_export *x = (stats_export *)e;
    qn_status st = stats_read_totals(conn, &x->d);
    if (st == QN_OK)
        st = stats_read_series(conn, &x->d);
    if (st == QN_ERR) {
        log_error(NULL, "stats: reading template %" PRId64 " on ds_%d failed: %s", e->job.id, e->ds,
                  pgpool_conn_error(conn));
        return reqjob_db_fail(conn);
    }
    if (st != QN_OK)
        return st;
    if (++x->read < SERVICE_DS_COUNT) {
        e->ds = (e->ds + 1) % SERVICE_DS_COUNT; /* the shop's template database came first */
        return QN_OK;
    }
    e->last = 1;
    return stats_export_rows(x);
}

static const export_spec stats_export_spec = {
    .ds = EXPORT_DS_TPL,
    .csv = 1,
    .size = sizeof(stats_export),
    .clear = stats_export_clear,
    .sheet_name = "statistics",
    .header = stats_export_header,
    .ncols = STATS_XCOLS,
    .params = stats_export_params,
    .prepare = stats_export_prepare,
    .page = stats_export_page,
};

static void stats_h_export(http_req *req, void *arg)
{
    export_by_id(arg, req, "couponTemplateId", &stats_export_spec);
}

/* ================================================================ the module */

static qn_status stats_start(service *s, void **state)
{
    stats_g.svc = s;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++)
        stats_g.rollups[ds].ds = ds;
    *state = s; /* the handlers' arg is the service, as madmin_job_new wants */
    return QN_OK;
}

static const config_var stats_vars[] = {
    {"QUAN_STATS_ROLLUP_MS", CONFIG_INT, offsetof(stats_settings, rollup_ms), "1000", 0, 3600000,
     NULL, 0,
     "how often the template statistics' deltas are rolled up on each database (0: never; the "
     "answers stay exact, the deltas only pile up)"},
};

const service_module stats_module = {
    .name = "stats",
    .vars = stats_vars,
    .nvars = sizeof(stats_vars) / sizeof(stats_vars[0]),
    .settings = &stats_cfg,
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats", stats_h_totals, HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats/series", stats_h_series,
             HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats/summary", stats_h_summary,
             HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats/export", stats_h_export,
             HTTP_NEED_SHOP},
            {0},
        },
    .timers =
        (const service_timer[]){
            {"stats-rollup", offsetof(stats_settings, rollup_ms), stats_on_tick},
            {0},
        },
    .start = stats_start,
};
