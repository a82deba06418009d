/*
 * quan-bench-paced: an open-loop, constant-rate HTTP/1.1 load generator (bench/hotpath.sh).
 *
 *   quan-bench-paced [-m METHOD] [-b BODY] [-x STATUS] [-w SECONDS] URL RATE SECONDS CONNS
 *                    [HEADER ...]
 *
 *   URL        http://HOST:PORT/path?query (HOST: an address or a name resolved once)
 *   RATE       requests per second in total, spread evenly over the CONNS keep-alive connections
 *   SECONDS    how long requests are scheduled
 *   HEADER     "Name: value", sent with every request (Host is added; Content-Length with -b)
 *   -m METHOD  GET (default), POST, PUT or DELETE
 *   -b BODY    the request body
 *   -x STATUS  an answer with this status counts as expected, like a 2xx (e.g. 409 for a refusal)
 *   -w SECONDS how long, after the last scheduled request, answers are still waited for (5)
 *
 * Request n (n = 0, 1, ...) is due at start + n / RATE, on connection n % CONNS. Its latency is
 * counted from that intended time to the end of its answer, so a server that falls behind is
 * charged the whole queueing delay (no coordinated omission): a connection still waiting for an
 * answer sends its next request as soon as that answer is in. Every scheduled request not
 * answered by the end (connection error, unreadable answer, still queued or in flight) is an
 * error. Answers must carry a Content-Length (as evhttp's do); chunked ones count as errors.
 *
 * It prints one line:
 *   rate_achieved=N p50_ms=X p90_ms=X p99_ms=X max_ms=X errors=N non2xx=N
 * rate_achieved: answers per second over the run; percentiles from a histogram of 10 us buckets
 * up to 1 s (the bucket's upper edge; above 1 s, the maximum); non2xx: answers neither 2xx nor
 * the -x status. Exit status 0 when it ran, 1 on bad arguments or when no connection could be
 * opened. One thread: it keeps up with 30,000 requests per second on one core.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PACED_BUCKET_NS 10000LL
#define PACED_BUCKETS   100000      /* 10 us x 100,000 = 1 s */
#define PACED_BUF       (16 * 1024) /* an answer's head must fit; its body is only counted */

typedef struct paced_run paced_run;

/* One keep-alive connection, on a raw non-blocking socket (bufferevents cost two epoll_ctl and
 * an ioctl more per request): at most one request in flight. */
typedef struct paced_conn {
    paced_run *run;
    int idx, fd, connected;
    unsigned gen; /* of the socket: one more each time it is closed */
    struct event *rev, *wev, *timer;
    uint64_t k;          /* requests this connection has sent */
    int64_t intended_ns; /* of the request in flight */
    int busy, done;
    size_t sent; /* bytes of the request in flight written so far */
    /* the answer being read */
    int have_head, status, close_after;
    size_t body_left, have;
    char buf[PACED_BUF];
} paced_conn;

struct paced_run {
    struct event_base *base;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *req;
    size_t req_len;
    double rate;
    int conns, expect_status;
    uint64_t total; /* requests scheduled: those due before start + SECONDS */
    int64_t start_ns, last_ns;
    int connected, connect_failed, idle, reported;
    paced_conn *c;
    uint64_t answers, non2xx, hist[PACED_BUCKETS + 1];
    int64_t max_ns;
};

static int64_t paced_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t paced_due_ns(const paced_run *r, uint64_t n)
{
    return r->start_ns + (int64_t)((double)n * 1e9 / r->rate);
}

static void paced_record(paced_run *r, int64_t lat_ns)
{
    if (lat_ns < 0)
        lat_ns = 0;
    int64_t b = lat_ns / PACED_BUCKET_NS;
    r->hist[b < PACED_BUCKETS ? b : PACED_BUCKETS]++;
    if (lat_ns > r->max_ns)
        r->max_ns = lat_ns;
    r->answers++;
}

/* The p-quantile in ms: the upper edge of its bucket, never above the maximum. */
static double paced_quantile_ms(const paced_run *r, double p)
{
    if (!r->answers)
        return 0;
    uint64_t want = (uint64_t)(p * (double)r->answers + 0.999999), seen = 0;
    int64_t v = r->max_ns;
    for (int i = 0; i < PACED_BUCKETS && want > 0; i++) {
        seen += r->hist[i];
        if (seen >= want) {
            v = (i + 1) * PACED_BUCKET_NS;
            break;
        }
    }
    return (double)(v < r->max_ns ? v : r->max_ns) / 1e6;
}

static void paced_on_limit(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(((paced_run *)arg)->base);
}

static void paced_pump(paced_conn *c);
static void paced_on_read(evutil_socket_t fd, short what, void *arg);
static void paced_on_write(evutil_socket_t fd, short what, void *arg);

