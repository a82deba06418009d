/*
 * pgpool against a real PostgreSQL (QUAN_DS0_DSN, QUAN_DS1_DSN): done callbacks on the loop
 * thread, a responsive loop while workers block, the queue bound, transactions, SQLSTATEs,
 * the statement timeout, reconnects after pg_terminate_backend, borrowing and shutdown.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "bridge.h"
#include "log.h"
#include "now.h"
#include "pgpool.h"
#include "testhelp.h"

static struct event_base *base;
static bridge *br;
static pthread_t loop_thread;
static const char *dsn0, *dsn1;
static char table[64]; /* scratch table of this run */
static char appname[64];

/* ------------------------------------------------------------------ loop helpers */

typedef struct {
    const int *counter;
    int target;
    int64_t deadline;
} wait_ctx;

static void wait_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    wait_ctx *w = arg;
    if (*w->counter >= w->target || now_mono_ms() > w->deadline)
        event_base_loopbreak(base);
}

/* Runs the loop until *counter reaches target or timeout_ms passes. */
static int loop_until(const int *counter, int target, int timeout_ms)
{
    wait_ctx w = {counter, target, now_mono_ms() + timeout_ms};
    struct event *ev = event_new(base, -1, EV_PERSIST, wait_tick, &w);
    struct timeval tv = {0, 2000};
    event_add(ev, &tv);
    event_base_dispatch(base);
    event_free(ev);
    return *counter >= target;
}

/* ------------------------------------------------------------------ jobs */

typedef struct tjob {
    const char *sql;
    int nparams;
    const char *params[2];
    int mode; /* see tjob_work */
    qn_status work_st;
    qn_status done_st;
    int done_called;
    int done_on_loop;
    int work_off_loop;
    int conn_ok;
    int tx_idle; /* no transaction was open when the work function started */
    int64_t value;
    int64_t done_at_ms;
    char err[256];
    char sqlstate[6];
    int *done_count;
} tjob;

enum {
    MODE_QUERY,     /* run sql, keep the first value */
    MODE_CMD,       /* pgpool_exec_cmd(sql), status is the work status */
    MODE_TX_ROLLED, /* begin, two inserts, rollback */
    MODE_TX_COMMIT, /* begin, insert, commit */
    MODE_TX_OPEN,   /* begin, insert, return OK without commit */
    MODE_UNIQUE,    /* insert the same key twice in one transaction, then try to commit */
    MODE_TIMEOUT,   /* sql is slow: expect cancellation, then check the conn still works */
};

static void tjob_keep_error(tjob *j, pgpool_conn *c)
{
    snprintf(j->err, sizeof(j->err), "%s", pgpool_conn_error(c));
    snprintf(j->sqlstate, sizeof(j->sqlstate), "%s", pgpool_conn_sqlstate(c));
}

