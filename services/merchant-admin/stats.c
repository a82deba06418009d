/*
 * Template statistics of merchant-admin: /coupon-template/stats (a template's totals),
 * /coupon-template/stats/series (per minute, hour or day) and the rollup timer; and what the
 * shop's summary (statsum.c) and a template's export (statexport.c) read their figures with.
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
 * the shop's templates; then the other one (stats_walk).
 *
 * STATS_COLS names the summed columns, STATS_FIELDS the figures the answers and exports give
 * (their names and how each comes from the columns; stats.h): the totals, the summary, the
 * series and the export all go through them.
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

METRICS_DEFINE(STATS_METRICS)

#define STATS_MINUTE_MS   60000LL
#define STATS_HOUR_MS     (60 * STATS_MINUTE_MS)
#define STATS_DAY_MS      (24 * STATS_HOUR_MS)
#define STATS_LOG_EVERY   60   /* a rollup failing every tick is logged once per this many */
#define STATS_ROLL_MIN_MS 1000 /* a tick chains calls for max(this, the interval) at most */
#define STATS_POINTS_MAX  2000 /* per database: the widest range has 1,441 minutes */
#define STATS_MS(n)       "'epoch'::timestamptz + $" #n "::bigint * interval '1 millisecond'"

#define STATS_F_ROW_(key, group, name, series, cents, value) {#key, group, name, series, cents},
const stats_field stats_fields[STATS_NFIELDS] = {STATS_FIELDS(STATS_F_ROW_)};
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
    int64_t rollup_ms;    /* QUAN_STATS_ROLLUP_MS; 0: no rollup timer */
    int64_t rollup_batch; /* QUAN_STATS_ROLLUP_BATCH: deltas one call moves at most */
} stats_settings;

static stats_settings stats_cfg;

/* ================================================================ rollup */

typedef struct stats_rollup {
    int ds;
    const stats_settings *cfg;
    int running;   /* a rollup job of this database is queued or running */
    int64_t moved; /* the job's: deltas moved */
    int64_t fails; /* failures in a row */
    char err[256]; /* the job's: why it failed */
} stats_rollup;

/* The module's context. The pools join the running rollup jobs before the free hook runs. */
typedef struct stats_ctx {
    madmin_ctx head;
    stats_settings cfg;
    stats_rollup rollups[SERVICE_DS_COUNT];
} stats_ctx;

/* Pool worker. A call moves a bounded batch in its own transaction (one statement over the
 * whole backlog could outlast the statement timeout every time and never drain it); called
 * again while a call moved a full batch. */
static qn_status stats_rollup_work(pgpool_conn *conn, void *arg)
{
    stats_rollup *r = arg;
    r->moved = 0;
    r->err[0] = '\0';
    /* Bounded in time, not calls: the connection is one of the pool's that serve requests. */
    int64_t budget = r->cfg->rollup_ms > STATS_ROLL_MIN_MS ? r->cfg->rollup_ms : STATS_ROLL_MIN_MS;
    int64_t until = now_mono_ms() + budget;
    for (;;) {
        pgparam p = {0};
        pgparam_i64(&p, r->cfg->rollup_batch);
        PGresult *res = pgpool_exec(conn, "SELECT quan_template_stat_rollup($1)", p.n, p.v);
        if (!res) {
            snprintf(r->err, sizeof(r->err), "%s", pgpool_conn_error(conn));
            return QN_ERR;
        }
        int64_t n = PQntuples(res) == 1 ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0;
        PQclear(res);
        r->moved += n;
        if (n < r->cfg->rollup_batch || now_mono_ms() >= until)
            break; /* drained, or the next tick goes on */
    }
    return QN_OK;
}

/* Loop thread. A failure is tried again on the next tick; logged once per STATS_LOG_EVERY so
 * that a database down for long does not fill the log. */
static void stats_rollup_done(qn_status st, void *arg)
{
    stats_rollup *r = arg;
    r->running = 0;
    if (r->moved > 0) /* batches committed before a failure moved too */
        metrics_add(&metric_quan_stats_rolled_total, r->moved);
    if (st == QN_OK) {
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
    stats_ctx *ctx = state;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++) {
        stats_rollup *r = &ctx->rollups[ds];
        pgpool *pool = service_pg(ctx->head.svc, ds);
        if (r->running || !pool)
            continue;
        /* A full queue or a pool shutting down: the next tick tries again. */
        if (pgpool_submit(pool, stats_rollup_work, stats_rollup_done, r) == QN_OK)
            r->running = 1;
    }
}

/* ================================================================ reads */

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

static int64_t stats_floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b < 0);
}

/* The figures (SF_x) of the sums v and the stock. */
void stats_values(const int64_t *v, int64_t stock, int64_t *out)
{
#define STATS_F_VALUE_(key, group, name, series, cents, value) out[SF_##key] = (value);
    STATS_FIELDS(STATS_F_VALUE_)
#undef STATS_F_VALUE_
}

/* A figure as the export writes it: a count, or an amount in yuan ("-12.05"). */
void stats_value_text(const stats_field *f, int64_t x, char *buf, size_t len)
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
cJSON *stats_template_json(int64_t id, int64_t shop, const char *name, int status, const int64_t *v,
                           int64_t stock)
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
void stats_series_merge(stats_data *d)
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
qn_status stats_read_totals(pgpool_conn *conn, stats_data *d)
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
qn_status stats_read_series(pgpool_conn *conn, stats_data *d)
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

