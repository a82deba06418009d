/* The restore epoch (restore.h). */
#include "restore.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pgpool.h"
#include "query.h"

METRICS_DEFINE(RESTORE_METRICS)

#define RESTORE_ACQUIRE_MS 2000
#define RESTORE_SQL        "SELECT epoch, recovered_epoch FROM quan_restore WHERE id = 1"

typedef struct restore_settings {
    int64_t restore_check_ms;
} restore_settings;

/* Read at start; the running module reads them through its context. */
static restore_settings restore_cfg;

struct restore {
    service *svc;
    query *query;
    int running;
    atomic_int ok;             /* 0 until the first read answered */
    _Atomic int64_t epoch_now; /* restore_epoch */
    int known;                 /* a read answered once */
    /* the read in flight (its worker writes, the loop reads once it is done) */
    int64_t epoch[2], recovered[2];
    int missing; /* a database without quan_restore (not migrated yet) */
    /* what the loop last applied */
    int64_t seen_recovered[2];
    int missing_logged;
};

int restore_ok(const restore *r)
{
    return r && atomic_load(&r->ok);
}

int64_t restore_epoch(const restore *r)
{
    return r ? atomic_load(&r->epoch_now) : 0;
}

/* One database's epochs; a database without the table has never been restored. */
static qn_status restore_read(restore *r, pgpool_conn *c, int ds)
{
    PGresult *res = pgpool_exec(c, RESTORE_SQL, 0, NULL);
    if (!res) {
        if (!strcmp(pgpool_conn_sqlstate(c), "42P01")) { /* undefined_table */
            r->epoch[ds] = r->recovered[ds] = 0;
            r->missing = 1;
            return QN_OK;
        }
        return QN_ERR;
    }
    qn_status st = QN_ERR;
    if (PQntuples(res) == 1) {
        r->epoch[ds] = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        r->recovered[ds] = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
        st = QN_OK;
    }
    PQclear(res);
    return st;
}

static qn_status restore_work(pgpool_conn *conn0, void *arg)
{
    restore *r = arg;
    qn_status st = QN_ERR;
    pgpool_conn *c1 = NULL;
    r->missing = 0;
    if (restore_read(r, conn0, 0) != QN_OK)
        goto out;
    if (!(c1 = pgpool_acquire(service_pg(r->svc, 1), RESTORE_ACQUIRE_MS)))
        goto out;
    st = restore_read(r, c1, 1);
out:
    if (c1)
        pgpool_release(c1);
    return st;
}

/* Loop thread: the read's verdict. A failed read changes nothing (the databases are the
 * trouble then, and claims fail on them anyway). */
static void restore_done(qn_status st, void *arg)
{
    restore *r = arg;
    r->running = 0;
    if (st != QN_OK)
        return;
    int ok = r->epoch[0] == r->recovered[0] && r->epoch[1] == r->recovered[1];
    if (r->missing && !r->missing_logged) {
        r->missing_logged = 1;
        log_warn(NULL, "restore: a database has no quan_restore table (quan-migrate has not run): "
                       "restores of it are not noticed");
    }
    if (r->known &&
        (r->recovered[0] != r->seen_recovered[0] || r->recovered[1] != r->seen_recovered[1])) {
        /* quan-recover ran: whatever this process kept was read from the Redis it flushed */
        query_copies_drop(r->query);
        log_warnf(NULL,
                  ((log_field[]){LOG_I("ds_0", r->recovered[0]), LOG_I("ds_1", r->recovered[1]),
                                 LOG_END}),
                  "restore: quan-recover ran; the template copies of this process are dropped");
    }
    r->seen_recovered[0] = r->recovered[0];
    r->seen_recovered[1] = r->recovered[1];
    log_field f[] = {LOG_I("ds_0_epoch", r->epoch[0]), LOG_I("ds_0_recovered", r->recovered[0]),
                     LOG_I("ds_1_epoch", r->epoch[1]), LOG_I("ds_1_recovered", r->recovered[1]),
                     LOG_END};
    if (!ok && (atomic_load(&r->ok) || !r->known))
        log_warnf(NULL, f,
                  "restore: the databases were restored from a backup: claims wait for "
                  "quan-recover");
    else if (ok && r->known && !atomic_load(&r->ok)) /* the end of a wait someone saw begin */
        log_warnf(NULL, f, "restore: the databases and Redis agree; claims open");
    else if (ok && !r->known)
        log_infof(NULL, f, "restore: the databases were not restored; claims open");
    r->known = 1;
    atomic_store(&r->epoch_now, r->epoch[0] + r->epoch[1]);
    atomic_store(&r->ok, ok);
    metrics_set(&metric_quan_restore_pending, ok ? 0 : 1);
}

static void restore_on_tick(void *state)
{
    restore *r = state;
    pgpool *pool = service_pg(r->svc, 0);
    if (r->running || !pool)
        return;
    if (pgpool_submit(pool, restore_work, restore_done, r) == QN_OK)
        r->running = 1;
}

static bool restore_ready(void *state)
{
    return restore_ok(state);
}

static qn_status restore_start(service *s, void **state)
{
    restore *r = calloc(1, sizeof(*r));
    if (!r)
        return QN_ENOMEM;
    *state = r; /* freed by restore_free from here on, whatever happens below */
    r->svc = s;
    r->query = service_module_state(s, &query_module);
    metrics_set(&metric_quan_restore_pending, 1);
    if (!r->query) { /* it starts before this module */
        log_error(NULL, "restore: the query module must start first");
        return QN_ERR;
    }
    restore_on_tick(r); /* the first look now, not a period later */
    return QN_OK;
}

static void restore_free(void *state)
{
    free(state);
}

static const config_var restore_vars[] = {
    {"QUAN_RESTORE_CHECK_MS", CONFIG_INT, offsetof(restore_settings, restore_check_ms), "1000", 100,
     60000, NULL, 0,
     "how often an engine reads the databases' restore epoch (claims wait while they were "
     "restored and quan-recover has not run)"},
};

const service_module restore_module = {
    .name = "restore",
    .vars = restore_vars,
    .nvars = sizeof(restore_vars) / sizeof(restore_vars[0]),
    .settings = &restore_cfg,
    .timers =
        (const service_timer[]){
            {"restore", offsetof(restore_settings, restore_check_ms), restore_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(RESTORE_METRICS) NULL},
    .start = restore_start,
    .ready = restore_ready,
    .free = restore_free,
};
