/* Dead coupons to the archive tables and back (see archive.h). */
#include "archive.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "reconcile.h"
#include "shard.h"
#include "ucoupon.h"

METRICS_DEFINE(ARCHIVE_METRICS)

#define ARCHIVE_JOB_BUDGET_MS 1000 /* a tick's share of one ds_0 pool worker */
#define ARCHIVE_ACQUIRE_MS    5000

/* Dead: used, expired or revoked. */
#define ARCHIVE_DEAD "status >= " UCOUPON_STATUS_TEXT(USED)

/*
 * One batch on shard %1$d. s: the next candidates after the cursor ($2, $3), dead for more than
 * $1 days, at most $4 (the partial index t_user_coupon_N_dead_idx in its order); c: those not of
 * a claimable template ($5) deleted, their condition checked again on the row deleted (a refund
 * may have revived it since s read it); their log rows follow. The answer: coupons and log
 * rows moved, candidates looked at, and the last one (the next cursor; NULL when none).
 */
static const char archive_batch_fmt[] =
    "WITH s AS (SELECT id, update_time, coupon_template_id FROM t_user_coupon_%1$d "
    "WHERE " ARCHIVE_DEAD
    " AND update_time < now() - $1::integer * interval '1 day' AND (update_time, id) > "
    "($2::timestamptz, $3::bigint) ORDER BY update_time, id LIMIT $4::integer), "
    "c AS (DELETE FROM t_user_coupon_%1$d WHERE id IN (SELECT id FROM s WHERE coupon_template_id "
    "<> ALL($5::bigint[])) AND " ARCHIVE_DEAD " AND update_time < now() - $1::integer * "
    "interval '1 day' RETURNING *), "
    "ca AS (INSERT INTO t_user_coupon_archive_%1$d SELECT now(), c.* FROM c), "
    "l AS (DELETE FROM t_user_coupon_log_%1$d WHERE coupon_id IN (SELECT id FROM c) RETURNING *), "
    "la AS (INSERT INTO t_user_coupon_log_archive_%1$d SELECT * FROM l) "
    "SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM l), (SELECT count(*) FROM s), "
    "z.update_time::text, z.id FROM (SELECT 1) o LEFT JOIN (SELECT update_time, id FROM s "
    "ORDER BY update_time DESC, id DESC LIMIT 1) z ON true";

/*
 * The way back, on shard %1$d, of the archived coupons matching %2$s ($1 the user, $2 the
 * coupon or NULL for all of the user's). The issue trigger counts nothing under
 * quan.archive_restore; the row goes through jsonb so that archive_time is left behind
 * whatever the column order, and update_time is now (another retention period).
 */
static const char archive_restore_fmt[] =
    "WITH a AS (DELETE FROM t_user_coupon_archive_%1$d WHERE user_id = $1 AND ($2::bigint IS "
    "NULL OR id = $2::bigint) RETURNING *), "
    "c AS (INSERT INTO t_user_coupon_%1$d SELECT (jsonb_populate_record(NULL::t_user_coupon_%1$d, "
    "(to_jsonb(a) - 'archive_time') || jsonb_build_object('update_time', now()))).* FROM a "
    "RETURNING id), "
    "l AS (DELETE FROM t_user_coupon_log_archive_%1$d WHERE coupon_id IN (SELECT id FROM a) "
    "RETURNING *), "
    "li AS (INSERT INTO t_user_coupon_log_%1$d SELECT * FROM l) "
    "SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM l)";

qn_status archive_keep_list(pgpool_conn *pg[2], pgparam_array *keep)
{
    reconcile_tpl *t = NULL;
    size_t n = 0;
    qn_status st = reconcile_list_active(pg, &t, &n);
    for (size_t i = 0; st == QN_OK && i < n; i++)
        pgparam_array_i64(keep, t[i].id);
    free(t);
    return st;
}

