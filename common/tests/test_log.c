/* log.c: lines are JSON as before the hand-written formatting (numbers, escapes, messages with
 * and without arguments); buffered info lines wait for log_flush, and a warning writes them
 * first, then itself, so the order holds; a limited line goes out once per interval, with the
 * count of those held back; a pipe that is full gets whole lines, never waits, and drops what
 * finds the buffer full; a socket written by four threads at once gets every line whole, in
 * order. stdout is redirected to a temporary file, a pipe or a socket. */
#include <cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "testhelp.h"

static th_capture capture;

static void capture_start(void)
{
    capture = th_capture_start();
}

/* What was written since capture_start (caller frees); stdout is restored. */
static char *capture_end(void)
{
    return th_capture_end(capture);
}

/* Bytes written so far, without ending the capture. */
static size_t captured_len(void)
{
    return (size_t)lseek(STDOUT_FILENO, 0, SEEK_CUR);
}

static void test_numbers(void)
{
    char b[24];
    CHECK_EQ_INT(log_i64_str(b, 0), 1);
    CHECK_EQ_STR(b, "0");
    log_i64_str(b, -42);
    CHECK_EQ_STR(b, "-42");
    log_i64_str(b, INT64_MAX);
    CHECK_EQ_STR(b, "9223372036854775807");
    log_i64_str(b, INT64_MIN);
    CHECK_EQ_STR(b, "-9223372036854775808");
}

static void test_line(void)
{
    log_init("svc", LOGL_INFO);
    capture_start();
    log_ctx ctx = {.request_id = "r1", .trace_id = NULL};
    log_infof(
        &ctx,
        ((log_field[]){LOG_S("path", "/a\"b\n"), LOG_I("n", -7), LOG_I("big", INT64_MIN), LOG_END}),
        "request");
    log_warn(NULL, "100%% of %d", 3);
    char *out = capture_end();
    CHECK(out != NULL);
    char *nl = out ? strchr(out, '\n') : NULL;
    CHECK(nl != NULL);
    if (!nl) {
        free(out);
        return;
    }
    *nl = '\0';
    cJSON *a = cJSON_Parse(out), *b = cJSON_Parse(nl + 1);
    CHECK(a && b);
    if (a && b) {
        const char *ts = cJSON_GetObjectItem(a, "ts")->valuestring;
        CHECK(strlen(ts) == 24 && ts[10] == 'T' && ts[19] == '.' && ts[23] == 'Z');
        CHECK_EQ_STR(cJSON_GetObjectItem(a, "level")->valuestring, "info");
        CHECK_EQ_STR(cJSON_GetObjectItem(a, "service")->valuestring, "svc");
        CHECK_EQ_STR(cJSON_GetObjectItem(a, "msg")->valuestring, "request");
        CHECK_EQ_STR(cJSON_GetObjectItem(a, "request_id")->valuestring, "r1");
        CHECK(cJSON_GetObjectItem(a, "trace_id") == NULL);
        CHECK_EQ_STR(cJSON_GetObjectItem(a, "path")->valuestring, "/a\"b\n");
        CHECK(cJSON_GetObjectItem(a, "n")->valuedouble == -7);
        CHECK(strstr(out, "\"big\":-9223372036854775808}") != NULL);
        CHECK_EQ_STR(cJSON_GetObjectItem(b, "level")->valuestring, "warn");
        CHECK_EQ_STR(cJSON_GetObjectItem(b, "msg")->valuestring, "100% of 3");
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
    free(out);
}

static void test_buffered(void)
{
    log_init("svc", LOGL_INFO);
    capture_start();
    log_buffer_start(0);
    log_info(NULL, "one");
    log_info(NULL, "two");
    CHECK_EQ_INT(captured_len(), 0); /* buffered */
    log_flush();
    size_t after_flush = captured_len();
    CHECK(after_flush > 0);
    log_info(NULL, "three");
    CHECK_EQ_INT(captured_len(), after_flush);
    log_warn(NULL, "four"); /* writes "three" first */
    log_debug(NULL, "not logged at info");
    for (int i = 0; i < 2000; i++) /* more than the buffer holds: written as it fills */
        log_info(NULL, "filler %d", i);
    CHECK(captured_len() > 64 * 1024 / 2);
    log_buffer_stop();      /* flushes the rest */
    log_info(NULL, "five"); /* unbuffered again */
    char *out = capture_end();
    CHECK(out != NULL);
    if (!out)
        return;
    const char *p1 = strstr(out, "\"one\""), *p2 = strstr(out, "\"two\""),
               *p3 = strstr(out, "\"three\""), *p4 = strstr(out, "\"four\""),
               *p5 = strstr(out, "\"five\""), *last = strstr(out, "\"filler 1999\"");
    CHECK(p1 && p2 && p3 && p4 && p5 && last);
    CHECK(p1 < p2 && p2 < p3 && p3 < p4 && p4 < last && last < p5);
    CHECK(strstr(out, "not logged") == NULL);
    int lines = 0;
    for (const char *c = out; *c; c++)
        lines += *c == '\n';
    CHECK_EQ_INT(lines, 2005);
    free(out);
}

/* each_line (QUAN_LOG_FLUSH_MS 0): buffered all the same (never waiting for stdout), but every
 * line is written as it comes. */
static void test_each_line(void)
{
    log_init("svc", LOGL_INFO);
    capture_start();
    log_buffer_start(1);
    log_info(NULL, "one");
    size_t one = captured_len();
    CHECK(one > 0);
    log_info(NULL, "two");
    CHECK(captured_len() > one);
    log_buffer_stop();
    char *out = capture_end();
    CHECK(out && strstr(out, "\"one\"") && strstr(out, "\"two\""));
    free(out);
}

/* The escape as the spec reads, a byte at a time: the table-driven one must write the same for
 * every string and every buffer size (an escape is written whole or not at all). */
static size_t escape_by_byte(char *buf, size_t cap, const char *s)
{
    size_t n = 0;
    if (cap == 0)
        return 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[7];
        size_t k;
        if (c == '"' || c == '\\')
            k = (size_t)snprintf(e, sizeof(e), "\\%c", c);
        else if (c == '\n')
            k = (size_t)snprintf(e, sizeof(e), "\\n");
        else if (c == '\r')
            k = (size_t)snprintf(e, sizeof(e), "\\r");
        else if (c == '\t')
            k = (size_t)snprintf(e, sizeof(e), "\\t");
        else if (c < 0x20)
            k = (size_t)snprintf(e, sizeof(e), "\\u%04x", c);
        else
            k = (size_t)snprintf(e, sizeof(e), "%c", c);
        if (n + k >= cap)
            break;
        memcpy(buf + n, e, k);
        n += k;
    }
    buf[n] = '\0';
    return n;
}

