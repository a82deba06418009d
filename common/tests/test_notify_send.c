/* The sender against real local peers: an HTTP server whose path chooses its answer, and an
 * SMTP sink whose recipients choose theirs (both one connection at a time, on threads). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "notify_send.h"
#include "now.h"
#include "testhelp.h"

static atomic_int stop_servers;
static int http_port, smtp_port, closed_port;

/* What the peers saw, under lock. */
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static int http_requests, smtp_sessions;
static char http_last[8192];
static char smtp_from[512], smtp_rcpt[1024], smtp_data[16384];

static void send_str(int fd, const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

/* Waits (at most 10 s) until the client closes: a peer that never answers. */
static void hang(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char b[256];
    for (int i = 0; i < 100 && !stop_servers; i++)
        if (poll(&p, 1, 100) > 0 && recv(fd, b, sizeof(b), 0) <= 0)
            return;
}

/* One line of at most cap-1 bytes (CRLF kept); 0 at EOF. */
static size_t read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n < cap - 1) {
        char c;
        if (recv(fd, &c, 1, 0) != 1)
            break;
        buf[n++] = c;
        if (c == '\n')
            break;
    }
    buf[n] = '\0';
    return n;
}

/* ---------------------------------------------------------------- HTTP peer */

/* POST /status/<code>: answers that code; /hang: never answers. Records the whole request. */
static void http_serve(int fd)
{
    char req[8192] = "";
    size_t n = 0, want = 0;
    char *end = NULL;

    while (n < sizeof(req) - 1) {
        ssize_t r = recv(fd, req + n, sizeof(req) - 1 - n, 0);
        if (r <= 0)
            return;
        n += (size_t)r;
        req[n] = '\0';
        if (!end && (end = strstr(req, "\r\n\r\n"))) {
            const char *cl = strcasestr(req, "Content-Length:");
            want = (size_t)(end + 4 - req) + (cl ? strtoul(cl + 15, NULL, 10) : 0);
        }
        if (end && n >= want)
            break;
    }
    pthread_mutex_lock(&seen_mu);
    http_requests++;
    snprintf(http_last, sizeof(http_last), "%s", req);
    pthread_mutex_unlock(&seen_mu);
    int code = 0;
    if (strncmp(req, "POST /hang ", 11) == 0) {
        hang(fd);
        return;
    }
    if (sscanf(req, "POST /status/%d ", &code) != 1)
        code = 404;
    char out[256];
    snprintf(out, sizeof(out),
             "HTTP/1.1 %d X\r\n%sContent-Length: 2\r\nConnection: close\r\n\r\nok", code,
             code == 302 ? "Location: /status/200\r\n" : "");
    send_str(fd, out);
}

/* ---------------------------------------------------------------- SMTP peer */

/* A recipient containing "reject" gets 550, "later" 451, "hang" no answer at all. EHLO
 * advertises AUTH, which always fails (535). DATA is recorded with the dots unstuffed. */
