/*
 * quan-bench-bare PORT: the baseline of bench/hotpath.sh. A bare libevent evhttp server, one
 * thread, on 127.0.0.1:PORT, answering every request 200 with a fixed body shaped like the
 * services' envelope: what the engine's hot path is measured against. SIGTERM/SIGINT stop it.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static const char body[] = "{\"code\":\"0\",\"message\":null,\"data\":{\"status\":\"ok\"},"
                           "\"requestId\":\"0123456789abcdef0123456789abcdef\",\"success\":true}";

static void on_request(struct evhttp_request *req, void *arg)
{
    struct evbuffer *out = arg;
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "application/json; charset=utf-8");
    evbuffer_add_reference(out, body, sizeof(body) - 1, NULL, NULL);
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
    if (argc != 2) {
        fprintf(stderr, "usage: quan-bench-bare PORT\n");
        goto done;
    }
    signal(SIGPIPE, SIG_IGN);
    if (!http || !out || !term || !intr || event_add(term, NULL) || event_add(intr, NULL) ||
        evhttp_bind_socket(http, "127.0.0.1", (ev_uint16_t)atoi(argv[1]))) {
        fprintf(stderr, "quan-bench-bare: cannot listen on 127.0.0.1:%s\n", argv[1]);
        goto done;
    }
    evhttp_set_gencb(http, on_request, out);
    rc = event_base_dispatch(base) < 0;
done:
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
