/*
 * redis_sync (the blocking client) against real servers: the single Redis that
 * integration-tests/run.sh starts (QUAN_REDIS_HOST/PORT), and a Redis Cluster of three masters
 * and three replicas this test starts itself with deploy/local/rcluster.sh on free ports (or
 * the one QUAN_REDIS_CLUSTER_NODES names: then the master restart, which needs the processes,
 * is skipped). Slots are moved, scripts flushed, a replica promoted and a master restarted
 * under the client; rgen's cluster identity is checked along the way.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "log.h"
#include "now.h"
#include "redis_sync.h"
#include "rgen.h"
#include "rslot.h"
#include "testhelp.h"

#define RCLUSTER "deploy/local/rcluster.sh"

static const char *g_host;
static int g_port;
static redis_scripts *g_scripts;

/* the cluster */
static char g_dir[512];
static int g_base;    /* 0: not ours (QUAN_REDIS_CLUSTER_NODES) */
static int g_started; /* ours is running: stop it at exit */
static char g_nodes[512];

static redis_sync *new_single(int timeout_ms)
{
    redis_sync_opts o = {.host = g_host, .port = g_port, .timeout_ms = timeout_ms};
    return redis_sync_new(&o);
}

static redis_sync *new_cluster(int timeout_ms)
{
    redis_sync_opts o = {.timeout_ms = timeout_ms, .cluster_nodes = g_nodes};
    return redis_sync_new(&o);
}

static long long integer_of(redisReply *r)
{
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
    freeReplyObject(r);
    return v;
}

/* The reply's text ("" for none or another type) into out. */
static void text_of(redisReply *r, char *out, size_t cap)
{
    snprintf(out, cap, "%s",
             r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? r->str : "");
    freeReplyObject(r);
}

/* A raw connection to one node, for what the test does behind the client's back. */
static redisContext *raw(int port)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        c = NULL;
    }
    return c;
}

static int port_of(const char *name)
{
    const char *colon = name ? strrchr(name, ':') : NULL;
    return colon ? atoi(colon + 1) : 0;
}

/* ---------------------------------------------------------------- single node */

static void test_nodes_check(void)
{
    char err[256];
    CHECK(redis_sync_nodes_check(NULL, err, sizeof(err)) == QN_OK);
    CHECK(redis_sync_nodes_check("", err, sizeof(err)) == QN_OK);
    CHECK(redis_sync_nodes_check("127.0.0.1:7000", err, sizeof(err)) == QN_OK);
    CHECK(redis_sync_nodes_check("a:1, b.example:65535,[::1]:7001", err, sizeof(err)) == QN_OK);
    CHECK(redis_sync_nodes_check("a:0", err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "\"a:0\"") != NULL);
    CHECK(redis_sync_nodes_check("a:65536", err, sizeof(err)) == QN_EINVAL);
    CHECK(redis_sync_nodes_check("a", err, sizeof(err)) == QN_EINVAL);
    CHECK(redis_sync_nodes_check(":7000", err, sizeof(err)) == QN_EINVAL);
    CHECK(redis_sync_nodes_check("a:1,", err, sizeof(err)) == QN_EINVAL);
    CHECK(redis_sync_nodes_check("a:x1", err, sizeof(err)) == QN_EINVAL);
    CHECK(redis_sync_nodes_check("::1:7000", err, sizeof(err)) == QN_EINVAL);
    redis_sync_opts bad = {.cluster_nodes = "a:99999"};
    CHECK(redis_sync_new(&bad) == NULL);
    redis_sync_opts none = {.port = 6379};
    CHECK(redis_sync_new(&none) == NULL);
}

/* One connection, made on first use and again on the call after it broke; never resent. */
static void test_single_connection(void)
{
    redis_sync *rs = new_single(2000);
    char v[64];
    CHECK(rs != NULL);
    if (!rs)
        return;
    CHECK(!redis_sync_is_cluster(rs));
    CHECK(redis_sync_broken(rs)); /* nothing connected yet */
    CHECK(redis_sync_open(rs) == QN_OK);
    CHECK(!redis_sync_broken(rs));
    freeReplyObject(redis_sync_command(rs, "SET %s %s", "quan:test:rsync:{s}", "one"));
    text_of(redis_sync_command(rs, "GET %s", "quan:test:rsync:{s}"), v, sizeof(v));
    CHECK_EQ_STR(v, "one");
    const char *argv[] = {"GET", "quan:test:rsync:{s}"};
    text_of(redis_sync_command_argv(rs, 2, argv, NULL), v, sizeof(v));
    CHECK_EQ_STR(v, "one");
    CHECK_EQ_INT(redis_sync_node_count(rs), 1);
    CHECK(port_of(redis_sync_node_name(rs, 0)) == g_port);
    text_of(redis_sync_node_command(rs, 0, "PING"), v, sizeof(v));
    CHECK_EQ_STR(v, "PONG");
    CHECK(redis_sync_node_command(rs, 1, "PING") == NULL);

    /* The server closes the connection: the next command fails (not sent again), the one
     * after connects anew. */
    freeReplyObject(redis_sync_command(rs, "QUIT"));
    CHECK(redis_sync_command(rs, "PING") == NULL);
    CHECK(redis_sync_errstr(rs)[0] != '\0');
    CHECK(redis_sync_broken(rs));
    text_of(redis_sync_command(rs, "PING"), v, sizeof(v));
    CHECK_EQ_STR(v, "PONG");
    CHECK(!redis_sync_broken(rs));
    freeReplyObject(redis_sync_command(rs, "DEL %s", "quan:test:rsync:{s}"));
    redis_sync_free(rs);

    redis_sync_opts o = {.host = g_host, .port = 1, .timeout_ms = 200};
    rs = redis_sync_new(&o);
    CHECK(rs && redis_sync_open(rs) == QN_ERR);
    CHECK(rs && redis_sync_command(rs, "PING") == NULL);
    CHECK(rs && strstr(redis_sync_errstr(rs), "127.0.0.1:1") != NULL);
    redis_sync_free(rs);
}

