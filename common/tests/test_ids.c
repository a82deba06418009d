#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ids.h"
#include "now.h"
#include "testhelp.h"

#define T0 (IDS_EPOCH_MS + 86400000LL * 400) /* some instant in 2025 */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Number of adjacent equal values in a sorted copy of ids (0 when all are unique). */
static size_t count_dups(int64_t *ids, size_t n)
{
    qsort(ids, n, sizeof(ids[0]), cmp_i64);
    size_t d = 0;
    for (size_t i = 1; i < n; i++)
        d += ids[i] == ids[i - 1];
    return d;
}

static int64_t fake_clock(void *arg)
{
    return *(int64_t *)arg;
}

static void test_layout(void)
{
    CHECK(ids_new(-1) == NULL);
    CHECK(ids_new(1024) == NULL);
    ids_gen *g = ids_new(1023);
    CHECK(g != NULL);
    if (!g)
        return;
    CHECK_EQ_INT(ids_worker(g), 1023);
    int64_t clock = T0, id = 0;
    ids_set_clock(g, fake_clock, &clock);
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK(id > 0);
    CHECK_EQ_INT(ids_time_ms(id), T0);
    CHECK_EQ_INT(ids_worker_of(id), 1023);
    CHECK_EQ_INT(ids_seq_of(id), 0);
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK_EQ_INT(ids_seq_of(id), 1);
    CHECK_EQ_INT(ids_time_ms(id), T0);

    /* the last representable millisecond is still positive, one more is refused */
    clock = IDS_EPOCH_MS + (1LL << 41) - 1;
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK(id > 0);
    CHECK_EQ_INT(ids_time_ms(id), clock);
    ids_free(g);

    g = ids_new(5);
    if (!g)
        return;
    clock = IDS_EPOCH_MS - 1; /* before the epoch */
    ids_set_clock(g, fake_clock, &clock);
    CHECK(ids_next(g, &id) == QN_ERR);
    clock = IDS_EPOCH_MS + (1LL << 41);
    CHECK(ids_next(g, &id) == QN_ERR);
    ids_free(g);
}

static void test_monotonic_one_thread(void)
{
    enum { N = 1000000 };
    ids_gen *g = ids_new(7);
    CHECK(g != NULL);
    if (!g)
        return;
    int64_t prev = 0, id = 0;
    size_t not_increasing = 0, failures = 0;
    int64_t start_ms = now_wall_ms();
    for (int i = 0; i < N; i++) {
        if (ids_next(g, &id) != QN_OK) {
            failures++;
            continue;
        }
        not_increasing += id <= prev;
        prev = id;
    }
    int64_t end_ms = now_wall_ms();
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(not_increasing, 0);
    CHECK_EQ_INT(ids_worker_of(id), 7);
    /* the last id's time is real time, not far ahead of it */
    CHECK(ids_time_ms(id) <= end_ms + IDS_MAX_AHEAD_MS);
    CHECK(ids_time_ms(id) >= start_ms - 1000);
    ids_free(g);
}

typedef struct {
    ids_gen *g;
    int64_t *out;
    size_t n;
    size_t failures, not_increasing;
} thread_arg;

static void *gen_thread(void *p)
{
    thread_arg *a = p;
    int64_t prev = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (ids_next(a->g, &a->out[i]) != QN_OK) {
            a->failures++;
            a->out[i] = -(int64_t)i - 1; /* distinct filler, never a valid id */
            continue;
        }
        a->not_increasing += a->out[i] <= prev;
        prev = a->out[i];
    }
    return NULL;
}

