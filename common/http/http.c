#include "http.h"
#include "grow.h"
#include "jsonin.h"
#include "jsonout.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#include "metrics.h"
#include "now.h"

METRICS_DEFINE(HTTP_METRICS)

#define HTTP_JSON_TYPE "application/json; charset=utf-8"
#define HTTP_MSG_MAX   512 /* an error's message, formatted */
/* Requests kept for reuse, and the largest body buffer kept with one: allocating and zeroing
 * a request per request showed in the profile (malloc and free about a fifth of libc's time). */
#define HTTP_FREE_REQS_MAX  256
#define HTTP_KEEP_BODY_MAX  4096
#define HTTP_ROUTE_STATUSES 4 /* a route's statuses whose metric series are remembered */

/* A route's metric series for one status: looked up once, not per request. */
typedef struct http_route_series {
    int status; /* 0: unused */
    metrics_handle count, duration;
} http_route_series;

typedef struct http_route_ent {
    int method;
    char *path;
    http_handler fn;
    void *arg;
    unsigned flags;
    http_route_series series[HTTP_ROUTE_STATUSES];
} http_route_ent;

#define HTTP_MAX_SINGLE_WRITE (1024 * 1024)
#define HTTP_HDR_REQUEST_ID   "X-Request-Id"
#define HTTP_HDR_TRACEPARENT  "traceparent"

/* The request headers the framework reads (http_in_headers). */
enum { HTTP_IN_RID, HTTP_IN_TRACE, HTTP_IN_USER, HTTP_IN_SHOP, HTTP_IN_NAME, HTTP_IN_COUNT };

struct http_server {
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    char *bind_addr, *user_hdr, *shop_hdr, *name_hdr, *service;
    size_t in_len[HTTP_IN_COUNT]; /* the lengths of the names http_in_headers looks for */
    uint16_t port;
    size_t max_body;
    int request_timeout_ms;
    http_route_ent *routes;
    size_t nroutes, cap;
    http_ready_fn ready_fn;
    void *ready_arg;
    int draining;
    size_t inflight;
    size_t unsent;       /* replies handed to evhttp and not yet completely written */
    http_req *live;      /* requests whose handler has not replied yet */
    http_req *free_reqs; /* freed requests for reuse (next-linked) */
    size_t nfree;
    struct evbuffer *reply_buf; /* http_reply_buf */
};

/* Request, trace and span ids need to be unique, not secret: a per-thread splitmix64 seeded
 * once from getrandom saves a system call per request (measured: ~4 % of the loop's time). */
static uint64_t http_random64(void)
{
    static __thread uint64_t state;
    static __thread int seeded;
    if (!seeded) {
        if (getrandom(&state, sizeof(state), 0) != (ssize_t)sizeof(state))
            state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        seeded = 1;
    }
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void http_random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < nbytes; i += 8) {
        uint64_t v = http_random64();
        size_t n = nbytes - i < 8 ? nbytes - i : 8;
        for (size_t k = 0; k < 2 * n; k++, v >>= 4) /* a digit per nibble, no table of pairs */
            out[2 * i + k] = hex[v & 15];
    }
    out[2 * nbytes] = '\0';
}

static bool http_is_lhex(const char *s, size_t n)
{
    bool nonzero = false;
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
        nonzero |= s[i] != '0';
    }
    return nonzero || n == 2; /* flags may be 00; ids may not be all zero */
}

bool http_traceparent_parse(const char *s, char *trace_id, char *parent_id, char *flags)
{
    if (!s || strlen(s) != 55 || strncmp(s, "00-", 3) != 0 || s[35] != '-' || s[52] != '-')
        return false;
    if (!http_is_lhex(s + 3, 32) || !http_is_lhex(s + 36, 16) || !http_is_lhex(s + 53, 2))
        return false;
    memcpy(trace_id, s + 3, 32), trace_id[32] = '\0';
    memcpy(parent_id, s + 36, 16), parent_id[16] = '\0';
    memcpy(flags, s + 53, 2), flags[2] = '\0';
    return true;
}

char *http_req_traceparent(const http_req *req, char *buf)
{
    if (strlen(req->trace_id) != 32 || strlen(req->span_id) != 16 ||
        strlen(req->trace_flags) != 2) { /* a request not made by http_on_request (tests) */
        snprintf(buf, HTTP_TRACEPARENT_LEN, "00-%s-%s-%s", req->trace_id, req->span_id,
                 req->trace_flags);
        return buf;
    }
    /* fixed widths (http_ids): copies instead of a printf, twice per request */
    memcpy(buf, "00-", 3);
    memcpy(buf + 3, req->trace_id, 32);
    buf[35] = '-';
    memcpy(buf + 36, req->span_id, 16);
    buf[52] = '-';
    memcpy(buf + 53, req->trace_flags, 2);
    buf[55] = '\0';
    return buf;
}

bool http_request_id_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char c = s[n];
        if (n >= HTTP_REQUEST_ID_MAX ||
            !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return false;
    }
    return n > 0;
}

int64_t http_parse_id(const char *s)
{
    int64_t v;
    return s && s[0] != '-' && jsonin_int64_text(s, &v) == QN_OK && v > 0 ? v : 0;
}

static const char *http_method_name(int m)
{
    switch (m) {
    case EVHTTP_REQ_GET:
        return "GET";
    case EVHTTP_REQ_POST:
        return "POST";
    case EVHTTP_REQ_PUT:
        return "PUT";
    case EVHTTP_REQ_DELETE:
        return "DELETE";
    case EVHTTP_REQ_PATCH:
        return "PATCH";
    case EVHTTP_REQ_HEAD:
        return "HEAD";
    case EVHTTP_REQ_OPTIONS:
        return "OPTIONS";
    default:
        return "OTHER";
    }
}

