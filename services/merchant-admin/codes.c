/*
 * Exchange-code batches of merchant-admin: create, find, export, and the generator.
 *
 *   create    checks the template (active, the shop's), then in one ds_0 transaction inserts
 *             the batch (generating) and the outbox event codes.generate.
 *   codes.generate (queue merchant-admin.code-generate) writes the codes in chunks: each chunk
 *             is one transaction that locks the batch row, reads `generated` (always equal to
 *             the codes stored, since both change in the same transaction), inserts up to
 *             CODES_CHUNK fresh random codes with ON CONFLICT (code) DO NOTHING and adds the
 *             inserted count. Collisions are simply made up for by the next chunk. A
 *             redelivery, a second replica or a crash therefore resumes where the database
 *             says, never exceeding `count`. One delivery works at most CODES_SLICE_MS and then
 *             hands over to a new codes.generate event (same transaction as its last chunk), so
 *             a million codes never hold one message past the broker's heartbeat.
 *   export    the batch's codes as .xlsx (code, status), streamed (export.c): a batch of a
 *             million codes starts at once and never meets the request timeout.
 *
 * Codes: common/coupon/excode.h (10 characters, 30 random bits + a 20-bit HMAC check).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <libpq-fe.h>

#include "codes.h"
#include "events.h"
#include "excode.h"
#include "export.h"
#include "jsonin.h"
#include "log.h"
#include "madmin.h"
#include "now.h"
#include "pgparam.h"

#define CODES_DS         0
#define CODES_SLICE_MS   20000
#define CODES_ACQUIRE_MS 5000

/* t_exchange_code_batch.status; compared and written in statements' text too, so each number is
 * written once, as a macro the enum and CODES_BATCH_TEXT are made of (pgparam.h). */
#define CODES_BATCH_GENERATING_N 0
#define CODES_BATCH_READY_N      1
#define CODES_BATCH_FAILED_N     2
enum {
    CODES_BATCH_GENERATING = CODES_BATCH_GENERATING_N,
    CODES_BATCH_READY = CODES_BATCH_READY_N,
    CODES_BATCH_FAILED = CODES_BATCH_FAILED_N,
};
#define CODES_BATCH_TEXT(name) PGPARAM_DIGIT_TEXT(CODES_BATCH_##name##_N)

typedef struct codes_settings {
    const char *code_secret;
} codes_settings;

static codes_settings codes_cfg;

/* The module's context. */
typedef struct codes_ctx {
    madmin_ctx head;
    codes_settings cfg;
    export_ctx *exports; /* export_module's */
} codes_ctx;

/* The request state of create / find / export; job.id is the batch. */
typedef struct codes_req {
    madmin_job job;
    int64_t tpl_id, count;
} codes_req;

/* ------------------------------------------------------------------ create */

static qn_status codes_create_tpl_work(pgpool_conn *conn, void *arg)
{
    codes_req *c = arg;
    return madmin_tpl_check(conn, &c->job, c->tpl_id);
}

void codes_generate_key(char *buf, size_t len, int64_t batch_id, int64_t generated)
{
    if (generated)
        snprintf(buf, len, EVENT_CODES_GENERATE ":%" PRId64 ":%" PRId64, batch_id, generated);
    else
        snprintf(buf, len, EVENT_CODES_GENERATE ":%" PRId64, batch_id);
}

static qn_status codes_outbox(pgpool_conn *conn, int64_t batch_id, int64_t generated,
                              const char *request_id, const char *traceparent)
{
    char key[CODES_KEY_LEN], data[64];
    codes_generate_key(key, sizeof(key), batch_id, generated);
    snprintf(data, sizeof(data), "{\"batchId\":\"%" PRId64 "\"}", batch_id);
    outbox_event ev = {.routing_key = EVENT_CODES_GENERATE,
                       .key = key,
                       .data_json = data,
                       .request_id = request_id,
                       .traceparent = traceparent};
    return outbox_add(conn, &ev);
}

/* clang-format off */
static const char codes_insert_sql[] =
    "INSERT INTO t_exchange_code_batch (id, shop_number, coupon_template_id, count, generated, "
    "status) VALUES ($1::bigint, $2::bigint, $3::bigint, $4::integer, 0, "
    CODES_BATCH_TEXT(GENERATING) ")";
/* clang-format on */

