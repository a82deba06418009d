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

/* One sentinel asked within ms. QN_OK: *out; QN_ENOTFOUND: it knows no such master; QN_EINVAL:
 * it answered something else (an error reply: not a sentinel?); QN_ERR: no answer. why says
 * what happened. */
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
    if (r->type == REDIS_REPLY_NIL) {
        qn_errf(why, whylen, "no master named \"%s\"", s->name);
        st = QN_ENOTFOUND;
        goto out;
    }
    st = QN_EINVAL;
    if (r->type == REDIS_REPLY_ERROR) {
        qn_errf(why, whylen, "%s", r->str);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[0]->len == 0 || r->element[0]->len >= sizeof(out->host)) {
        qn_errf(why, whylen, "an unexpected reply");
        goto out;
    }
    int port = atoi(r->element[1]->str);
    if (port < 1 || port > 65535) {
        qn_errf(why, whylen, "a bad port \"%.16s\"", r->element[1]->str);
        goto out;
    }
    memcpy(out->host, r->element[0]->str, r->element[0]->len);
    out->host[r->element[0]->len] = '\0';
    out->port = port;
    st = QN_OK;
out:
    freeReplyObject(r);
    if (c)
        redisFree(c);
    return st;
}

qn_status rsentinel_resolve(rsentinel *s, int budget_ms, rcluster_addr *out, char *err,
                            size_t errlen)
{
    int64_t end = now_mono_ms() + (budget_ms > 0 ? budget_ms : RSENTINEL_BUDGET_MS);
    int answered = 0, unknown = 0;
    char why[160] = "", last[200] = "";

    for (int k = 0; k < s->n; k++) {
        int i = (s->first + k) % s->n;
        int64_t left = end - now_mono_ms();
        if (k > 0 && left <= 0)
            break;
        int ms = left < RSENTINEL_QUERY_MS ? (int)(left > 1 ? left : 1) : RSENTINEL_QUERY_MS;
        qn_status st = rsentinel_ask(s, &s->addr[i], ms, out, why, sizeof(why));
        if (st == QN_OK) {
            s->first = s->last = i;
            return QN_OK;
        }
        answered += st == QN_ENOTFOUND || st == QN_EINVAL;
        unknown += st == QN_ENOTFOUND;
        snprintf(last, sizeof(last), "%s:%d: %s", s->addr[i].host, s->addr[i].port, why);
    }
    if (answered > 0 && unknown == answered) {
        qn_errf(err, errlen,
                "sentinel: no sentinel of %s knows a master named \"%s\" (QUAN_REDIS_MASTER_NAME)",
                s->list, s->name);
        return QN_ENOTFOUND;
    }
    qn_errf(err, errlen, "sentinel: no sentinel of %s named master \"%s\" within %d ms (last: %s)",
            s->list, s->name, budget_ms > 0 ? budget_ms : RSENTINEL_BUDGET_MS, last);
    return QN_ERR;
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

/* ---------------------------------------------------------------- following a failover */

static unsigned long rsentinel_switch_count;

unsigned long rsentinel_switches(void)
{
    return __atomic_load_n(&rsentinel_switch_count, __ATOMIC_ACQUIRE);
}

struct rsentinel_watch {
    struct event_base *base;
    const rsentinel *s;
    rsentinel_switch_cb cb;
    void *arg;
    redisAsyncContext *ac;
    int next;                 /* the sentinel asked next */
    struct event *retry_ev;   /* the next connect */
    struct event *timeout_ev; /* the connect and SUBSCRIBE in flight */
    int subscribed;
};

static void rsentinel_watch_connect(rsentinel_watch *w);

static void rsentinel_watch_schedule(rsentinel_watch *w)
{
    struct timeval tv = {RSENTINEL_WATCH_RETRY_MS / 1000, (RSENTINEL_WATCH_RETRY_MS % 1000) * 1000};
    event_del(w->timeout_ev);
    evtimer_add(w->retry_ev, &tv);
}

/* Drops the connection (from inside a hiredis callback too: hiredis defers the free). */
static void rsentinel_watch_drop(rsentinel_watch *w, const char *why)
{
    redisAsyncContext *ac = w->ac;
    if (!ac)
        return;
    log_warn(NULL, "redis: sentinel watch of \"%s\": %s; trying the next sentinel", w->s->name,
             why);
    w->ac = NULL;
    w->subscribed = 0;
    redisAsyncFree(ac);
    rsentinel_watch_schedule(w);
}

/* "+switch-master <name> <old ip> <old port> <new ip> <new port>" */
static void rsentinel_watch_on_message(redisAsyncContext *ac, void *r, void *privdata)
{
    rsentinel_watch *w = privdata;
    const redisReply *reply = r;
    char name[RSENTINEL_NAME_MAX], host[RCLUSTER_HOST_MAX];
    int port = 0;

    if (!reply || w->ac != ac)
        return; /* the connection is going away */
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING) {
        rsentinel_watch_drop(w, "unexpected reply");
        return;
    }
    if (strcmp(reply->element[0]->str, "subscribe") == 0) {
        w->subscribed = 1;
        event_del(w->timeout_ev);
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

static void rsentinel_watch_on_connect(const redisAsyncContext *ac, int status)
{
    rsentinel_watch *w = ac->data;
    if (w->ac != ac)
        return;
    if (status != REDIS_OK) {
        w->ac = NULL; /* hiredis frees it */
        rsentinel_watch_schedule(w);
        return;
    }
    if (redisAsyncCommand((redisAsyncContext *)ac, rsentinel_watch_on_message, w,
                          "SUBSCRIBE +switch-master") != REDIS_OK)
        rsentinel_watch_drop(w, "cannot subscribe");
}

static void rsentinel_watch_on_disconnect(const redisAsyncContext *ac, int status)
{
    rsentinel_watch *w = ac->data;
    (void)status;
    if (w->ac != ac)
        return; /* dropped by us */
    w->ac = NULL;
    w->subscribed = 0;
    rsentinel_watch_schedule(w);
}

static void rsentinel_watch_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rsentinel_watch_connect(arg);
}

static void rsentinel_watch_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rsentinel_watch_drop(arg, "no answer in time");
}