/* CROSSSLOT is refused before anything is sent, alone or in a pipeline (which keeps its
 * order). */
static void test_single_crossslot(void)
{
    redis_sync *rs = new_single(2000);
    redisReply *r = NULL;
    if (!rs)
        return;
    freeReplyObject(redis_sync_command(rs, "MSET %s 1 %s 2", "quan:test:{a}x", "quan:test:{a}y"));
    freeReplyObject(redis_sync_command(rs, "SET %s 3", "quan:test:{b}z"));
    CHECK(redis_sync_command(rs, "DEL %s %s", "quan:test:{a}x", "quan:test:{b}z") == NULL);
    CHECK(strncmp(redis_sync_errstr(rs), "CROSSSLOT", 9) == 0);
    CHECK(strstr(redis_sync_errstr(rs), "DEL") != NULL);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "EXISTS %s", "quan:test:{b}z")), 1);
    /* one slot: allowed */
    CHECK_EQ_INT(
        integer_of(redis_sync_command(rs, "EXISTS %s %s", "quan:test:{a}x", "quan:test:{a}y")), 2);
    redis_sync_append(rs, "GET %s", "quan:test:{a}x");
    redis_sync_append(rs, "MGET %s %s", "quan:test:{a}x", "quan:test:{b}z");
    redis_sync_append(rs, "GET %s", "quan:test:{b}z");
    CHECK_EQ_INT(redis_sync_pending(rs), 3);
    CHECK(redis_sync_get_reply(rs, &r) == QN_OK && r && r->type == REDIS_REPLY_STRING &&
          !strcmp(r->str, "1"));
    freeReplyObject(r);
    CHECK(redis_sync_get_reply(rs, &r) == QN_ERR && r == NULL);
    CHECK(strncmp(redis_sync_errstr(rs), "CROSSSLOT", 9) == 0);
    CHECK(redis_sync_get_reply(rs, &r) == QN_OK && r && r->type == REDIS_REPLY_STRING &&
          !strcmp(r->str, "3"));
    freeReplyObject(r);
    CHECK(redis_sync_get_reply(rs, &r) == QN_EINVAL);
    /* a malformed EVAL (numkeys past the arguments) is not sent either */
    CHECK(redis_sync_command(rs, "EVAL %s 3 %s", "return 1", "k") == NULL);
    freeReplyObject(redis_sync_command(rs, "DEL %s %s", "quan:test:{a}x", "quan:test:{a}y"));
    freeReplyObject(redis_sync_command(rs, "DEL %s", "quan:test:{b}z"));
    redis_sync_free(rs);
}

