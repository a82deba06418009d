/* The consumer runner (mq_consumer.h). */
#include "mq_consumer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mq_conn.h"
#include "mq_dead.h"
#include "mq_thread.h"

#define MQ_CONSUMER_POLL_MS        200  /* first wait of a batch: how often stop is checked */
#define MQ_CONSUMER_REQUEUE_FACTOR 4    /* REQUEUE_LATER goes dead after this x max attempts */
#define MQ_CONSUMER_BATCH_MAX      1000 /* envelopes, when batch_max is 0 */

/* One delivery in hand. */
typedef struct slot {
    amqp_envelope_t raw; /* owned: amqp_destroy_envelope */
    mq_envelope *env;    /* &one, or a pack (owned: mq_envelope_pack_free); NULL: unreadable */
    size_t nenv;
    mq_envelope one;     /* one at a time: the envelope itself */
    mq_dead_marks marks; /* marks.routing_key points into rk */
    char rk[MQ_CONN_NAME_MAX];
    mq_handler_result verdict;
} slot;

struct mq_consumer {
    char *url, *name;
    char **keys; /* NULL-terminated */
    mq_conn_names q;
    char in_name[MQ_CONN_NAME_MAX], out_name[MQ_CONN_NAME_MAX]; /* connection names */
    int prefetch, retry_delay_ms, max_attempts, heartbeat_s, rcvbuf_bytes, batch_wait_ms;
    mq_conn_queue_type queue_type;
    mq_conn_cursor cursor; /* the consumer thread's: both connections, reconnects included */
    size_t batch_max;      /* envelopes; 1 one at a time */
    mq_handler_fn handler;
    mq_batch_fn batch_handler;
    void *arg;
    int (*deps_ready)(void *deps_arg);
    void *deps_arg;
    slot *slots;          /* batch_max: a delivery holds at least one envelope */
    mq_batch_item *items; /* the readable slots, as the handler sees them */
    size_t *item_slot;    /* items[i] is slots[item_slot[i]] */
    mq_conn *in;          /* consuming channel */
    mq_conn *out; /* confirmed republish to .retry/.dead: a second connection, so waiting for
                     a confirm never has to step over deliveries arriving on the first */
    mq_thread t;
    pthread_t keeper;
    int keeper_started;
    int busy;        /* guarded by t.mu: the handler runs, the keeper may use in and out */
    int keeper_quit; /* guarded by t.mu */
    int ready;       /* atomic */
};

/* ---------------------------------------------------------------- heartbeats while busy */

static void keeper_beat(mq_conn *conn)
{
    amqp_frame_t hb = {.frame_type = AMQP_FRAME_HEARTBEAT, .channel = 0};

    if (conn && mq_conn_ok(conn) && amqp_send_frame(mq_conn_amqp(conn), &hb) != AMQP_STATUS_OK)
        mq_conn_fail(conn, "heartbeat: cannot send");
}

/* rabbitmq-c sends heartbeats only while the connection's owner waits on it, and a handler can
 * be busy longer than the broker waits (two heartbeats) before it drops the connection and
 * redelivers what it holds. So while the handler runs, and only then (busy, under t.mu), the
 * keeper sends them on the consumer's connections. */
static void *keeper_main(void *arg)
{
    mq_consumer *c = arg;
    int64_t period = (int64_t)c->heartbeat_s * 1000 / 2;

    pthread_mutex_lock(&c->t.mu);
    while (!c->keeper_quit) {
        mq_thread_wait(&c->t, period);
        if (c->busy && !c->keeper_quit) {
            keeper_beat(c->in);
            keeper_beat(c->out);
        }
    }
    pthread_mutex_unlock(&c->t.mu);
    return NULL;
}

static void consumer_busy(mq_consumer *c, int busy)
{
    pthread_mutex_lock(&c->t.mu);
    c->busy = busy;
    pthread_mutex_unlock(&c->t.mu);
}

