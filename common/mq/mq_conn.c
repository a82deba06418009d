/* One AMQP connection and the topology declared on it (mq_conn.h). */
#include "mq_conn.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "log.h"
#include "mq_envelope.h"
#include "mq_thread.h"
#include "namelist.h"
#include "now.h"

#define MQ_CONN_TIMEOUT_S 5 /* connect, login and every RPC */
#define MQ_CONN_FRAME_MAX 131072

static struct timeval ms_to_tv(int64_t ms)
{
    if (ms < 0)
        ms = 0;
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

int mq_conn_bytes_eq(amqp_bytes_t b, const char *s)
{
    size_t n = strlen(s);
    return b.len == n && (n == 0 || memcmp(b.bytes, s, n) == 0);
}

const char *mq_conn_bytes_str(amqp_bytes_t b, char *buf, size_t cap)
{
    size_t n = b.len < cap - 1 ? b.len : cap - 1;
    if (n)
        memcpy(buf, b.bytes, n);
    buf[n] = '\0';
    return buf;
}

/* ---------------------------------------------------------------- connection */

struct mq_conn {
    amqp_connection_state_t st;
    amqp_channel_t ch;
    int chan_open;
    int confirm;       /* channel in confirm mode */
    int broken;        /* the connection must be thrown away */
    uint64_t next_tag; /* delivery tag the broker gives the next publish (confirm mode) */
    int node;          /* the URL of the list it went to */
    char errstr[MQ_CONN_ERR_MAX];
};

int mq_conn_node(const mq_conn *c)
{
    return c ? c->node : 0;
}

int mq_conn_ok(const mq_conn *c)
{
    return c && !c->broken;
}

const char *mq_conn_errstr(const mq_conn *c)
{
    return c ? c->errstr : "no connection";
}

amqp_connection_state_t mq_conn_amqp(mq_conn *c)
{
    return c->st;
}

void mq_conn_fail(mq_conn *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errstr, sizeof(c->errstr), fmt, ap);
    va_end(ap);
    c->broken = 1;
}

/* Answers a broker-initiated close; the channel (or connection) is unusable afterwards. */
static void on_close_method(mq_conn *c, const amqp_method_t *m, const char *what)
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

qn_status mq_conn_check(mq_conn *c, amqp_rpc_reply_t r, const char *what)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return QN_OK;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(c->errstr, sizeof(c->errstr), "%s: %s", what, amqp_error_string2(r.library_error));
        c->broken = 1;
        return QN_EAGAIN;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        on_close_method(c, &r.reply, what);
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

qn_status mq_conn_check_last(mq_conn *c, const char *what)
{
    return mq_conn_check(c, amqp_get_rpc_reply(c->st), what);
}

/* Opens the channel if a broker error closed it (the same number is reusable after close-ok). */
static qn_status ensure_channel(mq_conn *c)
{
    qn_status st;

    if (c->broken)
        return QN_EAGAIN;
    if (c->chan_open)
        return QN_OK;
    amqp_channel_open(c->st, c->ch);
    if ((st = mq_conn_check_last(c, "channel.open")) != QN_OK)
        return st;
    c->chan_open = 1;
    if (c->confirm) {
        amqp_confirm_select(c->st, c->ch);
        if ((st = mq_conn_check_last(c, "confirm.select")) != QN_OK)
            return st;
        c->next_tag = 1;
    }
    return QN_OK;
}

/* ---------------------------------------------------------------- URL lists */

const char *const mq_conn_queue_types[] = {"classic", "quorum", NULL};

qn_status mq_conn_queue_type_parse(const char *text, mq_conn_queue_type *out)
{
    if (!text || !*text || !strcmp(text, "classic")) {
        *out = MQ_CONN_CLASSIC;
        return QN_OK;
    }
    if (!strcmp(text, "quorum")) {
        *out = MQ_CONN_QUORUM;
        return QN_OK;
    }
    return QN_EINVAL;
}

/* Cuts list (modified in place) at its commas into at most max URLs, blanks around each
 * removed. The count (0 for an empty list), or -1 when there are more than max; an empty entry
 * is kept as "". */
