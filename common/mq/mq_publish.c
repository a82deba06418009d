/* The publisher thread (mq_publish.h). */
#include "mq_publish.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "mq_envelope.h"
#include "mq_thread.h"
#include "now.h"

METRICS_DEFINE(MQ_PUBLISH_METRICS)

#define MQ_PUB_WINDOW 1024 /* publishes in flight (sliding window of confirms) */

typedef struct pub_item {
    struct pub_item *next;
    mq_publisher *pub;
    char *rk, *key, *request_id, *traceparent, *body;
    int64_t ts_ms;
    mq_publish_cb cb;
    void *arg;
    qn_status st;
    size_t body_len;
    int packable;
    struct pub_item *pack; /* the next message of the same pack (the window holds the first) */
    double handed_s;       /* now_mono_s() when mq_publish took it */
} pub_item;

struct mq_publisher {
    char *url;
    char conn_name[MQ_CONN_NAME_MAX];
    bridge *br;
    int queue_max, confirm_timeout_ms;
    mq_thread t;           /* t.mu guards the queue, t.cv signals it */
    pub_item *head, *tail; /* guarded by t.mu */
    int qlen;              /* guarded by t.mu */
    int ready;             /* atomic */
    int down; /* atomic: the last attempt to connect failed, so publishes fail at once */
    mq_conn_cursor cursor; /* the publisher thread's: a reconnect goes to the next node */
};

static void pub_item_free(pub_item *it)
{
    if (!it)
        return;
    free(it->body); /* the strings live in the item's own allocation */
    free(it);
}

static void pub_item_run(void *arg)
{
    pub_item *it = arg;
    it->cb(it->st, it->arg);
    pub_item_free(it);
}

/* Hands the outcome to the loop thread; counted here, whichever thread decided it. */
static void pub_item_post(pub_item *it, qn_status st)
{
    it->st = st;
    metrics_inc(st == QN_OK ? &metric_quan_mq_published_total
                            : &metric_quan_mq_publish_failures_total);
    metrics_observe(&metric_quan_mq_publish_duration_seconds, now_mono_s() - it->handed_s);
    if (!it->cb) {
        pub_item_free(it);
        return;
    }
    if (bridge_post(it->pub->br, pub_item_run, it) != QN_OK) {
        log_error(NULL, "mq: cannot post publish result (out of memory); result dropped");
        pub_item_free(it);
    }
}

static void pub_item_finish(pub_item *it, qn_status st)
{
    if (st != QN_OK)
        log_warnf(NULL,
                  ((log_field[]){LOG_S("routing_key", it->rk), LOG_S("key", it->key),
                                 LOG_S("status", qn_status_str(st)), LOG_END}),
                  "mq: publish failed");
    pub_item_post(it, st);
}

/* Finishes a window entry: one message, or every message of its pack. */
static void pub_pack_finish(pub_item *it, qn_status st)
{
    while (it) {
        pub_item *next = it->pack;
        pub_item_finish(it, st);
        it = next;
    }
}

/* Chains the packable messages of fresh[0..n) that share a routing key into packs (at most
 * MQ_ENVELOPE_PACK_MAX messages and about MQ_ENVELOPE_PACK_BYTES each, in queue order); returns the
 * number of window entries left at the front of fresh. */
static size_t pub_pack(pub_item **fresh, size_t n)
{
    size_t heads = 0, count = 0, bytes = 0;
    pub_item *tail = NULL;

    for (size_t i = 0; i < n; i++) {
        pub_item *it = fresh[i], *head = heads ? fresh[heads - 1] : NULL;
        size_t len = it->body_len;
        if (head && tail && it->packable && head->packable && !strcmp(it->rk, head->rk) &&
            count < MQ_ENVELOPE_PACK_MAX && bytes + len + 1 <= MQ_ENVELOPE_PACK_BYTES) {
            tail->pack = it;
            tail = it;
            count++;
            bytes += len + 1;
            continue;
        }
        fresh[heads++] = it;
        tail = it;
        count = 1;
        bytes = len + 2;
    }
    return heads;
}

/* Fails every queued item: the broker is unreachable, or the publisher stops. */
static void pub_fail_queued(mq_publisher *p)
{
    pub_item *failed;

    pthread_mutex_lock(&p->t.mu);
    failed = p->head;
    p->head = p->tail = NULL;
    p->qlen = 0;
    pthread_mutex_unlock(&p->t.mu);
    while (failed) {
        pub_item *next = failed->next;
        pub_item_finish(failed, QN_EAGAIN);
        failed = next;
    }
}

/* Window of publishes waiting for their confirms (oldest first). */
typedef struct pub_window {
    pub_item *it[MQ_PUB_WINDOW];
    mq_conn_pending pend[MQ_PUB_WINDOW];
    int64_t sent_ms[MQ_PUB_WINDOW];
    size_t n;
} pub_window;