static void test_single_pipeline(void)
{
    redis_sync *rs = new_single(2000);
    redisReply *r = NULL;
    int bad = 0;
    if (!rs)
        return;
    for (int i = 0; i < 1000; i++) {
        char key[64];
        snprintf(key, sizeof(key), "quan:test:rsync:p{%d}", i);
        if (i % 2)
            redis_sync_append(rs, "GET %s", key);
        else
            redis_sync_append(rs, "SET %s %d", key, i);
    }
    for (int i = 0; i < 1000; i++) {
        if (redis_sync_get_reply(rs, &r) != QN_OK || !r) {
            bad++;
            continue;
        }
        if (i % 2 == 0 && r->type != REDIS_REPLY_STATUS)
            bad++;
        freeReplyObject(r);
    }
    CHECK_EQ_INT(bad, 0);
    /* replies only counted (no objects), an error reply seen as one */
    redis_sync_append(rs, "SET %s x", "quan:test:rsync:p{0}");
    redis_sync_append(rs, "INCR %s", "quan:test:rsync:p{0}");
    CHECK(redis_sync_get_reply(rs, NULL) == QN_OK);
    CHECK(redis_sync_get_reply(rs, NULL) == QN_ERR);
    /* several requests in one buffer */
    const char buf[] = "*3\r\n$3\r\nSET\r\n$18\r\nquan:test:rsync:f1\r\n$1\r\na\r\n"
                       "*2\r\n$3\r\nGET\r\n$18\r\nquan:test:rsync:f1\r\n";
    CHECK_EQ_INT(redis_sync_append_formatted(rs, buf, sizeof(buf) - 1), 2);
    CHECK(redis_sync_get_reply(rs, NULL) == QN_OK);
    CHECK(redis_sync_get_reply(rs, &r) == QN_OK && r && r->type == REDIS_REPLY_STRING &&
          !strcmp(r->str, "a"));
    freeReplyObject(r);
    CHECK_EQ_INT(redis_sync_append_formatted(rs, "*1\r\n$4\r\nPI", 11), 1);
    CHECK(redis_sync_get_reply(rs, NULL) == QN_ERR);
    /* a command while replies are unread: they are dropped, it gets its own */
    redis_sync_append(rs, "SET %s b", "quan:test:rsync:f1");
    redis_sync_append(rs, "GET %s", "quan:test:rsync:f1");
    char v[16];
    text_of(redis_sync_command(rs, "ECHO %s", "mine"), v, sizeof(v));
    CHECK_EQ_STR(v, "mine");
    CHECK_EQ_INT(redis_sync_pending(rs), 0);
    text_of(redis_sync_command(rs, "GET %s", "quan:test:rsync:f1"), v, sizeof(v));
    CHECK_EQ_STR(v, "b"); /* the appended commands were sent all the same */
    redis_sync_append(rs, "DEL %s", "quan:test:rsync:f1");
    redis_sync_discard(rs);
    CHECK_EQ_INT(redis_sync_pending(rs), 0);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "EXISTS %s", "quan:test:rsync:f1")), 0);
    for (int i = 0; i < 1000; i++)
        redis_sync_append(rs, "DEL quan:test:rsync:p{%d}", i);
    redis_sync_discard(rs);
    redis_sync_free(rs);
}

static void test_single_script(void)
{
    redis_sync *rs = new_single(2000);
    const char *keys[1] = {"quan:test:rsync:lock{x}"};
    const char *args[2] = {"tok", "3000"};
    redisReply *r;
    if (!rs || !g_scripts)
        goto out;
    freeReplyObject(redis_sync_command(rs, "DEL %s", keys[0]));
    freeReplyObject(redis_sync_command(rs, "SCRIPT FLUSH"));
    r = redis_sync_run_script(rs, g_scripts, "lock_acquire", 1, keys, 2, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "EXISTS %s", keys[0])), 1);
    r = redis_sync_run_script(rs, g_scripts, "lock_release", 1, keys, 1, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    CHECK(redis_sync_run_script(rs, g_scripts, "nope", 0, NULL, 0, NULL) == NULL);
    CHECK(strstr(redis_sync_errstr(rs), "unknown script") != NULL);
out:
    redis_sync_free(rs);
}

/* One node: the identity is its run id, as before clusters. */
static void test_single_generation(void)
{
    redis_sync *rs = new_single(2000);
    char run[RGEN_RUN_MAX], info[RGEN_RUN_MAX];
    if (!rs)
        return;
    CHECK(rgen_sync_run_id(rs, run) == QN_OK);
    CHECK_EQ_INT(strlen(run), 40);
    redisReply *r = redis_sync_command(rs, "INFO server");
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
    snprintf(info, sizeof(info), "%.40s", p ? p + 7 : "");
    freeReplyObject(r);
    CHECK_EQ_STR(run, info);
    redis_sync_free(rs);
}

/* ---------------------------------------------------------------- the cluster */

/* Six consecutive ports and their cluster bus ports (+10000) free, all below the ephemeral
 * range (outgoing connections take ports there at any moment). */
static int find_base(void)
{
    srand((unsigned)(getpid() ^ now_wall_ms()));
    for (int attempt = 0; attempt < 200; attempt++) {
        int base = 12000 + rand() % 10700, ok = 1;
        for (int i = 0; i < 6 && ok; i++)
            ok = th_port_free(base + i) && th_port_free(base + 10000 + i);
        if (ok)
            return base;
    }
    return 0;
}

static void cluster_stop(void)
{
    char cmd[1024];
    if (!g_started)
        return;
    g_started = 0;
    snprintf(cmd, sizeof(cmd), RCLUSTER " stop '%s' >/dev/null 2>&1", g_dir);
    if (system(cmd) != 0)
        printf("  could not stop the cluster in %s\n", g_dir);
    th_rmtree(g_dir);
}

static void on_signal(int sig)
{
    (void)sig;
    exit(1); /* atexit stops the cluster */
}