/* Bounds the open transaction's statements: the batch gives up rather than wait. */
static qn_status archive_bound(pgpool_conn *c, int64_t ms)
{
    pgparam p = {0};
    char v[PGPARAM_NUM_LEN];
    pgparam_fmt_i64(v, ms);
    pgparam_str(&p, v);
    return pgpool_exec_cmd(c,
                           "SELECT set_config('statement_timeout', $1, true), "
                           "set_config('lock_timeout', $1, true)",
                           p.n, p.v, NULL);
}

/* One batch of shard cur->idx from the cursor on; moves the cursor. *looked: candidates. */
static qn_status archive_batch(pgpool_conn *c, const archive_opts *o, const char *keep,
                               archive_cursor *cur, int64_t *looked, archive_totals *t)
{
    char sql[sizeof(archive_batch_fmt) + 64];
    pgparam p = {0};
    PGresult *r = NULL;
    qn_status st = QN_ERR;
    double t0 = now_mono_s();

    snprintf(sql, sizeof(sql), archive_batch_fmt, cur->idx);
    pgparam_i64(&p, o->after_days);
    pgparam_str(&p, cur->time[0] ? cur->time : "-infinity");
    pgparam_i64(&p, cur->id);
    pgparam_i64(&p, o->batch);
    pgparam_str(&p, keep);
    if (pgpool_begin(c) != QN_OK || archive_bound(c, o->statement_ms) != QN_OK)
        goto done;
    r = pgpool_exec(c, sql, p.n, p.v);
    if (!r || PQntuples(r) != 1 || pgpool_commit(c) != QN_OK)
        goto done;
    *looked = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    t->coupons += strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    t->logs += strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    if (!PQgetisnull(r, 0, 3)) {
        snprintf(cur->time, sizeof(cur->time), "%s", PQgetvalue(r, 0, 3));
        cur->id = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
    }
    double s = now_mono_s() - t0;
    t->batches++;
    t->sum_batch_s += s;
    if (s > t->max_batch_s)
        t->max_batch_s = s;
    st = QN_OK;
done:
    if (st != QN_OK) {
        (void)pgpool_rollback(c);
        log_warn(NULL, "archive t_user_coupon_%d: %s", cur->idx, pgpool_conn_error(c));
    }
    PQclear(r);
    return st;
}

qn_status archive_pass(pgpool_conn *pg[2], const archive_opts *o, const char *keep,
                       archive_cursor *cur, int64_t budget_ms, archive_batch_fn on_batch, void *arg,
                       archive_totals *t, int *done)
{
    int ntables = shard_table_count("t_user_coupon");
    int64_t start = now_mono_ms();

    *done = 0;
    while (cur->idx < ntables) {
        shard_route r;
        int64_t looked = 0;
        double before = t->sum_batch_s;
        if (shard_route_index("t_user_coupon", cur->idx, &r) != QN_OK)
            return QN_EINVAL;
        if (archive_batch(pg[r.ds], o, keep, cur, &looked, t) != QN_OK)
            return QN_ERR;
        if (on_batch)
            on_batch(t->sum_batch_s - before, arg);
        if (looked < o->batch) /* this shard is done */
            *cur = (archive_cursor){.idx = cur->idx + 1};
        if (budget_ms > 0 && now_mono_ms() - start >= budget_ms && cur->idx < ntables)
            return QN_OK;
    }
    *cur = (archive_cursor){0};
    *done = 1;
    return QN_OK;
}

