/*
 * Runs a real http_server on an ephemeral loopback port in a thread and talks to it with
 * libcurl and raw sockets.
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "testhelp.h"

static struct event_base *t_base;
static http_server *t_srv;
static uint16_t t_port;
static atomic_int t_late_replies;
static atomic_int t_ready = 1;

/* ---- server side ---- */

typedef struct later {
    struct event *ev;
    http_req *req;
} later;

static void later_fire(evutil_socket_t fd, short what, void *arg)
{
    later *l = arg;
    (void)fd, (void)what;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddBoolToObject(d, "deferred", 1);
    http_reply_ok(l->req, d); /* dropped when the client is gone or timed out */
    atomic_fetch_add(&t_late_replies, 1);
    event_free(l->ev);
    free(l);
}

static void reply_later(http_req *req, int ms)
{
    later *l = calloc(1, sizeof(*l));
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    l->req = req;
    l->ev = evtimer_new(t_base, later_fire, l);
    evtimer_add(l->ev, &tv);
}

static void h_deferred(http_req *req, void *arg)
{
    reply_later(req, (int)(intptr_t)arg);
}

static void h_echo(http_req *req, void *arg)
{
    (void)arg;
    char tp[HTTP_TRACEPARENT_LEN];
    int64_t n = 0;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "userId", (double)req->user_id);
    cJSON_AddNumberToObject(d, "shopNumber", (double)req->shop_number);
    cJSON_AddStringToObject(d, "username", req->username ? req->username : "");
    cJSON_AddStringToObject(d, "traceparent", http_req_traceparent(req, tp));
    cJSON_AddStringToObject(d, "parent", req->parent_id);
    const char *a = http_param_str(req, "a");
    cJSON_AddStringToObject(d, "a", a ? a : "");
    qn_status st = http_param_i64(req, "n", &n);
    cJSON_AddNumberToObject(d, "n", st == QN_OK ? (double)n : -1);
    cJSON_AddNumberToObject(d, "nStatus", st);
    http_reply_ok(req, d);
}

static void h_inflight(http_req *req, void *arg)
{
    (void)arg;
    cJSON *d = cJSON_CreateObject();
    /* This request itself is in flight. */
    cJSON_AddNumberToObject(d, "inflight", (double)http_server_inflight(t_srv) - 1);
    http_reply_ok(req, d);
}

static void h_drain(http_req *req, void *arg)
{
    (void)arg;
    http_server_set_draining(t_srv);
    http_reply_status(req, 202, NULL);
}

static void h_stop(http_req *req, void *arg)
{
    (void)arg;
    http_server_stop_accepting(t_srv);
    http_reply_ok(req, NULL);
}

static void h_raw(http_req *req, void *arg)
{
    (void)arg;
    static const char *const hdrs[] = {"Content-Disposition", "attachment; filename=\"r.xlsx\"",
                                       NULL};
    http_reply_raw(req, 200, "application/octet-stream", "PK\x03\x04", 4, hdrs);
}

/* The raw body and the path as they reached the handler; status from ?s= (default 200). */
static void h_rawbody(http_req *req, void *arg)
{
    (void)arg;
    size_t len;
    const char *b = http_body_raw(req, &len);
    int64_t st = 200;
    if (http_param_i64(req, "s", &st) != QN_OK)
        st = 200;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "body", b);
    cJSON_AddNumberToObject(d, "len", (double)len);
    cJSON_AddStringToObject(d, "path", req->path);
    cJSON_AddStringToObject(d, "query", http_query_raw(req));
    http_reply_status(req, (int)st, d);
}

/* "/t/lll...": a route longer than a request's inline path buffer. */
static void t_long_path(char *buf, size_t cap)
{
    memset(buf, 'l', cap - 1);
    memcpy(buf, "/t/", 3);
    buf[cap - 1] = '\0';
}

static bool ready_cb(void *arg)
{
    return atomic_load((atomic_int *)arg) != 0;
}

static void *server_thread(void *arg)
{
    (void)arg;
    event_base_dispatch(t_base);
    return NULL;
}

