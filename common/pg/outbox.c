/* Transactional outbox and its relay; see outbox.h for the delivery contract. */
#include "outbox.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "mq_thread.h"
#include "now.h"
#include "pgparam.h"

METRICS_DEFINE(OUTBOX_METRICS)

#define OUTBOX_DEFAULT_BATCH       100
#define OUTBOX_DEFAULT_POLL_MS     200
#define OUTBOX_DEFAULT_IDLE_MS     1000
#define OUTBOX_DEFAULT_RETENTION_S 86400
#define OUTBOX_DEFAULT_BACKOFF_MIN 1000
#define OUTBOX_DEFAULT_BACKOFF_MAX 60000
#define OUTBOX_DEFAULT_CLEANUP_MS  60000
#define OUTBOX_DEFAULT_BACKLOG_MS  5000
#define OUTBOX_MAX_BATCH           10000
#define OUTBOX_CLEANUP_CHUNK       500 /* rows per DELETE: short locks, small WAL bursts */
#define OUTBOX_CLEANUP_ROUNDS      40  /* chunks per cleanup tick, so publishing is not starved */
#define OUTBOX_RECONNECT_MIN_MS    100
#define OUTBOX_RECONNECT_MAX_MS    5000
#define OUTBOX_ERR_MAX             500 /* last_error is truncated to this many characters */
#define OUTBOX_STATEMENT_TIMEOUT   30000

#define OUTBOX_STR_(x) #x
#define OUTBOX_STR(x)  OUTBOX_STR_(x)

/* ---------------------------------------------------------------- producer side */

static qn_status status_of_sql_error(const pgpool_conn *conn)
{
    /* Class 22 (data exception): data_json is not JSON, a value out of range. */
    return strncmp(pgpool_conn_sqlstate(conn), "22", 2) == 0 ? QN_EINVAL : QN_ERR;
}

qn_status outbox_add_many(pgpool_conn *conn, const outbox_event *evs, size_t n)
{
    static const char sql[] =
        "INSERT INTO t_outbox (topic, msg_key, payload, headers, due_at) "
        "SELECT t, k, p::jsonb, jsonb_strip_nulls(jsonb_build_object('requestId', r, "
        "'traceparent', tp)), COALESCE(to_timestamp(d::double precision / 1000), now()) "
        "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) "
        "WITH ORDINALITY AS x(t, k, p, r, tp, d, o) ORDER BY o";
    pgparam_array a[6] = {0};
    pgparam p = {0};
    qn_status st = QN_EINVAL;
    int64_t earliest = INT64_MAX; /* 0: due now */

    if (!conn || (n && !evs))
        return QN_EINVAL;
    if (n == 0)
        return QN_OK;
    for (size_t i = 0; i < n; i++) {
        const outbox_event *ev = &evs[i];
        char due[PGPARAM_NUM_LEN];
        if (!ev->routing_key || !*ev->routing_key || !ev->key || !*ev->key || ev->due_at_ms < 0)
            goto out;
        if (ev->due_at_ms)
            pgparam_fmt_i64(due, ev->due_at_ms);
        if (ev->due_at_ms < earliest)
            earliest = ev->due_at_ms;
        pgparam_array_str(&a[0], ev->routing_key);
        pgparam_array_str(&a[1], ev->key);
        pgparam_array_str(&a[2], ev->data_json ? ev->data_json : "{}");
        pgparam_array_str(&a[3], ev->request_id);
        pgparam_array_str(&a[4], ev->traceparent);
        pgparam_array_str(&a[5], ev->due_at_ms ? due : NULL); /* NULL: now() */
    }
    for (int k = 0; k < 6; k++)
        if ((st = pgparam_array_bind(&p, &a[k])) != QN_OK)
            goto out;
    st = pgpool_exec_cmd(conn, sql, p.n, p.v, NULL);
    if (st == QN_OK)
        pgpool_conn_note_commit(conn, earliest); /* the relay hears of them at the commit */
    else if (st != QN_ETIMEDOUT)
        st = status_of_sql_error(conn);
out:
    for (int k = 0; k < 6; k++)
        pgparam_array_free(&a[k]);
    return st;
}

qn_status outbox_add(pgpool_conn *conn, const outbox_event *ev)
{
    return ev ? outbox_add_many(conn, ev, 1) : QN_EINVAL;
}

