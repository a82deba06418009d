/* User-coupon expiry: the sweeper and the coupon.expire consumer (see expire.h). */
#include "expire.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"
#include "ucoupon.h"

METRICS_DEFINE(EXPIRE_METRICS)

#define EXPIRE_JOB_BUDGET_MS 2000 /* one job yields its pool worker after this; resubmitted */
#define EXPIRE_ACQUIRE_MS    5000
#define EXPIRE_MEMBER_LEN    48

typedef struct expire expire;

/* One database's sweep: at most one runs at a time. */
typedef struct expire_job {
    expire *x;
    int ds;
    int running;
    int more; /* the job stopped at its budget with due rows left: run again at once */
    int64_t expired;
} expire_job;

typedef struct expire_settings {
    int64_t expire_interval_ms;
    int64_t expire_batch;
} expire_settings;

/* Read at start; the running module reads them through its context. */
static expire_settings expire_cfg;

/* The module's context: its timer's and its consumer's arg. Freed by the free hook, after the
 * pools joined the running jobs and the consumer thread stopped. */
struct expire {
    service *svc;
    const service_config *common;
    const expire_settings *cfg;
    expire_job jobs[SERVICE_DS_COUNT];
    redis_sync *consumer_rs; /* the coupon.expire consumer thread's own client */
};

/* Pipelines one ZREM per row (columns: id, user_id, coupon_template_id): the users' wallets,
 * each on its own slot's node. */
static qn_status expire_zrem_rows(redis_sync *rs, const PGresult *res)
{
    int n = PQntuples(res);
    qn_status st = QN_OK;

    for (int i = 0; i < n; i++) {
        char key[KEYS_LEN], member[EXPIRE_MEMBER_LEN];
        keys_wallet(key, strtoll(PQgetvalue(res, i, 1), NULL, 10));
        snprintf(member, sizeof(member), "%s_%s", PQgetvalue(res, i, 2), PQgetvalue(res, i, 0));
        redis_sync_append(rs, "ZREM %s %s", key, member);
    }
    /* Every reply is read, so the next command gets its own. */
    for (int i = 0; i < n; i++)
        if (redis_sync_get_reply(rs, NULL) != QN_OK)
            st = QN_ERR;
    return st;
}

/* Expires at most batch due rows of table (one transaction). *n gets how many. */
static qn_status expire_batch(pgpool_conn *conn, redis_sync *rs, const char *table, int batch,
                              int *n)
{
    char sel[256], upd[192];
    pgparam p = {0};
    pgparam_array ids = {0};
    PGresult *res = NULL;
    qn_status st = QN_ERR;

    *n = 0;
    snprintf(sel, sizeof(sel),
             "SELECT id, user_id, coupon_template_id FROM %s WHERE status = " UCOUPON_STATUS_TEXT(
                 UNUSED) " AND valid_end_time <= now() LIMIT $1 FOR UPDATE SKIP LOCKED",
             table);
    snprintf(upd, sizeof(upd),
             "UPDATE %s SET status = " UCOUPON_STATUS_TEXT(
                 EXPIRED) ", update_time = now(), "
                          "last_ref = NULL, last_actor = 'expiry' "
                          "WHERE id = ANY($1::bigint[]) AND status = " UCOUPON_STATUS_TEXT(UNUSED),
             table);
    pgparam_i64(&p, batch);
    if (pgpool_begin(conn) != QN_OK)
        goto done;
    res = pgpool_exec(conn, sel, p.n, p.v);
    if (!res)
        goto done;
    int rows = PQntuples(res);
    if (rows == 0) {
        st = QN_OK;
        goto done;
    }
    if (expire_zrem_rows(rs, res) != QN_OK) {
        log_warn(NULL, "expire: wallet ZREM failed (%s); batch rolled back, next sweep retries",
                 redis_sync_errstr(rs));
        goto done;
    }
    for (int i = 0; i < rows; i++)
        pgparam_array_i64(&ids, strtoll(PQgetvalue(res, i, 0), NULL, 10));
    pgparam_truncate(&p, 0);
    if (pgparam_array_bind(&p, &ids) != QN_OK ||
        pgpool_exec_cmd(conn, upd, p.n, p.v, NULL) != QN_OK || pgpool_commit(conn) != QN_OK)
        goto done;
    *n = rows;
    st = QN_OK;
done:
    if (st != QN_OK || *n == 0)
        (void)pgpool_rollback(conn);
    if (st != QN_OK && pgpool_conn_error(conn)[0])
        log_warn(NULL, "expire %s: %s", table, pgpool_conn_error(conn));
    PQclear(res);
    pgparam_array_free(&ids);
    return st;
}

