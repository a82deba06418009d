/* The Redis generation (rgen.h). */
#include "rgen.h"

#include <event2/event.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "now.h"

/* One master's INFO server in flight: where its run id goes. */
typedef struct rgen_part {
    struct rgen *g;
    int pos; /* its place in the identity (masters by first slot) */
} rgen_part;

struct rgen {
    redis_client *c;
    struct event *timer;
    int checking;
    unsigned long checked_connects; /* the connection the last check ran on */
    unsigned long issued_connects;
    char gen[RGEN_RUN_MAX + 32];
    /* the check in flight: one INFO server per master */
    int nparts, replies, failed;
    rgen_part parts[RGEN_MASTERS_MAX];
    char runs[RGEN_MASTERS_MAX][41];
    atomic_int ok;
};

/* "run_id:<hex>" out of an INFO server reply. */
static int rgen_parse_run_id(const char *info, char *run)
{
    const char *p = info ? strstr(info, "run_id:") : NULL;
    size_t n = 0;
    if (!p)
        return 0;
    p += strlen("run_id:");
    while (p[n] && p[n] != '\r' && p[n] != '\n' && n < RGEN_RUN_MAX - 1)
        n++;
    memcpy(run, p, n);
    run[n] = '\0';
    return n > 0;
}

/* The key's value names run (its part before ':'). */
static int rgen_names(const char *gen, const char *run)
{
    size_t n = strlen(run);
    return gen && n > 0 && strncmp(gen, run, n) == 0 && gen[n] == ':';
}

/* The check's verdict, once every master's run id is in (or one failed). */
static void rgen_settle(rgen *g)
{
    char id[RGEN_RUN_MAX];
    size_t n = 0;
    int ok = !g->failed && g->nparts > 0;
    for (int i = 0; ok && i < g->nparts; i++) {
        size_t len = strlen(g->runs[i]);
        if (n + len + 2 > sizeof(id)) {
            ok = 0;
            break;
        }
        if (i)
            id[n++] = ',';
        memcpy(id + n, g->runs[i], len);
        n += len;
    }
    id[n] = '\0';
    ok = ok && rgen_names(g->gen, id);
    g->checking = 0;
    if (ok != atomic_load(&g->ok))
        log_infof(NULL,
                  ((log_field[]){LOG_S("generation", g->gen[0] ? g->gen : "(none)"), LOG_END}),
                  ok ? "rgen: the Redis claim state is current"
                     : "rgen: the Redis claim state is not current (server restarted, failed "
                       "over or not rebuilt yet): claims wait for the rebuild");
    g->checked_connects = g->issued_connects;
    atomic_store(&g->ok, ok);
}

static void rgen_on_info(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    rgen_part *part = arg;
    rgen *g = part->g;
    char run[RGEN_RUN_MAX];
    if (!err && r && r->type == REDIS_REPLY_STRING && rgen_parse_run_id(r->str, run) &&
        strlen(run) < sizeof(g->runs[0]))
        memcpy(g->runs[part->pos], run, strlen(run) + 1);
    else
        g->failed = 1;
    if (++g->replies == g->nparts)
        rgen_settle(g);
}

/* The masters in the order of the first slot each serves (one server: itself). */
static int rgen_masters(redis_client *c, int *order)
{
    int n = 0;
    for (int i = 0; i < redis_client_node_count(c) && n < RGEN_MASTERS_MAX; i++) {
        int first = redis_client_node_first_slot(c, i);
        if (first < 0)
            continue;
        int at = n++;
        while (at > 0 && redis_client_node_first_slot(c, order[at - 1]) > first) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = i;
    }
    return n;
}