/* Once the first error of a run: the rest are counted, not told. */
static void paced_tell(paced_run *r, paced_conn *c, const char *what)
{
    if (!r->reported++)
        fprintf(stderr, "quan-bench-paced: connection %d: %s\n", c->idx, what);
}

static void paced_close(paced_conn *c)
{
    if (c->rev)
        event_free(c->rev);
    if (c->wev)
        event_free(c->wev);
    if (c->fd >= 0)
        close(c->fd);
    c->rev = c->wev = NULL;
    c->fd = -1;
    c->gen++;
    c->connected = c->have_head = 0; /* busy stays: a request may wait for the new socket */
    c->have = c->sent = 0;
}

/* A new socket for c: the first, or after an error or a "Connection: close". */
static int paced_connect(paced_conn *c)
{
    paced_run *r = c->run;
    int one = 1;
    paced_close(c);
    c->fd = socket(r->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->rev = event_new(r->base, c->fd, EV_READ | EV_PERSIST, paced_on_read, c);
    c->wev = event_new(r->base, c->fd, EV_WRITE, paced_on_write, c);
    if (!c->rev || !c->wev)
        return -1;
    if (connect(c->fd, (struct sockaddr *)&r->addr, r->addrlen) == 0)
        c->connected = 1;
    else if (errno != EINPROGRESS)
        return -1;
    if (c->connected ? event_add(c->rev, NULL) : event_add(c->wev, NULL))
        return -1;
    if (c->connected && r->start_ns == 0)
        r->connected++;
    return 0;
}

/* Drops c's socket after an error: its request in flight stays unanswered (an error at the
 * end). A new socket is opened when c's next request is due, from the loop: not from here, where
 * a server that keeps failing would recurse once per overdue request. */
static void paced_fail(paced_conn *c, const char *what)
{
    static const struct timeval now = {0, 0};
    paced_tell(c->run, c, what);
    paced_close(c);
    c->busy = 0;
    evtimer_add(c->timer, &now);
}

/* Writes what is left of the request in flight; waits for the socket when it is full. */
static void paced_flush(paced_conn *c)
{
    paced_run *r = c->run;
    while (c->sent < r->req_len) {
        ssize_t n = send(c->fd, r->req + c->sent, r->req_len - c->sent, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            event_add(c->wev, NULL);
            return;
        }
        if (n < 0) {
            paced_fail(c, strerror(errno));
            return;
        }
        c->sent += (size_t)n;
    }
}

/* Sends c's next request if it is due and c is free, or arms c's timer for it. */
static void paced_pump(paced_conn *c)
{
    paced_run *r = c->run;
    if (c->busy || c->done || r->start_ns == 0)
        return;
    uint64_t n = c->k * (uint64_t)r->conns + (uint64_t)c->idx;
    if (n >= r->total) {
        c->done = 1;
        if (++r->idle == r->conns)
            event_base_loopexit(r->base, NULL);
        return;
    }
    int64_t due = paced_due_ns(r, n), now = paced_now_ns();
    if (due > now) {
        int64_t wait_us = (due - now + 999) / 1000; /* rounded up: a timer early is one wasted */
        struct timeval tv = {(time_t)(wait_us / 1000000), (suseconds_t)(wait_us % 1000000)};
        evtimer_add(c->timer, &tv);
        return;
    }
    c->k++;
    c->intended_ns = due;
    c->busy = 1;
    c->sent = 0;
    if (c->fd < 0 && paced_connect(c) < 0) {
        paced_fail(c, "cannot connect");
        return;
    }
    if (c->connected)
        paced_flush(c); /* else once connected */
}

static void paced_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    paced_pump(arg);
}

/* Writable: the connection is made (or refused), or the socket has room again. */
static void paced_on_write(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    paced_conn *c = arg;
    paced_run *r = c->run;
    if (!c->connected) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err) {
            if (r->start_ns == 0) {
                fprintf(stderr, "quan-bench-paced: cannot connect: %s\n", strerror(err));
                r->connect_failed = 1;
                event_base_loopbreak(r->base);
                return;
            }
            paced_fail(c, strerror(err));
            return;
        }
        c->connected = 1;
        event_add(c->rev, NULL);
        if (r->start_ns == 0 && ++r->connected == r->conns)
            event_base_loopbreak(r->base); /* all connected: the schedule starts */
    }
    if (c->busy)
        paced_flush(c);
}

/* Reads an answer's head: status, Content-Length, Connection. -1 when it is not HTTP/1.x with
 * a Content-Length. */
