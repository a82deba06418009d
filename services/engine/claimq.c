/* The batching engine.redeem consumer (claimq.h). */
#include "claimq.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/event.h>

#include "claimdb.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "redis.h"
#include "ucoupon.h"

#define CQ_CONSUMER      "engine.redeem"
#define CQ_GUARD_RUN_MS  60000   /* CONSUMING: a batch takes far less */
#define CQ_GUARD_DONE_MS 3600000 /* CONSUMED */
#define CQ_FIRST_WAIT_MS 200     /* wait for the first message of a batch (stop flag checks) */
#define CQ_FILL_WAIT_MS  2       /* then take what arrives within this, up to the batch size */

enum { CQ_MALFORMED = 0, CQ_CLAIM, CQ_WALLET };
enum { CQ_ACK = 0, CQ_NACK };

typedef struct cq_msg {
    uint64_t tag;
    int redelivered;
    int kind;
    int run;  /* passed the guard: process */
    int done; /* guard said CONSUMED, or an in-batch duplicate: ack only */
    int verdict;
    char key[128];
    claimdb_item item;   /* CQ_CLAIM */
    int64_t wallet_user; /* CQ_WALLET */
    int64_t wallet_coupon, wallet_tpl, wallet_time;
} cq_msg;

typedef struct claimq {
    char *amqp_url, *dsn[2], *redis_host, *redis_password;
    int redis_port, redis_timeout_ms, stmt_timeout_ms;
    int batch;
    redis_scripts *scripts;
    amqp_connection_state_t amqp;
    pgpool_conn *pg[2];
    redisContext *redis;
    cq_msg *msgs;
    pthread_t th;
    int started;
    int stop; /* atomic */
} claimq;

static claimq g_cq;

static int cq_stopping(void)
{
    return __atomic_load_n(&g_cq.stop, __ATOMIC_ACQUIRE);
}

