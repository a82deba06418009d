#include "pgpool.h"

#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "now.h"
#include "pgparam.h"

#define PGPOOL_DEFAULT_SIZE      4
#define PGPOOL_MAX_SIZE          64
#define PGPOOL_DEFAULT_QUEUE     1024
#define PGPOOL_DEFAULT_CONNECT_S 5
#define PGPOOL_BACKOFF_MIN_MS    100
#define PGPOOL_BACKOFF_MAX_MS    1000
#define PGPOOL_IDLE_CHECK_MS     1000 /* idle workers look at their socket this often */
#define PGPOOL_FAIL_LOG_NAMES    16   /* database names with a limit of their own */
#define PGPOOL_NO_NOTE           INT64_MAX

/* What a connection needs to (re)connect; shared by a pool's connections. */
typedef struct pgpool_cfg {
    char *dsn;
    char *name;
    char *appname; /* application_name, default "quan" */
    int statement_timeout_ms;
    int connect_timeout_s;
    pgpool_commit_fn on_commit;
    void *on_commit_arg;
} pgpool_cfg;

struct pgpool_conn {
    pgpool *pool;          /* NULL for a dedicated connection */
    const pgpool_cfg *cfg; /* the pool's, or own_cfg */
    pgpool_cfg own_cfg;    /* dedicated connections only */
    PGconn *pg;            /* NULL when never connected or after a failed connect */
    bool up;               /* last known state, counted in pool->up */
    bool lent;             /* borrowed through pgpool_acquire (guarded by pool->mu) */
    int backoff_ms;        /* 0 after a success: the first reconnect is immediate */
    int64_t next_attempt_ms;
    log_limit *fail_log;    /* its database's (conn_fail_log), looked up at the first failure */
    int64_t commit_note_ms; /* the transaction's earliest note, or PGPOOL_NO_NOTE */
    char sqlstate[6];
    char errstr[256];
};

enum { PGJ_WORK, PGJ_LEND };
enum { LEND_PENDING, LEND_TAKEN, LEND_GRANTED, LEND_CANCELLED };

/* A queued job. WORK jobs are heap-owned by the pool; LEND jobs live on the acquirer's stack. */
typedef struct pgpool_job {
    struct pgpool_job *next;
    int kind;
    pgpool_work_fn work;
    pgpool_done_fn done;
    void *arg;
    qn_status st;
    int lend_state;    /* LEND: guarded by pool->mu */
    pgpool_conn *conn; /* LEND: set when granted */
} pgpool_job;

typedef struct pgpool_worker {
    pgpool *pool;
    pthread_t thread;
    bool started;
    pgpool_conn conn;
} pgpool_worker;

struct pgpool {
    struct event_base *base;
    bridge *br;
    pgpool_cfg cfg;
    int size;
    int queue_cap;

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: a job arrived, or stopping */
    pthread_cond_t lend_cv; /* acquirers, workers and free: lend state changes */
    pgpool_job *head, *tail;
    int stopping;
    int waiters; /* threads inside pgpool_acquire */
    atomic_int queued;
    atomic_int in_use;
    atomic_int up;

    pgpool_worker *workers;
};

/* ------------------------------------------------------------------ errors */

/* While a database is down, every connection to it (a pool's and the dedicated ones) fails at
 * each backoff step with the same message: tens of lines a second that say one thing. So the
 * failures are told at most once a second per database name and process, with the count held
 * back. Past PGPOOL_FAIL_LOG_NAMES names a connection logs every failure, as before. */