static qn_status tjob_work(pgpool_conn *c, void *arg)
{
    tjob *j = arg;
    qn_status st = QN_OK;
    j->work_off_loop = !pthread_equal(pthread_self(), loop_thread);
    j->conn_ok = pgpool_conn_ok(c);
    j->tx_idle = j->conn_ok && PQtransactionStatus(pgpool_conn_pg(c)) == PQTRANS_IDLE;
    switch (j->mode) {
    case MODE_QUERY: {
        PGresult *r = pgpool_exec(c, j->sql, j->nparams, j->params);
        if (!r) {
            tjob_keep_error(j, c);
            st = QN_ERR;
            break;
        }
        if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
            j->value = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        PQclear(r);
        break;
    }
    case MODE_CMD:
        st = pgpool_exec_cmd(c, j->sql, j->nparams, j->params, &j->value);
        if (st != QN_OK)
            tjob_keep_error(j, c);
        break;
    case MODE_TX_ROLLED:
    case MODE_TX_COMMIT:
    case MODE_TX_OPEN: {
        char sql[160];
        snprintf(sql, sizeof(sql), "INSERT INTO %s (id, v) VALUES ($1::int, $2)", table);
        const char *p1[] = {j->params[0], "a"};
        const char *p2[] = {j->params[1], "b"};
        if (pgpool_begin(c) != QN_OK || pgpool_exec_cmd(c, sql, 2, p1, NULL) != QN_OK) {
            tjob_keep_error(j, c);
            st = QN_ERR;
            break;
        }
        if (j->mode == MODE_TX_ROLLED) {
            if (pgpool_exec_cmd(c, sql, 2, p2, NULL) != QN_OK)
                st = QN_ERR;
            if (pgpool_rollback(c) != QN_OK)
                st = QN_ERR;
        } else if (j->mode == MODE_TX_COMMIT) {
            st = pgpool_commit(c);
        }
        break;
    }
    case MODE_UNIQUE: {
        char sql[160];
        snprintf(sql, sizeof(sql), "INSERT INTO %s (id, v) VALUES ($1::int, 'x')", table);
        const char *p[] = {j->params[0]};
        if (pgpool_begin(c) != QN_OK || pgpool_exec_cmd(c, sql, 1, p, NULL) != QN_OK) {
            st = QN_ERR;
            break;
        }
        j->work_st = pgpool_exec_cmd(c, sql, 1, p, NULL); /* the duplicate */
        j->value = pgpool_is_unique_violation(c);
        tjob_keep_error(j, c);
        /* The transaction is aborted now: COMMIT must report failure, not success. */
        st = pgpool_commit(c) == QN_OK ? QN_OK : QN_ECONFLICT;
        return st;
    }
    case MODE_TIMEOUT: {
        int64_t t0 = now_mono_ms();
        st = pgpool_exec_cmd(c, j->sql, 0, NULL, NULL);
        tjob_keep_error(j, c);
        j->value = now_mono_ms() - t0;
        PGresult *r = pgpool_exec(c, "SELECT 1", 0, NULL);
        if (!r)
            j->conn_ok = 0;
        PQclear(r);
        break;
    }
    }
    j->work_st = st;
    return st;
}

static void tjob_done(qn_status st, void *arg)
{
    tjob *j = arg;
    j->done_st = st;
    j->done_called++;
    j->done_on_loop = pthread_equal(pthread_self(), loop_thread);
    j->done_at_ms = now_mono_ms();
    if (j->done_count)
        (*j->done_count)++;
}

static pgpool *pool_new(const char *dsn, int size, int queue_cap, int stmt_ms)
{
    pgpool_opts o = {.dsn = dsn,
                     .name = "ds_test",
                     .application_name = appname,
                     .size = size,
                     .queue_cap = queue_cap,
                     .statement_timeout_ms = stmt_ms,
                     .connect_timeout_s = 2};
    return pgpool_new(base, br, &o);
}

static pgpool_conn *admin_conn(void)
{
    pgpool_opts o = {.dsn = dsn0, .name = "admin", .application_name = "pgpool-test-admin"};
    return pgpool_conn_open(&o);
}

static int64_t admin_int(const char *sql, const char *param)
{
    pgpool_conn *c = admin_conn();
    const char *p[] = {param};
    PGresult *r = pgpool_exec(c, sql, param ? 1 : 0, p);
    int64_t v = -1;
    if (r && PQntuples(r) > 0)
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    if (!r)
        printf("  admin query failed: %s\n", pgpool_conn_error(c));
    PQclear(r);
    pgpool_conn_close(c);
    return v;
}

/* Waits (off the loop) until the pool reports `want` jobs in use. */
static int wait_in_use(pgpool *p, int want)
{
    for (int i = 0; i < 300; i++) {
        int in_use = 0;
        pgpool_stats(p, &in_use, NULL);
        if (in_use == want)
            return 1;
        usleep(10000);
    }
    return 0;
}

/* ------------------------------------------------------------------ tests */

