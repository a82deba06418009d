/* Redis client on the event loop (see redis.h). */
#include "redis.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <event2/event_struct.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#include "grow.h"
#include "log.h"
#include "now.h"
#include "rcluster.h"
#include "rcmd.h"
#include "rsentinel.h"

#define REDIS_BACKOFF_MIN_MS 100
#define REDIS_BACKOFF_MAX_MS 2000

/* ---------------------------------------------------------------- asynchronous client */

/*
 * The client is a set of nodes, each one hiredis connection with its own life (connect, AUTH,
 * scripts, reconnect with backoff). Alone (one server) it has one node and sends everything
 * there. In cluster mode it keeps the slot map (CLUSTER SLOTS) and sends each command to the
 * master of its key's slot. What becomes of a command after each try (a redirect, a wait, a
 * resend, its answer) is rcmd_decide's; the client only waits on its timers, so a cluster
 * request keeps its formatted text until its callback has run.
 */

#define REDIS_REFRESH_IDLE_MS  2000 /* the map asked again while all is well */
#define REDIS_REFRESH_FAULT_MS 250  /* ... while a slot has no connected master */

typedef enum { RC_DISCONNECTED = 0, RC_CONNECTING, RC_AUTHENTICATING, RC_CONNECTED } rc_state;

typedef struct redis_node {
    redis_client *c;
    char *host;
    int port;
    int index; /* in c->nodes */
    redisAsyncContext *ac;
    rc_state state;
    int master;     /* single mode: always; cluster: serves slots in the current map */
    int scripts_ok; /* every script of the registry loaded on this connection */
    size_t scripts_loaded;
    int loading_scripts; /* SCRIPT LOADs of this connection are in flight */
    int backoff_ms;
    unsigned long connects;
    struct event *reconnect_ev;
    struct event *connect_timeout_ev;
} redis_node;

typedef enum {
    REQ_NEW = 0,    /* accepted, not sent */
    REQ_IN_HIREDIS, /* sent: its reply callback will come */
    REQ_FAIL_LATER, /* its timer fires at once and reports fail_err */
    REQ_RETRY_LATER /* cluster: its timer sends it again */
} req_state;

/* A command accepted by redis_command* (or one of the client's own): on the client's list from
 * acceptance until its callback ran. */
typedef struct redis_req {
    struct redis_req *prev, *next;
    redis_client *c;
    redis_node *node; /* where it is in hiredis */
    redis_node *pin;  /* sent to this node alone, under the one-server rule (a node command) */
    int internal;     /* the client's own (AUTH, SCRIPT LOAD, CLUSTER SLOTS): before "connected" */
    redis_cb cb;
    void *arg;
    struct event timer; /* command timeout, the deferred failure, or the re-send */
    req_state state;
    int timed_out;
    const char *fail_err;
    /* cluster mode: the command, to be sent again after a redirect */
    char *cmd;
    size_t len;
    int slot;        /* RCMD_SLOT_NONE: any master */
    redis_node *ask; /* ASK: send to this node once, after ASKING */
    rcmd_retry retry;
} redis_req;

struct redis_client {
    struct event_base *base;
    rcmd_conf conf; /* the options, checked: timeouts, password, nodes */
    int max_pending;
    redis_scripts *scripts;
    int cluster;

    redis_node **nodes; /* cluster: by the map's node index */
    size_t capnodes;
    int nnodes;
    rcluster_map map; /* cluster: the nodes' addresses and the slot map */
    int refreshing;
    int64_t refreshed_ms;
    struct event *refresh_ev;
    unsigned rr; /* round robin for commands without a key */

    rsentinel_watch *watch;       /* a Sentinel deployment: +switch-master on a sentinel */
    rsentinel_resolver *resolver; /* ... and the master asked of the sentinels before a connect */

    int ready;
    int ready_any; /* atomic copy of ready, for other threads */
    int closing;
    redis_req *reqs; /* every accepted command whose callback has not run yet */
    int nreqs;
};

static void node_start_connect(redis_node *n);
static qn_status node_send_argv(redis_node *n, redis_cb cb, void *arg, int argc, const char **argv,
                                const size_t *argvlen);
static void cluster_want_refresh(redis_client *c);
static void req_dispatch(redis_req *r, const char *cmd, size_t len);

/* ---- readiness ---- */

/* Every node a command may go to: the one server, or each master of a complete map. */
static int client_all_masters(const redis_client *c, int need_scripts)
{
    int any = 0;
    if (c->cluster && !c->map.complete)
        return 0;
    for (int i = 0; i < c->nnodes; i++) {
        const redis_node *n = c->nodes[i];
        if (!n->master)
            continue;
        if (n->state != RC_CONNECTED || (need_scripts && !n->scripts_ok))
            return 0;
        any = 1;
    }
    return any;
}