static void cq_sleep_ms(int ms)
{
    for (int waited = 0; waited < ms && !cq_stopping(); waited += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---- connections ---- */

static void cq_amqp_close(void)
{
    if (!g_cq.amqp)
        return;
    amqp_connection_close(g_cq.amqp, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(g_cq.amqp);
    g_cq.amqp = NULL;
}

static char cq_default_vhost[] = "/";

static qn_status cq_amqp_open(void)
{
    struct amqp_connection_info ci;
    char *url = strdup(g_cq.amqp_url);
    qn_status st = QN_ERR;
    const char *what = "url";
    amqp_rpc_reply_t r;
    if (!url)
        return QN_ENOMEM;
    if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK)
        goto done;
    if (!ci.vhost || !*ci.vhost) /* "amqp://h:p/" names the default vhost */
        ci.vhost = cq_default_vhost;
    g_cq.amqp = amqp_new_connection();
    amqp_socket_t *sock = g_cq.amqp ? amqp_tcp_socket_new(g_cq.amqp) : NULL;
    struct timeval tv = {5, 0};
    what = "connect";
    if (!sock || amqp_socket_open_noblock(sock, ci.host, ci.port, &tv) != AMQP_STATUS_OK)
        goto done;
    /* A large receive buffer lets the broker keep delivering while a batch is in the
     * database (intake overlaps the database work); the kernel default holds only a few
     * hundred deliveries. FORCE needs CAP_NET_ADMIN; otherwise the capped size is kept. */
    int rcvbuf = 16 << 20;
    if (setsockopt(amqp_get_sockfd(g_cq.amqp), SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf,
                   sizeof(rcvbuf)) != 0)
        (void)setsockopt(amqp_get_sockfd(g_cq.amqp), SOL_SOCKET, SO_RCVBUF, &rcvbuf,
                         sizeof(rcvbuf));
    r = amqp_login(g_cq.amqp, ci.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ci.user, ci.password);
    what = "login";
    if (r.reply_type != AMQP_RESPONSE_NORMAL)
        goto done;
    what = "channel/qos/consume";
    amqp_channel_open(g_cq.amqp, 1);
    if (amqp_get_rpc_reply(g_cq.amqp).reply_type != AMQP_RESPONSE_NORMAL)
        goto done;
    int prefetch = g_cq.batch * 2 > 65535 ? 65535 : g_cq.batch * 2;
    amqp_basic_qos(g_cq.amqp, 1, 0, (uint16_t)prefetch, 0);
    if (amqp_get_rpc_reply(g_cq.amqp).reply_type != AMQP_RESPONSE_NORMAL)
        goto done;
    amqp_basic_consume(g_cq.amqp, 1, amqp_cstring_bytes(CLAIMQ_QUEUE), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    if (amqp_get_rpc_reply(g_cq.amqp).reply_type != AMQP_RESPONSE_NORMAL)
        goto done;
    st = QN_OK;
    log_info(NULL, "claimq: consuming %s in batches of %d", CLAIMQ_QUEUE, g_cq.batch);
done:
    if (st != QN_OK) {
        log_warn(NULL, "claimq: cannot connect to RabbitMQ (%s); retrying", what);
        cq_amqp_close();
    }
    free(url);
    return st;
}

static qn_status cq_connect(void)
{
    if (!g_cq.redis || g_cq.redis->err) {
        if (g_cq.redis)
            redisFree(g_cq.redis);
        g_cq.redis = redis_sync_connect(g_cq.redis_host, g_cq.redis_port, g_cq.redis_password,
                                        g_cq.redis_timeout_ms);
        if (!g_cq.redis)
            return QN_ERR;
    }
    for (int i = 0; i < 2; i++) {
        if (!g_cq.pg[i]) {
            char name[16];
            snprintf(name, sizeof(name), "ds_%d", i);
            pgpool_opts po = {.dsn = g_cq.dsn[i],
                              .name = name,
                              .application_name = "quan-engine claimq",
                              .statement_timeout_ms = g_cq.stmt_timeout_ms};
            if (!(g_cq.pg[i] = pgpool_conn_open(&po)))
                return QN_ENOMEM;
        }
        if (pgpool_conn_ensure(g_cq.pg[i]) != QN_OK)
            return QN_ERR;
    }
    if (!g_cq.amqp)
        return cq_amqp_open();
    return QN_OK;
}

/* ---- parsing ---- */

static int64_t cq_i64(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v))
        return (int64_t)v->valuedouble;
    return 0;
}

static void cq_parse(cq_msg *m, const amqp_envelope_t *env)
{
    mq_envelope e = {0};
    m->kind = CQ_MALFORMED;
    if (mq_envelope_parse(env->message.body.bytes, env->message.body.len, &e) != QN_OK)
        return;
    snprintf(m->key, sizeof(m->key), "%s", e.key);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e.data, "kind");
    const char *k = cJSON_IsString(kind) ? kind->valuestring : "claim";
    if (!strcmp(k, "wallet")) {
        m->wallet_user = cq_i64(e.data, "userId");
        m->wallet_coupon = cq_i64(e.data, "userCouponId");
        m->wallet_tpl = cq_i64(e.data, "couponTemplateId");
        m->wallet_time = cq_i64(e.data, "receiveTime");
        if (m->wallet_user > 0 && m->wallet_coupon > 0 && m->wallet_tpl > 0)
            m->kind = CQ_WALLET;
    } else if (!strcmp(k, "claim")) {
        ucoupon *u = &m->item.c;
        const cJSON *rid = cJSON_GetObjectItemCaseSensitive(e.data, "requestId");
        u->id = cq_i64(e.data, "userCouponId");
        u->user_id = cq_i64(e.data, "userId");
        u->template_id = cq_i64(e.data, "couponTemplateId");
        u->shop_number = cq_i64(e.data, "shopNumber");
        u->source = (int)cq_i64(e.data, "source");
        u->receive_count = (int)cq_i64(e.data, "receiveCount");
        u->receive_time_ms = cq_i64(e.data, "receiveTime");
        u->valid_start_ms = u->receive_time_ms;
        u->valid_end_ms = cq_i64(e.data, "validEndTime");
        u->status = UCOUPON_UNUSED;
        if (cJSON_IsString(rid))
            snprintf(u->request_id, sizeof(u->request_id), "%s", rid->valuestring);
        if (u->id > 0 && u->user_id > 0 && u->template_id > 0 && u->shop_number > 0 &&
            u->receive_count >= 1 && u->request_id[0] && strchr(u->request_id, '"') == NULL &&
            strchr(u->request_id, '\\') == NULL) {
            m->kind = CQ_CLAIM;
            claimdb_route(&m->item);
        }
    }
    mq_envelope_free(&e);
}

