/* Reservations until they are settled, and who settles the ones in doubt (resv.h). */
#include "resv.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "bucket.h"
#include "claimdb.h"
#include "claimq.h"
#include "excode.h"
#include "grow.h"
#include "hash.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "redis.h"
#include "redis_sync.h"
#include "turnbatch.h"

METRICS_DEFINE(RESV_METRICS)

#define RESV_TOUCH_MS      60000  /* a process says again that it reserves on a template */
#define RESV_INDEX_KEEP_MS 600000 /* a quiet template leaves the index (>> RESV_TOUCH_MS) */
#define RESV_TOUCH_SLOTS   1024   /* direct-mapped: a collision costs one ZADD, nothing else */
#define RESV_INDEX_MAX     10000  /* templates per round; the rest wait for the next */
#define RESV_PER_TEMPLATE  200    /* open reservations looked at per template per round */
#define RESV_ACQUIRE_MS    2000
#define RESV_DOUBT_MS      250 /* this process asks about its claims in doubt this often */
#define RESV_INSTANCE_MAX  64
#define RESV_OWNER_LEN     (RESV_INSTANCE_MAX + 1 + LOCK_TOKEN_LEN)
#define RESV_MARKS_MAX     256  /* queued marks in one ZADD: the command stays small */
#define RESV_DONE_TRIES    40   /* a record's end is sent again every RESV_DOUBT_MS: 10 s */
#define RESV_REDO_MAX      4096 /* records whose end waits to be sent again; the rest: the sweep */

/* A queued claim's mark, waiting for the end of the loop turn (resv_queued). */
typedef struct resv_mark {
    char set[KEYS_LEN];
    char member[KEYS_LEN];
    char score[24];
} resv_mark;

typedef struct resv_touch_job {
    resv *rv;
    resv_touch_cb cb;
    void *arg;
    size_t slot;
    int64_t tpl, now;
    int n;
} resv_touch_job;

/* A settled reservation's record whose ZREM failed (resv_done), or a give-back whose
 * claim_undo.lua failed (resv_undo_again), sent again. */
typedef struct resv_end {
    resv *rv;
    resv_keys k;
    char attempt[24]; /* undo: the attempt given back */
    int undo;
    int tries;
} resv_end;

/* One claim in doubt of this process. */
typedef struct resv_doubt_item {
    claimdb_item it;
    int mq;
} resv_doubt_item;

typedef struct resv_settings {
    int64_t resv_sweep_ms;
    int64_t resv_lease_ms;
    int64_t resv_abandon_ms;
    const char *instance_id; /* QUAN_INSTANCE_ID: the owner name of this process's reservations */
} resv_settings;

/* Read at start; the running module reads them through its context. */
static resv_settings resv_cfg;

struct resv {
    service *svc;
    const service_config *common;
    const resv_settings *cfg;
    redis_client *redis; /* the service's */
    /* the templates this process said it reserves on, and when (loop thread only) */
    struct {
        int64_t tpl, at;
        int n; /* the buckets it was touched with */
    } touched[RESV_TOUCH_SLOTS];
    /* who this process is: the owner claim.lua records, and its lease */
    char instance[RESV_INSTANCE_MAX + 1];
    char run[LOCK_TOKEN_LEN];
    char owner[RESV_OWNER_LEN];
    char live_key[KEYS_LEN];
    int leased; /* the lease was written once: a run id found after that is another process's */
    struct event *lease_ev, *doubt_ev;
    /* the queued marks of this loop turn: a confirm answers a pack of claims at once, and their
     * marks go as one ZADD per template (resv_mark, by set) */
    turnbatch *marks;
    /* settled records whose end failed (a master moving, a connection lost): each is sent again
     * on the doubt timer, so that a record does not hold its user and the stock "in doubt" until
     * the sweep's QUAN_RESV_ABANDON_MS (loop thread only) */
    resv_end **redo;
    size_t nredo, redo_cap;
    /* its claims in doubt, waiting for the next round (loop thread only) */
    resv_doubt_item *doubts;
    size_t ndoubts, cap;
    /* the rounds: one at a time, on a ds_0 pool worker */
    int running;
    redis_sync *sync;
    log_limit fail_log[3]; /* a round's failures: reservations in ds_0, ds_1; exchanges */
};

void resv_keys_of(resv_keys *k, int64_t tpl_id, int b, int n, int64_t user, const char *request_id)
{
    bucket_keys bk;
    if (n <= 1 || b < 0 || b >= n)
        b = 0, n = 1;
    bucket_keys_of(&bk, tpl_id, b, n);
    memcpy(k->tpl, bk.hash, sizeof(k->tpl));
    memcpy(k->users, bk.users, sizeof(k->users));
    memcpy(k->set, bk.resv, sizeof(k->set));
    k->bkt = b, k->nbkt = n;
    keys_resv_member(k->member, user, request_id);
    keys_user_field(k->user, user);
}

const char *resv_owner(const resv *r)
{
    return r->owner;
}

/* ---- the engine's side: the index, the end of a reservation ---- */

static void resv_on_touched(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    resv_touch_job *t = arg;
    qn_status st = err || !r || r->type == REDIS_REPLY_ERROR ? QN_ERR : QN_OK;
    if (st == QN_OK) {
        t->rv->touched[t->slot].tpl = t->tpl;
        t->rv->touched[t->slot].at = t->now;
        t->rv->touched[t->slot].n = t->n;
    }
    t->cb(st, t->arg);
    free(t);
}

/* The index's member of a template: "<tpl>:<shop>", and ":<n>" for more than one bucket. */
static void resv_index_member(char *buf, size_t size, int64_t tpl_id, int64_t shop, int n)
{
    if (n > 1)
        snprintf(buf, size, "%" PRId64 ":%" PRId64 ":%d", tpl_id, shop, n);
    else
        snprintf(buf, size, "%" PRId64 ":%" PRId64, tpl_id, shop);
}

