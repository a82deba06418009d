/*
 * Coupon templates of the merchant back office (docs/api.md, merchant-admin): create, page, find,
 * increase-number, change-buckets, terminate, log, and the template.ended consumer.
 *
 * Every route is scoped to the caller's shop (X-Shop-Number): the shop number is part of every
 * WHERE, so another shop's template answers 404 exactly like a missing one.
 *
 * Writes run in one pgpool job each: BEGIN, the row change, the operation-log row (before and
 * after as jsonb) and, for create, the outbox timer that ends the template at validEndTime,
 * COMMIT. Create sets the new id's bloom filter bits before the job (no Redis, nothing
 * created: 503), so no kill -9 can leave a template the engine's filter does not know. Redis
 * follows the commit on the loop: the cache hashes of every stock bucket (bucket.h:
 * template_cache_put.lua, whole or nothing, expiring at validEndTime); HINCRBY on bucket 0 /
 * HSET on every bucket, only if the hash exists, for increase-number / terminate. If a Redis step
 * fails after the commit, the database is still the truth: the engine's query chain rebuilds a
 * missing hash from it. A change of stockBuckets writes only the row: the engine's re-layout
 * (services/engine/relayout.h) closes the old number's buckets and rebuilds them on the new.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "templates.h"
#include "bloom.h"
#include "bucket.h"
#include "events.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "madmin.h"
#include "now.h"
#include "pgparam.h"
#include "reqjob.h"
#include "shard.h"
#include "task.h"
#include "template.h"

#define TM_TEXT_MAX     1024          /* usageInstructions, explanationOfUnmetConditions */
#define TM_MONEY_MAX    10000000000LL /* 100,000,000.00 yuan in cents */
#define TM_VALIDITY_MAX (24 * 365 * 10)
#define TM_LOG_ROWS_MAX 1000

#define TM_PEAK_MAX 100000000 /* expectedPeakPerSecond */

typedef struct tm_settings {
    int64_t bloom_expected; /* as the engine's: both compute one bloom_params */
    int64_t bloom_fp_per_million;
    int64_t claims_per_master; /* one template's claims a second one Redis master carries */
} tm_settings;

static tm_settings tm_cfg;

/* The module's context. */
typedef struct tm_ctx {
    madmin_ctx head;
    redis_client *redis;
    bloom_params bloom;     /* of the settings, as the engine's */
    redis_sync *sync_redis; /* the template.ended consumer thread's own client */
} tm_ctx;

/* One request's job, from the handler through the pgpool work to the reply (reqjob.h). */
typedef struct tm_job {
    reqjob rj; /* first: the request and the reply being prepared */
    tm_ctx *ctx;
    int ds;
    char table[64], log_table[64];
    int64_t shop, user_id, id, number;
    char who[96];
    int op;             /* increase-number, terminate, change-buckets: TM_OP_... */
    int buckets;        /* increase-number, terminate: the stockBuckets asked (0: not given) */
    int stored_buckets; /* ... and the template's, as the row says */
    int relayout_from;  /* the row's change of buckets under way: from that many (0: none) */
    int changed_from;   /* this request changed the buckets from that many (0: it did not) */
    int pending;        /* terminate: the bucket hashes whose status is not yet answered */
    tpl t;              /* create */
    char *log_text;     /* create */
    /* page filters (NULL / -1 when absent) */
    char *name_like, *goods_like;
    int type, target, status;
    madmin_page page;
} tm_job;

enum { TM_OP_INCREASE, TM_OP_TERMINATE, TM_OP_BUCKETS }; /* tm_job.op */

static void tm_job_clear(reqjob *rj)
{
    tm_job *j = (tm_job *)rj;
    tpl_clear(&j->t);
    free(j->log_text);
    free(j->name_like);
    free(j->goods_like);
}

/* The job of req, routed to its shop's shard; NULL after replying when there is none or when
 * out of memory. */
static tm_job *tm_job_new(tm_ctx *ctx, http_req *req)
{
    tm_job *j = reqjob_new(req, sizeof(*j), tm_job_clear);
    if (!j)
        return NULL;
    j->ctx = ctx;
    j->shop = req->shop_number;
    j->user_id = req->user_id;
    j->type = j->target = j->status = -1;
    if (req->username)
        snprintf(j->who, sizeof(j->who), "%s (user %" PRId64 ")", req->username, req->user_id);
    else
        snprintf(j->who, sizeof(j->who), "user %" PRId64, req->user_id);
    shard_route r, lr;
    if (shard_route_for("t_coupon_template", j->shop, &r) != QN_OK ||
        shard_route_for("t_coupon_template_log", j->shop, &lr) != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_INTERNAL, "no shard for the shop");
        return NULL;
    }
    j->ds = r.ds;
    snprintf(j->table, sizeof(j->table), "%s", r.table);
    snprintf(j->log_table, sizeof(j->log_table), "%s", lr.table);
    return j;
}

/* A job its work refused or failed is answered (and freed): returns 1 then. */
static int tm_replied_error(qn_status st, tm_job *j)
{
    if (st == QN_OK && !reqjob_failed(&j->rj))
        return 0;
    reqjob_reply(&j->rj, st);
    return 1;
}

static void tm_submit(tm_job *j, pgpool_work_fn work, pgpool_done_fn done)
{
    reqjob_submit(&j->rj, service_pg(j->ctx->head.svc, j->ds), work, done);
}

/* A database failure inside a work function: logged, rolled back; the status to answer. */
static qn_status tm_work_fail(pgpool_conn *c, tm_job *j, const char *what)
{
    qn_status st = reqjob_db_fail(c); /* before the rollback touches the connection */
    log_error(NULL, "templates: %s failed (template %" PRId64 ", shop %" PRId64 "): %s", what,
              j->id, j->shop, pgpool_conn_error(c));
    (void)pgpool_rollback(c);
    return st;
}

