/*
 * Template statistics of merchant-admin: /coupon-template/stats (a template's totals),
 * /coupon-template/stats/series (per minute, hour or day) and the rollup timer.
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
 * or not. The template's own database is read first, with the check that the template is the
 * caller's shop's (404 otherwise, like coupon-template/find); then the other one.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <libpq-fe.h>

#include "stats.h"
#include "jsonin.h"
#include "log.h"
#include "madmin.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"
#include "template.h"

#define STATS_MINUTE_MS  60000LL
#define STATS_HOUR_MS    (60 * STATS_MINUTE_MS)
#define STATS_DAY_MS     (24 * STATS_HOUR_MS)
#define STATS_LOG_EVERY  60   /* a rollup failing every tick is logged once per this many */
#define STATS_POINTS_MAX 2000 /* per database: the widest range has 1,441 minutes */

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

/* clang-format off */
/* $1 the template: one row, a count then the sums (column 1 + SC_x). */
static const char stats_totals_sql[] =
    "SELECT count(*)" STATS_SUMS " FROM ("
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat "
    "WHERE coupon_template_id = $1 AND grain = 0 "
    "UNION ALL "
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat_delta "
    "WHERE coupon_template_id = $1) u";

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

typedef struct stats_job {
    madmin_job job;           /* first; job.id is the template */
    int ds[SERVICE_DS_COUNT]; /* the databases in the order read: the template's first */
    int step;                 /* the index in ds of the one being read */
    int series;               /* 0: the totals; 1: the series */
    int64_t stock;
    int64_t tot[STATS_NCOLS];
    int grain;
    int64_t from_ms, to_ms; /* from_ms at the start of its bucket */
    stats_point *pts;       /* both databases' points, merged when the last is read */
    size_t npts;
} stats_job;

static void stats_job_clear(reqjob *rj)
{
    stats_job *j = (stats_job *)rj;
    free(j->pts);
}

static int64_t stats_floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b < 0);
}

static cJSON *stats_num(cJSON *o, const char *name, int64_t v)
{
    return cJSON_AddNumberToObject(o, name, (double)v);
}

static int64_t stats_issued(const int64_t *v)
{
    return v[SC_issued_claim] + v[SC_issued_mq] + v[SC_issued_dist] + v[SC_issued_code] +
           v[SC_issued_other];
}

/* The totals' answer. NULL when out of memory. */
static cJSON *stats_totals_json(const stats_job *j)
{
    const int64_t *v = j->tot;
    cJSON *d = cJSON_CreateObject(), *is = cJSON_CreateObject(), *now = cJSON_CreateObject();
    if (!d || !is || !now) {
        cJSON_Delete(d);
        cJSON_Delete(is);
        cJSON_Delete(now);
        return NULL;
    }
    cJSON_AddItemToObject(d, "couponTemplateId", jsonin_id_to_json(j->job.id));
    cJSON_AddItemToObject(d, "shopNumber", jsonin_id_to_json(j->job.shop));
    stats_num(d, "stock", j->stock);
    stats_num(is, "claim", v[SC_issued_claim]);
    stats_num(is, "mq", v[SC_issued_mq]);
    stats_num(is, "distribution", v[SC_issued_dist]);
    stats_num(is, "exchangeCode", v[SC_issued_code]);
    stats_num(is, "other", v[SC_issued_other]);
    stats_num(is, "total", stats_issued(v));
    cJSON_AddItemToObject(d, "issued", is);
    stats_num(d, "distinctUsers", v[SC_new_users]);
    stats_num(now, "unused", v[SC_st_unused]);
    stats_num(now, "locked", v[SC_st_locked]);
    stats_num(now, "used", v[SC_st_used]);
    stats_num(now, "expired", v[SC_st_expired]);
    stats_num(now, "revoked", v[SC_st_revoked]);
    cJSON_AddItemToObject(d, "now", now);
    stats_num(d, "locked", v[SC_locked]);
    stats_num(d, "unlocked", v[SC_unlocked]);
    stats_num(d, "used", v[SC_used]);
    stats_num(d, "refunded", v[SC_refunded]);
    stats_num(d, "expired", v[SC_expired]);
    stats_num(d, "revoked", v[SC_revoked]);
    cJSON_AddItemToObject(d, "discountAmount", jsonin_cents_to_json(v[SC_discount_cents]));
    cJSON_AddItemToObject(d, "refundedDiscountAmount",
                          jsonin_cents_to_json(v[SC_refund_discount_cents]));
    cJSON_AddItemToObject(d, "netDiscountAmount",
                          jsonin_cents_to_json(v[SC_discount_cents] - v[SC_refund_discount_cents]));
    return d;
}