static struct {
    pthread_mutex_t mu;
    size_t n;
    struct {
        char name[64];
        log_limit limit;
    } names[PGPOOL_FAIL_LOG_NAMES];
} pgpool_fail_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static log_limit *conn_fail_log(const char *name)
{
    char key[sizeof(pgpool_fail_log.names[0].name)];
    log_limit *l = NULL;
    snprintf(key, sizeof(key), "%s", name);
    pthread_mutex_lock(&pgpool_fail_log.mu);
    for (size_t i = 0; i < pgpool_fail_log.n && !l; i++)
        if (!strcmp(pgpool_fail_log.names[i].name, key))
            l = &pgpool_fail_log.names[i].limit;
    if (!l && pgpool_fail_log.n < PGPOOL_FAIL_LOG_NAMES) {
        memcpy(pgpool_fail_log.names[pgpool_fail_log.n].name, key, sizeof(key));
        l = &pgpool_fail_log.names[pgpool_fail_log.n++].limit;
    }
    pthread_mutex_unlock(&pgpool_fail_log.mu);
    return l;
}

static void conn_set_error(pgpool_conn *c, const char *sqlstate, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_set_error(pgpool_conn *c, const char *sqlstate, const char *fmt, ...)
{
    int n = snprintf(c->errstr, sizeof(c->errstr), "%s: ", c->cfg->name);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(c->errstr))
        vsnprintf(c->errstr + n, sizeof(c->errstr) - (size_t)n, fmt, ap);
    va_end(ap);
    /* libpq messages end with a newline (sometimes several lines); keep the first line. */
    c->errstr[strcspn(c->errstr, "\n")] = '\0';
    snprintf(c->sqlstate, sizeof(c->sqlstate), "%s", sqlstate ? sqlstate : "");
}

static void conn_clear_error(pgpool_conn *c)
{
    c->errstr[0] = '\0';
    c->sqlstate[0] = '\0';
}

static void conn_set_up(pgpool_conn *c, bool up)
{
    if (c->up == up)
        return;
    c->up = up;
    if (c->pool)
        atomic_fetch_add(&c->pool->up, up ? 1 : -1);
}

/* ------------------------------------------------------------------ connecting */

/* Server notices ("relation ... does not exist, skipping") go to the log, not to stderr. */
static void conn_notice(void *arg, const char *message)
{
    const pgpool_conn *c = arg;
    char line[256];
    snprintf(line, sizeof(line), "%s", message);
    line[strcspn(line, "\n")] = '\0';
    log_debug(NULL, "%s: server notice: %s", c->cfg->name, line);
}

static qn_status conn_connect(pgpool_conn *c)
{
    const pgpool_cfg *cfg = c->cfg;
    char timeout[16];
    snprintf(timeout, sizeof(timeout), "%d", cfg->connect_timeout_s);
    /* The DSN is expanded first; the keywords after it override what it says. */
    const char *kw[] = {"dbname",           "connect_timeout",  "client_encoding",
                        "keepalives",       "keepalives_idle",  "keepalives_interval",
                        "keepalives_count", "application_name", NULL};
    const char *val[] = {cfg->dsn, timeout, "UTF8", "1", "30", "10", "3", cfg->appname, NULL};

    if (c->pg) {
        PQfinish(c->pg);
        c->pg = NULL;
    }
    conn_set_up(c, false);
    c->pg = PQconnectdbParams(kw, val, 1);
    if (!c->pg) {
        conn_set_error(c, "08006", "connect failed: out of memory");
        return QN_ENOMEM;
    }
    if (PQstatus(c->pg) != CONNECTION_OK) {
        conn_set_error(c, "08006", "connect failed: %s", PQerrorMessage(c->pg));
        goto fail;
    }
    PQsetNoticeProcessor(c->pg, conn_notice, c);
    if (cfg->statement_timeout_ms > 0) {
        pgparam p = {0};
        pgparam_i64(&p, cfg->statement_timeout_ms);
        PGresult *res = PQexecParams(c->pg, "SELECT set_config('statement_timeout', $1, false)",
                                     p.n, NULL, p.v, NULL, NULL, 0);
        bool ok = res && PQresultStatus(res) == PGRES_TUPLES_OK;
        if (!ok)
            conn_set_error(c, "08006", "setting statement_timeout failed: %s",
                           PQerrorMessage(c->pg));
        PQclear(res);
        if (!ok)
            goto fail;
    }
    conn_set_up(c, true);
    return QN_OK;
fail:
    PQfinish(c->pg);
    c->pg = NULL;
    return QN_ERR;
}