static void test_threads_unique(void)
{
    enum { THREADS = 4, PER = 200000 };
    ids_gen *g = ids_new(9);
    int64_t *all = malloc(sizeof(int64_t) * THREADS * PER);
    CHECK(g && all);
    if (!g || !all)
        goto done;
    pthread_t th[THREADS];
    thread_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg){.g = g, .out = all + (size_t)i * PER, .n = PER};
        CHECK(pthread_create(&th[i], NULL, gen_thread, &args[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(args[i].failures, 0);
        CHECK_EQ_INT(args[i].not_increasing, 0); /* each thread sees increasing ids */
    }
    CHECK_EQ_INT(count_dups(all, (size_t)THREADS * PER), 0);
done:
    free(all);
    ids_free(g);
}

static void test_sequence_exhaustion_frozen_clock(void)
{
    ids_gen *g = ids_new(1);
    if (!g)
        return;
    int64_t clock = T0, id = 0, prev = 0;
    ids_set_clock(g, fake_clock, &clock);
    size_t bad = 0;
    for (int i = 0; i <= IDS_MAX_SEQ; i++) {
        bad += ids_next(g, &id) != QN_OK || id <= prev || ids_time_ms(id) != T0;
        prev = id;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(ids_seq_of(prev), IDS_MAX_SEQ);
    /* 4097th id in a millisecond that never ends: borrows the next millisecond */
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK(id > prev);
    CHECK_EQ_INT(ids_time_ms(id), T0 + 1);
    CHECK_EQ_INT(ids_seq_of(id), 0);
    /* the wall clock moves on: back to real time, sequence restarts */
    clock = T0 + 10;
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK_EQ_INT(ids_time_ms(id), T0 + 10);
    CHECK_EQ_INT(ids_seq_of(id), 0);
    ids_free(g);
}

static void test_clock_backwards(void)
{
    ids_gen *g = ids_new(2);
    if (!g)
        return;
    int64_t clock = T0, id = 0, prev = 0;
    ids_set_clock(g, fake_clock, &clock);
    CHECK(ids_next(g, &prev) == QN_OK);

    /* a small step back: ids continue from the logical clock, still increasing */
    clock = T0 - 5;
    size_t bad = 0, issued = 0;
    int64_t max_ts = 0;
    qn_status st;
    while ((st = ids_next(g, &id)) == QN_OK) {
        bad += id <= prev;
        prev = id;
        max_ts = ids_time_ms(id);
        if (++issued > 10000000)
            break;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(st == QN_EAGAIN);
    /* it borrowed up to exactly IDS_MAX_AHEAD_MS ahead of the (frozen) wall clock */
    CHECK_EQ_INT(max_ts, clock + IDS_MAX_AHEAD_MS);
    CHECK_EQ_INT(issued, (int64_t)(IDS_MAX_AHEAD_MS - 5 + 1) * (IDS_MAX_SEQ + 1) - 1);

    /* a large step back fails at once, and recovers when the clock passes the last id */
    ids_gen *h = ids_new(3);
    if (h) {
        int64_t c2 = T0;
        ids_set_clock(h, fake_clock, &c2);
        CHECK(ids_next(h, &prev) == QN_OK);
        c2 = T0 - IDS_MAX_AHEAD_MS - 1;
        CHECK(ids_next(h, &id) == QN_EAGAIN);
        c2 = T0 - IDS_MAX_AHEAD_MS; /* within the bound: continues at T0 */
        CHECK(ids_next(h, &id) == QN_OK);
        CHECK(id > prev);
        CHECK_EQ_INT(ids_time_ms(id), T0);
        c2 = T0 + 1;
        CHECK(ids_next(h, &id) == QN_OK);
        CHECK_EQ_INT(ids_time_ms(id), T0 + 1);
        CHECK_EQ_INT(ids_seq_of(id), 0);
        ids_free(h);
    }
    ids_free(g);
}

static void test_lease_deadline(void)
{
    ids_gen *g = ids_new(4);
    if (!g)
        return;
    int64_t clock = T0, id = 0;
    ids_set_clock(g, fake_clock, &clock);
    ids_set_lease_deadline(g, T0 + 100);
    CHECK(ids_leased(g));
    CHECK(ids_next(g, &id) == QN_OK);
    clock = T0 + 101;
    id = 42;
    CHECK(!ids_leased(g));
    CHECK(ids_next(g, &id) == QN_EAGAIN);
    CHECK_EQ_INT(id, 42);
    /* Leased again under another worker id: ids resume under that one, after the old ones. */
    CHECK(ids_set_worker(g, 1024) == QN_EINVAL);
    CHECK(ids_set_worker(g, 9) == QN_OK);
    CHECK_EQ_INT(ids_worker(g), 9);
    ids_set_lease_deadline(g, T0 + 200);
    CHECK(ids_leased(g));
    CHECK(ids_next(g, &id) == QN_OK);
    CHECK_EQ_INT(ids_worker_of(id), 9);
    CHECK_EQ_INT(ids_time_ms(id), T0 + 101);
    ids_set_lease_deadline(g, 0);
    CHECK(ids_leased(g));
    CHECK(ids_next(g, &id) == QN_OK);
    ids_set_clock(g, NULL, NULL); /* the real clock again */
    CHECK(ids_next(g, &id) == QN_OK);
    ids_free(g);
}

/* ---------------------------------------------------------------- with Redis */

static redis_scripts *g_scripts; /* for the lease renewal script */
static char prefix[128];

static redis_sync *redis_connect(void)
{
    const char *host = getenv("QUAN_REDIS_HOST");
    redis_sync_opts o = {.host = host && *host ? host : "127.0.0.1",
                         .port = atoi(th_env("QUAN_REDIS_PORT")),
                         .timeout_ms = 2000};
    redis_sync *c = redis_sync_new(&o);
    if (c && redis_sync_open(c) != QN_OK) {
        printf("  redis connect: %s\n", redis_sync_errstr(c));
        redis_sync_free(c);
        return NULL;
    }
    return c;
}

static void redis_del_prefix(redis_sync *c)
{
    for (int n = 0; n <= IDS_MAX_WORKER; n++) {
        redisReply *r = redis_sync_command(c, "DEL %s%d", prefix, n);
        if (r)
            freeReplyObject(r);
    }
}

static void test_lease_claim_renew_release(void)
{
    redis_sync *c = redis_connect();
    CHECK(c != NULL);
    if (!c)
        return;
    int w1 = -1, w2 = -1;
    char t1[IDS_TOKEN_LEN], t2[IDS_TOKEN_LEN];
    CHECK(ids_worker_claim_sync(c, prefix, 30000, &w1, t1) == QN_OK);
    CHECK(ids_worker_claim_sync(c, prefix, 30000, &w2, t2) == QN_OK);
    CHECK(w1 >= 0 && w1 <= IDS_MAX_WORKER);
    CHECK(w2 >= 0 && w2 <= IDS_MAX_WORKER);
    CHECK(w1 != w2);
    CHECK_EQ_INT(strlen(t1), 32);
    CHECK(strcmp(t1, t2) != 0);

    redisReply *r = redis_sync_command(c, "GET %s%d", prefix, w1);
    CHECK(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, t1) == 0);
    if (r)
        freeReplyObject(r);

    CHECK(ids_worker_renew_sync(c, g_scripts, prefix, w1, t1, 45000) == QN_OK);
    r = redis_sync_command(c, "PTTL %s%d", prefix, w1);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 30000 && r->integer <= 45000);
    if (r)
        freeReplyObject(r);
    /* someone else's token cannot renew or release our lease */
    CHECK(ids_worker_renew_sync(c, g_scripts, prefix, w1, t2, 45000) == QN_ECONFLICT);
    CHECK(ids_worker_release_sync(c, g_scripts, prefix, w1, t2) == QN_ECONFLICT);

    /* release keeps the key for a short hold, never deletes it outright */
    CHECK(ids_worker_release_sync(c, g_scripts, prefix, w1, t1) == QN_OK);
    r = redis_sync_command(c, "PTTL %s%d", prefix, w1);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer > 0 &&
          r->integer <= IDS_RELEASE_HOLD_MS);
    if (r)
        freeReplyObject(r);

    /* a lost lease (expired or deleted) is reported as a conflict */
    r = redis_sync_command(c, "DEL %s%d", prefix, w2);
    if (r)
        freeReplyObject(r);
    CHECK(ids_worker_renew_sync(c, g_scripts, prefix, w2, t2, 45000) == QN_ECONFLICT);

    redis_del_prefix(c);
    redis_sync_free(c);
}