static int stats_point_cmp(const void *a, const void *b)
{
    int64_t x = ((const stats_point *)a)->ms, y = ((const stats_point *)b)->ms;
    return (x > y) - (x < y);
}

/* The series' answer: the points of both databases, a bucket's added up. NULL when out of
 * memory. */
static cJSON *stats_series_json(stats_job *j)
{
    cJSON *d = cJSON_CreateObject(), *arr = NULL;
    if (!d || !cJSON_AddStringToObject(d, "grain", stats_grains[j->grain].name) ||
        !(arr = cJSON_AddArrayToObject(d, "points"))) {
        cJSON_Delete(d);
        return NULL;
    }
    if (j->npts > 0)
        qsort(j->pts, j->npts, sizeof(*j->pts), stats_point_cmp);
    for (size_t i = 0; i < j->npts;) {
        stats_point p = j->pts[i++];
        for (; i < j->npts && j->pts[i].ms == p.ms; i++)
            for (int c = 0; c < STATS_NCOLS; c++)
                p.v[c] += j->pts[i].v[c];
        cJSON *o = cJSON_CreateObject();
        if (!o) {
            cJSON_Delete(d);
            return NULL;
        }
        cJSON_AddItemToArray(arr, o);
        cJSON_AddItemToObject(o, "time", jsonin_time_to_json(p.ms));
        stats_num(o, "issued", stats_issued(p.v));
        stats_num(o, "claim", p.v[SC_issued_claim]);
        stats_num(o, "mq", p.v[SC_issued_mq]);
        stats_num(o, "distribution", p.v[SC_issued_dist]);
        stats_num(o, "exchangeCode", p.v[SC_issued_code]);
        stats_num(o, "used", p.v[SC_used]);
        stats_num(o, "refunded", p.v[SC_refunded]);
        stats_num(o, "expired", p.v[SC_expired]);
        cJSON_AddItemToObject(o, "discountAmount", jsonin_cents_to_json(p.v[SC_discount_cents]));
    }
    return d;
}

