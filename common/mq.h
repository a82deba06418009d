/*
 * RabbitMQ for Quan (rabbitmq-c 0.11): topology, the JSON message envelope, a threaded
 * publisher with confirms for the event loop, a synchronous confirmed connection for worker
 * threads (outbox relay), a consumer runner with delayed retries and a dead-letter queue, and
 * operator tooling for the dead-letter queue.
 *
 * rabbitmq-c is blocking and not thread-safe per connection, so every connection here belongs
 * to exactly one thread: the publisher and each consumer run their own threads, and an mq_conn
 * must only be used by the thread that opened it.
 *
 * Topology (declared idempotently, same arguments every time):
 *   exchange  quan.events               durable topic; routing keys are event names
 *   queue     quan.<name>               durable, bound to quan.events with the consumer's keys
 *   queue     quan.<name>.retry         durable, x-message-ttl = retry delay, dead-letters back
 *                                       to quan.<name> through the default exchange
 *   queue     quan.<name>.dead          durable; messages land here after max attempts
 *
 * Every message carries the header x-attempt (1 on first publish, +1 per retry) and, once it
 * has been through the retry or dead queue, x-routing-key (its original event name).
 */
#ifndef QUAN_MQ_H
#define QUAN_MQ_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "bridge.h"
#include "status.h"

#define MQ_EXCHANGE                "quan.events"
#define MQ_DEFAULT_PREFETCH        16
#define MQ_DEFAULT_RETRY_DELAY_MS  10000
#define MQ_DEFAULT_MAX_ATTEMPTS    16
#define MQ_DEFAULT_CONFIRM_TIMEOUT 5000 /* ms */
#define MQ_DEFAULT_PUBLISH_QUEUE   4096
#define MQ_PACK_MAX                128   /* envelopes in one pack */
#define MQ_PACK_BYTES              65536 /* about the most bytes of one pack */

/* ---------------------------------------------------------------- envelope */

/*
 * The JSON body of every message:
 *   {"key":..., "requestId":..., "traceparent":..., "ts":<epoch ms>, "type":<routing key>,
 *    "data":{...}}
 * All fields owned by the struct; free with mq_envelope_free (which does not free the struct).
 */
typedef struct mq_envelope {
    char *key;         /* stable key (idempotency), never NULL after a successful parse */
    char *type;        /* event name = routing key, never NULL after a successful parse */
    char *request_id;  /* may be NULL */
    char *traceparent; /* may be NULL */
    int64_t ts_ms;     /* 0 if absent */
    cJSON *data;       /* never NULL after a successful parse */
} mq_envelope;

/* data_json is JSON text for "data" (NULL means {}); ts_ms 0 means now. request_id and
 * traceparent may be NULL (omitted). Returns an owned string (free()), NULL on bad input. */
char *mq_envelope_build(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json);
/* Needs "key" and "type" strings and a "data" member. On failure *out is left zeroed. */
qn_status mq_envelope_parse(const char *body, size_t len, mq_envelope *out) QN_MUSTCHECK;
/* Frees the fields and zeroes them; NULL-safe and safe on a zeroed struct. */
void mq_envelope_free(mq_envelope *e);

/*
 * A pack: several envelopes in one AMQP message, [envelope, envelope, ...] (header x-pack =
 * their count). The threaded publisher makes packs of packable messages (mq_msg.packable)
 * queued at the same moment, so that under load the broker's cost per message is shared by
 * many; only consumers that read packs may be bound to such routing keys.
 * Parses a pack or a single envelope into *out (n entries, owned: mq_pack_free).
 * QN_EINVAL when any element is not an envelope or there are more than MQ_PACK_MAX.
 */
qn_status mq_pack_parse(const char *body, size_t len, mq_envelope **out, size_t *n) QN_MUSTCHECK;
void mq_pack_free(mq_envelope *e, size_t n);

/* ---------------------------------------------------------------- message to publish */

/* Everything borrowed for the duration of the call that takes it. */
typedef struct mq_msg {
    const char *routing_key; /* required: the event name, e.g. "task.execute" */
    const char *key;         /* required: stable key, also the AMQP message_id */
    const char *request_id;  /* optional: x-request-id header and envelope requestId */
    const char *traceparent; /* optional: traceparent header and envelope field */
    int64_t ts_ms;           /* optional: 0 = now */
    const char *data_json;   /* JSON text for the envelope's "data" (NULL = {}) ... */
    const char *body;        /* ... or a complete envelope sent as-is (e.g. from the outbox) */
    int packable; /* mq_publish only: may share one AMQP message with others (a pack, above) */
} mq_msg;

/* ---------------------------------------------------------------- synchronous connection */

/* One connection with one channel in confirm mode; use it from one thread only. */
typedef struct mq_conn mq_conn;

/* Connects (amqp://user:pass@host:port/vhost, plain TCP), opens the channel, selects confirms
 * and declares the quan.events exchange. conn_name (may be NULL) labels the connection for
 * operators ("quan <conn_name>"). NULL on failure (reason logged). Free: mq_conn_close. */
