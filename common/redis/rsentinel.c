/* Redis Sentinel: the master of a name, asked of the sentinels in turn (rsentinel.h). */
#include "rsentinel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>

#include "log.h"
#include "now.h"

#define RSENTINEL_WATCH_RETRY_MS 1000 /* a watch's next sentinel after a failure */

struct rsentinel {
    rcluster_addr addr[RSENTINEL_MAX];
    int n;
    int first; /* asked first next time: the one that answered last */
    int last;  /* the one that answered last */
    char name[RSENTINEL_NAME_MAX];
    char list[RSENTINEL_MAX * (RCLUSTER_HOST_MAX + 8)];
};

static int rsentinel_name_ok(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len >= RSENTINEL_NAME_MAX)
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

qn_status rsentinel_check(const char *sentinels, const char *master_name, const char *cluster_nodes,
                          char *err, size_t errlen)
{
    char why[256];
    int have_s = sentinels && *sentinels, have_n = master_name && *master_name;

    if (!have_s && !have_n)
        return QN_OK;
    if (cluster_nodes && *cluster_nodes) {
        qn_errf(err, errlen,
                "QUAN_REDIS_SENTINELS/QUAN_REDIS_MASTER_NAME: not with QUAN_REDIS_CLUSTER_NODES "
                "(Sentinel and Redis Cluster are two deployments; set one)");
        return QN_EINVAL;
    }
    if (!have_s) {
        qn_errf(err, errlen,
                "QUAN_REDIS_SENTINELS: empty while QUAN_REDIS_MASTER_NAME is set (both or "
                "neither)");
        return QN_EINVAL;
    }
    if (!have_n) {
        qn_errf(err, errlen,
                "QUAN_REDIS_MASTER_NAME: empty while QUAN_REDIS_SENTINELS is set (both or "
                "neither)");
        return QN_EINVAL;
    }
    if (rcluster_addrs_parse(sentinels, NULL, RSENTINEL_MAX, why, sizeof(why)) < 0) {
        qn_errf(err, errlen, "QUAN_REDIS_SENTINELS: %s", why);
        return QN_EINVAL;
    }
    if (!rsentinel_name_ok(master_name)) {
        qn_errf(err, errlen,
                "QUAN_REDIS_MASTER_NAME: \"%.64s\" is not a master's name (1..%d letters, digits, "
                "'.', '_' or '-')",
                master_name, RSENTINEL_NAME_MAX - 1);
        return QN_EINVAL;
    }
    return QN_OK;
}

rsentinel *rsentinel_new(const char *sentinels, const char *master_name, char *err, size_t errlen)
{
    rsentinel *s = NULL;

    if (!sentinels || !*sentinels || !master_name || !*master_name) {
        qn_errf(err, errlen, "QUAN_REDIS_SENTINELS and QUAN_REDIS_MASTER_NAME: both are needed");
        return NULL;
    }
    if (rsentinel_check(sentinels, master_name, NULL, err, errlen) != QN_OK)
        return NULL;
    if (!(s = calloc(1, sizeof(*s)))) {
        qn_errf(err, errlen, "out of memory");
        return NULL;
    }
    s->n = rcluster_addrs_parse(sentinels, s->addr, RSENTINEL_MAX, err, errlen);
    snprintf(s->name, sizeof(s->name), "%s", master_name);
    for (int i = 0; i < s->n; i++) {
        size_t used = strlen(s->list);
        snprintf(s->list + used, sizeof(s->list) - used, "%s%s:%d", i ? "," : "", s->addr[i].host,
                 s->addr[i].port);
    }
    return s;
}

void rsentinel_free(rsentinel *s)
{
    free(s);
}

const char *rsentinel_master_name(const rsentinel *s)
{
    return s->name;
}

const char *rsentinel_list(const rsentinel *s)
{
    return s->list;
}

/* What a sentinel answered to SENTINEL get-master-addr-by-name, for both ways of asking.
 * QN_OK: *out; QN_ENOTFOUND: it knows no such master; QN_EINVAL: it answered something else (an
 * error reply: not a sentinel?). why says what happened. */
