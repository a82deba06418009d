/*
 * quan-bench-buckets: a flash sale on one template of N stock buckets, at the Redis layer (the
 * claim script at each user's home bucket, the transfer and the sold-out verdict of bucket.h
 * when a home is dry), for bench/buckets.sh. Reads QUAN_REDIS_CLUSTER_NODES (a cluster) or
 * QUAN_REDIS_HOST / QUAN_REDIS_PORT, and QUAN_LUA_DIR (default lua-scripts).
 *
 *   sale TEMPLATE N STOCK USERS THREADS [SKEW]
 *       writes template TEMPLATE's N bucket hashes (STOCK split, one coupon a user, open for an
 *       hour), then THREADS threads, one connection each, make USERS users (ids from
 *       TEMPLATE * 1000000) claim once each: the claim at the home bucket, and while the home
 *       answers "no stock", a seek (stock moved from another bucket, then the claim again; "in
 *       doubt": again); after the first final "sold out" the rest are refused without asking,
 *       as the engine's copy of a sold-out template refuses them. Prints "accepted A refused R
 * doubts D seconds S", and exits 1 unless every unit was sold (A = min(STOCK, USERS)), every other
 * user was refused once, no units are left or on their way, and no user's count passes the limit.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bucket.h"
#include "claimgate.h"
#include "log.h"
#include "now.h"
#include "redis_sync.h"

#define SALE_THREADS_MAX 64

typedef struct sale {
    int64_t tpl, users;
    int n, threads;
    int skew;   /* percent of users in bucket 0; -1: as hashed */
    int resume; /* the buckets as they are; a user with a coupon counts as served */
    int die_after_give;
    const char *lua;
    int sold_out; /* a final "sold out" was seen: later users are refused here, as the engine's
                     copy of the template refuses them (read and set without a lock: a user who
                     misses it asks Redis, which answers the same) */
} sale;

typedef struct worker {
    sale *s;
    int index;
    int64_t yes, no, doubts, errors, had;
} worker;

/* The i-th user of the sale: ids from tpl * 1000000, skipping ids so that skew percent of the
 * users have their home in bucket 0 and the rest elsewhere. Stateless: a resumed sale names
 * the same users. */
static int64_t sale_user(const sale *s, int64_t i)
{
    int64_t u = s->tpl * 1000000 + i * 1024; /* room for the search below */
    if (s->skew < 0 || s->n < 2)
        return u;
    int want0 = i % 100 < s->skew;
    while ((bucket_home(u, s->n) == 0) != want0)
        u++;
    return u;
}

static redis_sync *connect_redis(void)
{
    const char *nodes = getenv("QUAN_REDIS_CLUSTER_NODES");
    const char *host = getenv("QUAN_REDIS_HOST");
    const char *port = getenv("QUAN_REDIS_PORT");
    return redis_sync_new(&(redis_sync_opts){.host = host && *host ? host : "127.0.0.1",
                                             .port = port && *port ? atoi(port) : 6379,
                                             .cluster_nodes = nodes && *nodes ? nodes : NULL,
                                             .timeout_ms = 5000});
}