/* Finishes the resolved entries, keeping the rest in order. */
static void pub_window_settle(pub_window *w, int fail_all)
{
    size_t k = 0;
    for (size_t i = 0; i < w->n; i++) {
        if (fail_all && !w->pend[i].done) { /* their confirms are lost with the channel */
            w->pend[i].done = 1;
            w->pend[i].st = QN_EAGAIN;
        }
        if (w->pend[i].done) {
            pub_pack_finish(w->it[i], w->pend[i].st);
            continue;
        }
        w->it[k] = w->it[i];
        w->pend[k] = w->pend[i];
        w->sent_ms[k++] = w->sent_ms[i];
    }
    w->n = k;
}

static void pub_window_add(pub_window *w, mq_conn *c, pub_item *it)
{
    mq_conn_pending *pd = &w->pend[w->n];
    mq_conn_props mp;
    char *packed = NULL;
    const char *body = it->body;
    size_t len = it->body_len, count = 1;

    memset(pd, 0, sizeof(*pd));
    pd->key = it->key;
    pd->rk = it->rk;
    w->it[w->n] = it;
    w->sent_ms[w->n++] = now_mono_ms();
    if (it->pack) { /* [envelope,envelope,...] */
        for (pub_item *m = it->pack; m; m = m->pack, count++)
            len += m->body_len + 1;
        if (!(packed = malloc(len + 3))) {
            pd->done = 1;
            pd->st = QN_ENOMEM;
            return;
        }
        len = 0;
        for (pub_item *m = it; m; m = m->pack) {
            packed[len++] = m == it ? '[' : ',';
            memcpy(packed + len, m->body, m->body_len);
            len += m->body_len;
        }
        packed[len++] = ']';
        packed[len] = '\0';
        body = packed;
    }
    if (!mq_conn_ok(c)) {
        pd->done = 1;
        pd->st = QN_EAGAIN;
        free(packed);
        return;
    }
    mq_conn_props_init(&mp, it->key, it->request_id, it->traceparent, it->ts_ms);
    if (count > 1) {
        int k = (int)mp.p.headers.num_entries;
        mp.h[k].key = amqp_cstring_bytes("x-pack");
        mp.h[k].value.kind = AMQP_FIELD_KIND_I64;
        mp.h[k].value.value.i64 = (int64_t)count;
        mp.p.headers.num_entries = k + 1;
    }
    pd->st = mq_conn_publish_raw(c, MQ_CONN_EXCHANGE, it->rk, &mp.p, body, len, &pd->tag);
    pd->done = pd->st != QN_OK;
    free(packed);
}

/* A sliding window: new publishes go out as soon as they are queued (up to MQ_PUB_WINDOW
 * unconfirmed), and each confirm (multiple=1 included) finishes its publishes at once, instead
 * of sending a batch and stopping until all of it is confirmed. */
static void *pub_main(void *arg)
{
    mq_publisher *p = arg;
    mq_conn *c = NULL;
    int stop;
    pub_window *w = calloc(1, sizeof(*w));
    pub_item **fresh = calloc(MQ_PUB_WINDOW, sizeof(*fresh));

    if (!w || !fresh) {
        log_error(NULL, "mq: publisher out of memory");
        free(w);
        free(fresh);
        pub_fail_queued(p);
        return NULL;
    }
    for (;;) {
        size_t n = 0;

        if (!c) {
            if (mq_thread_stopping(&p->t))
                break;
            c = mq_conn_open_at(p->url, p->conn_name, &p->cursor);
            if (!c) {
                /* The broker is known unreachable: what waits fails now, and so does whatever
                 * comes until a connect succeeds (the caller answers a retryable 503), instead
                 * of waiting out the backoff. */
                __atomic_store_n(&p->down, 1, __ATOMIC_RELEASE);
                pub_fail_queued(p);
                mq_thread_backoff(&p->t);
                continue;
            }
            mq_thread_connected(&p->t);
            __atomic_store_n(&p->down, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&p->ready, 1, __ATOMIC_RELEASE);
            log_info(NULL, "mq: publisher connected");
        }
        pthread_mutex_lock(&p->t.mu);
        if (!p->head && !mq_thread_stopping(&p->t) && w->n == 0)
            mq_thread_wait(&p->t, 1000); /* wake at least every second for heartbeats */
        while (w->n + n < MQ_PUB_WINDOW && p->head) {
            fresh[n++] = p->head;
            p->head = p->head->next;
            p->qlen--;
        }
        if (!p->head)
            p->tail = NULL;
        stop = mq_thread_stopping(&p->t);
        pthread_mutex_unlock(&p->t.mu);

        n = pub_pack(fresh, n);
        for (size_t i = 0; i < n; i++)
            pub_window_add(w, c, fresh[i]);
        if (w->n) {
            /* Until at least one confirm (new publishes wait at most that long), or the oldest
             * publish's confirm timeout. */
            mq_conn_confirm_until(c, w->pend, w->n, w->sent_ms[0] + p->confirm_timeout_ms, 1);
            pub_window_settle(w, 0);
        } else if (stop) {
            break;
        } else {
            mq_conn_poll(c);
        }
        if (!mq_conn_ok(c)) {
            log_warnf(NULL, ((log_field[]){LOG_S("error", mq_conn_errstr(c)), LOG_END}),
                      "mq: publisher connection lost; reconnecting");
            __atomic_store_n(&p->ready, 0, __ATOMIC_RELEASE);
            pub_window_settle(w, 1);
            mq_conn_close(c);
            c = NULL;
        }
    }
    pub_window_settle(w, 1);
    free(w);
    free(fresh);
    __atomic_store_n(&p->ready, 0, __ATOMIC_RELEASE);
    mq_conn_close(c);
    pub_fail_queued(p);
    return NULL;
}