/*
 * An idle connection has nothing to read. If the socket is readable, the server sent something
 * unasked, in practice the FATAL before it closes (pg_terminate_backend, shutdown): consume it
 * so libpq notices the close. No round trip.
 */
static bool conn_idle_alive(pgpool_conn *c)
{
    int fd = PQsocket(c->pg);
    if (fd < 0)
        return false;
    for (int i = 0; i < 4; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0)
            break;
        if (!PQconsumeInput(c->pg) || PQstatus(c->pg) != CONNECTION_OK)
            return false;
        PGnotify *n;
        while ((n = PQnotifies(c->pg)) != NULL)
            PQfreemem(n);
    }
    return PQstatus(c->pg) == CONNECTION_OK;
}

/* Internal callers may ignore the result: a down connection makes the statements fail. */
static qn_status conn_ensure(pgpool_conn *c)
{
    if (c->pg && PQstatus(c->pg) == CONNECTION_OK && conn_idle_alive(c)) {
        conn_set_up(c, true);
        conn_clear_error(c);
        return QN_OK;
    }
    bool was_up = c->up;
    conn_set_up(c, false);
    if (c->pg) {
        /* Lost since last use; with pg == NULL errstr still holds the failed connect. */
        conn_set_error(c, "08006", "connection lost: %s", PQerrorMessage(c->pg));
        PQfinish(c->pg);
        c->pg = NULL;
    }
    /* Backing off (errstr keeps the last failure), unless another connection of the pool is
     * up: the server is back, and a request must not fail here while this one waits out a
     * delay it took while the server was down. */
    if (now_mono_ms() < c->next_attempt_ms && !(c->pool && atomic_load(&c->pool->up) > 0))
        return QN_ERR;
    qn_status st = conn_connect(c);
    if (st == QN_OK) {
        if (c->backoff_ms || was_up)
            log_info(NULL, "%s: reconnected", c->cfg->name);
        c->backoff_ms = 0;
        c->next_attempt_ms = 0;
        conn_clear_error(c);
        return QN_OK;
    }
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : PGPOOL_BACKOFF_MIN_MS;
    if (c->backoff_ms > PGPOOL_BACKOFF_MAX_MS)
        c->backoff_ms = PGPOOL_BACKOFF_MAX_MS;
    c->next_attempt_ms = now_mono_ms() + c->backoff_ms;
    if (!c->fail_log)
        c->fail_log = conn_fail_log(c->cfg->name);
    log_warn_limited(c->fail_log, NULL, ((log_field[]){LOG_I("retry_ms", c->backoff_ms), LOG_END}),
                     "%s (retry in %d ms)", c->errstr, c->backoff_ms);
    return st;
}

qn_status pgpool_conn_ensure(pgpool_conn *c)
{
    return c ? conn_ensure(c) : QN_EINVAL;
}

/* ------------------------------------------------------------------ statements */

bool pgpool_conn_ok(const pgpool_conn *c)
{
    return c && c->pg && PQstatus(c->pg) == CONNECTION_OK;
}

/* Before a statement: fail fast on a dead connection, keeping the error that killed it. */
static bool conn_precall(pgpool_conn *c)
{
    if (pgpool_conn_ok(c)) {
        conn_clear_error(c);
        return true;
    }
    if (!c->errstr[0])
        conn_set_error(c, "08006", "connection unavailable");
    snprintf(c->sqlstate, sizeof(c->sqlstate), "08006");
    return false;
}

