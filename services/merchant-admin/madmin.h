/* quan-merchant-admin: what its modules share. Each module (templates.c, tasks.c, codes.c, ...)
 * exports one descriptor, declared in its own header (service_module: its settings and their
 * struct, routes, queues and consumers, start and free hooks); main.c lists them. madmin.c
 * holds what they share: the head of their contexts, the shop-scoped request job, its checks
 * and the paged answer. */
#ifndef QUAN_MADMIN_H
#define QUAN_MADMIN_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "jsonin.h"
#include "pgparam.h"
#include "reqjob.h"
#include "service.h"

/* ------------------------------------------------------------------ contexts
 * Each module owns its context (nginx's module contexts): its start hook makes it, its routes'
 * handlers, its consumers and its timers get it as arg, and its free hook frees it. Every
 * context starts with this head, so the shared machinery below (jobs, exports, the statistics'
 * walk) takes any module's. */
typedef struct madmin_ctx {
    service *svc; /* the binary's handles (pools, Redis, ids) */
} madmin_ctx;

/* A zeroed context of size bytes (madmin_ctx first) for the module starting in s, in *state at
 * once, so that the module's free hook gets it even when the rest of its start fails.
 * QN_ENOMEM. */
qn_status madmin_ctx_new(service *s, size_t size, void **state) QN_MUSTCHECK;
/* The free hook of a module whose context holds nothing else to free (NULL tolerated). */
void madmin_ctx_free(void *state);

/* ------------------------------------------------------------------ madmin.c
 * What the request modules share: the shop-scoped request job, the checks they make alike, and
 * the answer of a page. */

/* An id parameter (body or query, JSON number or decimal string), 1..INT64_MAX; err names it. */
qn_status madmin_param_id(http_req *req, const char *name, int64_t *out,
                          jsonin_err *err) QN_MUSTCHECK;

/* The head of every job struct of the modules that work in the database (its first member): one
 * request of the caller's shop, through pool workers to its reply (reqjob.h: who owns and frees
 * it).
 * Every read and write of the job is scoped to shop. */
typedef struct madmin_job madmin_job;
struct madmin_job {
    reqjob rj;             /* first: the request and the reply being prepared */
    const madmin_ctx *ctx; /* the context of the module whose route made it */
    int64_t shop;          /* req's shop number */
    int64_t id; /* the resource the request names (madmin_job_by_id), else the module's */
};

/* A zeroed job of size bytes (the enclosing struct) for req (reqjob_new), of the module whose
 * context is ctx. */
void *madmin_job_new(const madmin_ctx *ctx, http_req *req, size_t size,
                     void (*clear)(reqjob *j)) QN_MUSTCHECK;
/* Appends j's resource id and shop: $1 and $2 of the statements that read the one row the
 * request names, of its shop. */
void madmin_job_params(pgparam *p, const madmin_job *j);
/* reqjob_submit on database ds. */
void madmin_job_submit(madmin_job *j, int ds, pgpool_work_fn work, pgpool_done_fn done);
/* madmin_job_submit on the database of the shard holding j's shop's templates (500 when there
 * is none): where create checks its template. */
void madmin_job_submit_tpl_shard(madmin_job *j, pgpool_work_fn work, pgpool_done_fn done);
/* The handler of a route naming one resource: a job of size bytes whose id is the parameter
 * id_name (400 when invalid), then work on ds and the reply (reqjob_done). */
void madmin_job_by_id(const madmin_ctx *ctx, http_req *req, size_t size, void (*clear)(reqjob *j),
                      const char *id_name, int ds, pgpool_work_fn work);

/* Inside a work function: the template tpl_id is j's shop's and active. QN_OK with an error
 * reply (404 / 409) set when not; a database failure as reqjob_db_fail. */
qn_status madmin_tpl_check(pgpool_conn *conn, madmin_job *j, int64_t tpl_id) QN_MUSTCHECK;

/* ------------------------------------------------------------------ pages
 * The lists (templates, tasks, the statistics' summary) are answered a page at a time. */

#define MADMIN_PAGE_MAX   1000000   /* the last page one may ask for */
#define MADMIN_SIZE_MAX   100       /* rows of a page */
#define MADMIN_SIZE_ASKED INT32_MAX /* the largest size MADMIN_SIZE_CAP accepts, then caps */

/* What madmin_page_parse does with a size over MADMIN_SIZE_MAX. */
enum {
    MADMIN_SIZE_REFUSE = 0, /* a 400 (tasks, the summary) */
    MADMIN_SIZE_CAP = 1,    /* MADMIN_SIZE_MAX instead (the template page, as the reference) */
};

typedef struct madmin_page {
    int64_t current; /* 1.. */
    int64_t size;    /* 1..MADMIN_SIZE_MAX */
} madmin_page;

/* `current` (1 when absent, 1..MADMIN_PAGE_MAX) and `size` (10 when absent) of a list from their
 * texts (NULL or "": absent); size over MADMIN_SIZE_MAX as over_max says. QN_EINVAL with err set
 * (out untouched). */
qn_status madmin_page_parse(const char *current, const char *size, int over_max, madmin_page *out,
                            jsonin_err *err) QN_MUSTCHECK;
/* The rows before the page. */
int64_t madmin_page_offset(const madmin_page *pg);
/* The pages total rows fill at size rows each (0 when there are none). */
int64_t madmin_page_count(int64_t total, int64_t size);

/* The answer of a page: {records, total, size, current, pages}. Takes records (an array); NULL,
 * records freed, when out of memory or records is NULL. */
cJSON *madmin_page_json(cJSON *records, int64_t total, const madmin_page *pg) QN_MUSTCHECK;

#endif
