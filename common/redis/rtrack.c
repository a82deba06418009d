/* Invalidation of in-process copies of Redis keys (rtrack.h). */
#include "rtrack.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>

#include "jsonin.h"
#include "log.h"
#include "now.h"

#define RTRACK_CHANNEL        "__redis__:invalidate"
#define RTRACK_BACKOFF_MIN_MS 100
#define RTRACK_BACKOFF_MAX_MS 2000
#define RTRACK_RETRY_MIN_MS   1000
#define RTRACK_RETRY_MAX_MS   60000

#define RTRACK_SERVERS_MAX 64 /* as many as the reader has nodes (redis.c's bound) */

/* One server the reader reads from: rtrack's connection there, and the tracking of the
 * reader's connection to it. */
typedef struct rtrack_sub {
    rtrack *t;
    int node; /* the reader's node number */
    char *host;
    int port;
    redisAsyncContext *ac; /* NULL while down */
    long long id;          /* its CLIENT ID, 0 until known */
    int subscribed;        /* the SUBSCRIBE is confirmed */
    int backoff_ms;
    struct event *reconnect_ev;
    /* On for the reader's connection number tracked_conn, redirected to id. enabling: a CLIENT
     * TRACKING is in flight (for that connection and id). */
    int on, enabling;
    unsigned long tracked_conn, enabling_conn;
    long long enabling_id;
    int64_t retry_at_ms; /* after a refused CLIENT TRACKING: not before then (doubling delay) */
    int retry_ms;
} rtrack_sub;

struct rtrack {
    struct event_base *base;
    char *password;
    redis_client *reader;
    rtrack_invalidate_cb cb;
    void *arg;
    rtrack_sub *subs[RTRACK_SERVERS_MAX]; /* by the reader's node number */
    int on;                               /* every master of the reader is tracked */
    unsigned long topology;               /* the reader's slot map when it went on */
    uint64_t epoch, next_epoch;
    int freeing;
};

static void rtrack_connect(rtrack_sub *s);
static rtrack_sub *rtrack_sub_new(rtrack *t, int node);

/* Tracking is off from now on: every copy goes. */
static void rtrack_off(rtrack *t, const char *why)
{
    if (t->on) {
        log_info(NULL, "rtrack: tracking off (%s); copies dropped", why);
        t->on = 0;
        t->epoch = 0;
        t->cb(NULL, 0, t->arg);
    }
}

/* The reader's connection to s's server is the one s tracks. */
static int rtrack_sub_current(const rtrack_sub *s)
{
    return s->on && redis_client_node_connected(s->t->reader, s->node) &&
           redis_client_node_connects(s->t->reader, s->node) == s->tracked_conn;
}

static void rtrack_on_tracking(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    rtrack_sub *s = arg;
    (void)c;
    (void)reply;
    s->enabling = 0;
    if (s->t->freeing)
        return;
    if (err) {
        /* Refused (an old server, an ACL) or the connection failed: tried again later, not on
         * every request. */
        s->retry_ms = s->retry_ms ? (s->retry_ms * 2 > RTRACK_RETRY_MAX_MS ? RTRACK_RETRY_MAX_MS
                                                                           : s->retry_ms * 2)
                                  : RTRACK_RETRY_MIN_MS;
        s->retry_at_ms = now_mono_ms() + s->retry_ms;
        log_warn(NULL,
                 "rtrack: CLIENT TRACKING on %s:%d failed (%s); nothing kept, next try in %d ms",
                 s->host, s->port, err, s->retry_ms);
        return;
    }
    s->retry_ms = 0;
    /* Only if the reader's connection and the redirect target are still the ones it was for. */
    if (!redis_client_node_connected(s->t->reader, s->node) ||
        redis_client_node_connects(s->t->reader, s->node) != s->enabling_conn || !s->subscribed ||
        s->id != s->enabling_id)
        return;
    s->on = 1;
    s->tracked_conn = s->enabling_conn;
}

static void rtrack_on_off_reply(redis_client *c, const redisReply *reply, const char *err,
                                void *arg)
{
    (void)c;
    (void)reply;
    (void)err;
    (void)arg;
}

/* Turns tracking on for the reader's current connection to s's server (off first: a connection
 * tracked for an earlier rtrack connection must follow the new redirect target). */
static void rtrack_enable(rtrack_sub *s)
{
    char id[24];
    redis_client *r = s->t->reader;
    if (s->enabling || !s->subscribed || !redis_client_node_connected(r, s->node) ||
        (s->retry_ms && now_mono_ms() < s->retry_at_ms))
        return;
    log_i64_str(id, s->id);
    if (redis_command_node(r, s->node, rtrack_on_off_reply, s, "CLIENT TRACKING off") != QN_OK ||
        redis_command_node(r, s->node, rtrack_on_tracking, s, "CLIENT TRACKING on REDIRECT %s",
                           id) != QN_OK)
        return;
    s->enabling = 1;
    s->enabling_conn = redis_client_node_connects(r, s->node);
    s->enabling_id = s->id;
}

