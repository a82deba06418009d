/* lock.c against a real Redis, with helper_lockholder processes for real contention. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "lock.h"
#include "log.h"
#include "now.h"
#include "redis.h"
#include "redis_sync.h"
#include "testhelp.h"

static const char *g_host;
static int g_port;
static const char *g_lua_dir;
static char g_helper[1024];
static struct event_base *g_base;
static redis_client *g_c;
static redis_sync *g_sync;

static int run_until(const int *flag, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    while (!*flag && now_mono_ms() < end) {
        event_base_loop(g_base, EVLOOP_NONBLOCK);
        if (!*flag)
            usleep(1000);
    }
    return *flag;
}

static void run_for(int ms)
{
    int never = 0;
    run_until(&never, ms);
}

/* ---------------------------------------------------------------- sync helpers */

static void s_cmd(const char *fmt, const char *a, const char *b)
{
    redisReply *r = redis_sync_command(g_sync, fmt, a, b);
    CHECK(r != NULL);
    if (r)
        freeReplyObject(r);
}

static void s_get(const char *key, char *out, size_t cap)
{
    redisReply *r = redis_sync_command(g_sync, "GET %s", key);
    snprintf(out, cap, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "(nil)");
    if (r)
        freeReplyObject(r);
}

static long long s_pttl(const char *key)
{
    redisReply *r = redis_sync_command(g_sync, "PTTL %s", key);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    if (r)
        freeReplyObject(r);
    return v;
}

/* ---------------------------------------------------------------- lock callbacks */

typedef struct {
    int calls;
    lock_outcome o;
    lock_handle *h;
    int64_t at; /* when called */
} got;

static void on_lock(lock_handle *h, lock_outcome o, void *arg)
{
    got *g = arg;
    g->calls++;
    g->o = o;
    g->h = h;
    g->at = now_mono_ms();
}

typedef struct {
    int calls;
    int released;
} rel;

static void on_rel(int released, void *arg)
{
    rel *r = arg;
    r->calls++;
    r->released = released;
}

/* Acquires and waits; returns the elapsed ms. */
static int64_t acquire_wait(const char *name, lock_strategy st, int64_t wait_ms, int64_t lease_ms,
                            int64_t watchdog_ms, got *g, int timeout_ms)
{
    lock_opts o = {.name = name,
                   .wait_ms = wait_ms,
                   .lease_ms = lease_ms,
                   .watchdog_ms = watchdog_ms,
                   .strategy = st};
    int64_t t0 = now_mono_ms();
    memset(g, 0, sizeof(*g));
    CHECK(lock_acquire(g_c, &o, on_lock, g) == QN_OK);
    CHECK_EQ_INT(g->calls, 0);
    run_until(&g->calls, timeout_ms);
    CHECK_EQ_INT(g->calls, 1);
    return g->at - t0;
}

static int release_wait(lock_handle *h)
{
    rel r = {0};
    lock_release(h, on_rel, &r);
    run_until(&r.calls, 2000);
    CHECK_EQ_INT(r.calls, 1);
    return r.released;
}

/* ---------------------------------------------------------------- helper processes */

typedef struct {
    pid_t pid;
    int out; /* read end of its stdout */
    char buf[512];
    size_t len;
} child;

static int spawn(child *ch, const char *const argv[])
{
    int p[2];
    memset(ch, 0, sizeof(*ch));
    if (pipe(p) != 0)
        return -1;
    ch->pid = fork();
    if (ch->pid < 0)
        return -1;
    if (ch->pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        execv(g_helper, (char *const *)argv); /* execv does not write them */
        _exit(127);
    }
    close(p[1]);
    ch->out = p[0];
    return 0;
}

/* Waits for a line starting with prefix on the child's stdout; 1 if seen. */
static int child_wait_line(child *ch, const char *prefix, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    for (;;) {
        char *nl;
        while ((nl = memchr(ch->buf, '\n', ch->len)) != NULL) {
            size_t linelen = (size_t)(nl - ch->buf) + 1;
            int match = strncmp(ch->buf, prefix, strlen(prefix)) == 0;
            memmove(ch->buf, ch->buf + linelen, ch->len - linelen);
            ch->len -= linelen;
            if (match)
                return 1;
        }
        int64_t left = end - now_mono_ms();
        struct pollfd pfd = {ch->out, POLLIN, 0};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return 0;
        ssize_t n = read(ch->out, ch->buf + ch->len, sizeof(ch->buf) - 1 - ch->len);
        if (n <= 0)
            return 0;
        ch->len += (size_t)n;
    }
}

