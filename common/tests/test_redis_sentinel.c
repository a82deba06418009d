/*
 * Both Redis clients in a Sentinel deployment of their own (deploy/local/rsentinel.sh: a master,
 * a replica and three sentinels on free loopback ports): the settings checked, the master found
 * through the sentinels and confirmed, a wrong master name refused with a clear error, and the
 * clients following the master after SENTINEL FAILOVER and after the master is killed with
 * SIGKILL, within seconds; and, on two lone servers of the test's own, a replica the sentinels
 * name refused (ROLE), and a master turned replica under the clients left on its -READONLY.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "log.h"
#include "now.h"
#include "redis.h"
#include "redis_seen.h"
#include "redis_sync.h"
#include "rsentinel.h"
#include "testhelp.h"

#define FOLLOW_MS                                                                                  \
    20000 /* a failover (1 s to notice, a vote, a promotion) and the clients after it */

static char g_dir[128];
static int g_base;
static char g_sentinels[128];
static const char *g_lua_dir;

/* The first line redis-cli -p port prints for args into out; 0 when it exited 0. */
static int cli(int port, const char *args, char *out, size_t outlen)
{
    char cmd[1024], line[512] = "", rest[512];
    snprintf(cmd, sizeof(cmd), "redis-cli -h 127.0.0.1 -p %d %s 2>&1", port, args);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    if (!fgets(line, sizeof(line), p))
        line[0] = '\0';
    while (fgets(rest, sizeof(rest), p))
        ;
    int rc = pclose(p);
    line[strcspn(line, "\r\n")] = '\0';
    snprintf(out, outlen, "%s", line);
    return rc == 0 ? 0 : -1;
}

static const char *script(void)
{
    const char *root = getenv("QUAN_ROOT");
    static char path[512];
    snprintf(path, sizeof(path), "%s/deploy/local/rsentinel.sh", root && *root ? root : ".");
    return path;
}

static int set_start(void)
{
    char cmd[1024];
    th_tmpdir(g_dir, sizeof(g_dir), "quan-rsentinel");
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (int attempt = 0; attempt < 50 && !g_base; attempt++) {
        int b = 22000 + (rand() % 1000), ok = 1;
        for (int i = 0; i < 5 && ok; i++)
            ok = th_port_free(b + i);
        if (ok)
            g_base = b;
    }
    if (!g_base)
        return 0;
    snprintf(cmd, sizeof(cmd), "QUAN_INFRA_DURABILITY=fast %s start %s %d >%s/start.log 2>&1",
             script(), g_dir, g_base, g_dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "cat %s/start.log", g_dir);
        if (system(cmd) != 0)
            return 0;
        return 0;
    }
    snprintf(g_sentinels, sizeof(g_sentinels), "127.0.0.1:%d, 127.0.0.1:%d,127.0.0.1:%d",
             g_base + 2, g_base + 3, g_base + 4);
    return 1;
}

static void set_stop(void)
{
    char cmd[1024];
    if (!g_dir[0])
        return;
    snprintf(cmd, sizeof(cmd), "%s stop %s >/dev/null 2>&1", script(), g_dir);
    if (system(cmd) != 0)
        printf("   stopping %s failed\n", g_dir);
    th_rmtree(g_dir);
}

/* The master's port as the sentinels name it now (0 when none answers). */
static int set_master(void)
{
    char cmd[1024], line[64] = "";
    snprintf(cmd, sizeof(cmd), "%s master %s 2>/dev/null", script(), g_dir);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    if (!fgets(line, sizeof(line), p))
        line[0] = '\0';
    pclose(p);
    return atoi(line);
}

/* Until the sentinels name another master than was (and a replica is back in sync, so that the
 * next failover can happen): the new master's port, 0 on timeout. */
static int wait_new_master(int was)
{
    int64_t end = now_mono_ms() + FOLLOW_MS;
    while (now_mono_ms() < end) {
        int m = set_master();
        if (m && m != was)
            return m;
        usleep(100 * 1000);
    }
    return 0;
}

static redis_sync *sync_new(const char *name)
{
    redis_sync_opts o = {.sentinels = g_sentinels, .master_name = name, .timeout_ms = 1000};
    return redis_sync_new(&o);
}

/* One INCR through rs: 1 when it succeeded on the server of port want. */
static int sync_on(redis_sync *rs, int want)
{
    char name[32];
    snprintf(name, sizeof(name), "127.0.0.1:%d ", want);
    redisReply *r = redis_sync_command(rs, "INCR sentinel:sync");
    int ok = r && r->type == REDIS_REPLY_INTEGER;
    freeReplyObject(r);
    return ok && strncmp(redis_sync_node_name(rs, 0), name, strlen(name)) == 0;
}