static int paced_parse_head(paced_conn *c, const char *h, size_t len)
{
    const char *end = h + len, *l;
    int have_len = 0;
    if (len < 12 || strncmp(h, "HTTP/1.", 7) != 0)
        return -1;
    c->status = atoi(h + 9);
    c->close_after = h[7] == '0';
    for (l = memchr(h, '\n', len); l && l + 1 < end;
         l = memchr(l + 1, '\n', (size_t)(end - l - 1))) {
        const char *s = l + 1;
        if ((size_t)(end - s) > 15 && strncasecmp(s, "Content-Length:", 15) == 0) {
            c->body_left = strtoull(s + 15, NULL, 10);
            have_len = 1;
        } else if ((size_t)(end - s) > 11 && strncasecmp(s, "Connection:", 11) == 0) {
            const char *v = s + 11;
            while (*v == ' ')
                v++;
            c->close_after = strncasecmp(v, "close", 5) == 0;
        }
    }
    return have_len && c->status >= 100 ? 0 : -1;
}

/* One answer is complete: counted, and the connection's next request goes out when due. */
static void paced_answered(paced_conn *c)
{
    paced_run *r = c->run;
    r->last_ns = paced_now_ns();
    paced_record(r, r->last_ns - c->intended_ns);
    if (!(c->status >= 200 && c->status < 300) && c->status != r->expect_status)
        r->non2xx++;
    c->busy = c->have_head = 0;
    if (c->close_after)
        paced_close(c);
    paced_pump(c);
}