static void tm_not_found(tm_job *j)
{
    reqjob_fail(&j->rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template");
}

/* The operation-log row; before/after are jsonb text or NULL. */
static qn_status tm_log_insert(pgpool_conn *c, const char *log_table, int64_t log_id, int64_t shop,
                               int64_t tpl_id, int64_t operator_id, const char *text,
                               const char *before, const char *after)
{
    char sql[384];
    pgparam p = {0};
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s (id, shop_number, coupon_template_id, operator_id, operation_log, "
             "original_data, modified_data) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb)",
             log_table);
    pgparam_i64(&p, log_id);
    pgparam_i64(&p, shop);
    pgparam_i64(&p, tpl_id);
    if (operator_id > 0)
        pgparam_i64(&p, operator_id);
    else
        pgparam_null(&p);
    pgparam_str(&p, text);
    pgparam_str(&p, before);
    pgparam_str(&p, after);
    return pgpool_exec_cmd(c, sql, p.n, p.v, NULL);
}

/* The row as jsonb text (owned), locked FOR UPDATE; *status gets its status, *stock and
 * *buckets (if not NULL) its stock and stockBuckets, j->relayout_from its change of buckets
 * under way. NULL with *found 0 when absent, NULL with *found 1 on a database error. */
static char *tm_lock_row(pgpool_conn *c, tm_job *j, int *status, int64_t *stock, int *buckets,
                         int *found)
{
    char sql[320];
    pgparam p = {0};
    snprintf(sql, sizeof(sql),
             "SELECT status, stock, to_jsonb(t)::text, stock_buckets, "
             "coalesce(buckets_relayout_from, 0) FROM %s t WHERE id = $1 AND "
             "shop_number = $2 AND del_flag = 0 FOR UPDATE",
             j->table);
    pgparam_i64(&p, j->id);
    pgparam_i64(&p, j->shop);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    *found = 1;
    if (!r)
        return NULL;
    char *out = NULL;
    if (PQntuples(r) == 1) {
        *status = atoi(PQgetvalue(r, 0, 0));
        if (stock)
            *stock = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        if (buckets)
            *buckets = atoi(PQgetvalue(r, 0, 3));
        j->relayout_from = atoi(PQgetvalue(r, 0, 4));
        out = strdup(PQgetvalue(r, 0, 2));
    } else {
        *found = 0;
    }
    PQclear(r);
    return out;
}

/* UPDATE ... RETURNING the new row as jsonb text (owned); NULL on error or when cond (extra
 * SQL of the WHERE, "" for none) leaves no row. arg3, if not NULL, is $3 of set or cond. */
static char *tm_update_row(pgpool_conn *c, const tm_job *j, const char *set, const char *cond,
                           const int64_t *arg3)
{
    char sql[384];
    pgparam p = {0};
    snprintf(sql, sizeof(sql),
             "UPDATE %s t SET %s, update_time = now() WHERE id = $1 AND shop_number = $2%s "
             "RETURNING to_jsonb(t)::text",
             j->table, set, cond);
    pgparam_i64(&p, j->id);
    pgparam_i64(&p, j->shop);
    if (arg3)
        pgparam_i64(&p, *arg3);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return NULL;
    char *out = PQntuples(r) == 1 ? strdup(PQgetvalue(r, 0, 0)) : NULL;
    PQclear(r);
    return out;
}

/* The values a body or a filter may give. */
static const int tm_sources[] = {TPL_SOURCE_SHOP, TPL_SOURCE_PLATFORM};
static const int tm_targets[] = {TPL_TARGET_GOODS, TPL_TARGET_SHOP};
static const int tm_types[] = {TPL_TYPE_FIXED, TPL_TYPE_THRESHOLD, TPL_TYPE_PERCENT};
static const int tm_statuses[] = {TPL_STATUS_ACTIVE, TPL_STATUS_ENDED};
#define TM_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The SET of terminate and of the end, and the end's condition (tm_update_row). */
static const char tm_set_ended[] = "status = " TPL_STATUS_TEXT(ENDED);
static const char tm_if_active[] = " AND status = " TPL_STATUS_TEXT(ACTIVE);

static void tm_end_key(char *buf, size_t len, int64_t id)
{
    snprintf(buf, len, EVENT_TEMPLATE_ENDED ":%" PRId64, id);
}

/* ================================================================ create */

int templates_auto_buckets(int64_t stock, int64_t peak, int masters, int64_t per_master)
{
    if (peak <= 0 || per_master <= 0 || masters <= 1)
        return 1;
    int64_t n = (peak + per_master - 1) / per_master; /* the masters' threads the peak needs */
    if (n > masters)
        n = masters; /* two buckets on one master spread nothing */
    if (n > stock / TEMPLATES_BUCKET_SHARE_MIN)
        n = stock / TEMPLATES_BUCKET_SHARE_MIN; /* a few units a bucket: transfers, not claims */
    if (n > TPL_BUCKETS_MAX)
        n = TPL_BUCKETS_MAX;
    return n < 1 ? 1 : (int)n;
}

/* The Redis masters the service's client sees (1 for a lone server or Sentinel). */
static int tm_masters(redis_client *c)
{
    int n = 0;
    for (int i = 0; i < redis_client_node_count(c); i++)
        n += redis_client_node_master(c, i) != 0;
    return n < 1 ? 1 : n;
}

/* stockBuckets of a create that named none, from expectedPeakPerSecond (optional): QN_EINVAL
 * with err for a bad one. */
static qn_status tm_create_buckets(const tm_ctx *ctx, const cJSON *body, tpl *t, jsonin_err *err)
{
    int64_t peak = 0;
    if (jsonin_int64(body, "expectedPeakPerSecond", JSONIN_OPTIONAL, 0, 1, TM_PEAK_MAX, &peak,
                     err) != QN_OK)
        return QN_EINVAL;
    if (!cJSON_GetObjectItemCaseSensitive(body, "stockBuckets"))
        t->buckets = templates_auto_buckets(t->stock, peak, tm_masters(ctx->redis),
                                            tm_cfg.claims_per_master);
    return QN_OK;
}

qn_status templates_create_parse(const cJSON *b, int64_t now_ms, tpl *t, jsonin_err *err)
{
    const char *name = NULL, *goods = NULL, *usage = NULL, *expl = NULL;
    int64_t stock = 0, limit = 0, terms = 0, maxd = 0, validity = 0;
    cJSON *rr = NULL, *cr = NULL, *rr_out = NULL, *cr_out = NULL;
    qn_status st = QN_EINVAL;

    if (!cJSON_IsObject(b)) {
        jsonin_errf(err, "body", "must be a JSON object");
        goto done;
    }
    if (jsonin_string(b, "name", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, TPL_NAME_MAX, &name, err) ||
        jsonin_enum_int(b, "source", JSONIN_REQUIRED, 0, tm_sources, TM_COUNT(tm_sources),
                        &t->source, err) ||
        jsonin_enum_int(b, "target", JSONIN_REQUIRED, 0, tm_targets, TM_COUNT(tm_targets),
                        &t->target, err) ||
        jsonin_string(b, "goods", JSONIN_OPTIONAL, 0, TPL_GOODS_MAX, &goods, err) ||
        jsonin_enum_int(b, "type", JSONIN_REQUIRED, 0, tm_types, TM_COUNT(tm_types), &t->type,
                        err) ||
        jsonin_time_ms(b, "validStartTime", JSONIN_REQUIRED, 0, &t->valid_start_ms, err) ||
        jsonin_time_ms(b, "validEndTime", JSONIN_REQUIRED, 0, &t->valid_end_ms, err) ||
        jsonin_int64(b, "stock", JSONIN_REQUIRED, 0, 1, TPL_STOCK_MAX, &stock, err) ||
        jsonin_int(b, "stockBuckets", JSONIN_OPTIONAL, 1, 1, TPL_BUCKETS_MAX, &t->buckets, err))
        goto done;
    /* goods iff goods-specific; white space alone is no product. */
    int has_goods = goods && goods[strspn(goods, " \t\r\n")] != '\0';
    if (t->target == TPL_TARGET_GOODS && !has_goods) {
        jsonin_errf(err, "goods", "required when target is 0 (goods-specific)");
        goto done;
    }
    if (t->target == TPL_TARGET_SHOP && goods && goods[0]) {
        jsonin_errf(err, "goods", "must be empty when target is 1 (whole shop)");
        goto done;
    }
    if (t->valid_end_ms <= t->valid_start_ms) {
        jsonin_errf(err, "validEndTime", "must be after validStartTime");
        goto done;
    }
    if (t->valid_end_ms <= now_ms) {
        jsonin_errf(err, "validEndTime", "must be in the future");
        goto done;
    }

    if (jsonin_object(b, "receiveRule", JSONIN_REQUIRED, &rr, err) ||
        jsonin_object(b, "consumeRule", JSONIN_REQUIRED, &cr, err))
        goto done;
    if (jsonin_int64(rr, "limitPerPerson", JSONIN_REQUIRED, 0, 1, TPL_LIMIT_MAX, &limit, err) ||
        jsonin_string(rr, "usageInstructions", JSONIN_OPTIONAL, 0, TM_TEXT_MAX, &usage, err)) {
        jsonin_err_prefix(err, "receiveRule");
        goto done;
    }
    /* termsOfUse: the threshold of type 1 (> 0) and of type 2 (>= 0); optional for type 0. */
    unsigned terms_flags = t->type == TPL_TYPE_FIXED ? JSONIN_OPTIONAL : JSONIN_REQUIRED;
    int64_t terms_min = t->type == TPL_TYPE_THRESHOLD ? 1 : 0;
    if (jsonin_money_cents(cr, "termsOfUse", terms_flags, -1, terms_min, TM_MONEY_MAX, &terms,
                           err) ||
        jsonin_money_cents(cr, "maximumDiscountAmount", JSONIN_REQUIRED, 0, 1, TM_MONEY_MAX, &maxd,
                           err) ||
        jsonin_string(cr, "explanationOfUnmetConditions", JSONIN_OPTIONAL, 0, TM_TEXT_MAX, &expl,
                      err) ||
        jsonin_int64(cr, "validityPeriod", JSONIN_REQUIRED, 0, 1, TM_VALIDITY_MAX, &validity,
                     err)) {
        jsonin_err_prefix(err, "consumeRule");
        goto done;
    }
    int rate = 0;
    if (t->type == TPL_TYPE_PERCENT) {
        const cJSON *rv = cJSON_GetObjectItemCaseSensitive(cr, "discountRate");
        if (!rv || cJSON_IsNull(rv) || (cJSON_IsString(rv) && !rv->valuestring[0])) {
            jsonin_errf(err, "consumeRule.discountRate", "required when type is 2 (percent off)");
            goto done;
        }
        rate = tpl_parse_rate(rv);
        if (rate <= 0 || rate >= TPL_RATE_SCALE) {
            jsonin_errf(err, "consumeRule.discountRate",
                        "must be a fraction paid between 0 and 1 (exclusive), at most 4 decimals");
            goto done;
        }
    }

    /* Normalised rules: numbers, money in yuan, only the fields that mean something. */
    rr_out = cJSON_CreateObject();
    cr_out = cJSON_CreateObject();
    if (!rr_out || !cr_out)
        goto oom;
    cJSON_AddNumberToObject(rr_out, "limitPerPerson", (double)limit);
    cJSON_AddStringToObject(rr_out, "usageInstructions", usage ? usage : "");
    if (terms >= 0)
        cJSON_AddItemToObject(cr_out, "termsOfUse", jsonin_cents_to_json(terms));
    cJSON_AddItemToObject(cr_out, "maximumDiscountAmount", jsonin_cents_to_json(maxd));
    if (t->type == TPL_TYPE_PERCENT)
        cJSON_AddNumberToObject(cr_out, "discountRate", (double)rate / TPL_RATE_SCALE);
    cJSON_AddStringToObject(cr_out, "explanationOfUnmetConditions", expl ? expl : "");
    cJSON_AddNumberToObject(cr_out, "validityPeriod", (double)validity);

    t->name = strdup(name);
    t->goods = strdup(t->target == TPL_TARGET_GOODS ? goods : "");
    t->receive_rule = cJSON_PrintUnformatted(rr_out);
    t->consume_rule = cJSON_PrintUnformatted(cr_out);
    if (!t->name || !t->goods || !t->receive_rule || !t->consume_rule)
        goto oom;
    t->stock = stock;
    t->status = TPL_STATUS_ACTIVE;
    if (tpl_parse_rules(t) != QN_OK) {
        jsonin_errf(err, "consumeRule", "cannot be read back");
        goto done;
    }
    st = QN_OK;
    goto done;
oom:
    st = QN_ENOMEM;
done:
    cJSON_Delete(rr);
    cJSON_Delete(cr);
    cJSON_Delete(rr_out);
    cJSON_Delete(cr_out);
    return st;
}

static char *tm_create_log_text(const tm_job *j)
{
    static const char *const targets[] = {"goods-specific", "whole shop"};
    static const char *const types[] = {"amount off", "threshold amount off", "percent off"};
    char start[JSONIN_TIME_LEN], end[JSONIN_TIME_LEN], *out = NULL;
    jsonin_time_format(j->t.valid_start_ms, start);
    jsonin_time_format(j->t.valid_end_ms, end);
    if (asprintf(&out,
                 "%s created coupon template: %s, target: %s, type: %s, stock: %" PRId64
                 ", goods: %s, valid from %s to %s, receive rule: %s, consume rule: %s",
                 j->who, j->t.name, targets[j->t.target], types[j->t.type], j->t.stock,
                 j->t.goods[0] ? j->t.goods : "-", start, end, j->t.receive_rule,
                 j->t.consume_rule) < 0)
        return NULL;
    return out;
}

static qn_status tm_create_work(pgpool_conn *c, void *arg)
{
    tm_job *j = arg;
    int64_t log_id;
    char data[96], key[64], sql[320];
    pgparam p = {0};
    if (ids_next(service_ids(j->ctx->head.svc), &log_id) != QN_OK) {
        reqjob_fail(&j->rj, ERRCODE_UNAVAILABLE, "id generator unavailable");
        return QN_OK;
    }
    if (pgpool_begin(c) != QN_OK)
        return tm_work_fail(c, j, "begin");
    if (tpl_db_insert(c, &j->t) != QN_OK)
        return tm_work_fail(c, j, "insert template");
    /* The log's "after" is the row as stored (defaults included). */
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s (id, shop_number, coupon_template_id, operator_id, operation_log, "
             "original_data, modified_data) SELECT $1, $2, t.id, $4, $5, NULL, to_jsonb(t) "
             "FROM %s t WHERE t.id = $3",
             j->log_table, j->table);
    pgparam_i64(&p, log_id);
    pgparam_i64(&p, j->shop);
    pgparam_i64(&p, j->id);
    pgparam_i64(&p, j->user_id);
    pgparam_str(&p, j->log_text);
    if (pgpool_exec_cmd(c, sql, p.n, p.v, NULL) != QN_OK)
        return tm_work_fail(c, j, "insert log");
    snprintf(data, sizeof(data), "{\"id\":\"%" PRId64 "\",\"shopNumber\":\"%" PRId64 "\"}", j->id,
             j->shop);
    tm_end_key(key, sizeof(key), j->id);
    outbox_event ev = {.routing_key = EVENT_TEMPLATE_ENDED,
                       .key = key,
                       .data_json = data,
                       .request_id = j->rj.request_id,
                       .traceparent = j->rj.traceparent,
                       .due_at_ms = j->t.valid_end_ms};
    if (outbox_add(c, &ev) != QN_OK)
        return tm_work_fail(c, j, "outbox timer");
    if (pgpool_commit(c) != QN_OK)
        return tm_work_fail(c, j, "commit");
    return QN_OK;
}

/* 200 {id}. */
static void tm_create_reply(tm_job *j)
{
    cJSON *d = cJSON_CreateObject();
    if (d)
        cJSON_AddItemToObject(d, "id", jsonin_id_to_json(j->id));
    j->rj.data = d;
    reqjob_reply(&j->rj, QN_OK);
}

static void tm_cache_put_done(qn_status st, void *arg)
{
    tm_job *j = arg;
    if (st != QN_OK)
        log_warn(&j->rj.req->log,
                 "templates: cache of %" PRId64 " not written (%s); the engine "
                 "rebuilds it from the database",
                 j->id, qn_status_str(st));
    tm_create_reply(j);
}

static void tm_create_done(qn_status st, void *arg)
{
    tm_job *j = arg;
    if (tm_replied_error(st, j))
        return;
    log_infof(&j->rj.req->log,
              ((log_field[]){LOG_I("template_id", j->id), LOG_I("shop", j->shop), LOG_END}),
              "coupon template created");
    /* every bucket's hash, each its share of the stock, the template's own last (bucket.h) */
    qn_status rs = bucket_cache_put(j->ctx->redis, &j->t, j->t.stock, tm_cache_put_done, j);
    if (rs != QN_OK)
        tm_cache_put_done(rs, j);
}

static void tm_create_bloomed(qn_status st, void *arg)
{
    tm_job *j = arg;
    if (st == QN_ECONFLICT) /* a filter of other parameters: the template is made all the same */
        log_error(&j->rj.req->log,
                  "templates: the bloom filter has other parameters; run quan-bloom-rebuild");
    else if (st != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_UNAVAILABLE,
                           "template store unavailable; nothing was created, try again");
        return;
    }
    tm_submit(j, tm_create_work, tm_create_done);
}

