/*
 * Distribution tasks of merchant-admin: create, page, find, cancel, failure report, and the
 * two timers behind create.
 *
 *   create     validates, checks the template (its shard), then in ONE ds_0 transaction
 *              inserts the task and its outbox rows: task.execute now (immediate; running)
 *              or the timer task.schedule due at sendTime (scheduled; pending), plus
 *              task.count twice: due now (the first count) and due QUAN_TASK_COUNT_RETRY_MS
 *              later (the fallback), each with its own key.
 *   task.schedule  (queue merchant-admin.task-schedule) UPDATE pending -> running and, only if
 *              that one row changed, outbox task.execute in the same transaction: two replicas
 *              (or a redelivery) never start a task twice, a cancelled task never starts.
 *   task.count (queue merchant-admin.task-count) counts the sheet's data rows into send_num
 *              while it IS NULL (idempotent; the first count may fail on a file not complete
 *              yet or a failed download). It runs on the consumer's thread and holds no
 *              database connection while the file is fetched and read. A failure that trying
 *              again would not change (QN_EINVAL) ends that count; the fallback still comes.
 *
 * Every read and write is scoped to the caller's shop (a task of another shop is 404).
 * Tasks, failure rows and the outbox rows live in ds_0.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <libpq-fe.h>

#include "tasks.h"
#include "events.h"
#include "export.h"
#include "fetch.h"
#include "jsonin.h"
#include "log.h"
#include "madmin.h"
#include "now.h"
#include "pgparam.h"
#include "sheet.h"
#include "task.h"
#include "usersheet.h"

#define TASKS_DS         0
#define TASKS_ACQUIRE_MS 5000

typedef struct tasks_settings {
    fetch_config file;           /* QUAN_FILE_*: where task files may come from */
    int64_t task_count_retry_ms; /* the durable row-count fallback fires this long after create */
} tasks_settings;

static tasks_settings tasks_cfg;

/* The module's context. */
typedef struct tasks_ctx {
    madmin_ctx head;
    tasks_settings cfg;
    export_ctx *exports; /* export_module's */
} tasks_ctx;

/* The context of the module that made job j (a route of this module's). */
static const tasks_ctx *tasks_of(const madmin_job *j)
{
    return (const tasks_ctx *)j->ctx; /* madmin_ctx is its first member */
}

/* ------------------------------------------------------------------ the row count */

/* fileAddress: an http(s) URL whose host the address policy lets us fetch from, or an existing
 * file under the file root; nothing else. QN_EINVAL (refused) or, when the host could not be
 * checked now, QN_ETIMEDOUT / QN_ERR; err starts with "fileAddress: ". Touches the file system
 * and resolves names (bounded by the connect timeout): worker threads only. */
static qn_status tasks_check_address(const tasks_settings *cfg, const char *addr, char *err,
                                     size_t errlen)
{
    fetch_limits lim = fetch_config_limits(&cfg->file);
    qn_status st = fetch_check_address(addr, cfg->file.root, err, errlen);
    return st == QN_OK ? fetch_check_host(addr, &lim, err, errlen) : st;
}

static int tasks_is_url(const char *addr)
{
    return fetch_is_url(addr);
}

/*
 * Counts the data rows of the spreadsheet at addr (an http(s) URL is downloaded to a temp file
 * first, bounded by QUAN_FILE_MAX_BYTES and QUAN_FILE_TIMEOUT_S). Blocking: worker or consumer
 * threads only. QN_EINVAL when trying again would not change the outcome (not a spreadsheet,
 * too large, outside the root, a refused host, an HTTP 4xx); other errors are worth retrying.
 */
static qn_status tasks_count_rows(const tasks_settings *cfg, const char *addr, int64_t *rows,
                                  char *err, size_t errlen)
{
    char path[4096];
    /* A URL is downloaded to a temp file, unlinked below. */
    qn_status st = fetch_resolve_cfg(&cfg->file, addr, path, sizeof(path), err, errlen);
    if (st != QN_OK)
        return st;
    sheet_limits sl = {.max_sheet_bytes = (uint64_t)cfg->file.max_xml,
                       .max_sst_bytes = (uint64_t)cfg->file.max_xml};
    st = usersheet_count_rows(path, &sl, rows, err, errlen);
    if (tasks_is_url(addr))
        unlink(path);
    return st;
}

