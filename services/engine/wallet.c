/* The user's coupon list (wallet.h). */
#include "wallet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonin.h"
#include "pgparam.h"
#include "query.h"
#include "template.h"
#include "ucoupon.h"

/* The module's context (its routes' arg). */
typedef struct wallet {
    service *svc;
    const service_config *common;
    query *query; /* the templates' fields come through its chain */
} wallet;

typedef struct wallet_tpl {
    int64_t id, shop;
    int found;
    tpl t; /* owned when found */
} wallet_tpl;

typedef struct wallet_job {
    wallet *w;
    http_req *req;
    int64_t user;
    int status; /* -1: all */
    ucoupon *rows;
    size_t n;
    wallet_tpl *tpls;
    size_t ntpl, pending;
} wallet_job;

static void wallet_job_free(wallet_job *j)
{
    for (size_t i = 0; i < j->ntpl; i++)
        if (j->tpls[i].found)
            tpl_clear(&j->tpls[i].t);
    free(j->tpls);
    free(j->rows);
    free(j);
}

static qn_status wallet_work(pgpool_conn *c, void *arg)
{
    wallet_job *j = arg;
    char sql[1024], table[64];
    pgparam p = {0};
    ucoupon_table(j->user, table);
    snprintf(sql, sizeof(sql),
             "SELECT " UCOUPON_COLUMNS " FROM %s WHERE user_id = $1 AND ($2::int < 0 OR "
             "status = $2::int) ORDER BY receive_time DESC, id DESC LIMIT %d",
             table, WALLET_LIST_MAX);
    pgparam_i64(&p, j->user);
    pgparam_i64(&p, j->status);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    int n = PQntuples(r);
    j->rows = calloc((size_t)(n ? n : 1), sizeof(*j->rows));
    if (!j->rows) {
        PQclear(r);
        return QN_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        ucoupon_from_row(r, i, &j->rows[i]);
    j->n = (size_t)n;
    PQclear(r);
    return QN_OK;
}

static void wallet_reply(wallet_job *j)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < j->n; i++) {
        const ucoupon *u = &j->rows[i];
        cJSON *o = cJSON_CreateObject();
        if (!o)
            break;
        cJSON_AddItemToObject(o, "userCouponId", jsonin_id_to_json(u->id));
        cJSON_AddItemToObject(o, "couponTemplateId", jsonin_id_to_json(u->template_id));
        cJSON_AddNumberToObject(o, "status", u->status);
        cJSON_AddNumberToObject(o, "source", u->source);
        cJSON_AddNumberToObject(o, "receiveCount", u->receive_count);
        cJSON_AddItemToObject(o, "receiveTime", jsonin_time_to_json(u->receive_time_ms));
        cJSON_AddItemToObject(o, "validStartTime", jsonin_time_to_json(u->valid_start_ms));
        cJSON_AddItemToObject(o, "validEndTime", jsonin_time_to_json(u->valid_end_ms));
        for (size_t k = 0; k < j->ntpl; k++) {
            const wallet_tpl *w = &j->tpls[k];
            if (w->id != u->template_id || !w->found)
                continue;
            cJSON *tj = tpl_to_json(&w->t);
            static const char *const fields[] = {"name",  "shopNumber", "target",
                                                 "goods", "type",       "consumeRule"};
            for (size_t f = 0; tj && f < sizeof(fields) / sizeof(fields[0]); f++) {
                cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(tj, fields[f]);
                if (v)
                    cJSON_AddItemToObject(o, fields[f], v);
            }
            cJSON_Delete(tj);
            break;
        }
        cJSON_AddItemToArray(arr, o);
    }
    http_reply_ok(j->req, arr);
    wallet_job_free(j);
}