int rtrack_key_id(const char *key, size_t len, const char *prefix, int64_t *id)
{
    char digits[24];
    size_t n = strlen(prefix);
    if (len < n + 3 || len - n - 2 >= sizeof(digits) || memcmp(key, prefix, n) != 0 ||
        key[n] != '{' || key[len - 1] != '}' || key[n + 1] == '-')
        return 0;
    memcpy(digits, key + n + 1, len - n - 2);
    digits[len - n - 2] = '\0';
    return jsonin_int64_text(digits, id) == QN_OK && *id > 0;
}

uint64_t rtrack_epoch(rtrack *t)
{
    redis_client *r = t->reader;
    int n = redis_client_node_count(r), all = 1, masters = 0;
    /* Invalidations already in the sockets are applied before anything is served: Redis sends
     * a key's invalidation before its writer's reply, so a writer that waited for its reply and
     * then asks us is never answered from the copy it replaced. */
    for (int i = 0; i < n && i < RTRACK_SERVERS_MAX; i++) {
        rtrack_sub *s = t->subs[i];
        if (s && s->ac && s->subscribed)
            redisAsyncHandleRead(s->ac);
    }
    if (t->on && redis_client_topology(r) != t->topology)
        rtrack_off(t, "the slot map changed");
    for (int i = 0; i < n && i < RTRACK_SERVERS_MAX; i++) {
        if (!redis_client_node_master(r, i))
            continue;
        masters++;
        rtrack_sub *s = t->subs[i];
        if (!s && !(s = t->subs[i] = rtrack_sub_new(t, i))) {
            all = 0;
            continue;
        }
        if (!rtrack_sub_current(s)) {
            if (s->on) {
                s->on = 0;
                rtrack_off(t, "the reader's connection changed");
            }
            rtrack_enable(s);
            all = 0;
        }
    }
    if (!t->on && all && masters > 0 && redis_client_connected(r)) {
        t->on = 1;
        t->topology = redis_client_topology(r);
        t->epoch = ++t->next_epoch;
    }
    return t->on ? t->epoch : 0;
}

/* ---------------------------------------------------------------- rtrack's own connections */

static void rtrack_schedule(rtrack_sub *s)
{
    struct timeval tv = {s->backoff_ms / 1000, (s->backoff_ms % 1000) * 1000};
    if (s->t->freeing)
        return;
    evtimer_add(s->reconnect_ev, &tv);
    s->backoff_ms =
        s->backoff_ms * 2 > RTRACK_BACKOFF_MAX_MS ? RTRACK_BACKOFF_MAX_MS : s->backoff_ms * 2;
}

static void rtrack_lost(rtrack_sub *s, const char *why)
{
    s->subscribed = 0;
    s->id = 0;
    s->on = 0;
    rtrack_off(s->t, why);
}

/* Drops the connection (from inside a hiredis callback too: hiredis defers the free). */
static void rtrack_drop(rtrack_sub *s, const char *why)
{
    redisAsyncContext *ac = s->ac;
    if (!ac)
        return;
    log_warn(NULL, "rtrack: %s:%d: %s; reconnecting", s->host, s->port, why);
    s->ac = NULL;
    rtrack_lost(s, why);
    redisAsyncFree(ac);
    rtrack_schedule(s);
}

static void rtrack_on_message(redisAsyncContext *ac, void *r, void *privdata)
{
    rtrack_sub *s = privdata;
    rtrack *t = s->t;
    redisReply *reply = r;
    if (!reply || s->ac != ac)
        return; /* the connection is going away: on_disconnect tells */
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING) {
        rtrack_drop(s, "unexpected reply on the invalidation channel");
        return;
    }
    if (strcasecmp(reply->element[0]->str, "subscribe") == 0) {
        s->subscribed = 1;
        s->backoff_ms = RTRACK_BACKOFF_MIN_MS;
        rtrack_enable(s);
        return;
    }
    if (strcasecmp(reply->element[0]->str, "message") != 0)
        return;
    const redisReply *keys = reply->element[2];
    if (keys->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < keys->elements; i++)
            if (keys->element[i]->type == REDIS_REPLY_STRING)
                t->cb(keys->element[i]->str, keys->element[i]->len, t->arg);
    } else if (keys->type == REDIS_REPLY_STRING) {
        t->cb(keys->str, keys->len, t->arg);
    } else {
        /* A nil: FLUSHALL or FLUSHDB. */
        t->cb(NULL, 0, t->arg);
    }
}

static void rtrack_on_id(redisAsyncContext *ac, void *r, void *privdata)
{
    rtrack_sub *s = privdata;
    redisReply *reply = r;
    if (!reply || s->ac != ac)
        return;
    if (reply->type != REDIS_REPLY_INTEGER) {
        rtrack_drop(s, reply->type == REDIS_REPLY_ERROR ? reply->str : "CLIENT ID failed");
        return;
    }
    s->id = reply->integer;
    if (redisAsyncCommand(ac, rtrack_on_message, s, "SUBSCRIBE " RTRACK_CHANNEL) != REDIS_OK)
        rtrack_drop(s, "cannot subscribe");
}

