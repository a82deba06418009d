/*
 * A separate process contending for a lock.c lock, for test_lock.
 * Env: QUAN_REDIS_HOST, QUAN_REDIS_PORT, QUAN_LUA_DIR (default ./lua-scripts).
 *
 *   helper_lockholder hold NAME HOLD_MS STRATEGY WAIT_MS LEASE_MS [WATCHDOG_MS]
 *       prints "ACQUIRED <token>", holds HOLD_MS, releases, prints "RELEASED <0|1>", exit 0;
 *       if not acquired prints "OUTCOME <outcome>" and exits 3.
 *   helper_lockholder count NAME COUNTER_KEY ITERATIONS GAP_MS [nolock]
 *       ITERATIONS times: lock (keep_retry, lease 5 s), GET counter, wait GAP_MS, SET counter+1,
 *       unlock. "nolock" skips the lock (to show the race). Prints "DONE <n>", exit 0.
 * Exit 2 on usage or connection errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "lock.h"
#include "log.h"
#include "redis.h"

typedef struct {
    struct event_base *base;
    redis_client *c;
    struct event *timer;
    lock_opts lo;
    lock_handle *h;
    int exit_code;
    /* count mode */
    const char *counter_key;
    int iterations, done, gap_ms, use_lock;
    long long value;
    /* hold mode */
    int hold_ms;
    enum { PH_WAIT_READY, PH_HOLD, PH_GAP } phase; /* what the one timer means now */
} helper;

static void after_ms(helper *hp, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(hp->timer, &tv);
}

static void finish(helper *hp, int code)
{
    hp->exit_code = code;
    event_base_loopbreak(hp->base);
}

/* ---------------------------------------------------------------- hold */

static void on_hold_released(int released, void *arg)
{
    helper *hp = arg;
    printf("RELEASED %d\n", released);
    fflush(stdout);
    finish(hp, 0);
}

static void on_hold_timer(evutil_socket_t fd, short what, void *arg)
{
    helper *hp = arg;
    (void)fd, (void)what;
    lock_release(hp->h, on_hold_released, hp);
}

static void on_hold_lock(lock_handle *h, lock_outcome o, void *arg)
{
    helper *hp = arg;
    if (o != LOCK_ACQUIRED) {
        printf("OUTCOME %s\n", lock_outcome_str(o));
        fflush(stdout);
        finish(hp, 3);
        return;
    }
    hp->h = h;
    printf("ACQUIRED %s\n", lock_handle_token(h));
    fflush(stdout);
    hp->phase = PH_HOLD;
    after_ms(hp, hp->hold_ms);
}

/* ---------------------------------------------------------------- count */

static void count_next(helper *hp);

static void on_count_released(int released, void *arg)
{
    helper *hp = arg;
    if (!released)
        fprintf(stderr, "helper: release found the lock not ours\n");
    hp->done++;
    count_next(hp);
}

static void on_count_set(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    helper *hp = arg;
    (void)c, (void)r;
    if (err) {
        fprintf(stderr, "helper: SET failed: %s\n", err);
        finish(hp, 2);
        return;
    }
    if (hp->use_lock) {
        lock_release(hp->h, on_count_released, hp);
        return;
    }
    hp->done++;
    count_next(hp);
}

static void on_count_gap(evutil_socket_t fd, short what, void *arg)
{
    helper *hp = arg;
    (void)fd, (void)what;
    if (redis_command(hp->c, on_count_set, hp, "SET %s %lld", hp->counter_key, hp->value + 1) !=
        QN_OK)
        finish(hp, 2);
}

static void on_count_get(redis_client *c, const redisReply *r, const char *err, void *arg)
{
    helper *hp = arg;
    (void)c;
    if (err) {
        fprintf(stderr, "helper: GET failed: %s\n", err);
        finish(hp, 2);
        return;
    }
    hp->value = r->type == REDIS_REPLY_STRING ? atoll(r->str) : 0;
    /* The gap between the read and the write is what makes the unlocked variant lose updates. */
    hp->phase = PH_GAP;
    after_ms(hp, hp->gap_ms);
}

