/* The sweep of stopped runs (sweep.h). */
#include "sweep.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "events.h"
#include "log.h"
#include "now.h"
#include "outbox.h"
#include "pgparam.h"

#define SWEEP_BATCH 100 /* tasks per transaction */

typedef struct sweep_settings {
    int64_t sweep_ms; /* QUAN_DIST_SWEEP_MS: how often stopped runs are looked for */
} sweep_settings;

static sweep_settings sweep_cfg;

/* The module's context (its start hook's state), the arg of its timer. */
typedef struct sweep {
    service *svc;
    const sweep_settings *cfg;
    int running;   /* a sweep is in the pool: the next tick waits */
    int64_t found; /* written by the worker, read in sweep_done */
} sweep;

/* Worker thread: claims the stopped runs and writes their task.execute. */
static qn_status sweep_work(pgpool_conn *conn, void *arg)
{
    sweep *sw = arg;
    pgparam p = {0};
    pgparam_array ids = {0};
    PGresult *r = NULL;
    qn_status st = QN_ERR;
    int64_t now = now_wall_ms();

    sw->found = 0;
    pgparam_i64(&p, sw->cfg->sweep_ms);
    pgparam_i64(&p, SWEEP_BATCH);
    if (pgpool_begin(conn) != QN_OK)
        goto done;
    r = pgpool_exec(
        conn,
        "SELECT id, batch_id, shop_number, coupon_template_id FROM t_coupon_task "
        "WHERE status = " TASK_STATUS_TEXT(
            RUNNING) " AND del_flag = 0 AND (lease_until IS NULL OR lease_until < "
                     "now()) AND update_time < now() - $1::bigint * interval '1 millisecond' "
                     "ORDER BY update_time LIMIT $2::integer FOR UPDATE SKIP LOCKED",
        p.n, p.v);
    if (!r)
        goto done;
    for (int i = 0; i < PQntuples(r); i++) {
        char key[96], data[256];
        snprintf(key, sizeof(key), EVENT_TASK_EXECUTE ":%s:resume:%" PRId64, PQgetvalue(r, i, 0),
                 now);
        snprintf(data, sizeof(data),
                 "{\"taskId\":\"%s\",\"batchId\":\"%s\",\"shopNumber\":\"%s\","
                 "\"couponTemplateId\":\"%s\"}",
                 PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                 PQgetvalue(r, i, 3));
        outbox_event ev = {.routing_key = EVENT_TASK_EXECUTE, .key = key, .data_json = data};
        if (outbox_add(conn, &ev) != QN_OK)
            goto done;
        pgparam_array_i64(&ids, strtoll(PQgetvalue(r, i, 0), NULL, 10));
    }
    pgparam_truncate(&p, 0);
    if (PQntuples(r) > 0 &&
        (pgparam_array_bind(&p, &ids) != QN_OK ||
         pgpool_exec_cmd(conn,
                         "UPDATE t_coupon_task SET update_time = now() WHERE id = "
                         "ANY($1::bigint[])",
                         p.n, p.v, NULL) != QN_OK))
        goto done;
    if (pgpool_commit(conn) != QN_OK)
        goto done;
    sw->found = PQntuples(r);
    st = QN_OK;
done:
    if (st != QN_OK) {
        log_warn(NULL, "distribution sweep: %s", pgpool_conn_error(conn));
        (void)pgpool_rollback(conn);
    }
    PQclear(r);
    pgparam_array_free(&ids);
    return st;
}

/* Loop thread. */
static void sweep_done(qn_status st, void *arg)
{
    sweep *sw = arg;
    sw->running = 0;
    if (st == QN_OK && sw->found > 0) {
        log_infof(NULL, ((log_field[]){LOG_I("tasks", sw->found), LOG_END}),
                  "distribution sweep: tasks in progress without a run published again");
    }
}

/* Every QUAN_DIST_SWEEP_MS, on the loop thread. */
static void sweep_on_tick(void *state)
{
    sweep *sw = state;
    pgpool *pool = service_pg(sw->svc, DIST_TASK_DS);
    if (sw->running || !pool)
        return;
    /* A full queue or a pool shutting down: the next tick tries again. */
    if (pgpool_submit(pool, sweep_work, sweep_done, sw) == QN_OK)
        sw->running = 1;
}

static qn_status sweep_start(service *s, void **state)
{
    sweep *sw = calloc(1, sizeof(*sw));
    if (!sw)
        return QN_ENOMEM;
    sw->svc = s;
    sw->cfg = &sweep_cfg;
    *state = sw;
    return QN_OK;
}

/* After the pools are gone: no sweep is in flight any more. */
static void sweep_free(void *state)
{
    free(state);
}

static const config_var sweep_vars[] = {
    {"QUAN_DIST_SWEEP_MS", CONFIG_INT, offsetof(sweep_settings, sweep_ms), "30000", 100, 3600000,
     NULL, 0,
     "how often tasks in progress without a live run are looked for (and how long such a task "
     "waits before its task.execute is published again)"},
};

const service_module sweep_module = {
    .name = "sweep",
    .vars = sweep_vars,
    .nvars = sizeof(sweep_vars) / sizeof(sweep_vars[0]),
    .settings = &sweep_cfg,
    .timers =
        (const service_timer[]){
            {"sweep", offsetof(sweep_settings, sweep_ms), sweep_on_tick},
            {0},
        },
    .start = sweep_start,
    .free = sweep_free,
};