/* Owns res: returns it on success, else clears it and records the error. */
static PGresult *conn_result(pgpool_conn *c, PGresult *res)
{
    ExecStatusType rs = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (rs == PGRES_COMMAND_OK || rs == PGRES_TUPLES_OK)
        return res;
    const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
    const char *primary = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    if (PQstatus(c->pg) != CONNECTION_OK) {
        conn_set_error(c, "08006", "connection lost: %s",
                       primary ? primary : PQerrorMessage(c->pg));
        conn_set_up(c, false);
    } else if (primary) {
        conn_set_error(c, state, "%s", primary);
    } else if (!res || rs == PGRES_FATAL_ERROR || rs == PGRES_NONFATAL_ERROR) {
        conn_set_error(c, state, "%s", PQerrorMessage(c->pg));
    } else {
        /* COPY and friends are not for these helpers. */
        conn_set_error(c, NULL, "unexpected result status %s", PQresStatus(rs));
    }
    PQclear(res);
    return NULL;
}

PGresult *pgpool_exec(pgpool_conn *c, const char *sql, int nparams, const char *const *params)
{
    if (!c || !sql)
        return NULL;
    if (!conn_precall(c))
        return NULL;
    return conn_result(c, PQexecParams(c->pg, sql, nparams, NULL, params, NULL, NULL, 0));
}

static qn_status conn_status_of_error(const pgpool_conn *c)
{
    if (strcmp(c->sqlstate, "23505") == 0)
        return QN_ECONFLICT;
    if (strcmp(c->sqlstate, "57014") == 0)
        return QN_ETIMEDOUT;
    return QN_ERR;
}

qn_status pgpool_exec_cmd(pgpool_conn *c, const char *sql, int nparams, const char *const *params,
                          int64_t *affected_rows)
{
    if (affected_rows)
        *affected_rows = 0;
    if (!c || !sql)
        return QN_EINVAL;
    PGresult *res = pgpool_exec(c, sql, nparams, params);
    if (!res)
        return conn_status_of_error(c);
    if (affected_rows) {
        const char *n = PQcmdTuples(res);
        *affected_rows = (n && *n) ? strtoll(n, NULL, 10) : 0;
    }
    PQclear(res);
    return QN_OK;
}

qn_status pgpool_exec_script(pgpool_conn *c, const char *sql)
{
    if (!c || !sql)
        return QN_EINVAL;
    if (!conn_precall(c))
        return QN_ERR;
    PGresult *res = conn_result(c, PQexec(c->pg, sql));
    if (!res)
        return conn_status_of_error(c);
    PQclear(res);
    return QN_OK;
}

qn_status pgpool_begin(pgpool_conn *c)
{
    if (c) /* a transaction lost with its connection left its note behind */
        c->commit_note_ms = PGPOOL_NO_NOTE;
    return pgpool_exec_cmd(c, "BEGIN", 0, NULL, NULL);
}

void pgpool_conn_note_commit(pgpool_conn *c, int64_t at_ms)
{
    if (!c || !c->cfg->on_commit)
        return;
    if (pgpool_conn_ok(c) && PQtransactionStatus(c->pg) == PQTRANS_IDLE)
        c->cfg->on_commit(c->cfg->on_commit_arg, at_ms);
    else if (at_ms < c->commit_note_ms)
        c->commit_note_ms = at_ms;
}

/* After a COMMIT that committed or may have: the hook, with what the transaction noted. */
static void conn_committed(pgpool_conn *c, int64_t note)
{
    if (note != PGPOOL_NO_NOTE && c->cfg->on_commit)
        c->cfg->on_commit(c->cfg->on_commit_arg, note);
}