static int cluster_start(void)
{
    char cmd[2048];
    th_tmpdir(g_dir, sizeof(g_dir), "rsync-cluster");
    g_base = find_base();
    if (!g_base) {
        printf("  no free ports for a cluster\n");
        return 0;
    }
    g_started = 1;
    atexit(cluster_stop);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    snprintf(cmd, sizeof(cmd),
             "QUAN_INFRA_DURABILITY=fast QUAN_INFRA_TIMEOUT=40 " RCLUSTER
             " start '%s' %d >'%s/start.log' 2>&1",
             g_dir, g_base, g_dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "cat '%s/start.log'", g_dir);
        if (system(cmd) != 0)
            printf("  (no log)\n");
        return 0;
    }
    for (int i = 0; i < 6; i++) {
        size_t n = strlen(g_nodes);
        snprintf(g_nodes + n, sizeof(g_nodes) - n, "%s127.0.0.1:%d", i ? "," : "", g_base + i);
    }
    return 1;
}

/* A key "<prefix>{<n>}" whose slot master m (of the client's order) serves, but not the first
 * slot it serves (which the tests keep in place); *slot gets the slot, -1 if none. */
static void key_on(redis_sync *rs, int m, const char *prefix, char *key, size_t cap, int *slot)
{
    static char mine[RSLOT_COUNT];
    int lo = RSLOT_COUNT, port = port_of(redis_sync_node_name(rs, m));
    redisReply *r = redis_sync_node_command(rs, m, "CLUSTER SLOTS");
    memset(mine, 0, sizeof(mine));
    for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->element[2]->element[1]->integer != port)
            continue;
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
            mine[s] = 1;
        if (e->element[0]->integer < lo)
            lo = (int)e->element[0]->integer;
    }
    freeReplyObject(r);
    *slot = -1;
    for (int i = 0; i < 100000; i++) {
        snprintf(key, cap, "%s{%d}", prefix, i);
        int s = rslot_of_key(key, strlen(key));
        if (mine[s] && s != lo) {
            *slot = s;
            return;
        }
    }
}

/* How often node (port) ran or refused command name: calls + rejected_calls + failed_calls. */
static long long cmdstat(int port, const char *name)
{
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, "INFO commandstats") : NULL;
    long long n = 0;
    char tag[64];
    snprintf(tag, sizeof(tag), "cmdstat_%s:", name);
    const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, tag) : NULL;
    if (p) {
        const char *calls = strstr(p, "calls="), *rej = strstr(p, "rejected_calls="),
                   *fail = strstr(p, "failed_calls=");
        const char *eol = strchr(p, '\n');
        if (calls && (!eol || calls < eol))
            n += atoll(calls + 6);
        if (rej && (!eol || rej < eol))
            n += atoll(rej + 15);
        if (fail && (!eol || fail < eol))
            n += atoll(fail + 13);
    }
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return n;
}

static void flush_all(redis_sync *rs)
{
    int n = redis_sync_node_count(rs);
    for (int i = 0; i < n; i++)
        freeReplyObject(redis_sync_node_command(rs, i, "FLUSHALL"));
}

/* Keys of many slots land on all three masters and read back. */
static void test_cluster_spread(void)
{
    redis_sync *rs = new_cluster(2000);
    int per[3] = {0, 0, 0};
    char v[32];
    if (!rs)
        return;
    CHECK(redis_sync_is_cluster(rs));
    CHECK(redis_sync_open(rs) == QN_OK);
    CHECK_EQ_INT(redis_sync_node_count(rs), 3);
    flush_all(rs);
    for (int i = 0; i < 300; i++) {
        char key[64];
        snprintf(key, sizeof(key), "quan:test:spread:{%d}", i);
        freeReplyObject(redis_sync_command(rs, "SET %s %d", key, i));
    }
    for (int m = 0; m < 3; m++)
        per[m] = (int)integer_of(redis_sync_node_command(rs, m, "DBSIZE"));
    CHECK(per[0] > 50 && per[1] > 50 && per[2] > 50);
    CHECK_EQ_INT(per[0] + per[1] + per[2], 300);
    int wrong = 0;
    for (int i = 0; i < 300; i++) {
        char key[64], want[16];
        snprintf(key, sizeof(key), "quan:test:spread:{%d}", i);
        snprintf(want, sizeof(want), "%d", i);
        text_of(redis_sync_command(rs, "GET %s", key), v, sizeof(v));
        wrong += strcmp(v, want) != 0;
    }
    CHECK_EQ_INT(wrong, 0);
    /* the masters, by their first slot */
    for (int m = 0; m < 3; m++)
        CHECK(redis_sync_node_name(rs, m) != NULL);
    redis_sync_free(rs);
}