static void test_done_on_loop_thread(void)
{
    pgpool *p = pool_new(dsn0, 2, 16, 0);
    pgpool *p1 = pool_new(dsn1, 1, 16, 0);
    CHECK(p != NULL && p1 != NULL);
    if (!p || !p1)
        goto done;
    int n = 0;
    tjob j[4] = {0};
    for (int i = 0; i < 3; i++) {
        j[i] = (tjob){.mode = MODE_QUERY,
                      .sql = "SELECT $1::int + 1",
                      .nparams = 1,
                      .params = {"41"},
                      .done_count = &n};
        CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j[i]), QN_OK);
    }
    /* ds_1 really is the other database. */
    j[3] = (tjob){.mode = MODE_QUERY,
                  .sql = "SELECT CASE WHEN current_database() = 'ds_1' THEN 1 ELSE 0 END",
                  .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p1, tjob_work, tjob_done, &j[3]), QN_OK);
    CHECK(loop_until(&n, 4, 5000));
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(j[i].done_called, 1);
        CHECK_EQ_INT(j[i].done_st, QN_OK);
        CHECK(j[i].done_on_loop);
        CHECK(j[i].work_off_loop);
        CHECK_EQ_INT(j[i].value, i < 3 ? 42 : 1);
    }
    CHECK(pgpool_ready(p));
    CHECK_EQ_STR(pgpool_name(p), "ds_test");
done:
    pgpool_free(p);
    pgpool_free(p1);
}

static int ticks;
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    ticks++;
}

static void test_loop_stays_responsive(void)
{
    pgpool *p = pool_new(dsn0, 4, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    /* Warm up: all four connections made, so the timing measures only the sleeps. */
    for (int i = 0; i < 100 && admin_int("SELECT count(*) FROM pg_stat_activity "
                                         "WHERE application_name = $1",
                                         appname) < 4;
         i++)
        usleep(20000);

    int n = 0;
    tjob j[4];
    ticks = 0;
    struct event *tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
    struct timeval tv = {0, 10000};
    event_add(tick, &tv);
    int64_t t0 = now_mono_ms();
    for (int i = 0; i < 4; i++) {
        j[i] = (tjob){.mode = MODE_QUERY, .sql = "SELECT 7 FROM pg_sleep(0.3)", .done_count = &n};
        CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j[i]), QN_OK);
    }
    CHECK(loop_until(&n, 4, 5000));
    int64_t elapsed = now_mono_ms() - t0;
    event_free(tick);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(j[i].done_st, QN_OK);
        CHECK_EQ_INT(j[i].value, 7);
        CHECK(j[i].done_on_loop);
    }
    printf("  4 x pg_sleep(0.3) took %lld ms, %d ticks of 10 ms\n", (long long)elapsed, ticks);
    CHECK(elapsed >= 290);
    CHECK(elapsed < 900); /* in parallel: serially it would be 1200 ms */
    CHECK(ticks >= 20);   /* the loop kept running timers while the workers blocked */
    pgpool_free(p);
}

static void test_queue_bound(void)
{
    pgpool *p = pool_new(dsn0, 2, 2, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob slow[2], quick[3];
    for (int i = 0; i < 2; i++) {
        slow[i] =
            (tjob){.mode = MODE_QUERY, .sql = "SELECT 1 FROM pg_sleep(0.3)", .done_count = &n};
        CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &slow[i]), QN_OK);
    }
    CHECK(wait_in_use(p, 2));
    for (int i = 0; i < 3; i++)
        quick[i] = (tjob){.mode = MODE_QUERY, .sql = "SELECT 2", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &quick[0]), QN_OK);
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &quick[1]), QN_OK);
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &quick[2]), QN_EBUSY);
    int in_use = -1, queued = -1;
    pgpool_stats(p, &in_use, &queued);
    CHECK_EQ_INT(in_use, 2);
    CHECK_EQ_INT(queued, 2);
    CHECK(loop_until(&n, 4, 5000));
    CHECK_EQ_INT(quick[0].done_st, QN_OK);
    CHECK_EQ_INT(quick[1].value, 2);
    CHECK_EQ_INT(quick[2].done_called, 0); /* refused jobs never call back */
    pgpool_stats(p, &in_use, &queued);
    CHECK_EQ_INT(in_use, 0);
    CHECK_EQ_INT(queued, 0);
    pgpool_free(p);
}

