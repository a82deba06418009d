/*
 * The clocks, read one way everywhere (header only).
 *
 * Wall time (CLOCK_REALTIME) is for what is stored or compared with stored times: validity
 * windows, ids, timestamps in events. Monotonic time (CLOCK_MONOTONIC) is for durations,
 * timeouts and backoff, which a wall-clock step must not stretch or shrink.
 */
#ifndef QUAN_NOW_H
#define QUAN_NOW_H

#include <stdint.h>
#include <time.h>

/* Milliseconds since the Unix epoch. */
static inline int64_t now_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds of the monotonic clock: only differences mean anything. */
static inline int64_t now_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds of the monotonic clock with sub-millisecond precision, for latencies. */
static inline double now_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * The moment ms (>= 0) from now on clock, for pthread_cond_timedwait: CLOCK_MONOTONIC for a
 * condition variable made with pthread_condattr_setclock, else CLOCK_REALTIME.
 */
static inline struct timespec now_deadline(clockid_t clock, int64_t ms)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