/* The envelope {"code","message","data","requestId","success"} into b, written out rather than
 * built as a tree: data is written by w (w(b, warg)) or printed once from data (NULL: null),
 * into a stack buffer when it fits. */
static qn_status http_envelope_add(struct evbuffer *b, const char *code, const char *message,
                                   const cJSON *data, http_data_writer w, const void *warg,
                                   const char *request_id, bool success)
{
    char small[4096], *printed = NULL;
    const char *djson = "null";
    if (w) {
        djson = "";
    } else if (data) {
        if (cJSON_PrintPreallocated((cJSON *)data, small, sizeof(small), 0))
            djson = small;
        else if ((printed = cJSON_PrintUnformatted(data)))
            djson = printed;
        else
            return QN_ENOMEM;
    }
    int bad = evbuffer_add(b, "{\"code\":", 8) || jsonout_str(b, code) ||
              evbuffer_add(b, ",\"message\":", 11) ||
              (message ? jsonout_str(b, message) : evbuffer_add(b, "null", 4)) ||
              evbuffer_add(b, ",\"data\":", 8) || (w && w(b, warg)) ||
              evbuffer_add(b, djson, strlen(djson)) || evbuffer_add(b, ",\"requestId\":", 13) ||
              jsonout_str(b, request_id) ||
              (success ? evbuffer_add(b, ",\"success\":true}", 16)
                       : evbuffer_add(b, ",\"success\":false}", 17));
    free(printed);
    return bad ? QN_ENOMEM : QN_OK;
}

char *http_envelope(const char *code, const char *message, const cJSON *data,
                    const char *request_id, bool success)
{
    struct evbuffer *b = evbuffer_new();
    char *out = NULL;
    if (b && http_envelope_add(b, code, message, data, NULL, NULL, request_id, success) == QN_OK) {
        size_t n = evbuffer_get_length(b);
        if ((out = malloc(n + 1))) {
            evbuffer_remove(b, out, n);
            out[n] = '\0';
        }
    }
    if (b)
        evbuffer_free(b);
    return out;
}

/* ---- request lifetime ---- */

static void http_req_free(http_req *req)
{
    http_server *srv = req->srv;
    if (srv) {
        if (req->prev)
            req->prev->next = req->next;
        else
            srv->live = req->next;
        if (req->next)
            req->next->prev = req->prev;
        srv->inflight--;
    }
    if (req->timer_armed)
        event_del(&req->timer);
    cJSON_Delete(req->json);
    cJSON_Delete(req->scratch);
    free(req->path_buf);
    free(req->username_buf);
    if (req->query_raw != req->query_inline)
        free(req->query_raw);
    if (srv && srv->nfree < HTTP_FREE_REQS_MAX) {
        if (req->body_cap > HTTP_KEEP_BODY_MAX) {
            free(req->body);
            req->body = NULL;
            req->body_cap = 0;
        }
        req->next = srv->free_reqs;
        srv->free_reqs = req;
        srv->nfree++;
        return;
    }
    free(req->body);
    free(req);
}

/* A zeroed request, from the free list when there is one (its body buffer kept). */
static http_req *http_req_alloc(http_server *srv)
{
    http_req *req = srv->free_reqs;
    if (!req)
        return calloc(1, sizeof(*req));
    srv->free_reqs = req->next;
    srv->nfree--;
    char *body = req->body;
    size_t cap = req->body_cap;
    memset(req, 0, sizeof(*req));
    req->body = body;
    req->body_cap = cap;
    if (body)
        body[0] = '\0'; /* http_body_raw before the body is read: "" */
    return req;
}

/* seconds as "S.uuuuuu" (microseconds), without printf */
static void http_seconds_str(char *out, double dur)
{
    int64_t us = dur > 0 ? (int64_t)(dur * 1e6 + 0.5) : 0;
    size_t n = log_i64_str(out, us / 1000000);
    out[n++] = '.';
    for (int64_t d = 100000, f = us % 1000000; d; d /= 10)
        out[n++] = (char)('0' + f / d % 10);
    out[n] = '\0';
}

/* The route's series slot for status (route_no > 0), or NULL when the route answers more
 * statuses than it remembers (those are looked up each time). */
static http_route_series *http_route_series_of(http_server *srv, size_t route_no, int status)
{
    http_route_ent *r = &srv->routes[route_no - 1];
    http_route_series *free_slot = NULL;
    for (size_t i = 0; i < HTTP_ROUTE_STATUSES; i++) {
        if (r->series[i].status == status)
            return &r->series[i];
        if (!free_slot && r->series[i].status == 0)
            free_slot = &r->series[i];
    }
    if (free_slot)
        free_slot->status = status;
    return free_slot;
}

static void http_access_log(http_req *req, int status, double dur)
{
    char status_s[24], dur_s[48];
    log_i64_str(status_s, status);
    http_seconds_str(dur_s, dur);
    http_route_series *rs =
        req->srv && req->route_no ? http_route_series_of(req->srv, req->route_no, status) : NULL;
    if (rs) {
        const char *const labels[] = {req->route, status_s, NULL};
        metrics_series_add(
            metrics_handle_series(&rs->count, &metric_quan_http_requests_total, labels), 1);
        metrics_series_observe(metrics_handle_series(&rs->duration,
                                                     &metric_quan_http_request_duration_seconds,
                                                     labels),
                               dur);
    } else {
        metrics_inc_l(&metric_quan_http_requests_total, req->route, status_s);
        metrics_observe_l(&metric_quan_http_request_duration_seconds, dur, req->route, status_s);
    }
    log_infof(
        &req->log,
        ((log_field[]){LOG_S("method", http_method_name(req->method)), LOG_S("route", req->route),
                       LOG_S("path", req->path), LOG_I("status", status),
                       LOG_S("duration_s", dur_s), LOG_I("user_id", req->user_id), LOG_END}),
        "request");
}