static int64_t count_rows(const char *where)
{
    char sql[200];
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE %s", table, where);
    return admin_int(sql, NULL);
}

static void test_transactions(void)
{
    pgpool *p = pool_new(dsn0, 1, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob rolled = {.mode = MODE_TX_ROLLED, .params = {"1", "2"}, .done_count = &n};
    tjob committed = {.mode = MODE_TX_COMMIT, .params = {"3", NULL}, .done_count = &n};
    tjob left_open = {.mode = MODE_TX_OPEN, .params = {"4", NULL}, .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &rolled), QN_OK);
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &committed), QN_OK);
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &left_open), QN_OK);
    CHECK(loop_until(&n, 3, 5000));
    CHECK_EQ_INT(rolled.done_st, QN_OK);
    CHECK_EQ_INT(count_rows("id IN (1, 2)"), 0);
    CHECK_EQ_INT(committed.done_st, QN_OK);
    CHECK_EQ_INT(count_rows("id = 3"), 1);
    /* Work said OK but left the transaction open: the pool rolled back and reports failure. */
    CHECK_EQ_INT(left_open.work_st, QN_OK);
    CHECK_EQ_INT(left_open.done_st, QN_ERR);
    CHECK_EQ_INT(count_rows("id = 4"), 0);

    /* The same connection is clean for the next job. */
    tjob after = {.mode = MODE_QUERY, .sql = "SELECT 1", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &after), QN_OK);
    CHECK(loop_until(&n, 4, 5000));
    CHECK_EQ_INT(after.done_st, QN_OK);
    CHECK(after.tx_idle);
    pgpool_free(p);
}

static void test_unique_violation(void)
{
    pgpool *p = pool_new(dsn0, 1, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob j = {.mode = MODE_UNIQUE, .params = {"10"}, .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j), QN_OK);
    CHECK(loop_until(&n, 1, 5000));
    CHECK_EQ_INT(j.work_st, QN_ECONFLICT);
    CHECK_EQ_INT(j.value, 1);
    CHECK_EQ_STR(j.sqlstate, "23505");
    CHECK(strstr(j.err, "duplicate key") != NULL);
    CHECK_EQ_INT(j.done_st, QN_ECONFLICT); /* COMMIT of the aborted transaction failed */
    CHECK_EQ_INT(count_rows("id = 10"), 0);
    pgpool_free(p);
}

static void test_statement_timeout(void)
{
    pgpool *p = pool_new(dsn0, 1, 16, 200);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob j = {.mode = MODE_TIMEOUT, .sql = "SELECT pg_sleep(3)", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j), QN_OK);
    CHECK(loop_until(&n, 1, 6000));
    CHECK_EQ_INT(j.done_st, QN_ETIMEDOUT);
    CHECK_EQ_STR(j.sqlstate, "57014");
    CHECK(j.value >= 150 && j.value < 1500);
    CHECK(j.conn_ok); /* the connection survives a cancelled statement */
    pgpool_free(p);
}

static qn_status pid_work(pgpool_conn *c, void *arg)
{
    tjob *j = arg;
    PGresult *r = pgpool_exec(c, "SELECT pg_backend_pid() FROM pg_sleep(0.1)", 0, NULL);
    if (!r) {
        tjob_keep_error(j, c);
        return QN_ERR;
    }
    j->value = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return QN_OK;
}

/* pid_work once both jobs of the pair have started: each holds its worker until the other
 * has one too, so the two run on two connections however slowly the second one connects. */
static atomic_int pair_started;

static qn_status pid_pair_work(pgpool_conn *c, void *arg)
{
    atomic_fetch_add(&pair_started, 1);
    for (int ms = 0; ms < 10000 && atomic_load(&pair_started) < 2; ms++)
        usleep(1000);
    return pid_work(c, arg);
}