qn_status pgpool_commit(pgpool_conn *c)
{
    if (!c)
        return QN_EINVAL;
    int64_t note = c->commit_note_ms; /* this transaction's, whatever becomes of it */
    c->commit_note_ms = PGPOOL_NO_NOTE;
    /* COMMIT of a failed transaction "succeeds" with tag ROLLBACK: make that an error. */
    bool failed_tx = pgpool_conn_ok(c) && PQtransactionStatus(c->pg) == PQTRANS_INERROR;
    if (!conn_precall(c))
        return QN_ERR;
    PGresult *res = conn_result(c, PQexec(c->pg, "COMMIT"));
    if (!res) { /* sent: the server may have committed before the connection went */
        if (PQstatus(c->pg) != CONNECTION_OK) {
            conn_committed(c, note);
            return QN_EUNKNOWN;
        }
        return conn_status_of_error(c);
    }
    bool rolled_back = failed_tx || strcmp(PQcmdStatus(res), "ROLLBACK") == 0;
    PQclear(res);
    if (rolled_back) {
        conn_set_error(c, "25P02", "commit of a failed transaction: rolled back");
        return QN_ERR;
    }
    conn_committed(c, note);
    return QN_OK;
}

qn_status pgpool_rollback(pgpool_conn *c)
{
    if (!c)
        return QN_EINVAL;
    c->commit_note_ms = PGPOOL_NO_NOTE;
    if (pgpool_conn_ok(c) && PQtransactionStatus(c->pg) == PQTRANS_IDLE)
        return QN_OK;
    return pgpool_exec_cmd(c, "ROLLBACK", 0, NULL, NULL);
}

const char *pgpool_conn_error(const pgpool_conn *c)
{
    return c ? c->errstr : "";
}

const char *pgpool_conn_sqlstate(const pgpool_conn *c)
{
    return c ? c->sqlstate : "";
}

bool pgpool_is_unique_violation(const pgpool_conn *c)
{
    return c && strcmp(c->sqlstate, "23505") == 0;
}

PGconn *pgpool_conn_pg(pgpool_conn *c)
{
    return c ? c->pg : NULL;
}

/*
 * After a job or a borrow: never hand the next user an open transaction. If the user left one,
 * its writes are gone, so a job that reported success now reports failure.
 */
static void conn_after_use(pgpool_conn *c, qn_status *st)
{
    c->commit_note_ms = PGPOOL_NO_NOTE;
    if (!pgpool_conn_ok(c)) {
        conn_set_up(c, false);
        return;
    }
    PGTransactionStatusType tx = PQtransactionStatus(c->pg);
    if (tx == PQTRANS_IDLE)
        return;
    log_warn(NULL, "%s: a transaction was left open; rolling it back", c->cfg->name);
    PGresult *res = PQexec(c->pg, "ROLLBACK");
    PQclear(res);
    if (PQstatus(c->pg) != CONNECTION_OK || PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        /* A connection in an unknown state is not reused. */
        PQfinish(c->pg);
        c->pg = NULL;
        conn_set_up(c, false);
    }
    if (st && *st == QN_OK) {
        conn_set_error(c, "25000", "transaction left open by the work function; rolled back");
        *st = QN_ERR;
    }
}

/* ------------------------------------------------------------------ config */

static void cfg_clear(pgpool_cfg *cfg)
{
    free(cfg->dsn);
    free(cfg->name);
    free(cfg->appname);
    memset(cfg, 0, sizeof(*cfg));
}

static qn_status cfg_init(pgpool_cfg *cfg, const pgpool_opts *opts)
{
    memset(cfg, 0, sizeof(*cfg));
    if (!opts || !opts->dsn || opts->statement_timeout_ms < 0 || opts->connect_timeout_s < 0)
        return QN_EINVAL;
    cfg->dsn = strdup(opts->dsn);
    cfg->name = strdup(opts->name && *opts->name ? opts->name : "pg");
    cfg->appname = opts->application_name ? strdup(opts->application_name) : strdup("quan");
    if (!cfg->dsn || !cfg->name || !cfg->appname) {
        cfg_clear(cfg);
        return QN_ENOMEM;
    }
    cfg->statement_timeout_ms = opts->statement_timeout_ms;
    cfg->connect_timeout_s =
        opts->connect_timeout_s ? opts->connect_timeout_s : PGPOOL_DEFAULT_CONNECT_S;
    cfg->on_commit = opts->on_commit;
    cfg->on_commit_arg = opts->on_commit_arg;
    return QN_OK;
}

