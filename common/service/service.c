#include "service.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "jsonin.h"
#include "log.h"
#include "metrics.h"
#include "namelist.h"
#include "nodup.h"
#include "rsentinel.h"
#include "now.h"

METRICS_DEFINE(SERVICE_METRICS)

static const char *const service_log_levels[] = {"debug", "info", "warn", "error", "off", NULL};

/* The rows of the settings every binary shares: offsets within service_config. */
static const config_var service_config_vars[] = {
    {"QUAN_HTTP_BIND", CONFIG_STR, offsetof(service_config, http_bind), "0.0.0.0", 0, 64, NULL, 0,
     "address the HTTP server binds"},
    {"QUAN_HTTP_PORT", CONFIG_INT, offsetof(service_config, http_port),
     "0", /* the binary's own: service_def.http_port */
     1, 65535, NULL, 0, "HTTP port (/api/..., /livez, /readyz, /metrics)"},
    {"QUAN_HTTP_MAX_BODY", CONFIG_INT, offsetof(service_config, http_max_body), "1048576", 1024,
     67108864, NULL, 0, "largest request body in bytes; larger gets 413"},
    {"QUAN_HTTP_IDLE_TIMEOUT_S", CONFIG_INT, offsetof(service_config, http_idle_timeout_s), "60", 1,
     3600, NULL, 0, "idle keep-alive and header read timeout, seconds"},
    {"QUAN_HTTP_REQUEST_TIMEOUT_MS", CONFIG_INT, offsetof(service_config, http_request_timeout_ms),
     "10000", 10, 600000, NULL, 0, "a request not answered by then gets 503"},
    {"QUAN_HEADER_USER_ID", CONFIG_STR, offsetof(service_config, header_user_id), "X-User-Id", 1,
     64, NULL, 0, "gateway header carrying the user id"},
    {"QUAN_HEADER_SHOP_NUMBER", CONFIG_STR, offsetof(service_config, header_shop_number),
     "X-Shop-Number", 1, 64, NULL, 0, "gateway header carrying the merchant's shop number"},
    {"QUAN_HEADER_USERNAME", CONFIG_STR, offsetof(service_config, header_username), "X-Username", 1,
     64, NULL, 0, "gateway header carrying the user name"},
    {"QUAN_LOG_LEVEL", CONFIG_ENUM, offsetof(service_config, log_level), "info", 0, 0,
     service_log_levels, 0, "least severe level logged"},
    {"QUAN_DS0_DSN", CONFIG_STR, offsetof(service_config, ds_dsn[0]), NULL, 1, 1024, NULL,
     CONFIG_REQUIRED | CONFIG_SECRET, "libpq URI of database ds_0"},
    {"QUAN_DS1_DSN", CONFIG_STR, offsetof(service_config, ds_dsn[1]), NULL, 1, 1024, NULL,
     CONFIG_REQUIRED | CONFIG_SECRET, "libpq URI of database ds_1"},
    {"QUAN_PG_POOL_SIZE", CONFIG_INT, offsetof(service_config, pg_pool_size), "4", 1, 64, NULL, 0,
     "connections (and worker threads) per database"},
    {"QUAN_PG_QUEUE_MAX", CONFIG_INT, offsetof(service_config, pg_queue_max), "1024", 1, 1000000,
     NULL, 0, "queries waiting for a connection before new ones are refused (503)"},
    {"QUAN_PG_STATEMENT_TIMEOUT_MS", CONFIG_INT, offsetof(service_config, pg_statement_timeout_ms),
     "5000", 0, 600000, NULL, 0, "statement_timeout of every connection (0: none)"},
    {"QUAN_REDIS_HOST", CONFIG_STR, offsetof(service_config, redis_host), "127.0.0.1", 1, 255, NULL,
     0, "Redis host"},
    {"QUAN_REDIS_PORT", CONFIG_INT, offsetof(service_config, redis_port), "6379", 1, 65535, NULL, 0,
     "Redis port"},
    {"QUAN_REDIS_PASSWORD", CONFIG_STR, offsetof(service_config, redis_password), "", 0, 256, NULL,
     CONFIG_SECRET, "Redis AUTH password (empty: none)"},
    {"QUAN_REDIS_TIMEOUT_MS", CONFIG_INT, offsetof(service_config, redis_timeout_ms), "1000", 10,
     60000, NULL, 0, "Redis connect and command timeout"},
    {"QUAN_REDIS_CLUSTER_NODES", CONFIG_STR, offsetof(service_config, redis_cluster_nodes), "", 0,
     4096, NULL, 0,
     "Redis Cluster nodes to start from, host:port,host:port (empty: the one server of "
     "QUAN_REDIS_HOST "
     "and QUAN_REDIS_PORT)"},
    {"QUAN_REDIS_SENTINELS", CONFIG_STR, offsetof(service_config, redis_sentinels), "", 0, 4096,
     NULL, 0,
     "Redis Sentinel: the sentinels, host:port,host:port, asked where the master of "
     "QUAN_REDIS_MASTER_NAME is before every connect (with it; not with "
     "QUAN_REDIS_CLUSTER_NODES; empty: no Sentinel)"},
    {"QUAN_REDIS_MASTER_NAME", CONFIG_STR, offsetof(service_config, redis_master_name), "", 0, 127,
     NULL, 0, "Redis Sentinel: the name the sentinels monitor the master under"},
    {"QUAN_LUA_DIR", CONFIG_STR, offsetof(service_config, lua_dir), "lua-scripts", 1, 4096, NULL, 0,
     "directory of the Lua scripts loaded at start"},
    {"QUAN_AMQP_URL", CONFIG_STR, offsetof(service_config, amqp_url),
     "amqp://guest:guest@127.0.0.1:5672/", 1, 4096, NULL, CONFIG_SECRET,
     "RabbitMQ URL, or the comma-separated URLs of a cluster's nodes (tried in turn)",
     mq_conn_urls_check},
    {"QUAN_MQ_QUEUE_TYPE", CONFIG_ENUM, offsetof(service_config, mq_queue_type), "classic", 0, 0,
     mq_conn_queue_types, 0,
     "type of the queues declared: quorum replicates them over a RabbitMQ cluster's nodes"},
    {"QUAN_MQ_SKIP_QUEUES", CONFIG_STR, offsetof(service_config, mq_skip_queues), "", 0, 1024, NULL,
     0,
     "queues of this binary that this process declares but leaves to its other replicas to "
     "consume, comma-separated (e.g. engine.coupon-expire,engine.remind): replicas that only "
     "serve requests"},
    {"QUAN_MQ_PREFETCH", CONFIG_INT, offsetof(service_config, mq_prefetch), "16", 1, 1000, NULL, 0,
     "unacked messages per consumer"},
    {"QUAN_MQ_RETRY_DELAY_MS", CONFIG_INT, offsetof(service_config, mq_retry_delay_ms), "10000", 10,
     3600000, NULL, 0, "delay before a failed message is delivered again"},
    {"QUAN_MQ_MAX_ATTEMPTS", CONFIG_INT, offsetof(service_config, mq_max_attempts), "16", 1, 100,
     NULL, 0, "deliveries before a message goes to the dead-letter queue"},
    {"QUAN_IDS_LEASE_MS", CONFIG_INT, offsetof(service_config, ids_lease_ms), "60000", 5000,
     3600000, NULL, 0,
     "lease of the snowflake worker id in Redis; without it no ids, until Redis is back"},
    {"QUAN_TIMEZONE", CONFIG_STR, offsetof(service_config, timezone), "Asia/Shanghai", 1, 64, NULL,
     0, "zone of \"yyyy-MM-dd HH:mm:ss\" times in the API"},
    {"QUAN_SHUTDOWN_TIMEOUT_S", CONFIG_INT, offsetof(service_config, shutdown_timeout_s), "25", 1,
     600, NULL, 0, "longest drain after SIGTERM before exiting anyway"},
    {"QUAN_LOG_FLUSH_MS", CONFIG_INT, offsetof(service_config, log_flush_ms), "100", 0, 10000, NULL,
     0,
     "info lines (the access log above all) go to stdout at most this late, many per write; "
     "0: each at once (stdout is never waited for either way)"},
    {"QUAN_DEBUG_ROUTES", CONFIG_BOOL, offsetof(service_config, debug_routes), "false", 0, 0, NULL,
     0, "serve /debug/sleep and /debug/redis-ping (tests and benchmarks only)"},
};
static const size_t service_config_nvars =
    sizeof(service_config_vars) / sizeof(service_config_vars[0]);