static void test_reconnect_after_terminate(void)
{
    pgpool *p = pool_new(dsn0, 2, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob a[2] = {{.done_count = &n}, {.done_count = &n}};
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pgpool_submit(p, pid_pair_work, tjob_done, &a[i]), QN_OK);
    CHECK(loop_until(&n, 2, 15000));
    CHECK(a[0].done_st == QN_OK && a[1].done_st == QN_OK);
    CHECK(a[0].value != a[1].value); /* two connections */

    int64_t killed = admin_int("SELECT count(*) FROM (SELECT pg_terminate_backend(pid, 5000) "
                               "FROM pg_stat_activity WHERE application_name = $1) t",
                               appname);
    CHECK_EQ_INT(killed, 2);

    /* Right away, before the idle check: the worker notices the close at job start. */
    tjob b[2] = {{.done_count = &n}, {.done_count = &n}};
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pgpool_submit(p, pid_work, tjob_done, &b[i]), QN_OK);
    CHECK(loop_until(&n, 4, 10000));
    for (int i = 0; i < 2; i++) {
        if (b[i].done_st != QN_OK)
            printf("  job after terminate: %s\n", b[i].err);
        CHECK_EQ_INT(b[i].done_st, QN_OK);
        CHECK(b[i].value > 0 && b[i].value != a[0].value && b[i].value != a[1].value);
    }
    CHECK(pgpool_ready(p));
    /* The bound holds: never more than size connections. */
    CHECK(admin_int("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", appname) <=
          2);
    pgpool_free(p);
}

/* What a failed COMMIT says: QN_EUNKNOWN once it was sent and no answer came (the server may
 * have committed; here it went away with the transaction), QN_ERR when it never left (the
 * connection known down) or the server answered a rollback: nothing committed. */
/* Ends c's server process from another connection (as a restart or a lost network would), so
 * that c's next statement finds it gone; 1 when it was ended. */
static int64_t terminate_backend_of(pgpool_conn *c)
{
    char pid[24];
    PGresult *r = pgpool_exec(c, "SELECT pg_backend_pid()", 0, NULL);
    CHECK(r != NULL);
    snprintf(pid, sizeof(pid), "%s", r ? PQgetvalue(r, 0, 0) : "0");
    PQclear(r);
    return admin_int("SELECT count(*) FROM (SELECT pg_terminate_backend($1::int, 5000)) t", pid);
}

static void test_commit_outcome(void)
{
    pgpool_opts o = {.dsn = dsn0, .name = "ds_test", .application_name = appname};
    pgpool_conn *c = pgpool_conn_open(&o);
    char sql[160];
    CHECK(c && pgpool_conn_ok(c));
    if (!c || !pgpool_conn_ok(c)) {
        pgpool_conn_close(c);
        return;
    }
    snprintf(sql, sizeof(sql), "INSERT INTO %s (id, v) VALUES (20, 'x')", table);
    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    CHECK_EQ_INT(pgpool_exec_cmd(c, sql, 0, NULL, NULL), QN_OK);
    CHECK_EQ_INT(terminate_backend_of(c), 1);
    CHECK_EQ_INT(pgpool_commit(c), QN_EUNKNOWN);
    CHECK(!pgpool_conn_ok(c));
    CHECK_EQ_INT(pgpool_commit(c), QN_ERR); /* never sent: the connection is known down */
    CHECK_EQ_INT(count_rows("id = 20"), 0);

    CHECK_EQ_INT(pgpool_conn_ensure(c), QN_OK);
    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    CHECK(pgpool_exec_cmd(c, "SELECT 1/0", 0, NULL, NULL) != QN_OK);
    CHECK_EQ_INT(pgpool_commit(c), QN_ERR); /* the server rolled back: a certain failure */
    CHECK(pgpool_conn_ok(c));
    pgpool_conn_close(c);
}

/* The commit hook (what wakes an outbox relay): called once per committed transaction that
 * noted something, with the earliest time noted; never for a rollback, a transaction the pool
 * rolled back, or a failed one; at once for a statement outside a transaction; and also when
 * the COMMIT's answer was lost, since the transaction may have committed. */