/* Restores on shard idx what archive_restore_fmt matches; one transaction. */
static qn_status archive_restore_on(pgpool_conn *c, int idx, int64_t user_id, int64_t id,
                                    int64_t *coupons, int64_t *logs)
{
    char sql[sizeof(archive_restore_fmt) + 64];
    pgparam p = {0};
    PGresult *r = NULL;
    qn_status st = QN_ERR;

    snprintf(sql, sizeof(sql), archive_restore_fmt, idx);
    pgparam_i64(&p, user_id);
    if (id > 0)
        pgparam_i64(&p, id);
    else
        pgparam_null(&p);
    if (pgpool_begin(c) != QN_OK ||
        pgpool_exec_cmd(c, "SET LOCAL quan.archive_restore = 'on'", 0, NULL, NULL) != QN_OK)
        goto done;
    r = pgpool_exec(c, sql, p.n, p.v);
    if (!r) {
        if (pgpool_is_unique_violation(c))
            st = QN_ECONFLICT;
        goto done;
    }
    if (pgpool_commit(c) != QN_OK)
        goto done;
    *coupons = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    *logs = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    st = *coupons > 0 ? QN_OK : QN_ENOTFOUND;
done:
    if (st != QN_OK && st != QN_ENOTFOUND) {
        (void)pgpool_rollback(c);
        log_warn(NULL, "archive restore t_user_coupon_%d: %s", idx, pgpool_conn_error(c));
    }
    PQclear(r);
    return st;
}

qn_status archive_restore_user(pgpool_conn *pg[2], int64_t user_id, int64_t *coupons, int64_t *logs)
{
    shard_route r;
    *coupons = *logs = 0;
    if (shard_route_for("t_user_coupon", user_id, &r) != QN_OK)
        return QN_EINVAL;
    return archive_restore_on(pg[r.ds], r.index, user_id, 0, coupons, logs);
}

qn_status archive_restore_coupon(pgpool_conn *pg[2], int64_t id, int64_t *coupons, int64_t *logs)
{
    *coupons = *logs = 0;
    /* The user is not known: look in every archive table of both databases. */
    for (int idx = 0; idx < shard_table_count("t_user_coupon"); idx++) {
        shard_route r;
        char sql[128];
        pgparam p = {0};
        if (shard_route_index("t_user_coupon", idx, &r) != QN_OK)
            return QN_EINVAL;
        snprintf(sql, sizeof(sql), "SELECT user_id FROM t_user_coupon_archive_%d WHERE id = $1",
                 idx);
        pgparam_i64(&p, id);
        PGresult *x = pgpool_exec(pg[r.ds], sql, p.n, p.v);
        if (!x)
            return QN_ERR;
        int64_t user_id = PQntuples(x) == 1 ? strtoll(PQgetvalue(x, 0, 0), NULL, 10) : 0;
        PQclear(x);
        if (user_id > 0)
            return archive_restore_on(pg[r.ds], idx, user_id, id, coupons, logs);
    }
    return QN_ENOTFOUND;
}

/* ---------------------------------------------------------------- the engine's archiver */

typedef struct archive_settings {
    int64_t after_days;
    int64_t interval_ms;
    int64_t batch;
    int64_t statement_ms;
} archive_settings;

static archive_settings archive_cfg;

/* The module's context. The job's fields are its worker's while running is set. */
typedef struct archive_ctx {
    service *svc;
    int running;
    archive_cursor cur; /* where the pass goes on */
    pgparam_array keep; /* the pass's claimable templates, read at its start */
    int in_pass;        /* keep is read and the cursor stands inside a pass */
    archive_totals t;   /* this tick's */
} archive_ctx;

static void archive_observe(double seconds, void *arg)
{
    (void)arg;
    metrics_observe(&metric_quan_archive_batch_duration_seconds, seconds);
}