static void *sale_worker(void *arg)
{
    worker *w = arg;
    sale *s = w->s;
    redis_sync *rs = connect_redis();
    redis_scripts *scripts = redis_scripts_load_dir(s->lua);
    char xid[64];
    if (!rs || !scripts) {
        w->errors++;
        goto out;
    }
    for (int64_t i = w->index; i < s->users; i += s->threads) {
        int64_t user = sale_user(s, i);
        if (__atomic_load_n(&s->sold_out, __ATOMIC_RELAXED)) {
            w->no++;
            continue;
        }
        for (int attempt = 0;; attempt++) {
            int code = bucket_claim_sync(rs, scripts, s->tpl, s->n, user, "0", "");
            if (code == CLAIMGATE_OK) {
                w->yes++;
                break;
            }
            if (code == CLAIMGATE_LIMIT_REACHED && s->resume) {
                w->had++;
                break;
            }
            if (code == CLAIMGATE_SOLD_OUT && s->die_after_give &&
                __atomic_exchange_n(&s->die_after_give, 0, __ATOMIC_RELAXED)) {
                bucket_look l;
                int home = bucket_home(user, s->n);
                if (bucket_give_sync(rs, scripts, s->tpl, s->n, (home + 1) % s->n, home, 1 << 30,
                                     "dying", &l) == QN_OK &&
                    l.given > 0) {
                    fprintf(stderr, "gave %" PRId64 " units towards bucket %d; dying\n", l.given,
                            home);
                    raise(SIGKILL);
                }
            }
            if ((code != CLAIMGATE_SOLD_OUT && code != CLAIMGATE_STOCK_IN_DOUBT) ||
                attempt > 20000) {
                w->errors++;
                break;
            }
            bucket_verdict_t v;
            snprintf(xid, sizeof(xid), "b%d.%" PRId64 ".%d", w->index, user, attempt);
            if (bucket_seek_sync(rs, scripts, s->tpl, s->n, bucket_home(user, s->n), xid, &v) !=
                QN_OK) {
                w->errors++;
                break;
            }
            if (v == BUCKET_SOLD_OUT) {
                __atomic_store_n(&s->sold_out, 1, __ATOMIC_RELAXED);
                w->no++;
                break;
            }
            if (v == BUCKET_IN_DOUBT) { /* a transfer on its way, a crashed one not yet old */
                w->doubts++;
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
    }
out:
    if (scripts)
        redis_scripts_free(scripts);
    redis_sync_free(rs);
    return NULL;
}

/* A reply's integer or string as a number; def otherwise. */
static int64_t reply_num(const redisReply *r, int64_t def)
{
    if (r && r->type == REDIS_REPLY_INTEGER)
        return r->integer;
    if (r && r->type == REDIS_REPLY_STRING)
        return strtoll(r->str, NULL, 10);
    return def;
}

/* What is left: units in the buckets and on their way, and whether a count passed 1. */
static int sale_check(redis_sync *rs, const sale *s, int64_t *left, int64_t *counted)
{
    int over = 0;
    *left = *counted = 0;
    for (int b = 0; b < s->n; b++) {
        bucket_keys k;
        bucket_keys_of(&k, s->tpl, b, s->n);
        redisReply *r = redis_sync_command(rs, "HGETALL %s", k.hash);
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i + 1 < r->elements; i += 2) {
            const char *f = r->element[i]->str;
            if (strcmp(f, "stock") == 0 || strncmp(f, "xo:", 3) == 0)
                *left += strtoll(r->element[i + 1]->str, NULL, 10);
        }
        if (r)
            freeReplyObject(r);
        r = redis_sync_command(rs, "HVALS %s", k.users);
        for (size_t i = 0; r && r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
            int64_t c = reply_num(r->element[i], 0);
            over |= c > 1;
            *counted += c;
        }
        if (r)
            freeReplyObject(r);
    }
    return over;
}

static int sale_run(sale *s, int64_t stock)
{
    redis_sync *rs = connect_redis();
    int rc = 1;
    if (!rs)
        return 1;
    char start[24], end[24];
    snprintf(start, sizeof(start), "%" PRId64, now_wall_ms() - 60000);
    snprintf(end, sizeof(end), "%" PRId64, now_wall_ms() + 3600000);
    for (int b = 0; b < s->n && !s->resume; b++) {
        bucket_keys k;
        bucket_keys_of(&k, s->tpl, b, s->n);
        redisReply *r = redis_sync_command(rs, "DEL %s", k.hash);
        if (r)
            freeReplyObject(r);
        r = redis_sync_command(rs, "DEL %s", k.users);
        if (r)
            freeReplyObject(r);
        r = redis_sync_command(rs, "DEL %s", k.resv);
        if (r)
            freeReplyObject(r);
        r = redis_sync_command(rs,
                               "HSET %s stock %" PRId64 " status 0 validStartTime %s "
                               "validEndTime %s shopNumber 1 limitPerPerson 1 validityHours 24 "
                               "buckets %d",
                               k.hash, bucket_share(stock, b, s->n), start, end, s->n);
        int ok = r && r->type == REDIS_REPLY_INTEGER;
        if (r)
            freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "cannot write bucket %d: %s\n", b, redis_sync_errstr(rs));
            goto out;
        }
    }
    pthread_t th[SALE_THREADS_MAX];
    worker w[SALE_THREADS_MAX];
    int64_t t0 = now_mono_ms();
    for (int i = 0; i < s->threads; i++) {
        w[i] = (worker){.s = s, .index = i};
        if (pthread_create(&th[i], NULL, sale_worker, &w[i]) != 0) {
            fprintf(stderr, "cannot start a thread\n");
            exit(1);
        }
    }
    int64_t yes = 0, no = 0, doubts = 0, errors = 0, had = 0;
    for (int i = 0; i < s->threads; i++) {
        pthread_join(th[i], NULL);
        yes += w[i].yes, no += w[i].no, doubts += w[i].doubts, errors += w[i].errors;
        had += w[i].had;
    }
    double secs = (double)(now_mono_ms() - t0) / 1e3;
    int64_t left, counted;
    int over = sale_check(rs, s, &left, &counted);
    int64_t want = stock < s->users ? stock : s->users;
    printf("accepted %" PRId64 " refused %" PRId64 " doubts %" PRId64 " seconds %.3f\n", yes, no,
           doubts, secs);
    rc = 0;
    if (errors) {
        fprintf(stderr, "%" PRId64 " claims failed\n", errors), rc = 1;
    }
    int wrong = counted != want || over || (s->users >= stock && left != 0);
    if (s->resume)
        wrong |= yes + had != want || no != s->users - want;
    else
        wrong |= yes != want || no != s->users - want;
    if (wrong) {
        fprintf(stderr,
                "wrong sale: accepted %" PRId64 " (had before %" PRId64 ", want %" PRId64
                "), refused %" PRId64 ", counted %" PRId64 ", left %" PRId64
                ", a user over the limit: %d\n",
                yes, had, want, no, counted, left, over);
        rc = 1;
    }