/* ---- Redis, pipelined ---- */

/* Sets run/done/verdict of every message from the consume guard. QN_ERR when Redis failed. */
static qn_status cq_guard_begin(cq_msg *ms, size_t n)
{
    char key[KEYS_LEN];
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        if (ms[i].kind == CQ_MALFORMED || ms[i].done)
            continue;
        keys_redeem_guard(key, ms[i].key);
        redisAppendCommand(g_cq.redis, "SET %s 0 NX GET PX %d", key, CQ_GUARD_RUN_MS);
        sent++;
    }
    qn_status st = QN_OK;
    for (size_t i = 0; i < n; i++) {
        if (ms[i].kind == CQ_MALFORMED || ms[i].done)
            continue;
        redisReply *r = NULL;
        if (redisGetReply(g_cq.redis, (void **)&r) != REDIS_OK || !r) {
            st = QN_ERR;
            break;
        }
        if (r->type == REDIS_REPLY_NIL) {
            ms[i].run = 1;
        } else if (r->type == REDIS_REPLY_STRING && !strcmp(r->str, "1")) {
            ms[i].done = 1;
        } else if (r->type == REDIS_REPLY_STRING) {
            /* Someone holds it: it is ours only once the broker gave it back (holder died);
             * the database keys make a concurrent run harmless anyway. */
            if (ms[i].redelivered)
                ms[i].run = 1;
            else
                ms[i].verdict = CQ_NACK;
        } else {
            st = QN_ERR;
        }
        freeReplyObject(r);
        if (st != QN_OK)
            break;
    }
    (void)sent;
    return st;
}

/* Appends the guard's end for every message run; returns the number of commands. */
static size_t cq_guard_end_append(const cq_msg *ms, size_t n, int commit)
{
    char key[KEYS_LEN];
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        if (!ms[i].run)
            continue;
        keys_redeem_guard(key, ms[i].key);
        if (commit)
            redisAppendCommand(g_cq.redis, "SET %s 1 PX %d", key, CQ_GUARD_DONE_MS);
        else
            redisAppendCommand(g_cq.redis, "DEL %s", key);
        sent++;
    }
    return sent;
}

static void cq_replies_drain(size_t sent)
{
    for (size_t i = 0; i < sent; i++) {
        redisReply *r = NULL;
        if (redisGetReply(g_cq.redis, (void **)&r) != REDIS_OK)
            break;
        freeReplyObject(r);
    }
}

static void cq_guard_end(const cq_msg *ms, size_t n, int commit)
{
    cq_replies_drain(cq_guard_end_append(ms, n, commit));
}

/* ---- database ---- */

typedef qn_status (*cq_step)(pgpool_conn *, int, claimdb_item *, size_t);

/* 1 when step has something to do in database ds (else it would only cost round trips). */
static int cq_step_needed(cq_step fn, int ds, const claimdb_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const claimdb_item *it = &items[i];
        if (fn == claimdb_take_stock && it->state == CLAIMDB_PENDING && it->tpl_ds == ds)
            return 1;
        /* user_ds first: the two databases' inserts run on two threads over one array, each
         * touching only its own items. */
        if (fn == claimdb_insert_coupons && it->user_ds == ds && it->state == CLAIMDB_PENDING)
            return 1;
        if (fn == claimdb_give_back &&
            (it->state == CLAIMDB_REFUSED_SLOT || it->state == CLAIMDB_FAILED) &&
            it->tpl_ds == ds && !it->returned)
            return 1;
    }
    return 0;
}