static int urls_split(char *list, char **out, int max)
{
    namelist it = namelist_of(list);
    const char *url;
    size_t len;
    int n = 0;

    while (namelist_next(&it, NAMELIST_TRIM, &url, &len)) {
        if (n == max)
            return -1;
        out[n] = list + (url - list);
        out[n++][len] = '\0'; /* on its comma, a blank or the end: the walk has passed it */
    }
    return n;
}

/* ---------------------------------------------------------------- TLS (amqps) */

/* What the query of an amqps:// URL asks of its TLS link (RabbitMQ's URI query parameters). */
typedef struct conn_tls {
    int verify;         /* verify_peer (the default): the chain and the host name */
    const char *cacert; /* the authorities trusted: cacertfile, else the system's */
    const char *cert;   /* client certificate (certfile) and its key (keyfile), both or none */
    const char *key;
} conn_tls;

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Percent-decodes s in place (a comma in a path is written %2C in a URL list); -1 if malformed. */
static int pct_decode(char *s)
{
    char *w = s;

    for (const char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hexval(r[1]), lo = hi < 0 ? -1 : hexval(r[2]);
            if (lo < 0)
                return -1;
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return 0;
}

/*
 * Cuts the query off the URL u (modified in place) and reads it into t (a '?' of a password is
 * written %3F, as rabbitmq-c's parser wants anyway). A query on a plain amqp:// URL, an unknown
 * parameter, a malformed or repeated one, a key without its certificate (or the reverse) or a
 * file that cannot be read is QN_EINVAL with the reason in err (parameters and paths, never the
 * rest of the URL).
 */
static qn_status url_tls(char *u, conn_tls *t, char *err, size_t errlen)
{
    char *q = strchr(u, '?'), *save = NULL, *kv;
    int ssl = strncmp(u, "amqps://", 8) == 0;

    *t = (conn_tls){.verify = 1, .cacert = MQ_CONN_SYSTEM_CA};
    if (!q)
        return QN_OK;
    *q++ = '\0';
    if (!ssl) {
        snprintf(err, errlen, "query parameters are only read on amqps:// URLs");
        return QN_EINVAL;
    }
    int seen_ca = 0, seen_cert = 0, seen_key = 0, seen_verify = 0;
    for (kv = strtok_r(q, "&", &save); kv; kv = strtok_r(NULL, "&", &save)) {
        char *v = strchr(kv, '=');
        if (!v || v == kv) {
            snprintf(err, errlen, "query parameter '%.40s' is not name=value", kv);
            return QN_EINVAL;
        }
        *v++ = '\0';
        if (pct_decode(v) != 0) {
            snprintf(err, errlen, "query parameter %.40s: malformed %%-escape", kv);
            return QN_EINVAL;
        }
        const char **slot;
        int *seen;
        if (!strcmp(kv, "cacertfile")) {
            slot = &t->cacert;
            seen = &seen_ca;
        } else if (!strcmp(kv, "certfile")) {
            slot = &t->cert;
            seen = &seen_cert;
        } else if (!strcmp(kv, "keyfile")) {
            slot = &t->key;
            seen = &seen_key;
        } else if (!strcmp(kv, "verify")) {
            if (seen_verify++) {
                snprintf(err, errlen, "query parameter verify given twice");
                return QN_EINVAL;
            }
            if (!strcmp(v, "verify_peer"))
                t->verify = 1;
            else if (!strcmp(v, "verify_none"))
                t->verify = 0;
            else {
                snprintf(err, errlen, "verify must be verify_peer or verify_none, not '%.40s'", v);
                return QN_EINVAL;
            }
            continue;
        } else {
            snprintf(err, errlen,
                     "unknown query parameter '%.40s' (cacertfile, certfile, keyfile, verify)", kv);
            return QN_EINVAL;
        }
        if ((*seen)++) {
            snprintf(err, errlen, "query parameter %s given twice", kv);
            return QN_EINVAL;
        }
        if (!*v) {
            snprintf(err, errlen, "query parameter %s is empty", kv);
            return QN_EINVAL;
        }
        *slot = v;
    }
    if (!t->cert != !t->key) {
        snprintf(err, errlen,
                 "certfile and keyfile go together (a client certificate and its key)");
        return QN_EINVAL;
    }
    const char *files[][2] = {
        {"cacertfile", t->cacert}, {"certfile", t->cert}, {"keyfile", t->key}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (files[i][1] && access(files[i][1], R_OK) != 0) {
            snprintf(err, errlen, "%s %.160s: %s", files[i][0], files[i][1], strerror(errno));
            return QN_EINVAL;
        }
    }
    return QN_OK;
}

qn_status mq_conn_urls_check(const char *urls, char *err, size_t errlen)
{
    char *list = urls ? strdup(urls) : NULL, *url[MQ_CONN_URLS_MAX];
    qn_status st = QN_EINVAL;
    int n;

    if (!list) {
        snprintf(err, errlen, urls ? "out of memory" : "not set");
        return urls ? QN_ENOMEM : QN_EINVAL;
    }
    n = urls_split(list, url, MQ_CONN_URLS_MAX);
    if (n <= 0) {
        if (n < 0)
            snprintf(err, errlen, "more than %d URLs", MQ_CONN_URLS_MAX);
        else
            snprintf(err, errlen, "no URL given");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        struct amqp_connection_info ci;
        /* The reason names the position only: the text holds a password. */
        if (!*url[i]) {
            snprintf(err, errlen, "URL %d of %d is empty", i + 1, n);
            goto done;
        }
        conn_tls tls;
        char why[MQ_CONN_ERR_MAX];
        if (url_tls(url[i], &tls, why, sizeof(why)) != QN_OK) {
            snprintf(err, errlen, "URL %d of %d: %s", i + 1, n, why);
            goto done;
        }
        if (amqp_parse_url(url[i], &ci) != AMQP_STATUS_OK) {
            snprintf(err, errlen,
                     "URL %d of %d is not amqp[s]://user:password@host:port/vhost[?query]", i + 1,
                     n);
            goto done;
        }
    }
    st = QN_OK;
done:
    free(list);
    return st;
}

/* The process's rotation over URL lists: a random start (two replicas begin at different
 * nodes), one further per connection (a process's connections spread too). */
static unsigned conn_rotation_next;
static pthread_once_t conn_rotation_once = PTHREAD_ONCE_INIT;

static void conn_rotation_begin(void)
{
    unsigned first;

    if (getrandom(&first, sizeof(first), GRND_NONBLOCK) != (ssize_t)sizeof(first))
        first = (unsigned)getpid() * 2654435761u ^ (unsigned)now_wall_ms();
    conn_rotation_next = first;
}

static unsigned conn_rotation(void)
{
    pthread_once(&conn_rotation_once, conn_rotation_begin);
    return __atomic_fetch_add(&conn_rotation_next, 1, __ATOMIC_RELAXED);
}

/* ---------------------------------------------------------------- one URL */

/* The socket's trust and identity from the URL's query; verification of the peer's chain and
 * host name on unless verify_none asked to skip it (logged, once per connection). */
static qn_status conn_tls_setup(mq_conn *c, amqp_socket_t *sock, const conn_tls *t)
{
    if (amqp_ssl_socket_set_cacert(sock, t->cacert) != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "cacertfile %.160s: no certificate could be loaded",
                 t->cacert);
        return QN_EINVAL;
    }
    if (t->cert && amqp_ssl_socket_set_key(sock, t->cert, t->key) != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr),
                 "certfile/keyfile: the client certificate or its key could not be loaded "
                 "(PEM, the key unencrypted and matching the certificate)");
        return QN_EINVAL;
    }
    amqp_ssl_socket_set_verify_peer(sock, t->verify);
    amqp_ssl_socket_set_verify_hostname(sock, t->verify);
    if (!t->verify)
        log_warn(NULL, "mq: TLS without verification of the broker's certificate (verify_none)");
    return QN_OK;
}