/* A command across two slots is refused by the client: no node ever sees it. */
static void test_cluster_crossslot(void)
{
    redis_sync *rs = new_cluster(2000);
    long long before = 0, after = 0;
    if (!rs)
        return;
    freeReplyObject(redis_sync_command(rs, "SET %s 1", "quan:test:{x1}"));
    freeReplyObject(redis_sync_command(rs, "SET %s 1", "quan:test:{x2}"));
    int n = redis_sync_node_count(rs);
    for (int m = 0; m < n; m++)
        before += cmdstat(port_of(redis_sync_node_name(rs, m)), "del");
    CHECK(redis_sync_command(rs, "DEL %s %s", "quan:test:{x1}", "quan:test:{x2}") == NULL);
    CHECK(strncmp(redis_sync_errstr(rs), "CROSSSLOT", 9) == 0);
    redis_sync_append(rs, "DEL %s %s", "quan:test:{x1}", "quan:test:{x2}");
    CHECK(redis_sync_get_reply(rs, NULL) == QN_ERR);
    const char *argv[] = {"EVAL", "return redis.call('DEL', KEYS[1], KEYS[2])", "2",
                          "quan:test:{x1}", "quan:test:{x2}"};
    CHECK(redis_sync_command_argv(rs, 5, argv, NULL) == NULL);
    CHECK(redis_sync_command(rs, "MULTI") == NULL);
    for (int m = 0; m < n; m++)
        after += cmdstat(port_of(redis_sync_node_name(rs, m)), "del");
    CHECK_EQ_INT(after, before);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "EXISTS %s", "quan:test:{x1}")), 1);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "EXISTS %s", "quan:test:{x2}")), 1);
    redis_sync_free(rs);
}

/* The id of the node on port. */
static void node_id(int port, char *id, size_t cap)
{
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, "CLUSTER MYID") : NULL;
    snprintf(id, cap, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    if (c)
        redisFree(c);
}

static int raw_ok(int port, const char *fmt, const char *a, const char *b, const char *c3)
{
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, fmt, a, b, c3) : NULL;
    int ok = r && r->type != REDIS_REPLY_ERROR;
    if (!ok)
        printf("  %d: %s: %s\n", port, fmt, r ? r->str : "no reply");
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* Keys of other tests in slot keep it from moving (SETSLOT NODE refuses while the source holds
 * keys of the slot): they are removed first. */
static void empty_slot(int port, int slot)
{
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, "CLUSTER GETKEYSINSLOT %d 1000", slot) : NULL;
    if (r && r->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < r->elements; i++)
            freeReplyObject(redisCommand(c, "DEL %b", r->element[i]->str, r->element[i]->len));
    freeReplyObject(r);
    if (c)
        redisFree(c);
}

/*
 * A slot moved by hand from master 0 to master 1 under a client that read the map before:
 * while it migrates, a key already moved is reached through ASK; once it is moved, through
 * MOVED. The generation identity does not change (the same servers hold the state).
 */
