/*
 * outbox.c against real PostgreSQL (QUAN_DS0_DSN), RabbitMQ (QUAN_AMQP_URL) and Redis (the
 * consume guard), with helper_outbox_relay as a relay process that is SIGKILLed mid-way.
 * Routing keys, queues and message keys carry the pid; every test removes its rows and queues.
 */
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "guard.h"
#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "now.h"
#include "outbox.h"
#include "pgpool.h"
#include "redis.h"
#include "redis_sync.h"
#include "testhelp.h"

static const char *g_dsn, *g_url, *g_redis_host;
static int g_redis_port, g_pid;
static redis_scripts *g_scripts;
static pgpool_conn *g_pg; /* the test's own connection (main thread only) */
static char g_helper[512];

/* ---------------------------------------------------------------- what consumers saw */

typedef struct sink {
    pthread_mutex_t mu;
    char prefix[64]; /* message keys are <prefix><index> */
    int cap;
    int *seen;        /* deliveries per index */
    int deliveries;   /* all deliveries with our prefix */
    int effects;      /* effect rows inserted (guarded consumers) */
    int64_t last_at;  /* monotonic ms of the last delivery */
    mq_envelope last; /* copy of the last envelope */
} sink;

static void sink_init(sink *s, const char *what, int cap)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    snprintf(s->prefix, sizeof(s->prefix), "ot%d-%s-", g_pid, what);
    s->cap = cap;
    s->seen = calloc((size_t)cap, sizeof(int));
}

static void sink_free(sink *s)
{
    free(s->seen);
    mq_envelope_free(&s->last);
    pthread_mutex_destroy(&s->mu);
}

static char *dup_or_null(const char *v)
{
    return v ? strdup(v) : NULL;
}

static void sink_record(sink *s, const mq_envelope *env)
{
    size_t plen = strlen(s->prefix);

    if (strncmp(env->key, s->prefix, plen) != 0)
        return;
    pthread_mutex_lock(&s->mu);
    int i = atoi(env->key + plen);
    if (i >= 0 && i < s->cap)
        s->seen[i]++;
    s->deliveries++;
    s->last_at = now_mono_ms();
    mq_envelope_free(&s->last);
    s->last.key = dup_or_null(env->key);
    s->last.type = dup_or_null(env->type);
    s->last.request_id = dup_or_null(env->request_id);
    s->last.traceparent = dup_or_null(env->traceparent);
    s->last.ts_ms = env->ts_ms;
    s->last.data = cJSON_Duplicate(env->data, 1);
    pthread_mutex_unlock(&s->mu);
}

static int sink_deliveries(sink *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->deliveries;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Number of indexes seen at least once. */
static int sink_distinct(sink *s)
{
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->cap; i++)
        n += s->seen[i] > 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static int wait_distinct(sink *s, int want, int ms)
{
    int64_t end = now_mono_ms() + ms;
    while (sink_distinct(s) < want && now_mono_ms() < end)
        usleep(5000);
    return sink_distinct(s);
}

static mq_handler_result plain_handler(const mq_envelope *env, const mq_delivery_info *info,
                                       void *arg)
{
    (void)info;
    sink_record(arg, env);
    return MQ_ACK;
}

/* A consumer on its own queue quan.t<pid>.outbox.<what>, bound to routing key rk. */
static mq_consumer *consumer_start(const char *what, const char *rk, mq_handler_fn fn, void *arg)
{
    char name[96];
    const char *keys[] = {rk, NULL};
    snprintf(name, sizeof(name), "t%d.outbox.%s", g_pid, what);
    mq_consumer_opts o = {.url = g_url,
                          .name = name,
                          .routing_keys = keys,
                          .retry_delay_ms = 200,
                          .handler = fn,
                          .arg = arg};
    mq_consumer *c = mq_consumer_start(&o);
    int64_t end = now_mono_ms() + 5000;
    while (c && !mq_consumer_ready(c) && now_mono_ms() < end)
        usleep(10000);
    return c;
}

static void consumer_delete(const char *what)
{
    char name[96];
    mq_conn *c = mq_conn_open(g_url, "test_outbox cleanup");
    snprintf(name, sizeof(name), "t%d.outbox.%s", g_pid, what);
    if (c && mq_conn_delete_consumer(c, name) != QN_OK)
        printf("  (could not delete consumer %s)\n", name);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- database helpers */

static void topic_of(char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "ot%d.%s", g_pid, what);
}

static long long query_ll(const char *sql, const char *p1)
{
    const char *params[1] = {p1};
    PGresult *res = pgpool_exec(g_pg, sql, p1 ? 1 : 0, p1 ? params : NULL);
    long long v = -1;
    if (res && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
        v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
    if (!res)
        printf("  sql error: %s\n", pgpool_conn_error(g_pg));
    PQclear(res);
    return v;
}

static void delete_topic(const char *topic)
{
    const char *params[1] = {topic};
    if (pgpool_exec_cmd(g_pg, "DELETE FROM t_outbox WHERE topic = $1", 1, params, NULL) != QN_OK)
        printf("  cleanup failed: %s\n", pgpool_conn_error(g_pg));
}

/* Commits n events <sink prefix><i> (i = 0..n-1) on topic in one transaction. */
static qn_status add_events(const sink *s, const char *topic, int n, int64_t due_at_ms)
{
    char key[128], data[64];
    if (pgpool_begin(g_pg) != QN_OK)
        return QN_ERR;
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof(key), "%s%d", s->prefix, i);
        snprintf(data, sizeof(data), "{\"i\":%d}", i);
        outbox_event ev = {
            .routing_key = topic, .key = key, .data_json = data, .due_at_ms = due_at_ms};
        if (outbox_add(g_pg, &ev) != QN_OK) {
            (void)pgpool_rollback(g_pg);
            return QN_ERR;
        }
    }
    return pgpool_commit(g_pg);
}