static qn_status rsentinel_answer(const rsentinel *s, const redisReply *r, rcluster_addr *out,
                                  char *why, size_t whylen)
{
    if (r->type == REDIS_REPLY_NIL) {
        qn_errf(why, whylen, "no master named \"%s\"", s->name);
        return QN_ENOTFOUND;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        qn_errf(why, whylen, "%s", r->str);
        return QN_EINVAL;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || r->element[0]->len >= sizeof(out->host)) {
        qn_errf(why, whylen, "an unexpected reply");
        return QN_EINVAL;
    }
    int port = atoi(r->element[1]->str);
    if (port < 1 || port > 65535) {
        qn_errf(why, whylen, "a bad port \"%.16s\"", r->element[1]->str);
        return QN_EINVAL;
    }
    memcpy(out->host, r->element[0]->str, r->element[0]->len);
    out->host[r->element[0]->len] = '\0';
    out->port = port;
    return QN_OK;
}

/* One sentinel asked within ms, blocking. As rsentinel_answer, and QN_ERR: no answer. */
static qn_status rsentinel_ask(const rsentinel *s, const rcluster_addr *a, int ms,
                               rcluster_addr *out, char *why, size_t whylen)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisReply *r = NULL;
    qn_status st = QN_ERR;
    redisContext *c = redisConnectWithTimeout(a->host, a->port, tv);

    if (!c || c->err) {
        qn_errf(why, whylen, "%s", c ? c->errstr : "out of memory");
        goto out;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        qn_errf(why, whylen, "%s", c->errstr);
        goto out;
    }
    r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", s->name);
    if (!r) {
        qn_errf(why, whylen, "%s", c->errstr[0] ? c->errstr : "no reply");
        goto out;
    }
    st = rsentinel_answer(s, r, out, why, whylen);
out:
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return st;
}

/*
 * One resolution's walk over the sentinels, the same for the blocking and the loop's way of
 * asking: from the one that answered last, each once, within the budget (the first always
 * asked); what they said, for the verdict.
 */
typedef struct rsentinel_walk {
    int64_t end;
    int budget_ms;
    int k; /* sentinels taken so far */
    int i; /* the one being asked */
    int answered, unknown;
    char last[200];
} rsentinel_walk;

static void rsentinel_walk_start(const rsentinel *s, rsentinel_walk *w, int budget_ms)
{
    memset(w, 0, sizeof(*w));
    w->budget_ms = budget_ms > 0 ? budget_ms : RSENTINEL_BUDGET_MS;
    w->end = now_mono_ms() + w->budget_ms;
    w->i = s->first;
}

/* The next sentinel to ask and its time in *ms; NULL when the walk is over. */
static const rcluster_addr *rsentinel_walk_next(const rsentinel *s, rsentinel_walk *w, int *ms)
{
    int64_t left = w->end - now_mono_ms();
    if (w->k == s->n || (w->k > 0 && left <= 0))
        return NULL;
    w->i = (s->first + w->k++) % s->n;
    *ms = left < RSENTINEL_QUERY_MS ? (int)(left > 1 ? left : 1) : RSENTINEL_QUERY_MS;
    return &s->addr[w->i];
}

/* What the sentinel rsentinel_walk_next gave said (st, why: as rsentinel_answer, QN_ERR for no
 * answer). 1 when it named the master: the walk is over and the next starts from it. */
static int rsentinel_walk_note(rsentinel *s, rsentinel_walk *w, qn_status st, const char *why)
{
    if (st == QN_OK) {
        s->first = s->last = w->i;
        return 1;
    }
    w->answered += st == QN_ENOTFOUND || st == QN_EINVAL;
    w->unknown += st == QN_ENOTFOUND;
    snprintf(w->last, sizeof(w->last), "%s:%d: %s", s->addr[w->i].host, s->addr[w->i].port, why);
    return 0;
}