/* Keeps a copy of the template (t is borrowed for the callback only). */
static void wallet_on_tpl(qn_status st, const tpl *t, wallet_tpl *w)
{
    if (st != QN_OK || !t)
        return;
    w->t = *t;
    w->t.name = strdup(t->name ? t->name : "");
    w->t.goods = strdup(t->goods ? t->goods : "");
    w->t.receive_rule = strdup(t->receive_rule ? t->receive_rule : "{}");
    w->t.consume_rule = strdup(t->consume_rule ? t->consume_rule : "{}");
    w->found = 1;
}

typedef struct wallet_tpl_req {
    wallet_job *j;
    size_t k;
} wallet_tpl_req;

static void wallet_tpl_done(qn_status st, const tpl *t, void *arg)
{
    wallet_tpl_req *tr = arg;
    wallet_job *j = tr->j;
    wallet_on_tpl(st, t, &j->tpls[tr->k]);
    free(tr);
    if (--j->pending == 0)
        wallet_reply(j);
}

static void wallet_done(qn_status st, void *arg)
{
    wallet_job *j = arg;
    if (st != QN_OK) {
        http_reply_error(j->req, ERRCODE_UNAVAILABLE, "database unavailable");
        wallet_job_free(j);
        return;
    }
    j->tpls = calloc(j->n ? j->n : 1, sizeof(*j->tpls));
    if (!j->tpls) {
        http_reply_error(j->req, ERRCODE_UNAVAILABLE, "out of memory");
        wallet_job_free(j);
        return;
    }
    for (size_t i = 0; i < j->n; i++) {
        size_t k = 0;
        while (k < j->ntpl && j->tpls[k].id != j->rows[i].template_id)
            k++;
        if (k == j->ntpl) {
            j->tpls[k].id = j->rows[i].template_id;
            j->tpls[k].shop = j->rows[i].shop_number;
            j->ntpl++;
        }
    }
    /* One chain lookup per template (a cache hit each, normally); pending starts at 1 so the
     * reply cannot happen before every lookup is started. */
    j->pending = 1;
    for (size_t k = 0; k < j->ntpl; k++) {
        wallet_tpl_req *tr = malloc(sizeof(*tr));
        if (!tr)
            continue;
        tr->j = j;
        tr->k = k;
        j->pending++;
        if (query_template(j->w->query, j->tpls[k].shop, j->tpls[k].id, wallet_tpl_done, tr) !=
            QN_OK) {
            j->pending--;
            free(tr);
        }
    }
    if (--j->pending == 0)
        wallet_reply(j);
}

static void wallet_handle(http_req *req, void *arg)
{
    wallet *w = arg;
    static const int statuses[] = {UCOUPON_UNUSED, UCOUPON_LOCKED, UCOUPON_USED, UCOUPON_EXPIRED,
                                   UCOUPON_REVOKED};
    jsonin_err err;
    int status;
    if (jsonin_parse_enum_str("status", http_query(req, "status"), JSONIN_OPTIONAL, -1, statuses, 5,
                              &status, &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    wallet_job *j = calloc(1, sizeof(*j));
    if (!j) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "out of memory");
        return;
    }
    j->w = w;
    j->req = req;
    j->user = req->user_id;
    j->status = status;
    if (pgpool_submit(service_pg(w->svc, ucoupon_ds(j->user)), wallet_work, wallet_done, j) !=
        QN_OK) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "database busy");
        wallet_job_free(j);
    }
}

static qn_status wallet_start(service *s, void **state)
{
    wallet *w = calloc(1, sizeof(*w));
    if (!w)
        return QN_ENOMEM;
    *state = w;
    w->svc = s;
    w->common = service_cfg(s);
    w->query = service_module_state(s, &query_module);
    return w->query ? QN_OK : QN_EINVAL; /* query_module is listed before this one */
}

static void wallet_free(void *state)
{
    free(state);
}

const service_module wallet_module = {
    .name = "wallet",
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/engine/user-coupon/list", wallet_handle, HTTP_NEED_USER},
            {0},
        },
    .start = wallet_start,
    .free = wallet_free,
};
