/* Redis client on the event loop, script registry and synchronous helpers (see redis.h). */
#include "redis.h"

#include <dirent.h>
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

#define REDIS_BACKOFF_MIN_MS   100
#define REDIS_BACKOFF_MAX_MS   2000
#define REDIS_SCRIPT_MAX_BYTES (1 << 20)

/* ---------------------------------------------------------------- SHA1 (for EVALSHA) */

/* Computed locally so that a registry is usable (EVALSHA) before, or without, SCRIPT LOAD,
 * e.g. by consumer threads with their own synchronous connection. FIPS 180-1. */
static uint32_t sha1_rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = sha1_rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5A827999;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ED9EBA1;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8F1BBCDC;
        } else {
            f = b ^ c ^ d;
            k = 0xCA62C1D6;
        }
        uint32_t t = sha1_rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = sha1_rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

static void sha1_hex(const char *data, size_t len, char out[41])
{
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    const unsigned char *p = (const unsigned char *)data;
    unsigned char tail[128] = {0};
    size_t full = len / 64 * 64, rest = len - full, tail_len;
    uint64_t bits = (uint64_t)len * 8;

    for (size_t off = 0; off < full; off += 64)
        sha1_block(h, p + off);
    memcpy(tail, p + full, rest);
    tail[rest] = 0x80;
    tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha1_block(h, tail);
    if (tail_len == 128)
        sha1_block(h, tail + 64);
    for (int i = 0; i < 5; i++)
        snprintf(out + 8 * i, 9, "%08x", h[i]);
}

/* ---------------------------------------------------------------- script registry */

typedef struct redis_script {
    char *name;
    char *source;
    size_t source_len;
    char sha1[41];
} redis_script;

struct redis_scripts {
    redis_script *v;
    size_t n;
};

static int scripts_is_lua(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return d->d_name[0] != '.' && len > 4 && strcmp(d->d_name + len - 4, ".lua") == 0;
}

static char *scripts_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;

    if (!f)
        goto fail;
    buf = malloc(REDIS_SCRIPT_MAX_BYTES + 1);
    if (!buf)
        goto fail;
    len = fread(buf, 1, REDIS_SCRIPT_MAX_BYTES + 1, f);
    if (ferror(f) || len > REDIS_SCRIPT_MAX_BYTES)
        goto fail;
    buf[len] = '\0';
    fclose(f);
    /* Kept for the process's life, once per loader: a 1 MiB buffer per script would hold
     * megabytes of address space (and of "in use" heap in malloc_stats and heap profilers). */
    char *fit = realloc(buf, len + 1);
    if (fit)
        buf = fit;
    *len_out = len;
    return buf;
fail:
    if (f)
        fclose(f);
    free(buf);
    return NULL;
}

redis_scripts *redis_scripts_load_dir(const char *dir)
{
    struct dirent **ents = NULL;
    int nents = -1;
    redis_scripts *s = calloc(1, sizeof(*s));

    if (!s || !dir)
        goto fail;
    nents = scandir(dir, &ents, scripts_is_lua, alphasort);
    if (nents < 0) {
        log_error(NULL, "redis: cannot read the Lua directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    if (nents > 0) {
        s->v = calloc((size_t)nents, sizeof(*s->v));
        if (!s->v)
            goto fail;
    }
    for (int i = 0; i < nents; i++) {
        redis_script *sc = &s->v[s->n];
        const char *fname = ents[i]->d_name;
        char *path = NULL;

        if (asprintf(&path, "%s/%s", dir, fname) < 0)
            goto fail;
        sc->source = scripts_read_file(path, &sc->source_len);
        if (!sc->source) {
            log_error(NULL, "redis: cannot read the Lua script %s", path);
            free(path);
            goto fail;
        }
        free(path);
        sc->name = strndup(fname, strlen(fname) - 4);
        if (!sc->name) {
            free(sc->source);
            goto fail;
        }
        sha1_hex(sc->source, sc->source_len, sc->sha1);
        s->n++;
    }
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
    return s;
fail:
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
    redis_scripts_free(s);
    return NULL;
}

void redis_scripts_free(redis_scripts *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].source);
    }
    free(s->v);
    free(s);
}

