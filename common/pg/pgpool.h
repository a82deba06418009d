/*
 * A bounded PostgreSQL pool per data source (ds_0, ds_1) that never blocks the event loop.
 *
 * `size` worker threads each own one libpq connection. The loop thread submits a job (a work
 * function and a done callback); a worker runs work(conn, arg) with blocking libpq calls, then
 * done(status, arg) is posted back to the loop thread through the bridge. Jobs wait in a FIFO
 * queue of at most `queue_cap` entries: beyond that pgpool_submit returns QN_EBUSY at once, so
 * the HTTP layer can answer 503 instead of queueing without bound.
 *
 * Threads that may block (MQ consumers, the outbox relay) borrow a worker's connection with
 * pgpool_acquire/pgpool_release: the borrow waits in the same queue, so the number of
 * connections of a pool never exceeds `size`. A thread that wants a connection of its own,
 * outside any pool, opens one with pgpool_conn_open.
 *
 * Connections are (re)made lazily with exponential backoff (100 ms .. 5 s). A connection the
 * server closed while idle (pg_terminate_backend, restart) is noticed before the next job
 * without a round trip. If a connection cannot be made, the work function still runs:
 * pgpool_conn_ok() is false and every statement helper fails at once with the connection error
 * in pgpool_conn_error(), so work functions need only one error path.
 *
 * Every statement helper takes bound parameters in text format; nothing is interpolated.
 */
#ifndef QUAN_PGPOOL_H
#define QUAN_PGPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include <event2/event.h>
#include <libpq-fe.h>

#include "bridge.h"
#include "status.h"

typedef struct pgpool pgpool;
typedef struct pgpool_conn pgpool_conn;

/*
 * A commit hook: runs on the committing thread right after COMMIT of a transaction during which
 * pgpool_conn_note_commit was called, with the earliest at_ms noted. Also after a COMMIT whose
 * answer was lost (it may have committed), so a call must be harmless when nothing committed.
 * Must not block. The outbox uses it to wake its relay (outbox.h).
 */
typedef void (*pgpool_commit_fn)(void *arg, int64_t at_ms);

typedef struct pgpool_opts {
    const char *dsn;              /* libpq URI or key=value string; copied */
    const char *name;             /* data source name for logs and errors, e.g. "ds_0"; copied */
    const char *application_name; /* shown in pg_stat_activity; copied; default "quan" */
    int size;                     /* worker threads = connections; default 4 */
    int queue_cap;                /* jobs waiting for a worker; default 1024 */
    int statement_timeout_ms;     /* per statement, set on every connect; 0 = server default */
    int connect_timeout_s;        /* libpq connect_timeout (libpq's minimum is 2); default 5 */
    pgpool_commit_fn on_commit;   /* optional, for every connection of the pool */
    void *on_commit_arg;          /* borrowed; must outlive the pool or connection */
} pgpool_opts;

/*
 * Runs on a worker thread with the worker's connection (borrowed for the call). May run any
 * number of statements and transactions. A transaction left open is rolled back by the pool
 * and the job then reports QN_ERR, since its writes were discarded.
 */
typedef qn_status (*pgpool_work_fn)(pgpool_conn *conn, void *arg);
/* Runs on the loop thread after work returned, with work's status (or QN_ERR, see below). */
typedef void (*pgpool_done_fn)(qn_status st, void *arg);

/*
 * Starts the workers, which connect in the background. base and b are borrowed and must
 * outlive the pool. Owned by the caller; free with pgpool_free. NULL on bad options or when
 * out of memory (the reason is logged).
 */
pgpool *pgpool_new(struct event_base *base, bridge *b, const pgpool_opts *opts) QN_MUSTCHECK;

/*
 * Call on the loop thread, after every thread that uses pgpool_acquire has released its
 * connection. Waits for running jobs to finish, calls done(QN_ERR, arg) directly for every job
 * still queued ("shutting down"), closes the connections and frees the pool. Done callbacks of
 * jobs that were running are posted through the bridge as usual and may run after this returns:
 * they must not use the pool.
 */
void pgpool_free(pgpool *pool);

/*
 * Any thread. Queues work(conn, arg) for a worker; done(st, arg) will run on the loop thread.
 * QN_EBUSY when the queue holds queue_cap jobs, QN_ERR when the pool is shutting down,
 * QN_ENOMEM; in those cases neither callback will ever run.
 */
qn_status pgpool_submit(pgpool *pool, pgpool_work_fn work, pgpool_done_fn done,
                        void *arg) QN_MUSTCHECK;