static qn_status codes_create_insert_work(pgpool_conn *conn, void *arg)
{
    codes_req *c = arg;
    pgparam p = {0};
    pgparam_i64(&p, c->job.id);
    pgparam_i64(&p, c->job.shop);
    pgparam_i64(&p, c->tpl_id);
    pgparam_i64(&p, c->count);
    if (pgpool_begin(conn) != QN_OK)
        return reqjob_db_fail(conn);
    qn_status st = pgpool_exec_cmd(conn, codes_insert_sql, p.n, p.v, NULL);
    if (st == QN_OK)
        st = codes_outbox(conn, c->job.id, 0, c->job.rj.request_id, c->job.rj.traceparent);
    if (st == QN_OK)
        st = pgpool_commit(conn);
    if (st != QN_OK) {
        (void)pgpool_rollback(conn);
        return reqjob_db_fail(conn);
    }
    c->job.rj.data = cJSON_CreateObject();
    if (!c->job.rj.data)
        return QN_ENOMEM;
    cJSON_AddItemToObject(c->job.rj.data, "batchId", jsonin_id_to_json(c->job.id));
    return QN_OK;
}

static void codes_create_insert_done(qn_status st, void *arg)
{
    codes_req *c = arg;
    if (st == QN_OK) {
        log_info(&c->job.rj.req->log, "code batch %" PRId64 ": %" PRId64 " codes requested",
                 c->job.id, c->count);
    }
    reqjob_reply(&c->job.rj, st);
}

static void codes_create_tpl_done(qn_status st, void *arg)
{
    codes_req *c = arg;
    if (st != QN_OK || reqjob_failed(&c->job.rj)) {
        reqjob_reply(&c->job.rj, st);
        return;
    }
    if (ids_next(service_ids(c->job.ctx->svc), &c->job.id) != QN_OK) {
        reqjob_reply_error(&c->job.rj, ERRCODE_UNAVAILABLE, "id generator unavailable, try again");
        return;
    }
    madmin_job_submit(&c->job, CODES_DS, codes_create_insert_work, codes_create_insert_done);
}

qn_status codes_create_parse(const cJSON *b, int64_t *tpl_id, int64_t *count, jsonin_err *err)
{
    if (jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, tpl_id, err) !=
            QN_OK ||
        jsonin_int64(b, "count", JSONIN_REQUIRED, 0, 1, CODES_COUNT_MAX, count, err) != QN_OK)
        return QN_EINVAL;
    return QN_OK;
}

