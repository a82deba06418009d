/* The blocking Redis client, one node or a cluster (redis_sync.h). */
#include "redis_sync.h"

#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <hiredis/sds.h>

#include "grow.h"
#include "log.h"
#include "now.h"
#include "rcluster.h"
#include "rslot.h"

#define RS_REFRESH_MIN_MS 100 /* the slot map is read again at most this often, unless asked */
#define RS_REDIRECTS_MAX  16  /* redirects and retries of one command */
#define RS_RETRY_FIRST_MS 20
#define RS_RETRY_MAX_MS   200
#define RS_ARGV_STACK     64
#define RS_ERR_MAX        256
#define RS_NAME_MAX       24
#define RS_NODES_MAX      4096 /* addresses ever seen by one client (nodes are kept, see below) */

#define RS_ASKING "*1\r\n$6\r\nASKING\r\n"

/* What a command is, beyond its slot. */
enum { RS_READONLY = 1u << 0, RS_TRANSACTION = 1u << 1 };

/* Where an appended command is. */
typedef enum {
    RS_QUEUED, /* cluster: not sent yet */
    RS_SENT,   /* written (single node: in hiredis' buffer); its reply is to be read */
    RS_UNSENT, /* cluster: nothing of it was written (no node, no connection): safe to send */
    RS_LOST,   /* cluster: written, then its connection failed: it may have run */
    RS_DONE,   /* cluster: its reply is in reply */
    RS_FAILED, /* no reply: err says why */
} rs_state;

typedef struct rs_req {
    char *cmd; /* cluster: the formatted request until it is settled (owned) */
    size_t len;
    size_t start; /* cluster: its first byte in its node's write buffer */
    int slot;
    unsigned flags;
    int node; /* cluster: index in nodes it was sent to */
    rs_state state;
    redisReply *reply; /* RS_DONE (owned) */
    char *err;         /* RS_FAILED (owned; NULL: out of memory) */
    char name[RS_NAME_MAX];
} rs_req;

/*
 * A cluster node's connection, at the node's index in the map (rcluster.h: nodes are never
 * removed, so indices held by appended commands stay valid); a node that leaves the map only
 * loses its connection.
 */
typedef struct rs_node {
    rcluster_addr a;
    char name[RCLUSTER_HOST_MAX + 8]; /* "host:port" */
    redisContext *ctx;
    unsigned long flush; /* the pipeline flush that last used it */
    int usable;          /* during that flush: connected and not failed */
} rs_node;

struct redis_sync {
    char *host, *password;
    int port, timeout_ms;
    int cluster;
    char single_name[RCLUSTER_HOST_MAX + 8];
    redisContext *ctx; /* single node */

    rcluster_addr *startup; /* cluster_nodes */
    int nstartup;
    rcluster_map map;
    rs_node **nodes; /* by the map's node index */
    size_t capnodes;
    int64_t refreshed_ms;
    int broken;
    unsigned long flushes;

    /* appended commands: [head, sent) settled, [sent, tail) queued (cluster mode) */
    rs_req *q;
    size_t head, sent, tail, cap;
    size_t lost; /* appends that could not even be recorded (out of memory) */

    char err[RS_ERR_MAX];
};

/* ---------------------------------------------------------------- small helpers */

static void rs_errf(redis_sync *rs, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rs_errf(redis_sync *rs, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rs->err, sizeof(rs->err), fmt, ap);
    va_end(ap);
}

static int rs_name_is(const char *name, size_t len, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(list[i]) == len && strncasecmp(list[i], name, len) == 0)
            return 1;
    return 0;
}

/* Commands that only read: resent after a lost connection, since running them twice is
 * harmless. Scripts are never in it (a claim script must not run twice). */
static const char *const rs_readonly_names[] = {
    "BITCOUNT",    "DBSIZE",        "ECHO",      "EVALSHA_RO", "EVAL_RO",
    "EXISTS",      "EXPIRETIME",    "GET",       "GETBIT",     "GETRANGE",
    "HEXISTS",     "HGET",          "HGETALL",   "HKEYS",      "HLEN",
    "HMGET",       "HSCAN",         "HSTRLEN",   "HVALS",      "INFO",
    "KEYS",        "LINDEX",        "LLEN",      "LRANGE",     "MGET",
    "PEXPIRETIME", "PING",          "PTTL",      "ROLE",       "SCAN",
    "SCARD",       "SISMEMBER",     "SMEMBERS",  "SMISMEMBER", "SRANDMEMBER",
    "SSCAN",       "STRLEN",        "TIME",      "TTL",        "TYPE",
    "ZCARD",       "ZCOUNT",        "ZLEXCOUNT", "ZMSCORE",    "ZRANGE",
    "ZRANGEBYLEX", "ZRANGEBYSCORE", "ZRANK",     "ZREVRANGE",  "ZREVRANGEBYSCORE",
    "ZREVRANK",    "ZSCAN",         "ZSCORE",
};
static const char *const rs_transaction_names[] = {"DISCARD", "EXEC", "MULTI", "UNWATCH", "WATCH"};

static unsigned rs_flags_of(const char *name, size_t len)
{
    unsigned f = 0;
    if (rs_name_is(name, len, rs_readonly_names,
                   sizeof(rs_readonly_names) / sizeof(rs_readonly_names[0])))
        f |= RS_READONLY;
    if (rs_name_is(name, len, rs_transaction_names,
                   sizeof(rs_transaction_names) / sizeof(rs_transaction_names[0])))
        f |= RS_TRANSACTION;
    return f;
}