static void http_on_sent(struct evhttp_request *ev, void *arg)
{
    (void)ev;
    http_server *srv = arg;
    if (srv->unsent > 0)
        srv->unsent--;
}

/* The Date header's value (RFC 7231 IMF-fixdate) of the current second. evhttp formats one per
 * reply (gmtime and a printf) when the reply has none; the loop's replies of one second share
 * this one. */
static const char *http_date(void)
{
    static const char days[] = "SunMonTueWedThuFriSat";
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    static __thread time_t at = -1;
    static __thread char text[32];
    time_t t = time(NULL);
    if (t != at) {
        struct tm tm;
        gmtime_r(&t, &tm);
        char *p = text;
        memcpy(p, days + 3 * tm.tm_wday, 3);
        p += 3;
        *p++ = ',';
        *p++ = ' ';
        *p++ = (char)('0' + tm.tm_mday / 10);
        *p++ = (char)('0' + tm.tm_mday % 10);
        *p++ = ' ';
        memcpy(p, months + 3 * tm.tm_mon, 3);
        p += 3;
        *p++ = ' ';
        p += log_i64_str(p, tm.tm_year + 1900);
        const int hms[3] = {tm.tm_hour, tm.tm_min, tm.tm_sec};
        for (int i = 0; i < 3; i++) {
            *p++ = i ? ':' : ' ';
            *p++ = (char)('0' + hms[i] / 10);
            *p++ = (char)('0' + hms[i] % 10);
        }
        memcpy(p, " GMT", 5);
        at = t;
    }
    return text;
}

/* The headers every answer carries, then the caller's (NULL or name/value pairs). A 429 or
 * 503 says when to try again: a second (every such answer is for a state that changes by
 * itself, soon: a claim in doubt, a lock, a dependency reconnecting). */
static void http_out_headers(http_req *req, struct evhttp_request *ev, int status,
                             const char *ctype, const char *const *headers)
{
    struct evkeyvalq *oh = evhttp_request_get_output_headers(ev);
    char tp[HTTP_TRACEPARENT_LEN];
    evhttp_add_header(oh, "Content-Type", ctype ? ctype : "application/octet-stream");
    evhttp_add_header(oh, HTTP_HDR_REQUEST_ID, req->request_id);
    evhttp_add_header(oh, HTTP_HDR_TRACEPARENT, http_req_traceparent(req, tp));
    evhttp_add_header(oh, "Date", http_date());
    if (req->srv && req->srv->draining)
        evhttp_add_header(oh, "Connection", "close"); /* let keep-alive clients move on */
    if (status == 429 || status == 503)
        evhttp_add_header(oh, "Retry-After", "1");
    for (; headers && headers[0] && headers[1]; headers += 2)
        evhttp_add_header(oh, headers[0], headers[1]);
}

/* Counted until written, so a drain does not close a connection with the reply still in its
 * output buffer. (libevent skips this callback when the write fails, hence the service's
 * bounded wait.) */
static void http_count_unsent(http_req *req, struct evhttp_request *ev)
{
    if (req->srv) {
        req->srv->unsent++;
        evhttp_request_set_on_complete_cb(ev, http_on_sent, req->srv);
    }
}

/* Sends body (emptied; NULL: none) to the client, once. headers: NULL or name/value pairs,
 * NULL-terminated. */
static void http_send_buf(http_req *req, int status, const char *ctype, struct evbuffer *body,
                          const char *const *headers)
{
    struct evhttp_request *ev = req->evreq;
    if (req->client_done)
        return;
    req->client_done = 1;
    req->evreq = NULL;
    if (!ev)
        return;
    struct evhttp_connection *conn = evhttp_request_get_connection(ev);
    if (conn)
        evhttp_connection_set_closecb(conn, NULL, NULL);
    http_out_headers(req, ev, status, ctype, headers);
    if (status != 204 && status != 304 && status >= 200) {
        /* What evhttp would add, without its printf. A HEAD answer says the length and sends
         * nothing: evhttp would send the body after it, which the client reads as the start of
         * the next answer. */
        char len[24];
        log_i64_str(len, (int64_t)(body ? evbuffer_get_length(body) : 0));
        evhttp_add_header(evhttp_request_get_output_headers(ev), "Content-Length", len);
        if (req->method == EVHTTP_REQ_HEAD && body)
            evbuffer_drain(body, evbuffer_get_length(body));
    }
    /* With the connection gone, libevent frees the request here. */
    http_count_unsent(req, ev);
    evhttp_send_reply(ev, status, NULL, body);
    http_access_log(req, status, now_mono_s() - req->start);
}

/* The server's reply buffer: evhttp_send_reply moves its content out, so one serves every
 * reply of the loop (a request without a server gets its own). */
static struct evbuffer *http_reply_buf(http_req *req)
{
    if (req->srv) {
        if (!req->srv->reply_buf)
            req->srv->reply_buf = evbuffer_new();
        if (req->srv->reply_buf)
            evbuffer_drain(req->srv->reply_buf, evbuffer_get_length(req->srv->reply_buf));
        return req->srv->reply_buf;
    }
    return evbuffer_new();
}

static void http_reply_buf_done(http_req *req, struct evbuffer *b)
{
    if (b && (!req->srv || b != req->srv->reply_buf))
        evbuffer_free(b);
}

static void http_send(http_req *req, int status, const char *ctype, const void *data, size_t len,
                      const char *const *headers)
{
    if (req->client_done)
        return;
    struct evbuffer *b = http_reply_buf(req);
    if (b && len)
        evbuffer_add(b, data, len);
    http_send_buf(req, status, ctype, b, headers);
    http_reply_buf_done(req, b);
}

