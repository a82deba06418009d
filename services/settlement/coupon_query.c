/* Coupons that fit an order (coupon_query.h). */
#include "coupon_query.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discount.h"
#include "jsonin.h"
#include "jsonout.h"
#include "keys.h"
#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"
#include "template.h"

static struct {
    service *svc;
} g_cq;

typedef struct cq_job cq_job;

/* One of the user's unused, unexpired coupons. */
typedef struct cq_coupon {
    int64_t id, tpl_id, shop, valid_end_ms;
    size_t k; /* index of its template in job->tpls */
} cq_coupon;

/* One distinct template; t owned when found. */
typedef struct cq_tpl {
    cq_job *j;
    int64_t id, shop;
    int ds; /* the template shard's database, -1 when the shop cannot be routed */
    int found;
    tpl t;
} cq_tpl;

/* One fallback job: loads the missing templates of one database. */
typedef struct cq_dsjob {
    cq_job *j;
    int ds;
    qn_status st; /* written by the worker, read in done */
} cq_dsjob;

struct cq_job {
    http_req *req;
    int64_t user;
    discount_order order;
    discount_goods *goods; /* goods_number borrowed from the request body (lives until reply) */
    cq_coupon *rows;
    size_t n;
    cq_tpl *tpls;
    size_t ntpl;
    size_t pending;
    cq_dsjob ds_jobs[SHARD_DB_COUNT];
    int fallback_failed;
};

/* One entry of the answer, for sorting. */
typedef struct cq_entry {
    const cq_coupon *c;
    const tpl *t;
    int64_t amount_cents;
    const char *reason; /* NULL when available */
} cq_entry;

static void cq_free(cq_job *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->ntpl; i++)
        if (j->tpls[i].found)
            tpl_clear(&j->tpls[i].t);
    free(j->tpls);
    free(j->rows);
    free(j->goods);
    free(j);
}

/* ------------------------------------------------------------------ answer */

static int cq_cmp_available(const void *a, const void *b)
{
    const cq_entry *x = a, *y = b;
    if (x->amount_cents != y->amount_cents)
        return x->amount_cents > y->amount_cents ? -1 : 1;
    if (x->c->valid_end_ms != y->c->valid_end_ms)
        return x->c->valid_end_ms < y->c->valid_end_ms ? -1 : 1;
    return x->c->id < y->c->id ? -1 : x->c->id > y->c->id;
}

static int cq_cmp_unavailable(const void *a, const void *b)
{
    const cq_entry *x = a, *y = b;
    if (x->c->valid_end_ms != y->c->valid_end_ms)
        return x->c->valid_end_ms < y->c->valid_end_ms ? -1 : 1;
    return x->c->id < y->c->id ? -1 : x->c->id > y->c->id;
}

/* The entry as JSON text: the template fields read the same as in the engine's answers
 * (tpl_json_write); written without a tree, since a user may hold hundreds of coupons. */
static int cq_entry_write(struct evbuffer *b, const cq_entry *e)
{
    const tpl *t = e->t;
    char end[JSONIN_TIME_LEN];
    jsonin_time_format(e->c->valid_end_ms, end);
    return evbuffer_add(b, "{", 1) || jsonout_key(b, "userCouponId", 1) ||
                   jsonout_id(b, e->c->id) || jsonout_key(b, "couponTemplateId", 0) ||
                   jsonout_id(b, e->c->tpl_id) || jsonout_key(b, "name", 0) ||
                   jsonout_str(b, t->name) || jsonout_key(b, "target", 0) ||
                   jsonout_i64(b, t->target) || jsonout_key(b, "goods", 0) ||
                   jsonout_str(b, t->goods) || jsonout_key(b, "type", 0) ||
                   jsonout_i64(b, t->type) || jsonout_key(b, "consumeRule", 0) ||
                   jsonout_raw(b, t->consume_rule && *t->consume_rule ? t->consume_rule : "{}") ||
                   jsonout_key(b, "couponAmount", 0) || jsonout_cents(b, e->amount_cents) ||
                   jsonout_key(b, "validEndTime", 0) || jsonout_str(b, end) ||
                   (e->reason && (jsonout_key(b, "reason", 0) || jsonout_str(b, e->reason))) ||
                   evbuffer_add(b, "}", 1)
               ? -1
               : 0;
}

static int cq_list_write(struct evbuffer *b, const cq_entry *es, size_t n)
{
    if (evbuffer_add(b, "[", 1))
        return -1;
    for (size_t i = 0; i < n; i++)
        if ((i && evbuffer_add(b, ",", 1)) || cq_entry_write(b, &es[i]))
            return -1;
    return evbuffer_add(b, "]", 1);
}

/* The two sorted lists (http_data_writer). */
typedef struct cq_answer {
    const cq_entry *ok, *no;
    size_t nok, nno;
} cq_answer;