qn_status outbox_cancel(pgpool_conn *conn, const char *key, int64_t *cancelled)
{
    const char *params[1] = {key};

    if (cancelled)
        *cancelled = 0;
    if (!conn || !key || !*key)
        return QN_EINVAL;
    return pgpool_exec_cmd(
        conn, "DELETE FROM t_outbox WHERE msg_key = $1 AND status = " OUTBOX_STATUS_TEXT(PENDING),
        1, params, cancelled);
}

qn_status outbox_backlog(pgpool_conn *conn, int64_t *out)
{
    PGresult *res;

    if (!conn || !out)
        return QN_EINVAL;
    res = pgpool_exec(conn,
                      "SELECT count(*) FROM t_outbox WHERE status = " OUTBOX_STATUS_TEXT(
                          PENDING) " AND due_at <= now()",
                      0, NULL);
    if (!res)
        return QN_ERR;
    *out = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    PQclear(res);
    return QN_OK;
}

/* ---------------------------------------------------------------- relay */

struct outbox_relay {
    char *dsn, *ds, *amqp_url;
    int batch, poll_ms, idle_ms, retention_s, confirm_timeout_ms;
    int backoff_min_ms, backoff_max_ms, cleanup_interval_ms, backlog_interval_ms;

    mq_thread t;          /* the relay's thread, its stop request and waits */
    bool woken;           /* under t.mu: a wake arrived, skip the next wait */
    int64_t asleep_until; /* under t.mu: wall ms the current wait ends; 0 while a pass runs */
    atomic_int_fast64_t published, failed;

    /* Relay thread only. */
    pgpool_conn *pg;
    mq_conn *mq;
    mq_conn_cursor mq_cursor;        /* a reconnect goes to the next node of the list */
    int64_t mq_retry_at, mq_backoff; /* monotonic ms */
    int64_t next_cleanup, next_backlog;
};

/* Sleeps up to ms, returning early on stop or wake. */
static void relay_wait(outbox_relay *r, int64_t ms)
{
    pthread_mutex_lock(&r->t.mu);
    if (!r->woken && !mq_thread_stopping(&r->t) && ms > 0) {
        r->asleep_until = now_wall_ms() + ms;
        mq_thread_wait(&r->t, ms);
        r->asleep_until = 0;
    }
    r->woken = false;
    pthread_mutex_unlock(&r->t.mu);
}

/* QN_OK when both connections are usable; otherwise the caller waits a little and retries. */
static qn_status relay_connect(outbox_relay *r)
{
    char name[96];

    if (pgpool_conn_ensure(r->pg) != QN_OK)
        return QN_EAGAIN; /* pgpool keeps its own reconnect backoff */
    if (r->mq && !mq_conn_ok(r->mq)) {
        mq_conn_close(r->mq);
        r->mq = NULL;
    }
    if (r->mq)
        return QN_OK;
    if (now_mono_ms() < r->mq_retry_at)
        return QN_EAGAIN;
    snprintf(name, sizeof(name), "outbox-relay:%s", r->ds);
    r->mq = mq_conn_open_at(r->amqp_url, name, &r->mq_cursor);
    if (!r->mq) {
        r->mq_backoff = r->mq_backoff ? r->mq_backoff * 2 : OUTBOX_RECONNECT_MIN_MS;
        if (r->mq_backoff > OUTBOX_RECONNECT_MAX_MS)
            r->mq_backoff = OUTBOX_RECONNECT_MAX_MS;
        r->mq_retry_at = now_mono_ms() + r->mq_backoff;
        return QN_EAGAIN;
    }
    r->mq_backoff = 0;
    return QN_OK;
}

static int64_t retry_delay_ms(const outbox_relay *r, int attempts)
{
    int64_t d = r->backoff_min_ms;
    for (int i = 0; i < attempts && d < r->backoff_max_ms; i++)
        d *= 2;
    return d < r->backoff_max_ms ? d : r->backoff_max_ms;
}

/* Records a failed publish of row id: one more attempt, the reason, a later due time. */
static qn_status relay_mark_failed(outbox_relay *r, const char *id, int attempts, qn_status st)
{
    char err[OUTBOX_ERR_MAX + 1];
    const char *mqerr = r->mq ? mq_conn_errstr(r->mq) : "";
    pgparam p = {0};

    snprintf(err, sizeof(err), "%s%s%s", qn_status_str(st), *mqerr ? ": " : "", mqerr);
    if (st == QN_ENOTFOUND)
        snprintf(err, sizeof(err), "unroutable: no queue bound for the routing key");
    pgparam_str(&p, id);
    pgparam_str(&p, err);
    pgparam_i64(&p, retry_delay_ms(r, attempts));
    return pgpool_exec_cmd(r->pg,
                           "UPDATE t_outbox SET attempts = attempts + 1, last_error = $2, "
                           "due_at = clock_timestamp() + $3::bigint * interval '1 millisecond' "
                           "WHERE id = $1",
                           p.n, p.v, NULL);
}