static void client_update_ready(redis_client *c)
{
    int ready = !c->closing && client_all_masters(c, 1);
    if (ready && !c->ready) {
        int masters = 0;
        for (int i = 0; i < c->nnodes; i++)
            masters += c->nodes[i]->master;
        if (c->cluster)
            log_info(NULL, "redis: ready (cluster of %d masters, %zu scripts loaded)", masters,
                     redis_scripts_count(c->scripts));
        else
            log_info(NULL, "redis: ready (%s:%d, %zu scripts loaded)", c->nodes[0]->host,
                     c->nodes[0]->port, redis_scripts_count(c->scripts));
    }
    c->ready = ready;
    __atomic_store_n(&c->ready_any, ready, __ATOMIC_RELEASE);
}

/* ---- requests ---- */

static void req_unlink(redis_req *r)
{
    redis_client *c = r->c;
    if (r->prev)
        r->prev->next = r->next;
    else
        c->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    c->nreqs--;
    event_del(&r->timer);
}

/* Runs the callback and frees the request: the only place a request ends. */
static void req_finish(redis_req *r, const redisReply *reply, const char *err)
{
    redis_client *c = r->c;
    redis_cb cb = r->cb;
    void *arg = r->arg;

    req_unlink(r);
    free(r->cmd);
    free(r);
    if (!err && reply && reply->type == REDIS_REPLY_ERROR)
        err = reply->str ? reply->str : "error reply";
    if (!err && !reply)
        err = "no reply";
    cb(c, reply, err, arg);
}

static void req_fail_later(redis_req *r, const char *err)
{
    struct timeval zero = {0, 0};
    r->state = REQ_FAIL_LATER;
    r->fail_err = err;
    evtimer_add(&r->timer, &zero);
}

static void node_drop(redis_node *n);

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
    redis_req *r = arg;
    (void)fd;
    (void)what;

    switch (r->state) {
    case REQ_FAIL_LATER:
        req_finish(r, NULL, r->fail_err);
        return;
    case REQ_RETRY_LATER:
        req_dispatch(r, r->cmd, r->len);
        return;
    case REQ_IN_HIREDIS:
        /* Replies come in order, so everything behind the overdue one is stuck as well: drop
         * the connection (what rcmd_decide says of each of them follows) and reconnect. */
        r->timed_out = 1;
        log_warn(NULL, "redis: a command to %s:%d got no reply within %d ms; reconnecting",
                 r->node->host, r->node->port, r->c->conf.command_timeout_ms);
        node_drop(r->node);
        return;
    case REQ_NEW:
        return;
    }
}

static redis_req *req_new(redis_client *c, redis_cb cb, void *arg)
{
    redis_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->c = c;
    r->cb = cb;
    r->arg = arg;
    r->slot = RCMD_SLOT_NONE;
    rcmd_retry_init(&r->retry, 0, c->cluster, now_mono_ms() + c->conf.command_timeout_ms);
    evtimer_assign(&r->timer, c->base, on_req_timer, r);
    r->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = r;
    c->reqs = r;
    c->nreqs++;
    return r;
}

static void on_hiredis_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* Hands r to node n's connection; its timer then runs to the deadline. QN_ERR: not taken. */
static qn_status req_send(redis_req *r, redis_node *n, const char *cmd, size_t len)
{
    int64_t left = r->retry.deadline_ms - now_mono_ms();
    struct timeval tv = rcmd_timeval(left > 1 ? (int)left : 1);
    if (redisAsyncFormattedCommand(n->ac, on_hiredis_reply, r, cmd, len) != REDIS_OK)
        return QN_ERR;
    r->node = n;
    r->state = REQ_IN_HIREDIS;
    evtimer_add(&r->timer, &tv);
    return QN_OK;
}

/* ---- the slot map (cluster) ---- */

static redis_node *node_new(redis_client *c, const char *host, int port)
{
    redis_node *n;
    if (c->nnodes == RCMD_NODES_MAX ||
        grow(&c->nodes, &c->capnodes, (size_t)c->nnodes + 1, sizeof(*c->nodes), 8) != QN_OK)
        return NULL;
    n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    n->c = c;
    n->port = port;
    n->index = c->nnodes;
    n->backoff_ms = REDIS_BACKOFF_MIN_MS;
    n->host = strdup(host);
    if (!n->host) {
        free(n);
        return NULL;
    }
    c->nodes[c->nnodes++] = n;
    return n;
}

static void node_free(redis_node *n)
{
    if (n->reconnect_ev)
        event_free(n->reconnect_ev);
    if (n->connect_timeout_ev)
        event_free(n->connect_timeout_ev);
    free(n->host);
    free(n);
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg);
static void on_connect_timeout(evutil_socket_t fd, short what, void *arg);

/* A node with its timers, connecting; NULL (logged) when it cannot be made. */
static redis_node *node_add(redis_client *c, const char *host, int port)
{
    redis_node *n = node_new(c, host, port);
    if (!n) {
        log_error(NULL, "redis: cannot add node %s:%d (%d known)", host, port, c->nnodes);
        return NULL;
    }
    n->reconnect_ev = evtimer_new(c->base, on_reconnect_timer, n);
    n->connect_timeout_ev = evtimer_new(c->base, on_connect_timeout, n);
    if (!n->reconnect_ev || !n->connect_timeout_ev) {
        c->nnodes--;
        node_free(n);
        return NULL;
    }
    node_start_connect(n);
    return n;
}

