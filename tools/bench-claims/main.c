/*
 * quan-bench-claims: helpers of bench/engine.sh, bench/mq.sh and of the claim and topology tests
 * (reads QUAN_AMQP_URL, one URL or a list, QUAN_MQ_QUEUE_TYPE for the queues it declares,
 * QUAN_DS0_DSN, QUAN_DS1_DSN):
 *
 *   publish-rate SECONDS WINDOW [CLAIMS BYTES]
 *                                 raw publish-with-confirms rate to the broker: envelopes of a
 *                                 claim's size to quan.events / bench.raw (queue
 *                                 quan.bench-raw, deleted after), at most WINDOW unconfirmed
 *                                 (pipelined confirms); prints messages per second. With
 *                                 CLAIMS > 1 each message is a pack of CLAIMS envelopes, each
 *                                 padded to about BYTES (the packs /redeem-mq makes)
 *   queue-rate N WINDOW BATCH     the same queue through and through: N envelopes published
 *                                 (WINDOW unconfirmed at most), then all N consumed (one
 *                                 multiple ack per BATCH, prefetch 2 x BATCH); prints
 *                                 "PUBLISHED/s CONSUMED/s"; the queue is deleted after
 *   declare-queues NAME KEY       declares consumer NAME's three queues (quan.NAME, .retry,
 *                                 .dead) bound to KEY, as a service would
 *   delete-queues NAME            deletes them
 *   publish KEY DATA_JSON [N]     publishes one coupon.redeem message N times (default 1),
 *                                 each confirmed (tests: a claim delivered twice)
 *   publish-pack N KEY DATA_JSON [KEY DATA_JSON ...]
 *                                 publishes one coupon.redeem message holding these claims as
 *                                 a pack, N times, each confirmed (tests: the consume guard of
 *                                 packs)
 *   backlog TPL SHOP USER0 N      publishes N claims of users USER0.. on template TPL of SHOP
 *                                 (one coupon each), pipelined confirms; prints the count
 *   consume-rate QUEUE N BATCH    the broker's ceiling for a drain: receives N messages of
 *                                 QUEUE doing nothing with them, one multiple ack per BATCH
 *                                 (prefetch 2 x BATCH); prints messages per second
 *   wait-stock TPL SHOP BELOW S   waits (one connection, polling every 10 ms, at most S seconds)
 *                                 until template TPL's database stock is at most BELOW;
 *                                 prints the wall-clock time it saw that (epoch seconds)
 *   pg-one-tx TPL SHOP USER0 N    writes N coupons the slow way: one transaction per coupon
 *                                 (stock UPDATE + INSERT); prints coupons per second
 */
#include <amqp.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "events.h"
#include "log.h"
#include "mq.h"
#include "now.h"
#include "pgparam.h"
#include "shard.h"

/* A connection in confirm mode (pipelined confirms are counted here, not by mq_conn). */
static mq_conn *raw_open(void)
{
    char err[MQ_CONN_ERR_MAX];
    mq_conn *c = mq_conn_connect(getenv("QUAN_AMQP_URL"),
                                 &(mq_conn_opts){.name = "bench-claims", .confirm = 1}, err);
    if (!c)
        fprintf(stderr, "cannot connect to RabbitMQ: %s\n", err);
    return c;
}

/* Publishes n bodies made by make(i), at most window unconfirmed; returns those confirmed.
 * Stops early after `seconds` when seconds > 0. */
