/*
 * redis.c's client against a real Redis Cluster of its own (rcluster_help.h): routing by slot
 * to all three masters, a command across slots never sent, scripts on every master and the
 * NOSCRIPT fallback, MOVED after a slot moved, ASK while it moves, a replica promoted, a master
 * killed (errors only while its replica takes over), and the node API.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "log.h"
#include "now.h"
#include "rcluster_help.h"
#include "redis.h"
#include "redis_seen.h"
#include "rgen.h"
#include "rslot.h"
#include "rtrack.h"
#include "testhelp.h"

static rch_cluster g_k;
static const char *g_lua_dir;

static int wait_ready(struct event_base *base, redis_client *c, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    while (!redis_client_ready(c) && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    return redis_client_ready(c);
}

static redis_client *new_client(struct event_base *base)
{
    redis_opts o = {.cluster_nodes = g_k.nodes,
                    .connect_timeout_ms = 500,
                    .command_timeout_ms = 2000,
                    .lua_dir = g_lua_dir};
    return redis_client_new(base, &o);
}

/* One command, waited for: its seen. */
static seen cmd1(struct event_base *base, redis_client *c, const char *fmt, const char *a,
                 const char *b)
{
    seen s = {0};
    qn_status st =
        b ? redis_command(c, record_cb, &s, fmt, a, b) : redis_command(c, record_cb, &s, fmt, a);
    CHECK(st == QN_OK);
    if (st == QN_OK)
        run_until(base, &s.calls, 5000);
    return s;
}

/* The port of the master serving slot now, as the nodes' own view has it (CLUSTER NODES of
 * the first node that answers, every node asked in turn: one may be down); 0 if none. */
static int master_port_of_slot(int slot)
{
    for (int q = g_k.base; q < g_k.base + 6; q++) {
        char cmd[128], line[1024];
        int port = 0, answered = 0;
        snprintf(cmd, sizeof(cmd), "redis-cli -h 127.0.0.1 -p %d cluster nodes 2>/dev/null", q);
        FILE *p = popen(cmd, "r");
        if (!p)
            continue;
        while (fgets(line, sizeof(line), p)) {
            char *f[64];
            int n = 0;
            for (char *t = strtok(line, " \n"); t && n < 64; t = strtok(NULL, " \n"))
                f[n++] = t;
            if (n < 8)
                continue;
            answered = 1;
            if (!strstr(f[2], "master") || strstr(f[2], "fail"))
                continue;
            for (int i = 8; i < n; i++) {
                if (f[i][0] == '[')
                    continue; /* a slot being migrated or imported */
                long lo = strtol(f[i], NULL, 10), hi = lo;
                char *dash = strchr(f[i], '-');
                if (dash)
                    hi = strtol(dash + 1, NULL, 10);
                if (slot >= lo && slot <= hi)
                    port = atoi(strchr(f[1], ':') + 1);
            }
        }
        pclose(p);
        if (answered)
            return port;
    }
    return 0;
}

/* The node id of the server on port. */
static void node_id(int port, char *id, size_t len)
{
    rch_cli(port, "cluster myid", id, len);
}

/* What rtrack told: keys invalidated (by name) and how many times everything went. */
typedef struct {
    char keys[64][48];
    int nkeys;
    int all;
} told;

static void on_invalidate(const char *key, size_t len, void *arg)
{
    told *t = arg;
    if (!key) {
        t->all++;
        return;
    }
    if (t->nkeys < 64 && len < 48) {
        memcpy(t->keys[t->nkeys], key, len);
        t->keys[t->nkeys][len] = '\0';
        t->nkeys++;
    }
}

static int told_key(const told *t, const char *key)
{
    for (int i = 0; i < t->nkeys; i++)
        if (strcmp(t->keys[i], key) == 0)
            return 1;
    return 0;
}

static uint64_t wait_epoch(struct event_base *base, rtrack *tr, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    uint64_t e;
    while (!(e = rtrack_epoch(tr)) && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(1000);
    }
    return e;
}

/* ---------------------------------------------------------------- tests */

