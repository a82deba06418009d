/* The Redis command core of both clients (rcmd.h). */
#include "rcmd.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* ---------------------------------------------------------------- options */

qn_status rcmd_nodes_check(const char *list, char *err, size_t errlen)
{
    if (!list || !*list)
        return QN_OK;
    return rcluster_addrs_parse(list, NULL, RCMD_STARTUP_MAX, err, errlen) < 0 ? QN_EINVAL : QN_OK;
}

qn_status rcmd_conf_init(rcmd_conf *cf, const rcmd_opts *o, char *err, size_t errlen)
{
    qn_status st = QN_ENOMEM;
    int n;

    memset(cf, 0, sizeof(*cf));
    if (!o) {
        qn_errf(err, errlen, "no options");
        return QN_EINVAL;
    }
    cf->cluster = o->cluster_nodes && *o->cluster_nodes;
    int both = o->timeout_ms > 0 ? o->timeout_ms : RCMD_TIMEOUT_MS;
    cf->connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : both;
    cf->command_timeout_ms = o->command_timeout_ms > 0 ? o->command_timeout_ms : both;
    if (o->password && *o->password && !(cf->password = strdup(o->password)))
        goto fail;
    if (cf->cluster) {
        n = rcluster_addrs_parse(o->cluster_nodes, NULL, RCMD_STARTUP_MAX, err, errlen);
        if (n < 0) {
            st = QN_EINVAL;
            goto fail;
        }
        if (!(cf->startup = calloc((size_t)n, sizeof(*cf->startup))))
            goto fail;
        cf->nstartup = rcluster_addrs_parse(o->cluster_nodes, cf->startup, n, err, errlen);
        if (rsentinel_check(o->sentinels, o->master_name, o->cluster_nodes, err, errlen) != QN_OK) {
            st = QN_EINVAL;
            goto fail;
        }
        return QN_OK;
    }
    if ((o->sentinels && *o->sentinels) || (o->master_name && *o->master_name)) {
        /* Where the master is comes from the sentinels, at every connect. */
        if (!(cf->sentinel = rsentinel_new(o->sentinels, o->master_name, err, errlen))) {
            st = QN_EINVAL;
            goto fail;
        }
        if (!(cf->host = strdup(rsentinel_master_name(cf->sentinel))))
            goto fail;
        snprintf(cf->name, sizeof(cf->name), "master %s", rsentinel_master_name(cf->sentinel));
        return QN_OK;
    }
    if (!o->host || !*o->host || o->port < 1 || o->port > 65535) {
        qn_errf(err, errlen, "no Redis address (host and a port 1..65535, or cluster nodes)");
        st = QN_EINVAL;
        goto fail;
    }
    if (!(cf->host = strdup(o->host)))
        goto fail;
    cf->port = o->port;
    snprintf(cf->name, sizeof(cf->name), "%s:%d", o->host, o->port);
    return QN_OK;
fail:
    if (st == QN_ENOMEM)
        qn_errf(err, errlen, "out of memory");
    rcmd_conf_free(cf);
    return st;
}

qn_status rcmd_conf_set_server(rcmd_conf *cf, const char *host, int port)
{
    char *h = strdup(host);
    if (!h)
        return QN_ENOMEM;
    free(cf->host);
    cf->host = h;
    cf->port = port;
    if (cf->sentinel)
        snprintf(cf->name, sizeof(cf->name), "%s:%d (master %s)", host, port,
                 rsentinel_master_name(cf->sentinel));
    else
        snprintf(cf->name, sizeof(cf->name), "%s:%d", host, port);
    return QN_OK;
}

void rcmd_conf_free(rcmd_conf *cf)
{
    rsentinel_free(cf->sentinel);
    free(cf->host);
    free(cf->password);
    free(cf->startup);
    memset(cf, 0, sizeof(*cf));
}

int rcmd_auth_argv(const rcmd_conf *cf, const char *argv[2], size_t argvlen[2])
{
    if (!cf->password)
        return 0;
    argv[0] = "AUTH";
    argvlen[0] = 4;
    argv[1] = cf->password;
    argvlen[1] = strlen(cf->password);
    return 2;
}

