/*
 * One AMQP connection (rabbitmq-c 0.11) with one channel, and the topology Quan declares on it.
 * Every other mq module opens its connections here (mq_conn_connect), so the URL, timeouts,
 * heartbeats, the connection's name for operators and the error text are handled once.
 *
 * rabbitmq-c is blocking and not thread-safe per connection: an mq_conn belongs to the thread
 * that opened it (mq_consumer's heartbeat keeper is the one documented exception).
 *
 * Topology (declared idempotently, same arguments every time):
 *   exchange  quan.events               durable topic; routing keys are event names
 *   queue     quan.<name>               durable, bound to quan.events with the consumer's keys
 *   queue     quan.<name>.retry         durable, x-message-ttl = retry delay, dead-letters back
 *                                       to quan.<name> through the default exchange
 *   queue     quan.<name>.dead          durable; messages land here after max attempts
 * All three are classic queues, or quorum queues (replicated over a cluster's nodes) when the
 * caller asks (QUAN_MQ_QUEUE_TYPE): see mq_conn_declare_consumer.
 *
 * A URL may be a comma-separated list: the nodes of a RabbitMQ cluster, any of which serves
 * every queue. A connection goes to one of them (mq_conn_connect says which first).
 *
 * TLS: an amqps:// URL (port 5671 by default) connects through rabbitmq-c's OpenSSL socket,
 * configured by RabbitMQ's URI query parameters:
 *   cacertfile=PATH             the authorities trusted (default MQ_CONN_SYSTEM_CA)
 *   certfile=PATH&keyfile=PATH  a client certificate and its unencrypted PEM key (both or none)
 *   verify=verify_peer          the default: the chain must lead to cacertfile and the URL's
 *                               host must be a DNS name of the certificate (rabbitmq-c compares
 *                               DNS names only: write the host name, not an IP address);
 *                               verify=verify_none turns both checks off (logged as a warning)
 * A value's comma or ampersand is written %2C / %26. The socket blocks like the TCP one; the
 * threads that own connections (publisher, consumers, relays) are the only ones waiting on it,
 * and the handshake is bounded by the connect timeout.
 */
#ifndef QUAN_MQ_CONN_H
#define QUAN_MQ_CONN_H

#include <stddef.h>
#include <stdint.h>

#include <amqp.h>

#include "status.h"

#define MQ_CONN_EXCHANGE           "quan.events"
#define MQ_CONN_CHANNEL            1     /* the one channel of every connection */
#define MQ_CONN_HEARTBEAT_S        30    /* serviced by every wait on the connection */
#define MQ_CONN_RETRY_DELAY_MS     10000 /* default TTL of quan.<name>.retry */
#define MQ_CONN_CONFIRM_TIMEOUT_MS 5000  /* default wait for a publish confirm */
#define MQ_CONN_NAME_MAX           256   /* AMQP short strings: 255 bytes */
#define MQ_CONN_ERR_MAX            256   /* room for mq_conn_connect's reason */
#define MQ_CONN_URLS_MAX           16    /* URLs in one list */
/* The authorities an amqps:// URL trusts when its query names no cacertfile (Debian's bundle). */
#define MQ_CONN_SYSTEM_CA "/etc/ssl/certs/ca-certificates.crt"

/* The type of every queue mq_conn_declare_consumer declares. */
typedef enum {
    MQ_CONN_CLASSIC = 0, /* one node holds it (and its messages) */
    MQ_CONN_QUORUM = 1,  /* Raft-replicated over the cluster's nodes (a majority must be up) */
} mq_conn_queue_type;

/* "classic", "quorum", NULL, indexed by mq_conn_queue_type: QUAN_MQ_QUEUE_TYPE's choices. */
extern const char *const mq_conn_queue_types[];
/* NULL or empty: classic. QN_EINVAL for anything but the names above. */
qn_status mq_conn_queue_type_parse(const char *text, mq_conn_queue_type *out) QN_MUSTCHECK;

/*
 * Where an owner that reconnects (a publisher, a consumer, a relay) is in its URL list. Zeroed:
 * not started yet, and the first connect begins where the process's rotation is. Each connect
 * leaves it one past the URL that answered, so the reconnect after a lost connection tries the
 * next node first instead of the one that was just lost. Owned by one thread, like the
 * connection.
 */
typedef struct mq_conn_cursor {
    unsigned next;
    int started;
} mq_conn_cursor;

/* One connection with one channel; use it from one thread only. */
typedef struct mq_conn mq_conn;

typedef struct mq_conn_opts {
    const char *name; /* label: the connection is "quan <name>" for operators (NULL: "conn") */
    int confirm;      /* channel in confirm mode (publishes wait for the broker's confirm) */
    int heartbeat_s;  /* 0: MQ_CONN_HEARTBEAT_S; < 0: no heartbeats */
    int rcvbuf_bytes; /* socket receive buffer (0: the kernel's): room for deliveries that
                         arrive while the owner is busy */
    mq_conn_cursor *cursor; /* optional: the owner's place in the URL list (NULL: the
                               process's rotation alone decides where to begin) */
} mq_conn_opts;