static void smtp_serve(int fd)
{
    char line[1024];
    char from[512] = "", rcpt[1024] = "";

    pthread_mutex_lock(&seen_mu);
    smtp_sessions++;
    pthread_mutex_unlock(&seen_mu);
    send_str(fd, "220 sink ESMTP\r\n");
    while (read_line(fd, line, sizeof(line)) > 0) {
        if (!strncasecmp(line, "EHLO", 4)) {
            send_str(fd, "250-sink\r\n250 AUTH PLAIN LOGIN\r\n");
        } else if (!strncasecmp(line, "HELO", 4)) {
            send_str(fd, "250 sink\r\n");
        } else if (!strncasecmp(line, "AUTH", 4)) {
            send_str(fd, "535 5.7.8 authentication failed\r\n");
        } else if (!strncasecmp(line, "MAIL FROM:", 10)) {
            snprintf(from, sizeof(from), "%.*s", (int)strcspn(line + 10, "\r\n"), line + 10);
            rcpt[0] = '\0';
            send_str(fd, "250 ok\r\n");
        } else if (!strncasecmp(line, "RCPT TO:", 8)) {
            if (strstr(line, "hang")) {
                hang(fd);
                return;
            }
            if (strstr(line, "reject")) {
                send_str(fd, "550 5.1.1 no such user\r\n");
                continue;
            }
            if (strstr(line, "later")) {
                send_str(fd, "451 4.3.0 try again later\r\n");
                continue;
            }
            size_t k = strlen(rcpt);
            snprintf(rcpt + k, sizeof(rcpt) - k, "%s%.*s", k ? " " : "",
                     (int)strcspn(line + 8, "\r\n"), line + 8);
            send_str(fd, "250 ok\r\n");
        } else if (!strncasecmp(line, "DATA", 4)) {
            char data[16384] = "";
            size_t k = 0;
            send_str(fd, "354 go on\r\n");
            while (read_line(fd, line, sizeof(line)) > 0 && strcmp(line, ".\r\n") != 0) {
                const char *l = line[0] == '.' ? line + 1 : line; /* unstuff */
                k += (size_t)snprintf(data + k, sizeof(data) - k, "%s", l);
                if (k >= sizeof(data))
                    k = sizeof(data) - 1;
            }
            pthread_mutex_lock(&seen_mu);
            snprintf(smtp_from, sizeof(smtp_from), "%s", from);
            snprintf(smtp_rcpt, sizeof(smtp_rcpt), "%s", rcpt);
            snprintf(smtp_data, sizeof(smtp_data), "%s", data);
            pthread_mutex_unlock(&seen_mu);
            send_str(fd, "250 queued\r\n");
        } else if (!strncasecmp(line, "QUIT", 4)) {
            send_str(fd, "221 bye\r\n");
            return;
        } else {
            send_str(fd, "250 ok\r\n");
        }
    }
}

typedef struct peer {
    int lfd;
    void (*serve)(int fd);
} peer;