qn_status stats_tpl_load(pgpool_conn *conn, madmin_job *j, stats_tpl *t)
{
    tpl row = {0};
    qn_status st = tpl_db_load(conn, j->shop, j->id, &row);
    if (st == QN_OK) {
        t->d.id = j->id;
        t->d.stock = row.stock;
        t->status = row.status;
        t->name = row.name;
        row.name = NULL; /* kept */
    } else if (st == QN_ENOTFOUND) {
        reqjob_fail(&j->rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template");
        st = QN_OK;
    }
    tpl_clear(&row);
    return st;
}

void stats_tpl_clear(stats_tpl *t)
{
    free(t->name);
    free(t->d.pts);
}

qn_status stats_series_params(http_req *req, stats_data *d, int first, jsonin_err *err)
{
    return stats_series_range(http_query(req, "grain"), http_query(req, "from"),
                              http_query(req, "to"), first, now_wall_ms(), d, err);
}

qn_status stats_series_range(const char *g, const char *from, const char *to, int first,
                             int64_t now_ms, stats_data *d, jsonin_err *err)
{
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
    if (jsonin_parse_time_str("to", to, JSONIN_OPTIONAL, now_ms, &d->to_ms, err) != QN_OK ||
        jsonin_parse_time_str("from", from, JSONIN_OPTIONAL, d->to_ms - STATS_DAY_MS, &d->from_ms,
                              err) != QN_OK)
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
void *stats_walk_new(const madmin_ctx *mod, http_req *req, size_t size, void (*clear)(reqjob *j),
                     pgpool_work_fn work)
{
    shard_route r;
    stats_walk *w = madmin_job_new(mod, req, size, clear);
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

void stats_walk_start(stats_walk *w)
{
    madmin_job_submit(&w->job, w->ds[0], w->work, stats_walk_done);
}

/* The end of a work function: out of memory is a 500; a database failure is logged (what, id)
 * and answered as reqjob_db_fail. */
qn_status stats_work_end(pgpool_conn *conn, stats_walk *w, qn_status st, const char *what,
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
    stats_tpl t;
} stats_job;

static void stats_job_clear(reqjob *rj)
{
    stats_tpl_clear(&((stats_job *)rj)->t);
}

/* Pool worker: one database's part; on the template's database first the template (the
 * caller's shop's, else 404, and its stock); after the last database, the answer. */
static qn_status stats_work(pgpool_conn *conn, void *arg)
{
    stats_job *j = arg;
    stats_data *d = &j->t.d;
    qn_status st = QN_OK;
    if (j->w.step == 0 &&
        ((st = stats_tpl_load(conn, &j->w.job, &j->t)) != QN_OK || reqjob_failed(&j->w.job.rj)))
        goto out;
    if ((st = j->series ? stats_read_series(conn, d) : stats_read_totals(conn, d)) != QN_OK)
        goto out;
    if (j->w.step + 1 < SERVICE_DS_COUNT)
        return QN_OK;
    j->w.job.rj.data = j->series ? stats_series_json(d)
                                 : stats_template_json(j->w.job.id, j->w.job.shop, j->t.name,
                                                       j->t.status, d->tot, d->stock);
    if (!j->w.job.rj.data)
        st = QN_ENOMEM;
out:
    return stats_work_end(conn, &j->w, st, "template", j->w.job.id);
}

/* The job of a one-template route (the template id read); NULL after replying. */
static stats_job *stats_job_start(const stats_ctx *ctx, http_req *req)
{
    jsonin_err err = {{0}};
    stats_job *j = stats_walk_new(&ctx->head, req, sizeof(*j), stats_job_clear, stats_work);
    if (!j)
        return NULL;
    if (madmin_param_id(req, "couponTemplateId", &j->w.job.id, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return NULL;
    }
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
    if (stats_series_params(req, &j->t.d, STATS_GRAIN_MINUTE, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    stats_walk_start(&j->w);
}

/* ================================================================ the module */

static qn_status stats_start(service *s, void **state)
{
    qn_status st = madmin_ctx_new(s, sizeof(stats_ctx), state);
    if (st != QN_OK)
        return st;
    stats_ctx *ctx = *state;
    ctx->cfg = stats_cfg;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++) {
        ctx->rollups[ds].ds = ds;
        ctx->rollups[ds].cfg = &ctx->cfg;
    }
    return QN_OK;
}

static const config_var stats_vars[] = {
    {"QUAN_STATS_ROLLUP_MS", CONFIG_INT, offsetof(stats_settings, rollup_ms), "1000", 0, 3600000,
     NULL, 0,
     "how often the template statistics' deltas are rolled up on each database (0: never; the "
     "answers stay exact, the deltas only pile up)"},
    {"QUAN_STATS_ROLLUP_BATCH", CONFIG_INT, offsetof(stats_settings, rollup_batch), "50000", 1,
     1000000, NULL, 0,
     "deltas one rollup call moves at most, in one transaction within the statement timeout (a "
     "tick calls again while a call moved a full batch)"},
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
    .metrics = (metrics_family *const[]){METRICS_REFS(STATS_METRICS) NULL},
    .start = stats_start,
    .free = madmin_ctx_free,
};
