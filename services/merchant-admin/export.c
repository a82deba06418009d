/* Streamed exports: see export.h. Threads: the page jobs run on a pool (one at a time per
 * export: the encoder is only ever touched by one thread); everything else, the client's
 * callbacks included, runs on the loop thread. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <event2/buffer.h>
#include <libpq-fe.h>

#include "export.h"
#include "log.h"
#include "pgparam.h"
#include "shard.h"

struct export_ctx {
    madmin_ctx head;
    int active; /* exports running (their jobs not freed yet) */
};

static void export_clear(reqjob *j)
{
    export_job *e = (export_job *)j;
    if (e->spec && e->spec->clear)
        e->spec->clear(e);
    xlsxout_free(e->x);
    csvout_free(e->c);
    if (e->out)
        evbuffer_free(e->out);
    e->exports->active--;
}

/* The encoder's output: kept until the loop hands it to the client. */
static qn_status export_sink(void *arg, const void *data, size_t len)
{
    export_job *e = arg;
    return evbuffer_add(e->out, data, len) == 0 ? QN_OK : QN_ENOMEM;
}

qn_status export_row(export_job *e, const char *const *cells, unsigned numeric_mask)
{
    e->rows++;
    if (e->format == EXPORT_CSV)
        return csvout_row(e->c, cells);
    return xlsxout_row(e->x, cells, numeric_mask);
}

