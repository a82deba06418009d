/* The batching engine.redeem consumer (claimq.h). */
#include "claimq.h"

#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bucket.h"
#include "claimdb.h"
#include "claimstep.h"
#include "events.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "now.h"
#include "outbox.h"
#include "pgparam.h"
#include "redis.h"
#include "redis_scripts.h"
#include "redis_sync.h"
#include "restore.h"
#include "resv.h"
#include "ucoupon.h"

METRICS_DEFINE(CLAIMQ_METRICS)

#define CQ_GUARD_RUN_MS  60000   /* CONSUMING: a batch takes far less */
#define CQ_GUARD_DONE_MS 3600000 /* CONSUMED */
#define CQ_FILL_WAIT_MS  2       /* a batch takes what arrives within this, up to its size */
#define CQ_RCVBUF_BYTES  (16 << 20)

/* How long a batch waits for the restore epoch to be read before it goes back (restore.h). */
#define CQ_RESTORE_WAIT_MS 3000
/* CQ_STALE: a /redeem-mq claim accepted under an earlier restore epoch (dead-lettered). */
enum { CQ_MALFORMED = 0, CQ_CLAIM, CQ_STALE };

/* One claim of a delivery. */

/* The queue of claims accepted by /redeem-mq and of the checks of synchronous claims. */
static const service_consumer cq_consumers[] = {
    {"engine.redeem", (const char *const[]){EVENT_COUPON_REDEEM, NULL}, NULL},
    {0},
};

typedef struct cq_settings {
    int64_t claim_batch;     /* claims written in one transaction */
    int64_t claim_consumers; /* consumer threads (0: this replica writes none) */
} cq_settings;

static cq_settings cq_cfg;

typedef struct cq_msg {
    size_t delivery; /* index in the batch's deliveries */
    int redelivered;
    int kind;
    int run;     /* passed its delivery's guard: process */
    int done;    /* the guard said CONSUMED, or an in-batch duplicate: ack only */
    int requeue; /* someone else holds its delivery, or a later attempt (cq_mark_duplicates):
                    its delivery goes back to the queue at once */
    char key[CLAIMQ_ATTEMPT_KEY];
    claimdb_item item; /* CQ_CLAIM */
} cq_msg;

/* One delivery of a batch, its claims msgs[first, first + n). The consume guard goes by
 * delivery, not by claim: its two SETs cost about 4 us of Redis per claim, a quarter of Redis'
 * CPU per drained claim, and a pack holds a couple of dozen claims. */
typedef struct cq_del {
    size_t first, n;
    int redelivered;
    int asked; /* it held a claim to decide: the guard was asked */
    int run;   /* the guard let it run: its key ends CONSUMED or deleted (cq_guard_end_append) */
    char guard[CLAIMQ_ATTEMPT_KEY]; /* its claim's attempt key, or a pack's claimq_pack_key */
} cq_del;

/* Settings shared by the workers; read-only once they run. */
typedef struct claimq {
    const service *svc;     /* its relays wake at the commit of a pack's claim checks */
    const restore *restore; /* batches wait while a restore waits for quan-recover */
    log_limit restore_log;
    char *dsn[2], *lua_dir;
    int stmt_timeout_ms;
    int batch;
    /* While a database is down every batch fails (and comes back): told once a second per
     * database, not once per batch and worker. */
    log_limit failed_log[2];
    int nworkers;
    struct cq_worker *workers;
} claimq;

/* One batch consumer (its own thread and RabbitMQ connections, mq_consumer.h) with its own
 * PostgreSQL and Redis connections: batches of the workers overlap (one in the database while
 * another receives), and the broker spreads deliveries between them. */
typedef struct cq_worker {
    claimq *q;
    int id;
    redis_scripts *scripts;
    mq_consumer *consumer;
    pgpool_conn *pg[2];
    redis_sync *redis;
    cq_msg *msgs; /* batch + MQ_ENVELOPE_PACK_MAX claims */
    cq_del *dels; /* as many deliveries */
} cq_worker;

/* ---- connections ---- */

/* PostgreSQL and Redis, on the consumer's thread; RabbitMQ is the consumer's own. */
static qn_status cq_connect(cq_worker *w)
{
    if (redis_sync_open(w->redis) != QN_OK)
        return QN_ERR;
    for (int i = 0; i < 2; i++) {
        if (!w->pg[i]) {
            char name[16];
            snprintf(name, sizeof(name), "ds_%d", i);
            pgpool_opts po = {.dsn = w->q->dsn[i],
                              .name = name,
                              .application_name = "quan-engine claimq",
                              .statement_timeout_ms = w->q->stmt_timeout_ms};
            service_pg_commit_hook(w->q->svc, i, &po);
            if (!(w->pg[i] = pgpool_conn_open(&po)))
                return QN_ENOMEM;
        }
        if (pgpool_conn_ensure(w->pg[i]) != QN_OK)
            return QN_ERR;
    }
    return QN_OK;
}

/* ---- parsing ---- */

static int64_t cq_i64(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    int64_t n;
    if (cJSON_IsString(v)) /* the whole text a number, or 0 (which no claim accepts) */
        return jsonin_int64_text(v->valuestring, &n) == QN_OK ? n : 0;
    /* A number past int64 (1e300 in a malformed message) would make the cast undefined: it
     * reads as 0, which no claim accepts. 2^63 is exactly representable. */
    if (cJSON_IsNumber(v) && v->valuedouble >= -9223372036854775808.0 &&
        v->valuedouble < 9223372036854775808.0)
        return (int64_t)v->valuedouble;
    return 0;
}

