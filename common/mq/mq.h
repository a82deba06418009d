/*
 * RabbitMQ for Quan (rabbitmq-c 0.11): everything of the mq family at once.
 *
 *   mq_envelope   the JSON envelope of every message, and packs of envelopes
 *   mq_conn       one connection (the one place that opens them) and the topology on it
 *   mq_publish    the publisher thread with confirms, for the event loop
 *   mq_consumer   the consumer runner: one message at a time, retries and dead letters
 *   mq_dead       retry and dead-letter bookkeeping, and the operator's list and replay
 *   mq_thread     what the threads owning connections share (stop, sleeps, backoff)
 *
 * Every message carries the header x-attempt (1 on first publish, +1 per retry) and, once it
 * has been through the retry or dead queue, x-routing-key (its original event name).
 */
#ifndef QUAN_MQ_H
#define QUAN_MQ_H

#include "mq_conn.h"
#include "mq_consumer.h"
#include "mq_dead.h"
#include "mq_envelope.h"
#include "mq_publish.h"

#endif