/* The rows these tests write come from this process's own connection, not the relay's, and
 * most tests do not wake the relay: it looks every 50 ms (idle_ms), so that "nothing more came"
 * means something after half a second. */
static outbox_relay *relay_start(int batch, int backoff_min, int backoff_max)
{
    outbox_relay_opts o = {.dsn = g_dsn,
                           .ds = "ds_0",
                           .amqp_url = g_url,
                           .batch = batch,
                           .poll_ms = 50,
                           .idle_ms = 50,
                           .backoff_min_ms = backoff_min,
                           .backoff_max_ms = backoff_max,
                           .backlog_interval_ms = 200};
    return outbox_relay_start(&o);
}

/* ---------------------------------------------------------------- tests */

/* Validation needs no server round trip for missing fields; bad JSON is refused by PG. */
static void test_add_invalid(void)
{
    outbox_event ev = {.routing_key = "x", .key = NULL};
    CHECK_EQ_INT(outbox_add(g_pg, &ev), QN_EINVAL);
    ev.key = "k";
    ev.routing_key = "";
    CHECK_EQ_INT(outbox_add(g_pg, &ev), QN_EINVAL);
    CHECK_EQ_INT(outbox_add(g_pg, NULL), QN_EINVAL);

    CHECK(pgpool_begin(g_pg) == QN_OK);
    ev.routing_key = "ot.invalid";
    ev.data_json = "{not json";
    CHECK_EQ_INT(outbox_add(g_pg, &ev), QN_EINVAL);
    (void)pgpool_rollback(g_pg);
}

/* outbox_add_many writes the rows outbox_add would, in order, in one statement; one event
 * refused refuses them all. */
static void test_add_many(void)
{
    char topic[64], keys[2][3][96];
    const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    int64_t due = now_wall_ms() + 3600 * 1000;
    topic_of(topic, sizeof(topic), "many");
    outbox_event ev[2][3];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 3; i++)
            snprintf(keys[k][i], sizeof(keys[k][i]), "%s-%c%d", topic, "ab"[k], i);
        ev[k][0] =
            (outbox_event){.routing_key = topic, .key = keys[k][0], .data_json = "{\"i\":0}"};
        ev[k][1] = (outbox_event){.routing_key = topic,
                                  .key = keys[k][1],
                                  .data_json = "{\"s\":\"\\u00e9\\\"q\",\"n\":[1,2]}",
                                  .request_id = "req-many",
                                  .traceparent = tp,
                                  .due_at_ms = due};
        ev[k][2] = (outbox_event){.routing_key = topic, .key = keys[k][2], .request_id = "r,\"{}"};
    }
    CHECK_EQ_INT(outbox_add_many(g_pg, NULL, 0), QN_OK);
    for (int i = 0; i < 3; i++) /* the one-row way, then the many-row way */
        CHECK(outbox_add(g_pg, &ev[0][i]) == QN_OK);
    CHECK(outbox_add_many(g_pg, ev[1], 3) == QN_OK);
    /* Each row as written, both ways: the payload as JSON, the headers without the fields left
     * out, the due time as given or now. */
    char sql[1024];
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0 AND ("
             "(msg_key LIKE '%%-_0' AND payload = '{\"i\": 0}' AND headers = '{}' AND "
             "abs(extract(epoch FROM due_at - now())) < 60) OR "
             "(msg_key LIKE '%%-_1' AND payload = '{\"n\": [1, 2], \"s\": \"\u00e9\\\"q\"}' AND "
             "headers = '{\"requestId\": \"req-many\", \"traceparent\": \"%s\"}' AND "
             "due_at = to_timestamp(%lld / 1000.0)) OR "
             "(msg_key LIKE '%%-_2' AND payload = '{}' AND headers = '{\"requestId\": "
             "\"r,\\\"{}\"}' AND "
             "abs(extract(epoch FROM due_at - now())) < 60))",
             tp, (long long)due);
    CHECK_EQ_INT(query_ll(sql, topic), 6);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1", topic), 6);
    /* In order: b0, b1, b2 take ascending ids. */
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM (SELECT msg_key, lag(msg_key) OVER (ORDER BY id) "
                          "AS prev FROM t_outbox WHERE topic = $1 AND msg_key LIKE '%-b_') x "
                          "WHERE prev IS NOT NULL AND prev > msg_key",
                          topic),
                 0);
    delete_topic(topic);

    /* A missing key, or one payload that is not JSON: nothing of the call is written. */
    ev[1][1].key = NULL;
    CHECK_EQ_INT(outbox_add_many(g_pg, ev[1], 3), QN_EINVAL);
    ev[1][1].key = keys[1][1];
    ev[1][2].data_json = "{not json";
    CHECK(pgpool_begin(g_pg) == QN_OK);
    CHECK_EQ_INT(outbox_add_many(g_pg, ev[1], 3), QN_EINVAL);
    (void)pgpool_rollback(g_pg);
    CHECK_EQ_INT(outbox_add_many(g_pg, ev[1], 3), QN_EINVAL); /* autocommit: one statement */
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1", topic), 0);
}