void resv_touch(resv *r, int64_t tpl_id, int64_t shop, int n, resv_touch_cb cb, void *arg)
{
    int64_t now = now_wall_ms();
    size_t slot = (size_t)((uint64_t)tpl_id % RESV_TOUCH_SLOTS);
    if (r->touched[slot].tpl == tpl_id && r->touched[slot].n == n &&
        now - r->touched[slot].at < RESV_TOUCH_MS) {
        cb(QN_OK, arg);
        return;
    }
    resv_touch_job *t = malloc(sizeof(*t));
    if (!t) {
        cb(QN_ENOMEM, arg);
        return;
    }
    *t = (resv_touch_job){
        .rv = r, .cb = cb, .arg = arg, .slot = slot, .tpl = tpl_id, .now = now, .n = n};
    char member[64], score[24];
    resv_index_member(member, sizeof(member), tpl_id, shop, n);
    snprintf(score, sizeof(score), "%" PRId64, now);
    /* GT: a clock behind another replica's never moves the score back. */
    if (redis_command(r->redis, resv_on_touched, t, "ZADD %s GT %s %s", KEYS_RESV_INDEX, score,
                      member) != QN_OK)
        resv_on_touched(r->redis, NULL, "cannot issue", t);
}

static void resv_end_send(resv_end *e);

static void resv_on_done(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    resv_end *e = arg;
    if (!err && r && r->type != REDIS_REPLY_ERROR) {
        free(e);
        return;
    }
    resv *rv = e->rv;
    if (++e->tries >= RESV_DONE_TRIES || rv->nredo >= RESV_REDO_MAX ||
        grow(&rv->redo, &rv->redo_cap, rv->nredo + 1, sizeof(*rv->redo), 64) != QN_OK) {
        /* left open: the sweep settles it once it is old */
        log_warn(NULL, e->undo ? "resv: cannot give a reservation back (the sweep settles it)"
                               : "resv: cannot end a settled reservation's record (the sweep "
                                 "ends it)");
        free(e);
        return;
    }
    if (e->tries == 1)
        log_infof(NULL,
                  ((log_field[]){LOG_S("error", err ? err
                                                : r ? r->str
                                                    : "no reply"),
                                 LOG_END}),
                  e->undo ? "resv: a reservation's give-back is sent again shortly"
                          : "resv: a settled reservation's record is ended again shortly");
    rv->redo[rv->nredo++] = e;
}

static void resv_end_send(resv_end *e)
{
    qn_status st;
    if (e->undo) {
        const char *keys[3] = RESV_UNDO_KEYS(&e->k), *args[3] = RESV_UNDO_ARGS(&e->k, e->attempt);
        st = REDIS_EVAL(e->rv->redis, claim_undo, keys, args, resv_on_done, e);
    } else {
        st = redis_command(e->rv->redis, resv_on_done, e, "ZREM %s %s", e->k.set, e->k.member);
    }
    if (st != QN_OK)
        resv_on_done(e->rv->redis, NULL, "cannot issue", e);
}

/* The records whose end failed, sent again (each again on the list if it fails again). */
static void resv_redo(resv *rv)
{
    size_t n = rv->nredo;
    resv_end **list = rv->redo;
    rv->redo = NULL, rv->nredo = 0, rv->redo_cap = 0;
    for (size_t i = 0; i < n; i++)
        resv_end_send(list[i]);
    free(list);
}

/* A record's end or a give-back, sent (again on failure). */
static void resv_end_start(resv *r, const resv_keys *k, const char *attempt)
{
    resv_end *e = malloc(sizeof(*e));
    if (!e) {
        log_warn(NULL, "resv: out of memory: a reservation is left to the sweep");
        return;
    }
    e->rv = r, e->tries = 0, e->undo = attempt != NULL, e->k = *k;
    snprintf(e->attempt, sizeof(e->attempt), "%s", attempt ? attempt : "");
    resv_end_send(e);
}

void resv_done(resv *r, const resv_keys *k)
{
    resv_end_start(r, k, NULL);
}

void resv_undo_again(resv *r, const resv_keys *k, const char *attempt)
{
    if (attempt && *attempt) /* only a named attempt: a retry may hold the marker by now */
        resv_end_start(r, k, attempt);
}

static void resv_on_marked(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)arg;
    if (err || (r && r->type == REDIS_REPLY_ERROR)) /* a retry counts them unqueued: it asks */
        log_warn(NULL, "resv: cannot mark queued claims' reservations: %s", err ? err : r->str);
}

/* turnbatch: a loop turn's marks go by set. */
static uint64_t resv_set_hash(const void *x)
{
    return hash_str(((const resv_mark *)x)->set);
}

static int resv_same_set(const void *x, const void *y)
{
    return strcmp(((const resv_mark *)x)->set, ((const resv_mark *)y)->set) == 0;
}

/* marks[0..n), of one set, in order: one ZADD XX. */
static void resv_marks_send(void *items, size_t n, void *arg)
{
    resv *rv = arg;
    const resv_mark *marks = items;
    const char *argv[3 + 2 * RESV_MARKS_MAX];
    int argc = 0;
    argv[argc++] = "ZADD";
    argv[argc++] = marks[0].set;
    argv[argc++] = "XX";
    for (size_t i = 0; i < n; i++) {
        argv[argc++] = marks[i].score;
        argv[argc++] = marks[i].member;
    }
    if (redis_command_argv(rv->redis, resv_on_marked, NULL, argc, argv, NULL) != QN_OK)
        resv_on_marked(rv->redis, NULL, "cannot issue", NULL);
}

void resv_queued(resv *r, const resv_keys *k, int64_t reserved_ms)
{
    resv_mark *m = turnbatch_add(r->marks);
    if (!m) {
        resv_on_marked(r->redis, NULL, "out of memory", NULL);
        return;
    }
    snprintf(m->set, sizeof(m->set), "%s", k->set);
    snprintf(m->member, sizeof(m->member), "%s", k->member);
    snprintf(m->score, sizeof(m->score), "%lld", (long long)(RESV_QUEUED_BASE + reserved_ms));
}

static void resv_round_start(resv *rv);

/* Onto the list of claims in doubt; 0 when out of memory (then the sweeper settles it once it
 * is old, QUAN_RESV_ABANDON_MS). */