static void *peer_main(void *arg)
{
    peer *p = arg;
    while (!stop_servers) {
        struct pollfd pf = {.fd = p->lfd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        int fd = accept(p->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        p->serve(fd);
        close(fd);
    }
    return NULL;
}

/* A loopback socket bound to a free port (listening if asked); its port in *port. */
static int bind_local(int *port, int do_listen)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        (do_listen && listen(fd, 16) != 0) || getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        printf("cannot bind a local socket\n0 passed, 1 failed\n");
        exit(1);
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

/* before + "127.0.0.1:<port>" + after */
static const char *url(const char *before, int port, const char *after)
{
    static char u[4][256];
    static int i;
    i = (i + 1) % 4;
    snprintf(u[i], sizeof(u[i]), "%s127.0.0.1:%d%s", before, port, after);
    return u[i];
}

static int seen(int *counter)
{
    pthread_mutex_lock(&seen_mu);
    int n = *counter;
    pthread_mutex_unlock(&seen_mu);
    return n;
}

/* ---------------------------------------------------------------- webhook */

static void test_webhook_delivered(void)
{
    char err[NOTIFY_SEND_ERR_LEN] = "";
    const char *json = "{\"channel\":\"app\",\"userIds\":[\"1\",\"2\"]}";
    CHECK_EQ_INT(
        notify_send_webhook(url("http://", http_port, "/status/200"), json, 2000, err, sizeof(err)),
        QN_OK);
    pthread_mutex_lock(&seen_mu);
    CHECK(strncmp(http_last, "POST /status/200 HTTP/1.1\r\n", 27) == 0);
    CHECK(strcasestr(http_last, "\r\nContent-Type: application/json\r\n") != NULL);
    const char *body = strstr(http_last, "\r\n\r\n");
    CHECK(body && strcmp(body + 4, json) == 0);
    pthread_mutex_unlock(&seen_mu);
    CHECK_EQ_INT(
        notify_send_webhook(url("http://", http_port, "/status/204"), "{}", 2000, err, sizeof(err)),
        QN_OK);
}

static void test_webhook_statuses(void)
{
    static const struct {
        int code;
        qn_status st;
    } cases[] = {{500, QN_EAGAIN}, {503, QN_EAGAIN}, {408, QN_EAGAIN}, {429, QN_EAGAIN},
                 {400, QN_EINVAL}, {404, QN_EINVAL}, {422, QN_EINVAL}, {302, QN_EINVAL}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[NOTIFY_SEND_ERR_LEN] = "", want[64];
        char path[64];
        int before = seen(&http_requests);
        snprintf(path, sizeof(path), "/status/%d", cases[i].code);
        qn_status st =
            notify_send_webhook(url("http://", http_port, path), "{}", 2000, err, sizeof(err));
        CHECK_EQ_INT(st, cases[i].st);
        CHECK_EQ_INT(notify_send_retryable(st), cases[i].st != QN_EINVAL);
        snprintf(want, sizeof(want), "webhook: HTTP %d", cases[i].code);
        CHECK_EQ_STR(err, want);
        CHECK_EQ_INT(seen(&http_requests), before + 1); /* a redirect is not followed */
    }
    CHECK_EQ_INT(notify_send_retryable(QN_OK), 0);
}

static void test_webhook_unreachable_and_timeout(void)
{
    char err[NOTIFY_SEND_ERR_LEN] = "";
    qn_status st =
        notify_send_webhook(url("http://", closed_port, "/x"), "{}", 2000, err, sizeof(err));
    CHECK_EQ_INT(st, QN_EAGAIN);
    CHECK(notify_send_retryable(st));
    CHECK(strncmp(err, "webhook: ", 9) == 0 && strlen(err) > 9);

    double t0 = now_mono_s();
    st = notify_send_webhook(url("http://", http_port, "/hang"), "{}", 300, err, sizeof(err));
    CHECK_EQ_INT(st, QN_ETIMEDOUT);
    CHECK(notify_send_retryable(st));
    CHECK(now_mono_s() - t0 < 3.0);
}

static void test_webhook_bad_urls(void)
{
    static const char *const bad[] = {"",
                                      "not a url",
                                      "ftp://127.0.0.1/x",
                                      "file:///etc/passwd",
                                      "smtp://127.0.0.1:25",
                                      "http://",
                                      "http:///path",
                                      "http://127.0.0.1/a\r\nX-Injected: 1"};
    int before = seen(&http_requests);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[NOTIFY_SEND_ERR_LEN] = "";
        CHECK_EQ_INT(notify_send_webhook(bad[i], "{}", 1000, err, sizeof(err)), QN_EINVAL);
        CHECK(strncmp(err, "webhook: ", 9) == 0);
        CHECK(!*bad[i] || !strstr(err, bad[i]));
    }
    char err[NOTIFY_SEND_ERR_LEN] = "";
    CHECK_EQ_INT(notify_send_webhook(NULL, "{}", 1000, err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "webhook: no URL configured");
    CHECK_EQ_INT(
        notify_send_webhook(url("http://", http_port, "/status/200"), NULL, 1000, err, sizeof(err)),
        QN_EINVAL);
    CHECK_EQ_INT(seen(&http_requests), before);
}

static void test_webhook_credentials_not_in_errors(void)
{
    char err[NOTIFY_SEND_ERR_LEN] = "";
    qn_status st =
        notify_send_webhook(url("http://hookuser:Hunter2%21pw@", closed_port, "/x?token=tok3n"),
                            "{}", 1000, err, sizeof(err));
    CHECK_EQ_INT(st, QN_EAGAIN);
    CHECK(!strstr(err, "Hunter2") && !strstr(err, "tok3n") && !strstr(err, "hookuser"));
}

/* ---------------------------------------------------------------- mail */

static notify_send_msg mail_to(const char *const *to)
{
    return (notify_send_msg){.smtp_url = url("smtp://", smtp_port, ""),
                             .from = "quan@quan.test",
                             .to = to,
                             .subject = "Your coupon",
                             .body = "Hello.\n.\n..two dots\nlast line",
                             .msg_id = "task.notify:1:2:3@quan",
                             .timeout_ms = 2000};
}

static void test_mail_delivered(void)
{
    const char *to[] = {"a@users.test", "b.c+d@users.test", NULL};
    notify_send_msg m = mail_to(to);
    char err[NOTIFY_SEND_ERR_LEN] = "";
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_OK);
    pthread_mutex_lock(&seen_mu);
    CHECK_EQ_STR(smtp_from, "<quan@quan.test>");
    CHECK_EQ_STR(smtp_rcpt, "<a@users.test> <b.c+d@users.test>");
    static const char head[] = "From: <quan@quan.test>\r\nTo: <a@users.test>, "
                               "<b.c+d@users.test>\r\nSubject: Your coupon\r\nDate: ";
    CHECK(strncmp(smtp_data, head, sizeof(head) - 1) == 0);
    CHECK(strstr(smtp_data, "\r\nMessage-ID: <task.notify:1:2:3@quan>\r\n") != NULL);
    CHECK(strstr(smtp_data, "\r\nContent-Type: text/plain; charset=utf-8\r\n") != NULL);
    /* every line ends in CRLF, and the dots came through (stuffed by libcurl, unstuffed here) */
    const char *body = strstr(smtp_data, "\r\n\r\n");
    CHECK(body && strcmp(body + 4, "Hello.\r\n.\r\n..two dots\r\nlast line\r\n") == 0);
    pthread_mutex_unlock(&seen_mu);
}

static void test_mail_subject_encoded(void)
{
    const char *to[] = {"a@users.test", NULL};
    notify_send_msg m = mail_to(to);
    char err[NOTIFY_SEND_ERR_LEN] = "";
    /* two bytes then 30 three-byte characters: three encoded words, never split inside one */
    const char *subject = "A 优惠券到账优惠券到账优惠券到账优惠券到账优惠券到账优惠券到账";
    m.subject = subject;
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_OK);
    pthread_mutex_lock(&seen_mu);
    char decoded[256] = "";
    size_t k = 0;
    const char *p = strstr(smtp_data, "\r\nSubject: ");
    CHECK(p != NULL);
    for (p = p ? p + 11 : "";
         (p = strstr(p, "=?UTF-8?B?")) && p < strstr(smtp_data, "\r\nDate:");) {
        p += 10;
        const char *e = strstr(p, "?=");
        unsigned char out[128];
        int n = e ? EVP_DecodeBlock(out, (const unsigned char *)p, (int)(e - p)) : -1;
        while (n > 0 && e[-1] == '=' && out[n - 1] == 0) /* EVP counts the padding */
            n--, e--;
        if (n > 0 && k + (size_t)n < sizeof(decoded)) {
            memcpy(decoded + k, out, (size_t)n);
            k += (size_t)n;
        }
    }
    decoded[k] = '\0';
    CHECK_EQ_STR(decoded, subject);
    CHECK(strstr(smtp_data, "?=\r\n =?UTF-8?B?") != NULL); /* folded between words */
    pthread_mutex_unlock(&seen_mu);

    /* line breaks in a subject never start a header of their own */
    m.subject = "Hi\r\nBcc: victim@users.test";
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_OK);
    pthread_mutex_lock(&seen_mu);
    CHECK(strstr(smtp_data, "\r\nSubject: Hi  Bcc: victim@users.test\r\n") != NULL);
    CHECK(strstr(smtp_data, "\r\nBcc:") == NULL);
    pthread_mutex_unlock(&seen_mu);

    /* past NOTIFY_SEND_SUBJECT_MAX bytes the subject is cut */
    char longer[NOTIFY_SEND_SUBJECT_MAX + 100];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = '\0';
    m.subject = longer;
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_OK);
    pthread_mutex_lock(&seen_mu);
    p = strstr(smtp_data, "\r\nSubject: ");
    CHECK(p && strcspn(p + 11, "\r") == NOTIFY_SEND_SUBJECT_MAX);
    pthread_mutex_unlock(&seen_mu);
}

