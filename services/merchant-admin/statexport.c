/*
 * A template's statistics as a file, of merchant-admin: /coupon-template/stats/export, the
 * template's totals and its series per hour or day (stats.h's figures), as .xlsx or .csv
 * through export.c: the template checked on the shop's template database, then each database's
 * totals and points read in turn, and the file written after the last.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "statexport.h"
#include "export.h"
#include "jsonin.h"
#include "log.h"
#include "madmin.h"
#include "stats.h"

/* The totals' columns (a header row and the template's row), then a header row of the series'
 * columns and a row per bucket, fewer cells. */
#define STATEXPORT_KEY_(key, group, name, series, cents, value) #key,
static const char *const statexport_header[] = {"couponTemplateId", "shopNumber", "name", "status",
                                                STATS_FIELDS(STATEXPORT_KEY_)};
#undef STATEXPORT_KEY_
enum { STATEXPORT_FIXED = 4, STATEXPORT_COLS = STATEXPORT_FIXED + STATS_NFIELDS };
_Static_assert(STATEXPORT_COLS <= EXPORT_COLS_MAX, "the export's columns");
_Static_assert(sizeof(statexport_header) / sizeof(statexport_header[0]) == STATEXPORT_COLS,
               "the export's header");

/* The module's context: the service and the exports' bound (export_module's). */
typedef struct statexport_ctx {
    madmin_ctx head;
    export_ctx *exports;
} statexport_ctx;

typedef struct statexport_job {
    export_job e; /* first; e.job.id is the template */
    int read;     /* databases read */
    stats_tpl t;
} statexport_job;

static void statexport_clear(export_job *e)
{
    stats_tpl_clear(&((statexport_job *)e)->t);
}

static qn_status statexport_params(http_req *req, export_job *e, jsonin_err *err)
{
    return stats_series_params(req, &((statexport_job *)e)->t.d, STATS_GRAIN_HOUR, err);
}

/* A database failure: logged, the file cut (or never started). */
static qn_status statexport_db_fail(pgpool_conn *conn, export_job *e)
{
    log_error(NULL, "stats: reading template %" PRId64 " on ds_%d failed: %s", e->job.id, e->ds,
              pgpool_conn_error(conn));
    return reqjob_db_fail(conn);
}

/* On the shop's template database: the template is the caller's shop's (else 404). */
static qn_status statexport_prepare(pgpool_conn *conn, export_job *e)
{
    qn_status st = stats_tpl_load(conn, &e->job, &((statexport_job *)e)->t);
    if (st != QN_OK)
        return statexport_db_fail(conn, e);
    snprintf(e->filename, sizeof(e->filename), "template-%" PRId64 "-stats", e->job.id);
    return QN_OK;
}

/* Every row of the file, once every database is read. */
static qn_status statexport_rows(statexport_job *x)
{
    const char *cells[STATEXPORT_COLS] = {0};
    char text[STATEXPORT_COLS][32];
    int64_t f[STATS_NFIELDS];
    int n = 0;
    stats_values(x->t.d.tot, x->t.d.stock, f);
    snprintf(text[0], sizeof(text[0]), "%" PRId64, x->e.job.id);
    snprintf(text[1], sizeof(text[1]), "%" PRId64, x->e.job.shop);
    snprintf(text[3], sizeof(text[3]), "%d", x->t.status);
    cells[0] = text[0];
    cells[1] = text[1];
    cells[2] = x->t.name;
    cells[3] = text[3];
    for (int i = 0; i < STATS_NFIELDS; i++) {
        stats_value_text(&stats_fields[i], f[i], text[STATEXPORT_FIXED + i], sizeof(text[0]));
        cells[STATEXPORT_FIXED + i] = text[STATEXPORT_FIXED + i];
    }
    /* ids stay text (a spreadsheet keeps 15 digits of a number); the figures are numbers */
    qn_status st = export_row(&x->e, cells, ((1u << STATEXPORT_COLS) - 1) & ~7u);
    memset(cells, 0, sizeof(cells));
    cells[n++] = "time";
    for (int i = 0; i < STATS_NFIELDS; i++)
        if (stats_fields[i].series)
            cells[n++] = stats_fields[i].series;
    if (st == QN_OK)
        st = export_row(&x->e, cells, 0);
    stats_series_merge(&x->t.d);
    for (size_t p = 0; p < x->t.d.npts && st == QN_OK; p++) {
        jsonin_time_format(x->t.d.pts[p].ms, text[0]);
        cells[0] = text[0];
        stats_values(x->t.d.pts[p].v, 0, f);
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
static qn_status statexport_page(pgpool_conn *conn, export_job *e)
{
    statexport_job *x = (statexport_job *)e;
    qn_status st = stats_read_totals(conn, &x->t.d);
    if (st == QN_OK)
        st = stats_read_series(conn, &x->t.d);
    if (st == QN_ERR)
        return statexport_db_fail(conn, e);
    if (st != QN_OK)
        return st;
    if (++x->read < SERVICE_DS_COUNT) {
        e->ds = (e->ds + 1) % SERVICE_DS_COUNT; /* the shop's template database came first */
        return QN_OK;
    }
    e->last = 1;
    return statexport_rows(x);
}

static const export_spec statexport_spec = {
    .ds = EXPORT_DS_TPL,
    .csv = 1,
    .size = sizeof(statexport_job),
    .clear = statexport_clear,
    .sheet_name = "statistics",
    .header = statexport_header,
    .ncols = STATEXPORT_COLS,
    .params = statexport_params,
    .prepare = statexport_prepare,
    .page = statexport_page,
};

static void statexport_h_export(http_req *req, void *arg)
{
    statexport_ctx *ctx = arg;
    export_by_id(&ctx->head, ctx->exports, req, "couponTemplateId", &statexport_spec);
}

static qn_status statexport_start(service *s, void **state)
{
    qn_status st = madmin_ctx_new(s, sizeof(statexport_ctx), state);
    if (st != QN_OK)
        return st;
    statexport_ctx *ctx = *state;
    return export_ctx_of(s, &ctx->exports);
}

const service_module statexport_module = {
    .name = "statexport",
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats/export", statexport_h_export,
             HTTP_NEED_SHOP},
            {0},
        },
    .start = statexport_start,
    .free = madmin_ctx_free,
};
