#include "mq.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include "log.h"

#define MQ_CONNECT_TIMEOUT_S 5
#define MQ_HEARTBEAT_S       30 /* serviced by every wait on the connection, see conn_poll */
#define MQ_FRAME_MAX         131072
#define MQ_NAME_MAX          256  /* AMQP short strings: 255 bytes */
#define MQ_PUB_WINDOW        1024 /* publishes in flight (sliding window of confirms) */
#define MQ_BACKOFF_MIN_MS    100
#define MQ_BACKOFF_MAX_MS    5000
#define MQ_POLL_MS           200 /* consumer: how often the stop flag is checked */
#define MQ_REQUEUE_FACTOR    4   /* REQUEUE_LATER goes dead after this x max attempts */

/* ---------------------------------------------------------------- time and sync helpers */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval ms_to_tv(int64_t ms)
{
    if (ms < 0)
        ms = 0;
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Condition variables use the monotonic clock so wall-clock jumps do not stretch waits. */
static void cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

static void cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

static int bytes_eq(amqp_bytes_t b, const char *s)
{
    size_t n = strlen(s);
    return b.len == n && (n == 0 || memcmp(b.bytes, s, n) == 0);
}

/* Copies b into buf as a C string (truncated to cap-1). */
static const char *bytes_str(amqp_bytes_t b, char *buf, size_t cap)
{
    size_t n = b.len < cap - 1 ? b.len : cap - 1;
    if (n)
        memcpy(buf, b.bytes, n);
    buf[n] = '\0';
    return buf;
}

/* ---------------------------------------------------------------- envelope */

char *mq_envelope_build(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json)
{
    char *out = NULL;
    cJSON *root = NULL, *data = NULL;

    if (!type || !*type || !key || !*key)
        return NULL;
    data = data_json ? cJSON_Parse(data_json) : cJSON_CreateObject();
    if (!data)
        goto done;
    root = cJSON_CreateObject();
    if (!root)
        goto done;
    if (!cJSON_AddStringToObject(root, "key", key))
        goto done;
    if (request_id && !cJSON_AddStringToObject(root, "requestId", request_id))
        goto done;
    if (traceparent && !cJSON_AddStringToObject(root, "traceparent", traceparent))
        goto done;
    if (!cJSON_AddNumberToObject(root, "ts", (double)(ts_ms ? ts_ms : wall_ms())))
        goto done;
    if (!cJSON_AddStringToObject(root, "type", type))
        goto done;
    cJSON_AddItemToObject(root, "data", data);
    data = NULL; /* owned by root now */
    out = cJSON_PrintUnformatted(root);
done:
    cJSON_Delete(data);
    cJSON_Delete(root);
    return out;
}

static char *json_str_dup(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) && v->valuestring ? strdup(v->valuestring) : NULL;
}

/* Fills out from the envelope object o, taking o's "data" (o is changed, not freed). */
static qn_status envelope_take(cJSON *o, mq_envelope *out)
{
    const cJSON *ts;

    memset(out, 0, sizeof(*out));
    if (!cJSON_IsObject(o))
        goto fail;
    out->key = json_str_dup(o, "key");
    out->type = json_str_dup(o, "type");
    if (!out->key || !out->type || !*out->key || !*out->type)
        goto fail;
    out->request_id = json_str_dup(o, "requestId");
    out->traceparent = json_str_dup(o, "traceparent");
    ts = cJSON_GetObjectItemCaseSensitive(o, "ts");
    out->ts_ms = cJSON_IsNumber(ts) ? (int64_t)ts->valuedouble : 0;
    out->data = cJSON_DetachItemFromObjectCaseSensitive(o, "data");
    if (!out->data)
        goto fail;
    return QN_OK;
fail:
    mq_envelope_free(out);
    return QN_EINVAL;
}

qn_status mq_envelope_parse(const char *body, size_t len, mq_envelope *out)
{
    cJSON *root = body ? cJSON_ParseWithLength(body, len) : NULL;
    qn_status st = envelope_take(root, out);
    cJSON_Delete(root);
    return st;
}

qn_status mq_pack_parse(const char *body, size_t len, mq_envelope **out, size_t *n)
{
    qn_status st = QN_EINVAL;
    cJSON *root = body ? cJSON_ParseWithLength(body, len) : NULL;
    size_t count = 0, i = 0;
    mq_envelope *e = NULL;

    *out = NULL;
    *n = 0;
    if (cJSON_IsObject(root))
        count = 1;
    else if (cJSON_IsArray(root))
        count = (size_t)cJSON_GetArraySize(root);
    if (count == 0 || count > MQ_PACK_MAX)
        goto done;
    st = QN_ENOMEM;
    if (!(e = calloc(count, sizeof(*e))))
        goto done;
    st = QN_EINVAL;
    if (cJSON_IsObject(root)) {
        if (envelope_take(root, &e[i++]) != QN_OK)
            goto done;
    } else {
        cJSON *item;
        cJSON_ArrayForEach(item, root)
        {
            if (envelope_take(item, &e[i++]) != QN_OK)
                goto done;
        }
    }
    st = QN_OK;
    *out = e;
    *n = count;
    e = NULL;
done:
    mq_pack_free(e, i);
    cJSON_Delete(root);
    return st;
}

void mq_pack_free(mq_envelope *e, size_t n)
{
    if (!e)
        return;
    for (size_t i = 0; i < n; i++)
        mq_envelope_free(&e[i]);
    free(e);
}

void mq_envelope_free(mq_envelope *e)
{
    if (!e)
        return;
    free(e->key);
    free(e->type);
    free(e->request_id);
    free(e->traceparent);
    cJSON_Delete(e->data);
    memset(e, 0, sizeof(*e));
}

/* ---------------------------------------------------------------- connection */

struct mq_conn {
    amqp_connection_state_t st;
    amqp_channel_t ch;
    int chan_open;
    int confirm;       /* channel in confirm mode */
    int broken;        /* the connection must be thrown away */
    uint64_t next_tag; /* delivery tag the broker gives the next publish (confirm mode) */
    char errstr[256];
};

int mq_conn_ok(const mq_conn *c)
{
    return c && !c->broken;
}

const char *mq_conn_errstr(const mq_conn *c)
{
    return c ? c->errstr : "no connection";
}