static void test_routes_every_key_to_its_master(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(c != NULL);
    CHECK(redis_client_cluster(c));
    CHECK(wait_ready(base, c, 8000));
    CHECK(redis_client_connected(c));
    int masters = 0;
    for (int i = 0; i < redis_client_node_count(c); i++)
        masters += redis_client_node_master(c, i);
    CHECK_EQ_INT(masters, 3);

    /* 300 keys land on all three masters; each reads back what was written. */
    seen sets[300], gets[300];
    char keys[300][32], vals[300][32];
    memset(sets, 0, sizeof(sets));
    memset(gets, 0, sizeof(gets));
    for (int i = 0; i < 300; i++) {
        snprintf(keys[i], sizeof(keys[i]), "quan:test:rc:{%d}", i);
        snprintf(vals[i], sizeof(vals[i]), "v%d", i * 7);
        CHECK(redis_command(c, record_cb, &sets[i], "SET %s %s", keys[i], vals[i]) == QN_OK);
        CHECK(redis_command(c, record_cb, &gets[i], "GET %s", keys[i]) == QN_OK);
    }
    int64_t end = now_mono_ms() + 5000;
    int done = 0;
    while (done < 600 && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        done = 0;
        for (int i = 0; i < 300; i++)
            done += sets[i].calls + gets[i].calls;
    }
    CHECK_EQ_INT(done, 600);
    for (int i = 0; i < 300; i++) {
        CHECK_EQ_STR(sets[i].err, "");
        CHECK_EQ_STR(gets[i].str, vals[i]);
    }
    /* Each master holds some of them (its own DBSIZE, node by node). */
    for (int n = 0; n < redis_client_node_count(c); n++) {
        if (!redis_client_node_master(c, n))
            continue;
        seen s = {0};
        CHECK(redis_command_node(c, n, record_cb, &s, "DBSIZE") == QN_OK);
        run_until(base, &s.calls, 3000);
        CHECK(s.integer > 50);
        CHECK(redis_client_node_first_slot(c, n) >= 0);
    }
    /* A keyless command goes to some master. */
    seen p2 = {0};
    CHECK(redis_command(c, record_cb, &p2, "PING") == QN_OK);
    run_until(base, &p2.calls, 3000);
    CHECK_EQ_STR(p2.str, "PONG");
    redis_client_free(c);
    event_base_free(base);
}

/* Keys in two slots: refused before anything is sent (the first key is still there). */
static void test_cross_slot_command_is_never_sent(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(wait_ready(base, c, 8000));
    seen s = cmd1(base, c, "SET %s %s", "quan:test:rc:cross:{a}", "1");
    CHECK_EQ_STR(s.str, "OK");
    s = cmd1(base, c, "DEL %s %s", "quan:test:rc:cross:{a}", "quan:test:rc:cross:{b}");
    CHECK_EQ_INT(s.calls, 1);
    CHECK(strncmp(s.err, "CROSSSLOT", 9) == 0);
    s = cmd1(base, c, "EXISTS %s", "quan:test:rc:cross:{a}", NULL);
    CHECK_EQ_INT(s.integer, 1);
    /* Transactions are refused on a cluster (a script does that), never sent: both clients'
     * rule (rcmd_admit). */
    static const char *const tx[] = {"MULTI", "EXEC", "DISCARD", "UNWATCH"};
    for (size_t i = 0; i < sizeof(tx) / sizeof(tx[0]); i++) {
        s = cmd1(base, c, tx[i], NULL, NULL);
        CHECK_EQ_INT(s.calls, 1);
        CHECK(!s.has_reply);
        CHECK(strstr(s.err, "transactions are refused") != NULL);
    }
    s = cmd1(base, c, "WATCH %s", "quan:test:rc:cross:{a}", NULL);
    CHECK(!s.has_reply && strstr(s.err, "transactions are refused") != NULL);
    /* The same keys under one tag go. */
    s = cmd1(base, c, "DEL %s %s", "quan:test:rc:cross:{a}", "quan:test:rc:cross:{a}:2");
    CHECK_EQ_INT(s.integer, 1);
    redis_client_free(c);
    event_base_free(base);
}

