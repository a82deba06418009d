/*
 * A small HTTP server framework on libevent's evhttp, shared by the four services: exact-path
 * routing, gateway identity headers, request id and W3C traceparent, the JSON envelope of
 * docs/api.md, deferred replies with a per-request timeout, built-in /livez, /readyz and /metrics,
 * per-request metrics and an access log line.
 *
 * Request lifetime: the framework allocates one http_req per request and frees it in exactly
 * one place, inside the reply function the handler calls. A handler either replies before it
 * returns or keeps the pointer and replies later from any loop-thread callback; it must call
 * exactly one http_reply_* (or, for a streamed body, http_stream_end) per request, and must not
 * touch req after that call. If the client
 * disconnected or the request timed out (503 already sent), the late reply is dropped and req
 * is still freed. Everything here runs on the event-loop thread only.
 *
 * The process should ignore SIGPIPE (http_server_new does so if SIGPIPE is still SIG_DFL):
 * replying to a client that went away must not kill the server.
 */
#ifndef QUAN_HTTP_H
#define QUAN_HTTP_H

#include <cJSON.h>
#include <stdarg.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "errcode.h"
#include "status.h"
#include "metrics.h"

typedef struct http_server http_server;
typedef struct http_req http_req;
/* A streamed reply's callbacks (see http_stream_start). */
typedef void (*http_stream_cb)(http_req *req, void *arg);

/* Methods are evhttp's bits; a route matches one method. */
#define HTTP_GET    EVHTTP_REQ_GET
#define HTTP_POST   EVHTTP_REQ_POST
#define HTTP_PUT    EVHTTP_REQ_PUT
#define HTTP_DELETE EVHTTP_REQ_DELETE
#define HTTP_PATCH  EVHTTP_REQ_PATCH

/* Route flags. */
#define HTTP_NEED_USER 0x1u /* X-User-Id (int64 > 0) required, else 401 A000401 */
#define HTTP_NEED_SHOP 0x2u /* X-User-Id and X-Shop-Number required, else 401 A000401 */
#define HTTP_RAW_BODY  0x4u /* do not parse the body as JSON; read it with http_body_raw */

#define HTTP_REQUEST_ID_MAX  64
#define HTTP_TRACEPARENT_LEN 56 /* "00-<32>-<16>-<2>" plus NUL */

typedef struct http_server_opts {
    const char *bind_addr;       /* default "0.0.0.0" */
    uint16_t port;               /* 0: an ephemeral port, see http_server_port */
    size_t max_body_bytes;       /* default 1 MiB; larger bodies get 413 */
    int idle_timeout_s;          /* evhttp connection read/write timeout; default 60 */
    int request_timeout_ms;      /* handler deadline, then 503 C000001; default 10000 */
    const char *user_id_header;  /* default "X-User-Id" */
    const char *shop_header;     /* default "X-Shop-Number" */
    const char *username_header; /* default "X-Username" */
    const char *service;         /* for logs; default "quan" */
} http_server_opts;

/* Handler: runs on the loop thread; arg is the route's arg (borrowed). */
typedef void (*http_handler)(http_req *req, void *arg);
/* Readiness: true when the service's dependencies are usable. */
typedef bool (*http_ready_fn)(void *arg);

/*
 * The request. Fields above the line are read-only for handlers and valid until the reply;
 * all strings are owned by req.
 */
struct http_req {
    int method;           /* HTTP_GET, ... */
    const char *path;     /* raw path of the URI, without the query */
    const char *route;    /* the matched route template, or "unmatched" */
    int64_t user_id;      /* 0 when absent or invalid */
    int64_t shop_number;  /* 0 when absent or invalid */
    const char *username; /* NULL when absent */
    char request_id[HTTP_REQUEST_ID_MAX + 1];
    char trace_id[33];   /* 32 lowercase hex */
    char span_id[17];    /* this request's span, 16 lowercase hex */
    char parent_id[17];  /* caller's span, "" when the trace started here */
    char trace_flags[3]; /* "01" when the trace started here */
    log_ctx log;         /* request_id + trace_id, for log_info(&req->log, ...) */
    double start;        /* CLOCK_MONOTONIC seconds when the request arrived */
    /* ---- private to http.c ---- */
    http_server *srv;
    struct evhttp_request *evreq; /* NULL once the client has been answered or is gone */
    struct event timer;           /* the request timeout, set while timer_armed (no allocation) */
    int timer_armed;
    unsigned flags;
    size_t route_no; /* 1 + the matched route's index in the server's table; 0 when none */
    char *path_buf, *username_buf; /* malloc'ed copies, when not in the inline buffers */
    char path_inline[128];
    char query_inline[512]; /* the query's text, then its parameters (http_req_set_query) */
    char *body;             /* body_cap bytes; kept with req on the server's free list */
    size_t body_cap;        /* 0: body is not ours to keep (NULL, or freed with req) */
    size_t body_len;
    cJSON *json;     /* parsed body, NULL when empty */
    cJSON *scratch;  /* cJSON nodes made for http_param from the query string */
    char *query_raw; /* the URI's query string, NULL when none; its parameters follow it */
    char *query_kv;  /* "key\0value\0" per parameter, values decoded */
    size_t query_n;
    void (*reply_hook)(http_req *, int, void *); /* http_req_on_reply */
    void *reply_hook_arg;
    int client_done; /* the client has its answer (or is gone): drop later replies */
    int status;      /* a streamed reply's status, for the access log */
    size_t streamed; /* bytes of a streamed body */
    http_stream_cb stream_drained, stream_gone; /* set while a reply is streamed */
    void *stream_arg;
    int handler_done;
    int dispatching;
    http_req *prev, *next; /* the server's live list, or its free list (next only) */
};