/* data is owned (freed here); w (when not NULL) writes the data instead. */
static void http_send_envelope_w(http_req *req, int status, const char *code, const char *msg,
                                 cJSON *data, http_data_writer w, const void *warg,
                                 const char *const *headers)
{
    if (req->client_done) {
        cJSON_Delete(data);
        return;
    }
    struct evbuffer *b = http_reply_buf(req);
    if (!b || http_envelope_add(b, code, msg, data, w, warg, req->request_id,
                                strcmp(code, "0") == 0) != QN_OK) {
        static const char oom[] =
            "{\"code\":\"B000001\",\"message\":\"out of memory\",\"data\":null,\"requestId\":null,"
            "\"success\":false}";
        if (b)
            evbuffer_drain(b, evbuffer_get_length(b));
        http_reply_buf_done(req, b);
        cJSON_Delete(data);
        http_send(req, 500, HTTP_JSON_TYPE, oom, sizeof(oom) - 1, NULL);
        return;
    }
    cJSON_Delete(data);
    http_send_buf(req, status, HTTP_JSON_TYPE, b, headers);
    http_reply_buf_done(req, b);
}

static void http_send_envelope(http_req *req, int status, const char *code, const char *msg,
                               cJSON *data, const char *const *headers)
{
    http_send_envelope_w(req, status, code, msg, data, NULL, NULL, headers);
}

/* The handler's reply: answers the client unless already answered, then frees req (after
 * dispatch returns when the handler replied synchronously). */
static void http_finish(http_req *req)
{
    req->handler_done = 1;
    if (!req->dispatching)
        http_req_free(req);
}

/* The wrapper's hook, once, before the reply frees req. */
static void http_run_reply_hook(http_req *req, int status)
{
    http_reply_hook fn = req->reply_hook;
    req->reply_hook = NULL;
    if (fn)
        fn(req, status, req->reply_hook_arg);
}

void http_req_on_reply(http_req *req, http_reply_hook fn, void *arg)
{
    req->reply_hook = fn;
    req->reply_hook_arg = arg;
}

void http_reply_status(http_req *req, int status, cJSON *data)
{
    http_run_reply_hook(req, status);
    if (!req->client_done)
        http_send_envelope(req, status, "0", NULL, data, NULL);
    else
        cJSON_Delete(data);
    http_finish(req);
}

void http_reply_ok(http_req *req, cJSON *data)
{
    http_reply_status(req, 200, data);
}

void http_reply_ok_write(http_req *req, http_data_writer w, const void *arg)
{
    http_run_reply_hook(req, 200);
    if (!req->client_done)
        http_send_envelope_w(req, 200, "0", NULL, NULL, w, arg, NULL);
    http_finish(req);
}

void http_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
{
    const char *s = NULL;
    if (!strchr(fmt, '%'))
        s = fmt;
    else if (fmt[0] == '%' && fmt[1] == 's' && fmt[2] == '\0')
        s = va_arg(ap, const char *);
    if (!s) {
        vsnprintf(buf, cap, fmt, ap);
        return;
    }
    size_t n = strlen(s);
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
}