/* ------------------------------------------------------------------ dedicated connections */

pgpool_conn *pgpool_conn_open(const pgpool_opts *opts)
{
    pgpool_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (cfg_init(&c->own_cfg, opts) != QN_OK) {
        free(c);
        return NULL;
    }
    c->cfg = &c->own_cfg;
    c->commit_note_ms = PGPOOL_NO_NOTE;
    conn_ensure(c); /* a failure is left for the caller to read */
    return c;
}

void pgpool_conn_close(pgpool_conn *c)
{
    if (!c)
        return;
    if (c->pool) {
        log_error(NULL, "%s: pgpool_conn_close on a pooled connection; use pgpool_release",
                  c->cfg->name);
        return;
    }
    if (c->pg)
        PQfinish(c->pg);
    cfg_clear(&c->own_cfg);
    free(c);
}

/* ------------------------------------------------------------------ the pool */

static void job_done_on_loop(void *arg)
{
    pgpool_job *j = arg;
    if (j->done)
        j->done(j->st, j->arg);
    free(j);
}

static void job_post_done(pgpool *pool, pgpool_job *j)
{
    /* bridge_post fails only when out of memory; the callback must not be lost. */
    int tries = 0;
    while (bridge_post(pool->br, job_done_on_loop, j) != QN_OK) {
        if (tries++ == 0)
            log_error(NULL, "%s: bridge_post failed; retrying", pool->cfg.name);
        usleep(1000);
    }
}

static void worker_run(pgpool *pool, pgpool_conn *c, pgpool_job *j)
{
    conn_ensure(c); /* on failure the work function sees a down connection */
    if (j->kind == PGJ_WORK) {
        qn_status st = j->work(c, j->arg);
        conn_after_use(c, &st);
        j->st = st;
        /* No longer in use before its done callback can run: whoever reads the pool's
         * statistics in that callback (or after it) sees the worker free. */
        atomic_fetch_sub(&pool->in_use, 1);
        job_post_done(pool, j);
        pthread_mutex_lock(&pool->mu);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    j->conn = c;
    c->lent = true;
    j->lend_state = LEND_GRANTED; /* j belongs to the acquirer from here on */
    pthread_cond_broadcast(&pool->lend_cv);
    while (c->lent)
        pthread_cond_wait(&pool->lend_cv, &pool->mu);
    atomic_fetch_sub(&pool->in_use, 1);
}

static void *worker_main(void *arg)
{
    pgpool_worker *w = arg;
    pgpool *pool = w->pool;
    pgpool_conn *c = &w->conn;

    conn_ensure(c); /* connect early so readiness comes up before traffic */
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stopping && !pool->head) {
            struct timespec until = now_deadline(CLOCK_MONOTONIC, PGPOOL_IDLE_CHECK_MS);
            if (pthread_cond_timedwait(&pool->work_cv, &pool->mu, &until) == ETIMEDOUT &&
                !pool->head && !pool->stopping) {
                /* Idle: notice a closed connection and reconnect before traffic needs it. */
                pthread_mutex_unlock(&pool->mu);
                conn_ensure(c);
                pthread_mutex_lock(&pool->mu);
            }
        }
        if (pool->stopping)
            break;
        pgpool_job *j = pool->head;
        pool->head = j->next;
        if (!pool->head)
            pool->tail = NULL;
        j->next = NULL;
        atomic_fetch_sub(&pool->queued, 1);
        atomic_fetch_add(&pool->in_use, 1);
        if (j->kind == PGJ_LEND)
            j->lend_state = LEND_TAKEN; /* no longer cancellable by the acquirer's timeout */
        pthread_mutex_unlock(&pool->mu);
        worker_run(pool, c, j); /* returns with the mutex held */
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_stop_workers(pgpool *pool)
{
    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->size; i++) {
        if (pool->workers[i].started)
            pthread_join(pool->workers[i].thread, NULL);
    }
}

