/* The threads that own AMQP connections (mq_thread.h). */
#include "mq_thread.h"
#include "now.h"

#include <time.h>

qn_status mq_thread_start(mq_thread *t, void *(*fn)(void *), void *arg)
{
    pthread_condattr_t a;

    t->stop = 0;
    t->backoff_ms = MQ_THREAD_BACKOFF_MIN_MS;
    pthread_mutex_init(&t->mu, NULL);
    /* the monotonic clock: wall-clock jumps do not stretch waits */
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &a);
    pthread_condattr_destroy(&a);
    if (pthread_create(&t->th, NULL, fn, arg) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        return QN_ERR;
    }
    return QN_OK;
}

void mq_thread_quit(mq_thread *t)
{
    pthread_mutex_lock(&t->mu);
    __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void mq_thread_stop(mq_thread *t)
{
    mq_thread_quit(t);
    pthread_join(t->th, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

int mq_thread_stopping(mq_thread *t)
{
    return __atomic_load_n(&t->stop, __ATOMIC_ACQUIRE);
}

void mq_thread_wait(mq_thread *t, int64_t ms)
{
    struct timespec until = now_deadline(CLOCK_MONOTONIC, ms);
    pthread_cond_timedwait(&t->cv, &t->mu, &until);
}

void mq_thread_sleep(mq_thread *t, int64_t ms)
{
    int64_t until = now_mono_ms() + ms;

    pthread_mutex_lock(&t->mu);
    while (!mq_thread_stopping(t) && now_mono_ms() < until)
        mq_thread_wait(t, until - now_mono_ms());
    pthread_mutex_unlock(&t->mu);
}

void mq_thread_backoff(mq_thread *t)
{
    mq_thread_sleep(t, t->backoff_ms);
    t->backoff_ms =
        t->backoff_ms * 2 > MQ_THREAD_BACKOFF_MAX_MS ? MQ_THREAD_BACKOFF_MAX_MS : t->backoff_ms * 2;
}

void mq_thread_connected(mq_thread *t)
{
    t->backoff_ms = MQ_THREAD_BACKOFF_MIN_MS;
}
