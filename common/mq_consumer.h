/*
 * A consumer: a thread that owns a connection to quan.<name> (declaring its topology), takes
 * one message at a time, hands its envelope to a handler and settles it by the handler's
 * verdict: acked, retried through quan.<name>.retry or dead-lettered (mq_dead.h). It
 * reconnects with backoff after any failure.
 *
 * The verdicts and what a handler gets keep the family's short names (MQ_ACK, mq_delivery_info):
 * every consumer in the services uses them.
 */
#ifndef QUAN_MQ_CONSUMER_H
#define QUAN_MQ_CONSUMER_H

#include <stdint.h>

#include "mq_envelope.h"
#include "status.h"

#define MQ_CONSUMER_PREFETCH     16
#define MQ_CONSUMER_MAX_ATTEMPTS 16

typedef enum {
    MQ_ACK = 0,       /* done, or a duplicate */
    MQ_RETRY,         /* transient failure: again after the retry delay, counts an attempt */
    MQ_DEAD,          /* poison: straight to the dead-letter queue */
    MQ_REQUEUE_LATER, /* someone else is at it (consume guard): again after the retry delay
                         without counting an attempt (bounded: dead after 4 x max attempts) */
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

/* Runs on the consumer's thread, one message at a time; may block (DB calls etc.), but should
 * return well within a minute: heartbeats (30 s) are not sent while it runs, and after two
 * missed ones the broker drops the connection and redelivers the message. */
typedef mq_handler_result (*mq_handler_fn)(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg);

typedef struct mq_consumer_opts {
    const char *url;                 /* copied */
    const char *name;                /* copied; e.g. "engine.redeem" -> queue quan.engine.redeem */
    const char *const *routing_keys; /* copied; NULL-terminated, at least one */
    int prefetch;                    /* 0 = MQ_CONSUMER_PREFETCH */
    int retry_delay_ms;              /* 0 = MQ_CONN_RETRY_DELAY_MS */
    int max_attempts;                /* 0 = MQ_CONSUMER_MAX_ATTEMPTS */
    mq_handler_fn handler;
    void *arg; /* borrowed, passed to handler */
} mq_consumer_opts;

typedef struct mq_consumer mq_consumer;

/* Starts the consumer thread (connects, declares topology, consumes; reconnects with backoff).
 * NULL on bad options or out of memory. Free with mq_consumer_stop. */
mq_consumer *mq_consumer_start(const mq_consumer_opts *o);
/* Stops taking deliveries, lets the message in hand finish and be acked, closes the
 * connections (prefetched, unhandled messages go back to the queue), joins and frees. */
void mq_consumer_stop(mq_consumer *c);
/* 1 while consuming (for /readyz). Thread-safe. */
int mq_consumer_ready(const mq_consumer *c);

#endif