static void rtrack_on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    rtrack_sub *s = privdata;
    redisReply *reply = r;
    if (!reply || s->ac != ac)
        return;
    if (reply->type == REDIS_REPLY_ERROR)
        rtrack_drop(s, "AUTH failed");
}

static void rtrack_on_connect(const redisAsyncContext *ac, int status)
{
    rtrack_sub *s = ac->data;
    if (s->ac != ac)
        return;
    if (status != REDIS_OK) {
        s->ac = NULL; /* hiredis frees it */
        rtrack_schedule(s);
        return;
    }
    redisEnableKeepAlive((redisContext *)&ac->c);
    redisAsyncContext *w = (redisAsyncContext *)ac;
    if ((s->t->password &&
         redisAsyncCommand(w, rtrack_on_auth, s, "AUTH %s", s->t->password) != REDIS_OK) ||
        redisAsyncCommand(w, rtrack_on_id, s, "CLIENT ID") != REDIS_OK)
        rtrack_drop(s, "cannot send the handshake");
}

static void rtrack_on_disconnect(const redisAsyncContext *ac, int status)
{
    rtrack_sub *s = ac->data;
    (void)status;
    if (s->ac != ac)
        return; /* dropped by us */
    s->ac = NULL;
    rtrack_lost(s, "invalidation connection lost");
    rtrack_schedule(s);
}

static void rtrack_on_reconnect(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rtrack_connect(arg);
}

static void rtrack_connect(rtrack_sub *s)
{
    redisAsyncContext *ac;
    if (s->t->freeing || s->ac)
        return;
    /* Where the reader's node is now: a Sentinel deployment's master moves with a failover, and
     * the reader asks the sentinels before each of its connects. */
    const char *host = redis_client_node_host(s->t->reader, s->node);
    if (host && strcmp(host, s->host) != 0) {
        char *h = strdup(host);
        if (!h) {
            rtrack_schedule(s);
            return;
        }
        free(s->host);
        s->host = h;
    }
    s->port = redis_client_node_port(s->t->reader, s->node);
    if (s->port < 1) {
        rtrack_schedule(s); /* not resolved yet */
        return;
    }
    ac = redisAsyncConnect(s->host, s->port);
    if (!ac || ac->err || (ac->data = s, redisLibeventAttach(ac, s->t->base) != REDIS_OK)) {
        if (ac)
            redisAsyncFree(ac);
        rtrack_schedule(s);
        return;
    }
    redisAsyncSetConnectCallback(ac, rtrack_on_connect);
    redisAsyncSetDisconnectCallback(ac, rtrack_on_disconnect);
    s->ac = ac;
}

static void rtrack_sub_free(rtrack_sub *s)
{
    if (!s)
        return;
    if (s->ac) {
        redisAsyncContext *ac = s->ac;
        s->ac = NULL;
        redisAsyncFree(ac);
    }
    if (s->reconnect_ev)
        event_free(s->reconnect_ev);
    free(s->host);
    free(s);
}

/* rtrack's side of the reader's node: connecting at once. NULL on allocation failure. */
static rtrack_sub *rtrack_sub_new(rtrack *t, int node)
{
    rtrack_sub *s = calloc(1, sizeof(*s));
    const char *host = redis_client_node_host(t->reader, node);
    if (!s || !host)
        goto fail;
    s->t = t;
    s->node = node;
    s->port = redis_client_node_port(t->reader, node);
    s->backoff_ms = RTRACK_BACKOFF_MIN_MS;
    s->host = strdup(host);
    s->reconnect_ev = evtimer_new(t->base, rtrack_on_reconnect, s);
    if (!s->host || !s->reconnect_ev)
        goto fail;
    rtrack_connect(s);
    return s;
fail:
    rtrack_sub_free(s);
    return NULL;
}

rtrack *rtrack_new(struct event_base *base, const rtrack_opts *opts)
{
    rtrack *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->base = base;
    t->reader = opts->reader;
    t->cb = opts->cb;
    t->arg = opts->arg;
    t->password = opts->password && *opts->password ? strdup(opts->password) : NULL;
    if (opts->password && *opts->password && !t->password) {
        rtrack_free(t);
        return NULL;
    }
    /* The subscriptions are made as the reader's masters become known (rtrack_epoch). */
    for (int i = 0; i < redis_client_node_count(t->reader) && i < RTRACK_SERVERS_MAX; i++)
        if (redis_client_node_master(t->reader, i) && !(t->subs[i] = rtrack_sub_new(t, i))) {
            rtrack_free(t);
            return NULL;
        }
    return t;
}

void rtrack_free(rtrack *t)
{
    if (!t)
        return;
    t->freeing = 1;
    for (int i = 0; i < RTRACK_SERVERS_MAX; i++)
        rtrack_sub_free(t->subs[i]);
    free(t->password);
    free(t);
}