/* A connection lost with commands in flight: what only reads is sent again (and answered, the
 * node back after its reconnect), what may have run is not (its caller hears the outcome is
 * unknown) -- the rule both clients follow (rcmd_decide). The write here never ran (it waited
 * behind a blocked BLPOP when the server dropped the connection): sent again, it would have. */
static void test_lost_connection_resends_reads_only(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    seen blocked = {0}, write = {0}, read = {0}, later;
    char out[128];
    CHECK(wait_ready(base, c, 8000));
    later = cmd1(base, c, "SET %s %s", "quan:test:rc:{lost}v", "v1");
    CHECK_EQ_STR(later.str, "OK");
    later = cmd1(base, c, "DEL %s", "quan:test:rc:{lost}n", NULL);
    CHECK_EQ_INT(later.calls, 1);
    int port = master_port_of_slot(rslot_of_key("lost", 4));
    CHECK(port > 0);

    CHECK(redis_command(c, record_cb, &blocked, "BLPOP quan:test:rc:{lost}empty 3") == QN_OK);
    CHECK(redis_command(c, record_cb, &write, "INCR quan:test:rc:{lost}n") == QN_OK);
    CHECK(redis_command(c, record_cb, &read, "GET quan:test:rc:{lost}v") == QN_OK);
    run_for(base, 100);
    CHECK(rch_cli(port, "CLIENT KILL TYPE normal", out, sizeof(out)) == 0);
    run_until(base, &read.calls, 3000);
    CHECK_EQ_INT(read.calls, 1);
    CHECK_EQ_STR(read.str, "v1");
    CHECK_EQ_INT(blocked.calls, 1);
    CHECK(!blocked.has_reply);
    CHECK(strstr(blocked.err, "outcome is unknown") != NULL);
    CHECK_EQ_INT(write.calls, 1);
    CHECK(!write.has_reply);
    CHECK(strstr(write.err, "outcome is unknown") != NULL);
    later = cmd1(base, c, "GET %s", "quan:test:rc:{lost}n", NULL);
    CHECK_EQ_INT(later.type, REDIS_REPLY_NIL); /* the INCR did not run, and was not resent */
    run_for(base, 100);
    CHECK_EQ_INT(blocked.calls + write.calls + read.calls, 3);
    redis_client_free(c);
    event_base_free(base);
}

static void eval_cb_wait(struct event_base *base, redis_client *c, const char *key, seen *s)
{
    const char *keys[1] = {key};
    const char *args[1] = {"5"};
    memset(s, 0, sizeof(*s));
    CHECK(redis_eval(c, "incrby", 1, keys, 1, args, record_cb, s) == QN_OK);
    run_until(base, &s->calls, 5000);
}

/* Scripts are loaded on every master; a master that lost them is answered by the EVAL
 * fallback. */
static void test_scripts_on_every_master(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(wait_ready(base, c, 8000));
    for (int i = 0; i < 30; i++) {
        char key[48];
        seen s;
        snprintf(key, sizeof(key), "quan:test:rc:script:{%d}", i);
        eval_cb_wait(base, c, key, &s);
        CHECK_EQ_STR(s.err, "");
        CHECK_EQ_INT(s.integer, 5);
    }
    /* Every master has the script already (SCRIPT EXISTS on each). */
    const char *sha = redis_scripts_sha1(redis_client_scripts(c), "incrby");
    char args[80], out[64];
    for (int p = g_k.base; p < g_k.base + 6; p++) {
        rch_cli(p, "role", out, sizeof(out));
        if (strcmp(out, "master") != 0)
            continue;
        snprintf(args, sizeof(args), "script exists %s", sha);
        rch_cli(p, args, out, sizeof(out));
        CHECK_EQ_STR(out, "1");
        rch_cli(p, "script flush", NULL, 0);
    }
    for (int i = 0; i < 30; i++) {
        char key[48];
        seen s;
        snprintf(key, sizeof(key), "quan:test:rc:script:{%d}", i);
        eval_cb_wait(base, c, key, &s);
        CHECK_EQ_STR(s.err, "");
        CHECK_EQ_INT(s.integer, 10);
    }
    redis_client_free(c);
    event_base_free(base);
}