/* ---------------------------------------------------------------- connections */

static void consumer_disconnect(mq_consumer *c)
{
    __atomic_store_n(&c->ready, 0, __ATOMIC_RELEASE);
    mq_conn_close(c->in);
    mq_conn_close(c->out);
    c->in = c->out = NULL;
}

static qn_status consumer_connect(mq_consumer *c)
{
    qn_status st = QN_EAGAIN;
    char err[MQ_CONN_ERR_MAX] = "";
    mq_conn_opts in = {.name = c->in_name,
                       .heartbeat_s = c->heartbeat_s,
                       .rcvbuf_bytes = c->rcvbuf_bytes,
                       .cursor = &c->cursor};
    mq_conn_opts out = {
        .name = c->out_name, .confirm = 1, .heartbeat_s = c->heartbeat_s, .cursor = &c->cursor};
    amqp_connection_state_t a;

    if (!(c->in = mq_conn_connect(c->url, &in, err)))
        goto fail;
    st = mq_conn_declare_consumer(c->in, c->name, (const char *const *)c->keys, c->retry_delay_ms,
                                  c->queue_type);
    if (st != QN_OK)
        goto fail;
    a = mq_conn_amqp(c->in);
    amqp_basic_qos(a, MQ_CONN_CHANNEL, 0, (uint16_t)c->prefetch, 0);
    if ((st = mq_conn_check_last(c->in, "basic.qos")) != QN_OK)
        goto fail;
    amqp_basic_consume(a, MQ_CONN_CHANNEL, amqp_cstring_bytes(c->q.main), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    if ((st = mq_conn_check_last(c->in, "basic.consume")) != QN_OK)
        goto fail;
    st = QN_EAGAIN;
    if (!(c->out = mq_conn_connect(c->url, &out, err)))
        goto fail;
    __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
    log_infof(NULL, ((log_field[]){LOG_S("queue", c->q.main), LOG_END}), "mq: consuming");
    return QN_OK;
fail:
    log_errorf(NULL,
               ((log_field[]){LOG_S("queue", c->q.main),
                              LOG_S("error", c->in ? mq_conn_errstr(c->in) : err), LOG_END}),
               "mq: consumer setup failed; retrying");
    consumer_disconnect(c);
    return st;
}

/* Republishes to .retry or .dead, reconnecting the publish connection once if needed. */
static qn_status consumer_republish(mq_consumer *c, const slot *s, const char *queue)
{
    qn_status st = QN_EAGAIN;

    for (int round = 0; round < 2; round++) {
        if (!mq_conn_ok(c->out)) {
            mq_conn_close(c->out);
            c->out = mq_conn_connect(c->url,
                                     &(mq_conn_opts){.name = c->out_name,
                                                     .confirm = 1,
                                                     .heartbeat_s = c->heartbeat_s,
                                                     .cursor = &c->cursor},
                                     NULL);
            if (!c->out)
                continue;
        }
        st = mq_dead_move(c->out, &s->raw.message, queue, &s->marks, MQ_CONN_CONFIRM_TIMEOUT_MS);
        if (st == QN_OK || mq_conn_ok(c->out))
            break;
    }
    return st;
}

/* Reads a frame that is not a delivery (amqp_consume_message put it back). */
static void consumer_other_frame(mq_consumer *c)
{
    amqp_frame_t f;
    int rc = amqp_simple_wait_frame(mq_conn_amqp(c->in), &f);

    if (rc != AMQP_STATUS_OK) {
        mq_conn_fail(c->in, "%s", amqp_error_string2(rc));
        return;
    }
    if (f.frame_type == AMQP_FRAME_METHOD && f.payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
        /* the broker cancelled us (queue deleted): set everything up again */
        mq_conn_fail(c->in, "consumer cancelled by broker");
        return;
    }
    mq_conn_on_frame(c->in, &f, "consume");
}

/* ---------------------------------------------------------------- a batch in hand */

/* Reads the delivery in s->raw: its marks and envelopes. One at a time takes one envelope, a
 * batch a pack or one; anything else goes to the dead-letter queue unseen by the handler. */
static void slot_read(mq_consumer *c, slot *s)
{
    const amqp_basic_properties_t *props = &s->raw.message.properties;
    const char *body = s->raw.message.body.bytes;
    size_t len = s->raw.message.body.len;
    char h[MQ_CONN_NAME_MAX];

    s->verdict = MQ_ACK;
    s->env = NULL;
    s->nenv = 0;
    mq_dead_marks_read(props, s->raw.routing_key, &s->marks, s->rk);
    if (c->batch_handler) {
        qn_status st = mq_envelope_pack_parse(body, len, &s->env, &s->nenv);
        if (st == QN_ENOMEM) { /* not the message's fault: back to the queue */
            s->verdict = MQ_REQUEUE_NOW;
            return;
        }
        if (st != QN_OK)
            s->env = NULL;
    } else if (mq_envelope_parse(body, len, &s->one) == QN_OK) {
        s->env = &s->one;
        s->nenv = 1;
    }
    if (!s->env) {
        log_warnf(NULL,
                  ((log_field[]){LOG_S("queue", c->q.main),
                                 LOG_S("routing_key", s->marks.routing_key), LOG_END}),
                  "mq: malformed envelope; dead-lettering");
        s->nenv = 0;
        s->verdict = MQ_DEAD;
        s->marks.reason = "malformed";
        return;
    }
    if (s->nenv == 1 && !s->env[0].request_id) {
        const char *rid = mq_conn_header_str(props, "x-request-id", h, sizeof(h));
        s->env[0].request_id = rid ? strdup(rid) : NULL;
    }
}

static void slots_release(mq_consumer *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        slot *s = &c->slots[i];
        if (s->env == &s->one)
            mq_envelope_free(&s->one);
        else
            mq_envelope_pack_free(s->env, s->nenv);
        amqp_destroy_envelope(&s->raw);
    }
}