static void test_escape_matches_bytewise(void)
{
    char in[40], want[256], got[256];
    unsigned lcg = 12345;
    int bad = 0;
    for (int round = 0; round < 3000 && !bad; round++) {
        size_t len = (size_t)(round % 39);
        for (size_t i = 0; i < len; i++) {
            lcg = lcg * 1103515245u + 12345u;
            unsigned r = (lcg >> 16) % 4;
            /* mostly plain text, with quotes, backslashes and control bytes among it */
            if (r == 0)
                in[i] = (char)(1 + (lcg >> 8) % 31);
            else if (r == 1)
                in[i] = "\"\\"[(lcg >> 9) % 2];
            else
                in[i] = (char)(32 + (lcg >> 8) % 223);
        }
        in[len] = '\0';
        for (size_t cap = 0; cap < sizeof(want); cap++) {
            memset(want, 'x', sizeof(want));
            memset(got, 'x', sizeof(got));
            size_t w = escape_by_byte(want, cap, in), g = log_json_escape(got, cap, in);
            if (w != g || memcmp(want, got, cap) != 0)
                bad = 1;
        }
    }
    CHECK(!bad);
    CHECK_EQ_INT(log_json_plain_len("abc\"d"), 3);
    CHECK_EQ_INT(log_json_plain_len("plain text"), 10);
    CHECK_EQ_INT(log_json_plain_len("\x7f\xc3\xa9"), 3); /* DEL and UTF-8 go as they are */
    CHECK_EQ_INT(log_json_plain_len(""), 0);
}

