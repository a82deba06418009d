/*
 * pgbatch against a real PostgreSQL (QUAN_DS0_DSN): an item goes alone when nothing is in
 * flight and waits for the next transaction otherwise; batches keep the order of arrival and
 * their bound; a group never has more than inflight_max transactions in flight while different
 * groups run side by side; the waiting bound and the pool's refusal are told to the submitter,
 * and a waiting batch the pool refuses later is answered without running;
 * every item's work is in the database exactly once.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "bridge.h"
#include "log.h"
#include "now.h"
#include "pgbatch.h"
#include "pgpool.h"
#include "testhelp.h"

#define MAX_ITEMS   64
#define MAX_BATCHES 64

static struct event_base *base;
static bridge *br;
static const char *dsn0;
static char table[64]; /* scratch table of this run: one row per item written */

typedef struct titem {
    int id;
    int64_t group;
    int done;
    qn_status st;
    int batch; /* index of the batch that answered it */
} titem;

/* What one test saw; the work function writes the atomics from the pool's threads. */
typedef struct seen {
    _Atomic int running[2]; /* transactions in flight per group (0, 1) */
    _Atomic int most[2];    /* the most at once */
    _Atomic int both;       /* both groups had one in flight at once */
    int sleep_ms;
    /* loop thread */
    int nbatches, ndone;
    size_t sizes[MAX_BATCHES];
    int first[MAX_BATCHES]; /* id of each batch's first item */
} seen;

static seen S;

static qn_status t_work(pgpool_conn *c, void *const *items, size_t n, void *arg)
{
    (void)arg;
    const titem *first = items[0];
    int g = (int)first->group;
    int now = atomic_fetch_add(&S.running[g], 1) + 1;
    int most = atomic_load(&S.most[g]);
    while (now > most && !atomic_compare_exchange_weak(&S.most[g], &most, now)) {
    }
    if (atomic_load(&S.running[0]) && atomic_load(&S.running[1]))
        atomic_store(&S.both, 1);
    char sql[256], ids[MAX_ITEMS * 8] = "{";
    for (size_t i = 0; i < n; i++) {
        const titem *it = items[i];
        snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), "%s%d", i ? "," : "", it->id);
    }
    strcat(ids, "}");
    const char *p[1] = {ids};
    snprintf(sql, sizeof(sql), "INSERT INTO %s SELECT unnest($1::int[]), pg_sleep(%g) IS NULL",
             table, S.sleep_ms / 1000.0);
    qn_status st = QN_ERR;
    if (pgpool_begin(c) == QN_OK && pgpool_exec_cmd(c, sql, 1, p, NULL) == QN_OK)
        st = pgpool_commit(c);
    else
        (void)pgpool_rollback(c);
    atomic_fetch_sub(&S.running[g], 1);
    return st;
}

static void t_done(qn_status st, void *const *items, size_t n, void *arg)
{
    (void)arg;
    int b = S.nbatches < MAX_BATCHES ? S.nbatches++ : MAX_BATCHES - 1;
    S.sizes[b] = n;
    S.first[b] = ((titem *)items[0])->id;
    for (size_t i = 0; i < n; i++) {
        titem *it = items[i];
        it->done++;
        it->st = st;
        it->batch = b;
        S.ndone++;
    }
}

static void wait_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    const int *target = arg;
    if (S.ndone >= *target)
        event_base_loopbreak(base);
}

/* Runs the loop until target items were answered or 10 s passed. */
static int loop_until_done(int target)
{
    struct event *ev = event_new(base, -1, EV_PERSIST, wait_tick, &target);
    struct timeval tv = {0, 2000}, limit = {10, 0};
    event_add(ev, &tv);
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    event_free(ev);
    return S.ndone >= target;
}

static pgpool *new_pool(int size, int queue_cap)
{
    pgpool_opts o = {.dsn = dsn0,
                     .name = "ds_0",
                     .application_name = "pgbatch-test",
                     .size = size,
                     .queue_cap = queue_cap};
    return pgpool_new(base, br, &o);
}