/* A pointer for the operator after a failed TLS check: which setting decides it. */
static const char *tls_hint(int rc)
{
    switch (rc) {
    case AMQP_STATUS_SSL_PEER_VERIFY_FAILED:
        return " (the broker's certificate is not signed by an authority of cacertfile)";
    case AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED:
        return " (the URL's host is not a DNS name of the broker's certificate)";
    case AMQP_STATUS_SSL_CONNECTION_FAILED:
        return " (TLS handshake failed: a plain listener, or the broker refused this client)";
    default:
        return "";
    }
}

/* Connects to the one URL u (modified: amqp_parse_url cuts it up). NULL on failure, with the
 * reason in why (never the password). */
static mq_conn *conn_open_one(char *u, const mq_conn_opts *o, char why[MQ_CONN_ERR_MAX])
{
    mq_conn *c = calloc(1, sizeof(*c));
    struct amqp_connection_info ci;
    amqp_socket_t *sock;
    struct timeval tv = {.tv_sec = MQ_CONN_TIMEOUT_S};
    char label[MQ_CONN_NAME_MAX];
    amqp_table_entry_t prop;
    amqp_table_t props = {.num_entries = 1, .entries = &prop};
    conn_tls tls;
    int rc, heartbeat = o->heartbeat_s == 0 ? MQ_CONN_HEARTBEAT_S : o->heartbeat_s;

    if (!c)
        goto fail;
    c->ch = MQ_CONN_CHANNEL;
    c->confirm = o->confirm;
    amqp_default_connection_info(&ci);
    if (url_tls(u, &tls, c->errstr, sizeof(c->errstr)) != QN_OK)
        goto fail;
    if (amqp_parse_url(u, &ci) != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "malformed AMQP URL"); /* never log it: password */
        goto fail;
    }
    /* "amqp://host:port/" parses to the empty vhost; we mean the default one. */
    if (!ci.vhost || !*ci.vhost)
        ci.vhost = (char *)AMQP_DEFAULT_VHOST;
    c->st = amqp_new_connection();
    if (!c->st || !(sock = ci.ssl ? amqp_ssl_socket_new(c->st) : amqp_tcp_socket_new(c->st))) {
        snprintf(c->errstr, sizeof(c->errstr), "out of memory");
        goto fail;
    }
    if (ci.ssl && conn_tls_setup(c, sock, &tls) != QN_OK)
        goto fail;
    amqp_set_handshake_timeout(c->st, &tv);
    amqp_set_rpc_timeout(c->st, &tv); /* a hung broker must not hang a declare forever */
    /* TLS: the handshake and the checks are inside this call, bounded by the same deadline. */
    rc = amqp_socket_open_noblock(sock, ci.host, ci.port, &tv);
    if (rc != AMQP_STATUS_OK) {
        snprintf(c->errstr, sizeof(c->errstr), "connect %s:%d%s: %s%s", ci.host, ci.port,
                 ci.ssl ? " (TLS)" : "", amqp_error_string2(rc), tls_hint(rc));
        goto fail;
    }
    /* FORCE goes past the system's cap but needs CAP_NET_ADMIN; else the capped size. */
    if (o->rcvbuf_bytes > 0 && setsockopt(amqp_socket_get_sockfd(sock), SOL_SOCKET, SO_RCVBUFFORCE,
                                          &o->rcvbuf_bytes, sizeof(o->rcvbuf_bytes)) != 0)
        (void)setsockopt(amqp_socket_get_sockfd(sock), SOL_SOCKET, SO_RCVBUF, &o->rcvbuf_bytes,
                         sizeof(o->rcvbuf_bytes));
    /* connection_name shows in the management UI and rabbitmqctl: who holds this connection */
    snprintf(label, sizeof(label), "quan %s", o->name ? o->name : "conn");
    prop.key = amqp_cstring_bytes("connection_name");
    prop.value.kind = AMQP_FIELD_KIND_UTF8;
    prop.value.value.bytes = amqp_cstring_bytes(label);
    if (mq_conn_check(c,
                      amqp_login_with_properties(c->st, ci.vhost, 0, MQ_CONN_FRAME_MAX,
                                                 heartbeat > 0 ? heartbeat : 0, &props,
                                                 AMQP_SASL_METHOD_PLAIN, ci.user, ci.password),
                      "login") != QN_OK)
        goto fail;
    if (ensure_channel(c) != QN_OK)
        goto fail;
    amqp_exchange_declare(c->st, c->ch, amqp_cstring_bytes(MQ_CONN_EXCHANGE),
                          amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
    if (mq_conn_check_last(c, "exchange.declare " MQ_CONN_EXCHANGE) != QN_OK)
        goto fail;
    return c;
fail:
    snprintf(why, MQ_CONN_ERR_MAX, "%s", c ? c->errstr : "out of memory");
    if (c) {
        c->broken = 1; /* skip the polite close */
        mq_conn_close(c);
    }
    return NULL;
}