static int resv_doubt_push(resv *rv, const claimdb_item *it, int mq)
{
    if (grow(&rv->doubts, &rv->cap, rv->ndoubts + 1, sizeof(*rv->doubts), 16) != QN_OK) {
        log_error(NULL, "resv: out of memory: a claim in doubt is left to the sweeper");
        return 0;
    }
    rv->doubts[rv->ndoubts] = (resv_doubt_item){.it = *it, .mq = mq};
    claimdb_set(&rv->doubts[rv->ndoubts++].it, CLAIMDB_PENDING); /* asked again */
    metrics_set(&metric_quan_claims_in_doubt, (int64_t)rv->ndoubts);
    return 1;
}

void resv_doubt(resv *r, const claimdb_item *it, int mq)
{
    if (!resv_doubt_push(r, it, mq))
        return;
    log_warnf(NULL,
              ((log_field[]){LOG_I("template", it->c.template_id), LOG_I("user", it->c.user_id),
                             LOG_S("request_id", it->c.request_id), LOG_END}),
              "resv: a claim's outcome is not known; it is settled once the database answers");
    resv_round_start(r);
}

/* ---- the rounds: this process's claims in doubt, and the sweep ---- */

/* One template of the index and what the round found in its reservation set. */
typedef struct resv_tpl {
    int64_t tpl, shop, touched;
    int n;          /* its stock buckets (bucket.h): each has its reservation set */
    long long open; /* reservations in the sets */
} resv_tpl;

/* What a round knows of each claim it settles, beside its claimdb_item (same index). */
typedef struct resv_meta {
    int own;      /* one of this process's claims in doubt */
    int mq;       /* its pending marker goes with the give-back (unknown when swept: yes) */
    int exchange; /* an exchange redemption: its code row in ds_0 decides, not the ledger */
    int old;      /* older than QUAN_RESV_ABANDON_MS: its record ends even if it took stock */
    int queued;   /* an MQ claim the broker confirmed (its record marked queued), this old: its
                   * consumer wrote it but could not end the record, or has not come yet. Only
                   * looked up, never given up: its message may still be in the broker */
    int refused;  /* queued, and its consumer recorded this attempt FAILED: its give-back (in
                   * Redis, after the commit) may have been lost, and is made again */
    int decided;  /* its database answered: given up (VOID) or it took stock (PENDING) */
    int settled;  /* nothing more to do here: given back, or its check made due */
} resv_meta;

typedef struct resv_round {
    resv *rv;
    resv_tpl *tpls;
    size_t ntpl;
    claimdb_item *items;
    resv_meta *meta;
    size_t n, cap;
    int sweep; /* this round holds the sweep lock */
    int64_t given_back, completed;
} resv_round;

static void resv_round_free(resv_round *rr)
{
    free(rr->tpls);
    free(rr->items);
    free(rr->meta);
    free(rr);
}

static claimdb_item *resv_add(resv_round *rr, resv_meta **meta)
{
    size_t cap = rr->cap; /* the two arrays grow together */
    if (grow(&rr->items, &rr->cap, rr->n + 1, sizeof(*rr->items), 64) != QN_OK ||
        grow(&rr->meta, &cap, rr->n + 1, sizeof(*rr->meta), 64) != QN_OK)
        return NULL;
    claimdb_item *it = &rr->items[rr->n];
    memset(it, 0, sizeof(*it));
    *meta = &rr->meta[rr->n++];
    memset(*meta, 0, sizeof(**meta));
    return it;
}

static int resv_is_exchange(const claimdb_item *it)
{
    return strncmp(it->c.request_id, CLAIMQ_EXCODE_PREFIX, strlen(CLAIMQ_EXCODE_PREFIX)) == 0;
}

/* This round sweeps unless another replica's is running (the lock expires by itself). */
static int resv_lock(resv *rv)
{
    redisReply *r = redis_sync_command(rv->sync, "SET %s 1 NX PX %lld", KEYS_RESV_SWEEP_LOCK,
                                       (long long)rv->cfg->resv_sweep_ms);
    int ours = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ours;
}

/* The index. */
static qn_status resv_read_index(resv_round *rr)
{
    resv *rv = rr->rv;
    redisReply *r = redis_sync_command(rv->sync, "ZRANGE %s 0 %d WITHSCORES", KEYS_RESV_INDEX,
                                       RESV_INDEX_MAX - 1);
    qn_status st = QN_ERR;
    if (!r || r->type != REDIS_REPLY_ARRAY)
        goto out;
    st = QN_ENOMEM;
    rr->tpls = calloc(r->elements / 2 + 1, sizeof(*rr->tpls));
    if (!rr->tpls)
        goto out;
    for (size_t i = 0; i + 1 < r->elements; i += 2) {
        resv_tpl *t = &rr->tpls[rr->ntpl];
        if (r->element[i]->type != REDIS_REPLY_STRING)
            continue;
        int got =
            sscanf(r->element[i]->str, "%" SCNd64 ":%" SCNd64 ":%d", &t->tpl, &t->shop, &t->n);
        if (got < 2)
            continue;
        if (got < 3 || t->n < 1 || t->n > BUCKET_MAX)
            t->n = 1;
        t->touched = strtoll(r->element[i + 1]->str, NULL, 10);
        rr->ntpl++;
    }
    st = QN_OK;
out:
    if (r)
        freeReplyObject(r);
    return st;
}

/* The open, not queued, reservations of every template of the index (pipelined, oldest first),
 * the queued ones older than the abandon age, and the size of each set. Each becomes an item
 * of the round; its owner is found next. */