size_t redis_scripts_count(const redis_scripts *s)
{
    return s ? s->n : 0;
}

const char *redis_scripts_name(const redis_scripts *s, size_t i)
{
    return s && i < s->n ? s->v[i].name : NULL;
}

static const redis_script *scripts_find(const redis_scripts *s, const char *name)
{
    for (size_t i = 0; s && name && i < s->n; i++)
        if (strcmp(s->v[i].name, name) == 0)
            return &s->v[i];
    return NULL;
}

const char *redis_scripts_sha1(const redis_scripts *s, const char *name)
{
    const redis_script *sc = scripts_find(s, name);
    return sc ? sc->sha1 : NULL;
}

const char *redis_scripts_source(const redis_scripts *s, const char *name)
{
    const redis_script *sc = scripts_find(s, name);
    return sc ? sc->source : NULL;
}

/* ---------------------------------------------------------------- EVAL argument vectors */

/* One EVALSHA call with private copies of keys and args: the NOSCRIPT retry re-sends it
 * after the caller's arrays are gone. Shared by the async and the sync path. */
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

typedef enum { RC_DISCONNECTED = 0, RC_CONNECTING, RC_AUTHENTICATING, RC_CONNECTED } rc_state;

/* A command accepted by redis_command*: on the client's list from acceptance until its
 * callback ran. Either in hiredis (its reply callback will come) or failed-later (its timer
 * fires at once and reports fail_err). */
typedef struct redis_req {
    struct redis_req *prev, *next;
    redis_client *c;
    redis_cb cb;
    void *arg;
    struct event timer; /* command timeout, or the deferred failure */
    int in_hiredis;
    int timed_out;
    const char *fail_err;
} redis_req;

struct redis_client {
    struct event_base *base;
    char *host;
    char *password;
    int port;
    int connect_timeout_ms;
    int command_timeout_ms;
    int max_pending;
    redis_scripts *scripts;

    redisAsyncContext *ac;
    rc_state state;
    int ready;
    int ready_any; /* atomic copy of ready, for other threads */
    size_t scripts_loaded;
    int backoff_ms;
    unsigned long connects;
    int closing;
    const char *drop_err; /* why the pending commands fail while we drop the connection */

    struct event *reconnect_ev;
    struct event *connect_timeout_ev;
    redis_req *reqs; /* every accepted command whose callback has not run yet */
    int nreqs;
};

static void client_start_connect(redis_client *c);
static qn_status client_send_argv(redis_client *c, int internal, redis_cb cb, void *arg, int argc,
                                  const char **argv, const size_t *argvlen);

static void client_set_ready(redis_client *c, int ready)
{
    c->ready = ready;
    __atomic_store_n(&c->ready_any, ready, __ATOMIC_RELEASE);
}

static struct timeval ms_to_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

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
    free(r);
    if (!err && reply && reply->type == REDIS_REPLY_ERROR)
        err = reply->str ? reply->str : "error reply";
    if (!err && !reply)
        err = "no reply";
    cb(c, reply, err, arg);
}

static void client_schedule_reconnect(redis_client *c)
{
    struct timeval tv = ms_to_tv(c->backoff_ms);
    if (c->closing)
        return;
    evtimer_add(c->reconnect_ev, &tv);
    c->backoff_ms =
        c->backoff_ms * 2 > REDIS_BACKOFF_MAX_MS ? REDIS_BACKOFF_MAX_MS : c->backoff_ms * 2;
}

/* Frees the hiredis context now (or right after the hiredis callback we are in): hiredis then
 * calls every pending reply callback with NULL, which fails them with why. */
static void client_drop(redis_client *c, const char *why)
{
    redisAsyncContext *ac = c->ac;
    if (!ac)
        return;
    c->ac = NULL;
    c->state = RC_DISCONNECTED;
    client_set_ready(c, 0);
    event_del(c->connect_timeout_ev);
    c->drop_err = why;
    redisAsyncFree(ac);
    c->drop_err = NULL;
    client_schedule_reconnect(c);
}