static void test_mail_refusals(void)
{
    static const struct {
        const char *rcpt;
        qn_status st;
    } cases[] = {{"reject@users.test", QN_EINVAL}, {"later@users.test", QN_EAGAIN}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *to[] = {"ok@users.test", cases[i].rcpt, NULL};
        notify_send_msg m = mail_to(to);
        char err[NOTIFY_SEND_ERR_LEN] = "";
        qn_status st = notify_send_mail(&m, err, sizeof(err));
        CHECK_EQ_INT(st, cases[i].st);
        CHECK(strncmp(err, "smtp: ", 6) == 0);
        CHECK(strstr(err, cases[i].st == QN_EINVAL ? "550" : "451") != NULL);
    }

    const char *to[] = {"a@users.test", NULL};
    notify_send_msg m = mail_to(to);
    char err[NOTIFY_SEND_ERR_LEN] = "";
    m.smtp_url = url("smtp://", closed_port, "");
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EAGAIN);

    const char *hung[] = {"hang@users.test", NULL};
    m = mail_to(hung);
    m.timeout_ms = 300;
    double t0 = now_mono_s();
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_ETIMEDOUT);
    CHECK(now_mono_s() - t0 < 3.0);
}

static void test_mail_bad_input_sends_nothing(void)
{
    static const char *const bad[] = {"",
                                      "no-at",
                                      "@users.test",
                                      "a@",
                                      "a b@users.test",
                                      "<a@users.test>",
                                      "a@b@c",
                                      "a@users.test\r\nRCPT TO:<x@y>",
                                      "a,b@users.test",
                                      "ü@users.test"};
    int before = seen(&smtp_sessions);
    char err[NOTIFY_SEND_ERR_LEN] = "";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(!notify_send_address_ok(bad[i]));
        const char *to[] = {"ok@users.test", bad[i], NULL};
        notify_send_msg m = mail_to(to);
        CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
        CHECK_EQ_STR(err, "smtp: recipient 2 is malformed");
        to[1] = NULL;
        m.from = bad[i];
        CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
        CHECK_EQ_STR(err, "smtp: the sender address is malformed");
    }
    CHECK(notify_send_address_ok("quan@localhost"));
    CHECK(notify_send_address_ok("first.last+tag@sub.example.com"));

    const char *none[] = {NULL};
    notify_send_msg m = mail_to(none);
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "smtp: no recipient");
    const char *to[] = {"a@users.test", NULL};
    m = mail_to(to);
    m.msg_id = "x>\r\nBcc: y";
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
    m = mail_to(to);
    m.smtp_url = url("http://", smtp_port, "");
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
    m.smtp_url = "";
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "smtp: no URL configured");
    CHECK_EQ_INT(seen(&smtp_sessions), before);
}