/* Only in binaries that have SERVICE_ROUTE_NODUP routes. */
static const config_var service_nodup_var = {
    "QUAN_NODUP_WINDOW_MS",
    CONFIG_INT,
    offsetof(service_config, nodup_window_ms),
    "3000",
    0,
    600000,
    NULL,
    0,
    "the same caller posting the same body again within this gets 429"};

#define SERVICE_TICK_MS     50   /* drain progress check */
#define SERVICE_GAUGE_MS    1000 /* pool and connection gauges */
#define SERVICE_IDS_TICK_MS 1000 /* the lease's renewal (a third of it) or re-lease is due */
#define SERVICE_LAG_TICK_MS 20   /* the loop-lag probe (quan_loop_lag_seconds) */

typedef enum { SERVICE_RUNNING, SERVICE_DRAINING, SERVICE_STOPPED } service_state;

struct service {
    const char *name;
    const service_config *cfg;
    unsigned uses;
    service_state state;
    int exit_code;

    struct event_base *base;
    bridge *bridge;
    http_server *http;
    redis_client *redis;
    pgpool *pg[SERVICE_DS_COUNT];
    mq_publisher *pub;
    mq_consumer *consumers[SERVICE_MAX_CONSUMERS];
    size_t nconsumers;
    outbox_relay *relays[SERVICE_DS_COUNT];
    int modules_drained; /* their drain hooks ran (once) */

    ids_gen *ids;
    int ids_worker;
    char ids_token[IDS_TOKEN_LEN];
    int ids_renewing;        /* a renewal or a re-lease is in flight */
    int ids_lost;            /* the lease is gone: lease a worker id again */
    int64_t ids_next_renew;  /* wall ms */
    int64_t ids_lost_logged; /* wall ms of the last "cannot lease" line */

    struct event *sig_term, *sig_int, *sig_hup;
    struct event *tick, *gauges, *ids_timer, *log_timer, *lag_timer;
    double lag_due;       /* now_mono_s() when the lag probe should run */
    double drain_started; /* now_mono_s() */

    /* Set by service_main: the binary, its modules' states (module order) and timers. */
    const service_def *def;
    void **states;
    size_t nmodules;
    struct event **timers;
    size_t ntimers;
    nodup *nd; /* the duplicate-submit guard of SERVICE_ROUTE_NODUP routes */
    pthread_t stopper;
    int stopper_started;
    volatile int consumers_stopped; /* set on the loop thread via the bridge */
    double answered_at;             /* drain seconds when the last request was answered */
};

static void service_drain_modules(service *s);
static void service_free_modules(service *s);

/* A queue of a module's consumer, declared at start. */
typedef struct service_queue {
    const char *name;                /* consumer name: queue quan.<name> (+ .retry, .dead) */
    const char *const *routing_keys; /* NULL-terminated event names bound to it */
} service_queue;

/* QUAN_MQ_SKIP_QUEUES names only queues this binary's modules consume through a handler: a
 * queue a module consumes itself has its own setting (QUAN_CLAIM_CONSUMERS), and a name that
 * matches nothing would silently change nothing. */
static qn_status service_skip_check(const service_def *def, const char *list, char *err,
                                    size_t errlen)
{
    namelist it = namelist_of(list);
    const char *name;
    size_t len;
    while (namelist_next(&it, NAMELIST_EXACT, &name, &len)) {
        const service_consumer *found = NULL;
        if (len == 0) {
            snprintf(err, errlen, "QUAN_MQ_SKIP_QUEUES: an empty name (one comma between names)");
            return QN_EINVAL;
        }
        for (const service_module *const *m = def->modules; *m && !found; m++)
            for (const service_consumer *c = (*m)->consumers; c && c->queue && !found; c++)
                if (strlen(c->queue) == len && !strncmp(name, c->queue, len))
                    found = c;
        if (!found || !found->handler) {
            snprintf(err, errlen, "QUAN_MQ_SKIP_QUEUES: %.*s is %s", (int)len, name,
                     found ? "consumed by its module itself, which has a setting of its own"
                           : "not a queue of this binary");
            return QN_EINVAL;
        }
    }
    return QN_OK;
}

/* What service_configure read: cfg's strings and those of the modules with settings of their own
 * (config_load's copies). */
static void service_unconfigure(const service_def *def, const config_var *vars, size_t nown,
                                void *cfg)
{
    config_free(vars, nown, cfg);
    for (const service_module *const *m = def->modules; *m; m++)
        if ((*m)->settings)
            config_free((*m)->vars, (*m)->nvars, (*m)->settings);
}