/* Appends "URL i+1 of n: why" to the reasons in buf, cut at its end when they are many. */
static void reason_append(char *buf, size_t cap, int i, int n, const char *why)
{
    size_t used = strlen(buf);
    int w = snprintf(buf + used, cap - used, "%sURL %d of %d: %s", used ? "; " : "", i + 1, n, why);

    if (w < 0)
        buf[used] = '\0';
}

mq_conn *mq_conn_connect(const char *url, const mq_conn_opts *o, char err[MQ_CONN_ERR_MAX])
{
    char *list = url ? strdup(url) : NULL, *urls[MQ_CONN_URLS_MAX];
    char why[MQ_CONN_ERR_MAX], all[MQ_CONN_ERR_MAX] = "";
    mq_conn *c = NULL;
    unsigned start = 0;
    int n = 0, tried = 0, i = 0;

    if (!list) {
        snprintf(all, sizeof(all), url ? "out of memory" : "malformed AMQP URL");
        goto done;
    }
    n = urls_split(list, urls, MQ_CONN_URLS_MAX);
    if (n <= 0) {
        if (n < 0)
            snprintf(all, sizeof(all), "more than %d AMQP URLs", MQ_CONN_URLS_MAX);
        else
            snprintf(all, sizeof(all), "no AMQP URL");
        goto done;
    }
    if (n > 1)
        start = o->cursor && o->cursor->started ? o->cursor->next : conn_rotation();
    for (tried = 0; tried < n && !c; tried++) {
        i = (int)((start + (unsigned)tried) % (unsigned)n);
        c = conn_open_one(urls[i], o, why);
        if (c)
            break;
        if (n == 1) /* one URL: its reason as it is */
            snprintf(all, sizeof(all), "%s", why);
        else
            reason_append(all, sizeof(all), i, n, why);
    }
    if (o->cursor) {
        /* Past the node that answered; after a round that found none, one further. */
        o->cursor->next = c ? (unsigned)i + 1 : start + 1;
        o->cursor->started = 1;
    }
    if (c) {
        c->node = i;
        if (tried > 0)
            log_warnf(NULL,
                      ((log_field[]){LOG_S("connection", o->name ? o->name : "conn"),
                                     LOG_I("node", i + 1), LOG_S("skipped", all), LOG_END}),
                      "mq: connected to a later node of the list");
    }
done:
    if (!c && err)
        snprintf(err, MQ_CONN_ERR_MAX, "%s", all);
    free(list);
    return c;
}