typedef struct hook_rec {
    int calls;
    int64_t at;
} hook_rec;

static void hook_fn(void *arg, int64_t at_ms)
{
    hook_rec *h = arg;
    h->calls++;
    h->at = at_ms;
}

static void test_commit_hook(void)
{
    hook_rec h = {0};
    pgpool_opts o = {.dsn = dsn0,
                     .name = "ds_test",
                     .application_name = appname,
                     .size = 1,
                     .on_commit = hook_fn,
                     .on_commit_arg = &h};
    pgpool *p = pgpool_new(base, br, &o);
    CHECK(p != NULL);
    if (!p)
        return;
    pgpool_conn *c = pgpool_acquire(p, 2000);
    CHECK(c != NULL && pgpool_conn_ok(c));
    if (!c)
        goto done;

    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    pgpool_conn_note_commit(c, 500);
    pgpool_conn_note_commit(c, 200);
    pgpool_conn_note_commit(c, 900);
    CHECK_EQ_INT(h.calls, 0); /* nothing before the commit */
    CHECK_EQ_INT(pgpool_commit(c), QN_OK);
    CHECK_EQ_INT(h.calls, 1);
    CHECK_EQ_INT(h.at, 200);

    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    pgpool_conn_note_commit(c, 100);
    CHECK_EQ_INT(pgpool_rollback(c), QN_OK);
    CHECK_EQ_INT(pgpool_begin(c), QN_OK); /* a later transaction inherits nothing */
    CHECK_EQ_INT(pgpool_exec_cmd(c, "SELECT 1", 0, NULL, NULL), QN_OK);
    CHECK_EQ_INT(pgpool_commit(c), QN_OK);
    CHECK_EQ_INT(h.calls, 1);

    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    pgpool_conn_note_commit(c, 5);
    CHECK(pgpool_exec_cmd(c, "SELECT 1/0", 0, NULL, NULL) != QN_OK);
    CHECK_EQ_INT(pgpool_commit(c), QN_ERR); /* the server rolled it back */
    CHECK_EQ_INT(h.calls, 1);

    pgpool_conn_note_commit(c, 42); /* no transaction open: the statement committed already */
    CHECK_EQ_INT(h.calls, 2);
    CHECK_EQ_INT(h.at, 42);

    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    pgpool_conn_note_commit(c, 7);
    pgpool_release(c); /* left open: the pool rolls it back */
    c = pgpool_acquire(p, 2000);
    CHECK(c != NULL);
    if (!c)
        goto done;
    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    CHECK_EQ_INT(pgpool_commit(c), QN_OK);
    CHECK_EQ_INT(h.calls, 2);

    /* The COMMIT sent and its answer lost: maybe committed, so the hook runs. */
    CHECK_EQ_INT(pgpool_begin(c), QN_OK);
    pgpool_conn_note_commit(c, 3);
    CHECK_EQ_INT(terminate_backend_of(c), 1);
    CHECK_EQ_INT(pgpool_commit(c), QN_EUNKNOWN);
    CHECK_EQ_INT(h.calls, 3);
    CHECK_EQ_INT(h.at, 3);
    pgpool_release(c);
done:
    pgpool_free(p);
}

static void test_connect_failure(void)
{
    /* Port 1 on loopback: connection refused at once. */
    pgpool *p = pool_new("postgresql://quan@127.0.0.1:1/ds_0", 1, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob j = {.mode = MODE_QUERY, .sql = "SELECT 1", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j), QN_OK);
    CHECK(loop_until(&n, 1, 5000));
    CHECK_EQ_INT(j.done_st, QN_ERR);
    CHECK_EQ_INT(j.conn_ok, 0);
    CHECK_EQ_STR(j.sqlstate, "08006");
    CHECK(strstr(j.err, "ds_test: connect failed") != NULL);
    CHECK(!pgpool_ready(p));
    pgpool_free(p);

    pgpool_opts o = {.dsn = "postgresql://quan@127.0.0.1:1/ds_0", .name = "dead"};
    pgpool_conn *c = pgpool_conn_open(&o);
    CHECK(c != NULL && !pgpool_conn_ok(c));
    CHECK(strstr(pgpool_conn_error(c), "dead: connect failed") != NULL);
    CHECK(pgpool_exec(c, "SELECT 1", 0, NULL) == NULL);
    pgpool_conn_close(c);
}