/* vars (nvars) are every row, for --help; the first nown of them are read into cfg, and the
 * modules with settings of their own read theirs. */
static void service_configure(int argc, char **argv, const service_def *def, const config_var *vars,
                              size_t nvars, size_t nown, void *cfg)
{
    const service_module *const *m;
    char err[512];

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            config_print_help(stdout, def->name, def->summary, vars, nvars);
            exit(0);
        }
        fprintf(stderr, "%s: unknown argument %s (try --help)\n", def->name, argv[i]);
        exit(2);
    }
    qn_status st = config_load(vars, nown, cfg, err, sizeof(err));
    if (st == QN_OK) {
        char why[256];
        const char *nodes = ((const service_config *)cfg)->redis_cluster_nodes;
        if ((st = redis_sync_nodes_check(nodes, why, sizeof(why))) != QN_OK)
            snprintf(err, sizeof(err), "QUAN_REDIS_CLUSTER_NODES: %s", why);
        else if ((st = rsentinel_check(((const service_config *)cfg)->redis_sentinels,
                                       ((const service_config *)cfg)->redis_master_name, nodes, why,
                                       sizeof(why))) != QN_OK)
            snprintf(err, sizeof(err), "%s", why);
    }
    for (m = def->modules; *m && st == QN_OK; m++)
        if ((*m)->settings)
            st = config_load((*m)->vars, (*m)->nvars, (*m)->settings, err, sizeof(err));
    if (st == QN_OK)
        st = service_skip_check(def, ((const service_config *)cfg)->mq_skip_queues, err,
                                sizeof(err));
    if (st != QN_OK) {
        fprintf(stderr, "%s: configuration error: %s\n", def->name, err);
        service_unconfigure(def, vars, nown, cfg);
        exit(2);
    }
    log_init(def->name, (log_level)((const service_config *)cfg)->log_level);
    config_log(vars, nown, cfg);
    for (m = def->modules; *m; m++)
        if ((*m)->settings)
            config_log((*m)->vars, (*m)->nvars, (*m)->settings);
}

static service *service_new(const char *name, const service_config *cfg, unsigned uses)
{
    service *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->name = name;
    s->cfg = cfg;
    s->uses = uses;
    s->ids_worker = -1;
    return s;
}

/* An outbox relay per database: it needs the databases and the broker too. */
static bool service_runs_relays(const service *s)
{
    unsigned need = SERVICE_USE_OUTBOX | SERVICE_USE_PG | SERVICE_USE_MQ;
    return (s->uses & need) == need;
}

/* ---- readiness and gauges ---- */

/* Redis (scripts loaded), a worker id to make ids with, and a connection to each database, as
 * far as any thread can tell at once. */
static bool service_stores_up(const service *s)
{
    if ((s->uses & SERVICE_USE_REDIS) &&
        (!redis_client_up(s->redis) || (s->ids && !ids_leased(s->ids))))
        return false;
    for (int i = 0; (s->uses & SERVICE_USE_PG) && i < SERVICE_DS_COUNT; i++)
        if (!pgpool_ready(s->pg[i]))
            return false;
    return true;
}

int service_deps_ready(void *arg)
{
    return service_stores_up(arg);
}

static bool service_ready(void *arg)
{
    service *s = arg;
    if (s->state != SERVICE_RUNNING || !service_stores_up(s))
        return false;
    if ((s->uses & SERVICE_USE_MQ) && !mq_publisher_ready(s->pub))
        return false;
    for (size_t i = 0; i < s->nconsumers; i++)
        if (!mq_consumer_ready(s->consumers[i]))
            return false;
    for (size_t i = 0; s->def->modules[i]; i++)
        if (s->def->modules[i]->ready && !s->def->modules[i]->ready(s->states[i]))
            return false;
    return true;
}

static void service_on_gauges(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service *s = arg;
    for (int i = 0; (s->uses & SERVICE_USE_PG) && i < SERVICE_DS_COUNT; i++) {
        int in_use = 0, queued = 0;
        pgpool_stats(s->pg[i], &in_use, &queued);
        metrics_set_l(&metric_quan_pg_pool_in_use, in_use, pgpool_name(s->pg[i]));
        metrics_set_l(&metric_quan_pg_pool_queue, queued, pgpool_name(s->pg[i]));
    }
    if (s->uses & SERVICE_USE_REDIS)
        metrics_set(&metric_quan_redis_connected, redis_client_connected(s->redis) ? 1 : 0);
    /* What /readyz would answer, for alerting: a scrape of a process that is up but not ready
     * shows it without a probe of its own. */
    metrics_set(&metric_quan_ready, service_ready(s) ? 1 : 0);
}

/* ---- snowflake worker-id lease: claimed at start, renewed on the loop, leased again after it
 * was lost (Redis down past the lease, or Redis lost the key): the process never needs a
 * restart to issue ids again ---- */

static int64_t service_lease_deadline(const service *s, int64_t sent)
{
    return sent + s->cfg->ids_lease_ms - IDS_MAX_AHEAD_MS;
}

static qn_status service_claim_worker(service *s)
{
    qn_status st = QN_ERR;
    redis_sync *rs = service_redis_sync_new(s->cfg, 0);
    if (!rs)
        return QN_ENOMEM;
    if (redis_sync_open(rs) != QN_OK) {
        log_error(NULL, "redis: cannot connect to lease a worker id: %s", redis_sync_errstr(rs));
        redis_sync_free(rs);
        return QN_ERR;
    }
    int64_t sent = now_wall_ms();
    st = ids_worker_claim_sync(rs, NULL, s->cfg->ids_lease_ms, &s->ids_worker, s->ids_token);
    if (st != QN_OK)
        log_error(NULL, "cannot lease a snowflake worker id: %s (%s)", qn_status_str(st),
                  redis_sync_errstr(rs));
    redis_sync_free(rs);
    if (st != QN_OK)
        return st;
    s->ids = ids_new(s->ids_worker);
    if (!s->ids)
        return QN_ENOMEM;
    ids_set_lease_deadline(s->ids, service_lease_deadline(s, sent));
    s->ids_next_renew = sent + s->cfg->ids_lease_ms / 3;
    log_infof(NULL, ((log_field[]){LOG_I("worker", s->ids_worker), LOG_END}),
              "snowflake worker id leased");
    return QN_OK;
}

/* One renewal or re-lease in flight. A re-lease tries SET NX PX on worker ids from a random
 * one on, as the claim at start does, one command at a time on the loop's client. */
