/*
 * A tiny unit-test harness (hiredis test.c, redis testhelp.h). Each test function is counted
 * once: passed if none of its checks failed. The last line is "N passed, N failed" and the
 * exit status is non-zero when anything failed.
 */
#ifndef QUAN_TESTHELP_H
#define QUAN_TESTHELP_H

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int th_passed, th_failed, th_case_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("  FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                               \
            th_case_failed = 1;                                                                    \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                         \
    do {                                                                                           \
        long long th_a = (long long)(a), th_b = (long long)(b);                                    \
        if (th_a != th_b) {                                                                        \
            printf("  FAIL %s:%d: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, #a, #b, th_a,    \
                   th_b);                                                                          \
            th_case_failed = 1;                                                                    \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                         \
    do {                                                                                           \
        const char *th_a = (a), *th_b = (b);                                                       \
        if (!th_a || !th_b || strcmp(th_a, th_b) != 0) {                                           \
            printf("  FAIL %s:%d: %s == %s (\"%s\" != \"%s\")\n", __FILE__, __LINE__, #a, #b,      \
                   th_a ? th_a : "(null)", th_b ? th_b : "(null)");                                \
            th_case_failed = 1;                                                                    \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        th_case_failed = 0;                                                                        \
        fn();                                                                                      \
        if (th_case_failed) {                                                                      \
            th_failed++;                                                                           \
            printf("FAIL %s\n", #fn);                                                              \
        } else {                                                                                   \
            th_passed++;                                                                           \
            printf("ok   %s\n", #fn);                                                              \
        }                                                                                          \
        fflush(stdout);                                                                            \
    } while (0)

#define TEST_MAIN_END()                                                                            \
    do {                                                                                           \
        printf("%d passed, %d failed\n", th_passed, th_failed);                                    \
        return th_failed ? 1 : 0;                                                                  \
    } while (0)

/* A new directory named prefix.XXXXXX for the test's files, under $QUAN_TEST_TMP (else /tmp),
 * into dir; on failure it says so as a failed run and exits. Remove it with th_rmtree. */
static inline void th_tmpdir(char *dir, size_t len, const char *prefix)
{
    const char *base = getenv("QUAN_TEST_TMP");
    snprintf(dir, len, "%s/%s.XXXXXX", base && *base ? base : "/tmp", prefix);
    if (!mkdtemp(dir)) {
        printf("mkdtemp failed\n0 passed, 1 failed\n");
        exit(1);
    }
}

static inline void th_rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        printf("  could not remove %s\n", dir);
}

/* 1 when nothing listens on 127.0.0.1:port now (a test's own servers pick free ports). */
static inline int th_port_free(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), on = 1, ok;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A required environment variable for tests that need real servers: fail loudly if unset. */
static inline const char *th_env(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        printf("  FAIL: %s is not set (run through integration-tests/run.sh)\n", name);
        printf("0 passed, 1 failed\n");
        exit(1);
    }
    return v;
}

/* What the code under test writes to stdout (log.c's lines), caught in a temporary file from
 * th_capture_start to th_capture_end. A failing CHECK in between is caught too: check after. */
typedef struct th_capture {
    int saved_stdout;
    FILE *file;
} th_capture;

static inline th_capture th_capture_start(void)
{
    th_capture c;
    fflush(stdout);
    c.file = tmpfile();
    c.saved_stdout = dup(STDOUT_FILENO);
    if (!c.file || c.saved_stdout < 0 || dup2(fileno(c.file), STDOUT_FILENO) < 0) {
        printf("cannot capture stdout\n0 passed, 1 failed\n");
        exit(1);
    }
    return c;
}

/* What was written since th_capture_start (caller frees); stdout is restored. */
static inline char *th_capture_end(th_capture c)
{
    fflush(stdout);
    dup2(c.saved_stdout, STDOUT_FILENO);
    close(c.saved_stdout);
    fseek(c.file, 0, SEEK_END);
    long n = ftell(c.file);
    rewind(c.file);
    char *out = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (out && n > 0 && fread(out, 1, (size_t)n, c.file) != (size_t)n)
        out[0] = '\0';
    fclose(c.file);
    return out;
}

#endif
