/*
 * A request's job: the state that carries one HTTP request from its handler through pgpool
 * workers (and any other asynchronous step) to its one reply, and the reply it prepares.
 *
 * A module's job struct embeds a reqjob as its FIRST member, so that the job, its reqjob and
 * the pgpool arg are one address:
 *
 *     typedef struct tasks_find { reqjob rj; int64_t id; char *name; } tasks_find;
 *
 * The handler makes the job (reqjob_new); work functions prepare the answer in it, data for a
 * success or an error reply they decided (reqjob_fail: a 404, a 409), and return a qn_status;
 * the done function answers from both (reqjob_reply):
 *
 *     an error reply set       that reply (status, code, message), whatever st says
 *     st == QN_EAGAIN          503 C000001 "database unavailable" (reqjob_db_fail: the
 *                              connection is down, trying again may work)
 *     any other st != QN_OK    500 B000001 "internal error"
 *     otherwise                the success status (200 unless set, e.g. 202) with data
 *
 * Ownership: the handler owns the job from reqjob_new; reqjob_submit hands it to the pool
 * until the done function runs, which owns it then. Whoever owns it ends it exactly once,
 * with reqjob_reply (answer, then free), or reqjob_send (answer now, keep the job for work
 * that goes on after the answer) and later reqjob_free. reqjob_free runs the clear hook, then
 * frees data and the job; it never answers: the request must have been answered by then.
 *
 * Threads: the loop thread only, except that a work function (on a pool worker) may read and
 * write the job while it runs (it reads the request's ids from the job, never from req), and
 * that a job without a request may be made and freed on any thread before it is handed over.
 */
#ifndef QUAN_REQJOB_H
#define QUAN_REQJOB_H

#include <stdarg.h>
#include <stddef.h>

#include <cJSON.h>

#include "http.h"
#include "pgpool.h"
#include "status.h"

#define REQJOB_MSG_MAX 256

typedef struct reqjob reqjob;
struct reqjob {
    http_req *req; /* NULL once answered, or for a job no client waits for (a consumer's) */
    /* req's, copied at reqjob_new: what a work function writes into events */
    char request_id[HTTP_REQUEST_ID_MAX + 1];
    char traceparent[HTTP_TRACEPARENT_LEN];
    /* The reply being prepared. status: 0 until decided (a success answers 200); a 2xx: a
     * success answered with that status; >= 400: an error reply (reqjob_fail), err's. */
    int status;
    errcode err; /* the error reply, when status >= 400 */
    char msg[REQJOB_MSG_MAX];
    cJSON *data; /* a success's data; owned by the job until answered */
    /* Frees the enclosing struct's own fields (reqjob_free); may be NULL. After an answer,
     * status is the answer's (e.g. for a waiting thread to hear). */
    void (*clear)(reqjob *j);
};

/*
 * A zeroed job of size bytes (the enclosing struct, >= sizeof(reqjob)) for req, with req's
 * request id and traceparent. req may be NULL (a job no client waits for). NULL when out of
 * memory, after answering req 500 B000001 "out of memory". Owned by the caller (see above).
 */
void *reqjob_new(http_req *req, size_t size, void (*clear)(reqjob *j)) QN_MUSTCHECK;

/* Sets the error reply e (errcode.h; replacing one set before); the message is formatted into
 * the job. */
void reqjob_fail(reqjob *j, errcode e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* reqjob_fail with a va_list, for a module's own variadic fail step. */
void reqjob_vfail(reqjob *j, errcode e, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* True when an error reply is set. */
static inline int reqjob_failed(const reqjob *j)
{
    return j->status >= 400;
}

/* Inside a work function, after a failed statement: QN_EAGAIN when the connection is down
 * (answered 503), else QN_ERR (500). */
qn_status reqjob_db_fail(pgpool_conn *conn) QN_MUSTCHECK;

/* Decides the answer from st and the prepared reply (see above): after it, status is the
 * answer's (200 for a success not set otherwise). Answers req unless it is answered already
 * (NULL), frees data; the job stays, with req NULL. */
void reqjob_send(reqjob *j, qn_status st);
/* reqjob_send, then reqjob_free. */
void reqjob_reply(reqjob *j, qn_status st);
/* reqjob_fail, then reqjob_reply: answers that error now and frees the job. */
void reqjob_reply_error(reqjob *j, errcode e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A pgpool done function that is reqjob_reply (arg: the job). */
void reqjob_done(qn_status st, void *arg);

/* Submits work and done with the job as arg; the pool owns the job until done runs. If the
 * pool refuses, answers 503 C000001 and frees the job (neither callback runs). */
void reqjob_submit(reqjob *j, pgpool *pool, pgpool_work_fn work, pgpool_done_fn done);

/* The clear hook, data, the job. NULL is fine. Does not answer (see above). */
void reqjob_free(reqjob *j);

#endif