typedef struct service_lease_op {
    service *s;
    int64_t sent;
    char token[IDS_TOKEN_LEN];
    int first, tried, worker;
} service_lease_op;

static void service_lease_op_end(service_lease_op *op, int64_t retry_in_ms)
{
    service *s = op->s;
    s->ids_renewing = 0;
    if (retry_in_ms >= 0)
        s->ids_next_renew = now_wall_ms() + retry_in_ms;
    free(op);
}

static qn_status service_send_claim(service_lease_op *op);

static void service_on_claimed(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    service_lease_op *op = arg;
    service *s = op->s;
    if (reply && reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0) {
        if (ids_set_worker(s->ids, op->worker) != QN_OK) {
            service_lease_op_end(op, SERVICE_IDS_TICK_MS);
            return;
        }
        s->ids_worker = op->worker;
        memcpy(s->ids_token, op->token, IDS_TOKEN_LEN);
        ids_set_lease_deadline(s->ids, service_lease_deadline(s, op->sent));
        s->ids_lost = 0;
        log_infof(NULL, ((log_field[]){LOG_I("worker", op->worker), LOG_END}),
                  "snowflake worker id leased again; ids resume");
        s->ids_next_renew = op->sent + s->cfg->ids_lease_ms / 3;
        service_lease_op_end(op, -1);
        return;
    }
    if (reply && reply->type == REDIS_REPLY_NIL && ++op->tried <= IDS_MAX_WORKER) {
        if (service_send_claim(op) != QN_OK)
            service_lease_op_end(op, SERVICE_IDS_TICK_MS);
        return;
    }
    /* All 1024 taken, or Redis failed: again at a later tick. */
    if (now_wall_ms() - s->ids_lost_logged >= 10000) {
        s->ids_lost_logged = now_wall_ms();
        log_error(NULL, "cannot lease a snowflake worker id again: %s",
                  err ? err
                      : (reply && reply->type == REDIS_REPLY_NIL ? "all taken" : "bad reply"));
    }
    service_lease_op_end(op, SERVICE_IDS_TICK_MS);
}

static qn_status service_send_claim(service_lease_op *op)
{
    char key[64], ttl[32];
    op->worker = (op->first + op->tried) % (IDS_MAX_WORKER + 1);
    op->sent = now_wall_ms();
    snprintf(key, sizeof(key), "%s%d", IDS_DEFAULT_PREFIX, op->worker);
    snprintf(ttl, sizeof(ttl), "%" PRId64, op->s->cfg->ids_lease_ms);
    const char *argv[] = {"SET", key, op->token, "NX", "PX", ttl};
    return redis_command_argv(op->s->redis, service_on_claimed, op, 6, argv, NULL);
}

static void service_on_renewed(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    service_lease_op *op = arg;
    service *s = op->s;
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
        ids_set_lease_deadline(s->ids, service_lease_deadline(s, op->sent));
        s->ids_next_renew = op->sent + s->cfg->ids_lease_ms / 3;
        service_lease_op_end(op, -1);
    } else if (reply && reply->type == REDIS_REPLY_INTEGER) {
        /* Lost (it expired while Redis was away, or Redis lost it): the generator stops at the
         * old deadline, so no duplicate can be issued; a new worker id is leased at once. */
        log_warn(NULL, "snowflake worker id lease lost; leasing another");
        s->ids_lost = 1;
        service_lease_op_end(op, 0);
    } else {
        log_warn(NULL, "snowflake worker id renewal failed: %s", err ? err : "unexpected reply");
        service_lease_op_end(op, SERVICE_IDS_TICK_MS);
    }
}

/* Every tick: renew when a third of the lease has passed (or a failed renewal is to be tried
 * again), lease anew when it was lost. Nothing while Redis is away: the lease runs out by
 * itself, and the first tick after the reconnect renews it or finds it lost. */
static void service_on_ids_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service *s = arg;
    int64_t now = now_wall_ms();
    if (s->ids_renewing || !redis_client_connected(s->redis) ||
        (now < s->ids_next_renew && ids_leased(s->ids)))
        return;
    service_lease_op *op = calloc(1, sizeof(*op));
    if (!op)
        return;
    op->s = s;
    op->sent = now;
    s->ids_renewing = 1;
    qn_status st;
    if (s->ids_lost) {
        st = ids_claim_token(op->token, &op->first);
        if (st == QN_OK)
            st = service_send_claim(op);
    } else {
        char key[64], ttl[32];
        snprintf(key, sizeof(key), "%s%d", IDS_DEFAULT_PREFIX, s->ids_worker);
        snprintf(ttl, sizeof(ttl), "%" PRId64, s->cfg->ids_lease_ms);
        const char *keys[] = {key}, *args[] = {s->ids_token, ttl};
        st = REDIS_EVAL(s->redis, lock_renew, keys, args, service_on_renewed, op);
    }
    if (st != QN_OK)
        service_lease_op_end(op, SERVICE_IDS_TICK_MS);
}

/* ---- debug routes (QUAN_DEBUG_ROUTES): a request that stays in flight, for drain tests, and
 * the smallest request answered from Redis through the async path, for benchmarks ---- */

typedef struct {
    http_req *req;
    struct event *ev;
} service_sleep;

static void service_on_slept(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service_sleep *sl = arg;
    http_reply_ok(sl->req, cJSON_CreateString("slept"));
    event_free(sl->ev);
    free(sl);
}

static void service_debug_sleep(http_req *req, void *arg)
{
    service *s = arg;
    int64_t ms = 0;
    if (http_param_i64(req, "ms", &ms) != QN_OK || ms < 0 || ms > 60000) {
        http_reply_error(req, ERRCODE_INVALID, "ms: must be an integer between 0 and 60000");
        return;
    }
    service_sleep *sl = calloc(1, sizeof(*sl));
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!sl || !(sl->ev = evtimer_new(s->base, service_on_slept, sl)) || evtimer_add(sl->ev, &tv)) {
        if (sl && sl->ev)
            event_free(sl->ev);
        free(sl);
        http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    sl->req = req;
}

static void service_on_pong(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    http_req *req = arg;
    if (!reply || reply->type != REDIS_REPLY_STATUS) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "redis: %s", err ? err : "unexpected reply");
        return;
    }
    http_reply_ok(req, cJSON_CreateString(reply->str));
}

static void service_debug_redis_ping(http_req *req, void *arg)
{
    service *s = arg;
    if (!s->redis || redis_command(s->redis, service_on_pong, req, "PING") != QN_OK)
        http_reply_error(req, ERRCODE_UNAVAILABLE, "redis unavailable");
}