int claimq_claim_parse(const cJSON *data, claimdb_item *it)
{
    memset(it, 0, sizeof(*it));
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(data, "kind");
    const char *k = cJSON_IsString(kind) ? kind->valuestring : "claim";
    if (strcmp(k, "claim") != 0)
        return 0;
    ucoupon *u = &it->c;
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(data, "requestId");
    u->id = cq_i64(data, "userCouponId");
    u->user_id = cq_i64(data, "userId");
    u->template_id = cq_i64(data, "couponTemplateId");
    u->shop_number = cq_i64(data, "shopNumber");
    u->source = (int)cq_i64(data, "source");
    u->receive_count = (int)cq_i64(data, "receiveCount");
    u->receive_time_ms = cq_i64(data, "receiveTime");
    u->valid_start_ms = u->receive_time_ms;
    u->valid_end_ms = cq_i64(data, "validEndTime");
    u->status = UCOUPON_UNUSED;
    if (cJSON_IsString(rid))
        snprintf(u->request_id, sizeof(u->request_id), "%s", rid->valuestring);
    it->check = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(data, "check"));
    it->epoch = cq_i64(data, "epoch");
    /* the reservation's bucket (bucket.h); none said: bucket 0 of 1, as before buckets */
    int64_t bkt = cq_i64(data, "bucket"), nbkt = cq_i64(data, "buckets");
    if (cJSON_GetObjectItemCaseSensitive(data, "buckets")) {
        if (nbkt < 1 || nbkt > BUCKET_MAX || bkt < 0 || bkt >= nbkt)
            return 0;
        it->bkt = (int)bkt;
        it->nbkt = (int)nbkt;
    }
    /* A check completes a /redeem whose request died after the stock's commit. */
    u->channel = it->check ? UCOUPON_CH_CLAIM : UCOUPON_CH_MQ;
    if (u->id > 0 && u->user_id > 0 && u->template_id > 0 && u->shop_number > 0 &&
        u->receive_count >= 1 && u->request_id[0] && strchr(u->request_id, '"') == NULL &&
        strchr(u->request_id, '\\') == NULL) {
        claimdb_route(it);
        return 1;
    }
    return 0;
}

/* The guard's key names one attempt of a claim: its reservation's time with the request id. A
 * retry with the same request id after its first attempt was given up is another claim (the
 * message of the given-up attempt, delivered late, must not make the guard drop the retry's). */
static void cq_parse(cq_msg *m, const mq_envelope *env)
{
    m->kind = claimq_claim_parse(env->data, &m->item) ? CQ_CLAIM : CQ_MALFORMED;
    if (m->kind == CQ_CLAIM)
        claimq_attempt_key(m->key, sizeof(m->key), &m->item.c, m->item.check);
    else
        snprintf(m->key, sizeof(m->key), "%s", env->key);
}

/* ---- Redis, pipelined ---- */

/* 1 when delivery d holds a claim for the guard to decide: readable, neither an in-batch
 * duplicate nor a later attempt going back (cq_mark_duplicates). */
static int cq_del_open(const cq_msg *ms, const cq_del *d)
{
    for (size_t i = d->first; i < d->first + d->n; i++)
        if (ms[i].kind == CQ_CLAIM && !ms[i].done && !ms[i].requeue)
            return 1;
    return 0;
}

/* 1 when a claim of delivery d goes back to the queue, and with it the whole delivery. */
static int cq_del_requeued(const cq_msg *ms, const cq_del *d)
{
    for (size_t i = d->first; i < d->first + d->n; i++)
        if (ms[i].requeue)
            return 1;
    return 0;
}

/* The guard's verdict on delivery d, for every claim of it. CONSUMED is given only to a
 * delivery acked whole (cq_guard_end_append): all of it was written, a later attempt in it
 * included, so nothing of it goes back. */
static void cq_del_verdict(cq_msg *ms, cq_del *d, const redisReply *r)
{
    int done = r->type == REDIS_REPLY_STRING && !strcmp(r->str, "1");
    /* Someone holds it: it is ours only once the broker gave it back (holder died); the
     * database keys make a concurrent run harmless anyway. */
    d->run = r->type == REDIS_REPLY_NIL || (!done && d->redelivered);
    for (size_t i = d->first; i < d->first + d->n; i++) {
        cq_msg *m = &ms[i];
        if (m->kind != CQ_CLAIM)
            continue;
        if (done) {
            m->done = 1;
            m->requeue = 0;
        } else if (!m->done && !m->requeue) {
            m->run = d->run;
            m->requeue = !d->run;
        }
    }
}

/* Sets run/done/requeue of every claim from its delivery's consume guard. QN_ERR when Redis
 * failed. */
static qn_status cq_guard_begin(cq_worker *w, cq_msg *ms, cq_del *ds, size_t nd)
{
    char key[KEYS_LEN];
    for (size_t d = 0; d < nd; d++) {
        if (!(ds[d].asked = cq_del_open(ms, &ds[d])))
            continue;
        keys_redeem_guard(key, ds[d].guard);
        redis_sync_append(w->redis, "SET %s 0 NX GET PX %d", key, CQ_GUARD_RUN_MS);
    }
    qn_status st = QN_OK;
    for (size_t d = 0; d < nd; d++) {
        if (!ds[d].asked)
            continue;
        redisReply *r = NULL;
        if (redis_sync_get_reply(w->redis, &r) != QN_OK) {
            st = QN_ERR;
            break;
        }
        if (r->type == REDIS_REPLY_NIL || r->type == REDIS_REPLY_STRING)
            cq_del_verdict(ms, &ds[d], r);
        else
            st = QN_ERR;
        freeReplyObject(r);
        if (st != QN_OK)
            break;
    }
    if (st != QN_OK)
        redis_sync_discard(w->redis); /* the rest, read so the next command gets its own */
    return st;
}

/* Checks run only: a check whose claim marker is gone from Redis had its reservation given
 * back (by the request that failed), so its claim must not be completed: it becomes a probe. */
static qn_status cq_markers(cq_worker *w, cq_msg *ms, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ms[i].run && ms[i].kind == CQ_CLAIM && ms[i].item.check) {
            const claimdb_item *it = &ms[i].item;
            resv_keys k;
            resv_keys_of(&k, it->c.template_id, it->bkt, it->nbkt, it->c.user_id, it->c.request_id);
            redis_sync_append(w->redis, "HEXISTS %s %s", k.users, k.member);
        }
    for (size_t i = 0; i < n && redis_sync_pending(w->redis); i++) {
        if (!(ms[i].run && ms[i].kind == CQ_CLAIM && ms[i].item.check))
            continue;
        redisReply *r = NULL;
        int ok = redis_sync_get_reply(w->redis, &r) == QN_OK && r->type == REDIS_REPLY_INTEGER;
        ms[i].item.probe = ok && r->integer == 0;
        freeReplyObject(r);
        if (!ok) {
            redis_sync_discard(w->redis);
            return QN_ERR;
        }
    }
    return QN_OK;
}

