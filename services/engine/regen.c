/* The rebuild of the Redis claim state (regen.h). */
#include "regen.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bucket.h"
#include "claimq.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "mq_conn.h"
#include "now.h"
#include "reconcile.h"
#include "restore.h"
#include "rgen.h"
#include "shard.h"

METRICS_DEFINE(REGEN_METRICS)

#define REGEN_LOCK       KEYS_REGEN_LOCK
#define REGEN_LOCK_MS    15000 /* renewed while rebuilding: a dead rebuilder's expires soon */
#define REGEN_CHECK_MS   500
#define REGEN_ACQUIRE_MS 5000
#define REGEN_BATCH      500 /* templates per reconcile_run */

typedef struct regen_settings {
    int64_t regen_settle_ms;
    int64_t regen_drain_max_ms;
    int64_t regen_check_ms;
} regen_settings;

/* Read at start; the running module reads them through its context. */
static regen_settings regen_cfg;

struct regen {
    service *svc;
    const service_config *common;
    const regen_settings *cfg;
    rgen *gen;
    const restore *restore; /* a restore's recovery is quan-recover's, not this rebuild's */
    int running;
    redis_sync *sync; /* the rebuilding worker's client */
    const redis_scripts *scripts;
    char token[LOCK_TOKEN_LEN]; /* this attempt's hold on REGEN_LOCK */
};

int regen_ok(const regen *g)
{
    return rgen_ok(g->gen) && restore_ok(g->restore);
}

/* Closes every template before the settle, every one of its stock buckets (bucket.h): nothing
 * reserves while the claims in flight end. */
static qn_status regen_close(regen *g, reconcile_tpl *t, size_t n)
{
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        int nb = t[i].buckets >= 1 ? t[i].buckets : 1;
        for (int b = 0; b < nb; b++) {
            bucket_keys k;
            bucket_keys_of(&k, t[i].id, b, nb);
            redis_sync_append(g->sync, "HDEL %s stock", k.hash);
            redis_sync_append(g->sync, "HSET %s rebuilding 1", k.hash);
            /* until reconcile writes the hash with the template's end (a rebuild that dies
             * leaves it closed: the next one reopens it) */
            redis_sync_append(g->sync, "PEXPIRE %s %d", k.hash, 3600000);
            sent += 3;
        }
    }
    for (size_t i = 0; i < sent; i++) {
        redisReply *r = NULL;
        if (redis_sync_get_reply(g->sync, &r) != QN_OK)
            return QN_ERR; /* no reply: the rest is dropped by the next command */
        freeReplyObject(r);
    }
    return QN_OK;
}

/* The rebuilder still holds the lock (renewed: a rebuild outlives REGEN_LOCK_MS). Only our own
 * hold is extended or deleted: the lock's value is this attempt's random token. 0 when the
 * hold is gone (it expired, or Redis lost it): another replica may be rebuilding by now, and
 * two rebuilds would close each other's reopened templates, so this one stops. A reply that
 * did not come (a timeout) is not a loss: the next renewal or the mark finds out. */
static int regen_renew(regen *g)
{
    const char *keys[1] = {REGEN_LOCK};
    char lease[16];
    snprintf(lease, sizeof(lease), "%d", REGEN_LOCK_MS);
    const char *args[2] = {g->token, lease};
    redisReply *r = REDIS_SYNC_SCRIPT(g->sync, g->scripts, lock_renew, keys, args);
    int held = !r || r->type != REDIS_REPLY_INTEGER || r->integer == 1;
    freeReplyObject(r);
    return held;
}

static void regen_unlock(regen *g)
{
    const char *keys[1] = {REGEN_LOCK};
    const char *args[1] = {g->token};
    freeReplyObject(REDIS_SYNC_SCRIPT(g->sync, g->scripts, lock_release, keys, args));
}

/* Ready messages in the claim queue and its retry queue; -1 when the broker cannot say. */
static long regen_queued(mq_conn *mq)
{
    mq_conn_names q;
    uint32_t a = 0, b = 0;
    if (!mq || mq_conn_names_of("engine.redeem", &q) != QN_OK ||
        mq_conn_queue_count(mq, q.main, &a) != QN_OK ||
        mq_conn_queue_count(mq, q.retry, &b) != QN_OK)
        return -1;
    return (long)a + (long)b;
}

