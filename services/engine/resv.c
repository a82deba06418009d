/* Reservations nobody finishes, and their sweeper (resv.h). */
#include "resv.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claimdb.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "redis.h"

#define RESV_TOUCH_MS      60000  /* a process says again that it reserves on a template */
#define RESV_INDEX_KEEP_MS 600000 /* a quiet template leaves the index (>> RESV_TOUCH_MS) */
#define RESV_TOUCH_SLOTS   1024   /* direct-mapped: a collision costs one ZADD, nothing else */
#define RESV_INDEX_MAX     10000  /* templates per round; the rest wait for the next */
#define RESV_PER_TEMPLATE  200    /* old reservations per template per round */
#define RESV_ACQUIRE_MS    2000

typedef struct resv_touch_job {
    resv_touch_cb cb;
    void *arg;
    size_t slot;
    int64_t tpl, now;
} resv_touch_job;

static struct {
    engine *e;
    redis_client *redis;
    /* the templates this process said it reserves on, and when (loop thread only) */
    struct {
        int64_t tpl, at;
    } touched[RESV_TOUCH_SLOTS];
    /* the sweeper: one round at a time, on a ds_0 pool worker */
    int running;
    redis_sync *sync;
    int64_t given_back, completed;
} resv_g;

void resv_keys_of(resv_keys *k, int64_t tpl, int64_t user, const char *request_id)
{
    keys_template_resv(k->set, tpl);
    keys_resv_member(k->member, user, request_id);
}

/* ---- the engine's side: the index, the end of a reservation ---- */

static void resv_on_touched(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c;
    resv_touch_job *t = arg;
    qn_status st = err || !r || r->type == REDIS_REPLY_ERROR ? QN_ERR : QN_OK;
    if (st == QN_OK) {
        resv_g.touched[t->slot].tpl = t->tpl;
        resv_g.touched[t->slot].at = t->now;
    }
    t->cb(st, t->arg);
    free(t);
}

void resv_touch(int64_t tpl, int64_t shop, resv_touch_cb cb, void *arg)
{
    int64_t now = now_wall_ms();
    size_t slot = (size_t)((uint64_t)tpl % RESV_TOUCH_SLOTS);
    if (resv_g.touched[slot].tpl == tpl && now - resv_g.touched[slot].at < RESV_TOUCH_MS) {
        cb(QN_OK, arg);
        return;
    }
    resv_touch_job *t = malloc(sizeof(*t));
    if (!t) {
        cb(QN_ENOMEM, arg);
        return;
    }
    *t = (resv_touch_job){.cb = cb, .arg = arg, .slot = slot, .tpl = tpl, .now = now};
    char member[48], score[24];
    snprintf(member, sizeof(member), "%" PRId64 ":%" PRId64, tpl, shop);
    snprintf(score, sizeof(score), "%" PRId64, now);
    /* GT: a clock behind another replica's never moves the score back. */
    if (redis_command(resv_g.redis, resv_on_touched, t, "ZADD %s GT %s %s", KEYS_RESV_INDEX, score,
                      member) != QN_OK)
        resv_on_touched(resv_g.redis, NULL, "cannot issue", t);
}

static void resv_on_done(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    (void)c, (void)r, (void)arg;
    if (err) /* left open: the sweeper finds the stock taken and removes it */
        log_warn(NULL, "resv: cannot remove a completed reservation: %s", err);
}

void resv_done(const resv_keys *k)
{
    if (redis_command(resv_g.redis, resv_on_done, NULL, "ZREM %s %s", k->set, k->member) != QN_OK)
        log_warn(NULL, "resv: cannot remove a completed reservation (the sweeper will)");
}

void resv_queued(const resv_keys *k, int64_t reserved_ms)
{
    if (redis_command(resv_g.redis, resv_on_done, NULL, "ZADD %s XX %lld %s", k->set,
                      (long long)(RESV_QUEUED_BASE + reserved_ms), k->member) != QN_OK)
        log_warn(NULL, "resv: cannot mark a queued claim's reservation");
}