static void paced_on_read(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    paced_conn *c = arg;
    ssize_t got = recv(fd, c->buf + c->have, sizeof(c->buf) - c->have, 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (got <= 0) {
        paced_fail(c, got == 0 ? "closed by the server" : strerror(errno));
        return;
    }
    const char *p = c->buf;
    size_t len = c->have + (size_t)got;
    unsigned gen = c->gen;
    c->have = 0;
    while (len) {
        if (!c->busy) {
            paced_fail(c, "data without a request");
            return;
        }
        if (!c->have_head) {
            const char *eoh = memmem(p, len, "\r\n\r\n", 4);
            if (!eoh) {
                if (len == sizeof(c->buf)) {
                    paced_fail(c, "an answer's head too long");
                    return;
                }
                memmove(c->buf, p, len); /* the rest of the head comes with the next read */
                c->have = len;
                return;
            }
            size_t head_len = (size_t)(eoh - p) + 4;
            if (paced_parse_head(c, p, head_len) < 0) {
                paced_fail(c, "unreadable answer (HTTP/1.x with a Content-Length expected)");
                return;
            }
            c->have_head = 1;
            p += head_len;
            len -= head_len;
        }
        size_t take = len < c->body_left ? len : c->body_left;
        p += take;
        len -= take;
        c->body_left -= take;
        if (c->body_left)
            return;
        paced_answered(c);
        if (c->gen != gen)
            return; /* closed ("Connection: close"): what is left is not this socket's */
    }
}

/* The request's bytes, built once; NULL on bad input. */
static char *paced_build_request(const char *method, const struct evhttp_uri *uri, const char *body,
                                 char **headers, int nheaders, size_t *len)
{
    const char *path = evhttp_uri_get_path(uri), *query = evhttp_uri_get_query(uri);
    struct evbuffer *b = evbuffer_new();
    char *out = NULL;
    if (!b)
        return NULL;
    evbuffer_add_printf(b, "%s %s%s%s HTTP/1.1\r\nHost: %s:%d\r\n", method,
                        path && *path ? path : "/", query ? "?" : "", query ? query : "",
                        evhttp_uri_get_host(uri), evhttp_uri_get_port(uri));
    for (int i = 0; i < nheaders; i++) {
        if (!strchr(headers[i], ':')) {
            fprintf(stderr, "quan-bench-paced: a header is \"Name: value\", not \"%s\"\n",
                    headers[i]);
            goto done;
        }
        evbuffer_add_printf(b, "%s\r\n", headers[i]);
    }
    if (body)
        evbuffer_add_printf(b, "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    else
        evbuffer_add(b, "\r\n", 2);
    *len = evbuffer_get_length(b);
    if ((out = malloc(*len)))
        evbuffer_remove(b, out, *len);
done:
    evbuffer_free(b);
    return out;
}

static int paced_resolve(paced_run *r, const struct evhttp_uri *uri)
{
    char port[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    snprintf(port, sizeof(port), "%d", evhttp_uri_get_port(uri));
    if (getaddrinfo(evhttp_uri_get_host(uri), port, &hints, &ai) != 0 || !ai)
        return -1;
    memcpy(&r->addr, ai->ai_addr, ai->ai_addrlen);
    r->addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

static void paced_usage(void)
{
    fprintf(stderr, "usage: quan-bench-paced [-m METHOD] [-b BODY] [-x STATUS] [-w SECONDS] "
                    "URL RATE SECONDS CONNS [\"Name: value\" ...]\n");
}

int main(int argc, char **argv)
{
    static paced_run run;
    paced_run *r = &run;
    const char *method = "GET", *body = NULL;
    double wait_s = 5;
    struct evhttp_uri *uri = NULL;
    struct event_config *cfg = NULL;
    struct event *limit_ev = NULL;
    int opt, rc = 1;

    while ((opt = getopt(argc, argv, "m:b:x:w:")) != -1) {
        switch (opt) {
        case 'm':
            method = optarg;
            break;
        case 'b':
            body = optarg;
            break;
        case 'x':
            r->expect_status = atoi(optarg);
            break;
        case 'w':
            wait_s = atof(optarg);
            break;
        default:
            paced_usage();
            return 1;
        }
    }
    if (argc - optind < 4) {
        paced_usage();
        return 1;
    }
    double seconds = atof(argv[optind + 2]);
    r->rate = atof(argv[optind + 1]);
    r->conns = atoi(argv[optind + 3]);
    uri = evhttp_uri_parse(argv[optind]);
    if (!uri || !evhttp_uri_get_host(uri) || r->rate <= 0 || seconds <= 0 || r->conns <= 0 ||
        wait_s < 0) {
        paced_usage();
        goto done;
    }
    if (evhttp_uri_get_port(uri) < 0)
        evhttp_uri_set_port(uri, 80);
    if (paced_resolve(r, uri) < 0) {
        fprintf(stderr, "quan-bench-paced: cannot resolve %s\n", evhttp_uri_get_host(uri));
        goto done;
    }
    if (!(r->req = paced_build_request(method, uri, body, argv + optind + 4, argc - optind - 4,
                                       &r->req_len)))
        goto done;
    r->total = (uint64_t)(r->rate * seconds + 0.999999);
    signal(SIGPIPE, SIG_IGN);
    /* timerfd: requests leave within microseconds of their time, not epoll's milliseconds. */
    cfg = event_config_new();
    if (cfg)
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    r->base = cfg ? event_base_new_with_config(cfg) : NULL;
    r->c = calloc((size_t)r->conns, sizeof(*r->c));
    if (!r->base || !r->c)
        goto done;
    for (int i = 0; i < r->conns; i++)
        r->c[i] = (paced_conn){.run = r, .idx = i, .fd = -1};
    for (int i = 0; i < r->conns; i++) {
        paced_conn *c = &r->c[i];
        c->timer = evtimer_new(r->base, paced_on_timer, c);
        if (!c->timer || paced_connect(c) < 0) {
            fprintf(stderr, "quan-bench-paced: cannot connect to %s\n", argv[optind]);
            goto done;
        }
    }
    /* Every connection is made before the first request is due, so none pays for it. */
    if (r->connected < r->conns) {
        /* A timer of our own, not event_base_loopexit(5 s): that one cannot be taken back, and
         * would end the measured run 5 s after the connects, cutting off its last answers. */
        struct timeval connect_limit = {5, 0};
        limit_ev = evtimer_new(r->base, paced_on_limit, r);
        if (!limit_ev || evtimer_add(limit_ev, &connect_limit))
            goto done;
        event_base_dispatch(r->base);
        event_free(limit_ev);
        limit_ev = NULL;
    }
    if (r->connect_failed || r->connected < r->conns) {
        fprintf(stderr, "quan-bench-paced: %d of %d connections made\n", r->connected, r->conns);
        goto done;
    }
    r->start_ns = paced_now_ns();
    for (int i = 0; i < r->conns; i++)
        paced_pump(&r->c[i]);
    double limit = seconds + wait_s;
    struct timeval deadline = {(time_t)limit, (suseconds_t)((limit - (double)(time_t)limit) * 1e6)};
    if (r->idle < r->conns) {
        event_base_loopexit(r->base, &deadline);
        event_base_dispatch(r->base);
    }
    double elapsed = (double)(r->last_ns - r->start_ns) / 1e9;
    if (elapsed < seconds)
        elapsed = seconds;
    printf("rate_achieved=%.0f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f errors=%llu "
           "non2xx=%llu\n",
           (double)r->answers / elapsed, paced_quantile_ms(r, 0.50), paced_quantile_ms(r, 0.90),
           paced_quantile_ms(r, 0.99), (double)r->max_ns / 1e6,
           (unsigned long long)(r->total - r->answers), (unsigned long long)r->non2xx);
    rc = 0;
done:
    if (limit_ev)
        event_free(limit_ev);
    for (int i = 0; r->c && i < r->conns; i++) {
        paced_close(&r->c[i]);
        if (r->c[i].timer)
            event_free(r->c[i].timer);
    }
    free(r->c);
    free(r->req);
    if (r->base)
        event_base_free(r->base);
    if (cfg)
        event_config_free(cfg);
    if (uri)
        evhttp_uri_free(uri);
    return rc;
}