/* 1. A rolled-back event never goes out; a committed one goes out once, envelope intact. */
static void test_rollback_and_commit(void)
{
    char topic[64], key_rb[128], key_ok[128];
    const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    sink s;
    int64_t pub0 = metrics_get(&metric_quan_mq_published_total), before, after;

    sink_init(&s, "commit", 2);
    topic_of(topic, sizeof(topic), "commit");
    snprintf(key_rb, sizeof(key_rb), "%s0", s.prefix);
    snprintf(key_ok, sizeof(key_ok), "%s1", s.prefix);
    mq_consumer *c = consumer_start("commit", topic, plain_handler, &s);
    outbox_relay *r = relay_start(0, 0, 0);
    CHECK(c != NULL && mq_consumer_ready(c));
    CHECK(r != NULL);

    outbox_event rb = {.routing_key = topic, .key = key_rb, .data_json = "{\"x\":1}"};
    CHECK(pgpool_begin(g_pg) == QN_OK);
    CHECK(outbox_add(g_pg, &rb) == QN_OK);
    CHECK(pgpool_rollback(g_pg) == QN_OK);

    outbox_event ok = {.routing_key = topic,
                       .key = key_ok,
                       .data_json = "{\"templateId\":\"42\",\"n\":7,\"s\":\"\\u00e9\\\"q\"}",
                       .request_id = "req-123",
                       .traceparent = tp};
    before = now_wall_ms();
    CHECK(pgpool_begin(g_pg) == QN_OK);
    CHECK(outbox_add(g_pg, &ok) == QN_OK);
    CHECK(pgpool_commit(g_pg) == QN_OK);
    after = now_wall_ms();
    outbox_relay_wake(r);

    CHECK_EQ_INT(wait_distinct(&s, 1, 5000), 1);
    usleep(500000); /* time for a duplicate or the rolled-back event to show up (they must not) */
    CHECK_EQ_INT(s.seen[0], 0);
    CHECK_EQ_INT(s.seen[1], 1);
    CHECK_EQ_INT(sink_deliveries(&s), 1);
    pthread_mutex_lock(&s.mu);
    CHECK_EQ_STR(s.last.key, key_ok);
    CHECK_EQ_STR(s.last.type, topic);
    CHECK_EQ_STR(s.last.request_id, "req-123");
    CHECK_EQ_STR(s.last.traceparent, tp);
    CHECK(s.last.ts_ms >= before - 5 && s.last.ts_ms <= after + 5);
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(s.last.data, "templateId");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(s.last.data, "n");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(s.last.data, "s");
    CHECK(cJSON_IsString(tid) && strcmp(tid->valuestring, "42") == 0);
    CHECK(cJSON_IsNumber(n) && n->valueint == 7);
    CHECK(cJSON_IsString(str) && strcmp(str->valuestring, "\xc3\xa9\"q") == 0);
    pthread_mutex_unlock(&s.mu);

    /* The row is marked sent; the rolled-back one never existed. */
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE msg_key = $1 AND status = 1 "
                          "AND sent_at IS NOT NULL",
                          key_ok),
                 1);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE msg_key = $1", key_rb), 0);
    CHECK(metrics_get(&metric_quan_mq_published_total) >= pub0 + 1);

    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("commit");
    delete_topic(topic);
    sink_free(&s);
}

