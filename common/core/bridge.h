/*
 * Hands work from any thread to the event-loop thread. Worker threads (PostgreSQL pool,
 * RabbitMQ publisher and consumers) finish blocking calls off the loop, then post a callback
 * here; the callback runs on the loop thread, in posting order.
 */
#ifndef QUAN_BRIDGE_H
#define QUAN_BRIDGE_H

#include <event2/event.h>

#include "status.h"

typedef struct bridge bridge;
typedef void (*bridge_fn)(void *arg);

/* Owned by the caller; free with bridge_free after the loop has stopped. NULL on failure. */
bridge *bridge_new(struct event_base *base);
/* Runs the callbacks still queued, then frees. */
void bridge_free(bridge *b);
/* Thread-safe. fn(arg) will run on the loop thread. Fails only when out of memory. */
qn_status bridge_post(bridge *b, bridge_fn fn, void *arg) QN_MUSTCHECK;

#endif
