#include "ids.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "lock.h"
#include "now.h"

#define IDS_TS_MAX ((1LL << 41) - 1)

struct ids_gen {
    pthread_mutex_t mu;
    int worker;
    int64_t last_ms; /* logical clock, ms since IDS_EPOCH_MS; -1 before the first id */
    int seq;         /* last sequence issued at last_ms */
    int64_t deadline_ms;
    int64_t (*clock_fn)(void *arg);
    void *clock_arg;
};

static int64_t ids_real_clock(void *arg)
{
    (void)arg;
    return now_wall_ms();
}

ids_gen *ids_new(int worker_id)
{
    if (worker_id < 0 || worker_id > IDS_MAX_WORKER)
        return NULL;
    ids_gen *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    if (pthread_mutex_init(&g->mu, NULL) != 0) {
        free(g);
        return NULL;
    }
    g->worker = worker_id;
    g->last_ms = -1;
    g->clock_fn = ids_real_clock;
    return g;
}

void ids_free(ids_gen *g)
{
    if (!g)
        return;
    pthread_mutex_destroy(&g->mu);
    free(g);
}

int ids_worker(const ids_gen *g)
{
    ids_gen *m = (ids_gen *)g; /* the mutex only: nothing is changed */
    pthread_mutex_lock(&m->mu);
    int w = m->worker;
    pthread_mutex_unlock(&m->mu);
    return w;
}

qn_status ids_set_worker(ids_gen *g, int worker_id)
{
    if (worker_id < 0 || worker_id > IDS_MAX_WORKER)
        return QN_EINVAL;
    pthread_mutex_lock(&g->mu);
    g->worker = worker_id;
    pthread_mutex_unlock(&g->mu);
    return QN_OK;
}

bool ids_leased(ids_gen *g)
{
    pthread_mutex_lock(&g->mu);
    bool ok = !g->deadline_ms || g->clock_fn(g->clock_arg) <= g->deadline_ms;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void ids_set_lease_deadline(ids_gen *g, int64_t deadline_wall_ms)
{
    pthread_mutex_lock(&g->mu);
    g->deadline_ms = deadline_wall_ms;
    pthread_mutex_unlock(&g->mu);
}

void ids_set_clock(ids_gen *g, int64_t (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&g->mu);
    g->clock_fn = fn ? fn : ids_real_clock;
    g->clock_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&g->mu);
}

qn_status ids_next(ids_gen *g, int64_t *out)
{
    qn_status st = QN_OK;
    pthread_mutex_lock(&g->mu);

    int64_t wall = g->clock_fn(g->clock_arg);
    if (g->deadline_ms && wall > g->deadline_ms) {
        st = QN_EAGAIN; /* the lease may have expired: another process may own our worker id */
        goto done;
    }
    int64_t now = wall - IDS_EPOCH_MS;
    if (now < 0 || now > IDS_TS_MAX) {
        st = QN_ERR;
        goto done;
    }

    int64_t ts;
    int seq;
    if (now > g->last_ms) {
        ts = now;
        seq = 0;
    } else if (g->last_ms - now > IDS_MAX_AHEAD_MS) {
        /* the clock went back too far: never issue more than IDS_MAX_AHEAD_MS ahead */
        st = QN_EAGAIN;
        goto done;
    } else if (g->seq < IDS_MAX_SEQ) {
        /* same millisecond, or the clock went back a little: continue on the logical clock */
        ts = g->last_ms;
        seq = g->seq + 1;
    } else {
        if (now == g->last_ms) {
            /* 4096 ids in this millisecond: wait for the next one (about 1 ms at most). The
             * bound only matters for a frozen clock; then we borrow like below. */
            for (int spin = 0; spin < 200000 && now == g->last_ms; spin++) {
                wall = g->clock_fn(g->clock_arg);
                now = wall - IDS_EPOCH_MS;
            }
        }
        if (now > g->last_ms) {
            ts = now;
            seq = 0;
        } else {
            /* behind the logical clock and out of sequence: borrow one ms, bounded */
            if (g->last_ms + 1 - now > IDS_MAX_AHEAD_MS) {
                st = QN_EAGAIN;
                goto done;
            }
            ts = g->last_ms + 1;
            seq = 0;
        }
    }
    if (ts > IDS_TS_MAX) {
        st = QN_ERR;
        goto done;
    }
    g->last_ms = ts;
    g->seq = seq;
    *out = (int64_t)(((uint64_t)ts << (IDS_WORKER_BITS + IDS_SEQ_BITS)) |
                     ((uint64_t)g->worker << IDS_SEQ_BITS) | (uint64_t)seq);
done:
    pthread_mutex_unlock(&g->mu);
    return st;
}