/* Appends the guard's end for every delivery run: CONSUMED only when it is acked whole; a
 * delivery going back (a later attempt in it) must find its key gone, or its requeued claims
 * would be skipped on their return and lost. */
static void cq_guard_end_append(cq_worker *w, const cq_msg *ms, const cq_del *ds, size_t nd,
                                int commit)
{
    char key[KEYS_LEN];
    for (size_t d = 0; d < nd; d++) {
        if (!ds[d].run)
            continue;
        keys_redeem_guard(key, ds[d].guard);
        if (commit && !cq_del_requeued(ms, &ds[d]))
            redis_sync_append(w->redis, "SET %s 1 PX %d", key, CQ_GUARD_DONE_MS);
        else
            redis_sync_append(w->redis, "DEL %s", key);
    }
}

static void cq_guard_end(cq_worker *w, const cq_msg *ms, const cq_del *ds, size_t nd, int commit)
{
    cq_guard_end_append(w, ms, ds, nd, commit);
    redis_sync_discard(w->redis);
}

/* ---- database ---- */

typedef qn_status (*cq_step)(pgpool_conn *, int, claimdb_item *, size_t);

/* 1 when step has something to do in database ds (else it would only cost round trips). */
static int cq_step_needed(cq_step fn, int ds, const claimdb_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const claimdb_item *it = &items[i];
        if ((fn == claimdb_take_stock || fn == claimdb_take_stock_new) &&
            it->state == CLAIMDB_PENDING && it->tpl_ds == ds)
            return 1;
        /* user_ds first: the two databases' inserts run on two threads over one array, each
         * touching only its own items. */
        if ((fn == claimdb_insert_coupons || fn == claimdb_insert_coupons_new) &&
            it->user_ds == ds && it->state == CLAIMDB_PENDING)
            return 1;
        if (fn == claimdb_find_coupons && it->user_ds == ds && it->state == CLAIMDB_PENDING &&
            it->probe)
            return 1;
        if (fn == claimdb_give_back &&
            (it->state == CLAIMDB_REFUSED_SLOT || it->state == CLAIMDB_FAILED) &&
            it->tpl_ds == ds && !it->returned)
            return 1;
    }
    return 0;
}

/* Runs the steps that have work in one transaction of ds; no transaction when none has.
 * QN_ECONFLICT (rolled back, not logged) when a claimdb_*_new step found a row written. */
static qn_status cq_tx(cq_worker *w, int ds, cq_step fn, cq_step fn2, cq_step fn3,
                       claimdb_item *items, size_t n)
{
    pgpool_conn *c = w->pg[ds];
    cq_step steps[3] = {fn, fn2, fn3};
    int open = 0;
    qn_status st = QN_ERR;
    for (int k = 0; k < 3; k++) {
        if (!steps[k] || !cq_step_needed(steps[k], ds, items, n))
            continue;
        /* Coupons first in the transaction: one INSERT statement (atomic by itself) plus a
         * read, so no BEGIN/COMMIT round trips. A give-back it makes necessary runs in its own
         * transaction below; every step is idempotent, so a crash in between ends the same. */
        if (!open &&
            (steps[k] == claimdb_insert_coupons || steps[k] == claimdb_insert_coupons_new)) {
            if ((st = steps[k](c, ds, items, n)) != QN_OK)
                goto fail;
            continue;
        }
        st = QN_ERR;
        if (!open && pgpool_begin(c) != QN_OK)
            goto fail;
        open = 1;
        if ((st = steps[k](c, ds, items, n)) != QN_OK)
            goto fail;
    }
    st = QN_ERR;
    if (open && pgpool_commit(c) != QN_OK)
        goto fail;
    return QN_OK;
fail:
    if (st != QN_ECONFLICT)
        log_warn_limited(
            &w->q->failed_log[ds], NULL,
            ((log_field[]){LOG_I("ds", ds), LOG_S("error", pgpool_conn_error(c)), LOG_END}),
            "claimq: batch transaction failed");
    (void)pgpool_rollback(c);
    return st == QN_ECONFLICT ? st : QN_ERR;
}

/* Step fresh (a claimdb_*_new) when the batch looks new (cq_fresh), then, if it found a row
 * written already (rolled back, nothing decided), or else at once, the ordinary step. */
static qn_status cq_tx_fresh(cq_worker *w, int ds, int fresh, cq_step fast, cq_step slow,
                             claimdb_item *items, size_t n)
{
    if (fresh) {
        qn_status st = cq_tx(w, ds, fast, NULL, NULL, items, n);
        if (st != QN_ECONFLICT)
            return st;
        log_at(LOGL_DEBUG, NULL, ((log_field[]){LOG_I("ds", ds), LOG_END}),
               "claimq: a row of the batch exists; writing it the careful way");
    }
    return cq_tx(w, ds, slow, NULL, NULL, items, n) == QN_OK ? QN_OK : QN_ERR;
}

/* 1 when every claim to write is a first delivery and none is a check (a check's coupon was
 * usually written by its request): their rows most likely exist nowhere yet. */
static int cq_fresh(const cq_msg *ms, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ms[i].run && ms[i].kind == CQ_CLAIM && (ms[i].redelivered || ms[i].item.check))
            return 0;
    return 1;
}

/* Redelivered claims already recorded as FAILED skip the database (their stock was given back
 * and must not be taken again). Only redelivered ones: a claim is published in one message
 * (an unconfirmed publish is settled in the database, claim.c, not repeated), so a first
 * delivery holds none, and looking every pack's claims up would cost PostgreSQL a read per
 * claim. A publisher that repeated claims in other packs would need them looked up too.
 * A failure is decided again as it was: refused, its give-back in Redis is this batch's (an
 * earlier delivery may have died before it); given up (VOID), it is whoever gave it up's, and
 * the claim's marker may be a retry's by now, which a give-back here would take from it. */
