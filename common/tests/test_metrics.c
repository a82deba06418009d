#include <event2/buffer.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "testhelp.h"

/* The metrics these tests update, listed as a module lists its own. */
#define TEST_METRICS(X)                                                                            \
    X(test_plain_total, COUNTER, "A counter without labels.", "")                                  \
    X(test_failures_total, COUNTER, "Another one, for the threads.", "")                           \
    X(test_in_use, GAUGE, "A gauge by database.", "ds")                                            \
    X(test_outcomes_total, COUNTER, "A counter by outcome.", "outcome")                            \
    X(test_consumed_total, COUNTER, "A counter of two labels.", "queue,outcome")                   \
    X(test_requests_total, COUNTER, "Requests by route and status.", "route,status")               \
    X(test_duration_seconds, HISTOGRAM, "Latency by route and status.", "route,status")
METRICS_DEFINE(TEST_METRICS)

/* Two modules' lists, as their descriptors name them: the second names the first's shared
 * family too. The shell never registers TEST_LATE_METRICS. */
#define TEST_MOD_A_METRICS(X)                                                                      \
    X(test_mod_a_total, COUNTER, "Module a's own.", "")                                            \
    X(test_shared_total, COUNTER, "Updated by both modules.", "outcome")
#define TEST_MOD_B_METRICS(X)                                                                      \
    X(test_mod_b_seconds, HISTOGRAM, "Module b's own.", "")                                        \
    X(test_mod_b_gauge, GAUGE, "Module b's own gauge.", "")
METRICS_DEFINE(TEST_MOD_A_METRICS)
METRICS_DEFINE(TEST_MOD_B_METRICS)
#define TEST_LATE_METRICS(X) X(test_late_total, COUNTER, "In no module's list.", "")
METRICS_DEFINE(TEST_LATE_METRICS)

/* Renders the registry into a malloc'd NUL-terminated string (caller frees). */
static char *render(void)
{
    struct evbuffer *b = evbuffer_new();
    char *s = NULL;
    if (!b)
        return NULL;
    if (metrics_render(b) != QN_OK)
        goto done;
    size_t n = evbuffer_get_length(b);
    s = malloc(n + 1);
    if (s) {
        evbuffer_remove(b, s, n);
        s[n] = '\0';
    }
done:
    evbuffer_free(b);
    return s;
}

/* Feeds text to the real Prometheus parser; returns its exit status. */
static int prom_parse_q(const char *text, int quiet)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import sys; from prometheus_client.parser import "
             "text_string_to_metric_families as p; list(p(sys.stdin.read()))'%s",
             quiet ? " 2>/dev/null" : "");
    fflush(stdout);
    FILE *p = popen(cmd, "w");
    if (!p)
        return -1;
    fputs(text, p);
    return pclose(p);
}

static int prom_parse(const char *text)
{
    return prom_parse_q(text, 0);
}

