/* now.h: the two clocks agree with the system's, move forward, and deadlines normalize. */
#include <stdint.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "now.h"
#include "testhelp.h"

/* Bounded by gettimeofday read before and after: time() reads a coarse clock that can lag
 * CLOCK_REALTIME by a tick, so near a second's edge it made the bound fail. */
static int64_t tod_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void test_wall(void)
{
    for (int i = 0; i < 1000; i++) {
        int64_t before = tod_ms();
        int64_t ms = now_wall_ms();
        int64_t after = tod_ms();
        CHECK(ms >= before && ms <= after);
        CHECK(ms > (int64_t)1700000000 * 1000); /* seconds, not ms, would fail this */
    }
}

static void test_mono(void)
{
    int64_t a = now_mono_ms();
    double s0 = now_mono_s();
    usleep(20000);
    int64_t b = now_mono_ms();
    double s1 = now_mono_s();
    CHECK(b - a >= 19 && b - a < 2000);
    CHECK(s1 - s0 >= 0.019 && s1 - s0 < 2.0);
    CHECK(s0 * 1000 >= (double)a - 1 && s0 * 1000 <= (double)b + 1);
}

static void test_deadline(void)
{
    for (int64_t ms = 0; ms < 2500; ms += 97) {
        int64_t before = now_mono_ms();
        struct timespec d = now_deadline(CLOCK_MONOTONIC, ms);
        int64_t at = (int64_t)d.tv_sec * 1000 + d.tv_nsec / 1000000;
        CHECK(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
        CHECK(at >= before + ms && at <= now_mono_ms() + ms);
    }
    struct timespec w = now_deadline(CLOCK_REALTIME, 1000);
    int64_t at = (int64_t)w.tv_sec * 1000 + w.tv_nsec / 1000000;
    CHECK(at - now_wall_ms() > 900 && at - now_wall_ms() <= 1000);
}

int main(void)
{
    RUN(test_wall);
    RUN(test_mono);
    RUN(test_deadline);
    TEST_MAIN_END();
}
