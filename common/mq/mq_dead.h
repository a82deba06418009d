/*
 * Retries and dead letters. A consumer that cannot handle a message now moves a copy of it to
 * quan.<name>.retry (it comes back after the retry delay) or to quan.<name>.dead, with
 * bookkeeping headers, confirmed before the original is acked: a crash in between duplicates
 * the message, never loses it.
 *
 *   x-attempt      deliveries so far: 1 on first publish, +1 per counted retry
 *   x-requeues     retries that did not count as attempts (MQ_REQUEUE_LATER)
 *   x-routing-key  the original event name (retry and dead queues are reached through the
 *                  default exchange, which loses it)
 *   x-dead-reason  why it is dead (max-attempts, requeue-limit, handler, malformed, ...)
 *
 * Operators list the dead-letter queue and replay it (quan-dlq).
 */
#ifndef QUAN_MQ_DEAD_H
#define QUAN_MQ_DEAD_H

#include <stddef.h>

#include <amqp.h>

#include "mq_conn.h"
#include "status.h"

/* The bookkeeping of one message. Strings borrowed. */
typedef struct mq_dead_marks {
    int attempt;             /* >= 1 */
    int requeues;            /* >= 0 */
    const char *routing_key; /* the original event name */
    const char *reason;      /* x-dead-reason; NULL on the way to the retry queue */
} mq_dead_marks;

/* The marks of a delivered message; the routing key (x-routing-key, else the delivery's) is
 * copied into rk (MQ_CONN_NAME_MAX bytes), reason is NULL. */
void mq_dead_marks_read(const amqp_basic_properties_t *p, amqp_bytes_t delivery_rk,
                        mq_dead_marks *out, char rk[MQ_CONN_NAME_MAX]);

/* Publishes a copy of msg to queue (through the default exchange) with the marks as headers
 * (the broker's x-death headers dropped) and waits up to timeout_ms for the confirm (c in
 * confirm mode). QN_OK: the broker has it; ack the original only then. */
qn_status mq_dead_move(mq_conn *c, const amqp_message_t *msg, const char *queue,
                       const mq_dead_marks *m, int timeout_ms) QN_MUSTCHECK;

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

/* Borrowed for the duration of the call: 1 keeps the message, 0 dead-letters it. */
typedef int (*mq_dead_keep_fn)(const char *body, size_t len, void *arg);
/* Sorts the messages that are in quan.<name> and quan.<name>.retry when it starts: each one
 * keep() refuses goes to quan.<name>.dead with x-dead-reason reason, each one it keeps back to
 * quan.<name> (attempt and routing key kept), each copy confirmed before the original is acked.
 * Messages a consumer holds unacknowledged are not seen: stop the consumers first. Queues that
 * do not exist hold nothing. *kept and *dead get the counts. */
qn_status mq_dead_sort(const char *url, const char *name, mq_dead_keep_fn keep, void *arg,
                       const char *reason, int *kept, int *dead) QN_MUSTCHECK;

#endif