/* 2. Events committed while no relay runs survive a relay SIGKILLed mid-way. */
#define CRASH_N 600
static void test_crash_loses_nothing(void)
{
    char topic[64], batch[] = "1";
    sink s;
    pid_t pid;
    int status = 0;
    long long pending_after_kill;

    sink_init(&s, "crash", CRASH_N);
    topic_of(topic, sizeof(topic), "crash");
    mq_consumer *c = consumer_start("crash", topic, plain_handler, &s);
    CHECK(c != NULL && mq_consumer_ready(c));
    CHECK(add_events(&s, topic, CRASH_N, 0) == QN_OK);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic),
                 CRASH_N);

    /* Batch 1: one transaction per row, so the kill lands among many small commits. */
    pid = fork();
    if (pid == 0) {
        char *argv[] = {g_helper, batch, NULL};
        execv(g_helper, argv);
        _exit(127);
    }
    CHECK(pid > 0);
    int64_t end = now_mono_ms() + 10000;
    while (sink_deliveries(&s) < 40 && now_mono_ms() < end)
        usleep(1000);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    usleep(100000);
    int got_before = sink_distinct(&s);
    pending_after_kill =
        query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic);
    printf("  killed relay process after %d of %d events; %lld rows still pending\n", got_before,
           CRASH_N, pending_after_kill);
    CHECK(got_before >= 40);
    CHECK(pending_after_kill > 0); /* the kill really was mid-way */

    /* A fresh relay finishes the job. */
    outbox_relay *r = relay_start(50, 0, 0);
    CHECK(r != NULL);
    CHECK_EQ_INT(wait_distinct(&s, CRASH_N, 15000), CRASH_N);
    int64_t quiet = now_mono_ms() + 2000;
    while (query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic) != 0 &&
           now_mono_ms() < quiet)
        usleep(20000);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic),
                 0);
    printf("  all %d keys received, %d deliveries (duplicates allowed: at least once)\n",
           sink_distinct(&s), sink_deliveries(&s));

    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("crash");
    delete_topic(topic);
    sink_free(&s);
}

/* 3. Two relays share the work; guarded consumers produce exactly one effect per event. */
#define TWO_N 2000

typedef struct guarded {
    sink *s;
    redis_sync *redis;
    pgpool_conn *pg;
    char table[64];
} guarded;

static mq_handler_result guarded_handler(const mq_envelope *env, const mq_delivery_info *info,
                                         void *arg)
{
    guarded *g = arg;
    char gkey[256], sql[160];
    const char *params[1] = {env->key};
    int64_t affected = 0;
    qn_status st;

    (void)info;
    sink_record(g->s, env);
    snprintf(gkey, sizeof(gkey), "quan:test:outbox:{%d}:%s", g_pid, env->key);
    switch (guard_begin(g->redis, g_scripts, gkey, 60000)) {
    case GUARD_DONE:
        return MQ_ACK;
    case GUARD_BUSY:
        return MQ_REQUEUE_LATER;
    case GUARD_ERROR:
        return MQ_RETRY;
    case GUARD_RUN:
        break;
    }
    /* The unique key behind the guard: a duplicate insert is a no-op, never a second effect. */
    snprintf(sql, sizeof(sql), "INSERT INTO %s (msg_key) VALUES ($1) ON CONFLICT DO NOTHING",
             g->table);
    st = pgpool_exec_cmd(g->pg, sql, 1, params, &affected);
    if (st != QN_OK) {
        if (guard_abort(g->redis, gkey) != QN_OK)
            printf("  (guard_abort failed)\n");
        return MQ_RETRY;
    }
    if (affected == 1) {
        pthread_mutex_lock(&g->s->mu);
        g->s->effects++;
        pthread_mutex_unlock(&g->s->mu);
    }
    if (guard_commit(g->redis, gkey, 60000) != QN_OK)
        return MQ_RETRY; /* the effect is in; a redelivery hits the unique key */
    return MQ_ACK;
}

