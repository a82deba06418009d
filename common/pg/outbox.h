/*
 * Transactional outbox, relay and timers (docs/architecture.md, rules 1, 2 and 4).
 *
 * A service that changes rows of a database and must announce it writes the event into that
 * database's t_outbox with outbox_add, in the same transaction as the change: the event exists
 * if and only if the change committed. A relay thread per database (any number of replicas at
 * once) claims due rows with FOR UPDATE SKIP LOCKED, publishes each with publisher confirms and
 * marks it sent in the same transaction. A row with a future due time is a timer of any length
 * (template end, coupon expiry, reminders): it is simply not due yet, so no broker delay limit
 * applies.
 *
 * Delivery is AT LEAST ONCE. A relay that dies (or loses PostgreSQL) after the broker confirmed
 * a message but before its COMMIT leaves the row pending, and the next relay publishes it again;
 * a confirm timeout is also treated as a failure and republished. Consumers must therefore be
 * idempotent: the consume guard (guard.h) in front and a DB unique key on the message key
 * behind it (rule 4). A row is never dropped: failed publishes (nack, unroutable, timeout,
 * connection lost) stay pending with attempts + 1, last_error and due_at pushed back with
 * capped exponential backoff. Order is by due time only: events are not ordered per key.
 *
 * Schema: t_outbox in migrations/both/0001_init.sql and 0002_outbox_sent_index.sql, which
 * ds_0's and ds_1's files of those numbers include.
 */
#ifndef QUAN_OUTBOX_H
#define QUAN_OUTBOX_H

#include <stdint.h>

#include "metrics.h"
#include "pgparam.h"
#include "pgpool.h"
#include "status.h"

/* t_outbox.status; each number written once, for the enum and the statements' text
 * (OUTBOX_STATUS_TEXT(PENDING) is "0", pgparam.h). */
#define OUTBOX_PENDING_N 0
#define OUTBOX_SENT_N    1
enum { OUTBOX_PENDING = OUTBOX_PENDING_N, OUTBOX_SENT = OUTBOX_SENT_N };
#define OUTBOX_STATUS_TEXT(name) PGPARAM_DIGIT_TEXT(OUTBOX_##name##_N)

/* Everything borrowed for the duration of outbox_add. */
typedef struct outbox_event {
    const char *routing_key; /* required: event name, e.g. "template.ended" */
    const char *key;         /* required: stable message key (consumer idempotency) */
    const char *data_json;   /* JSON text of the envelope's "data"; NULL = {} */
    const char *request_id;  /* optional */
    const char *traceparent; /* optional (W3C) */
    int64_t due_at_ms;       /* epoch ms; 0 = now (publish after commit), later = a timer */
} outbox_event;

/*
 * Inserts ev into t_outbox on conn (borrowed), which must be the connection of the database
 * whose rows the caller's open transaction changes; the row becomes visible to relays only when
 * that transaction commits. A connection whose options carry outbox_relay_on_commit wakes that
 * relay at the commit when the row falls due before the relay would look anyway; other relays
 * find it within their idle_ms. Not on the loop thread (blocking). QN_EINVAL on a missing field or
 * data_json that is not JSON, QN_ERR on other database errors (pgpool_conn_error tells).
 */
qn_status outbox_add(pgpool_conn *conn, const outbox_event *ev) QN_MUSTCHECK;
/* outbox_add of evs[0..n) in one statement (one round trip instead of n), the rows in that
 * order; nothing is inserted when any event is refused. QN_OK for n = 0. */
qn_status outbox_add_many(pgpool_conn *conn, const outbox_event *evs, size_t n) QN_MUSTCHECK;

/*
 * Cancels the pending (unsent) events with message key key, e.g. a reminder withdrawn before
 * it fires. *cancelled (may be NULL) gets the number of rows deleted. Meant to run in the
 * caller's transaction like outbox_add. An event already claimed by a relay at that moment may
 * still go out: the DELETE waits for the relay's transaction and then finds the row sent.
 */
qn_status outbox_cancel(pgpool_conn *conn, const char *key, int64_t *cancelled) QN_MUSTCHECK;

/* Count of due, unsent rows (what quan_outbox_backlog reports). */
qn_status outbox_backlog(pgpool_conn *conn, int64_t *out) QN_MUSTCHECK;

/* ---------------------------------------------------------------- relay */

typedef struct outbox_relay_opts {
    const char *dsn;         /* required: the database's DSN; copied */
    const char *ds;          /* required: data source name for logs and metrics ("ds_0"); copied */
    const char *amqp_url;    /* required; copied */
    int batch;               /* rows per transaction; default 100 */
    int poll_ms;             /* wait after a batch short of batch rows; default 200 */
    int idle_ms;             /* longest wait when nothing was due: the relay sleeps until the
                                next pending row falls due, at most this; default 1000 (rows
                                committed through outbox_relay_on_commit wake it) */
    int retention_s;         /* sent rows are deleted after this; default 86400 (24 h) */
    int confirm_timeout_ms;  /* per publish; default MQ_CONN_CONFIRM_TIMEOUT_MS */
    int backoff_min_ms;      /* first retry delay of a failed row; default 1000 */
    int backoff_max_ms;      /* cap of the doubling retry delay; default 60000 */
    int cleanup_interval_ms; /* how often sent rows are purged; default 60000 */
    int backlog_interval_ms; /* how often the backlog gauge is refreshed; default 5000 */
} outbox_relay_opts;

typedef struct outbox_relay outbox_relay;

/*
 * Starts the relay thread, which opens its own PostgreSQL and RabbitMQ connections and
 * reconnects both with backoff (100 ms .. 5 s) whenever they fail. NULL on bad options or when
 * out of memory (logged). Owned by the caller; free with outbox_relay_stop.
 */
outbox_relay *outbox_relay_start(const outbox_relay_opts *opts) QN_MUSTCHECK;

/*
 * Stops at once: the current batch ends after the publish in flight (rows not yet published
 * stay pending, untouched), the transaction commits, the connections close and the thread is
 * joined. Then frees r. NULL-safe. Any thread but the relay's.
 */
void outbox_relay_stop(outbox_relay *r);

/* Any thread: ends the relay's wait now. */
void outbox_relay_wake(outbox_relay *r);
/* A pgpool_commit_fn (pgpool_opts.on_commit = outbox_relay_on_commit, .on_commit_arg = the
 * relay of that database): a row due at due_ms (epoch ms; 0 = now) has committed, and the relay
 * is woken if it would look only after that. Any thread. */
void outbox_relay_on_commit(void *relay, int64_t due_ms);

/* Rows this relay published (acked) and publishes that failed, since start. Any thread. */
void outbox_relay_stats(const outbox_relay *r, int64_t *published, int64_t *failed);

/* The relays' metrics (registered by the service shell of a binary that runs them); their publishes
 * count in MQ_PUBLISH_METRICS (mq_publish.h). */
#define OUTBOX_METRICS(X)                                                                          \
    X(quan_outbox_backlog, GAUGE, "Outbox rows not yet published, by database.", "ds")
METRICS_DECLARE(OUTBOX_METRICS)

#endif
