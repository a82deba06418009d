/* The consumer runner (mq_consumer.h). */
#include "mq_consumer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mq_conn.h"
#include "mq_dead.h"
#include "mq_thread.h"

#define MQ_CONSUMER_POLL_MS        200 /* how often the stop flag is checked */
#define MQ_CONSUMER_REQUEUE_FACTOR 4   /* REQUEUE_LATER goes dead after this x max attempts */

struct mq_consumer {
    char *url, *name;
    char **keys; /* NULL-terminated */
    mq_conn_names q;
    char in_name[MQ_CONN_NAME_MAX], out_name[MQ_CONN_NAME_MAX]; /* connection names */
    int prefetch, retry_delay_ms, max_attempts;
    mq_handler_fn handler;
    void *arg;
    mq_conn *in;  /* consuming channel */
    mq_conn *out; /* confirmed republish to .retry/.dead: a second connection, so waiting for
                     a confirm never has to step over deliveries arriving on the first */
    mq_thread t;
    int ready; /* atomic */
};

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
    amqp_connection_state_t a;

    if (!(c->in = mq_conn_connect(c->url, &(mq_conn_opts){.name = c->in_name}, err)))
        goto fail;
    st = mq_conn_declare_consumer(c->in, c->name, (const char *const *)c->keys, c->retry_delay_ms);
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
    if (!(c->out =
              mq_conn_connect(c->url, &(mq_conn_opts){.name = c->out_name, .confirm = 1}, err)))
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
static qn_status consumer_republish(mq_consumer *c, const amqp_envelope_t *env, const char *queue,
                                    const mq_dead_marks *marks)
{
    qn_status st = QN_EAGAIN;

    for (int round = 0; round < 2; round++) {
        if (!mq_conn_ok(c->out)) {
            mq_conn_close(c->out);
            c->out =
                mq_conn_connect(c->url, &(mq_conn_opts){.name = c->out_name, .confirm = 1}, NULL);
            if (!c->out)
                continue;
        }
        st = mq_dead_move(c->out, &env->message, queue, marks, MQ_CONN_CONFIRM_TIMEOUT_MS);
        if (st == QN_OK || mq_conn_ok(c->out))
            break;
    }
    return st;
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

static void consumer_handle(mq_consumer *c, amqp_envelope_t *env)
{
    const amqp_basic_properties_t *props = &env->message.properties;
    char rkbuf[MQ_CONN_NAME_MAX], hbuf[MQ_CONN_NAME_MAX], tid[33];
    const char *queue = NULL;
    mq_dead_marks m;
    mq_envelope e = {0};
    mq_handler_result res;
    log_ctx lc = {0};

    mq_dead_marks_read(props, env->routing_key, &m, rkbuf);
    mq_delivery_info info = {
        .consumer = c->name,
        .routing_key = m.routing_key,
        .attempt = m.attempt,
        .max_attempts = c->max_attempts,
        .redelivered = env->redelivered,
        .delivery_tag = env->delivery_tag,
    };

    if (mq_envelope_parse(env->message.body.bytes, env->message.body.len, &e) != QN_OK) {
        log_warnf(NULL,
                  ((log_field[]){LOG_S("queue", c->q.main), LOG_S("routing_key", m.routing_key),
                                 LOG_END}),
                  "mq: malformed envelope; dead-lettering");
        res = MQ_DEAD;
        m.reason = "malformed";
    } else {
        if (!e.request_id) {
            const char *h = mq_conn_header_str(props, "x-request-id", hbuf, sizeof(hbuf));
            e.request_id = h ? strdup(h) : NULL;
        }
        lc.request_id = e.request_id;
        lc.trace_id = trace_id_of(e.traceparent, tid);
        res = c->handler(&e, &info, c->arg);
    }

    switch (res) {
    case MQ_ACK:
        break;
    case MQ_RETRY:
        if (m.attempt >= c->max_attempts) {
            queue = c->q.dead;
            m.reason = "max-attempts";
        } else {
            queue = c->q.retry;
            m.attempt++;
        }
        break;
    case MQ_REQUEUE_LATER:
        if (m.requeues + 1 >= MQ_CONSUMER_REQUEUE_FACTOR * c->max_attempts) {
            queue = c->q.dead;
            m.reason = "requeue-limit";
        } else {
            queue = c->q.retry;
            m.requeues++;
        }
        break;
    default: /* MQ_DEAD and anything unknown */
        queue = c->q.dead;
        if (!m.reason)
            m.reason = "handler";
        break;
    }

    if (queue) {
        qn_status st = consumer_republish(c, env, queue, &m);
        if (st != QN_OK) {
            /* Not acked: back to the queue, handled again shortly; nothing is lost. */
            log_errorf(
                &lc,
                ((log_field[]){LOG_S("queue", queue), LOG_S("status", qn_status_str(st)), LOG_END}),
                "mq: cannot republish; returning the message to its queue");
            if (amqp_basic_nack(mq_conn_amqp(c->in), MQ_CONN_CHANNEL, env->delivery_tag, 0, 1) !=
                AMQP_STATUS_OK)
                mq_conn_fail(c->in, "basic.nack failed");
            mq_thread_sleep(&c->t, 1000);
            goto done;
        }
        if (m.reason)
            log_warnf(&lc,
                      ((log_field[]){LOG_S("queue", queue), LOG_S("reason", m.reason),
                                     LOG_S("key", e.key), LOG_I("attempt", m.attempt), LOG_END}),
                      "mq: message dead-lettered");
    }
    if (amqp_basic_ack(mq_conn_amqp(c->in), MQ_CONN_CHANNEL, env->delivery_tag, 0) !=
        AMQP_STATUS_OK)
        mq_conn_fail(c->in, "basic.ack failed");
done:
    mq_envelope_free(&e);
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

static void *consumer_main(void *arg)
{
    mq_consumer *c = arg;

    while (!mq_thread_stopping(&c->t)) {
        amqp_envelope_t env;
        amqp_rpc_reply_t r;
        struct timeval tv = {.tv_usec = MQ_CONSUMER_POLL_MS * 1000};

        if (!c->in) {
            if (consumer_connect(c) != QN_OK) {
                mq_thread_backoff(&c->t);
                continue;
            }
            mq_thread_connected(&c->t);
        }
        amqp_maybe_release_buffers(mq_conn_amqp(c->in));
        r = amqp_consume_message(mq_conn_amqp(c->in), &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            consumer_handle(c, &env);
            amqp_destroy_envelope(&env);
        } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                   r.library_error == AMQP_STATUS_TIMEOUT) {
            if (c->out)
                mq_conn_poll(c->out); /* keep the idle publish connection's heartbeats going */
        } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                   r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            consumer_other_frame(c);
        } else {
            qn_status st = mq_conn_check(c->in, r, "consume");
            if (mq_conn_ok(c->in)) /* a channel closed under us, or a stray reply: start over */
                mq_conn_fail(c->in, "consume: %s",
                             st == QN_OK ? "unexpected reply" : "channel closed by broker");
        }
        if (!mq_conn_ok(c->in)) {
            log_warnf(NULL,
                      ((log_field[]){LOG_S("queue", c->q.main),
                                     LOG_S("error", mq_conn_errstr(c->in)), LOG_END}),
                      "mq: consumer connection lost; reconnecting");
            consumer_disconnect(c);
        }
    }
    /* The message in hand was acked above; closing returns prefetched ones to the queue. */
    consumer_disconnect(c);
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
    free(c);
}