/* The cluster node at a, added (and connecting) when it is new; NULL (logged) when it cannot be. */
static redis_node *cluster_node_at(redis_client *c, const rcluster_addr *a)
{
    char err[128];
    int k = rcluster_map_node(&c->map, a, err, sizeof(err));
    if (k < 0) {
        log_error(NULL, "redis: %s", err);
        return NULL;
    }
    return c->nodes[k];
}

/* The map's new node: its connection, at the same index. */
static int cluster_on_new_node(void *ctx, int node, const rcluster_addr *a)
{
    redis_client *c = ctx;
    if (node != c->nnodes)
        return -1;
    return node_add(c, a->host, a->port) ? 0 : -1;
}

static void node_load_scripts(redis_node *n);

/* A map from a CLUSTER SLOTS reply (arg: the node that answered). */
static void cluster_on_slots(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    const redis_node *from = arg;
    rcluster_addr fa;
    char why[RCLUSTER_HOST_MAX + 64];
    c->refreshing = 0;
    if (c->closing)
        return;
    snprintf(fa.host, sizeof(fa.host), "%s", from->host);
    fa.port = from->port;
    if (err || rcluster_map_apply(&c->map, reply, &fa, why, sizeof(why)) != QN_OK) {
        log_warn(NULL, "redis: CLUSTER SLOTS failed: %s", err ? err : why);
        cluster_want_refresh(c);
        return;
    }
    for (int i = 0; i < c->nnodes; i++) {
        redis_node *n = c->nodes[i];
        int was = n->master;
        n->master = rcluster_map_is_master(&c->map, i);
        if (n->master && !was) {
            log_info(NULL, "redis: %s:%d serves slots", n->host, n->port);
            if (n->state == RC_CONNECTED)
                node_load_scripts(n); /* a promoted replica has none of them */
        }
    }
    if (!c->map.complete)
        log_warn(NULL, "redis: the cluster's slot map does not cover every slot");
    client_update_ready(c);
}

static void cluster_refresh_now(redis_client *c)
{
    static const char *argv[2] = {"CLUSTER", "SLOTS"};
    if (c->closing || c->refreshing)
        return;
    /* Ask a connected master first, else any connected node. */
    redis_node *ask = NULL;
    for (int pass = 0; pass < 2 && !ask; pass++)
        for (int i = 0; i < c->nnodes && !ask; i++) {
            redis_node *n = c->nodes[(int)((c->rr + (unsigned)i) % (unsigned)c->nnodes)];
            if (n->state == RC_CONNECTED && (pass == 1 || n->master))
                ask = n;
        }
    c->refreshed_ms = now_mono_ms();
    if (!ask)
        return; /* the nodes reconnect on their own; the next one up asks */
    if (node_send_argv(ask, cluster_on_slots, ask, 2, argv, NULL) == QN_OK)
        c->refreshing = 1;
}

/* The next CLUSTER SLOTS: soon after an error (at most one per RCMD_REFRESH_GAP_MS), else on
 * the periodic timer. */
static void cluster_want_refresh(redis_client *c)
{
    if (!c->cluster || c->closing)
        return;
    int64_t wait = c->refreshed_ms + RCMD_REFRESH_GAP_MS - now_mono_ms();
    struct timeval tv = rcmd_timeval(wait > 0 ? (int)wait : 0);
    evtimer_add(c->refresh_ev, &tv);
}

static void on_refresh_timer(evutil_socket_t fd, short what, void *arg)
{
    redis_client *c = arg;
    (void)fd;
    (void)what;
    cluster_refresh_now(c);
    struct timeval tv =
        rcmd_timeval(client_all_masters(c, 0) ? REDIS_REFRESH_IDLE_MS : REDIS_REFRESH_FAULT_MS);
    evtimer_add(c->refresh_ev, &tv);
}

/* The node a cluster request goes to now, or NULL. */
static redis_node *cluster_node_for(redis_client *c, int slot)
{
    if (slot >= 0) {
        int k = rcluster_map_master(&c->map, slot);
        return k >= 0 ? c->nodes[k] : NULL;
    }
    for (int i = 0; i < c->nnodes; i++) {
        redis_node *n = c->nodes[(c->rr++) % (unsigned)c->nnodes];
        if (n->master && n->state == RC_CONNECTED)
            return n;
    }
    return NULL;
}

/* Does what rcmd_decide says of r now that its last try brought v (reply: the reply that came,
 * if any; slot and to: a redirect's). Never calls r's callback itself but for a reply that is
 * the answer: a failure comes from r's timer, so never from inside the call that issued r. */