/* UPDATE send_num only while it is unknown: the first count and the fallback may both run. */
static qn_status tasks_store_count(pgpool_conn *conn, int64_t id, int64_t rows, int64_t *changed)
{
    pgparam p = {0};
    pgparam_i64(&p, rows);
    pgparam_i64(&p, id);
    return pgpool_exec_cmd(conn,
                           "UPDATE t_coupon_task SET send_num = $1::integer, update_time = now() "
                           "WHERE id = $2::bigint AND send_num IS NULL",
                           p.n, p.v, changed);
}

/* ------------------------------------------------------------------ create */

/* job.id is the task. */
typedef struct tasks_create {
    madmin_job job;
    int64_t operator_id, tpl_id, batch_id, send_time_ms;
    int send_type, status;
    char *task_name, *file_address;
    char notify[TASKS_NOTIFY_LEN];
} tasks_create;

static void tasks_create_clear(reqjob *j)
{
    tasks_create *c = (tasks_create *)j;
    free(c->task_name);
    free(c->file_address);
}

/* Step 2 (template shard worker): the address is acceptable, the template is the shop's and
 * active. */
static qn_status tasks_create_tpl_work(pgpool_conn *conn, void *arg)
{
    tasks_create *c = arg;
    char addr_err[200] = "";
    /* The address check touches the file system (realpath, stat) and resolves names: not on
     * the loop thread. */
    qn_status st =
        tasks_check_address(&tasks_of(&c->job)->cfg, c->file_address, addr_err, sizeof(addr_err));
    if (st == QN_EINVAL) {
        reqjob_fail(&c->job.rj, ERRCODE_INVALID, "%s",
                    addr_err[0] ? addr_err : "fileAddress: not allowed");
        return QN_OK;
    }
    if (st != QN_OK) {
        reqjob_fail(&c->job.rj, ERRCODE_UNAVAILABLE, "%s; try again",
                    addr_err[0] ? addr_err : "fileAddress");
        return QN_OK;
    }
    return madmin_tpl_check(conn, &c->job, c->tpl_id);
}

static qn_status tasks_outbox(pgpool_conn *conn, const tasks_create *c, const char *event,
                              const char *key_suffix, int64_t due_ms)
{
    char key[80], data[256];
    snprintf(key, sizeof(key), "%s:%" PRId64 "%s", event, c->job.id, key_suffix);
    snprintf(data, sizeof(data),
             "{\"taskId\":\"%" PRId64 "\",\"batchId\":\"%" PRId64 "\",\"shopNumber\":\"%" PRId64
             "\",\"couponTemplateId\":\"%" PRId64 "\"}",
             c->job.id, c->batch_id, c->job.shop, c->tpl_id);
    outbox_event ev = {.routing_key = event,
                       .key = key,
                       .data_json = data,
                       .request_id = c->job.rj.request_id,
                       .traceparent = c->job.rj.traceparent,
                       .due_at_ms = due_ms};
    return outbox_add(conn, &ev);
}

/* Step 3 (ds_0 worker): the task and its events, in one transaction. */
static qn_status tasks_create_insert_work(pgpool_conn *conn, void *arg)
{
    tasks_create *c = arg;
    pgparam p = {0};
    pgparam_i64(&p, c->job.id);
    pgparam_i64(&p, c->job.shop);
    pgparam_i64(&p, c->batch_id);
    pgparam_str(&p, c->task_name);
    pgparam_str(&p, c->file_address);
    pgparam_str(&p, c->notify);
    pgparam_i64(&p, c->tpl_id);
    pgparam_i64(&p, c->send_type);
    if (c->send_time_ms)
        pgparam_i64(&p, c->send_time_ms);
    else
        pgparam_null(&p); /* an immediate task */
    pgparam_i64(&p, c->status);
    pgparam_i64(&p, c->operator_id);
    qn_status st = pgpool_begin(conn);
    if (st != QN_OK)
        return reqjob_db_fail(conn);
    st = pgpool_exec_cmd(conn,
                         "INSERT INTO t_coupon_task (id, shop_number, batch_id, task_name, "
                         "file_address, notify_type, coupon_template_id, send_type, send_time, "
                         "status, operator_id) VALUES ($1::bigint, $2::bigint, $3::bigint, $4, $5, "
                         "$6, $7::bigint, $8::smallint, to_timestamp($9::bigint / 1000.0), "
                         "$10::smallint, $11::bigint)",
                         p.n, p.v, NULL);
    if (st == QN_OK)
        st = c->send_type ? tasks_outbox(conn, c, EVENT_TASK_SCHEDULE, "", c->send_time_ms)
                          : tasks_outbox(conn, c, EVENT_TASK_EXECUTE, "", 0);
    /* The first count and its fallback: own keys, so the consume guard keeps neither from
     * running (a first count refused for good still leaves the fallback). */
    if (st == QN_OK)
        st = tasks_outbox(conn, c, EVENT_TASK_COUNT, ":first", 0);
    if (st == QN_OK)
        st = tasks_outbox(conn, c, EVENT_TASK_COUNT, "",
                          now_wall_ms() + tasks_of(&c->job)->cfg.task_count_retry_ms);
    if (st == QN_OK)
        st = pgpool_commit(conn);
    if (st != QN_OK) {
        (void)pgpool_rollback(conn);
        return reqjob_db_fail(conn);
    }
    cJSON *d = cJSON_CreateObject();
    if (d) {
        cJSON_AddItemToObject(d, "id", jsonin_id_to_json(c->job.id));
        cJSON_AddItemToObject(d, "batchId", jsonin_id_to_json(c->batch_id));
    }
    c->job.rj.data = d;
    return d ? QN_OK : QN_ENOMEM;
}