/*
 * Not on the loop thread: blocks. Borrows a connection for the calling thread, waiting at most
 * timeout_ms (> 0) for a free worker (plus, rarely, a reconnect bounded by connect_timeout_s). NULL
 * on timeout, a full queue, or shutdown. The connection may be down: check pgpool_conn_ok or let
 * the first statement fail. Give it back with pgpool_release from the same thread.
 */
pgpool_conn *pgpool_acquire(pgpool *pool, int timeout_ms) QN_MUSTCHECK;
/* Rolls back a transaction left open and returns the connection to its worker. */
void pgpool_release(pgpool_conn *conn);

/* True while at least one connection of the pool is up. Any thread; never blocks. */
bool pgpool_ready(const pgpool *pool);
/* Jobs running or connections borrowed, and jobs waiting. Any thread; either may be NULL. */
void pgpool_stats(const pgpool *pool, int *in_use, int *queued);
/* Connections (worker threads) the pool has; 0 for NULL. Any thread. */
int pgpool_size(const pgpool *pool);
const char *pgpool_name(const pgpool *pool);

/*
 * A dedicated connection outside any pool, for tools and threads that want their own. Connects
 * synchronously (never on the loop thread). Returns NULL only when out of memory or on bad
 * options; a failed connect still returns the object, with pgpool_conn_ok() false and the reason
 * in pgpool_conn_error(). size and queue_cap are ignored.
 */
pgpool_conn *pgpool_conn_open(const pgpool_opts *opts) QN_MUSTCHECK;
void pgpool_conn_close(pgpool_conn *conn);
/* (Re)connects if the connection is down and the backoff allows; QN_OK if it is usable. */
qn_status pgpool_conn_ensure(pgpool_conn *conn) QN_MUSTCHECK;

/* --- Inside work functions, or with an acquired or dedicated connection --- */

/* True if the connection is up as far as the client knows. */
bool pgpool_conn_ok(const pgpool_conn *conn);
/*
 * Runs one statement with text-format parameters (NULL entries are SQL NULL). Returns the
 * owned result (free with PQclear) for PGRES_COMMAND_OK / PGRES_TUPLES_OK, else NULL with the
 * error in pgpool_conn_error / pgpool_conn_sqlstate.
 */
PGresult *pgpool_exec(pgpool_conn *conn, const char *sql, int nparams,
                      const char *const *params) QN_MUSTCHECK;
/*
 * pgpool_exec for statements whose rows are not needed. affected_rows (may be NULL) gets
 * PQcmdTuples, 0 if the command reports none. QN_ECONFLICT on a unique violation (23505),
 * QN_ETIMEDOUT when the statement timeout cancelled it (57014), QN_ERR otherwise.
 */
qn_status pgpool_exec_cmd(pgpool_conn *conn, const char *sql, int nparams,
                          const char *const *params, int64_t *affected_rows) QN_MUSTCHECK;
/*
 * Several statements in one string, no parameters, simple query protocol (migrations, DDL).
 * Never pass data in sql.
 */
qn_status pgpool_exec_script(pgpool_conn *conn, const char *sql) QN_MUSTCHECK;
qn_status pgpool_begin(pgpool_conn *conn) QN_MUSTCHECK;
/* Fails (and the transaction is gone) if the commit failed. QN_EUNKNOWN when the COMMIT was
 * sent and no answer came (the connection was lost): it may have committed, and the caller must
 * find out before it acts as if it had not. Any other failure (the connection was already down,
 * the server answered an error or ROLLBACK) means nothing of the transaction was committed. */
qn_status pgpool_commit(pgpool_conn *conn) QN_MUSTCHECK;
/* Safe to call when no transaction is open. */
qn_status pgpool_rollback(pgpool_conn *conn);
/*
 * Asks for the on_commit hook (pgpool_opts) when the open transaction commits, with the
 * earliest at_ms noted in it; a rollback forgets the note. With no transaction open the
 * statement just run has committed on its own, and the hook runs at once. No-op without a hook.
 */
void pgpool_conn_note_commit(pgpool_conn *conn, int64_t at_ms);

/* Message of the last failure on conn ("" if none). Borrowed; valid until the next call. */
const char *pgpool_conn_error(const pgpool_conn *conn);
/* SQLSTATE of the last failure ("" if none; "08006" when the connection is down). */
const char *pgpool_conn_sqlstate(const pgpool_conn *conn);
bool pgpool_is_unique_violation(const pgpool_conn *conn);
/* The raw libpq handle (borrowed; NULL when down), for COPY and other special cases. */
PGconn *pgpool_conn_pg(pgpool_conn *conn);

#endif