static void tm_h_create(http_req *req, void *arg)
{
    tm_ctx *ctx = arg;
    tm_job *j = tm_job_new(ctx, req);
    if (!j)
        return;
    jsonin_err err;
    qn_status st = templates_create_parse(http_body_json(req), now_wall_ms(), &j->t, &err);
    if (st == QN_ENOMEM) {
        reqjob_fail(&j->rj, ERRCODE_INTERNAL, "out of memory");
        goto reply;
    }
    if (st == QN_OK)
        st = tm_create_buckets(ctx, http_body_json(req), &j->t, &err);
    if (st != QN_OK) {
        reqjob_fail(&j->rj, ERRCODE_INVALID, "%s", err.msg);
        goto reply;
    }
    if (ids_next(service_ids(ctx->head.svc), &j->id) != QN_OK) {
        reqjob_fail(&j->rj, ERRCODE_UNAVAILABLE, "id generator unavailable");
        goto reply;
    }
    j->t.id = j->id;
    j->t.shop_number = j->shop;
    if (!(j->log_text = tm_create_log_text(j))) {
        reqjob_fail(&j->rj, ERRCODE_INTERNAL, "out of memory");
        goto reply;
    }
    /* The id joins the bloom filter before the row exists: a process killed between the commit
     * and a later add would leave a real template that every query answers "not found". An id
     * whose row never comes costs a database read per query of it, nothing more. */
    if (bloom_add(ctx->redis, KEYS_TEMPLATE_BLOOM, &ctx->bloom, j->id, tm_create_bloomed, j) !=
        QN_OK)
        tm_create_bloomed(QN_ERR, j);
    return;
reply:
    reqjob_reply(&j->rj, QN_OK);
}