/* Owned by the caller; free with http_server_free. opts may be NULL (all defaults); its
 * strings are copied. NULL on failure. */
http_server *http_server_new(struct event_base *base, const http_server_opts *opts);
/* Closes the listener and every connection. Requests whose handlers have not replied yet are
 * detached: their later replies are dropped and still free them. */
void http_server_free(http_server *srv);
/* Binds and listens; QN_ERR (logged, with errno text) if the address cannot be bound. */
qn_status http_server_listen(http_server *srv) QN_MUSTCHECK;
/* The bound port (useful with port 0), or 0 when not listening. */
uint16_t http_server_port(const http_server *srv);

/* path is copied. QN_EINVAL for a duplicate method+path, QN_ENOMEM. */
qn_status http_route(http_server *srv, int method, const char *path, http_handler fn, void *arg,
                     unsigned flags) QN_MUSTCHECK;

void http_server_set_ready_cb(http_server *srv, http_ready_fn fn, void *arg);
/* /readyz answers 503 from now on; keep-alive connections are closed after their next reply. */
void http_server_set_draining(http_server *srv);
/* Closes the listening socket (new connections are refused) and sets draining. */
void http_server_stop_accepting(http_server *srv);
/* Requests whose handler has not replied yet (a timed-out request counts until its handler
 * replies, since its async work may still be running). Drain waits for this to reach 0. */
size_t http_server_inflight(const http_server *srv);
/* Replies given to libevent whose bytes are not all written yet (drain waits for these). */
size_t http_server_unsent(const http_server *srv);

/* ---- reading the request ---- */

/* Query-string parameter, decoded; borrowed from req; NULL when absent. */
const char *http_query(http_req *req, const char *name);
/* Header value, borrowed; NULL when absent or when the client is already answered. */
const char *http_header(http_req *req, const char *name);
/* Parsed JSON body, borrowed from req; NULL for an empty body. A malformed body never reaches
 * the handler (400 A000001), except on HTTP_RAW_BODY routes where this is always NULL. */
const cJSON *http_body_json(http_req *req);
/* Raw body bytes, NUL-terminated, borrowed; *len may be NULL. Never NULL (empty body: ""). */
const char *http_body_raw(http_req *req, size_t *len);
/* name from the JSON body object first, then from the query string (as a cJSON string).
 * Borrowed from req; NULL when absent or JSON null. */
const cJSON *http_param(http_req *req, const char *name);
/* http_param as a string (a JSON string, or the query value); NULL when absent or not a
 * string. */
const char *http_param_str(http_req *req, const char *name);
/* http_param as int64: a JSON integer or a decimal string (ids are JSON strings).
 * QN_ENOTFOUND when absent, QN_EINVAL when not an int64. */
qn_status http_param_i64(http_req *req, const char *name, int64_t *out) QN_MUSTCHECK;

/* The raw (undecoded) query string of the request URI, "" when none; borrowed from req. */
const char *http_query_raw(http_req *req);
/* Reads q (NULL or "": none) into req for http_query and http_query_raw, as evhttp's
 * evhttp_parse_query_str reads a query string: parameters between '&' (a trailing one may be
 * empty), each key=value with a key of at least one byte, the value decoded (%XX, '+' as a
 * space; a decoded NUL ends it), the key taken as it is; http_query compares names without
 * regard to case and finds a repeated name's first value. QN_EINVAL when q is malformed,
 * QN_ENOMEM. Once per request (the dispatcher's; the fuzz target's). */
qn_status http_req_set_query(http_req *req, const char *q) QN_MUSTCHECK;

/* For wrappers around handlers (e.g. the duplicate-submit guard): fn(req, status, arg) runs
 * once, inside the handler's http_reply_* call and before req is freed, with the status the
 * handler replied with (even if the client is gone or already got a 503 timeout). One hook
 * per request; setting another replaces it. Loop thread only. */
typedef void (*http_reply_hook)(http_req *req, int status, void *arg);
void http_req_on_reply(http_req *req, http_reply_hook fn, void *arg);