static void test_lease_all_taken(void)
{
    redis_sync *c = redis_connect();
    CHECK(c != NULL);
    if (!c)
        return;
    char seen[IDS_MAX_WORKER + 1] = {0};
    int w = -1, dups = 0, fails = 0;
    char tok[IDS_TOKEN_LEN];
    for (int i = 0; i <= IDS_MAX_WORKER; i++) {
        if (ids_worker_claim_sync(c, prefix, 30000, &w, tok) != QN_OK) {
            fails++;
            continue;
        }
        dups += seen[w]++ != 0;
    }
    CHECK_EQ_INT(fails, 0);
    CHECK_EQ_INT(dups, 0);
    CHECK(ids_worker_claim_sync(c, prefix, 30000, &w, tok) == QN_EBUSY);
    redis_del_prefix(c);
    redis_sync_free(c);
}

enum { CHILD_IDS = 200000 };

/* Child: claim a worker, report it, wait for "go", write CHILD_IDS ids to fd. */
static void child_main(int ready_fd, int go_fd, int out_fd)
{
    int code = 1;
    int w = -1;
    char tok[IDS_TOKEN_LEN];
    ids_gen *g = NULL;
    int64_t *buf = malloc(sizeof(int64_t) * CHILD_IDS);
    redis_sync *c = redis_connect();
    if (!c || !buf || ids_worker_claim_sync(c, prefix, 30000, &w, tok) != QN_OK)
        w = -1;
    if (write(ready_fd, &w, sizeof(w)) != sizeof(w) || w < 0)
        goto done;
    char go;
    if (read(go_fd, &go, 1) != 1 || !(g = ids_new(w)))
        goto done;
    for (size_t i = 0; i < CHILD_IDS; i++)
        if (ids_next(g, &buf[i]) != QN_OK)
            goto done;
    size_t len = sizeof(int64_t) * CHILD_IDS, off = 0;
    while (off < len) {
        ssize_t n = write(out_fd, (char *)buf + off, len - off);
        if (n <= 0)
            goto done;
        off += (size_t)n;
    }
    if (ids_worker_release_sync(c, g_scripts, prefix, w, tok) == QN_OK)
        code = 0;
done:
    ids_free(g);
    free(buf);
    if (c)
        redis_sync_free(c);
    _exit(code);
}