/* ---- client side ---- */

typedef struct resp {
    long status;
    char body[65536];
    size_t blen;
    char hdrs[8192];
    size_t hlen;
    double secs;
    CURLcode rc;
} resp;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    size_t len = sz * n;
    if (r->blen + len >= sizeof(r->body))
        len = sizeof(r->body) - 1 - r->blen;
    memcpy(r->body + r->blen, p, len);
    r->blen += len;
    r->body[r->blen] = '\0';
    return sz * n;
}

static size_t on_hdr(char *p, size_t sz, size_t n, void *ud)
{
    resp *r = ud;
    size_t len = sz * n;
    if (r->hlen + len >= sizeof(r->hdrs))
        len = sizeof(r->hdrs) - 1 - r->hlen;
    memcpy(r->hdrs + r->hlen, p, len);
    r->hlen += len;
    r->hdrs[r->hlen] = '\0';
    return sz * n;
}

/* headers: NULL-terminated "Name: value" strings. body NULL: no body. */
static resp *req(const char *method, const char *path, const char *const *headers, const char *body,
                 size_t blen)
{
    static resp r;
    char url[512];
    memset(&r, 0, sizeof(r));
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", t_port, path);
    CURL *c = curl_easy_init();
    struct curl_slist *sl = NULL;
    for (; headers && *headers; headers++)
        sl = curl_slist_append(sl, *headers);
    sl = curl_slist_append(sl, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "HEAD") == 0)
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, sl);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_hdr);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)blen);
    }
    double t0 = now_mono_s();
    r.rc = curl_easy_perform(c);
    r.secs = now_mono_s() - t0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(sl);
    curl_easy_cleanup(c);
    return &r;
}

#define GET(path, ...) req("GET", (path), (const char *const[]){__VA_ARGS__ NULL}, NULL, 0)

/* Value of a response header (case-insensitive name) copied into out, or "" */
static const char *hdr(const resp *r, const char *name, char *out, size_t cap)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *p = r->hdrs; *p;) {
        const char *e = strstr(p, "\r\n");
        if (!e)
            break;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(out, cap, "%.*s", (int)(e - v), v);
            return out;
        }
        p = e + 2;
    }
    return out;
}

static cJSON *body_json(const resp *r)
{
    return cJSON_Parse(r->body);
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Bytes after the header of a HEAD /livez answer, read off a raw socket until the server
 * closes it (Connection: close); -1 on a socket error. */
static long raw_head_body_bytes(unsigned port)
{
    static const char ask[] = "HEAD /livez HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    char buf[4096];
    size_t n = 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        write(fd, ask, sizeof(ask) - 1) != (ssize_t)(sizeof(ask) - 1)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    for (ssize_t k; n < sizeof(buf) - 1 && (k = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0;)
        n += (size_t)k;
    close(fd);
    buf[n] = '\0';
    const char *end = strstr(buf, "\r\n\r\n");
    return end ? (long)(n - (size_t)(end + 4 - buf)) : -1;
}

/* ---- tests ---- */

static void test_envelope_and_traceparent_units(void)
{
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "x", 1);
    char *s = http_envelope("0", NULL, d, "rid", true);
    CHECK_EQ_STR(s, "{\"code\":\"0\",\"message\":null,\"data\":{\"x\":1},\"requestId\":\"rid\","
                    "\"success\":true}");
    free(s);
    s = http_envelope("A000001", "bad \"x\"", NULL, "r2", false);
    CHECK_EQ_STR(s, "{\"code\":\"A000001\",\"message\":\"bad \\\"x\\\"\",\"data\":null,"
                    "\"requestId\":\"r2\",\"success\":false}");
    free(s);
    cJSON_Delete(d);

    char t[33], p[17], f[3];
    CHECK(
        http_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", t, p, f));
    CHECK_EQ_STR(t, "4bf92f3577b34da6a3ce929d0e0e4736");
    CHECK_EQ_STR(p, "00f067aa0ba902b7");
    CHECK_EQ_STR(f, "01");
    CHECK(!http_traceparent_parse("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", t, p,
                                  f));
    CHECK(!http_traceparent_parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01", t, p,
                                  f));
    CHECK(!http_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", t, p,
                                  f));
    CHECK(
        !http_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", t, p, f));
    CHECK(!http_traceparent_parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", t, p,
                                  f));
    CHECK(!http_traceparent_parse(NULL, t, p, f));
}