/*
 * The one way to connect: parses url (amqp://user:pass@host:port/vhost, plain TCP, or
 * amqps://...[?query], TLS as above; an empty vhost is "/"), connects and logs in within 5 s (every
 * later RPC times out after 5 s too), opens the channel (confirm mode if asked) and declares the
 * quan.events exchange. NULL on failure, with the reason in err (never the password; err may be
 * NULL). Free: mq_conn_close.
 *
 * url may also be a list, "URL,URL,..." (mq_conn_urls_check): the URLs are tried in turn, each
 * with its own 5 s, until one logs in. The first tried is o->cursor's, else the next of the
 * process's rotation: a random start per process, one further for every connection, so that
 * replicas and their connections spread over the nodes rather than all landing on the first.
 * When every URL fails, err holds each one's reason (by position, never the URL).
 */
mq_conn *mq_conn_connect(const char *url, const mq_conn_opts *o, char err[MQ_CONN_ERR_MAX]);
/* mq_conn_connect in confirm mode with default heartbeats; a failure is logged. */
mq_conn *mq_conn_open(const char *url, const char *conn_name);
/* mq_conn_open for an owner that reconnects: cursor as in mq_conn_opts. */
mq_conn *mq_conn_open_at(const char *url, const char *conn_name, mq_conn_cursor *cursor);
/* QN_OK when urls is what mq_conn_connect takes: 1 to MQ_CONN_URLS_MAX amqp:// or amqps://
 * URLs separated by commas (blanks around each ignored; a comma inside one is written %2C),
 * the query parameters of each known and their files readable. Otherwise QN_EINVAL and the
 * reason in err, naming the URL by its position and the parameter, never showing the URL (it
 * holds a password). The check of QUAN_AMQP_URL at start (config_var.check). */
qn_status mq_conn_urls_check(const char *urls, char *err, size_t errlen) QN_MUSTCHECK;
/* Which URL of its list the connection went to: 0 for the first (or the only one). */
int mq_conn_node(const mq_conn *c);
void mq_conn_close(mq_conn *c);
/* 0 once the connection is broken: close it and open a new one. */
int mq_conn_ok(const mq_conn *c);
/* Last error of this connection (empty string if none); borrowed. */
const char *mq_conn_errstr(const mq_conn *c);
/* The rabbitmq-c state (channel MQ_CONN_CHANNEL), for what this module does not wrap: raw
 * consumes and pipelined publishes in tools and tests. Borrowed. */
amqp_connection_state_t mq_conn_amqp(mq_conn *c);

/* ---------------------------------------------------------------- publishing */

/* A message to publish. Everything borrowed for the duration of the call that takes it. */
typedef struct mq_msg {
    const char *routing_key; /* required: the event name, e.g. "task.execute" */
    const char *key;         /* required: stable key, also the AMQP message_id */
    const char *request_id;  /* optional: x-request-id header and envelope requestId */
    const char *traceparent; /* optional: traceparent header and envelope field */
    int64_t ts_ms;           /* optional: 0 = now */
    const char *data_json;   /* JSON text for the envelope's "data" (NULL = {}) ... */
    const char *body;        /* ... or a complete envelope sent as-is (e.g. from the outbox) */
    int packable; /* mq_publish only: may share one AMQP message with others (mq_envelope.h) */
    int data_own; /* mq_publish only: data_json is this process's own text, not parsed again */
} mq_msg;

/* 1 when m has a routing key and a key that fit AMQP short strings. */
int mq_conn_msg_valid(const mq_msg *m);

/*
 * Publishes m to quan.events (mandatory, persistent, application/json) and waits up to
 * timeout_ms for the broker's confirm (needs a connection in confirm mode). QN_OK: acked (the
 * broker has it). QN_ENOTFOUND: no queue is bound for the routing key (returned, nothing
 * stored). QN_ERR: nacked. QN_ETIMEDOUT: no confirm in time (state unknown: publish again,
 * consumers are idempotent). QN_EAGAIN: the connection broke. QN_EINVAL: bad message.
 */
qn_status mq_conn_publish_confirmed(mq_conn *c, const mq_msg *m, int timeout_ms) QN_MUSTCHECK;

/* ---------------------------------------------------------------- topology */

/* The three queue names of consumer <name>. */
typedef struct mq_conn_names {
    char main[MQ_CONN_NAME_MAX], retry[MQ_CONN_NAME_MAX], dead[MQ_CONN_NAME_MAX];
} mq_conn_names;

/* QN_EINVAL if name is empty or the names do not fit. */
qn_status mq_conn_names_of(const char *name, mq_conn_names *q) QN_MUSTCHECK;

