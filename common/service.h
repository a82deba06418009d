/*
 * The shell every Quan binary runs in: configuration (the common rows of the env table),
 * the event loop, signals handled on the loop (pgbouncer), the HTTP server with /livez,
 * /readyz and /metrics, the Redis client with its scripts, one PostgreSQL pool per data
 * source, the RabbitMQ publisher and consumers, and the drain on SIGTERM:
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
#include "mq.h"
#include "outbox.h"
#include "pgpool.h"
#include "redis.h"
#include "status.h"

#define SERVICE_DS_COUNT      2 /* ds_0 and ds_1 */
#define SERVICE_MAX_CONSUMERS 16
#define SERVICE_VERSION       "0.1.0"

/* The settings every binary shares; each binary embeds this struct in its own config. */
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
    const char *ds_dsn[SERVICE_DS_COUNT];
    int64_t pg_pool_size;
    int64_t pg_queue_max;
    int64_t pg_statement_timeout_ms;
    const char *redis_host;
    int64_t redis_port;
    const char *redis_password;
    int64_t redis_timeout_ms;
    const char *lua_dir;
    const char *amqp_url;
    int64_t mq_prefetch;
    int64_t mq_retry_delay_ms;
    int64_t mq_max_attempts;
    const char *timezone;
    int64_t shutdown_timeout_s;
    int debug_routes;
} service_config;

extern const char *const service_log_levels[];

/* The common rows of a binary's config table. T is the binary's config struct, F the name
 * of its service_config member, PORT the default HTTP port as a string. */