static void req_settle(redis_req *r, rcmd_verdict v, const redisReply *reply, int slot,
                       const rcluster_addr *to)
{
    redis_client *c = r->c;
    rcmd_decision d = rcmd_decide(&r->retry, v, now_mono_ms());
    redis_node *n;

    switch (d.action) {
    case RCMD_DONE:
        req_finish(r, reply, NULL);
        return;
    case RCMD_FAIL:
        req_fail_later(r, r->timed_out ? "timeout" : d.why);
        return;
    case RCMD_SEND:
    case RCMD_SEND_ASKING:
        n = to->host[0] ? cluster_node_at(c, to) : r->node;
        if (!n) {
            req_finish(r, reply, NULL); /* no room for the node (logged): the redirect answers */
            return;
        }
        if (d.action == RCMD_SEND) {
            /* This slot at once; the rest of the map with the next refresh. */
            rcluster_map_moved(&c->map, slot, n->index);
            cluster_want_refresh(c);
            r->ask = NULL;
        } else {
            r->ask = n;
        }
        req_dispatch(r, r->cmd, r->len);
        return;
    case RCMD_WAIT:
    case RCMD_REFRESH:
        /* A failover, a migration or a reconnect under way: a new map, and the command waits a
         * little, within its deadline, rather than failing at once. */
        cluster_want_refresh(c);
        struct timeval tv = rcmd_timeval(d.wait_ms);
        r->state = REQ_RETRY_LATER;
        evtimer_add(&r->timer, &tv);
        return;
    }
}

/* Sends (or sends again) r: to its pinned node, the one server, the node ASK named, or its
 * slot's master. */
static void req_dispatch(redis_req *r, const char *cmd, size_t len)
{
    redis_client *c = r->c;
    redis_node *n = r->pin        ? r->pin
                    : !c->cluster ? c->nodes[0]
                    : r->ask      ? r->ask
                                  : cluster_node_for(c, r->slot);
    if (!n) {
        req_settle(r, RCMD_NO_NODE, NULL, 0, NULL);
        return;
    }
    if (!n->ac || (!r->internal && n->state != RC_CONNECTED)) {
        req_settle(r, RCMD_UNSENT, NULL, 0, NULL);
        return;
    }
    if (r->ask && redisAsyncFormattedCommand(n->ac, NULL, NULL, RCMD_ASKING,
                                             sizeof(RCMD_ASKING) - 1) != REDIS_OK) {
        req_settle(r, RCMD_UNSENT, NULL, 0, NULL);
        return;
    }
    r->ask = NULL;
    if (req_send(r, n, cmd, len) != QN_OK)
        req_settle(r, RCMD_UNSENT, NULL, 0, NULL);
}

/* ---- nodes: connect, authenticate, load the scripts, reconnect ---- */

static void node_schedule_reconnect(redis_node *n)
{
    struct timeval tv = rcmd_timeval(n->backoff_ms);
    if (n->c->closing)
        return;
    evtimer_add(n->reconnect_ev, &tv);
    n->backoff_ms =
        n->backoff_ms * 2 > REDIS_BACKOFF_MAX_MS ? REDIS_BACKOFF_MAX_MS : n->backoff_ms * 2;
}

static void node_lost(redis_node *n)
{
    redis_client *c = n->c;
    n->ac = NULL;
    n->state = RC_DISCONNECTED;
    n->scripts_ok = 0;
    n->loading_scripts = 0;
    client_update_ready(c);
    node_schedule_reconnect(n);
    cluster_want_refresh(c); /* a master that went away may have been replaced */
}

/* Frees the hiredis context now (or right after the hiredis callback we are in): hiredis then
 * calls every pending reply callback with NULL, and each command's fate is rcmd_decide's. */
static void node_drop(redis_node *n)
{
    redisAsyncContext *ac = n->ac;
    if (!ac)
        return;
    n->ac = NULL;
    event_del(n->connect_timeout_ev);
    redisAsyncFree(ac);
    node_lost(n);
}

static void on_hiredis_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    redis_req *r = privdata;
    const redisReply *rep = reply;
    rcluster_addr to;
    int slot = 0;
    (void)ac;

    event_del(&r->timer);
    if (r->c->closing) {
        req_finish(r, NULL, "client closed");
        return;
    }
    if (!rep) {
        req_settle(r, RCMD_LOST, NULL, 0, NULL);
        return;
    }
    rcmd_verdict v = rcmd_verdict_of(rep, &slot, &to);
    redis_node *n = r->node;
    int demoted = r->c->conf.sentinel && rsentinel_readonly(rep);
    req_settle(r, v, rep, slot, &to);
    if (demoted && n->ac) {
        /* The server is a replica now and this connection was not closed: connect anew, which
         * asks the sentinels where the master is. */
        log_warn(NULL, "redis: %s:%d refused a write as a replica; asking the sentinels again",
                 n->host, n->port);
        node_drop(n);
    }
}

/*
 * The one way commands reach the connections. pin: a node command, or one of the client's own
 * (internal: AUTH, SCRIPT LOAD, CLUSTER SLOTS, sent before the node counts as connected; ci
 * NULL). Else ci classified a caller's command, admitted here and sent to the one server or its
 * slot's master. cmd is copied.
 */