/* Answers a broker-initiated close; the channel (or connection) is unusable afterwards. */
static void conn_on_close_method(mq_conn *c, amqp_method_t *m, const char *what)
{
    if (m->id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *cm = m->decoded;
        amqp_channel_close_ok_t ok = {0};
        snprintf(c->errstr, sizeof(c->errstr), "%s: channel closed by broker: %u %.*s", what,
                 cm->reply_code, (int)cm->reply_text.len, (const char *)cm->reply_text.bytes);
        if (amqp_send_method(c->st, c->ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK)
            c->broken = 1;
        c->chan_open = 0;
    } else if (m->id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *cm = m->decoded;
        amqp_connection_close_ok_t ok = {0};
        snprintf(c->errstr, sizeof(c->errstr), "%s: connection closed by broker: %u %.*s", what,
                 cm->reply_code, (int)cm->reply_text.len, (const char *)cm->reply_text.bytes);
        (void)amqp_send_method(c->st, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        c->broken = 1;
    }
}

/* Maps an RPC reply to a status, recording the reason and the state of the connection. */
static qn_status conn_reply(mq_conn *c, amqp_rpc_reply_t r, const char *what)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return QN_OK;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, amqp_error_string2(r.library_error));
        c->broken = 1;
        return QN_EAGAIN;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        conn_on_close_method(c, &r.reply, what);
        if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            uint16_t code = ((amqp_channel_close_t *)r.reply.decoded)->reply_code;
            return code == AMQP_PRECONDITION_FAILED ? QN_ECONFLICT
                   : code == AMQP_NOT_FOUND         ? QN_ENOTFOUND
                                                    : QN_ERR;
        }
        c->broken = 1;
        return QN_EAGAIN;
    default:
        snprintf(c->errstr, sizeof(c->errstr), "%s: no RPC reply", what);
        c->broken = 1;
        return QN_EAGAIN;
    }
}

static qn_status conn_last(mq_conn *c, const char *what)
{
    return conn_reply(c, amqp_get_rpc_reply(c->st), what);
}

/* Opens the channel if a broker error closed it (the same number is reusable after close-ok). */
static qn_status conn_ensure_channel(mq_conn *c)
{
    qn_status st;

    if (c->broken)
        return QN_EAGAIN;
    if (c->chan_open)
        return QN_OK;
    amqp_channel_open(c->st, c->ch);
    if ((st = conn_last(c, "channel.open")) != QN_OK)
        return st;
    c->chan_open = 1;
    if (c->confirm) {
        amqp_confirm_select(c->st, c->ch);
        if ((st = conn_last(c, "confirm.select")) != QN_OK)
            return st;
        c->next_tag = 1;
    }
    return QN_OK;
}

static mq_conn *conn_new(const char *url, const char *conn_name, int confirm)
{
    mq_conn *c = calloc(1, sizeof(*c));
    char *u = url ? strdup(url) : NULL;
    struct amqp_connection_info ci;
    amqp_socket_t *sock;
    struct timeval tv = {.tv_sec = MQ_CONNECT_TIMEOUT_S};
    char label[MQ_NAME_MAX];
    amqp_table_entry_t prop;
    amqp_table_t props = {.num_entries = 1, .entries = &prop};
    int rc;

    if (!c || !u)
        goto fail;
    c->ch = 1;
    c->confirm = confirm;
    amqp_default_connection_info(&ci);
    if (amqp_parse_url(u, &ci) != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "malformed AMQP URL"); /* never log it: password */
        goto fail;
    }
    if (ci.ssl) {
        snprintf(c->errstr, sizeof(c->errstr), "amqps is not supported");
        goto fail;
    }
    /* "amqp://host:port/" parses to the empty vhost; we mean the default one. */
    if (!ci.vhost || !*ci.vhost)
        ci.vhost = (char *)AMQP_DEFAULT_VHOST;
    c->st = amqp_new_connection();
    if (!c->st || !(sock = amqp_tcp_socket_new(c->st)))
        goto fail;
    amqp_set_handshake_timeout(c->st, &tv);
    amqp_set_rpc_timeout(c->st, &tv); /* a hung broker must not hang a declare forever */
    rc = amqp_socket_open_noblock(sock, ci.host, ci.port, &tv);
    if (rc != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "connect %s:%d: %s", ci.host, ci.port,
                 amqp_error_string2(rc));
        goto fail;
    }
    /* connection_name shows in the management UI and rabbitmqctl: who holds this connection */
    snprintf(label, sizeof(label), "quan %s", conn_name ? conn_name : "conn");
    prop.key = amqp_cstring_bytes("connection_name");
    prop.value.kind = AMQP_FIELD_KIND_UTF8;
    prop.value.value.bytes = amqp_cstring_bytes(label);
    if (conn_reply(c,
                   amqp_login_with_properties(c->st, ci.vhost, 0, MQ_FRAME_MAX, MQ_HEARTBEAT_S,
                                              &props, AMQP_SASL_METHOD_PLAIN, ci.user, ci.password),
                   "login") != QN_OK)
        goto fail;
    if (conn_ensure_channel(c) != QN_OK)
        goto fail;
    amqp_exchange_declare(c->st, c->ch, amqp_cstring_bytes(MQ_EXCHANGE),
                          amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
    if (conn_last(c, "exchange.declare " MQ_EXCHANGE) != QN_OK)
        goto fail;
    free(u);
    return c;
fail:
    log_errorf(NULL, ((log_field[]){LOG_S("error", c ? c->errstr : "out of memory"), LOG_END}),
               "mq: cannot open connection");
    free(u);
    if (c) {
        c->broken = 1; /* skip the polite close */
        mq_conn_close(c);
    }
    return NULL;
}

mq_conn *mq_conn_open(const char *url, const char *conn_name)
{
    return conn_new(url, conn_name, 1);
}

void mq_conn_close(mq_conn *c)
{
    if (!c)
        return;
    if (c->st) {
        if (!c->broken) {
            if (c->chan_open)
                (void)amqp_channel_close(c->st, c->ch, AMQP_REPLY_SUCCESS);
            (void)amqp_connection_close(c->st, AMQP_REPLY_SUCCESS);
        }
        amqp_destroy_connection(c->st);
    }
    free(c);
}

/* Services heartbeats and notices a closed connection while idle; frames read here are stale
 * confirms or broker closes. */
static void conn_poll(mq_conn *c)
{
    struct timeval zero = {0};
    amqp_frame_t f;

    while (!c->broken) {
        int rc = amqp_simple_wait_frame_noblock(c->st, &f, &zero);
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            snprintf(c->errstr, sizeof(c->errstr), "idle: %s", amqp_error_string2(rc));
            c->broken = 1;
            break;
        }
        if (f.frame_type == AMQP_FRAME_METHOD)
            conn_on_close_method(c, &f.payload.method, "idle");
        if (!c->chan_open)
            c->broken = 1; /* simplest recovery for an unexpected channel close: reconnect */
    }
    amqp_maybe_release_buffers(c->st);
}

/* Properties of a Quan message; the header array lives beside them. */
typedef struct msg_props {
    amqp_basic_properties_t p;
    amqp_table_entry_t h[4];
} msg_props;

static void props_init(msg_props *mp, const char *key, const char *request_id,
                       const char *traceparent, int64_t ts_ms)
{
    int n = 0;

    memset(mp, 0, sizeof(*mp));
    mp->p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
                   AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_HEADERS_FLAG;
    mp->p.content_type = amqp_cstring_bytes("application/json");
    mp->p.delivery_mode = 2; /* persistent */
    mp->p.message_id = amqp_cstring_bytes(key);
    mp->p.timestamp = (uint64_t)(ts_ms / 1000); /* AMQP timestamps are seconds */
    mp->h[n].key = amqp_cstring_bytes("x-attempt");
    mp->h[n].value.kind = AMQP_FIELD_KIND_I64;
    mp->h[n++].value.value.i64 = 1;
    if (request_id) {
        mp->h[n].key = amqp_cstring_bytes("x-request-id");
        mp->h[n].value.kind = AMQP_FIELD_KIND_UTF8;
        mp->h[n++].value.value.bytes = amqp_cstring_bytes(request_id);
    }
    if (traceparent) {
        mp->h[n].key = amqp_cstring_bytes("traceparent");
        mp->h[n].value.kind = AMQP_FIELD_KIND_UTF8;
        mp->h[n++].value.value.bytes = amqp_cstring_bytes(traceparent);
    }
    mp->p.headers.num_entries = n;
    mp->p.headers.entries = mp->h;
}

