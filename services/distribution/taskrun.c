/* Running distribution tasks: the task.execute consumers (taskrun.h). */
#include "taskrun.h"

#include "bucket.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chunk.h"
#include "events.h"
#include "fetch.h"
#include "guard.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"
#include "task.h"
#include "taskrow.h"
#include "template.h"

METRICS_DEFINE(TASKRUN_METRICS)

#define TR_GUARD_DONE_MS 3600000 /* a consumed message's guard */
#define TR_ACQUIRE_MS    5000    /* a pool connection (keeper, template reload) */
#define TR_TRIES         5       /* a failing step is tried this often ... */
#define TR_PAUSE_MS      1000    /* ... this long apart */
#define TR_ADDR_MAX      600
#define TR_REASON_MAX    300
/* Chunks in flight, one per stage: read and reserved (the front), written to the databases
 * (the back), settled in Redis and committed (the tail). Each stage waits for a different
 * server, so the three overlap; every step is idempotent per chunk, and checkpoints stay in
 * chunk order, so a crash with chunks in several stages resumes like one with a single chunk. */
#define TR_BUFS 3

/* A run's stop request, raised only: go on; no new chunk (a cancel: what is reserved is still
 * written); stop at the next chunk boundary (lease lost, SIGTERM, a failed step). */
enum { TR_GO = 0, TR_CANCEL = 1, TR_HALT = 2 };

/* How the front (the sheet and Redis) ended. */
enum {
    TR_END_NONE = 0,
    TR_END_EOF,       /* every row reserved */
    TR_END_CANCELLED, /* a cancel: no more chunks */
    TR_END_FAILED,    /* for good: the file, the template (reason) */
    TR_END_ERROR,     /* for now: Redis or the database (the message comes back) */
    TR_END_HALTED,    /* asked to stop, or another run committed a chunk: lost */
};

static const service_consumer tr_consumers[] = {
    {"distribution.task-execute", (const char *const[]){EVENT_TASK_EXECUTE, NULL}, NULL},
    {0},
};

typedef struct taskrun taskrun;
typedef struct tr_worker tr_worker;

/* One run of one task. */
typedef struct tr_run {
    tr_worker *w;
    uint64_t serial; /* the worker's run number: the keeper's check that a run is the same */
    chunk_task t;
    char exec_id[32], file_address[TR_ADDR_MAX], notify[40];
    int64_t processed, success, fail, chunk_rows;
    int resumed, cancel_asked;
    tpl tpl;
    atomic_int stop;
    int lost; /* the fence or the keeper found another owner */

    /* the front */
    pthread_t front;
    redis_sync *front_rc;
    taskrow_reader *reader;
    char path[4096];
    int downloaded;
    chunk bufs[TR_BUFS];
    int64_t next_no, next_first;

    /* front -> back -> tail: the chunks reserved and those written (each queue in chunk
     * order), the free ones, how the front ended, whether the back took its last chunk */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    chunk *ready[TR_BUFS], *written[TR_BUFS], *spare[TR_BUFS];
    int nready, nwritten, nspare;
    int end;
    int back_done;
    atomic_int failed; /* a chunk could not be written or committed */
    char reason[TR_REASON_MAX];
} tr_run;

struct tr_worker {
    taskrun *tr;
    int id;
    mq_consumer *consumer;
    pgpool_conn *pg[2];
    redis_sync *redis;
    /* the tail's own: Redis for the wallets, ds_0 for the checkpoints */
    pgpool_conn *tail_pg;
    redis_sync *tail_redis;

    /* the lease keeper */
    pthread_t keeper;
    int keeper_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    tr_run *run; /* under mu */
    uint64_t serial;
};

typedef struct tr_settings {
    fetch_config file;  /* QUAN_FILE_*: as merchant-admin's (where task files may come from) */
    int64_t chunk_rows; /* QUAN_DIST_CHUNK_ROWS: rows of a chunk (one Redis call, one commit) */
    int64_t workers;    /* QUAN_DIST_WORKERS: tasks run at once by this replica */
    int64_t lease_ms;   /* QUAN_DIST_LEASE_MS: a run's hold on its task, renewed while it runs */
} tr_settings;

static tr_settings tr_cfg;

struct taskrun {
    service *svc;
    const service_config *common; /* the settings every binary shares */
    const tr_settings *cfg;
    redis_scripts *scripts;
    int nworkers;
    tr_worker *workers;
    atomic_int draining;
};

/* ---------------------------------------------------------------- helpers */