static int child_reap(child *ch, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    int status = 0;
    while (now_mono_ms() < end) {
        pid_t r = waitpid(ch->pid, &status, WNOHANG);
        if (r == ch->pid) {
            close(ch->out);
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(5000);
    }
    kill(ch->pid, SIGKILL);
    waitpid(ch->pid, &status, 0);
    close(ch->out);
    return -1;
}

/* ---------------------------------------------------------------- tests */

static void test_acquire_release(void)
{
    const char *key = "quan:test:lock:{basic}";
    char v[64];
    got g;
    long long t;

    s_cmd("DEL %s", key, NULL);
    acquire_wait(key, LOCK_SKIP_FAST, 0, 2000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    CHECK(g.h != NULL);
    if (!g.h)
        return;
    CHECK_EQ_INT(strlen(lock_handle_token(g.h)), 32);
    CHECK_EQ_STR(lock_handle_name(g.h), key);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, lock_handle_token(g.h));
    t = s_pttl(key);
    CHECK(t > 1500 && t <= 2000);
    CHECK(!lock_handle_lost(g.h));
    CHECK_EQ_INT(release_wait(g.h), 1);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "(nil)");

    /* Two acquisitions never share a token. */
    got a, b;
    acquire_wait(key, LOCK_SKIP_FAST, 0, 2000, 0, &a, 2000);
    char tok[33];
    snprintf(tok, sizeof(tok), "%s", a.h ? lock_handle_token(a.h) : "");
    CHECK(a.h && release_wait(a.h) == 1);
    acquire_wait(key, LOCK_SKIP_FAST, 0, 2000, 0, &b, 2000);
    CHECK(b.h && strcmp(tok, lock_handle_token(b.h)) != 0);
    if (b.h)
        CHECK(release_wait(b.h) == 1);

    lock_opts bad = {.name = "", .strategy = LOCK_SKIP_FAST};
    CHECK(lock_acquire(g_c, &bad, on_lock, &g) == QN_EINVAL);
    lock_strategy st;
    CHECK(lock_strategy_parse("KEEP-RETRY", &st) == QN_OK && st == LOCK_KEEP_RETRY);
    CHECK(lock_strategy_parse("sometimes", &st) == QN_EINVAL);
}

/* Held by someone else: what each strategy reports, and when (never a fake success). */
static void test_strategies_when_busy(void)
{
    const char *key = "quan:test:lock:{busy}";
    char v[64];
    got g;
    int64_t dt;

    s_cmd("SET %s %s PX 5000", key, "someone-else");
    dt = acquire_wait(key, LOCK_SKIP_FAST, 1000, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_SKIPPED);
    CHECK(g.h == NULL);
    CHECK(dt < 100);

    dt = acquire_wait(key, LOCK_FAIL_FAST, 1000, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_FAILED_BUSY);
    CHECK(g.h == NULL);
    CHECK(dt < 100);

    dt = acquire_wait(key, LOCK_SKIP_AFTER_RETRY_TIMEOUT, 300, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_SKIPPED);
    CHECK(g.h == NULL);
    CHECK(dt >= 290 && dt < 600);

    dt = acquire_wait(key, LOCK_FAIL_AFTER_RETRY_TIMEOUT, 300, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_FAILED_TIMEOUT);
    CHECK(g.h == NULL);
    CHECK(dt >= 290 && dt < 600);

    /* The other owner's lease runs out within the wait time: acquired then. */
    s_cmd("SET %s %s PX 300", key, "someone-else");
    dt = acquire_wait(key, LOCK_FAIL_AFTER_RETRY_TIMEOUT, 2000, 1000, 0, &g, 3000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    CHECK(dt >= 250 && dt < 800);
    if (g.h)
        CHECK_EQ_INT(release_wait(g.h), 1);

    s_cmd("SET %s %s PX 400", key, "someone-else");
    dt = acquire_wait(key, LOCK_KEEP_RETRY, 0, 1000, 0, &g, 3000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    CHECK(dt >= 350 && dt < 900);
    if (g.h) {
        s_get(key, v, sizeof(v));
        CHECK_EQ_STR(v, lock_handle_token(g.h));
        CHECK_EQ_INT(release_wait(g.h), 1);
    }
}

static void test_watchdog_renews(void)
{
    const char *key = "quan:test:lock:{wd}";
    char v[64];
    got g, other;

    s_cmd("DEL %s", key, NULL);
    acquire_wait(key, LOCK_SKIP_FAST, 0, -1, 300, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    if (!g.h)
        return;
    CHECK(s_pttl(key) <= 300);
    run_for(1000); /* more than three leases */
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, lock_handle_token(g.h));
    CHECK(s_pttl(key) > 0);
    CHECK(!lock_handle_lost(g.h));
    acquire_wait(key, LOCK_SKIP_FAST, 0, 1000, 0, &other, 2000);
    CHECK_EQ_INT(other.o, LOCK_SKIPPED);
    CHECK_EQ_INT(release_wait(g.h), 1);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "(nil)");

    /* A fixed lease is not renewed: it simply runs out. */
    acquire_wait(key, LOCK_SKIP_FAST, 0, 300, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    run_for(500);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "(nil)");
    if (g.h)
        CHECK_EQ_INT(release_wait(g.h), 0);
}

static void test_non_owner_cannot_release(void)
{
    const char *key = "quan:test:lock:{owner}";
    const char *keys[1] = {key};
    const char *args[1] = {"not-the-token"};
    char v[64];
    got g;
    redisReply *r;

    s_cmd("DEL %s", key, NULL);
    acquire_wait(key, LOCK_SKIP_FAST, 0, 5000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    if (!g.h)
        return;
    /* Compare-and-delete with a foreign token does nothing. */
    r = redis_sync_run_script(g_sync, redis_client_scripts(g_c), "lock_release", 1, keys, 1, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0);
    if (r)
        freeReplyObject(r);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, lock_handle_token(g.h));

    /* Our lease ran out and another owner took the lock: our release must not delete it. */
    s_cmd("SET %s %s PX 5000", key, "new-owner");
    CHECK_EQ_INT(release_wait(g.h), 0);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "new-owner");

    /* The watchdog notices the loss and stops renewing. */
    s_cmd("DEL %s", key, NULL);
    acquire_wait(key, LOCK_SKIP_FAST, 0, -1, 300, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    if (!g.h)
        return;
    s_cmd("SET %s %s PX 5000", key, "new-owner");
    run_for(250);
    CHECK(lock_handle_lost(g.h));
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "new-owner");
    CHECK(s_pttl(key) > 4000); /* not extended with our lease */
    CHECK_EQ_INT(release_wait(g.h), 0);
    s_get(key, v, sizeof(v));
    CHECK_EQ_STR(v, "new-owner");
    s_cmd("DEL %s", key, NULL);
}