static pgbatch *new_batch(size_t batch_max, size_t wait_max, size_t inflight_max)
{
    pgbatch_opts o = {.batch_max = batch_max,
                      .wait_max = wait_max,
                      .inflight_max = inflight_max,
                      .work = t_work,
                      .done = t_done};
    return pgbatch_new(&o);
}

static pgpool_conn *admin_conn(void)
{
    pgpool_opts o = {.dsn = dsn0, .name = "admin", .application_name = "pgbatch-test-admin"};
    return pgpool_conn_open(&o);
}

/* SELECT what FROM the scratch table [where ...] */
static int64_t admin_int(const char *what, const char *where)
{
    char sql[256];
    snprintf(sql, sizeof(sql), "SELECT %s FROM %s %s", what, table, where);
    pgpool_conn *c = admin_conn();
    PGresult *r = pgpool_exec(c, sql, 0, NULL);
    int64_t v = r && PQntuples(r) ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : -1;
    PQclear(r);
    pgpool_conn_close(c);
    return v;
}

static void reset(int sleep_ms, titem *items, int n, int64_t group_of_odd)
{
    memset(&S, 0, sizeof(S));
    S.sleep_ms = sleep_ms;
    for (int i = 0; i < n; i++)
        items[i] = (titem){.id = i, .group = (i % 2) ? group_of_odd : 0, .batch = -1};
    char sql[128];
    snprintf(sql, sizeof(sql), "TRUNCATE %s", table);
    pgpool_conn *c = admin_conn();
    if (pgpool_exec_script(c, sql) != QN_OK)
        printf("  truncate failed: %s\n", pgpool_conn_error(c));
    pgpool_conn_close(c);
}

/* ------------------------------------------------------------------ tests */

static void test_alone_then_together(void)
{
    titem it[21];
    reset(100, it, 21, 0);
    pgpool *pool = new_pool(2, 64);
    pgbatch *b = new_batch(8, 64, 1);
    CHECK(pool && b);
    if (!pool || !b)
        goto out;
    for (int i = 0; i < 21; i++) /* the first flies alone, the others arrive while it does */
        CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[i]), QN_OK);
    CHECK(loop_until_done(21));
    CHECK_EQ_INT(S.nbatches, 4);
    size_t want[] = {1, 8, 8, 4};
    int first[] = {0, 1, 9, 17};
    for (int k = 0; k < 4 && k < S.nbatches; k++) {
        CHECK_EQ_INT(S.sizes[k], want[k]);
        CHECK_EQ_INT(S.first[k], first[k]);
    }
    for (int i = 0; i < 21; i++) { /* in arrival order, each answered once, with its batch's */
        CHECK_EQ_INT(it[i].done, 1);
        CHECK_EQ_INT(it[i].st, QN_OK);
        CHECK_EQ_INT(it[i].batch, i == 0 ? 0 : 1 + (i - 1) / 8);
    }
    CHECK_EQ_INT(atomic_load(&S.most[0]), 1);
    CHECK_EQ_INT(admin_int("count(DISTINCT id)", ""), 21);
    CHECK_EQ_INT(admin_int("count(*)", ""), 21);
out:
    pgbatch_free(b);
    pgpool_free(pool);
}