static qn_status cq_known_failures(cq_worker *w, cq_msg *ms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ms[i].run || ms[i].kind != CQ_CLAIM || !ms[i].redelivered)
            continue;
        pgparam p = {0};
        pgparam_i64(&p, ms[i].item.c.user_id);
        pgparam_str(&p, ms[i].item.c.request_id);
        pgparam_i64(&p, ms[i].item.c.receive_time_ms);
        pgparam_str(&p, claimdb_state_reason(CLAIMDB_VOID));
        /* this attempt's failure: an earlier attempt's (given up, then retried) is not */
        PGresult *r = pgpool_exec(
            w->pg[0],
            "SELECT reason IS NOT DISTINCT FROM $4 FROM t_claim_result WHERE user_id = $1 AND "
            "request_id = $2 AND status = " CLAIMDB_RESULT_TEXT(FAILED) " AND (resv_ms IS NULL OR "
                                                                        "resv_ms = $3)",
            p.n, p.v);
        if (!r)
            return QN_ERR;
        if (PQntuples(r) == 1)
            claimdb_set(&ms[i].item,
                        PQgetvalue(r, 0, 0)[0] == 't' ? CLAIMDB_VOID : CLAIMDB_REFUSED_STOCK);
        PQclear(r);
    }
    return QN_OK;
}

/* What each claim's database outcome leaves its batch to do (claimstep.h, CLAIM_DRAIN): into
 * the wallet, its record ended, its marker gone, given back, its exchange code released. After
 * cq_dup_status: a coupon found written goes into the wallet only while unused. */
static void cq_decide(const claimdb_item *items, size_t m, claim_course *cs)
{
    for (size_t i = 0; i < m; i++) {
        claim_outcome o = {.st = QN_OK, .db = items[i].state};
        claimstep_begin(&cs[i], CLAIM_DRAIN);
        cs[i].check = items[i].check;
        cs[i].coupon_unused = items[i].c.status == UCOUPON_UNUSED;
        /* only checks carry an exchange redemption's request id ("excode:<code>") */
        cs[i].exchange =
            !strncmp(items[i].c.request_id, CLAIMQ_EXCODE_PREFIX, strlen(CLAIMQ_EXCODE_PREFIX));
        claimstep_next(&cs[i], &o);
    }
}

/* An exchange redemption whose claim did not become a coupon in the end: its code is usable
 * again. */
static qn_status cq_release_codes(cq_worker *w, const claimdb_item *items, const claim_course *cs,
                                  size_t m)
{
    for (size_t i = 0; i < m; i++) {
        const ucoupon *u = &items[i].c;
        if (!cs[i].release_code)
            continue;
        const char *code = u->request_id + strlen(CLAIMQ_EXCODE_PREFIX);
        int freed = 0;
        if (claimdb_free_code(w->pg[0], code, u, &freed) != QN_OK)
            return QN_ERR;
        if (!freed) /* already free: an earlier delivery of this check released it */
            continue;
        log_warnf(NULL, ((log_field[]){LOG_I("user", u->user_id), LOG_END}),
                  "claimq: an interrupted exchange did not complete; its code is usable again");
    }
    return QN_OK;
}

/* A coupon found already written (DUP) goes back to the wallet only while unused: it may have
 * been locked or used since. c.status gets the database's status. */
static qn_status cq_dup_status(cq_worker *w, claimdb_item *items, size_t m)
{
    for (size_t i = 0; i < m; i++) {
        ucoupon *u = &items[i].c;
        if (items[i].state != CLAIMDB_DUP)
            continue;
        ucoupon now;
        qn_status st = ucoupon_load(w->pg[items[i].user_ds], u->user_id, u->id, &now);
        if (st != QN_OK && st != QN_ENOTFOUND)
            return st;
        u->status = st == QN_OK ? now.status : -1;
    }
    return QN_OK;
}

typedef struct cq_ins {
    cq_worker *w;
    int fresh;
    claimdb_item *items;
    size_t n;
    qn_status st;
} cq_ins;

static qn_status cq_insert(cq_worker *w, int ds, int fresh, claimdb_item *items, size_t n)
{
    return cq_tx_fresh(w, ds, fresh, claimdb_insert_coupons_new, claimdb_insert_coupons, items, n);
}

static void *cq_insert_ds1(void *arg)
{
    cq_ins *a = arg;
    a->st = cq_insert(a->w, 1, a->fresh, a->items, a->n);
    return NULL;
}

/* Step 2 in both databases, in parallel when both have coupons to write. */
static qn_status cq_insert_both(cq_worker *w, int fresh, claimdb_item *items, size_t n)
{
    int both = cq_step_needed(claimdb_insert_coupons, 0, items, n) &&
               cq_step_needed(claimdb_insert_coupons, 1, items, n);
    cq_ins a = {w, fresh, items, n, QN_ERR};
    pthread_t th;
    if (!both || pthread_create(&th, NULL, cq_insert_ds1, &a) != 0) {
        if (cq_insert(w, 0, fresh, items, n) != QN_OK || cq_insert(w, 1, fresh, items, n) != QN_OK)
            return QN_ERR;
        return QN_OK;
    }
    qn_status st = cq_insert(w, 0, fresh, items, n);
    pthread_join(th, NULL);
    return st == QN_OK && a.st == QN_OK ? QN_OK : QN_ERR;
}