mq_conn *mq_conn_open(const char *url, const char *conn_name);
void mq_conn_close(mq_conn *c);
/* 0 once the connection is broken: close it and open a new one. */
int mq_conn_ok(const mq_conn *c);
/* Last error of this connection (empty string if none); borrowed. */
const char *mq_conn_errstr(const mq_conn *c);

/*
 * Publishes m to quan.events (mandatory, persistent, application/json) and waits up to
 * timeout_ms for the broker's confirm. QN_OK: acked (the broker has it). QN_ENOTFOUND: no
 * queue is bound for the routing key (returned, nothing stored). QN_ERR: nacked.
 * QN_ETIMEDOUT: no confirm in time (state unknown: publish again, consumers are idempotent).
 * QN_EAGAIN: the connection broke. QN_EINVAL: bad message.
 */
qn_status mq_conn_publish_confirmed(mq_conn *c, const mq_msg *m, int timeout_ms) QN_MUSTCHECK;

/* Declares queue quan.<name>, its .retry (TTL retry_delay_ms, 0 = default) and .dead queues
 * and binds quan.<name> to quan.events for each key in the NULL-terminated routing_keys.
 * QN_ECONFLICT if a queue exists with other arguments (the channel is reopened, the connection
 * stays usable; the broker's text is in mq_conn_errstr). */
qn_status mq_conn_declare_consumer(mq_conn *c, const char *name, const char *const *routing_keys,
                                   int retry_delay_ms) QN_MUSTCHECK;
/* Deletes the three queues of consumer name (tests, decommissioning). */
qn_status mq_conn_delete_consumer(mq_conn *c, const char *name) QN_MUSTCHECK;
/* Message count of a queue (passive declare). QN_ENOTFOUND if it does not exist. */
qn_status mq_conn_queue_count(mq_conn *c, const char *queue, uint32_t *count) QN_MUSTCHECK;

/* ---------------------------------------------------------------- threaded publisher */

typedef struct mq_publisher mq_publisher;

/* Runs on the loop thread (through the bridge). st as for mq_conn_publish_confirmed, plus
 * QN_EAGAIN when the broker was unreachable for the whole confirm timeout or the publisher was
 * freed before the message went out. The caller decides to compensate or retry. */
typedef void (*mq_publish_cb)(qn_status st, void *arg);

typedef struct mq_publisher_opts {
    const char *url;        /* copied */
    bridge *bridge;         /* borrowed; must outlive the publisher */
    const char *name;       /* optional label: connection "quan publisher:<name>" */
    int queue_max;          /* bounded hand-off queue; 0 = MQ_DEFAULT_PUBLISH_QUEUE */
    int confirm_timeout_ms; /* 0 = MQ_DEFAULT_CONFIRM_TIMEOUT */
} mq_publisher_opts;

/* Starts the publisher thread; it connects (and reconnects with backoff) on its own.
 * NULL on failure. */
mq_publisher *mq_publisher_new(const mq_publisher_opts *o);
/* Publishes what is queued while the broker is reachable, fails the rest with QN_EAGAIN, joins
 * the thread. The final callbacks are posted to the bridge: call before bridge_free (which runs
 * them). */
void mq_publisher_free(mq_publisher *p);
/* Thread-safe. Copies m, enqueues it and returns at once; cb(st, arg) runs later on the loop
 * thread (cb may be NULL). QN_EBUSY if the queue is full, QN_EINVAL on a bad message; cb is
 * not called when this does not return QN_OK. */
qn_status mq_publish(mq_publisher *p, const mq_msg *m, mq_publish_cb cb, void *arg) QN_MUSTCHECK;
/* 1 while connected to the broker (for /readyz). Thread-safe. */
int mq_publisher_ready(const mq_publisher *p);

/* ---------------------------------------------------------------- consumer runner */

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
    int prefetch;                    /* 0 = MQ_DEFAULT_PREFETCH */
    int retry_delay_ms;              /* 0 = MQ_DEFAULT_RETRY_DELAY_MS */
    int max_attempts;                /* 0 = MQ_DEFAULT_MAX_ATTEMPTS */
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

/* ---------------------------------------------------------------- dead-letter tooling */

/* Borrowed for the duration of the call. */
typedef void (*mq_dead_fn)(const char *body, size_t len, int attempt, const char *reason,
                           void *arg);

/* Calls fn for up to max messages of quan.<name>.dead without removing them. */
qn_status mq_dead_list(const char *url, const char *name, int max, mq_dead_fn fn,
                       void *arg) QN_MUSTCHECK;
/* Moves up to max of the messages that are in quan.<name>.dead when it starts back to
 * quan.<name> with x-attempt reset to 1 (each one confirmed before it is acked off the dead
 * queue); those that fail again and come back meanwhile are left for the next replay.
 * *moved gets the count. */
qn_status mq_dead_replay(const char *url, const char *name, int max, int *moved) QN_MUSTCHECK;

#endif