static int cq_answer_write(struct evbuffer *b, const void *arg)
{
    const cq_answer *a = arg;
    return evbuffer_add(b, "{", 1) || jsonout_key(b, "availableCouponList", 1) ||
                   cq_list_write(b, a->ok, a->nok) || jsonout_key(b, "notAvailableCouponList", 0) ||
                   cq_list_write(b, a->no, a->nno) || evbuffer_add(b, "}", 1)
               ? -1
               : 0;
}

/* Replies and frees the job. */
static void cq_reply(cq_job *j)
{
    cq_entry *ok = NULL, *no = NULL;
    size_t nok = 0, nno = 0;
    int64_t now = now_wall_ms();

    if (j->fallback_failed) {
        http_reply_error(j->req, 503, "C000001", "database unavailable");
        goto done;
    }
    ok = calloc(j->n ? j->n : 1, sizeof(*ok));
    no = calloc(j->n ? j->n : 1, sizeof(*no));
    if (!ok || !no)
        goto oom;
    for (size_t i = 0; i < j->n; i++) {
        const cq_coupon *c = &j->rows[i];
        const cq_tpl *ct = &j->tpls[c->k];
        if (!ct->found) {
            /* The reference threw on this; a coupon without a template is no option. */
            log_warn(&j->req->log,
                     "coupon-query: template %" PRId64 " of coupon %" PRId64 " not found",
                     c->tpl_id, c->id);
            continue;
        }
        if (ct->t.status != TPL_STATUS_ACTIVE || ct->t.valid_end_ms <= now) {
            no[nno++] = (cq_entry){.c = c, .t = &ct->t, .reason = "template ended"};
            continue;
        }
        discount_rule rule;
        discount_result res;
        discount_rule_from_tpl(&ct->t, &rule);
        discount_reason why = discount_apply(&rule, &j->order, &res);
        if (why == DISCOUNT_OK)
            ok[nok++] = (cq_entry){.c = c, .t = &ct->t, .amount_cents = res.discount_cents};
        else
            no[nno++] = (cq_entry){.c = c, .t = &ct->t, .reason = discount_reason_str(why)};
    }
    if (nok)
        qsort(ok, nok, sizeof(*ok), cq_cmp_available);
    if (nno)
        qsort(no, nno, sizeof(*no), cq_cmp_unavailable);
    cq_answer a = {ok, no, nok, nno};
    http_reply_ok_write(j->req, cq_answer_write, &a);
    goto done;
oom:
    http_reply_error(j->req, 500, "B000001", "out of memory");
done:
    free(ok);
    free(no);
    cq_free(j);
}

/* ------------------------------------------------------------------ 3. database fallback */

static qn_status cq_work_tpls(pgpool_conn *c, void *arg)
{
    cq_dsjob *d = arg;
    cq_job *j = d->j;
    d->st = QN_OK;
    for (size_t k = 0; k < j->ntpl; k++) {
        cq_tpl *ct = &j->tpls[k];
        if (ct->found || ct->ds != d->ds)
            continue;
        qn_status st = tpl_db_load(c, ct->shop, ct->id, &ct->t);
        if (st == QN_OK)
            ct->found = 1;
        else if (st != QN_ENOTFOUND)
            d->st = st;
    }
    return d->st;
}

static void cq_done_tpls(qn_status st, void *arg)
{
    cq_dsjob *d = arg;
    cq_job *j = d->j;
    if (st != QN_OK) {
        log_warn(&j->req->log, "coupon-query: templates of ds_%d not loaded: %s", d->ds,
                 qn_status_str(st));
        j->fallback_failed = 1;
    }
    if (--j->pending == 0)
        cq_reply(j);
}

/* Loads what the cache did not have, one job per database that holds any of it. */
static void cq_fallback(cq_job *j)
{
    int need[SHARD_DB_COUNT] = {0};
    for (size_t k = 0; k < j->ntpl; k++)
        if (!j->tpls[k].found && j->tpls[k].ds >= 0)
            need[j->tpls[k].ds] = 1;
    j->pending = 1; /* the reply cannot come before every job is submitted */
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++) {
        if (!need[ds])
            continue;
        j->ds_jobs[ds] = (cq_dsjob){.j = j, .ds = ds};
        j->pending++;
        if (pgpool_submit(service_pg(g_cq.svc, ds), cq_work_tpls, cq_done_tpls, &j->ds_jobs[ds]) !=
            QN_OK) {
            j->pending--;
            j->fallback_failed = 1;
        }
    }
    if (--j->pending == 0)
        cq_reply(j);
}

/* ------------------------------------------------------------------ 2. template cache */

static void cq_on_hgetall(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    cq_tpl *ct = arg;
    cq_job *j = ct->j;
    /* An error, a missing or a partial hash: the database decides (step 3). */
    if (!err && tpl_from_cache(reply, &ct->t) == QN_OK) {
        if (ct->t.id == ct->id)
            ct->found = 1;
        else
            tpl_clear(&ct->t);
    }
    if (--j->pending == 0)
        cq_fallback(j);
}

