/* A coupon's history for its shop (history.h). */
#include <inttypes.h>
#include <stdint.h>

#include "chistory.h"
#include "history.h"
#include "log.h"
#include "madmin.h"

/* The module's context: the service alone. */
typedef struct history_ctx {
    madmin_ctx head;
} history_ctx;

typedef struct history_job {
    madmin_job job; /* first; job.id is the coupon */
    int ds;         /* the database being read */
} history_job;

/* Pool worker: the coupon on database ds; found, the answer (or the 404 of another shop's). */
static qn_status history_work(pgpool_conn *conn, void *arg)
{
    history_job *j = arg;
    chistory h;
    qn_status st = chistory_find(conn, j->ds, j->job.id, &h);
    if (st == QN_ENOTFOUND)
        return QN_OK; /* the next database, or the 404 */
    if (st == QN_ERR) {
        log_error(NULL, "history: reading coupon %" PRId64 " on ds_%d failed: %s", j->job.id, j->ds,
                  pgpool_conn_error(conn));
        return reqjob_db_fail(conn);
    }
    if (st != QN_OK)
        return st;
    /* Found (ids are unique): another shop's coupon is as good as none. */
    if (h.shop_number != j->job.shop)
        reqjob_fail(&j->job.rj, ERRCODE_NOT_FOUND, "couponId: no such coupon");
    else if (!(j->job.rj.data = chistory_to_json(&h, 1)))
        reqjob_fail(&j->job.rj, ERRCODE_INTERNAL, "out of memory");
    chistory_clear(&h);
    return QN_OK;
}

/* Loop thread: the answer, or the next database. */
static void history_done(qn_status st, void *arg)
{
    history_job *j = arg;
    if (st != QN_OK || reqjob_failed(&j->job.rj) || j->job.rj.data) {
        reqjob_reply(&j->job.rj, st);
        return;
    }
    if (++j->ds >= SERVICE_DS_COUNT) {
        reqjob_reply_error(&j->job.rj, ERRCODE_NOT_FOUND, "couponId: no such coupon");
        return;
    }
    madmin_job_submit(&j->job, j->ds, history_work, history_done);
}

static void history_handle(http_req *req, void *arg)
{
    const history_ctx *ctx = arg;
    jsonin_err err = {{0}};
    history_job *j = madmin_job_new(&ctx->head, req, sizeof(*j), NULL);
    if (!j)
        return;
    if (madmin_param_id(req, "couponId", &j->job.id, &err) != QN_OK) {
        reqjob_reply_error(&j->job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    j->ds = 0;
    madmin_job_submit(&j->job, j->ds, history_work, history_done);
}

static qn_status history_start(service *s, void **state)
{
    return madmin_ctx_new(s, sizeof(history_ctx), state);
}

const service_module history_module = {
    .name = "history",
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/merchant-admin/coupon/history", history_handle, HTTP_NEED_SHOP},
            {0},
        },
    .start = history_start,
    .free = madmin_ctx_free,
};