struct timeval rcmd_timeval(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* ---------------------------------------------------------------- the command table */

#define RO RCMD_READONLY
#define TX RCMD_TRANSACTION
#define NK RCMD_NOKEY

/* Sorted by name in byte order ('_' after the letters): rcmd_lookup searches it by halves. A
 * command missing here has its key first and is a write, which is never sent twice. */
static const rcmd_row rcmd_table[] = {
    {"ASKING", 0, NK},
    {"AUTH", 0, NK},
    {"BITCOUNT", RCMD_KEYS_FIRST, RO},
    {"BLPOP", RCMD_KEYS_ALL_BUT_LAST, 0},
    {"BRPOP", RCMD_KEYS_ALL_BUT_LAST, 0},
    {"BZPOPMAX", RCMD_KEYS_ALL_BUT_LAST, 0},
    {"BZPOPMIN", RCMD_KEYS_ALL_BUT_LAST, 0},
    {"CLIENT", 0, NK},
    {"CLUSTER", 0, NK},
    {"COMMAND", 0, NK},
    {"CONFIG", 0, NK},
    {"DBSIZE", 0, NK | RO},
    {"DEL", RCMD_KEYS_ALL, 0},
    {"DISCARD", 0, NK | TX},
    {"ECHO", 0, NK | RO},
    {"EVAL", RCMD_KEYS_NUMKEYS, 0},
    {"EVALSHA", RCMD_KEYS_NUMKEYS, 0},
    {"EVALSHA_RO", RCMD_KEYS_NUMKEYS, RO},
    {"EVAL_RO", RCMD_KEYS_NUMKEYS, RO},
    {"EXEC", 0, NK | TX},
    {"EXISTS", RCMD_KEYS_ALL, RO},
    {"EXPIRETIME", RCMD_KEYS_FIRST, RO},
    {"FCALL", RCMD_KEYS_NUMKEYS, 0},
    {"FLUSHALL", 0, NK},
    {"FLUSHDB", 0, NK},
    {"GET", RCMD_KEYS_FIRST, RO},
    {"GETBIT", RCMD_KEYS_FIRST, RO},
    {"GETRANGE", RCMD_KEYS_FIRST, RO},
    {"HELLO", 0, NK},
    {"HEXISTS", RCMD_KEYS_FIRST, RO},
    {"HGET", RCMD_KEYS_FIRST, RO},
    {"HGETALL", RCMD_KEYS_FIRST, RO},
    {"HKEYS", RCMD_KEYS_FIRST, RO},
    {"HLEN", RCMD_KEYS_FIRST, RO},
    {"HMGET", RCMD_KEYS_FIRST, RO},
    {"HSCAN", RCMD_KEYS_FIRST, RO},
    {"HSTRLEN", RCMD_KEYS_FIRST, RO},
    {"HVALS", RCMD_KEYS_FIRST, RO},
    {"INFO", 0, NK | RO},
    {"KEYS", 0, NK | RO},
    {"LINDEX", RCMD_KEYS_FIRST, RO},
    {"LLEN", RCMD_KEYS_FIRST, RO},
    {"LMOVE", RCMD_KEYS_TWO, 0},
    {"LRANGE", RCMD_KEYS_FIRST, RO},
    {"MGET", RCMD_KEYS_ALL, RO},
    {"MSET", RCMD_KEYS_PAIRS, 0},
    {"MSETNX", RCMD_KEYS_PAIRS, 0},
    {"MULTI", 0, NK | TX},
    {"PEXPIRETIME", RCMD_KEYS_FIRST, RO},
    {"PING", 0, NK | RO},
    {"PSUBSCRIBE", 0, NK},
    {"PTTL", RCMD_KEYS_FIRST, RO},
    {"PUBLISH", 0, NK},
    {"QUIT", 0, NK},
    {"READONLY", 0, NK},
    {"RENAME", RCMD_KEYS_TWO, 0},
    {"RENAMENX", RCMD_KEYS_TWO, 0},
    {"ROLE", 0, NK | RO},
    {"RPOPLPUSH", RCMD_KEYS_TWO, 0},
    {"SCAN", 0, NK | RO},
    {"SCARD", RCMD_KEYS_FIRST, RO},
    {"SCRIPT", 0, NK},
    {"SELECT", 0, NK},
    {"SISMEMBER", RCMD_KEYS_FIRST, RO},
    {"SMEMBERS", RCMD_KEYS_FIRST, RO},
    {"SMISMEMBER", RCMD_KEYS_FIRST, RO},
    {"SMOVE", RCMD_KEYS_TWO, 0},
    {"SRANDMEMBER", RCMD_KEYS_FIRST, RO},
    {"SSCAN", RCMD_KEYS_FIRST, RO},
    {"STRLEN", RCMD_KEYS_FIRST, RO},
    {"SUBSCRIBE", 0, NK},
    {"TIME", 0, NK | RO},
    {"TOUCH", RCMD_KEYS_ALL, 0},
    {"TTL", RCMD_KEYS_FIRST, RO},
    {"TYPE", RCMD_KEYS_FIRST, RO},
    {"UNLINK", RCMD_KEYS_ALL, 0},
    {"UNWATCH", 0, NK | TX},
    {"WAIT", 0, NK},
    {"WATCH", RCMD_KEYS_ALL, TX},
    {"ZCARD", RCMD_KEYS_FIRST, RO},
    {"ZCOUNT", RCMD_KEYS_FIRST, RO},
    {"ZLEXCOUNT", RCMD_KEYS_FIRST, RO},
    {"ZMSCORE", RCMD_KEYS_FIRST, RO},
    {"ZRANGE", RCMD_KEYS_FIRST, RO},
    {"ZRANGEBYLEX", RCMD_KEYS_FIRST, RO},
    {"ZRANGEBYSCORE", RCMD_KEYS_FIRST, RO},
    {"ZRANK", RCMD_KEYS_FIRST, RO},
    {"ZREVRANGE", RCMD_KEYS_FIRST, RO},
    {"ZREVRANGEBYSCORE", RCMD_KEYS_FIRST, RO},
    {"ZREVRANK", RCMD_KEYS_FIRST, RO},
    {"ZSCAN", RCMD_KEYS_FIRST, RO},
    {"ZSCORE", RCMD_KEYS_FIRST, RO},
};

#undef RO
#undef TX
#undef NK

#define RCMD_ROWS (sizeof(rcmd_table) / sizeof(rcmd_table[0]))

const rcmd_row *rcmd_rows(size_t *n)
{
    *n = RCMD_ROWS;
    return rcmd_table;
}

/* name (len bytes, any case) against an upper-case row name, as strcmp would order them. */
static int rcmd_name_cmp(const char *name, size_t len, const char *row)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char a = (unsigned char)name[i], b = (unsigned char)row[i];
        if (a >= 'a' && a <= 'z')
            a = (unsigned char)(a - 'a' + 'A');
        if (a != b)
            return b == '\0' ? 1 : (a > b) - (a < b);
    }
    return row[len] ? -1 : 0;
}