/* Step 2: the claims in flight end (or the bound passes). QN_ERR when the lock was lost. */
static qn_status regen_settle(regen *g)
{
    const service_config *cfg = g->common;
    int64_t until = now_wall_ms() + g->cfg->regen_drain_max_ms;
    int empty = 0;
    for (int64_t slept = 0; slept < g->cfg->regen_settle_ms; slept += 1000) {
        if (!regen_renew(g))
            return QN_ERR;
        usleep(
            (useconds_t)((g->cfg->regen_settle_ms - slept < 1000 ? g->cfg->regen_settle_ms - slept
                                                                 : 1000) *
                         1000));
    }
    mq_conn_cursor cursor = {0}; /* a reopen goes to the next node of the list */
    mq_conn *mq = mq_conn_open_at(cfg->amqp_url, "quan-engine regen", &cursor);
    while (empty < 2 && now_wall_ms() < until) {
        long q = regen_queued(mq);
        empty = q == 0 ? empty + 1 : 0;
        if (q < 0) {
            mq_conn_close(mq);
            mq = mq_conn_open_at(cfg->amqp_url, "quan-engine regen", &cursor);
        }
        if (!regen_renew(g)) {
            mq_conn_close(mq);
            return QN_ERR;
        }
        if (empty < 2)
            usleep(1000000);
    }
    if (empty < 2)
        log_error(NULL, "regen: the claim queue did not drain in QUAN_REGEN_DRAIN_MAX_MS; "
                        "rebuilding anyway (claims still queued may be refused when written)");
    mq_conn_close(mq);
    return QN_OK;
}

static qn_status regen_work(pgpool_conn *conn0, void *arg)
{
    regen *g = arg;
    pgpool_conn *pg[2] = {conn0, NULL};
    reconcile_tpl *t = NULL;
    size_t n = 0;
    qn_status st = QN_ERR;
    const char *step = NULL; /* the step under way once the rebuild started, for its log */
    char run[RGEN_RUN_MAX];
    if (redis_sync_open(g->sync) != QN_OK || rgen_sync_current(g->sync) != 0 ||
        rgen_sync_run_id(g->sync, run) != QN_OK)
        goto out; /* current already (another replica rebuilt), or no Redis yet */
    if (lock_token_new(g->token) != QN_OK)
        goto out;
    g->scripts = redis_client_scripts(service_redis(g->svc));
    redisReply *r =
        redis_sync_command(g->sync, "SET %s %s NX PX %d", REGEN_LOCK, g->token, REGEN_LOCK_MS);
    int ours = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (!ours)
        goto out;
    /* Another replica may have finished a rebuild between the look above and the lock: a
     * second one would close every template again for nothing. */
    if (rgen_sync_current(g->sync) != 0)
        goto unlock;
    if (!(pg[1] = pgpool_acquire(service_pg(g->svc, 1), REGEN_ACQUIRE_MS)))
        goto unlock;
    int64_t t0 = now_wall_ms();
    log_warn(NULL, "regen: rebuilding the Redis claim state from the databases");
    step = "listing the active templates";
    if (reconcile_list_active(pg, &t, &n) != QN_OK)
        goto unlock;
    step = "closing the templates";
    if (regen_close(g, t, n) != QN_OK)
        goto unlock;
    step = "waiting for the claims in flight (the lock was lost)";
    if (regen_settle(g) != QN_OK)
        goto unlock;
    reconcile_opts o = {.apply = 1, .dead = 1};
    step = "rebuilding the templates from the databases";
    for (size_t i = 0; i < n; i += REGEN_BATCH) {
        size_t m = n - i < REGEN_BATCH ? n - i : REGEN_BATCH;
        if (!regen_renew(g)) {
            step = "rebuilding the templates (the lock was lost)";
            goto unlock;
        }
        if (reconcile_run(g->sync, g->scripts, pg, t + i, m, &o) != QN_OK)
            goto unlock;
    }
    step = "marking the generation (the servers changed meanwhile)";
    if (rgen_sync_mark(g->sync, run) != QN_OK)
        goto unlock;
    /* at the level of the start's line: whoever saw the claims close sees them reopen */
    log_warnf(
        NULL,
        ((log_field[]){LOG_I("templates", (int64_t)n), LOG_I("ms", now_wall_ms() - t0), LOG_END}),
        "regen: Redis claim state rebuilt; claims open again");
    st = QN_OK;
unlock:
    if (st != QN_OK && step) /* the next tick (QUAN_REGEN_CHECK_MS) tries again from the start */
        log_warnf(NULL, ((log_field[]){LOG_S("step", step), LOG_END}),
                  "regen: the rebuild failed; trying again");
    if (!redis_sync_broken(g->sync))
        regen_unlock(g);
out:
    if (pg[1])
        pgpool_release(pg[1]);
    free(t);
    return st;
}

