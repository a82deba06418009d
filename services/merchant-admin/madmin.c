/*
 * What the modules of merchant-admin share: the head of their contexts, the shop-scoped job that
 * carries a request through a pgpool worker to its reply (tasks.c, codes.c, export.c, the
 * statistics), the checks they make alike (an id parameter, a template the shop may use) and the
 * answer of a page (templates.c, tasks.c, statsum.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "log.h"
#include "madmin.h"
#include "now.h"
#include "shard.h"
#include "template.h"

qn_status madmin_param_id(http_req *req, const char *name, int64_t *out, jsonin_err *err)
{
    const cJSON *v = http_param(req, name);
    if (v && cJSON_IsString(v))
        return jsonin_parse_int64_str(name, v->valuestring, JSONIN_REQUIRED, 0, 1, INT64_MAX, out,
                                      err);
    if (!v) {
        jsonin_errf(err, name, "required");
        return QN_EINVAL;
    }
    int64_t x = 0;
    if (http_param_i64(req, name, &x) != QN_OK || x < 1) {
        jsonin_errf(err, name, "must be a positive integer id");
        return QN_EINVAL;
    }
    *out = x;
    return QN_OK;
}

/* ------------------------------------------------------------------ jobs */

void *madmin_job_new(const madmin_ctx *ctx, http_req *req, size_t size, void (*clear)(reqjob *j))
{
    madmin_job *j = reqjob_new(req, size, clear);
    if (!j)
        return NULL;
    j->ctx = ctx;
    j->shop = req->shop_number;
    return j;
}

void madmin_job_params(pgparam *p, const madmin_job *j)
{
    pgparam_i64(p, j->id);
    pgparam_i64(p, j->shop);
}

void madmin_job_submit(madmin_job *j, int ds, pgpool_work_fn work, pgpool_done_fn done)
{
    reqjob_submit(&j->rj, service_pg(j->ctx->svc, ds), work, done);
}

void madmin_job_submit_tpl_shard(madmin_job *j, pgpool_work_fn work, pgpool_done_fn done)
{
    shard_route r;
    if (shard_route_for("t_coupon_template", j->shop, &r) != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_INTERNAL, "no shard for the shop");
        return;
    }
    madmin_job_submit(j, r.ds, work, done);
}

void madmin_job_by_id(const madmin_ctx *ctx, http_req *req, size_t size, void (*clear)(reqjob *j),
                      const char *id_name, int ds, pgpool_work_fn work)
{
    jsonin_err err = {{0}};
    madmin_job *j = madmin_job_new(ctx, req, size, clear);
    if (!j)
        return;
    if (madmin_param_id(req, id_name, &j->id, &err) != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    madmin_job_submit(j, ds, work, reqjob_done);
}

qn_status madmin_tpl_check(pgpool_conn *conn, madmin_job *j, int64_t tpl_id)
{
    tpl t = {0};
    qn_status st = tpl_db_load(conn, j->shop, tpl_id, &t);
    if (st == QN_ENOTFOUND) {
        reqjob_fail(&j->rj, ERRCODE_NOT_FOUND, "couponTemplateId: template not found");
        st = QN_OK;
    } else if (st == QN_OK && tpl_ended(&t, now_wall_ms())) {
        reqjob_fail(&j->rj, ERRCODE_ENDED, "couponTemplateId: template has ended");
    } else if (st != QN_OK) {
        st = reqjob_db_fail(conn);
    }
    tpl_clear(&t);
    return st;
}

/* ------------------------------------------------------------------ pages */

qn_status madmin_page_parse(const char *current, const char *size, int over_max, madmin_page *out,
                            jsonin_err *err)
{
    madmin_page pg;
    int64_t size_max = over_max == MADMIN_SIZE_CAP ? MADMIN_SIZE_ASKED : MADMIN_SIZE_MAX;
    if (jsonin_parse_int64_str("current", current, JSONIN_OPTIONAL, 1, 1, MADMIN_PAGE_MAX,
                               &pg.current, err) != QN_OK ||
        jsonin_parse_int64_str("size", size, JSONIN_OPTIONAL, 10, 1, size_max, &pg.size, err) !=
            QN_OK)
        return QN_EINVAL;
    if (pg.size > MADMIN_SIZE_MAX)
        pg.size = MADMIN_SIZE_MAX;
    *out = pg;
    return QN_OK;
}

int64_t madmin_page_offset(const madmin_page *pg)
{
    return (pg->current - 1) * pg->size;
}

int64_t madmin_page_count(int64_t total, int64_t size)
{
    return (total + size - 1) / size;
}

cJSON *madmin_page_json(cJSON *records, int64_t total, const madmin_page *pg)
{
    cJSON *d = records ? cJSON_CreateObject() : NULL;
    if (!d || !cJSON_AddItemToObject(d, "records", records)) {
        cJSON_Delete(d);
        cJSON_Delete(records);
        return NULL;
    }
    if (!cJSON_AddNumberToObject(d, "total", (double)total) ||
        !cJSON_AddNumberToObject(d, "size", (double)pg->size) ||
        !cJSON_AddNumberToObject(d, "current", (double)pg->current) ||
        !cJSON_AddNumberToObject(d, "pages", (double)madmin_page_count(total, pg->size))) {
        cJSON_Delete(d); /* records with it */
        return NULL;
    }
    return d;
}

/* ------------------------------------------------------------------ contexts */

qn_status madmin_ctx_new(service *s, size_t size, void **state)
{
    madmin_ctx *ctx = calloc(1, size);
    *state = ctx;
    if (!ctx)
        return QN_ENOMEM;
    ctx->svc = s;
    return QN_OK;
}

void madmin_ctx_free(void *state)
{
    free(state);
}