static void test_two_processes(void)
{
    char path[2][64];
    int out_fd[2] = {-1, -1}, ready[2][2], go[2][2], workers[2] = {-1, -1};
    pid_t pid[2] = {-1, -1};
    int64_t *all = malloc(sizeof(int64_t) * 2 * CHILD_IDS);
    CHECK(all != NULL);
    if (!all)
        return;
    fflush(stdout); /* the children must not repeat buffered output */
    for (int i = 0; i < 2; i++) {
        snprintf(path[i], sizeof(path[i]), "/tmp/test_ids.%d.%d", (int)getpid(), i);
        out_fd[i] = open(path[i], O_RDWR | O_CREAT | O_TRUNC, 0600);
        CHECK(out_fd[i] >= 0);
        CHECK(pipe(ready[i]) == 0 && pipe(go[i]) == 0);
        pid[i] = fork();
        if (pid[i] == 0) {
            close(ready[i][0]);
            close(go[i][1]);
            child_main(ready[i][1], go[i][0], out_fd[i]);
        }
        CHECK(pid[i] > 0);
        close(ready[i][1]);
        close(go[i][0]);
    }
    /* both have claimed a worker before either generates: they run at the same time */
    for (int i = 0; i < 2; i++)
        CHECK(read(ready[i][0], &workers[i], sizeof(int)) == sizeof(int));
    for (int i = 0; i < 2; i++)
        CHECK(write(go[i][1], "g", 1) == 1);
    for (int i = 0; i < 2; i++) {
        int status = -1;
        CHECK(waitpid(pid[i], &status, 0) == pid[i]);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        close(ready[i][0]);
        close(go[i][1]);
    }
    CHECK(workers[0] >= 0 && workers[1] >= 0);
    CHECK(workers[0] != workers[1]);
    printf("  workers %d and %d\n", workers[0], workers[1]);

    size_t wrong_worker = 0;
    for (int i = 0; i < 2; i++) {
        int64_t *dst = all + (size_t)i * CHILD_IDS;
        ssize_t n = pread(out_fd[i], dst, sizeof(int64_t) * CHILD_IDS, 0);
        CHECK_EQ_INT(n, (ssize_t)(sizeof(int64_t) * CHILD_IDS));
        if (n != (ssize_t)(sizeof(int64_t) * CHILD_IDS))
            memset(dst, 0, sizeof(int64_t) * CHILD_IDS);
        for (size_t k = 0; k < CHILD_IDS; k++)
            wrong_worker += ids_worker_of(dst[k]) != workers[i];
        close(out_fd[i]);
        unlink(path[i]);
    }
    CHECK_EQ_INT(wrong_worker, 0);
    CHECK_EQ_INT(count_dups(all, 2 * CHILD_IDS), 0);
    free(all);

    redis_sync *c = redis_connect();
    if (c) {
        redis_del_prefix(c);
        redis_sync_free(c);
    }
}

int main(void)
{
    th_env("QUAN_REDIS_PORT");
    const char *lua = getenv("QUAN_LUA_DIR");
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    if (!g_scripts) {
        printf("cannot load the Lua scripts (QUAN_LUA_DIR)\n0 passed, 1 failed\n");
        return 1;
    }
    snprintf(prefix, sizeof(prefix), "quan:test:ids:%d:worker:", (int)getpid());
    RUN(test_layout);
    RUN(test_monotonic_one_thread);
    RUN(test_threads_unique);
    RUN(test_sequence_exhaustion_frozen_clock);
    RUN(test_clock_backwards);
    RUN(test_lease_deadline);
    RUN(test_lease_claim_renew_release);
    RUN(test_lease_all_taken);
    RUN(test_two_processes);
    redis_scripts_free(g_scripts);
    TEST_MAIN_END();
}