/* Takes the next batch into slots: the first delivery within MQ_CONSUMER_POLL_MS, then those
 * following within batch_wait_ms of each other, until batch_max envelopes. After a stop
 * request it takes nothing more. Returns the deliveries taken; 0 when none came or the
 * connection broke (those taken are dropped: the broker delivers them again). */
static size_t consumer_collect(mq_consumer *c)
{
    amqp_connection_state_t a = mq_conn_amqp(c->in);
    size_t n = 0, nenv = 0;

    while (nenv < c->batch_max && !mq_thread_stopping(&c->t)) {
        int wait_ms = n == 0 ? MQ_CONSUMER_POLL_MS : c->batch_wait_ms;
        struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
        slot *s = &c->slots[n];
        amqp_rpc_reply_t r;

        amqp_maybe_release_buffers(a); /* a delivery owns its memory: held ones are not freed */
        r = amqp_consume_message(a, &s->raw, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            slot_read(c, s);
            nenv += s->nenv ? s->nenv : 1;
            n++;
            continue;
        }
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT)
            break;
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            consumer_other_frame(c);
        } else {
            qn_status st = mq_conn_check(c->in, r, "consume");
            if (mq_conn_ok(c->in)) /* a channel closed under us, or a stray reply: start over */
                mq_conn_fail(c->in, "consume: %s",
                             st == QN_OK ? "unexpected reply" : "channel closed by broker");
        }
        if (!mq_conn_ok(c->in))
            break;
    }
    if (!mq_conn_ok(c->in)) {
        slots_release(c, n);
        return 0;
    }
    return n;
}

/* Where a delivery goes by its verdict: NULL to be acked (or nacked: MQ_REQUEUE_NOW), else the
 * retry or the dead-letter queue, its marks updated for the trip. */