/* Worker thread: every table of job->ds, batch after batch, until done or the budget is out. */
static qn_status expire_work(pgpool_conn *conn, void *arg)
{
    expire_job *job = arg;
    int batch = (int)job->x->cfg->expire_batch;
    int ntables = shard_table_count("t_user_coupon");
    int64_t start = now_mono_ms();
    redis_sync *rs = NULL;
    qn_status st = QN_ERR;

    job->more = 0;
    job->expired = 0;
    rs = service_redis_sync_new(job->x->common, 0);
    if (!rs || redis_sync_open(rs) != QN_OK)
        goto done;
    for (int idx = 0; idx < ntables; idx++) {
        shard_route r;
        if (shard_route_index("t_user_coupon", idx, &r) != QN_OK || r.ds != job->ds)
            continue;
        for (;;) {
            int n = 0;
            if (expire_batch(conn, rs, r.table, batch, &n) != QN_OK)
                goto done;
            job->expired += n;
            if (n < batch)
                break;
            if (now_mono_ms() - start > EXPIRE_JOB_BUDGET_MS) {
                job->more = 1;
                st = QN_OK;
                goto done;
            }
        }
    }
    st = QN_OK;
done:
    redis_sync_free(rs);
    return st;
}

static void expire_submit(expire_job *job);

/* Loop thread. */
static void expire_done(qn_status st, void *arg)
{
    expire_job *job = arg;

    job->running = 0;
    if (job->expired > 0) {
        metrics_add(&metric_quan_coupons_expired_total, job->expired);
        log_infof(NULL,
                  ((log_field[]){LOG_I("ds", job->ds), LOG_I("expired", job->expired), LOG_END}),
                  "expired user coupons");
    }
    if (st == QN_OK && job->more)
        expire_submit(job);
}

static void expire_submit(expire_job *job)
{
    pgpool *pool = service_pg(job->x->svc, job->ds);

    if (job->running || !pool)
        return;
    /* A full queue (QN_EBUSY) or a pool shutting down: skip this round, the timer retries. */
    if (pgpool_submit(pool, expire_work, expire_done, job) == QN_OK)
        job->running = 1;
}

/* Every QUAN_EXPIRE_INTERVAL_MS, on the loop thread. */
static void expire_on_tick(void *state)
{
    expire *x = state;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++)
        expire_submit(&x->jobs[ds]);
}

/* ---------------------------------------------------------------- coupon.expire consumer */