/* ---- the sweeper ---- */

/* One template of the index and what the round found in its reservation set. */
typedef struct resv_tpl {
    int64_t tpl, shop, touched;
    long long open; /* reservations in the set */
} resv_tpl;

typedef struct resv_round {
    resv_tpl *tpls;
    size_t ntpl;
    claimdb_item *items;
    size_t nitems, cap;
    char decided[2]; /* the database of ds answered: its items are decided */
} resv_round;

static void resv_round_free(resv_round *rr)
{
    free(rr->tpls);
    free(rr->items);
}

/* This round is ours unless another replica's is running (the lock expires by itself). */
static int resv_lock(void)
{
    redisReply *r = redis_sync_command(resv_g.sync, "SET %s 1 NX PX %lld", KEYS_RESV_SWEEP_LOCK,
                                       (long long)resv_g.e->cfg->resv_sweep_ms);
    int ours = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    return ours;
}

/* The index. */
static qn_status resv_read_index(resv_round *rr)
{
    redisReply *r = redis_sync_command(resv_g.sync, "ZRANGE %s 0 %d WITHSCORES", KEYS_RESV_INDEX,
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
        if (r->element[i]->type != REDIS_REPLY_STRING ||
            sscanf(r->element[i]->str, "%" SCNd64 ":%" SCNd64, &t->tpl, &t->shop) != 2)
            continue;
        t->touched = strtoll(r->element[i + 1]->str, NULL, 10);
        rr->ntpl++;
    }
    st = QN_OK;
out:
    if (r)
        freeReplyObject(r);
    return st;
}

static claimdb_item *resv_add_item(resv_round *rr)
{
    if (rr->nitems == rr->cap) {
        size_t cap = rr->cap ? rr->cap * 2 : 64;
        claimdb_item *n = realloc(rr->items, cap * sizeof(*n));
        if (!n)
            return NULL;
        rr->items = n;
        rr->cap = cap;
    }
    claimdb_item *it = &rr->items[rr->nitems++];
    memset(it, 0, sizeof(*it));
    return it;
}

/* The reservations older than the cutoff, of every template of the index (pipelined), and the
 * size of each set. */
static qn_status resv_read_old(resv_round *rr, int64_t cutoff)
{
    char key[KEYS_LEN];
    qn_status st = QN_OK;
    for (size_t i = 0; i < rr->ntpl; i++) {
        keys_template_resv(key, rr->tpls[i].tpl);
        redis_sync_append(resv_g.sync, "ZRANGEBYSCORE %s -inf %lld WITHSCORES LIMIT 0 %d", key,
                          (long long)cutoff, RESV_PER_TEMPLATE);
        redis_sync_append(resv_g.sync, "ZCARD %s", key);
    }
    for (size_t i = 0; i < rr->ntpl; i++) {
        redisReply *r = NULL, *card = NULL;
        if (redis_sync_get_reply(resv_g.sync, &r) != QN_OK ||
            redis_sync_get_reply(resv_g.sync, &card) != QN_OK) {
            freeReplyObject(r);
            return QN_ERR; /* the rest is dropped by the next command */
        }
        rr->tpls[i].open = card->type == REDIS_REPLY_INTEGER ? card->integer : 1;
        for (size_t k = 0; st == QN_OK && r->type == REDIS_REPLY_ARRAY && k + 1 < r->elements;
             k += 2) {
            int64_t user;
            char rid[UCOUPON_REQUEST_ID_MAX + 1];
            if (sscanf(r->element[k]->str, "%" SCNd64 ":%64s", &user, rid) != 2)
                continue;
            claimdb_item *it = resv_add_item(rr);
            if (!it) {
                st = QN_ENOMEM;
                break;
            }
            it->c.template_id = rr->tpls[i].tpl;
            it->c.shop_number = rr->tpls[i].shop;
            it->c.user_id = user;
            it->c.receive_time_ms = strtoll(r->element[k + 1]->str, NULL, 10);
            snprintf(it->c.request_id, sizeof(it->c.request_id), "%s", rid);
            claimdb_route(it);
        }
        freeReplyObject(r);
        freeReplyObject(card);
    }
    return st;
}