const rcmd_row *rcmd_lookup(const char *name, size_t len)
{
    size_t lo = 0, hi = RCMD_ROWS;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = rcmd_name_cmp(name, len, rcmd_table[mid].name);
        if (c == 0)
            return &rcmd_table[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- classification */

/* Where a command's keys are among its arguments, and the slot they fold into. One walk over
 * the arguments, in order, serves an argv and a RESP request alike: a script's key count
 * (argv[2]) comes before its keys. */
typedef struct rcmd_fold {
    int argc;
    int from, to, step; /* keys: argv[from], argv[from + step], ... below argv[to] */
    int numkeys;        /* to is set by argv[2] */
    int slot;
} rcmd_fold;

static void rcmd_fold_begin(rcmd_fold *f, rcmd_info *ci, const char *name, size_t len, int argc)
{
    const rcmd_row *row = rcmd_lookup(name, len);
    rcmd_keys keys = row ? row->keys : RCMD_KEYS_FIRST;
    size_t n = len < RCMD_NAME_MAX - 1 ? len : RCMD_NAME_MAX - 1;

    memcpy(ci->name, name, n);
    ci->name[n] = '\0';
    ci->flags = row ? row->flags : 0;
    f->argc = argc;
    f->from = 1;
    f->to = argc;
    f->step = 1;
    f->numkeys = 0;
    f->slot = RCMD_SLOT_NONE;
    if (ci->flags & RCMD_NOKEY) {
        f->to = 0;
        return;
    }
    switch (keys) {
    case RCMD_KEYS_FIRST:
        f->to = argc > 1 ? 2 : 1;
        break;
    case RCMD_KEYS_ALL:
        break;
    case RCMD_KEYS_ALL_BUT_LAST:
        f->to = argc - 1;
        break;
    case RCMD_KEYS_TWO:
        f->to = argc < 3 ? argc : 3;
        break;
    case RCMD_KEYS_PAIRS:
        f->step = 2;
        break;
    case RCMD_KEYS_NUMKEYS:
        if (argc < 3) {
            f->slot = RCMD_SLOT_CROSS;
            f->to = 0;
            break;
        }
        f->numkeys = 1;
        f->from = 3;
        f->to = 3;
        break;
    }
}

/* Argument i (len bytes) of the command: a key folds into the slot, the first key sets it and a
 * key of another slot makes it RCMD_SLOT_CROSS. */
static void rcmd_fold_arg(rcmd_fold *f, int i, const char *a, size_t len)
{
    if (f->numkeys && i == 2) {
        char num[12], *end;
        long n = -1;
        if (len > 0 && len < sizeof(num)) {
            memcpy(num, a, len);
            num[len] = '\0';
            n = strtol(num, &end, 10);
            if (*end)
                n = -1;
        }
        if (n < 0 || n > f->argc - 3) {
            f->slot = RCMD_SLOT_CROSS;
            f->to = 0;
        } else {
            f->to = 3 + (int)n;
        }
        return;
    }
    if (i < f->from || i >= f->to || (i - f->from) % f->step || f->slot == RCMD_SLOT_CROSS)
        return;
    int s = rslot_of_key(a, len);
    if (f->slot == RCMD_SLOT_NONE)
        f->slot = s;
    else if (f->slot != s)
        f->slot = RCMD_SLOT_CROSS;
}

void rcmd_classify_argv(int argc, const char *const *argv, const size_t *argvlen, rcmd_info *ci)
{
    rcmd_fold f;
    rcmd_fold_begin(&f, ci, argv[0], argvlen[0], argc);
    /* Only up to the last key: f.to grows once a script's count is read. */
    for (int i = 1; i < argc && i < f.to; i++)
        rcmd_fold_arg(&f, i, argv[i], argvlen[i]);
    ci->slot = f.slot;
}

/* The decimal after *p up to "\r\n"; advances *p past it. -1 when malformed. */
static long long rcmd_resp_len(const char **p, const char *end)
{
    long long n = 0;
    const char *q = *p;
    if (q >= end || *q < '0' || *q > '9')
        return -1;
    while (q < end && *q >= '0' && *q <= '9') {
        n = n * 10 + (*q++ - '0');
        if (n > (1LL << 40))
            return -1;
    }
    if (end - q < 2 || q[0] != '\r' || q[1] != '\n')
        return -1;
    *p = q + 2;
    return n;
}

qn_status rcmd_classify_request(const char *cmd, size_t len, size_t *used, rcmd_info *ci)
{
    const char *p = cmd, *end = cmd + len;
    rcmd_fold f;
    if (len < 1 || *p++ != '*')
        return QN_EINVAL;
    long long argc = rcmd_resp_len(&p, end);
    if (argc < 1 || argc > (1LL << 31) - 1)
        return QN_EINVAL;
    for (long long i = 0; i < argc; i++) {
        if (p >= end || *p++ != '$')
            return QN_EINVAL;
        long long n = rcmd_resp_len(&p, end);
        if (n < 0 || end - p < n + 2 || p[n] != '\r' || p[n + 1] != '\n')
            return QN_EINVAL;
        if (i == 0)
            rcmd_fold_begin(&f, ci, p, (size_t)n, (int)argc);
        else
            rcmd_fold_arg(&f, (int)i, p, (size_t)n);
        p += n + 2;
    }
    ci->slot = f.slot;
    *used = (size_t)(p - cmd);
    return QN_OK;
}

qn_status rcmd_admit(const rcmd_info *ci, int cluster, const char **why)
{
    if (ci->slot == RCMD_SLOT_CROSS) {
        log_errorf(NULL, ((log_field[]){LOG_S("command", ci->name), LOG_END}),
                   "redis: a command whose keys lie in two hash slots was refused (CROSSSLOT), "
                   "not sent");
        *why = "CROSSSLOT: keys in different hash slots (not sent)";
        return QN_EINVAL;
    }
    if (cluster && (ci->flags & RCMD_TRANSACTION)) {
        log_errorf(NULL, ((log_field[]){LOG_S("command", ci->name), LOG_END}),
                   "redis: a transaction command was refused on a Redis Cluster, not sent");
        *why = "transactions are refused on a Redis Cluster (a script does that; not sent)";
        return QN_EINVAL;
    }
    return QN_OK;
}

/* ---------------------------------------------------------------- RESP */

/* "<prefix><n>\r\n" at p; returns the end. */
static char *rcmd_put_len(char *p, char prefix, size_t n)
{
    *p++ = prefix;
    p += log_i64_str(p, (int64_t)n);
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* What hiredis' redisFormatCommandArgv makes, without its sprintf per argument and its
 * allocation for every command: this is on the event loop's hot path. */
size_t rcmd_format(char *buf, size_t cap, char **heap, int argc, const char *const *argv,
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
    char *p = rcmd_put_len(buf, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        size_t n = argvlen ? argvlen[i] : strlen(argv[i]);
        p = rcmd_put_len(p, '$', n);
        memcpy(p, argv[i], n);
        p += n;
        *p++ = '\r';
        *p++ = '\n';
    }
    return (size_t)(p - buf);
}

#define RCMD_ARGV_STACK 64 /* argument lengths measured on the stack */

size_t rcmd_format_command(char *buf, size_t cap, char **heap, int argc, const char *const *argv,
                           const size_t *argvlen, rcmd_info *ci)
{
    size_t lens_s[RCMD_ARGV_STACK], *lens = lens_s, len = 0;

    *heap = NULL;
    if (argc < 1)
        return 0;
    if (!argvlen) {
        if (argc > RCMD_ARGV_STACK && !(lens = malloc((size_t)argc * sizeof(*lens))))
            return 0;
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        argvlen = lens;
    }
    rcmd_classify_argv(argc, argv, argvlen, ci);
    len = rcmd_format(buf, cap, heap, argc, argv, argvlen);
    if (lens != lens_s)
        free(lens);
    return len;
}

/* ---------------------------------------------------------------- script calls */

/* Where the caller's extra bytes start: past the struct, aligned for any type. */
#define RCMD_SCRIPT_EXTRA_AT                                                                       \
    ((sizeof(rcmd_script) + _Alignof(max_align_t) - 1) & ~(_Alignof(max_align_t) - 1))

qn_status rcmd_script_new(const redis_scripts *s, const char *name, int nkeys, const char **keys,
                          int nargs, const char **args, size_t extra, rcmd_script **out,
                          const char **why)
{
    const redis_script *script;
    size_t ex = (extra + _Alignof(max_align_t) - 1) & ~(_Alignof(max_align_t) - 1);
    size_t bytes = RCMD_SCRIPT_EXTRA_AT + ex, n;
    rcmd_script *sc;
    char *p;

    *out = NULL;
    if (!name || nkeys < 0 || nargs < 0 || (nkeys && !keys) || (nargs && !args) ||
        !redis_scripts_call_ok(name, nkeys, nargs)) {
        *why = "wrong number of keys or arguments";
        return QN_EINVAL;
    }
    if (!s || !(script = redis_scripts_find(s, name))) {
        log_error(NULL, "redis: unknown Lua script %s", name);
        *why = "unknown script";
        return QN_ENOTFOUND;
    }
    n = 3 + (size_t)nkeys + (size_t)nargs;
    bytes += n * (sizeof(char *) + sizeof(size_t));
    for (int i = 0; i < nkeys + nargs; i++)
        bytes += strlen(i < nkeys ? keys[i] : args[i - nkeys]) + 1;
    if (!(sc = calloc(1, bytes))) {
        *why = "out of memory";
        return QN_ENOMEM;
    }
    sc->script = script;
    sc->extra = extra;
    sc->argc = (int)n;
    sc->argv = (const char **)((char *)sc + RCMD_SCRIPT_EXTRA_AT + ex);
    sc->argvlen = (size_t *)(sc->argv + n);
    p = (char *)(sc->argvlen + n);
    sc->argv[0] = "EVALSHA";
    sc->argvlen[0] = 7;
    sc->argv[1] = script->sha1;
    sc->argvlen[1] = 40;
    sc->argv[2] = sc->numkeys;
    sc->argvlen[2] = log_i64_str(sc->numkeys, nkeys);
    for (int i = 0; i < nkeys + nargs; i++) {
        const char *src = i < nkeys ? keys[i] : args[i - nkeys];
        size_t len = strlen(src);
        memcpy(p, src, len + 1);
        sc->argv[3 + i] = p;
        sc->argvlen[3 + i] = len;
        p += len + 1;
    }
    *out = sc;
    return QN_OK;
}

void *rcmd_script_extra(rcmd_script *sc)
{
    return sc->extra ? (char *)sc + RCMD_SCRIPT_EXTRA_AT : NULL;
}

int rcmd_script_fallback(rcmd_script *sc, const redisReply *r)
{
    if (sc->fell_back || !r || r->type != REDIS_REPLY_ERROR || !r->str ||
        strncmp(r->str, "NOSCRIPT", 8) != 0)
        return 0;
    sc->fell_back = 1;
    sc->argv[0] = "EVAL";
    sc->argvlen[0] = 4;
    sc->argv[1] = sc->script->source;
    sc->argvlen[1] = sc->script->source_len;
    return 1;
}

/* ---------------------------------------------------------------- redirects and retries */

void rcmd_retry_init(rcmd_retry *st, unsigned flags, int cluster, int64_t deadline_ms)
{
    memset(st, 0, sizeof(*st));
    st->deadline_ms = deadline_ms;
    st->flags = flags;
    st->cluster = cluster;
}

rcmd_verdict rcmd_verdict_of(const redisReply *r, int *slot, rcluster_addr *to)
{
    switch (rcluster_verdict_of(r, slot, to)) {
    case RCLUSTER_MOVED:
        return RCMD_MOVED;
    case RCLUSTER_ASK:
        return RCMD_ASK;
    case RCLUSTER_RETRY:
        return RCMD_BUSY;
    case RCLUSTER_FINAL:
        break;
    }
    return RCMD_REPLY;
}

/* The next wait (the first, or twice the last up to the cap) as action; give_up with why when
 * that wait would end at or past the deadline. */
static rcmd_decision rcmd_wait(rcmd_retry *st, int64_t now_ms, rcmd_action action,
                               rcmd_action give_up, const char *why)
{
    rcmd_decision d = {give_up, 0, why};
    int w = st->wait_ms ? st->wait_ms * 2 : RCMD_RETRY_MIN_MS;
    if (w > RCMD_RETRY_MAX_MS)
        w = RCMD_RETRY_MAX_MS;
    if (now_ms + w >= st->deadline_ms)
        return d;
    st->wait_ms = w;
    d.action = action;
    d.wait_ms = w;
    d.why = NULL;
    return d;
}

#define RCMD_WHY_UNKNOWN "connection lost after the command was sent: its outcome is unknown"

static rcmd_decision rcmd_fail(const char *why)
{
    rcmd_decision d = {RCMD_FAIL, 0, why};
    return d;
}

rcmd_decision rcmd_decide(rcmd_retry *st, rcmd_verdict v, int64_t now_ms)
{
    rcmd_decision done = {RCMD_DONE, 0, NULL};
    int readonly = (st->flags & RCMD_READONLY) != 0;

    switch (v) {
    case RCMD_REPLY:
        return done;
    case RCMD_MOVED:
    case RCMD_ASK:
        /* A server that is no cluster node means what it says; past the cap the redirect is the
         * answer (a map that keeps changing under the command). */
        if (!st->cluster || st->hops >= RCMD_HOPS_MAX)
            return done;
        st->hops++;
        done.action = v == RCMD_MOVED ? RCMD_SEND : RCMD_SEND_ASKING;
        return done;
    case RCMD_BUSY:
        /* Nothing ran: safe to send again, and the error reply is the answer once time is up. */
        return st->cluster ? rcmd_wait(st, now_ms, RCMD_WAIT, RCMD_DONE, NULL) : done;
    case RCMD_UNSENT:
        if (st->written && !readonly)
            return rcmd_fail(RCMD_WHY_UNKNOWN);
        if (!st->cluster)
            return rcmd_fail("not connected");
        return rcmd_wait(st, now_ms, RCMD_WAIT, RCMD_FAIL, "not sent: no node took it in time");
    case RCMD_LOST:
        /* It may have run: only what merely reads may run again. */
        st->written = 1;
        if (!readonly)
            return rcmd_fail(RCMD_WHY_UNKNOWN);
        if (!st->cluster)
            return rcmd_fail("connection lost");
        return rcmd_wait(st, now_ms, RCMD_WAIT, RCMD_FAIL, "connection lost");
    case RCMD_NO_NODE:
        if (!st->cluster)
            return rcmd_fail("not connected");
        return rcmd_wait(st, now_ms, RCMD_REFRESH, RCMD_FAIL, "no node serves the command's slot");
    }
    return rcmd_fail("unknown verdict");
}