/* How many times needle is in text. */
static int count_of(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* How many times a render holds needle; -1 when it could not render. */
static int rendered(const char *needle)
{
    char *txt = render();
    int n = txt ? count_of(txt, needle) : -1;
    free(txt);
    return n;
}

/* Where needle first is in text; -1 when it is not. */
static long pos_of(const char *text, const char *needle)
{
    const char *p = strstr(text, needle);
    return p ? p - text : -1;
}

/* Modules' lists registered as the shell registers their descriptors': every family listed once,
 * in registration order, from the first render on (no sample before an update); a family in
 * both lists stays where the first put it. */
static void test_register(void)
{
    static metrics_family *const mod_a[] = {METRICS_REFS(TEST_MOD_A_METRICS) NULL};
    static metrics_family *const mod_b[] = {&metric_test_shared_total,
                                            METRICS_REFS(TEST_MOD_B_METRICS) NULL};
    static const char *const types[] = {
        "# TYPE test_mod_a_total counter\n", "# TYPE test_shared_total counter\n",
        "# TYPE test_mod_b_seconds histogram\n", "# TYPE test_mod_b_gauge gauge\n"};
    metrics_register(mod_a);
    metrics_register(mod_b);
    metrics_register(mod_a);
    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        CHECK_EQ_INT(count_of(txt, types[i]), 1);
        if (i > 0)
            CHECK(pos_of(txt, types[i - 1]) < pos_of(txt, types[i]));
    }
    CHECK(strstr(txt, "# HELP test_shared_total Updated by both modules.\n") != NULL);
    CHECK(strstr(txt, "\ntest_mod_a_total ") == NULL);
    CHECK(strstr(txt, "\ntest_mod_b_seconds_count ") == NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    free(txt);

    /* An update adds the sample under the family's one listing. */
    metrics_inc_l(&metric_test_shared_total, "ok");
    metrics_observe(&metric_test_mod_b_seconds, 0.01);
    CHECK_EQ_INT(rendered(types[1]), 1);
    CHECK_EQ_INT(rendered("test_shared_total{outcome=\"ok\"} 1\n"), 1);
    CHECK_EQ_INT(rendered("test_mod_b_seconds_count 1\n"), 1);
}

/* A family in no list is listed from its first series on, after those registered. */
static void test_unregistered_update(void)
{
    CHECK_EQ_INT(rendered("test_late_total"), 0);
    metrics_add(&metric_test_late_total, 3);
    CHECK_EQ_INT(rendered("# TYPE test_late_total counter\n"), 1);
    CHECK_EQ_INT(rendered("\ntest_late_total 3\n"), 1);
}

/* metrics_shutdown empties the registry: a list registered again is listed again, once. */
static void test_register_after_shutdown(void)
{
    static metrics_family *const mod_a[] = {METRICS_REFS(TEST_MOD_A_METRICS) NULL};
    metrics_register(mod_a);
    metrics_shutdown();
    metrics_init("test", "1.2.3");
    CHECK_EQ_INT(rendered("test_mod_a_total"), 0);
    CHECK_EQ_INT(rendered("# TYPE quan_build_info gauge\n"), 1);
    metrics_register(mod_a);
    metrics_register(mod_a);
    CHECK_EQ_INT(rendered("# TYPE test_mod_a_total counter\n"), 1);
    CHECK_EQ_INT(rendered("# TYPE test_shared_total counter\n"), 1);
    CHECK_EQ_INT(rendered("# TYPE quan_build_info gauge\n"), 1);
}

static void test_counter_and_gauge(void)
{
    int64_t before = metrics_get(&metric_test_plain_total);
    metrics_inc(&metric_test_plain_total);
    metrics_add(&metric_test_plain_total, 4);
    CHECK_EQ_INT(metrics_get(&metric_test_plain_total), before + 5);

    metrics_set_l(&metric_test_in_use, 7, "ds_0");
    metrics_set_l(&metric_test_in_use, 2, "ds_1");
    metrics_add_l(&metric_test_in_use, -3, "ds_0");
    CHECK_EQ_INT(metrics_get_l(&metric_test_in_use, "ds_0"), 4);
    CHECK_EQ_INT(metrics_get_l(&metric_test_in_use, "ds_1"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_test_in_use, "ds_9"), 0);

    metrics_inc_l(&metric_test_outcomes_total, "success");
    metrics_inc_l(&metric_test_outcomes_total, "success");
    metrics_inc_l(&metric_test_outcomes_total, "sold_out");
    CHECK_EQ_INT(metrics_get_l(&metric_test_outcomes_total, "success"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_test_outcomes_total, "sold_out"), 1);

    /* A wrong label count is refused, not stored under a truncated key. */
    metrics_inc_l(&metric_test_consumed_total, "only-one");
    CHECK_EQ_INT(metrics_get_l(&metric_test_consumed_total, "only-one", "ack"), 0);

    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    CHECK(strstr(txt, "# TYPE test_outcomes_total counter\n") != NULL);
    CHECK(strstr(txt, "# HELP test_outcomes_total ") != NULL);
    CHECK(strstr(txt, "test_outcomes_total{outcome=\"success\"} 2\n") != NULL);
    CHECK(strstr(txt, "test_in_use{ds=\"ds_0\"} 4\n") != NULL);
    CHECK(strstr(txt, "# TYPE test_in_use gauge\n") != NULL);
    CHECK(strstr(txt, "quan_build_info{version=\"1.2.3\",service=\"test\"} 1\n") != NULL);
    CHECK(strstr(txt, "\nquan_process_resident_memory_bytes ") != NULL);
    CHECK(strstr(txt, "quan_process_resident_memory_bytes 0\n") == NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    free(txt);
}

static void test_label_escaping(void)
{
    metrics_inc_l(&metric_test_consumed_total, "q\\a\"b\nc", "ack");
    CHECK_EQ_INT(metrics_get_l(&metric_test_consumed_total, "q\\a\"b\nc", "ack"), 1);
    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    CHECK(strstr(txt, "test_consumed_total{queue=\"q\\\\a\\\"b\\nc\",outcome=\"ack\"} 1\n") !=
          NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    /* The checker itself must be able to fail: an unescaped quote is rejected. */
    CHECK(prom_parse_q("# TYPE x counter\nx{a=\"b\"c\"} 1\n", 1) != 0);
    free(txt);
}

static void test_histogram(void)
{
    metrics_family *h = &metric_test_duration_seconds;
    metrics_observe_l(h, 0.0003, "/h", "200"); /* le 0.0005 */
    metrics_observe_l(h, 0.001, "/h", "200");  /* exactly on a bound: le 0.001 */
    metrics_observe_l(h, 0.2, "/h", "200");    /* le 0.25 */
    metrics_observe_l(h, 42, "/h", "200");     /* +Inf only */
    CHECK_EQ_INT(metrics_get_l(h, "/h", "200"), 4);
    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    const char *p = "test_duration_seconds_bucket{route=\"/h\",status=\"200\",";
    char want[256];
    static const struct {
        const char *le;
        int n;
    } exp[] = {{"0.0005", 1}, {"0.001", 2}, {"0.0025", 2}, {"0.1", 2},
               {"0.25", 3},   {"10", 3},    {"+Inf", 4}};
    for (size_t i = 0; i < sizeof(exp) / sizeof(exp[0]); i++) {
        snprintf(want, sizeof(want), "%sle=\"%s\"} %d\n", p, exp[i].le, exp[i].n);
        CHECK(strstr(txt, want) != NULL);
    }
    CHECK(strstr(txt, "test_duration_seconds_count{route=\"/h\",status=\"200\"} 4\n") != NULL);
    CHECK(strstr(txt, "test_duration_seconds_sum{route=\"/h\",status=\"200\"} "
                      "42.201300000\n") != NULL);
    CHECK(strstr(txt, "# TYPE test_duration_seconds histogram\n") != NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    free(txt);
}

static void test_cardinality_cap(void)
{
    char v[32];
    for (int i = 0; i < METRICS_MAX_SERIES + 50; i++) {
        snprintf(v, sizeof(v), "q%d", i);
        metrics_inc_l(&metric_test_consumed_total, v, "skip");
    }
    /* Earlier series (3 from above) plus new ones fill the table; the rest go to other. */
    CHECK(metrics_get_l(&metric_test_consumed_total, "other", "other") >= 50);
    CHECK_EQ_INT(metrics_get_l(&metric_test_consumed_total, "q0", "skip"), 1);
    char *txt = render();
    CHECK(txt != NULL);
    if (txt) {
        CHECK_EQ_INT(prom_parse(txt), 0);
        free(txt);
    }
}

#define NTHREADS 4
#define NITER    100000

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < NITER; i++) {
        metrics_inc(&metric_test_failures_total);
        metrics_inc_l(&metric_test_outcomes_total, (i & 1) ? "limit" : "window");
        metrics_observe_l(&metric_test_duration_seconds, 0.003, "/c", "200");
    }
    return NULL;
}

static void test_concurrent(void)
{
    pthread_t t[NTHREADS];
    int64_t before = metrics_get(&metric_test_failures_total);
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&t[i], NULL, hammer, NULL) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_INT(metrics_get(&metric_test_failures_total) - before, (int64_t)NTHREADS * NITER);
    CHECK_EQ_INT(metrics_get_l(&metric_test_outcomes_total, "limit"), NTHREADS * NITER / 2);
    CHECK_EQ_INT(metrics_get_l(&metric_test_outcomes_total, "window"), NTHREADS * NITER / 2);
    CHECK_EQ_INT(metrics_get_l(&metric_test_duration_seconds, "/c", "200"), NTHREADS * NITER);
}

/* A series handle updates what the labelled calls read; metrics_shutdown invalidates it. */
static void test_series_handle(void)
{
    metrics_series *c =
        metrics_series_of(&metric_test_requests_total, (const char *const[]){"/sh", "200", NULL});
    metrics_series *h =
        metrics_series_of(&metric_test_duration_seconds, (const char *const[]){"/sh", "200", NULL});
    CHECK(c != NULL && h != NULL);
    CHECK(metrics_series_of(&metric_test_requests_total, (const char *const[]){"/sh", NULL}) ==
          NULL); /* a label short */
    CHECK(c == metrics_series_of(&metric_test_requests_total,
                                 (const char *const[]){"/sh", "200", NULL}));
    metrics_series_add(c, 2);
    metrics_series_add(h, 5);       /* not a counter: ignored */
    metrics_series_observe(c, 0.1); /* not a histogram: ignored */
    metrics_series_observe(h, 0.002);
    metrics_series_add(NULL, 1);
    metrics_series_observe(NULL, 1);
    CHECK_EQ_INT(metrics_get_l(&metric_test_requests_total, "/sh", "200"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_test_duration_seconds, "/sh", "200"), 1);
    metrics_inc_l(&metric_test_requests_total, "/sh", "200");
    CHECK_EQ_INT(metrics_get_l(&metric_test_requests_total, "/sh", "200"), 3);
    unsigned gen = metrics_generation();
    CHECK(gen != 0);
    metrics_shutdown();
    CHECK(metrics_generation() != gen);
    CHECK_EQ_INT(metrics_get_l(&metric_test_requests_total, "/sh", "200"), 0);
    metrics_init("test", "1.2.3");
}

/* A kept handle follows the registry across metrics_shutdown. */
static void test_kept_handle(void)
{
    static const char *const labels[] = {"/kh", "200", NULL};
    metrics_handle k = {0};
    metrics_series *s = metrics_handle_series(&k, &metric_test_requests_total, labels);
    CHECK(s != NULL);
    CHECK(metrics_handle_series(&k, &metric_test_requests_total, labels) == s);
    metrics_series_add(s, 4);
    CHECK_EQ_INT(metrics_get_l(&metric_test_requests_total, "/kh", "200"), 4);
    metrics_shutdown();
    metrics_init("test", "1.2.3");
    metrics_series_add(metrics_handle_series(&k, &metric_test_requests_total, labels), 1);
    CHECK_EQ_INT(metrics_get_l(&metric_test_requests_total, "/kh", "200"), 1);
}

int main(void)
{
    log_init("test", LOGL_OFF);
    metrics_init("test", "1.2.3");
    RUN(test_register);
    RUN(test_unregistered_update);
    RUN(test_counter_and_gauge);
    RUN(test_label_escaping);
    RUN(test_histogram);
    RUN(test_kept_handle);
    RUN(test_concurrent);
    RUN(test_series_handle);
    RUN(test_cardinality_cap);
    RUN(test_register_after_shutdown);
    metrics_shutdown();
    TEST_MAIN_END();
}