typedef const char *(*body_fn)(long i, void *arg);
static long raw_publish(amqp_connection_state_t st, const char *rk, long n, int window,
                        double seconds, body_fn make, void *arg)
{
    amqp_basic_properties_t props = {0};
    props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.content_type = amqp_cstring_bytes("application/json");
    props.delivery_mode = 2;
    long sent = 0, acked = 0;
    double end = now_mono_s() + seconds;
    while ((n <= 0 || acked < n)) {
        int stop = (n > 0 && sent >= n) || (seconds > 0 && now_mono_s() >= end);
        if (stop && acked >= sent)
            break;
        while (!stop && sent - acked < window && (n <= 0 || sent < n)) {
            const char *b = make(sent, arg);
            if (amqp_basic_publish(st, 1, amqp_cstring_bytes(MQ_CONN_EXCHANGE),
                                   amqp_cstring_bytes(rk), 0, 0, &props,
                                   amqp_cstring_bytes(b)) != AMQP_STATUS_OK)
                return acked;
            sent++;
        }
        amqp_frame_t f;
        amqp_maybe_release_buffers(st);
        if (amqp_simple_wait_frame(st, &f) != AMQP_STATUS_OK)
            return acked;
        if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            amqp_basic_ack_t *a = f.payload.method.decoded;
            if (a->multiple)
                acked = (long)a->delivery_tag;
            else if ((long)a->delivery_tag > acked)
                acked = (long)a->delivery_tag;
        } else if (f.frame_type == AMQP_FRAME_METHOD &&
                   f.payload.method.id == AMQP_BASIC_NACK_METHOD) {
            fprintf(stderr, "nacked\n");
            return acked;
        }
    }
    return acked;
}

/* The longest envelope publish-rate writes (BYTES at most this). */
#define RAW_ENVELOPE_MAX 1024
/* Room for a pack of MQ_ENVELOPE_PACK_MAX envelopes, their commas and brackets. */
static char g_body[MQ_ENVELOPE_PACK_MAX * (RAW_ENVELOPE_MAX + 1) + 2];

/* The shape of publish-rate's messages: claims envelopes each (1: one envelope, no pack), each
 * padded to about bytes (0: as written). */
typedef struct raw_shape {
    int claims, bytes;
} raw_shape;

/* One envelope of a claim's fields at g_body + at, padded to about bytes (0: not padded);
 * returns its length. */
static size_t raw_envelope(size_t at, long i, int k, int bytes)
{
    static const char pad[RAW_ENVELOPE_MAX] = {[0 ... RAW_ENVELOPE_MAX - 2] = 'x'};
    size_t room = sizeof(g_body) - at;
    int n = snprintf(g_body + at, room,
                     "{\"key\":\"bench:%ld:%d\",\"requestId\":\"bench\",\"ts\":%" PRId64
                     ",\"type\":\"bench.raw\",\"data\":{\"kind\":\"claim\",\"userId\":\"%ld\","
                     "\"requestId\":\"b%ld\",\"couponTemplateId\":\"1\",\"shopNumber\":\"1\","
                     "\"source\":0,\"receiveCount\":1,\"userCouponId\":\"%ld\",\"receiveTime\":0,"
                     "\"validEndTime\":0",
                     i, k, now_wall_ms(), i, i, i);
    if (bytes > RAW_ENVELOPE_MAX)
        bytes = RAW_ENVELOPE_MAX;
    int fill = bytes - n - 12; /* ,"pad":"..."}} around the padding */
    if (bytes <= 0 || fill < 0)
        return (size_t)n + (size_t)snprintf(g_body + at + n, room - (size_t)n, "}}");
    return (size_t)n +
           (size_t)snprintf(g_body + at + n, room - (size_t)n, ",\"pad\":\"%.*s\"}}", fill, pad);
}

static const char *raw_body(long i, void *arg)
{
    const raw_shape *shape = arg;
    size_t len = 0;
    if (shape->claims <= 1) {
        raw_envelope(0, i, 0, shape->bytes);
        return g_body;
    }
    for (int k = 0; k < shape->claims; k++) {
        g_body[len++] = k ? ',' : '[';
        len += raw_envelope(len, i, k, shape->bytes);
    }
    g_body[len++] = ']';
    g_body[len] = '\0';
    return g_body;
}

typedef struct backlog_arg {
    int64_t tpl, shop, user0, id0, now;
} backlog_arg;