static void test_two_relays(void)
{
    char topic[64], table[64], sql[256];
    sink s;
    guarded g[2];
    mq_consumer *c[2] = {NULL, NULL};
    pgpool_opts po = {.dsn = g_dsn, .name = "ds_0"};
    int64_t pub[2], fail[2];

    sink_init(&s, "two", TWO_N);
    topic_of(topic, sizeof(topic), "two");
    snprintf(table, sizeof(table), "outbox_test_effect_%d", g_pid);
    snprintf(sql, sizeof(sql), "CREATE TABLE IF NOT EXISTS %s (msg_key text PRIMARY KEY)", table);
    CHECK(pgpool_exec_cmd(g_pg, sql, 0, NULL, NULL) == QN_OK);

    /* Two competing consumers on one queue, each with its own Redis and PG connection. */
    for (int i = 0; i < 2; i++) {
        g[i].s = &s;
        g[i].redis = redis_sync_new(
            &(redis_sync_opts){.host = g_redis_host, .port = g_redis_port, .timeout_ms = 2000});
        g[i].pg = pgpool_conn_open(&po);
        snprintf(g[i].table, sizeof(g[i].table), "%s", table);
        CHECK(g[i].redis != NULL && g[i].pg != NULL && pgpool_conn_ok(g[i].pg));
        c[i] = consumer_start("two", topic, guarded_handler, &g[i]);
        CHECK(c[i] != NULL && mq_consumer_ready(c[i]));
    }
    outbox_relay *r1 = relay_start(50, 0, 0);
    outbox_relay *r2 = relay_start(50, 0, 0);
    CHECK(r1 && r2);
    usleep(100000); /* both relays connected and polling */

    int64_t t0 = now_mono_ms();
    CHECK(add_events(&s, topic, TWO_N, 0) == QN_OK);
    outbox_relay_wake(r1);
    outbox_relay_wake(r2);
    CHECK_EQ_INT(wait_distinct(&s, TWO_N, 20000), TWO_N);
    int64_t t1 = now_mono_ms();
    usleep(300000);
    outbox_relay_stats(r1, &pub[0], &fail[0]);
    outbox_relay_stats(r2, &pub[1], &fail[1]);
    outbox_relay_stop(r1);
    outbox_relay_stop(r2);
    for (int i = 0; i < 2; i++)
        mq_consumer_stop(c[i]);

    printf("  relay 1 published %lld, relay 2 published %lld; %d deliveries in %lld ms; "
           "%d effects\n",
           (long long)pub[0], (long long)pub[1], s.deliveries, (long long)(t1 - t0), s.effects);
    CHECK(pub[0] > 0 && pub[1] > 0); /* SKIP LOCKED spread the rows over both */
    CHECK(pub[0] + pub[1] >= TWO_N);
    CHECK_EQ_INT(fail[0] + fail[1], 0);
    CHECK(s.deliveries >= TWO_N);
    CHECK_EQ_INT(s.effects, TWO_N);
    snprintf(sql, sizeof(sql), "SELECT count(*) FROM %s WHERE msg_key LIKE $1 || '%%'", table);
    CHECK_EQ_INT(query_ll(sql, s.prefix), TWO_N);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic),
                 0);

    for (int i = 0; i < 2; i++) {
        if (g[i].redis) {
            /* Guard keys: one per event, pattern-deleted in the test's own namespace. */
            redisReply *rep;
            char pat[128];
            snprintf(pat, sizeof(pat), "quan:test:outbox:{%d}:*", g_pid);
            long long cursor = 0;
            do {
                rep = redis_sync_command(g[i].redis, "SCAN %lld MATCH %s COUNT 1000", cursor, pat);
                if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
                    break;
                cursor = strtoll(rep->element[0]->str, NULL, 10);
                for (size_t k = 0; k < rep->element[1]->elements; k++) {
                    redisReply *d =
                        redis_sync_command(g[i].redis, "DEL %s", rep->element[1]->element[k]->str);
                    if (d)
                        freeReplyObject(d);
                }
                freeReplyObject(rep);
                rep = NULL;
            } while (cursor != 0);
            if (rep)
                freeReplyObject(rep);
            redis_sync_free(g[i].redis);
        }
        pgpool_conn_close(g[i].pg);
    }
    snprintf(sql, sizeof(sql), "DROP TABLE IF EXISTS %s", table);
    CHECK(pgpool_exec_cmd(g_pg, sql, 0, NULL, NULL) == QN_OK);
    consumer_delete("two");
    delete_topic(topic);
    sink_free(&s);
}

/* A relay that, with nothing due, looks again only after 3 s (or when woken). */
static outbox_relay *idle_relay_start(void)
{
    outbox_relay_opts o = {
        .dsn = g_dsn, .ds = "ds_0", .amqp_url = g_url, .poll_ms = 50, .idle_ms = 3000};
    return outbox_relay_start(&o);
}

/* When the relay's connection last began or ended a statement (µs): each statement moves
 * pg_stat_activity's state_change (live, not the statistics flushed later). */
static long long relay_last_statement(void)
{
    return query_ll("SELECT max((extract(epoch FROM state_change) * 1e6)::bigint) "
                    "FROM pg_stat_activity WHERE application_name = $1",
                    "quan outbox-relay");
}

