/* A Redis Cluster's nodes, slot map and reply verdicts (rcluster.h), without a server: the
 * replies are built here as hiredis would hand them over. */
#include <stdio.h>
#include <string.h>

#include "rcluster.h"
#include "testhelp.h"

static void test_addr_parse(void)
{
    static const struct {
        const char *in;
        int strict, ok;
        const char *host;
        int port;
    } v[] = {
        {"127.0.0.1:7000", 1, 1, "127.0.0.1", 7000},
        {"redis-0.redis:6379", 1, 1, "redis-0.redis", 6379},
        {"[::1]:7000", 1, 1, "::1", 7000},
        {"::1:7000", 1, 0, NULL, 0},     /* a bare v6 host is ambiguous in configuration */
        {"::1:7000", 0, 1, "::1", 7000}, /* ... a redirect's ip:port splits at the last colon */
        {":7000", 1, 0, NULL, 0},
        {":7000", 0, 1, "", 7000}, /* a redirect without an ip: the node that answered */
        {"host:0", 1, 0, NULL, 0},
        {"host:65536", 1, 0, NULL, 0},
        {"host:65535", 1, 1, "host", 65535},
        {"host:7x", 1, 0, NULL, 0},
        {"host:", 1, 0, NULL, 0},
        {"host", 1, 0, NULL, 0},
        {"[::1]7000", 1, 0, NULL, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        rcluster_addr a;
        int ok = rcluster_addr_parse(v[i].in, strlen(v[i].in), &a, v[i].strict);
        if (ok != v[i].ok)
            printf("  case \"%s\" strict=%d\n", v[i].in, v[i].strict);
        CHECK_EQ_INT(ok, v[i].ok);
        if (ok && v[i].ok) {
            CHECK_EQ_STR(a.host, v[i].host);
            CHECK_EQ_INT(a.port, v[i].port);
        }
    }
}

static void test_addrs_parse(void)
{
    rcluster_addr a[4];
    char err[128];
    CHECK_EQ_INT(rcluster_addrs_parse("a:1, b:2 ,\t[::1]:3", a, 4, err, sizeof(err)), 3);
    CHECK_EQ_STR(a[1].host, "b");
    CHECK_EQ_STR(a[2].host, "::1");
    CHECK_EQ_INT(rcluster_addrs_parse("a:1,b:2", NULL, 4, err, sizeof(err)), 2);
    CHECK_EQ_INT(rcluster_addrs_parse("a:1,b", a, 4, err, sizeof(err)), -1);
    CHECK(strstr(err, "\"b\" is not host:port") != NULL);
    CHECK_EQ_INT(rcluster_addrs_parse("a:1,b:2,c:3", a, 2, err, sizeof(err)), -1);
    CHECK(strstr(err, "more than 2") != NULL);
    CHECK_EQ_INT(rcluster_addrs_parse("", a, 4, err, sizeof(err)), -1);
    CHECK(strstr(err, "no host:port") != NULL);
    CHECK_EQ_INT(rcluster_addrs_parse("a:1,", a, 4, err, sizeof(err)), -1);
    CHECK(strstr(err, "\"\" is not host:port") != NULL);
}

static redisReply err_reply(const char *s)
{
    redisReply r = {.type = REDIS_REPLY_ERROR, .str = (char *)s, .len = strlen(s)};
    return r;
}

static void test_verdicts(void)
{
    static const struct {
        const char *err;
        rcluster_verdict v;
        int slot;
        const char *host;
        int port;
    } v[] = {
        {"MOVED 3999 127.0.0.1:6381", RCLUSTER_MOVED, 3999, "127.0.0.1", 6381},
        {"ASK 3999 127.0.0.1:6381", RCLUSTER_ASK, 3999, "127.0.0.1", 6381},
        {"MOVED 16383 :6381", RCLUSTER_MOVED, 16383, "", 6381},
        {"MOVED 16384 127.0.0.1:6381", RCLUSTER_FINAL, 0, NULL, 0},
        {"MOVED x 127.0.0.1:6381", RCLUSTER_FINAL, 0, NULL, 0},
        {"MOVED 12 nowhere", RCLUSTER_FINAL, 0, NULL, 0},
        {"TRYAGAIN Multiple keys request during rehashing of slot", RCLUSTER_RETRY, 0, NULL, 0},
        {"CLUSTERDOWN The cluster is down", RCLUSTER_RETRY, 0, NULL, 0},
        {"LOADING Redis is loading the dataset in memory", RCLUSTER_RETRY, 0, NULL, 0},
        {"NOSCRIPT No matching script", RCLUSTER_FINAL, 0, NULL, 0},
        {"ERR wrong number of arguments", RCLUSTER_FINAL, 0, NULL, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        redisReply r = err_reply(v[i].err);
        int slot = -1;
        rcluster_addr to = {"", 0};
        rcluster_verdict got = rcluster_verdict_of(&r, &slot, &to);
        if (got != v[i].v)
            printf("  case \"%s\"\n", v[i].err);
        CHECK_EQ_INT(got, v[i].v);
        if (got == RCLUSTER_MOVED || got == RCLUSTER_ASK) {
            CHECK_EQ_INT(slot, v[i].slot);
            CHECK_EQ_STR(to.host, v[i].host);
            CHECK_EQ_INT(to.port, v[i].port);
        }
    }
    redisReply ok = {.type = REDIS_REPLY_STATUS, .str = (char *)"MOVED 1 a:1", .len = 11};
    int slot;
    rcluster_addr to;
    CHECK_EQ_INT(rcluster_verdict_of(&ok, &slot, &to), RCLUSTER_FINAL); /* not an error */
    CHECK_EQ_INT(rcluster_verdict_of(NULL, &slot, &to), RCLUSTER_FINAL);
}

/* A CLUSTER SLOTS reply of up to 4 ranges, built in place. */
typedef struct slots_reply {
    redisReply top, range[4], *range_p[4], field[4][3], *field_p[4][3], node[4][2], *node_p[4][2];
    char host[4][32];
} slots_reply;

static const redisReply *slots_of(slots_reply *b, int n, const int from[], const int to[],
                                  const char *const host[], const int port[])
{
    memset(b, 0, sizeof(*b));
    b->top.type = REDIS_REPLY_ARRAY;
    b->top.elements = (size_t)n;
    b->top.element = b->range_p;
    for (int i = 0; i < n; i++) {
        snprintf(b->host[i], sizeof(b->host[i]), "%s", host[i]);
        b->node[i][0] =
            (redisReply){.type = REDIS_REPLY_STRING, .str = b->host[i], .len = strlen(b->host[i])};
        b->node[i][1] = (redisReply){.type = REDIS_REPLY_INTEGER, .integer = port[i]};
        b->node_p[i][0] = &b->node[i][0];
        b->node_p[i][1] = &b->node[i][1];
        b->field[i][0] = (redisReply){.type = REDIS_REPLY_INTEGER, .integer = from[i]};
        b->field[i][1] = (redisReply){.type = REDIS_REPLY_INTEGER, .integer = to[i]};
        b->field[i][2] =
            (redisReply){.type = REDIS_REPLY_ARRAY, .elements = 2, .element = b->node_p[i]};
        for (int k = 0; k < 3; k++)
            b->field_p[i][k] = &b->field[i][k];
        b->range[i] =
            (redisReply){.type = REDIS_REPLY_ARRAY, .elements = 3, .element = b->field_p[i]};
        b->range_p[i] = &b->range[i];
    }
    return &b->top;
}

typedef struct told {
    int n, refuse_at;
    rcluster_addr a[8];
} told;

static int on_new(void *ctx, int node, const rcluster_addr *a)
{
    told *t = ctx;
    if (node == t->refuse_at || node != t->n)
        return -1;
    t->a[t->n++] = *a;
    return 0;
}

static void test_map(void)
{
    rcluster_map m;
    told t = {.refuse_at = -1};
    char err[160];
    slots_reply b;
    const rcluster_addr from = {"10.0.0.9", 7009};
    rcluster_map_init(&m, 4, on_new, &t);
    CHECK_EQ_INT(rcluster_map_master(&m, 0), -1); /* no map yet: no table either */
    CHECK(!rcluster_map_is_master(&m, 0));
    rcluster_map_moved(&m, 0, 0); /* nothing to move */

    /* Three masters, listed out of order; the third does not know its own ip. */
    const int from3[] = {10923, 0, 5461}, to3[] = {16383, 5460, 10922};
    const int port3b[] = {7002, 7000, 7009};
    const char *host3[] = {"10.0.0.2", "10.0.0.0", "?"};
    CHECK_EQ_INT(
        rcluster_map_apply(&m, slots_of(&b, 3, from3, to3, host3, port3b), &from, err, sizeof(err)),
        QN_OK);
    CHECK_EQ_INT(m.nnodes, 3);
    CHECK_EQ_INT(t.n, 3); /* each node told, in index order */
    CHECK_EQ_STR(t.a[2].host, "10.0.0.9");
    CHECK(m.have_map && m.complete);
    CHECK_EQ_INT(m.topology, 1);
    CHECK_EQ_INT(m.nmasters, 3);
    CHECK_EQ_INT(m.first_slot[m.masters[0]], 0); /* masters by first slot */
    CHECK_EQ_INT(m.first_slot[m.masters[1]], 5461);
    CHECK_EQ_INT(m.first_slot[m.masters[2]], 10923);
    CHECK_EQ_INT(m.slot[0], 1);
    CHECK_EQ_INT(m.slot[16383], 0);
    CHECK_EQ_INT(rcluster_map_find(&m, &from), 2);

    /* The same map again: nothing moved. */
    CHECK_EQ_INT(
        rcluster_map_apply(&m, slots_of(&b, 3, from3, to3, host3, port3b), &from, err, sizeof(err)),
        QN_OK);
    CHECK_EQ_INT(m.topology, 1);

    /* MOVED: one slot at once. */
    rcluster_map_moved(&m, 0, 0);
    CHECK_EQ_INT(m.slot[0], 0);
    CHECK_EQ_INT(m.topology, 2);
    rcluster_map_moved(&m, 0, 0);
    CHECK_EQ_INT(m.topology, 2);
    rcluster_map_moved(&m, 0, 9); /* no such node: ignored */
    CHECK_EQ_INT(m.slot[0], 0);

    /* A failover: 10.0.0.2 gone, its slots at a new node, one range left uncovered. The old
     * node keeps its index, as no longer a master. */
    const int from2[] = {0, 10923}, to2[] = {5460, 16383}, port2[] = {7000, 7003};
    const char *host2[] = {"10.0.0.0", "10.0.0.3"};
    CHECK_EQ_INT(
        rcluster_map_apply(&m, slots_of(&b, 2, from2, to2, host2, port2), &from, err, sizeof(err)),
        QN_OK);
    CHECK_EQ_INT(m.nnodes, 4);
    CHECK(!m.complete);
    CHECK_EQ_INT(m.slot[6000], -1);
    CHECK(!rcluster_map_is_master(&m, 0));
    CHECK(rcluster_map_is_master(&m, 3));
    CHECK_EQ_INT(m.nmasters, 2);
    CHECK_EQ_INT(m.topology, 3);

    /* Full (maxnodes 4): a fifth node is refused, and the map stays what it was. */
    const int from1[] = {0}, to1[] = {16383}, port1[] = {7005};
    const char *host1[] = {"10.0.0.5"};
    CHECK(rcluster_map_apply(&m, slots_of(&b, 1, from1, to1, host1, port1), &from, err,
                             sizeof(err)) != QN_OK);
    CHECK(strstr(err, "more than 4") != NULL);
    CHECK_EQ_INT(m.slot[0], 1);
    CHECK_EQ_INT(m.topology, 3);

    /* Not a map: an error reply, an empty array. */
    redisReply e = err_reply("ERR This instance has cluster support disabled");
    CHECK(rcluster_map_apply(&m, &e, &from, err, sizeof(err)) != QN_OK);
    CHECK(strstr(err, "cluster support disabled") != NULL);
    redisReply empty = {.type = REDIS_REPLY_ARRAY};
    CHECK(rcluster_map_apply(&m, &empty, &from, err, sizeof(err)) != QN_OK);
    CHECK_EQ_INT(m.nmasters, 2);
    rcluster_map_free(&m);
}

static void test_new_node_refused(void)
{
    rcluster_map m;
    told t = {.refuse_at = 1};
    char err[160];
    rcluster_map_init(&m, 8, on_new, &t);
    rcluster_addr a = {"a", 1}, b = {"b", 2};
    CHECK_EQ_INT(rcluster_map_node(&m, &a, err, sizeof(err)), 0);
    CHECK_EQ_INT(rcluster_map_node(&m, &a, err, sizeof(err)), 0); /* known: not told again */
    CHECK_EQ_INT(t.n, 1);
    CHECK_EQ_INT(rcluster_map_node(&m, &b, err, sizeof(err)), -1);
    CHECK_EQ_INT(m.nnodes, 1);
    CHECK_EQ_INT(rcluster_map_find(&m, &b), -1);
    t.refuse_at = -1;
    CHECK_EQ_INT(rcluster_map_node(&m, &b, err, sizeof(err)), 1);
    rcluster_map_free(&m);
}

int main(void)
{
    RUN(test_addr_parse);
    RUN(test_addrs_parse);
    RUN(test_verdicts);
    RUN(test_map);
    RUN(test_new_node_refused);
    TEST_MAIN_END();
}