/* log_limit_pass: one line per interval, the rest counted and told with the next one; among
 * threads calling at the same moment, exactly one line gets through (rounds of four threads
 * released together by a barrier, the limit reset between rounds). */
#define LIMIT_THREADS 4
#define LIMIT_ROUNDS  2000
static log_limit limit_shared;
static pthread_barrier_t limit_start, limit_end;

static void *limit_caller(void *arg)
{
    long *passed = arg;
    for (int r = 0; r < LIMIT_ROUNDS; r++) {
        pthread_barrier_wait(&limit_start);
        *passed += log_limit_pass(&limit_shared, 60000, NULL);
        pthread_barrier_wait(&limit_end);
    }
    return NULL;
}

static void test_limit(void)
{
    log_limit l = {0};
    int64_t held = -1;
    CHECK_EQ_INT(log_limit_pass(&l, 30, &held), 1);
    CHECK_EQ_INT(held, 0);
    CHECK_EQ_INT(log_limit_pass(&l, 30, &held), 0);
    CHECK_EQ_INT(log_limit_pass(&l, 30, &held), 0);
    usleep(40 * 1000);
    CHECK_EQ_INT(log_limit_pass(&l, 30, &held), 1);
    CHECK_EQ_INT(held, 2);

    pthread_t th[LIMIT_THREADS];
    long passed[LIMIT_THREADS] = {0};
    int bad_rounds = 0;
    CHECK(pthread_barrier_init(&limit_start, NULL, LIMIT_THREADS + 1) == 0);
    CHECK(pthread_barrier_init(&limit_end, NULL, LIMIT_THREADS + 1) == 0);
    for (int k = 0; k < LIMIT_THREADS; k++)
        CHECK(pthread_create(&th[k], NULL, limit_caller, &passed[k]) == 0);
    long before = 0;
    for (int r = 0; r < LIMIT_ROUNDS; r++) {
        atomic_store(&limit_shared.next_ms, 0); /* a new interval */
        atomic_store(&limit_shared.suppressed, 0);
        pthread_barrier_wait(&limit_start);
        pthread_barrier_wait(&limit_end);
        long now = 0;
        for (int k = 0; k < LIMIT_THREADS; k++)
            now += passed[k];
        bad_rounds += now - before != 1;
        before = now;
    }
    for (int k = 0; k < LIMIT_THREADS; k++)
        pthread_join(th[k], NULL);
    CHECK_EQ_INT(bad_rounds, 0);
    pthread_barrier_destroy(&limit_start);
    pthread_barrier_destroy(&limit_end);
}

/* log_warn_limited: one line per interval with the caller's fields and the held-back count
 * last; the lines held back are not written at all; a NULL limit lets each line through. */
static void test_warn_limited(void)
{
    log_init("svc", LOGL_INFO);
    log_limit l = {0};
    capture_start();
    for (int k = 0; k < 3; k++)
        log_warn_limited(&l, NULL, ((log_field[]){LOG_I("ds", 1), LOG_S("error", "down"), LOG_END}),
                         "cannot %s", "settle");
    atomic_store(&l.next_ms, 0); /* the interval is over */
    log_warn_limited(&l, NULL, NULL, "again");
    log_warn_limited(NULL, NULL, NULL, "unlimited");
    log_warn_limited(NULL, NULL, NULL, "unlimited");
    char *out = capture_end();
    CHECK(out != NULL);
    if (!out)
        return;
    char *lines[8] = {0};
    int n = 0;
    for (char *save = NULL, *t = strtok_r(out, "\n", &save); t && n < 8;
         t = strtok_r(NULL, "\n", &save))
        lines[n++] = t;
    CHECK_EQ_INT(n, 4);
    const char *want[4][2] = {
        {"cannot settle", "0"}, {"again", "2"}, {"unlimited", "0"}, {"unlimited", "0"}};
    for (int k = 0; k < n && k < 4; k++) {
        cJSON *o = cJSON_Parse(lines[k]);
        CHECK(o != NULL);
        CHECK_EQ_STR(cJSON_GetStringValue(cJSON_GetObjectItem(o, "msg")), want[k][0]);
        CHECK_EQ_STR(cJSON_GetStringValue(cJSON_GetObjectItem(o, "level")), "warn");
        cJSON *held = cJSON_GetObjectItem(o, "suppressed");
        CHECK(cJSON_IsNumber(held));
        char num[24];
        snprintf(num, sizeof(num), "%.0f", held ? held->valuedouble : -1);
        CHECK_EQ_STR(num, want[k][1]);
        cJSON_Delete(o);
    }
    /* The caller's fields come first, the count last. */
    CHECK(n > 0 && strstr(lines[0], "\"ds\":1,\"error\":\"down\",\"suppressed\":0}") != NULL);
    free(out);
}