/* Moves one slot from its master to another by hand (IMPORTING / MIGRATING, MIGRATE of its
 * keys, then SETSLOT NODE everywhere). With stop_before_node, the slot is left half-moved
 * (keys already at the target): the source answers ASK. */
static void move_slot(int slot, int from, int to, const char *key, int stop_before_node)
{
    char from_id[64], to_id[64], a[256];
    node_id(from, from_id, sizeof(from_id));
    node_id(to, to_id, sizeof(to_id));
    snprintf(a, sizeof(a), "cluster setslot %d importing %s", slot, from_id);
    CHECK(rch_cli(to, a, NULL, 0) == 0);
    snprintf(a, sizeof(a), "cluster setslot %d migrating %s", slot, to_id);
    CHECK(rch_cli(from, a, NULL, 0) == 0);
    snprintf(a, sizeof(a), "migrate 127.0.0.1 %d %s 0 5000", to, key);
    char out[64];
    rch_cli(from, a, out, sizeof(out));
    CHECK_EQ_STR(out, "OK");
    if (stop_before_node)
        return;
    snprintf(a, sizeof(a), "cluster setslot %d node %s", slot, to_id);
    for (int p = g_k.base; p < g_k.base + 6; p++)
        rch_cli(p, a, NULL, 0);
}

static void finish_move(int slot, int to)
{
    char to_id[64], a[256];
    node_id(to, to_id, sizeof(to_id));
    snprintf(a, sizeof(a), "cluster setslot %d node %s", slot, to_id);
    for (int p = g_k.base; p < g_k.base + 6; p++)
        rch_cli(p, a, NULL, 0);
}

static int other_master(int not_port)
{
    char out[32];
    for (int p = g_k.base; p < g_k.base + 6; p++) {
        if (p == not_port)
            continue;
        rch_cli(p, "role", out, sizeof(out));
        if (strcmp(out, "master") == 0)
            return p;
    }
    return 0;
}

/* A slot moved behind the client's back: MOVED, and the command still answers. Then a slot
 * being moved: ASK to the importing node, once. */
static void test_moved_and_ask(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(wait_ready(base, c, 8000));
    const char *key = "quan:test:rc:moved:{m1}";
    int slot = rslot_of_key(key, strlen(key));
    seen s = cmd1(base, c, "SET %s %s", key, "before");
    CHECK_EQ_STR(s.str, "OK");
    int from = master_port_of_slot(slot);
    int to = other_master(from);
    CHECK(from > 0 && to > 0);
    unsigned long topo = redis_client_topology(c);
    move_slot(slot, from, to, key, 0);
    s = cmd1(base, c, "GET %s", key, NULL);
    CHECK_EQ_STR(s.err, "");
    CHECK_EQ_STR(s.str, "before");
    s = cmd1(base, c, "SET %s %s", key, "after");
    CHECK_EQ_STR(s.str, "OK");
    /* The map was asked again after the MOVED. */
    run_until(base, &(int){0}, 300);
    CHECK(redis_client_topology(c) != topo);
    CHECK_EQ_INT(master_port_of_slot(slot), to);

    /* ASK: the key is already at the importing node, the slot not yet assigned to it. */
    const char *key2 = "quan:test:rc:ask:{a2}";
    int slot2 = rslot_of_key(key2, strlen(key2));
    s = cmd1(base, c, "SET %s %s", key2, "asked");
    CHECK_EQ_STR(s.str, "OK");
    int from2 = master_port_of_slot(slot2);
    int to2 = other_master(from2);
    move_slot(slot2, from2, to2, key2, 1);
    s = cmd1(base, c, "GET %s", key2, NULL);
    CHECK_EQ_STR(s.err, "");
    CHECK_EQ_STR(s.str, "asked");
    finish_move(slot2, to2);
    s = cmd1(base, c, "GET %s", key2, NULL);
    CHECK_EQ_STR(s.str, "asked");
    redis_client_free(c);
    event_base_free(base);
}

/* CLUSTER FAILOVER on a replica: it becomes the master of its slots; the client follows and
 * loads the scripts there (EVALSHA answers without the fallback: the promoted node's script
 * cache is checked directly). */