static void tr_sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Raises run's stop request to at least level. */
static void tr_stop(tr_run *run, int level)
{
    int cur = atomic_load(&run->stop);
    while (cur < level && !atomic_compare_exchange_weak(&run->stop, &cur, level))
        ;
    pthread_mutex_lock(&run->mu);
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

/* *rs made if it was not yet, and connected again if it broke. */
static qn_status tr_redis_ensure(const taskrun *tr, redis_sync **rs)
{
    const service_config *sc = tr->common;
    /* A chunk's script holds Redis for a few milliseconds; its reply can take longer than a
     * single command's timeout on a loaded machine. */
    if (!*rs && !(*rs = service_redis_sync_new(sc, (int)sc->redis_timeout_ms * 5)))
        return QN_ENOMEM;
    return redis_sync_open(*rs);
}

/* *conn, a connection of its own to database ds, opened or connected again. */
static qn_status tr_pg_ensure(const taskrun *tr, pgpool_conn **conn, int ds)
{
    if (!*conn) {
        char name[16];
        snprintf(name, sizeof(name), "ds_%d", ds);
        pgpool_opts po = {.dsn = tr->common->ds_dsn[ds],
                          .name = name,
                          .application_name = "quan-distribution",
                          .statement_timeout_ms = (int)tr->common->pg_statement_timeout_ms};
        service_pg_commit_hook(tr->svc, ds, &po);
        if (!(*conn = pgpool_conn_open(&po)))
            return QN_ENOMEM;
    }
    return pgpool_conn_ensure(*conn);
}

/* The worker's own PostgreSQL and Redis connections, on its consumer's thread. */
static qn_status tr_connect(tr_worker *w)
{
    if (tr_redis_ensure(w->tr, &w->redis) != QN_OK)
        return QN_ERR;
    for (int i = 0; i < 2; i++) {
        qn_status st = tr_pg_ensure(w->tr, &w->pg[i], i);
        if (st != QN_OK)
            return st;
    }
    return QN_OK;
}

/* ---------------------------------------------------------------- the task row */

typedef enum { TR_OWNED, TR_NOT_RUNNABLE, TR_BUSY, TR_DB_ERROR } tr_acquire_result;

/* Takes the task for run (its exec_id set) by one conditional UPDATE; fills run from the row. */
static tr_acquire_result tr_acquire(tr_worker *w, tr_run *run)
{
    pgparam p = {0};
    PGresult *r = NULL;
    tr_acquire_result res = TR_DB_ERROR;
    pgparam_i64(&p, run->t.id);
    pgparam_str(&p, run->exec_id);
    pgparam_i64(&p, w->tr->cfg->lease_ms);
    pgparam_i64(&p, w->tr->cfg->chunk_rows);
    r = pgpool_exec(
        w->pg[DIST_TASK_DS],
        "WITH prev AS (SELECT id, execution_id FROM t_coupon_task WHERE id = $1::bigint "
        "FOR UPDATE) UPDATE t_coupon_task t SET execution_id = $2, lease_until = now() "
        "+ $3::bigint * interval '1 millisecond', chunk_rows = coalesce(t.chunk_rows, "
        "$4::integer), update_time = now() FROM prev WHERE t.id = prev.id AND "
        "t.status = " TASK_STATUS_TEXT(
            RUNNING) " AND t.del_flag = 0 AND (t.lease_until IS NULL OR t.lease_until "
                     "<= now()) RETURNING t.shop_number, t.batch_id, t.coupon_template_id, "
                     "t.file_address, t.notify_type, t.processed_rows, t.success_num, t.fail_num, "
                     "t.chunk_rows, t.cancel_requested, prev.execution_id IS NOT NULL",
        p.n, p.v);
    if (!r)
        goto out;
    if (PQntuples(r) == 1) {
        run->t.shop = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        run->t.batch_id = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        run->t.tpl_id = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
        snprintf(run->file_address, sizeof(run->file_address), "%s", PQgetvalue(r, 0, 3));
        snprintf(run->notify, sizeof(run->notify), "%s", PQgetvalue(r, 0, 4));
        run->processed = strtoll(PQgetvalue(r, 0, 5), NULL, 10);
        run->success = strtoll(PQgetvalue(r, 0, 6), NULL, 10);
        run->fail = strtoll(PQgetvalue(r, 0, 7), NULL, 10);
        run->chunk_rows = strtoll(PQgetvalue(r, 0, 8), NULL, 10);
        run->cancel_asked = PQgetvalue(r, 0, 9)[0] == 't';
        run->resumed = PQgetvalue(r, 0, 10)[0] == 't';
        res = TR_OWNED;
        goto out;
    }
    PQclear(r);
    pgparam_truncate(&p, 1);
    r = pgpool_exec(w->pg[DIST_TASK_DS],
                    "SELECT status = " TASK_STATUS_TEXT(
                        RUNNING) " AND del_flag = 0 FROM t_coupon_task WHERE id = $1::bigint",
                    p.n, p.v);
    if (!r)
        goto out;
    /* In progress but not ours: another run holds a live lease. */
    res = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't' ? TR_BUSY : TR_NOT_RUNNABLE;
out:
    if (res == TR_DB_ERROR)
        log_warn(NULL, "task %" PRId64 ": cannot take it: %s", run->t.id,
                 pgpool_conn_error(w->pg[DIST_TASK_DS]));
    PQclear(r);
    return res;
}

/* The run's end in the task row (fenced): status, the reason of a failure, the time. */
static qn_status tr_finish(tr_run *run, int status, const char *reason)
{
    pgparam p = {0};
    int64_t n = 0;
    pgparam_i64(&p, run->t.id);
    pgparam_str(&p, run->exec_id);
    pgparam_i64(&p, status);
    pgparam_str(&p, reason);
    qn_status st = pgpool_exec_cmd(
        run->w->pg[DIST_TASK_DS],
        "UPDATE t_coupon_task SET status = $3::smallint, fail_reason = $4, "
        "completion_time = now(), send_num = CASE WHEN $3::smallint = " TASK_STATUS_TEXT(
            SUCCEEDED) " THEN "
                       "processed_rows ELSE send_num END, lease_until = NULL, update_time = now() "
                       "WHERE id = $1::bigint AND execution_id = $2 AND status = " TASK_STATUS_TEXT(
                           RUNNING),
        p.n, p.v, &n);
    if (st == QN_OK && n == 0) {
        run->lost = 1;
        return QN_ECONFLICT;
    }
    return st;
}

/* Gives the lease up (the run stopped without an end): the next delivery may run at once. */
static void tr_release(tr_run *run)
{
    pgparam p = {0};
    pgparam_i64(&p, run->t.id);
    pgparam_str(&p, run->exec_id);
    if (pgpool_exec_cmd(
            run->w->pg[DIST_TASK_DS],
            "UPDATE t_coupon_task SET lease_until = now(), update_time = now() WHERE "
            "id = $1::bigint AND execution_id = $2 AND status = " TASK_STATUS_TEXT(RUNNING),
            p.n, p.v, NULL) != QN_OK)
        log_warn(NULL, "task %" PRId64 ": cannot give its lease up (it runs out): %s", run->t.id,
                 pgpool_conn_error(run->w->pg[DIST_TASK_DS]));
}

/* ---------------------------------------------------------------- the lease keeper */

/* Renews the lease of run (task id and execution id copied by the caller). *lost when the task
 * is not this run's any more; *cancel when a cancel was asked. */
static qn_status tr_renew(taskrun *tr, int64_t task_id, const char *exec_id, int *lost, int *cancel)
{
    pgparam p = {0};
    pgpool_conn *c = pgpool_acquire(service_pg(tr->svc, DIST_TASK_DS), TR_ACQUIRE_MS);
    if (!c)
        return QN_EBUSY;
    pgparam_i64(&p, task_id);
    pgparam_str(&p, exec_id);
    pgparam_i64(&p, tr->cfg->lease_ms);
    PGresult *r = pgpool_exec(c,
                              "UPDATE t_coupon_task SET lease_until = now() + $3::bigint * "
                              "interval '1 millisecond', update_time = now() WHERE id = "
                              "$1::bigint AND execution_id = $2 AND status = " TASK_STATUS_TEXT(
                                  RUNNING) " RETURNING "
                                           "cancel_requested",
                              p.n, p.v);
    qn_status st = r ? QN_OK : QN_ERR;
    if (r) {
        *lost = PQntuples(r) == 0;
        *cancel = !*lost && PQgetvalue(r, 0, 0)[0] == 't';
    } else {
        log_warn(NULL, "task %" PRId64 ": lease renewal failed: %s", task_id, pgpool_conn_error(c));
    }
    PQclear(r);
    pgpool_release(c);
    return st;
}

static void *tr_keeper(void *arg)
{
    tr_worker *w = arg;
    int64_t every = w->tr->cfg->lease_ms / 3;
    pthread_mutex_lock(&w->mu);
    while (!w->quit) {
        struct timespec ts = now_deadline(CLOCK_MONOTONIC, every);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        if (w->quit || !w->run)
            continue;
        tr_run *run = w->run;
        uint64_t serial = run->serial;
        int64_t task_id = run->t.id;
        char exec_id[sizeof(run->exec_id)];
        memcpy(exec_id, run->exec_id, sizeof(exec_id));
        pthread_mutex_unlock(&w->mu);
        int lost = 0, cancel = 0;
        qn_status st = tr_renew(w->tr, task_id, exec_id, &lost, &cancel);
        pthread_mutex_lock(&w->mu);
        if (st != QN_OK || !w->run || w->run->serial != serial)
            continue;
        if (lost) {
            log_warn(NULL, "task %" PRId64 ": the run lost its lease; it stops", task_id);
            w->run->lost = 1;
            tr_stop(w->run, TR_HALT);
        } else if (cancel) {
            tr_stop(w->run, TR_CANCEL);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---------------------------------------------------------------- the template */

/* The template from its shard on conn. QN_ENOTFOUND when gone (or another shop's). */
static qn_status tr_template_load(tr_run *run, pgpool_conn *conn)
{
    tpl_clear(&run->tpl);
    qn_status st = tpl_db_load(conn, run->t.shop, run->t.tpl_id, &run->tpl);
    if (st != QN_OK && st != QN_ENOTFOUND)
        log_warn(NULL, "task %" PRId64 ": cannot read template %" PRId64 ": %s", run->t.id,
                 run->t.tpl_id, pgpool_conn_error(conn));
    return st;
}

/* The template as a run starts: read after a FOR SHARE lock on its row, so a change of its
 * stock buckets being written (merchant-admin locks the row FOR UPDATE, then looks for a
 * task in progress) is waited for and seen. A run that read the row first holds a task in
 * progress, which that change then finds and refuses on. */
static qn_status tr_template_load_start(tr_run *run, pgpool_conn *conn, const char *table)
{
    char sql[192];
    pgparam p = {0};
    if (pgpool_begin(conn) != QN_OK)
        return QN_ERR;
    snprintf(sql, sizeof(sql),
             "SELECT 1 FROM %s WHERE shop_number = $1 AND id = $2 AND del_flag = 0 FOR SHARE",
             table);
    pgparam_i64(&p, run->t.shop);
    pgparam_i64(&p, run->t.tpl_id);
    PGresult *r = pgpool_exec(conn, sql, p.n, p.v);
    qn_status st = r ? tr_template_load(run, conn) : QN_ERR;
    PQclear(r);
    if (st == QN_OK || st == QN_ENOTFOUND) {
        if (pgpool_commit(conn) != QN_OK)
            st = QN_ERR;
    } else {
        (void)pgpool_rollback(conn);
    }
    return st;
}

static int tr_template_ended(const tpl *t)
{
    return tpl_ended(t, now_wall_ms());
}

/* The template's cache hashes, each written only if absent (bucket.h). */
static qn_status tr_template_cache(tr_run *run, redis_sync *rs)
{
    return bucket_cache_put_sync(rs, run->w->tr->scripts, &run->tpl, run->tpl.stock, NULL);
}

/* ---------------------------------------------------------------- the front */

static void tr_front_end(tr_run *run, int end, const char *reason)
{
    pthread_mutex_lock(&run->mu);
    run->end = end;
    snprintf(run->reason, sizeof(run->reason), "%s", reason ? reason : "");
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

/* A free chunk buffer; NULL once the run is to halt. */
static chunk *tr_take_spare(tr_run *run)
{
    chunk *c = NULL;
    pthread_mutex_lock(&run->mu);
    while (run->nspare == 0 && atomic_load(&run->stop) < TR_HALT)
        pthread_cond_wait(&run->cv, &run->mu);
    if (atomic_load(&run->stop) < TR_HALT)
        c = run->spare[--run->nspare];
    pthread_mutex_unlock(&run->mu);
    return c;
}

/* Appends c to the queue q of *n chunks. */
static void tr_put(tr_run *run, chunk **q, int *n, chunk *c)
{
    pthread_mutex_lock(&run->mu);
    q[(*n)++] = c;
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

/* The first chunk of queue q (of *n); NULL once *upstream_done and the queue is empty. */
static chunk *tr_take(tr_run *run, chunk **q, int *n, const int *upstream_done)
{
    chunk *c = NULL;
    pthread_mutex_lock(&run->mu);
    while (*n == 0 && !*upstream_done)
        pthread_cond_wait(&run->cv, &run->mu);
    if (*n > 0) {
        c = q[0];
        memmove(q, q + 1, (size_t)(*n - 1) * sizeof(*q));
        (*n)--;
    }
    pthread_mutex_unlock(&run->mu);
    return c;
}

typedef enum {
    TR_RES_OK,
    TR_RES_NONE,
    TR_RES_GONE,
    TR_RES_CHANGED,
    TR_RES_LOST,
    TR_RES_ERROR
} tr_res;

/* The template's end read again after its cache hash went missing: all rows of c ended, the
 * hash written again (then the script is called again), or gone. */
static tr_res tr_reload(tr_run *run, chunk *c, int *again)
{
    pgpool_conn *conn = pgpool_acquire(service_pg(run->w->tr->svc, run->t.tpl_ds), TR_ACQUIRE_MS);
    *again = 0;
    if (!conn)
        return TR_RES_ERROR;
    qn_status st = tr_template_load(run, conn);
    pgpool_release(conn);
    if (st == QN_ENOTFOUND)
        return TR_RES_GONE;
    if (st != QN_OK)
        return TR_RES_ERROR;
    if (tr_template_ended(&run->tpl)) {
        chunk_all_ended(c); /* the hash expired at the end: every row fails alike */
        return TR_RES_OK;
    }
    if (tr_template_cache(run, run->front_rc) != QN_OK)
        return TR_RES_ERROR;
    *again = 1;
    return TR_RES_OK;
}

/* Step 1 of chunk c, tried again on a Redis failure; a replay only once a cancel is asked. */
static tr_res tr_reserve(tr_run *run, chunk *c)
{
    int reloads = 0;
    for (int attempt = 0; attempt < TR_TRIES * 2; attempt++) {
        chunk_reply reply = CHUNK_RESERVED;
        if (attempt > 0)
            tr_sleep_ms(TR_PAUSE_MS / 2);
        if (atomic_load(&run->stop) >= TR_HALT)
            return TR_RES_LOST;
        if (tr_redis_ensure(run->w->tr, &run->front_rc) != QN_OK)
            continue;
        int peek = atomic_load(&run->stop) >= TR_CANCEL;
        qn_status st = chunk_reserve(run->front_rc, run->w->tr->scripts, &run->t, c, peek, &reply);
        if (st == QN_EINVAL)
            return TR_RES_CHANGED;
        if (st != QN_OK)
            continue;
        switch (reply) {
        case CHUNK_RESERVED:
        case CHUNK_REPLAYED:
            return TR_RES_OK;
        case CHUNK_NONE:
            return TR_RES_NONE;
        case CHUNK_CLOSED:
            return TR_RES_LOST; /* another run committed it: this one does not own the task */
        case CHUNK_MISS: {
            int again = 0;
            tr_res res = tr_reload(run, c, &again);
            if (res != TR_RES_OK && res != TR_RES_ERROR)
                return res;
            if (res == TR_RES_OK && !again)
                return TR_RES_OK;
            /* A reload is no failure, unless the hash never becomes whole (a partial one is
             * not overwritten: claims keep failing on it too until it expires). */
            if (res == TR_RES_OK && ++reloads <= 3)
                attempt--;
            continue;
        }
        }
    }
    return TR_RES_ERROR;
}

/* The front: reads the sheet chunk by chunk and reserves each in Redis, one chunk ahead of the
 * databases. */
static void *tr_front(void *arg)
{
    tr_run *run = arg;
    char reason[TR_REASON_MAX];
    for (;;) {
        chunk *c = tr_take_spare(run);
        if (!c) {
            tr_front_end(run, TR_END_HALTED, NULL);
            break;
        }
        double t_read = now_mono_s();
        if (taskrow_read(run->reader, &c->rows, (size_t)run->chunk_rows) != QN_OK) {
            tr_put(run, run->spare, &run->nspare, c);
            snprintf(reason, sizeof(reason), "the spreadsheet cannot be read: %s",
                     taskrow_error(run->reader));
            tr_front_end(run, TR_END_FAILED, reason);
            break;
        }
        metrics_observe_l(&metric_quan_dist_step_duration_seconds, now_mono_s() - t_read, "read");
        metrics_add(&metric_quan_dist_rows_read_total, (int64_t)c->rows.n);
        if (c->rows.n == 0) {
            tr_put(run, run->spare, &run->nspare, c);
            tr_front_end(run, TR_END_EOF, NULL);
            break;
        }
        c->no = run->next_no++;
        c->first = run->next_first;
        run->next_first += (int64_t)c->rows.n;
        tr_res res = tr_reserve(run, c);
        if (res == TR_RES_OK) {
            metrics_observe_l(&metric_quan_dist_step_duration_seconds, c->t_reserve, "reserve");
            tr_put(run, run->ready, &run->nready, c);
            continue;
        }
        tr_put(run, run->spare, &run->nspare, c);
        switch (res) {
        case TR_RES_NONE:
            tr_front_end(run, TR_END_CANCELLED, NULL);
            break;
        case TR_RES_GONE:
            tr_front_end(run, TR_END_FAILED, "the coupon template does not exist");
            break;
        case TR_RES_CHANGED:
            tr_front_end(run, TR_END_FAILED,
                         "the spreadsheet changed while the task ran: its rows are not the ones "
                         "already distributed");
            break;
        case TR_RES_LOST:
            tr_front_end(run, TR_END_HALTED, NULL);
            break;
        default:
            tr_front_end(run, TR_END_ERROR, "Redis unavailable");
            break;
        }
        break;
    }
    return NULL;
}

/* ---------------------------------------------------------------- the back: one chunk */

static const char *tr_outcome_label(int o)
{
    switch (o) {
    case CHUNK_DUPLICATE:
        return "duplicate_in_file";
    case CHUNK_LIMIT:
        return "limit_reached";
    case CHUNK_NO_STOCK:
        return "out_of_stock";
    case CHUNK_ENDED:
        return "template_ended";
    case CHUNK_INVALID:
        return "invalid_user_id";
    default:
        return "issued";
    }
}

static void tr_count(const chunk *c)
{
    int64_t by[6] = {0}; /* issued, then -1..-5 */
    for (size_t i = 0; i < c->rows.n; i++) {
        int o = c->outcome[i] >= 1 && !c->issued[i] ? CHUNK_LIMIT : c->outcome[i];
        by[o >= 1 ? 0 : -o]++;
    }
    for (int k = 0; k < 6; k++)
        if (by[k])
            metrics_add_l(&metric_quan_dist_rows_total, by[k], tr_outcome_label(k ? -k : 1));
    metrics_observe(&metric_quan_dist_chunk_duration_seconds, now_mono_s() - c->t0);
}

/* Step 2 of chunk c, the databases, tried again while it fails (on the consumer's thread). */
static qn_status tr_write(tr_run *run, chunk *c)
{
    tr_worker *w = run->w;
    for (int attempt = 0; attempt < TR_TRIES; attempt++) {
        if (attempt > 0)
            tr_sleep_ms(TR_PAUSE_MS);
        if (atomic_load(&run->stop) >= TR_HALT)
            return QN_ERR;
        if (tr_connect(w) != QN_OK)
            continue;
        double t1 = now_mono_s();
        if (chunk_write(w->pg, &run->t, c) != QN_OK)
            continue;
        c->t_write = now_mono_s() - t1;
        metrics_observe_l(&metric_quan_dist_step_duration_seconds, c->t_write, "write");
        return QN_OK;
    }
    return QN_ERR;
}

/* Steps 3 to 5 of chunk c (Redis, the checkpoint, the record closed), each tried again while it
 * fails, on the tail's connections. QN_ECONFLICT: the run lost the task. *cancel: a cancel was
 * asked. */
static qn_status tr_settle(tr_run *run, chunk *c, int *cancel)
{
    tr_worker *w = run->w;
    int settled = 0; /* each step is idempotent, but needs not run twice */
    qn_status st = QN_ERR;
    for (int attempt = 0; attempt < TR_TRIES; attempt++) {
        if (attempt > 0) {
            tr_sleep_ms(TR_PAUSE_MS);
            if (atomic_load(&run->stop) >= TR_HALT)
                return QN_ERR;
        }
        if (tr_redis_ensure(w->tr, &w->tail_redis) != QN_OK ||
            tr_pg_ensure(w->tr, &w->tail_pg, DIST_TASK_DS) != QN_OK)
            continue;
        double t2 = now_mono_s();
        if (!settled && (st = chunk_settle(w->tail_redis, w->tr->scripts, &run->t, c)) != QN_OK)
            continue;
        settled = 1;
        double t3 = now_mono_s();
        st = chunk_commit(w->tail_pg, &run->t, c, cancel);
        double t4 = now_mono_s();
        metrics_observe_l(&metric_quan_dist_step_duration_seconds, t3 - t2, "wallets");
        metrics_observe_l(&metric_quan_dist_step_duration_seconds, t4 - t3, "commit");
        log_at(LOGL_DEBUG, NULL,
               ((log_field[]){LOG_I("task", run->t.id), LOG_I("chunk", c->no),
                              LOG_I("rows", (int64_t)c->rows.n),
                              LOG_I("redis_us", (int64_t)(c->t_reserve * 1e6)),
                              LOG_I("db_us", (int64_t)(c->t_write * 1e6)),
                              LOG_I("wallet_us", (int64_t)((t3 - t2) * 1e6)),
                              LOG_I("commit_us", (int64_t)((t4 - t3) * 1e6)),
                              LOG_I("total_us", (int64_t)((t4 - c->t0) * 1e6)), LOG_END}),
               "distribution: chunk");
        if (st == QN_ECONFLICT)
            return st;
        if (st != QN_OK)
            continue;
        chunk_close(w->tail_redis, &run->t, c);
        tr_count(c);
        metrics_set(&metric_quan_dist_progress_timestamp_seconds, now_wall_ms() / 1000);
        run->processed = c->first + (int64_t)c->rows.n;
        run->success += (int64_t)c->nissued;
        run->fail += (int64_t)(c->rows.n - c->nissued);
        return QN_OK;
    }
    return st == QN_ECONFLICT ? st : QN_ERR;
}

/* The back, on the consumer's thread: writes the chunks the front reserved, in order, until
 * the front ends; passes each to the tail. */
static void tr_back(tr_run *run)
{
    chunk *c;
    while ((c = tr_take(run, run->ready, &run->nready, &run->end))) {
        if (atomic_load(&run->stop) < TR_HALT) {
            if (tr_write(run, c) == QN_OK) {
                tr_put(run, run->written, &run->nwritten, c);
                continue;
            }
            if (atomic_load(&run->stop) < TR_HALT) {
                atomic_store(&run->failed, 1);
                tr_stop(run, TR_HALT);
            }
        }
        tr_put(run, run->spare, &run->nspare, c);
    }
    pthread_mutex_lock(&run->mu);
    run->back_done = 1;
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

/* The tail: settles and commits the chunks the back wrote, in order, until the back ends. */
static void *tr_tail(void *arg)
{
    tr_run *run = arg;
    chunk *c;
    while ((c = tr_take(run, run->written, &run->nwritten, &run->back_done))) {
        if (atomic_load(&run->stop) < TR_HALT) {
            int cancel = 0;
            qn_status st = tr_settle(run, c, &cancel);
            if (st == QN_ECONFLICT) {
                log_warn(NULL, "task %" PRId64 ": another run owns it now; this one stops",
                         run->t.id);
                run->lost = 1;
                tr_stop(run, TR_HALT);
            } else if (st != QN_OK) {
                if (atomic_load(&run->stop) < TR_HALT)
                    atomic_store(&run->failed, 1);
                tr_stop(run, TR_HALT);
            } else if (cancel) {
                tr_stop(run, TR_CANCEL);
            }
        }
        tr_put(run, run->spare, &run->nspare, c);
    }
    return NULL;
}

/* ---------------------------------------------------------------- one run */

/* Why the run stopped without an end, and what its message becomes. */
static mq_handler_result tr_stopped(tr_run *run, const char *why)
{
    if (run->lost)
        return MQ_ACK; /* the task is another run's: this message is done */
    tr_release(run);
    log_warnf(NULL,
              ((log_field[]){LOG_I("task", run->t.id), LOG_I("processed", run->processed),
                             LOG_S("why", why), LOG_END}),
              "task %" PRId64 ": run stopped at a chunk boundary; it resumes later", run->t.id);
    return atomic_load(&run->w->tr->draining) ? MQ_REQUEUE_NOW : MQ_RETRY;
}

/* The end of a run in the task row, logs and metrics. *final: the task has its final state. */
static mq_handler_result tr_end(tr_run *run, int status, const char *reason, int *final)
{
    static const char *const names[] = {"pending", "running", "failed", "succeeded", "cancelled"};
    qn_status st = tr_finish(run, status, reason);
    if (st == QN_ECONFLICT)
        return MQ_ACK; /* another run took it meanwhile: it ends it */
    if (st != QN_OK) {
        log_warn(NULL, "task %" PRId64 ": cannot record its end: %s", run->t.id,
                 pgpool_conn_error(run->w->pg[DIST_TASK_DS]));
        return tr_stopped(run, "its end could not be written");
    }
    *final = 1;
    metrics_inc_l(&metric_quan_dist_tasks_total, names[status]);
    /* The duplicates set is not needed any more; chunk records expire (closed ones are small,
     * and a late run of this task still finds them). */
    char key[KEYS_LEN], rec[KEYS_LEN];
    for (int b = 0; b < (run->t.buckets > 1 ? run->t.buckets : 1); b++) {
        chunk_keys(&run->t, 0, b, 0, rec, key); /* one set per bucket, in its slot */
        if (run->w->redis && !redis_sync_broken(run->w->redis))
            freeReplyObject(redis_sync_command(run->w->redis, "UNLINK %s", key));
    }
    log_infof(NULL,
              ((log_field[]){LOG_I("task", run->t.id), LOG_S("state", names[status]),
                             LOG_I("rows", run->processed), LOG_I("issued", run->success),
                             LOG_I("failed", run->fail), LOG_S("reason", reason ? reason : ""),
                             LOG_S("execution", run->exec_id), LOG_END}),
              "task %" PRId64 " %s: %" PRId64 " rows, %" PRId64 " issued, %" PRId64 " failed",
              run->t.id, names[status], run->processed, run->success, run->fail);
    return MQ_ACK;
}

/* The file at the task's address, opened at the rows after the last committed chunk: 1, or 0
 * with the message's verdict in *res (the task failed, or the download is tried again). */
static int tr_open(tr_run *run, const mq_delivery_info *info, int *final, mq_handler_result *res)
{
    char err[256] = "", reason[TR_REASON_MAX];
    const tr_settings *cfg = run->w->tr->cfg;
    qn_status st = fetch_resolve_cfg(&cfg->file, run->file_address, run->path, sizeof(run->path),
                                     err, sizeof(err));
    if (st != QN_OK) {
        snprintf(reason, sizeof(reason), "the spreadsheet cannot be read: %s", err);
        /* 5xx, time-outs and network failures may pass; the last attempt ends the task. */
        if (st != QN_EINVAL && info->attempt < info->max_attempts) {
            log_warn(NULL, "task %" PRId64 ": %s (attempt %d)", run->t.id, reason, info->attempt);
            tr_release(run);
            *res = MQ_RETRY;
            return 0;
        }
        *res = tr_end(run, TASK_STATUS_FAILED, reason, final);
        return 0;
    }
    run->downloaded = fetch_is_url(run->file_address);
    sheet_limits sl = {.max_sheet_bytes = (uint64_t)cfg->file.max_xml,
                       .max_sst_bytes = (uint64_t)cfg->file.max_xml};
    if (!(run->reader = taskrow_open(run->path, &sl, err, sizeof(err))) ||
        taskrow_skip(run->reader, run->processed) != QN_OK) {
        snprintf(reason, sizeof(reason), "the spreadsheet cannot be read: %s",
                 run->reader ? taskrow_error(run->reader) : err);
        *res = tr_end(run, TASK_STATUS_FAILED, reason, final);
        return 0;
    }
    return 1;
}

/* The run of an owned task, from its template to its end. */
static mq_handler_result tr_execute(tr_run *run, const mq_delivery_info *info, int *final)
{
    tr_worker *w = run->w;
    shard_route route;
    mq_handler_result res;

    if (shard_route_for("t_coupon_template", run->t.shop, &route) != QN_OK)
        return tr_end(run, TASK_STATUS_FAILED, "the coupon template does not exist", final);
    run->t.tpl_ds = route.ds;
    qn_status st = tr_template_load_start(run, w->pg[route.ds], route.table);
    if (st == QN_ENOTFOUND)
        return tr_end(run, TASK_STATUS_FAILED, "the coupon template does not exist", final);
    if (st != QN_OK)
        return tr_stopped(run, "the template could not be read");
    /* The chunks route users by the template's stock buckets: not while they change (the
     * engine's re-layout, services/engine/relayout.h, ends it soon). Nothing ran: the task
     * waits, without using up an attempt. */
    if (run->tpl.relayout_from > 0 && !run->lost) {
        tr_release(run);
        log_infof(
            NULL,
            ((log_field[]){LOG_I("task", run->t.id), LOG_I("template_id", run->t.tpl_id), LOG_END}),
            "task %" PRId64 ": its template's stock buckets are changing; it starts later",
            run->t.id);
        return MQ_REQUEUE_LATER;
    }
    /* Nothing ran yet: a task whose template ended does not start. Later, the rows left fail
     * one by one ("template ended"), after the chunk a dead run may have reserved. */
    if (!run->resumed && run->processed == 0 && tr_template_ended(&run->tpl))
        return tr_end(run, TASK_STATUS_FAILED, "the coupon template has ended", final);
    run->t.limit = run->tpl.limit_per_person;
    /* fixed at the template's creation: the chunks route users by it */
    run->t.buckets = run->tpl.buckets >= 1 ? run->tpl.buckets : 1;
    run->t.validity_hours = run->tpl.validity_hours;
    run->t.source = run->tpl.source == TPL_SOURCE_PLATFORM ? 1 : 2; /* ucoupon.h: platform, shop */
    if (!tr_template_ended(&run->tpl) && tr_template_cache(run, w->redis) != QN_OK)
        return tr_stopped(run, "Redis unavailable");

    if (!tr_open(run, info, final, &res))
        return res;
    run->next_no = run->processed / run->chunk_rows;
    run->next_first = run->processed;
    if (run->cancel_asked)
        atomic_store(&run->stop, TR_CANCEL);
    for (int i = 0; i < TR_BUFS; i++)
        run->spare[i] = &run->bufs[i];
    run->nspare = TR_BUFS;
    pthread_t tail;
    if (pthread_create(&tail, NULL, tr_tail, run) != 0)
        return tr_stopped(run, "no thread");
    if (pthread_create(&run->front, NULL, tr_front, run) != 0) {
        tr_front_end(run, TR_END_HALTED, NULL);
        tr_back(run);
        pthread_join(tail, NULL);
        return tr_stopped(run, "no thread");
    }
    tr_back(run);
    pthread_join(tail, NULL);
    tr_stop(run, TR_HALT); /* the front, if it still waits for a buffer */
    pthread_join(run->front, NULL);
    int failed = atomic_load(&run->failed);

    if (run->lost || run->end == TR_END_HALTED)
        return tr_stopped(run, atomic_load(&w->tr->draining) ? "shutting down" : "lease lost");
    if (failed || run->end == TR_END_ERROR)
        return tr_stopped(run, failed ? "a chunk could not be written" : run->reason);
    switch (run->end) {
    case TR_END_EOF:
        return tr_end(run, TASK_STATUS_SUCCEEDED, NULL, final);
    case TR_END_CANCELLED:
        return tr_end(run, TASK_STATUS_CANCELLED, NULL, final);
    default:
        return tr_end(run, TASK_STATUS_FAILED, run->reason, final);
    }
}

static void tr_run_free(tr_run *run)
{
    redis_sync_free(run->front_rc);
    taskrow_close(run->reader);
    if (run->downloaded)
        unlink(run->path);
    for (int i = 0; i < TR_BUFS; i++)
        chunk_free(&run->bufs[i]);
    tpl_clear(&run->tpl);
    pthread_mutex_destroy(&run->mu);
    pthread_cond_destroy(&run->cv);
    free(run);
}

/* A task.execute message: the task runs here if it can be taken. *final: it reached its end
 * (or cannot run at all), so the message is consumed. */
static mq_handler_result tr_task(tr_worker *w, int64_t task_id, const mq_delivery_info *info,
                                 int *final)
{
    taskrun *tr = w->tr;
    int64_t run_id = 0;
    mq_handler_result res = MQ_RETRY;
    tr_run *run = calloc(1, sizeof(*run));
    if (!run)
        return MQ_RETRY;
    pthread_mutex_init(&run->mu, NULL);
    pthread_cond_init(&run->cv, NULL);
    run->w = w;
    run->t.id = task_id;
    run->t.exec_id = run->exec_id;
    run->t.notify = run->notify;
    run->t.lease_ms = tr->cfg->lease_ms;
    run->t.ids = service_ids(tr->svc);
    if (ids_next(run->t.ids, &run_id) != QN_OK)
        goto out;
    snprintf(run->exec_id, sizeof(run->exec_id), "run-%" PRId64, run_id);

    switch (tr_acquire(w, run)) {
    case TR_NOT_RUNNABLE:
        *final = 1; /* done, cancelled, failed or gone: nothing to run */
        res = MQ_ACK;
        goto out;
    case TR_BUSY:
        /* A live run holds it. A redelivered message may be the one of a run that died: again
         * once that lease runs out. Any other is a copy (the sweep's, a second publish): the
         * holder's own message comes back if it stops, and the sweep writes task.execute again
         * once a lease runs out, so the copy is done; kept, it would circle until dead-lettered. */
        if (info->redelivered) {
            res = MQ_REQUEUE_LATER;
            goto out;
        }
        log_info(NULL, "task %" PRId64 ": another run holds it; this copy of task.execute is done",
                 task_id);
        res = MQ_ACK;
        goto out;
    case TR_DB_ERROR:
        goto out;
    case TR_OWNED:
        break;
    }
    log_infof(NULL,
              ((log_field[]){LOG_I("task", task_id), LOG_I("template", run->t.tpl_id),
                             LOG_I("rows_done", run->processed), LOG_I("issued", run->success),
                             LOG_I("failed", run->fail), LOG_I("chunk_rows", run->chunk_rows),
                             LOG_S("execution", run->exec_id), LOG_END}),
              run->resumed ? "task %" PRId64 ": run resumed after %" PRId64 " rows"
                           : "task %" PRId64 ": run started (%" PRId64 " rows done)",
              task_id, run->processed);
    pthread_mutex_lock(&w->mu);
    run->serial = ++w->serial;
    w->run = run;
    if (atomic_load(&tr->draining))
        atomic_store(&run->stop, TR_HALT);
    pthread_mutex_unlock(&w->mu);
    /* Running and progressing, for alerting on a run that stalls (see tr_settle). */
    metrics_add(&metric_quan_dist_tasks_running, 1);
    metrics_set(&metric_quan_dist_progress_timestamp_seconds, now_wall_ms() / 1000);
    res = tr_execute(run, info, final);
    metrics_add(&metric_quan_dist_tasks_running, -1);
    pthread_mutex_lock(&w->mu);
    w->run = NULL;
    pthread_mutex_unlock(&w->mu);
out:
    tr_run_free(run);
    return res;
}

/* ---------------------------------------------------------------- the consumer */

static mq_handler_result tr_on_message(const mq_envelope *env, const mq_delivery_info *info,
                                       void *arg)
{
    tr_worker *w = arg;
    taskrun *tr = w->tr;
    int64_t task_id = 0;
    jsonin_err err = {{0}};
    char gkey[KEYS_LEN];
    int final = 0;

    if (jsonin_int64(env->data, "taskId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &task_id, &err) !=
        QN_OK) {
        log_error(NULL, "task.execute %s: %s", env->key, err.msg);
        return MQ_DEAD;
    }
    if (atomic_load(&tr->draining))
        return MQ_REQUEUE_NOW;
    if (tr_connect(w) != QN_OK) {
        log_warn(NULL, "task %" PRId64 ": PostgreSQL or Redis unreachable; again later", task_id);
        return MQ_RETRY;
    }
    keys_task_guard(gkey, env->key);
    switch (guard_begin(w->redis, tr->scripts, gkey, tr->cfg->lease_ms * 2)) {
    case GUARD_DONE:
        return MQ_ACK;
    case GUARD_BUSY:
        /* A consumer holds this message: ours only once the broker gave it back (its holder
         * died); the task's lease decides anyway. */
        if (!info->redelivered)
            return MQ_REQUEUE_LATER;
        break;
    case GUARD_ERROR:
        return MQ_RETRY;
    case GUARD_RUN:
        break;
    }
    mq_handler_result res = tr_task(w, task_id, info, &final);
    if (w->redis && !redis_sync_broken(w->redis)) {
        qn_status gst =
            final ? guard_commit(w->redis, gkey, TR_GUARD_DONE_MS) : guard_abort(w->redis, gkey);
        if (gst != QN_OK) /* the guard is the fast path only: the task row decides */
            log_warn(NULL, "task %" PRId64 ": consume guard not updated", task_id);
    }
    return res;
}

/* ---------------------------------------------------------------- life cycle */

/* At the drain (off the loop thread): the consumers stop taking messages, each run stops at its
 * next chunk boundary and gives its lease up, then the consumers finish. */
static void tr_drain(void *arg)
{
    taskrun *tr = arg;
    if (!tr)
        return;
    atomic_store(&tr->draining, 1);
    for (int i = 0; i < tr->nworkers; i++)
        mq_consumer_quit(tr->workers[i].consumer);
    for (int i = 0; i < tr->nworkers; i++) {
        tr_worker *w = &tr->workers[i];
        pthread_mutex_lock(&w->mu);
        if (w->run)
            tr_stop(w->run, TR_HALT);
        pthread_mutex_unlock(&w->mu);
    }
    for (int i = 0; i < tr->nworkers; i++) {
        mq_consumer_stop(tr->workers[i].consumer);
        tr->workers[i].consumer = NULL;
    }
}

static void tr_free(void *arg)
{
    taskrun *tr = arg;
    if (!tr)
        return;
    if (tr->workers)
        tr_drain(tr);
    for (int i = 0; i < tr->nworkers; i++) {
        tr_worker *w = &tr->workers[i];
        if (w->keeper_started) {
            pthread_mutex_lock(&w->mu);
            w->quit = 1;
            pthread_cond_broadcast(&w->cv);
            pthread_mutex_unlock(&w->mu);
            pthread_join(w->keeper, NULL);
        }
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        for (int k = 0; k < 2; k++)
            pgpool_conn_close(w->pg[k]);
        pgpool_conn_close(w->tail_pg);
        redis_sync_free(w->redis);
        redis_sync_free(w->tail_redis);
    }
    free(tr->workers);
    redis_scripts_free(tr->scripts);
    free(tr);
}

static qn_status tr_start(service *s, void **state)
{
    const tr_settings *cfg = &tr_cfg;
    const service_config *common = service_cfg(s);
    taskrun *tr = calloc(1, sizeof(*tr));
    if (!tr)
        return QN_ENOMEM;
    *state = tr; /* freed by tr_free from here on, whatever happens below */
    tr->svc = s;
    tr->cfg = cfg;
    tr->common = common;
    tr->scripts = redis_scripts_load_dir(common->lua_dir);
    tr->workers = calloc((size_t)cfg->workers, sizeof(*tr->workers));
    if (!tr->scripts || !tr->workers)
        return QN_ENOMEM;
    for (int i = 0; i < (int)cfg->workers; i++) {
        tr_worker *w = &tr->workers[i];
        w->tr = tr;
        w->id = i;
        pthread_mutex_init(&w->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&w->cv, &ca);
        pthread_condattr_destroy(&ca);
        tr->nworkers = i + 1;
        if (pthread_create(&w->keeper, NULL, tr_keeper, w) != 0)
            return QN_ERR;
        w->keeper_started = 1;
    }
    for (int i = 0; i < tr->nworkers; i++) {
        tr_worker *w = &tr->workers[i];
        mq_consumer_opts o = service_consumer_opts(tr->svc, &tr_consumers[0]);
        o.prefetch = 1;
        o.handler = tr_on_message;
        o.arg = w;
        if (!(w->consumer = mq_consumer_start(&o)))
            return QN_ERR;
    }
    log_infof(NULL,
              ((log_field[]){LOG_I("workers", tr->nworkers), LOG_I("chunk_rows", cfg->chunk_rows),
                             LOG_I("lease_ms", cfg->lease_ms), LOG_END}),
              "distribution: consuming %s", tr_consumers[0].queue);
    return QN_OK;
}

static const config_var tr_vars[] = {
    FETCH_CONFIG_VARS(tr_settings, file),
    {"QUAN_DIST_CHUNK_ROWS", CONFIG_INT, offsetof(tr_settings, chunk_rows), "5000", 1, 20000, NULL,
     0,
     "spreadsheet rows per chunk: one Redis call and one commit per database (a task keeps the "
     "size it started with)"},
    {"QUAN_DIST_WORKERS", CONFIG_INT, offsetof(tr_settings, workers), "2", 1, 16, NULL, 0,
     "tasks this replica runs at once (each with its own connections)"},
    {"QUAN_DIST_LEASE_MS", CONFIG_INT, offsetof(tr_settings, lease_ms), "30000", 1000, 3600000,
     NULL, 0,
     "how long a run holds its task without renewing: a run whose process died is taken over "
     "this long after its last renewal"},
};

const service_module taskrun_module = {
    .name = "taskrun",
    .vars = tr_vars,
    .nvars = sizeof(tr_vars) / sizeof(tr_vars[0]),
    .settings = &tr_cfg,
    .consumers = tr_consumers, /* consumed by the workers tr_start starts */
    .metrics = (metrics_family *const[]){METRICS_REFS(TASKRUN_METRICS) NULL},
    .start = tr_start,
    .drain = tr_drain,
    .free = tr_free,
};