/* ================================================================ reads */

/* couponTemplateId from the JSON body or the query string; replies 400 on failure. */
static qn_status tm_param_id(http_req *req, int64_t *out)
{
    jsonin_err err;
    const cJSON *b = http_body_json(req);
    qn_status st;
    if (cJSON_IsObject(b) && jsonin_present(b, "couponTemplateId"))
        st = jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, out, &err);
    else
        st = jsonin_parse_int64_str("couponTemplateId", http_query(req, "couponTemplateId"),
                                    JSONIN_REQUIRED, 0, 1, INT64_MAX, out, &err);
    if (st != QN_OK)
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
    return st;
}

static qn_status tm_find_work(pgpool_conn *c, void *arg)
{
    tm_job *j = arg;
    tpl t;
    qn_status st = tpl_db_load(c, j->shop, j->id, &t);
    if (st == QN_ENOTFOUND) {
        tm_not_found(j);
        return QN_OK;
    }
    if (st != QN_OK)
        return tm_work_fail(c, j, "find");
    j->rj.data = tpl_to_json(&t);
    tpl_clear(&t);
    return QN_OK;
}

/* The job of a request naming template id (number: increase-number's), then work and done. */
static void tm_start(tm_ctx *ctx, http_req *req, int64_t id, int64_t number, pgpool_work_fn work,
                     pgpool_done_fn done)
{
    tm_job *j = tm_job_new(ctx, req);
    if (!j)
        return;
    j->id = id;
    j->number = number;
    tm_submit(j, work, done);
}

static void tm_h_find(http_req *req, void *arg)
{
    int64_t id;
    if (tm_param_id(req, &id) == QN_OK)
        tm_start(arg, req, id, 0, tm_find_work, reqjob_done);
}

char *templates_like_pattern(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(2 * n + 3), *p = out;
    if (!out)
        return NULL;
    *p++ = '%';
    for (; *s; s++) {
        if (*s == '\\' || *s == '%' || *s == '_')
            *p++ = '\\';
        *p++ = *s;
    }
    *p++ = '%';
    *p = '\0';
    return out;
}