/* The length of the first whole RESP request in p (len bytes), 0 when there is none. */
static size_t rs_request_len(const char *p, size_t len)
{
    const char *s = p, *end = p + len;
    long long argc = 0;
    if (len < 4 || *s++ != '*')
        return 0;
    while (s < end && *s >= '0' && *s <= '9' && argc < (1LL << 31))
        argc = argc * 10 + (*s++ - '0');
    if (end - s < 2 || s[0] != '\r' || s[1] != '\n' || argc < 1)
        return 0;
    s += 2;
    for (long long i = 0; i < argc; i++) {
        long long n = 0;
        if (s >= end || *s++ != '$')
            return 0;
        while (s < end && *s >= '0' && *s <= '9' && n < (1LL << 40))
            n = n * 10 + (*s++ - '0');
        if (end - s < 2 || s[0] != '\r' || s[1] != '\n' || end - (s + 2) < n + 2)
            return 0;
        s += 2 + n;
        if (s[0] != '\r' || s[1] != '\n')
            return 0;
        s += 2;
    }
    return (size_t)(s - p);
}

/* The slot, kind and name of a formatted request (one whole request of len bytes). */
static qn_status rs_classify(const char *cmd, size_t len, rs_req *q)
{
    const char *sargv[RS_ARGV_STACK], **argv = sargv;
    size_t slen[RS_ARGV_STACK], *argvlen = slen;
    long long argc = 0;
    qn_status st = QN_EINVAL;

    for (size_t i = 1; i < len && cmd[i] >= '0' && cmd[i] <= '9' && argc < (1LL << 31); i++)
        argc = argc * 10 + (cmd[i] - '0');
    if (argc > RS_ARGV_STACK) {
        argv = malloc((size_t)argc * sizeof(*argv));
        argvlen = malloc((size_t)argc * sizeof(*argvlen));
        if (!argv || !argvlen) {
            st = QN_ENOMEM;
            goto out;
        }
    }
    int n = rslot_parse_request(cmd, len, argv, argvlen,
                                argc > RS_ARGV_STACK ? (int)argc : RS_ARGV_STACK);
    if (n < 1)
        goto out;
    q->slot = rslot_of_command(n, argv, argvlen);
    q->flags = rs_flags_of(argv[0], argvlen[0]);
    snprintf(q->name, sizeof(q->name), "%.*s", (int)(argvlen[0] < RS_NAME_MAX ? argvlen[0] : 20),
             argv[0]);
    st = QN_OK;
out:
    if (argv != sargv)
        free(argv);
    if (argvlen != slen)
        free(argvlen);
    return st;
}

qn_status redis_sync_nodes_check(const char *list, char *err, size_t errlen)
{
    if (!list || !*list)
        return QN_OK;
    return rcluster_addrs_parse(list, NULL, REDIS_SYNC_NODES_MAX, err, errlen) < 0 ? QN_EINVAL
                                                                                   : QN_OK;
}

/* ---------------------------------------------------------------- connections */

