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

#include "log.h"
#include "now.h"
#include "rcluster.h"
#include "rslot.h"

#define REDIS_BACKOFF_MIN_MS 100
#define REDIS_BACKOFF_MAX_MS 2000

/* ---------------------------------------------------------------- EVAL argument vectors */

/* One EVALSHA call with private copies of keys and args: the NOSCRIPT retry re-sends it
 * after the caller's arrays are gone. */
typedef struct eval_call {
    const redis_script *script; /* borrowed from the registry */
    redis_cb cb;
    void *arg;
    int retried;
    int argc;
    const char **argv;
    size_t *argvlen;
    char numkeys[16];
} eval_call;

static eval_call *eval_call_new(const redis_script *sc, int nkeys, const char **keys, int nargs,
                                const char **args)
{
    size_t bytes = sizeof(eval_call), n;
    eval_call *ec;
    char *p;

    if (nkeys < 0 || nargs < 0 || (nkeys && !keys) || (nargs && !args))
        return NULL;
    n = 3 + (size_t)nkeys + (size_t)nargs;
    bytes += n * (sizeof(char *) + sizeof(size_t));
    for (int i = 0; i < nkeys; i++)
        bytes += strlen(keys[i]) + 1;
    for (int i = 0; i < nargs; i++)
        bytes += strlen(args[i]) + 1;
    ec = calloc(1, bytes);
    if (!ec)
        return NULL;
    ec->script = sc;
    ec->argc = (int)n;
    ec->argv = (const char **)(ec + 1);
    ec->argvlen = (size_t *)(ec->argv + n);
    p = (char *)(ec->argvlen + n);
    log_i64_str(ec->numkeys, nkeys);
    ec->argv[0] = "EVALSHA";
    ec->argv[1] = sc->sha1;
    ec->argv[2] = ec->numkeys;
    for (int i = 0; i < nkeys + nargs; i++) {
        const char *src = i < nkeys ? keys[i] : args[i - nkeys];
        size_t len = strlen(src);
        memcpy(p, src, len + 1);
        ec->argv[3 + i] = p;
        p += len + 1;
    }
    for (size_t i = 0; i < n; i++)
        ec->argvlen[i] = i == 1 ? 40 : strlen(ec->argv[i]);
    return ec;
}

/* Switches the call to EVAL <source>; returns 0 if it already was. */
static int eval_call_fallback(eval_call *ec)
{
    if (ec->retried)
        return 0;
    ec->retried = 1;
    ec->argv[0] = "EVAL";
    ec->argvlen[0] = 4;
    ec->argv[1] = ec->script->source;
    ec->argvlen[1] = ec->script->source_len;
    return 1;
}

static int reply_is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str && strncmp(r->str, "NOSCRIPT", 8) == 0;
}

/* ---------------------------------------------------------------- asynchronous client */

/*
 * The client is a set of nodes, each one hiredis connection with its own life (connect, AUTH,
 * scripts, reconnect with backoff). Alone (one server) it has one node and sends everything
 * there. In cluster mode it keeps the slot map (CLUSTER SLOTS) and sends each command to the
 * master of its key's slot; a redirect or a cluster that is busy re-sends the command, so a
 * cluster request keeps its formatted text until its callback has run.
 */

#define REDIS_NODES_MAX                                                                            \
    64 /* nodes a cluster client knows (the first ones given, masters, redirects) */
#define REDIS_REDIRECTS_MAX    5  /* MOVED/ASK hops of one command */
#define REDIS_RETRY_MIN_MS     20 /* TRYAGAIN, CLUSTERDOWN, a slot whose master is not up */
#define REDIS_RETRY_MAX_MS     400
#define REDIS_REFRESH_GAP_MS   100  /* between two CLUSTER SLOTS asked for by errors */
#define REDIS_REFRESH_IDLE_MS  2000 /* the map asked again while all is well */
#define REDIS_REFRESH_FAULT_MS 250  /* ... while a slot has no connected master */
#define REDIS_ARGV_STACK       64   /* arguments split on the stack to find a command's slot */

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
    const char *drop_err; /* why the pending commands fail while we drop the connection */
    struct event *reconnect_ev;
    struct event *connect_timeout_ev;
} redis_node;