/* Runs the steps that have work in one transaction of ds; no transaction when none has. */
static qn_status cq_tx(int ds, cq_step fn, cq_step fn2, cq_step fn3, claimdb_item *items, size_t n)
{
    pgpool_conn *c = g_cq.pg[ds];
    cq_step steps[3] = {fn, fn2, fn3};
    int open = 0;
    for (int k = 0; k < 3; k++) {
        if (!steps[k] || !cq_step_needed(steps[k], ds, items, n))
            continue;
        /* Coupons first in the transaction: one INSERT statement (atomic by itself) plus a
         * read, so no BEGIN/COMMIT round trips. A give-back it makes necessary runs in its own
         * transaction below; every step is idempotent, so a crash in between ends the same. */
        if (!open && steps[k] == claimdb_insert_coupons) {
            if (steps[k](c, ds, items, n) != QN_OK)
                goto fail;
            continue;
        }
        if (!open && pgpool_begin(c) != QN_OK)
            goto fail;
        open = 1;
        if (steps[k](c, ds, items, n) != QN_OK)
            goto fail;
    }
    if (open && pgpool_commit(c) != QN_OK)
        goto fail;
    return QN_OK;
fail:
    log_warnf(NULL, ((log_field[]){LOG_I("ds", ds), LOG_S("error", pgpool_conn_error(c)), LOG_END}),
              "claimq: batch transaction failed");
    (void)pgpool_rollback(c);
    return QN_ERR;
}

/* FAILED outcomes, by (user, request id), in ds_0. */
static qn_status cq_save_failed(claimdb_item *items, size_t n)
{
    size_t cap = 64 + n * 160, len = 0;
    char *a[4];
    size_t lens[4] = {0};
    int cnt = 0;
    qn_status st = QN_ENOMEM;
    for (int k = 0; k < 4; k++)
        a[k] = malloc(cap);
    for (int k = 0; k < 4; k++)
        if (!a[k])
            goto done;
    for (size_t i = 0; i < n; i++) {
        if (items[i].state != CLAIMDB_REFUSED_STOCK && items[i].state != CLAIMDB_REFUSED_SLOT)
            continue;
        const char *sep = cnt++ ? "," : "{";
        lens[0] +=
            (size_t)snprintf(a[0] + lens[0], cap - lens[0], "%s%" PRId64, sep, items[i].c.user_id);
        lens[1] +=
            (size_t)snprintf(a[1] + lens[1], cap - lens[1], "%s\"%s\"", sep, items[i].c.request_id);
        lens[2] += (size_t)snprintf(a[2] + lens[2], cap - lens[2], "%s%" PRId64, sep,
                                    items[i].c.template_id);
        lens[3] += (size_t)snprintf(a[3] + lens[3], cap - lens[3], "%s\"%s\"", sep,
                                    claimdb_reason(&items[i]));
    }
    st = QN_OK;
    if (cnt == 0)
        goto done;
    for (int k = 0; k < 4; k++)
        snprintf(a[k] + lens[k], cap - lens[k], "}");
    const char *p[] = {a[0], a[1], a[2], a[3]};
    st = pgpool_exec_cmd(g_cq.pg[0],
                         "INSERT INTO t_claim_result (user_id, request_id, coupon_template_id, "
                         "status, reason) SELECT u, r, t, 2, why FROM unnest($1::bigint[], "
                         "$2::text[], $3::bigint[], $4::text[]) AS x(u, r, t, why) "
                         "ON CONFLICT (user_id, request_id) DO UPDATE SET status = 2, "
                         "reason = excluded.reason, update_time = now()",
                         4, p, NULL);
done:
    (void)len;
    for (int k = 0; k < 4; k++)
        free(a[k]);
    return st;
}

/* Redelivered claims already recorded as FAILED skip the database (their stock was given back
 * and must not be taken again). */
static qn_status cq_known_failures(cq_msg *ms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ms[i].run || ms[i].kind != CQ_CLAIM || !ms[i].redelivered)
            continue;
        char uid[24];
        snprintf(uid, sizeof(uid), "%" PRId64, ms[i].item.c.user_id);
        const char *p[] = {uid, ms[i].item.c.request_id};
        PGresult *r = pgpool_exec(g_cq.pg[0],
                                  "SELECT 1 FROM t_claim_result WHERE user_id = $1 AND "
                                  "request_id = $2 AND status = 2",
                                  2, p);
        if (!r)
            return QN_ERR;
        if (PQntuples(r) == 1)
            ms[i].item.state = CLAIMDB_REFUSED_STOCK;
        PQclear(r);
    }
    return QN_OK;
}

typedef struct cq_ins {
    claimdb_item *items;
    size_t n;
    qn_status st;
} cq_ins;

static void *cq_insert_ds1(void *arg)
{
    cq_ins *a = arg;
    a->st = cq_tx(1, claimdb_insert_coupons, NULL, NULL, a->items, a->n);
    return NULL;
}