static void test_cluster_moved_ask(void)
{
    redis_sync *rs = new_cluster(2000);
    char k_old[64], k_new[64], v[32], src_id[64], dst_id[64], slot_s[16];
    char id_before[RGEN_RUN_MAX], id_after[RGEN_RUN_MAX];
    int slot = -1;
    if (!rs)
        return;
    CHECK_EQ_INT(redis_sync_node_count(rs), 3);
    CHECK(rgen_sync_run_id(rs, id_before) == QN_OK);
    int src = port_of(redis_sync_node_name(rs, 0)), dst = port_of(redis_sync_node_name(rs, 1));
    key_on(rs, 0, "quan:test:mv:a", k_old, sizeof(k_old), &slot);
    CHECK(slot >= 0);
    if (slot < 0)
        goto out;
    /* a second key of the same slot */
    snprintf(k_new, sizeof(k_new), "quan:test:mv:b{%s", strchr(k_old, '{') + 1);
    CHECK_EQ_INT(rslot_of_key(k_new, strlen(k_new)), slot);
    empty_slot(src, slot);
    freeReplyObject(redis_sync_command(rs, "SET %s old", k_old));
    node_id(src, src_id, sizeof(src_id));
    node_id(dst, dst_id, sizeof(dst_id));
    snprintf(slot_s, sizeof(slot_s), "%d", slot);
    CHECK(raw_ok(dst, "CLUSTER SETSLOT %s IMPORTING %s", slot_s, src_id, ""));
    CHECK(raw_ok(src, "CLUSTER SETSLOT %s MIGRATING %s", slot_s, dst_id, ""));

    /* migrating: the key still at the source is read there, a new one goes by ASK */
    long long asks = cmdstat(src, "set");
    text_of(redis_sync_command(rs, "GET %s", k_old), v, sizeof(v));
    CHECK_EQ_STR(v, "old");
    text_of(redis_sync_command(rs, "SET %s new", k_new), v, sizeof(v));
    CHECK_EQ_STR(v, "OK");
    CHECK(cmdstat(src, "set") > asks); /* the source answered ASK first */
    text_of(redis_sync_command(rs, "GET %s", k_new), v, sizeof(v));
    CHECK_EQ_STR(v, "new");
    {
        redisContext *c = raw(dst);
        redisReply *r = c ? redisCommand(c, "ASKING") : NULL;
        freeReplyObject(r);
        r = c ? redisCommand(c, "GET %s", k_new) : NULL;
        text_of(r, v, sizeof(v));
        CHECK_EQ_STR(v, "new"); /* it is on the destination */
        if (c)
            redisFree(c);
    }
    /* the old key moves: the source now says ASK for it too */
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", dst);
    {
        redisContext *c = raw(src);
        redisReply *r =
            c ? redisCommand(c, "MIGRATE 127.0.0.1 %s %s 0 5000 KEYS %s", port_s, "", k_old) : NULL;
        CHECK(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        if (c)
            redisFree(c);
    }
    text_of(redis_sync_command(rs, "GET %s", k_old), v, sizeof(v));
    CHECK_EQ_STR(v, "old");

    /* moved for good: every master is told (the destination first); the client's map still
     * says the source */
    int third = port_of(redis_sync_node_name(rs, 2));
    CHECK(raw_ok(dst, "CLUSTER SETSLOT %s NODE %s", slot_s, dst_id, ""));
    CHECK(raw_ok(src, "CLUSTER SETSLOT %s NODE %s", slot_s, dst_id, ""));
    CHECK(raw_ok(third, "CLUSTER SETSLOT %s NODE %s", slot_s, dst_id, ""));
    long long moved = cmdstat(src, "get");
    text_of(redis_sync_command(rs, "GET %s", k_old), v, sizeof(v));
    CHECK_EQ_STR(v, "old");
    CHECK(cmdstat(src, "get") > moved); /* the source answered MOVED */
    moved = cmdstat(src, "get");
    text_of(redis_sync_command(rs, "GET %s", k_new), v, sizeof(v));
    CHECK_EQ_STR(v, "new");
    CHECK_EQ_INT(cmdstat(src, "get"), moved); /* the map knows now */

    /* a slot moved: the same servers, the same identity */
    usleep(300 * 1000); /* the nodes agree on the new owner */
    CHECK(rgen_sync_run_id(rs, id_after) == QN_OK);
    CHECK_EQ_STR(id_after, id_before);
out:
    redis_sync_free(rs);
}

/* A master that lost its scripts: EVALSHA answers NOSCRIPT, the client sends the source. */
static void test_cluster_noscript(void)
{
    redis_sync *rs = new_cluster(2000);
    char key[64];
    int slot;
    const char *args[2] = {"tok", "3000"};
    if (!rs || !g_scripts)
        goto out;
    key_on(rs, 2, "quan:test:ns", key, sizeof(key), &slot);
    const char *keys[1] = {key};
    int port = port_of(redis_sync_node_name(rs, 2));
    const char *sha = redis_scripts_sha1(g_scripts, "lock_acquire");
    freeReplyObject(redis_sync_node_command(rs, 2, "SCRIPT FLUSH"));
    redisReply *r = redis_sync_node_command(rs, 2, "SCRIPT EXISTS %s", sha);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 0);
    freeReplyObject(r);
    long long evals = cmdstat(port, "eval");
    r = redis_sync_run_script(rs, g_scripts, "lock_acquire", 1, keys, 2, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    CHECK_EQ_INT(cmdstat(port, "eval"), evals + 1);
    r = redis_sync_node_command(rs, 2, "SCRIPT EXISTS %s", sha);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->element[0]->integer == 1);
    freeReplyObject(r);
    r = redis_sync_run_script(rs, g_scripts, "lock_release", 1, keys, 1, args);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
out:
    redis_sync_free(rs);
}