/* Everything the pipe holds now (appended to *got). */
static void pipe_drain(int fd, char **got, size_t *len)
{
    char buf[8192];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        char *g = realloc(*got, *len + (size_t)n + 1);
        if (!g)
            return;
        memcpy(g + *len, buf, (size_t)n);
        *len += (size_t)n;
        g[*len] = '\0';
        *got = g;
    }
}

/* stdout a pipe whose reader is behind: the loop's flush never blocks, what goes out is whole
 * lines (a partial write would cut one), the rest follows in order once the reader reads, and
 * lines past the buffer are counted as dropped. */
static void test_full_pipe_gets_whole_lines(void)
{
    int p[2], saved = dup(STDOUT_FILENO);
    CHECK(pipe(p) == 0 && saved >= 0);
    CHECK(fcntl(p[1], F_SETPIPE_SZ, 4 * 4096) >= 4 * 4096);
    fflush(stdout);
    CHECK(dup2(p[1], STDOUT_FILENO) == STDOUT_FILENO);
    CHECK(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
    log_init("svc", LOGL_INFO);
    log_buffer_start(0); /* a pipe: made non-blocking */
    char page[4096], *got = NULL;
    size_t len = 0, pages = 0;
    memset(page, 'x', sizeof(page));
    while (write(STDOUT_FILENO, page, sizeof(page)) == (ssize_t)sizeof(page))
        pages++; /* full */
    CHECK(pages >= 4);
    CHECK(read(p[0], page, sizeof(page)) == (ssize_t)sizeof(page)); /* one page free */
    for (int i = 0; i < 60; i++) /* some 9 KB: more than the free page */
        log_info(NULL, "line %d of the test, long enough to make sixty of them fill pages", i);
    log_flush(); /* must not block */
    pipe_drain(p[0], &got, &len);
    size_t prefill = (pages - 1) * sizeof(page);
    CHECK(len > prefill && got && got[len - 1] == '\n'); /* whole lines only */
    for (int round = 0; round < 10; round++) {           /* the reader reads: the rest follows */
        log_flush();
        pipe_drain(p[0], &got, &len);
    }
    int next = 0;
    for (char *line = got ? got + prefill : NULL; line && *line;) {
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL);
        if (!nl)
            break;
        *nl = '\0';
        cJSON *j = cJSON_Parse(line);
        char want[96];
        snprintf(want, sizeof(want),
                 "line %d of the test, long enough to make sixty of them fill pages", next++);
        CHECK(j && cJSON_GetObjectItem(j, "msg") &&
              strcmp(cJSON_GetObjectItem(j, "msg")->valuestring, want) == 0);
        cJSON_Delete(j);
        line = nl + 1;
    }
    CHECK_EQ_INT(next, 60); /* all of them, in order */
    int64_t dropped = log_dropped_lines();
    while (write(STDOUT_FILENO, page, sizeof(page)) == (ssize_t)sizeof(page)) {
    } /* full again: past the 64 KiB buffer, lines are dropped */
    for (int i = 0; i < 1000; i++)
        log_info(NULL, "filler %d of a pipe nobody reads, until the buffer is full", i);
    CHECK(log_dropped_lines() > dropped);
    len = 0;
    free(got);
    got = NULL;
    for (int round = 0; round < 40; round++) { /* emptied: the stop's last flush blocks */
        pipe_drain(p[0], &got, &len);
        log_flush();
    }
    log_buffer_stop();
    pipe_drain(p[0], &got, &len);
    free(got);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(p[0]);
    close(p[1]);
}