typedef enum {
    REQ_NEW = 0,    /* accepted, not sent */
    REQ_IN_HIREDIS, /* sent: its reply callback will come */
    REQ_FAIL_LATER, /* its timer fires at once and reports fail_err */
    REQ_RETRY_LATER /* cluster: its timer sends it again */
} req_state;

/* A command accepted by redis_command*: on the client's list from acceptance until its
 * callback ran. */
typedef struct redis_req {
    struct redis_req *prev, *next;
    redis_client *c;
    redis_node *node; /* where it is in hiredis */
    redis_cb cb;
    void *arg;
    struct event timer; /* command timeout, the deferred failure, or the re-send */
    req_state state;
    int timed_out;
    const char *fail_err;
    /* cluster mode: the command, to be sent again after a redirect */
    char *cmd;
    size_t len;
    int slot; /* RSLOT_NONE: any master */
    int redirects;
    int retry_ms;
    redis_node *ask; /* ASK: send to this node once, after ASKING */
    int64_t deadline_ms;
} redis_req;

struct redis_client {
    struct event_base *base;
    char *password;
    int connect_timeout_ms;
    int command_timeout_ms;
    int max_pending;
    redis_scripts *scripts;
    int cluster;

    redis_node *nodes[REDIS_NODES_MAX]; /* cluster: by the map's node index */
    int nnodes;
    rcluster_map map; /* cluster: the nodes' addresses and the slot map */
    int refreshing;
    int64_t refreshed_ms;
    struct event *refresh_ev;
    unsigned rr; /* round robin for commands without a key */

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
static void req_dispatch(redis_req *r);

static struct timeval ms_to_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

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

/* Cluster: sent again after a delay (doubling), unless that passes the deadline. */
static void req_retry_later(redis_req *r, const char *err)
{
    int64_t left = r->deadline_ms - now_mono_ms();
    r->retry_ms = r->retry_ms ? r->retry_ms * 2 : REDIS_RETRY_MIN_MS;
    if (r->retry_ms > REDIS_RETRY_MAX_MS)
        r->retry_ms = REDIS_RETRY_MAX_MS;
    if (left <= r->retry_ms) {
        req_fail_later(r, err);
        return;
    }
    struct timeval tv = ms_to_tv(r->retry_ms);
    r->state = REQ_RETRY_LATER;
    r->fail_err = err;
    evtimer_add(&r->timer, &tv);
}

static void node_drop(redis_node *n, const char *why);

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
        req_dispatch(r);
        return;
    case REQ_IN_HIREDIS:
        /* Replies come in order, so everything behind the overdue one is stuck as well: drop
         * the connection (failing them all now) and reconnect. */
        r->timed_out = 1;
        log_warn(NULL, "redis: a command to %s:%d got no reply within %d ms; reconnecting",
                 r->node->host, r->node->port, r->c->command_timeout_ms);
        node_drop(r->node, "connection dropped after a command timeout");
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
    r->slot = RSLOT_NONE;
    r->deadline_ms = now_mono_ms() + c->command_timeout_ms;
    evtimer_assign(&r->timer, c->base, on_req_timer, r);
    r->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = r;
    c->reqs = r;
    c->nreqs++;
    return r;
}

static void on_hiredis_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* Hands r to node n's connection; its timer then runs to the deadline. */
static void req_send(redis_req *r, redis_node *n, const char *cmd, size_t len)
{
    int64_t left = r->deadline_ms - now_mono_ms();
    struct timeval tv = ms_to_tv(left > 1 ? (int)left : 1);
    r->node = n;
    r->state = REQ_IN_HIREDIS;
    if (redisAsyncFormattedCommand(n->ac, on_hiredis_reply, r, cmd, len) != REDIS_OK) {
        req_fail_later(r, "not connected");
        return;
    }
    evtimer_add(&r->timer, &tv);
}

/* ---- the slot map (cluster) ---- */

