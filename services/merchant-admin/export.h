/*
 * Streamed exports of merchant-admin (a batch's exchange codes, a task's failure report, a
 * template's statistics), as .xlsx or .csv: however many rows, the answer starts as soon as the
 * request is checked and the file follows in chunks, so that no export ever meets the request
 * timeout and memory stays bounded.
 *
 * The rows are read a page at a time, each page by its own pool job that also encodes it
 * (xlsxout with deflate, or csvout), so no database connection is held while the client reads.
 * A page is a keyset (page_sql: each page starts after the key of the last row sent) or the
 * spec's own page function (its rows through export_row; it may read another database for the
 * next page). On the loop, a page's bytes go to the client (http_stream_write); the next page
 * is asked for only while the connection's output buffer is below EXPORT_WATERMARK, otherwise
 * when it has drained: a slow client pauses the export. A client that goes away stops it
 * (after the page in hand, if any) and everything is freed. At most EXPORT_MAX_ACTIVE exports
 * run at once (then 503), each holding one page and the encoder's state.
 *
 * That bound is the process's, whichever module exports: it is the context of export_module,
 * listed in main.c before the modules that export (tasks, codes, statexport), whose start hooks
 * take it with service_module_state.
 */
#ifndef QUAN_MADMIN_EXPORT_H
#define QUAN_MADMIN_EXPORT_H

#include "csvout.h"
#include "madmin.h"
#include "xlsxout.h"

#define EXPORT_FIXED_MAX  4
#define EXPORT_KEY_MAX    2
#define EXPORT_COLS_MAX   32 /* numeric_mask has a bit per column */
#define EXPORT_PAGE_ROWS  5000
#define EXPORT_WATERMARK  (256u << 10)
#define EXPORT_MAX_ACTIVE 8
#define EXPORT_DS_TPL     (-1) /* export_spec.ds: the database of the shop's templates */

typedef struct export_job export_job;
/* The exports running in the process (export_module's context); loop thread only. */
typedef struct export_ctx export_ctx;

/* No route of its own: its context, the exports' bound. */
extern const service_module export_module;
/* export_module's context, for the start hook of a module that exports; QN_ERR (logged) when
 * the binary does not list export_module before that module. */
qn_status export_ctx_of(service *s, export_ctx **out) QN_MUSTCHECK;

typedef enum export_format { EXPORT_XLSX, EXPORT_CSV } export_format;

/* One kind of export; static. */
typedef struct export_spec {
    int ds;      /* the database of the first job (and of every page unless page moves e->ds) */
    int csv;     /* the `format` parameter is read: xlsx (the default) or csv; else always xlsx */
    size_t size; /* the job's struct, export_job its first member (0: just export_job) */
    void (*clear)(export_job *e); /* frees what the larger struct holds; NULL: nothing */
    const char *sheet_name;
    const char *const *header; /* ncols column names */
    int ncols;                 /* 1..EXPORT_COLS_MAX: every row has ncols cells */
    unsigned numeric_mask;     /* page_sql's rows: bit c, column c is a number */
    /* On the loop before the first job: the request's other parameters into the job; not QN_OK
     * with err set: 400. NULL: none. */
    qn_status (*params)(http_req *req, export_job *e, jsonin_err *err);
    /* On a pool worker before the first page: checks the request (with e->job's shop and id),
     * fills e->fixed and e->filename, or sets an error reply on e->job. A database failure as
     * reqjob_db_fail. */
    qn_status (*prepare)(pgpool_conn *conn, export_job *e);
    /* A page, in key order: $1..$nfixed the fixed parameters (set by prepare), then nkey
     * parameters, the key of the last row sent (key_start before the first page), then the
     * page size. Its rows: the ncols columns, then the nkey key columns. */
    const char *page_sql;
    int nfixed, nkey;
    const char *const *key_start;
    /* Instead of page_sql: on a pool worker of database e->ds, the next rows through
     * export_row, e->last set with the last of them (a page may have none); it may set e->ds
     * for the next page. The first page runs in prepare's job. A database failure as
     * reqjob_db_fail (the file is cut). */
    qn_status (*page)(pgpool_conn *conn, export_job *e);
} export_spec;

struct export_job {
    madmin_job job;
    int64_t fixed[EXPORT_FIXED_MAX]; /* prepare's */
    char filename[96];               /* prepare's: the attachment's name, without extension */
    int ds;                          /* the database of the next job (see page) */
    int last;                        /* the last rows are written: the file is closed after */
    export_format format;
    /* ---- private to export.c ---- */
    export_ctx *exports;
    const export_spec *spec;
    char key[EXPORT_KEY_MAX][24];
    xlsxout *x;
    csvout *c;
    struct evbuffer *out; /* bytes made by the page job, not yet handed to the client */
    int64_t rows;
    int started; /* the answer has begun */
    int busy;    /* a page job is running */
    int waiting; /* paused until the client drains the output buffer */
    int closed;  /* the file is complete in out */
    int gone;    /* the client went away while a page job ran */
};

/* The handler of an export route of the module whose context is mod: the resource named by the
 * parameter id_name (400 when invalid) becomes the job's id; `format` when spec->csv, and
 * spec's params, are read (400); then spec's prepare and pages follow. exports: export_module's
 * context (503 when EXPORT_MAX_ACTIVE are running). */
void export_by_id(const madmin_ctx *mod, export_ctx *exports, http_req *req, const char *id_name,
                  const export_spec *spec);

/* `format` from its text (NULL or "": absent): xlsx (the default) or csv. QN_EINVAL with err
 * set. */
qn_status export_format_parse(const char *format, export_format *out, jsonin_err *err) QN_MUSTCHECK;

/* In a page function: one row of the spec's ncols cells (NULL: empty) into the file; bit c of
 * numeric_mask: cell c is a number in .xlsx (when its text is one). */
qn_status export_row(export_job *e, const char *const *cells, unsigned numeric_mask) QN_MUSTCHECK;

#endif
