/*
 * fetch: paths under the root (.., symlinks, non-files refused), schemes other than http(s)
 * refused, and downloads from a small HTTP server on a thread of this test (size limit,
 * timeout, redirects, HTTP errors).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "fetch.h"
#include "now.h"
#include "sheet.h"
#include "testhelp.h"

static char dir[256], root[300];
static int port;
static atomic_int stop_server;

static void put(const char *rel, const char *data)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputs(data, f);
        fclose(f);
    }
}

/* ---- the HTTP server: one connection at a time, a few fixed routes */

static void send_all(int fd, const char *b, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        b += w;
        n -= (size_t)w;
    }
}

static void send_str(int fd, const char *s)
{
    send_all(fd, s, strlen(s));
}

static const char csv_body[] = "用户ID,手机号,邮箱\r\n1810518709471555585,13800000001,a@b.c\r\n";

static void serve(int fd)
{
    char req[4096] = "";
    size_t n = 0;
    while (n < sizeof(req) - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t r = recv(fd, req + n, sizeof(req) - 1 - n, 0);
        if (r <= 0)
            return;
        n += (size_t)r;
        req[n] = '\0';
    }
    char path[256] = "";
    if (sscanf(req, "GET %255s", path) != 1)
        return;
    char hdr[512];
    if (strcmp(path, "/list.csv") == 0) {
        snprintf(hdr, sizeof(hdr),
                 "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                 sizeof(csv_body) - 1);
        send_str(fd, hdr);
        send_str(fd, csv_body);
    } else if (strcmp(path, "/big") == 0 || strcmp(path, "/big-unsized") == 0) {
        /* 256 KiB; with or without a Content-Length (then only the byte count stops it) */
        if (strcmp(path, "/big") == 0)
            send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 262144\r\nConnection: close\r\n\r\n");
        else
            send_str(fd, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
        char chunk[4096];
        memset(chunk, 'x', sizeof(chunk));
        for (int i = 0; i < 64; i++)
            send_all(fd, chunk, sizeof(chunk));
    } else if (strcmp(path, "/slow") == 0) {
        send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n0123");
        /* then nothing, until the client gives up (at most 10 s) */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        for (int i = 0; i < 100 && !stop_server; i++) {
            if (poll(&p, 1, 100) > 0) {
                char b[64];
                if (recv(fd, b, sizeof(b), 0) <= 0)
                    break;
            }
        }
    } else if (strcmp(path, "/to-ftp") == 0) {
        send_str(fd, "HTTP/1.1 302 Found\r\nLocation: ftp://127.0.0.1/x.csv\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n");
    } else if (strcmp(path, "/to-file") == 0) {
        send_str(fd, "HTTP/1.1 302 Found\r\nLocation: file:///etc/passwd\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n");
    } else if (strcmp(path, "/to-list") == 0) {
        send_str(fd, "HTTP/1.1 302 Found\r\nLocation: /list.csv\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n");
    } else if (strcmp(path, "/busy") == 0) {
        send_str(fd, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n");
    } else {
        send_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
}

static void *server_main(void *arg)
{
    int lfd = *(int *)arg;
    while (!stop_server) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        serve(fd);
        close(fd);
    }
    return NULL;
}

static const char *url(const char *path)
{
    static char u[4][128];
    static int i;
    i = (i + 1) % 4;
    snprintf(u[i], sizeof(u[i]), "http://127.0.0.1:%d%s", port, path);
    return u[i];
}

/* ---- tests */

static void test_paths(void)
{
    char out[4096], err[256];
    CHECK_EQ_INT(fetch_resolve("a.xlsx", root, out, sizeof(out), err, sizeof(err)), QN_OK);
    CHECK(strstr(out, "/root/a.xlsx") != NULL);
    CHECK_EQ_INT(fetch_resolve("sub/b.csv", root, out, sizeof(out), err, sizeof(err)), QN_OK);
    char abs[600];
    snprintf(abs, sizeof(abs), "%s/sub/b.csv", root);
    CHECK_EQ_INT(fetch_resolve(abs, root, out, sizeof(out), err, sizeof(err)), QN_OK);
    /* a symlink that stays inside the root is fine; its target is what comes back */
    CHECK_EQ_INT(fetch_resolve("inlink.csv", root, out, sizeof(out), err, sizeof(err)), QN_OK);
    CHECK(strstr(out, "/root/sub/b.csv") != NULL);
    CHECK_EQ_INT(fetch_check_address("sub/b.csv", root, err, sizeof(err)), QN_OK);

    struct {
        const char *addr;
        const char *why;
    } refused[] = {
        {"../outside.csv", "\"..\""},  {"sub/../a.xlsx", "\"..\""},
        {"outlink.csv", "outside"}, /* symlink escape */
        {"sub", "not a regular file"}, {"missing.csv", "no such file"},
        {"/etc/passwd", "outside"},    {"", "empty"},
        {"a\n.xlsx", "control"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        err[0] = '\0';
        qn_status st = fetch_resolve(refused[i].addr, root, out, sizeof(out), err, sizeof(err));
        CHECK_EQ_INT(st, QN_EINVAL);
        CHECK_EQ_INT(fetch_check_address(refused[i].addr, root, err, sizeof(err)), QN_EINVAL);
        if (!strstr(err, refused[i].why)) {
            printf("  %s: \"%s\" lacks \"%s\"\n", refused[i].addr, err, refused[i].why);
            CHECK(0);
        }
    }
    /* no root configured: no path at all */
    CHECK_EQ_INT(fetch_resolve("a.xlsx", "", out, sizeof(out), err, sizeof(err)), QN_EINVAL);
    CHECK(strstr(err, "not allowed") != NULL);
    CHECK_EQ_INT(fetch_check_address(abs, NULL, err, sizeof(err)), QN_EINVAL);
}

static void test_schemes(void)
{
    char out[4096], err[256];
    CHECK_EQ_INT(
        fetch_check_address("https://files.example.com/a.xlsx?sig=1", root, err, sizeof(err)),
        QN_OK);
    CHECK_EQ_INT(fetch_check_address("HTTP://files.example.com/a.xlsx", root, err, sizeof(err)),
                 QN_OK);
    CHECK(fetch_is_url("http://x/y"));
    CHECK(!fetch_is_url("dir/http://x"));
    const char *bad[] = {"ftp://127.0.0.1/a.xlsx", "file:///etc/passwd", "gopher://x/",
                         "http:///nohost",         "https://",           "http://exa mple.com/a"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        CHECK_EQ_INT(fetch_check_address(bad[i], root, err, sizeof(err)), QN_EINVAL);
        CHECK(err[0] != '\0');
        CHECK_EQ_INT(fetch_resolve(bad[i], root, out, sizeof(out), err, sizeof(err)), QN_EINVAL);
    }
    CHECK_EQ_INT(fetch_check_address("ftp://127.0.0.1/a.xlsx", root, err, sizeof(err)), QN_EINVAL);
    CHECK(strstr(err, "http or https only") != NULL);
}

static int tmp_leftovers(const char *tmp)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls %s | grep -c quan-fetch", tmp);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

static void test_download(void)
{
    char out[4096], err[256], tmp[400];
    snprintf(tmp, sizeof(tmp), "%s/tmp", dir);
    fetch_limits lim = {.max_bytes = 64 * 1024, .timeout_ms = 800, .tmp_dir = tmp};

    /* The test server is on 127.0.0.1: refused unless internal addresses are allowed (SSRF),
     * also as ::1, as an IPv4-mapped address, and behind a name that resolves to it. */
    const char *internal[] = {url("/list.csv"),          "http://localhost:1/x.csv",
                              "http://[::1]:1/x.csv",    "http://[::ffff:127.0.0.1]:1/x.csv",
                              "http://10.1.2.3:1/x.csv", "http://169.254.169.254/latest/meta-data/",
                              "http://0.0.0.0:1/x.csv"};
    for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++) {
        CHECK_EQ_INT(fetch_resolve_opt(internal[i], root, &lim, out, sizeof(out), err, sizeof(err)),
                     QN_EINVAL);
        CHECK(strstr(err, "internal address") != NULL);
    }
    lim.allow_internal = 1;

    CHECK_EQ_INT(
        fetch_resolve_opt(url("/list.csv"), root, &lim, out, sizeof(out), err, sizeof(err)), QN_OK);
    CHECK(strncmp(out, tmp, strlen(tmp)) == 0);
    CHECK(strstr(out, ".csv") != NULL);
    struct stat sb;
    CHECK(stat(out, &sb) == 0 && (size_t)sb.st_size == sizeof(csv_body) - 1);
    /* what was downloaded reads as a sheet */
    sheet *s = sheet_open(out, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        CHECK_EQ_INT(sheet_header_index(s, "邮箱"), 2);
        sheet_row row;
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555585");
        sheet_free(s);
    }
    unlink(out); /* the caller's job */

    /* an http redirect is followed */
    CHECK_EQ_INT(fetch_resolve_opt(url("/to-list"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_OK);
    unlink(out);

    /* size limit, with and without Content-Length */
    CHECK_EQ_INT(fetch_resolve_opt(url("/big"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_EINVAL);
    CHECK(strstr(err, "larger than the limit") != NULL);
    CHECK_EQ_INT(
        fetch_resolve_opt(url("/big-unsized"), root, &lim, out, sizeof(out), err, sizeof(err)),
        QN_EINVAL);
    CHECK(strstr(err, "larger than the limit") != NULL);

    /* redirects to other protocols are refused */
    CHECK_EQ_INT(fetch_resolve_opt(url("/to-ftp"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_EINVAL);
    CHECK(strstr(err, "redirect") != NULL);
    CHECK_EQ_INT(fetch_resolve_opt(url("/to-file"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_EINVAL);

    /* HTTP errors: a 4xx will not change (permanent), a 5xx may (worth retrying) */
    CHECK_EQ_INT(fetch_resolve_opt(url("/nope"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_EINVAL);
    CHECK(strstr(err, "404") != NULL);
    CHECK_EQ_INT(fetch_resolve_opt(url("/busy"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_EAGAIN);
    CHECK(strstr(err, "503") != NULL);

    /* total timeout: the server stalls after 4 bytes */
    double t0 = now_mono_s();
    CHECK_EQ_INT(fetch_resolve_opt(url("/slow"), root, &lim, out, sizeof(out), err, sizeof(err)),
                 QN_ETIMEDOUT);
    double secs = now_mono_s() - t0;
    CHECK(secs >= 0.7 && secs < 3.0);
    CHECK(strstr(err, "timed out") != NULL);

    /* nothing listening */
    char dead[64];
    snprintf(dead, sizeof(dead), "http://127.0.0.1:1/x.csv");
    CHECK_EQ_INT(fetch_resolve_opt(dead, root, &lim, out, sizeof(out), err, sizeof(err)), QN_ERR);

    CHECK_EQ_INT(tmp_leftovers(tmp), 0); /* failures leave no temporary file */
}

/* The host check at task creation: names resolved like the download's, internal ones refused,
 * no connection made, bounded in time. */
static void test_check_host(void)
{
    char err[256];
    fetch_limits lim = {.connect_timeout_ms = 1500};
    const char *internal[] = {url("/list.csv"),
                              "http://127.0.0.1:1/x.xlsx",
                              "http://localhost:1/x.csv",
                              "http://[::1]:1/x.csv",
                              "http://[::ffff:127.0.0.1]:1/x.csv",
                              "http://10.1.2.3/x.csv",
                              "https://169.254.169.254/latest/meta-data/",
                              "http://0x7f000001/x.csv"};
    for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++) {
        err[0] = '\0';
        double t0 = now_mono_s();
        CHECK_EQ_INT(fetch_check_host(internal[i], &lim, err, sizeof(err)), QN_EINVAL);
        if (!strstr(err, "fileAddress: the host is an internal address")) {
            printf("  %s: \"%s\"\n", internal[i], err);
            CHECK(0);
        }
        CHECK(now_mono_s() - t0 < 1.0);
    }
    /* a public address passes: noted, never connected to (this machine may have no route) */
    double t0 = now_mono_s();
    CHECK_EQ_INT(fetch_check_host("http://93.184.215.14:81/x.xlsx", &lim, err, sizeof(err)), QN_OK);
    CHECK(now_mono_s() - t0 < 1.0);
    /* a name that does not resolve: refused, or not checkable now; never past the bound */
    t0 = now_mono_s();
    qn_status st = fetch_check_host("http://no-such-host.invalid/x.xlsx", &lim, err, sizeof(err));
    printf("  no-such-host.invalid: %s (%s) in %.2fs\n", qn_status_str(st), err, now_mono_s() - t0);
    CHECK(st == QN_EINVAL || st == QN_ETIMEDOUT || st == QN_ERR);
    CHECK(strncmp(err, "fileAddress: ", 13) == 0);
    CHECK(now_mono_s() - t0 < 3.0);
    /* not a URL: nothing to resolve; a bad URL: refused as by fetch_check_address */
    CHECK_EQ_INT(fetch_check_host("a.xlsx", &lim, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(fetch_check_host("ftp://127.0.0.1/a.xlsx", &lim, err, sizeof(err)), QN_EINVAL);
    /* allowed: no check at all */
    lim.allow_internal = 1;
    for (size_t i = 0; i < sizeof(internal) / sizeof(internal[0]); i++)
        CHECK_EQ_INT(fetch_check_host(internal[i], &lim, err, sizeof(err)), QN_OK);
}

int main(void)
{
    /* The test server is on loopback: no proxy from the environment. */
    unsetenv("http_proxy"), unsetenv("HTTP_PROXY"), unsetenv("all_proxy"), unsetenv("ALL_PROXY");
    th_tmpdir(dir, sizeof(dir), "fetch-test");
    snprintf(root, sizeof(root), "%s/root", dir);
    char p[700], q[700];
    mkdir(root, 0755);
    snprintf(p, sizeof(p), "%s/sub", root);
    mkdir(p, 0755);
    snprintf(p, sizeof(p), "%s/tmp", dir);
    mkdir(p, 0755);
    put("root/a.xlsx", "not really");
    put("root/sub/b.csv", "h\n1\n");
    put("outside.csv", "secret\n");
    snprintf(p, sizeof(p), "%s/outlink.csv", root);
    snprintf(q, sizeof(q), "%s/outside.csv", dir);
    if (symlink(q, p) != 0)
        printf("  symlink failed\n");
    snprintf(p, sizeof(p), "%s/inlink.csv", root);
    if (symlink("sub/b.csv", p) != 0)
        printf("  symlink failed\n");

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 16) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        printf("cannot listen\n0 passed, 1 failed\n");
        return 1;
    }
    port = ntohs(sa.sin_port);
    pthread_t th;
    pthread_create(&th, NULL, server_main, &lfd);

    RUN(test_paths);
    RUN(test_schemes);
    RUN(test_download);
    RUN(test_check_host);

    stop_server = 1;
    pthread_join(th, NULL);
    close(lfd);
    th_rmtree(dir);
    TEST_MAIN_END();
}