void http_reply_error(http_req *req, errcode e, const char *fmt, ...)
{
    const errcode_info *x = errcode_of(e);
    http_run_reply_hook(req, x->status);
    if (!req->client_done) {
        char msg[HTTP_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        http_vformat(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        http_send_envelope(req, x->status, x->code, msg, NULL, NULL);
    }
    http_finish(req);
}

void http_reply_raw(http_req *req, int status, const char *content_type, const void *data,
                    size_t len, const char *const *headers)
{
    http_run_reply_hook(req, status);
    http_send(req, status, content_type, data, len, headers);
    http_finish(req);
}

/* ---- streamed replies ---- */

static void http_stream_on_drained(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    http_req *req = arg;
    if (req->stream_drained)
        req->stream_drained(req, req->stream_arg);
}

/* Tells the handler, once, that nothing more can be sent (req->evreq is already NULL). */
static void http_stream_lost(http_req *req)
{
    http_stream_cb gone = req->stream_gone;
    req->stream_gone = req->stream_drained = NULL;
    if (gone)
        gone(req, req->stream_arg);
}

/* The client went away in the middle of the body. On a network failure libevent detaches the
 * request from the connection before freeing the connection, and leaves the request to us. */
static void http_stream_on_close(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    http_req *req = arg;
    struct evhttp_request *ev = req->evreq;
    req->evreq = NULL;
    if (ev && !evhttp_request_get_connection(ev))
        evhttp_request_free(ev);
    log_info(&req->log, "client closed during the body, after %zu bytes (route %s)", req->streamed,
             req->route);
    http_stream_lost(req);
}

qn_status http_stream_start(http_req *req, int status, const char *content_type,
                            const char *const *headers, http_stream_cb drained, http_stream_cb gone,
                            void *arg)
{
    struct evhttp_request *ev = req->evreq;
    struct evhttp_connection *conn = ev ? evhttp_request_get_connection(ev) : NULL;
    if (req->client_done || !conn)
        return QN_ERR;
    http_run_reply_hook(req, status);
    req->client_done = 1; /* no timeout answer, no other reply */
    req->status = status;
    if (req->timer_armed)
        evtimer_del(&req->timer);
    req->stream_drained = drained;
    req->stream_gone = gone;
    req->stream_arg = arg;
    evhttp_connection_set_closecb(conn, http_stream_on_close, req);
    http_out_headers(req, ev, status, content_type, headers);
    evhttp_send_reply_start(ev, status, NULL);
    return QN_OK;
}

qn_status http_stream_write(http_req *req, struct evbuffer *data)
{
    if (!req->evreq)
        return QN_ERR;
    req->streamed += evbuffer_get_length(data);
    evhttp_send_reply_chunk_with_cb(req->evreq, data, http_stream_on_drained, req);
    return QN_OK;
}

size_t http_stream_pending(http_req *req)
{
    struct evhttp_connection *conn = req->evreq ? evhttp_request_get_connection(req->evreq) : NULL;
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    return bev ? evbuffer_get_length(bufferevent_get_output(bev)) : 0;
}

void http_stream_end(http_req *req, bool complete)
{
    struct evhttp_request *ev = req->evreq;
    req->evreq = NULL;
    req->stream_gone = req->stream_drained = NULL;
    if (ev) {
        struct evhttp_connection *conn = evhttp_request_get_connection(ev);
        if (conn)
            evhttp_connection_set_closecb(conn, NULL, NULL);
        if (complete) {
            http_count_unsent(req, ev);
            evhttp_send_reply_end(ev);
        } else if (conn) {
            evhttp_connection_free(conn); /* frees ev too */
        } else {
            evhttp_request_free(ev);
        }
    }
    if (!complete && ev) /* (a client that left has been logged already) */
        log_warn(&req->log, "streamed body cut after %zu bytes (route %s)", req->streamed,
                 req->route);
    http_access_log(req, req->status, now_mono_s() - req->start);
    http_finish(req);
}

/* The client has gone; libevent keeps the evhttp_request until we send on it, which frees it. */
static void http_on_close(struct evhttp_connection *conn, void *arg)
{
    http_req *req = arg;
    (void)conn;
    log_info(&req->log, "client closed before the reply (route %s)", req->route);
}

static void http_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    http_req *req = arg;
    (void)fd, (void)what;
    if (req->client_done)
        return;
    log_warn(&req->log, "request timed out after %d ms (route %s)",
             req->srv ? req->srv->request_timeout_ms : 0, req->route);
    http_send_envelope(req, errcode_of(ERRCODE_UNAVAILABLE)->status,
                       errcode_of(ERRCODE_UNAVAILABLE)->code, "request timed out", NULL, NULL);
}

/* ---- reading the request ---- */

/* The value of a hex digit (one isxdigit took). */
static int http_hex_value(char c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}

/* Decodes the n bytes at s into out as evhttp does a query value, up to a decoded NUL; writes a
 * NUL after it and returns the end. */
static char *http_query_decode(const char *s, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '+') {
            c = ' ';
        } else if (c == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
                   isxdigit((unsigned char)s[i + 2])) {
            c = (char)(http_hex_value(s[i + 1]) << 4 | http_hex_value(s[i + 2]));
            i += 2;
        }
        if (c == '\0')
            break;
        *out++ = c;
    }
    *out++ = '\0';
    return out;
}

qn_status http_req_set_query(http_req *req, const char *q)
{
    size_t qlen = q ? strlen(q) : 0;
    if (qlen == 0)
        return QN_OK;
    /* The text as it came, then the parameters: at most as long again, plus a NUL. */
    char *buf =
        2 * qlen + 2 <= sizeof(req->query_inline) ? req->query_inline : malloc(2 * qlen + 2);
    if (!buf)
        return QN_ENOMEM;
    memcpy(buf, q, qlen + 1);
    char *kv = buf + qlen + 1, *o = kv;
    size_t n = 0;
    for (const char *p = q; *p; n++) {
        const char *amp = strchr(p, '&'), *end = amp ? amp : q + qlen;
        const char *eq = memchr(p, '=', (size_t)(end - p));
        if (!eq || eq == p) { /* no value, or no name */
            if (buf != req->query_inline)
                free(buf);
            return QN_EINVAL;
        }
        memcpy(o, p, (size_t)(eq - p));
        o += eq - p;
        *o++ = '\0';
        o = http_query_decode(eq + 1, (size_t)(end - eq - 1), o);
        p = amp ? amp + 1 : end;
    }
    req->query_raw = buf;
    req->query_kv = kv;
    req->query_n = n;
    return QN_OK;
}

const char *http_query(http_req *req, const char *name)
{
    const char *k = req->query_kv;
    for (size_t i = 0; i < req->query_n; i++) {
        const char *v = k + strlen(k) + 1;
        if (strcasecmp(k, name) == 0)
            return v;
        k = v + strlen(v) + 1;
    }
    return NULL;
}

const char *http_query_raw(http_req *req)
{
    return req->query_raw ? req->query_raw : "";
}

const char *http_header(http_req *req, const char *name)
{
    return req->evreq ? evhttp_find_header(evhttp_request_get_input_headers(req->evreq), name)
                      : NULL;
}

const cJSON *http_body_json(http_req *req)
{
    return req->json;
}

