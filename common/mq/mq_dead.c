/* Retries and dead letters (mq_dead.h). */
#include "mq_dead.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void mq_dead_marks_read(const amqp_basic_properties_t *p, amqp_bytes_t delivery_rk,
                        mq_dead_marks *out, char rk[MQ_CONN_NAME_MAX])
{
    out->attempt = (int)mq_conn_header_int(p, "x-attempt", 1);
    if (out->attempt < 1)
        out->attempt = 1;
    out->requeues = (int)mq_conn_header_int(p, "x-requeues", 0);
    if (out->requeues < 0)
        out->requeues = 0;
    out->routing_key = mq_conn_header_str(p, "x-routing-key", rk, MQ_CONN_NAME_MAX);
    if (!out->routing_key)
        out->routing_key = mq_conn_bytes_str(delivery_rk, rk, MQ_CONN_NAME_MAX);
    out->reason = NULL;
}

static int header_ours(amqp_bytes_t k)
{
    static const char *const drop[] = {"x-attempt", "x-requeues", "x-routing-key", "x-dead-reason",
                                       NULL};
    for (int i = 0; drop[i]; i++)
        if (mq_conn_bytes_eq(k, drop[i]))
            return 1;
    /* The broker's dead-letter bookkeeping from the retry queue; x-attempt replaces it. */
    return (k.len >= 7 && memcmp(k.bytes, "x-death", 7) == 0) ||
           (k.len >= 13 && memcmp(k.bytes, "x-first-death", 13) == 0) ||
           (k.len >= 12 && memcmp(k.bytes, "x-last-death", 12) == 0);
}

qn_status mq_dead_move(mq_conn *c, const amqp_message_t *msg, const char *queue,
                       const mq_dead_marks *m, int timeout_ms)
{
    const amqp_basic_properties_t *op = &msg->properties;
    amqp_basic_properties_t p = *op;
    int n = (op->_flags & AMQP_BASIC_HEADERS_FLAG) ? op->headers.num_entries : 0, k = 0;
    amqp_table_entry_t *h = calloc((size_t)n + 4, sizeof(*h));
    mq_conn_pending pend = {0};
    char key[MQ_CONN_NAME_MAX] = "";
    qn_status st = QN_ENOMEM;

    if (!h)
        goto done;
    for (int i = 0; i < n; i++)
        if (!header_ours(op->headers.entries[i].key))
            h[k++] = op->headers.entries[i];
    h[k].key = amqp_cstring_bytes("x-attempt");
    h[k].value.kind = AMQP_FIELD_KIND_I64;
    h[k++].value.value.i64 = m->attempt;
    if (m->requeues > 0) {
        h[k].key = amqp_cstring_bytes("x-requeues");
        h[k].value.kind = AMQP_FIELD_KIND_I64;
        h[k++].value.value.i64 = m->requeues;
    }
    if (m->routing_key) {
        h[k].key = amqp_cstring_bytes("x-routing-key");
        h[k].value.kind = AMQP_FIELD_KIND_UTF8;
        h[k++].value.value.bytes = amqp_cstring_bytes(m->routing_key);
    }
    if (m->reason) {
        h[k].key = amqp_cstring_bytes("x-dead-reason");
        h[k].value.kind = AMQP_FIELD_KIND_UTF8;
        h[k++].value.value.bytes = amqp_cstring_bytes(m->reason);
    }
    p._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    p._flags &= ~AMQP_BASIC_EXPIRATION_FLAG;
    p.delivery_mode = 2;
    p.headers.num_entries = k;
    p.headers.entries = h;
    st = mq_conn_publish_raw(c, "", queue, &p, msg->body.bytes, msg->body.len, &pend.tag);
    if (st != QN_OK)
        goto done;
    if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        mq_conn_bytes_str(p.message_id, key, sizeof(key));
    pend.key = key;
    pend.rk = queue;
    mq_conn_confirm(c, &pend, 1, timeout_ms);
    st = pend.st;
done:
    free(h);
    return st;
}

/* ---------------------------------------------------------------- operator tooling */

static mq_conn *dead_connect(const char *url, const char *label, int confirm)
{
    char err[MQ_CONN_ERR_MAX];
    mq_conn *c = mq_conn_connect(url, &(mq_conn_opts){.name = label, .confirm = confirm}, err);

    if (!c)
        log_errorf(NULL, ((log_field[]){LOG_S("error", err), LOG_END}),
                   "mq: cannot open connection");
    return c;
}