/* Redis down: errors are reported as errors, not as busy or as success. */
static void test_error_when_disconnected(void)
{
    struct event_base *saved_base = g_base;
    redis_client *saved = g_c;
    redis_opts o = {.host = "127.0.0.1", .port = 1, .lua_dir = g_lua_dir};
    got g;

    g_base = event_base_new();
    g_c = redis_client_new(g_base, &o);
    CHECK(g_c != NULL);
    acquire_wait("quan:test:lock:{down}", LOCK_SKIP_FAST, 0, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_FAILED_ERROR);
    acquire_wait("quan:test:lock:{down}", LOCK_SKIP_AFTER_RETRY_TIMEOUT, 200, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_FAILED_ERROR);
    run_for(50);
    redis_client_free(g_c);
    event_base_free(g_base);
    g_c = saved;
    g_base = saved_base;
}

#define NPROC 4
#define NITER 25

static long long run_counters(const char *lockname, const char *counter, int use_lock)
{
    child ch[NPROC];
    char iters[16];
    const char *argv[] = {"helper_lockholder",        "count", lockname, counter, iters, "3",
                          use_lock ? NULL : "nolock", NULL};
    char v[64];
    int ok = 1;

    snprintf(iters, sizeof(iters), "%d", NITER);
    s_cmd("DEL %s %s", counter, lockname);
    for (int i = 0; i < NPROC; i++)
        CHECK(spawn(&ch[i], argv) == 0);
    for (int i = 0; i < NPROC; i++) {
        ok &= child_wait_line(&ch[i], "DONE", 30000);
        ok &= child_reap(&ch[i], 5000) == 0;
    }
    CHECK(ok);
    s_get(counter, v, sizeof(v));
    s_cmd("DEL %s %s", counter, lockname);
    return atoll(v);
}

/* 4 processes x 25 read-modify-write increments with a 3 ms gap: exact under the lock,
 * lost updates without it (which shows the test can tell). */
static void test_cross_process_contention(void)
{
    long long locked = run_counters("quan:test:lock:{ctr}", "quan:test:lock:{ctr}:n", 1);
    long long unlocked = run_counters("quan:test:lock:{ctr}", "quan:test:lock:{ctr}:n", 0);
    printf("  counter with lock %lld, without %lld (of %d)\n", locked, unlocked, NPROC * NITER);
    CHECK_EQ_INT(locked, NPROC * NITER);
    CHECK(unlocked < NPROC * NITER);
}

/* A holder in watchdog mode outlives its base lease while alive, and frees the lock about a
 * lease after kill -9. */