/* How many statements the relay's connection ran while sampled every 10 ms for ms. */
static int relay_statements(int ms)
{
    long long last = -1;
    int changes = 0;
    for (int64_t end = now_mono_ms() + ms; now_mono_ms() < end; usleep(10000)) {
        long long v = relay_last_statement();
        if (v >= 0 && v != last) {
            changes += last >= 0;
            last = v;
        }
    }
    return changes;
}

/* 4. A timer: not published before its due time, published after. The relay is idle: it
 * sleeps until the earliest pending row falls due (here up to idle_ms, 3 s), not a look every
 * poll_ms; idle, it leaves the database alone, and the timer it was woken for goes out on time
 * all the same. */
static void test_delayed(void)
{
    char topic[64];
    sink s;

    sink_init(&s, "delay", 1);
    topic_of(topic, sizeof(topic), "delay");
    mq_consumer *c = consumer_start("delay", topic, plain_handler, &s);
    outbox_relay *r = idle_relay_start();
    CHECK(c != NULL && r != NULL);
    usleep(300000); /* connected, and asleep after its first look */
    int idle = relay_statements(2000);
    printf("  statements of an idle relay in 2 s: %d (a look every poll_ms: 40 or more)\n", idle);
    CHECK(idle < 10);

    int64_t t0 = now_mono_ms();
    CHECK(add_events(&s, topic, 1, now_wall_ms() + 1500) == QN_OK);
    outbox_relay_wake(r);
    while (now_mono_ms() < t0 + 1200)
        usleep(10000);
    CHECK_EQ_INT(sink_deliveries(&s), 0);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND status = 0", topic),
                 1);
    CHECK_EQ_INT(wait_distinct(&s, 1, 3000), 1);
    int64_t lat = s.last_at - t0;
    printf("  delayed event (due +1500 ms) delivered at +%lld ms\n", (long long)lat);
    CHECK(lat >= 1450 && lat < 2500);
    CHECK_EQ_INT(sink_deliveries(&s), 1);

    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("delay");
    delete_topic(topic);
    sink_free(&s);
}

/* 4b. The commit wakes the relay (outbox_relay_on_commit as the connection's commit hook): an
 * idle relay (idle_ms 3 s) publishes a row at once when the transaction that added it commits,
 * in a transaction or on its own; a rolled-back row, or a timer due after the relay looks
 * anyway, does not wake it; a timer due before then does, and goes out on time. */
static void test_commit_wakes(void)
{
    char topic[64], key[128];
    sink s;

    sink_init(&s, "wake", 4);
    topic_of(topic, sizeof(topic), "wake");
    mq_consumer *c = consumer_start("wake", topic, plain_handler, &s);
    outbox_relay *r = idle_relay_start();
    pgpool_opts po = {.dsn = g_dsn,
                      .name = "ds_0",
                      .application_name = "outbox-test writer",
                      .on_commit = outbox_relay_on_commit,
                      .on_commit_arg = r};
    pgpool_conn *w = pgpool_conn_open(&po);
    CHECK(c != NULL && r != NULL && w != NULL && pgpool_conn_ok(w));
    if (!c || !r || !w)
        goto out;
    usleep(300000); /* connected, and asleep after its first look */

    /* Rolled back, and a timer due in a minute: the relay sleeps on, its connection's last
     * statement still the one before them. */
    long long before = relay_last_statement();
    snprintf(key, sizeof(key), "%s0", s.prefix);
    outbox_event ev = {.routing_key = topic, .key = key};
    CHECK_EQ_INT(pgpool_begin(w), QN_OK);
    CHECK_EQ_INT(outbox_add(w, &ev), QN_OK);
    CHECK_EQ_INT(pgpool_rollback(w), QN_OK);
    snprintf(key, sizeof(key), "%s1", s.prefix);
    ev.due_at_ms = now_wall_ms() + 60000;
    CHECK_EQ_INT(pgpool_begin(w), QN_OK);
    CHECK_EQ_INT(outbox_add(w, &ev), QN_OK);
    CHECK_EQ_INT(pgpool_commit(w), QN_OK);
    usleep(1000000);
    long long after = relay_last_statement();
    printf("  relay statements in 1 s after a rollback and a far timer: %s\n",
           after == before ? "none" : "some");
    CHECK(before > 0 && after == before);

    /* Due now, in a transaction: published at the commit, not at the relay's next look. */
    snprintf(key, sizeof(key), "%s2", s.prefix);
    ev.due_at_ms = 0;
    int64_t t0 = now_mono_ms();
    CHECK_EQ_INT(pgpool_begin(w), QN_OK);
    CHECK_EQ_INT(outbox_add(w, &ev), QN_OK);
    CHECK_EQ_INT(pgpool_commit(w), QN_OK);
    CHECK_EQ_INT(wait_distinct(&s, 1, 5000), 1);
    int64_t lat = s.last_at - t0;
    printf("  row committed in a transaction delivered after %lld ms\n", (long long)lat);
    CHECK(lat < 1000);

    /* On its own (autocommit). */
    snprintf(key, sizeof(key), "%s3", s.prefix);
    usleep(200000); /* asleep again */
    t0 = now_mono_ms();
    CHECK_EQ_INT(outbox_add(w, &ev), QN_OK);
    CHECK_EQ_INT(wait_distinct(&s, 2, 5000), 2);
    lat = s.last_at - t0;
    printf("  row committed on its own delivered after %lld ms\n", (long long)lat);
    CHECK(lat < 1000);

    /* A timer due before the relay's next look wakes it to plan for it: out on time. */
    usleep(200000);
    snprintf(key, sizeof(key), "%s1", s.prefix); /* replaces the far timer's row */
    CHECK_EQ_INT(outbox_cancel(w, key, NULL), QN_OK);
    t0 = now_mono_ms();
    ev.due_at_ms = now_wall_ms() + 700;
    CHECK_EQ_INT(outbox_add(w, &ev), QN_OK);
    CHECK_EQ_INT(wait_distinct(&s, 3, 5000), 3);
    lat = s.last_at - t0;
    printf("  timer due +700 ms delivered at +%lld ms\n", (long long)lat);
    CHECK(lat >= 650 && lat < 1500);
    CHECK_EQ_INT(s.seen[0], 0);
    CHECK_EQ_INT(sink_deliveries(&s), 3);
out:
    pgpool_conn_close(w);
    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("wake");
    delete_topic(topic);
    sink_free(&s);
}

