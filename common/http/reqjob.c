/* A request's job through the pool to its reply: see reqjob.h. */
#include "reqjob.h"

#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void *reqjob_new(http_req *req, size_t size, void (*clear)(reqjob *j))
{
    assert(size >= sizeof(reqjob));
    reqjob *j = calloc(1, size);
    if (!j) {
        if (req)
            http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
        return NULL;
    }
    j->req = req;
    j->clear = clear;
    if (req) {
        memcpy(j->request_id, req->request_id, sizeof(j->request_id)); /* same size, NUL-ended */
        http_req_traceparent(req, j->traceparent);
    }
    return j;
}

void reqjob_vfail(reqjob *j, errcode e, const char *fmt, va_list ap)
{
    j->status = errcode_of(e)->status;
    j->err = e;
    http_vformat(j->msg, sizeof(j->msg), fmt, ap);
}

void reqjob_fail(reqjob *j, errcode e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reqjob_vfail(j, e, fmt, ap);
    va_end(ap);
}

qn_status reqjob_db_fail(pgpool_conn *conn)
{
    return pgpool_conn_ok(conn) ? QN_ERR : QN_EAGAIN;
}

void reqjob_send(reqjob *j, qn_status st)
{
    /* The outcome becomes the reply first, so that the job says what was answered (a clear
     * hook, or the owner of a job no client waits for, reads it). */
    if (!reqjob_failed(j) && st == QN_EAGAIN)
        reqjob_fail(j, ERRCODE_UNAVAILABLE, "database unavailable");
    else if (!reqjob_failed(j) && st != QN_OK)
        reqjob_fail(j, ERRCODE_INTERNAL, "%s", errcode_of(ERRCODE_INTERNAL)->msg);
    else if (!j->status)
        j->status = 200;
    http_req *req = j->req;
    j->req = NULL;
    if (req && reqjob_failed(j)) {
        http_reply_error(req, j->err, "%s", j->msg);
    } else if (req) {
        http_reply_status(req, j->status, j->data);
        j->data = NULL; /* the reply took it */
    }
    cJSON_Delete(j->data);
    j->data = NULL;
}

void reqjob_reply(reqjob *j, qn_status st)
{
    reqjob_send(j, st);
    reqjob_free(j);
}

void reqjob_reply_error(reqjob *j, errcode e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reqjob_vfail(j, e, fmt, ap);
    va_end(ap);
    reqjob_reply(j, QN_OK);
}

void reqjob_done(qn_status st, void *arg)
{
    reqjob_reply(arg, st);
}

void reqjob_submit(reqjob *j, pgpool *pool, pgpool_work_fn work, pgpool_done_fn done)
{
    qn_status st = pgpool_submit(pool, work, done, j);
    if (st == QN_OK)
        return;
    reqjob_reply_error(j, ERRCODE_UNAVAILABLE, "%s",
                       st == QN_EBUSY ? "database busy, retry later" : "database unavailable");
}

void reqjob_free(reqjob *j)
{
    if (!j)
        return;
    if (j->clear)
        j->clear(j);
    cJSON_Delete(j->data);
    free(j);
}