/* The verdict of a walk over without an address (rsentinel_resolve's QN_ENOTFOUND or QN_ERR). */
static qn_status rsentinel_walk_fail(const rsentinel *s, const rsentinel_walk *w, char *err,
                                     size_t errlen)
{
    if (w->answered > 0 && w->unknown == w->answered) {
        qn_errf(err, errlen,
                "sentinel: no sentinel of %s knows a master named \"%s\" (QUAN_REDIS_MASTER_NAME)",
                s->list, s->name);
        return QN_ENOTFOUND;
    }
    qn_errf(err, errlen, "sentinel: no sentinel of %s named master \"%s\" within %d ms (last: %s)",
            s->list, s->name, w->budget_ms, w->last);
    return QN_ERR;
}

qn_status rsentinel_resolve(rsentinel *s, int budget_ms, rcluster_addr *out, char *err,
                            size_t errlen)
{
    rsentinel_walk w;
    const rcluster_addr *a;
    char why[160] = "";
    int ms;

    rsentinel_walk_start(s, &w, budget_ms);
    while ((a = rsentinel_walk_next(s, &w, &ms)))
        if (rsentinel_walk_note(s, &w, rsentinel_ask(s, a, ms, out, why, sizeof(why)), why))
            return QN_OK;
    return rsentinel_walk_fail(s, &w, err, errlen);
}

void rsentinel_skip(rsentinel *s)
{
    s->first = (s->last + 1) % s->n;
}

int rsentinel_role_master(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
           r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
}

int rsentinel_readonly_text(const char *err)
{
    return err && strncmp(err, "READONLY", 8) == 0;
}

int rsentinel_readonly(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && rsentinel_readonly_text(r->str);
}

/* ---------------------------------------------------------------- on the event loop */

/*
 * One asynchronous connection to a sentinel at a time, for the watch and the resolver: opened
 * to an address with a command sent once connected, every reply to on_reply, and any failure
 * (connect refused, connection lost, no answer within the timer) to on_fail once, the
 * connection then gone. The owner closes it when done (rsentinel_conn_close), from inside
 * on_reply too: hiredis defers the free until its callback returns, and ac->data is cleared so
 * that nothing hiredis calls back afterwards reaches the owner. A second timer is the owner's
 * "later" (the watch's next try, the resolver's result told from the loop).
 */
typedef struct rsentinel_conn rsentinel_conn;

typedef struct rsentinel_conn_ops {
    void (*on_reply)(rsentinel_conn *k, const redisReply *r);
    void (*on_fail)(rsentinel_conn *k, const char *why);
    void (*on_later)(rsentinel_conn *k);
} rsentinel_conn_ops;

struct rsentinel_conn {
    struct event_base *base;
    redisAsyncContext *ac;
    struct event *timeout_ev; /* connect and answer; also a failure reported from a callback */
    const char *fail_why;     /* what the timer reports */
    int argc;
    const char **argv;      /* the command, borrowed from the owner */
    struct event *later_ev; /* rsentinel_conn_later */
    const rsentinel_conn_ops *ops;
    void *owner; /* the struct the conn is embedded first in */
};

static void rsentinel_conn_on_timeout(evutil_socket_t fd, short what, void *arg);

static void rsentinel_conn_on_later(evutil_socket_t fd, short what, void *arg)
{
    rsentinel_conn *k = arg;
    (void)fd;
    (void)what;
    k->ops->on_later(k);
}

/* on_later in ms, from the loop. */
static void rsentinel_conn_later(rsentinel_conn *k, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(k->later_ev, &tv);
}

/* Closes the connection, if any, without a word to the owner. */
static void rsentinel_conn_close(rsentinel_conn *k)
{
    redisAsyncContext *ac = k->ac;
    if (k->timeout_ev)
        event_del(k->timeout_ev);
    if (!ac)
        return;
    k->ac = NULL;
    ac->data = NULL;
    redisAsyncFree(ac);
}