static void codes_create_handler(http_req *req, void *arg)
{
    const codes_ctx *ctx = arg;
    jsonin_err err = {{0}};
    codes_req *c = madmin_job_new(&ctx->head, req, sizeof(*c), NULL);
    if (!c)
        return;
    if (codes_create_parse(http_body_json(req), &c->tpl_id, &c->count, &err) != QN_OK) {
        reqjob_reply_error(&c->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    madmin_job_submit_tpl_shard(&c->job, codes_create_tpl_work, codes_create_tpl_done);
}

/* ------------------------------------------------------------------ find / export */

static const char codes_batch_sql[] =
    "SELECT id, coupon_template_id, count, generated, status, "
    "(extract(epoch from create_time) * 1000)::bigint FROM t_exchange_code_batch "
    "WHERE id = $1::bigint AND shop_number = $2::bigint";

/* The batch row of j (codes_batch_sql) in *out, or *out NULL and a 404 reply. */
static qn_status codes_batch_row(pgpool_conn *conn, madmin_job *j, PGresult **out)
{
    pgparam p = {0};
    madmin_job_params(&p, j);
    PGresult *r = pgpool_exec(conn, codes_batch_sql, p.n, p.v);
    *out = NULL;
    if (!r)
        return reqjob_db_fail(conn);
    if (PQntuples(r) == 0) {
        PQclear(r);
        reqjob_fail(&j->rj, ERRCODE_NOT_FOUND, "batchId: batch not found");
        return QN_OK;
    }
    *out = r;
    return QN_OK;
}

static qn_status codes_find_work(pgpool_conn *conn, void *arg)
{
    codes_req *c = arg;
    cJSON *d = NULL;
    PGresult *r = NULL;
    qn_status st = codes_batch_row(conn, &c->job, &r);
    if (st != QN_OK || !r)
        return st;
    if ((d = c->job.rj.data = cJSON_CreateObject())) {
        cJSON_AddItemToObject(d, "batchId",
                              jsonin_id_to_json(strtoll(PQgetvalue(r, 0, 0), NULL, 10)));
        cJSON_AddItemToObject(d, "couponTemplateId",
                              jsonin_id_to_json(strtoll(PQgetvalue(r, 0, 1), NULL, 10)));
        cJSON_AddNumberToObject(d, "count", strtod(PQgetvalue(r, 0, 2), NULL));
        cJSON_AddNumberToObject(d, "generated", strtod(PQgetvalue(r, 0, 3), NULL));
        cJSON_AddNumberToObject(d, "status", strtod(PQgetvalue(r, 0, 4), NULL));
        cJSON_AddItemToObject(d, "createTime",
                              jsonin_time_to_json(strtoll(PQgetvalue(r, 0, 5), NULL, 10)));
    } else {
        st = QN_ENOMEM;
    }
    PQclear(r);
    return st;
}

/* Export, before the first page: the batch is the shop's and ready. */
static qn_status codes_export_prepare(pgpool_conn *conn, export_job *e)
{
    PGresult *r = NULL;
    qn_status st = codes_batch_row(conn, &e->job, &r);
    if (st != QN_OK || !r)
        return st;
    int status = atoi(PQgetvalue(r, 0, 4));
    char progress[64];
    snprintf(progress, sizeof(progress), "%s of %s", PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 2));
    PQclear(r);
    if (status != CODES_BATCH_READY) {
        reqjob_fail(&e->job.rj, ERRCODE_STATE, "batchId: codes are still being generated (%s)",
                    progress);
        return QN_OK;
    }
    e->fixed[0] = e->job.id;
    snprintf(e->filename, sizeof(e->filename), "codes-%" PRId64, e->job.id);
    return QN_OK;
}

static const char *const codes_export_header[] = {"code", "status"};
static const char *const codes_export_start[] = {"-9223372036854775808"};
static const export_spec codes_export = {
    .ds = CODES_DS,
    .sheet_name = "codes",
    .header = codes_export_header,
    .ncols = 2,
    .numeric_mask = 1u << 1,
    .page_sql = "SELECT code, status, id FROM t_exchange_code "
                "WHERE batch_id = $1::bigint AND id > $2::bigint ORDER BY id LIMIT $3::integer",
    .nfixed = 1,
    .nkey = 1,
    .key_start = codes_export_start,
    .prepare = codes_export_prepare,
};

static void codes_find_handler(http_req *req, void *arg)
{
    const codes_ctx *ctx = arg;
    madmin_job_by_id(&ctx->head, req, sizeof(codes_req), NULL, "batchId", CODES_DS,
                     codes_find_work);
}

static void codes_export_handler(http_req *req, void *arg)
{
    codes_ctx *ctx = arg;
    export_by_id(&ctx->head, ctx->exports, req, "batchId", &codes_export);
}

/* ------------------------------------------------------------------ generator */

int64_t codes_chunk_want(int64_t count, int64_t generated)
{
    int64_t want = count - generated;
    if (want > CODES_CHUNK)
        want = CODES_CHUNK;
    return want > 0 ? want : 0;
}

/* A chunk's progress, $1 generated of batch $2; with the last, the batch is ready. */
/* clang-format off */
static const char codes_progress_sql[] =
    "UPDATE t_exchange_code_batch SET generated = $1::integer, update_time = now() "
    "WHERE id = $2::bigint";
static const char codes_progress_ready_sql[] =
    "UPDATE t_exchange_code_batch SET generated = $1::integer, "
    "status = " CODES_BATCH_TEXT(READY) ", update_time = now() WHERE id = $2::bigint";
/* clang-format on */

/*
 * One chunk in one transaction. *progress gets `generated` after it, *done 1 when the batch
 * is complete (or not generating any more). When slice_over, the transaction also hands the
 * rest over to a new codes.generate event.
 */
static qn_status codes_chunk(const codes_ctx *ctx, pgpool_conn *conn, int64_t batch_id,
                             int slice_over, const mq_envelope *env, int64_t *progress, int *done)
{
    pgparam_array ids = {0}, codes = {0};
    pgparam p = {0};
    PGresult *r = NULL;
    qn_status st = QN_ERR;
    int64_t inserted = 0;

    *done = 0;
    if (pgpool_begin(conn) != QN_OK)
        goto fail;
    /* The row lock serialises replicas and redeliveries working on the same batch. */
    pgparam_i64(&p, batch_id);
    r = pgpool_exec(conn,
                    "SELECT count, generated, status, coupon_template_id, shop_number "
                    "FROM t_exchange_code_batch WHERE id = $1::bigint FOR UPDATE",
                    p.n, p.v);
    if (!r)
        goto fail;
    if (PQntuples(r) == 0 || atoi(PQgetvalue(r, 0, 2)) != CODES_BATCH_GENERATING) {
        *done = 1;
        *progress = PQntuples(r) ? strtoll(PQgetvalue(r, 0, 1), NULL, 10) : 0;
        st = pgpool_commit(conn);
        goto out;
    }
    int64_t count = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    int64_t generated = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    int64_t tpl_id = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    int64_t shop = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
    PQclear(r);
    r = NULL;

    int64_t want = codes_chunk_want(count, generated);
    if (want > 0) {
        for (int64_t i = 0; i < want; i++) {
            int64_t id = 0;
            char code[EXCODE_LEN + 1];
            if (ids_next(service_ids(ctx->head.svc), &id) != QN_OK ||
                excode_generate(ctx->cfg.code_secret, code) != QN_OK)
                goto fail;
            pgparam_array_i64(&ids, id);
            pgparam_array_str(&codes, code);
        }
        pgparam_truncate(&p, 0);
        if (pgparam_array_bind(&p, &ids) != QN_OK)
            goto fail;
        pgparam_i64(&p, batch_id);
        pgparam_i64(&p, tpl_id);
        pgparam_i64(&p, shop);
        if (pgparam_array_bind(&p, &codes) != QN_OK ||
            pgpool_exec_cmd(conn,
                            "INSERT INTO t_exchange_code (id, batch_id, coupon_template_id, "
                            "shop_number, code) SELECT i, $2::bigint, $3::bigint, $4::bigint, c "
                            "FROM unnest($1::bigint[], $5::text[]) AS u(i, c) "
                            "ON CONFLICT (code) DO NOTHING",
                            p.n, p.v, &inserted) != QN_OK)
            goto fail;
    }
    generated += inserted;
    *done = generated >= count;
    pgparam_truncate(&p, 0);
    pgparam_i64(&p, generated);
    pgparam_i64(&p, batch_id);
    if (pgpool_exec_cmd(conn, *done ? codes_progress_ready_sql : codes_progress_sql, p.n, p.v,
                        NULL) != QN_OK)
        goto fail;
    if (!*done && slice_over &&
        codes_outbox(conn, batch_id, generated, env->request_id, env->traceparent) != QN_OK)
        goto fail;
    if (pgpool_commit(conn) != QN_OK)
        goto fail;
    *progress = generated;
    st = QN_OK;
    goto out;
fail:
    log_warn(NULL, "code batch %" PRId64 ": chunk failed: %s", batch_id, pgpool_conn_error(conn));
    (void)pgpool_rollback(conn);
    st = QN_ERR;
out:
    PQclear(r);
    pgparam_array_free(&ids);
    pgparam_array_free(&codes);
    return st;
}

static mq_handler_result codes_on_generate(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg)
{
    (void)info;
    const codes_ctx *ctx = arg;
    jsonin_err err = {{0}};
    int64_t batch_id = 0, progress = 0;
    int done = 0;
    if (jsonin_int64(env->data, "batchId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &batch_id, &err) !=
        QN_OK) {
        log_error(NULL, "codes.generate %s: %s", env->key, err.msg);
        return MQ_DEAD;
    }
    pgpool_conn *conn = pgpool_acquire(service_pg(ctx->head.svc, CODES_DS), CODES_ACQUIRE_MS);
    if (!conn)
        return MQ_RETRY;
    int64_t start = now_mono_ms();
    mq_handler_result res = MQ_ACK;
    while (!done) {
        int slice_over = now_mono_ms() - start >= CODES_SLICE_MS;
        if (codes_chunk(ctx, conn, batch_id, slice_over, env, &progress, &done) != QN_OK) {
            res = MQ_RETRY;
            break;
        }
        if (slice_over && !done) {
            log_info(NULL, "code batch %" PRId64 ": %" PRId64 " so far, continuing later", batch_id,
                     progress);
            break;
        }
    }
    pgpool_release(conn);
    if (done)
        log_info(NULL, "code batch %" PRId64 ": %" PRId64 " codes ready", batch_id, progress);
    return res;
}

/* ------------------------------------------------------------------ the module */

static qn_status codes_start(service *s, void **state)
{
    qn_status st = madmin_ctx_new(s, sizeof(codes_ctx), state);
    if (st != QN_OK)
        return st;
    codes_ctx *ctx = *state;
    ctx->cfg = codes_cfg;
    return export_ctx_of(s, &ctx->exports);
}

static const config_var codes_vars[] = {
    EXCODE_CONFIG_VAR(codes_settings),
};

const service_module codes_module = {
    .name = "codes",
    .vars = codes_vars,
    .nvars = sizeof(codes_vars) / sizeof(codes_vars[0]),
    .settings = &codes_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/merchant-admin/coupon-template/exchange-code/create",
             codes_create_handler, HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/exchange-code/find", codes_find_handler,
             HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/exchange-code/export",
             codes_export_handler, HTTP_NEED_SHOP},
            {0},
        },
    .consumers =
        (const service_consumer[]){
            /* write a batch's codes, a slice at a time */
            {"merchant-admin.code-generate", (const char *const[]){EVENT_CODES_GENERATE, NULL},
             codes_on_generate},
            {0},
        },
    .start = codes_start,
    .free = madmin_ctx_free,
};
