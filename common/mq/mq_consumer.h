/*
 * A consumer: a thread that owns a connection to quan.<name> (declaring its topology), takes
 * deliveries, hands them to a handler and settles each by the handler's verdict: acked, retried
 * through quan.<name>.retry or dead-lettered (mq_dead.h). It reconnects with backoff after any
 * failure, a broker restart included.
 *
 * Two modes:
 *   one at a time  handler gets one envelope; one delivery in hand at a time.
 *   batches        batch_handler gets up to batch_max envelopes at once: the deliveries that
 *                  arrived within batch_wait_ms of each other, packs read (mq_envelope.h); the
 *                  acks go out together, one basic.ack with multiple=1 up to the batch's last
 *                  delivery tag, after the retries and dead letters it has.
 * In both, heartbeats are kept alive while the handler runs (a keeper thread sends them on the
 * consumer's connections, which the consumer's thread leaves alone meanwhile), so a handler may
 * take longer than the heartbeat timeout. Deliveries that are not envelopes are dead-lettered
 * ("malformed") without reaching the handler.
 *
 * The verdicts and what a handler gets keep the family's short names (MQ_ACK, mq_delivery_info):
 * every consumer in the services uses them.
 */
#ifndef QUAN_MQ_CONSUMER_H
#define QUAN_MQ_CONSUMER_H

#include <stddef.h>
#include <stdint.h>

#include "mq_conn.h"
#include "mq_envelope.h"
#include "status.h"

#define MQ_CONSUMER_PREFETCH     16 /* one at a time; batches: 2 x batch_max */
#define MQ_CONSUMER_MAX_ATTEMPTS 16
#define MQ_CONSUMER_BATCH_WAIT   2    /* ms */
#define MQ_CONSUMER_PAUSE_MS     1000 /* after a failed batch or republish */

typedef enum {
    MQ_ACK = 0,       /* done, or a duplicate */
    MQ_RETRY,         /* transient failure: again after the retry delay, counts an attempt */
    MQ_DEAD,          /* poison: straight to the dead-letter queue */
    MQ_REQUEUE_LATER, /* someone else is at it (consume guard): again after the retry delay
                         without counting an attempt (bounded: dead after 4 x max attempts) */
    MQ_REQUEUE_NOW,   /* back to its queue at once (basic.nack, requeue): delivered again soon,
                         marked redelivered; counts nothing */
} mq_handler_result;

/* Borrowed for the duration of the handler call. */
typedef struct mq_delivery_info {
    const char *consumer;    /* consumer name */
    const char *routing_key; /* original event name */
    int attempt;             /* 1 on first delivery, +1 per retry */
    int max_attempts;
    int redelivered; /* the broker redelivered it (a consumer died holding it) */
    uint64_t delivery_tag;
} mq_delivery_info;

/* One at a time: runs on the consumer's thread and may block (DB calls etc.). */
typedef mq_handler_result (*mq_handler_fn)(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg);

/* One delivery of a batch; the handler sets verdict (and reason), the rest is borrowed. */
typedef struct mq_batch_item {
    const mq_envelope *env; /* its envelopes: one, or a pack's */
    size_t nenv;            /* >= 1 */
    mq_delivery_info info;
    mq_handler_result verdict; /* MQ_ACK unless the handler says otherwise */
    const char *reason;        /* with MQ_DEAD: x-dead-reason, a static string (NULL: "handler") */
} mq_batch_item;

/*
 * Batches: runs on the consumer's thread with n >= 1 deliveries and may block. QN_OK: each
 * item's verdict applies. Anything else: the batch failed as a whole (a database is down):
 * every delivery of it goes back to the queue at once, to come again marked redelivered, and
 * the consumer pauses MQ_CONSUMER_PAUSE_MS.
 */
typedef qn_status (*mq_batch_fn)(mq_batch_item *items, size_t n, void *arg);

typedef struct mq_consumer_opts {
    const char *url;                 /* copied; one URL or a list (mq_conn_connect) */
    const char *name;                /* copied; e.g. "engine.redeem" -> queue quan.engine.redeem */
    mq_conn_queue_type queue_type;   /* of the queues it declares (QUAN_MQ_QUEUE_TYPE) */
    const char *const *routing_keys; /* copied; NULL-terminated, at least one */
    int prefetch;                    /* 0 = MQ_CONSUMER_PREFETCH, or 2 x batch_max */
    int retry_delay_ms;              /* 0 = MQ_CONN_RETRY_DELAY_MS */
    int max_attempts;                /* 0 = MQ_CONSUMER_MAX_ATTEMPTS */
    int heartbeat_s;                 /* 0 = MQ_CONN_HEARTBEAT_S */
    int rcvbuf_bytes;                /* receive buffer of the consuming connection (0: the
                                        kernel's); room for deliveries arriving mid-batch */
    mq_handler_fn handler;           /* one at a time ... */
    mq_batch_fn batch_handler;       /* ... or batches: exactly one of the two */
    int batch_max;     /* batches: a batch ends once it holds this many envelopes (whole
                          deliveries, so a pack may take it past by up to a pack less one) */
    int batch_wait_ms; /* batches: 0 = MQ_CONSUMER_BATCH_WAIT */
    void *arg;         /* borrowed, passed to the handler */
    /* Optional, called on the consumer's thread after a handler: 0 while a store the handler
     * needs is known down. A delivery it failed with MQ_RETRY then waits in the retry queue
     * without using up an attempt: the outage is not the message's fault, and an outage longer
     * than max_attempts retry delays must not dead-letter what arrives meanwhile. */
    int (*deps_ready)(void *deps_arg);
    void *deps_arg; /* borrowed */
} mq_consumer_opts;

typedef struct mq_consumer mq_consumer;

/* Starts the consumer thread (connects, declares topology, consumes; reconnects with backoff).
 * NULL on bad options or out of memory. Free with mq_consumer_stop. */
mq_consumer *mq_consumer_start(const mq_consumer_opts *o);
/* Asks it to stop taking deliveries and returns at once (stop several consumers together:
 * mq_consumer_quit each, then mq_consumer_stop each). */
void mq_consumer_quit(mq_consumer *c);
/* Stops taking deliveries, lets the message or batch in hand finish and be settled, closes the
 * connections (prefetched, unhandled messages go back to the queue), joins and frees. */
void mq_consumer_stop(mq_consumer *c);
/* 1 while consuming (for /readyz). Thread-safe. */
int mq_consumer_ready(const mq_consumer *c);

#endif