/* basic.get one message; *got = 0 when the queue is empty. msg is valid when *got, and rk (when
 * not NULL, MQ_CONN_NAME_MAX bytes) holds the routing key it was delivered with. */
static qn_status dead_get_rk(mq_conn *c, const char *queue, amqp_message_t *msg, uint64_t *tag,
                             int *got, char *rk)
{
    qn_status st;
    amqp_connection_state_t a = mq_conn_amqp(c);
    amqp_rpc_reply_t r = amqp_basic_get(a, MQ_CONN_CHANNEL, amqp_cstring_bytes(queue), 0);

    *got = 0;
    if ((st = mq_conn_check(c, r, "basic.get")) != QN_OK)
        return st;
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
        return QN_OK; /* get-empty */
    *tag = ((amqp_basic_get_ok_t *)r.reply.decoded)->delivery_tag;
    if (rk)
        mq_conn_bytes_str(((amqp_basic_get_ok_t *)r.reply.decoded)->routing_key, rk,
                          MQ_CONN_NAME_MAX);
    if ((st = mq_conn_check(c, amqp_read_message(a, MQ_CONN_CHANNEL, msg, 0), "read")) != QN_OK)
        return st;
    *got = 1;
    return QN_OK;
}

static qn_status dead_get(mq_conn *c, const char *queue, amqp_message_t *msg, uint64_t *tag,
                          int *got)
{
    return dead_get_rk(c, queue, msg, tag, got, NULL);
}

qn_status mq_dead_list(const char *url, const char *name, int max, mq_dead_fn fn, void *arg)
{
    qn_status st;
    mq_conn_names q;
    mq_conn *c = NULL;
    uint64_t tag = 0, last = 0;

    if (!fn || (st = mq_conn_names_of(name, &q)) != QN_OK)
        return QN_EINVAL;
    if (!(c = dead_connect(url, "dead-list", 0)))
        return QN_EAGAIN;
    for (int i = 0; i < max; i++) {
        amqp_message_t msg;
        char rb[MQ_CONN_NAME_MAX];
        int got;

        if ((st = dead_get(c, q.dead, &msg, &tag, &got)) != QN_OK || !got)
            break;
        last = tag;
        fn(msg.body.bytes, msg.body.len, (int)mq_conn_header_int(&msg.properties, "x-attempt", 1),
           mq_conn_header_str(&msg.properties, "x-dead-reason", rb, sizeof(rb)), arg);
        amqp_destroy_message(&msg);
        amqp_maybe_release_buffers(mq_conn_amqp(c));
    }
    /* Put everything back where it was: listing must not consume. */
    if (last && mq_conn_ok(c) &&
        amqp_basic_nack(mq_conn_amqp(c), MQ_CONN_CHANNEL, last, 1, 1) != AMQP_STATUS_OK)
        mq_conn_fail(c, "basic.nack failed");
    mq_conn_close(c);
    return st;
}

qn_status mq_dead_replay(const char *url, const char *name, int max, int *moved)
{
    qn_status st;
    mq_conn_names q;
    mq_conn *c = NULL;
    uint32_t present = 0;

    *moved = 0;
    if ((st = mq_conn_names_of(name, &q)) != QN_OK)
        return st;
    if (!(c = dead_connect(url, "dead-replay", 1)))
        return QN_EAGAIN;
    /*
     * Only the messages dead at the start: a replayed message that fails again comes back to
     * this queue, and taking "until empty" would take it again for as long as its consumer
     * keeps up. The queue is FIFO and nothing else takes from it, so the first `present`
     * messages basic.get returns are exactly the ones counted: whatever is dead-lettered after
     * the count (a replayed message included) queues up behind them. A message that arrives
     * while the count is read is either counted, and then ahead of all later ones, or not, and
     * then behind every counted one; either way replay moves the queue as it stood at one
     * instant. Fewer than counted (someone purged it) ends at the first empty get.
     */
    if ((st = mq_conn_queue_count(c, q.dead, &present)) != QN_OK)
        goto done;
    if (max > 0 && (uint32_t)max > present)
        max = (int)present;
    for (int i = 0; i < max; i++) {
        amqp_message_t msg;
        char rb[MQ_CONN_NAME_MAX];
        mq_dead_marks marks = {.attempt = 1}; /* a fresh start: attempts and requeues reset */
        uint64_t tag = 0;
        int got;

        if ((st = dead_get(c, q.dead, &msg, &tag, &got)) != QN_OK || !got)
            break;
        marks.routing_key = mq_conn_header_str(&msg.properties, "x-routing-key", rb, sizeof(rb));
        st = mq_dead_move(c, &msg, q.main, &marks, MQ_CONN_CONFIRM_TIMEOUT_MS);
        amqp_destroy_message(&msg);
        if (st != QN_OK) {
            if (mq_conn_ok(c))
                (void)amqp_basic_nack(mq_conn_amqp(c), MQ_CONN_CHANNEL, tag, 0, 1);
            break;
        }
        if (amqp_basic_ack(mq_conn_amqp(c), MQ_CONN_CHANNEL, tag, 0) != AMQP_STATUS_OK) {
            mq_conn_fail(c, "basic.ack failed");
            st = QN_EAGAIN;
            break;
        }
        (*moved)++;
        amqp_maybe_release_buffers(mq_conn_amqp(c));
    }
done:
    if (st == QN_OK)
        log_infof(NULL, ((log_field[]){LOG_S("queue", q.dead), LOG_I("moved", *moved), LOG_END}),
                  "mq: dead letters replayed");
    mq_conn_close(c);
    return st;
}