/*
 * One transaction: claim up to batch due rows, publish each, record the outcomes, commit.
 * Returns the number of rows claimed (so a full batch means "go again at once"), or -1 when a
 * connection failed.
 */
static int relay_batch(outbox_relay *r)
{
    static const char select_sql[] =
        "SELECT id, topic, msg_key, payload::text, headers->>'requestId', "
        "headers->>'traceparent', (extract(epoch FROM created_at) * 1000)::bigint, attempts "
        "FROM t_outbox WHERE status = " OUTBOX_STATUS_TEXT(
            PENDING) " AND due_at <= now() "
                     "ORDER BY due_at, id LIMIT $1 FOR UPDATE SKIP LOCKED";
    PGresult *res = NULL;
    pgparam_array sent = {0};
    int n = 0, rc = -1, nsent = 0, nfailed = 0;
    bool mq_broken = false;
    pgparam p = {0};

    pgparam_i64(&p, r->batch);
    if (pgpool_begin(r->pg) != QN_OK)
        goto fail;
    if (!(res = pgpool_exec(r->pg, select_sql, p.n, p.v)))
        goto fail;
    n = PQntuples(res);
    for (int i = 0; i < n && !mq_thread_stopping(&r->t); i++) {
        const char *id = PQgetvalue(res, i, 0);
        mq_msg m = {
            .routing_key = PQgetvalue(res, i, 1),
            .key = PQgetvalue(res, i, 2),
            .data_json = PQgetvalue(res, i, 3),
            .request_id = PQgetisnull(res, i, 4) ? NULL : PQgetvalue(res, i, 4),
            .traceparent = PQgetisnull(res, i, 5) ? NULL : PQgetvalue(res, i, 5),
            .ts_ms = strtoll(PQgetvalue(res, i, 6), NULL, 10),
        };
        int attempts = atoi(PQgetvalue(res, i, 7));
        qn_status st = mq_conn_publish_confirmed(r->mq, &m, r->confirm_timeout_ms);

        if (st == QN_OK) {
            pgparam_array_i64(&sent, strtoll(id, NULL, 10));
            nsent++;
            continue;
        }
        nfailed++;
        log_warnf(NULL,
                  ((log_field[]){LOG_S("ds", r->ds), LOG_S("id", id), LOG_S("topic", m.routing_key),
                                 LOG_S("key", m.key), LOG_S("status", qn_status_str(st)),
                                 LOG_I("attempts", attempts + 1), LOG_END}),
                  "outbox: publish failed, will retry");
        if (relay_mark_failed(r, id, attempts, st) != QN_OK)
            goto fail;
        /* A timeout or a lost connection leaves the channel's confirm state unknown: drop the
         * connection, and leave the rest of the batch untouched (not their fault). */
        if (st == QN_ETIMEDOUT || st == QN_EAGAIN) {
            mq_broken = true;
            break;
        }
    }
    if (nsent) {
        pgparam_truncate(&p, 0);
        /* Out of memory: rolled back, so republished later, which is allowed. */
        if (pgparam_array_bind(&p, &sent) != QN_OK ||
            pgpool_exec_cmd(r->pg,
                            "UPDATE t_outbox SET status = " OUTBOX_STATUS_TEXT(
                                SENT) ", sent_at = clock_timestamp() "
                                      "WHERE id = ANY($1::bigint[])",
                            p.n, p.v, NULL) != QN_OK)
            goto fail;
    }
    if (pgpool_commit(r->pg) != QN_OK)
        goto fail;
    rc = n;
    goto done;
fail:
    /* Published rows that were not committed as sent go out again: at least once. */
    log_warnf(NULL,
              ((log_field[]){LOG_S("ds", r->ds), LOG_S("error", pgpool_conn_error(r->pg)),
                             LOG_I("published_uncommitted", nsent), LOG_END}),
              "outbox: relay transaction failed");
    (void)pgpool_rollback(r->pg);
done:
    atomic_fetch_add(&r->published, nsent);
    atomic_fetch_add(&r->failed, nfailed);
    metrics_add(&metric_quan_mq_published_total, nsent);
    metrics_add(&metric_quan_mq_publish_failures_total, nfailed);
    if (mq_broken) {
        mq_conn_close(r->mq);
        r->mq = NULL;
    }
    PQclear(res);
    pgparam_array_free(&sent);
    return rc;
}