static void pool_destroy(pgpool *pool)
{
    if (pool->workers) {
        for (int i = 0; i < pool->size; i++) {
            if (pool->workers[i].conn.pg)
                PQfinish(pool->workers[i].conn.pg);
        }
        free(pool->workers);
    }
    pthread_cond_destroy(&pool->work_cv);
    pthread_cond_destroy(&pool->lend_cv);
    pthread_mutex_destroy(&pool->mu);
    cfg_clear(&pool->cfg);
    free(pool);
}

pgpool *pgpool_new(struct event_base *base, bridge *b, const pgpool_opts *opts)
{
    pgpool *pool = NULL;
    if (!base || !b || !opts || opts->size < 0 || opts->size > PGPOOL_MAX_SIZE ||
        opts->queue_cap < 0) {
        log_error(NULL, "pgpool_new: invalid options");
        return NULL;
    }
    pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    if (cfg_init(&pool->cfg, opts) != QN_OK) {
        log_error(NULL, "pgpool_new: invalid options or out of memory");
        free(pool);
        return NULL;
    }
    pool->base = base;
    pool->br = b;
    pool->size = opts->size ? opts->size : PGPOOL_DEFAULT_SIZE;
    pool->queue_cap = opts->queue_cap ? opts->queue_cap : PGPOOL_DEFAULT_QUEUE;

    pthread_mutex_init(&pool->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&pool->work_cv, &ca);
    pthread_cond_init(&pool->lend_cv, &ca);
    pthread_condattr_destroy(&ca);

    pool->workers = calloc((size_t)pool->size, sizeof(*pool->workers));
    if (!pool->workers)
        goto fail;
    for (int i = 0; i < pool->size; i++) {
        pgpool_worker *w = &pool->workers[i];
        w->pool = pool;
        w->conn.pool = pool;
        w->conn.cfg = &pool->cfg;
        w->conn.commit_note_ms = PGPOOL_NO_NOTE;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            log_error(NULL, "%s: cannot start worker thread", pool->cfg.name);
            goto fail;
        }
        w->started = true;
    }
    log_info(NULL, "%s: pool of %d connections, queue %d", pool->cfg.name, pool->size,
             pool->queue_cap);
    return pool;
fail:
    pool_stop_workers(pool);
    pool_destroy(pool);
    return NULL;
}

static void queue_push(pgpool *pool, pgpool_job *j)
{
    j->next = NULL;
    if (pool->tail)
        pool->tail->next = j;
    else
        pool->head = j;
    pool->tail = j;
    atomic_fetch_add(&pool->queued, 1);
    pthread_cond_signal(&pool->work_cv);
}

static void queue_remove(pgpool *pool, pgpool_job *j)
{
    pgpool_job *prev = NULL;
    for (pgpool_job *it = pool->head; it; prev = it, it = it->next) {
        if (it != j)
            continue;
        if (prev)
            prev->next = it->next;
        else
            pool->head = it->next;
        if (pool->tail == it)
            pool->tail = prev;
        atomic_fetch_sub(&pool->queued, 1);
        return;
    }
}

qn_status pgpool_submit(pgpool *pool, pgpool_work_fn work, pgpool_done_fn done, void *arg)
{
    if (!pool || !work)
        return QN_EINVAL;
    pgpool_job *j = calloc(1, sizeof(*j));
    if (!j)
        return QN_ENOMEM;
    j->kind = PGJ_WORK;
    j->work = work;
    j->done = done;
    j->arg = arg;

    qn_status st = QN_OK;
    pthread_mutex_lock(&pool->mu);
    if (pool->stopping)
        st = QN_ERR;
    else if (atomic_load(&pool->queued) >= pool->queue_cap)
        st = QN_EBUSY;
    else
        queue_push(pool, j);
    pthread_mutex_unlock(&pool->mu);
    if (st != QN_OK)
        free(j);
    return st;
}