/* Closed, and nothing "later" either. */
static void rsentinel_conn_reset(rsentinel_conn *k)
{
    rsentinel_conn_close(k);
    if (k->later_ev)
        event_del(k->later_ev);
}

/* Frees the conn embedded first in its owner, the owner with it; NULL is a no-op. */
static void rsentinel_conn_free(rsentinel_conn *k)
{
    if (!k)
        return;
    rsentinel_conn_close(k);
    if (k->timeout_ev)
        event_free(k->timeout_ev);
    if (k->later_ev)
        event_free(k->later_ev);
    free(k);
}

/* A new owner (size bytes, its conn first) with its conn ready; NULL when out of memory. */
static void *rsentinel_conn_new(size_t size, struct event_base *base, const rsentinel_conn_ops *ops)
{
    rsentinel_conn *k = calloc(1, size);
    if (!k)
        return NULL;
    k->base = base;
    k->owner = k;
    k->ops = ops;
    k->timeout_ev = evtimer_new(base, rsentinel_conn_on_timeout, k);
    k->later_ev = evtimer_new(base, rsentinel_conn_on_later, k);
    if (!k->timeout_ev || !k->later_ev) {
        rsentinel_conn_free(k);
        return NULL;
    }
    return k;
}

/* Closes the connection and tells the owner why. */
static void rsentinel_conn_fail(rsentinel_conn *k, const char *why)
{
    rsentinel_conn_close(k);
    k->ops->on_fail(k, why);
}

/* A failure seen where the connection cannot be freed (hiredis' connect callback frees nothing
 * safely): reported from the timer, at once. */
static void rsentinel_conn_fail_soon(rsentinel_conn *k, const char *why)
{
    struct timeval now = {0, 0};
    k->fail_why = why;
    evtimer_add(k->timeout_ev, &now);
}

static void rsentinel_conn_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    rsentinel_conn *k = arg;
    (void)fd;
    (void)what;
    rsentinel_conn_fail(k, k->fail_why ? k->fail_why : "no answer in time");
}

static void rsentinel_conn_on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    rsentinel_conn *k = ac->data;
    (void)privdata;
    if (!k || k->ac != ac || !r)
        return; /* closed by the owner, or going away: the disconnect callback says why */
    k->ops->on_reply(k, r);
}

static void rsentinel_conn_on_connect(const redisAsyncContext *ac, int status)
{
    rsentinel_conn *k = ac->data;
    if (!k || k->ac != ac)
        return;
    if (status != REDIS_OK) {
        k->ac = NULL; /* hiredis frees it */
        event_del(k->timeout_ev);
        k->ops->on_fail(k, ac->errstr[0] ? ac->errstr : "cannot connect");
        return;
    }
    if (redisAsyncCommandArgv((redisAsyncContext *)ac, rsentinel_conn_on_reply, NULL, k->argc,
                              k->argv, NULL) != REDIS_OK)
        rsentinel_conn_fail_soon(k, "cannot send the command");
}

static void rsentinel_conn_on_disconnect(const redisAsyncContext *ac, int status)
{
    rsentinel_conn *k = ac->data;
    (void)status;
    if (!k || k->ac != ac)
        return; /* closed by the owner */
    k->ac = NULL;
    event_del(k->timeout_ev);
    k->ops->on_fail(k, ac->errstr[0] ? ac->errstr : "connection closed");
}

/* Connects to a, sending argc/argv (borrowed until the connection is closed) once connected,
 * within ms. QN_ERR: it cannot even start (why says so); else the owner hears of it. */
static qn_status rsentinel_conn_open(rsentinel_conn *k, const rcluster_addr *a, int ms, int argc,
                                     const char **argv, char *why, size_t whylen)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisAsyncContext *ac = redisAsyncConnect(a->host, a->port);

    rsentinel_conn_close(k);
    if (!ac || ac->err) {
        qn_errf(why, whylen, "%s", ac ? ac->errstr : "out of memory");
        goto fail;
    }
    ac->data = k;
    if (redisLibeventAttach(ac, k->base) != REDIS_OK) {
        qn_errf(why, whylen, "cannot watch the connection");
        goto fail;
    }
    redisAsyncSetConnectCallback(ac, rsentinel_conn_on_connect);
    redisAsyncSetDisconnectCallback(ac, rsentinel_conn_on_disconnect);
    k->ac = ac;
    k->argc = argc;
    k->argv = argv;
    k->fail_why = NULL;
    evtimer_add(k->timeout_ev, &tv);
    return QN_OK;
