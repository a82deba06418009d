/* A coupon's history for its user (history.h). */
#include "history.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "chistory.h"
#include "jsonin.h"
#include "log.h"
#include "reqjob.h"
#include "ucoupon.h"

/* The module's context (its route's arg). */
typedef struct history {
    service *svc;
    const service_config *common;
} history;

typedef struct history_job {
    reqjob rj; /* first: the request and the reply being prepared */
    int64_t user, id;
} history_job;

/* Pool worker, on the user's database: the answer, or the 404. */
static qn_status history_work(pgpool_conn *c, void *arg)
{
    history_job *j = arg;
    chistory h;
    qn_status st = chistory_load_user(c, j->user, j->id, &h);
    if (st == QN_ENOTFOUND) {
        reqjob_fail(&j->rj, ERRCODE_NOT_FOUND, "couponId: no such coupon");
        return QN_OK;
    }
    if (st == QN_ERR) {
        log_error(NULL, "history: reading coupon %" PRId64 " failed: %s", j->id,
                  pgpool_conn_error(c));
        return reqjob_db_fail(c);
    }
    if (st != QN_OK)
        return st;
    j->rj.data = chistory_to_json(&h, 0);
    chistory_clear(&h);
    if (!j->rj.data)
        reqjob_fail(&j->rj, ERRCODE_INTERNAL, "out of memory");
    return QN_OK;
}

static void history_handle(http_req *req, void *arg)
{
    history *h = arg;
    jsonin_err err;
    history_job *j = reqjob_new(req, sizeof(*j), NULL);
    if (!j)
        return;
    if (jsonin_parse_int64_str("couponId", http_query(req, "couponId"), JSONIN_REQUIRED, 0, 1,
                               INT64_MAX, &j->id, &err) != QN_OK) {
        reqjob_reply_error(&j->rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    j->user = req->user_id;
    reqjob_submit(&j->rj, service_pg(h->svc, ucoupon_ds(j->user)), history_work, reqjob_done);
}

static qn_status history_start(service *s, void **state)
{
    history *h = calloc(1, sizeof(*h));
    if (!h)
        return QN_ENOMEM;
    *state = h;
    h->svc = s;
    h->common = service_cfg(s);
    return QN_OK;
}

static void history_free(void *state)
{
    free(state);
}

const service_module history_module = {
    .name = "history",
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/engine/user-coupon/history", history_handle, HTTP_NEED_USER},
            {0},
        },
    .start = history_start,
    .free = history_free,
};