static qn_status cq_claims(cq_worker *w, cq_msg *ms, size_t n, claimdb_item *items,
                           claim_course *cs, size_t *idx, size_t *ni)
{
    size_t m = 0;
    int fresh = cq_fresh(ms, n);
    for (size_t i = 0; i < n; i++)
        if (ms[i].run && ms[i].kind == CQ_CLAIM) {
            idx[m] = i;
            items[m++] = ms[i].item;
        }
    *ni = m;
    if (m == 0)
        return QN_OK;
    /* Stock first everywhere, then coupons: a coupon never exists without its stock taken.
     * The coupons of the two databases are written at the same time (each one autocommit
     * statement), then the give-backs they made necessary. */
    if (cq_tx_fresh(w, 0, fresh, claimdb_take_stock_new, claimdb_take_stock, items, m) != QN_OK ||
        cq_tx_fresh(w, 1, fresh, claimdb_take_stock_new, claimdb_take_stock, items, m) != QN_OK ||
        cq_insert_both(w, fresh, items, m) != QN_OK ||
        cq_tx(w, 0, claimdb_find_coupons, NULL, NULL, items, m) != QN_OK ||
        cq_tx(w, 1, claimdb_find_coupons, NULL, NULL, items, m) != QN_OK ||
        cq_tx(w, 0, claimdb_give_back, NULL, NULL, items, m) != QN_OK ||
        cq_tx(w, 1, claimdb_give_back, NULL, NULL, items, m) != QN_OK)
        return QN_ERR;
    if (claimdb_save_failed(w->pg[0], items, m) != QN_OK || cq_dup_status(w, items, m) != QN_OK)
        return QN_ERR;
    cq_decide(items, m, cs);
    return cq_release_codes(w, items, cs, m);
}

#define CQ_END_MAX 500 /* claims per ZREM: a command holds Redis while it runs */

/* By template, then bucket: one reservation set after the other. */
static int cq_by_template(const void *a, const void *b, void *base)
{
    const claimdb_item *items = base, *p = &items[*(const size_t *)a],
                       *q = &items[*(const size_t *)b];
    int64_t x = p->c.template_id, y = q->c.template_id;
    if (x != y)
        return (x > y) - (x < y);
    return (p->bkt > q->bkt) - (p->bkt < q->bkt);
}

static int cq_same_set(const claimdb_item *p, const claimdb_item *q)
{
    return p->c.template_id == q->c.template_id && p->bkt == q->bkt && p->nbkt == q->nbkt;
}

/* Appends the ZREM of the claims ord[lo..hi) (one reservation set's) to the pipeline. args:
 * ZREM, the set, then the members (CQ_END_MAX + 2 slots). */
static void cq_end_call(cq_worker *w, const claimdb_item *items, const size_t *ord, size_t lo,
                        size_t hi, char (*mem)[KEYS_LEN], const char **args)
{
    bucket_keys bk;
    const claimdb_item *first = &items[ord[lo]];
    bucket_keys_of(&bk, first->c.template_id, first->nbkt > 1 ? first->bkt : 0, first->nbkt);
    args[0] = "ZREM";
    args[1] = bk.resv;
    for (size_t i = lo; i < hi; i++) {
        const ucoupon *u = &items[ord[i]].c;
        keys_resv_member(mem[i - lo], u->user_id, u->request_id);
        args[2 + i - lo] = mem[i - lo];
    }
    redis_sync_append_argv(w->redis, (int)(2 + hi - lo), args, NULL);
}

/* The records of the claims that became coupons end: one ZREM per template (and CQ_END_MAX
 * claims), pipelined, not one per claim; the users' lists of open ids follow by themselves
 * (claim.lua). A record left open (Redis failed) is found settled by whoever looks at it
 * next. */
static void cq_end_records(cq_worker *w, const claimdb_item *items, const claim_course *cs,
                           size_t m)
{
    size_t *ord = calloc(m ? m : 1, sizeof(*ord)), *cut = calloc(m + 1, sizeof(*cut));
    char(*mem)[KEYS_LEN] = malloc(CQ_END_MAX * sizeof(*mem));
    const char **args = malloc((CQ_END_MAX + 2) * sizeof(*args));
    size_t n = 0, ncalls = 0;
    if (!ord || !cut || !mem || !args)
        goto out;
    for (size_t i = 0; i < m; i++)
        if (cs[i].end_record)
            ord[n++] = i;
    qsort_r(ord, n, sizeof(*ord), cq_by_template, (void *)items);
    /* calls [cut[k], cut[k + 1]): one template, at most CQ_END_MAX claims */
    for (size_t i = 0; i < n; i++)
        if (i == 0 || i - cut[ncalls - 1] == CQ_END_MAX ||
            !cq_same_set(&items[ord[i]], &items[ord[i - 1]]))
            cut[ncalls++] = i;
    cut[ncalls] = n;
    for (size_t k = 0; k < ncalls; k++)
        cq_end_call(w, items, ord, cut[k], cut[k + 1], mem, args);
out:
    free(ord);
    free(cut);
    free(mem);
    free(args);
}

/* After the commits, what each claim's course says (cq_decide): refused reservations given back,
 * coupons into wallets, records ended, markers gone. */