static qn_status service_add_debug_routes(service *s)
{
    qn_status st = http_route(s->http, HTTP_GET, "/debug/sleep", service_debug_sleep, s, 0);
    if (st == QN_OK)
        st = http_route(s->http, HTTP_GET, "/debug/redis-ping", service_debug_redis_ping, s, 0);
    return st;
}

/* ---- start ---- */

static qn_status service_add_timer(service *s, struct event **ev, int ms, event_callback_fn fn)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    *ev = event_new(s->base, -1, EV_PERSIST, fn, s);
    if (!*ev || event_add(*ev, &tv) != 0)
        return QN_ERR;
    return QN_OK;
}

static void service_on_signal(evutil_socket_t sig, short what, void *arg);

/* The loop-lag probe: a timer re-armed each time it runs. How late it runs is what any event
 * due then waited: other callbacks of the loop, or the thread waiting for a core. */
static void service_on_lag_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service *s = arg;
    double now = now_mono_s();
    struct timeval tv = {0, SERVICE_LAG_TICK_MS * 1000};
    metrics_observe(&metric_quan_loop_lag_seconds, now > s->lag_due ? now - s->lag_due : 0);
    s->lag_due = now + SERVICE_LAG_TICK_MS / 1000.0;
    if (evtimer_add(s->lag_timer, &tv) != 0)
        log_warn(NULL, "the loop-lag probe stopped: cannot re-arm its timer");
}

static void service_on_log_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    log_flush();
}

/* epoll with libevent's change list: the changes an iteration makes to one descriptor (a
 * request read, so reading is switched off and writing on; the answer written, and back) reach
 * the kernel as one epoll_ctl when the iteration ends, not one each. */
static struct event_base *service_base_new(void)
{
    struct event_config *ec = event_config_new();
    struct event_base *base = NULL;
    if (!ec)
        return NULL;
    if (event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST) == 0)
        base = event_base_new_with_config(ec);
    event_config_free(ec);
    return base;
}

/* Every metric of the binary: the shell's and HTTP's, the publisher's and the relays' when it
 * runs them, then each module's, in the binary's order (the render's). Before anything of the
 * binary starts, so that a scrape never misses one. */
static void service_register_metrics(const service *s)
{
    static metrics_family *const shell[] = {METRICS_REFS(SERVICE_METRICS) METRICS_REFS(HTTP_METRICS)
                                                NULL};
    static metrics_family *const publisher[] = {METRICS_REFS(MQ_PUBLISH_METRICS) NULL};
    static metrics_family *const relays[] = {METRICS_REFS(OUTBOX_METRICS) NULL};

    metrics_register(shell);
    if (s->uses & SERVICE_USE_MQ)
        metrics_register(publisher);
    if (service_runs_relays(s))
        metrics_register(relays);
    for (size_t i = 0; s->def->modules[i]; i++)
        metrics_register(s->def->modules[i]->metrics);
}

static qn_status service_start(service *s)
{
    const service_config *cfg = s->cfg;
    qn_status st = QN_ERR;

    char zerr[256];
    if (jsonin_zone_init(cfg->timezone, zerr, sizeof(zerr)) != QN_OK) {
        log_error(NULL, "QUAN_TIMEZONE: %s", zerr);
        return QN_EINVAL;
    }
    metrics_init(s->name, SERVICE_VERSION);
    service_register_metrics(s);
    /* No evthread_use_pthreads: only the loop thread touches the base, its events and its
     * evbuffers (other threads hand work back through the bridge, an eventfd with its own
     * mutex, and fill an evbuffer only while the loop leaves it alone), so libevent's locks on
     * every buffer and event operation would be paid for nothing. */
    s->base = service_base_new();
    if (!s->base)
        goto fail;
    s->bridge = bridge_new(s->base);
    if (!s->bridge)
        goto fail;

    log_buffer_start(cfg->log_flush_ms == 0);
    if (cfg->log_flush_ms > 0 &&
        service_add_timer(s, &s->log_timer, (int)cfg->log_flush_ms, service_on_log_flush))
        goto fail;

    /* Signals are events on the loop: the handlers run as ordinary callbacks. */
    signal(SIGPIPE, SIG_IGN);
    s->sig_term = evsignal_new(s->base, SIGTERM, service_on_signal, s);
    s->sig_int = evsignal_new(s->base, SIGINT, service_on_signal, s);
    s->sig_hup = evsignal_new(s->base, SIGHUP, service_on_signal, s);
    if (!s->sig_term || !s->sig_int || !s->sig_hup || evsignal_add(s->sig_term, NULL) ||
        evsignal_add(s->sig_int, NULL) || evsignal_add(s->sig_hup, NULL))
        goto fail;

    if (s->uses & SERVICE_USE_REDIS) {
        redis_opts ro = service_redis_opts(cfg);
        ro.lua_dir = cfg->lua_dir;
        s->redis = redis_client_new(s->base, &ro);
        if (!s->redis) {
            log_error(NULL, "redis: cannot create the client (scripts in %s?)", cfg->lua_dir);
            goto fail;
        }
        char why[160];
        if (redis_scripts_check(redis_client_scripts(s->redis), why, sizeof(why)) != QN_OK) {
            log_errorf(NULL, ((log_field[]){LOG_S("dir", cfg->lua_dir), LOG_END}), "%s", why);
            goto fail;
        }
        st = service_claim_worker(s);
        if (st != QN_OK)
            goto fail;
        if (service_add_timer(s, &s->ids_timer, SERVICE_IDS_TICK_MS, service_on_ids_timer))
            goto fail;
    }

    /* The relays first: every pool's commit hook wakes its database's relay. */
    if (service_runs_relays(s)) {
        for (int i = 0; i < SERVICE_DS_COUNT; i++) {
            char ds[16];
            snprintf(ds, sizeof(ds), "ds_%d", i);
            outbox_relay_opts oo = {.dsn = cfg->ds_dsn[i], .ds = ds, .amqp_url = cfg->amqp_url};
            s->relays[i] = outbox_relay_start(&oo);
            if (!s->relays[i]) {
                log_error(NULL, "%s: cannot start the outbox relay", ds);
                goto fail;
            }
        }
    }

    if (s->uses & SERVICE_USE_PG) {
        for (int i = 0; i < SERVICE_DS_COUNT; i++) {
            char name[16], app[64];
            snprintf(name, sizeof(name), "ds_%d", i);
            snprintf(app, sizeof(app), "%s", s->name);
            pgpool_opts po = {.dsn = cfg->ds_dsn[i],
                              .name = name,
                              .application_name = app,
                              .size = (int)cfg->pg_pool_size,
                              .queue_cap = (int)cfg->pg_queue_max,
                              .statement_timeout_ms = (int)cfg->pg_statement_timeout_ms};
            service_pg_commit_hook(s, i, &po);
            s->pg[i] = pgpool_new(s->base, s->bridge, &po);
            if (!s->pg[i]) {
                log_error(NULL, "%s: cannot create the PostgreSQL pool", name);
                goto fail;
            }
            /* Fixed for the process's life: set once, not with the 1 s gauges. */
            metrics_set_l(&metric_quan_pg_pool_size, pgpool_size(s->pg[i]), name);
        }
    }

    if (s->uses & SERVICE_USE_MQ) {
        mq_publisher_opts mo = {.url = cfg->amqp_url, .bridge = s->bridge, .name = s->name};
        s->pub = mq_publisher_new(&mo);
        if (!s->pub) {
            log_error(NULL, "rabbitmq: cannot create the publisher");
            goto fail;
        }
    }

    http_server_opts ho = {.bind_addr = cfg->http_bind,
                           .port = (uint16_t)cfg->http_port,
                           .max_body_bytes = (size_t)cfg->http_max_body,
                           .idle_timeout_s = (int)cfg->http_idle_timeout_s,
                           .request_timeout_ms = (int)cfg->http_request_timeout_ms,
                           .user_id_header = cfg->header_user_id,
                           .shop_header = cfg->header_shop_number,
                           .username_header = cfg->header_username,
                           .service = s->name};
    s->http = http_server_new(s->base, &ho);
    if (!s->http)
        goto fail;
    http_server_set_ready_cb(s->http, service_ready, s);
    if (cfg->debug_routes && service_add_debug_routes(s) != QN_OK)
        goto fail;
    if (service_add_timer(s, &s->gauges, SERVICE_GAUGE_MS, service_on_gauges))
        goto fail;
    struct timeval lag_tick = {0, SERVICE_LAG_TICK_MS * 1000};
    s->lag_due = now_mono_s() + SERVICE_LAG_TICK_MS / 1000.0;
    if (!(s->lag_timer = evtimer_new(s->base, service_on_lag_tick, s)) ||
        evtimer_add(s->lag_timer, &lag_tick) != 0)
        goto fail;
    return QN_OK;
fail:
    return st != QN_OK ? st : QN_ERR;
}