static redisContext *rs_connect(redis_sync *rs, const char *host, int port)
{
    struct timeval tv = {rs->timeout_ms / 1000, (rs->timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    redisReply *r = NULL;

    if (!c || c->err) {
        rs_errf(rs, "%s:%d: %s", host, port, c ? c->errstr : "out of memory");
        goto fail;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        rs_errf(rs, "%s:%d: %s", host, port, c->errstr);
        goto fail;
    }
    if (rs->password) {
        r = redisCommand(c, "AUTH %s", rs->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            rs_errf(rs, "%s:%d: AUTH failed: %s", host, port, r ? r->str : c->errstr);
            goto fail;
        }
        freeReplyObject(r);
    }
    return c;
fail:
    log_warn(NULL, "redis: cannot connect: %s", rs->err);
    freeReplyObject(r);
    if (c)
        redisFree(c);
    rs->broken = 1;
    return NULL;
}

/* Bytes written of c's buffer into *written; QN_ERR when the connection failed first. */
static qn_status rs_write(redisContext *c, size_t *written)
{
    size_t total = sdslen(c->obuf);
    int done = 0;
    while (!done)
        if (redisBufferWrite(c, &done) == REDIS_ERR) {
            *written = total - sdslen(c->obuf);
            return QN_ERR;
        }
    *written = total;
    return QN_OK;
}

/* A connection with nothing to read before a request is written: readable then means the peer
 * closed it (a restart, a failover, an idle timeout), which a write would not notice, and the
 * command would be lost with an unknown outcome instead of sent on a new connection. */
static int rs_idle_ok(const redisContext *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    return c->reader->pos >= c->reader->len && poll(&p, 1, 0) == 0;
}

static void rs_node_drop(redis_sync *rs, rs_node *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
    n->usable = 0;
    rs->broken = 1;
}

static qn_status rs_node_ensure(redis_sync *rs, rs_node *n)
{
    if (n->ctx && !n->ctx->err && rs_idle_ok(n->ctx))
        return QN_OK;
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = rs_connect(rs, n->a.host, n->a.port);
    return n->ctx ? QN_OK : QN_ERR;
}

/* The single node's pending replies fail: their connection is gone. */
static void rs_fail_sent(redis_sync *rs, const char *why)
{
    for (size_t i = rs->head; i < rs->tail; i++)
        if (rs->q[i].state == RS_SENT) {
            rs->q[i].state = RS_FAILED;
            rs->q[i].err = strdup(why);
        }
}

static qn_status rs_single_ensure(redis_sync *rs)
{
    if (rs->ctx && !rs->ctx->err)
        return QN_OK;
    if (rs->ctx)
        redisFree(rs->ctx);
    rs->ctx = NULL;
    rs_fail_sent(rs, "connection lost");
    rs->ctx = rs_connect(rs, rs->host, rs->port);
    return rs->ctx ? QN_OK : QN_ERR;
}

/* ---------------------------------------------------------------- the slot map */

/* The map's new node: its connection slot, at the same index. */
static int rs_on_new_node(void *ctx, int node, const rcluster_addr *a)
{
    redis_sync *rs = ctx;
    if (grow(&rs->nodes, &rs->capnodes, (size_t)node + 1, sizeof(*rs->nodes), 8) != QN_OK)
        return -1;
    rs_node *n = calloc(1, sizeof(*n));
    if (!n)
        return -1;
    n->a = *a;
    snprintf(n->name, sizeof(n->name), "%s:%d", a->host, a->port);
    rs->nodes[node] = n;
    return 0;
}

/* The node of address a, added if new; -1 (err set) when it cannot be. */
static int rs_node_get(redis_sync *rs, const rcluster_addr *a)
{
    return rcluster_map_node(&rs->map, a, rs->err, sizeof(rs->err));
}

/* A CLUSTER SLOTS reply as the map; a node no longer in it loses its connection. */
static qn_status rs_map_apply(redis_sync *rs, const redisReply *r, const rcluster_addr *from)
{
    qn_status st = rcluster_map_apply(&rs->map, r, from, rs->err, sizeof(rs->err));
    if (st != QN_OK)
        return st;
    for (int i = 0; i < rs->map.nnodes; i++)
        if (!rcluster_map_is_master(&rs->map, i) && rs->nodes[i]->ctx) {
            redisFree(rs->nodes[i]->ctx);
            rs->nodes[i]->ctx = NULL;
        }
    return QN_OK;
}

/* The map from the node at a (its own connection when it is a node, else a passing one). */
static qn_status rs_refresh_from(redis_sync *rs, const rcluster_addr *a)
{
    int k = rcluster_map_find(&rs->map, a);
    redisContext *c = NULL;
    if (k >= 0) {
        if (rs_node_ensure(rs, rs->nodes[k]) != QN_OK)
            return QN_ERR;
        c = rs->nodes[k]->ctx;
    } else if (!(c = rs_connect(rs, a->host, a->port))) {
        return QN_ERR;
    }
    redisReply *r = redisCommand(c, "CLUSTER SLOTS");
    qn_status st = QN_ERR;
    if (!r)
        rs_errf(rs, "%s:%d: %s", a->host, a->port, c->errstr);
    else
        st = rs_map_apply(rs, r, a);
    freeReplyObject(r);
    if (k < 0)
        redisFree(c);
    else if (!r)
        rs_node_drop(rs, rs->nodes[k]);
    return st;
}

/* Reads the map again (at most every RS_REFRESH_MIN_MS unless force): the startup nodes in turn,
 * then the other masters known. A failure keeps the map there was. The error of the call that asked
 * stays what redis_sync_errstr says, unless there is no map at all. */
static qn_status rs_refresh(redis_sync *rs, int force)
{
    int64_t now = now_mono_ms();
    char before[RS_ERR_MAX];
    rcluster_addr *known = NULL;
    int nknown = 0;
    qn_status st = QN_ERR;

    if (!force && rs->map.have_map && now - rs->refreshed_ms < RS_REFRESH_MIN_MS)
        return QN_OK;
    rs->refreshed_ms = now;
    memcpy(before, rs->err, sizeof(before));
    for (int i = 0; i < rs->nstartup && st != QN_OK; i++)
        st = rs_refresh_from(rs, &rs->startup[i]);
    if (st != QN_OK && rs->map.nmasters > 0 &&
        (known = malloc((size_t)rs->map.nmasters * sizeof(*known)))) {
        for (int i = 0; i < rs->map.nmasters; i++)
            known[nknown++] = rs->map.addr[rs->map.masters[i]];
        for (int i = 0; i < nknown && st != QN_OK; i++) {
            int tried = 0;
            for (int k = 0; k < rs->nstartup && !tried; k++)
                tried = rs->startup[k].port == known[i].port &&
                        !strcmp(rs->startup[k].host, known[i].host);
            if (!tried)
                st = rs_refresh_from(rs, &known[i]);
        }
        free(known);
    }
    if (st == QN_OK || rs->map.have_map)
        memcpy(rs->err, before, sizeof(before));
    if (st != QN_OK)
        log_warn(NULL, "redis: cannot read the cluster's slot map: %s", rs->err);
    return st;
}

/* The node a slot goes to without reading the map: -1 when none. */
static int rs_route(redis_sync *rs, int slot)
{
    const rcluster_map *m = &rs->map;
    if (!m->have_map) {
        rs_errf(rs, "no cluster slot map (no node answered)");
        return -1;
    }
    if (slot == RSLOT_NONE) {
        /* Any master: one already connected spares a connect. */
        for (int i = 0; i < m->nmasters; i++)
            if (rs->nodes[m->masters[i]]->ctx)
                return m->masters[i];
        return m->nmasters > 0 ? m->masters[0] : -1;
    }
    int k = rcluster_map_master(m, slot);
    if (k < 0)
        rs_errf(rs, "slot %d is served by no node", slot);
    return k;
}

/* ---------------------------------------------------------------- one command, cluster */

/* Sleeps *pause (then doubled, up to RS_RETRY_MAX_MS) unless that would pass deadline. */
static int rs_pause(int *pause, int64_t deadline)
{
    if (now_mono_ms() + *pause > deadline)
        return 0;
    struct timespec ts = {0, (long)*pause * 1000000L};
    nanosleep(&ts, NULL);
    *pause = *pause * 2 > RS_RETRY_MAX_MS ? RS_RETRY_MAX_MS : *pause * 2;
    return 1;
}

/* Sends q's request to n (after ASKING when asking) and reads the reply. NULL without one,
 * *written telling how much of the request reached the socket. */
static redisReply *rs_node_call(redis_sync *rs, rs_node *n, const rs_req *q, int asking,
                                size_t *written)
{
    redisReply *r = NULL, *ask = NULL;
    *written = 0;
    if (rs_node_ensure(rs, n) != QN_OK)
        return NULL;
    redisContext *c = n->ctx;
    if ((asking && redisAppendFormattedCommand(c, RS_ASKING, sizeof(RS_ASKING) - 1) != REDIS_OK) ||
        redisAppendFormattedCommand(c, q->cmd, q->len) != REDIS_OK || rs_write(c, written) != QN_OK)
        goto fail;
    if (asking) {
        if (redisGetReply(c, (void **)&ask) != REDIS_OK)
            goto fail;
        freeReplyObject(ask);
    }
    if (redisGetReply(c, (void **)&r) != REDIS_OK)
        goto fail;
    return r;
fail:
    rs_errf(rs, "%s: %s", n->name, c->errstr[0] ? c->errstr : "out of memory");
    rs_node_drop(rs, n);
    return NULL;
}

/*
 * Runs q on the cluster until it has its answer: from reply r when one came already (a
 * pipeline's; from_host: the host of the node that sent it), else by sending it. Follows
 * MOVED and ASK, waits out TRYAGAIN/CLUSTERDOWN/LOADING, and sends again after a connection
 * failure only what cannot have run (see redis_sync.h). NULL (err set) without a reply.
 */
static redisReply *rs_cluster_run(redis_sync *rs, const rs_req *q, redisReply *r,
                                  const char *from_host, int64_t deadline)
{
    rs_node *at = NULL;
    int asking = 0, hops = 0, pause = RS_RETRY_FIRST_MS;
    char host[RCLUSTER_HOST_MAX];
    snprintf(host, sizeof(host), "%s", from_host ? from_host : "");
    for (;;) {
        if (!r) {
            size_t written = 0;
            int k = at ? -1 : rs_route(rs, q->slot);
            if (!at && k < 0) {
                if (!rs_pause(&pause, deadline))
                    return NULL;
                (void)rs_refresh(rs, 1);
                continue;
            }
            if (!at)
                at = rs->nodes[k];
            snprintf(host, sizeof(host), "%s", at->a.host);
            r = rs_node_call(rs, at, q, asking, &written);
            asking = 0;
            if (!r) {
                char why[RS_ERR_MAX];
                at = NULL;
                (void)rs_refresh(rs, 0);
                if (written > 0 && !(q->flags & RS_READONLY)) {
                    memcpy(why, rs->err, sizeof(why));
                    rs_errf(rs, "%s: %s was sent, its outcome is unknown (not sent again)", why,
                            q->name);
                    return NULL;
                }
                if (!rs_pause(&pause, deadline))
                    return NULL;
                continue;
            }
        }
        int slot = 0;
        rcluster_addr to;
        rcluster_verdict kind = rcluster_verdict_of(r, &slot, &to);
        if (kind == RCLUSTER_FINAL)
            return r;
        if (++hops > RS_REDIRECTS_MAX)
            return r; /* that redirect or error is the answer */
        if (kind == RCLUSTER_RETRY) {
            if (!rs_pause(&pause, deadline))
                return r;
            freeReplyObject(r);
            r = NULL;
            at = NULL;
            (void)rs_refresh(rs, 0);
            continue;
        }
        freeReplyObject(r);
        r = NULL;
        if (!to.host[0])
            snprintf(to.host, sizeof(to.host), "%s", host);
        if (kind == RCLUSTER_MOVED)
            (void)rs_refresh(rs, 0);
        int k = rs_node_get(rs, &to);
        if (k < 0)
            return NULL;
        if (kind == RCLUSTER_MOVED) /* the node says so now, whatever the map read said */
            rcluster_map_moved(&rs->map, slot, k);
        at = rs->nodes[k];
        asking = kind == RCLUSTER_ASK;
    }
}

/* ---------------------------------------------------------------- commands */

/* Before a call: no error yet; unread pipeline replies dropped (redis_sync.h). */
static void rs_begin(redis_sync *rs)
{
    if (rs->tail > rs->head || rs->lost)
        redis_sync_discard(rs);
    rs->err[0] = '\0';
}

/* Refuses q when it can never be sent here: QN_OK when it may go. */
static qn_status rs_admit(redis_sync *rs, const rs_req *q)
{
    if (q->slot == RSLOT_CROSS) {
        log_errorf(NULL, ((log_field[]){LOG_S("command", q->name), LOG_END}),
                   "redis: a command whose keys lie in two hash slots was refused (CROSSSLOT), "
                   "not sent");
        rs_errf(rs, "CROSSSLOT: the keys of %s lie in two hash slots (not sent)", q->name);
        return QN_EINVAL;
    }
    if (rs->cluster && (q->flags & RS_TRANSACTION)) {
        log_errorf(NULL, ((log_field[]){LOG_S("command", q->name), LOG_END}),
                   "redis: a transaction command was refused on a Redis Cluster, not sent");
        rs_errf(rs, "%s is not supported on a Redis Cluster (a script does that)", q->name);
        return QN_EINVAL;
    }
    return QN_OK;
}

/* One formatted command (q->cmd, borrowed) and its reply. */
static redisReply *rs_call(redis_sync *rs, rs_req *q)
{
    redisReply *r = NULL;
    if (rs_admit(rs, q) != QN_OK)
        return NULL;
    if (!rs->cluster) {
        if (rs_single_ensure(rs) != QN_OK)
            return NULL;
        if (redisAppendFormattedCommand(rs->ctx, q->cmd, q->len) != REDIS_OK ||
            redisGetReply(rs->ctx, (void **)&r) != REDIS_OK) {
            rs_errf(rs, "%s: %s", rs->single_name, rs->ctx->errstr);
            return NULL;
        }
        return r;
    }
    rs->broken = 0;
    if (!rs->map.have_map && rs_refresh(rs, 1) != QN_OK)
        return NULL;
    return rs_cluster_run(rs, q, NULL, NULL, now_mono_ms() + rs->timeout_ms);
}

static redisReply *rs_vcommand(redis_sync *rs, int node, const char *fmt, va_list ap)
{
    char *cmd = NULL;
    rs_req q = {0};
    redisReply *r = NULL;
    rs_begin(rs);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    if (len < 0 || rs_classify(cmd, (size_t)len, &q) != QN_OK) {
        rs_errf(rs, "cannot format the command \"%.40s\"", fmt);
        goto out;
    }
    q.cmd = cmd;
    q.len = (size_t)len;
    if (node < 0) {
        r = rs_call(rs, &q);
    } else if (!rs->cluster) {
        if (node != 0)
            rs_errf(rs, "no node %d", node);
        else
            r = rs_call(rs, &q);
    } else {
        size_t written;
        rs->broken = 0;
        if (!rs->map.have_map)
            (void)rs_refresh(rs, 1);
        if (node >= rs->map.nmasters)
            rs_errf(rs, "no node %d (%d masters)", node, rs->map.nmasters);
        else
            r = rs_node_call(rs, rs->nodes[rs->map.masters[node]], &q, 0, &written);
    }
out:
    if (cmd)
        redisFreeCommand(cmd);
    return r;
}

redisReply *redis_sync_command(redis_sync *rs, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = rs_vcommand(rs, -1, fmt, ap);
    va_end(ap);
    return r;
}

redisReply *redis_sync_vcommand(redis_sync *rs, const char *fmt, va_list ap)
{
    return rs_vcommand(rs, -1, fmt, ap);
}

redisReply *redis_sync_node_command(redis_sync *rs, int node, const char *fmt, ...)
{
    va_list ap;
    if (node < 0) {
        rs_errf(rs, "no node %d", node);
        return NULL;
    }
    va_start(ap, fmt);
    redisReply *r = rs_vcommand(rs, node, fmt, ap);
    va_end(ap);
    return r;
}

/* argv as a request in q (q->cmd owned by the caller: redisFreeCommand). */
static qn_status rs_format_argv(redis_sync *rs, rs_req *q, int argc, const char **argv,
                                const size_t *argvlen)
{
    size_t slen[RS_ARGV_STACK], *lens = slen;
    qn_status st = QN_ENOMEM;
    if (argc < 1) {
        rs_errf(rs, "no command");
        return QN_EINVAL;
    }
    if (!argvlen) {
        if (argc > RS_ARGV_STACK && !(lens = malloc((size_t)argc * sizeof(*lens))))
            goto out;
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        argvlen = lens;
    }
    int len = redisFormatCommandArgv(&q->cmd, argc, argv, argvlen);
    if (len < 0)
        goto out;
    q->len = (size_t)len;
    q->slot = rslot_of_command(argc, argv, argvlen);
    q->flags = rs_flags_of(argv[0], argvlen[0]);
    snprintf(q->name, sizeof(q->name), "%.*s", (int)(argvlen[0] < RS_NAME_MAX ? argvlen[0] : 20),
             argv[0]);
    st = QN_OK;
out:
    if (lens != slen)
        free(lens);
    if (st != QN_OK)
        rs_errf(rs, "out of memory");
    return st;
}

redisReply *redis_sync_command_argv(redis_sync *rs, int argc, const char **argv,
                                    const size_t *argvlen)
{
    rs_req q = {0};
    redisReply *r = NULL;
    rs_begin(rs);
    if (rs_format_argv(rs, &q, argc, argv, argvlen) == QN_OK)
        r = rs_call(rs, &q);
    if (q.cmd)
        redisFreeCommand(q.cmd);
    return r;
}

/* The EVALSHA request of script name into argv (sargv, or a malloc'ed array the caller frees
 * when *argv != sargv); num holds the key count. QN_EINVAL for an unknown script or bad counts,
 * QN_ENOMEM. */
static qn_status rs_script_argv(redis_sync *rs, const redis_scripts *s, const char *name, int nkeys,
                                const char **keys, int nargs, const char **args, const char **sargv,
                                const char ***argv, char num[16])
{
    const char *sha = s && name ? redis_scripts_sha1(s, name) : NULL;
    int argc = 3 + nkeys + nargs;
    *argv = sargv;
    if (name && !redis_scripts_call_ok(name, nkeys, nargs)) {
        rs_errf(rs, "%s.lua: wrong number of keys or arguments", name);
        return QN_EINVAL;
    }
    if (!sha) {
        log_error(NULL, "redis: unknown Lua script %s", name ? name : "(null)");
        rs_errf(rs, "unknown Lua script %s", name ? name : "(null)");
        return QN_EINVAL;
    }
    if (nkeys < 0 || nargs < 0 ||
        (argc > RS_ARGV_STACK && !(*argv = malloc((size_t)argc * sizeof(**argv))))) {
        rs_errf(rs, nkeys < 0 || nargs < 0 ? "bad script arguments" : "out of memory");
        *argv = sargv;
        return nkeys < 0 || nargs < 0 ? QN_EINVAL : QN_ENOMEM;
    }
    snprintf(num, 16, "%d", nkeys);
    (*argv)[0] = "EVALSHA";
    (*argv)[1] = sha;
    (*argv)[2] = num;
    for (int i = 0; i < nkeys; i++)
        (*argv)[3 + i] = keys[i];
    for (int i = 0; i < nargs; i++)
        (*argv)[3 + nkeys + i] = args[i];
    return QN_OK;
}

redisReply *redis_sync_run_script(redis_sync *rs, const redis_scripts *s, const char *name,
                                  int nkeys, const char **keys, int nargs, const char **args)
{
    const char *sargv[RS_ARGV_STACK], **argv;
    int argc = 3 + nkeys + nargs;
    char num[16];
    redisReply *r = NULL;

    rs_begin(rs);
    if (rs_script_argv(rs, s, name, nkeys, keys, nargs, args, sargv, &argv, num) != QN_OK)
        return NULL;
    r = redis_sync_command_argv(rs, argc, argv, NULL);
    /* NOSCRIPT: nothing ran; the source is sent instead (and the node keeps it). */
    if (r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
        freeReplyObject(r);
        argv[0] = "EVAL";
        argv[1] = redis_scripts_source(s, name);
        r = redis_sync_command_argv(rs, argc, argv, NULL);
    }
    if (argv != sargv)
        free(argv);
    return r;
}

/* ---------------------------------------------------------------- pipelines */

/* A new entry at the tail; NULL when the queue cannot grow (then counted in lost). */
static rs_req *rs_push(redis_sync *rs)
{
    if (grow(&rs->q, &rs->cap, rs->tail + 1, sizeof(*rs->q), 64) != QN_OK) {
        log_error(NULL, "redis: out of memory appending a command");
        rs->lost++;
        return NULL;
    }
    rs_req *q = &rs->q[rs->tail++];
    memset(q, 0, sizeof(*q));
    q->node = -1;
    if (!rs->cluster)
        rs->sent = rs->tail; /* a single node's are in hiredis' buffer at once */
    return q;
}

/* A copy of a request the queue owns (freed with free(), whoever formatted it). */
static char *rs_own(const char *cmd, size_t len)
{
    char *c = malloc(len ? len : 1);
    if (c)
        memcpy(c, cmd, len);
    return c;
}

static void rs_fail(rs_req *q, const char *why)
{
    free(q->cmd);
    q->cmd = NULL;
    q->state = RS_FAILED;
    q->err = strdup(why);
}

/* Appends one formatted request (cmd, q->len bytes; classified in q) to the pipeline. An
 * owned cmd (malloc'ed) is kept until sent or freed; a borrowed one is copied where needed:
 * into the queue in cluster mode, into hiredis' buffer for a single node. */
static void rs_append_req(redis_sync *rs, rs_req *q, char *cmd, int owned)
{
    rs->err[0] = '\0';
    if (rs_admit(rs, q) != QN_OK) {
        if (owned)
            free(cmd);
        rs_fail(q, rs->err);
        return;
    }
    if (rs->cluster) {
        q->cmd = owned ? cmd : rs_own(cmd, q->len);
        q->state = RS_QUEUED;
        if (!q->cmd)
            rs_fail(q, "out of memory");
        return;
    }
    /* A broken connection is made again only at the first command of a pipeline: the others
     * fail with it rather than each waiting for a connect. */
    int first = rs->tail - rs->head == 1;
    if ((first ? rs_single_ensure(rs) != QN_OK : !rs->ctx || rs->ctx->err != 0) ||
        redisAppendFormattedCommand(rs->ctx, cmd, q->len) != REDIS_OK) {
        if (!rs->err[0])
            rs_errf(rs, "%s: %s", rs->single_name, rs->ctx ? rs->ctx->errstr : "not connected");
        rs_fail(q, rs->err);
    } else {
        q->state = RS_SENT;
    }
    if (owned)
        free(cmd);
}

void redis_sync_append(redis_sync *rs, const char *fmt, ...)
{
    va_list ap;
    char *cmd = NULL;
    rs_req *q = rs_push(rs);
    if (!q)
        return;
    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    char *own = len >= 0 ? rs_own(cmd, (size_t)len) : NULL;
    if (cmd)
        redisFreeCommand(cmd);
    if (!own || rs_classify(own, (size_t)len, q) != QN_OK) {
        free(own);
        rs_fail(q, "cannot format the command");
        return;
    }
    q->len = (size_t)len;
    rs_append_req(rs, q, own, 1);
}

void redis_sync_append_argv(redis_sync *rs, int argc, const char **argv, const size_t *argvlen)
{
    rs_req tmp = {0};
    rs_req *q = rs_push(rs);
    if (!q)
        return;
    if (rs_format_argv(rs, &tmp, argc, argv, argvlen) != QN_OK) {
        rs_fail(q, rs->err);
        return;
    }
    char *own = rs_own(tmp.cmd, tmp.len);
    redisFreeCommand(tmp.cmd);
    tmp.cmd = NULL;
    *q = tmp;
    q->node = -1;
    if (!own) {
        rs_fail(q, "out of memory");
        return;
    }
    rs_append_req(rs, q, own, 1);
}

void redis_sync_append_script(redis_sync *rs, const redis_scripts *s, const char *name, int nkeys,
                              const char **keys, int nargs, const char **args)
{
    const char *sargv[RS_ARGV_STACK], **argv;
    char num[16];
    if (rs_script_argv(rs, s, name, nkeys, keys, nargs, args, sargv, &argv, num) != QN_OK) {
        rs_req *q = rs_push(rs);
        if (q)
            rs_fail(q, rs->err);
        return;
    }
    redis_sync_append_argv(rs, 3 + nkeys + nargs, argv, NULL);
    if (argv != sargv)
        free(argv);
}

size_t redis_sync_append_formatted(redis_sync *rs, const char *cmds, size_t len)
{
    size_t n = 0, off = 0;
    while (off < len) {
        size_t l = rs_request_len(cmds + off, len - off);
        rs_req *q = rs_push(rs);
        n++;
        if (!q)
            break;
        qn_status st = l ? rs_classify(cmds + off, l, q) : QN_EINVAL;
        if (st != QN_OK) {
            rs_fail(q, st == QN_ENOMEM ? "out of memory" : "not a RESP request");
            break;
        }
        q->len = l;
        rs_append_req(rs, q, (char *)(uintptr_t)(cmds + off), 0);
        off += l;
    }
    return n;
}

/* Cluster: sends the queued commands (one write per node), reads every reply back, then
 * settles each in order: redirects followed, what was not written sent again, what may have
 * run reported. */
static void rs_flush(redis_sync *rs)
{
    size_t from = rs->sent, to = rs->tail;
    unsigned long flush = ++rs->flushes;
    int64_t deadline;

    rs->sent = to;
    rs->broken = 0;
    if (!rs->map.have_map)
        (void)rs_refresh(rs, 1);
    /* 1. each to its node's buffer */
    for (size_t i = from; i < to; i++) {
        rs_req *q = &rs->q[i];
        if (q->state != RS_QUEUED)
            continue;
        int k = rs_route(rs, q->slot);
        rs_node *n = k >= 0 ? rs->nodes[k] : NULL;
        q->state = RS_UNSENT;
        if (!n)
            continue;
        if (n->flush != flush) {
            n->flush = flush;
            n->usable = rs_node_ensure(rs, n) == QN_OK;
        }
        if (!n->usable)
            continue;
        q->start = sdslen(n->ctx->obuf);
        if (redisAppendFormattedCommand(n->ctx, q->cmd, q->len) != REDIS_OK)
            continue;
        q->node = k;
        q->state = RS_SENT;
    }
    /* 2. one write per node; a failed write leaves what it did not reach unsent */
    for (int k = 0; k < rs->map.nnodes; k++) {
        rs_node *n = rs->nodes[k];
        size_t written;
        if (n->flush != flush || !n->usable || rs_write(n->ctx, &written) == QN_OK)
            continue;
        rs_errf(rs, "%s: %s", n->name, n->ctx->errstr);
        for (size_t i = from; i < to; i++)
            if (rs->q[i].state == RS_SENT && rs->q[i].node == k)
                rs->q[i].state = rs->q[i].start >= written ? RS_UNSENT : RS_LOST;
        rs_node_drop(rs, n);
    }
    /* 3. the replies, in order (each node's come in the order they were sent) */
    for (size_t i = from; i < to; i++) {
        rs_req *q = &rs->q[i];
        if (q->state != RS_SENT)
            continue;
        rs_node *n = rs->nodes[q->node];
        if (!n->usable || redisGetReply(n->ctx, (void **)&q->reply) != REDIS_OK) {
            if (n->usable) {
                rs_errf(rs, "%s: %s", n->name, n->ctx->errstr);
                rs_node_drop(rs, n);
            }
            q->state = RS_LOST;
            continue;
        }
        q->state = RS_DONE;
    }
    /* 4. settled in order, with the budget of one call for the retries */
    deadline = now_mono_ms() + rs->timeout_ms;
    for (size_t i = from; i < to; i++) {
        rs_req *q = &rs->q[i];
        redisReply *r = NULL;
        int slot;
        rcluster_addr a;
        if (q->state == RS_FAILED)
            continue;
        if (q->state == RS_DONE && rcluster_verdict_of(q->reply, &slot, &a) == RCLUSTER_FINAL) {
            free(q->cmd);
            q->cmd = NULL;
            continue;
        }
        if (q->state != RS_DONE && now_mono_ms() >= deadline) {
            char why[2 * RS_ERR_MAX];
            snprintf(why, sizeof(why), "%s not sent: %s", q->name,
                     rs->err[0] ? rs->err : "no node could be reached in time");
            rs_fail(q, why);
            continue;
        }
        if (q->state == RS_LOST && !(q->flags & RS_READONLY)) {
            char why[2 * RS_ERR_MAX];
            snprintf(why, sizeof(why),
                     "%s: the connection failed after %s was sent: its outcome is unknown",
                     rs->nodes[q->node]->name, q->name);
            rs_fail(q, why);
            continue;
        }
        rs->err[0] = '\0';
        r = rs_cluster_run(rs, q, q->state == RS_DONE ? q->reply : NULL,
                           q->state == RS_DONE ? rs->nodes[q->node]->a.host : NULL, deadline);
        q->reply = NULL;
        if (r) {
            q->reply = r;
            q->state = RS_DONE;
            free(q->cmd);
            q->cmd = NULL;
        } else {
            rs_fail(q, rs->err[0] ? rs->err : "no reply");
        }
    }
}

qn_status redis_sync_get_reply(redis_sync *rs, redisReply **reply)
{
    if (reply)
        *reply = NULL;
    if (rs->head == rs->tail) {
        if (rs->lost) {
            rs->lost--;
            rs_errf(rs, "out of memory");
            return QN_ERR;
        }
        rs_errf(rs, "no command is waiting for its reply");
        return QN_EINVAL;
    }
    if (rs->cluster && rs->head == rs->sent)
        rs_flush(rs);
    rs_req *q = &rs->q[rs->head++];
    qn_status st = QN_OK;
    rs->err[0] = '\0';
    if (q->state == RS_FAILED) {
        rs_errf(rs, "%s", q->err ? q->err : "out of memory");
        st = QN_ERR;
    } else if (q->state == RS_DONE) {
        if (reply)
            *reply = q->reply;
        else {
            st = q->reply->type == REDIS_REPLY_ERROR ? QN_ERR : QN_OK;
            if (st != QN_OK)
                rs_errf(rs, "%s", q->reply->str);
            freeReplyObject(q->reply);
        }
        q->reply = NULL;
    } else if (!reply) {
        /* Without reply functions hiredis hands back each reply's type in place of an object:
         * no allocation per reply. */
        redisReplyObjectFunctions *fn = rs->ctx->reader->fn;
        void *x = NULL;
        rs->ctx->reader->fn = NULL;
        if (redisGetReply(rs->ctx, &x) != REDIS_OK) {
            rs_errf(rs, "%s: %s", rs->single_name, rs->ctx->errstr);
            st = QN_ERR;
        } else if ((uintptr_t)x == REDIS_REPLY_ERROR) {
            rs_errf(rs, "error reply");
            st = QN_ERR;
        }
        rs->ctx->reader->fn = fn;
    } else if (redisGetReply(rs->ctx, (void **)reply) != REDIS_OK) {
        rs_errf(rs, "%s: %s", rs->single_name, rs->ctx->errstr);
        st = QN_ERR;
    }
    free(q->cmd);
    free(q->err);
    if (rs->head == rs->tail)
        rs->head = rs->sent = rs->tail = 0;
    return st;
}

size_t redis_sync_pending(const redis_sync *rs)
{
    return rs->tail - rs->head + rs->lost;
}

void redis_sync_discard(redis_sync *rs)
{
    while (rs->head < rs->tail || rs->lost)
        if (redis_sync_get_reply(rs, NULL) == QN_EINVAL)
            break;
    rs->err[0] = '\0';
}

/* ---------------------------------------------------------------- nodes */

int redis_sync_node_count(redis_sync *rs)
{
    if (!rs->cluster)
        return 1;
    rs_begin(rs);
    rs->broken = 0;
    return rs_refresh(rs, 1) == QN_OK ? rs->map.nmasters : 0;
}

const char *redis_sync_node_name(const redis_sync *rs, int node)
{
    if (!rs->cluster)
        return node == 0 ? rs->single_name : NULL;
    return node >= 0 && node < rs->map.nmasters ? rs->nodes[rs->map.masters[node]]->name : NULL;
}

/* ---------------------------------------------------------------- life */

redis_sync *redis_sync_new(const redis_sync_opts *o)
{
    redis_sync *rs = NULL;
    char err[RS_ERR_MAX];
    int cluster = o && o->cluster_nodes && *o->cluster_nodes;

    if (!o || (!cluster && (!o->host || !*o->host || o->port < 1 || o->port > 65535))) {
        log_error(NULL, "redis: no Redis address");
        return NULL;
    }
    if (!(rs = calloc(1, sizeof(*rs))))
        goto oom;
    rs->cluster = cluster;
    rs->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 1000;
    rs->broken = 1;
    rcluster_map_init(&rs->map, RS_NODES_MAX, rs_on_new_node, rs);
    if (o->password && *o->password && !(rs->password = strdup(o->password)))
        goto oom;
    if (cluster) {
        int n =
            rcluster_addrs_parse(o->cluster_nodes, NULL, REDIS_SYNC_NODES_MAX, err, sizeof(err));
        if (n < 0) {
            log_error(NULL, "redis: cluster nodes: %s", err);
            redis_sync_free(rs);
            return NULL;
        }
        if (!(rs->startup = calloc((size_t)n, sizeof(*rs->startup))))
            goto oom;
        rs->nstartup = rcluster_addrs_parse(o->cluster_nodes, rs->startup, n, err, sizeof(err));
    } else {
        if (!(rs->host = strdup(o->host)))
            goto oom;
        rs->port = o->port;
        snprintf(rs->single_name, sizeof(rs->single_name), "%s:%d", o->host, o->port);
    }
    return rs;
oom:
    log_error(NULL, "redis: out of memory");
    redis_sync_free(rs);
    return NULL;
}

void redis_sync_free(redis_sync *rs)
{
    if (!rs)
        return;
    for (size_t i = rs->head; i < rs->tail; i++) {
        free(rs->q[i].cmd);
        free(rs->q[i].err);
        freeReplyObject(rs->q[i].reply);
    }
    free(rs->q);
    if (rs->ctx)
        redisFree(rs->ctx);
    for (int i = 0; i < rs->map.nnodes; i++) {
        if (rs->nodes[i]->ctx)
            redisFree(rs->nodes[i]->ctx);
        free(rs->nodes[i]);
    }
    free(rs->nodes);
    rcluster_map_free(&rs->map);
    free(rs->startup);
    free(rs->host);
    free(rs->password);
    free(rs);
}

int redis_sync_is_cluster(const redis_sync *rs)
{
    return rs->cluster;
}

qn_status redis_sync_open(redis_sync *rs)
{
    int broken = rs->broken;
    rs_begin(rs);
    if (!rs->cluster)
        return rs_single_ensure(rs);
    if (!rs->map.have_map || broken) {
        qn_status st = rs_refresh(rs, 1);
        if (st == QN_OK)
            rs->broken = 0;
        return st;
    }
    return QN_OK;
}

const char *redis_sync_errstr(const redis_sync *rs)
{
    return rs->err;
}

int redis_sync_broken(const redis_sync *rs)
{
    if (!rs->cluster)
        return !rs->ctx || rs->ctx->err != 0;
    return rs->broken;
}