out:
    redis_sync_free(rs);
    return rc;
}

int main(int argc, char **argv)
{
    log_init("quan-bench-buckets", LOGL_WARN);
    int resume = argc >= 2 && strcmp(argv[1], "resume") == 0;
    if ((argc == 7 || argc == 8) && (resume || strcmp(argv[1], "sale") == 0)) {
        const char *lua = getenv("QUAN_LUA_DIR");
        const char *die = getenv("QUAN_BENCH_BUCKETS_DIE_AFTER_GIVE");
        sale s = {.tpl = strtoll(argv[2], NULL, 10),
                  .n = atoi(argv[3]),
                  .users = strtoll(argv[5], NULL, 10),
                  .threads = atoi(argv[6]),
                  .skew = argc == 8 ? atoi(argv[7]) : -1,
                  .resume = resume,
                  .die_after_give = die && strcmp(die, "1") == 0,
                  .lua = lua && *lua ? lua : "lua-scripts"};
        int64_t stock = strtoll(argv[4], NULL, 10);
        if (s.tpl < 1 || s.n < 1 || s.n > BUCKET_MAX || stock < 0 || s.users < 1 || s.threads < 1 ||
            s.threads > SALE_THREADS_MAX || s.skew > 100) {
            fprintf(stderr,
                    "%s: TEMPLATE >= 1, N 1..%d, STOCK >= 0, USERS >= 1, THREADS 1..%d, "
                    "SKEW 0..100\n",
                    argv[1], BUCKET_MAX, SALE_THREADS_MAX);
            return 2;
        }
        return sale_run(&s, stock);
    }
    fprintf(stderr,
            "usage: quan-bench-buckets sale|resume TEMPLATE N STOCK USERS THREADS [SKEW]\n");
    return 2;
}