/* This database's totals, added to j->tot. */
static qn_status stats_read_totals(pgpool_conn *conn, stats_job *j)
{
    pgparam p = {0};
    pgparam_i64(&p, j->job.id);
    PGresult *r = pgpool_exec(conn, stats_totals_sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    for (int c = 0; c < STATS_NCOLS && PQntuples(r) == 1; c++)
        j->tot[c] += strtoll(PQgetvalue(r, 0, 1 + c), NULL, 10);
    PQclear(r);
    return QN_OK;
}

/* This database's points, appended to j->pts. */
static qn_status stats_read_series(pgpool_conn *conn, stats_job *j)
{
    char sql[sizeof(stats_series_fmt) + sizeof(STATS_DAY_EXPR)];
    pgparam p = {0};
    qn_status st = QN_ERR;
    int day = j->grain == STATS_GRAIN_DAY;
    snprintf(sql, sizeof(sql), stats_series_fmt, day ? STATS_DAY_EXPR : "h");
    pgparam_i64(&p, j->job.id);
    pgparam_i64(&p, j->grain == STATS_GRAIN_MINUTE ? 1 : 2); /* a day is its hours */
    pgparam_i64(&p, j->from_ms);
    pgparam_i64(&p, j->to_ms);
    pgparam_str(&p, j->grain == STATS_GRAIN_MINUTE ? "minute" : "hour");
    if (day)
        pgparam_i64(&p, jsonin_zone_offset_s());
    PGresult *r = pgpool_exec(conn, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    size_t n = (size_t)PQntuples(r);
    if (n > STATS_POINTS_MAX)
        n = STATS_POINTS_MAX; /* not reached: the range bounds the buckets */
    stats_point *pts = realloc(j->pts, (j->npts + n + 1) * sizeof(*pts));
    if (!pts)
        goto done;
    j->pts = pts;
    for (size_t i = 0; i < n; i++) {
        stats_point *pt = &j->pts[j->npts++];
        pt->ms = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        for (int c = 0; c < STATS_NCOLS; c++)
            pt->v[c] = strtoll(PQgetvalue(r, (int)i, 1 + c), NULL, 10);
    }
    st = QN_OK;
done:
    PQclear(r);
    return st;
}

/* Pool worker: one database's part; on the template's database first the template (the
 * caller's shop's, else 404, and its stock); after the last database, the answer. */
static qn_status stats_work(pgpool_conn *conn, void *arg)
{
    stats_job *j = arg;
    if (j->step == 0) {
        tpl t = {0};
        qn_status st = tpl_db_load(conn, j->job.shop, j->job.id, &t);
        j->stock = t.stock;
        tpl_clear(&t);
        if (st == QN_ENOTFOUND) {
            reqjob_fail(&j->job.rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template");
            return QN_OK;
        }
        if (st != QN_OK)
            goto fail;
    }
    if ((j->series ? stats_read_series(conn, j) : stats_read_totals(conn, j)) != QN_OK)
        goto fail;
    if (j->step + 1 < SERVICE_DS_COUNT)
        return QN_OK;
    j->job.rj.data = j->series ? stats_series_json(j) : stats_totals_json(j);
    if (!j->job.rj.data)
        reqjob_fail(&j->job.rj, ERRCODE_INTERNAL, "out of memory");
    return QN_OK;
fail:
    log_error(NULL, "stats: reading template %" PRId64 " on ds_%d failed: %s", j->job.id,
              j->ds[j->step], pgpool_conn_error(conn));
    return reqjob_db_fail(conn);
}

/* Loop thread: the next database, or the answer. */
static void stats_done(qn_status st, void *arg)
{
    stats_job *j = arg;
    if (st != QN_OK || reqjob_failed(&j->job.rj) || ++j->step >= SERVICE_DS_COUNT) {
        reqjob_reply(&j->job.rj, st);
        return;
    }
    madmin_job_submit(&j->job, j->ds[j->step], stats_work, stats_done);
}

/* The job of a stats route (the template id read, the databases ordered); NULL after
 * replying. */
static stats_job *stats_job_start(service *svc, http_req *req)
{
    jsonin_err err = {{0}};
    shard_route r;
    stats_job *j = madmin_job_new(svc, req, sizeof(*j), stats_job_clear);
    if (!j)
        return NULL;
    if (madmin_param_id(req, "couponTemplateId", &j->job.id, &err) != QN_OK) {
        reqjob_reply_error(&j->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return NULL;
    }
    if (shard_route_for("t_coupon_template", j->job.shop, &r) != QN_OK) {
        reqjob_reply_error(&j->job.rj, ERRCODE_INTERNAL, "no shard for the shop");
        return NULL;
    }
    for (int i = 0; i < SERVICE_DS_COUNT; i++)
        j->ds[i] = (r.ds + i) % SERVICE_DS_COUNT;
    return j;
}

static void stats_h_totals(http_req *req, void *arg)
{
    stats_job *j = stats_job_start(arg, req);
    if (j)
        madmin_job_submit(&j->job, j->ds[0], stats_work, stats_done);
}

/* grain, from and to of the series; QN_EINVAL with err set. */
static qn_status stats_series_params(http_req *req, stats_job *j, jsonin_err *err)
{
    const char *g = http_query(req, "grain");
    j->grain = -1;
    if (!g || !*g)
        j->grain = STATS_GRAIN_MINUTE;
    for (int i = 0; g && *g && i < STATS_NGRAINS; i++)
        if (strcmp(g, stats_grains[i].name) == 0)
            j->grain = i;
    if (j->grain < 0) {
        jsonin_errf(err, "grain", "must be minute, hour or day");
        return QN_EINVAL;
    }
    if (jsonin_parse_time_str("to", http_query(req, "to"), JSONIN_OPTIONAL, now_wall_ms(),
                              &j->to_ms, err) != QN_OK ||
        jsonin_parse_time_str("from", http_query(req, "from"), JSONIN_OPTIONAL,
                              j->to_ms - STATS_DAY_MS, &j->from_ms, err) != QN_OK)
        return QN_EINVAL;
    if (j->from_ms > j->to_ms) {
        jsonin_errf(err, "from", "must not be after to");
        return QN_EINVAL;
    }
    if (j->to_ms - j->from_ms > stats_grains[j->grain].max_range_ms) {
        jsonin_errf(err, "to", "at most %s after from for grain %s",
                    stats_grains[j->grain].max_text, stats_grains[j->grain].name);
        return QN_EINVAL;
    }
    /* The bucket holding from is in: a day starts at midnight in the configured zone. */
    int64_t b = stats_grains[j->grain].bucket_ms;
    int64_t off = j->grain == STATS_GRAIN_DAY ? (int64_t)jsonin_zone_offset_s() * 1000 : 0;
    j->from_ms = stats_floor_div(j->from_ms + off, b) * b - off;
    return QN_OK;
}

static void stats_h_series(http_req *req, void *arg)
{
    jsonin_err err = {{0}};
    stats_job *j = stats_job_start(arg, req);
    if (!j)
        return;
    j->series = 1;
    if (stats_series_params(req, j, &err) != QN_OK) {
        reqjob_reply_error(&j->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    madmin_job_submit(&j->job, j->ds[0], stats_work, stats_done);
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
            {0},
        },
    .timers =
        (const service_timer[]){
            {"stats-rollup", offsetof(stats_settings, rollup_ms), stats_on_tick},
            {0},
        },
    .start = stats_start,
};
