/*
 * The shell every Quan binary runs in: configuration (the common rows of the env table),
 * the event loop, signals handled on the loop (pgbouncer), the HTTP server with /livez,
 * /readyz and /metrics, the Redis client with its scripts, one PostgreSQL pool per data
 * source, the RabbitMQ publisher and consumers, the binary's modules, and the drain on SIGTERM:
 *
 *   1st SIGTERM/SIGINT: /readyz answers 503, the listener closes (new connections are
 *   refused), consumers stop taking messages and finish the one in hand, in-flight requests
 *   complete; then connections close and the process exits 0 (1 if the drain outlived
 *   QUAN_SHUTDOWN_TIMEOUT_S). A second signal exits at once.
 */
#ifndef QUAN_SERVICE_H
#define QUAN_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "bridge.h"
#include "config.h"
#include "http.h"
#include "ids.h"
#include "metrics.h"
#include "mq.h"
#include "outbox.h"
#include "pgpool.h"
#include "redis.h"
#include "redis_sync.h"
#include "status.h"

#define SERVICE_DS_COUNT      2 /* ds_0 and ds_1 */
#define SERVICE_MAX_CONSUMERS 16
#define SERVICE_VERSION       "0.1.0"

/* The settings every binary shares (their rows are in service.c); each binary's config struct
 * starts with this struct, so the rows' offsets apply to it unchanged. */
typedef struct service_config {
    const char *http_bind;
    int64_t http_port;
    int64_t http_max_body;
    int64_t http_idle_timeout_s;
    int64_t http_request_timeout_ms;
    const char *header_user_id;
    const char *header_shop_number;
    const char *header_username;
    int log_level;
    int64_t log_flush_ms;
    const char *ds_dsn[SERVICE_DS_COUNT];
    int64_t pg_pool_size;
    int64_t pg_queue_max;
    int64_t pg_statement_timeout_ms;
    const char *redis_host;
    int64_t redis_port;
    const char *redis_password;
    int64_t redis_timeout_ms;
    const char *redis_cluster_nodes; /* "" : the one server of redis_host/redis_port */
    const char *redis_sentinels;     /* "" : no Sentinel; else with redis_master_name */
    const char *redis_master_name;
    const char *lua_dir;
    const char *amqp_url;
    int64_t mq_prefetch;
    int64_t mq_retry_delay_ms;
    int64_t mq_max_attempts;
    int mq_queue_type;          /* mq_conn_queue_type */
    const char *mq_skip_queues; /* "": this process consumes every queue of its modules */
    int64_t ids_lease_ms;
    const char *timezone;
    int64_t shutdown_timeout_s;
    int debug_routes;
    int64_t nodup_window_ms; /* binaries with SERVICE_ROUTE_NODUP routes only */
} service_config;

/* What a binary needs started; /readyz waits for exactly these. */
enum {
    SERVICE_USE_PG = 1 << 0,
    SERVICE_USE_REDIS = 1 << 1,
    SERVICE_USE_MQ = 1 << 2,     /* the publisher (consumers come with the modules) */
    SERVICE_USE_OUTBOX = 1 << 3, /* an outbox relay per database (needs PG and MQ) */
};

typedef struct service service;

/* ---- modules: a binary is the list of its modules (main.c) ---- */

/* A route of a module. The handler gets the module's state (its start hook's) as arg. */
typedef struct service_route {
    int method;       /* HTTP_GET, HTTP_POST */
    const char *path; /* exactly as served, e.g. "/api/engine/user-coupon/redeem" */
    http_handler handler;
    unsigned flags; /* HTTP_NEED_USER, HTTP_NEED_SHOP, SERVICE_ROUTE_NODUP */
} service_route;

/* The route is behind the duplicate-submit guard (nodup.h): the same caller posting the same
 * request again while it runs or within QUAN_NODUP_WINDOW_MS after gets 429. The binary then
 * has that setting and one guard for all such routes. */
#define SERVICE_ROUTE_NODUP 0x100u

/* A queue a module consumes: quan.<queue> (with .retry and .dead), bound to routing keys (the
 * event names of events.h). Declared when the binary starts, before any module, so events
 * published before the first consumer runs are kept. With a handler, a consumer thread calls
 * handler(msg, state) for each message; without one, the module consumes the queue itself
 * (e.g. in batches) from its start hook. */
typedef struct service_consumer {
    const char *queue;
    const char *const *routing_keys; /* NULL-terminated */
    mq_handler_fn handler;
} service_consumer;

/* A periodic job: fn(state) on the loop thread every interval, read at start from the module's
 * settings (an int64 field of milliseconds at interval_offset; the binary's config for a module
 * without settings of its own; 0: the timer is off). fn must not block. */
typedef struct service_timer {
    const char *name;
    size_t interval_offset;
    void (*fn)(void *state);
} service_timer;

/* What a module is: everything it adds to the binary, in one place. Arrays end with a zeroed
 * row; any of them may be NULL. */