static void test_replica_promoted(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    told t = {0};
    CHECK(wait_ready(base, c, 8000));
    rtrack_opts o = {.reader = c, .cb = on_invalidate, .arg = &t};
    rtrack *tr = rtrack_new(base, &o);
    uint64_t e1 = wait_epoch(base, tr, 5000);
    CHECK(e1 != 0);
    const char *key = "quan:test:rc:failover:{f1}";
    int slot = rslot_of_key(key, strlen(key));
    seen s = cmd1(base, c, "SET %s %s", key, "kept");
    CHECK_EQ_STR(s.str, "OK");
    int master = master_port_of_slot(slot);
    char master_id[64], out[128], a[128];
    node_id(master, master_id, sizeof(master_id));
    int replica = 0;
    for (int p = g_k.base; p < g_k.base + 6 && !replica; p++) {
        char line[256], cmd[256];
        rch_cli(p, "role", out, sizeof(out));
        if (strcmp(out, "slave") != 0)
            continue;
        snprintf(cmd, sizeof(cmd), "redis-cli -p %d cluster nodes | grep myself", p);
        FILE *f = popen(cmd, "r");
        if (f && fgets(line, sizeof(line), f) && strstr(line, master_id))
            replica = p;
        if (f)
            pclose(f);
    }
    CHECK(replica > 0);
    rch_cli(replica, "cluster failover", out, sizeof(out));
    CHECK_EQ_STR(out, "OK");
    int64_t end = now_mono_ms() + 10000;
    while (master_port_of_slot(slot) != replica && now_mono_ms() < end)
        usleep(100000);
    CHECK_EQ_INT(master_port_of_slot(slot), replica);
    s = cmd1(base, c, "GET %s", key, NULL);
    CHECK_EQ_STR(s.str, "kept");
    CHECK(wait_ready(base, c, 5000));
    const char *sha = redis_scripts_sha1(redis_client_scripts(c), "incrby");
    snprintf(a, sizeof(a), "script exists %s", sha);
    end = now_mono_ms() + 5000;
    do {
        run_until(base, &(int){0}, 100);
        rch_cli(replica, a, out, sizeof(out));
    } while (strcmp(out, "1") != 0 && now_mono_ms() < end);
    CHECK_EQ_STR(out, "1");
    /* The promoted master never saw the reader's reads: every copy went, and tracking is on
     * again under a new epoch. */
    uint64_t e2 = wait_epoch(base, tr, 5000);
    CHECK(e2 != 0 && e2 != e1);
    CHECK(t.all >= 1);
    rtrack_free(tr);
    redis_client_free(c);
    event_base_free(base);
}

/* The cluster's generation identity as rgen.h defines it, computed here from the nodes' own
 * INFO: the masters' run ids by first slot, joined with ','. */
static void cluster_identity(redis_client *c, char *out, size_t len)
{
    int firsts[64], ports[64], n = 0;
    for (int i = 0; i < redis_client_node_count(c); i++) {
        int f = redis_client_node_first_slot(c, i);
        if (f < 0)
            continue;
        int at = n++;
        while (at > 0 && firsts[at - 1] > f) {
            firsts[at] = firsts[at - 1];
            ports[at] = ports[at - 1];
            at--;
        }
        firsts[at] = f;
        ports[at] = redis_client_node_port(c, i);
    }
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        char cmd[128], line[128] = "";
        snprintf(cmd, sizeof(cmd), "redis-cli -p %d info server | grep '^run_id:' | cut -c8-47",
                 ports[i]);
        FILE *p = popen(cmd, "r");
        if (p) {
            if (!fgets(line, sizeof(line), p))
                line[0] = '\0';
            pclose(p);
        }
        line[strcspn(line, "\r\n")] = '\0';
        snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? "," : "", line);
    }
}

static int wait_rgen(struct event_base *base, const rgen *g, int want, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    while (rgen_ok(g) != want && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        usleep(2000);
    }
    return rgen_ok(g) == want;
}

/* The generation of a cluster names every master: current once quan:gen holds that, no longer
 * once a replica took over a master's slots. */