static qn_status resv_read_open(resv_round *rr, size_t *first, int64_t now)
{
    resv *rv = rr->rv;
    bucket_keys bk;
    qn_status st = QN_OK;
    *first = rr->n;
    /* every bucket's set of every template (bucket.h) */
    for (size_t i = 0; i < rr->ntpl; i++)
        for (int b = 0; b < rr->tpls[i].n; b++) {
            bucket_keys_of(&bk, rr->tpls[i].tpl, b, rr->tpls[i].n);
            redis_sync_append(rv->sync, "ZRANGEBYSCORE %s -inf (%lld WITHSCORES LIMIT 0 %d",
                              bk.resv, RESV_QUEUED_BASE, RESV_PER_TEMPLATE);
            redis_sync_append(rv->sync, "ZRANGEBYSCORE %s %lld (%lld WITHSCORES LIMIT 0 %d",
                              bk.resv, RESV_QUEUED_BASE,
                              (long long)(RESV_QUEUED_BASE + now - rv->cfg->resv_abandon_ms),
                              RESV_PER_TEMPLATE);
            redis_sync_append(rv->sync, "ZCARD %s", bk.resv);
        }
    for (size_t i = 0; i < rr->ntpl; i++) {
        rr->tpls[i].open = 0;
        for (int b = 0; b < rr->tpls[i].n; b++) {
            redisReply *r = NULL, *old = NULL, *card = NULL;
            if (redis_sync_get_reply(rv->sync, &r) != QN_OK ||
                redis_sync_get_reply(rv->sync, &old) != QN_OK ||
                redis_sync_get_reply(rv->sync, &card) != QN_OK) {
                freeReplyObject(r);
                freeReplyObject(old);
                return QN_ERR; /* the rest is dropped by the next command */
            }
            rr->tpls[i].open += card->type == REDIS_REPLY_INTEGER ? card->integer : 1;
            size_t nopen = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
            size_t nold = old->type == REDIS_REPLY_ARRAY ? old->elements : 0;
            for (size_t k = 0; st == QN_OK && k + 1 < nopen + nold; k += 2) {
                int queued = k >= nopen;
                redisReply *const *e = queued ? old->element + (k - nopen) : r->element + k;
                int64_t user;
                char rid[UCOUPON_REQUEST_ID_MAX + 1];
                resv_meta *m;
                if (sscanf(e[0]->str, "%" SCNd64 ":%64s", &user, rid) != 2)
                    continue;
                claimdb_item *it = resv_add(rr, &m);
                if (!it) {
                    st = QN_ENOMEM;
                    break;
                }
                it->c.template_id = rr->tpls[i].tpl;
                it->c.shop_number = rr->tpls[i].shop;
                it->c.user_id = user;
                it->c.receive_time_ms =
                    strtoll(e[1]->str, NULL, 10) - (queued ? RESV_QUEUED_BASE : 0);
                snprintf(it->c.request_id, sizeof(it->c.request_id), "%s", rid);
                it->bkt = b;
                it->nbkt = rr->tpls[i].n;
                claimdb_route(it);
                m->mq = 1;
                m->queued = queued;
                m->exchange = resv_is_exchange(it);
            }
            freeReplyObject(r);
            freeReplyObject(old);
            freeReplyObject(card);
        }
    }
    return st;
}

/* Whose reservation it is, as its marker names it: "<instance>/<run>". */
typedef struct resv_owner_of {
    char instance[RESV_OWNER_LEN];
    const char *run; /* in instance, after its '\0'; NULL: no owner recorded */
    int mine;
} resv_owner_of;

/* The owner a claim's marker "<n>:<t>:<owner>" names (keys.h), or NULL (none recorded). */
static const char *resv_marker_owner(const char *marker)
{
    const char *colon = strchr(marker, ':');
    colon = colon ? strchr(colon + 1, ':') : NULL;
    return colon && colon[1] ? colon + 1 : NULL;
}

/* 1 when items [0, own) (this process's claims in doubt, handed to the round) hold it. */
static int resv_is_own(const resv_round *rr, size_t own, const claimdb_item *it)
{
    for (size_t i = 0; i < own; i++)
        if (rr->items[i].c.user_id == it->c.user_id &&
            rr->items[i].c.template_id == it->c.template_id &&
            !strcmp(rr->items[i].c.request_id, it->c.request_id))
            return 1;
    return 0;
}

/* Keeps, of items [first, n), those to settle now: their owner's lease is gone or names another
 * run (a process that died or was started again), or they are older than the abandon age (this
 * process's own too: one that old is stuck). A record without an owner (made before owners
 * were recorded) goes by age alone. */
static qn_status resv_pick_orphans(resv_round *rr, size_t first, int64_t now)
{
    resv *rv = rr->rv;
    size_t n = rr->n - first, kept = first;
    resv_owner_of *o = calloc(n ? n : 1, sizeof(*o));
    char key[KEYS_LEN];
    qn_status st = QN_ENOMEM;
    if (!o)
        return st;
    /* the owners (each record's marker), then each owner's lease */
    for (size_t i = first; i < rr->n; i++) {
        const claimdb_item *it = &rr->items[i];
        resv_keys k;
        resv_keys_of(&k, it->c.template_id, it->bkt, it->nbkt, it->c.user_id, it->c.request_id);
        redis_sync_append(rv->sync, "HGET %s %s", k.users, k.member);
    }
    st = QN_ERR;
    for (size_t i = 0; i < n; i++) {
        redisReply *r = NULL;
        if (redis_sync_get_reply(rv->sync, &r) != QN_OK)
            goto out;
        const char *owner = r->type == REDIS_REPLY_STRING ? resv_marker_owner(r->str) : NULL;
        if (owner) {
            snprintf(o[i].instance, sizeof(o[i].instance), "%s", owner);
            o[i].mine = !strcmp(o[i].instance, rv->owner);
            char *slash = strrchr(o[i].instance, '/');
            if (slash && slash[1] && !o[i].mine) {
                *slash = '\0';
                o[i].run = slash + 1;
                keys_resv_live(key, o[i].instance);
                redis_sync_append(rv->sync, "GET %s", key);
            }
        }
        freeReplyObject(r);
    }
    for (size_t i = 0; i < n; i++) {
        size_t at = first + i;
        int dead = 0;
        if (o[i].run) {
            redisReply *r = NULL;
            if (redis_sync_get_reply(rv->sync, &r) != QN_OK)
                goto out;
            dead = r->type != REDIS_REPLY_STRING || strcmp(r->str, o[i].run) != 0;
            freeReplyObject(r);
        }
        int old = now - rr->items[at].c.receive_time_ms > rv->cfg->resv_abandon_ms;
        if (!(dead || old || rr->meta[at].queued) || resv_is_own(rr, first, &rr->items[at]))
            continue;
        rr->items[kept] = rr->items[at];
        rr->meta[kept] = rr->meta[at];
        rr->meta[kept].old = old || rr->meta[at].queued;
        kept++;
    }
    rr->n = kept;
    st = QN_OK;
out:
    if (st != QN_OK) {
        redis_sync_discard(rv->sync);
        rr->n = first;
    }
    free(o);
    return st;
}