static mq_handler_result expire_on_message(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg)
{
    int64_t user_id = 0, uc_id = 0;
    jsonin_err err;
    shard_route r;
    pgpool_conn *conn = NULL;
    PGresult *res = NULL;
    mq_handler_result out = MQ_RETRY;
    char sql[256];
    pgparam p = {0};
    expire *x = arg;

    (void)info;
    if (jsonin_int64(env->data, "userId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &user_id, &err) !=
            QN_OK ||
        (jsonin_int64(env->data, "userCouponId", JSONIN_OPTIONAL, 0, 1, INT64_MAX, &uc_id, &err) !=
         QN_OK) ||
        (!uc_id &&
         jsonin_int64(env->data, "id", JSONIN_REQUIRED, 0, 1, INT64_MAX, &uc_id, &err) != QN_OK) ||
        shard_route_for("t_user_coupon", user_id, &r) != QN_OK) {
        /* Not ours to understand: the sweeper expires the coupon anyway. */
        log_warn(NULL, "coupon.expire %s: ignored (%s)", env->key, err.msg);
        return MQ_ACK;
    }
    pgparam_i64(&p, user_id);
    pgparam_i64(&p, uc_id);
    conn = pgpool_acquire(service_pg(x->svc, r.ds), EXPIRE_ACQUIRE_MS);
    if (!conn)
        goto done;
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET status = " UCOUPON_STATUS_TEXT(
                 EXPIRED) ", update_time = now(), "
                          "last_ref = NULL, last_actor = 'expiry' "
                          "WHERE user_id = $1 AND id = $2 AND status = " UCOUPON_STATUS_TEXT(
                              UNUSED) " AND valid_end_time <= now()",
             r.table);
    if (pgpool_exec_cmd(conn, sql, p.n, p.v, NULL) != QN_OK)
        goto done;
    snprintf(sql, sizeof(sql),
             "SELECT status, coupon_template_id FROM %s WHERE user_id = $1 AND id = $2", r.table);
    res = pgpool_exec(conn, sql, p.n, p.v);
    if (!res)
        goto done;
    /* Unknown or not yet expired (early event, or locked/used): nothing to do here. */
    if (PQntuples(res) == 0 || strcmp(PQgetvalue(res, 0, 0), UCOUPON_STATUS_TEXT(EXPIRED)) != 0) {
        out = MQ_ACK;
        goto done;
    }
    /* DB first, then ZREM: a crash in between redelivers the message, and the status is
     * then already 3, so the ZREM still happens. */
    char key[KEYS_LEN], member[EXPIRE_MEMBER_LEN];
    keys_wallet(key, user_id);
    snprintf(member, sizeof(member), "%s_%" PRId64, PQgetvalue(res, 0, 1), uc_id);
    redisReply *rr = redis_sync_command(x->consumer_rs, "ZREM %s %s", key, member);
    if (rr && rr->type != REDIS_REPLY_ERROR)
        out = MQ_ACK;
    freeReplyObject(rr);
done:
    if (conn)
        pgpool_release(conn);
    PQclear(res);
    return out;
}

static qn_status expire_start(service *s, void **state)
{
    expire *x = calloc(1, sizeof(*x));
    if (!x)
        return QN_ENOMEM;
    *state = x; /* freed by expire_free from here on, whatever happens below */
    x->svc = s;
    x->common = service_cfg(s);
    x->cfg = &expire_cfg;
    for (int ds = 0; ds < SERVICE_DS_COUNT; ds++)
        x->jobs[ds] = (expire_job){.x = x, .ds = ds};
    return (x->consumer_rs = service_redis_sync_new(x->common, 0)) ? QN_OK : QN_ENOMEM;
}

/* After the consumer thread and the pools stopped. */
static void expire_free(void *state)
{
    expire *x = state;
    if (!x)
        return;
    redis_sync_free(x->consumer_rs);
    free(x);
}

static const config_var expire_vars[] = {
    {"QUAN_EXPIRE_INTERVAL_MS", CONFIG_INT, offsetof(expire_settings, expire_interval_ms), "20000",
     0, 3600000, NULL, 0,
     "how often expired user coupons are swept out of the wallets; 0: not in this process (its "
     "other replicas sweep)"},
    {"QUAN_EXPIRE_BATCH", CONFIG_INT, offsetof(expire_settings, expire_batch), "1000", 1, 100000,
     NULL, 0, "user coupons expired per transaction by the sweeper"},
};

const service_module expire_module = {
    .name = "expire",
    .vars = expire_vars,
    .nvars = sizeof(expire_vars) / sizeof(expire_vars[0]),
    .settings = &expire_cfg,
    .consumers =
        (const service_consumer[]){
            /* one due coupon to expire at once (the sweeper covers every coupon anyway) */
            {"engine.coupon-expire", (const char *const[]){EVENT_COUPON_EXPIRE, NULL},
             expire_on_message},
            {0},
        },
    .timers =
        (const service_timer[]){
            {"sweep", offsetof(expire_settings, expire_interval_ms), expire_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(EXPIRE_METRICS) NULL},
    .start = expire_start,
    .free = expire_free,
};