static void test_inflight_bound_and_groups(void)
{
    titem it[40];
    reset(60, it, 40, 1); /* even ids group 0, odd ids group 1 */
    pgpool *pool = new_pool(4, 64);
    pgbatch *b = new_batch(4, 64, 2);
    CHECK(pool && b);
    if (!pool || !b)
        goto out;
    for (int i = 0; i < 40; i++)
        CHECK_EQ_INT(pgbatch_submit(b, pool, it[i].group, &it[i]), QN_OK);
    CHECK(loop_until_done(40));
    CHECK_EQ_INT(atomic_load(&S.most[0]), 2); /* two at once per group, never three */
    CHECK_EQ_INT(atomic_load(&S.most[1]), 2);
    CHECK_EQ_INT(atomic_load(&S.both), 1);
    int per_group_batches[2] = {0, 0};
    for (int k = 0; k < S.nbatches; k++) {
        CHECK(S.sizes[k] >= 1 && S.sizes[k] <= 4);
        per_group_batches[S.first[k] % 2]++;
    }
    /* 20 items a group: two alone, then batches of at most four */
    for (int g = 0; g < 2; g++)
        CHECK(per_group_batches[g] >= 7 && per_group_batches[g] <= 12);
    for (int i = 0; i < 40; i++)
        CHECK(it[i].done == 1 && it[i].st == QN_OK);
    CHECK_EQ_INT(admin_int("count(DISTINCT id)", ""), 40);
    CHECK_EQ_INT(admin_int("count(*)", ""), 40);
out:
    pgbatch_free(b);
    pgpool_free(pool);
}

static void test_wait_bound(void)
{
    titem it[8];
    reset(100, it, 8, 0);
    pgpool *pool = new_pool(1, 64);
    pgbatch *b = new_batch(8, 4, 1);
    CHECK(pool && b);
    if (!pool || !b)
        goto out;
    for (int i = 0; i < 5; i++) /* one in flight, four waiting */
        CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[i]), QN_OK);
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[5]), QN_EBUSY);
    CHECK_EQ_INT(pgbatch_submit(b, pool, 7, &it[6]), QN_OK); /* another group has room */
    CHECK(loop_until_done(6));
    for (int i = 0; i < 7; i++)
        CHECK_EQ_INT(it[i].done, i == 5 ? 0 : 1);
    CHECK_EQ_INT(admin_int("count(*)", "WHERE id = 5"), 0);
    CHECK_EQ_INT(admin_int("count(*)", ""), 6);
out:
    pgbatch_free(b);
    pgpool_free(pool);
}

/* The pool's queue is full: the submitter is told at once, nothing is written, and the group
 * takes items again once the pool does. */
static qn_status t_block(pgpool_conn *c, void *arg)
{
    (void)arg;
    return pgpool_exec_cmd(c, "SELECT pg_sleep(0.3)", 0, NULL, NULL);
}

static int blocked_done;
static void t_block_done(qn_status st, void *arg)
{
    (void)st, (void)arg;
    blocked_done++;
}

/* 1 once the pool has in_use jobs running and queued waiting and the scratch table holds rows
 * rows, polled with the loop not running; 0 after 5 s. */
static int pool_reaches(pgpool *pool, int in_use, int queued, int64_t rows)
{
    int64_t deadline = now_mono_ms() + 5000;
    int u, q;
    do {
        pgpool_stats(pool, &u, &q);
        if (u == in_use && q == queued && admin_int("count(*)", "") == rows)
            return 1;
        usleep(10000);
    } while (now_mono_ms() < deadline);
    return 0;
}

/* Fills the pool of one thread and one queue slot: a job runs, another waits (rows: the
 * scratch table's, unchanged meanwhile). 1 when it did. */
static int fill_pool(pgpool *pool, int64_t rows)
{
    blocked_done = 0;
    return pgpool_submit(pool, t_block, t_block_done, NULL) == QN_OK &&
           pool_reaches(pool, 1, 0, rows) &&
           pgpool_submit(pool, t_block, t_block_done, NULL) == QN_OK;
}

/* Runs the loop until fill_pool's two jobs are done (5 s at most). */
static void drain_pool(void)
{
    int64_t deadline = now_mono_ms() + 5000;
    while (blocked_done < 2 && now_mono_ms() < deadline)
        event_base_loop(base, EVLOOP_ONCE);
}