/* Writes the traceparent to send downstream (same trace id, this request's span id) into buf
 * (HTTP_TRACEPARENT_LEN bytes). Returns buf. */
char *http_req_traceparent(const http_req *req, char *buf);

/* ---- replying: exactly one of these per request; each frees req ---- */

/* 200 envelope, success; data owned (freed here), NULL gives "data":null. */
void http_reply_ok(http_req *req, cJSON *data);
/* 200 whose data the caller writes as JSON text (jsonout.h) straight into the reply: for the hot
 * path, where building a cJSON tree and printing it costs more than the rest. w returns 0, or
 * -1 when it could not write (the client then gets 500). */
typedef int (*http_data_writer)(struct evbuffer *b, const void *arg);
void http_reply_ok_write(http_req *req, http_data_writer w, const void *arg);
/* Envelope with success true and the given status (e.g. 202). data owned, may be NULL. */
void http_reply_status(http_req *req, int status, cJSON *data);
/* vsnprintf into buf (cap > 0), copying instead of formatting the usual cases: a message
 * without conversions, and "%s". */
void http_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Error envelope of e (errcode.h: its status and code), message from fmt (say which field or
 * limit). */
void http_reply_error(http_req *req, errcode e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Any body (metrics, xlsx). data borrowed (copied); headers: NULL or a NULL-terminated list
 * of name, value pairs, e.g. {"Content-Disposition", "attachment; filename=x.xlsx", NULL}. */
void http_reply_raw(http_req *req, int status, const char *content_type, const void *data,
                    size_t len, const char *const *headers);

/* ---- a streamed reply: a body too large to build before answering ----
 *
 * http_stream_start answers at once with the status and headers (HTTP/1.1: chunked transfer
 * encoding; HTTP/1.0: the body ends when the connection closes) and takes the request off the
 * request timeout. The body then goes out in pieces (http_stream_write), and exactly one
 * http_stream_end finishes it and frees req, like a reply. Until then req stays in flight (a
 * drain waits for it) and the handler hears, on the loop thread:
 *   drained(req, arg): everything written so far has left the output buffer: write more;
 *   gone(req, arg):    the client went away, or the server is shutting down: nothing more can
 *                      be sent; stop producing and call http_stream_end (from inside gone too).
 * A producer pauses while http_stream_pending is above its watermark and goes on when drained
 * runs: a slow client never makes the whole body pile up in memory.
 */
/* Headers as for http_reply_raw. Not QN_OK when the client is already answered (a timeout) or
 * gone: req is then still an ordinary request, to be answered with an http_reply_*. */
qn_status http_stream_start(http_req *req, int status, const char *content_type,
                            const char *const *headers, http_stream_cb drained, http_stream_cb gone,
                            void *arg) QN_MUSTCHECK;
/* Moves data's bytes to the connection's output buffer (data is left empty). QN_ERR when the
 * client is gone. */
qn_status http_stream_write(http_req *req, struct evbuffer *data) QN_MUSTCHECK;
/* Bytes written with http_stream_write that have not left the output buffer yet (0 once the
 * client is gone). */
size_t http_stream_pending(http_req *req);
/* complete: the body is whole (the last chunk goes out after the rest). Otherwise the
 * connection is closed at once, so that the client sees a cut body, never a complete-looking
 * one. Frees req. */
void http_stream_end(http_req *req, bool complete);

/* Builds the envelope text (exposed for tests and non-HTTP callers). Caller frees with free().
 * data is borrowed here. NULL when out of memory. */
char *http_envelope(const char *code, const char *message, const cJSON *data,
                    const char *request_id, bool success);

/* ---- the checks of untrusted request headers (pure: called directly by the fuzz targets) */

/* Parses a W3C traceparent; true when valid (version 00, lowercase hex, non-zero ids).
 * trace_id gets 33 bytes, parent_id 17, flags 3. */
bool http_traceparent_parse(const char *s, char *trace_id, char *parent_id, char *flags);
/* An X-Request-Id is kept when true: 1 to HTTP_REQUEST_ID_MAX characters of [A-Za-z0-9._:-]
 * (it goes into logs and the reply's headers); otherwise the request gets a new one. */
bool http_request_id_ok(const char *s);
/* An identity header's value (X-User-Id, X-Shop-Number): a strict decimal int64 > 0 (no sign,
 * spaces or overflow); 0 when s is NULL or not one. */
int64_t http_parse_id(const char *s);

/* The HTTP layer's metrics (registered by the service shell). */
#define HTTP_METRICS(X)                                                                            \
    X(quan_http_requests_total, COUNTER, "HTTP requests answered, by route template and status.",  \
      "route,status")                                                                              \
    X(quan_http_request_duration_seconds, HISTOGRAM,                                               \
      "HTTP request latency in seconds, by route template and status.", "route,status")
METRICS_DECLARE(HTTP_METRICS)

#endif