static redis_client *async_new(struct event_base *base, const char *name)
{
    redis_opts o = {.sentinels = g_sentinels,
                    .master_name = name,
                    .connect_timeout_ms = 500,
                    .command_timeout_ms = 1000,
                    .lua_dir = g_lua_dir};
    return redis_client_new(base, &o);
}

/* One INCR through c: 1 when it succeeded on the server of port want. */
static int async_on(struct event_base *base, redis_client *c, int want)
{
    seen s = {0};
    if (redis_command(c, record_cb, &s, "INCR sentinel:async") == QN_OK)
        run_until(base, &s.calls, 2000);
    return s.calls == 1 && s.type == REDIS_REPLY_INTEGER && redis_client_ready(c) &&
           redis_client_node_port(c, 0) == want;
}

/* Both clients write, with the loop turning between (as in a service), until each writes on
 * the server of port want: the ms each took into *ts and *ta (-1: not within FOLLOW_MS). */
static void follow(struct event_base *base, redis_client *c, redis_sync *rs, int want, int64_t *ts,
                   int64_t *ta)
{
    int64_t t0 = now_mono_ms(), end = t0 + FOLLOW_MS;
    *ts = *ta = -1;
    while (now_mono_ms() < end && (*ts < 0 || *ta < 0)) {
        if (*ta < 0 && async_on(base, c, want))
            *ta = now_mono_ms() - t0;
        if (*ts < 0 && sync_on(rs, want))
            *ts = now_mono_ms() - t0;
        run_for(base, 20);
    }
}