/* 1000 commands over many slots (and a refused one): every reply in the order appended. */
static void test_cluster_pipeline(void)
{
    redis_sync *rs = new_cluster(2000);
    int bad = 0, n = 0;
    redisReply *r;
    if (!rs)
        return;
    for (int i = 0; i < 500; i++) {
        char key[64];
        snprintf(key, sizeof(key), "quan:test:pipe:{%d}", i);
        redis_sync_append(rs, "SET %s %d", key, i);
        redis_sync_append(rs, "GET %s", key);
        n += 2;
        if (i == 250) {
            redis_sync_append(rs, "MGET %s quan:test:pipe:{x}", key);
            n++;
        }
    }
    CHECK_EQ_INT(redis_sync_pending(rs), n);
    for (int i = 0; i < 500; i++) {
        char want[16];
        snprintf(want, sizeof(want), "%d", i);
        if (redis_sync_get_reply(rs, &r) != QN_OK || !r || r->type != REDIS_REPLY_STATUS)
            bad++;
        freeReplyObject(r);
        if (redis_sync_get_reply(rs, &r) != QN_OK || !r || r->type != REDIS_REPLY_STRING ||
            strcmp(r->str, want))
            bad++;
        freeReplyObject(r);
        if (i == 250 && redis_sync_get_reply(rs, &r) != QN_ERR)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(redis_sync_get_reply(rs, &r) == QN_EINVAL);
    /* one buffer of many requests, as distribution writes wallets */
    char buf[64 * 200];
    size_t len = 0;
    for (int i = 0; i < 200; i++) {
        char key[64];
        int k = snprintf(key, sizeof(key), "quan:test:pipe:z{%d}", i);
        len += (size_t)snprintf(buf + len, sizeof(buf) - len,
                                "*4\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n$1\r\n1\r\n$1\r\nm\r\n", k, key);
    }
    CHECK_EQ_INT(redis_sync_append_formatted(rs, buf, len), 200);
    bad = 0;
    for (int i = 0; i < 200; i++)
        bad += redis_sync_get_reply(rs, NULL) != QN_OK;
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(integer_of(redis_sync_command(rs, "ZCARD %s", "quan:test:pipe:z{7}")), 1);
    redis_sync_free(rs);
}

/* SCAN on every master finds every key. */
static void test_cluster_scan(void)
{
    redis_sync *rs = new_cluster(2000);
    static char seen[1000];
    int found = 0, nodes;
    if (!rs)
        return;
    for (int i = 0; i < 1000; i++)
        redis_sync_append(rs, "SET quan:test:scan:{%d} 1", i);
    redis_sync_discard(rs);
    nodes = redis_sync_node_count(rs);
    CHECK_EQ_INT(nodes, 3);
    for (int m = 0; m < nodes; m++) {
        char cursor[32] = "0";
        do {
            redisReply *r = redis_sync_node_command(rs, m, "SCAN %s MATCH %s COUNT 100", cursor,
                                                    "quan:test:scan:*");
            if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2) {
                CHECK(0);
                freeReplyObject(r);
                break;
            }
            snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
            for (size_t k = 0; k < r->element[1]->elements; k++) {
                int i = atoi(strchr(r->element[1]->element[k]->str, '{') + 1);
                if (i >= 0 && i < 1000 && !seen[i]) {
                    seen[i] = 1;
                    found++;
                }
            }
            freeReplyObject(r);
        } while (strcmp(cursor, "0") != 0);
    }
    CHECK_EQ_INT(found, 1000);
    redis_sync_free(rs);
}

/* A command that may have run is not run again after its connection failed: a script that
 * counts, then outlives the client's timeout, ran once. */
static void test_cluster_no_second_run(void)
{
    redis_sync *rs = new_cluster(300);
    const char *key = "quan:test:once:{1}";
    if (!rs)
        return;
    freeReplyObject(redis_sync_command(rs, "DEL %s", key));
    redisReply *r = redis_sync_command(
        rs, "EVAL %s 1 %s",
        "redis.call('INCR', KEYS[1]) local t = redis.call('TIME') local e = t[1] * 1000000 + "
        "t[2] + 700000 repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] > e return 1",
        key);
    CHECK(r == NULL);
    CHECK(strstr(redis_sync_errstr(rs), "outcome is unknown") != NULL);
    freeReplyObject(r);
    usleep(800 * 1000);
    char v[16];
    redis_sync *rs2 = new_cluster(2000);
    text_of(rs2 ? redis_sync_command(rs2, "GET %s", key) : NULL, v, sizeof(v));
    CHECK_EQ_STR(v, "1");
    /* the first client goes on (its connection is made anew) */
    text_of(redis_sync_command(rs, "GET %s", key), v, sizeof(v));
    CHECK_EQ_STR(v, "1");
    redis_sync_free(rs2);
    redis_sync_free(rs);
}

/* The port of a replica of the master on port. */
static int replica_of(int port)
{
    char id[64];
    int rport = 0;
    node_id(port, id, sizeof(id));
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, "CLUSTER REPLICAS %s", id) : NULL;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements > 0) {
        /* "<id> <ip>:<port>@<bus> ..." */
        const char *colon = strchr(r->element[0]->str, ':');
        rport = colon ? atoi(colon + 1) : 0;
    }
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return rport;
}

static int is_master(int port)
{
    redisContext *c = raw(port);
    redisReply *r = c ? redisCommand(c, "ROLE") : NULL;
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            !strcmp(r->element[0]->str, "master");
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return m;
}

static int count_in(const char *list, const char *run)
{
    int n = 0;
    for (const char *p = list; (p = strstr(p, run)); p++)
        n++;
    return n;
}

/* A replica promoted (CLUSTER FAILOVER), then a master restarted empty: each time the state may
 * be another, and the identity changes; the client rides both out. */