/* Exchange redemptions: their code row (ds_0), locked so that a redemption still in its
 * transaction finishes first. Redeemed by the user: it took stock (the check completes it);
 * else it never will, and is given up. */
static qn_status resv_decide_exchanges(resv_round *rr, pgpool_conn *c0)
{
    pgparam_array codes = {0};
    pgparam p = {0};
    qn_status st = QN_OK;
    size_t pre = strlen(CLAIMQ_EXCODE_PREFIX);
    for (size_t i = 0; i < rr->n; i++)
        if (rr->meta[i].exchange && !rr->meta[i].queued)
            pgparam_array_str(&codes, rr->items[i].c.request_id + pre);
    if (codes.n == 0)
        goto out;
    st = QN_ERR;
    if (pgparam_array_bind(&p, &codes) != QN_OK || pgpool_begin(c0) != QN_OK)
        goto out;
    /* Locked whatever their status: a redemption in its transaction holds the row, and the
     * lock waits for it, then reads what it left. */
    PGresult *r = pgpool_exec(c0,
                              "SELECT code, status, coalesce(user_id, 0) FROM t_exchange_code "
                              "WHERE code = ANY($1::text[]) FOR UPDATE",
                              p.n, p.v);
    if (!r)
        goto out;
    for (size_t i = 0; i < rr->n; i++) {
        if (!rr->meta[i].exchange || rr->meta[i].queued)
            continue;
        int took = 0;
        for (int k = 0; k < PQntuples(r) && !took; k++)
            took = !strcmp(PQgetvalue(r, k, 0), rr->items[i].c.request_id + pre) &&
                   atoi(PQgetvalue(r, k, 1)) == EXCODE_REDEEMED &&
                   strtoll(PQgetvalue(r, k, 2), NULL, 10) == rr->items[i].c.user_id;
        claimdb_set(&rr->items[i], took ? CLAIMDB_PENDING : CLAIMDB_VOID);
        rr->meta[i].decided = 1;
    }
    PQclear(r);
    st = pgpool_commit(c0);
out:
    if (st != QN_OK) {
        (void)pgpool_rollback(c0);
        for (size_t i = 0; i < rr->n; i++)
            if (rr->meta[i].exchange)
                rr->meta[i].decided = 0;
    }
    pgparam_array_free(&codes);
    return st;
}

/* The checks of those that took stock, due now (their consumer completes them): claims' in the
 * template's database, exchanges' in ds_0. Settles the own ones on success. */
static void resv_pull_checks(resv_round *rr, int ds, pgpool_conn *c)
{
    pgparam_array keys = {0};
    pgparam p = {0};
    char key[CLAIMQ_ATTEMPT_KEY];
    for (size_t i = 0; i < rr->n; i++) {
        const resv_meta *m = &rr->meta[i];
        int in_ds = m->exchange ? ds == 0 : rr->items[i].tpl_ds == ds;
        if (!m->decided || m->refused || rr->items[i].state == CLAIMDB_VOID || !in_ds)
            continue;
        claimq_attempt_key(key, sizeof(key), &rr->items[i].c, 1);
        pgparam_array_str(&keys, key);
    }
    if (keys.n == 0)
        return;
    int ok = pgparam_array_bind(&p, &keys) == QN_OK &&
             pgpool_exec_cmd(c,
                             "UPDATE t_outbox SET due_at = now() WHERE msg_key = ANY($1::text[]) "
                             "AND status = " OUTBOX_STATUS_TEXT(PENDING) " AND due_at > now()",
                             p.n, p.v, NULL) == QN_OK;
    pgparam_array_free(&keys);
    if (!ok) {
        log_warn(NULL, "resv: cannot make the checks of reservations that took stock due: %s",
                 pgpool_conn_error(c));
        return;
    }
    for (size_t i = 0; i < rr->n; i++) {
        resv_meta *m = &rr->meta[i];
        int in_ds = m->exchange ? ds == 0 : rr->items[i].tpl_ds == ds;
        if (m->decided && !m->refused && rr->items[i].state != CLAIMDB_VOID && in_ds) {
            m->settled = 1;
            rr->completed++;
        }
    }
}

/* The claims (not the exchanges) of database ds given up unless they took stock
 * (claimdb_void), on a compact copy; their states come back into the round. */
static qn_status resv_void_claims(resv_round *rr, int ds, pgpool_conn *c)
{
    claimdb_item *v = calloc(rr->n ? rr->n : 1, sizeof(*v));
    size_t *idx = calloc(rr->n ? rr->n : 1, sizeof(*idx)), m = 0;
    qn_status st = QN_ENOMEM;
    if (!v || !idx)
        goto out;
    for (size_t i = 0; i < rr->n; i++)
        if (!rr->meta[i].exchange && !rr->meta[i].queued && rr->items[i].tpl_ds == ds &&
            rr->items[i].state == CLAIMDB_PENDING) {
            idx[m] = i;
            v[m++] = rr->items[i];
        }
    if ((st = claimdb_void(c, ds, v, m)) != QN_OK)
        goto out;
    for (size_t k = 0; k < m; k++) {
        claimdb_set(&rr->items[idx[k]], v[k].state);
        rr->meta[idx[k]].decided = 1;
    }
out:
    free(v);
    free(idx);
    return st;
}

/* Looks up the old queued claims of the round (those of database ds, or any with ds < 0, not
 * decided yet) with sql over $1 users, $2 request ids, $3 reservation times, which returns the
 * ordinal of each one found: those found are decided, and refused when asked. Read only. */