typedef struct service_module {
    const char *name;
    const config_var *vars; /* its settings: rows of the binary's config table */
    size_t nvars;
    /* Where vars are read into: the module's own struct (the rows' offsets are within it), so
     * that a setting is added in its module's file alone; NULL: the binary's config struct. */
    void *settings;
    const service_route *routes;
    const service_consumer *consumers;
    const service_timer *timers;
    /* Its metrics (METRICS_REFS of its lists, NULL-terminated; metrics.h), registered when the
     * binary starts, before any module does: /metrics lists them from the first scrape. A
     * metric two modules update may be in both lists: it is listed once. */
    metrics_family *const *metrics;
    /* Called once the loop, pools, Redis and the publisher are up and the queues declared,
     * before routes, consumers and timers are added: builds the module's state (*state, owned
     * by the module until free) and starts what the module runs itself. NULL: no state. */
    qn_status (*start)(service *s, void **state);
    /* Loop thread, for /readyz: false while the module cannot serve (NULL: always ready). */
    bool (*ready)(void *state);
    /* First SIGTERM, off the loop thread, with the consumers' stops: stop taking work, finish
     * what is in hand (may block). */
    void (*drain)(void *state);
    /* After every connection, pool and queued callback is gone, before the loop is freed, in
     * reverse module order: free the state. */
    void (*free)(void *state);
} service_module;

/* A binary. */
typedef struct service_def {
    const char *name;      /* "quan-engine" */
    const char *summary;   /* first line of --help */
    const char *http_port; /* default of QUAN_HTTP_PORT */
    unsigned uses;         /* SERVICE_USE_* */
    size_t config_size;    /* of the binary's config struct (service_config its first member) */
    const service_module *const *modules; /* NULL-terminated; started in this order */
} service_def;

/* The whole life of a binary: --help, configuration (the common rows and every module's,
 * validated; exit 2 naming a bad variable), start, queues, each module's start, routes,
 * consumers and timers, the loop, the drain on SIGTERM, teardown. Returns the exit code. */
int service_main(const service_def *def, int argc, char **argv);

/* Borrowed handles of the running binary, for its modules (from their start hook on). */
struct event_base *service_base(const service *s);
http_server *service_http(const service *s);
redis_client *service_redis(const service *s);
pgpool *service_pg(const service *s, int ds);
mq_publisher *service_publisher(const service *s);
bridge *service_bridge(const service *s);
/* Sets po's commit hook to this process's outbox relay of database ds (none without one), for
 * a connection a module opens itself with pgpool_conn_open: outbox rows it commits then reach
 * the relay at once, as through service_pg's pools, which have the hook already. */
void service_pg_commit_hook(const service *s, int ds, pgpool_opts *po);
ids_gen *service_ids(const service *s);
/* 0 while a store the binary uses is known down: Redis (or the worker-id lease, which lives
 * there) or a database. Any thread; never blocks. For mq_consumer_opts.deps_ready (with the
 * service as deps_arg) of consumers a module starts itself; service_consumer ones have it. */
int service_deps_ready(void *s);
const service_config *service_cfg(const service *s);
/* The state module m's start hook made (borrowed, until the modules are freed): how a module
 * reaches another's context, e.g. the claims the template query's. Modules start in the binary's
 * order, so only one listed before the caller has it; NULL for a module not started (yet), not
 * in the binary, or without state. */
void *service_module_state(const service *s, const service_module *m);
/* The options of a consumer of queue c for this binary: the broker's URL, queue type, prefetch,
 * retry delay and attempts from the configuration, c's routing keys and handler, and deps_ready
 * (service_deps_ready). The caller sets arg, and for a batch consumer the batch fields (and
 * handler NULL). Strings borrowed from the configuration and c. */
mq_consumer_opts service_consumer_opts(const service *s, const service_consumer *c);
/* A blocking Redis client for one of the binary's threads, with its Redis settings
 * (QUAN_REDIS_*: the one server, the cluster's startup nodes, or the sentinels) and timeout_ms (0:
 * QUAN_REDIS_TIMEOUT_MS). Connects nothing yet. Owned: redis_sync_free; NULL when out of
 * memory. */
redis_sync *service_redis_sync_new(const service_config *cfg, int timeout_ms) QN_MUSTCHECK;
/* The event-loop client's options from the configuration (QUAN_REDIS_*: the one server, the
 * sentinels, or the cluster's nodes; the timeouts; no scripts: set lua_dir to load them). Strings
 * borrowed from cfg. */
redis_opts service_redis_opts(const service_config *cfg);

/* The shell's own metrics: the loop, the pools, the stores, readiness. service_main registers them
 * with the library's it runs (HTTP_METRICS, MQ_PUBLISH_METRICS, OUTBOX_METRICS) and every module's,
 * before anything starts. */
#define SERVICE_METRICS(X)                                                                         \
    X(quan_loop_lag_seconds, HISTOGRAM,                                                            \
      "How late the event loop ran a timer due every 20 ms: time it spent on other callbacks or "  \
      "waiting for a core (up to 1 ms is the timer's own rounding).",                              \
      "")                                                                                          \
    X(quan_pg_pool_in_use, GAUGE, "PostgreSQL connections busy, by database.", "ds")               \
    X(quan_pg_pool_queue, GAUGE, "Queries waiting for a PostgreSQL connection, by database.",      \
      "ds")                                                                                        \
    X(quan_pg_pool_size, GAUGE, "PostgreSQL connections the pool holds at most, by database.",     \
      "ds")                                                                                        \
    X(quan_ready, GAUGE,                                                                           \
      "1 when /readyz would answer 200 (stores, consumers and modules ready), else 0.", "")        \
    X(quan_redis_connected, GAUGE, "1 when the Redis connection is up, else 0.", "")
METRICS_DECLARE(SERVICE_METRICS)

#endif