static const char *consumer_route(mq_consumer *c, slot *s)
{
    switch (s->verdict) {
    case MQ_ACK:
    case MQ_REQUEUE_NOW:
        return NULL;
    case MQ_RETRY:
        if (c->deps_ready && !c->deps_ready(c->deps_arg))
            return c->q.retry; /* uncounted: see mq_consumer_opts.deps_ready */
        if (s->marks.attempt >= c->max_attempts) {
            s->marks.reason = "max-attempts";
            return c->q.dead;
        }
        s->marks.attempt++;
        return c->q.retry;
    case MQ_REQUEUE_LATER:
        if (s->marks.requeues + 1 >= MQ_CONSUMER_REQUEUE_FACTOR * c->max_attempts) {
            s->marks.reason = "requeue-limit";
            return c->q.dead;
        }
        s->marks.requeues++;
        return c->q.retry;
    default: /* MQ_DEAD and anything unknown */
        if (!s->marks.reason)
            s->marks.reason = "handler";
        return c->q.dead;
    }
}

/* The W3C trace id (32 hex) out of a traceparent, for log lines; NULL if malformed. */
static const char *trace_id_of(const char *tp, char *buf)
{
    if (!tp || strlen(tp) < 55 || tp[2] != '-' || tp[35] != '-')
        return NULL;
    memcpy(buf, tp + 3, 32);
    buf[32] = '\0';
    return buf;
}

/* Retries and dead letters first (each confirmed), then one ack with multiple=1 up to the
 * highest tag acked: below it, this channel holds nothing unsettled but this batch. Deliveries
 * going back to their queue (MQ_REQUEUE_NOW, or a republish that failed) are nacked one by one
 * before that ack, which then leaves them alone. */
static void consumer_settle(mq_consumer *c, size_t n)
{
    amqp_connection_state_t a = mq_conn_amqp(c->in);
    uint64_t last_ack = 0;
    int pause = 0;

    for (size_t i = 0; i < n; i++) {
        slot *s = &c->slots[i];
        const char *queue = consumer_route(c, s);
        const mq_envelope *e = s->nenv == 1 ? &s->env[0] : NULL;
        char tid[33];
        log_ctx lc = {.request_id = e ? e->request_id : NULL,
                      .trace_id = e ? trace_id_of(e->traceparent, tid) : NULL};

        if (s->verdict == MQ_REQUEUE_NOW) {
            if (amqp_basic_nack(a, MQ_CONN_CHANNEL, s->raw.delivery_tag, 0, 1) != AMQP_STATUS_OK)
                mq_conn_fail(c->in, "basic.nack failed");
            continue;
        }
        if (queue) {
            qn_status st = consumer_republish(c, s, queue);
            if (st != QN_OK) {
                /* Not acked: back to the queue, handled again shortly; nothing is lost. */
                log_errorf(&lc,
                           ((log_field[]){LOG_S("queue", queue), LOG_S("status", qn_status_str(st)),
                                          LOG_END}),
                           "mq: cannot republish; returning the message to its queue");
                if (amqp_basic_nack(a, MQ_CONN_CHANNEL, s->raw.delivery_tag, 0, 1) !=
                    AMQP_STATUS_OK)
                    mq_conn_fail(c->in, "basic.nack failed");
                pause = 1;
                continue;
            }
            if (s->marks.reason)
                log_warnf(&lc,
                          ((log_field[]){LOG_S("queue", queue), LOG_S("reason", s->marks.reason),
                                         LOG_S("key", e ? e->key : ""),
                                         LOG_I("attempt", s->marks.attempt), LOG_END}),
                          "mq: message dead-lettered");
        }
        if (s->raw.delivery_tag > last_ack)
            last_ack = s->raw.delivery_tag;
    }
    if (last_ack && mq_conn_ok(c->in) &&
        amqp_basic_ack(a, MQ_CONN_CHANNEL, last_ack, 1) != AMQP_STATUS_OK)
        mq_conn_fail(c->in, "basic.ack failed");
    if (pause)
        mq_thread_sleep(&c->t, MQ_CONSUMER_PAUSE_MS);
}