static void cq_redis_after(cq_worker *w, const cq_msg *ms, const cq_del *ds, size_t nd,
                           const claimdb_item *items, const claim_course *cs, size_t m)
{
    char key[KEYS_LEN];
    char member[UCOUPON_MEMBER_LEN];
    /* A claim that became a coupon is settled, queued until now or completed by its check (the
     * request that made it died after the stock's commit). A refused one's record goes with its
     * give-back below, not before: until then its user is in doubt, not at the limit. A given-up
     * one (VOID) was cleaned up in Redis by whoever voided it: the marker and the record may be
     * a later attempt's now. */
    cq_end_records(w, items, cs, m);
    for (size_t i = 0; i < m; i++) {
        const ucoupon *u = &items[i].c;
        if (cs[i].step == CLAIM_WALLET) {
            keys_wallet(key, u->user_id);
            ucoupon_member(member, u->template_id, u->id);
            redis_sync_append(w->redis, "ZADD %s %lld %s", key, (long long)u->receive_time_ms,
                              member);
        }
        if (cs[i].unmark && keys_claim_pending_used(u->template_id, u->request_id)) {
            keys_claim_pending(key, u->user_id, u->request_id);
            redis_sync_append(w->redis, "DEL %s", key);
        }
    }
    /* The guard's CONSUMED marks ride in the same pipeline (one round trip per node): they
     * follow the commits, which is all they need. */
    cq_guard_end_append(w, ms, ds, nd, 1);
    redis_sync_discard(w->redis);
    for (size_t i = 0; i < m; i++) {
        const ucoupon *u = &items[i].c;
        if (cs[i].step != CLAIM_UNDO)
            continue;
        resv_keys rk;
        resv_keys_of(&rk, u->template_id, items[i].bkt, items[i].nbkt, u->user_id, u->request_id);
        /* this message's attempt only: a retry of the request id may hold the marker now */
        char attempt[24];
        log_i64_str(attempt, u->receive_time_ms);
        const char *keys[3] = RESV_UNDO_KEYS(&rk), *args[3] = RESV_UNDO_ARGS(&rk, attempt);
        redisReply *r = REDIS_SYNC_SCRIPT(w->redis, w->scripts, claim_undo, keys, args);
        if (!r || r->type == REDIS_REPLY_ERROR)
            log_errorf(NULL,
                       ((log_field[]){LOG_I("template", u->template_id), LOG_I("user", u->user_id),
                                      LOG_END}),
                       "claimq: cannot give a refused claim back in Redis");
        if (r)
            freeReplyObject(r);
        metrics_inc_l(&metric_quan_claims_total, cs[i].label);
    }
}

/* ---- one batch ---- */

static int cq_by_key(const void *a, const void *b, void *base)
{
    const cq_msg *ms = base;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = strcmp(ms[i].key, ms[j].key);
    return c ? c : (i > j) - (i < j);
}

/* By user and request id, then the attempt's time, then arrival. */
static int cq_by_request(const void *a, const void *b, void *base)
{
    const cq_msg *ms = base;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    const ucoupon *x = &ms[i].item.c, *y = &ms[j].item.c;
    int c = (x->user_id > y->user_id) - (x->user_id < y->user_id);
    if (!c)
        c = strcmp(x->request_id, y->request_id);
    if (!c)
        c = (x->receive_time_ms > y->receive_time_ms) - (x->receive_time_ms < y->receive_time_ms);
    return c ? c : (i > j) - (i < j);
}

/* The same claim twice in one batch (a redelivered pack beside its copy): all but the first
 * are only acked. Two attempts of one request id (a given-up one delivered late beside its
 * retry) go to the database in different batches, the earlier first: the later one goes back
 * to the queue. Indices sorted: n log n, not n^2 (batches hold about 1,000). tmp (n entries)
 * is scratch. */
static void cq_mark_duplicates(cq_msg *ms, size_t n, size_t *tmp)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (ms[i].kind != CQ_MALFORMED) /* malformed: dead-lettered on arrival (cq_take) */
            tmp[m++] = i;
    qsort_r(tmp, m, sizeof(*tmp), cq_by_key, ms);
    for (size_t k = 1; k < m; k++)
        if (!strcmp(ms[tmp[k]].key, ms[tmp[k - 1]].key))
            ms[tmp[k]].done = 1;
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (ms[i].kind == CQ_CLAIM && !ms[i].done)
            tmp[m++] = i;
    qsort_r(tmp, m, sizeof(*tmp), cq_by_request, ms);
    for (size_t k = 1; k < m; k++) {
        const ucoupon *x = &ms[tmp[k]].item.c, *y = &ms[tmp[k - 1]].item.c;
        if (x->user_id == y->user_id && !strcmp(x->request_id, y->request_id))
            ms[tmp[k]].requeue = 1;
    }
}

/* QN_ERR when the batch failed: nothing decided is lost (every step is idempotent) and its
 * deliveries all come back. */
static qn_status cq_process(cq_worker *w, cq_msg *ms, size_t n, cq_del *ds, size_t nd)
{
    double t0 = now_mono_s(), t1 = t0, t2 = t0, t3 = t0;
    claimdb_item *items = calloc(n, sizeof(*items));
    claim_course *cs = calloc(n, sizeof(*cs));
    size_t *idx = calloc(n, sizeof(*idx)), m = 0;
    int failed = 0;

    if (idx)
        cq_mark_duplicates(ms, n, idx);
    if (!items || !cs || !idx || cq_guard_begin(w, ms, ds, nd) != QN_OK ||
        cq_markers(w, ms, n) != QN_OK) {
        failed = 1;
        goto end;
    }
    t1 = now_mono_s();
    if (cq_known_failures(w, ms, n) != QN_OK || cq_claims(w, ms, n, items, cs, idx, &m) != QN_OK) {
        failed = 1;
        goto end;
    }
    t2 = now_mono_s();
    cq_redis_after(w, ms, ds, nd, items, cs, m);
    t3 = now_mono_s();
end:
    if (failed && !redis_sync_broken(w->redis))
        cq_guard_end(w, ms, ds, nd, 0);
    for (size_t i = 0; i < n; i++)
        metrics_inc_l(&metric_quan_mq_consumed_total, cq_consumers[0].queue,
                      failed || ms[i].requeue ? "retry"
                      : ms[i].done            ? "skip"
                                              : "ack");
    log_at(LOGL_DEBUG, NULL,
           ((log_field[]){LOG_I("worker", w->id), LOG_I("n", (int64_t)n),
                          LOG_I("deliveries", (int64_t)nd),
                          LOG_I("guard_us", (int64_t)((t1 - t0) * 1e6)),
                          LOG_I("db_us", (int64_t)((t2 - t1) * 1e6)),
                          LOG_I("redis_us", (int64_t)((t3 - t2) * 1e6)), LOG_END}),
           "claimq: batch");
    free(items);
    free(cs);
    free(idx);
    return failed ? QN_ERR : QN_OK;
}

/* The batch handler (mq_consumer.h): the claims of the deliveries, packs and single claims
 * alike. A delivery holding a claim that cannot be read goes whole to
 * quan.engine.redeem.dead ("malformed"), where `quan-dlq list|replay engine.redeem` shows and
 * replays it; its readable claims are processed all the same (a replay repeats nothing). The
 * acks, the dead letter, and on failure the return of the whole batch are the consumer's. */
