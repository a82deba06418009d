/*
 * What the threads that own AMQP connections (the publisher, each consumer) share: starting and
 * joining, a stop request, sleeps that the stop cuts short, and the backoff between attempts to
 * reconnect.
 */
#ifndef QUAN_MQ_THREAD_H
#define QUAN_MQ_THREAD_H

#include <pthread.h>
#include <stdint.h>

#include "status.h"

#define MQ_THREAD_BACKOFF_MIN_MS 100
#define MQ_THREAD_BACKOFF_MAX_MS 5000

/* Embedded in its owner. mu and cv are the owner's to use as well (e.g. the publisher's queue
 * is guarded by mu and signalled through cv). */
typedef struct mq_thread {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on the monotonic clock; broadcast at stop */
    int stop;          /* atomic */
    int backoff_ms;    /* the owner thread's own */
} mq_thread;

/* Initialises t and runs fn(arg) on a new thread. On failure t is left released. */
qn_status mq_thread_start(mq_thread *t, void *(*fn)(void *), void *arg) QN_MUSTCHECK;
/* Requests the stop and wakes every sleep and wait; returns at once. */
void mq_thread_quit(mq_thread *t);
/* mq_thread_quit, then joins the thread and releases t. */
void mq_thread_stop(mq_thread *t);
/* 1 once the stop is requested. Any thread. */
int mq_thread_stopping(mq_thread *t);
/* Sleeps up to ms, less if the stop is requested. Without mu held. */
void mq_thread_sleep(mq_thread *t, int64_t ms);
/* Waits on cv up to ms with mu held (woken by the owner's signals or the stop). */
void mq_thread_wait(mq_thread *t, int64_t ms);
/* After a failed connect: sleeps the backoff and doubles it (MQ_THREAD_BACKOFF_MAX_MS at most).
 * mq_thread_connected starts it again from MQ_THREAD_BACKOFF_MIN_MS. */
void mq_thread_backoff(mq_thread *t);
void mq_thread_connected(mq_thread *t);

#endif