static void test_check(void)
{
    char err[256];
    CHECK(rsentinel_check(NULL, NULL, NULL, err, sizeof(err)) == QN_OK);
    CHECK(rsentinel_check("", "", "a:1", err, sizeof(err)) == QN_OK);
    CHECK(rsentinel_check("a:1,b:2", "quan", "", err, sizeof(err)) == QN_OK);
    CHECK(rsentinel_check("a:1", "", NULL, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QUAN_REDIS_MASTER_NAME") && strstr(err, "both or neither"));
    CHECK(rsentinel_check("", "quan", NULL, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QUAN_REDIS_SENTINELS") && strstr(err, "both or neither"));
    CHECK(rsentinel_check("a:1", "quan", "c:3", err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QUAN_REDIS_CLUSTER_NODES") != NULL);
    CHECK(rsentinel_check("a:99999", "quan", NULL, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QUAN_REDIS_SENTINELS: \"a:99999\" is not host:port") != NULL);
    CHECK(rsentinel_check("a:1", "qu an", NULL, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QUAN_REDIS_MASTER_NAME: \"qu an\"") != NULL);
    /* The options of both clients say the same. */
    redis_sync_opts o = {.sentinels = "a:1", .cluster_nodes = "b:2", .master_name = "quan"};
    CHECK(redis_sync_new(&o) == NULL);
    o.cluster_nodes = NULL;
    o.master_name = NULL;
    CHECK(redis_sync_new(&o) == NULL);
}

static void test_resolve(void)
{
    char err[256];
    rcluster_addr a;
    /* The first sentinel is down: the next one answers. */
    char list[160];
    snprintf(list, sizeof(list), "127.0.0.1:%d,%s", g_base - 1, g_sentinels);
    rsentinel *s = rsentinel_new(list, "quan", err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    CHECK(rsentinel_resolve(s, 500, &a, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(a.host, "127.0.0.1");
    CHECK_EQ_INT(a.port, set_master());
    rsentinel_free(s);

    s = rsentinel_new(g_sentinels, "nosuch", err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    CHECK(rsentinel_resolve(s, 500, &a, err, sizeof(err)) == QN_ENOTFOUND);
    CHECK(strstr(err, "knows a master named \"nosuch\"") != NULL);
    rsentinel_free(s);

    /* None answers: within the budget, saying so. */
    snprintf(list, sizeof(list), "127.0.0.1:%d,127.0.0.1:%d", g_base - 1, g_base - 2);
    s = rsentinel_new(list, "quan", err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    int64_t t0 = now_mono_ms();
    CHECK(rsentinel_resolve(s, 300, &a, err, sizeof(err)) == QN_ERR);
    CHECK(now_mono_ms() - t0 < 1000);
    CHECK(strstr(err, "no sentinel of") != NULL);
    rsentinel_free(s);
}

/* A listener that never accepts: the kernel completes the connections, nothing ever answers,
 * as a sentinel on a host that swallows what it is sent (deterministic, unlike an unroutable
 * address). Its fd, its port into *port; -1 on failure. */
static int swallower_open(int *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

/* A 10 ms timer standing for the service's other work: the longest gap between its ticks. */
typedef struct ticker {
    int64_t last, max_gap;
} ticker;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    ticker *t = arg;
    int64_t now = now_mono_ms();
    (void)fd;
    (void)what;
    if (t->last && now - t->last > t->max_gap)
        t->max_gap = now - t->last;
    t->last = now;
}

/* The client made from a callback of the loop, as a service's reconnects run: a command sent at
 * once must fail as while disconnected. */
typedef struct starter {
    struct event_base *base;
    const char *sentinels;
    const char *lua_dir;
    redis_client *c;
    int64_t at;
    seen ping;
} starter;

static void on_start(evutil_socket_t fd, short what, void *arg)
{
    starter *st = arg;
    redis_opts o = {.sentinels = st->sentinels,
                    .master_name = "quan",
                    .connect_timeout_ms = 500,
                    .command_timeout_ms = 1000,
                    .lua_dir = st->lua_dir};
    (void)fd;
    (void)what;
    st->at = now_mono_ms();
    st->c = redis_client_new(st->base, &o);
    if (st->c && redis_command(st->c, record_cb, &st->ping, "PING") != QN_OK)
        st->ping.calls = -1;
}

/* The first sentinel swallows the question: the event loop's client must wait it out on the
 * loop's timers, the loop serving its other events meanwhile, and end on the master the next
 * sentinel names. No scripts: reading and hashing them in redis_client_new, and loading them
 * once connected, take tens of ms under ASan, which is not the lookup's to answer for. */
static void test_loop_unblocked(void)
{
    struct event_base *base = event_base_new();
    ticker t = {0};
    struct timeval ten = {0, 10 * 1000}, later = {0, 50 * 1000};
    struct event *tick = event_new(base, -1, EV_PERSIST, on_tick, &t);
    char list[160], nolua[160];
    int port = 0, fd = swallower_open(&port), took = -1, asked = -1;
    starter st = {.base = base, .sentinels = list, .lua_dir = nolua};

    snprintf(nolua, sizeof(nolua), "%s/nolua", g_dir);
    CHECK(fd >= 0 && tick != NULL && mkdir(nolua, 0700) == 0);
    if (fd < 0 || !tick)
        goto out;
    snprintf(list, sizeof(list), "127.0.0.1:%d,%s", port, g_sentinels);
    evtimer_add(tick, &ten);
    event_base_once(base, -1, EV_TIMEOUT, on_start, &st, &later);
    int64_t end = now_mono_ms() + 5000;
    while (now_mono_ms() < end && !(st.c && redis_client_ready(st.c)))
        run_for(base, 5);
    CHECK(st.c != NULL);
    if (!st.c)
        goto out;
    took = (int)(now_mono_ms() - st.at);
    /* The swallower was asked (its connection waits in the backlog) and waited out. */
    asked = accept(fd, NULL, NULL);
    printf("   first sentinel silent: ready in %d ms, the loop's longest gap between 10 ms ticks "
           "%lld ms\n",
           took, (long long)t.max_gap);
    CHECK(redis_client_ready(st.c));
    CHECK_EQ_INT(redis_client_node_port(st.c, 0), set_master());
    CHECK(asked >= 0);
    CHECK(took >= RSENTINEL_QUERY_MS - 10);
    CHECK(t.max_gap < RSENTINEL_QUERY_MS / 2);
    CHECK_EQ_INT(st.ping.calls, 1);
    CHECK_EQ_STR(st.ping.err, "not connected");
out:
    if (asked >= 0)
        close(asked);
    if (fd >= 0)
        close(fd);
    redis_client_free(st.c);
    if (tick)
        event_free(tick);
    event_base_free(base);
}

static void test_wrong_name(void)
{
    redis_sync *rs = sync_new("nosuch");
    CHECK(rs != NULL);
    if (rs) {
        CHECK(redis_sync_open(rs) != QN_OK);
        CHECK(strstr(redis_sync_errstr(rs), "knows a master named \"nosuch\"") != NULL);
        redisReply *r = redis_sync_command(rs, "PING");
        CHECK(r == NULL);
        freeReplyObject(r);
        redis_sync_free(rs);
    }
    struct event_base *base = event_base_new();
    redis_client *c = async_new(base, "nosuch");
    CHECK(c != NULL);
    if (c) {
        run_for(base, 500);
        CHECK(!redis_client_connected(c));
        seen s = {0};
        CHECK(redis_command(c, record_cb, &s, "PING") == QN_OK);
        run_until(base, &s.calls, 2000);
        CHECK_EQ_INT(s.calls, 1);
        CHECK(s.err[0] != '\0');
        redis_client_free(c);
    }
    event_base_free(base);
}

/* Both clients on the master; then they follow it through SENTINEL FAILOVER and through
 * SIGKILL of the master. */
static void test_follow(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = async_new(base, "quan");
    redis_sync *rs = sync_new("quan");
    int m0 = set_master();
    CHECK(c != NULL && rs != NULL && m0 == g_base);
    if (!c || !rs)
        goto out;

    int64_t ts, ta;
    follow(base, c, rs, m0, &ts, &ta);
    CHECK(ts >= 0 && ta >= 0);
    CHECK(redis_client_ready(c));

    /* A failover the sentinels are asked for. The old master takes writes until they
     * reconfigure it, some seconds later: the clients must leave it when the new one is
     * elected (+switch-master), not then. */
    char cmd[512], out[64];
    snprintf(cmd, sizeof(cmd), "sentinel failover quan");
    CHECK(cli(g_base + 2, cmd, out, sizeof(out)) == 0);
    CHECK_EQ_STR(out, "OK");
    int m1 = wait_new_master(m0);
    CHECK(m1 == g_base + 1);
    follow(base, c, rs, m1, &ts, &ta);
    printf("   after SENTINEL FAILOVER to %d: blocking client %lld ms, event loop's %lld ms\n", m1,
           (long long)ts, (long long)ta);
    CHECK(ts >= 0 && ts < 3000 && ta >= 0 && ta < 3000);

    /* Once reconfigured, the old master refuses writes (READONLY), which the clients also take
     * as "the master moved"; then it is a replica in sync again, ready for the next failover. */
    int64_t end = now_mono_ms() + FOLLOW_MS;
    int readonly = 0, synced = 0;
    while (now_mono_ms() < end && !(readonly && synced)) {
        char args[96], info[64] = "";
        readonly =
            cli(m0, "set sentinel:x 1", out, sizeof(out)) == 0 && strstr(out, "READONLY") != NULL;
        snprintf(args, sizeof(args), "info replication | grep -c 'slave0:.*state=online'");
        synced = cli(m1, args, info, sizeof(info)) == 0 && atoi(info) >= 1;
        run_for(base, 100);
    }
    CHECK(readonly && synced);

    /* The master killed: the replica is promoted once the sentinels agree it is down. */
    snprintf(cmd, sizeof(cmd), "%s kill %s %d >/dev/null 2>&1", script(), g_dir, m1);
    CHECK(system(cmd) == 0);
    int64_t t0 = now_mono_ms();
    int m2 = wait_new_master(m1);
    int64_t elected = now_mono_ms() - t0;
    CHECK(m2 == m0);
    follow(base, c, rs, m2, &ts, &ta);
    printf("   SIGKILL of %d, %d elected after %lld ms; then blocking client %lld ms, event "
           "loop's %lld ms\n",
           m1, m2, (long long)elected, (long long)ts, (long long)ta);
    CHECK(ts >= 0 && ts < 3000 && ta >= 0 && ta < 3000);
    /* Scripts are loaded on the new master before the client says ready. */
    CHECK(redis_client_ready(c));
out:
    redis_sync_free(rs);
    redis_client_free(c);
    event_base_free(base);
}

/* A lone redis-server of the test's own on a free port, in g_dir (daemonized: its pid file);
 * its port, 0 when it did not start. */
static int lone_start(const char *tag)
{
    char cmd[1024], out[64];
    for (int attempt = 0; attempt < 50; attempt++) {
        int p = 23000 + rand() % 1000;
        if (!th_port_free(p))
            continue;
        snprintf(cmd, sizeof(cmd),
                 "redis-server --bind 127.0.0.1 --port %d --save '' --appendonly no --daemonize "
                 "yes --dir %s --pidfile %s/%s.pid --logfile %s/%s.log >/dev/null 2>&1",
                 p, g_dir, g_dir, tag, g_dir, tag);
        if (system(cmd) != 0)
            return 0;
        for (int i = 0; i < 50; i++) {
            if (cli(p, "ping", out, sizeof(out)) == 0 && strcmp(out, "PONG") == 0)
                return p;
            usleep(100 * 1000);
        }
        return 0;
    }
    return 0;
}

static void lone_stop(const char *tag)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "test -s %s/%s.pid && kill $(cat %s/%s.pid) 2>/dev/null", g_dir, tag,
             g_dir, tag);
    if (system(cmd) != 0)
        printf("   %s was not running\n", tag);
}

/* Every sentinel watches master name ro at port (after forgetting what it watched as ro). */
static int sentinels_watch(int port)
{
    char args[128], out[64];
    int ok = 1;
    for (int i = 2; i < 5; i++) {
        (void)cli(g_base + i, "sentinel remove ro", out, sizeof(out));
        if (!port)
            continue;
        snprintf(args, sizeof(args), "sentinel monitor ro 127.0.0.1 %d 2", port);
        ok &= cli(g_base + i, args, out, sizeof(out)) == 0 && strcmp(out, "OK") == 0;
    }
    return ok;
}

/* The two checks the sentinels' word gets: a server they name must say master (ROLE), and a
 * server that turns replica under a live connection (an operator's REPLICAOF: nobody closes
 * the connections) refuses writes with -READONLY, on which both clients ask again. Two lone
 * servers of the test's own, watched as "ro", so the set of the other tests is not touched. */
static void test_role_and_readonly(void)
{
    struct event_base *base = event_base_new();
    redis_client *c = NULL;
    redis_sync *rs = NULL;
    char args[128], out[64];
    int y = lone_start("y"), z = lone_start("z");
    CHECK(y && z);
    if (!y || !z)
        goto out;

    /* Named a replica: refused. */
    snprintf(args, sizeof(args), "replicaof 127.0.0.1 %d", y);
    CHECK(cli(z, args, out, sizeof(out)) == 0);
    CHECK(sentinels_watch(z));
    rs = sync_new("ro");
    CHECK(rs && redis_sync_open(rs) != QN_OK);
    if (rs)
        CHECK(strstr(redis_sync_errstr(rs), "says it is master \"ro\"") != NULL);
    redis_sync_free(rs);
    rs = NULL;

    /* Named a master, which turns replica under the clients' connections. */
    CHECK(cli(z, "replicaof no one", out, sizeof(out)) == 0);
    rs = sync_new("ro");
    c = async_new(base, "ro");
    CHECK(rs && c);
    if (!rs || !c)
        goto out;
    CHECK(sync_on(rs, z));
    int on = 0;
    for (int64_t t0 = now_mono_ms(); !on && now_mono_ms() - t0 < 5000; run_for(base, 20))
        on = async_on(base, c, z);
    CHECK(on);
    snprintf(args, sizeof(args), "replicaof 127.0.0.1 %d", y);
    CHECK(cli(z, args, out, sizeof(out)) == 0);
    CHECK(sentinels_watch(y));

    redisReply *r = redis_sync_command(rs, "INCR sentinel:sync");
    CHECK(rsentinel_readonly(r));
    freeReplyObject(r);
    CHECK(sync_on(rs, y));
    seen s = {0};
    CHECK(redis_command(c, record_cb, &s, "INCR sentinel:async") == QN_OK);
    run_until(base, &s.calls, 2000);
    CHECK(s.calls == 1 && strncmp(s.err, "READONLY", 8) == 0);
    int64_t t0 = now_mono_ms(), ta = -1;
    while (ta < 0 && now_mono_ms() - t0 < 5000) {
        if (async_on(base, c, y))
            ta = now_mono_ms() - t0;
        run_for(base, 20);
    }
    printf("   after READONLY: the event loop's client on the new master in %lld ms\n",
           (long long)ta);
    CHECK(ta >= 0);
out:
    redis_sync_free(rs);
    redis_client_free(c);
    event_base_free(base);
    CHECK(sentinels_watch(0));
    if (y)
        lone_stop("y");
    if (z)
        lone_stop("z");
}

int main(void)
{
    const char *lua = getenv("QUAN_LUA_DIR");
    g_lua_dir = lua && *lua ? lua : "lua-scripts";
    log_init("test_redis_sentinel", LOGL_OFF);

    RUN(test_check);
    int64_t t0 = now_mono_ms();
    if (!set_start()) {
        printf("FAIL the sentinel set did not start\n");
        th_failed++;
        set_stop();
        TEST_MAIN_END();
    }
    printf("   sentinel set on %d..%d up in %lld ms\n", g_base, g_base + 4,
           (long long)(now_mono_ms() - t0));
    RUN(test_resolve);
    RUN(test_loop_unblocked);
    RUN(test_wrong_name);
    RUN(test_follow);
    RUN(test_role_and_readonly);
    set_stop();
    TEST_MAIN_END();
}