/* Gives up in each template database the attempts that never reached it; ds_0's on conn. */
static void resv_decide(resv_round *rr, pgpool_conn *conn0)
{
    for (int ds = 0; ds < 2; ds++) {
        pgpool_conn *c =
            ds == 0 ? conn0 : pgpool_acquire(service_pg(resv_g.e->svc, 1), RESV_ACQUIRE_MS);
        if (!c)
            continue;
        rr->decided[ds] = claimdb_void(c, ds, rr->items, rr->nitems) == QN_OK;
        if (!rr->decided[ds])
            log_warn(NULL, "resv: cannot resolve reservations in ds_%d: %s", ds,
                     pgpool_conn_error(c));
        if (ds != 0)
            pgpool_release(c);
    }
}

/* In Redis: given up ones back (stock, count, marker: claim_undo.lua), taken ones complete. */
static void resv_settle(resv_round *rr)
{
    const redis_scripts *scripts = redis_client_scripts(resv_g.redis);
    for (size_t i = 0; i < rr->nitems; i++) {
        claimdb_item *it = &rr->items[i];
        const ucoupon *u = &it->c;
        resv_keys k;
        if (!rr->decided[it->tpl_ds])
            continue;
        resv_keys_of(&k, u->template_id, u->user_id, u->request_id);
        if (it->state != CLAIMDB_VOID) {
            freeReplyObject(redis_sync_command(resv_g.sync, "ZREM %s %s", k.set, k.member));
            resv_g.completed++;
            continue;
        }
        char k_tpl[KEYS_LEN], k_user[KEYS_LEN], k_req[KEYS_LEN], k_pending[KEYS_LEN];
        keys_template(k_tpl, u->template_id);
        keys_template_user(k_user, u->template_id, u->user_id);
        keys_template_req(k_req, u->template_id, u->user_id, u->request_id);
        const char *keys[4] = {k_tpl, k_user, k_req, k.set}, *args[1] = {k.member};
        redisReply *r = redis_sync_run_script(resv_g.sync, scripts, "claim_undo", 4, keys, 1, args);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            log_errorf(NULL,
                       ((log_field[]){LOG_I("template", u->template_id), LOG_I("user", u->user_id),
                                      LOG_END}),
                       "resv: cannot give an abandoned reservation back (next round)");
        } else {
            resv_g.given_back++;
            /* an MQ claim that was never queued: /redeem-result reads its FAILED row now */
            keys_claim_pending(k_pending, u->user_id, u->request_id);
            freeReplyObject(redis_sync_command(resv_g.sync, "DEL %s", k_pending));
        }
        freeReplyObject(r);
        if (redis_sync_broken(resv_g.sync))
            return;
    }
}

/* Templates quiet for RESV_INDEX_KEEP_MS with no reservation open leave the index. */
static void resv_prune(resv_round *rr, int64_t now)
{
    const redis_scripts *scripts = redis_client_scripts(resv_g.redis);
    char cutoff[24], member[48];
    snprintf(cutoff, sizeof(cutoff), "%" PRId64, now - RESV_INDEX_KEEP_MS);
    for (size_t i = 0; i < rr->ntpl && !redis_sync_broken(resv_g.sync); i++) {
        const resv_tpl *t = &rr->tpls[i];
        if (t->open != 0 || t->touched >= now - RESV_INDEX_KEEP_MS)
            continue;
        snprintf(member, sizeof(member), "%" PRId64 ":%" PRId64, t->tpl, t->shop);
        const char *keys[1] = {KEYS_RESV_INDEX}, *args[2] = {member, cutoff};
        freeReplyObject(
            redis_sync_run_script(resv_g.sync, scripts, "resv_prune", 1, keys, 2, args));
    }
}

