/* Redis lock on the event loop (see lock.h). */
#include "lock.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <event2/event.h>

#include "log.h"
#include "now.h"

#define LOCK_RETRY_MIN_MS 20
#define LOCK_RETRY_MAX_MS 50

typedef enum { LS_ACQUIRING = 0, LS_HELD, LS_RELEASING } lock_state;

struct lock_handle {
    redis_client *c;
    char *key;
    char token[LOCK_TOKEN_LEN];
    lock_strategy strategy;
    int64_t lease_ms; /* what we ask Redis for: the fixed lease or the watchdog lease */
    int watchdog;
    int64_t deadline; /* monotonic ms; retry strategies only */
    lock_cb cb;
    void *arg;
    struct event *timer; /* retry while acquiring, renewal while held */
    lock_state state;
    int inflight; /* our Redis commands whose callback has not run: h lives until 0 */
    int last_error;
    int had_error;
    int lost;
    int released;
    lock_release_cb rel_cb;
    void *rel_arg;
};

static uint32_t lock_random32(void)
{
    uint32_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != sizeof(v))
        v = (uint32_t)now_mono_ms() * 2654435761u;
    return v;
}

qn_status lock_token_new(char out[LOCK_TOKEN_LEN])
{
    unsigned char b[16];
    if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b))
        return QN_ERR;
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return QN_OK;
}

static void lock_free(lock_handle *h)
{
    if (!h)
        return;
    if (h->timer)
        event_free(h->timer);
    free(h->key);
    free(h);
}

static void on_ignore(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r, (void)err, (void)arg;
}

/* Reports a failed acquisition and frees h. */
static void lock_fail(lock_handle *h, lock_outcome o)
{
    lock_cb cb = h->cb;
    void *arg = h->arg;
    const char *keys[1] = {h->key};
    const char *args[1] = {h->token};

    /* An attempt whose reply was lost may have taken the lock: give it back (best effort; the
     * lease frees it otherwise). */
    if (h->had_error && REDIS_EVAL(h->c, lock_release, keys, args, on_ignore, NULL) != QN_OK)
        log_warn(NULL, "lock: %s: could not clean up after a failed acquisition", h->key);
    lock_free(h);
    cb(NULL, o, arg);
}

static void on_release_done(lock_handle *h)
{
    lock_release_cb done = h->rel_cb;
    void *arg = h->rel_arg;
    int released = h->released;

    lock_free(h);
    if (done)
        done(released, arg);
}

static void lock_schedule(lock_handle *h, int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(h->timer, &tv);
}

static qn_status lock_attempt(lock_handle *h);

static void on_acquire_reply(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    lock_handle *h = arg;
    int retrying = h->strategy == LOCK_SKIP_AFTER_RETRY_TIMEOUT ||
                   h->strategy == LOCK_FAIL_AFTER_RETRY_TIMEOUT || h->strategy == LOCK_KEEP_RETRY;
    int64_t now, next;
    (void)c;

    h->inflight--;
    if (!err && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
        h->state = LS_HELD;
        if (h->watchdog)
            lock_schedule(h, h->lease_ms / 3);
        h->cb(h, LOCK_ACQUIRED, h->arg);
        return;
    }
    h->last_error = err != NULL || r->type != REDIS_REPLY_INTEGER;
    if (h->last_error) {
        h->had_error = 1;
        log_warn(NULL, "lock: %s: acquire attempt failed: %s", h->key, err ? err : "bad reply");
    }
    if (!retrying) {
        lock_fail(h, h->last_error                   ? LOCK_FAILED_ERROR
                     : h->strategy == LOCK_SKIP_FAST ? LOCK_SKIPPED
                                                     : LOCK_FAILED_BUSY);
        return;
    }
    now = now_mono_ms();
    if (h->strategy != LOCK_KEEP_RETRY && now >= h->deadline) {
        lock_fail(h, h->last_error                                  ? LOCK_FAILED_ERROR
                     : h->strategy == LOCK_SKIP_AFTER_RETRY_TIMEOUT ? LOCK_SKIPPED
                                                                    : LOCK_FAILED_TIMEOUT);
        return;
    }
    next = LOCK_RETRY_MIN_MS + lock_random32() % (LOCK_RETRY_MAX_MS - LOCK_RETRY_MIN_MS + 1);
    /* The last attempt happens at the deadline, not up to 50 ms after it. */
    if (h->strategy != LOCK_KEEP_RETRY && now + next > h->deadline)
        next = h->deadline - now;
    lock_schedule(h, next);
}