static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Every connection to a database that is down fails with the same message: told once a second
 * per database name and process, pools and dedicated connections together, with the count held
 * back; another name has a limit of its own. */
static void test_connect_failure_told_once(void)
{
    enum { N = 6 };
    pgpool_opts o = {.dsn = "postgresql://quan@127.0.0.1:1/ds_0", .name = "down_a"};
    pgpool_opts o2 = {.dsn = "postgresql://quan@127.0.0.1:1/ds_0", .name = "down_b"};
    pgpool_conn *c[N] = {0}, *other = NULL, *late = NULL;

    log_level was = log_min_level;
    log_min_level = LOGL_WARN;
    th_capture cap = th_capture_start();
    for (int i = 0; i < N; i++)
        c[i] = pgpool_conn_open(&o); /* each tries at once, and fails */
    other = pgpool_conn_open(&o2);
    char *first = th_capture_end(cap);

    usleep(1100 * 1000);
    cap = th_capture_start();
    late = pgpool_conn_open(&o);
    char *second = th_capture_end(cap);
    log_min_level = was;

    CHECK(first && second);
    if (first && second) {
        CHECK_EQ_INT(count_of(first, "down_a: connect failed"), 1);
        CHECK_EQ_INT(count_of(first, "down_b: connect failed"), 1);
        CHECK_EQ_INT(count_of(second, "down_a: connect failed"), 1);
        CHECK(strstr(second, "\"suppressed\":5") != NULL); /* the N - 1 held back before */
    }
    for (int i = 0; i < N; i++) {
        CHECK(c[i] && strstr(pgpool_conn_error(c[i]), "down_a: connect failed"));
        pgpool_conn_close(c[i]);
    }
    pgpool_conn_close(other);
    pgpool_conn_close(late);
    free(first);
    free(second);
}

typedef struct {
    pgpool *pool;
    int timeout_ms;
    int got;
    int64_t waited_ms;
} acq_arg;

static void *acquire_thread(void *arg)
{
    acq_arg *a = arg;
    int64_t t0 = now_mono_ms();
    pgpool_conn *c = pgpool_acquire(a->pool, a->timeout_ms);
    a->waited_ms = now_mono_ms() - t0;
    if (c) {
        PGresult *r = pgpool_exec(c, "SELECT 1", 0, NULL);
        a->got = r != NULL;
        PQclear(r);
        pgpool_release(c);
    }
    return NULL;
}

static void test_acquire_release(void)
{
    pgpool *p = pool_new(dsn0, 1, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    /* The test thread borrows the only connection (it is not the loop here). */
    pgpool_conn *c = pgpool_acquire(p, 2000);
    CHECK(c != NULL);
    if (!c)
        goto done;
    CHECK(pgpool_conn_ok(c));
    CHECK_EQ_INT(pgpool_begin(c), QN_OK); /* left open on purpose: release rolls it back */
    int in_use = 0;
    pgpool_stats(p, &in_use, NULL);
    CHECK_EQ_INT(in_use, 1);

    /* Nobody else gets a connection while it is lent: the bound is size. */
    acq_arg a = {.pool = p, .timeout_ms = 150};
    pthread_t t;
    pthread_create(&t, NULL, acquire_thread, &a);
    pthread_join(t, NULL);
    CHECK_EQ_INT(a.got, 0);
    CHECK(a.waited_ms >= 140 && a.waited_ms < 1000);
    int queued = -1;
    pgpool_stats(p, NULL, &queued);
    CHECK_EQ_INT(queued, 0); /* the timed-out borrow left the queue */

    /* A job submitted meanwhile waits, then runs after release. */
    int n = 0;
    tjob j = {.mode = MODE_QUERY, .sql = "SELECT 5", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j), QN_OK);
    a = (acq_arg){.pool = p, .timeout_ms = 3000};
    pthread_create(&t, NULL, acquire_thread, &a);
    usleep(50000);
    pgpool_release(c);
    pthread_join(t, NULL);
    CHECK_EQ_INT(a.got, 1);
    CHECK(loop_until(&n, 1, 5000));
    CHECK_EQ_INT(j.done_st, QN_OK);
    CHECK_EQ_INT(j.value, 5);
    CHECK(j.tx_idle); /* the borrower's open transaction was rolled back on release */
    CHECK(admin_int("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", appname) <=
          1);
done:
    pgpool_free(p);
}