static void test_mail_password_never_in_errors(void)
{
    const char *to[] = {"a@users.test", NULL};
    notify_send_msg m = mail_to(to);
    char err[NOTIFY_SEND_ERR_LEN] = "";
    /* the sink advertises AUTH and refuses every login */
    m.smtp_url = url("smtp://mailer:S3cret%2Fpass@", smtp_port, "");
    qn_status st = notify_send_mail(&m, err, sizeof(err));
    CHECK_EQ_INT(st, QN_EINVAL);
    CHECK(!notify_send_retryable(st));
    CHECK(strncmp(err, "smtp: ", 6) == 0);
    CHECK(!strstr(err, "S3cret") && !strstr(err, "pass") && !strstr(err, "mailer"));
    m.smtp_url = url("smtps://mailer:S3cret%2Fpass@", closed_port, "");
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EAGAIN);
    CHECK(!strstr(err, "S3cret") && !strstr(err, "mailer"));
    /* libcurl's own words, were they the password: masked, and cut where a message ends in
     * the password's beginning */
    m.smtp_url = url("smtp://mailer:connect@", closed_port, "");
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EAGAIN);
    CHECK(!strstr(err, "connect") && strstr(err, "***"));
    m.smtp_url = url("smtp://mailer:server%2Fx@", closed_port, "");
    CHECK_EQ_INT(notify_send_mail(&m, err, sizeof(err)), QN_EAGAIN);
    CHECK(!strstr(err, "server"));
}