static void test_generation_names_every_master(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(wait_ready(base, c, 8000));
    rgen *g = rgen_new(base, c, 100);
    CHECK(g != NULL);
    seen s = cmd1(base, c, "DEL %s", RGEN_KEY, NULL);
    CHECK(wait_rgen(base, g, 0, 3000));
    char id[512], val[600];
    cluster_identity(c, id, sizeof(id));
    CHECK(strlen(id) == 3 * 40 + 2);
    snprintf(val, sizeof(val), "%s:1", id);
    s = cmd1(base, c, "SET %s %s", RGEN_KEY, val);
    CHECK_EQ_STR(s.str, "OK");
    CHECK(wait_rgen(base, g, 1, 3000));
    /* One master's run id alone is not the cluster's identity. */
    char one[64];
    snprintf(one, sizeof(one), "%.40s:1", id);
    s = cmd1(base, c, "SET %s %s", RGEN_KEY, one);
    CHECK(wait_rgen(base, g, 0, 3000));
    s = cmd1(base, c, "SET %s %s", RGEN_KEY, val);
    CHECK(wait_rgen(base, g, 1, 3000));
    /* A replica takes over: another run id serves those slots. */
    int replica = 0;
    char out[64];
    for (int p = g_k.base; p < g_k.base + 6 && !replica; p++) {
        rch_cli(p, "role", out, sizeof(out));
        if (strcmp(out, "slave") == 0)
            replica = p;
    }
    CHECK(replica > 0);
    /* TAKEOVER: the replica takes over without its master's handshake (a master just demoted by
     * the test before may still be catching up) and without the other masters' votes (a master
     * votes for one replica of a master per two node timeouts, and the test before may have had
     * that vote: the election would then wait or fail on a loaded machine). */
    rch_cli(replica, "cluster failover takeover", out, sizeof(out));
    CHECK_EQ_STR(out, "OK");
    int64_t until = now_mono_ms() + 10000;
    do {
        run_until(base, &(int){0}, 100);
        rch_cli(replica, "role", out, sizeof(out));
    } while (strcmp(out, "master") != 0 && now_mono_ms() < until);
    CHECK_EQ_STR(out, "master");
    CHECK(wait_rgen(base, g, 0, 10000));
    char id2[512];
    int64_t end = now_mono_ms() + 5000;
    do {
        event_base_loop(base, EVLOOP_NONBLOCK);
        cluster_identity(c, id2, sizeof(id2));
    } while (strcmp(id2, id) == 0 && now_mono_ms() < end);
    CHECK(strcmp(id2, id) != 0);
    rgen_free(g);
    redis_client_free(c);
    event_base_free(base);
}

/* A master dies: commands to its slots fail (never hang) until its replica takes over, then
 * answer again; commands to other masters answer throughout. */
static void test_master_killed(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = new_client(base);
    CHECK(wait_ready(base, c, 8000));
    const char *key = "quan:test:rc:kill:{k1}";
    int slot = rslot_of_key(key, strlen(key));
    seen s = cmd1(base, c, "SET %s %s", key, "survives");
    CHECK_EQ_STR(s.str, "OK");
    /* Replicated before the kill (the replica must hold it to serve it after). */
    int master = master_port_of_slot(slot);
    char out[64];
    rch_cli(master, "wait 1 2000", out, sizeof(out));
    CHECK_EQ_STR(out, "1");
    /* A key elsewhere. */
    char other[48];
    int other_slot = -1;
    for (int i = 0; i < 100 && other_slot < 0; i++) {
        snprintf(other, sizeof(other), "quan:test:rc:kill:{o%d}", i);
        int sl = rslot_of_key(other, strlen(other));
        if (master_port_of_slot(sl) != master)
            other_slot = sl;
    }
    s = cmd1(base, c, "SET %s %s", other, "x");
    CHECK_EQ_STR(s.str, "OK");

    rch_cli(master, "shutdown nosave", NULL, 0);
    int64_t start = now_mono_ms(), end = start + 20000, ok_after = 0;
    int errors = 0, other_errors = 0;
    while (now_mono_ms() < end) {
        s = cmd1(base, c, "GET %s", key, NULL);
        seen o = cmd1(base, c, "GET %s", other, NULL);
        if (o.err[0])
            other_errors++;
        if (s.err[0]) {
            errors++;
            continue;
        }
        CHECK_EQ_STR(s.str, "survives");
        ok_after = now_mono_ms() - start;
        break;
    }
    printf("  master killed: %d failed reads, answered again after %lld ms; other master: %d "
           "failed reads\n",
           errors, (long long)ok_after, other_errors);
    CHECK(ok_after > 0);
    CHECK_EQ_INT(other_errors, 0);
    /* The dead node comes back as a replica of its successor. */
    CHECK(rch_restart_dead(&g_k) == 0);
    CHECK(wait_ready(base, c, 10000));
    redis_client_free(c);
    event_base_free(base);
}