const char *http_body_raw(http_req *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

/* name in the JSON body: 1 with *v set (NULL for JSON null), 0 when the body has no such member
 * (http_param then reads the query string). */
static int http_body_member(http_req *req, const char *name, const cJSON **v)
{
    if (!cJSON_IsObject(req->json))
        return 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(req->json, name);
    if (!m)
        return 0;
    *v = cJSON_IsNull(m) ? NULL : m;
    return 1;
}

const cJSON *http_param(http_req *req, const char *name)
{
    const cJSON *v;
    if (http_body_member(req, name, &v))
        return v;
    const char *q = http_query(req, name);
    if (!q)
        return NULL;
    if (!req->scratch && !(req->scratch = cJSON_CreateArray()))
        return NULL;
    cJSON *s = cJSON_CreateString(q);
    if (!s)
        return NULL;
    cJSON_AddItemToArray(req->scratch, s);
    return s;
}

const char *http_param_str(http_req *req, const char *name)
{
    const cJSON *v;
    if (http_body_member(req, name, &v))
        return cJSON_IsString(v) ? v->valuestring : NULL;
    return http_query(req, name); /* read in place: no cJSON string made for it */
}

qn_status http_param_i64(http_req *req, const char *name, int64_t *out)
{
    const cJSON *v;
    if (!http_body_member(req, name, &v)) {
        const char *q = http_query(req, name);
        return q ? jsonin_int64_text(q, out) : QN_ENOTFOUND;
    }
    if (!v)
        return QN_ENOTFOUND;
    if (cJSON_IsNumber(v)) {
        double d = v->valuedouble;
        /* 2^63 is exactly representable; anything at or past it overflows. */
        if (d != d || d >= 9223372036854775808.0 || d < -9223372036854775808.0 ||
            d != (double)(int64_t)d)
            return QN_EINVAL;
        *out = (int64_t)d;
        return QN_OK;
    }
    if (!cJSON_IsString(v))
        return QN_EINVAL;
    return jsonin_int64_text(v->valuestring, out);
}

/* ---- dispatch ---- */

/* Finds them in one pass over the request's headers (evhttp_find_header walks the list once per
 * name, comparing each name case-insensitively); the first of a name counts, as there. */
static void http_in_headers(const http_server *srv, struct evkeyvalq *ih,
                            const char *val[HTTP_IN_COUNT])
{
    const char *const names[HTTP_IN_COUNT] = {HTTP_HDR_REQUEST_ID, HTTP_HDR_TRACEPARENT,
                                              srv->user_hdr, srv->shop_hdr, srv->name_hdr};
    const struct evkeyval *h;
    memset(val, 0, HTTP_IN_COUNT * sizeof(*val));
    TAILQ_FOREACH(h, ih, next)
    {
        size_t n = strlen(h->key);
        for (int i = 0; i < HTTP_IN_COUNT; i++) {
            if (!val[i] && n == srv->in_len[i] && strcasecmp(h->key, names[i]) == 0) {
                val[i] = h->value;
                break;
            }
        }
    }
}

static void http_ids(http_server *srv, http_req *req)
{
    const char *in[HTTP_IN_COUNT];
    http_in_headers(srv, evhttp_request_get_input_headers(req->evreq), in);
    const char *rid = in[HTTP_IN_RID];
    if (rid && http_request_id_ok(rid))
        memcpy(req->request_id, rid, strlen(rid) + 1); /* at most HTTP_REQUEST_ID_MAX */
    else
        http_random_hex(req->request_id, 16);
    if (!http_traceparent_parse(in[HTTP_IN_TRACE], req->trace_id, req->parent_id,
                                req->trace_flags)) {
        http_random_hex(req->trace_id, 16);
        req->parent_id[0] = '\0';
        memcpy(req->trace_flags, "01", 3);
    }
    http_random_hex(req->span_id, 8);
    req->log.request_id = req->request_id;
    req->log.trace_id = req->trace_id;

    req->user_id = http_parse_id(in[HTTP_IN_USER]);
    req->shop_number = http_parse_id(in[HTTP_IN_SHOP]);
    const char *un = in[HTTP_IN_NAME];
    if (un && *un && (req->username_buf = strdup(un)))
        req->username = req->username_buf;
}

/* Runs checks and the handler; every path ends in exactly one reply or a deferred handler. */
static void http_dispatch(http_server *srv, http_req *req, const struct evhttp_uri *uri)
{
    const http_route_ent *r = NULL, *same_path = NULL;

    for (size_t i = 0; i < srv->nroutes; i++) {
        if (strcmp(srv->routes[i].path, req->path) != 0)
            continue;
        same_path = &srv->routes[i];
        if (srv->routes[i].method == req->method) {
            r = &srv->routes[i];
            req->route_no = i + 1;
            break;
        }
    }
    if (!r && !same_path) {
        http_reply_error(req, ERRCODE_NOT_FOUND, "no such path: %s", req->path);
        return;
    }
    if (!r) {
        char allow[64] = "";
        for (size_t i = 0; i < srv->nroutes; i++) {
            if (strcmp(srv->routes[i].path, req->path) != 0)
                continue;
            size_t n = strlen(allow);
            snprintf(allow + n, sizeof(allow) - n, "%s%s", n ? ", " : "",
                     http_method_name(srv->routes[i].method));
        }
        req->route = same_path->path;
        http_send_envelope(req, errcode_of(ERRCODE_METHOD)->status,
                           errcode_of(ERRCODE_METHOD)->code, "method not allowed", NULL,
                           (const char *const[]){"Allow", allow, NULL});
        http_finish(req);
        return;
    }
    req->route = r->path;
    req->flags = r->flags;

    if ((r->flags & (HTTP_NEED_USER | HTTP_NEED_SHOP)) && req->user_id <= 0) {
        http_reply_error(req, ERRCODE_UNAUTHORIZED, "missing or invalid %s header", srv->user_hdr);
        return;
    }
    if ((r->flags & HTTP_NEED_SHOP) && req->shop_number <= 0) {
        http_reply_error(req, ERRCODE_UNAUTHORIZED, "missing or invalid %s header", srv->shop_hdr);
        return;
    }

    struct evbuffer *in = evhttp_request_get_input_buffer(req->evreq);
    size_t len = evbuffer_get_length(in);
    if (len > srv->max_body) {
        http_reply_error(req, ERRCODE_TOO_LARGE, "request body exceeds %zu bytes", srv->max_body);
        return;
    }
    if (len + 1 > req->body_cap) {
        free(req->body);
        req->body_cap = 0;
        if (!(req->body = malloc(len + 1))) {
            http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
            return;
        }
        req->body_cap = len + 1;
    }
    evbuffer_remove(in, req->body, len);
    req->body[len] = '\0';
    req->body_len = len;
    if (!(r->flags & HTTP_RAW_BODY) && req->body[strspn(req->body, " \t\r\n")] != '\0') {
        /* jsonin_parse keeps long integer literals exact (ids beyond 2^53). */
        jsonin_err jerr;
        req->json = jsonin_parse(req->body, len, &jerr);
        if (!req->json) {
            http_reply_error(req, ERRCODE_INVALID, "%s", jerr.msg);
            return;
        }
    }
    qn_status st = http_req_set_query(req, uri ? evhttp_uri_get_query(uri) : NULL);
    if (st != QN_OK) {
        if (st == QN_EINVAL)
            http_reply_error(req, ERRCODE_INVALID, "malformed query string");
        else
            http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    r->fn(req, r->arg);
}

static void http_on_request(struct evhttp_request *ev, void *arg)
{
    http_server *srv = arg;
    http_req *req = http_req_alloc(srv);
    if (!req) {
        evhttp_send_error(ev, HTTP_INTERNAL, NULL);
        return;
    }
    req->start = now_mono_s();
    req->srv = srv;
    req->evreq = ev;
    req->method = (int)evhttp_request_get_command(ev);
    req->route = "unmatched";
    req->next = srv->live;
    if (srv->live)
        srv->live->prev = req;
    srv->live = req;
    srv->inflight++;

    http_ids(srv, req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(ev);
    const char *p = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!p || !*p)
        p = "/";
    size_t plen = strlen(p);
    if (plen < sizeof(req->path_inline)) {
        memcpy(req->path_inline, p, plen + 1);
        req->path = req->path_inline;
    } else {
        req->path_buf = strdup(p);
        req->path = req->path_buf ? req->path_buf : "/";
    }
    struct evhttp_connection *conn = evhttp_request_get_connection(ev);
    if (conn) {
        evhttp_connection_set_closecb(conn, http_on_close, req);
        /* libevent writes at most 16 KiB per call and loop pass by default: a 50 KB answer
         * (a wallet's coupon list) took four passes and four writev. The socket takes what
         * fits either way. */
        bufferevent_set_max_single_write(evhttp_connection_get_bufferevent(conn),
                                         HTTP_MAX_SINGLE_WRITE);
    }

    req->dispatching = 1;
    http_dispatch(srv, req, uri);
    req->dispatching = 0;
    if (req->handler_done) {
        http_req_free(req);
        return;
    }
    /* Deferred: arm the deadline. */
    struct timeval tv = {srv->request_timeout_ms / 1000, (srv->request_timeout_ms % 1000) * 1000};
    evtimer_assign(&req->timer, srv->base, http_on_timeout, req);
    req->timer_armed = 1;
    if (evtimer_add(&req->timer, &tv) != 0)
        log_warn(&req->log, "cannot arm the request timeout (route %s)", req->route);
}

/* ---- built-in routes ---- */

static int http_livez_data(struct evbuffer *b, const void *arg)
{
    (void)arg;
    return evbuffer_add(b, "{\"status\":\"ok\"}", 15);
}

static void http_h_livez(http_req *req, void *arg)
{
    (void)arg;
    http_reply_ok_write(req, http_livez_data, NULL);
}

static void http_h_readyz(http_req *req, void *arg)
{
    http_server *srv = arg;
    if (srv->draining) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "draining");
        return;
    }
    if (srv->ready_fn && !srv->ready_fn(srv->ready_arg)) {
        http_reply_error(req, ERRCODE_UNAVAILABLE, "dependencies not ready");
        return;
    }
    cJSON *d = cJSON_CreateObject();
    if (d)
        cJSON_AddStringToObject(d, "status", "ready");
    http_reply_ok(req, d);
}