static qn_status conn_publish_raw(mq_conn *c, const char *exchange, const char *rk,
                                  const amqp_basic_properties_t *props, const char *body,
                                  size_t len, uint64_t *tag)
{
    amqp_bytes_t b = {.len = len, .bytes = (void *)body};
    int rc;

    if (conn_ensure_channel(c) != QN_OK)
        return QN_EAGAIN;
    /* mandatory: an event no queue is bound for comes back instead of vanishing */
    rc = amqp_basic_publish(c->st, c->ch, amqp_cstring_bytes(exchange), amqp_cstring_bytes(rk), 1,
                            0, props, b);
    if (rc != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "publish: %s", amqp_error_string2(rc));
        c->broken = 1;
        return QN_EAGAIN;
    }
    *tag = c->next_tag++;
    return QN_OK;
}

/* One publish waiting for its confirm. */
typedef struct conn_pending {
    uint64_t tag;
    const char *key; /* message_id and routing key identify a basic.return */
    const char *rk;
    int returned;
    int done;
    qn_status st;
} conn_pending;

static size_t pending_resolve(conn_pending *p, size_t n, uint64_t tag, int multiple, qn_status st)
{
    size_t hit = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].done || (multiple ? p[i].tag > tag : p[i].tag != tag))
            continue;
        p[i].st = (st == QN_OK && p[i].returned) ? QN_ENOTFOUND : st;
        p[i].done = 1;
        hit++;
    }
    return hit;
}

/* basic.return carries no delivery tag; it comes before the ack of the same message, so the
 * first unresolved publish with the same message id and routing key is the one. */
static void pending_on_return(mq_conn *c, const amqp_frame_t *f, conn_pending *p, size_t n)
{
    amqp_basic_return_t *r = f->payload.method.decoded;
    char rk[MQ_NAME_MAX];
    amqp_message_t msg;
    amqp_rpc_reply_t rr;

    bytes_str(r->routing_key, rk, sizeof(rk));
    rr = amqp_read_message(c->st, f->channel, &msg, 0);
    if (conn_reply(c, rr, "basic.return") != QN_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        if (p[i].done || p[i].returned || strcmp(p[i].rk, rk) != 0)
            continue;
        if ((msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) &&
            !bytes_eq(msg.properties.message_id, p[i].key))
            continue;
        p[i].returned = 1;
        break;
    }
    amqp_destroy_message(&msg);
}

/* Reads frames until every pending publish is acked, nacked or returned, the deadline passes
 * or the connection breaks; each entry's st tells which. */