/* Step 2 in both databases, in parallel when both have coupons to write. */
static qn_status cq_insert_both(claimdb_item *items, size_t n)
{
    int both = cq_step_needed(claimdb_insert_coupons, 0, items, n) &&
               cq_step_needed(claimdb_insert_coupons, 1, items, n);
    cq_ins a = {items, n, QN_ERR};
    pthread_t th;
    if (!both || pthread_create(&th, NULL, cq_insert_ds1, &a) != 0) {
        if (cq_tx(0, claimdb_insert_coupons, NULL, NULL, items, n) != QN_OK ||
            cq_tx(1, claimdb_insert_coupons, NULL, NULL, items, n) != QN_OK)
            return QN_ERR;
        return QN_OK;
    }
    qn_status st = cq_tx(0, claimdb_insert_coupons, NULL, NULL, items, n);
    pthread_join(th, NULL);
    return st == QN_OK && a.st == QN_OK ? QN_OK : QN_ERR;
}

static qn_status cq_claims(cq_msg *ms, size_t n, claimdb_item *items, size_t *idx, size_t *ni)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ms[i].run && ms[i].kind == CQ_CLAIM) {
            idx[m] = i;
            items[m++] = ms[i].item;
        }
    *ni = m;
    if (m == 0)
        return QN_OK;
    /* Stock first everywhere, then coupons: a coupon never exists without its stock taken.
     * The coupons of the two databases are written at the same time (each one autocommit
     * statement), then the give-backs they made necessary. */
    if (cq_tx(0, claimdb_take_stock, NULL, NULL, items, m) != QN_OK ||
        cq_tx(1, claimdb_take_stock, NULL, NULL, items, m) != QN_OK ||
        cq_insert_both(items, m) != QN_OK ||
        cq_tx(0, claimdb_give_back, NULL, NULL, items, m) != QN_OK ||
        cq_tx(1, claimdb_give_back, NULL, NULL, items, m) != QN_OK)
        return QN_ERR;
    if (cq_save_failed(items, m) != QN_OK)
        return QN_ERR;
    return QN_OK;
}

static qn_status cq_wallets(cq_msg *ms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ms[i].run || ms[i].kind != CQ_WALLET)
            continue;
        ucoupon u;
        qn_status st = ucoupon_load(g_cq.pg[ucoupon_ds(ms[i].wallet_user)], ms[i].wallet_user,
                                    ms[i].wallet_coupon, &u);
        if (st == QN_ENOTFOUND || (st == QN_OK && u.status != UCOUPON_UNUSED)) {
            ms[i].wallet_user = 0; /* nothing to add */
            continue;
        }
        if (st != QN_OK)
            return st;
    }
    return QN_OK;
}