static void test_pool_refusal(void)
{
    titem it[2];
    reset(0, it, 2, 0);
    pgpool *pool = new_pool(1, 1);
    pgbatch *b = new_batch(8, 64, 1);
    CHECK(pool && b);
    if (!pool || !b)
        goto out;
    CHECK(fill_pool(pool, 0));
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[0]), QN_EBUSY);
    drain_pool();
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[1]), QN_OK);
    CHECK(loop_until_done(1));
    CHECK(it[0].done == 0 && it[1].done == 1 && it[1].st == QN_OK);
    CHECK_EQ_INT(admin_int("count(*)", ""), 1);
out:
    pgbatch_free(b);
    pgpool_free(pool);
}

/* A batch that waited while another flew is handed to the pool only when that one's done runs
 * on the loop thread; a pool full at that moment refuses it. Its items are answered QN_EBUSY,
 * its work never runs, the batch in flight keeps its own answer, and the group takes items
 * again afterwards. The loop is held still while the pool fills, so the refusal is certain. */
static void test_later_batch_refused(void)
{
    titem it[3];
    reset(100, it, 3, 0);
    pgpool *pool = new_pool(1, 1);
    pgbatch *b = new_batch(8, 64, 1);
    CHECK(pool && b);
    if (!pool || !b)
        goto out;
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[0]), QN_OK); /* flies, 100 ms */
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[1]), QN_OK); /* waits for it */
    /* it[0]'s work ends (its row committed, the pool's thread free); its done waits for the
     * loop while the pool fills. */
    CHECK(pool_reaches(pool, 0, 0, 1));
    CHECK(fill_pool(pool, 1));
    CHECK(loop_until_done(2));
    CHECK(it[0].done == 1 && it[0].st == QN_OK);
    CHECK(it[1].done == 1 && it[1].st == QN_EBUSY);
    CHECK_EQ_INT(S.nbatches, 2);
    drain_pool();
    CHECK_EQ_INT(pgbatch_submit(b, pool, 0, &it[2]), QN_OK);
    CHECK(loop_until_done(3));
    CHECK(it[2].done == 1 && it[2].st == QN_OK);
    CHECK_EQ_INT(admin_int("count(*)", "WHERE id = 1"), 0);
    CHECK_EQ_INT(admin_int("count(*)", ""), 2);
out:
    pgbatch_free(b);
    pgpool_free(pool);
}

static void test_bad_options(void)
{
    pgbatch_opts o = {
        .batch_max = 1, .wait_max = 1, .inflight_max = 0, .work = t_work, .done = t_done};
    CHECK(pgbatch_new(&o) == NULL);
    o.inflight_max = 1;
    o.work = NULL;
    CHECK(pgbatch_new(&o) == NULL);
}

int main(void)
{
    log_init("test_pgbatch", LOGL_ERROR);
    dsn0 = th_env("QUAN_DS0_DSN");
    base = event_base_new();
    br = bridge_new(base);
    snprintf(table, sizeof(table), "pgbatch_test_%d", (int)getpid());

    char sql[128];
    snprintf(sql, sizeof(sql), "CREATE TABLE %s (id int NOT NULL, slept bool)", table);
    pgpool_conn *admin = admin_conn();
    if (!pgpool_conn_ok(admin) || pgpool_exec_script(admin, sql) != QN_OK) {
        printf("  setup failed: %s\n0 passed, 1 failed\n", pgpool_conn_error(admin));
        return 1;
    }

    RUN(test_alone_then_together);
    RUN(test_inflight_bound_and_groups);
    RUN(test_wait_bound);
    RUN(test_pool_refusal);
    RUN(test_later_batch_refused);
    RUN(test_bad_options);

    snprintf(sql, sizeof(sql), "DROP TABLE IF EXISTS %s", table);
    if (pgpool_exec_script(admin, sql) != QN_OK)
        printf("  cleanup failed: %s\n", pgpool_conn_error(admin));
    pgpool_conn_close(admin);
    bridge_free(br);
    event_base_free(base);
    TEST_MAIN_END();
}