mq_publisher *mq_publisher_new(const mq_publisher_opts *o)
{
    mq_publisher *p = NULL;

    if (!o || !o->url || !o->bridge)
        return NULL;
    p = calloc(1, sizeof(*p));
    if (!p || !(p->url = strdup(o->url)))
        goto fail;
    p->br = o->bridge;
    snprintf(p->conn_name, sizeof(p->conn_name), "publisher:%s", o->name ? o->name : "main");
    p->queue_max = o->queue_max > 0 ? o->queue_max : MQ_PUBLISH_QUEUE_MAX;
    p->confirm_timeout_ms =
        o->confirm_timeout_ms > 0 ? o->confirm_timeout_ms : MQ_CONN_CONFIRM_TIMEOUT_MS;
    if (mq_thread_start(&p->t, pub_main, p) != QN_OK)
        goto fail;
    return p;
fail:
    if (p)
        free(p->url);
    free(p);
    return NULL;
}

void mq_publisher_free(mq_publisher *p)
{
    if (!p)
        return;
    mq_thread_stop(&p->t);
    free(p->url);
    free(p);
}

/* Copies s to *at (advancing it); NULL stays NULL. */
static char *pub_copy(char **at, const char *s, size_t len)
{
    char *d = *at;
    if (!s)
        return NULL;
    memcpy(d, s, len + 1);
    *at += len + 1;
    return d;
}

qn_status mq_publish(mq_publisher *p, const mq_msg *m, mq_publish_cb cb, void *arg)
{
    pub_item *it = NULL;
    qn_status st = QN_EINVAL;

    if (!p || !mq_conn_msg_valid(m))
        goto fail;
    /* One allocation for the item and its strings: a claim's publish is on the hot path. */
    size_t l_rk = strlen(m->routing_key), l_key = strlen(m->key);
    size_t l_rid = m->request_id ? strlen(m->request_id) : 0;
    size_t l_tp = m->traceparent ? strlen(m->traceparent) : 0;
    st = QN_ENOMEM;
    if (!(it = calloc(1, sizeof(*it) + l_rk + l_key + l_rid + l_tp + 4)))
        goto fail;
    char *at = (char *)(it + 1);
    it->handed_s = now_mono_s();
    it->pub = p;
    it->cb = cb;
    it->arg = arg;
    it->ts_ms = m->ts_ms ? m->ts_ms : now_wall_ms();
    it->rk = pub_copy(&at, m->routing_key, l_rk);
    it->key = pub_copy(&at, m->key, l_key);
    it->request_id = pub_copy(&at, m->request_id, l_rid);
    it->traceparent = pub_copy(&at, m->traceparent, l_tp);
    it->packable = m->packable;
    if (m->body) {
        if (!(it->body = strdup(m->body)))
            goto fail;
    } else {
        /* built here, so a bad data_json is reported to the caller at once */
        it->body = (m->data_own ? mq_envelope_write : mq_envelope_build)(
            m->routing_key, m->key, m->request_id, m->traceparent, it->ts_ms, m->data_json);
        if (!it->body) {
            st = QN_EINVAL;
            goto fail;
        }
    }
    it->body_len = strlen(it->body);

    if (__atomic_load_n(&p->down, __ATOMIC_ACQUIRE)) {
        pub_item_post(it, QN_EAGAIN); /* logged once, by the failed connect */
        return QN_OK;
    }
    pthread_mutex_lock(&p->t.mu);
    if (mq_thread_stopping(&p->t) || p->qlen >= p->queue_max) {
        pthread_mutex_unlock(&p->t.mu);
        st = QN_EBUSY;
        goto fail;
    }
    if (p->tail)
        p->tail->next = it;
    else
        p->head = it;
    p->tail = it;
    p->qlen++;
    pthread_cond_signal(&p->t.cv);
    pthread_mutex_unlock(&p->t.mu);
    return QN_OK;
fail:
    pub_item_free(it);
    return st;
}

int mq_publisher_ready(const mq_publisher *p)
{
    return p && __atomic_load_n(&p->ready, __ATOMIC_ACQUIRE);
}
