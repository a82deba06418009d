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

struct rtrack {
    struct event_base *base;
    char *host, *password;
    int port;
    redis_client *reader;
    rtrack_invalidate_cb cb;
    void *arg;

    redisAsyncContext *sub; /* rtrack's own connection, NULL while down */
    long long sub_id;       /* its CLIENT ID, 0 until known */
    int subscribed;         /* the SUBSCRIBE is confirmed */
    int backoff_ms;
    struct event *reconnect_ev;

    /* Tracking on the reader: on for reader connection number tracked_conn, redirected to
     * sub_id. enabling: a CLIENT TRACKING is in flight (for that connection and id). */
    int on, enabling;
    unsigned long tracked_conn, enabling_conn;
    long long enabling_id;
    uint64_t epoch, next_epoch;
    int64_t retry_at_ms; /* after a refused CLIENT TRACKING: not before then (doubling delay) */
    int retry_ms;
    int freeing;
};

static void rtrack_connect(rtrack *t);

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

static void rtrack_on_tracking(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    rtrack *t = arg;
    (void)c;
    (void)reply;
    t->enabling = 0;
    if (t->freeing)
        return;
    if (err) {
        /* Refused (an old server, an ACL) or the connection failed: tried again later, not on
         * every request. */
        t->retry_ms = t->retry_ms ? (t->retry_ms * 2 > RTRACK_RETRY_MAX_MS ? RTRACK_RETRY_MAX_MS
                                                                           : t->retry_ms * 2)
                                  : RTRACK_RETRY_MIN_MS;
        t->retry_at_ms = now_mono_ms() + t->retry_ms;
        log_warn(NULL, "rtrack: CLIENT TRACKING failed (%s); nothing kept, next try in %d ms", err,
                 t->retry_ms);
        return;
    }
    t->retry_ms = 0;
    /* Only if the reader's connection and the redirect target are still the ones it was for. */
    if (!redis_client_connected(t->reader) ||
        redis_client_connects(t->reader) != t->enabling_conn || !t->subscribed ||
        t->sub_id != t->enabling_id)
        return;
    t->on = 1;
    t->tracked_conn = t->enabling_conn;
    t->epoch = ++t->next_epoch;
}

static void rtrack_on_off_reply(redis_client *c, const redisReply *reply, const char *err,
                                void *arg)
{
    (void)c;
    (void)reply;
    (void)err;
    (void)arg;
}

/* Turns tracking on for the reader's current connection (off first: a connection tracked for
 * an earlier rtrack connection must follow the new redirect target). */
static void rtrack_enable(rtrack *t)
{
    char id[24];
    if (t->enabling || !t->subscribed || !redis_client_connected(t->reader) ||
        (t->retry_ms && now_mono_ms() < t->retry_at_ms))
        return;
    log_i64_str(id, t->sub_id);
    if (redis_command(t->reader, rtrack_on_off_reply, t, "CLIENT TRACKING off") != QN_OK ||
        redis_command(t->reader, rtrack_on_tracking, t, "CLIENT TRACKING on REDIRECT %s", id) !=
            QN_OK)
        return;
    t->enabling = 1;
    t->enabling_conn = redis_client_connects(t->reader);
    t->enabling_id = t->sub_id;
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
    /* Invalidations already in the socket are applied before anything is served: Redis sends a
     * key's invalidation before its writer's reply, so a writer that waited for its reply and
     * then asks us is never answered from the copy it replaced. */
    if (t->sub && t->subscribed)
        redisAsyncHandleRead(t->sub);
    if (t->on &&
        (!redis_client_connected(t->reader) || redis_client_connects(t->reader) != t->tracked_conn))
        rtrack_off(t, "the reader's connection changed");
    if (!t->on)
        rtrack_enable(t);
    return t->on ? t->epoch : 0;
}

/* ---------------------------------------------------------------- rtrack's own connection */

static void rtrack_schedule(rtrack *t)
{
    struct timeval tv = {t->backoff_ms / 1000, (t->backoff_ms % 1000) * 1000};
    if (t->freeing)
        return;
    evtimer_add(t->reconnect_ev, &tv);
    t->backoff_ms =
        t->backoff_ms * 2 > RTRACK_BACKOFF_MAX_MS ? RTRACK_BACKOFF_MAX_MS : t->backoff_ms * 2;
}

static void rtrack_lost(rtrack *t, const char *why)
{
    t->subscribed = 0;
    t->sub_id = 0;
    rtrack_off(t, why);
}