static void rgen_on_gen(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    rgen *g = arg;
    int order[RGEN_MASTERS_MAX];
    g->gen[0] = '\0';
    if (!err && r && r->type == REDIS_REPLY_STRING)
        snprintf(g->gen, sizeof(g->gen), "%s", r->str);
    g->nparts = err ? 0 : rgen_masters(c, order);
    g->replies = g->failed = 0;
    if (g->nparts == 0) {
        g->checking = 0;
        atomic_store(&g->ok, 0);
        return;
    }
    for (int i = 0; i < g->nparts; i++) {
        g->parts[i] = (rgen_part){g, i};
        g->runs[i][0] = '\0';
    }
    for (int i = 0; i < g->nparts; i++)
        if (redis_command_node(c, order[i], rgen_on_info, &g->parts[i], "INFO server") != QN_OK) {
            /* the ones sent still answer; this one counts as failed */
            g->failed = 1;
            if (++g->replies == g->nparts)
                rgen_settle(g);
        }
}

static void rgen_check(rgen *g)
{
    if (g->checking || !redis_client_connected(g->c))
        return;
    g->checking = 1;
    g->issued_connects = redis_client_connects(g->c);
    if (redis_command(g->c, rgen_on_gen, g, "GET %s", RGEN_KEY) != QN_OK)
        g->checking = 0;
}

static void rgen_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    rgen_check(arg);
}

rgen *rgen_new(struct event_base *base, redis_client *c, int interval_ms)
{
    rgen *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->c = c;
    struct timeval tv = {interval_ms / 1000, (interval_ms % 1000) * 1000};
    g->timer = event_new(base, -1, EV_PERSIST, rgen_on_timer, g);
    if (!g->timer || event_add(g->timer, &tv) != 0) {
        rgen_free(g);
        return NULL;
    }
    rgen_check(g);
    return g;
}

void rgen_free(rgen *g)
{
    if (!g)
        return;
    if (g->timer)
        event_free(g->timer);
    free(g);
}

int rgen_ok(const rgen *g)
{
    /* A new connection may be to another server (restart, failover): not until checked. */
    return g && atomic_load(&g->ok) && g->checked_connects == redis_client_connects(g->c) &&
           redis_client_connected(g->c);
}

int rgen_ok_any_thread(const rgen *g)
{
    return g && atomic_load(&g->ok);
}

/* ---- synchronous ---- */

qn_status rgen_sync_run_id(redis_sync *rs, char *run)
{
    char one[RGEN_RUN_MAX];
    size_t len = 0;
    int n = redis_sync_node_count(rs);
    if (n <= 0)
        return QN_ERR;
    if (n > RGEN_MASTERS_MAX) {
        log_error(NULL, "rgen: %d masters, more than the %d an identity names", n,
                  RGEN_MASTERS_MAX);
        return QN_ERR;
    }
    /* Node i is the master of the i-th lowest first slot (redis_sync_node_count). */
    for (int i = 0; i < n; i++) {
        redisReply *r = redis_sync_node_command(rs, i, "INFO server");
        int ok = r && r->type == REDIS_REPLY_STRING && rgen_parse_run_id(r->str, one);
        freeReplyObject(r);
        size_t k = ok ? strlen(one) : 0;
        if (!ok || len + k + 2 > RGEN_RUN_MAX)
            return QN_ERR;
        if (i > 0)
            run[len++] = ',';
        memcpy(run + len, one, k + 1);
        len += k;
    }
    return QN_OK;
}

int rgen_sync_current(redis_sync *rs)
{
    char run[RGEN_RUN_MAX];
    if (rgen_sync_run_id(rs, run) != QN_OK)
        return -1;
    redisReply *r = redis_sync_command(rs, "GET %s", RGEN_KEY);
    if (!r)
        return -1;
    int cur = r->type == REDIS_REPLY_STRING && rgen_names(r->str, run);
    freeReplyObject(r);
    return cur;
}

qn_status rgen_sync_mark(redis_sync *rs, const char *run)
{
    char now[RGEN_RUN_MAX];
    if (rgen_sync_run_id(rs, now) != QN_OK || strcmp(now, run) != 0)
        return QN_ERR;
    redisReply *r =
        redis_sync_command(rs, "SET %s %s:%lld", RGEN_KEY, run, (long long)now_wall_ms());
    int ok = r && r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    return ok ? QN_OK : QN_ERR;
}