/* One round, on a ds_0 worker. */
static qn_status resv_sweep_work(pgpool_conn *conn, void *arg)
{
    (void)arg;
    resv_round rr = {0};
    int64_t now = now_wall_ms();
    qn_status st = QN_ERR;
    resv_g.given_back = resv_g.completed = 0;
    if (redis_sync_open(resv_g.sync) != QN_OK || !resv_lock())
        goto out;
    if ((st = resv_read_index(&rr)) != QN_OK ||
        (st = resv_read_old(&rr, now - resv_g.e->cfg->resv_abandon_ms)) != QN_OK)
        goto out;
    if (rr.nitems > 0) {
        resv_decide(&rr, conn);
        if (claimdb_save_failed(conn, rr.items, rr.nitems) != QN_OK) {
            /* no FAILED rows, no give-back: the next round finds them void and does both */
            st = QN_ERR;
            goto out;
        }
        resv_settle(&rr);
    }
    resv_prune(&rr, now);
out:
    resv_round_free(&rr);
    return st;
}

/* Loop thread. */
static void resv_sweep_done(qn_status st, void *arg)
{
    (void)st, (void)arg;
    resv_g.running = 0;
    if (resv_g.given_back)
        metrics_add_l(METRIC_quan_claim_reservations_swept_total, (double)resv_g.given_back,
                      "given_back");
    if (resv_g.completed)
        metrics_add_l(METRIC_quan_claim_reservations_swept_total, (double)resv_g.completed,
                      "completed");
    if (resv_g.given_back || resv_g.completed)
        log_infof(NULL,
                  ((log_field[]){LOG_I("given_back", resv_g.given_back),
                                 LOG_I("completed", resv_g.completed), LOG_END}),
                  "resv: abandoned reservations resolved");
}

static void resv_on_tick(void *state)
{
    (void)state;
    pgpool *pool = service_pg(resv_g.e->svc, 0);
    if (resv_g.running || !pool)
        return;
    if (pgpool_submit(pool, resv_sweep_work, resv_sweep_done, NULL) == QN_OK)
        resv_g.running = 1;
}

static qn_status resv_start(service *s, void **state)
{
    resv_g.e = engine_of(s);
    resv_g.redis = service_redis(s);
    /* A round's pipelines are long: five times a command's timeout. */
    resv_g.sync = service_redis_sync_new(service_cfg(s), (int)service_cfg(s)->redis_timeout_ms * 5);
    *state = &resv_g;
    return resv_g.sync ? QN_OK : QN_ENOMEM;
}

/* After the pools: no round runs any more. */
static void resv_free(void *state)
{
    (void)state;
    redis_sync_free(resv_g.sync);
    resv_g.sync = NULL;
}

static const config_var resv_vars[] = {
    {"QUAN_RESV_SWEEP_MS", CONFIG_INT, offsetof(engine_config, resv_sweep_ms), "5000", 100, 3600000,
     NULL, 0, "how often one engine replica looks for abandoned claim reservations"},
    {"QUAN_RESV_ABANDON_MS", CONFIG_INT, offsetof(engine_config, resv_abandon_ms), "30000", 1000,
     3600000, NULL, 0,
     "a claim reservation this old and still open is abandoned: completed if its stock reached "
     "the database, else given back (stock and the user's count)"},
};

const service_module resv_module = {
    .name = "resv",
    .vars = resv_vars,
    .nvars = sizeof(resv_vars) / sizeof(resv_vars[0]),
    .timers =
        (const service_timer[]){
            {"resv-sweep", offsetof(engine_config, resv_sweep_ms), resv_on_tick},
            {0},
        },
    .start = resv_start,
    .free = resv_free,
};