mq_conn *mq_conn_open(const char *url, const char *conn_name)
{
    return mq_conn_open_at(url, conn_name, NULL);
}

mq_conn *mq_conn_open_at(const char *url, const char *conn_name, mq_conn_cursor *cursor)
{
    char err[MQ_CONN_ERR_MAX];
    mq_conn *c = mq_conn_connect(
        url, &(mq_conn_opts){.name = conn_name, .confirm = 1, .cursor = cursor}, err);

    if (!c)
        log_errorf(NULL, ((log_field[]){LOG_S("error", err), LOG_END}),
                   "mq: cannot open connection");
    return c;
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

void mq_conn_on_frame(mq_conn *c, const amqp_frame_t *f, const char *what)
{
    if (f->frame_type != AMQP_FRAME_METHOD)
        return;
    on_close_method(c, &f->payload.method, what);
    if (!c->chan_open)
        c->broken = 1;
}

/* Frames read here are stale confirms or broker closes. */
void mq_conn_poll(mq_conn *c)
{
    struct timeval zero = {0};
    amqp_frame_t f;

    while (!c->broken) {
        int rc = amqp_simple_wait_frame_noblock(c->st, &f, &zero);
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            mq_conn_fail(c, "idle: %s", amqp_error_string2(rc));
            break;
        }
        mq_conn_on_frame(c, &f, "idle");
    }
    amqp_maybe_release_buffers(c->st);
}