/* stdout a stream socket (journald's way) with a small buffer and a reader that reads in bursts,
 * written by the loop and by three other threads at once: a socket can take part of a write, so
 * every thread's lines go out through the one buffer; each line arrives whole, each thread's in
 * its order, a socket full between two reads loses nothing, and what is not received was
 * counted as dropped. */
#define SOCK_THREADS 3
#define SOCK_LINES   3000
static atomic_int sock_running;

static void *sock_writer(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < SOCK_LINES; i++) {
        if (i % 50 == 49)
            log_warn(NULL, "t%d n%d", t, i);
        else
            log_info(NULL, "t%d n%d", t, i);
        usleep(200); /* together some 24 KB in 20 ms: within the buffer */
    }
    atomic_fetch_sub(&sock_running, 1);
    return NULL;
}

static void test_threads_share_a_socket(void)
{
    int sv[2], saved = dup(STDOUT_FILENO), small = 4096;
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && saved >= 0);
    CHECK(setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0);
    CHECK(setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) == 0);
    CHECK(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
    fflush(stdout);
    CHECK(dup2(sv[1], STDOUT_FILENO) == STDOUT_FILENO);
    log_init("svc", LOGL_INFO);
    int64_t dropped0 = log_dropped_lines();
    log_buffer_start(0);
    char *got = NULL;
    size_t len = 0;
    pthread_t th[SOCK_THREADS];
    atomic_store(&sock_running, SOCK_THREADS);
    for (int t = 0; t < SOCK_THREADS; t++)
        pthread_create(&th[t], NULL, sock_writer, (void *)(intptr_t)t);
    for (int i = 0; atomic_load(&sock_running) > 0; i++) { /* the loop: its own lines, flushes */
        log_info(NULL, "t%d n%d", SOCK_THREADS, i);
        log_flush();
        if (i % 100 == 99) /* a reader that reads every 20 ms, all there is then */
            for (int k = 0; k < 40; k++) {
                pipe_drain(sv[0], &got, &len);
                log_flush();
            }
        usleep(200);
    }
    for (int t = 0; t < SOCK_THREADS; t++)
        pthread_join(th[t], NULL);
    for (int round = 0; round < 200; round++) {
        log_flush();
        pipe_drain(sv[0], &got, &len);
        usleep(1000);
    }
    log_buffer_stop();
    pipe_drain(sv[0], &got, &len);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(sv[0]);
    close(sv[1]);

    int next[SOCK_THREADS + 1] = {0}, lines = 0, whole = 1, ordered = 1;
    for (char *line = got; line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) {
            whole = 0;
            break;
        }
        *nl = '\0';
        cJSON *j = cJSON_Parse(line);
        const cJSON *msg = j ? cJSON_GetObjectItem(j, "msg") : NULL;
        int t = -1, n = -1;
        if (!cJSON_IsString(msg) || sscanf(msg->valuestring, "t%d n%d", &t, &n) != 2 || t < 0 ||
            t > SOCK_THREADS)
            whole = 0;
        else if (n < next[t])
            ordered = 0;
        else
            next[t] = n + 1;
        cJSON_Delete(j);
        lines++;
        line = nl + 1;
    }
    int sent = SOCK_THREADS * SOCK_LINES + next[SOCK_THREADS]; /* the loop's: up to its last */
    int64_t dropped = log_dropped_lines() - dropped0;
    printf("  %d lines received whole of %d sent by 4 threads, %lld dropped\n", lines, sent,
           (long long)dropped);
    CHECK(whole);
    CHECK(ordered);
    CHECK(lines + dropped == sent);
    CHECK(lines >= sent * 9 / 10); /* a full socket for a moment drops nothing: they wait */
    free(got);
}

int main(void)
{
    RUN(test_numbers);
    RUN(test_line);
    RUN(test_buffered);
    RUN(test_each_line);
    RUN(test_full_pipe_gets_whole_lines);
    RUN(test_threads_share_a_socket);
    RUN(test_escape_matches_bytewise);
    RUN(test_limit);
    RUN(test_warn_limited);
    TEST_MAIN_END();
}
