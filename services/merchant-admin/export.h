/*
 * Streamed .xlsx exports of merchant-admin (a batch's exchange codes, a task's failure
 * report): however many rows, the answer starts as soon as the request is checked and the file
 * follows in chunks, so that no export ever meets the request timeout and memory stays bounded.
 *
 * The rows are read a page at a time (a keyset: each page starts after the key of the last row
 * sent), each page by its own pool job that also encodes it (xlsxout, deflate), so no database
 * connection is held while the client reads. On the loop, a page's bytes go to the client
 * (http_stream_write); the next page is asked for only while the connection's output buffer
 * is below EXPORT_WATERMARK, otherwise when it has drained: a slow client pauses the export. A
 * client that goes away stops it (after the page in hand, if any) and everything is freed.
 * At most EXPORT_MAX_ACTIVE exports run at once (then 503), each holding one page and the
 * deflate state.
 */
#ifndef QUAN_MADMIN_EXPORT_H
#define QUAN_MADMIN_EXPORT_H

#include "madmin.h"
#include "xlsxout.h"

#define EXPORT_FIXED_MAX  4
#define EXPORT_KEY_MAX    2
#define EXPORT_COLS_MAX   8
#define EXPORT_PAGE_ROWS  5000
#define EXPORT_WATERMARK  (256u << 10)
#define EXPORT_MAX_ACTIVE 8

typedef struct export_job export_job;

/* One kind of export; static. */
typedef struct export_spec {
    int ds; /* the database it reads */
    const char *sheet_name;
    const char *const *header; /* ncols column names */
    int ncols;                 /* 1..EXPORT_COLS_MAX */
    unsigned numeric_mask;     /* bit c: column c is a number */
    /* A page, in key order: $1..$nfixed the fixed parameters (set by prepare), then nkey
     * parameters, the key of the last row sent (key_start before the first page), then the
     * page size. Its rows: the ncols columns, then the nkey key columns. */
    const char *page_sql;
    int nfixed, nkey;
    const char *const *key_start;
    /* On a pool worker before the first page: checks the request (with e->job's shop and id),
     * fills e->fixed and e->filename, or sets an error reply on e->job. A database failure as
     * reqjob_db_fail. */
    qn_status (*prepare)(pgpool_conn *conn, export_job *e);
} export_spec;

struct export_job {
    madmin_job job;
    int64_t fixed[EXPORT_FIXED_MAX]; /* prepare's */
    char filename[96];               /* prepare's: the attachment's name */
    /* ---- private to export.c ---- */
    const export_spec *spec;
    char key[EXPORT_KEY_MAX][24];
    xlsxout *x;
    struct evbuffer *out; /* bytes made by the page job, not yet handed to the client */
    int64_t rows;
    int started; /* the answer has begun */
    int busy;    /* a page job is running */
    int waiting; /* paused until the client drains the output buffer */
    int last;    /* the file is complete in out */
    int gone;    /* the client went away while a page job ran */
};

/* The handler of an export route: the resource named by the parameter id_name (400 when
 * invalid) becomes the job's id, then spec's prepare and pages follow. */
void export_by_id(service *svc, http_req *req, const char *id_name, const export_spec *spec);

#endif