static void regen_done(qn_status st, void *arg)
{
    (void)st;
    regen *g = arg;
    g->running = 0;
}

static void regen_on_tick(void *state)
{
    regen *g = state;
    pgpool *pool = service_pg(g->svc, 0);
    metrics_set(&metric_quan_redis_rebuild_in_progress, rgen_ok(g->gen) ? 0 : 1);
    if (g->running || rgen_ok(g->gen) || !restore_ok(g->restore) || !pool ||
        !redis_client_connected(service_redis(g->svc)))
        return;
    if (pgpool_submit(pool, regen_work, regen_done, g) == QN_OK)
        g->running = 1;
}

static bool regen_ready(void *state)
{
    return regen_ok(state);
}

static qn_status regen_start(service *s, void **state)
{
    regen *g = calloc(1, sizeof(*g));
    if (!g)
        return QN_ENOMEM;
    *state = g; /* freed by regen_free from here on, whatever happens below */
    g->svc = s;
    g->common = service_cfg(s);
    g->cfg = &regen_cfg;
    g->restore = service_module_state(s, &restore_module);
    if (!g->restore) { /* it starts before this module */
        log_error(NULL, "regen: the restore module must start first");
        return QN_ERR;
    }
    g->gen = rgen_new(service_base(s), service_redis(s), REGEN_CHECK_MS);
    /* A rebuild's pipelines and scripts are long: five times a command's timeout. */
    g->sync = service_redis_sync_new(g->common, (int)g->common->redis_timeout_ms * 5);
    return g->gen && g->sync ? QN_OK : QN_ENOMEM;
}

static void regen_free(void *state)
{
    regen *g = state;
    if (!g)
        return;
    rgen_free(g->gen);
    redis_sync_free(g->sync);
    free(g);
}

static const config_var regen_vars[] = {
    {"QUAN_REGEN_SETTLE_MS", CONFIG_INT, offsetof(regen_settings, regen_settle_ms), "11000", 0,
     600000, NULL, 0,
     "after Redis lost state, how long the rebuild waits for synchronous claims in flight (more "
     "than the request timeout)"},
    {"QUAN_REGEN_DRAIN_MAX_MS", CONFIG_INT, offsetof(regen_settings, regen_drain_max_ms), "300000",
     0, 86400000, NULL, 0,
     "after Redis lost state, how long the rebuild waits at most for the claim queue to drain"},
    {"QUAN_REGEN_CHECK_MS", CONFIG_INT, offsetof(regen_settings, regen_check_ms), "1000", 100,
     60000, NULL, 0, "how often an engine looks whether the Redis claim state needs a rebuild"},
};

const service_module regen_module = {
    .name = "regen",
    .vars = regen_vars,
    .nvars = sizeof(regen_vars) / sizeof(regen_vars[0]),
    .settings = &regen_cfg,
    .timers =
        (const service_timer[]){
            {"regen", offsetof(regen_settings, regen_check_ms), regen_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(REGEN_METRICS) NULL},
    .start = regen_start,
    .ready = regen_ready,
    .free = regen_free,
};