fail:
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    return QN_ERR;
}

/* The answer came: no timer for it any more (a subscription stays open). */
static void rsentinel_conn_answered(rsentinel_conn *k)
{
    event_del(k->timeout_ev);
}

/* ---- resolving on the loop ---- */

struct rsentinel_resolver {
    rsentinel_conn conn; /* first: the resolver is its owner */
    rsentinel *s;
    rsentinel_walk walk;
    rsentinel_resolved_cb cb;
    void *arg;
    int busy;
    qn_status st;
    rcluster_addr addr;
    char err[RSENTINEL_ERR_MAX];
    const char *argv[3];
};

/* The result, told from the loop (conn's later): never inside the start. */
static void rsentinel_resolver_done(rsentinel_resolver *r, qn_status st)
{
    rsentinel_conn_close(&r->conn);
    r->st = st;
    rsentinel_conn_later(&r->conn, 0);
}

/* Asks the walk's next sentinel; the walk's verdict when none is left. */
static void rsentinel_resolver_next(rsentinel_resolver *r)
{
    const rcluster_addr *a;
    char why[160];
    int ms;

    while ((a = rsentinel_walk_next(r->s, &r->walk, &ms))) {
        if (rsentinel_conn_open(&r->conn, a, ms, 3, r->argv, why, sizeof(why)) == QN_OK)
            return;
        rsentinel_walk_note(r->s, &r->walk, QN_ERR, why);
    }
    rsentinel_resolver_done(r, rsentinel_walk_fail(r->s, &r->walk, r->err, sizeof(r->err)));
}

static void rsentinel_resolver_on_reply(rsentinel_conn *k, const redisReply *reply)
{
    rsentinel_resolver *r = k->owner;
    char why[160];
    qn_status st = rsentinel_answer(r->s, reply, &r->addr, why, sizeof(why));

    rsentinel_conn_close(k);
    if (rsentinel_walk_note(r->s, &r->walk, st, why))
        rsentinel_resolver_done(r, QN_OK);
    else
        rsentinel_resolver_next(r);
}

static void rsentinel_resolver_on_fail(rsentinel_conn *k, const char *why)
{
    rsentinel_resolver *r = k->owner;
    rsentinel_walk_note(r->s, &r->walk, QN_ERR, why);
    rsentinel_resolver_next(r);
}

static void rsentinel_resolver_on_done(rsentinel_conn *k)
{
    rsentinel_resolver *r = k->owner;
    r->busy = 0;
    r->cb(r->st, r->st == QN_OK ? &r->addr : NULL, r->st == QN_OK ? NULL : r->err, r->arg);
}

static const rsentinel_conn_ops rsentinel_resolver_ops = {
    rsentinel_resolver_on_reply, rsentinel_resolver_on_fail, rsentinel_resolver_on_done};

rsentinel_resolver *rsentinel_resolver_new(struct event_base *base, rsentinel *s,
                                           rsentinel_resolved_cb cb, void *arg)
{
    rsentinel_resolver *r = rsentinel_conn_new(sizeof(*r), base, &rsentinel_resolver_ops);
    if (!r)
        return NULL;
    r->s = s;
    r->cb = cb;
    r->arg = arg;
    r->argv[0] = "SENTINEL";
    r->argv[1] = "get-master-addr-by-name";
    r->argv[2] = s->name;
    return r;
}

void rsentinel_resolver_start(rsentinel_resolver *r, int budget_ms)
{
    if (r->busy)
        return;
    r->busy = 1;
    rsentinel_walk_start(r->s, &r->walk, budget_ms);
    rsentinel_resolver_next(r);
}