mq_consumer *mq_consumer_start(const mq_consumer_opts *o)
{
    mq_consumer *c = NULL;
    size_t n = 0;

    if (!o || !o->url || !o->handler || !o->routing_keys || !o->routing_keys[0])
        return NULL;
    if (!(c = calloc(1, sizeof(*c))))
        return NULL;
    if (mq_conn_names_of(o->name, &c->q) != QN_OK)
        goto fail;
    while (o->routing_keys[n])
        n++;
    snprintf(c->in_name, sizeof(c->in_name), "consumer:%s", o->name);
    snprintf(c->out_name, sizeof(c->out_name), "consumer:%s:republish", o->name);
    c->url = strdup(o->url);
    c->name = strdup(o->name);
    c->keys = calloc(n + 1, sizeof(*c->keys));
    if (!c->url || !c->name || !c->keys)
        goto fail;
    for (size_t i = 0; i < n; i++)
        if (!(c->keys[i] = strdup(o->routing_keys[i])))
            goto fail;
    c->prefetch = o->prefetch > 0 ? o->prefetch : MQ_CONSUMER_PREFETCH;
    if (c->prefetch > 65535)
        c->prefetch = 65535;
    c->retry_delay_ms = o->retry_delay_ms > 0 ? o->retry_delay_ms : MQ_CONN_RETRY_DELAY_MS;
    c->max_attempts = o->max_attempts > 0 ? o->max_attempts : MQ_CONSUMER_MAX_ATTEMPTS;
    c->handler = o->handler;
    c->arg = o->arg;
    if (mq_thread_start(&c->t, consumer_main, c) != QN_OK)
        goto fail;
    return c;
fail:
    consumer_free(c);
    return NULL;
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