/*
 * Declares queue quan.<name>, its .retry (TTL retry_delay_ms, 0 = default) and .dead queues
 * and binds quan.<name> to quan.events for each key in the NULL-terminated routing_keys.
 * QN_ECONFLICT if a queue exists with other arguments (the channel is reopened, the connection
 * stays usable; the broker's text is in mq_conn_errstr).
 *
 * type MQ_CONN_QUORUM makes the three quorum queues. Everything they use is allowed on one
 * (RabbitMQ 3.10 and later): they are durable, never exclusive or auto-deleted; the retry
 * queue's message TTL and dead-lettering are, and it dead-letters at least once (a retry that
 * expires while quan.<name> has lost its majority waits instead of being dropped). A queue
 * that exists with the other type is QN_ECONFLICT like any other argument: a deployment
 * changes type by deleting its queues once they are empty.
 */
qn_status mq_conn_declare_consumer(mq_conn *c, const char *name, const char *const *routing_keys,
                                   int retry_delay_ms, mq_conn_queue_type type) QN_MUSTCHECK;
/* Deletes the three queues of consumer name (tests, decommissioning). */
qn_status mq_conn_delete_consumer(mq_conn *c, const char *name) QN_MUSTCHECK;
/* Message count of a queue (passive declare): ready messages, not those delivered and not yet
 * acked. QN_ENOTFOUND if it does not exist. */
qn_status mq_conn_queue_count(mq_conn *c, const char *queue, uint32_t *count) QN_MUSTCHECK;

/* ---------------------------------------------------------------- for the other mq modules */

/* Maps an RPC reply to a status, recording the reason: a library error or a broker's
 * connection close breaks the connection; a channel close (QN_ECONFLICT for a precondition,
 * QN_ENOTFOUND, else QN_ERR) leaves it usable, the channel reopened by the next call here. */
qn_status mq_conn_check(mq_conn *c, amqp_rpc_reply_t r, const char *what) QN_MUSTCHECK;
/* mq_conn_check of the last RPC (amqp_basic_qos and the like). */
qn_status mq_conn_check_last(mq_conn *c, const char *what) QN_MUSTCHECK;
/* Marks the connection broken with a reason (printf-style). */
void mq_conn_fail(mq_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A method frame nobody waited for: a broker close is answered and breaks the connection (the
 * simplest recovery from an unexpected channel close is a new connection); others are ignored. */
void mq_conn_on_frame(mq_conn *c, const amqp_frame_t *f, const char *what);
/* Services heartbeats and notices a closed connection while idle, without blocking. */
void mq_conn_poll(mq_conn *c);

/* Properties of a Quan message; the header array lives beside them, with room for one header
 * more than mq_conn_props_init sets (the publisher's x-pack). */
typedef struct mq_conn_props {
    amqp_basic_properties_t p;
    amqp_table_entry_t h[4];
} mq_conn_props;

/* Persistent application/json with message_id = key, timestamp, x-attempt 1 and the optional
 * x-request-id and traceparent headers. The strings are borrowed by *mp. */
void mq_conn_props_init(mq_conn_props *mp, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms);
/* Sends one publish (mandatory) without waiting; *tag gets its confirm tag. */
qn_status mq_conn_publish_raw(mq_conn *c, const char *exchange, const char *rk,
                              const amqp_basic_properties_t *props, const char *body, size_t len,
                              uint64_t *tag) QN_MUSTCHECK;

/* One publish waiting for its confirm (mq_conn_publish_raw gave tag). */
typedef struct mq_conn_pending {
    uint64_t tag;
    const char *key; /* message_id and routing key identify a basic.return; borrowed */
    const char *rk;
    int returned;
    int done;
    qn_status st; /* once done: as for mq_conn_publish_confirmed */
} mq_conn_pending;

/* Reads frames until every pending publish is acked, nacked or returned, the monotonic
 * deadline (ms) passes or the connection breaks; each entry's st tells which. any: return
 * after the first confirm that resolves something (the publisher's sliding window). */
void mq_conn_confirm_until(mq_conn *c, mq_conn_pending *p, size_t n, int64_t deadline_ms, int any);
/* The same with a timeout, waiting for all. */
void mq_conn_confirm(mq_conn *c, mq_conn_pending *p, size_t n, int timeout_ms);

/* A header of a received message: its integer value (def if absent or not an integer), or its
 * string copied into buf (truncated; NULL if absent or not a string). */
int64_t mq_conn_header_int(const amqp_basic_properties_t *p, const char *name, int64_t def);
const char *mq_conn_header_str(const amqp_basic_properties_t *p, const char *name, char *buf,
                               size_t cap);
/* b as a C string in buf (truncated to cap - 1); returns buf. */
const char *mq_conn_bytes_str(amqp_bytes_t b, char *buf, size_t cap);
/* 1 when b holds exactly the string s. */
int mq_conn_bytes_eq(amqp_bytes_t b, const char *s);

#endif