static qn_status tm_page_work(pgpool_conn *c, void *arg)
{
    tm_job *j = arg;
    char where[512], sql[1024];
    pgparam p = {0};
    snprintf(where, sizeof(where),
             "shop_number = $1 AND del_flag = 0 AND ($2::text IS NULL OR name LIKE $2 ESCAPE "
             "'\\') AND ($3::text IS NULL OR goods LIKE $3 ESCAPE '\\') AND ($4::int IS NULL "
             "OR type = $4) AND ($5::int IS NULL OR target = $5) AND ($6::int IS NULL OR "
             "status = $6)");
    /* A filter left out (< 0) is NULL, which its condition lets through. */
    const int filters[] = {j->type, j->target, j->status};
    pgparam_i64(&p, j->shop);
    pgparam_str(&p, j->name_like);
    pgparam_str(&p, j->goods_like);
    for (size_t i = 0; i < sizeof(filters) / sizeof(filters[0]); i++) {
        if (filters[i] >= 0)
            pgparam_i64(&p, filters[i]);
        else
            pgparam_null(&p);
    }
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE %s", j->table, where);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return tm_work_fail(c, j, "page count");
    int64_t total = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    pgparam_i64(&p, j->page.size);
    pgparam_i64(&p, madmin_page_offset(&j->page));
    snprintf(sql, sizeof(sql),
             "SELECT " TPL_DB_COLUMNS " FROM %s WHERE %s ORDER BY id DESC LIMIT $7 OFFSET $8",
             j->table, where);
    if (!(r = pgpool_exec(c, sql, p.n, p.v)))
        return tm_work_fail(c, j, "page");
    cJSON *recs = cJSON_CreateArray();
    for (int i = 0; recs && i < PQntuples(r); i++) {
        tpl t;
        if (tpl_from_row(r, i, &t) != QN_OK)
            continue; /* a row whose rules cannot be read is skipped, not fatal */
        cJSON_AddItemToArray(recs, tpl_to_json(&t));
        tpl_clear(&t);
    }
    PQclear(r);
    if (!(j->rj.data = madmin_page_json(recs, total, &j->page)))
        return QN_ENOMEM;
    return QN_OK;
}

/* A query-string text filter: valid UTF-8 of at most max characters, as a LIKE pattern. */
static qn_status tm_text_filter(http_req *req, const char *field, size_t max, char **out,
                                jsonin_err *err)
{
    const char *q = http_query(req, field);
    const char *s = NULL;
    if (!q || !*q)
        return QN_OK;
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, field, q)) {
        cJSON_Delete(o);
        return QN_ENOMEM;
    }
    qn_status st = jsonin_string(o, field, JSONIN_OPTIONAL, 0, max, &s, err);
    if (st == QN_OK && !(*out = templates_like_pattern(q)))
        st = QN_ENOMEM;
    cJSON_Delete(o);
    return st;
}

