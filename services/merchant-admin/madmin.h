/* quan-merchant-admin: what its modules share. Each module (templates.c, tasks.c, codes.c)
 * registers its routes and consumers in its own *_init, called from main.c. */
#ifndef QUAN_MADMIN_H
#define QUAN_MADMIN_H

#include "service.h"

typedef struct madmin_config {
    service_config common;
    /* templates.c */
    int64_t nodup_window_ms;
    int64_t bloom_expected;
    int64_t bloom_fp_per_million;
    /* tasks.c */
    const char *file_root;
    int64_t file_max_bytes;
    int64_t file_timeout_s;
    int64_t task_count_retry_ms; /* the durable row-count fallback fires this long after create */
    /* codes.c */
    const char *code_secret;
} madmin_config;

typedef struct madmin {
    service *svc;
    const madmin_config *cfg;
} madmin;

qn_status madmin_templates_init(madmin *m) QN_MUSTCHECK;
qn_status madmin_tasks_init(madmin *m) QN_MUSTCHECK;
qn_status madmin_codes_init(madmin *m) QN_MUSTCHECK;

/* tasks.c, also used by codes.c: runs sql (bound text params) through a cursor on conn (inside
 * a worker job, outside any transaction of the caller) and writes its rows to an .xlsx in
 * constant memory: a header row of ncols names, then one row per result row; columns whose bit
 * is set in numeric_mask are written as numbers. *out (owned, free()) gets the file's bytes. */
qn_status madmin_xlsx_from_query(pgpool_conn *conn, const char *sheet_name, const char *sql,
                                 int nparams, const char *const *params, const char *const *header,
                                 int ncols, unsigned numeric_mask, char **out,
                                 size_t *out_len) QN_MUSTCHECK;

#endif