static void on_renew_reply(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    lock_handle *h = arg;
    (void)c;

    h->inflight--;
    if (h->state == LS_RELEASING) {
        if (h->inflight == 0)
            on_release_done(h);
        return;
    }
    if (!err && r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
        lock_schedule(h, h->lease_ms / 3);
        return;
    }
    if (!err && r->type == REDIS_REPLY_INTEGER) {
        h->lost = 1;
        log_errorf(NULL, ((log_field[]){LOG_S("lock", h->key), LOG_END}),
                   "lock: lost (lease ran out or another owner took it); watchdog stopped");
        return;
    }
    /* Transient: two more ticks remain before the lease runs out. */
    log_warn(NULL, "lock: %s: renewal failed: %s", h->key, err ? err : "bad reply");
    lock_schedule(h, h->lease_ms / 3);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    lock_handle *h = arg;
    char lease[24];
    const char *keys[1] = {h->key};
    const char *args[2] = {h->token, lease};
    (void)fd, (void)what;

    if (h->state == LS_ACQUIRING) {
        if (lock_attempt(h) != QN_OK) {
            h->had_error = 1;
            lock_fail(h, LOCK_FAILED_ERROR);
        }
        return;
    }
    snprintf(lease, sizeof(lease), "%" PRId64, h->lease_ms);
    if (REDIS_EVAL(h->c, lock_renew, keys, args, on_renew_reply, h) == QN_OK) {
        h->inflight++;
        return;
    }
    log_warn(NULL, "lock: %s: cannot issue the renewal", h->key);
    lock_schedule(h, h->lease_ms / 3);
}

static qn_status lock_attempt(lock_handle *h)
{
    char lease[24];
    const char *keys[1] = {h->key};
    const char *args[2] = {h->token, lease};
    qn_status st;

    snprintf(lease, sizeof(lease), "%" PRId64, h->lease_ms);
    st = REDIS_EVAL(h->c, lock_acquire, keys, args, on_acquire_reply, h);
    if (st == QN_OK)
        h->inflight++;
    return st;
}

qn_status lock_acquire(redis_client *c, const lock_opts *o, lock_cb cb, void *arg)
{
    lock_handle *h = NULL;
    struct event_base *base;
    qn_status st = QN_EINVAL;

    if (!c || !o || !o->name || !*o->name || !cb || o->strategy < LOCK_SKIP_FAST ||
        o->strategy > LOCK_KEEP_RETRY)
        goto fail;
    base = redis_client_base(c);
    st = QN_ENOMEM;
    h = calloc(1, sizeof(*h));
    if (!h)
        goto fail;
    h->c = c;
    h->key = strdup(o->name);
    h->timer = evtimer_new(base, on_timer, h);
    if (!h->key || !h->timer)
        goto fail;
    st = lock_token_new(h->token);
    if (st != QN_OK)
        goto fail;
    h->strategy = o->strategy;
    h->watchdog = o->lease_ms <= 0;
    h->lease_ms =
        h->watchdog ? (o->watchdog_ms > 0 ? o->watchdog_ms : LOCK_WATCHDOG_LEASE_MS) : o->lease_ms;
    h->deadline = now_mono_ms() + (o->wait_ms < 0 ? 1000 : o->wait_ms);
    h->cb = cb;
    h->arg = arg;
    st = lock_attempt(h);
    if (st != QN_OK)
        goto fail;
    return QN_OK;
fail:
    lock_free(h);
    return st;
}

static void on_release_reply(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    lock_handle *h = arg;
    (void)c;

    h->inflight--;
    h->released = !err && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (err)
        log_warn(NULL, "lock: %s: release failed (the lease will free it): %s", h->key, err);
    else if (!h->released)
        log_warn(NULL, "lock: %s: was no longer ours at release", h->key);
    if (h->inflight == 0)
        on_release_done(h);
}

void lock_release(lock_handle *h, lock_release_cb done, void *arg)
{
    const char *keys[1];
    const char *args[1];

    if (!h)
        return;
    keys[0] = h->key;
    args[0] = h->token;
    h->state = LS_RELEASING;
    h->rel_cb = done;
    h->rel_arg = arg;
    event_del(h->timer);
    if (REDIS_EVAL_N(h->c, lock_release, 1, keys, 1, args, on_release_reply, h) == QN_OK) {
        h->inflight++;
        return;
    }
    log_warn(NULL, "lock: %s: cannot issue the release (the lease will free it)", h->key);
    h->released = 0;
    if (h->inflight == 0)
        on_release_done(h);
}

int lock_handle_lost(const lock_handle *h)
{
    return h ? h->lost : 1;
}

const char *lock_handle_token(const lock_handle *h)
{
    return h ? h->token : NULL;
}

const char *lock_handle_name(const lock_handle *h)
{
    return h ? h->key : NULL;
}

const char *lock_outcome_str(lock_outcome o)
{
    switch (o) {
    case LOCK_ACQUIRED:
        return "acquired";
    case LOCK_SKIPPED:
        return "skipped";
    case LOCK_FAILED_BUSY:
        return "failed_busy";
    case LOCK_FAILED_TIMEOUT:
        return "failed_timeout";
    case LOCK_FAILED_ERROR:
        return "failed_error";
    }
    return "?";
}

qn_status lock_strategy_parse(const char *s, lock_strategy *out)
{
    static const char *const names[] = {"skip_fast", "fail_fast", "skip_after_retry_timeout",
                                        "fail_after_retry_timeout", "keep_retry"};
    char buf[32];
    size_t i;

    if (!s || !out || strlen(s) >= sizeof(buf))
        return QN_EINVAL;
    for (i = 0; s[i]; i++)
        buf[i] = s[i] == '-' ? '_' : s[i];
    buf[i] = '\0';
    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcasecmp(buf, names[i]) == 0) {
            *out = (lock_strategy)i;
            return QN_OK;
        }
    }
    return QN_EINVAL;
}