#define SERVICE_CONFIG_VARS(T, F, PORT)                                                            \
    {"QUAN_HTTP_BIND",                                                                             \
     CONFIG_STR,                                                                                   \
     offsetof(T, F.http_bind),                                                                     \
     "0.0.0.0",                                                                                    \
     0,                                                                                            \
     64,                                                                                           \
     NULL,                                                                                         \
     0,                                                                                            \
     "address the HTTP server binds"},                                                             \
        {"QUAN_HTTP_PORT",                                                                         \
         CONFIG_INT,                                                                               \
         offsetof(T, F.http_port),                                                                 \
         PORT,                                                                                     \
         1,                                                                                        \
         65535,                                                                                    \
         NULL,                                                                                     \
         0,                                                                                        \
         "HTTP port (/api/..., /livez, /readyz, /metrics)"},                                       \
        {"QUAN_HTTP_MAX_BODY",                                                                     \
         CONFIG_INT,                                                                               \
         offsetof(T, F.http_max_body),                                                             \
         "1048576",                                                                                \
         1024,                                                                                     \
         67108864,                                                                                 \
         NULL,                                                                                     \
         0,                                                                                        \
         "largest request body in bytes; larger gets 413"},                                        \
        {"QUAN_HTTP_IDLE_TIMEOUT_S",                                                               \
         CONFIG_INT,                                                                               \
         offsetof(T, F.http_idle_timeout_s),                                                       \
         "60",                                                                                     \
         1,                                                                                        \
         3600,                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         "idle keep-alive and header read timeout, seconds"},                                      \
        {"QUAN_HTTP_REQUEST_TIMEOUT_MS",                                                           \
         CONFIG_INT,                                                                               \
         offsetof(T, F.http_request_timeout_ms),                                                   \
         "10000",                                                                                  \
         10,                                                                                       \
         600000,                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         "a request not answered by then gets 503"},                                               \
        {"QUAN_HEADER_USER_ID",                                                                    \
         CONFIG_STR,                                                                               \
         offsetof(T, F.header_user_id),                                                            \
         "X-User-Id",                                                                              \
         1,                                                                                        \
         64,                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         "gateway header carrying the user id"},                                                   \
        {"QUAN_HEADER_SHOP_NUMBER",                                                                \
         CONFIG_STR,                                                                               \
         offsetof(T, F.header_shop_number),                                                        \
         "X-Shop-Number",                                                                          \
         1,                                                                                        \
         64,                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         "gateway header carrying the merchant's shop number"},                                    \
        {"QUAN_HEADER_USERNAME",                                                                   \
         CONFIG_STR,                                                                               \
         offsetof(T, F.header_username),                                                           \
         "X-Username",                                                                             \
         1,                                                                                        \
         64,                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         "gateway header carrying the user name"},                                                 \
        {"QUAN_LOG_LEVEL",   CONFIG_ENUM, offsetof(T, F.log_level),   "info", 0, 0,                \
         service_log_levels, 0,           "least severe level logged"},                            \
        {"QUAN_DS0_DSN",                                                                           \
         CONFIG_STR,                                                                               \
         offsetof(T, F.ds_dsn[0]),                                                                 \
         NULL,                                                                                     \
         1,                                                                                        \
         1024,                                                                                     \
         NULL,                                                                                     \
         CONFIG_REQUIRED | CONFIG_SECRET,                                                          \
         "libpq URI of database ds_0"},                                                            \
        {"QUAN_DS1_DSN",                                                                           \
         CONFIG_STR,                                                                               \
         offsetof(T, F.ds_dsn[1]),                                                                 \
         NULL,                                                                                     \
         1,                                                                                        \
         1024,                                                                                     \
         NULL,                                                                                     \
         CONFIG_REQUIRED | CONFIG_SECRET,                                                          \
         "libpq URI of database ds_1"},                                                            \
        {"QUAN_PG_POOL_SIZE",                                                                      \
         CONFIG_INT,                                                                               \
         offsetof(T, F.pg_pool_size),                                                              \
         "4",                                                                                      \
         1,                                                                                        \
         64,                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         "connections (and worker threads) per database"},                                         \
        {"QUAN_PG_QUEUE_MAX",                                                                      \
         CONFIG_INT,                                                                               \
         offsetof(T, F.pg_queue_max),                                                              \
         "1024",                                                                                   \
         1,                                                                                        \
         1000000,                                                                                  \
         NULL,                                                                                     \
         0,                                                                                        \
         "queries waiting for a connection before new ones are refused (503)"},                    \
        {"QUAN_PG_STATEMENT_TIMEOUT_MS",                                                           \
         CONFIG_INT,                                                                               \
         offsetof(T, F.pg_statement_timeout_ms),                                                   \
         "5000",                                                                                   \
         0,                                                                                        \
         600000,                                                                                   \
         NULL,                                                                                     \
         0,                                                                                        \
         "statement_timeout of every connection (0: none)"},                                       \
        {"QUAN_REDIS_HOST", CONFIG_STR, offsetof(T, F.redis_host), "127.0.0.1", 1, 255, NULL, 0,   \
         "Redis host"},                                                                            \
        {"QUAN_REDIS_PORT", CONFIG_INT, offsetof(T, F.redis_port), "6379", 1, 65535, NULL, 0,      \
         "Redis port"},                                                                            \
        {"QUAN_REDIS_PASSWORD",                                                                    \
         CONFIG_STR,                                                                               \
         offsetof(T, F.redis_password),                                                            \
         "",                                                                                       \
         0,                                                                                        \
         256,                                                                                      \
         NULL,                                                                                     \
         CONFIG_SECRET,                                                                            \
         "Redis AUTH password (empty: none)"},                                                     \
        {"QUAN_REDIS_TIMEOUT_MS",                                                                  \
         CONFIG_INT,                                                                               \
         offsetof(T, F.redis_timeout_ms),                                                          \
         "1000",                                                                                   \
         10,                                                                                       \
         60000,                                                                                    \
         NULL,                                                                                     \
         0,                                                                                        \
         "Redis connect and command timeout"},                                                     \
        {"QUAN_LUA_DIR", CONFIG_STR, offsetof(T, F.lua_dir),                                       \
         "lua-scripts",  1,          4096,                                                         \
         NULL,           0,          "directory of the Lua scripts loaded at start"},              \
        {"QUAN_AMQP_URL",                                                                          \
         CONFIG_STR,                                                                               \
         offsetof(T, F.amqp_url),                                                                  \
         "amqp://guest:guest@127.0.0.1:5672/",                                                     \
         1,                                                                                        \
         1024,                                                                                     \
         NULL,                                                                                     \
         CONFIG_SECRET,                                                                            \
         "RabbitMQ URL"},                                                                          \
        {"QUAN_MQ_PREFETCH",                                                                       \
         CONFIG_INT,                                                                               \
         offsetof(T, F.mq_prefetch),                                                               \
         "16",                                                                                     \
         1,                                                                                        \
         1000,                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         "unacked messages per consumer"},                                                         \
        {"QUAN_MQ_RETRY_DELAY_MS",                                                                 \
         CONFIG_INT,                                                                               \
         offsetof(T, F.mq_retry_delay_ms),                                                         \
         "10000",                                                                                  \
         10,                                                                                       \
         3600000,                                                                                  \
         NULL,                                                                                     \
         0,                                                                                        \
         "delay before a failed message is delivered again"},                                      \
        {"QUAN_MQ_MAX_ATTEMPTS",                                                                   \
         CONFIG_INT,                                                                               \
         offsetof(T, F.mq_max_attempts),                                                           \
         "16",                                                                                     \
         1,                                                                                        \
         100,                                                                                      \
         NULL,                                                                                     \
         0,                                                                                        \
         "deliveries before a message goes to the dead-letter queue"},                             \
        {"QUAN_TIMEZONE",                                                                          \
         CONFIG_STR,                                                                               \
         offsetof(T, F.timezone),                                                                  \
         "Asia/Shanghai",                                                                          \
         1,                                                                                        \
         64,                                                                                       \
         NULL,                                                                                     \
         0,                                                                                        \
         "zone of \"yyyy-MM-dd HH:mm:ss\" times in the API"},                                      \
        {"QUAN_SHUTDOWN_TIMEOUT_S",                                                                \
         CONFIG_INT,                                                                               \
         offsetof(T, F.shutdown_timeout_s),                                                        \
         "25",                                                                                     \
         1,                                                                                        \
         600,                                                                                      \
         NULL,                                                                                     \
         0,                                                                                        \
         "longest drain after SIGTERM before exiting anyway"},                                     \
    {                                                                                              \
        "QUAN_DEBUG_ROUTES", CONFIG_BOOL, offsetof(T, F.debug_routes), "false", 0, 0, NULL, 0,     \
            "serve /debug/sleep and /debug/redis-ping (tests and benchmarks only)"                 \
    }