static void http_h_metrics(http_req *req, void *arg)
{
    (void)arg;
    struct evbuffer *b = evbuffer_new();
    if (!b || metrics_render(b) != QN_OK) {
        if (b)
            evbuffer_free(b);
        http_reply_error(req, ERRCODE_INTERNAL, "cannot render metrics");
        return;
    }
    size_t n = evbuffer_get_length(b);
    const void *p = evbuffer_pullup(b, -1);
    http_reply_raw(req, 200, METRICS_CONTENT_TYPE, p, n, NULL);
    evbuffer_free(b);
}

/* ---- server ---- */

http_server *http_server_new(struct event_base *base, const http_server_opts *opts)
{
    static const http_server_opts defaults = {0};
    http_server *srv = NULL;
    if (!opts)
        opts = &defaults;
    if (!(srv = calloc(1, sizeof(*srv))))
        goto fail;
    srv->base = base;
    srv->bind_addr = strdup(opts->bind_addr ? opts->bind_addr : "0.0.0.0");
    srv->user_hdr = strdup(opts->user_id_header ? opts->user_id_header : "X-User-Id");
    srv->shop_hdr = strdup(opts->shop_header ? opts->shop_header : "X-Shop-Number");
    srv->name_hdr = strdup(opts->username_header ? opts->username_header : "X-Username");
    srv->service = strdup(opts->service ? opts->service : "quan");
    if (!srv->bind_addr || !srv->user_hdr || !srv->shop_hdr || !srv->name_hdr || !srv->service)
        goto fail;
    srv->in_len[HTTP_IN_RID] = strlen(HTTP_HDR_REQUEST_ID);
    srv->in_len[HTTP_IN_TRACE] = strlen(HTTP_HDR_TRACEPARENT);
    srv->in_len[HTTP_IN_USER] = strlen(srv->user_hdr);
    srv->in_len[HTTP_IN_SHOP] = strlen(srv->shop_hdr);
    srv->in_len[HTTP_IN_NAME] = strlen(srv->name_hdr);
    srv->port = opts->port;
    srv->max_body = opts->max_body_bytes ? opts->max_body_bytes : 1024 * 1024;
    srv->request_timeout_ms = opts->request_timeout_ms > 0 ? opts->request_timeout_ms : 10000;
    if (!(srv->http = evhttp_new(base)))
        goto fail;
    /* Bodies up to twice the limit are read so the client gets our 413 envelope; beyond that
     * evhttp itself answers 413 and closes, bounding memory per connection. */
    evhttp_set_max_body_size(srv->http, (ev_ssize_t)(srv->max_body * 2 + 1024));
    evhttp_set_max_headers_size(srv->http, 16 * 1024);
    evhttp_set_timeout(srv->http, opts->idle_timeout_s > 0 ? opts->idle_timeout_s : 60);
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT |
                                              EVHTTP_REQ_DELETE | EVHTTP_REQ_PATCH |
                                              EVHTTP_REQ_HEAD | EVHTTP_REQ_OPTIONS);
    evhttp_set_gencb(srv->http, http_on_request, srv);
    if (http_route(srv, HTTP_GET, "/livez", http_h_livez, srv, 0) != QN_OK ||
        http_route(srv, HTTP_GET, "/readyz", http_h_readyz, srv, 0) != QN_OK ||
        http_route(srv, HTTP_GET, "/metrics", http_h_metrics, srv, 0) != QN_OK)
        goto fail;
    /* A write to a client that went away must not kill the process. */
    struct sigaction sa;
    if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
    return srv;