/* After the commits: give refused reservations back, add coupons to wallets. */
static void cq_redis_after(cq_msg *ms, size_t n, claimdb_item *items, size_t m)
{
    char key[KEYS_LEN], k2[KEYS_LEN], k3[KEYS_LEN], member[UCOUPON_MEMBER_LEN];
    size_t sent = 0;
    for (size_t i = 0; i < m; i++) {
        const ucoupon *u = &items[i].c;
        if (claimdb_succeeded(&items[i])) {
            keys_wallet(key, u->user_id);
            ucoupon_member(member, u->template_id, u->id);
            redisAppendCommand(g_cq.redis, "ZADD %s %lld %s", key, (long long)u->receive_time_ms,
                               member);
            sent++;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (ms[i].run && ms[i].kind == CQ_WALLET && ms[i].wallet_user) {
            keys_wallet(key, ms[i].wallet_user);
            ucoupon_member(member, ms[i].wallet_tpl, ms[i].wallet_coupon);
            redisAppendCommand(g_cq.redis, "ZADD %s NX %lld %s", key, (long long)ms[i].wallet_time,
                               member);
            sent++;
        }
    /* The guard's CONSUMED marks ride in the same pipeline (one round trip): they follow the
     * commits, which is all they need. */
    sent += cq_guard_end_append(ms, n, 1);
    cq_replies_drain(sent);
    for (size_t i = 0; i < m; i++) {
        const ucoupon *u = &items[i].c;
        if (items[i].state != CLAIMDB_REFUSED_STOCK && items[i].state != CLAIMDB_REFUSED_SLOT)
            continue;
        keys_template(key, u->template_id);
        keys_template_user(k2, u->template_id, u->user_id);
        keys_template_req(k3, u->template_id, u->user_id, u->request_id);
        const char *keys[3] = {key, k2, k3};
        redisReply *r = redis_sync_eval(g_cq.redis, g_cq.scripts, "claim_undo", 3, keys, 0, NULL);
        if (!r || r->type == REDIS_REPLY_ERROR)
            log_errorf(NULL,
                       ((log_field[]){LOG_I("template", u->template_id), LOG_I("user", u->user_id),
                                      LOG_END}),
                       "claimq: cannot give a refused claim back in Redis");
        if (r)
            freeReplyObject(r);
        metrics_inc_l(METRIC_quan_claims_total, "error");
    }
}

/* ---- one batch ---- */

static double cq_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void cq_process(cq_msg *ms, size_t n)
{
    double t0 = cq_mono(), t1 = t0, t2 = t0, t3 = t0;
    claimdb_item *items = calloc(n, sizeof(*items));
    size_t *idx = calloc(n, sizeof(*idx)), m = 0;
    int failed = 0;

    for (size_t i = 0; i < n; i++) {
        if (ms[i].kind == CQ_MALFORMED) {
            log_warn(NULL, "claimq: malformed message dropped");
            continue;
        }
        for (size_t j = 0; j < i; j++) /* the same message twice in one batch */
            if (ms[j].kind != CQ_MALFORMED && !strcmp(ms[j].key, ms[i].key)) {
                ms[i].done = 1;
                break;
            }
    }
    if (!items || !idx || cq_guard_begin(ms, n) != QN_OK) {
        failed = 1;
        goto end;
    }
    t1 = cq_mono();
    if (cq_known_failures(ms, n) != QN_OK || cq_claims(ms, n, items, idx, &m) != QN_OK ||
        cq_wallets(ms, n) != QN_OK) {
        failed = 1;
        goto end;
    }
    t2 = cq_mono();
    cq_redis_after(ms, n, items, m);
    t3 = cq_mono();
end:
    if (failed) {
        /* Nothing decided is lost: every step is idempotent; the batch comes back. */
        if (g_cq.redis && !g_cq.redis->err)
            cq_guard_end(ms, n, 0);
        for (size_t i = 0; i < n; i++)
            ms[i].verdict = CQ_NACK;
    }
    /* Nacks one by one first, then ONE ack with multiple=1 up to the highest acked tag: the
     * channel has nothing unsettled below it but this batch (one batch at a time). */
    uint64_t last_ack = 0;
    int rc = AMQP_STATUS_OK;
    for (size_t i = 0; i < n; i++) {
        metrics_inc_l(METRIC_quan_mq_consumed_total, CQ_CONSUMER,
                      ms[i].verdict == CQ_NACK ? "retry"
                      : ms[i].done             ? "skip"
                                               : "ack");
        if (ms[i].verdict == CQ_ACK) {
            if (ms[i].tag > last_ack)
                last_ack = ms[i].tag;
        } else if (rc == AMQP_STATUS_OK) {
            rc = amqp_basic_nack(g_cq.amqp, 1, ms[i].tag, 0, 1);
        }
    }
    if (rc == AMQP_STATUS_OK && last_ack)
        rc = amqp_basic_ack(g_cq.amqp, 1, last_ack, 1);
    if (rc != AMQP_STATUS_OK)
        cq_amqp_close();
    log_at(LOGL_DEBUG, NULL,
           ((log_field[]){LOG_I("n", (int64_t)n), LOG_I("guard_us", (int64_t)((t1 - t0) * 1e3)),
                          LOG_I("db_us", (int64_t)((t2 - t1) * 1e3)),
                          LOG_I("redis_us", (int64_t)((t3 - t2) * 1e3)),
                          LOG_I("ack_us", (int64_t)((cq_mono() - t3) * 1e3)), LOG_END}),
           "claimq: batch");
    free(items);
    free(idx);
    if (failed)
        cq_sleep_ms(1000);
}

static void *cq_main(void *arg)
{
    (void)arg;
    while (!cq_stopping()) {
        if (cq_connect() != QN_OK) {
            cq_sleep_ms(1000);
            continue;
        }
        size_t n = 0;
        while (n < (size_t)g_cq.batch && !cq_stopping()) {
            amqp_envelope_t env;
            int wait = n == 0 ? CQ_FIRST_WAIT_MS : CQ_FILL_WAIT_MS;
            struct timeval tv = {0, wait * 1000};
            amqp_maybe_release_buffers(g_cq.amqp);
            amqp_rpc_reply_t r = amqp_consume_message(g_cq.amqp, &env, &tv, 0);
            if (r.reply_type == AMQP_RESPONSE_NORMAL) {
                cq_msg *m = &g_cq.msgs[n++];
                memset(m, 0, sizeof(*m));
                m->tag = env.delivery_tag;
                m->redelivered = env.redelivered;
                cq_parse(m, &env);
                amqp_destroy_envelope(&env);
                continue;
            }
            if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                r.library_error == AMQP_STATUS_TIMEOUT)
                break;
            log_warn(NULL, "claimq: RabbitMQ connection lost; reconnecting");
            cq_amqp_close(); /* unacked deliveries go back to the queue */
            n = 0;
            break;
        }
        if (n > 0 && g_cq.amqp)
            cq_process(g_cq.msgs, n);
    }
    cq_amqp_close();
    return NULL;
}

/* ---- life cycle ---- */

/* At the drain (off the loop thread): finish the batch in hand, then stop and join. */
static void cq_stop(void *arg)
{
    (void)arg;
    __atomic_store_n(&g_cq.stop, 1, __ATOMIC_RELEASE);
    if (g_cq.started)
        pthread_join(g_cq.th, NULL);
    g_cq.started = 0;
}

/* From service_free: the thread is gone (cq_stop ran at the drain, or runs here). */
static void cq_free(void *arg)
{
    cq_stop(arg);
    for (int i = 0; i < 2; i++) {
        pgpool_conn_close(g_cq.pg[i]);
        g_cq.pg[i] = NULL;
        free(g_cq.dsn[i]);
        g_cq.dsn[i] = NULL;
    }
    if (g_cq.redis)
        redisFree(g_cq.redis);
    redis_scripts_free(g_cq.scripts);
    free(g_cq.msgs);
    free(g_cq.amqp_url);
    free(g_cq.redis_host);
    free(g_cq.redis_password);
    g_cq.redis = NULL;
    g_cq.scripts = NULL;
    g_cq.msgs = NULL;
    g_cq.amqp_url = g_cq.redis_host = g_cq.redis_password = NULL;
}

qn_status claimq_start(engine *e)
{
    const service_config *cfg = &e->cfg->common;
    g_cq.batch = (int)e->cfg->claim_batch;
    g_cq.amqp_url = strdup(cfg->amqp_url);
    g_cq.dsn[0] = strdup(cfg->ds_dsn[0]);
    g_cq.dsn[1] = strdup(cfg->ds_dsn[1]);
    g_cq.redis_host = strdup(cfg->redis_host);
    g_cq.redis_password = strdup(cfg->redis_password ? cfg->redis_password : "");
    g_cq.redis_port = (int)cfg->redis_port;
    g_cq.redis_timeout_ms = (int)cfg->redis_timeout_ms * 5;
    g_cq.stmt_timeout_ms = (int)cfg->pg_statement_timeout_ms;
    g_cq.scripts = redis_scripts_load_dir(cfg->lua_dir);
    g_cq.msgs = calloc((size_t)g_cq.batch, sizeof(cq_msg));
    if (!g_cq.amqp_url || !g_cq.dsn[0] || !g_cq.dsn[1] || !g_cq.redis_host ||
        !g_cq.redis_password || !g_cq.scripts || !g_cq.msgs)
        return QN_ENOMEM;
    /* The batch consumer has its own thread and connections: the service stops it during the
     * drain (the drain waits for the batch in hand) and frees it at exit. */
    if (service_at_free(e->svc, cq_free, NULL) != QN_OK ||
        service_at_drain(e->svc, cq_stop, NULL) != QN_OK)
        return QN_ERR;
    if (pthread_create(&g_cq.th, NULL, cq_main, NULL) != 0)
        return QN_ERR;
    g_cq.started = 1;
    return QN_OK;
}