static void on_hiredis_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    redis_req *r = privdata;
    redis_client *c = r->c;
    const char *err = NULL;
    (void)ac;

    if (!reply) {
        if (r->timed_out)
            err = "timeout";
        else if (c->closing)
            err = "client closed";
        else if (c->drop_err)
            err = c->drop_err;
        else
            err = "connection lost";
    }
    req_finish(r, reply, err);
}

static void on_req_timer(evutil_socket_t fd, short what, void *arg)
{
    redis_req *r = arg;
    redis_client *c = r->c;
    (void)fd;
    (void)what;

    if (!r->in_hiredis) {
        req_finish(r, NULL, r->fail_err);
        return;
    }
    /* Replies come in order, so everything behind the overdue one is stuck as well: drop the
     * connection (failing them all now) and reconnect. */
    r->timed_out = 1;
    log_warn(NULL, "redis: a command got no reply within %d ms; reconnecting",
             c->command_timeout_ms);
    client_drop(c, "connection dropped after a command timeout");
}

static redis_req *req_new(redis_client *c, redis_cb cb, void *arg)
{
    redis_req *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->c = c;
    r->cb = cb;
    r->arg = arg;
    evtimer_assign(&r->timer, c->base, on_req_timer, r);
    r->next = c->reqs;
    if (c->reqs)
        c->reqs->prev = r;
    c->reqs = r;
    c->nreqs++;
    return r;
}

static void req_fail_later(redis_req *r, const char *err)
{
    struct timeval zero = {0, 0};
    r->in_hiredis = 0;
    r->fail_err = err;
    evtimer_add(&r->timer, &zero);
}

/* The one way commands reach hiredis. internal: AUTH and SCRIPT LOAD, which are sent before
 * the connection counts as connected. */
