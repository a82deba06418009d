/* quan-merchant-admin: what its modules share. Each module (templates.c, tasks.c, codes.c)
 * registers its routes and consumers in its own *_init, called from main.c; madmin.c owns the
 * request plumbing tasks.c and codes.c share (declared at the end). */
#ifndef QUAN_MADMIN_H
#define QUAN_MADMIN_H

#include "jsonin.h"
#include "nodup.h"
#include "service.h"

typedef struct madmin_config {
    service_config common;
    /* templates.c */
    int64_t bloom_expected;
    int64_t bloom_fp_per_million;
    /* tasks.c */
    const char *file_root;
    int64_t file_max_bytes;
    int64_t file_timeout_s;
    int file_allow_internal;
    int64_t task_count_retry_ms; /* the durable row-count fallback fires this long after create */
    /* codes.c */
    const char *code_secret;
} madmin_config;

typedef struct madmin {
    service *svc;
    const madmin_config *cfg;
    nodup *nd;   /* duplicate-submit guard (nodup.h): template and task create, increase-number */
    int exports; /* streamed exports running (export.c; loop thread only) */
} madmin;

/* The shared parts (the duplicate-submit guard, freed by the service); first. */
qn_status madmin_init(madmin *m) QN_MUSTCHECK;
/* templates.c: the template routes, the template.ended consumer, the bloom filter settings. */
extern const service_module madmin_templates_module;
qn_status madmin_tasks_init(madmin *m) QN_MUSTCHECK;
qn_status madmin_codes_init(madmin *m) QN_MUSTCHECK;

/* ------------------------------------------------------------------ madmin.c
 * What tasks.c and codes.c share: a request's job through a pgpool worker to its reply. */

/* Wall-clock milliseconds since the epoch. */
int64_t madmin_now_ms(void);

/* Status of a failed statement inside a work function: a dead connection is QN_EAGAIN (503). */
qn_status madmin_db_fail(pgpool_conn *conn) QN_MUSTCHECK;

/* An id parameter (body or query, JSON number or decimal string), 1..INT64_MAX; err names it. */
qn_status madmin_param_id(http_req *req, const char *name, int64_t *out,
                          jsonin_err *err) QN_MUSTCHECK;

/* The answer a worker job prepares for its request. */
typedef struct madmin_reply {
    int status;       /* 0: success (data), else an error reply */
    const char *code; /* error code */
    char msg[256];
    cJSON *data; /* owned until replied */
} madmin_reply;

void madmin_reply_set(madmin_reply *r, int status, const char *code, const char *msg);
/* Replies from a job's outcome (st: the work function's status: QN_EAGAIN 503, other errors
 * 500), then frees r's data (r itself is borrowed). */
void madmin_reply_send(http_req *req, qn_status st, madmin_reply *r);

/* The head of every job struct of tasks.c / codes.c (its first member): one request of the
 * caller's shop. Every read and write of the job is scoped to shop. */
typedef struct madmin_job madmin_job;
struct madmin_job {
    madmin *m;
    http_req *req;
    int64_t shop; /* req's shop number */
    int64_t id;   /* the resource the request names (madmin_job_by_id), else the module's */
    char request_id[HTTP_REQUEST_ID_MAX + 1]; /* req's, for the events the job writes */
    char traceparent[HTTP_TRACEPARENT_LEN];
    madmin_reply reply;
    void (*clear)(madmin_job *j); /* frees the enclosing struct's own fields; may be NULL */
};

/* A zeroed job of size bytes (the enclosing struct) for req; NULL after replying 500 when out
 * of memory. Owned by the caller until handed to madmin_job_submit. */
void *madmin_job_new(madmin *m, http_req *req, size_t size, void (*clear)(madmin_job *j));
/* clear, the reply's data, the job. NULL is fine. */
void madmin_job_free(madmin_job *j);
/* madmin_reply_send, then madmin_job_free. */
void madmin_job_reply(madmin_job *j, qn_status st);
/* A pgpool done function that is just madmin_job_reply (arg: the job). */
void madmin_job_done(qn_status st, void *arg);
/* Submits work/done with the job as arg on ds's pool; takes ownership of j: if the pool
 * refuses, replies 503 and frees it. */
void madmin_job_submit(madmin_job *j, int ds, pgpool_work_fn work, pgpool_done_fn done);
/* madmin_job_submit on the database of the shard holding j's shop's templates (500 when there
 * is none): where create checks its template. */
void madmin_job_submit_tpl_shard(madmin_job *j, pgpool_work_fn work, pgpool_done_fn done);
/* The handler of a route naming one resource: a job of size bytes whose id is the parameter
 * id_name (400 when invalid), then work on ds and the reply (madmin_job_done). */
void madmin_job_by_id(madmin *m, http_req *req, size_t size, void (*clear)(madmin_job *j),
                      const char *id_name, int ds, pgpool_work_fn work);

/* Inside a work function: the template tpl_id is j's shop's and active. QN_OK with j->reply
 * set to 404 / 409 when not; a database failure as madmin_db_fail. */
qn_status madmin_tpl_check(pgpool_conn *conn, madmin_job *j, int64_t tpl_id) QN_MUSTCHECK;

#endif