static void count_locked(helper *hp)
{
    if (redis_command(hp->c, on_count_get, hp, "GET %s", hp->counter_key) != QN_OK)
        finish(hp, 2);
}

static void on_count_lock(lock_handle *h, lock_outcome o, void *arg)
{
    helper *hp = arg;
    if (o != LOCK_ACQUIRED) {
        fprintf(stderr, "helper: lock: %s\n", lock_outcome_str(o));
        finish(hp, 2);
        return;
    }
    hp->h = h;
    count_locked(hp);
}

static void count_next(helper *hp)
{
    if (hp->done == hp->iterations) {
        printf("DONE %d\n", hp->done);
        fflush(stdout);
        finish(hp, 0);
        return;
    }
    if (!hp->use_lock) {
        count_locked(hp);
        return;
    }
    if (lock_acquire(hp->c, &hp->lo, on_count_lock, hp) != QN_OK)
        finish(hp, 2);
}

/* ---------------------------------------------------------------- main */

static void start(helper *hp, const char *mode)
{
    if (strcmp(mode, "hold") == 0) {
        if (lock_acquire(hp->c, &hp->lo, on_hold_lock, hp) != QN_OK)
            finish(hp, 2);
        return;
    }
    count_next(hp);
}

static const char *g_mode;

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    helper *hp = arg;
    if (hp->phase == PH_HOLD) {
        on_hold_timer(fd, what, arg);
        return;
    }
    if (hp->phase == PH_GAP) {
        on_count_gap(fd, what, arg);
        return;
    }
    if (!redis_client_ready(hp->c)) {
        after_ms(hp, 5);
        return;
    }
    start(hp, g_mode);
}

int main(int argc, char **argv)
{
    helper hp = {0};
    const char *host = getenv("QUAN_REDIS_HOST"), *port = getenv("QUAN_REDIS_PORT");
    const char *lua = getenv("QUAN_LUA_DIR");
    redis_opts ro = {0};
    int ok_args;

    log_init("helper_lockholder", LOGL_OFF);
    ok_args = argc >= 2 && ((strcmp(argv[1], "hold") == 0 && argc >= 7) ||
                            (strcmp(argv[1], "count") == 0 && argc >= 6));
    if (!ok_args || !host || !port) {
        fprintf(stderr, "usage: see common/tests/helper_lockholder.c\n");
        return 2;
    }
    g_mode = argv[1];
    hp.lo.name = argv[2];
    if (strcmp(argv[1], "hold") == 0) {
        hp.hold_ms = atoi(argv[3]);
        if (lock_strategy_parse(argv[4], &hp.lo.strategy) != QN_OK) {
            fprintf(stderr, "helper: unknown strategy %s\n", argv[4]);
            return 2;
        }
        hp.lo.wait_ms = atoll(argv[5]);
        hp.lo.lease_ms = atoll(argv[6]);
        hp.lo.watchdog_ms = argc >= 8 ? atoll(argv[7]) : 0;
    } else {
        hp.counter_key = argv[3];
        hp.iterations = atoi(argv[4]);
        hp.gap_ms = atoi(argv[5]);
        hp.use_lock = !(argc >= 7 && strcmp(argv[6], "nolock") == 0);
        hp.lo.strategy = LOCK_KEEP_RETRY;
        hp.lo.lease_ms = 5000;
    }
    hp.base = event_base_new();
    ro.host = host;
    ro.port = atoi(port);
    ro.lua_dir = lua && *lua ? lua : "lua-scripts";
    hp.c = hp.base ? redis_client_new(hp.base, &ro) : NULL;
    hp.timer = hp.base ? event_new(hp.base, -1, 0, on_timer, &hp) : NULL;
    if (!hp.c || !hp.timer) {
        fprintf(stderr, "helper: cannot set up\n");
        return 2;
    }
    hp.exit_code = 2;
    after_ms(&hp, 0);
    event_base_dispatch(hp.base);
    event_free(hp.timer);
    redis_client_free(hp.c);
    event_base_free(hp.base);
    return hp.exit_code;
}