/* Tracking on every master: a key read through the reader on any master, then written by
 * another client, is told; a replica promoted ends the epoch. */
static void test_tracking_on_every_master(void)
{
    struct event_base *base = event_base_new();
    redis_client *reader = new_client(base), *writer = new_client(base);
    told t = {0};
    CHECK(wait_ready(base, reader, 8000) && wait_ready(base, writer, 8000));
    rtrack_opts o = {.reader = reader, .cb = on_invalidate, .arg = &t};
    rtrack *tr = rtrack_new(base, &o);
    CHECK(tr != NULL);
    uint64_t e1 = wait_epoch(base, tr, 5000);
    CHECK(e1 != 0);
    char keys[30][48];
    int masters_hit[64] = {0};
    for (int i = 0; i < 30; i++) {
        snprintf(keys[i], sizeof(keys[i]), "quan:test:rc:track:{%d}", i);
        seen w = cmd1(base, writer, "SET %s %s", keys[i], "1");
        CHECK_EQ_STR(w.str, "OK");
        seen r = cmd1(base, reader, "GET %s", keys[i], NULL);
        CHECK_EQ_STR(r.str, "1");
        masters_hit[master_port_of_slot(rslot_of_key(keys[i], strlen(keys[i]))) % 64] = 1;
    }
    int distinct = 0;
    for (int i = 0; i < 64; i++)
        distinct += masters_hit[i];
    CHECK_EQ_INT(distinct, 3);
    for (int i = 0; i < 30; i++) {
        seen w = cmd1(base, writer, "SET %s %s", keys[i], "2");
        CHECK_EQ_STR(w.str, "OK");
    }
    /* Told by the time the writer has its replies: rtrack_epoch reads what has arrived. */
    CHECK(rtrack_epoch(tr) == e1);
    for (int i = 0; i < 30; i++)
        CHECK(told_key(&t, keys[i]));
    CHECK_EQ_INT(t.all, 0);
    redis_client_free(writer);
    rtrack_free(tr);
    redis_client_free(reader);
    event_base_free(base);
}

static void write_file(const char *path, const char *content)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs(content, f);
    fclose(f);
}

int main(void)
{
    char lua[] = "/tmp/quan-test-rc-lua-XXXXXX", path[128];
    log_init("test_redis_cluster", getenv("QUAN_TEST_DEBUG") ? LOGL_DEBUG : LOGL_ERROR);
    if (!mkdtemp(lua)) {
        printf("0 passed, 1 failed\n");
        return 1;
    }
    snprintf(path, sizeof(path), "%s/incrby.lua", lua);
    write_file(path, "return redis.call('INCRBY', KEYS[1], ARGV[1])\n");
    g_lua_dir = lua;
    if (rch_start(&g_k) != 0) {
        printf("FAIL the cluster did not start\n0 passed, 1 failed\n");
        return 1;
    }
    RUN(test_routes_every_key_to_its_master);
    RUN(test_cross_slot_command_is_never_sent);
    RUN(test_lost_connection_resends_reads_only);
    RUN(test_scripts_on_every_master);
    RUN(test_tracking_on_every_master);
    RUN(test_moved_and_ask);
    RUN(test_replica_promoted);
    RUN(test_generation_names_every_master);
    RUN(test_master_killed);
    rch_stop(&g_k);
    unlink(path);
    rmdir(lua);
    TEST_MAIN_END();
}