static redis_node *node_new(redis_client *c, const char *host, int port)
{
    redis_node *n;
    if (c->nnodes == REDIS_NODES_MAX)
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

/* The next CLUSTER SLOTS: soon after an error (at most one per REDIS_REFRESH_GAP_MS), else on
 * the periodic timer. */
static void cluster_want_refresh(redis_client *c)
{
    if (!c->cluster || c->closing)
        return;
    int64_t wait = c->refreshed_ms + REDIS_REFRESH_GAP_MS - now_mono_ms();
    struct timeval tv = ms_to_tv(wait > 0 ? (int)wait : 0);
    evtimer_add(c->refresh_ev, &tv);
}

static void on_refresh_timer(evutil_socket_t fd, short what, void *arg)
{
    redis_client *c = arg;
    (void)fd;
    (void)what;
    cluster_refresh_now(c);
    struct timeval tv =
        ms_to_tv(client_all_masters(c, 0) ? REDIS_REFRESH_IDLE_MS : REDIS_REFRESH_FAULT_MS);
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

/* Sends (or re-sends) a cluster request to its slot's master. */
static void req_dispatch(redis_req *r)
{
    redis_client *c = r->c;
    redis_node *n = r->ask ? r->ask : cluster_node_for(c, r->slot);
    if (!n || n->state != RC_CONNECTED) {
        /* A failover or a reconnect in progress: the map is asked again and the command waits
         * a little, within its deadline, rather than failing at once. */
        cluster_want_refresh(c);
        req_retry_later(r, "not connected");
        return;
    }
    if (r->ask) {
        r->ask = NULL;
        if (redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK) {
            req_fail_later(r, "not connected");
            return;
        }
    }
    req_send(r, n, r->cmd, r->len);
}

/* A cluster error reply that moves the request elsewhere or later: 1 when r was taken care of
 * (it is not finished), 0 when the reply is the request's answer. */
static int cluster_redirect(redis_req *r, const redisReply *reply)
{
    redis_client *c = r->c;
    int slot;
    rcluster_addr to;
    rcluster_verdict v = rcluster_verdict_of(reply, &slot, &to);

    if (v == RCLUSTER_FINAL)
        return 0;
    if (v == RCLUSTER_RETRY) {
        cluster_want_refresh(c);
        req_retry_later(r, reply->str[0] == 'T'   ? "TRYAGAIN: the slot is being moved"
                           : reply->str[0] == 'L' ? "LOADING: the node is loading its data"
                                                  : "CLUSTERDOWN: the cluster is down");
        return 1;
    }
    redis_node *n = to.host[0] ? cluster_node_at(c, &to) : r->node;
    if (!n || ++r->redirects > REDIS_REDIRECTS_MAX)
        return 0;
    if (v == RCLUSTER_MOVED) {
        /* This slot at once; the rest of the map with the next refresh. */
        rcluster_map_moved(&c->map, slot, n->index);
        cluster_want_refresh(c);
    } else {
        r->ask = n;
    }
    if (n->state != RC_CONNECTED) {
        req_retry_later(r, "not connected");
        return 1;
    }
    req_dispatch(r);
    return 1;
}

/* ---- nodes: connect, authenticate, load the scripts, reconnect ---- */

static void node_schedule_reconnect(redis_node *n)
{
    struct timeval tv = ms_to_tv(n->backoff_ms);
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
 * calls every pending reply callback with NULL, which fails them with why. */
static void node_drop(redis_node *n, const char *why)
{
    redisAsyncContext *ac = n->ac;
    if (!ac)
        return;
    n->ac = NULL;
    event_del(n->connect_timeout_ev);
    n->drop_err = why;
    redisAsyncFree(ac);
    n->drop_err = NULL;
    node_lost(n);
}

static void on_hiredis_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    redis_req *r = privdata;
    redis_node *n = r->node;
    const redisReply *rep = reply;
    const char *err = NULL;
    (void)ac;

    event_del(&r->timer);
    if (!rep) {
        if (r->timed_out)
            err = "timeout";
        else if (r->c->closing)
            err = "client closed";
        else if (n->drop_err)
            err = n->drop_err;
        else
            err = "connection lost";
    } else if (r->cmd && rep->type == REDIS_REPLY_ERROR && rep->str && !r->c->closing &&
               cluster_redirect(r, rep)) {
        return;
    }
    req_finish(r, rep, err);
}

/* The one way commands reach one node's hiredis connection: internal ones (AUTH, SCRIPT LOAD,
 * CLUSTER SLOTS) before the node counts as connected, and everything in single mode. */
static qn_status node_send_formatted(redis_node *n, int internal, redis_cb cb, void *arg,
                                     const char *cmd, size_t len)
{
    redis_client *c = n->c;
    redis_req *r;

    if (c->closing)
        return QN_ERR;
    r = req_new(c, cb, arg);
    if (!r)
        return QN_ENOMEM;
    if (!n->ac || (!internal && n->state != RC_CONNECTED)) {
        req_fail_later(r, "not connected");
        return QN_OK;
    }
    if (c->nreqs > c->max_pending) {
        req_fail_later(r, "too many pending commands");
        return QN_OK;
    }
    req_send(r, n, cmd, len);
    return QN_OK;
}

/* "<prefix><n>\r\n" at p; returns the end. */
static char *resp_put_len(char *p, char prefix, size_t n)
{
    *p++ = prefix;
    p += log_i64_str(p, (int64_t)n);
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* The RESP array of argv into buf (cap bytes), or into a malloc'ed buffer (*heap, the caller
 * frees it) when it does not fit. What hiredis' redisFormatCommandArgv makes, without its
 * sprintf per argument and its allocation for every command. Returns the length, or 0 when out
 * of memory. */
static size_t resp_format(char *buf, size_t cap, char **heap, int argc, const char **argv,
                          const size_t *argvlen)
{
    size_t total = 24 + 2;
    for (int i = 0; i < argc; i++)
        total += 24 + 2 + (argvlen ? argvlen[i] : strlen(argv[i])) + 2;
    *heap = NULL;
    if (total > cap) {
        if (!(*heap = malloc(total)))
            return 0;
        buf = *heap;
    }
    char *p = resp_put_len(buf, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        size_t n = argvlen ? argvlen[i] : strlen(argv[i]);
        p = resp_put_len(p, '$', n);
        memcpy(p, argv[i], n);
        p += n;
        *p++ = '\r';
        *p++ = '\n';
    }
    return (size_t)(p - buf);
}

static qn_status node_send_argv(redis_node *n, redis_cb cb, void *arg, int argc, const char **argv,
                                const size_t *argvlen)
{
    char small[1024], *heap;
    size_t len = resp_format(small, sizeof(small), &heap, argc, argv, argvlen);
    if (len == 0)
        return QN_ENOMEM;
    qn_status st = node_send_formatted(n, 1, cb, arg, heap ? heap : small, len);
    free(heap);
    return st;
}

/* The slot of a formatted command (RSLOT_CROSS when it cannot be read). */
static int cmd_slot(const char *cmd, size_t len, char *name, size_t namecap)
{
    const char *argv_s[REDIS_ARGV_STACK];
    size_t lens_s[REDIS_ARGV_STACK];
    const char **argv = argv_s;
    size_t *lens = lens_s;
    int slot = RSLOT_CROSS;
    int argc = rslot_parse_request(cmd, len, argv, lens, REDIS_ARGV_STACK);
    if (argc < 0) { /* many arguments (a long pipeline-sized script call): split on the heap */
        int max = (int)(len / 4) + 1;
        argv = malloc(sizeof(*argv) * (size_t)max);
        lens = malloc(sizeof(*lens) * (size_t)max);
        if (argv && lens)
            argc = rslot_parse_request(cmd, len, argv, lens, max);
    }
    if (argc > 0) {
        slot = rslot_of_command(argc, argv, lens);
        snprintf(name, namecap, "%.*s", (int)(lens[0] < 32 ? lens[0] : 32), argv[0]);
    }
    if (argv != argv_s) {
        free(argv);
        free(lens);
    }
    return slot;
}

/* Every command of the callers: to the one server, or routed by its slot. */
static qn_status client_send_formatted(redis_client *c, redis_cb cb, void *arg, const char *cmd,
                                       size_t len)
{
    redis_req *r;
    char name[40] = "";

    if (!c->cluster) {
        /* Refused on one server too, so that every suite catches what a cluster would. */
        if (cmd_slot(cmd, len, name, sizeof(name)) == RSLOT_CROSS) {
            if (c->closing)
                return QN_ERR;
            log_error(NULL, "redis: %s: its keys lie in different hash slots; not sent", name);
            if (!(r = req_new(c, cb, arg)))
                return QN_ENOMEM;
            req_fail_later(r, "keys in different hash slots");
            return QN_OK;
        }
        return node_send_formatted(c->nodes[0], 0, cb, arg, cmd, len);
    }
    if (c->closing)
        return QN_ERR;
    r = req_new(c, cb, arg);
    if (!r)
        return QN_ENOMEM;
    if (c->nreqs > c->max_pending) {
        req_fail_later(r, "too many pending commands");
        return QN_OK;
    }
    r->slot = cmd_slot(cmd, len, name, sizeof(name));
    if (r->slot == RSLOT_CROSS) {
        /* Never sent: a programming error (keys without a common hash tag). */
        log_error(NULL, "redis: %s: its keys lie in different hash slots; not sent", name);
        req_fail_later(r, "keys in different hash slots");
        return QN_OK;
    }
    if (!(r->cmd = malloc(len))) {
        req_fail_later(r, "out of memory");
        return QN_OK;
    }
    memcpy(r->cmd, cmd, len);
    r->len = len;
    req_dispatch(r);
    return QN_OK;
}

static qn_status client_send_argv(redis_client *c, redis_cb cb, void *arg, int argc,
                                  const char **argv, const size_t *argvlen)
{
    char small[1024], *heap;
    size_t len;
    qn_status st;

    if (!c || !cb || argc <= 0 || !argv)
        return QN_EINVAL;
    len = resp_format(small, sizeof(small), &heap, argc, argv, argvlen);
    if (len == 0)
        return QN_ENOMEM;
    st = client_send_formatted(c, cb, arg, heap ? heap : small, len);
    free(heap);
    return st;
}

qn_status redis_command(redis_client *c, redis_cb cb, void *arg, const char *fmt, ...)
{
    char *cmd = NULL;
    int len;
    va_list ap;
    qn_status st;

    if (!c || !cb || !fmt)
        return QN_EINVAL;
    va_start(ap, fmt);
    len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len == -2)
        return QN_EINVAL; /* bad format string */
    if (len < 0)
        return QN_ENOMEM;
    st = client_send_formatted(c, cb, arg, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return st;
}

qn_status redis_command_argv(redis_client *c, redis_cb cb, void *arg, int argc, const char **argv,
                             const size_t *argvlen)
{
    return client_send_argv(c, cb, arg, argc, argv, argvlen);
}

qn_status redis_command_node(redis_client *c, int node, redis_cb cb, void *arg, const char *fmt,
                             ...)
{
    char *cmd = NULL;
    int len;
    va_list ap;
    qn_status st;

    if (!c || !cb || !fmt || node < 0 || node >= c->nnodes)
        return QN_EINVAL;
    va_start(ap, fmt);
    len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len == -2)
        return QN_EINVAL;
    if (len < 0)
        return QN_ENOMEM;
    st = node_send_formatted(c->nodes[node], 0, cb, arg, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return st;
}

static void on_eval_reply(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    eval_call *ec = arg;

    if (reply_is_noscript(reply) && eval_call_fallback(ec)) {
        if (redis_command_argv(c, on_eval_reply, ec, ec->argc, ec->argv, ec->argvlen) == QN_OK)
            return;
        reply = NULL;
        err = "cannot re-send EVAL after NOSCRIPT";
    }
    ec->cb(c, reply, err, ec->arg);
    free(ec);
}

static void on_unknown_script(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    eval_call *ec = arg; /* a bare holder of cb/arg here */
    (void)reply;
    (void)err;
    ec->cb(c, NULL, "unknown script", ec->arg);
    free(ec);
}

qn_status redis_eval(redis_client *c, const char *name, int nkeys, const char **keys, int nargs,
                     const char **args, redis_cb cb, void *arg)
{
    const redis_script *sc;
    eval_call *ec;
    redis_req *r;
    qn_status st;

    if (!c || !cb || !name || !redis_scripts_call_ok(name, nkeys, nargs))
        return QN_EINVAL;
    if (c->closing)
        return QN_ERR;
    sc = redis_scripts_find(c->scripts, name);
    if (!sc) {
        log_error(NULL, "redis: unknown Lua script %s", name);
        ec = calloc(1, sizeof(*ec));
        if (!ec)
            return QN_ENOMEM;
        ec->cb = cb;
        ec->arg = arg;
        r = req_new(c, on_unknown_script, ec);
        if (!r) {
            free(ec);
            return QN_ENOMEM;
        }
        req_fail_later(r, "unknown script");
        return QN_OK;
    }
    ec = eval_call_new(sc, nkeys, keys, nargs, args);
    if (!ec)
        return QN_EINVAL;
    ec->cb = cb;
    ec->arg = arg;
    st = redis_command_argv(c, on_eval_reply, ec, ec->argc, ec->argv, ec->argvlen);
    if (st != QN_OK)
        free(ec);
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
            node_drop(n, "the server is loading its data");
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
            node_drop(n, "out of memory while loading scripts");
            return;
        }
    }
}

