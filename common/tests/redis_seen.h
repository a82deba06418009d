/*
 * What the redis.c tests share: a callback that records what it saw, and loop runners that
 * turn the event loop until a flag is set (or a timeout passes), or for a while.
 */
#ifndef QUAN_REDIS_SEEN_H
#define QUAN_REDIS_SEEN_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include <event2/event.h>

#include "now.h"
#include "redis.h"

/* What a callback saw; calls counts invocations (must end at exactly 1). */
typedef struct {
    int calls;
    int has_reply;
    int type;
    long long integer;
    char str[256];
    char err[256];
} seen;

static inline void record_cb(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    seen *s = arg;
    (void)c;
    s->calls++;
    s->has_reply = r != NULL;
    s->type = r ? r->type : -1;
    s->integer = r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    snprintf(s->str, sizeof(s->str), "%s", r && r->str ? r->str : "");
    snprintf(s->err, sizeof(s->err), "%s", err ? err : "");
}

/* Runs the loop until *flag becomes nonzero or timeout_ms passes; returns *flag. */
static inline int run_until(struct event_base *base, const int *flag, int timeout_ms)
{
    int64_t end = now_mono_ms() + timeout_ms;
    while (!*flag && now_mono_ms() < end) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (!*flag)
            usleep(1000);
    }
    return *flag;
}

/* Runs the loop for ms. */
static inline void run_for(struct event_base *base, int ms)
{
    int never = 0;
    run_until(base, &never, ms);
}

#endif