/* What a binary needs started; /readyz waits for exactly these. */
enum {
    SERVICE_USE_PG = 1 << 0,
    SERVICE_USE_REDIS = 1 << 1,
    SERVICE_USE_MQ = 1 << 2,     /* the publisher; consumers are added one by one */
    SERVICE_USE_OUTBOX = 1 << 3, /* an outbox relay per database (needs PG and MQ) */
};

/* A queue a binary consumes: declared at start (idempotent), consumed by service_add_consumer. */
typedef struct service_queue {
    const char *name;                /* consumer name: queue quan.<name> (+ .retry, .dead) */
    const char *const *routing_keys; /* NULL-terminated event names bound to it */
} service_queue;

typedef struct service service;

/* Reads argv (--help prints the table and exits 0) and the environment into cfg; on a bad or
 * missing value prints the variable and the reason and exits 2. common points into cfg. */
void service_configure(int argc, char **argv, const char *name, const char *summary,
                       const config_var *vars, size_t nvars, void *cfg,
                       const service_config *common);

/* Owned by the caller (service_free). name and cfg are borrowed for the service's life. */
service *service_new(const char *name, const service_config *cfg, unsigned uses) QN_MUSTCHECK;
void service_free(service *s);

/* Creates the loop and connects what `uses` asks for, then listens. */
qn_status service_start(service *s) QN_MUSTCHECK;
/* Declares the queues of a binary (call after service_start): done at start so events
 * published before the first consumer runs are kept, not dropped as unroutable. */
qn_status service_declare_queues(service *s, const service_queue *queues, size_t n) QN_MUSTCHECK;
/* Starts a consumer thread (after service_start); it is stopped during the drain. */
qn_status service_add_consumer(service *s, const char *name, const char *const *routing_keys,
                               mq_handler_fn handler, void *arg) QN_MUSTCHECK;
/* fn(arg) runs at the start of the drain (first SIGTERM), on a thread that is not the loop, with
 * the consumers' stops: where a module with its own threads stops taking work and finishes what
 * it holds (it may block). The drain waits for it. */
qn_status service_at_drain(service *s, void (*fn)(void *arg), void *arg) QN_MUSTCHECK;
/* fn(arg) runs in service_free after every connection, pool and queued callback is gone and
 * before the event base is freed: where a module frees its state and its events. Last added
 * runs first. */
qn_status service_at_free(service *s, void (*fn)(void *arg), void *arg) QN_MUSTCHECK;
/* Runs the loop until the drain ends; returns the process exit code. */
int service_run(service *s);

/* Borrowed handles, valid between service_start and service_free. */
struct event_base *service_base(const service *s);
http_server *service_http(const service *s);
redis_client *service_redis(const service *s);
pgpool *service_pg(const service *s, int ds);
mq_publisher *service_publisher(const service *s);
bridge *service_bridge(const service *s);
/* Wakes the relay of database ds after a commit that added outbox rows (lower latency). */
void service_outbox_wake(service *s, int ds);
ids_gen *service_ids(const service *s);
const service_config *service_cfg(const service *s);

#endif