static void tasks_create_insert_done(qn_status st, void *arg)
{
    tasks_create *c = arg;
    if (st == QN_OK) {
        log_info(&c->job.rj.req->log, "task %" PRId64 " created (batch %" PRId64 ", send type %d)",
                 c->job.id, c->batch_id, c->send_type);
    }
    reqjob_reply(&c->job.rj, st);
}

static void tasks_create_tpl_done(qn_status st, void *arg)
{
    tasks_create *c = arg;
    if (st != QN_OK || reqjob_failed(&c->job.rj))
        goto reply;
    ids_gen *ids = service_ids(c->job.ctx->svc);
    if (ids_next(ids, &c->job.id) != QN_OK || ids_next(ids, &c->batch_id) != QN_OK) {
        reqjob_fail(&c->job.rj, ERRCODE_UNAVAILABLE, "id generator unavailable, try again");
        goto reply;
    }
    madmin_job_submit(&c->job, TASKS_DS, tasks_create_insert_work, tasks_create_insert_done);
    return;
reply:
    reqjob_reply(&c->job.rj, st);
}

qn_status tasks_create_parse(const cJSON *b, int64_t now_ms, tasks_create_body *out,
                             jsonin_err *err)
{
    static const int channels[] = {0, 1, 2, 3}; /* in-app, popup, email, SMS */
    static const int send_types[] = {TASKS_SEND_NOW, TASKS_SEND_SCHEDULED};
    enum { NCHANNELS = sizeof(channels) / sizeof(channels[0]) };
    tasks_create_body t = {0};
    int notify[NCHANNELS];
    size_t nnotify = 0;

    if (jsonin_string(b, "taskName", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, TASKS_NAME_MAX,
                      &t.task_name, err) != QN_OK ||
        jsonin_string(b, "fileAddress", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, TASKS_ADDR_MAX,
                      &t.file_address, err) != QN_OK ||
        jsonin_int_list_csv(b, "notifyType", JSONIN_REQUIRED, channels, NCHANNELS, notify,
                            NCHANNELS, &nnotify, err) != QN_OK ||
        jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &t.tpl_id, err) !=
            QN_OK ||
        jsonin_enum_int(b, "sendType", JSONIN_REQUIRED, 0, send_types, 2, &t.send_type, err) !=
            QN_OK ||
        jsonin_time_ms(b, "sendTime",
                       t.send_type == TASKS_SEND_SCHEDULED ? JSONIN_REQUIRED : JSONIN_OPTIONAL, 0,
                       &t.send_time_ms, err) != QN_OK)
        return QN_EINVAL;
    if (nnotify == 0) {
        jsonin_errf(err, "notifyType", "required");
        return QN_EINVAL;
    }
    if (t.send_type == TASKS_SEND_SCHEDULED) {
        if (t.send_time_ms <= now_ms) {
            jsonin_errf(err, "sendTime", "must be in the future for a scheduled task");
            return QN_EINVAL;
        }
        t.status = TASK_STATUS_PENDING; /* task.schedule starts it */
    } else {
        t.send_time_ms = 0; /* an immediate task has no send time */
        t.status = TASK_STATUS_RUNNING;
    }
    for (size_t i = 0, o = 0; i < nnotify; i++)
        o += (size_t)snprintf(t.notify + o, sizeof(t.notify) - o, "%s%d", i ? "," : "", notify[i]);
    *out = t;
    return QN_OK;
}