static qn_status client_send_formatted(redis_client *c, int internal, redis_cb cb, void *arg,
                                       const char *cmd, size_t len)
{
    redis_req *r;
    struct timeval tv = ms_to_tv(c->command_timeout_ms);

    if (c->closing)
        return QN_ERR;
    r = req_new(c, cb, arg);
    if (!r)
        return QN_ENOMEM;
    if (!c->ac || (!internal && c->state != RC_CONNECTED)) {
        req_fail_later(r, "not connected");
        return QN_OK;
    }
    if (c->nreqs > c->max_pending) {
        req_fail_later(r, "too many pending commands");
        return QN_OK;
    }
    r->in_hiredis = 1;
    if (redisAsyncFormattedCommand(c->ac, on_hiredis_reply, r, cmd, len) != REDIS_OK) {
        req_fail_later(r, "not connected");
        return QN_OK;
    }
    evtimer_add(&r->timer, &tv);
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

static qn_status client_send_argv(redis_client *c, int internal, redis_cb cb, void *arg, int argc,
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
    st = client_send_formatted(c, internal, cb, arg, heap ? heap : small, len);
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
    st = client_send_formatted(c, 0, cb, arg, cmd, (size_t)len);
    redisFreeCommand(cmd);
    return st;
}

qn_status redis_command_argv(redis_client *c, redis_cb cb, void *arg, int argc, const char **argv,
                             const size_t *argvlen)
{
    return client_send_argv(c, 0, cb, arg, argc, argv, argvlen);
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

    if (!c || !cb || !name)
        return QN_EINVAL;
    if (c->closing)
        return QN_ERR;
    sc = scripts_find(c->scripts, name);
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

static void client_became_ready(redis_client *c)
{
    client_set_ready(c, 1);
    c->backoff_ms = REDIS_BACKOFF_MIN_MS;
    log_info(NULL, "redis: ready (%s:%d, %zu scripts loaded)", c->host, c->port, c->scripts->n);
}

static void on_script_loaded(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    const redis_script *sc = &c->scripts->v[(size_t)(uintptr_t)arg];

    if (err) {
        /* A transport failure is retried by the reconnect; so is a server still loading its
         * data after a restart (LOADING), which else would keep the service not ready for good.
         * Any other error reply (a script that does not compile) keeps the service not ready,
         * which is what /readyz must show. */
        if (reply && strncmp(err, "LOADING", 7) == 0) {
            if (c->ac)
                log_warn(NULL, "redis: %s:%d is loading its data; connecting again", c->host,
                         c->port);
            client_drop(c, "the server is loading its data");
        } else if (reply) {
            log_error(NULL, "redis: SCRIPT LOAD %s failed: %s", sc->name, err);
        }
        return;
    }
    if (reply->type != REDIS_REPLY_STRING || strcmp(reply->str, sc->sha1) != 0) {
        log_error(NULL, "redis: SCRIPT LOAD %s returned an unexpected SHA1", sc->name);
        return;
    }
    if (++c->scripts_loaded == c->scripts->n && c->state == RC_CONNECTED)
        client_became_ready(c);
}

static void client_authenticated(redis_client *c)
{
    c->state = RC_CONNECTED;
    c->connects++;
    c->scripts_loaded = 0;
    log_info(NULL, "redis: connected to %s:%d", c->host, c->port);
    if (c->scripts->n == 0) {
        client_became_ready(c);
        return;
    }
    for (size_t i = 0; i < c->scripts->n; i++) {
        const redis_script *sc = &c->scripts->v[i];
        const char *argv[3] = {"SCRIPT", "LOAD", sc->source};
        size_t argvlen[3] = {6, 4, sc->source_len};
        if (client_send_argv(c, 1, on_script_loaded, (void *)(uintptr_t)i, 3, argv, argvlen) !=
            QN_OK) {
            client_drop(c, "out of memory while loading scripts");
            return;
        }
    }
}

static void on_auth(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)arg;
    if (err) {
        if (reply) {
            log_error(NULL, "redis: AUTH failed: %s", err);
            client_drop(c, "AUTH failed");
        }
        return;
    }
    client_authenticated(c);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    redis_client *c = ac->data;
    const char *argv[2] = {"AUTH", c->password};

    if (c->ac != ac)
        return;
    event_del(c->connect_timeout_ev);
    if (status != REDIS_OK) {
        /* hiredis frees the context after this returns. */
        log_warn(NULL, "redis: cannot connect to %s:%d: %s", c->host, c->port,
                 ac->errstr[0] ? ac->errstr : "error");
        c->ac = NULL;
        c->state = RC_DISCONNECTED;
        client_schedule_reconnect(c);
        return;
    }
    if (!c->password) {
        client_authenticated(c);
        return;
    }
    c->state = RC_AUTHENTICATING;
    if (client_send_argv(c, 1, on_auth, NULL, 2, argv, NULL) != QN_OK)
        client_drop(c, "out of memory");
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    redis_client *c = ac->data;

    if (c->ac != ac)
        return; /* we dropped it ourselves and already scheduled the reconnect */
    log_warn(NULL, "redis: connection to %s:%d lost: %s", c->host, c->port,
             status == REDIS_OK ? "closed" : (ac->errstr[0] ? ac->errstr : "error"));
    c->ac = NULL;
    c->state = RC_DISCONNECTED;
    client_set_ready(c, 0);
    client_schedule_reconnect(c);
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    redis_client *c = arg;
    (void)fd;
    (void)what;
    log_warn(NULL, "redis: connect to %s:%d timed out after %d ms", c->host, c->port,
             c->connect_timeout_ms);
    client_drop(c, "connect timeout");
}

static void on_reconnect_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    client_start_connect(arg);
}