static qn_status resv_find_queued(resv_round *rr, pgpool_conn *c, int ds, int refused,
                                  const char *sql)
{
    pgparam_array users = {0}, requests = {0}, attempts = {0};
    pgparam p = {0};
    size_t *idx = calloc(rr->n ? rr->n : 1, sizeof(*idx)), m = 0;
    qn_status st = QN_ENOMEM;
    if (!idx)
        goto out;
    for (size_t i = 0; i < rr->n; i++)
        if (rr->meta[i].queued && !rr->meta[i].decided && (ds < 0 || rr->items[i].tpl_ds == ds)) {
            idx[m++] = i;
            pgparam_array_i64(&users, rr->items[i].c.user_id);
            pgparam_array_str(&requests, rr->items[i].c.request_id);
            pgparam_array_i64(&attempts, rr->items[i].c.receive_time_ms);
        }
    st = QN_OK;
    if (m == 0)
        goto out;
    st = QN_ENOMEM;
    if (pgparam_array_bind(&p, &users) != QN_OK || pgparam_array_bind(&p, &requests) != QN_OK ||
        pgparam_array_bind(&p, &attempts) != QN_OK)
        goto out;
    st = QN_ERR;
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        goto out;
    for (int k = 0; k < PQntuples(r); k++) {
        long long o = strtoll(PQgetvalue(r, k, 0), NULL, 10);
        if (o >= 1 && (size_t)o <= m) {
            rr->meta[idx[o - 1]].decided = 1;
            rr->meta[idx[o - 1]].refused = refused;
        }
    }
    PQclear(r);
    st = QN_OK;
out:
    pgparam_array_free(&users);
    pgparam_array_free(&requests);
    pgparam_array_free(&attempts);
    free(idx);
    return st;
}

/* The old queued claims of database ds that took stock (a ledger row that gave up nothing):
 * decided, so that their records end; the others are left to their consumer. */
static qn_status resv_find_taken(resv_round *rr, int ds, pgpool_conn *c)
{
    return resv_find_queued(rr, c, ds, 0,
                            "SELECT x.o FROM unnest($1::bigint[], $2::text[], $3::bigint[]) WITH "
                            "ORDINALITY AS x(u, r, ms, o) JOIN t_claim_ledger l ON l.user_id = "
                            "x.u AND l.request_id = x.r AND l.void_resv_ms IS NULL");
}

/* The old queued claims whose consumer refused them (a FAILED outcome of that very attempt in
 * t_claim_result, ds_0: c0): decided, to be given back again (once per marker and attempt, so
 * nothing twice when the consumer's give-back did happen). */
static qn_status resv_find_refused(resv_round *rr, pgpool_conn *c0)
{
    return resv_find_queued(rr, c0, -1, 1,
                            "SELECT x.o FROM unnest($1::bigint[], $2::text[], $3::bigint[]) "
                            "WITH ORDINALITY AS x(u, r, ms, o) JOIN t_claim_result c ON "
                            "c.user_id = x.u AND c.request_id = x.r AND c.resv_ms = x.ms AND "
                            "c.status = " CLAIMDB_RESULT_TEXT(FAILED));
}

/* A round that cannot reach a database fails again every RESV_DOUBT_MS while it is down: told
 * once a second (per database and kind), with how many were held back. */
static void resv_fail_warn(log_limit *l, const char *what, int ds, pgpool_conn *c)
{
    log_warn_limited(
        l, NULL, ((log_field[]){LOG_I("ds", ds), LOG_S("error", pgpool_conn_error(c)), LOG_END}),
        "resv: cannot settle %s in ds_%d", what, ds);
}

/* In each template database: gives up the attempts that never reached it and makes the checks
 * of the others due; ds_0's work on conn0. */
static void resv_decide(resv_round *rr, pgpool_conn *conn0)
{
    resv *rv = rr->rv;
    if (resv_decide_exchanges(rr, conn0) != QN_OK)
        resv_fail_warn(&rv->fail_log[2], "exchange redemptions", 0, conn0);
    if (resv_find_refused(rr, conn0) != QN_OK)
        resv_fail_warn(&rv->fail_log[0], "reservations", 0, conn0);
    for (int ds = 0; ds < 2; ds++) {
        pgpool_conn *c = ds == 0 ? conn0 : pgpool_acquire(service_pg(rv->svc, 1), RESV_ACQUIRE_MS);
        if (!c)
            continue;
        if (resv_void_claims(rr, ds, c) != QN_OK || resv_find_taken(rr, ds, c) != QN_OK)
            resv_fail_warn(&rv->fail_log[ds], "reservations", ds, c);
        resv_pull_checks(rr, ds, c);
        if (ds != 0)
            pgpool_release(c);
    }
}

/* In Redis: the given up ones back (stock, count, marker: claim_undo.lua) once their FAILED
 * rows exist (failed_saved: an MQ claim's /redeem-result must read FAILED, not 404, once its
 * pending marker goes); the old ones that took stock lose their record. */
static void resv_settle(resv_round *rr, int failed_saved)
{
    resv *rv = rr->rv;
    const redis_scripts *scripts = redis_client_scripts(rv->redis);
    for (size_t i = 0; i < rr->n && !redis_sync_broken(rv->sync); i++) {
        claimdb_item *it = &rr->items[i];
        resv_meta *m = &rr->meta[i];
        const ucoupon *u = &it->c;
        resv_keys k;
        if (!m->decided)
            continue;
        resv_keys_of(&k, u->template_id, it->bkt, it->nbkt, u->user_id, u->request_id);
        if (it->state != CLAIMDB_VOID && !m->refused) {
            if (m->old)
                freeReplyObject(redis_sync_command(rv->sync, "ZREM %s %s", k.set, k.member));
            continue;
        }
        if (m->mq && !failed_saved)
            continue;
        char k_pending[KEYS_LEN], attempt[24];
        /* the attempt the record named: a retry that took the marker since keeps it */
        log_i64_str(attempt, u->receive_time_ms);
        const char *keys[3] = RESV_UNDO_KEYS(&k), *args[3] = RESV_UNDO_ARGS(&k, attempt);
        redisReply *r = REDIS_SYNC_SCRIPT(rv->sync, scripts, claim_undo, keys, args);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            log_errorf(NULL,
                       ((log_field[]){LOG_I("template", u->template_id), LOG_I("user", u->user_id),
                                      LOG_END}),
                       "resv: cannot give a reservation back (next round)");
        } else if (r->type == REDIS_REPLY_INTEGER && r->integer == -3) {
            m->settled = 1; /* a retry of the request id holds the marker now: all its own */
        } else {
            m->settled = 1;
            rr->given_back++;
            /* never queued: /redeem-result reads its FAILED row now */
            if (m->mq && keys_claim_pending_used(u->template_id, u->request_id)) {
                keys_claim_pending(k_pending, u->user_id, u->request_id);
                freeReplyObject(redis_sync_command(rv->sync, "DEL %s", k_pending));
            }
        }
        freeReplyObject(r);
    }
}

