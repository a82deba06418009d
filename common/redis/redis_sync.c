/* The blocking Redis client, one node or a cluster (redis_sync.h). */
#include "redis_sync.h"

#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/sds.h>

#include "grow.h"
#include "log.h"
#include "now.h"
#include "rcluster.h"
#include "rcmd.h"

#define RS_ERR_MAX 256

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
    rcmd_info ci; /* slot, flags, name */
    int node;     /* cluster: index in nodes it was sent to */
    rs_state state;
    redisReply *reply; /* RS_DONE (owned) */
    char *err;         /* RS_FAILED (owned; NULL: out of memory) */
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
    rcmd_conf conf; /* the options, checked: address or startup nodes, timeouts, password */
    int cluster;
    redisContext *ctx;      /* single node */
    int demoted;            /* Sentinel: ctx's server refused a write as a replica; connect anew */
    unsigned long switches; /* Sentinel: rsentinel_switches when ctx was connected */

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

qn_status redis_sync_nodes_check(const char *list, char *err, size_t errlen)
{
    return rcmd_nodes_check(list, err, errlen);
}

/* A failure of q without a reply, as rcmd_decide explains it, with what the connection said. */
static void rs_why(redis_sync *rs, const char *why, const rs_req *q)
{
    char detail[RS_ERR_MAX];
    memcpy(detail, rs->err, sizeof(detail));
    if (detail[0])
        rs_errf(rs, "%s (%s; %s)", why, q->ci.name, detail);
    else
        rs_errf(rs, "%s (%s)", why, q->ci.name);
}

/* ---------------------------------------------------------------- connections */