static void test_killed_holder_frees_after_lease(void)
{
    const char *key = "quan:test:lock:{kill}";
    const char *argv[] = {
        "helper_lockholder", "hold", key, "60000", "skip_fast", "0", "-1", "1000", NULL};
    child ch;
    got g;
    int64_t t_kill, dt;

    s_cmd("DEL %s", key, NULL);
    CHECK(spawn(&ch, argv) == 0);
    CHECK(child_wait_line(&ch, "ACQUIRED", 5000));

    /* Another process (this one) cannot take it; after 1.5 leases it is still held. */
    acquire_wait(key, LOCK_FAIL_FAST, 0, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_FAILED_BUSY);
    run_for(1500);
    acquire_wait(key, LOCK_SKIP_FAST, 0, 1000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_SKIPPED);

    kill(ch.pid, SIGKILL);
    t_kill = now_mono_ms();
    CHECK_EQ_INT(child_reap(&ch, 2000), 128 + SIGKILL);
    acquire_wait(key, LOCK_FAIL_AFTER_RETRY_TIMEOUT, 3000, 1000, 0, &g, 4000);
    dt = g.at - t_kill;
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    CHECK(dt <= 1300); /* within the remaining lease (<= 1000 ms), a retry and some slack */
    printf("  acquired %lld ms after kill -9\n", (long long)dt);
    if (g.h)
        CHECK_EQ_INT(release_wait(g.h), 1);
}

/* Strategies across processes: a helper waiting with a wait time gets the lock when we let
 * go; a fail-fast helper reports busy (exit 3), not success. */
static void test_helper_strategies(void)
{
    const char *key = "quan:test:lock:{xproc}";
    const char *fast[] = {"helper_lockholder", "hold", key, "10", "fail_fast", "0", "1000", NULL};
    const char *waiter[] = {"helper_lockholder",        "hold", key,    "10",
                            "fail_after_retry_timeout", "3000", "1000", NULL};
    child a, b;
    got g;

    s_cmd("DEL %s", key, NULL);
    acquire_wait(key, LOCK_SKIP_FAST, 0, 5000, 0, &g, 2000);
    CHECK_EQ_INT(g.o, LOCK_ACQUIRED);
    CHECK(spawn(&a, fast) == 0);
    CHECK(child_wait_line(&a, "OUTCOME failed_busy", 5000));
    CHECK_EQ_INT(child_reap(&a, 3000), 3);

    CHECK(spawn(&b, waiter) == 0);
    usleep(300 * 1000);
    if (g.h)
        CHECK_EQ_INT(release_wait(g.h), 1);
    CHECK(child_wait_line(&b, "ACQUIRED", 3000));
    CHECK(child_wait_line(&b, "RELEASED 1", 3000));
    CHECK_EQ_INT(child_reap(&b, 3000), 0);
}

int main(int argc, char **argv)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    char self[1024];
    redis_opts o = {0};
    (void)argc;

    g_host = th_env("QUAN_REDIS_HOST");
    g_port = atoi(th_env("QUAN_REDIS_PORT"));
    g_lua_dir = lua && *lua ? lua : "lua-scripts";
    log_init("test_lock", LOGL_OFF);
    signal(SIGPIPE, SIG_IGN);
    snprintf(self, sizeof(self), "%s", argv[0]);
    snprintf(g_helper, sizeof(g_helper), "%s/helper_lockholder", dirname(self));
    if (access(g_helper, X_OK) != 0) {
        printf("  FAIL: %s not built (make tests)\n0 passed, 1 failed\n", g_helper);
        return 1;
    }

    g_base = event_base_new();
    o.host = g_host;
    o.port = g_port;
    o.lua_dir = g_lua_dir;
    g_c = redis_client_new(g_base, &o);
    g_sync = redis_sync_new(&(redis_sync_opts){.host = g_host, .port = g_port, .timeout_ms = 2000});
    if (!g_c || !g_sync) {
        printf("  FAIL: no Redis\n0 passed, 1 failed\n");
        return 1;
    }
    for (int i = 0; i < 3000 && !redis_client_ready(g_c); i++)
        run_for(1);

    RUN(test_acquire_release);
    RUN(test_strategies_when_busy);
    RUN(test_watchdog_renews);
    RUN(test_non_owner_cannot_release);
    RUN(test_error_when_disconnected);
    RUN(test_cross_process_contention);
    RUN(test_killed_holder_frees_after_lease);
    RUN(test_helper_strategies);

    run_for(50);
    redis_client_free(g_c);
    redis_sync_free(g_sync);
    event_base_free(g_base);
    TEST_MAIN_END();
}