static void test_livez(void)
{
    char h[256];
    resp *r = GET("/livez", );
    CHECK_EQ_INT(r->status, 200);
    CHECK_EQ_STR(hdr(r, "Content-Type", h, sizeof(h)), "application/json; charset=utf-8");
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "0");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "success")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "message")));
    cJSON_Delete(j);
    /* Date and Content-Length are written by the framework, not evhttp: once each, and right. */
    CHECK_EQ_INT(strtol(hdr(r, "Content-Length", h, sizeof(h)), NULL, 10), (long)r->blen);
    struct tm tm = {0};
    const char *end = strptime(hdr(r, "Date", h, sizeof(h)), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    CHECK(end && *end == '\0' && strlen(h) == 29);
    time_t sent = timegm(&tm), now = time(NULL);
    CHECK(sent <= now && sent >= now - 2);
    size_t dates = 0, lengths = 0;
    for (const char *p = r->hdrs; (p = strstr(p, "\r\n")); p += 2) {
        dates += strncasecmp(p + 2, "Date:", 5) == 0;
        lengths += strncasecmp(p + 2, "Content-Length:", 15) == 0;
    }
    CHECK_EQ_INT(dates, 1);
    CHECK_EQ_INT(lengths, 1);
    /* HEAD (405 here: /livez is a GET): the length of the answer, and no body after it, which a
     * keep-alive client would read as the start of the next answer. */
    r = req("HEAD", "/livez", NULL, NULL, 0);
    CHECK_EQ_INT(r->rc, CURLE_OK);
    CHECK_EQ_INT(r->status, 405);
    CHECK(strtol(hdr(r, "Content-Length", h, sizeof(h)), NULL, 10) > 0);
    CHECK_EQ_INT(raw_head_body_bytes(t_port), 0);
}

static void test_404_405(void)
{
    char h[256];
    resp *r = GET("/nope", );
    CHECK_EQ_INT(r->status, 404);
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "A000404");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "success")));
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "data")));
    cJSON_Delete(j);

    r = req("POST", "/livez", NULL, "{}", 2);
    CHECK_EQ_INT(r->status, 405);
    CHECK_EQ_STR(hdr(r, "Allow", h, sizeof(h)), "GET");
    j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "A000405");
    cJSON_Delete(j);
}

static void test_identity(void)
{
    resp *r = GET("/t/user", );
    CHECK_EQ_INT(r->status, 401);
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "A000401");
    CHECK(strstr(r->body, "X-User-Id") != NULL);
    cJSON_Delete(j);
    CHECK_EQ_INT(GET("/t/user", "X-User-Id: abc", )->status, 401);
    CHECK_EQ_INT(GET("/t/user", "X-User-Id: 0", )->status, 401);
    CHECK_EQ_INT(GET("/t/user", "X-User-Id: -5", )->status, 401);
    CHECK_EQ_INT(GET("/t/user", "X-User-Id: 99999999999999999999", )->status, 401);

    r = GET("/t/user", "X-User-Id: 1810000000000000001", "X-Username: ann", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"userId\":1810000000000000001") != NULL ||
          strstr(r->body, "\"userId\":1.81e+18") != NULL);
    CHECK(strstr(r->body, "\"username\":\"ann\"") != NULL);

    CHECK_EQ_INT(GET("/t/shop", "X-User-Id: 7", )->status, 401);
    r = GET("/t/shop", "X-User-Id: 7", "X-Shop-Number: 1810", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"shopNumber\":1810") != NULL);
    /* Names match in any case; among other headers and names that only start the same; the
     * first of a repeated header counts. */
    r = GET("/t/shop", "X-User-Idx: 5", "x-shop-number: 1811", "Accept: */*", "X-USER-ID: 8",
            "X-Shop-Number: 1812", "x-username: bo", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"shopNumber\":1811") != NULL);
    CHECK(strstr(r->body, "\"userId\":8") != NULL);
    r = GET("/t/user", "x-request-id: abc-1", "X-User-Id: 9", "X-Username: cy", "X-Username: dd", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"username\":\"cy\"") != NULL);
    CHECK(strstr(r->body, "\"requestId\":\"abc-1\"") != NULL);
}