static qn_status client_send(redis_client *c, redis_node *pin, int internal, const rcmd_info *ci,
                             redis_cb cb, void *arg, const char *cmd, size_t len)
{
    const char *why;
    redis_req *r;

    if (c->closing)
        return QN_ERR;
    if (!(r = req_new(c, cb, arg)))
        return QN_ENOMEM;
    if (c->nreqs > c->max_pending) {
        req_fail_later(r, "too many pending commands");
        return QN_OK;
    }
    if (ci) {
        /* Never sent: CROSSSLOT (on one server too), a transaction on a cluster. */
        if (rcmd_admit(ci, c->cluster, &why) != QN_OK) {
            req_fail_later(r, why);
            return QN_OK;
        }
        r->retry.flags = ci->flags;
        r->slot = ci->slot;
    }
    r->internal = internal;
    if (pin) {
        r->pin = pin;
        r->retry.cluster = 0; /* no redirect is followed, nothing resent */
    } else if (c->cluster) {
        if (!(r->cmd = malloc(len))) {
            req_fail_later(r, "out of memory");
            return QN_OK;
        }
        memcpy(r->cmd, cmd, len);
        r->len = len;
    }
    req_dispatch(r, cmd, len);
    return QN_OK;
}

/* argv formatted and sent (pin, internal, ci: as client_send). */
static qn_status client_send_argv(redis_client *c, redis_node *pin, int internal,
                                  const rcmd_info *ci, redis_cb cb, void *arg, int argc,
                                  const char *const *argv, const size_t *argvlen)
{
    char small[1024], *heap;
    size_t len = rcmd_format(small, sizeof(small), &heap, argc, argv, argvlen);
    if (len == 0)
        return QN_ENOMEM;
    qn_status st = client_send(c, pin, internal, ci, cb, arg, heap ? heap : small, len);
    free(heap);
    return st;
}

static qn_status node_send_argv(redis_node *n, redis_cb cb, void *arg, int argc, const char **argv,
                                const size_t *argvlen)
{
    return client_send_argv(n->c, n, 1, NULL, cb, arg, argc, argv, argvlen);
}