/* A ds_0 pool worker; ds_1's connection borrowed for the job. */
static qn_status archive_work(pgpool_conn *conn, void *arg)
{
    archive_ctx *x = arg;
    archive_opts o = {.after_days = archive_cfg.after_days,
                      .batch = archive_cfg.batch,
                      .statement_ms = archive_cfg.statement_ms};
    pgpool_conn *pg[2] = {conn, pgpool_acquire(service_pg(x->svc, 1), ARCHIVE_ACQUIRE_MS)};
    qn_status st = QN_ERR;
    const char *keep;
    int done = 0;

    x->t = (archive_totals){0};
    if (!pg[1])
        goto out;
    if (!x->in_pass) { /* a new pass: the templates claimable now */
        pgparam_array_free(&x->keep);
        x->cur = (archive_cursor){0};
        if (archive_keep_list(pg, &x->keep) != QN_OK)
            goto out;
        x->in_pass = 1;
    }
    if (!(keep = pgparam_array_end(&x->keep)))
        goto out;
    st = archive_pass(pg, &o, keep, &x->cur, ARCHIVE_JOB_BUDGET_MS, archive_observe, NULL, &x->t,
                      &done);
out:
    if (pg[1])
        pgpool_release(pg[1]);
    if (st != QN_OK || done) /* the next pass reads the claimable templates anew */
        x->in_pass = 0;
    return st;
}

/* Loop thread. */
static void archive_done(qn_status st, void *arg)
{
    archive_ctx *x = arg;
    x->running = 0;
    if (st != QN_OK)
        metrics_inc(&metric_quan_archive_failures_total);
    if (x->t.coupons > 0) {
        metrics_add(&metric_quan_archive_coupons_total, x->t.coupons);
        log_infof(
            NULL,
            ((log_field[]){LOG_I("coupons", x->t.coupons), LOG_I("logs", x->t.logs),
                           LOG_I("batches", x->t.batches),
                           LOG_I("max_batch_ms", (int64_t)(x->t.max_batch_s * 1000)), LOG_END}),
            "archived dead user coupons");
    }
}

/* Every QUAN_ARCHIVE_INTERVAL_MS, on the loop thread. */
static void archive_on_tick(void *state)
{
    archive_ctx *x = state;
    pgpool *pool = service_pg(x->svc, 0);
    if (x->running || !pool || archive_cfg.after_days == 0)
        return;
    /* A full queue or a pool shutting down: the next tick tries again. */
    if (pgpool_submit(pool, archive_work, archive_done, x) == QN_OK)
        x->running = 1;
}

static qn_status archive_start(service *s, void **state)
{
    archive_ctx *x = calloc(1, sizeof(*x));
    if (!x)
        return QN_ENOMEM;
    x->svc = s;
    *state = x;
    return QN_OK;
}

/* After the pools joined the running job. */
static void archive_free(void *state)
{
    archive_ctx *x = state;
    if (!x)
        return;
    pgparam_array_free(&x->keep);
    free(x);
}

static const config_var archive_vars[] = {
    {"QUAN_ARCHIVE_AFTER_DAYS", CONFIG_INT, offsetof(archive_settings, after_days), "180", 0, 36500,
     NULL, 0,
     "days after its last change (used, expired, revoked) that a user coupon moves to the "
     "archive tables; 0: never (keep the refund window of used coupons inside it)"},
    {"QUAN_ARCHIVE_INTERVAL_MS", CONFIG_INT, offsetof(archive_settings, interval_ms), "10000", 0,
     3600000, NULL, 0,
     "how often this process archives dead user coupons, for at most a second each time; 0: "
     "not in this process (its other replicas archive)"},
    {"QUAN_ARCHIVE_BATCH", CONFIG_INT, offsetof(archive_settings, batch), "500", 1, 10000, NULL, 0,
     "user coupons one archive transaction looks at (and at most moves)"},
    {"QUAN_ARCHIVE_STATEMENT_TIMEOUT_MS", CONFIG_INT, offsetof(archive_settings, statement_ms),
     "1000", 10, 60000, NULL, 0,
     "statement and lock timeout of one archive batch: it gives up rather than hold a sale up"},
};

const service_module archive_module = {
    .name = "archive",
    .vars = archive_vars,
    .nvars = sizeof(archive_vars) / sizeof(archive_vars[0]),
    .settings = &archive_cfg,
    .timers =
        (const service_timer[]){
            {"archive", offsetof(archive_settings, interval_ms), archive_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(ARCHIVE_METRICS) NULL},
    .start = archive_start,
    .free = archive_free,
};