/* Hands the readable deliveries to the handler, then settles all n. */
static void consumer_process(mq_consumer *c, size_t n)
{
    qn_status st = QN_OK;
    size_t ni = 0;

    for (size_t i = 0; i < n; i++) {
        slot *s = &c->slots[i];
        if (!s->env)
            continue;
        c->item_slot[ni] = i;
        c->items[ni++] = (mq_batch_item){
            .env = s->env,
            .nenv = s->nenv,
            .info = {.consumer = c->name,
                     .routing_key = s->marks.routing_key,
                     .attempt = s->marks.attempt,
                     .max_attempts = c->max_attempts,
                     .redelivered = s->raw.redelivered,
                     .delivery_tag = s->raw.delivery_tag},
            .verdict = MQ_ACK,
        };
    }
    if (ni > 0) {
        consumer_busy(c, 1);
        if (c->batch_handler)
            st = c->batch_handler(c->items, ni, c->arg);
        else
            c->items[0].verdict = c->handler(c->items[0].env, &c->items[0].info, c->arg);
        consumer_busy(c, 0);
    }
    if (st != QN_OK) {
        uint64_t last = 0;
        for (size_t i = 0; i < n; i++)
            if (c->slots[i].raw.delivery_tag > last)
                last = c->slots[i].raw.delivery_tag;
        log_warnf(NULL,
                  ((log_field[]){LOG_S("queue", c->q.main), LOG_I("deliveries", (int64_t)n),
                                 LOG_S("status", qn_status_str(st)), LOG_END}),
                  "mq: batch failed; its deliveries go back to the queue");
        if (amqp_basic_nack(mq_conn_amqp(c->in), MQ_CONN_CHANNEL, last, 1, 1) != AMQP_STATUS_OK)
            mq_conn_fail(c->in, "basic.nack failed");
        mq_thread_sleep(&c->t, MQ_CONSUMER_PAUSE_MS);
        return;
    }
    for (size_t i = 0; i < ni; i++) {
        slot *s = &c->slots[c->item_slot[i]];
        s->verdict = c->items[i].verdict;
        if (s->verdict == MQ_DEAD)
            s->marks.reason = c->items[i].reason;
    }
    consumer_settle(c, n);
}

/* ---------------------------------------------------------------- life cycle */

static void *consumer_main(void *arg)
{
    mq_consumer *c = arg;

    c->keeper_started = pthread_create(&c->keeper, NULL, keeper_main, c) == 0;
    if (!c->keeper_started)
        log_error(NULL, "mq: cannot start the heartbeat keeper; long handlers may lose the "
                        "connection");
    while (!mq_thread_stopping(&c->t)) {
        size_t n;

        if (!c->in) {
            if (consumer_connect(c) != QN_OK) {
                mq_thread_backoff(&c->t);
                continue;
            }
            mq_thread_connected(&c->t);
        }
        if ((n = consumer_collect(c)) > 0) {
            consumer_process(c, n);
            slots_release(c, n);
        }
        if (c->out)
            mq_conn_poll(c->out); /* the publish connection's heartbeats, between batches */
        if (!mq_conn_ok(c->in)) {
            log_warnf(NULL,
                      ((log_field[]){LOG_S("queue", c->q.main),
                                     LOG_S("error", mq_conn_errstr(c->in)), LOG_END}),
                      "mq: consumer connection lost; reconnecting");
            consumer_disconnect(c);
        }
    }
    /* The batch in hand was settled above; closing returns prefetched ones to the queue. */
    consumer_disconnect(c);
    if (c->keeper_started) {
        pthread_mutex_lock(&c->t.mu);
        c->keeper_quit = 1;
        pthread_cond_broadcast(&c->t.cv);
        pthread_mutex_unlock(&c->t.mu);
        pthread_join(c->keeper, NULL);
    }
    return NULL;
}