/* Templates quiet for RESV_INDEX_KEEP_MS with no reservation open leave the index. */
static void resv_prune(resv_round *rr, int64_t now)
{
    resv *rv = rr->rv;
    const redis_scripts *scripts = redis_client_scripts(rv->redis);
    char cutoff[24], member[64];
    snprintf(cutoff, sizeof(cutoff), "%" PRId64, now - RESV_INDEX_KEEP_MS);
    for (size_t i = 0; i < rr->ntpl && !redis_sync_broken(rv->sync); i++) {
        const resv_tpl *t = &rr->tpls[i];
        if (t->open != 0 || t->touched >= now - RESV_INDEX_KEEP_MS)
            continue;
        resv_index_member(member, sizeof(member), t->tpl, t->shop, t->n);
        const char *keys[1] = {KEYS_RESV_INDEX}, *args[2] = {member, cutoff};
        freeReplyObject(REDIS_SYNC_SCRIPT(rv->sync, scripts, resv_prune, keys, args));
    }
}

/* One round, on a ds_0 worker: the own claims in doubt handed over (items [0, n) on entry),
 * then, with the lock, the reservations whose owner is gone. */
static qn_status resv_round_work(pgpool_conn *conn0, void *arg)
{
    resv_round *rr = arg;
    resv *rv = rr->rv;
    int64_t now = now_wall_ms();
    size_t first;
    if (redis_sync_open(rv->sync) != QN_OK)
        return QN_ERR;
    if ((rr->sweep = resv_lock(rv)) && resv_read_index(rr) == QN_OK &&
        resv_read_open(rr, &first, now) == QN_OK)
        (void)resv_pick_orphans(rr, first, now);
    if (rr->n > 0) {
        resv_decide(rr, conn0);
        int saved = claimdb_save_failed(conn0, rr->items, rr->n) == QN_OK;
        if (!saved)
            log_warn(NULL, "resv: cannot record given-up claims as FAILED (next round): %s",
                     pgpool_conn_error(conn0));
        resv_settle(rr, saved);
    }
    if (rr->sweep)
        resv_prune(rr, now);
    return QN_OK;
}

/* Loop thread: the own claims not settled go back to the list. */
static void resv_round_done(qn_status st, void *arg)
{
    resv_round *rr = arg;
    resv *rv = rr->rv;
    (void)st;
    rv->running = 0;
    for (size_t i = 0; i < rr->n; i++)
        if (rr->meta[i].own && !rr->meta[i].settled)
            (void)resv_doubt_push(rv, &rr->items[i], rr->meta[i].mq);
    metrics_set(&metric_quan_claims_in_doubt, (int64_t)rv->ndoubts);
    if (rr->given_back)
        metrics_add_l(&metric_quan_claim_reservations_swept_total, rr->given_back, "given_back");
    if (rr->completed)
        metrics_add_l(&metric_quan_claim_reservations_swept_total, rr->completed, "completed");
    if (rr->given_back || rr->completed)
        log_infof(NULL,
                  ((log_field[]){LOG_I("given_back", rr->given_back),
                                 LOG_I("completed", rr->completed), LOG_END}),
                  "resv: reservations in doubt settled");
    resv_round_free(rr);
}

/* Starts a round unless one runs; it takes the claims in doubt waiting now. */
static void resv_round_start(resv *rv)
{
    pgpool *pool = service_pg(rv->svc, 0);
    resv_round *rr;
    if (rv->running || !pool || !(rr = calloc(1, sizeof(*rr))))
        return;
    rr->rv = rv;
    for (size_t i = 0; i < rv->ndoubts; i++) {
        resv_meta *m;
        claimdb_item *it = resv_add(rr, &m);
        if (!it)
            break;
        *it = rv->doubts[i].it;
        claimdb_set(it, CLAIMDB_PENDING);
        *m = (resv_meta){.own = 1, .mq = rv->doubts[i].mq, .exchange = resv_is_exchange(it)};
    }
    if (rr->n < rv->ndoubts || pgpool_submit(pool, resv_round_work, resv_round_done, rr) != QN_OK) {
        resv_round_free(rr);
        return;
    }
    rv->ndoubts = 0;
    rv->running = 1;
}

static void resv_on_tick(void *state)
{
    resv_round_start(state);
}

static void resv_on_doubt_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    resv *rv = arg;
    if (rv->nredo > 0)
        resv_redo(rv);
    if (rv->ndoubts > 0)
        resv_round_start(rv);
}

/* ---- the lease ---- */

static void resv_on_leased(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    resv *rv = arg;
    if (err || !r || r->type == REDIS_REPLY_ERROR) {
        /* Before the first lease Redis may not be connected yet: the timer tries again. */
        log_at(rv->leased ? LOGL_WARN : LOGL_DEBUG, NULL,
               ((log_field[]){LOG_S("error", err ? err
                                             : r ? r->str
                                                 : "no reply"),
                              LOG_END}),
               "resv: cannot renew this process's reservation lease");
        return;
    }
    if (r->type == REDIS_REPLY_STRING && strcmp(r->str, rv->run) != 0) {
        if (rv->leased) /* someone else writes our name */
            log_errorf(NULL, ((log_field[]){LOG_S("instance", rv->instance), LOG_END}),
                       "resv: another engine process runs under this QUAN_INSTANCE_ID; give "
                       "each its own, or they settle each other's claims");
        else
            log_infof(NULL, ((log_field[]){LOG_S("instance", rv->instance), LOG_END}),
                      "resv: the previous run of this instance left a lease; its claims in "
                      "doubt are settled now");
    }
    rv->leased = 1;
}