/* The mail relay's rows, as both binaries declare them: what they accept at start, and that a
 * refusal names the variable without showing the URL's password. */
typedef struct smtp_settings {
    const char *smtp_url, *smtp_from;
} smtp_settings;

static void test_smtp_settings(void)
{
    static const config_var vars[] = {NOTIFY_SEND_SMTP_CONFIG_VARS(smtp_settings)};
    static const struct {
        const char *url, *from;
        const char *want; /* the error's start; NULL: accepted */
    } v[] = {
        {"", "quan@localhost", NULL}, /* the defaults: no mail */
        {"smtp://127.0.0.1:25", "coupons@quan.test", NULL},
        {"smtps://mailer:Pw-Secret-9@relay.example:465", "a@b.c", NULL},
        {"http://relay.example:25", "a@b.c", "QUAN_SMTP_URL: smtp: scheme http is not allowed"},
        {"smtp://mailer:Pw-Secret-9@", "a@b.c", "QUAN_SMTP_URL: smtp: the URL is malformed"},
        {"relay.example:25", "a@b.c", "QUAN_SMTP_URL: smtp: the URL is malformed"},
        {"smtp://relay example:25", "a@b.c", "QUAN_SMTP_URL: smtp: the URL contains a space"},
        {"smtp://relay.example:25", "coupons", "QUAN_SMTP_FROM: not a mail address"},
        {"smtp://relay.example:25", "Coupons <c@quan.test>", "QUAN_SMTP_FROM: not a mail address"},
        {"smtp://relay.example:25", "a@b@c", "QUAN_SMTP_FROM: not a mail address"},
        {"smtp://relay.example:25", "@b", "QUAN_SMTP_FROM: not a mail address"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        smtp_settings out = {0};
        char err[256] = "";
        setenv("QUAN_SMTP_URL", v[i].url, 1);
        setenv("QUAN_SMTP_FROM", v[i].from, 1);
        qn_status st = config_load(vars, sizeof(vars) / sizeof(vars[0]), &out, err, sizeof(err));
        if ((st == QN_OK) != !v[i].want ||
            (v[i].want && strncmp(err, v[i].want, strlen(v[i].want))))
            printf("  case %zu (%s, %s): %s \"%s\"\n", i, v[i].url, v[i].from, qn_status_str(st),
                   err);
        CHECK_EQ_INT(st == QN_OK, v[i].want == NULL);
        if (v[i].want)
            CHECK(strncmp(err, v[i].want, strlen(v[i].want)) == 0);
        else
            CHECK_EQ_STR(out.smtp_from, v[i].from);
        CHECK(!strstr(err, "Pw-Secret"));
        config_free(vars, sizeof(vars) / sizeof(vars[0]), &out);
    }
    unsetenv("QUAN_SMTP_URL");
    unsetenv("QUAN_SMTP_FROM");
}

int main(void)
{
    peer http = {bind_local(&http_port, 1), http_serve};
    peer smtp = {bind_local(&smtp_port, 1), smtp_serve};
    int cfd = bind_local(&closed_port, 0); /* bound, never listening: connections are refused */
    pthread_t th[2];
    pthread_create(&th[0], NULL, peer_main, &http);
    pthread_create(&th[1], NULL, peer_main, &smtp);

    RUN(test_webhook_delivered);
    RUN(test_webhook_statuses);
    RUN(test_webhook_unreachable_and_timeout);
    RUN(test_webhook_bad_urls);
    RUN(test_webhook_credentials_not_in_errors);
    RUN(test_mail_delivered);
    RUN(test_mail_subject_encoded);
    RUN(test_mail_refusals);
    RUN(test_mail_bad_input_sends_nothing);
    RUN(test_mail_password_never_in_errors);
    RUN(test_smtp_settings);

    stop_servers = 1;
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    close(http.lfd);
    close(smtp.lfd);
    close(cfd);
    TEST_MAIN_END();
}