static qn_status cq_batch(mq_batch_item *batch, size_t nd, void *arg)
{
    cq_worker *w = arg;
    size_t n = 0;
    int64_t epoch;

    /* At the engine's start the epoch is read within milliseconds: wait for it rather than
     * send the batch back (a delivery that comes again is marked redelivered, which changes how
     * its claims are run). */
    for (int i = 0; i < CQ_RESTORE_WAIT_MS / 50 && !restore_ok(w->q->restore); i++)
        usleep(50000);
    if (!restore_ok(w->q->restore)) {
        /* Redis and these claims' reservations may be of a future the databases no longer
         * hold: quan-recover decides what becomes of the queued claims (restore.h). */
        log_warn_limited(&w->q->restore_log, NULL, NULL,
                         "claimq: the databases were restored; the batch goes back until "
                         "quan-recover has run");
        return QN_EAGAIN;
    }
    /* read after the verdict: restore.c writes the epoch before it opens */
    epoch = restore_epoch(w->q->restore);
    if (cq_connect(w) != QN_OK) {
        log_warn(NULL, "claimq: PostgreSQL or Redis unreachable; the batch goes back");
        return QN_EAGAIN;
    }
    for (size_t d = 0; d < nd; d++) {
        cq_del *del = &w->dels[d];
        const char *keys[MQ_ENVELOPE_PACK_MAX];
        memset(del, 0, sizeof(*del));
        del->first = n;
        del->n = batch[d].nenv;
        del->redelivered = batch[d].info.redelivered;
        for (size_t i = 0; i < batch[d].nenv; i++) {
            cq_msg *m = &w->msgs[n++];
            keys[i] = m->key;
            memset(m, 0, sizeof(*m));
            m->delivery = d;
            m->redelivered = batch[d].info.redelivered;
            cq_parse(m, &batch[d].env[i]);
            if (m->kind == CQ_CLAIM && !m->item.check && m->item.epoch < epoch) {
                /* accepted against a Redis quan-recover flushed since: docs/architecture.md,
                 * "After a database restore" */
                m->kind = CQ_STALE;
                batch[d].verdict = MQ_DEAD;
                batch[d].reason = CLAIMQ_RESTORED_REASON;
                log_warnf(NULL, ((log_field[]){LOG_S("key", m->key), LOG_END}),
                          "claimq: a claim accepted before a database restore; its message goes "
                          "to the dead-letter queue");
            }
            if (m->kind == CQ_MALFORMED && batch[d].verdict != MQ_DEAD) {
                batch[d].verdict = MQ_DEAD;
                batch[d].reason = "malformed";
                log_errorf(NULL, ((log_field[]){LOG_S("key", m->key), LOG_END}),
                           "claimq: malformed claim; its message goes to the dead-letter queue");
            }
        }
        if (del->n == 1)
            snprintf(del->guard, sizeof(del->guard), "%s", keys[0]);
        else
            claimq_pack_key(del->guard, keys, del->n);
    }
    if (cq_process(w, w->msgs, n, w->dels, nd) != QN_OK)
        return QN_ERR;
    /* A pack comes back whole, its guard key deleted: all its claims run again (the database
     * keys make those already written harmless); coming back comes first, the dead letter of a
     * malformed claim beside it can wait for that. */
    for (size_t i = 0; i < n; i++)
        if (w->msgs[i].requeue)
            batch[w->msgs[i].delivery].verdict = MQ_REQUEUE_NOW;
    return QN_OK;
}

/* ---- producers ---- */

void claimq_attempt_key(char *buf, size_t size, const ucoupon *u, int check)
{
    snprintf(buf, size, "%s%" PRId64 ":%s:%" PRId64, check ? "check:" : "", u->user_id,
             u->request_id, u->receive_time_ms);
}

void claimq_pack_key(char buf[CLAIMQ_PACK_KEY], const char *const *keys, size_t n)
{
    redis_scripts_sha1_ctx x;
    redis_scripts_sha1_init(&x);
    for (size_t i = 0; i < n; i++) /* each with its NUL: ["ab","c"] is not ["a","bc"] */
        redis_scripts_sha1_update(&x, keys[i], strlen(keys[i]) + 1);
    memcpy(buf, "pack:", 5);
    redis_scripts_sha1_hex(&x, buf + 5);
}

char *claimq_claim_json(char buf[CLAIMQ_CLAIM_JSON], const ucoupon *u, int bkt, int nbkt, int check,
                        int64_t epoch)
{
    char ep[80] = "";
    size_t len = 0;
    if (epoch > 0)
        len = (size_t)snprintf(ep, sizeof(ep), ",\"epoch\":%" PRId64, epoch);
    if (nbkt > 1)
        snprintf(ep + len, sizeof(ep) - len, ",\"bucket\":%d,\"buckets\":%d", bkt, nbkt);
    snprintf(buf, CLAIMQ_CLAIM_JSON,
             "{\"kind\":\"claim\",\"userId\":\"%" PRId64 "\",\"requestId\":\"%s\","
             "\"couponTemplateId\":\"%" PRId64 "\",\"shopNumber\":\"%" PRId64 "\","
             "\"source\":%d,\"receiveCount\":%d,\"userCouponId\":\"%" PRId64 "\","
             "\"receiveTime\":%" PRId64 ",\"validEndTime\":%" PRId64 "%s%s}",
             u->user_id, u->request_id, u->template_id, u->shop_number, u->source, u->receive_count,
             u->id, u->receive_time_ms, u->valid_end_ms, check ? ",\"check\":true" : "", ep);
    return buf;
}

void claimq_check_event(outbox_event *ev, char data[CLAIMQ_CLAIM_JSON],
                        char key[CLAIMQ_ATTEMPT_KEY], const ucoupon *u, int bkt, int nbkt,
                        const char *request_id, int64_t due_at_ms)
{
    claimq_attempt_key(key, CLAIMQ_ATTEMPT_KEY, u, 1);
    *ev = (outbox_event){.routing_key = EVENT_COUPON_REDEEM,
                         .key = key,
                         .data_json = claimq_claim_json(data, u, bkt, nbkt, 1, 0),
                         .request_id = request_id,
                         .due_at_ms = due_at_ms};
}