static qn_status service_declare_queues(service *s, const service_queue *queues, size_t n)
{
    qn_status st = QN_OK;
    char err[MQ_CONN_ERR_MAX];
    mq_conn *c =
        mq_conn_connect(s->cfg->amqp_url, &(mq_conn_opts){.name = s->name, .confirm = 1}, err);
    if (!c || !mq_conn_ok(c)) {
        /* the reason of the connect itself (a refused certificate, a login): the operator's fix */
        log_error(NULL, "rabbitmq: cannot connect to declare queues: %s",
                  c ? mq_conn_errstr(c) : err);
        st = QN_ERR;
        goto done;
    }
    for (size_t i = 0; i < n && st == QN_OK; i++) {
        st = mq_conn_declare_consumer(c, queues[i].name, queues[i].routing_keys,
                                      (int)s->cfg->mq_retry_delay_ms,
                                      (mq_conn_queue_type)s->cfg->mq_queue_type);
        if (st != QN_OK)
            log_error(NULL, "rabbitmq: cannot declare queue quan.%s: %s", queues[i].name,
                      mq_conn_errstr(c));
    }
done:
    mq_conn_close(c);
    return st;
}

void service_pg_commit_hook(const service *s, int ds, pgpool_opts *po)
{
    bool has = ds >= 0 && ds < SERVICE_DS_COUNT && s->relays[ds];
    po->on_commit = has ? outbox_relay_on_commit : NULL;
    po->on_commit_arg = has ? s->relays[ds] : NULL;
}

mq_consumer_opts service_consumer_opts(const service *s, const service_consumer *c)
{
    const service_config *cfg = s->cfg;
    return (mq_consumer_opts){.url = cfg->amqp_url,
                              .name = c->queue,
                              .routing_keys = c->routing_keys,
                              .prefetch = (int)cfg->mq_prefetch,
                              .retry_delay_ms = (int)cfg->mq_retry_delay_ms,
                              .max_attempts = (int)cfg->mq_max_attempts,
                              .queue_type = (mq_conn_queue_type)cfg->mq_queue_type,
                              .handler = c->handler,
                              .deps_ready = service_deps_ready,
                              .deps_arg = (void *)s};
}

static qn_status service_add_consumer(service *s, const service_consumer *c, void *arg)
{
    if (s->nconsumers >= SERVICE_MAX_CONSUMERS)
        return QN_EBUSY;
    mq_consumer_opts co = service_consumer_opts(s, c);
    co.arg = arg;
    mq_consumer *mc = mq_consumer_start(&co);
    if (!mc)
        return QN_ERR;
    s->consumers[s->nconsumers++] = mc;
    return QN_OK;
}

/* ---- drain ---- */

static void service_on_consumers_stopped(void *arg)
{
    service *s = arg;
    s->consumers_stopped = 1;
}

/* mq_consumer_stop waits for the message in hand, so it runs off the loop thread: the loop
 * keeps answering in-flight requests meanwhile. */
static void service_stop_workers(service *s)
{
    /* All stop taking messages at once; then each finishes the one in hand. */
    for (size_t i = 0; i < s->nconsumers; i++)
        mq_consumer_quit(s->consumers[i]);
    for (size_t i = 0; i < s->nconsumers; i++)
        mq_consumer_stop(s->consumers[i]);
    if (!s->modules_drained) {
        s->modules_drained = 1;
        service_drain_modules(s);
    }
}

static void *service_stopper_main(void *arg)
{
    service *s = arg;
    service_stop_workers(s);
    if (bridge_post(s->bridge, service_on_consumers_stopped, s) != QN_OK)
        s->consumers_stopped = 1;
    return NULL;
}