static void tasks_create_handler(http_req *req, void *arg)
{
    const tasks_ctx *ctx = arg;
    jsonin_err err = {{0}};
    tasks_create_body body;
    tasks_create *c = madmin_job_new(&ctx->head, req, sizeof(*c), tasks_create_clear);
    if (!c)
        return;
    if (tasks_create_parse(http_body_json(req), now_wall_ms(), &body, &err) != QN_OK) {
        reqjob_reply_error(&c->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    c->operator_id = req->user_id;
    c->tpl_id = body.tpl_id;
    c->send_type = body.send_type;
    c->send_time_ms = body.send_time_ms;
    c->status = body.status;
    memcpy(c->notify, body.notify, sizeof(c->notify));
    c->task_name = strdup(body.task_name);
    c->file_address = strdup(body.file_address);
    if (!c->task_name || !c->file_address) {
        reqjob_reply_error(&c->job.rj, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    madmin_job_submit_tpl_shard(&c->job, tasks_create_tpl_work, tasks_create_tpl_done);
}

/* ------------------------------------------------------------------ page / find */

#define TASKS_COLUMNS                                                                              \
    "id, batch_id, task_name, file_address, send_num, notify_type, coupon_template_id, "           \
    "send_type, (extract(epoch from send_time) * 1000)::bigint, status, "                          \
    "(extract(epoch from completion_time) * 1000)::bigint, operator_id, success_num, fail_num, "   \
    "processed_rows, (extract(epoch from create_time) * 1000)::bigint, fail_reason, "              \
    "cancel_requested"

static cJSON *tasks_num_or_null(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? cJSON_CreateNull()
                                    : cJSON_CreateNumber(strtod(PQgetvalue(r, row, col), NULL));
}

static cJSON *tasks_id_or_null(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? cJSON_CreateNull()
                                    : jsonin_id_to_json(strtoll(PQgetvalue(r, row, col), NULL, 10));
}

static cJSON *tasks_time_or_null(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col)
               ? cJSON_CreateNull()
               : jsonin_time_to_json(strtoll(PQgetvalue(r, row, col), NULL, 10));
}

/* One task of a TASKS_COLUMNS row. */
static cJSON *tasks_row_json(const PGresult *r, int i)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "id", tasks_id_or_null(r, i, 0));
    cJSON_AddItemToObject(o, "batchId", tasks_id_or_null(r, i, 1));
    cJSON_AddStringToObject(o, "taskName", PQgetvalue(r, i, 2));
    cJSON_AddStringToObject(o, "fileAddress", PQgetvalue(r, i, 3));
    cJSON_AddItemToObject(o, "sendNum", tasks_num_or_null(r, i, 4));
    cJSON_AddStringToObject(o, "notifyType", PQgetvalue(r, i, 5));
    cJSON_AddItemToObject(o, "couponTemplateId", tasks_id_or_null(r, i, 6));
    cJSON_AddItemToObject(o, "sendType", tasks_num_or_null(r, i, 7));
    cJSON_AddItemToObject(o, "sendTime", tasks_time_or_null(r, i, 8));
    cJSON_AddItemToObject(o, "status", tasks_num_or_null(r, i, 9));
    cJSON_AddItemToObject(o, "completionTime", tasks_time_or_null(r, i, 10));
    cJSON_AddItemToObject(o, "operatorId", tasks_id_or_null(r, i, 11));
    cJSON_AddItemToObject(o, "successNum", tasks_num_or_null(r, i, 12));
    cJSON_AddItemToObject(o, "failNum", tasks_num_or_null(r, i, 13));
    cJSON_AddItemToObject(o, "processedRows", tasks_num_or_null(r, i, 14));
    cJSON_AddItemToObject(o, "createTime", tasks_time_or_null(r, i, 15));
    cJSON_AddItemToObject(o, "failReason",
                          PQgetisnull(r, i, 16) ? cJSON_CreateNull()
                                                : cJSON_CreateString(PQgetvalue(r, i, 16)));
    cJSON_AddBoolToObject(o, "cancelRequested", PQgetvalue(r, i, 17)[0] == 't');
    return o;
}

/* job.id is the task (find, cancel, fail report). */
typedef struct tasks_query {
    madmin_job job;
    madmin_page page;
    int64_t batch, tpl, status; /* page filters, -1 when absent */
    char *name;                 /* page filter, NULL when absent */
} tasks_query;

static void tasks_query_clear(reqjob *j)
{
    tasks_query *q = (tasks_query *)j;
    free(q->name);
}

/* The handler of find, cancel and fail report: the task named by taskId, then work. */
static void tasks_by_id(http_req *req, const tasks_ctx *ctx, pgpool_work_fn work)
{
    madmin_job_by_id(&ctx->head, req, sizeof(tasks_query), tasks_query_clear, "taskId", TASKS_DS,
                     work);
}

static qn_status tasks_find_work(pgpool_conn *conn, void *arg)
{
    tasks_query *q = arg;
    pgparam p = {0};
    madmin_job_params(&p, &q->job);
    PGresult *r = pgpool_exec(conn,
                              "SELECT " TASKS_COLUMNS " FROM t_coupon_task WHERE id = $1::bigint "
                              "AND shop_number = $2::bigint AND del_flag = 0",
                              p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    qn_status st = QN_OK;
    if (PQntuples(r) == 0)
        reqjob_fail(&q->job.rj, ERRCODE_NOT_FOUND, "taskId: task not found");
    else if (!(q->job.rj.data = tasks_row_json(r, 0)))
        st = QN_ENOMEM;
    PQclear(r);
    return st;
}

static void tasks_find_handler(http_req *req, void *arg)
{
    tasks_by_id(req, arg, tasks_find_work);
}

#define TASKS_PAGE_WHERE                                                                           \
    " FROM t_coupon_task WHERE shop_number = $1::bigint AND del_flag = 0"                          \
    " AND ($2::bigint IS NULL OR batch_id = $2::bigint)"                                           \
    " AND ($3::text IS NULL OR strpos(task_name, $3::text) > 0)"                                   \
    " AND ($4::bigint IS NULL OR coupon_template_id = $4::bigint)"                                 \
    " AND ($5::smallint IS NULL OR status = $5::smallint)"

/* A filter left out (-1) is NULL, which its condition lets through. */
static void tasks_filter_param(pgparam *p, int64_t v)
{
    if (v >= 0)
        pgparam_i64(p, v);
    else
        pgparam_null(p);
}

static qn_status tasks_page_work(pgpool_conn *conn, void *arg)
{
    tasks_query *q = arg;
    PGresult *r = NULL;
    qn_status st = QN_ENOMEM;
    pgparam p = {0};
    pgparam_i64(&p, q->job.shop);
    tasks_filter_param(&p, q->batch);
    pgparam_str(&p, q->name);
    tasks_filter_param(&p, q->tpl);
    tasks_filter_param(&p, q->status);

    r = pgpool_exec(conn, "SELECT count(*)" TASKS_PAGE_WHERE, p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    int64_t total = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    pgparam_i64(&p, q->page.size);
    pgparam_i64(&p, madmin_page_offset(&q->page));
    r = pgpool_exec(conn,
                    "SELECT " TASKS_COLUMNS TASKS_PAGE_WHERE
                    " ORDER BY id DESC LIMIT $6::bigint OFFSET $7::bigint",
                    p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    cJSON *recs = cJSON_CreateArray();
    if (!recs)
        goto done;
    for (int i = 0; i < PQntuples(r); i++) {
        cJSON *o = tasks_row_json(r, i);
        if (!o)
            goto done;
        cJSON_AddItemToArray(recs, o);
    }
    q->job.rj.data = madmin_page_json(recs, total, &q->page);
    recs = NULL; /* taken */
    if (q->job.rj.data)
        st = QN_OK;
done:
    cJSON_Delete(recs);
    PQclear(r);
    return st;
}

/* An optional query filter of min..max (min >= 0) into *out; -1 when absent. */
static qn_status tasks_filter_int(http_req *req, const char *name, int64_t min, int64_t max,
                                  int64_t *out, jsonin_err *err)
{
    int64_t v = 0;
    *out = -1;
    const char *s = http_param_str(req, name);
    const cJSON *j = http_param(req, name);
    if (!s && j && cJSON_IsNumber(j)) {
        if (http_param_i64(req, name, &v) != QN_OK || v < min || v > max) {
            jsonin_errf(err, name, "must be between %" PRId64 " and %" PRId64, min, max);
            return QN_EINVAL;
        }
    } else if (!s || !*s) {
        return QN_OK;
    } else if (jsonin_parse_int64_str(name, s, JSONIN_REQUIRED, 0, min, max, &v, err) != QN_OK) {
        return QN_EINVAL;
    }
    *out = v;
    return QN_OK;
}

static void tasks_page_handler(http_req *req, void *arg)
{
    const tasks_ctx *ctx = arg;
    jsonin_err err = {{0}};
    tasks_query *q = madmin_job_new(&ctx->head, req, sizeof(*q), tasks_query_clear);
    if (!q)
        return;
    const char *name = http_param_str(req, "taskName");
    if (madmin_page_parse(http_param_str(req, "current"), http_param_str(req, "size"),
                          MADMIN_SIZE_REFUSE, &q->page, &err) != QN_OK ||
        tasks_filter_int(req, "batchId", 1, INT64_MAX, &q->batch, &err) != QN_OK ||
        tasks_filter_int(req, "couponTemplateId", 1, INT64_MAX, &q->tpl, &err) != QN_OK ||
        tasks_filter_int(req, "status", TASK_STATUS_PENDING, TASK_STATUS_CANCELLED, &q->status,
                         &err) != QN_OK)
        goto invalid;
    if (name && *name) {
        if (strlen(name) > TASKS_NAME_MAX * 4) {
            jsonin_errf(&err, "taskName", "at most %d characters", TASKS_NAME_MAX);
            goto invalid;
        }
        if (!(q->name = strdup(name))) {
            reqjob_reply_error(&q->job.rj, ERRCODE_INTERNAL, "out of memory");
            return;
        }
    }
    madmin_job_submit(&q->job, TASKS_DS, tasks_page_work, reqjob_done);
    return;
invalid:
    reqjob_reply_error(&q->job.rj, ERRCODE_INVALID, "%s", err.msg[0] ? err.msg : "invalid query");
}

/* ------------------------------------------------------------------ cancel */

/* A pending task, or a running one no run has taken yet, is cancelled at once (nothing of it
 * ran). A task a run has taken gets cancel_requested: its run stops at the next chunk boundary
 * and ends the task cancelled itself, so the counters stay true to what was issued. */
/* clang-format off */
static const char tasks_cancel_sql[] =
    "UPDATE t_coupon_task SET "
    "status = CASE WHEN status = " TASK_STATUS_TEXT(PENDING) " OR execution_id IS NULL "
    "THEN " TASK_STATUS_TEXT(CANCELLED) " ELSE status END, "
    "cancel_requested = status = " TASK_STATUS_TEXT(RUNNING) " AND execution_id IS NOT NULL, "
    "update_time = now() "
    "WHERE id = $1::bigint AND shop_number = $2::bigint "
    "AND status IN (" TASK_STATUS_TEXT(PENDING) ", " TASK_STATUS_TEXT(RUNNING) ") "
    "AND del_flag = 0 RETURNING status";
/* clang-format on */

static qn_status tasks_cancel_work(pgpool_conn *conn, void *arg)
{
    tasks_query *q = arg;
    char key[64];
    pgparam p = {0};
    madmin_job_params(&p, &q->job);
    snprintf(key, sizeof(key), EVENT_TASK_SCHEDULE ":%" PRId64, q->job.id);
    if (pgpool_begin(conn) != QN_OK)
        return reqjob_db_fail(conn);
    PGresult *r = pgpool_exec(conn, tasks_cancel_sql, p.n, p.v);
    qn_status st = r ? QN_OK : QN_ERR;
    int changed = r && PQntuples(r) == 1;
    /* The timer is now pointless; its consumer would find the task cancelled and do nothing. */
    if (st == QN_OK && changed && atoi(PQgetvalue(r, 0, 0)) == TASK_STATUS_CANCELLED)
        st = outbox_cancel(conn, key, NULL);
    PQclear(r);
    if (st == QN_OK)
        st = pgpool_commit(conn);
    if (st != QN_OK) {
        (void)pgpool_rollback(conn);
        return reqjob_db_fail(conn);
    }
    if (changed)
        return QN_OK;
    r = pgpool_exec(conn,
                    "SELECT status FROM t_coupon_task WHERE id = $1::bigint "
                    "AND shop_number = $2::bigint AND del_flag = 0",
                    p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    if (PQntuples(r) == 0)
        reqjob_fail(&q->job.rj, ERRCODE_NOT_FOUND, "taskId: task not found");
    else
        reqjob_fail(&q->job.rj, ERRCODE_STATE,
                    "only a pending or running task can be cancelled (status is %s)",
                    PQgetvalue(r, 0, 0));
    PQclear(r);
    return QN_OK;
}

static void tasks_cancel_handler(http_req *req, void *arg)
{
    tasks_by_id(req, arg, tasks_cancel_work);
}

/* ------------------------------------------------------------------ fail report */

/* Fail report, before the first page: the task is the shop's; its batch. */
static qn_status tasks_report_prepare(pgpool_conn *conn, export_job *e)
{
    pgparam p = {0};
    madmin_job_params(&p, &e->job);
    PGresult *r = pgpool_exec(conn,
                              "SELECT batch_id FROM t_coupon_task WHERE id = $1::bigint "
                              "AND shop_number = $2::bigint AND del_flag = 0",
                              p.n, p.v);
    if (!r)
        return reqjob_db_fail(conn);
    if (PQntuples(r) == 0)
        reqjob_fail(&e->job.rj, ERRCODE_NOT_FOUND, "taskId: task not found");
    e->fixed[0] = PQntuples(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    e->fixed[1] = e->job.id;
    PQclear(r);
    snprintf(e->filename, sizeof(e->filename), "task-%" PRId64 "-failures", e->job.id);
    return QN_OK;
}

static const char *const tasks_report_header[] = {"row number", "user id", "cause"};
static const char *const tasks_report_start[] = {"-2147483648", "-9223372036854775808"};
/* In row order; rows of the same number by id (the key is both). */
static const export_spec tasks_report = {
    .ds = TASKS_DS,
    .sheet_name = "failures",
    .header = tasks_report_header,
    .ncols = 3,
    .numeric_mask = 1u << 0,
    .page_sql = "SELECT row_num, user_id, cause, row_num, id FROM t_coupon_task_fail "
                "WHERE batch_id = $1::bigint AND task_id = $2::bigint "
                "AND (row_num, id) > ($3::integer, $4::bigint) "
                "ORDER BY row_num, id LIMIT $5::integer",
    .nfixed = 2,
    .nkey = 2,
    .key_start = tasks_report_start,
    .prepare = tasks_report_prepare,
};

static void tasks_report_handler(http_req *req, void *arg)
{
    tasks_ctx *ctx = arg;
    export_by_id(&ctx->head, ctx->exports, req, "taskId", &tasks_report);
}

/* ------------------------------------------------------------------ consumers */

static qn_status tasks_msg_id(const mq_envelope *env, int64_t *id)
{
    jsonin_err err = {{0}};
    if (jsonin_int64(env->data, "taskId", JSONIN_REQUIRED, 0, 1, INT64_MAX, id, &err) != QN_OK) {
        log_error(NULL, "%s %s: %s", env->type, env->key, err.msg);
        return QN_EINVAL;
    }
    return QN_OK;
}

/* clang-format off */
static const char tasks_schedule_sql[] =
    "UPDATE t_coupon_task SET status = " TASK_STATUS_TEXT(RUNNING) ", update_time = now() "
    "WHERE id = $1::bigint AND status = " TASK_STATUS_TEXT(PENDING) " "
    "RETURNING batch_id, shop_number, coupon_template_id";
/* clang-format on */

/* task.schedule: start a pending task at its send time, exactly once. */
static mq_handler_result tasks_on_schedule(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg)
{
    (void)info;
    const tasks_ctx *ctx = arg;
    int64_t id = 0, n = 0;
    mq_handler_result res = MQ_RETRY;
    if (tasks_msg_id(env, &id) != QN_OK)
        return MQ_DEAD;
    pgpool_conn *conn = pgpool_acquire(service_pg(ctx->head.svc, TASKS_DS), TASKS_ACQUIRE_MS);
    if (!conn)
        return MQ_RETRY;
    pgparam p = {0};
    pgparam_i64(&p, id);
    PGresult *r = NULL;
    if (pgpool_begin(conn) != QN_OK)
        goto done;
    /* The conditional update is the whole point: whoever changes the row publishes. */
    r = pgpool_exec(conn, tasks_schedule_sql, p.n, p.v);
    if (!r)
        goto done;
    n = PQntuples(r);
    if (n == 1) {
        tasks_create c = {.job.id = id};
        c.batch_id = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        c.job.shop = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        c.tpl_id = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        snprintf(c.job.rj.request_id, sizeof(c.job.rj.request_id), "%s",
                 env->request_id ? env->request_id : "");
        snprintf(c.job.rj.traceparent, sizeof(c.job.rj.traceparent), "%s",
                 env->traceparent ? env->traceparent : "");
        if (tasks_outbox(conn, &c, EVENT_TASK_EXECUTE, "", 0) != QN_OK)
            goto done;
    }
    if (pgpool_commit(conn) != QN_OK)
        goto done;
    if (n == 1)
        log_info(NULL, "task %" PRId64 ": send time reached, started", id);
    else
        log_info(NULL, "task %" PRId64 ": send time reached, not pending (no-op)", id);
    res = MQ_ACK;
done:
    if (res != MQ_ACK)
        log_warn(NULL, "task %" PRId64 ": schedule failed: %s", id, pgpool_conn_error(conn));
    PQclear(r);
    pgpool_release(conn); /* rolls back what is left open */
    return res;
}

/* task.count: the row count (first, and the durable fallback). */
static mq_handler_result tasks_on_count(const mq_envelope *env, const mq_delivery_info *info,
                                        void *arg)
{
    const tasks_ctx *ctx = arg;
    int64_t id = 0, rows = 0, changed = 0;
    char *addr = NULL, err[256] = "";
    mq_handler_result res = MQ_RETRY;
    if (tasks_msg_id(env, &id) != QN_OK)
        return MQ_DEAD;
    pgparam p = {0};
    pgparam_i64(&p, id);

    /* No connection is held while the file is fetched and read. */
    pgpool_conn *conn = pgpool_acquire(service_pg(ctx->head.svc, TASKS_DS), TASKS_ACQUIRE_MS);
    if (!conn)
        return MQ_RETRY;
    PGresult *r = pgpool_exec(conn,
                              "SELECT file_address FROM t_coupon_task WHERE id = $1::bigint "
                              "AND send_num IS NULL",
                              p.n, p.v);
    if (r && PQntuples(r) == 1)
        addr = strdup(PQgetvalue(r, 0, 0));
    int found = r && PQntuples(r) == 1;
    PQclear(r);
    pgpool_release(conn);
    conn = NULL;
    if (!r)
        goto done;
    if (!found) {
        res = MQ_ACK; /* counted already (or gone) */
        goto done;
    }
    if (!addr)
        goto done;
    qn_status st = tasks_count_rows(&ctx->cfg, addr, &rows, err, sizeof(err));
    /* Retrying would not help (a refused host, an HTTP 4xx, not a sheet): this count ends. A
     * file still being written is counted again by the fallback; 5xx, timeouts and network
     * failures are retried up to the consumer's attempt limit. */
    if (st == QN_EINVAL) {
        log_warn(NULL, "task %" PRId64 ": the sheet cannot be counted: %s", id, err);
        res = MQ_ACK;
        goto done;
    }
    if (st != QN_OK) {
        log_warn(NULL, "task %" PRId64 ": row count failed (attempt %d): %s", id, info->attempt,
                 err);
        goto done;
    }
    conn = pgpool_acquire(service_pg(ctx->head.svc, TASKS_DS), TASKS_ACQUIRE_MS);
    if (!conn || tasks_store_count(conn, id, rows, &changed) != QN_OK)
        goto done;
    log_info(NULL, "task %" PRId64 ": %" PRId64 " data rows (%s)", id, rows,
             changed ? "stored" : "already known");
    res = MQ_ACK;
done:
    if (conn)
        pgpool_release(conn);
    free(addr);
    return res;
}

/* ------------------------------------------------------------------ the module */

static qn_status tasks_start(service *s, void **state)
{
    qn_status st = madmin_ctx_new(s, sizeof(tasks_ctx), state);
    if (st != QN_OK)
        return st;
    tasks_ctx *ctx = *state;
    ctx->cfg = tasks_cfg;
    return export_ctx_of(s, &ctx->exports);
}

static const config_var tasks_vars[] = {
    FETCH_CONFIG_VARS(tasks_settings, file),
    {"QUAN_TASK_COUNT_RETRY_MS", CONFIG_INT, offsetof(tasks_settings, task_count_retry_ms), "20000",
     100, 3600000, NULL, 0, "a task's row count is redone this long after create if it was lost"},
};

const service_module tasks_module = {
    .name = "tasks",
    .vars = tasks_vars,
    .nvars = sizeof(tasks_vars) / sizeof(tasks_vars[0]),
    .settings = &tasks_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/merchant-admin/coupon-task/create", tasks_create_handler,
             HTTP_NEED_SHOP | SERVICE_ROUTE_NODUP},
            {HTTP_GET, "/api/merchant-admin/coupon-task/page", tasks_page_handler, HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-task/find", tasks_find_handler, HTTP_NEED_SHOP},
            {HTTP_POST, "/api/merchant-admin/coupon-task/cancel", tasks_cancel_handler,
             HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-task/fail-report", tasks_report_handler,
             HTTP_NEED_SHOP},
            {0},
        },
    .consumers =
        (const service_consumer[]){
            /* a scheduled task's send time: start it, once */
            {"merchant-admin.task-schedule", (const char *const[]){EVENT_TASK_SCHEDULE, NULL},
             tasks_on_schedule},
            /* count a task's spreadsheet rows (the first count, and its fallback) */
            {"merchant-admin.task-count", (const char *const[]){EVENT_TASK_COUNT, NULL},
             tasks_on_count},
            {0},
        },
    .start = tasks_start,
    .free = madmin_ctx_free,
};