static void cq_fetch_templates(cq_job *j)
{
    redis_client *rc = service_redis(g_cq.svc);
    char key[KEYS_LEN];
    j->pending = 1;
    for (size_t k = 0; k < j->ntpl; k++) {
        keys_template(key, j->tpls[k].id);
        j->pending++;
        if (redis_command(rc, cq_on_hgetall, &j->tpls[k], "HGETALL %s", key) != QN_OK)
            j->pending--;
    }
    if (--j->pending == 0)
        cq_fallback(j);
}

/* ------------------------------------------------------------------ 1. the user's coupons */

static qn_status cq_work_rows(pgpool_conn *c, void *arg)
{
    cq_job *j = arg;
    shard_route r;
    char sql[512];
    pgparam p = {0};
    if (shard_route_for("t_user_coupon", j->user, &r) != QN_OK)
        return QN_EINVAL;
    snprintf(sql, sizeof(sql),
             "SELECT id, coupon_template_id, coalesce(shop_number, 0), "
             "(extract(epoch from valid_end_time) * 1000)::bigint FROM %s "
             "WHERE user_id = $1 AND status = 0 AND valid_end_time > now() "
             "ORDER BY valid_end_time, id LIMIT %d",
             r.table, COUPON_QUERY_MAX_COUPONS);
    pgparam_i64(&p, j->user);
    PGresult *res = pgpool_exec(c, sql, p.n, p.v);
    if (!res)
        return QN_ERR;
    int n = PQntuples(res);
    j->rows = calloc((size_t)(n ? n : 1), sizeof(*j->rows));
    if (!j->rows) {
        PQclear(res);
        return QN_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        cq_coupon *cp = &j->rows[i];
        cp->id = strtoll(PQgetvalue(res, i, 0), NULL, 10);
        cp->tpl_id = strtoll(PQgetvalue(res, i, 1), NULL, 10);
        cp->shop = strtoll(PQgetvalue(res, i, 2), NULL, 10);
        cp->valid_end_ms = strtoll(PQgetvalue(res, i, 3), NULL, 10);
    }
    j->n = (size_t)n;
    PQclear(res);
    return QN_OK;
}

static void cq_done_rows(qn_status st, void *arg)
{
    cq_job *j = arg;
    if (st != QN_OK) {
        http_reply_error(j->req, 503, "C000001", "database unavailable");
        cq_free(j);
        return;
    }
    j->tpls = calloc(j->n ? j->n : 1, sizeof(*j->tpls));
    if (!j->tpls) {
        http_reply_error(j->req, 500, "B000001", "out of memory");
        cq_free(j);
        return;
    }
    for (size_t i = 0; i < j->n; i++) {
        size_t k = 0;
        while (k < j->ntpl && j->tpls[k].id != j->rows[i].tpl_id)
            k++;
        if (k == j->ntpl) {
            shard_route r;
            cq_tpl *ct = &j->tpls[j->ntpl++];
            ct->j = j;
            ct->id = j->rows[i].tpl_id;
            ct->shop = j->rows[i].shop;
            ct->ds = shard_route_for("t_coupon_template", ct->shop, &r) == QN_OK ? r.ds : -1;
        }
        j->rows[i].k = k;
    }
    if (j->n == 0)
        cq_reply(j);
    else
        cq_fetch_templates(j);
}

/* ------------------------------------------------------------------ input */

static void cq_handle(http_req *req, void *arg)
{
    (void)arg;
    jsonin_err err = {{0}};
    const cJSON *body = http_body_json(req);
    cq_job *j = calloc(1, sizeof(*j));
    if (!j) {
        http_reply_error(req, 500, "B000001", "out of memory");
        return;
    }
    j->req = req;
    j->user = req->user_id;
    if (jsonin_money_cents(body, "orderAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS,
                           &j->order.amount_cents, &err) ||
        jsonin_int64(body, "shopNumber", JSONIN_REQUIRED, 0, 0, INT64_MAX, &j->order.shop_number,
                     &err) ||
        discount_read_goods(body, &j->goods, &j->order.n_goods, &err)) {
        http_reply_error(req, 400, "A000001", "%s", err.msg);
        cq_free(j);
        return;
    }
    j->order.goods = j->goods;
    shard_route r;
    if (shard_route_for("t_user_coupon", j->user, &r) != QN_OK ||
        pgpool_submit(service_pg(g_cq.svc, r.ds), cq_work_rows, cq_done_rows, j) != QN_OK) {
        http_reply_error(req, 503, "C000001", "database busy");
        cq_free(j);
    }
}

static qn_status cq_start(service *s, void **state)
{
    g_cq.svc = s;
    *state = &g_cq;
    return QN_OK;
}

const service_module coupon_query_module = {
    .name = "coupon-query",
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/settlement/coupon-query", cq_handle, HTTP_NEED_USER},
            {0},
        },
    .start = cq_start,
};