/* 5. Unroutable: the row stays pending with attempts and a later due time, until a queue is
 * bound; then it goes out. */
static void test_unroutable(void)
{
    char topic[64], key[128];
    sink s;
    int64_t fails;

    sink_init(&s, "unroutable", 1);
    topic_of(topic, sizeof(topic), "unroutable");
    snprintf(key, sizeof(key), "%s0", s.prefix);
    outbox_relay *r = relay_start(0, 300, 600);
    CHECK(r != NULL);
    CHECK(add_events(&s, topic, 1, 0) == QN_OK);
    outbox_relay_wake(r);

    int64_t end = now_mono_ms() + 3000;
    while (query_ll("SELECT attempts FROM t_outbox WHERE msg_key = $1", key) < 1 &&
           now_mono_ms() < end)
        usleep(10000);
    CHECK(query_ll("SELECT attempts FROM t_outbox WHERE msg_key = $1", key) >= 1);
    CHECK_EQ_INT(query_ll("SELECT status FROM t_outbox WHERE msg_key = $1", key), 0);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE msg_key = $1 AND "
                          "due_at > created_at AND last_error LIKE 'unroutable%'",
                          key),
                 1);
    outbox_relay_stats(r, NULL, &fails);
    CHECK(fails >= 1);

    /* Bind a queue: the next attempt (<= 600 ms away) is delivered. */
    mq_consumer *c = consumer_start("unroutable", topic, plain_handler, &s);
    CHECK(c != NULL && mq_consumer_ready(c));
    CHECK_EQ_INT(wait_distinct(&s, 1, 3000), 1);
    usleep(200000);
    CHECK_EQ_INT(sink_deliveries(&s), 1);
    CHECK_EQ_INT(query_ll("SELECT status FROM t_outbox WHERE msg_key = $1", key), 1);
    printf("  published after %lld attempts\n",
           query_ll("SELECT attempts FROM t_outbox WHERE msg_key = $1", key));

    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("unroutable");
    delete_topic(topic);
    sink_free(&s);
}