void rsentinel_resolver_cancel(rsentinel_resolver *r)
{
    rsentinel_conn_reset(&r->conn);
    r->busy = 0;
}

void rsentinel_resolver_free(rsentinel_resolver *r)
{
    rsentinel_conn_free(r ? &r->conn : NULL);
}

/* ---- following a failover ---- */

static unsigned long rsentinel_switch_count;

unsigned long rsentinel_switches(void)
{
    return __atomic_load_n(&rsentinel_switch_count, __ATOMIC_ACQUIRE);
}

struct rsentinel_watch {
    rsentinel_conn conn; /* first: the watch is its owner; subscribed, or on its way */
    const rsentinel *s;
    rsentinel_switch_cb cb;
    void *arg;
    int next; /* the sentinel asked next */
};

static const char *rsentinel_watch_argv[2] = {"SUBSCRIBE", "+switch-master"};

static void rsentinel_watch_on_fail(rsentinel_conn *k, const char *why)
{
    rsentinel_watch *w = k->owner;
    log_warn(NULL, "redis: sentinel watch of \"%s\": %s; trying the next sentinel", w->s->name,
             why);
    rsentinel_conn_later(k, RSENTINEL_WATCH_RETRY_MS);
}

/* "+switch-master <name> <old ip> <old port> <new ip> <new port>" */
static void rsentinel_watch_on_reply(rsentinel_conn *k, const redisReply *reply)
{
    rsentinel_watch *w = k->owner;
    char name[RSENTINEL_NAME_MAX], host[RCLUSTER_HOST_MAX];
    int port = 0;

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING) {
        rsentinel_conn_fail(k, "unexpected reply");
        return;
    }
    if (strcmp(reply->element[0]->str, "subscribe") == 0) {
        rsentinel_conn_answered(k);
        return;
    }
    if (strcmp(reply->element[0]->str, "message") != 0 ||
        reply->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (sscanf(reply->element[2]->str, "%127s %*s %*s %255s %d", name, host, &port) != 3 ||
        strcmp(name, w->s->name) != 0 || port < 1 || port > 65535)
        return;
    rcluster_addr a;
    snprintf(a.host, sizeof(a.host), "%s", host);
    a.port = port;
    __atomic_add_fetch(&rsentinel_switch_count, 1, __ATOMIC_ACQ_REL);
    log_info(NULL, "redis: the sentinels switched master \"%s\" to %s:%d", name, host, port);
    w->cb(&a, w->arg);
}

/* The next sentinel, in turn (conn's later: after a failure). */
static void rsentinel_watch_connect(rsentinel_conn *k)
{
    rsentinel_watch *w = k->owner;
    const rcluster_addr *a = &w->s->addr[w->next];
    char why[160];

    w->next = (w->next + 1) % w->s->n;
    /* Connect and SUBSCRIBE get longer than a question: the watch is no one's wait. */
    if (rsentinel_conn_open(k, a, RSENTINEL_QUERY_MS * 5, 2, rsentinel_watch_argv, why,
                            sizeof(why)) != QN_OK)
        rsentinel_watch_on_fail(k, why);
}

static const rsentinel_conn_ops rsentinel_watch_ops = {
    rsentinel_watch_on_reply, rsentinel_watch_on_fail, rsentinel_watch_connect};

rsentinel_watch *rsentinel_watch_new(struct event_base *base, const rsentinel *s,
                                     rsentinel_switch_cb cb, void *arg)
{
    rsentinel_watch *w = rsentinel_conn_new(sizeof(*w), base, &rsentinel_watch_ops);
    if (!w)
        return NULL;
    w->s = s;
    w->cb = cb;
    w->arg = arg;
    w->next = s->first;
    rsentinel_watch_connect(&w->conn);
    return w;
}

void rsentinel_watch_free(rsentinel_watch *w)
{
    rsentinel_conn_free(w ? &w->conn : NULL);
}