static void client_start_connect(redis_client *c)
{
    struct timeval tv = ms_to_tv(c->connect_timeout_ms);
    redisAsyncContext *ac;

    if (c->closing || c->ac)
        return;
    ac = redisAsyncConnect(c->host, c->port);
    if (!ac || ac->err) {
        log_warn(NULL, "redis: cannot connect to %s:%d: %s", c->host, c->port,
                 ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        client_schedule_reconnect(c);
        return;
    }
    ac->data = c;
    if (redisLibeventAttach(ac, c->base) != REDIS_OK) {
        redisAsyncFree(ac);
        client_schedule_reconnect(c);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
    c->state = RC_CONNECTING;
    evtimer_add(c->connect_timeout_ev, &tv);
}

redis_client *redis_client_new(struct event_base *base, const redis_opts *opts)
{
    redis_client *c = NULL;

    if (!base || !opts || !opts->host || opts->port <= 0)
        goto fail;
    c = calloc(1, sizeof(*c));
    if (!c)
        goto fail;
    c->base = base;
    c->port = opts->port;
    c->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 1000;
    c->command_timeout_ms = opts->command_timeout_ms > 0 ? opts->command_timeout_ms : 1000;
    c->max_pending = opts->max_pending > 0 ? opts->max_pending : 10000;
    c->backoff_ms = REDIS_BACKOFF_MIN_MS;
    c->host = strdup(opts->host);
    if (!c->host)
        goto fail;
    if (opts->password && *opts->password) {
        c->password = strdup(opts->password);
        if (!c->password)
            goto fail;
    }
    c->scripts =
        opts->lua_dir ? redis_scripts_load_dir(opts->lua_dir) : calloc(1, sizeof(*c->scripts));
    if (!c->scripts)
        goto fail;
    c->reconnect_ev = evtimer_new(base, on_reconnect_timer, c);
    c->connect_timeout_ev = evtimer_new(base, on_connect_timeout, c);
    if (!c->reconnect_ev || !c->connect_timeout_ev)
        goto fail;
    client_start_connect(c);
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
    if (c->ac) {
        redisAsyncContext *ac = c->ac;
        c->ac = NULL;
        redisAsyncFree(ac); /* fails what is in hiredis with "client closed" */
    }
    while (c->reqs)
        req_finish(c->reqs, NULL, "client closed");
    if (c->reconnect_ev)
        event_free(c->reconnect_ev);
    if (c->connect_timeout_ev)
        event_free(c->connect_timeout_ev);
    redis_scripts_free(c->scripts);
    free(c->host);
    free(c->password);
    free(c);
}

int redis_client_connected(const redis_client *c)
{
    return c && c->state == RC_CONNECTED;
}

int redis_client_ready(const redis_client *c)
{
    return c && c->state == RC_CONNECTED && c->ready;
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
    return c ? c->connects : 0;
}

/* ---------------------------------------------------------------- synchronous helpers */

redisContext *redis_sync_connect(const char *host, int port, const char *password, int timeout_ms)
{
    struct timeval tv = ms_to_tv(timeout_ms > 0 ? timeout_ms : 1000);
    redisContext *ctx = NULL;
    redisReply *r = NULL;

    if (!host)
        goto fail;
    ctx = redisConnectWithTimeout(host, port, tv);
    if (!ctx || ctx->err) {
        log_error(NULL, "redis: cannot connect to %s:%d: %s", host, port,
                  ctx ? ctx->errstr : "out of memory");
        goto fail;
    }
    if (redisSetTimeout(ctx, tv) != REDIS_OK)
        goto fail;
    if (password && *password) {
        r = redisCommand(ctx, "AUTH %s", password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            log_error(NULL, "redis: AUTH failed: %s", r ? r->str : ctx->errstr);
            goto fail;
        }
        freeReplyObject(r);
    }
    return ctx;
fail:
    if (r)
        freeReplyObject(r);
    if (ctx)
        redisFree(ctx);
    return NULL;
}

qn_status redis_sync_ensure(redisContext **ctx, const char *host, int port, const char *password,
                            int timeout_ms)
{
    if (*ctx && !(*ctx)->err)
        return QN_OK;
    if (*ctx)
        redisFree(*ctx);
    *ctx = redis_sync_connect(host, port, password, timeout_ms);
    return *ctx ? QN_OK : QN_ERR;
}

redisReply *redis_sync_eval(redisContext *ctx, const redis_scripts *s, const char *name, int nkeys,
                            const char **keys, int nargs, const char **args)
{
    const redis_script *sc = scripts_find(s, name);
    eval_call *ec = NULL;
    redisReply *r = NULL;

    if (!ctx || !sc) {
        log_error(NULL, "redis: unknown Lua script %s", name ? name : "(null)");
        goto done;
    }
    ec = eval_call_new(sc, nkeys, keys, nargs, args);
    if (!ec)
        goto done;
    r = redisCommandArgv(ctx, ec->argc, ec->argv, ec->argvlen);
    if (reply_is_noscript(r) && eval_call_fallback(ec)) {
        freeReplyObject(r);
        r = redisCommandArgv(ctx, ec->argc, ec->argv, ec->argvlen);
    }
done:
    free(ec);
    return r;
}