/* Deletes sent rows older than the retention, a chunk at a time. */
static void relay_cleanup(outbox_relay *r)
{
    pgparam p = {0};
    int64_t total = 0, affected = 0;

    pgparam_i64(&p, r->retention_s);
    for (int i = 0; i < OUTBOX_CLEANUP_ROUNDS && !mq_thread_stopping(&r->t); i++) {
        /* SKIP LOCKED: replicas cleaning at the same time take different rows. */
        if (pgpool_exec_cmd(
                r->pg,
                "DELETE FROM t_outbox WHERE id IN (SELECT id FROM t_outbox "
                "WHERE status = " OUTBOX_STATUS_TEXT(
                    SENT) " AND sent_at < now() - $1::int * interval '1 second' "
                          "LIMIT " OUTBOX_STR(OUTBOX_CLEANUP_CHUNK) " FOR UPDATE SKIP LOCKED)",
                p.n, p.v, &affected) != QN_OK) {
            log_warnf(NULL,
                      ((log_field[]){LOG_S("ds", r->ds), LOG_S("error", pgpool_conn_error(r->pg)),
                                     LOG_END}),
                      "outbox: cleanup failed");
            break;
        }
        total += affected;
        if (affected < OUTBOX_CLEANUP_CHUNK)
            break;
    }
    if (total > 0)
        log_infof(NULL, ((log_field[]){LOG_S("ds", r->ds), LOG_I("deleted", total), LOG_END}),
                  "outbox: sent rows purged");
}

static void relay_housekeeping(outbox_relay *r)
{
    int64_t now = now_mono_ms(), backlog;

    if (now >= r->next_backlog) {
        r->next_backlog = now + r->backlog_interval_ms;
        if (outbox_backlog(r->pg, &backlog) == QN_OK)
            metrics_set_l(&metric_quan_outbox_backlog, backlog, r->ds);
    }
    if (now >= r->next_cleanup) {
        r->next_cleanup = now + r->cleanup_interval_ms;
        relay_cleanup(r);
    }
}

/* How long an idle relay sleeps: until the earliest pending row falls due, at most idle_ms (rows
 * committed by other processes, which cannot wake this relay, wait that long at worst). A
 * pending row already due is held by another relay (SKIP LOCKED passed it): look again after
 * poll_ms. Looking every poll_ms while nothing happens would cost each database a transaction
 * five times a second per relay, on the cores that serve requests. */
static int64_t relay_idle_wait(outbox_relay *r)
{
    PGresult *res =
        pgpool_exec(r->pg,
                    "SELECT ceil(extract(epoch FROM min(due_at) - now()) * 1000)::bigint "
                    "FROM t_outbox WHERE status = " OUTBOX_STATUS_TEXT(PENDING),
                    0, NULL);
    int64_t wait = r->idle_ms;
    if (!res)
        return r->poll_ms;
    if (!PQgetisnull(res, 0, 0)) {
        int64_t due_in = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        wait = due_in <= 0 ? r->poll_ms : due_in < r->idle_ms ? due_in : r->idle_ms;
    }
    PQclear(res);
    return wait;
}

static void *relay_main(void *arg)
{
    outbox_relay *r = arg;
    pgpool_opts po = {
        .dsn = r->dsn,
        .name = r->ds,
        .application_name = "quan outbox-relay",
        .statement_timeout_ms = OUTBOX_STATEMENT_TIMEOUT,
    };
    int64_t wait_ms = OUTBOX_RECONNECT_MIN_MS;

    r->pg = pgpool_conn_open(&po);
    if (!r->pg) {
        log_errorf(NULL, ((log_field[]){LOG_S("ds", r->ds), LOG_END}),
                   "outbox: relay cannot allocate its connection; relay not running");
        return NULL;
    }
    while (!mq_thread_stopping(&r->t)) {
        int n;

        if (relay_connect(r) != QN_OK) {
            relay_wait(r, wait_ms);
            wait_ms = wait_ms * 2 > OUTBOX_RECONNECT_MAX_MS ? OUTBOX_RECONNECT_MAX_MS : wait_ms * 2;
            continue;
        }
        wait_ms = OUTBOX_RECONNECT_MIN_MS;
        relay_housekeeping(r);
        n = relay_batch(r);
        if (n == r->batch)
            continue; /* more may be due right now */
        if (n < 0) {
            relay_wait(r, wait_ms);
            continue;
        }
        relay_wait(r, n > 0 ? r->poll_ms : relay_idle_wait(r));
    }
    mq_conn_close(r->mq);
    r->mq = NULL;
    pgpool_conn_close(r->pg);
    r->pg = NULL;
    return NULL;
}