qn_status claimq_add_check(pgpool_conn *c, const ucoupon *u, int bkt, int nbkt,
                           const char *request_id, int64_t due_at_ms)
{
    char data[CLAIMQ_CLAIM_JSON], key[CLAIMQ_ATTEMPT_KEY];
    outbox_event ev;
    claimq_check_event(&ev, data, key, u, bkt, nbkt, request_id, due_at_ms);
    return outbox_add(c, &ev);
}

/* ---- life cycle ---- */

/* At the drain (off the loop thread): the consumers stop taking messages together, then each
 * finishes the batch in hand. */
static void cq_stop(void *arg)
{
    claimq *q = arg;
    if (!q)
        return;
    for (int i = 0; i < q->nworkers; i++)
        mq_consumer_quit(q->workers[i].consumer);
    for (int i = 0; i < q->nworkers; i++) {
        mq_consumer_stop(q->workers[i].consumer);
        q->workers[i].consumer = NULL;
    }
}

/* At the end (module free): the consumers are gone (cq_stop ran at the drain, or runs here). */
static void cq_free(void *arg)
{
    claimq *q = arg;
    if (!q)
        return;
    if (q->workers)
        cq_stop(q);
    for (int i = 0; i < q->nworkers; i++) {
        cq_worker *w = &q->workers[i];
        for (int k = 0; k < 2; k++)
            pgpool_conn_close(w->pg[k]);
        redis_sync_free(w->redis);
        redis_scripts_free(w->scripts);
        free(w->msgs);
        free(w->dels);
    }
    for (int k = 0; k < 2; k++)
        free(q->dsn[k]);
    free(q->workers);
    free(q->lua_dir);
    free(q);
}

static qn_status cq_module_start(service *s, void **state)
{
    const service_config *cfg = service_cfg(s);
    if (cq_cfg.claim_consumers == 0) {
        log_info(NULL, "claimq: no claim consumers on this replica (QUAN_CLAIM_CONSUMERS=0)");
        return QN_OK;
    }
    claimq *q = calloc(1, sizeof(*q));
    if (!q)
        return QN_ENOMEM;
    *state = q; /* freed by cq_free from here on, whatever happens below */
    q->svc = s;
    q->restore = service_module_state(s, &restore_module); /* it starts before this module */
    if (!q->restore)
        return QN_ERR;
    q->batch = (int)cq_cfg.claim_batch;
    q->dsn[0] = strdup(cfg->ds_dsn[0]);
    q->dsn[1] = strdup(cfg->ds_dsn[1]);
    q->lua_dir = strdup(cfg->lua_dir);
    q->stmt_timeout_ms = (int)cfg->pg_statement_timeout_ms;
    q->workers = calloc((size_t)cq_cfg.claim_consumers, sizeof(cq_worker));
    if (!q->dsn[0] || !q->dsn[1] || !q->lua_dir || !q->workers)
        return QN_ENOMEM;
    q->nworkers = (int)cq_cfg.claim_consumers;
    for (int i = 0; i < q->nworkers; i++) {
        cq_worker *w = &q->workers[i];
        w->q = q;
        w->id = i;
        w->scripts = redis_scripts_load_dir(q->lua_dir);
        w->msgs = calloc((size_t)q->batch + MQ_ENVELOPE_PACK_MAX, sizeof(cq_msg));
        w->dels = calloc((size_t)q->batch + MQ_ENVELOPE_PACK_MAX, sizeof(cq_del));
        /* A batch's pipelines are long: five times a command's timeout. */
        w->redis = service_redis_sync_new(cfg, (int)cfg->redis_timeout_ms * 5);
        if (!w->scripts || !w->msgs || !w->dels || !w->redis)
            return QN_ENOMEM;
    }
    for (int i = 0; i < q->nworkers; i++) {
        cq_worker *w = &q->workers[i];
        /* A large receive buffer lets the broker keep delivering while a batch is in the
         * database (intake overlaps the database work); the kernel default holds only a few
         * hundred deliveries. */
        mq_consumer_opts o = service_consumer_opts(s, &cq_consumers[0]);
        o.prefetch = 0; /* 2 x batch_max */
        o.rcvbuf_bytes = CQ_RCVBUF_BYTES;
        o.batch_handler = cq_batch;
        o.batch_max = q->batch;
        o.batch_wait_ms = CQ_FILL_WAIT_MS;
        o.arg = w;
        if (!(w->consumer = mq_consumer_start(&o)))
            return QN_ERR;
    }
    log_infof(NULL,
              ((log_field[]){LOG_I("consumers", q->nworkers), LOG_I("batch", q->batch), LOG_END}),
              "claimq: consuming %s in batches", cq_consumers[0].queue);
    return QN_OK;
}

static const config_var cq_vars[] = {
    {"QUAN_CLAIM_BATCH", CONFIG_INT, offsetof(cq_settings, claim_batch), "1000", 1, 10000, NULL, 0,
     "MQ claims written to the database per transaction"},
    {"QUAN_CLAIM_CONSUMERS", CONFIG_INT, offsetof(cq_settings, claim_consumers), "2", 0, 16, NULL,
     0,
     "claim batch consumer threads (their batches overlap); 0: this replica writes no MQ claims"},
};

const service_module claimq_module = {
    .name = "claimq",
    .vars = cq_vars,
    .nvars = sizeof(cq_vars) / sizeof(cq_vars[0]),
    .settings = &cq_cfg,
    .consumers = cq_consumers, /* consumed in batches by the workers cq_module_start starts */
    .metrics =
        (metrics_family *const[]){
            &metric_quan_claims_total,   /* outcomes of claims refused in a batch */
            METRICS_REFS(CLAIMQ_METRICS) /* the messages */
            NULL,
        },
    .start = cq_module_start,
    .drain = cq_stop,
    .free = cq_free,
};