static void test_body_and_params(void)
{
    resp *r = req("POST", "/t/echo", NULL, "{bad", 4);
    CHECK_EQ_INT(r->status, 400);
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "A000001");
    CHECK(jstr(j, "message") && strncmp(jstr(j, "message"), "body: malformed JSON", 20) == 0);
    cJSON_Delete(j);

    /* a from the body, n from the query string. */
    const char *b = "{\"a\":\"x y\"}";
    r = req("POST", "/t/echo?n=42&a=ignored", NULL, b, strlen(b));
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"a\":\"x y\"") != NULL);
    CHECK(strstr(r->body, "\"n\":42") != NULL);

    /* Empty body: query only, decoded. Ids as JSON strings or numbers. */
    r = GET("/t/echo?a=hello%20w&n=-7", );
    CHECK(strstr(r->body, "\"a\":\"hello w\"") != NULL);
    CHECK(strstr(r->body, "\"n\":-7") != NULL);
    b = "{\"n\":\"1810000000000000001\"}";
    r = req("POST", "/t/echo", NULL, b, strlen(b));
    CHECK(strstr(r->body, "\"nStatus\":0") != NULL);
    b = "{\"n\":1.5}";
    r = req("POST", "/t/echo", NULL, b, strlen(b));
    CHECK(strstr(r->body, "\"nStatus\":-7") != NULL); /* QN_EINVAL */
    r = GET("/t/echo", );
    CHECK(strstr(r->body, "\"nStatus\":-5") != NULL); /* QN_ENOTFOUND */
}

/* Requests are reused: nothing of one reaches the next (body, long path, query), and a route's
 * metrics count every status, also past the few it remembers. */
static void test_reuse(void)
{
    char long_path[300], want[400];
    resp *r = req("POST", "/t/rawbody?q=1", NULL, "abcdef", 6);
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"body\":\"abcdef\",\"len\":6") != NULL);
    for (int i = 0; i < 3; i++) {
        r = GET("/t/rawbody", );
        CHECK_EQ_INT(r->status, 200);
        CHECK(strstr(r->body, "\"body\":\"\",\"len\":0") != NULL);
        CHECK(strstr(r->body, "\"query\":\"\"") != NULL);
    }
    /* a body longer than the buffer kept, then a short one */
    char big[1000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    r = req("POST", "/t/rawbody", NULL, big, strlen(big));
    CHECK(strstr(r->body, "\"len\":999") != NULL);
    r = req("POST", "/t/rawbody", NULL, "yz", 2);
    CHECK(strstr(r->body, "\"body\":\"yz\",\"len\":2") != NULL);

    /* a path and a query longer than the request's own buffers */
    t_long_path(long_path, sizeof(long_path));
    r = GET(long_path, );
    CHECK_EQ_INT(r->status, 200);
    snprintf(want, sizeof(want), "\"path\":\"%s\"", long_path);
    CHECK(strstr(r->body, want) != NULL);
    char q[400] = "/t/echo?a=";
    size_t n = strlen(q);
    memset(q + n, 'a', 300);
    q[n + 300] = '\0';
    r = GET(q, );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"") !=
          NULL);

    /* six statuses on one route, twice each */
    static const int sts[] = {200, 201, 202, 400, 409, 503};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof(sts) / sizeof(sts[0]); i++) {
            char p[64];
            snprintf(p, sizeof(p), "/t/rawbody?s=%d", sts[i]);
            r = GET(p, );
            CHECK_EQ_INT(r->status, sts[i]);
        }
    for (size_t i = 0; i < sizeof(sts) / sizeof(sts[0]); i++) {
        char s[8];
        snprintf(s, sizeof(s), "%d", sts[i]);
        CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/t/rawbody", s),
                     sts[i] == 200 ? 2 + 6 : 2);
        CHECK_EQ_INT(metrics_get_l(&metric_quan_http_request_duration_seconds, "/t/rawbody", s),
                     sts[i] == 200 ? 2 + 6 : 2);
    }
}