static void relay_free(outbox_relay *r)
{
    if (!r)
        return;
    free(r->dsn);
    free(r->ds);
    free(r->amqp_url);
    free(r);
}

outbox_relay *outbox_relay_start(const outbox_relay_opts *o)
{
    outbox_relay *r = NULL;

    if (!o || !o->dsn || !o->ds || !*o->ds || !o->amqp_url || o->batch < 0 ||
        o->batch > OUTBOX_MAX_BATCH || o->poll_ms < 0 || o->idle_ms < 0 || o->retention_s < 0 ||
        o->confirm_timeout_ms < 0 || o->backoff_min_ms < 0 || o->backoff_max_ms < 0 ||
        o->cleanup_interval_ms < 0 || o->backlog_interval_ms < 0) {
        log_error(NULL, "outbox: bad relay options");
        return NULL;
    }
    if (!(r = calloc(1, sizeof(*r))))
        goto fail;
    r->dsn = strdup(o->dsn);
    r->ds = strdup(o->ds);
    r->amqp_url = strdup(o->amqp_url);
    if (!r->dsn || !r->ds || !r->amqp_url)
        goto fail;
    r->batch = o->batch ? o->batch : OUTBOX_DEFAULT_BATCH;
    r->poll_ms = o->poll_ms ? o->poll_ms : OUTBOX_DEFAULT_POLL_MS;
    r->idle_ms = o->idle_ms ? o->idle_ms : OUTBOX_DEFAULT_IDLE_MS;
    if (r->idle_ms < r->poll_ms)
        r->idle_ms = r->poll_ms;
    r->retention_s = o->retention_s ? o->retention_s : OUTBOX_DEFAULT_RETENTION_S;
    r->confirm_timeout_ms =
        o->confirm_timeout_ms ? o->confirm_timeout_ms : MQ_CONN_CONFIRM_TIMEOUT_MS;
    r->backoff_min_ms = o->backoff_min_ms ? o->backoff_min_ms : OUTBOX_DEFAULT_BACKOFF_MIN;
    r->backoff_max_ms = o->backoff_max_ms ? o->backoff_max_ms : OUTBOX_DEFAULT_BACKOFF_MAX;
    if (r->backoff_max_ms < r->backoff_min_ms)
        r->backoff_max_ms = r->backoff_min_ms;
    r->cleanup_interval_ms =
        o->cleanup_interval_ms ? o->cleanup_interval_ms : OUTBOX_DEFAULT_CLEANUP_MS;
    r->backlog_interval_ms =
        o->backlog_interval_ms ? o->backlog_interval_ms : OUTBOX_DEFAULT_BACKLOG_MS;
    atomic_init(&r->published, 0);
    atomic_init(&r->failed, 0);
    if (mq_thread_start(&r->t, relay_main, r) != QN_OK)
        goto fail;
    return r;
fail:
    log_errorf(NULL, ((log_field[]){LOG_S("ds", o->ds), LOG_END}), "outbox: relay start failed");
    relay_free(r);
    return NULL;
}

void outbox_relay_on_commit(void *relay, int64_t due_ms)
{
    outbox_relay *r = relay;
    if (!r)
        return;
    pthread_mutex_lock(&r->t.mu);
    /* The relay looks next when its wait ends, or (a pass running, which may have missed the
     * row) within idle_ms of the pass's end: a row due by then needs no wake. */
    int64_t next_look = r->asleep_until ? r->asleep_until : now_wall_ms() + r->idle_ms;
    if (due_ms < next_look) {
        r->woken = true;
        pthread_cond_signal(&r->t.cv);
    }
    pthread_mutex_unlock(&r->t.mu);
}

void outbox_relay_wake(outbox_relay *r)
{
    outbox_relay_on_commit(r, 0);
}

void outbox_relay_stop(outbox_relay *r)
{
    if (!r)
        return;
    mq_thread_stop(&r->t);
    relay_free(r);
}

void outbox_relay_stats(const outbox_relay *r, int64_t *published, int64_t *failed)
{
    outbox_relay *m = (outbox_relay *)r; /* atomics are read-only here */
    if (published)
        *published = r ? atomic_load(&m->published) : 0;
    if (failed)
        *failed = r ? atomic_load(&m->failed) : 0;
}