/* Drops the connection (from inside a hiredis callback too: hiredis defers the free). */
static void rtrack_drop(rtrack *t, const char *why)
{
    redisAsyncContext *ac = t->sub;
    if (!ac)
        return;
    log_warn(NULL, "rtrack: %s; reconnecting", why);
    t->sub = NULL;
    rtrack_lost(t, why);
    redisAsyncFree(ac);
    rtrack_schedule(t);
}

static void rtrack_on_message(redisAsyncContext *ac, void *r, void *privdata)
{
    rtrack *t = privdata;
    redisReply *reply = r;
    if (!reply || t->sub != ac)
        return; /* the connection is going away: on_disconnect tells */
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING) {
        rtrack_drop(t, "unexpected reply on the invalidation channel");
        return;
    }
    if (strcasecmp(reply->element[0]->str, "subscribe") == 0) {
        t->subscribed = 1;
        t->backoff_ms = RTRACK_BACKOFF_MIN_MS;
        rtrack_enable(t);
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
    rtrack *t = privdata;
    redisReply *reply = r;
    if (!reply || t->sub != ac)
        return;
    if (reply->type != REDIS_REPLY_INTEGER) {
        rtrack_drop(t, reply->type == REDIS_REPLY_ERROR ? reply->str : "CLIENT ID failed");
        return;
    }
    t->sub_id = reply->integer;
    if (redisAsyncCommand(ac, rtrack_on_message, t, "SUBSCRIBE " RTRACK_CHANNEL) != REDIS_OK)
        rtrack_drop(t, "cannot subscribe");
}

static void rtrack_on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    rtrack *t = privdata;
    redisReply *reply = r;
    if (!reply || t->sub != ac)
        return;
    if (reply->type == REDIS_REPLY_ERROR)
        rtrack_drop(t, "AUTH failed");
}

static void rtrack_on_connect(const redisAsyncContext *ac, int status)
{
    rtrack *t = ac->data;
    if (t->sub != ac)
        return;
    if (status != REDIS_OK) {
        t->sub = NULL; /* hiredis frees it */
        rtrack_schedule(t);
        return;
    }
    redisEnableKeepAlive((redisContext *)&ac->c);
    redisAsyncContext *w = (redisAsyncContext *)ac;
    if ((t->password &&
         redisAsyncCommand(w, rtrack_on_auth, t, "AUTH %s", t->password) != REDIS_OK) ||
        redisAsyncCommand(w, rtrack_on_id, t, "CLIENT ID") != REDIS_OK)
        rtrack_drop(t, "cannot send the handshake");
}

static void rtrack_on_disconnect(const redisAsyncContext *ac, int status)
{
    rtrack *t = ac->data;
    (void)status;
    if (t->sub != ac)
        return; /* dropped by us */
    t->sub = NULL;
    rtrack_lost(t, "invalidation connection lost");
    rtrack_schedule(t);
}

static void rtrack_on_reconnect(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rtrack_connect(arg);
}

static void rtrack_connect(rtrack *t)
{
    redisAsyncContext *ac;
    if (t->freeing || t->sub)
        return;
    ac = redisAsyncConnect(t->host, t->port);
    if (!ac || ac->err || (ac->data = t, redisLibeventAttach(ac, t->base) != REDIS_OK)) {
        if (ac)
            redisAsyncFree(ac);
        rtrack_schedule(t);
        return;
    }
    redisAsyncSetConnectCallback(ac, rtrack_on_connect);
    redisAsyncSetDisconnectCallback(ac, rtrack_on_disconnect);
    t->sub = ac;
}

rtrack *rtrack_new(struct event_base *base, const rtrack_opts *opts)
{
    rtrack *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->base = base;
    t->port = opts->port;
    t->reader = opts->reader;
    t->cb = opts->cb;
    t->arg = opts->arg;
    t->backoff_ms = RTRACK_BACKOFF_MIN_MS;
    t->host = strdup(opts->host);
    t->password = opts->password && *opts->password ? strdup(opts->password) : NULL;
    t->reconnect_ev = evtimer_new(base, rtrack_on_reconnect, t);
    if (!t->host || (opts->password && *opts->password && !t->password) || !t->reconnect_ev) {
        rtrack_free(t);
        return NULL;
    }
    rtrack_connect(t);
    return t;
}

void rtrack_free(rtrack *t)
{
    if (!t)
        return;
    t->freeing = 1;
    if (t->sub) {
        redisAsyncContext *ac = t->sub;
        t->sub = NULL;
        redisAsyncFree(ac);
    }
    if (t->reconnect_ev)
        event_free(t->reconnect_ev);
    free(t->host);
    free(t->password);
    free(t);
}