static void test_413(void)
{
    char big[1500];
    memset(big, ' ', sizeof(big));
    big[0] = '{', big[sizeof(big) - 1] = '}';
    resp *r = req("POST", "/t/echo", NULL, big, sizeof(big));
    CHECK_EQ_INT(r->status, 413);
    cJSON *j = body_json(r);
    CHECK(jstr(j, "message") && strstr(jstr(j, "message"), "1024") != NULL);
    cJSON_Delete(j);
    r = req("POST", "/t/echo", NULL, big, 1000); /* under the limit: fine (no closing brace) */
    CHECK_EQ_INT(r->status, 400);
}

static void test_request_id(void)
{
    char h[256];
    resp *r = GET("/livez", );
    hdr(r, "X-Request-Id", h, sizeof(h));
    CHECK_EQ_INT(strlen(h), 32);
    CHECK_EQ_INT(strspn(h, "0123456789abcdef"), 32);
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "requestId"), h);
    cJSON_Delete(j);
    char first[256];
    snprintf(first, sizeof(first), "%s", h);
    r = GET("/livez", );
    CHECK(strcmp(hdr(r, "X-Request-Id", h, sizeof(h)), first) != 0);

    r = GET("/livez", "X-Request-Id: gw-1234.abc:9_Z", );
    CHECK_EQ_STR(hdr(r, "X-Request-Id", h, sizeof(h)), "gw-1234.abc:9_Z");
    j = body_json(r);
    CHECK_EQ_STR(jstr(j, "requestId"), "gw-1234.abc:9_Z");
    cJSON_Delete(j);

    r = GET("/livez", "X-Request-Id: bad id!", );
    CHECK_EQ_INT(strlen(hdr(r, "X-Request-Id", h, sizeof(h))), 32);
    char longid[80];
    memset(longid, 'a', 79), longid[79] = '\0';
    char line[128];
    snprintf(line, sizeof(line), "X-Request-Id: %s", longid);
    r = GET("/livez", line, );
    CHECK_EQ_INT(strlen(hdr(r, "X-Request-Id", h, sizeof(h))), 32);
}

static void test_traceparent(void)
{
    char h[256];
    resp *r =
        GET("/t/echo", "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", );
    CHECK_EQ_INT(r->status, 200);
    hdr(r, "traceparent", h, sizeof(h));
    CHECK_EQ_INT(strlen(h), 55);
    CHECK(strncmp(h, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36) == 0);
    CHECK(strstr(h, "00f067aa0ba902b7") == NULL); /* a new span id */
    cJSON *j = body_json(r);
    cJSON *d = cJSON_GetObjectItem(j, "data");
    CHECK_EQ_STR(jstr(d, "traceparent"), h); /* what goes downstream */
    CHECK_EQ_STR(jstr(d, "parent"), "00f067aa0ba902b7");
    cJSON_Delete(j);

    r = GET("/t/echo", "traceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", );
    hdr(r, "traceparent", h, sizeof(h));
    CHECK_EQ_INT(strlen(h), 55);
    CHECK(strstr(h, "4bf92f3577b34da6a3ce929d0e0e4736") == NULL);
    r = GET("/t/echo", "traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01", );
    CHECK(strncmp(hdr(r, "traceparent", h, sizeof(h)), "00-0000000000", 13) != 0);
}