/* Worker: the next keyset page, encoded. */
static qn_status export_page_sql(pgpool_conn *conn, export_job *e)
{
    const export_spec *sp = e->spec;
    const char *cells[EXPORT_COLS_MAX];
    pgparam p = {0};
    for (int i = 0; i < sp->nfixed; i++)
        pgparam_i64(&p, e->fixed[i]);
    for (int i = 0; i < sp->nkey; i++)
        pgparam_str(&p, e->key[i]);
    pgparam_i64(&p, EXPORT_PAGE_ROWS);
    PGresult *r = pgpool_exec(conn, sp->page_sql, p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    int n = PQntuples(r);
    qn_status st = QN_OK;
    for (int i = 0; i < n && st == QN_OK; i++) {
        for (int c = 0; c < sp->ncols; c++)
            cells[c] = PQgetisnull(r, i, c) ? NULL : PQgetvalue(r, i, c);
        st = export_row(e, cells, sp->numeric_mask);
    }
    for (int k = 0; k < sp->nkey && n > 0; k++)
        snprintf(e->key[k], sizeof(e->key[k]), "%s", PQgetvalue(r, n - 1, sp->ncols + k));
    PQclear(r);
    e->last = n < EXPORT_PAGE_ROWS;
    return st;
}

/* Worker: the next page, encoded; after the last one the file is closed. */
static qn_status export_page(pgpool_conn *conn, export_job *e)
{
    qn_status st = e->spec->page ? e->spec->page(conn, e) : export_page_sql(conn, e);
    if (st != QN_OK || !e->last)
        return st;
    st = e->format == EXPORT_CSV ? csvout_close(e->c) : xlsxout_close(e->x);
    e->closed = 1;
    return st;
}

/* Worker: the request's checks, the workbook's start and the first page. */
static qn_status export_first_work(pgpool_conn *conn, void *arg)
{
    export_job *e = arg;
    const export_spec *sp = e->spec;
    qn_status st = sp->prepare(conn, e);
    if (st != QN_OK || reqjob_failed(&e->job.rj))
        return st;
    if (e->format == EXPORT_CSV)
        st = csvout_open(export_sink, e, sp->header, sp->ncols, &e->c);
    else
        st = xlsxout_open(export_sink, e, sp->sheet_name, sp->header, sp->ncols, &e->x);
    return st == QN_OK ? export_page(conn, e) : st;
}

static qn_status export_next_work(pgpool_conn *conn, void *arg)
{
    return export_page(conn, arg);
}

/* The end of a started export: the answer is finished (complete) or cut, and all is freed. */
static void export_end(export_job *e, bool complete)
{
    log_info(&e->job.rj.req->log, "export %s: %" PRId64 " rows%s", e->filename, e->rows,
             complete ? "" : ", stopped");
    http_stream_end(e->job.rj.req, complete);
    e->job.rj.req = NULL; /* answered by the stream's end */
    reqjob_free(&e->job.rj);
}

static void export_done(qn_status st, void *arg);

/* The next page now, or once the client has taken what waits in the output buffer. */
static void export_more(export_job *e)
{
    if (http_stream_pending(e->job.rj.req) > EXPORT_WATERMARK) {
        e->waiting = 1;
        return;
    }
    e->waiting = 0;
    e->busy = 1;
    qn_status st =
        pgpool_submit(service_pg(e->job.ctx->svc, e->ds), export_next_work, export_done, e);
    if (st != QN_OK) {
        e->busy = 0;
        log_warn(&e->job.rj.req->log, "export %s: no page job (%s)", e->filename,
                 qn_status_str(st));
        export_end(e, false);
    }
}

static void export_on_drained(http_req *req, void *arg)
{
    (void)req;
    export_job *e = arg;
    if (e->waiting && !e->busy)
        export_more(e);
}

static void export_on_gone(http_req *req, void *arg)
{
    (void)req;
    export_job *e = arg;
    if (e->busy)
        e->gone = 1; /* the page job's end stops it */
    else
        export_end(e, false);
}

/* Loop: a page job's end. */
static void export_done(qn_status st, void *arg)
{
    export_job *e = arg;
    e->busy = 0;
    if (!e->started) {
        if (st != QN_OK || reqjob_failed(&e->job.rj)) {
            reqjob_reply(&e->job.rj, st);
            return;
        }
        int csv = e->format == EXPORT_CSV;
        char disp[160];
        snprintf(disp, sizeof(disp), "attachment; filename=\"%s.%s\"", e->filename,
                 csv ? "csv" : "xlsx");
        const char *const headers[] = {"Content-Disposition", disp, NULL};
        if (http_stream_start(e->job.rj.req, 200, csv ? CSVOUT_CONTENT_TYPE : XLSXOUT_CONTENT_TYPE,
                              headers, export_on_drained, export_on_gone, e) != QN_OK) {
            reqjob_reply(&e->job.rj, QN_ERR); /* timed out meanwhile: nobody hears it */
            return;
        }
        e->started = 1;
    }
    if (e->gone) {
        export_end(e, false);
    } else if (st != QN_OK) {
        log_warn(&e->job.rj.req->log, "export %s: a page failed after %" PRId64 " rows (%s)",
                 e->filename, e->rows, qn_status_str(st));
        export_end(e, false);
    } else if (evbuffer_get_length(e->out) > 0 && /* a page may have made no bytes */
               http_stream_write(e->job.rj.req, e->out) != QN_OK) {
        export_end(e, false);
    } else if (e->closed) {
        export_end(e, true);
    } else {
        export_more(e);
    }
}

qn_status export_format_parse(const char *f, export_format *out, jsonin_err *err)
{
    if (!f || !*f || strcmp(f, "xlsx") == 0) {
        *out = EXPORT_XLSX;
        return QN_OK;
    }
    if (strcmp(f, "csv") == 0) {
        *out = EXPORT_CSV;
        return QN_OK;
    }
    jsonin_errf(err, "format", "must be xlsx or csv");
    return QN_EINVAL;
}

void export_by_id(const madmin_ctx *mod, export_ctx *exports, http_req *req, const char *id_name,
                  const export_spec *spec)
{
    jsonin_err err = {{0}};
    shard_route r;
    if (exports->active >= EXPORT_MAX_ACTIVE) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "too many exports at once, try again");
        return;
    }
    export_job *e = madmin_job_new(mod, req, spec->size ? spec->size : sizeof(*e), export_clear);
    if (!e)
        return;
    exports->active++; /* export_clear gives it back */
    e->exports = exports;
    e->spec = spec;
    e->ds = spec->ds;
    for (int k = 0; k < spec->nkey; k++)
        snprintf(e->key[k], sizeof(e->key[k]), "%s", spec->key_start[k]);
    if (!(e->out = evbuffer_new())) {
        reqjob_reply_error(&e->job.rj, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    if (madmin_param_id(req, id_name, &e->job.id, &err) != QN_OK ||
        (spec->csv && export_format_parse(http_query(req, "format"), &e->format, &err) != QN_OK) ||
        (spec->params && spec->params(req, e, &err) != QN_OK)) {
        reqjob_reply_error(&e->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    if (spec->ds == EXPORT_DS_TPL) {
        if (shard_route_for("t_coupon_template", e->job.shop, &r) != QN_OK) {
            reqjob_reply_error(&e->job.rj, ERRCODE_INTERNAL, "no shard for the shop");
            return;
        }
        e->ds = r.ds;
    }
    e->busy = 1;
    madmin_job_submit(&e->job, e->ds, export_first_work, export_done);
}

/* ------------------------------------------------------------------ the module */

static qn_status export_start(service *s, void **state)
{
    return madmin_ctx_new(s, sizeof(export_ctx), state);
}

qn_status export_ctx_of(service *s, export_ctx **out)
{
    if (!(*out = service_module_state(s, &export_module))) {
        log_error(NULL, "export: the module is not started before a module that exports");
        return QN_ERR;
    }
    return QN_OK;
}

const service_module export_module = {
    .name = "export",
    .start = export_start,
    .free = madmin_ctx_free,
};