static void service_on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service *s = arg;
    double waited = now_mono_s() - s->drain_started;
    size_t inflight = http_server_inflight(s->http);
    if (inflight == 0 && s->consumers_stopped && !s->answered_at)
        s->answered_at = waited;
    /* Then let the last replies leave the output buffers (bounded: libevent does not report
     * a write that failed). */
    int flushed = http_server_unsent(s->http) == 0 || waited - s->answered_at > 2.0;
    if (s->answered_at && flushed) {
        log_infof(NULL, ((log_field[]){LOG_I("drain_ms", (int64_t)(waited * 1000)), LOG_END}),
                  "drained; exiting");
        s->exit_code = 0;
        event_base_loopexit(s->base, NULL);
    } else if (waited > (double)s->cfg->shutdown_timeout_s) {
        log_warnf(NULL,
                  ((log_field[]){LOG_I("inflight", inflight),
                                 LOG_I("consumers_stopped", s->consumers_stopped), LOG_END}),
                  "drain timed out; exiting anyway");
        s->exit_code = 1;
        event_base_loopexit(s->base, NULL);
    }
}

static void service_begin_drain(service *s)
{
    s->state = SERVICE_DRAINING;
    s->drain_started = now_mono_s();
    http_server_stop_accepting(s->http);
    if ((s->nconsumers > 0 || s->nmodules > 0) &&
        pthread_create(&s->stopper, NULL, service_stopper_main, s) == 0) {
        s->stopper_started = 1;
    } else {
        service_stop_workers(s);
        s->consumers_stopped = 1;
    }
    if (service_add_timer(s, &s->tick, SERVICE_TICK_MS, service_on_tick) != QN_OK)
        event_base_loopexit(s->base, NULL);
}

static void service_on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    service *s = arg;
    if (sig == SIGHUP) {
        log_info(NULL, "SIGHUP ignored: configuration is read at start only");
        return;
    }
    if (s->state == SERVICE_DRAINING) {
        log_warn(NULL, "second signal: exiting at once");
        _exit(1);
    }
    log_infof(NULL,
              ((log_field[]){LOG_S("signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"),
                             LOG_I("inflight", http_server_inflight(s->http)), LOG_END}),
              "shutting down: draining requests and consumers");
    service_begin_drain(s);
}

static int service_run(service *s)
{
    if (http_server_listen(s->http) != QN_OK)
        return 1;
    log_infof(NULL,
              ((log_field[]){LOG_S("bind", s->cfg->http_bind),
                             LOG_I("port", http_server_port(s->http)), LOG_END}),
              "%s listening", s->name);
    event_base_dispatch(s->base);
    log_flush();
    s->state = SERVICE_STOPPED;
    return s->exit_code;
}

/* ---- teardown ---- */

static void service_free(service *s)
{
    if (!s)
        return;
    if (s->stopper_started)
        pthread_join(s->stopper, NULL);
    else if (!s->consumers_stopped)
        service_stop_workers(s);
    /* Requests still answered by callbacks are failed by their modules during teardown. */
    http_server_free(s->http);
    mq_publisher_free(s->pub);
    for (int i = 0; i < SERVICE_DS_COUNT; i++)
        pgpool_free(s->pg[i]);
    for (int i = 0; i < SERVICE_DS_COUNT; i++) /* after the pools: their commits wake them */
        if (s->relays[i])
            outbox_relay_stop(s->relays[i]);
    if (s->ids && s->redis) {
        redis_sync *rs = service_redis_sync_new(s->cfg, 0);
        if (rs && redis_sync_open(rs) == QN_OK &&
            ids_worker_release_sync(rs, redis_client_scripts(s->redis), NULL, s->ids_worker,
                                    s->ids_token) != QN_OK)
            log_warn(NULL, "could not release the snowflake worker id");
        redis_sync_free(rs);
    }
    redis_client_free(s->redis);
    nodup_free(s->nd); /* after the client: its pending replies reach the guard */
    ids_free(s->ids);
    struct event *evs[] = {s->sig_term, s->sig_int,   s->sig_hup,   s->tick,
                           s->gauges,   s->ids_timer, s->log_timer, s->lag_timer};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            event_free(evs[i]);
    bridge_free(s->bridge);
    service_free_modules(s);
    if (s->base)
        event_base_free(s->base);
    metrics_shutdown();
    log_buffer_stop();
    free(s);
}

struct event_base *service_base(const service *s)
{
    return s->base;
}
http_server *service_http(const service *s)
{
    return s->http;
}
redis_client *service_redis(const service *s)
{
    return s->redis;
}
pgpool *service_pg(const service *s, int ds)
{
    return ds >= 0 && ds < SERVICE_DS_COUNT ? s->pg[ds] : NULL;
}
mq_publisher *service_publisher(const service *s)
{
    return s->pub;
}
bridge *service_bridge(const service *s)
{
    return s->bridge;
}
ids_gen *service_ids(const service *s)
{
    return s->ids;
}
redis_opts service_redis_opts(const service_config *cfg)
{
    redis_opts ro = {.host = cfg->redis_host,
                     .port = (int)cfg->redis_port,
                     .password = cfg->redis_password,
                     .connect_timeout_ms = (int)cfg->redis_timeout_ms,
                     .command_timeout_ms = (int)cfg->redis_timeout_ms,
                     .cluster_nodes = cfg->redis_cluster_nodes,
                     .sentinels = cfg->redis_sentinels,
                     .master_name = cfg->redis_master_name};
    return ro;
}

redis_sync *service_redis_sync_new(const service_config *cfg, int timeout_ms)
{
    redis_sync_opts o = {.host = cfg->redis_host,
                         .port = (int)cfg->redis_port,
                         .password = cfg->redis_password,
                         .timeout_ms = timeout_ms > 0 ? timeout_ms : (int)cfg->redis_timeout_ms,
                         .cluster_nodes = cfg->redis_cluster_nodes,
                         .sentinels = cfg->redis_sentinels,
                         .master_name = cfg->redis_master_name};
    return redis_sync_new(&o);
}

void *service_module_state(const service *s, const service_module *m)
{
    for (size_t i = 0; s->def && i < s->nmodules; i++)
        if (s->def->modules[i] == m)
            return s->states[i];
    return NULL;
}

const service_config *service_cfg(const service *s)
{
    return s->cfg;
}

/* ---- service_main: a binary as the list of its modules ---- */

typedef struct service_tick {
    void (*fn)(void *state);
    void *state;
} service_tick;

static void service_on_module_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    service_tick *t = arg;
    t->fn(t->state);
}

/* The common rows then every module's, the port default set to the binary's own. Owned. */
static bool service_has_nodup_routes(const service_def *def)
{
    for (const service_module *const *m = def->modules; *m; m++)
        for (const service_route *r = (*m)->routes; r && r->path; r++)
            if (r->flags & SERVICE_ROUTE_NODUP)
                return true;
    return false;
}