static const char *backlog_body(long i, void *p)
{
    backlog_arg *a = p;
    int64_t user = a->user0 + i;
    snprintf(g_body, sizeof(g_body),
             "{\"key\":\"%" PRId64 ":bl%ld\",\"ts\":%" PRId64
             ",\"type\":\"coupon.redeem\",\"data\":{\"kind\":\"claim\",\"userId\":\"%" PRId64
             "\",\"requestId\":\"bl%ld\",\"couponTemplateId\":\"%" PRId64
             "\",\"shopNumber\":\"%" PRId64 "\",\"source\":0,\"receiveCount\":1,"
             "\"userCouponId\":\"%" PRId64 "\",\"receiveTime\":%" PRId64
             ",\"validEndTime\":%" PRId64 "}}",
             user, i, a->now, user, i, a->tpl, a->shop, a->id0 + i, a->now,
             a->now + (int64_t)86400000);
    return g_body;
}

/* QUAN_MQ_QUEUE_TYPE, as the services read it; exits on a value they would refuse. */
static mq_conn_queue_type queue_type(void)
{
    mq_conn_queue_type t;
    if (mq_conn_queue_type_parse(getenv("QUAN_MQ_QUEUE_TYPE"), &t) != QN_OK) {
        fprintf(stderr, "QUAN_MQ_QUEUE_TYPE: classic or quorum\n");
        exit(2);
    }
    return t;
}

/* A connection with consumer name's queues declared (NULL on failure, said on stderr). */
static mq_conn *declared(const char *name, const char *key)
{
    mq_conn *c = mq_conn_open(getenv("QUAN_AMQP_URL"), "bench-raw");
    qn_status st = QN_EAGAIN;
    if (c)
        st = mq_conn_declare_consumer(c, name, (const char *const[]){key, NULL}, 0, queue_type());
    if (st != QN_OK) {
        fprintf(stderr, "cannot declare the queues of %s: %s\n", name, mq_conn_errstr(c));
        mq_conn_close(c);
        return NULL;
    }
    return c;
}

static int cmd_publish_rate(double seconds, int window, raw_shape shape)
{
    if (shape.claims < 1 || shape.claims > MQ_ENVELOPE_PACK_MAX || shape.bytes < 0 ||
        shape.bytes > RAW_ENVELOPE_MAX) {
        fprintf(stderr, "publish-rate: CLAIMS is 1..%d, BYTES 0..%d\n", MQ_ENVELOPE_PACK_MAX,
                RAW_ENVELOPE_MAX);
        return 2;
    }
    mq_conn *c = declared("bench-raw", "bench.raw");
    if (!c)
        return 1;
    mq_conn *raw = raw_open();
    if (!raw)
        return 1;
    double t0 = now_mono_s();
    long n = raw_publish(mq_conn_amqp(raw), "bench.raw", 0, window, seconds, raw_body, &shape);
    double dt = now_mono_s() - t0;
    mq_conn_close(raw);
    if (mq_conn_delete_consumer(c, "bench-raw") != QN_OK)
        fprintf(stderr, "could not delete the bench queue\n");
    mq_conn_close(c);
    printf("%.0f\n", (double)n / dt);
    return 0;
}

static int cmd_backlog(int64_t tpl, int64_t shop, int64_t user0, long n)
{
    mq_conn *raw = raw_open();
    if (!raw)
        return 1;
    backlog_arg a = {tpl, shop, user0, (int64_t)1 << 60 | (int64_t)(now_wall_ms() % 1000000) << 24,
                     now_wall_ms()};
    long done = raw_publish(mq_conn_amqp(raw), EVENT_COUPON_REDEEM, n, 512, 0, backlog_body, &a);
    mq_conn_close(raw);
    printf("%ld\n", done);
    return done == n ? 0 : 1;
}

/* Receives n messages of queue doing nothing with them, one multiple ack per batch; the number
 * received (-1 when the consume was refused). */