/* A caller's command formatted by hiredis (fmt, ap), classified and sent (pin: to that node). */
static qn_status client_send_vformat(redis_client *c, redis_node *pin, redis_cb cb, void *arg,
                                     const char *fmt, va_list ap)
{
    char *cmd = NULL;
    size_t used = 0;
    rcmd_info ci;
    qn_status st;

    int len = redisvFormatCommand(&cmd, fmt, ap);
    if (len == -2)
        return QN_EINVAL; /* bad format string */
    if (len < 0)
        return QN_ENOMEM;
    st = rcmd_classify_request(cmd, (size_t)len, &used, &ci);
    if (st == QN_OK)
        st = client_send(c, pin, 0, &ci, cb, arg, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return st;
}

/* A caller's argv, classified, formatted and sent. */
static qn_status client_command_argv(redis_client *c, redis_cb cb, void *arg, int argc,
                                     const char *const *argv, const size_t *argvlen)
{
    char small[1024], *heap;
    rcmd_info ci;
    size_t len = rcmd_format_command(small, sizeof(small), &heap, argc, argv, argvlen, &ci);
    if (len == 0)
        return QN_ENOMEM;
    qn_status st = client_send(c, NULL, 0, &ci, cb, arg, heap ? heap : small, len);
    free(heap);
    return st;
}

qn_status redis_command(redis_client *c, redis_cb cb, void *arg, const char *fmt, ...)
{
    va_list ap;
    qn_status st;

    if (!c || !cb || !fmt)
        return QN_EINVAL;
    va_start(ap, fmt);
    st = client_send_vformat(c, NULL, cb, arg, fmt, ap);
    va_end(ap);
    return st;
}

qn_status redis_command_argv(redis_client *c, redis_cb cb, void *arg, int argc, const char **argv,
                             const size_t *argvlen)
{
    if (!c || !cb || argc <= 0 || !argv)
        return QN_EINVAL;
    return client_command_argv(c, cb, arg, argc, argv, argvlen);
}

qn_status redis_command_node(redis_client *c, int node, redis_cb cb, void *arg, const char *fmt,
                             ...)
{
    va_list ap;
    qn_status st;

    if (!c || !cb || !fmt || node < 0 || node >= c->nnodes)
        return QN_EINVAL;
    va_start(ap, fmt);
    st = client_send_vformat(c, c->nodes[node], cb, arg, fmt, ap);
    va_end(ap);
    return st;
}

/* The caller's callback of a script call, kept in the call (rcmd_script_extra). */
typedef struct eval_owner {
    redis_cb cb;
    void *arg;
} eval_owner;

static void on_eval_reply(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    rcmd_script *sc = arg;
    const eval_owner *o = rcmd_script_extra(sc);

    if (rcmd_script_fallback(sc, reply)) {
        if (client_command_argv(c, on_eval_reply, sc, sc->argc, sc->argv, sc->argvlen) == QN_OK)
            return;
        reply = NULL;
        err = "cannot re-send EVAL after NOSCRIPT";
    }
    o->cb(c, reply, err, o->arg);
    free(sc);
}

qn_status redis_eval(redis_client *c, const char *name, int nkeys, const char **keys, int nargs,
                     const char **args, redis_cb cb, void *arg)
{
    rcmd_script *sc;
    const char *why;
    redis_req *r;
    qn_status st;

    if (!c || !cb || !name)
        return QN_EINVAL;
    if (c->closing)
        return QN_ERR;
    st = rcmd_script_new(c->scripts, name, nkeys, keys, nargs, args, sizeof(eval_owner), &sc, &why);
    if (st == QN_ENOTFOUND) {
        /* Told to cb, as a failure of the call. */
        if (!(r = req_new(c, cb, arg)))
            return QN_ENOMEM;
        req_fail_later(r, why);
        return QN_OK;
    }
    if (st != QN_OK)
        return st;
    eval_owner *o = rcmd_script_extra(sc);
    o->cb = cb;
    o->arg = arg;
    st = client_command_argv(c, on_eval_reply, sc, sc->argc, sc->argv, sc->argvlen);
    if (st != QN_OK)
        free(sc);
    return st;
}

static void on_script_loaded(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    const redis_script *sc = redis_scripts_at(c->scripts, (size_t)(uintptr_t)arg & 0xffff);
    redis_node *n = c->nodes[(size_t)(uintptr_t)arg >> 16];

    if (err) {
        /* A transport failure is retried by the reconnect; so is a server still loading its
         * data after a restart (LOADING), which else would keep the service not ready for good.
         * Any other error reply (a script that does not compile) keeps the service not ready,
         * which is what /readyz must show. */
        if (reply && strncmp(err, "LOADING", 7) == 0) {
            if (n->ac)
                log_warn(NULL, "redis: %s:%d is loading its data; connecting again", n->host,
                         n->port);
            node_drop(n);
        } else if (reply) {
            log_error(NULL, "redis: SCRIPT LOAD %s on %s:%d failed: %s", sc->name, n->host, n->port,
                      err);
        }
        return;
    }
    if (reply->type != REDIS_REPLY_STRING || strcmp(reply->str, sc->sha1) != 0) {
        log_error(NULL, "redis: SCRIPT LOAD %s returned an unexpected SHA1", sc->name);
        return;
    }
    if (n->loading_scripts && ++n->scripts_loaded == redis_scripts_count(c->scripts) &&
        n->state == RC_CONNECTED) {
        n->loading_scripts = 0;
        n->scripts_ok = 1;
        n->backoff_ms = REDIS_BACKOFF_MIN_MS;
        client_update_ready(c);
    }
}

/* SCRIPT LOAD of every script on n's connection; ready once all are in. */
static void node_load_scripts(redis_node *n)
{
    redis_client *c = n->c;
    if (n->loading_scripts || n->scripts_ok)
        return;
    n->scripts_loaded = 0;
    if (redis_scripts_count(c->scripts) == 0) {
        n->scripts_ok = 1;
        n->backoff_ms = REDIS_BACKOFF_MIN_MS;
        client_update_ready(c);
        return;
    }
    n->loading_scripts = 1;
    for (size_t i = 0; i < redis_scripts_count(c->scripts); i++) {
        const redis_script *sc = redis_scripts_at(c->scripts, i);
        const char *argv[3] = {"SCRIPT", "LOAD", sc->source};
        size_t argvlen[3] = {6, 4, sc->source_len};
        uintptr_t tag = (uintptr_t)n->index << 16 | i;
        if (node_send_argv(n, on_script_loaded, (void *)tag, 3, argv, argvlen) != QN_OK) {
            node_drop(n);
            return;
        }
    }
}

/* Connected, authenticated and, in a Sentinel deployment, confirmed master: commands flow. */
static void node_verified(redis_node *n)
{
    redis_client *c = n->c;
    n->state = RC_CONNECTED;
    n->connects++;
    log_info(NULL, "redis: connected to %s:%d", n->host, n->port);
    if (c->cluster) {
        if (!c->map.complete || !c->refreshing)
            cluster_want_refresh(c);
        if (!n->master)
            return; /* a replica, or not known yet: scripts once it serves slots */
    }
    node_load_scripts(n);
}

static void on_role(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    redis_node *n = c->nodes[(int)(uintptr_t)arg];
    if (err) {
        if (reply) {
            log_error(NULL, "redis: ROLE on %s:%d failed: %s", n->host, n->port, err);
            node_drop(n);
        }
        return;
    }
    if (!rsentinel_role_master(reply)) {
        /* A sentinel that has not seen the failover yet named the old master: the next
         * connect asks the next sentinel. */
        log_warn(NULL,
                 "redis: %s:%d is not the master of \"%s\" (ROLE); asking the sentinels again",
                 n->host, n->port, rsentinel_master_name(c->conf.sentinel));
        rsentinel_skip(c->conf.sentinel);
        node_drop(n);
        return;
    }
    node_verified(n);
}

/* In a Sentinel deployment the server the sentinels named must say master (ROLE) first. */
static void node_authenticated(redis_node *n)
{
    redis_client *c = n->c;
    static const char *argv[1] = {"ROLE"};
    if (!c->conf.sentinel) {
        node_verified(n);
        return;
    }
    n->state = RC_AUTHENTICATING;
    if (node_send_argv(n, on_role, (void *)(uintptr_t)n->index, 1, argv, NULL) != QN_OK)
        node_drop(n);
}

static void on_auth(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    redis_node *n = c->nodes[(int)(uintptr_t)arg];
    if (err) {
        if (reply) {
            log_error(NULL, "redis: AUTH on %s:%d failed: %s", n->host, n->port, err);
            node_drop(n);
        }
        return;
    }
    node_authenticated(n);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    redis_node *n = ac->data;
    redis_client *c = n->c;
    const char *argv[2];
    size_t argvlen[2];

    if (n->ac != ac)
        return;
    event_del(n->connect_timeout_ev);
    if (status != REDIS_OK) {
        /* hiredis frees the context after this returns. */
        log_warn(NULL, "redis: cannot connect to %s:%d: %s", n->host, n->port,
                 ac->errstr[0] ? ac->errstr : "error");
        n->ac = NULL;
        n->state = RC_DISCONNECTED;
        node_schedule_reconnect(n);
        return;
    }
    if (rcmd_auth_argv(&c->conf, argv, argvlen) == 0) {
        node_authenticated(n);
        return;
    }
    n->state = RC_AUTHENTICATING;
    if (node_send_argv(n, on_auth, (void *)(uintptr_t)n->index, 2, argv, argvlen) != QN_OK)
        node_drop(n);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    redis_node *n = ac->data;

    if (n->ac != ac)
        return; /* we dropped it ourselves and already scheduled the reconnect */
    log_warn(NULL, "redis: connection to %s:%d lost: %s", n->host, n->port,
             status == REDIS_OK ? "closed" : (ac->errstr[0] ? ac->errstr : "error"));
    node_lost(n);
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    redis_node *n = arg;
    (void)fd;
    (void)what;
    log_warn(NULL, "redis: connect to %s:%d timed out after %d ms", n->host, n->port,
             n->c->conf.connect_timeout_ms);
    node_drop(n);
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_start_connect(arg);
}

/* A hiredis connection to n's address, then AUTH, ROLE and the scripts from its callbacks. */
static void node_connect(redis_node *n)
{
    redis_client *c = n->c;
    struct timeval tv = rcmd_timeval(c->conf.connect_timeout_ms);
    redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);

    if (!ac || ac->err) {
        log_warn(NULL, "redis: cannot connect to %s:%d: %s", n->host, n->port,
                 ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        node_schedule_reconnect(n);
        return;
    }
    ac->data = n;
    if (redisLibeventAttach(ac, c->base) != REDIS_OK) {
        redisAsyncFree(ac);
        node_schedule_reconnect(n);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    n->ac = ac;
    n->state = RC_CONNECTING;
    evtimer_add(n->connect_timeout_ev, &tv);
}

/* A Sentinel deployment: the sentinels named the master (asked before every connect, never
 * remembered across one), which node 0 connects to now. Meanwhile the node had no connection,
 * so commands failed as while disconnected. */
static void client_on_resolved(qn_status st, const rcluster_addr *a, const char *err, void *arg)
{
    redis_client *c = arg;
    redis_node *n = c->nodes[0];
    char *host;

    if (st != QN_OK) {
        log_warn(NULL, "redis: %s", err);
        node_schedule_reconnect(n);
        return;
    }
    if (strcmp(a->host, n->host) != 0 || a->port != n->port) {
        if (!(host = strdup(a->host)) ||
            rcmd_conf_set_server(&c->conf, a->host, a->port) != QN_OK) {
            free(host);
            log_error(NULL, "redis: out of memory");
            node_schedule_reconnect(n);
            return;
        }
        log_info(NULL, "redis: the sentinels name %s:%d as master \"%s\"", a->host, a->port,
                 rsentinel_master_name(c->conf.sentinel));
        free(n->host);
        n->host = host;
        n->port = a->port;
    }
    node_connect(n);
}

static void node_start_connect(redis_node *n)
{
    redis_client *c = n->c;

    if (c->closing || n->ac)
        return;
    if (c->resolver) {
        /* Asked on the loop: the answer (client_on_resolved) connects. */
        rsentinel_resolver_start(c->resolver, RSENTINEL_BUDGET_MS);
        return;
    }
    node_connect(n);
}

/* The sentinels elected a new master: leave the old one now (it may take writes for some
 * seconds yet, until the sentinels reconfigure it), and connect anew, asking them. */
static void client_on_switch(const rcluster_addr *master, void *arg)
{
    redis_client *c = arg;
    redis_node *n = c->nodes[0];
    if (strcmp(master->host, n->host) == 0 && master->port == n->port)
        return;
    n->backoff_ms = REDIS_BACKOFF_MIN_MS;
    if (n->ac) {
        node_drop(n);
    } else {
        /* Between tries, or asking: the next question at once (one under way may have gone
         * to a sentinel that has not seen the switch). */
        struct timeval now = {0, 0};
        rsentinel_resolver_cancel(c->resolver);
        evtimer_add(n->reconnect_ev, &now);
    }
}

redis_client *redis_client_new(struct event_base *base, const redis_opts *opts)
{
    redis_client *c = NULL;
    char err[160];

    if (!base || !opts)
        goto fail;
    c = calloc(1, sizeof(*c));
    if (!c)
        goto fail;
    c->base = base;
    if (rcmd_conf_init(&c->conf, opts, err, sizeof(err)) != QN_OK) {
        log_error(NULL, "redis: %s", err);
        goto fail;
    }
    c->cluster = c->conf.cluster;
    c->max_pending = opts->max_pending > 0 ? opts->max_pending : 10000;
    rcluster_map_init(&c->map, RCMD_NODES_MAX, cluster_on_new_node, c);
    c->scripts = redis_scripts_load_dir(opts->lua_dir);
    if (!c->scripts)
        goto fail;
    if (c->cluster) {
        c->refresh_ev = evtimer_new(base, on_refresh_timer, c);
        if (!c->refresh_ev)
            goto fail;
        for (int i = 0; i < c->conf.nstartup; i++)
            if (!cluster_node_at(c, &c->conf.startup[i]))
                goto fail;
        struct timeval tv = rcmd_timeval(REDIS_REFRESH_FAULT_MS);
        evtimer_add(c->refresh_ev, &tv);
    } else {
        /* The resolver first: the node's first connect asks it. */
        if (c->conf.sentinel &&
            !(c->resolver = rsentinel_resolver_new(base, c->conf.sentinel, client_on_resolved, c)))
            goto fail;
        redis_node *n = node_add(c, c->conf.host, c->conf.port);
        if (!n)
            goto fail;
        n->master = 1;
        if (c->conf.sentinel &&
            !(c->watch = rsentinel_watch_new(base, c->conf.sentinel, client_on_switch, c)))
            goto fail;
    }
    return c;
fail:
    log_error(NULL, "redis: cannot create the client");
    redis_client_free(c);
    return NULL;
}

void redis_client_free(redis_client *c)
{
    if (!c)
        return;
    c->closing = 1;
    rsentinel_watch_free(c->watch);
    rsentinel_resolver_free(c->resolver);
    for (int i = 0; i < c->nnodes; i++) {
        redis_node *n = c->nodes[i];
        if (n->ac) {
            redisAsyncContext *ac = n->ac;
            n->ac = NULL;
            redisAsyncFree(ac); /* fails what is in hiredis with "client closed" */
        }
    }
    while (c->reqs)
        req_finish(c->reqs, NULL, "client closed");
    for (int i = 0; i < c->nnodes; i++)
        node_free(c->nodes[i]);
    if (c->refresh_ev)
        event_free(c->refresh_ev);
    rcluster_map_free(&c->map);
    redis_scripts_free(c->scripts);
    free(c->nodes);
    rcmd_conf_free(&c->conf);
    free(c);
}

int redis_client_connected(const redis_client *c)
{
    return c && client_all_masters(c, 0);
}

int redis_client_ready(const redis_client *c)
{
    return c && c->ready;
}

int redis_client_up(const redis_client *c)
{
    return c && __atomic_load_n(&c->ready_any, __ATOMIC_ACQUIRE);
}

const redis_scripts *redis_client_scripts(const redis_client *c)
{
    return c->scripts;
}

struct event_base *redis_client_base(const redis_client *c)
{
    return c->base;
}

unsigned long redis_client_connects(const redis_client *c)
{
    unsigned long n = 0;
    if (!c)
        return 0;
    for (int i = 0; i < c->nnodes; i++)
        n += c->nodes[i]->connects;
    return n + c->map.topology;
}

int redis_client_cluster(const redis_client *c)
{
    return c && c->cluster;
}

int redis_client_node_count(const redis_client *c)
{
    return c ? c->nnodes : 0;
}

int redis_client_node_master(const redis_client *c, int node)
{
    return c && node >= 0 && node < c->nnodes && c->nodes[node]->master;
}

int redis_client_node_connected(const redis_client *c, int node)
{
    return c && node >= 0 && node < c->nnodes && c->nodes[node]->state == RC_CONNECTED;
}

unsigned long redis_client_node_connects(const redis_client *c, int node)
{
    return c && node >= 0 && node < c->nnodes ? c->nodes[node]->connects : 0;
}

const char *redis_client_node_host(const redis_client *c, int node)
{
    return c && node >= 0 && node < c->nnodes ? c->nodes[node]->host : NULL;
}

int redis_client_node_port(const redis_client *c, int node)
{
    return c && node >= 0 && node < c->nnodes ? c->nodes[node]->port : 0;
}

int redis_client_node_first_slot(const redis_client *c, int node)
{
    if (!c || node < 0 || node >= c->nnodes || !c->nodes[node]->master)
        return -1;
    if (!c->cluster)
        return 0;
    return c->map.first_slot[node] < RSLOT_COUNT ? c->map.first_slot[node] : -1;
}

unsigned long redis_client_topology(const redis_client *c)
{
    return c ? c->map.topology : 0;
}