static void test_cluster_generation(void)
{
    redis_sync *rs = new_cluster(2000);
    char id0[RGEN_RUN_MAX], id1[RGEN_RUN_MAX], id2[RGEN_RUN_MAX], v[32], key[64];
    int slot;
    if (!rs)
        return;
    CHECK(rgen_sync_run_id(rs, id0) == QN_OK);
    CHECK_EQ_INT(strlen(id0), 3 * 40 + 2);
    CHECK(rgen_sync_mark(rs, id0) == QN_OK);
    CHECK_EQ_INT(rgen_sync_current(rs), 1);
    CHECK(rgen_sync_mark(rs, "not-this-one") == QN_ERR);

    /* failover of master 1 to its replica */
    key_on(rs, 1, "quan:test:fo", key, sizeof(key), &slot);
    freeReplyObject(redis_sync_command(rs, "SET %s kept", key));
    int old = port_of(redis_sync_node_name(rs, 1)), rep = replica_of(old);
    CHECK(rep > 0);
    CHECK(rep > 0 && raw_ok(rep, "CLUSTER FAILOVER", "", "", ""));
    int64_t until = now_mono_ms() + 15000;
    while (rep > 0 && !is_master(rep) && now_mono_ms() < until)
        usleep(100 * 1000);
    CHECK(is_master(rep));
    usleep(500 * 1000); /* every node hears of it */
    /* the old master answers MOVED now; the client follows */
    text_of(redis_sync_command(rs, "GET %s", key), v, sizeof(v));
    CHECK_EQ_STR(v, "kept");
    CHECK(rgen_sync_run_id(rs, id1) == QN_OK);
    CHECK(strcmp(id1, id0) != 0);
    CHECK_EQ_INT(rgen_sync_current(rs), 0);
    char run_rep[64];
    {
        redisContext *c = raw(rep);
        redisReply *r = c ? redisCommand(c, "INFO server") : NULL;
        const char *p = r && r->type == REDIS_REPLY_STRING ? strstr(r->str, "run_id:") : NULL;
        snprintf(run_rep, sizeof(run_rep), "%.40s", p ? p + 7 : "?");
        freeReplyObject(r);
        if (c)
            redisFree(c);
    }
    CHECK_EQ_INT(count_in(id1, run_rep), 1);
    CHECK(rgen_sync_mark(rs, id1) == QN_OK);
    CHECK_EQ_INT(rgen_sync_current(rs), 1);

    if (!g_base) {
        printf("  (a cluster of QUAN_REDIS_CLUSTER_NODES: no master restart)\n");
        goto out;
    }
    /* master 2 killed and started again: empty (no persistence), a new run id */
    key_on(rs, 2, "quan:test:rs", key, sizeof(key), &slot);
    freeReplyObject(redis_sync_command(rs, "SET %s lost", key));
    int victim = port_of(redis_sync_node_name(rs, 2));
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "kill -9 $(awk -v p=%d '$1 == p { x = $2 } END { print x }' '%s/pids') && "
             "QUAN_INFRA_DURABILITY=fast QUAN_INFRA_TIMEOUT=40 " RCLUSTER
             " start '%s' %d >>'%s/start.log' 2>&1",
             victim, g_dir, g_dir, g_base, g_dir);
    CHECK(system(cmd) == 0);
    /* the client's connection to it is dead: found before writing, connected anew */
    until = now_mono_ms() + 15000;
    redisReply *r = NULL;
    while (now_mono_ms() < until) {
        r = redis_sync_command(rs, "SET %s %s", key, "again");
        if (r && r->type == REDIS_REPLY_STATUS)
            break;
        freeReplyObject(r);
        r = NULL;
        usleep(200 * 1000);
    }
    CHECK(r != NULL);
    freeReplyObject(r);
    CHECK(rgen_sync_run_id(rs, id2) == QN_OK);
    CHECK(strcmp(id2, id1) != 0);
    CHECK_EQ_INT(rgen_sync_current(rs), 0);
out:
    redis_sync_free(rs);
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR"), *nodes = getenv("QUAN_REDIS_CLUSTER_NODES");
    g_host = th_env("QUAN_REDIS_HOST");
    g_port = atoi(th_env("QUAN_REDIS_PORT"));
    log_init("test_redis_sync", LOGL_OFF);
    g_scripts = redis_scripts_load_dir(lua && *lua ? lua : "lua-scripts");
    CHECK(g_scripts != NULL);

    RUN(test_nodes_check);
    RUN(test_single_connection);
    RUN(test_single_crossslot);
    RUN(test_single_pipeline);
    RUN(test_single_script);
    RUN(test_single_generation);

    int64_t t0 = now_mono_ms();
    if (nodes && *nodes) {
        snprintf(g_nodes, sizeof(g_nodes), "%s", nodes);
    } else if (!cluster_start()) {
        printf("FAIL the cluster did not start\n");
        th_failed++;
        cluster_stop();
        TEST_MAIN_END();
    }
    printf("   cluster %s up in %lld ms\n", g_nodes, (long long)(now_mono_ms() - t0));
    RUN(test_cluster_spread);
    RUN(test_cluster_crossslot);
    RUN(test_cluster_moved_ask);
    RUN(test_cluster_noscript);
    RUN(test_cluster_pipeline);
    RUN(test_cluster_scan);
    RUN(test_cluster_no_second_run);
    RUN(test_cluster_generation);
    cluster_stop();
    redis_scripts_free(g_scripts);
    TEST_MAIN_END();
}