int64_t ids_time_ms(int64_t id)
{
    return (int64_t)((uint64_t)id >> (IDS_WORKER_BITS + IDS_SEQ_BITS)) + IDS_EPOCH_MS;
}

int ids_worker_of(int64_t id)
{
    return (int)(((uint64_t)id >> IDS_SEQ_BITS) & IDS_MAX_WORKER);
}

int ids_seq_of(int64_t id)
{
    return (int)((uint64_t)id & IDS_MAX_SEQ);
}

/* ---------------------------------------------------------------- worker leases */

/* The lease's owner token is a lock owner token (the lease is a lock on a worker id); the
 * first worker id to try comes from its own random draw. */
_Static_assert(IDS_TOKEN_LEN == LOCK_TOKEN_LEN, "a lease token is a lock token");
static qn_status ids_random_token(char token[IDS_TOKEN_LEN], uint32_t *start)
{
    if (lock_token_new(token) != QN_OK)
        return QN_ERR;
    if (getrandom(start, sizeof(*start), 0) != (ssize_t)sizeof(*start))
        return QN_ERR;
    return QN_OK;
}

qn_status ids_claim_token(char token[IDS_TOKEN_LEN], int *first_worker)
{
    uint32_t start;
    if (ids_random_token(token, &start) != QN_OK)
        return QN_ERR;
    *first_worker = (int)(start % (IDS_MAX_WORKER + 1));
    return QN_OK;
}

static void ids_key(char *buf, size_t cap, const char *prefix, int worker)
{
    snprintf(buf, cap, "%s%d", prefix ? prefix : IDS_DEFAULT_PREFIX, worker);
}

qn_status ids_worker_claim_sync(redis_sync *rs, const char *prefix, int64_t ttl_ms, int *out_worker,
                                char token[IDS_TOKEN_LEN])
{
    char key[256];
    char tok[IDS_TOKEN_LEN];
    uint32_t start;
    qn_status st = QN_EBUSY;

    if (!rs)
        return QN_ERR;
    if (ttl_ms <= 0)
        ttl_ms = IDS_LEASE_TTL_MS;
    if (ids_random_token(tok, &start) != QN_OK)
        return QN_ERR;
    /* A random start spreads replicas that start together over different ids, so most claims
     * succeed on the first SET. */
    for (int i = 0; i <= IDS_MAX_WORKER; i++) {
        int n = (int)((start + (uint32_t)i) % (IDS_MAX_WORKER + 1));
        ids_key(key, sizeof(key), prefix, n);
        redisReply *r = redis_sync_command(rs, "SET %s %s NX PX %lld", key, tok, (long long)ttl_ms);
        if (!r)
            return QN_ERR;
        if (r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0) {
            *out_worker = n;
            memcpy(token, tok, IDS_TOKEN_LEN);
            st = QN_OK;
        } else if (r->type != REDIS_REPLY_NIL) {
            st = QN_ERR;
        }
        freeReplyObject(r);
        if (st != QN_EBUSY)
            return st;
    }
    return QN_EBUSY;
}

/* A lease is a lock on the worker id: renewed by the lock's own compare-and-PEXPIRE. */
static qn_status ids_cas_pexpire(redis_sync *rs, const redis_scripts *scripts, const char *prefix,
                                 int worker, const char *token, int64_t ttl_ms)
{
    char key[256], ttl[24];
    qn_status st;
    if (!rs || !scripts || !token || worker < 0 || worker > IDS_MAX_WORKER)
        return QN_ERR;
    ids_key(key, sizeof(key), prefix, worker);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    const char *keys[] = {key}, *args[] = {token, ttl};
    redisReply *r = REDIS_SYNC_SCRIPT(rs, scripts, lock_renew, keys, args);
    if (!r)
        return QN_ERR;
    if (r->type == REDIS_REPLY_INTEGER)
        st = r->integer == 1 ? QN_OK : QN_ECONFLICT;
    else
        st = QN_ERR;
    freeReplyObject(r);
    return st;
}

qn_status ids_worker_renew_sync(redis_sync *rs, const redis_scripts *scripts, const char *prefix,
                                int worker, const char *token, int64_t ttl_ms)
{
    return ids_cas_pexpire(rs, scripts, prefix, worker, token,
                           ttl_ms > 0 ? ttl_ms : IDS_LEASE_TTL_MS);
}

qn_status ids_worker_release_sync(redis_sync *rs, const redis_scripts *scripts, const char *prefix,
                                  int worker, const char *token)
{
    return ids_cas_pexpire(rs, scripts, prefix, worker, token, IDS_RELEASE_HOLD_MS);
}