static void test_deferred(void)
{
    resp *r = GET("/t/deferred", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(r->secs >= 0.045);
    CHECK(strstr(r->body, "\"deferred\":true") != NULL);
}

static int inflight(void)
{
    resp *r = GET("/t/inflight", );
    cJSON *j = body_json(r);
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data"), "inflight");
    int n = cJSON_IsNumber(v) ? v->valueint : -1;
    cJSON_Delete(j);
    return n;
}

static void test_client_disconnect(void)
{
    int before = atomic_load(&t_late_replies);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(t_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    const char *rq = "GET /t/slow HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(write(fd, rq, strlen(rq)) == (ssize_t)strlen(rq));
    usleep(30 * 1000); /* the server has the request and has deferred it */
    CHECK_EQ_INT(inflight(), 1);
    close(fd);
    usleep(200 * 1000); /* the deferred reply (100 ms) ran against a closed client */
    CHECK_EQ_INT(atomic_load(&t_late_replies), before + 1);
    CHECK_EQ_INT(inflight(), 0);
    CHECK_EQ_INT(GET("/livez", )->status, 200);
}

static void test_timeout(void)
{
    char h[64];
    int before = atomic_load(&t_late_replies);
    resp *r = GET("/t/hang", );
    CHECK_EQ_INT(r->status, 503);
    CHECK_EQ_STR(hdr(r, "Retry-After", h, sizeof(h)), "1"); /* every 503 and 429 says when */
    CHECK(r->secs >= 0.28 && r->secs < 0.6);
    cJSON *j = body_json(r);
    CHECK_EQ_STR(jstr(j, "code"), "C000001");
    cJSON_Delete(j);
    CHECK_EQ_INT(inflight(), 1); /* the handler still owns the request */
    usleep(400 * 1000);          /* its late reply (600 ms) is dropped and frees it */
    CHECK_EQ_INT(atomic_load(&t_late_replies), before + 1);
    CHECK_EQ_INT(inflight(), 0);
}

static void test_raw(void)
{
    char h[256];
    resp *r = GET("/t/raw", );
    CHECK_EQ_INT(r->status, 200);
    CHECK_EQ_INT(r->blen, 4);
    CHECK(memcmp(r->body, "PK\x03\x04", 4) == 0);
    CHECK_EQ_STR(hdr(r, "Content-Disposition", h, sizeof(h)), "attachment; filename=\"r.xlsx\"");
    CHECK_EQ_STR(hdr(r, "Content-Type", h, sizeof(h)), "application/octet-stream");
}

static void test_metrics_endpoint(void)
{
    char h[256];
    resp *r = GET("/metrics", );
    CHECK_EQ_INT(r->status, 200);
    CHECK_EQ_STR(hdr(r, "Content-Type", h, sizeof(h)), METRICS_CONTENT_TYPE);
    CHECK(strstr(r->body, "quan_http_requests_total{route=\"/livez\",status=\"200\"} ") != NULL);
    CHECK(strstr(r->body, "quan_http_requests_total{route=\"unmatched\",status=\"404\"} 1\n") !=
          NULL);
    CHECK(strstr(r->body, "quan_http_requests_total{route=\"/t/hang\",status=\"503\"} 1\n") !=
          NULL);
    CHECK(strstr(r->body, "quan_http_request_duration_seconds_bucket{route=\"/t/deferred\","
                          "status=\"200\",le=\"0.025\"} 0\n") != NULL);
    CHECK(strstr(r->body, "quan_http_request_duration_seconds_count{route=\"/t/deferred\","
                          "status=\"200\"} 1\n") != NULL);
}

static void test_readyz_and_drain(void)
{
    char h[64];
    CHECK_EQ_STR(hdr(GET("/readyz", ), "Retry-After", h, sizeof(h)), ""); /* not on a 200 */
    CHECK_EQ_INT(GET("/readyz", )->status, 200);
    t_ready = 0; /* read on the server thread; the next request orders it */
    CHECK_EQ_INT(GET("/readyz", )->status, 503);
    t_ready = 1;
    CHECK_EQ_INT(GET("/readyz", )->status, 200);
    CHECK_EQ_INT(GET("/t/drain", )->status, 202);
    resp *r = GET("/readyz", );
    CHECK_EQ_INT(r->status, 503);
    CHECK(strstr(r->body, "C000001") != NULL);
    CHECK_EQ_INT(GET("/livez", )->status, 200);

    CHECK_EQ_INT(GET("/t/stop", )->status, 200);
    r = GET("/livez", );
    CHECK(r->rc == CURLE_COULDNT_CONNECT);
}

/* The server is freed while a handler still holds a request: its late reply must be dropped
 * and still free the request (ASan/LSan check the rest). Runs after the server thread ended. */
static int raw_fd = -1;

static void open_raw_connection(void)
{
    raw_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(t_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(raw_fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
}

static void start_pending_request(void)
{
    const char *rq = "GET /t/slow HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(write(raw_fd, rq, strlen(rq)) == (ssize_t)strlen(rq));
    usleep(30 * 1000);
}

static void test_free_with_pending(void)
{
    int before = atomic_load(&t_late_replies);
    http_server_free(t_srv);
    t_srv = NULL;
    struct timeval tv = {0, 250 * 1000};
    event_base_loopexit(t_base, &tv);
    event_base_dispatch(t_base); /* the 100 ms reply timer fires on the detached request */
    CHECK_EQ_INT(atomic_load(&t_late_replies), before + 1);
    char buf[64];
    CHECK(read(raw_fd, buf, sizeof(buf)) <= 0); /* closed without an answer */
    close(raw_fd);
}

/* q read by http_req_set_query as evhttp_parse_query_str reads it: both refuse it or both take
 * it, and every name evhttp found gives its first value through http_query, in any case. */
static int query_same_as_evhttp(const char *q)
{
    struct evkeyvalq want;
    int ev_ok = evhttp_parse_query_str(q, &want) == 0;
    http_req *r = calloc(1, sizeof(*r));
    int ok = r != NULL;
    qn_status st = r ? http_req_set_query(r, q) : QN_ENOMEM;
    ok = ok && (st == QN_OK) == ev_ok && (st == QN_OK || st == QN_EINVAL);
    if (ok && ev_ok) {
        const struct evkeyval *kv;
        ok = strcmp(http_query_raw(r), q) == 0;
        TAILQ_FOREACH(kv, &want, next)
        {
            const char *first = evhttp_find_header(&want, kv->key), *got = http_query(r, kv->key);
            ok = ok && got && strcmp(got, first) == 0;
        }
        ok = ok && (!TAILQ_EMPTY(&want) || http_query(r, "a") == NULL);
    }
    if (r && r->query_raw && r->query_raw != r->query_inline)
        free(r->query_raw);
    free(r);
    evhttp_clear_headers(&want);
    return ok;
}

static void test_query_string(void)
{
    static const char *const cases[] = {
        "",
        "a=1",
        "a=1&b=2",
        "a=1&",
        "&a=1",
        "a=1&&b=2",
        "a",
        "=1",
        "a=",
        "a=1=2",
        "A=1&a=2",
        "couponTemplateId=900000000000000002&shopNumber=1810714735922956666",
        "x=%41%42+c",
        "x=%4",
        "x=%zz%4g%",
        "x=%00y&z=1",
        "x=a%00&x=b",
        "k%41=v",
        "a+b=c+d",
        "q=?&r=%3F",
        "a=1&b",
        "a=1&b=",
        "x=%e4%bd%a0",
        "a=1&a=2&A=3"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (!query_same_as_evhttp(cases[i])) {
            printf("  query %s differs from evhttp's reading\n", cases[i]);
            CHECK(0);
        }
    }
    char longq[3000];
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(longq + n, sizeof(longq) - n, "%sk%d=v%%2B%d", i ? "&" : "", i, i);
    CHECK(query_same_as_evhttp(longq)); /* past the inline buffer */
    /* Through a server: a value decoded, a name in another case, a malformed query refused. */
    resp *r = GET("/t/echo?A=a%20b+c", );
    CHECK_EQ_INT(r->status, 200);
    CHECK(strstr(r->body, "\"a\":\"a b c\"") != NULL);
    CHECK_EQ_INT(GET("/t/echo?a=x&&y=1", )->status, 400);
}

static void test_parse_id(void)
{
    CHECK(http_parse_id("42") == 42);
    CHECK(http_parse_id("9223372036854775807") == INT64_MAX);
    static const char *const bad[] = {"0", "-5", "+5", "12a", " 5", "", "9223372036854775808"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(http_parse_id(bad[i]) == 0);
    CHECK(http_parse_id(NULL) == 0);
}

int main(void)
{
    log_init("test", LOGL_ERROR);
    evthread_use_pthreads();
    RUN(test_parse_id);
    curl_global_init(CURL_GLOBAL_ALL);
    metrics_init("test", "0.0.0");

    t_base = event_base_new();
    http_server_opts o = {.bind_addr = "127.0.0.1",
                          .port = 0,
                          .max_body_bytes = 1024,
                          .request_timeout_ms = 300,
                          .service = "test"};
    t_srv = http_server_new(t_base, &o);
    CHECK(t_srv != NULL);
    if (!t_srv)
        return 1;
    qn_status st = QN_OK;
    st |= http_route(t_srv, HTTP_GET, "/t/user", h_echo, NULL, HTTP_NEED_USER);
    st |= http_route(t_srv, HTTP_GET, "/t/shop", h_echo, NULL, HTTP_NEED_SHOP);
    st |= http_route(t_srv, HTTP_GET, "/t/echo", h_echo, NULL, 0);
    st |= http_route(t_srv, HTTP_POST, "/t/echo", h_echo, NULL, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/deferred", h_deferred, (void *)(intptr_t)50, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/slow", h_deferred, (void *)(intptr_t)100, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/hang", h_deferred, (void *)(intptr_t)600, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/inflight", h_inflight, NULL, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/drain", h_drain, NULL, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/stop", h_stop, NULL, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/raw", h_raw, NULL, 0);
    st |= http_route(t_srv, HTTP_GET, "/t/rawbody", h_rawbody, NULL, HTTP_RAW_BODY);
    st |= http_route(t_srv, HTTP_POST, "/t/rawbody", h_rawbody, NULL, HTTP_RAW_BODY);
    char long_path[300];
    t_long_path(long_path, sizeof(long_path));
    st |= http_route(t_srv, HTTP_GET, long_path, h_rawbody, NULL, 0);
    CHECK(st == QN_OK);
    CHECK(http_route(t_srv, HTTP_GET, "/t/raw", h_raw, NULL, 0) == QN_EINVAL);
    http_server_set_ready_cb(t_srv, ready_cb, &t_ready);
    CHECK(http_server_listen(t_srv) == QN_OK);
    t_port = http_server_port(t_srv);
    CHECK(t_port != 0);

    /* A second server on the same port must report the bind error. */
    http_server_opts o2 = o;
    o2.port = t_port;
    http_server *dup = http_server_new(t_base, &o2);
    CHECK(dup && http_server_listen(dup) != QN_OK);
    http_server_free(dup);

    pthread_t th;
    pthread_create(&th, NULL, server_thread, NULL);

    RUN(test_envelope_and_traceparent_units);
    RUN(test_livez);
    RUN(test_404_405);
    RUN(test_identity);
    RUN(test_body_and_params);
    RUN(test_query_string);
    RUN(test_reuse);
    RUN(test_413);
    RUN(test_request_id);
    RUN(test_traceparent);
    RUN(test_deferred);
    RUN(test_client_disconnect);
    RUN(test_timeout);
    RUN(test_raw);
    RUN(test_metrics_endpoint);
    open_raw_connection(); /* before the listener closes */
    RUN(test_readyz_and_drain);
    start_pending_request(); /* on the connection that is still open */

    event_base_loopexit(t_base, NULL);
    pthread_join(th, NULL);
    RUN(test_free_with_pending);
    http_server_free(t_srv);
    event_base_free(t_base);
    metrics_shutdown();
    curl_global_cleanup();
    libevent_global_shutdown();
    TEST_MAIN_END();
}