pgpool_conn *pgpool_acquire(pgpool *pool, int timeout_ms)
{
    if (!pool)
        return NULL;
    pgpool_job j = {.kind = PGJ_LEND, .lend_state = LEND_PENDING};
    struct timespec until = now_deadline(CLOCK_MONOTONIC, timeout_ms > 0 ? timeout_ms : 0);
    pgpool_conn *conn = NULL;

    pthread_mutex_lock(&pool->mu);
    if (pool->stopping || atomic_load(&pool->queued) >= pool->queue_cap)
        goto done;
    pool->waiters++;
    queue_push(pool, &j);
    while (j.lend_state != LEND_GRANTED && j.lend_state != LEND_CANCELLED) {
        if (j.lend_state == LEND_TAKEN) {
            pthread_cond_wait(&pool->lend_cv, &pool->mu); /* a worker is connecting for us */
            continue;
        }
        if (pthread_cond_timedwait(&pool->lend_cv, &pool->mu, &until) == ETIMEDOUT &&
            j.lend_state == LEND_PENDING) {
            queue_remove(pool, &j);
            break;
        }
    }
    if (j.lend_state == LEND_GRANTED)
        conn = j.conn;
    pool->waiters--;
    if (pool->stopping)
        pthread_cond_broadcast(&pool->lend_cv); /* pgpool_free waits for waiters == 0 */
done:
    pthread_mutex_unlock(&pool->mu);
    return conn;
}

void pgpool_release(pgpool_conn *c)
{
    if (!c)
        return;
    if (!c->pool) {
        log_error(NULL, "%s: pgpool_release on a dedicated connection; use pgpool_conn_close",
                  c->cfg->name);
        return;
    }
    conn_after_use(c, NULL);
    pgpool *pool = c->pool;
    pthread_mutex_lock(&pool->mu);
    c->lent = false;
    pthread_cond_broadcast(&pool->lend_cv);
    pthread_mutex_unlock(&pool->mu);
}

void pgpool_free(pgpool *pool)
{
    if (!pool)
        return;
    pgpool_job *work_list = NULL, **work_tail = &work_list;
    int cancelled = 0;

    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    pgpool_job *j = pool->head;
    pool->head = pool->tail = NULL;
    atomic_store(&pool->queued, 0);
    while (j) {
        pgpool_job *next = j->next;
        if (j->kind == PGJ_LEND) {
            j->lend_state = LEND_CANCELLED; /* the acquirer's stack object: not touched again */
        } else {
            j->next = NULL;
            *work_tail = j;
            work_tail = &j->next;
        }
        cancelled++;
        j = next;
    }
    pthread_cond_broadcast(&pool->work_cv);
    pthread_cond_broadcast(&pool->lend_cv);
    while (pool->waiters > 0)
        pthread_cond_wait(&pool->lend_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);

    if (cancelled)
        log_info(NULL, "%s: shutting down, %d queued jobs cancelled", pool->cfg.name, cancelled);
    while (work_list) {
        j = work_list;
        work_list = j->next;
        if (j->done)
            j->done(QN_ERR, j->arg);
        free(j);
    }
    pool_stop_workers(pool);
    pool_destroy(pool);
}

bool pgpool_ready(const pgpool *pool)
{
    return pool && atomic_load(&((pgpool *)pool)->up) > 0;
}

void pgpool_stats(const pgpool *pool, int *in_use, int *queued)
{
    pgpool *p = (pgpool *)pool; /* atomics only; no state is changed */
    if (in_use)
        *in_use = p ? atomic_load(&p->in_use) : 0;
    if (queued)
        *queued = p ? atomic_load(&p->queued) : 0;
}

int pgpool_size(const pgpool *pool)
{
    return pool ? pool->size : 0; /* set once at creation */
}

const char *pgpool_name(const pgpool *pool)
{
    return pool ? pool->cfg.name : "";
}