static void consumer_free(mq_consumer *c)
{
    if (!c)
        return;
    free(c->url);
    free(c->name);
    if (c->keys)
        for (size_t i = 0; c->keys[i]; i++)
            free(c->keys[i]);
    free(c->keys);
    free(c->slots);
    free(c->items);
    free(c->item_slot);
    free(c);
}

mq_consumer *mq_consumer_start(const mq_consumer_opts *o)
{
    mq_consumer *c = NULL;
    size_t n = 0;
    int prefetch;

    if (!o || !o->url || !o->routing_keys || !o->routing_keys[0] ||
        !o->handler == !o->batch_handler || o->batch_max < 0)
        return NULL;
    if (!(c = calloc(1, sizeof(*c))))
        return NULL;
    if (mq_conn_names_of(o->name, &c->q) != QN_OK)
        goto fail;
    while (o->routing_keys[n])
        n++;
    snprintf(c->in_name, sizeof(c->in_name), "consumer:%s", o->name);
    snprintf(c->out_name, sizeof(c->out_name), "consumer:%s:republish", o->name);
    c->handler = o->handler;
    c->batch_handler = o->batch_handler;
    c->batch_max = !o->batch_handler ? 1
                   : o->batch_max    ? (size_t)o->batch_max
                                     : MQ_CONSUMER_BATCH_MAX;
    c->batch_wait_ms = o->batch_wait_ms > 0 ? o->batch_wait_ms : MQ_CONSUMER_BATCH_WAIT;
    c->url = strdup(o->url);
    c->name = strdup(o->name);
    c->keys = calloc(n + 1, sizeof(*c->keys));
    c->slots = calloc(c->batch_max, sizeof(*c->slots));
    c->items = calloc(c->batch_max, sizeof(*c->items));
    c->item_slot = calloc(c->batch_max, sizeof(*c->item_slot));
    if (!c->url || !c->name || !c->keys || !c->slots || !c->items || !c->item_slot)
        goto fail;
    for (size_t i = 0; i < n; i++)
        if (!(c->keys[i] = strdup(o->routing_keys[i])))
            goto fail;
    prefetch = o->prefetch > 0    ? o->prefetch
               : o->batch_handler ? (int)(c->batch_max > 32767 ? 65535 : c->batch_max * 2)
                                  : MQ_CONSUMER_PREFETCH;
    c->prefetch = prefetch > 65535 ? 65535 : prefetch;
    c->retry_delay_ms = o->retry_delay_ms > 0 ? o->retry_delay_ms : MQ_CONN_RETRY_DELAY_MS;
    c->max_attempts = o->max_attempts > 0 ? o->max_attempts : MQ_CONSUMER_MAX_ATTEMPTS;
    c->heartbeat_s = o->heartbeat_s > 0 ? o->heartbeat_s : MQ_CONN_HEARTBEAT_S;
    c->rcvbuf_bytes = o->rcvbuf_bytes;
    c->queue_type = o->queue_type;
    c->arg = o->arg;
    c->deps_ready = o->deps_ready;
    c->deps_arg = o->deps_arg;
    if (mq_thread_start(&c->t, consumer_main, c) != QN_OK)
        goto fail;
    return c;
fail:
    consumer_free(c);
    return NULL;
}

void mq_consumer_quit(mq_consumer *c)
{
    if (c)
        mq_thread_quit(&c->t);
}

void mq_consumer_stop(mq_consumer *c)
{
    if (!c)
        return;
    mq_thread_stop(&c->t);
    consumer_free(c);
}

int mq_consumer_ready(const mq_consumer *c)
{
    return c && __atomic_load_n(&c->ready, __ATOMIC_ACQUIRE);
}