/* *nown: how many of them, first, are read into the binary's config struct (the rest are the
 * rows of modules with settings of their own, after them in module order). */
static config_var *service_vars(const service_def *def, size_t *n, size_t *nown)
{
    bool with_nodup = service_has_nodup_routes(def);
    size_t total = service_config_nvars + (with_nodup ? 1 : 0);
    for (const service_module *const *m = def->modules; *m; m++)
        total += (*m)->nvars;
    config_var *vars = calloc(total, sizeof(*vars));
    if (!vars)
        return NULL;
    memcpy(vars, service_config_vars, sizeof(service_config_vars));
    size_t k = service_config_nvars;
    if (with_nodup)
        vars[k++] = service_nodup_var;
    for (int own = 0; own < 2; own++) {
        if (own)
            *nown = k;
        for (const service_module *const *m = def->modules; *m; m++)
            if (((*m)->settings != NULL) == own)
                for (size_t i = 0; i < (*m)->nvars; i++)
                    vars[k++] = (*m)->vars[i];
    }
    for (size_t i = 0; i < total; i++)
        if (strcmp(vars[i].name, "QUAN_HTTP_PORT") == 0)
            vars[i].def = def->http_port;
    *n = total;
    return vars;
}

static qn_status service_declare_module_queues(service *s)
{
    size_t n = 0;
    for (const service_module *const *m = s->def->modules; *m; m++)
        for (const service_consumer *c = (*m)->consumers; c && c->queue; c++)
            n++;
    if (n == 0)
        return QN_OK;
    service_queue *qs = calloc(n, sizeof(*qs));
    if (!qs)
        return QN_ENOMEM;
    size_t k = 0;
    for (const service_module *const *m = s->def->modules; *m; m++)
        for (const service_consumer *c = (*m)->consumers; c && c->queue; c++)
            qs[k++] = (service_queue){c->queue, c->routing_keys};
    qn_status st = service_declare_queues(s, qs, n);
    free(qs);
    return st;
}

static void service_drain_modules(service *s)
{
    for (size_t i = 0; i < s->nmodules; i++)
        if (s->def->modules[i]->drain)
            s->def->modules[i]->drain(s->states[i]);
}

static void service_free_modules(service *s)
{
    for (size_t i = 0; i < s->ntimers; i++)
        if (s->timers[i]) {
            service_tick *t = event_get_callback_arg(s->timers[i]);
            event_free(s->timers[i]);
            free(t);
        }
    free(s->timers);
    for (size_t i = s->nmodules; i-- > 0;)
        if (s->def->modules[i]->free)
            s->def->modules[i]->free(s->states[i]);
    free(s->states);
}

/* Each module's start, then its routes, consumers and timers. */
static qn_status service_start_modules(service *s)
{
    const char *cfg = (const char *)s->cfg;
    size_t n = 0, ntimers = 0;
    for (const service_module *const *m = s->def->modules; *m; m++, n++)
        for (const service_timer *t = (*m)->timers; t && t->name; t++)
            ntimers++;
    s->states = calloc(n ? n : 1, sizeof(*s->states));
    s->timers = calloc(ntimers ? ntimers : 1, sizeof(*s->timers));
    if (!s->states || !s->timers)
        return QN_ENOMEM;
    if (service_has_nodup_routes(s->def)) {
        /* In flight, a key lives as long as a request may (then the window after it). */
        int64_t window = s->cfg->nodup_window_ms;
        s->nd = nodup_new(s->redis, window, s->cfg->http_request_timeout_ms + window);
        if (!s->nd)
            return QN_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const service_module *m = s->def->modules[i];
        qn_status st = m->start ? m->start(s, &s->states[i]) : QN_OK;
        s->nmodules = i + 1; /* its free hook runs even if its start failed */
        if (st != QN_OK) {
            log_error(NULL, "module %s: cannot start: %s", m->name, qn_status_str(st));
            return st;
        }
        void *state = s->states[i];
        for (const service_route *r = m->routes; r && r->path; r++) {
            unsigned flags = r->flags & ~SERVICE_ROUTE_NODUP;
            st = (r->flags & SERVICE_ROUTE_NODUP)
                     ? nodup_route(s->nd, s->http, r->method, r->path, r->handler, state, flags)
                     : http_route(s->http, r->method, r->path, r->handler, state, flags);
            if (st != QN_OK)
                return st;
        }
        for (const service_consumer *c = m->consumers; c && c->queue; c++) {
            if (!c->handler)
                continue; /* the module consumes it itself */
            if (namelist_has(s->cfg->mq_skip_queues, c->queue)) {
                log_info(NULL, "mq: %s is declared, left to other replicas (QUAN_MQ_SKIP_QUEUES)",
                         c->queue);
                continue;
            }
            if ((st = service_add_consumer(s, c, state)) != QN_OK)
                return st;
        }
        for (const service_timer *t = m->timers; t && t->name; t++) {
            const char *base = m->settings ? (const char *)m->settings : cfg;
            int64_t ms = *(const int64_t *)(base + t->interval_offset);
            if (ms <= 0)
                continue; /* a setting of 0 turns the timer off */
            struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
            service_tick *tick = malloc(sizeof(*tick));
            if (!tick)
                return QN_ENOMEM;
            *tick = (service_tick){t->fn, state};
            struct event *ev = event_new(s->base, -1, EV_PERSIST, service_on_module_timer, tick);
            if (!ev || event_add(ev, &tv) != 0) {
                if (ev)
                    event_free(ev);
                free(tick);
                return QN_ERR;
            }
            s->timers[s->ntimers++] = ev;
        }
    }
    return QN_OK;
}

int service_main(const service_def *def, int argc, char **argv)
{
    int rc = 1;
    size_t nvars = 0, nown = 0;
    service *s = NULL;
    config_var *vars = service_vars(def, &nvars, &nown);
    void *cfg = calloc(1, def->config_size);
    if (!vars || !cfg) {
        fprintf(stderr, "%s: out of memory\n", def->name);
        goto done;
    }
    service_configure(argc, argv, def, vars, nvars, nown, cfg);
    s = service_new(def->name, (const service_config *)cfg, def->uses);
    if (!s)
        goto done;
    s->def = def;
    if (service_start(s) != QN_OK || service_declare_module_queues(s) != QN_OK ||
        service_start_modules(s) != QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    if (cfg)
        service_unconfigure(def, vars, nown, cfg);
    free(cfg);
    free(vars);
    return rc;
}