/* One queue of mq_dead_sort: the messages present when it starts. */
static qn_status dead_sort_queue(mq_conn *c, const mq_conn_names *q, const char *from,
                                 mq_dead_keep_fn keep, void *arg, const char *reason, int *kept,
                                 int *dead)
{
    qn_status st;
    uint32_t present = 0;

    /* FIFO, and what is put back goes behind the counted ones (as in mq_dead_replay). A queue
     * no consumer ever declared holds nothing. */
    st = mq_conn_queue_count(c, from, &present);
    if (st == QN_ENOTFOUND)
        return QN_OK;
    if (st != QN_OK)
        return st;
    for (uint32_t i = 0; i < present; i++) {
        amqp_message_t msg;
        char rb[MQ_CONN_NAME_MAX], delivered[MQ_CONN_NAME_MAX];
        mq_dead_marks marks;
        uint64_t tag = 0;
        int got, k;

        if ((st = dead_get_rk(c, from, &msg, &tag, &got, delivered)) != QN_OK || !got)
            break;
        mq_dead_marks_read(&msg.properties, amqp_cstring_bytes(delivered), &marks, rb);
        k = keep(msg.body.bytes, msg.body.len, arg);
        marks.reason = k ? NULL : reason;
        st = mq_dead_move(c, &msg, k ? q->main : q->dead, &marks, MQ_CONN_CONFIRM_TIMEOUT_MS);
        amqp_destroy_message(&msg);
        if (st != QN_OK) {
            if (mq_conn_ok(c))
                (void)amqp_basic_nack(mq_conn_amqp(c), MQ_CONN_CHANNEL, tag, 0, 1);
            return st;
        }
        if (amqp_basic_ack(mq_conn_amqp(c), MQ_CONN_CHANNEL, tag, 0) != AMQP_STATUS_OK) {
            mq_conn_fail(c, "basic.ack failed");
            return QN_EAGAIN;
        }
        (*(k ? kept : dead))++;
        amqp_maybe_release_buffers(mq_conn_amqp(c));
    }
    return st;
}

qn_status mq_dead_sort(const char *url, const char *name, mq_dead_keep_fn keep, void *arg,
                       const char *reason, int *kept, int *dead)
{
    qn_status st;
    mq_conn_names q;
    mq_conn *c = NULL;

    *kept = *dead = 0;
    if (!keep || !reason || (st = mq_conn_names_of(name, &q)) != QN_OK)
        return QN_EINVAL;
    if (!(c = dead_connect(url, "dead-sort", 1)))
        return QN_EAGAIN;
    /* The retry queue first: its messages are older than those of the main queue. */
    st = dead_sort_queue(c, &q, q.retry, keep, arg, reason, kept, dead);
    if (st == QN_OK)
        st = dead_sort_queue(c, &q, q.main, keep, arg, reason, kept, dead);
    if (st == QN_OK)
        log_infof(NULL,
                  ((log_field[]){LOG_S("queue", q.main), LOG_I("kept", *kept), LOG_I("dead", *dead),
                                 LOG_S("reason", reason), LOG_END}),
                  "mq: queue sorted");
    mq_conn_close(c);
    return st;
}