static long consume_n(mq_conn *raw, const char *queue, long n, int batch)
{
    amqp_connection_state_t st = mq_conn_amqp(raw);
    int prefetch = batch * 2 > 65535 ? 65535 : batch * 2;
    amqp_basic_qos(st, MQ_CONN_CHANNEL, 0, (uint16_t)prefetch, 0);
    amqp_basic_consume(st, MQ_CONN_CHANNEL, amqp_cstring_bytes(queue), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    if (mq_conn_check_last(raw, "basic.consume") != QN_OK) {
        fprintf(stderr, "cannot consume %s: %s\n", queue, mq_conn_errstr(raw));
        return -1;
    }
    long got = 0;
    while (got < n) {
        amqp_envelope_t env;
        struct timeval tv = {10, 0};
        amqp_maybe_release_buffers(st);
        if (amqp_consume_message(st, &env, &tv, 0).reply_type != AMQP_RESPONSE_NORMAL)
            break;
        got++;
        if (got % batch == 0 || got == n)
            amqp_basic_ack(st, MQ_CONN_CHANNEL, env.delivery_tag, 1);
        amqp_destroy_envelope(&env);
    }
    return got;
}

static int cmd_consume_rate(const char *queue, long n, int batch)
{
    mq_conn *raw = raw_open();
    if (!raw)
        return 1;
    double t0 = now_mono_s();
    long got = consume_n(raw, queue, n, batch);
    double dt = now_mono_s() - t0;
    mq_conn_close(raw);
    if (got < 0)
        return 1;
    printf("%.0f\n", (double)got / dt);
    return got == n ? 0 : 1;
}

static int cmd_queue_rate(long n, int window, int batch)
{
    mq_conn *c = declared("bench-raw", "bench.raw");
    if (!c)
        return 1;
    mq_conn *raw = raw_open();
    if (!raw) {
        mq_conn_close(c);
        return 1;
    }
    double t0 = now_mono_s();
    long sent = raw_publish(mq_conn_amqp(raw), "bench.raw", n, window, 0, raw_body,
                            &(raw_shape){.claims = 1});
    double t1 = now_mono_s();
    mq_conn_close(raw);
    long got = -1;
    double t2 = t1, t3 = t1;
    if (sent == n && (raw = raw_open())) {
        t2 = now_mono_s();
        got = consume_n(raw, "quan.bench-raw", n, batch);
        t3 = now_mono_s();
        mq_conn_close(raw);
    }
    if (mq_conn_delete_consumer(c, "bench-raw") != QN_OK)
        fprintf(stderr, "could not delete the bench queue\n");
    mq_conn_close(c);
    if (sent != n || got != n) {
        fprintf(stderr, "published %ld, consumed %ld of %ld\n", sent, got, n);
        return 1;
    }
    printf("%.0f %.0f\n", (double)sent / (t1 - t0), (double)got / (t3 - t2));
    return 0;
}

static int cmd_declare_queues(const char *name, const char *key)
{
    mq_conn *c = declared(name, key);
    mq_conn_close(c);
    return c ? 0 : 1;
}

static int cmd_delete_queues(const char *name)
{
    mq_conn *c = mq_conn_open(getenv("QUAN_AMQP_URL"), "bench-raw");
    int rc = c && mq_conn_delete_consumer(c, name) == QN_OK ? 0 : 1;
    if (rc)
        fprintf(stderr, "cannot delete the queues of %s: %s\n", name, mq_conn_errstr(c));
    mq_conn_close(c);
    return rc;
}

static int cmd_publish(const char *key, const char *data, int n)
{
    mq_conn *c = mq_conn_open(getenv("QUAN_AMQP_URL"), "bench-claims");
    if (!c)
        return 1;
    mq_msg m = {.routing_key = EVENT_COUPON_REDEEM, .key = key, .data_json = data};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = mq_conn_publish_confirmed(c, &m, 5000) == QN_OK ? 0 : 1;
    mq_conn_close(c);
    return rc;
}

/* A pack as the publisher makes one ("[envelope,...]"); without its x-pack header, which the
 * consumer does not need (it reads a pack by its bracket). */
static int cmd_publish_pack(int n, char **kv, int nkv)
{
    size_t len = 0, cap = 2;
    char *body = NULL, *env[64] = {0};
    int count = nkv / 2, rc = 1;
    mq_conn *c = NULL;
    if (count < 1 || count > 64 || nkv % 2 != 0) {
        fprintf(stderr, "publish-pack: 1 to 64 KEY DATA pairs\n");
        return 2;
    }
    for (int i = 0; i < count; i++) {
        if (!(env[i] = mq_envelope_build(EVENT_COUPON_REDEEM, kv[2 * i], NULL, NULL, 0,
                                         kv[2 * i + 1]))) {
            fprintf(stderr, "publish-pack: claim %d is not JSON\n", i);
            goto out;
        }
        cap += strlen(env[i]) + 1;
    }
    if (!(body = malloc(cap + 1)))
        goto out;
    for (int i = 0; i < count; i++) {
        body[len++] = i == 0 ? '[' : ',';
        memcpy(body + len, env[i], strlen(env[i]));
        len += strlen(env[i]);
    }
    body[len++] = ']';
    body[len] = '\0';
    if (!(c = mq_conn_open(getenv("QUAN_AMQP_URL"), "bench-claims")))
        goto out;
    mq_msg m = {.routing_key = EVENT_COUPON_REDEEM, .key = kv[0], .body = body};
    rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = mq_conn_publish_confirmed(c, &m, 5000) == QN_OK ? 0 : 1;
out:
    mq_conn_close(c);
    for (int i = 0; i < count; i++)
        free(env[i]);
    free(body);
    return rc;
}

static int cmd_wait_stock(int64_t tpl, int64_t shop, int64_t below, double limit_s)
{
    shard_route tr;
    char sql[160];
    if (shard_route_for("t_coupon_template", shop, &tr) != QN_OK)
        return 1;
    PGconn *pg = PQconnectdb(getenv(tr.ds ? "QUAN_DS1_DSN" : "QUAN_DS0_DSN"));
    if (PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "cannot connect to PostgreSQL\n");
        PQfinish(pg);
        return 1;
    }
    snprintf(sql, sizeof(sql), "SELECT stock FROM %s WHERE shop_number = $1 AND id = $2", tr.table);
    pgparam p = {0};
    pgparam_i64(&p, shop);
    pgparam_i64(&p, tpl);
    double end = now_mono_s() + limit_s;
    int rc = 1;
    while (now_mono_s() < end) {
        PGresult *r = PQexecParams(pg, sql, p.n, NULL, p.v, NULL, NULL, 0);
        int64_t stock = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : INT64_MAX;
        PQclear(r);
        if (stock <= below) {
            printf("%.3f\n", (double)now_wall_ms() / 1e3);
            rc = 0;
            break;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc)
        fprintf(stderr, "stock still above %" PRId64 " after %.0f s\n", below, limit_s);
    PQfinish(pg);
    return rc;
}

static int cmd_pg_one_tx(int64_t tpl, int64_t shop, int64_t user0, long n)
{
    shard_route tr;
    PGconn *pg[2] = {PQconnectdb(getenv("QUAN_DS0_DSN")), PQconnectdb(getenv("QUAN_DS1_DSN"))};
    if (PQstatus(pg[0]) != CONNECTION_OK || PQstatus(pg[1]) != CONNECTION_OK ||
        shard_route_for("t_coupon_template", shop, &tr) != QN_OK) {
        fprintf(stderr, "cannot connect to PostgreSQL\n");
        return 1;
    }
    int64_t id0 = (int64_t)2 << 60 | (int64_t)(now_wall_ms() % 1000000) << 24;
    double t0 = now_mono_s();
    long ok = 0;
    for (long i = 0; i < n; i++) {
        shard_route ur;
        int64_t user = user0 + i;
        if (shard_route_for("t_user_coupon", user, &ur) != QN_OK)
            return 1;
        char sql[512], request_id[24];
        snprintf(request_id, sizeof(request_id), "pg%ld", i);
        /* The claim of the reference, one coupon per transaction, each database in its own
         * transaction (as claimdb.c does when they differ): stock, then coupon. */
        PGresult *r = PQexec(pg[tr.ds], "BEGIN");
        PQclear(r);
        snprintf(
            sql, sizeof(sql),
            "UPDATE %s SET stock = stock - 1 WHERE shop_number = $1 AND id = $2 AND stock >= 1",
            tr.table);
        pgparam p1 = {0};
        pgparam_i64(&p1, shop);
        pgparam_i64(&p1, tpl);
        r = PQexecParams(pg[tr.ds], sql, p1.n, NULL, p1.v, NULL, NULL, 0);
        PQclear(r);
        if (ur.ds != tr.ds) {
            PQclear(PQexec(pg[tr.ds], "COMMIT"));
            PQclear(PQexec(pg[ur.ds], "BEGIN"));
        }
        snprintf(sql, sizeof(sql),
                 "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
                 "valid_start_time, valid_end_time, request_id) VALUES ($1, $2, $3, $4, 1, now(), "
                 "now() + interval '1 day', $5)",
                 ur.table);
        pgparam p2 = {0};
        pgparam_i64(&p2, id0 + i);
        pgparam_i64(&p2, user);
        pgparam_i64(&p2, tpl);
        pgparam_i64(&p2, shop);
        pgparam_str(&p2, request_id);
        r = PQexecParams(pg[ur.ds], sql, p2.n, NULL, p2.v, NULL, NULL, 0);
        ok += PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
        PQclear(PQexec(pg[ur.ds], "COMMIT"));
    }
    double dt = now_mono_s() - t0;
    PQfinish(pg[0]);
    PQfinish(pg[1]);
    printf("%.0f\n", (double)ok / dt);
    return ok == n ? 0 : 1;
}

int main(int argc, char **argv)
{
    log_init("quan-bench-claims", LOGL_ERROR);
    if (argc >= 4 && !strcmp(argv[1], "publish-rate"))
        return cmd_publish_rate(atof(argv[2]), atoi(argv[3]),
                                (raw_shape){.claims = argc >= 5 ? atoi(argv[4]) : 1,
                                            .bytes = argc >= 6 ? atoi(argv[5]) : 0});
    if (argc >= 4 && !strcmp(argv[1], "publish"))
        return cmd_publish(argv[2], argv[3], argc >= 5 ? atoi(argv[4]) : 1);
    if (argc >= 5 && !strcmp(argv[1], "publish-pack"))
        return cmd_publish_pack(atoi(argv[2]), argv + 3, argc - 3);
    if (argc >= 6 && !strcmp(argv[1], "backlog"))
        return cmd_backlog(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atol(argv[5]));
    if (argc >= 5 && !strcmp(argv[1], "queue-rate"))
        return cmd_queue_rate(atol(argv[2]), atoi(argv[3]) > 0 ? atoi(argv[3]) : 1,
                              atoi(argv[4]) > 0 ? atoi(argv[4]) : 1);
    if (argc >= 4 && !strcmp(argv[1], "declare-queues"))
        return cmd_declare_queues(argv[2], argv[3]);
    if (argc >= 3 && !strcmp(argv[1], "delete-queues"))
        return cmd_delete_queues(argv[2]);
    if (argc >= 5 && !strcmp(argv[1], "consume-rate"))
        return cmd_consume_rate(argv[2], atol(argv[3]), atoi(argv[4]) > 0 ? atoi(argv[4]) : 1);
    if (argc >= 6 && !strcmp(argv[1], "wait-stock"))
        return cmd_wait_stock(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atof(argv[5]));
    if (argc >= 6 && !strcmp(argv[1], "pg-one-tx"))
        return cmd_pg_one_tx(atoll(argv[2]), atoll(argv[3]), atoll(argv[4]), atol(argv[5]));
    fprintf(
        stderr,
        "usage: quan-bench-claims publish-rate SECONDS WINDOW [CLAIMS BYTES] | queue-rate N WINDOW "
        "BATCH | declare-queues NAME KEY | delete-queues NAME | publish KEY DATA [N] "
        "| publish-pack N KEY DATA [KEY DATA ...] "
        "| backlog TPL SHOP USER0 N | consume-rate QUEUE N BATCH | wait-stock TPL SHOP "
        "BELOW S | pg-one-tx TPL SHOP USER0 N\n");
    return 2;
}