static void tm_h_page(http_req *req, void *arg)
{
    jsonin_err err;
    qn_status st = QN_OK;
    tm_job *j = tm_job_new(arg, req);
    if (!j)
        return;
    if (madmin_page_parse(http_query(req, "current"), http_query(req, "size"), MADMIN_SIZE_CAP,
                          &j->page, &err) ||
        jsonin_parse_enum_str("type", http_query(req, "type"), JSONIN_OPTIONAL, -1, tm_types,
                              TM_COUNT(tm_types), &j->type, &err) ||
        jsonin_parse_enum_str("target", http_query(req, "target"), JSONIN_OPTIONAL, -1, tm_targets,
                              TM_COUNT(tm_targets), &j->target, &err) ||
        jsonin_parse_enum_str("status", http_query(req, "status"), JSONIN_OPTIONAL, -1, tm_statuses,
                              TM_COUNT(tm_statuses), &j->status, &err) ||
        (st = tm_text_filter(req, "name", TPL_NAME_MAX, &j->name_like, &err)) != QN_OK ||
        (st = tm_text_filter(req, "goods", TPL_GOODS_MAX, &j->goods_like, &err)) != QN_OK) {
        if (st == QN_ENOMEM) /* not the caller's fault, and err holds no message */
            reqjob_reply_error(&j->rj, ERRCODE_INTERNAL, "out of memory");
        else
            reqjob_reply_error(&j->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    tm_submit(j, tm_page_work, reqjob_done);
}

static qn_status tm_log_work(pgpool_conn *c, void *arg)
{
    tm_job *j = arg;
    char sql[512];
    pgparam p = {0};
    pgparam_i64(&p, j->shop);
    pgparam_i64(&p, j->id);
    snprintf(sql, sizeof(sql),
             "SELECT 1 FROM %s WHERE shop_number = $1 AND id = $2 AND del_flag = 0", j->table);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return tm_work_fail(c, j, "log: template");
    int found = PQntuples(r) == 1;
    PQclear(r);
    if (!found) {
        tm_not_found(j);
        return QN_OK;
    }
    snprintf(sql, sizeof(sql),
             "SELECT id, coalesce(operator_id, 0), operation_log, coalesce(original_data::text, "
             "'null'), coalesce(modified_data::text, 'null'), (extract(epoch from create_time) "
             "* 1000)::bigint FROM %s WHERE shop_number = $1 AND coupon_template_id = $2 "
             "ORDER BY create_time, id LIMIT %d",
             j->log_table, TM_LOG_ROWS_MAX);
    if (!(r = pgpool_exec(c, sql, p.n, p.v)))
        return tm_work_fail(c, j, "log");
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < PQntuples(r); i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        int64_t op = strtoll(PQgetvalue(r, i, 1), NULL, 10);
        cJSON_AddItemToObject(o, "id", jsonin_id_to_json(strtoll(PQgetvalue(r, i, 0), NULL, 10)));
        cJSON_AddItemToObject(o, "couponTemplateId", jsonin_id_to_json(j->id));
        cJSON_AddItemToObject(o, "shopNumber", jsonin_id_to_json(j->shop));
        cJSON_AddItemToObject(o, "operatorId", op ? jsonin_id_to_json(op) : cJSON_CreateNull());
        cJSON_AddStringToObject(o, "operationLog", PQgetvalue(r, i, 2));
        /* jsonin_parse keeps the 19-digit ids of the rows exact (as strings). */
        jsonin_err jerr;
        cJSON *before = jsonin_parse(PQgetvalue(r, i, 3), strlen(PQgetvalue(r, i, 3)), &jerr);
        cJSON *after = jsonin_parse(PQgetvalue(r, i, 4), strlen(PQgetvalue(r, i, 4)), &jerr);
        cJSON_AddItemToObject(o, "originalData", before ? before : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "modifiedData", after ? after : cJSON_CreateNull());
        cJSON_AddItemToObject(o, "createTime",
                              jsonin_time_to_json(strtoll(PQgetvalue(r, i, 5), NULL, 10)));
        cJSON_AddItemToArray(arr, o);
    }
    PQclear(r);
    j->rj.data = arr;
    return QN_OK;
}

static void tm_h_log(http_req *req, void *arg)
{
    int64_t id;
    if (tm_param_id(req, &id) == QN_OK)
        tm_start(arg, req, id, 0, tm_log_work, reqjob_done);
}

/* ================================================================ increase-number, terminate */

int templates_buckets_change(int stored, int relayout_from, int asked, int terminate, errcode *code,
                             char *msg, size_t len)
{
    int same = asked == 0 || asked == stored;
    if (terminate) {
        if (same)
            return TEMPLATES_BUCKETS_KEPT;
        *code = ERRCODE_INVALID;
        snprintf(msg, len, "stockBuckets: terminate does not change them");
        return TEMPLATES_BUCKETS_REFUSED;
    }
    if (relayout_from > 0) {
        *code = ERRCODE_STATE;
        snprintf(msg, len,
                 "stockBuckets: the change from %d to %d buckets is under way; try again once it "
                 "is done",
                 relayout_from, stored);
        return TEMPLATES_BUCKETS_REFUSED;
    }
    return same ? TEMPLATES_BUCKETS_KEPT : TEMPLATES_BUCKETS_CHANGED;
}

int templates_change_allowed(int status, int64_t stock, int64_t number, errcode *code, char *msg,
                             size_t len)
{
    if (status != TPL_STATUS_ACTIVE) {
        *code = ERRCODE_ENDED;
        snprintf(msg, len, "the coupon template has ended");
        return 0;
    }
    if (number > 0 && stock + number > TPL_STOCK_MAX) {
        *code = ERRCODE_INVALID;
        snprintf(msg, len, "number: the stock would exceed %d", TPL_STOCK_MAX);
        return 0;
    }
    return 1;
}

#define TM_TASKS_ACQUIRE_MS 3000

/* Whether a distribution task of the template is in progress (status RUNNING: being run, or to
 * be run now), whose chunks route users by the buckets its run read at its start. Asked while
 * the template row is locked FOR UPDATE: a run that starts meanwhile reads the row FOR SHARE
 * (distribution's taskrun.c), so it waits for this change and then sees it under way, and does
 * not start; a run that read the row before holds a task already RUNNING, found here. 1, 0, or
 * -1 when the tasks' database did not answer. */
static int tm_task_running(pgpool_conn *c, const tm_job *j)
{
    pgpool_conn *c0 = j->ds == 0 ? c
                                 : pgpool_acquire(service_pg(j->ctx->head.svc, 0),
                                                  TM_TASKS_ACQUIRE_MS); /* the tasks' database */
    pgparam p = {0};
    if (!c0)
        return -1;
    pgparam_i64(&p, j->id);
    PGresult *r = pgpool_exec(c0,
                              "SELECT 1 FROM t_coupon_task WHERE coupon_template_id = $1 AND "
                              "status = " TASK_STATUS_TEXT(RUNNING) " LIMIT 1",
                              p.n, p.v);
    int res = r ? PQntuples(r) > 0 : -1;
    if (!r)
        log_error(NULL, "templates: the tasks of %" PRId64 " cannot be read: %s", j->id,
                  pgpool_conn_error(c0));
    PQclear(r);
    if (c0 != c)
        pgpool_release(c0);
    return res;
}

/* The change's operation-log text (malloc'ed; NULL when out of memory). */
static char *tm_change_text(const tm_job *j)
{
    char *text = NULL, moved[80] = "";
    if (j->changed_from > 0)
        snprintf(moved, sizeof(moved), "changed the stock buckets from %d to %d", j->changed_from,
                 j->stored_buckets);
    int n = j->op == TM_OP_TERMINATE ? asprintf(&text, "%s terminated the coupon template", j->who)
            : j->op == TM_OP_BUCKETS ? asprintf(&text, "%s %s", j->who, moved)
                                     : asprintf(&text, "%s increased the stock by %" PRId64 "%s%s",
                                                j->who, j->number, moved[0] ? " and " : "", moved);
    return n < 0 ? NULL : text;
}

/* Shared by the three: lock the row, refuse ended ones, change it, log it, optionally cancel
 * the end timer. A change of stockBuckets writes the new number and the old one as the change
 * under way (buckets_relayout_from) in the same transaction: from its commit the engine's
 * re-layout (services/engine/relayout.h) owns the template's Redis state until it is rebuilt on
 * the new number, whatever dies meanwhile. */
static qn_status tm_change_work(pgpool_conn *c, void *arg)
{
    tm_job *j = arg;
    int status = 0, found = 0, buckets = 1;
    int64_t stock = 0, log_id;
    char *before = NULL, *after = NULL, *text = NULL;
    qn_status st = QN_ERR;
    if (ids_next(service_ids(j->ctx->head.svc), &log_id) != QN_OK) {
        reqjob_fail(&j->rj, ERRCODE_UNAVAILABLE, "id generator unavailable");
        return QN_OK;
    }
    if (pgpool_begin(c) != QN_OK)
        return tm_work_fail(c, j, "begin");
    before = tm_lock_row(c, j, &status, &stock, &buckets, &found);
    if (!before) {
        if (found) {
            st = tm_work_fail(c, j, "lock");
            goto done;
        }
        tm_not_found(j);
        (void)pgpool_rollback(c);
        st = QN_OK;
        goto done;
    }
    errcode refusal = ERRCODE_STATE;
    char why[160];
    j->stored_buckets = buckets;
    int change = templates_buckets_change(buckets, j->relayout_from, j->buckets,
                                          j->op == TM_OP_TERMINATE, &refusal, why, sizeof(why));
    int running = 0;
    if (change == TEMPLATES_BUCKETS_REFUSED ||
        !templates_change_allowed(status, stock, j->number, &refusal, why, sizeof(why)) ||
        (change == TEMPLATES_BUCKETS_CHANGED && (running = tm_task_running(c, j)) != 0)) {
        if (running < 0)
            reqjob_fail(&j->rj, ERRCODE_UNAVAILABLE, "database unavailable");
        else if (running > 0)
            reqjob_fail(&j->rj, ERRCODE_STATE,
                        "stockBuckets: a distribution task of the template is in progress; "
                        "change them once it has ended");
        else
            reqjob_fail(&j->rj, refusal, "%s", why);
        (void)pgpool_rollback(c);
        st = QN_OK;
        goto done;
    }
    if (j->op == TM_OP_BUCKETS && change == TEMPLATES_BUCKETS_KEPT) { /* nothing to do */
        (void)pgpool_rollback(c);
        st = QN_OK;
        goto done;
    }
    char set[160];
    if (change == TEMPLATES_BUCKETS_CHANGED) {
        /* the SET's right side reads the row as it was: the old number becomes the change's
         * start */
        snprintf(set, sizeof(set),
                 "stock = stock + $3::int, stock_buckets = %d, buckets_relayout_from = "
                 "stock_buckets",
                 j->buckets);
        j->changed_from = buckets;
        j->stored_buckets = j->buckets;
    } else {
        snprintf(set, sizeof(set), "stock = stock + $3::int");
    }
    after = j->op == TM_OP_TERMINATE ? tm_update_row(c, j, tm_set_ended, "", NULL)
                                     : tm_update_row(c, j, set, "", &j->number);
    if (!after) {
        st = tm_work_fail(c, j, "update");
        goto done;
    }
    if (!(text = tm_change_text(j))) {
        st = tm_work_fail(c, j, "out of memory");
        goto done;
    }
    if (tm_log_insert(c, j->log_table, log_id, j->shop, j->id, j->user_id, text, before, after) !=
        QN_OK) {
        st = tm_work_fail(c, j, "insert log");
        goto done;
    }
    if (j->op == TM_OP_TERMINATE) {
        char key[64];
        tm_end_key(key, sizeof(key), j->id);
        if (outbox_cancel(c, key, NULL) != QN_OK) {
            st = tm_work_fail(c, j, "cancel the end timer");
            goto done;
        }
    }
    if (pgpool_commit(c) != QN_OK) {
        j->changed_from = 0;
        st = tm_work_fail(c, j, "commit");
        goto done;
    }
    if (j->changed_from > 0) { /* the change is under way: say so (the template query too) */
        cJSON *o = cJSON_CreateObject();
        if (o) {
            cJSON_AddItemToObject(o, "couponTemplateId", jsonin_id_to_json(j->id));
            cJSON_AddNumberToObject(o, "stockBuckets", j->stored_buckets);
            cJSON_AddNumberToObject(o, "stockBucketsChangingFrom", j->changed_from);
        }
        j->rj.data = o;
        j->rj.status = 202;
    }
    st = QN_OK;
done:
    free(before);
    free(after);
    free(text);
    return st;
}

/* One answer of the change's Redis calls; the reply goes once all of them answered. */
static void tm_change_cached(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    tm_job *j = arg;
    if (!err && reply && reply->type == REDIS_REPLY_ERROR)
        err = reply->str;
    if (err)
        log_warn(&j->rj.req->log, "templates: cache of %" PRId64 " not updated: %s", j->id, err);
    if (--j->pending > 0)
        return;
    reqjob_reply(&j->rj, QN_OK);
}

/* One Redis call of the change, counted in j->pending. */
#define TM_CHANGE_SENT(j, sent)                                                                    \
    do {                                                                                           \
        (j)->pending++;                                                                            \
        if ((sent) != QN_OK)                                                                       \
            tm_change_cached(NULL, NULL, "not sent", (j));                                         \
    } while (0)

static void tm_change_done(qn_status st, void *arg)
{
    tm_job *j = arg;
    if (tm_replied_error(st, j))
        return;
    char num[24];
    const char *args[1];
    bucket_keys k;
    int n = j->stored_buckets >= 1 ? j->stored_buckets : 1;
    /* one more than the calls until all are sent, so no answer replies early */
    j->pending = 1;
    if (j->op != TM_OP_TERMINATE && j->number > 0) {
        /* Added stock goes to bucket 0, the template's own hash: transfers carry it to the
         * others (bucket.h). Only while the hash still holds the number of buckets the row had
         * before this change, and is open: the engine's re-layout rebuilds the buckets from
         * the row, which counts these units, so an add arriving after it closed or rebuilt
         * them adds nothing. A change of buckets writes nothing else to Redis: the re-layout
         * closes the old number's buckets itself within a tick, and a close sent from here
         * could arrive after it had already written the new ones. */
        char was[12];
        bucket_keys_of(&k, j->id, 0, n);
        snprintf(was, sizeof(was), "%d", j->changed_from > 0 ? j->changed_from : n);
        const char *keys[] = {k.hash}, *add[] = {num, was};
        snprintf(num, sizeof(num), "%" PRId64, j->number);
        TM_CHANGE_SENT(j, REDIS_EVAL_N(j->ctx->redis, template_stock_add, 1, keys, 2, add,
                                       tm_change_cached, j));
    } else if (j->op == TM_OP_TERMINATE) {
        /* Every bucket is ended, each its own call (its own slot on a cluster): a claim at any
         * bucket's users must see it. While a change of buckets is under way, those of the old
         * number too (the re-layout also reads the status once more at its end). */
        args[0] = TPL_STATUS_TEXT(ENDED);
        for (int layout = 0; layout < 2; layout++) {
            int m = layout == 0 ? n : j->relayout_from;
            for (int b = 0; b < m; b++) {
                bucket_keys_of(&k, j->id, b, m);
                const char *keys[] = {k.hash};
                TM_CHANGE_SENT(j, REDIS_EVAL_N(j->ctx->redis, template_status_set, 1, keys, 1, args,
                                               tm_change_cached, j));
            }
        }
    }
    tm_change_cached(NULL, NULL, NULL, j); /* the extra one */
}

/* increase-number, terminate or change-buckets (op) of template id. A stockBuckets in the body
 * other than the template's starts a change of its buckets (tm_change_work). */
static void tm_change_start(tm_ctx *ctx, http_req *req, int64_t id, int op, int64_t number)
{
    jsonin_err err;
    int buckets;
    if (jsonin_int(http_body_json(req), "stockBuckets",
                   op == TM_OP_BUCKETS ? JSONIN_REQUIRED : JSONIN_OPTIONAL, 0, 1, TPL_BUCKETS_MAX,
                   &buckets, &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    tm_job *j = tm_job_new(ctx, req);
    if (!j)
        return;
    j->id = id;
    j->op = op;
    j->number = number;
    j->buckets = buckets;
    tm_submit(j, tm_change_work, tm_change_done);
}

static void tm_h_increase(http_req *req, void *arg)
{
    int64_t id, number;
    jsonin_err err;
    if (tm_param_id(req, &id) != QN_OK)
        return;
    if (jsonin_int64(http_body_json(req), "number", JSONIN_REQUIRED, 0, 1, TPL_STOCK_MAX, &number,
                     &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    tm_change_start(arg, req, id, TM_OP_INCREASE, number);
}

static void tm_h_buckets(http_req *req, void *arg)
{
    int64_t id;
    if (tm_param_id(req, &id) == QN_OK)
        tm_change_start(arg, req, id, TM_OP_BUCKETS, 0);
}

static void tm_h_terminate(http_req *req, void *arg)
{
    int64_t id;
    if (tm_param_id(req, &id) == QN_OK)
        tm_change_start(arg, req, id, TM_OP_TERMINATE, 0);
}

/* ================================================================ template.ended consumer */

/* Ended where it is still active: the row count says whether this delivery ended it, so the
 * transition (and its log row) happens once whichever replica gets the message, however often
 * it is delivered. */
static qn_status tm_end_db(pgpool_conn *c, tm_job *j, int *ended_now)
{
    int status = 0, found = 0, buckets = 1;
    int64_t log_id;
    char *before = NULL, *after = NULL;
    qn_status st = QN_ERR;
    *ended_now = 0;
    if (ids_next(service_ids(j->ctx->head.svc), &log_id) != QN_OK || pgpool_begin(c) != QN_OK)
        goto done;
    before = tm_lock_row(c, j, &status, NULL, &buckets, &found);
    j->stored_buckets = buckets;
    if (!before || status != TPL_STATUS_ACTIVE) {
        (void)pgpool_rollback(c);
        st = !before && found ? QN_ERR : QN_OK; /* gone, or ended already: nothing to do */
        if (!before && !found)
            log_warn(NULL,
                     "templates: template.ended for unknown template %" PRId64 " (shop %" PRId64
                     ")",
                     j->id, j->shop);
        goto done;
    }
    after = tm_update_row(c, j, tm_set_ended, tm_if_active, NULL);
    if (!after)
        goto fail;
    if (tm_log_insert(c, j->log_table, log_id, j->shop, j->id, 0,
                      "the coupon template ended (validEndTime reached)", before, after) != QN_OK ||
        pgpool_commit(c) != QN_OK)
        goto fail;
    *ended_now = 1;
    st = QN_OK;
    goto done;
fail:
    log_error(NULL, "templates: ending template %" PRId64 " failed: %s", j->id,
              pgpool_conn_error(c));
    (void)pgpool_rollback(c);
done:
    free(before);
    free(after);
    return st;
}

static mq_handler_result tm_on_ended(const mq_envelope *env, const mq_delivery_info *info,
                                     void *arg)
{
    tm_ctx *ctx = arg;
    jsonin_err err;
    tm_job j = {.ctx = ctx};
    mq_handler_result res = MQ_RETRY;
    if (jsonin_int64(env->data, "id", JSONIN_REQUIRED, 0, 1, INT64_MAX, &j.id, &err) ||
        jsonin_int64(env->data, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &j.shop, &err)) {
        log_error(NULL, "templates: bad template.ended message %s: %s", env->key, err.msg);
        return MQ_DEAD;
    }
    shard_route r;
    if (shard_route_for("t_coupon_template", j.shop, &r) != QN_OK)
        return MQ_DEAD;
    j.ds = r.ds;
    snprintf(j.table, sizeof(j.table), "%s", r.table);
    if (shard_route_for("t_coupon_template_log", j.shop, &r) != QN_OK)
        return MQ_DEAD;
    snprintf(j.log_table, sizeof(j.log_table), "%s", r.table);

    pgpool_conn *c = pgpool_acquire(service_pg(ctx->head.svc, j.ds), 5000);
    if (!c)
        return MQ_RETRY;
    int ended_now = 0;
    qn_status st = tm_end_db(c, &j, &ended_now);
    pgpool_release(c);
    if (st != QN_OK)
        return MQ_RETRY;
    if (ended_now)
        log_infof(NULL,
                  ((log_field[]){LOG_I("template_id", j.id), LOG_I("shop", j.shop),
                                 LOG_I("attempt", info->attempt), LOG_END}),
                  "coupon template ended");

    /* The cache, on every delivery (idempotent), so a retry after a Redis failure fixes it:
     * every bucket's hash, each its own call (its own slot on a cluster). The consumer thread's
     * client connects on first use and again after a failure. */
    redis_sync *rs = ctx->sync_redis;
    int n = j.stored_buckets >= 1 ? j.stored_buckets : 1, m = j.relayout_from;
    const char *args[] = {TPL_STATUS_TEXT(ENDED)};
    res = MQ_ACK;
    /* while a change of buckets is under way, the old number's buckets too (b >= n) */
    for (int b = 0; b < n + m && res == MQ_ACK; b++) {
        bucket_keys k;
        bucket_keys_of(&k, j.id, b < n ? b : b - n, b < n ? n : m);
        const char *keys[] = {k.hash};
        redisReply *rep = REDIS_SYNC_SCRIPT_N(rs, redis_client_scripts(ctx->redis),
                                              template_status_set, 1, keys, 1, args);
        if (!rep || rep->type != REDIS_REPLY_INTEGER) {
            log_warn(NULL, "templates: cache status of %" PRId64 " (bucket %d) not set: %s", j.id,
                     b, rep && rep->type == REDIS_REPLY_ERROR ? rep->str : redis_sync_errstr(rs));
            res = MQ_RETRY;
        }
        freeReplyObject(rep);
    }
    return res;
}

/* ================================================================ init */

/* Runs from service_free, after the consumer thread has stopped and every callback is done. */
static void tm_free(void *arg)
{
    tm_ctx *ctx = arg;
    if (!ctx)
        return;
    redis_sync_free(ctx->sync_redis);
    free(ctx);
}

static qn_status tm_module_start(service *s, void **state)
{
    qn_status st = madmin_ctx_new(s, sizeof(tm_ctx), state); /* tm_free frees it */
    if (st != QN_OK)
        return st;
    tm_ctx *ctx = *state;
    ctx->redis = service_redis(s);
    if (!(ctx->sync_redis = service_redis_sync_new(service_cfg(s), 0)))
        return QN_ENOMEM;
    if (bloom_params_for(tm_cfg.bloom_expected, tm_cfg.bloom_fp_per_million, &ctx->bloom) !=
        QN_OK) {
        log_error(NULL, "templates: bad bloom filter parameters");
        return QN_EINVAL;
    }
    log_info(NULL, "templates: bloom filter %" PRIu64 " bits, %d hashes", ctx->bloom.m,
             ctx->bloom.k);
    return QN_OK;
}

static const config_var tm_vars[] = {
    BLOOM_CONFIG_VARS(tm_settings),
    {"QUAN_BUCKET_CLAIMS_PER_MASTER", CONFIG_INT, offsetof(tm_settings, claims_per_master), "12000",
     100, 10000000, NULL, 0,
     "claims a second of one template one Redis master carries (about 58 us of its thread a "
     "claim, kept 70 % busy: docs/capacity.md); a create with expectedPeakPerSecond and no "
     "stockBuckets gets as many stock buckets as that peak needs masters"},
};

const service_module templates_module = {
    .name = "templates",
    .vars = tm_vars,
    .nvars = sizeof(tm_vars) / sizeof(tm_vars[0]),
    .settings = &tm_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/merchant-admin/coupon-template/create", tm_h_create,
             HTTP_NEED_SHOP | SERVICE_ROUTE_NODUP},
            {HTTP_POST, "/api/merchant-admin/coupon-template/increase-number", tm_h_increase,
             HTTP_NEED_SHOP | SERVICE_ROUTE_NODUP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/page", tm_h_page, HTTP_NEED_SHOP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/find", tm_h_find, HTTP_NEED_SHOP},
            {HTTP_POST, "/api/merchant-admin/coupon-template/terminate", tm_h_terminate,
             HTTP_NEED_SHOP},
            {HTTP_POST, "/api/merchant-admin/coupon-template/change-buckets", tm_h_buckets,
             HTTP_NEED_SHOP | SERVICE_ROUTE_NODUP},
            {HTTP_GET, "/api/merchant-admin/coupon-template/log", tm_h_log, HTTP_NEED_SHOP},
            {0},
        },
    .consumers =
        (const service_consumer[]){
            /* a template reached validEndTime: mark it ended */
            {"merchant-admin.template-ended", (const char *const[]){EVENT_TEMPLATE_ENDED, NULL},
             tm_on_ended},
            {0},
        },
    .start = tm_module_start,
    .free = tm_free,
};
