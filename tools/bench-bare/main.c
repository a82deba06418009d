/*
 * quan-bench-bare PORT [BODY_BYTES]: the baseline of bench/hotpath.sh. A bare libevent evhttp
 * server, one thread, on 127.0.0.1:PORT, answering every request 200 with a fixed body shaped
 * like the services' envelope: what the engine's hot path is measured against. With BODY_BYTES
 * the envelope's data is padded to make the body that long, so that an answer as large as
 * settlement's can be compared with sending that many bytes and nothing else. SIGTERM/SIGINT
 * stop it.
 */
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char fixed_body[] =
    "{\"code\":\"0\",\"message\":null,\"data\":{\"status\":\"ok\"},"
    "\"requestId\":\"0123456789abcdef0123456789abcdef\",\"success\":true}";
static const char pad_head[] = "{\"code\":\"0\",\"message\":null,\"data\":{\"pad\":\"";
static const char pad_tail[] =
    "\"},\"requestId\":\"0123456789abcdef0123456789abcdef\",\"success\":true}";

static const char *body = fixed_body;
static size_t body_len = sizeof(fixed_body) - 1;

/* Pads the envelope to len bytes (at least the envelope's own); the caller frees it. */
static char *padded_body(size_t len)
{
    size_t frame = sizeof(pad_head) - 1 + sizeof(pad_tail) - 1;
    char *b;
    if (len < frame)
        len = frame;
    b = malloc(len + 1);
    if (!b)
        return NULL;
    memcpy(b, pad_head, sizeof(pad_head) - 1);
    memset(b + sizeof(pad_head) - 1, 'x', len - frame);
    memcpy(b + len - (sizeof(pad_tail) - 1), pad_tail, sizeof(pad_tail));
    body_len = len;
    return b;
}

static void on_request(struct evhttp_request *req, void *arg)
{
    struct evbuffer *out = arg;
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    /* As the services do: one writev for a large answer, not one per 16 KiB and loop pass. */
    if (conn)
        bufferevent_set_max_single_write(evhttp_connection_get_bufferevent(conn), 256 * 1024);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json; charset=utf-8");
    evbuffer_add_reference(out, body, body_len, NULL, NULL);
    evhttp_send_reply(req, 200, "OK", out); /* drains out */
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    event_base_loopexit(arg, NULL);
}

int main(int argc, char **argv)
{
    int rc = 1;
    struct event_base *base = event_base_new();
    struct evhttp *http = base ? evhttp_new(base) : NULL;
    struct evbuffer *out = evbuffer_new();
    struct event *term = base ? evsignal_new(base, SIGTERM, on_signal, base) : NULL;
    struct event *intr = base ? evsignal_new(base, SIGINT, on_signal, base) : NULL;
    char *padded = NULL;
    struct evhttp_bound_socket *bound;
    int one = 1;
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: quan-bench-bare PORT [BODY_BYTES]\n");
        goto done;
    }
    if (argc == 3) {
        padded = padded_body(strtoul(argv[2], NULL, 10));
        if (!padded)
            goto done;
        body = padded;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!http || !out || !term || !intr || event_add(term, NULL) || event_add(intr, NULL) ||
        !(bound = evhttp_bind_socket_with_handle(http, "127.0.0.1", (ev_uint16_t)atoi(argv[1])))) {
        fprintf(stderr, "quan-bench-bare: cannot listen on 127.0.0.1:%s\n", argv[1]);
        goto done;
    }
    /* As the services do (common/http): accepted sockets inherit it, and without it the last
     * segment of a large answer waits for the client's delayed ACK. */
    if (setsockopt(evhttp_bound_socket_get_fd(bound), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
        perror("quan-bench-bare: TCP_NODELAY");
    evhttp_set_gencb(http, on_request, out);
    rc = event_base_dispatch(base) < 0;
done:
    free(padded);
    if (term)
        event_free(term);
    if (intr)
        event_free(intr);
    if (out)
        evbuffer_free(out);
    if (http)
        evhttp_free(http);
    if (base)
        event_base_free(base);
    return rc;
}