static void test_shutdown_cancels_queued(void)
{
    pgpool *p = pool_new(dsn0, 1, 16, 0);
    CHECK(p != NULL);
    if (!p)
        return;
    int n = 0;
    tjob j[4];
    j[0] = (tjob){.mode = MODE_QUERY, .sql = "SELECT 1 FROM pg_sleep(0.3)", .done_count = &n};
    CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j[0]), QN_OK);
    CHECK(wait_in_use(p, 1));
    for (int i = 1; i < 4; i++) {
        j[i] = (tjob){.mode = MODE_QUERY, .sql = "SELECT 1", .done_count = &n};
        CHECK_EQ_INT(pgpool_submit(p, tjob_work, tjob_done, &j[i]), QN_OK);
    }
    int64_t t0 = now_mono_ms();
    pgpool_free(p); /* waits for the running job */
    CHECK(now_mono_ms() - t0 >= 100);
    CHECK_EQ_INT(n, 3); /* the queued ones, called back right here on this thread */
    for (int i = 1; i < 4; i++) {
        CHECK_EQ_INT(j[i].done_st, QN_ERR);
        CHECK_EQ_INT(j[i].work_off_loop, 0); /* work never ran */
        CHECK(j[i].done_on_loop);
    }
    CHECK(loop_until(&n, 4, 3000)); /* the running job's done comes through the bridge */
    CHECK_EQ_INT(j[0].done_st, QN_OK);
}

int main(void)
{
    log_init("test_pgpool", LOGL_ERROR);
    dsn0 = th_env("QUAN_DS0_DSN");
    dsn1 = th_env("QUAN_DS1_DSN");
    base = event_base_new();
    br = bridge_new(base);
    loop_thread = pthread_self();
    snprintf(table, sizeof(table), "pgpool_test_%d", (int)getpid());
    snprintf(appname, sizeof(appname), "pgpool-test-%d", (int)getpid());

    char sql[200];
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (id int PRIMARY KEY, v text NOT NULL)", table);
    pgpool_conn *admin = admin_conn();
    if (!pgpool_conn_ok(admin) || pgpool_exec_script(admin, sql) != QN_OK) {
        printf("  setup failed: %s\n0 passed, 1 failed\n", pgpool_conn_error(admin));
        return 1;
    }

    RUN(test_done_on_loop_thread);
    RUN(test_loop_stays_responsive);
    RUN(test_queue_bound);
    RUN(test_transactions);
    RUN(test_unique_violation);
    RUN(test_statement_timeout);
    RUN(test_reconnect_after_terminate);
    RUN(test_commit_outcome);
    RUN(test_commit_hook);
    RUN(test_connect_failure);
    RUN(test_connect_failure_told_once);
    RUN(test_acquire_release);
    RUN(test_shutdown_cancels_queued);

    snprintf(sql, sizeof(sql), "DROP TABLE IF EXISTS %s", table);
    if (pgpool_exec_script(admin, sql) != QN_OK)
        printf("  cleanup failed: %s\n", pgpool_conn_error(admin));
    pgpool_conn_close(admin);
    bridge_free(br);
    event_base_free(base);
    TEST_MAIN_END();
}