static void rsentinel_watch_connect(rsentinel_watch *w)
{
    const rcluster_addr *a = &w->s->addr[w->next];
    struct timeval tv = {0, RSENTINEL_QUERY_MS * 1000 * 5};
    redisAsyncContext *ac;

    w->next = (w->next + 1) % w->s->n;
    ac = redisAsyncConnect(a->host, a->port);
    if (!ac || ac->err || (ac->data = w, redisLibeventAttach(ac, w->base) != REDIS_OK)) {
        if (ac)
            redisAsyncFree(ac);
        rsentinel_watch_schedule(w);
        return;
    }
    redisAsyncSetConnectCallback(ac, rsentinel_watch_on_connect);
    redisAsyncSetDisconnectCallback(ac, rsentinel_watch_on_disconnect);
    w->ac = ac;
    evtimer_add(w->timeout_ev, &tv);
}

rsentinel_watch *rsentinel_watch_new(struct event_base *base, const rsentinel *s,
                                     rsentinel_switch_cb cb, void *arg)
{
    rsentinel_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->base = base;
    w->s = s;
    w->cb = cb;
    w->arg = arg;
    w->next = s->first;
    w->retry_ev = evtimer_new(base, rsentinel_watch_on_timer, w);
    w->timeout_ev = evtimer_new(base, rsentinel_watch_on_timeout, w);
    if (!w->retry_ev || !w->timeout_ev) {
        rsentinel_watch_free(w);
        return NULL;
    }
    rsentinel_watch_connect(w);
    return w;
}

void rsentinel_watch_free(rsentinel_watch *w)
{
    if (!w)
        return;
    if (w->ac) {
        redisAsyncContext *ac = w->ac;
        w->ac = NULL;
        redisAsyncFree(ac);
    }
    if (w->retry_ev)
        event_free(w->retry_ev);
    if (w->timeout_ev)
        event_free(w->timeout_ev);
    free(w);
}