void mq_conn_props_init(mq_conn_props *mp, const char *key, const char *request_id,
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

qn_status mq_conn_publish_raw(mq_conn *c, const char *exchange, const char *rk,
                              const amqp_basic_properties_t *props, const char *body, size_t len,
                              uint64_t *tag)
{
    amqp_bytes_t b = {.len = len, .bytes = (void *)body};
    int rc;

    if (ensure_channel(c) != QN_OK)
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

static size_t pending_resolve(mq_conn_pending *p, size_t n, uint64_t tag, int multiple,
                              qn_status st)
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
static void pending_on_return(mq_conn *c, const amqp_frame_t *f, mq_conn_pending *p, size_t n)
{
    amqp_basic_return_t *r = f->payload.method.decoded;
    char rk[MQ_CONN_NAME_MAX];
    amqp_message_t msg;
    amqp_rpc_reply_t rr;

    mq_conn_bytes_str(r->routing_key, rk, sizeof(rk));
    rr = amqp_read_message(c->st, f->channel, &msg, 0);
    if (mq_conn_check(c, rr, "basic.return") != QN_OK)
        return;
    for (size_t i = 0; i < n; i++) {
        if (p[i].done || p[i].returned || strcmp(p[i].rk, rk) != 0)
            continue;
        if ((msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) &&
            !mq_conn_bytes_eq(msg.properties.message_id, p[i].key))
            continue;
        p[i].returned = 1;
        break;
    }
    amqp_destroy_message(&msg);
}

void mq_conn_confirm_until(mq_conn *c, mq_conn_pending *p, size_t n, int64_t deadline, int any)
{
    size_t left = 0, start;
    int timed_out = 0;

    for (size_t i = 0; i < n; i++)
        left += !p[i].done;
    start = left;
    while (left > 0 && (!any || left == start) && !c->broken && c->chan_open) {
        int64_t rem = deadline - now_mono_ms();
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
            on_close_method(c, &f.payload.method, "confirm");
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

void mq_conn_confirm(mq_conn *c, mq_conn_pending *p, size_t n, int timeout_ms)
{
    mq_conn_confirm_until(c, p, n, now_mono_ms() + timeout_ms, 0);
}

int mq_conn_msg_valid(const mq_msg *m)
{
    return m && m->routing_key && *m->routing_key && strlen(m->routing_key) < MQ_CONN_NAME_MAX &&
           m->key && *m->key && strlen(m->key) < MQ_CONN_NAME_MAX;
}

qn_status mq_conn_publish_confirmed(mq_conn *c, const mq_msg *m, int timeout_ms)
{
    qn_status st = QN_EINVAL;
    char *built = NULL;
    const char *body;
    int64_t ts = m && m->ts_ms ? m->ts_ms : now_wall_ms();
    mq_conn_props mp;
    mq_conn_pending p = {0};

    if (!c || !mq_conn_msg_valid(m))
        goto done;
    body = m->body;
    if (!body) {
        built = mq_envelope_build(m->routing_key, m->key, m->request_id, m->traceparent, ts,
                                  m->data_json);
        if (!built)
            goto done;
        body = built;
    }
    mq_conn_props_init(&mp, m->key, m->request_id, m->traceparent, ts);
    st =
        mq_conn_publish_raw(c, MQ_CONN_EXCHANGE, m->routing_key, &mp.p, body, strlen(body), &p.tag);
    if (st != QN_OK)
        goto done;
    p.key = m->key;
    p.rk = m->routing_key;
    mq_conn_confirm(c, &p, 1, timeout_ms > 0 ? timeout_ms : MQ_CONN_CONFIRM_TIMEOUT_MS);
    st = p.st;
done:
    free(built);
    return st;
}

/* ---------------------------------------------------------------- topology */

qn_status mq_conn_names_of(const char *name, mq_conn_names *q)
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
    char what[MQ_CONN_NAME_MAX + 16];

    if ((st = ensure_channel(c)) != QN_OK)
        return st;
    amqp_queue_declare(c->st, c->ch, amqp_cstring_bytes(q), 0, 1, 0, 0, args);
    snprintf(what, sizeof(what), "declare %s", q);
    st = mq_conn_check_last(c, what);
    if (st == QN_ECONFLICT)
        log_errorf(NULL, ((log_field[]){LOG_S("queue", q), LOG_S("error", c->errstr), LOG_END}),
                   "mq: queue exists with other arguments (e.g. another retry delay or queue "
                   "type); delete it or configure the same values");
    return st;
}

/* Sets e to a string argument. */
static void arg_str(amqp_table_entry_t *e, const char *key, const char *value)
{
    e->key = amqp_cstring_bytes(key);
    e->value.kind = AMQP_FIELD_KIND_UTF8;
    e->value.value.bytes = amqp_cstring_bytes(value);
}

qn_status mq_conn_declare_consumer(mq_conn *c, const char *name, const char *const *routing_keys,
                                   int retry_delay_ms, mq_conn_queue_type type)
{
    qn_status st;
    mq_conn_names q;
    amqp_table_entry_t e[6], qtype;
    amqp_table_t plain = amqp_empty_table, retry = {.num_entries = 3, .entries = e};

    if (!c || !routing_keys || !routing_keys[0])
        return QN_EINVAL;
    if ((st = mq_conn_names_of(name, &q)) != QN_OK)
        return st;
    /* Expired retries dead-letter through the default exchange straight to quan.<name>, so
     * other consumers of the same event never see them. */
    e[0].key = amqp_cstring_bytes("x-message-ttl");
    e[0].value.kind = AMQP_FIELD_KIND_I64;
    e[0].value.value.i64 = retry_delay_ms > 0 ? retry_delay_ms : MQ_CONN_RETRY_DELAY_MS;
    arg_str(&e[1], "x-dead-letter-exchange", "");
    arg_str(&e[2], "x-dead-letter-routing-key", q.main);
    if (type == MQ_CONN_QUORUM) {
        arg_str(&qtype, "x-queue-type", "quorum");
        plain = (amqp_table_t){.num_entries = 1, .entries = &qtype};
        e[3] = qtype;
        /* A quorum queue dead-letters at most once unless told otherwise: a retry expiring
         * while quan.<name> has no majority would be dropped, which classic queues on one node
         * never risked. At least once keeps it in .retry until quan.<name> confirms it; the
         * broker requires reject-publish overflow for that (no length limit is set, so
         * nothing is ever rejected). */
        arg_str(&e[4], "x-dead-letter-strategy", "at-least-once");
        arg_str(&e[5], "x-overflow", "reject-publish");
        retry.num_entries = 6;
    } else if (type != MQ_CONN_CLASSIC) {
        return QN_EINVAL;
    }
    if ((st = queue_declare(c, q.main, plain)) != QN_OK)
        return st;
    if ((st = queue_declare(c, q.retry, retry)) != QN_OK)
        return st;
    if ((st = queue_declare(c, q.dead, plain)) != QN_OK)
        return st;
    for (size_t i = 0; routing_keys[i]; i++) {
        amqp_queue_bind(c->st, c->ch, amqp_cstring_bytes(q.main),
                        amqp_cstring_bytes(MQ_CONN_EXCHANGE), amqp_cstring_bytes(routing_keys[i]),
                        amqp_empty_table);
        if ((st = mq_conn_check_last(c, "queue.bind")) != QN_OK)
            return st;
    }
    return QN_OK;
}

qn_status mq_conn_delete_consumer(mq_conn *c, const char *name)
{
    qn_status st;
    mq_conn_names q;
    const char *all[3] = {q.main, q.retry, q.dead};

    if (!c)
        return QN_EINVAL;
    if ((st = mq_conn_names_of(name, &q)) != QN_OK)
        return st;
    for (int i = 0; i < 3; i++) {
        if ((st = ensure_channel(c)) != QN_OK)
            return st;
        amqp_queue_delete(c->st, c->ch, amqp_cstring_bytes(all[i]), 0, 0);
        if ((st = mq_conn_check_last(c, "queue.delete")) != QN_OK)
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
    if ((st = ensure_channel(c)) != QN_OK)
        return st;
    ok = amqp_queue_declare(c->st, c->ch, amqp_cstring_bytes(queue), 1, 0, 0, 0, amqp_empty_table);
    if ((st = mq_conn_check_last(c, "queue.declare passive")) != QN_OK)
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
        if (mq_conn_bytes_eq(p->headers.entries[i].key, name))
            return &p->headers.entries[i].value;
    return NULL;
}

int64_t mq_conn_header_int(const amqp_basic_properties_t *p, const char *name, int64_t def)
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
const char *mq_conn_header_str(const amqp_basic_properties_t *p, const char *name, char *buf,
                               size_t cap)
{
    const amqp_field_value_t *v = header_get(p, name);
    if (!v || (v->kind != AMQP_FIELD_KIND_UTF8 && v->kind != AMQP_FIELD_KIND_BYTES))
        return NULL;
    return mq_conn_bytes_str(v->value.bytes, buf, cap);
}