static void resv_lease(resv *rv)
{
    if (redis_command(rv->redis, resv_on_leased, rv, "SET %s %s PX %lld GET", rv->live_key, rv->run,
                      (long long)rv->cfg->resv_lease_ms) != QN_OK)
        log_warn(NULL, "resv: cannot renew this process's reservation lease");
}

static void resv_on_lease_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    resv_lease(arg);
}

/* ---- the module ---- */

/* QUAN_INSTANCE_ID, or <hostname>:<port>: stable across restarts of one replica. */
static qn_status resv_instance(resv *rv)
{
    const char *id = rv->cfg->instance_id;
    char host[RESV_INSTANCE_MAX + 1] = "";
    if (id && *id) {
        snprintf(rv->instance, sizeof(rv->instance), "%s", id);
    } else {
        if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
            snprintf(host, sizeof(host), "engine");
        for (char *h = host; *h; h++) /* as resv_instance_check allows */
            if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') ||
                  (*h >= '0' && *h <= '9') || strchr(".-", *h)))
                *h = '-';
        snprintf(rv->instance, sizeof(rv->instance), "%.*s:%" PRId64, 40, host,
                 rv->common->http_port);
    }
    return lock_token_new(rv->run);
}

static qn_status resv_start(service *s, void **state)
{
    resv *rv = calloc(1, sizeof(*rv));
    if (!rv)
        return QN_ENOMEM;
    *state = rv; /* freed by resv_free from here on, whatever happens below */
    rv->svc = s;
    rv->common = service_cfg(s);
    rv->cfg = &resv_cfg;
    rv->redis = service_redis(s);
    if (resv_instance(rv) != QN_OK)
        return QN_ERR;
    snprintf(rv->owner, sizeof(rv->owner), "%s/%s", rv->instance, rv->run);
    keys_resv_live(rv->live_key, rv->instance);
    /* A round's pipelines are long: five times a command's timeout. */
    rv->sync = service_redis_sync_new(rv->common, (int)rv->common->redis_timeout_ms * 5);
    struct timeval lease = {.tv_sec = rv->cfg->resv_lease_ms / 3000,
                            .tv_usec = rv->cfg->resv_lease_ms / 3 % 1000 * 1000};
    struct timeval doubt = {.tv_sec = 0, .tv_usec = RESV_DOUBT_MS * 1000};
    rv->lease_ev = event_new(service_base(s), -1, EV_PERSIST, resv_on_lease_timer, rv);
    rv->doubt_ev = event_new(service_base(s), -1, EV_PERSIST, resv_on_doubt_timer, rv);
    rv->marks = turnbatch_new(service_base(s), sizeof(resv_mark), RESV_MARKS_MAX, resv_set_hash,
                              resv_same_set, resv_marks_send, rv);
    if (!rv->sync || !rv->lease_ev || !rv->doubt_ev || !rv->marks ||
        event_add(rv->lease_ev, &lease) != 0 || event_add(rv->doubt_ev, &doubt) != 0)
        return QN_ENOMEM;
    log_infof(NULL, ((log_field[]){LOG_S("owner", rv->owner), LOG_END}),
              "resv: reserving as this owner");
    /* At once: the claims a previous run of this instance left are settled by the first
     * round, which the sweep timer starts. */
    resv_lease(rv);
    return QN_OK;
}

/* After the pools: no round runs any more. */
static void resv_free(void *state)
{
    resv *rv = state;
    if (!rv)
        return;
    if (rv->lease_ev)
        event_free(rv->lease_ev);
    if (rv->doubt_ev)
        event_free(rv->doubt_ev);
    turnbatch_free(rv->marks); /* marks not sent yet stay unqueued: a retry asks the database */
    redis_sync_free(rv->sync);
    free(rv->doubts);
    for (size_t i = 0; i < rv->nredo; i++) /* left open: the sweep ends them once old */
        free(rv->redo[i]);
    free(rv->redo);
    free(rv);
}

/* QUAN_INSTANCE_ID: a hash tag's and a member's worth of safe characters. */
static qn_status resv_instance_check(const char *v, char *err, size_t errlen)
{
    for (const char *p = v; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._:-", *p))) {
            qn_errf(err, errlen, "only letters, digits and . _ : - allowed");
            return QN_EINVAL;
        }
    return QN_OK;
}

static const config_var resv_vars[] = {
    {"QUAN_RESV_SWEEP_MS", CONFIG_INT, offsetof(resv_settings, resv_sweep_ms), "1000", 100, 3600000,
     NULL, 0,
     "how often one engine replica settles the claim reservations of processes that are gone"},
    {"QUAN_RESV_LEASE_MS", CONFIG_INT, offsetof(resv_settings, resv_lease_ms), "3000", 300, 60000,
     NULL, 0,
     "an engine process's claims in flight are its own while it renews this lease (every third "
     "of it); past it, the other replicas settle them"},
    {"QUAN_RESV_ABANDON_MS", CONFIG_INT, offsetof(resv_settings, resv_abandon_ms), "30000", 1000,
     3600000, NULL, 0,
     "a claim reservation this old and still open is settled whatever its owner: completed if "
     "its stock reached the database, else given back (stock and the user's count)"},
    {"QUAN_INSTANCE_ID", CONFIG_STR, offsetof(resv_settings, instance_id), "", 0, RESV_INSTANCE_MAX,
     NULL, 0,
     "this engine process among the replicas, the same across its restarts and unique among "
     "those running ([A-Za-z0-9._:-]; default <hostname>:<QUAN_HTTP_PORT>): a restarted engine "
     "settles what its previous run left in doubt at once",
     resv_instance_check},
};

const service_module resv_module = {
    .name = "resv",
    .vars = resv_vars,
    .nvars = sizeof(resv_vars) / sizeof(resv_vars[0]),
    .settings = &resv_cfg,
    .timers =
        (const service_timer[]){
            {"resv-sweep", offsetof(resv_settings, resv_sweep_ms), resv_on_tick},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(RESV_METRICS) NULL},
    .start = resv_start,
    .free = resv_free,
};