/* Backlog count, cancelling a pending timer, and the cleanup of old sent rows. */
static void test_backlog_cancel_cleanup(void)
{
    char topic[64], key[128];
    sink s;
    int64_t b0 = -1, b1 = -1, cancelled = -1;

    sink_init(&s, "misc", 5);
    topic_of(topic, sizeof(topic), "misc");
    CHECK(outbox_backlog(g_pg, &b0) == QN_OK);
    CHECK(add_events(&s, topic, 3, 0) == QN_OK);
    CHECK(outbox_backlog(g_pg, &b1) == QN_OK);
    CHECK(b1 - b0 >= 3);

    /* A timer an hour ahead is not in the backlog, and can be cancelled while pending. */
    snprintf(key, sizeof(key), "%s9", s.prefix);
    outbox_event ev = {.routing_key = topic, .key = key, .due_at_ms = now_wall_ms() + 3600000};
    CHECK(outbox_add(g_pg, &ev) == QN_OK); /* autocommit: its own transaction */
    CHECK(outbox_backlog(g_pg, &b0) == QN_OK);
    CHECK_EQ_INT(b0, b1);
    CHECK(outbox_cancel(g_pg, key, &cancelled) == QN_OK);
    CHECK_EQ_INT(cancelled, 1);
    CHECK(outbox_cancel(g_pg, key, &cancelled) == QN_OK);
    CHECK_EQ_INT(cancelled, 0);

    /* Rows 0 and 1 sent two days ago, row 2 sent just now: only the old ones are purged. */
    CHECK(pgpool_exec_cmd(g_pg,
                          "UPDATE t_outbox SET status = 1, sent_at = now() - interval '2 days' "
                          "WHERE topic = $1 AND (payload->>'i')::int < 2",
                          1, (const char *[]){topic}, NULL) == QN_OK);
    CHECK(pgpool_exec_cmd(g_pg,
                          "UPDATE t_outbox SET status = 1, sent_at = now() "
                          "WHERE topic = $1 AND (payload->>'i')::int = 2",
                          1, (const char *[]){topic}, NULL) == QN_OK);
    outbox_relay_opts o = {
        .dsn = g_dsn, .ds = "ds_0", .amqp_url = g_url, .poll_ms = 50, .retention_s = 3600};
    outbox_relay *r = outbox_relay_start(&o);
    CHECK(r != NULL);
    int64_t end = now_mono_ms() + 3000;
    while (query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1", topic) > 1 &&
           now_mono_ms() < end)
        usleep(20000);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1", topic), 1);
    CHECK_EQ_INT(query_ll("SELECT count(*) FROM t_outbox WHERE topic = $1 AND "
                          "(payload->>'i')::int = 2",
                          topic),
                 1);
    outbox_relay_stop(r);
    delete_topic(topic);
    sink_free(&s);
}

/* The relay reconnects to PostgreSQL after its backend is killed, and carries on. */
static void test_pg_reconnect(void)
{
    char topic[64];
    sink s;

    sink_init(&s, "reconnect", 2);
    topic_of(topic, sizeof(topic), "reconnect");
    mq_consumer *c = consumer_start("reconnect", topic, plain_handler, &s);
    outbox_relay *r = relay_start(0, 0, 0);
    CHECK(c != NULL && r != NULL);
    CHECK(add_events(&s, topic, 1, 0) == QN_OK);
    CHECK_EQ_INT(wait_distinct(&s, 1, 5000), 1);

    /* Kill the relay's session (its application_name says which), then commit another. */
    CHECK(query_ll("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                   "WHERE application_name = $1 AND pid <> pg_backend_pid()",
                   "quan outbox-relay") >= 1);
    char key[128];
    snprintf(key, sizeof(key), "%s1", s.prefix);
    outbox_event ev = {.routing_key = topic, .key = key};
    CHECK(outbox_add(g_pg, &ev) == QN_OK);
    CHECK_EQ_INT(wait_distinct(&s, 2, 8000), 2);

    outbox_relay_stop(r);
    mq_consumer_stop(c);
    consumer_delete("reconnect");
    delete_topic(topic);
    sink_free(&s);
}

int main(int argc, char **argv)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    char self[512];
    pgpool_opts po;
    (void)argc;

    g_dsn = th_env("QUAN_DS0_DSN");
    g_url = th_env("QUAN_AMQP_URL");
    g_redis_host = th_env("QUAN_REDIS_HOST");
    g_redis_port = atoi(th_env("QUAN_REDIS_PORT"));
    g_pid = (int)getpid();
    signal(SIGPIPE, SIG_IGN);
    snprintf(self, sizeof(self), "%s", argv[0]);
    snprintf(g_helper, sizeof(g_helper), "%s/helper_outbox_relay", dirname(self));
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    po = (pgpool_opts){.dsn = g_dsn, .name = "ds_0"};
    g_pg = pgpool_conn_open(&po);
    if (!g_scripts || !g_pg || !pgpool_conn_ok(g_pg) || access(g_helper, X_OK) != 0) {
        printf("  FAIL: setup (Lua scripts, PostgreSQL at QUAN_DS0_DSN, or %s)\n", g_helper);
        printf("0 passed, 1 failed\n");
        return 1;
    }

    RUN(test_add_invalid);
    RUN(test_add_many);
    RUN(test_rollback_and_commit);
    RUN(test_crash_loses_nothing);
    RUN(test_two_relays);
    RUN(test_delayed);
    RUN(test_commit_wakes);
    RUN(test_unroutable);
    RUN(test_pg_reconnect);
    RUN(test_backlog_cancel_cleanup);

    pgpool_conn_close(g_pg);
    redis_scripts_free(g_scripts);
    metrics_shutdown();
    TEST_MAIN_END();
}