static redisContext *rs_connect(redis_sync *rs, const char *host, int port)
{
    redisContext *c =
        redisConnectWithTimeout(host, port, rcmd_timeval(rs->conf.connect_timeout_ms));
    redisReply *r = NULL;
    const char *argv[2];
    size_t argvlen[2];

    if (!c || c->err) {
        rs_errf(rs, "%s:%d: %s", host, port, c ? c->errstr : "out of memory");
        goto fail;
    }
    if (redisSetTimeout(c, rcmd_timeval(rs->conf.command_timeout_ms)) != REDIS_OK) {
        rs_errf(rs, "%s:%d: %s", host, port, c->errstr);
        goto fail;
    }
    if (rcmd_auth_argv(&rs->conf, argv, argvlen) > 0) {
        r = redisCommandArgv(c, 2, argv, argvlen);
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

/* A Sentinel deployment's master: asked of the sentinels (rsentinel.h), connected, and
 * confirmed by ROLE; a sentinel that named a replica (it has not seen the failover yet) makes
 * the next one be asked, each sentinel at most once. */
static redisContext *rs_sentinel_connect(redis_sync *rs)
{
    rsentinel *sn = rs->conf.sentinel;
    rs->switches = rsentinel_switches();
    int budget = rs->conf.connect_timeout_ms < RSENTINEL_BUDGET_MS ? rs->conf.connect_timeout_ms
                                                                   : RSENTINEL_BUDGET_MS;
    for (int tries = 0; tries < RSENTINEL_MAX; tries++) {
        rcluster_addr a;
        char why[RS_ERR_MAX];
        if (rsentinel_resolve(sn, budget, &a, why, sizeof(why)) != QN_OK) {
            rs_errf(rs, "%s", why);
            log_warn(NULL, "redis: %s", rs->err);
            rs->broken = 1;
            return NULL;
        }
        if (rcmd_conf_set_server(&rs->conf, a.host, a.port) != QN_OK) {
            rs_errf(rs, "out of memory");
            return NULL;
        }
        redisContext *c = rs_connect(rs, a.host, a.port);
        if (!c)
            return NULL;
        redisReply *r = redisCommand(c, "ROLE");
        int master = rsentinel_role_master(r);
        freeReplyObject(r);
        if (master)
            return c;
        log_warn(NULL, "redis: %s is not the master (ROLE); asking the next sentinel",
                 rs->conf.name);
        redisFree(c);
        rsentinel_skip(sn);
    }
    rs_errf(rs, "sentinel: no sentinel named a server that says it is master \"%s\"",
            rsentinel_master_name(sn));
    rs->broken = 1;
    return NULL;
}

static qn_status rs_single_ensure(redis_sync *rs)
{
    if (rs->ctx && !rs->ctx->err && !rs->demoted &&
        (!rs->conf.sentinel || rs->switches == rsentinel_switches()))
        return QN_OK;
    if (rs->ctx)
        redisFree(rs->ctx);
    rs->ctx = NULL;
    rs->demoted = 0;
    rs_fail_sent(rs, "connection lost");
    rs->ctx =
        rs->conf.sentinel ? rs_sentinel_connect(rs) : rs_connect(rs, rs->conf.host, rs->conf.port);
    return rs->ctx ? QN_OK : QN_ERR;
}

/* A Sentinel deployment's server refused a write as a replica: the master moved without this
 * connection being closed. It is dropped, and the next call asks the sentinels again. */
static void rs_single_check(redis_sync *rs, const redisReply *r)
{
    if (rs->conf.sentinel && rsentinel_readonly(r) && rs->ctx) {
        log_warn(NULL, "redis: %s refused a write as a replica; asking the sentinels again",
                 rs->conf.name);
        rs->demoted = 1;
    }
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

/* Reads the map again (at most every RCMD_REFRESH_GAP_MS unless force): the startup nodes in turn,
 * then the other masters known. A failure keeps the map there was. The error of the call that asked
 * stays what redis_sync_errstr says, unless there is no map at all. */
static qn_status rs_refresh(redis_sync *rs, int force)
{
    int64_t now = now_mono_ms();
    char before[RS_ERR_MAX];
    rcluster_addr *known = NULL;
    int nknown = 0;
    qn_status st = QN_ERR;

    if (!force && rs->map.have_map && now - rs->refreshed_ms < RCMD_REFRESH_GAP_MS)
        return QN_OK;
    rs->refreshed_ms = now;
    memcpy(before, rs->err, sizeof(before));
    for (int i = 0; i < rs->conf.nstartup && st != QN_OK; i++)
        st = rs_refresh_from(rs, &rs->conf.startup[i]);
    if (st != QN_OK && rs->map.nmasters > 0 &&
        (known = malloc((size_t)rs->map.nmasters * sizeof(*known)))) {
        for (int i = 0; i < rs->map.nmasters; i++)
            known[nknown++] = rs->map.addr[rs->map.masters[i]];
        for (int i = 0; i < nknown && st != QN_OK; i++) {
            int tried = 0;
            for (int k = 0; k < rs->conf.nstartup && !tried; k++)
                tried = rs->conf.startup[k].port == known[i].port &&
                        !strcmp(rs->conf.startup[k].host, known[i].host);
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
    if (slot == RCMD_SLOT_NONE) {
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
    if ((asking &&
         redisAppendFormattedCommand(c, RCMD_ASKING, sizeof(RCMD_ASKING) - 1) != REDIS_OK) ||
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

/* Sleeps ms: the blocking client's way of waiting. */
static void rs_sleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/*
 * Runs q on the cluster until it has its answer, doing what rcmd_decide says after each try.
 * What the first try brought comes from the caller: a pipeline's reply r (from node at), or
 * what became of the pipeline's write (v); v RCMD_REPLY without r: not tried yet. NULL (err
 * set) without a reply.
 */
static redisReply *rs_cluster_run(redis_sync *rs, const rs_req *q, rcmd_verdict v, redisReply *r,
                                  int at, int64_t deadline)
{
    rcmd_retry st;
    int slot = 0, asking = 0;
    rcluster_addr to;

    rcmd_retry_init(&st, q->ci.flags, 1, deadline);
    for (int tried = r || v != RCMD_REPLY;; tried = 1) {
        if (r)
            v = rcmd_verdict_of(r, &slot, &to);
        rcmd_decision d = {RCMD_WAIT, 0, NULL}; /* not tried yet: route and send at once */
        if (tried)
            d = rcmd_decide(&st, v, now_mono_ms());
        switch (d.action) {
        case RCMD_DONE:
            return r;
        case RCMD_FAIL:
            freeReplyObject(r);
            rs_why(rs, d.why, q);
            return NULL;
        case RCMD_SEND:
        case RCMD_SEND_ASKING: {
            if (!to.host[0]) /* the node that answered */
                snprintf(to.host, sizeof(to.host), "%s", rs->nodes[at]->a.host);
            if (d.action == RCMD_SEND)
                (void)rs_refresh(rs, 0);
            int k = rs_node_get(rs, &to);
            if (k < 0) {
                log_warn(NULL, "redis: %s", rs->err);
                return r; /* no room for the node: the redirect is the answer */
            }
            if (d.action == RCMD_SEND) /* the node says so now, whatever the map read said */
                rcluster_map_moved(&rs->map, slot, k);
            at = k;
            asking = d.action == RCMD_SEND_ASKING;
            break;
        }
        case RCMD_WAIT:
        case RCMD_REFRESH:
            if (tried) {
                rs_sleep(d.wait_ms);
                (void)rs_refresh(rs, d.action == RCMD_REFRESH);
            }
            at = -1;
            break;
        }
        freeReplyObject(r);
        r = NULL;
        if (at < 0 && (at = rs_route(rs, q->ci.slot)) < 0) {
            v = RCMD_NO_NODE;
            continue;
        }
        size_t written = 0;
        rs->err[0] = '\0';
        r = rs_node_call(rs, rs->nodes[at], q, asking, &written);
        asking = 0;
        if (!r) {
            v = written > 0 ? RCMD_LOST : RCMD_UNSENT;
            (void)rs_refresh(rs, 0);
        }
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

/* Refuses q when it can never be sent here (rcmd_admit): QN_OK when it may go. */
static qn_status rs_admit(redis_sync *rs, const rs_req *q)
{
    const char *why;
    if (rcmd_admit(&q->ci, rs->cluster, &why) == QN_OK)
        return QN_OK;
    rs->err[0] = '\0';
    rs_why(rs, why, q);
    return QN_EINVAL;
}

/* One command on the one server, or pinned to node n of a cluster: the reply is the answer,
 * nothing is resent (rcmd_decide's rule for one server). */
static redisReply *rs_single_call(redis_sync *rs, rs_node *n, rs_req *q)
{
    redisReply *r = NULL;
    size_t written = 0;
    rcmd_retry st;
    rcmd_verdict v = RCMD_REPLY;

    rcmd_retry_init(&st, q->ci.flags, 0, 0);
    if (n) {
        r = rs_node_call(rs, n, q, 0, &written);
        v = written > 0 ? RCMD_LOST : RCMD_UNSENT;
    } else if (rs_single_ensure(rs) != QN_OK) {
        v = RCMD_UNSENT;
    } else if (redisAppendFormattedCommand(rs->ctx, q->cmd, q->len) != REDIS_OK ||
               redisGetReply(rs->ctx, (void **)&r) != REDIS_OK) {
        rs_errf(rs, "%s: %s", rs->conf.name, rs->ctx->errstr);
        v = RCMD_LOST;
    }
    if (r) {
        if (!n)
            rs_single_check(rs, r);
        return r;
    }
    rs_why(rs, rcmd_decide(&st, v, now_mono_ms()).why, q);
    return NULL;
}

/* One formatted command (q->cmd, borrowed) and its reply. */
static redisReply *rs_call(redis_sync *rs, rs_req *q)
{
    if (rs_admit(rs, q) != QN_OK)
        return NULL;
    if (!rs->cluster)
        return rs_single_call(rs, NULL, q);
    rs->broken = 0;
    if (!rs->map.have_map && rs_refresh(rs, 1) != QN_OK)
        return NULL;
    return rs_cluster_run(rs, q, RCMD_REPLY, NULL, -1, now_mono_ms() + rs->conf.command_timeout_ms);
}

/* q's request from hiredis' format (fmt, ap), classified; q->cmd owned (redisFreeCommand). */
static qn_status rs_vformat(redis_sync *rs, rs_req *q, const char *fmt, va_list ap)
{
    size_t used = 0;
    int len = redisvFormatCommand(&q->cmd, fmt, ap);
    if (len < 0 || rcmd_classify_request(q->cmd, (size_t)len, &used, &q->ci) != QN_OK) {
        rs_errf(rs, "cannot format the command \"%.40s\"", fmt);
        return QN_EINVAL;
    }
    q->len = (size_t)len;
    return QN_OK;
}

static redisReply *rs_vcommand(redis_sync *rs, int node, const char *fmt, va_list ap)
{
    rs_req q = {0};
    redisReply *r = NULL;
    rs_begin(rs);
    if (rs_vformat(rs, &q, fmt, ap) != QN_OK)
        goto out;
    if (node < 0) {
        r = rs_call(rs, &q);
    } else if (!rs->cluster) {
        if (node != 0)
            rs_errf(rs, "no node %d", node);
        else
            r = rs_call(rs, &q);
    } else {
        rs->broken = 0;
        if (!rs->map.have_map)
            (void)rs_refresh(rs, 1);
        if (node >= rs->map.nmasters)
            rs_errf(rs, "no node %d (%d masters)", node, rs->map.nmasters);
        else if (rs_admit(rs, &q) == QN_OK)
            r = rs_single_call(rs, rs->nodes[rs->map.masters[node]], &q);
    }
out:
    if (q.cmd)
        redisFreeCommand(q.cmd);
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

redisReply *redis_sync_command_argv(redis_sync *rs, int argc, const char **argv,
                                    const size_t *argvlen)
{
    char small[1024], *heap = NULL;
    rs_req q = {0};
    redisReply *r = NULL;
    rs_begin(rs);
    if (argc < 1 || !argv) {
        rs_errf(rs, "no command");
        return NULL;
    }
    q.len = rcmd_format_command(small, sizeof(small), &heap, argc, argv, argvlen, &q.ci);
    q.cmd = heap ? heap : small;
    if (q.len == 0)
        rs_errf(rs, "out of memory");
    else
        r = rs_call(rs, &q);
    free(heap);
    return r;
}

/* The call of script name of s (rcmd_script_new), or NULL with err set. */
static rcmd_script *rs_script(redis_sync *rs, const redis_scripts *s, const char *name, int nkeys,
                              const char **keys, int nargs, const char **args)
{
    rcmd_script *sc = NULL;
    const char *why = "";
    if (rcmd_script_new(s, name, nkeys, keys, nargs, args, 0, &sc, &why) != QN_OK)
        rs_errf(rs, "%s: %s", name ? name : "(null)", why);
    return sc;
}

redisReply *redis_sync_run_script(redis_sync *rs, const redis_scripts *s, const char *name,
                                  int nkeys, const char **keys, int nargs, const char **args)
{
    redisReply *r = NULL;
    rs_begin(rs);
    rcmd_script *sc = rs_script(rs, s, name, nkeys, keys, nargs, args);
    if (!sc)
        return NULL;
    r = redis_sync_command_argv(rs, sc->argc, sc->argv, sc->argvlen);
    if (rcmd_script_fallback(sc, r)) {
        freeReplyObject(r);
        r = redis_sync_command_argv(rs, sc->argc, sc->argv, sc->argvlen);
    }
    free(sc);
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
            rs_errf(rs, "%s: %s", rs->conf.name, rs->ctx ? rs->ctx->errstr : "not connected");
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
    size_t used = 0;
    if (cmd)
        redisFreeCommand(cmd);
    if (!own || rcmd_classify_request(own, (size_t)len, &used, &q->ci) != QN_OK) {
        free(own);
        rs_fail(q, "cannot format the command");
        return;
    }
    q->len = (size_t)len;
    rs_append_req(rs, q, own, 1);
}

void redis_sync_append_argv(redis_sync *rs, int argc, const char **argv, const size_t *argvlen)
{
    char *own = NULL;
    rs_req *q = rs_push(rs);
    if (!q)
        return;
    if (argc < 1 || !argv) {
        rs_fail(q, "no command");
        return;
    }
    /* cap 0: formatted straight into a buffer the queue owns */
    q->len = rcmd_format_command(NULL, 0, &own, argc, argv, argvlen, &q->ci);
    if (q->len == 0) {
        rs_fail(q, "out of memory");
        return;
    }
    rs_append_req(rs, q, own, 1);
}

void redis_sync_append_script(redis_sync *rs, const redis_scripts *s, const char *name, int nkeys,
                              const char **keys, int nargs, const char **args)
{
    rcmd_script *sc = rs_script(rs, s, name, nkeys, keys, nargs, args);
    if (!sc) {
        rs_req *q = rs_push(rs);
        if (q)
            rs_fail(q, rs->err);
        return;
    }
    redis_sync_append_argv(rs, sc->argc, sc->argv, sc->argvlen);
    free(sc);
}

size_t redis_sync_append_formatted(redis_sync *rs, const char *cmds, size_t len)
{
    size_t n = 0, off = 0;
    while (off < len) {
        size_t l = 0;
        rs_req *q = rs_push(rs);
        n++;
        if (!q)
            break;
        if (rcmd_classify_request(cmds + off, len - off, &l, &q->ci) != QN_OK) {
            rs_fail(q, "not a RESP request");
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
        int k = rs_route(rs, q->ci.slot);
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
    /* 4. settled in order, each as rcmd_decide says, with the budget of one call */
    deadline = now_mono_ms() + rs->conf.command_timeout_ms;
    for (size_t i = from; i < to; i++) {
        rs_req *q = &rs->q[i];
        if (q->state == RS_FAILED)
            continue;
        rs->err[0] = '\0';
        if (q->state == RS_LOST)
            rs_errf(rs, "%s", rs->nodes[q->node]->name);
        redisReply *r = rs_cluster_run(rs, q, q->state == RS_LOST ? RCMD_LOST : RCMD_UNSENT,
                                       q->state == RS_DONE ? q->reply : NULL, q->node, deadline);
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
            rs_errf(rs, "%s: %s", rs->conf.name, rs->ctx->errstr);
            st = QN_ERR;
        } else if ((uintptr_t)x == REDIS_REPLY_ERROR) {
            rs_errf(rs, "error reply");
            st = QN_ERR;
        }
        rs->ctx->reader->fn = fn;
    } else if (redisGetReply(rs->ctx, (void **)reply) != REDIS_OK) {
        rs_errf(rs, "%s: %s", rs->conf.name, rs->ctx->errstr);
        st = QN_ERR;
    } else {
        rs_single_check(rs, *reply);
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
        return node == 0 ? rs->conf.name : NULL;
    return node >= 0 && node < rs->map.nmasters ? rs->nodes[rs->map.masters[node]]->name : NULL;
}

/* ---------------------------------------------------------------- life */

redis_sync *redis_sync_new(const redis_sync_opts *o)
{
    redis_sync *rs = NULL;
    char err[RS_ERR_MAX];

    if (!(rs = calloc(1, sizeof(*rs)))) {
        log_error(NULL, "redis: out of memory");
        return NULL;
    }
    if (rcmd_conf_init(&rs->conf, o, err, sizeof(err)) != QN_OK) {
        log_error(NULL, "redis: %s", err);
        free(rs);
        return NULL;
    }
    rs->cluster = rs->conf.cluster;
    rs->broken = 1;
    rcluster_map_init(&rs->map, RCMD_NODES_MAX, rs_on_new_node, rs);
    return rs;
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
    rcmd_conf_free(&rs->conf);
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
        return !rs->ctx || rs->ctx->err != 0 || rs->demoted;
    return rs->broken;
}