fail:
    http_server_free(srv);
    return NULL;
}

void http_server_free(http_server *srv)
{
    if (!srv)
        return;
    /* Detach requests still waiting for their handler: evhttp_free below frees their
     * evhttp_request, so their later reply must not touch it. */
    for (http_req *r = srv->live, *next; r; r = next) {
        next = r->next;
        if (r->evreq) {
            struct evhttp_connection *c = evhttp_request_get_connection(r->evreq);
            if (c)
                evhttp_connection_set_closecb(c, NULL, NULL);
        }
        r->evreq = NULL;
        r->client_done = 1;
        r->srv = NULL;
        r->prev = r->next = NULL;
        if (r->timer_armed) {
            event_del(&r->timer);
            r->timer_armed = 0;
        }
        http_stream_lost(r); /* a streamed body: its handler stops (and may free r) */
    }
    if (srv->http)
        evhttp_free(srv->http);
    for (size_t i = 0; i < srv->nroutes; i++)
        free(srv->routes[i].path);
    free(srv->routes);
    if (srv->reply_buf)
        evbuffer_free(srv->reply_buf);
    for (http_req *r = srv->free_reqs, *next; r; r = next) {
        next = r->next;
        free(r->body);
        free(r);
    }
    free(srv->bind_addr);
    free(srv->user_hdr);
    free(srv->shop_hdr);
    free(srv->name_hdr);
    free(srv->service);
    free(srv);
}

qn_status http_server_listen(http_server *srv)
{
    srv->bound = evhttp_bind_socket_with_handle(srv->http, srv->bind_addr, srv->port);
    if (!srv->bound) {
        log_error(NULL, "http: cannot listen on %s:%u: %s", srv->bind_addr, srv->port,
                  strerror(errno));
        return QN_ERR;
    }
    /* Accepted sockets inherit it (Linux): an answer of several segments goes out whole, instead
     * of its last small segment waiting for the client's delayed ACK (40 ms). */
    int one = 1;
    if (setsockopt(evhttp_bound_socket_get_fd(srv->bound), IPPROTO_TCP, TCP_NODELAY, &one,
                   sizeof(one)) != 0)
        log_warn(NULL, "http: TCP_NODELAY not set: %s", strerror(errno));
    log_info(NULL, "http: %s listening on %s:%u", srv->service, srv->bind_addr,
             http_server_port(srv));
    return QN_OK;
}

uint16_t http_server_port(const http_server *srv)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (!srv->bound ||
        getsockname(evhttp_bound_socket_get_fd(srv->bound), (struct sockaddr *)&ss, &len) != 0)
        return 0;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

qn_status http_route(http_server *srv, int method, const char *path, http_handler fn, void *arg,
                     unsigned flags)
{
    if (!path || path[0] != '/' || !fn)
        return QN_EINVAL;
    for (size_t i = 0; i < srv->nroutes; i++)
        if (srv->routes[i].method == method && strcmp(srv->routes[i].path, path) == 0)
            return QN_EINVAL;
    if (grow(&srv->routes, &srv->cap, srv->nroutes + 1, sizeof(*srv->routes), 16) != QN_OK)
        return QN_ENOMEM;
    char *p = strdup(path);
    if (!p)
        return QN_ENOMEM;
    srv->routes[srv->nroutes++] =
        (http_route_ent){.method = method, .path = p, .fn = fn, .arg = arg, .flags = flags};
    return QN_OK;
}

void http_server_set_ready_cb(http_server *srv, http_ready_fn fn, void *arg)
{
    srv->ready_fn = fn;
    srv->ready_arg = arg;
}

void http_server_set_draining(http_server *srv)
{
    srv->draining = 1;
}

void http_server_stop_accepting(http_server *srv)
{
    srv->draining = 1;
    if (srv->bound) {
        evhttp_del_accept_socket(srv->http, srv->bound);
        srv->bound = NULL;
    }
}

size_t http_server_unsent(const http_server *srv)
{
    return srv->unsent;
}

size_t http_server_inflight(const http_server *srv)
{
    return srv->inflight;
}