static void node_authenticated(redis_node *n)
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

static void on_auth(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    redis_node *n = c->nodes[(int)(uintptr_t)arg];
    if (err) {
        if (reply) {
            log_error(NULL, "redis: AUTH on %s:%d failed: %s", n->host, n->port, err);
            node_drop(n, "AUTH failed");
        }
        return;
    }
    node_authenticated(n);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    redis_node *n = ac->data;
    redis_client *c = n->c;
    const char *argv[2] = {"AUTH", c->password};

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
    if (!c->password) {
        node_authenticated(n);
        return;
    }
    n->state = RC_AUTHENTICATING;
    if (node_send_argv(n, on_auth, (void *)(uintptr_t)n->index, 2, argv, NULL) != QN_OK)
        node_drop(n, "out of memory");
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
             n->c->connect_timeout_ms);
    node_drop(n, "connect timeout");
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    node_start_connect(arg);
}

static void node_start_connect(redis_node *n)
{
    redis_client *c = n->c;
    struct timeval tv = ms_to_tv(c->connect_timeout_ms);
    redisAsyncContext *ac;

    if (c->closing || n->ac)
        return;
    ac = redisAsyncConnect(n->host, n->port);
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

/* The nodes of opts->cluster_nodes ("host:port,host:port"), each a node. */
static qn_status client_add_nodes(redis_client *c, const char *list)
{
    rcluster_addr a[REDIS_NODES_MAX];
    char err[128];
    int n = rcluster_addrs_parse(list, a, REDIS_NODES_MAX, err, sizeof(err));
    if (n <= 0) {
        log_error(NULL, "redis: bad cluster nodes: %s", n < 0 ? err : "none");
        return QN_EINVAL;
    }
    for (int i = 0; i < n; i++)
        if (!cluster_node_at(c, &a[i]))
            return QN_ERR;
    return QN_OK;
}

redis_client *redis_client_new(struct event_base *base, const redis_opts *opts)
{
    redis_client *c = NULL;
    int cluster = opts && opts->cluster_nodes && *opts->cluster_nodes;

    if (!base || !opts || (!cluster && (!opts->host || opts->port <= 0)))
        goto fail;
    c = calloc(1, sizeof(*c));
    if (!c)
        goto fail;
    c->base = base;
    c->cluster = cluster;
    c->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 1000;
    c->command_timeout_ms = opts->command_timeout_ms > 0 ? opts->command_timeout_ms : 1000;
    c->max_pending = opts->max_pending > 0 ? opts->max_pending : 10000;
    if (opts->password && *opts->password) {
        c->password = strdup(opts->password);
        if (!c->password)
            goto fail;
    }
    rcluster_map_init(&c->map, REDIS_NODES_MAX, cluster_on_new_node, c);
    c->scripts = redis_scripts_load_dir(opts->lua_dir);
    if (!c->scripts)
        goto fail;
    if (cluster) {
        c->refresh_ev = evtimer_new(base, on_refresh_timer, c);
        if (!c->refresh_ev)
            goto fail;
        if (client_add_nodes(c, opts->cluster_nodes) != QN_OK)
            goto fail;
        struct timeval tv = ms_to_tv(REDIS_REFRESH_FAULT_MS);
        evtimer_add(c->refresh_ev, &tv);
    } else {
        redis_node *n = node_add(c, opts->host, opts->port);
        if (!n)
            goto fail;
        n->master = 1;
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
    free(c->password);
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