/* any: return after the first confirm that resolves something (sliding window). */
static void conn_wait_confirms_until(mq_conn *c, conn_pending *p, size_t n, int64_t deadline,
                                     int any)
{
    size_t left = 0, start;
    int timed_out = 0;

    for (size_t i = 0; i < n; i++)
        left += !p[i].done;
    start = left;
    while (left > 0 && (!any || left == start) && !c->broken && c->chan_open) {
        int64_t rem = deadline - mono_ms();
        struct timeval tv = ms_to_tv(rem);
        amqp_frame_t f;
        int rc;

        if (rem <= 0) {
            timed_out = 1;
            break;
        }
        rc = amqp_simple_wait_frame_noblock(c->st, &f, &tv);
        if (rc == AMQP_STATUS_TIMEOUT) {
            timed_out = 1;
            break;
        }
        if (rc != AMQP_STATUS_OK) {
            snprintf(c->errstr, sizeof(c->errstr), "confirm: %s", amqp_error_string2(rc));
            c->broken = 1;
            break;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (f.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD: {
            amqp_basic_ack_t *a = f.payload.method.decoded;
            left -= pending_resolve(p, n, a->delivery_tag, a->multiple, QN_OK);
            break;
        }
        case AMQP_BASIC_NACK_METHOD: {
            amqp_basic_nack_t *a = f.payload.method.decoded;
            left -= pending_resolve(p, n, a->delivery_tag, a->multiple, QN_ERR);
            break;
        }
        case AMQP_BASIC_RETURN_METHOD:
            pending_on_return(c, &f, p, n);
            break;
        default:
            conn_on_close_method(c, &f.payload.method, "confirm");
            break;
        }
    }
    /* A channel closed mid-wait loses its confirm sequence: treat it as a lost connection. */
    if (!c->chan_open)
        c->broken = 1;
    for (size_t i = 0; i < n && (c->broken || timed_out || !any); i++) {
        if (!p[i].done) {
            p[i].st = c->broken ? QN_EAGAIN : QN_ETIMEDOUT;
            p[i].done = 1;
        }
    }
    amqp_maybe_release_buffers(c->st);
}

static void conn_wait_confirms(mq_conn *c, conn_pending *p, size_t n, int timeout_ms)
{
    conn_wait_confirms_until(c, p, n, mono_ms() + timeout_ms, 0);
}

static int msg_valid(const mq_msg *m)
{
    return m && m->routing_key && *m->routing_key && strlen(m->routing_key) < MQ_NAME_MAX &&
           m->key && *m->key && strlen(m->key) < MQ_NAME_MAX;
}

qn_status mq_conn_publish_confirmed(mq_conn *c, const mq_msg *m, int timeout_ms)
{
    qn_status st = QN_EINVAL;
    char *built = NULL;
    const char *body;
    int64_t ts = m && m->ts_ms ? m->ts_ms : wall_ms();
    msg_props mp;
    conn_pending p = {0};

    if (!c || !msg_valid(m))
        goto done;
    body = m->body;
    if (!body) {
        built = mq_envelope_build(m->routing_key, m->key, m->request_id, m->traceparent, ts,
                                  m->data_json);
        if (!built)
            goto done;
        body = built;
    }
    props_init(&mp, m->key, m->request_id, m->traceparent, ts);
    st = conn_publish_raw(c, MQ_EXCHANGE, m->routing_key, &mp.p, body, strlen(body), &p.tag);
    if (st != QN_OK)
        goto done;
    p.key = m->key;
    p.rk = m->routing_key;
    conn_wait_confirms(c, &p, 1, timeout_ms > 0 ? timeout_ms : MQ_DEFAULT_CONFIRM_TIMEOUT);
    st = p.st;
done:
    free(built);
    return st;
}

/* ---------------------------------------------------------------- topology */

typedef struct queue_names {
    char main[MQ_NAME_MAX], retry[MQ_NAME_MAX], dead[MQ_NAME_MAX];
} queue_names;

static qn_status names_of(const char *name, queue_names *q)
{
    if (!name || !*name)
        return QN_EINVAL;
    if ((size_t)snprintf(q->main, sizeof(q->main), "quan.%s", name) >= sizeof(q->main) ||
        (size_t)snprintf(q->retry, sizeof(q->retry), "quan.%s.retry", name) >= sizeof(q->retry) ||
        (size_t)snprintf(q->dead, sizeof(q->dead), "quan.%s.dead", name) >= sizeof(q->dead))
        return QN_EINVAL;
    return QN_OK;
}

static qn_status queue_declare(mq_conn *c, const char *q, amqp_table_t args)
{
    qn_status st;
    char what[MQ_NAME_MAX + 16];

    if ((st = conn_ensure_channel(c)) != QN_OK)
        return st;
    amqp_queue_declare(c->st, c->ch, amqp_cstring_bytes(q), 0, 1, 0, 0, args);
    snprintf(what, sizeof(what), "declare %s", q);
    st = conn_last(c, what);
    if (st == QN_ECONFLICT)
        log_errorf(NULL, ((log_field[]){LOG_S("queue", q), LOG_S("error", c->errstr), LOG_END}),
                   "mq: queue exists with other arguments (e.g. another retry delay); delete it "
                   "or configure the same values");
    return st;
}

qn_status mq_conn_declare_consumer(mq_conn *c, const char *name, const char *const *routing_keys,
                                   int retry_delay_ms)
{
    qn_status st;
    queue_names q;
    amqp_table_entry_t e[3];

    if (!c || !routing_keys || !routing_keys[0])
        return QN_EINVAL;
    if ((st = names_of(name, &q)) != QN_OK)
        return st;
    if ((st = queue_declare(c, q.main, amqp_empty_table)) != QN_OK)
        return st;
    /* Expired retries dead-letter through the default exchange straight to quan.<name>, so
     * other consumers of the same event never see them. */
    e[0].key = amqp_cstring_bytes("x-message-ttl");
    e[0].value.kind = AMQP_FIELD_KIND_I64;
    e[0].value.value.i64 = retry_delay_ms > 0 ? retry_delay_ms : MQ_DEFAULT_RETRY_DELAY_MS;
    e[1].key = amqp_cstring_bytes("x-dead-letter-exchange");
    e[1].value.kind = AMQP_FIELD_KIND_UTF8;
    e[1].value.value.bytes = amqp_cstring_bytes("");
    e[2].key = amqp_cstring_bytes("x-dead-letter-routing-key");
    e[2].value.kind = AMQP_FIELD_KIND_UTF8;
    e[2].value.value.bytes = amqp_cstring_bytes(q.main);
    if ((st = queue_declare(c, q.retry, (amqp_table_t){.num_entries = 3, .entries = e})) != QN_OK)
        return st;
    if ((st = queue_declare(c, q.dead, amqp_empty_table)) != QN_OK)
        return st;
    for (size_t i = 0; routing_keys[i]; i++) {
        amqp_queue_bind(c->st, c->ch, amqp_cstring_bytes(q.main), amqp_cstring_bytes(MQ_EXCHANGE),
                        amqp_cstring_bytes(routing_keys[i]), amqp_empty_table);
        if ((st = conn_last(c, "queue.bind")) != QN_OK)
            return st;
    }
    return QN_OK;
}

qn_status mq_conn_delete_consumer(mq_conn *c, const char *name)
{
    qn_status st;
    queue_names q;
    const char *all[3] = {q.main, q.retry, q.dead};

    if (!c)
        return QN_EINVAL;
    if ((st = names_of(name, &q)) != QN_OK)
        return st;
    for (int i = 0; i < 3; i++) {
        if ((st = conn_ensure_channel(c)) != QN_OK)
            return st;
        amqp_queue_delete(c->st, c->ch, amqp_cstring_bytes(all[i]), 0, 0);
        if ((st = conn_last(c, "queue.delete")) != QN_OK)
            return st;
    }
    return QN_OK;
}

qn_status mq_conn_queue_count(mq_conn *c, const char *queue, uint32_t *count)
{
    qn_status st;
    amqp_queue_declare_ok_t *ok;

    if (!c || !queue)
        return QN_EINVAL;
    if ((st = conn_ensure_channel(c)) != QN_OK)
        return st;
    ok = amqp_queue_declare(c->st, c->ch, amqp_cstring_bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    if ((st = conn_last(c, "queue.declare passive")) != QN_OK)
        return st;
    *count = ok->message_count;
    return QN_OK;
}

/* ---------------------------------------------------------------- headers */

static const amqp_field_value_t *header_get(const amqp_basic_properties_t *p, const char *name)
{
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return NULL;
    for (int i = 0; i < p->headers.num_entries; i++)
        if (bytes_eq(p->headers.entries[i].key, name))
            return &p->headers.entries[i].value;
    return NULL;
}

static int64_t header_int(const amqp_basic_properties_t *p, const char *name, int64_t def)
{
    const amqp_field_value_t *v = header_get(p, name);
    if (!v)
        return def;
    switch (v->kind) {
    case AMQP_FIELD_KIND_I8:
        return v->value.i8;
    case AMQP_FIELD_KIND_U8:
        return v->value.u8;
    case AMQP_FIELD_KIND_I16:
        return v->value.i16;
    case AMQP_FIELD_KIND_U16:
        return v->value.u16;
    case AMQP_FIELD_KIND_I32:
        return v->value.i32;
    case AMQP_FIELD_KIND_U32:
        return v->value.u32;
    case AMQP_FIELD_KIND_I64:
        return v->value.i64;
    case AMQP_FIELD_KIND_U64:
        return (int64_t)v->value.u64;
    default:
        return def;
    }
}

/* NULL if absent or not a string. */
static const char *header_str(const amqp_basic_properties_t *p, const char *name, char *buf,
                              size_t cap)
{
    const amqp_field_value_t *v = header_get(p, name);
    if (!v || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
        return NULL;
    return bytes_str(v->value.bytes, buf, cap);
}

static int header_ours(amqp_bytes_t k)
{
    static const char *const drop[] = {"x-attempt", "x-requeues", "x-routing-key", "x-dead-reason",
                                       NULL};
    for (int i = 0; drop[i]; i++)
        if (bytes_eq(k, drop[i]))
            return 1;
    /* The broker's dead-letter bookkeeping from the retry queue; x-attempt replaces it. */
    return (k.len >= 7 && memcmp(k.bytes, "x-death", 7) == 0) ||
           (k.len >= 13 && memcmp(k.bytes, "x-first-death", 13) == 0) ||
           (k.len >= 12 && memcmp(k.bytes, "x-last-death", 12) == 0);
}

/*
 * Publishes a copy of a received message to queue (through the default exchange) with our
 * bookkeeping headers set, and waits for the confirm. The caller acks the original only after
 * QN_OK, so a crash in between duplicates the message instead of losing it.
 */
static qn_status republish(mq_conn *c, const amqp_message_t *msg, const char *queue, int attempt,
                           int requeues, const char *rk, const char *reason, int timeout_ms)
{
    const amqp_basic_properties_t *op = &msg->properties;
    amqp_basic_properties_t p = *op;
    int n = (op->_flags & AMQP_BASIC_HEADERS_FLAG) ? op->headers.num_entries : 0, k = 0;
    amqp_table_entry_t *h = calloc((size_t)n + 4, sizeof(*h));
    conn_pending pend = {0};
    char key[MQ_NAME_MAX] = "";
    qn_status st = QN_ENOMEM;

    if (!h)
        goto done;
    for (int i = 0; i < n; i++)
        if (!header_ours(op->headers.entries[i].key))
            h[k++] = op->headers.entries[i];
    h[k].key = amqp_cstring_bytes("x-attempt");
    h[k].value.kind = AMQP_FIELD_KIND_I64;
    h[k++].value.value.i64 = attempt;
    if (requeues > 0) {
        h[k].key = amqp_cstring_bytes("x-requeues");
        h[k].value.kind = AMQP_FIELD_KIND_I64;
        h[k++].value.value.i64 = requeues;
    }
    if (rk) {
        h[k].key = amqp_cstring_bytes("x-routing-key");
        h[k].value.kind = AMQP_FIELD_KIND_UTF8;
        h[k++].value.value.bytes = amqp_cstring_bytes(rk);
    }
    if (reason) {
        h[k].key = amqp_cstring_bytes("x-dead-reason");
        h[k].value.kind = AMQP_FIELD_KIND_UTF8;
        h[k++].value.value.bytes = amqp_cstring_bytes(reason);
    }
    p._flags |= AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    p._flags &= ~AMQP_BASIC_EXPIRATION_FLAG;
    p.delivery_mode = 2;
    p.headers.num_entries = k;
    p.headers.entries = h;
    st = conn_publish_raw(c, "", queue, &p, msg->body.bytes, msg->body.len, &pend.tag);
    if (st != QN_OK)
        goto done;
    if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        bytes_str(p.message_id, key, sizeof(key));
    pend.key = key;
    pend.rk = queue;
    conn_wait_confirms(c, &pend, 1, timeout_ms);
    st = pend.st;
done:
    free(h);
    return st;
}

/* ---------------------------------------------------------------- publisher */

typedef struct pub_item {
    struct pub_item *next;
    mq_publisher *pub;
    char *rk, *key, *request_id, *traceparent, *body;
    int64_t ts_ms;
    int64_t enq_ms; /* monotonic, to fail items the broker never got in time */
    mq_publish_cb cb;
    void *arg;
    qn_status st;
    size_t body_len;
    int packable;
    struct pub_item *pack; /* the next message of the same pack (the window holds the first) */
} pub_item;

struct mq_publisher {
    char *url;
    char conn_name[MQ_NAME_MAX];
    bridge *br;
    int queue_max, confirm_timeout_ms;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pub_item *head, *tail; /* guarded by mu */
    int qlen;              /* guarded by mu */
    int stop;              /* guarded by mu */
    int ready;             /* atomic */
};

static void pub_item_free(pub_item *it)
{
    if (!it)
        return;
    free(it->rk);
    free(it->key);
    free(it->request_id);
    free(it->traceparent);
    free(it->body);
    free(it);
}

static void pub_item_run(void *arg)
{
    pub_item *it = arg;
    it->cb(it->st, it->arg);
    pub_item_free(it);
}

/* Hands the outcome to the loop thread. */
static void pub_item_finish(pub_item *it, qn_status st)
{
    it->st = st;
    if (st != QN_OK)
        log_warnf(NULL,
                  ((log_field[]){LOG_S("routing_key", it->rk), LOG_S("key", it->key),
                                 LOG_S("status", qn_status_str(st)), LOG_END}),
                  "mq: publish failed");
    if (!it->cb) {
        pub_item_free(it);
        return;
    }
    if (bridge_post(it->pub->br, pub_item_run, it) != QN_OK) {
        log_error(NULL, "mq: cannot post publish result (out of memory); result dropped");
        pub_item_free(it);
    }
}

/* Finishes a window entry: one message, or every message of its pack. */
static void pub_pack_finish(pub_item *it, qn_status st)
{
    while (it) {
        pub_item *next = it->pack;
        pub_item_finish(it, st);
        it = next;
    }
}

/* Chains the packable messages of fresh[0..n) that share a routing key into packs (at most
 * MQ_PACK_MAX messages and about MQ_PACK_BYTES each, in queue order); returns the number of
 * window entries left at the front of fresh. */
static size_t pub_pack(pub_item **fresh, size_t n)
{
    size_t heads = 0, count = 0, bytes = 0;
    pub_item *tail = NULL;

    for (size_t i = 0; i < n; i++) {
        pub_item *it = fresh[i], *head = heads ? fresh[heads - 1] : NULL;
        size_t len = it->body_len;
        if (head && tail && it->packable && head->packable && !strcmp(it->rk, head->rk) &&
            count < MQ_PACK_MAX && bytes + len + 1 <= MQ_PACK_BYTES) {
            tail->pack = it;
            tail = it;
            count++;
            bytes += len + 1;
            continue;
        }
        fresh[heads++] = it;
        tail = it;
        count = 1;
        bytes = len + 2;
    }
    return heads;
}

/* Fails items queued longer than the confirm timeout while the broker is unreachable. */
static void pub_fail_old(mq_publisher *p, int all)
{
    int64_t cutoff = mono_ms() - p->confirm_timeout_ms;
    pub_item *failed = NULL, **pp;

    pthread_mutex_lock(&p->mu);
    pp = &p->head;
    while (*pp) {
        pub_item *it = *pp;
        if (all || it->enq_ms <= cutoff) {
            *pp = it->next;
            it->next = failed;
            failed = it;
            p->qlen--;
        } else {
            pp = &it->next;
        }
    }
    p->tail = NULL;
    for (pub_item *it = p->head; it; it = it->next)
        p->tail = it;
    pthread_mutex_unlock(&p->mu);
    while (failed) {
        pub_item *next = failed->next;
        pub_item_finish(failed, QN_EAGAIN);
        failed = next;
    }
}

/* Sleeps up to ms unless stop is requested. */
static void pub_sleep(mq_publisher *p, int ms)
{
    int64_t until = mono_ms() + ms;
    pthread_mutex_lock(&p->mu);
    while (!p->stop && mono_ms() < until)
        cond_wait_ms(&p->cv, &p->mu, until - mono_ms());
    pthread_mutex_unlock(&p->mu);
}

/* Window of publishes waiting for their confirms (oldest first). */
typedef struct pub_window {
    pub_item *it[MQ_PUB_WINDOW];
    conn_pending pend[MQ_PUB_WINDOW];
    int64_t sent_ms[MQ_PUB_WINDOW];
    size_t n;
} pub_window;

/* Finishes the resolved entries, keeping the rest in order. */
static void pub_window_settle(pub_window *w, int fail_all)
{
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (fail_all && !w->pend[i].done) { /* their confirms are lost with the channel */
            w->pend[i].done = 1;
            w->pend[i].st = QN_EAGAIN;
        }
        if (w->pend[i].done) {
            pub_pack_finish(w->it[i], w->pend[i].st);
            continue;
        }
        w->it[k] = w->it[i];
        w->pend[k] = w->pend[i];
        w->sent_ms[k++] = w->sent_ms[i];
    }
    w->n = k;
}

static void pub_window_add(pub_window *w, mq_conn *c, pub_item *it)
{
    conn_pending *pd = &w->pend[w->n];
    msg_props mp;
    char *packed = NULL;
    const char *body = it->body;
    size_t len = it->body_len, count = 1;

    memset(pd, 0, sizeof(*pd));
    pd->key = it->key;
    pd->rk = it->rk;
    w->it[w->n] = it;
    w->sent_ms[w->n++] = mono_ms();
    if (it->pack) { /* [envelope,envelope,...] */
        for (pub_item *m = it->pack; m; m = m->pack, count++)
            len += m->body_len + 1;
        if (!(packed = malloc(len + 3))) {
            pd->done = 1;
            pd->st = QN_ENOMEM;
            return;
        }
        len = 0;
        for (pub_item *m = it; m; m = m->pack) {
            packed[len++] = m == it ? '[' : ',';
            memcpy(packed + len, m->body, m->body_len);
            len += m->body_len;
        }
        packed[len++] = ']';
        packed[len] = '\0';
        body = packed;
    }
    if (c->broken) {
        pd->done = 1;
        pd->st = QN_EAGAIN;
        free(packed);
        return;
    }
    props_init(&mp, it->key, it->request_id, it->traceparent, it->ts_ms);
    if (count > 1) {
        int k = (int)mp.p.headers.num_entries;
        mp.h[k].key = amqp_cstring_bytes("x-pack");
        mp.h[k].value.kind = AMQP_FIELD_KIND_I64;
        mp.h[k].value.value.i64 = (int64_t)count;
        mp.p.headers.num_entries = k + 1;
    }
    pd->st = conn_publish_raw(c, MQ_EXCHANGE, it->rk, &mp.p, body, len, &pd->tag);
    pd->done = pd->st != QN_OK;
    free(packed);
}

/* A sliding window: new publishes go out as soon as they are queued (up to MQ_PUB_WINDOW
 * unconfirmed), and each confirm (multiple=1 included) finishes its publishes at once, instead
 * of sending a batch and stopping until all of it is confirmed. */
static void *pub_main(void *arg)
{
    mq_publisher *p = arg;
    mq_conn *c = NULL;
    int backoff = MQ_BACKOFF_MIN_MS, stop;
    pub_window *w = calloc(1, sizeof(*w));
    pub_item **fresh = calloc(MQ_PUB_WINDOW, sizeof(*fresh));

    if (!w || !fresh) {
        log_error(NULL, "mq: publisher out of memory");
        free(w);
        free(fresh);
        pub_fail_old(p, 1);
        return NULL;
    }
    for (;;) {
        size_t n = 0;

        if (!c) {
            pthread_mutex_lock(&p->mu);
            stop = p->stop;
            pthread_mutex_unlock(&p->mu);
            if (stop)
                break;
            c = conn_new(p->url, p->conn_name, 1);
            if (!c) {
                pub_fail_old(p, 0);
                pub_sleep(p, backoff);
                backoff = backoff * 2 > MQ_BACKOFF_MAX_MS ? MQ_BACKOFF_MAX_MS : backoff * 2;
                continue;
            }
            backoff = MQ_BACKOFF_MIN_MS;
            __atomic_store_n(&p->ready, 1, __ATOMIC_RELEASE);
            log_info(NULL, "mq: publisher connected");
        }
        pthread_mutex_lock(&p->mu);
        if (!p->head && !p->stop && w->n == 0)
            cond_wait_ms(&p->cv, &p->mu, 1000); /* wake at least every second for heartbeats */
        while (w->n + n < MQ_PUB_WINDOW && p->head) {
            fresh[n++] = p->head;
            p->head = p->head->next;
            p->qlen--;
        }
        if (!p->head)
            p->tail = NULL;
        stop = p->stop;
        pthread_mutex_unlock(&p->mu);

        n = pub_pack(fresh, n);
        for (size_t i = 0; i < n; i++)
            pub_window_add(w, c, fresh[i]);
        if (w->n) {
            /* Until at least one confirm (new publishes wait at most that long), or the oldest
             * publish's confirm timeout. */
            conn_wait_confirms_until(c, w->pend, w->n, w->sent_ms[0] + p->confirm_timeout_ms, 1);
            pub_window_settle(w, 0);
        } else if (stop) {
            break;
        } else {
            conn_poll(c);
        }
        if (!mq_conn_ok(c)) {
            log_warnf(NULL, ((log_field[]){LOG_S("error", c->errstr), LOG_END}),
                      "mq: publisher connection lost; reconnecting");
            __atomic_store_n(&p->ready, 0, __ATOMIC_RELEASE);
            pub_window_settle(w, 1);
            mq_conn_close(c);
            c = NULL;
        }
    }
    pub_window_settle(w, 1);
    free(w);
    free(fresh);
    __atomic_store_n(&p->ready, 0, __ATOMIC_RELEASE);
    mq_conn_close(c);
    pub_fail_old(p, 1);
    return NULL;
}

mq_publisher *mq_publisher_new(const mq_publisher_opts *o)
{
    mq_publisher *p = NULL;

    if (!o || !o->url || !o->bridge)
        return NULL;
    p = calloc(1, sizeof(*p));
    if (!p || !(p->url = strdup(o->url)))
        goto fail;
    p->br = o->bridge;
    snprintf(p->conn_name, sizeof(p->conn_name), "publisher:%s", o->name ? o->name : "main");
    p->queue_max = o->queue_max > 0 ? o->queue_max : MQ_DEFAULT_PUBLISH_QUEUE;
    p->confirm_timeout_ms =
        o->confirm_timeout_ms > 0 ? o->confirm_timeout_ms : MQ_DEFAULT_CONFIRM_TIMEOUT;
    pthread_mutex_init(&p->mu, NULL);
    cond_init_mono(&p->cv);
    if (pthread_create(&p->th, NULL, pub_main, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    return p;
fail:
    if (p)
        free(p->url);
    free(p);
    return NULL;
}

void mq_publisher_free(mq_publisher *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->url);
    free(p);
}

static char *dup_opt(const char *s, int *oom)
{
    char *d;
    if (!s)
        return NULL;
    if (!(d = strdup(s)))
        *oom = 1;
    return d;
}

qn_status mq_publish(mq_publisher *p, const mq_msg *m, mq_publish_cb cb, void *arg)
{
    pub_item *it = NULL;
    qn_status st = QN_EINVAL;
    int oom = 0;

    if (!p || !msg_valid(m))
        goto fail;
    st = QN_ENOMEM;
    if (!(it = calloc(1, sizeof(*it))))
        goto fail;
    it->pub = p;
    it->cb = cb;
    it->arg = arg;
    it->ts_ms = m->ts_ms ? m->ts_ms : wall_ms();
    it->enq_ms = mono_ms();
    it->rk = dup_opt(m->routing_key, &oom);
    it->key = dup_opt(m->key, &oom);
    it->request_id = dup_opt(m->request_id, &oom);
    it->traceparent = dup_opt(m->traceparent, &oom);
    it->packable = m->packable;
    if (m->body) {
        it->body = dup_opt(m->body, &oom);
    } else {
        /* built here, so a bad data_json is reported to the caller at once */
        it->body = mq_envelope_build(m->routing_key, m->key, m->request_id, m->traceparent,
                                     it->ts_ms, m->data_json);
        if (!it->body) {
            st = QN_EINVAL;
            goto fail;
        }
    }
    if (oom)
        goto fail;
    it->body_len = strlen(it->body);

    pthread_mutex_lock(&p->mu);
    if (p->stop || p->qlen >= p->queue_max) {
        pthread_mutex_unlock(&p->mu);
        st = QN_EBUSY;
        goto fail;
    }
    if (p->tail)
        p->tail->next = it;
    else
        p->head = it;
    p->tail = it;
    p->qlen++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return QN_OK;
fail:
    pub_item_free(it);
    return st;
}

int mq_publisher_ready(const mq_publisher *p)
{
    return p && __atomic_load_n(&p->ready, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- consumer */

struct mq_consumer {
    char *url, *name;
    char **keys; /* NULL-terminated */
    queue_names q;
    char in_name[MQ_NAME_MAX], out_name[MQ_NAME_MAX]; /* connection names */
    int prefetch, retry_delay_ms, max_attempts;
    mq_handler_fn handler;
    void *arg;
    mq_conn *in;  /* consuming channel */
    mq_conn *out; /* confirmed republish to .retry/.dead: a second connection, so waiting for
                     a confirm never has to step over deliveries arriving on the first */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;  /* atomic; mu/cv only make the backoff sleep interruptible */
    int ready; /* atomic */
};

static int consumer_stopping(mq_consumer *c)
{
    return __atomic_load_n(&c->stop, __ATOMIC_ACQUIRE);
}

static void consumer_sleep(mq_consumer *c, int ms)
{
    int64_t until = mono_ms() + ms;
    pthread_mutex_lock(&c->mu);
    while (!consumer_stopping(c) && mono_ms() < until)
        cond_wait_ms(&c->cv, &c->mu, until - mono_ms());
    pthread_mutex_unlock(&c->mu);
}

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

    if (!(c->in = conn_new(c->url, c->in_name, 0)))
        goto fail;
    st = mq_conn_declare_consumer(c->in, c->name, (const char *const *)c->keys, c->retry_delay_ms);
    if (st != QN_OK)
        goto fail;
    amqp_basic_qos(c->in->st, c->in->ch, 0, (uint16_t)c->prefetch, 0);
    if ((st = conn_last(c->in, "basic.qos")) != QN_OK)
        goto fail;
    amqp_basic_consume(c->in->st, c->in->ch, amqp_cstring_bytes(c->q.main), amqp_empty_bytes, 0, 0,
                       0, amqp_empty_table);
    if ((st = conn_last(c->in, "basic.consume")) != QN_OK)
        goto fail;
    st = QN_EAGAIN;
    if (!(c->out = conn_new(c->url, c->out_name, 1)))
        goto fail;
    __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
    log_infof(NULL, ((log_field[]){LOG_S("queue", c->q.main), LOG_END}), "mq: consuming");
    return QN_OK;
fail:
    log_errorf(NULL,
               ((log_field[]){LOG_S("queue", c->q.main),
                              LOG_S("error", c->in ? c->in->errstr : "connect failed"), LOG_END}),
               "mq: consumer setup failed; retrying");
    consumer_disconnect(c);
    return st;
}

/* Republishes to .retry or .dead, reconnecting the publish connection once if needed. */
static qn_status consumer_republish(mq_consumer *c, const amqp_envelope_t *env, const char *queue,
                                    int attempt, int requeues, const char *rk, const char *reason)
{
    qn_status st = QN_EAGAIN;

    for (int round = 0; round < 2; round++) {
        if (!mq_conn_ok(c->out)) {
            mq_conn_close(c->out);
            if (!(c->out = conn_new(c->url, c->out_name, 1)))
                continue;
        }
        st = republish(c->out, &env->message, queue, attempt, requeues, rk, reason,
                       MQ_DEFAULT_CONFIRM_TIMEOUT);
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
    char rkbuf[MQ_NAME_MAX], hbuf[MQ_NAME_MAX], tid[33];
    int attempt = (int)header_int(props, "x-attempt", 1);
    int requeues = (int)header_int(props, "x-requeues", 0);
    const char *rk = header_str(props, "x-routing-key", rkbuf, sizeof(rkbuf));
    const char *reason = NULL, *queue = NULL;
    mq_envelope e = {0};
    mq_handler_result res;
    log_ctx lc = {0};

    if (attempt < 1)
        attempt = 1;
    if (!rk)
        rk = bytes_str(env->routing_key, rkbuf, sizeof(rkbuf));
    mq_delivery_info info = {
        .consumer = c->name,
        .routing_key = rk,
        .attempt = attempt,
        .max_attempts = c->max_attempts,
        .redelivered = env->redelivered,
        .delivery_tag = env->delivery_tag,
    };

    if (mq_envelope_parse(env->message.body.bytes, env->message.body.len, &e) != QN_OK) {
        log_warnf(NULL,
                  ((log_field[]){LOG_S("queue", c->q.main), LOG_S("routing_key", rk), LOG_END}),
                  "mq: malformed envelope; dead-lettering");
        res = MQ_DEAD;
        reason = "malformed";
    } else {
        if (!e.request_id) {
            const char *h = header_str(props, "x-request-id", hbuf, sizeof(hbuf));
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
        if (attempt >= c->max_attempts) {
            queue = c->q.dead;
            reason = "max-attempts";
        } else {
            queue = c->q.retry;
            attempt++;
        }
        break;
    case MQ_REQUEUE_LATER:
        if (requeues + 1 >= MQ_REQUEUE_FACTOR * c->max_attempts) {
            queue = c->q.dead;
            reason = "requeue-limit";
        } else {
            queue = c->q.retry;
            requeues++;
        }
        break;
    default: /* MQ_DEAD and anything unknown */
        queue = c->q.dead;
        if (!reason)
            reason = "handler";
        break;
    }

    if (queue) {
        qn_status st = consumer_republish(c, env, queue, attempt, requeues, rk, reason);
        if (st != QN_OK) {
            /* Not acked: back to the queue, handled again shortly; nothing is lost. */
            log_errorf(
                &lc,
                ((log_field[]){LOG_S("queue", queue), LOG_S("status", qn_status_str(st)), LOG_END}),
                "mq: cannot republish; returning the message to its queue");
            if (amqp_basic_nack(c->in->st, c->in->ch, env->delivery_tag, 0, 1) != AMQP_STATUS_OK)
                c->in->broken = 1;
            consumer_sleep(c, 1000);
            goto done;
        }
        if (reason)
            log_warnf(&lc,
                      ((log_field[]){LOG_S("queue", queue), LOG_S("reason", reason),
                                     LOG_S("key", e.key), LOG_I("attempt", attempt), LOG_END}),
                      "mq: message dead-lettered");
    }
    if (amqp_basic_ack(c->in->st, c->in->ch, env->delivery_tag, 0) != AMQP_STATUS_OK) {
        snprintf(c->in->errstr, sizeof(c->in->errstr), "basic.ack failed");
        c->in->broken = 1;
    }
done:
    mq_envelope_free(&e);
}

/* Reads a frame that is not a delivery (amqp_consume_message put it back). */
static void consumer_other_frame(mq_consumer *c)
{
    amqp_frame_t f;
    int rc = amqp_simple_wait_frame(c->in->st, &f);

    if (rc != AMQP_STATUS_OK) {
        snprintf(c->in->errstr, sizeof(c->in->errstr), "%s", amqp_error_string2(rc));
        c->in->broken = 1;
        return;
    }
    if (f.frame_type != AMQP_FRAME_METHOD)
        return;
    if (f.payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
        /* the broker cancelled us (queue deleted): set everything up again */
        snprintf(c->in->errstr, sizeof(c->in->errstr), "consumer cancelled by broker");
        c->in->broken = 1;
        return;
    }
    conn_on_close_method(c->in, &f.payload.method, "consume");
    if (!c->in->chan_open)
        c->in->broken = 1;
}

static void *consumer_main(void *arg)
{
    mq_consumer *c = arg;
    int backoff = MQ_BACKOFF_MIN_MS;

    while (!consumer_stopping(c)) {
        amqp_envelope_t env;
        amqp_rpc_reply_t r;
        struct timeval tv = ms_to_tv(MQ_POLL_MS);

        if (!c->in) {
            if (consumer_connect(c) != QN_OK) {
                consumer_sleep(c, backoff);
                backoff = backoff * 2 > MQ_BACKOFF_MAX_MS ? MQ_BACKOFF_MAX_MS : backoff * 2;
                continue;
            }
            backoff = MQ_BACKOFF_MIN_MS;
        }
        amqp_maybe_release_buffers(c->in->st);
        r = amqp_consume_message(c->in->st, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            consumer_handle(c, &env);
            amqp_destroy_envelope(&env);
        } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                   r.library_error == AMQP_STATUS_TIMEOUT) {
            if (c->out)
                conn_poll(c->out); /* keep the idle publish connection's heartbeats going */
        } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                   r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            consumer_other_frame(c);
        } else {
            (void)conn_reply(c->in, r, "consume");
            c->in->broken = 1;
        }
        if (!mq_conn_ok(c->in)) {
            log_warnf(
                NULL,
                ((log_field[]){LOG_S("queue", c->q.main), LOG_S("error", c->in->errstr), LOG_END}),
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
    if (names_of(o->name, &c->q) != QN_OK)
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
    c->prefetch = o->prefetch > 0 ? o->prefetch : MQ_DEFAULT_PREFETCH;
    if (c->prefetch > 65535)
        c->prefetch = 65535;
    c->retry_delay_ms = o->retry_delay_ms > 0 ? o->retry_delay_ms : MQ_DEFAULT_RETRY_DELAY_MS;
    c->max_attempts = o->max_attempts > 0 ? o->max_attempts : MQ_DEFAULT_MAX_ATTEMPTS;
    c->handler = o->handler;
    c->arg = o->arg;
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cv);
    if (pthread_create(&c->th, NULL, consumer_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        goto fail;
    }
    return c;
fail:
    consumer_free(c);
    return NULL;
}

void mq_consumer_stop(mq_consumer *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->th, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    consumer_free(c);
}

int mq_consumer_ready(const mq_consumer *c)
{
    return c && __atomic_load_n(&c->ready, __ATOMIC_ACQUIRE);
}

/* ---------------------------------------------------------------- dead-letter tooling */

/* basic.get one message; *got = 0 when the queue is empty. msg is valid when *got. */
static qn_status dead_get(mq_conn *c, const char *queue, amqp_message_t *msg, uint64_t *tag,
                          int *got)
{
    qn_status st;
    amqp_rpc_reply_t r = amqp_basic_get(c->st, c->ch, amqp_cstring_bytes(queue), 0);

    *got = 0;
    if ((st = conn_reply(c, r, "basic.get")) != QN_OK)
        return st;
    if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
        return QN_OK; /* get-empty */
    *tag = ((amqp_basic_get_ok_t *)r.reply.decoded)->delivery_tag;
    if ((st = conn_reply(c, amqp_read_message(c->st, c->ch, msg, 0), "read")) != QN_OK)
        return st;
    *got = 1;
    return QN_OK;
}

qn_status mq_dead_list(const char *url, const char *name, int max, mq_dead_fn fn, void *arg)
{
    qn_status st;
    queue_names q;
    mq_conn *c = NULL;
    uint64_t tag = 0, last = 0;

    if (!fn || (st = names_of(name, &q)) != QN_OK)
        return QN_EINVAL;
    if (!(c = conn_new(url, "dead-list", 0)))
        return QN_EAGAIN;
    for (int i = 0; i < max; i++) {
        amqp_message_t msg;
        char rb[MQ_NAME_MAX];
        int got;

        if ((st = dead_get(c, q.dead, &msg, &tag, &got)) != QN_OK || !got)
            break;
        last = tag;
        fn(msg.body.bytes, msg.body.len, (int)header_int(&msg.properties, "x-attempt", 1),
           header_str(&msg.properties, "x-dead-reason", rb, sizeof(rb)), arg);
        amqp_destroy_message(&msg);
        amqp_maybe_release_buffers(c->st);
    }
    /* Put everything back where it was: listing must not consume. */
    if (last && mq_conn_ok(c) && amqp_basic_nack(c->st, c->ch, last, 1, 1) != AMQP_STATUS_OK)
        c->broken = 1;
    mq_conn_close(c);
    return st;
}

qn_status mq_dead_replay(const char *url, const char *name, int max, int *moved)
{
    qn_status st;
    queue_names q;
    mq_conn *c = NULL;
    uint32_t present = 0;

    *moved = 0;
    if ((st = names_of(name, &q)) != QN_OK)
        return st;
    if (!(c = conn_new(url, "dead-replay", 1)))
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
        char rb[MQ_NAME_MAX];
        const char *rk;
        uint64_t tag = 0;
        int got;

        if ((st = dead_get(c, q.dead, &msg, &tag, &got)) != QN_OK || !got)
            break;
        rk = header_str(&msg.properties, "x-routing-key", rb, sizeof(rb));
        st = republish(c, &msg, q.main, 1, 0, rk, NULL, MQ_DEFAULT_CONFIRM_TIMEOUT);
        amqp_destroy_message(&msg);
        if (st != QN_OK) {
            if (mq_conn_ok(c))
                (void)amqp_basic_nack(c->st, c->ch, tag, 0, 1);
            break;
        }
        if (amqp_basic_ack(c->st, c->ch, tag, 0) != AMQP_STATUS_OK) {
            c->broken = 1;
            st = QN_EAGAIN;
            break;
        }
        (*moved)++;
        amqp_maybe_release_buffers(c->st);
    }
done:
    if (st == QN_OK)
        log_infof(NULL, ((log_field[]){LOG_S("queue", q.dead), LOG_I("moved", *moved), LOG_END}),
                  "mq: dead letters replayed");
    mq_conn_close(c);
    return st;
}
