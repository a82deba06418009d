/*
 * Publishing from the event loop: a publisher thread owns a connection in confirm mode, takes
 * messages from a bounded queue, sends them in a sliding window of unconfirmed publishes and
 * hands each outcome back to the loop thread through the bridge. Packable messages queued at
 * the same moment travel together as one pack (mq_envelope.h).
 */
#ifndef QUAN_MQ_PUBLISH_H
#define QUAN_MQ_PUBLISH_H

#include "bridge.h"
#include "metrics.h"
#include "mq_conn.h"
#include "status.h"

#define MQ_PUBLISH_QUEUE_MAX 4096 /* default bound of the hand-off queue */

typedef struct mq_publisher mq_publisher;

/* Runs on the loop thread (through the bridge). st as for mq_conn_publish_confirmed, plus
 * QN_EAGAIN when the broker is unreachable or the publisher was freed before the message went
 * out. The caller decides to compensate or retry. */
typedef void (*mq_publish_cb)(qn_status st, void *arg);

typedef struct mq_publisher_opts {
    const char *url;        /* copied; one URL or a list (mq_conn_connect) */
    bridge *bridge;         /* borrowed; must outlive the publisher */
    const char *name;       /* optional label: connection "quan publisher:<name>" */
    int queue_max;          /* bounded hand-off queue; 0 = MQ_PUBLISH_QUEUE_MAX */
    int confirm_timeout_ms; /* 0 = MQ_CONN_CONFIRM_TIMEOUT_MS */
} mq_publisher_opts;

/* Starts the publisher thread; it connects (and reconnects with backoff) on its own. While the
 * broker is known unreachable (the last attempt to connect failed), publishes fail at once with
 * QN_EAGAIN rather than wait for a reconnect: the caller can answer a retryable 503 now. A
 * publish made while the connection is merely lost waits for the next attempt, which comes at
 * once. NULL on failure. */
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

/* What publishing counts (here and in the outbox relays, outbox.h; registered by the service shell
 * of a binary with a publisher). */
#define MQ_PUBLISH_METRICS(X)                                                                      \
    X(quan_mq_published_total, COUNTER, "Messages published and confirmed by the broker.", "")     \
    X(quan_mq_publish_failures_total, COUNTER, "Publishes that failed or were nacked.", "")        \
    X(quan_mq_publish_duration_seconds, HISTOGRAM,                                                 \
      "Publishes of the publisher thread (/redeem-mq's claims), from the hand-off to the "         \
      "confirm or the failure: the wait for the pack in flight, then the pack's own round.",       \
      "")
METRICS_DECLARE(MQ_PUBLISH_METRICS)

#endif
