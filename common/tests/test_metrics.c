#include <event2/buffer.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "testhelp.h"

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

static void test_counter_and_gauge(void)
{
    int64_t before = metrics_get(&metric_quan_mq_published_total);
    metrics_inc(&metric_quan_mq_published_total);
    metrics_add(&metric_quan_mq_published_total, 4);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_published_total), before + 5);

    metrics_set_l(&metric_quan_pg_pool_in_use, 7, "ds_0");
    metrics_set_l(&metric_quan_pg_pool_in_use, 2, "ds_1");
    metrics_add_l(&metric_quan_pg_pool_in_use, -3, "ds_0");
    CHECK_EQ_INT(metrics_get_l(&metric_quan_pg_pool_in_use, "ds_0"), 4);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_pg_pool_in_use, "ds_1"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_pg_pool_in_use, "ds_9"), 0);

    metrics_inc_l(&metric_quan_claims_total, "success");
    metrics_inc_l(&metric_quan_claims_total, "success");
    metrics_inc_l(&metric_quan_claims_total, "sold_out");
    CHECK_EQ_INT(metrics_get_l(&metric_quan_claims_total, "success"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_claims_total, "sold_out"), 1);

    /* A wrong label count is refused, not stored under a truncated key. */
    metrics_inc_l(&metric_quan_mq_consumed_total, "only-one");
    CHECK_EQ_INT(metrics_get_l(&metric_quan_mq_consumed_total, "only-one", "ack"), 0);

    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    CHECK(strstr(txt, "# TYPE quan_claims_total counter\n") != NULL);
    CHECK(strstr(txt, "# HELP quan_claims_total ") != NULL);
    CHECK(strstr(txt, "quan_claims_total{outcome=\"success\"} 2\n") != NULL);
    CHECK(strstr(txt, "quan_pg_pool_in_use{ds=\"ds_0\"} 4\n") != NULL);
    CHECK(strstr(txt, "# TYPE quan_pg_pool_in_use gauge\n") != NULL);
    CHECK(strstr(txt, "quan_build_info{version=\"1.2.3\",service=\"test\"} 1\n") != NULL);
    CHECK(strstr(txt, "\nquan_process_resident_memory_bytes ") != NULL);
    CHECK(strstr(txt, "quan_process_resident_memory_bytes 0\n") == NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    free(txt);
}

static void test_label_escaping(void)
{
    metrics_inc_l(&metric_quan_mq_consumed_total, "q\\a\"b\nc", "ack");
    CHECK_EQ_INT(metrics_get_l(&metric_quan_mq_consumed_total, "q\\a\"b\nc", "ack"), 1);
    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    CHECK(strstr(txt, "quan_mq_consumed_total{queue=\"q\\\\a\\\"b\\nc\",outcome=\"ack\"} 1\n") !=
          NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    /* The checker itself must be able to fail: an unescaped quote is rejected. */
    CHECK(prom_parse_q("# TYPE x counter\nx{a=\"b\"c\"} 1\n", 1) != 0);
    free(txt);
}

static void test_histogram(void)
{
    metrics_family *h = &metric_quan_http_request_duration_seconds;
    metrics_observe_l(h, 0.0003, "/h", "200"); /* le 0.0005 */
    metrics_observe_l(h, 0.001, "/h", "200");  /* exactly on a bound: le 0.001 */
    metrics_observe_l(h, 0.2, "/h", "200");    /* le 0.25 */
    metrics_observe_l(h, 42, "/h", "200");     /* +Inf only */
    CHECK_EQ_INT(metrics_get_l(h, "/h", "200"), 4);
    char *txt = render();
    CHECK(txt != NULL);
    if (!txt)
        return;
    const char *p = "quan_http_request_duration_seconds_bucket{route=\"/h\",status=\"200\",";
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
    CHECK(
        strstr(txt, "quan_http_request_duration_seconds_count{route=\"/h\",status=\"200\"} 4\n") !=
        NULL);
    CHECK(strstr(txt, "quan_http_request_duration_seconds_sum{route=\"/h\",status=\"200\"} "
                      "42.201300000\n") != NULL);
    CHECK(strstr(txt, "# TYPE quan_http_request_duration_seconds histogram\n") != NULL);
    CHECK_EQ_INT(prom_parse(txt), 0);
    free(txt);
}

static void test_cardinality_cap(void)
{
    char v[32];
    for (int i = 0; i < METRICS_MAX_SERIES + 50; i++) {
        snprintf(v, sizeof(v), "q%d", i);
        metrics_inc_l(&metric_quan_mq_consumed_total, v, "skip");
    }
    /* Earlier series (3 from above) plus new ones fill the table; the rest go to other. */
    CHECK(metrics_get_l(&metric_quan_mq_consumed_total, "other", "other") >= 50);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_mq_consumed_total, "q0", "skip"), 1);
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
        metrics_inc(&metric_quan_mq_publish_failures_total);
        metrics_inc_l(&metric_quan_claims_total, (i & 1) ? "limit" : "window");
        metrics_observe_l(&metric_quan_http_request_duration_seconds, 0.003, "/c", "200");
    }
    return NULL;
}

static void test_concurrent(void)
{
    pthread_t t[NTHREADS];
    int64_t before = metrics_get(&metric_quan_mq_publish_failures_total);
    for (int i = 0; i < NTHREADS; i++)
        CHECK(pthread_create(&t[i], NULL, hammer, NULL) == 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_publish_failures_total) - before,
                 (int64_t)NTHREADS * NITER);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_claims_total, "limit"), NTHREADS * NITER / 2);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_claims_total, "window"), NTHREADS * NITER / 2);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_request_duration_seconds, "/c", "200"),
                 NTHREADS * NITER);
}

/* A series handle updates what the labelled calls read; metrics_shutdown invalidates it. */
static void test_series_handle(void)
{
    metrics_series *c = metrics_series_of(&metric_quan_http_requests_total,
                                          (const char *const[]){"/sh", "200", NULL});
    metrics_series *h = metrics_series_of(&metric_quan_http_request_duration_seconds,
                                          (const char *const[]){"/sh", "200", NULL});
    CHECK(c != NULL && h != NULL);
    CHECK(metrics_series_of(&metric_quan_http_requests_total, (const char *const[]){"/sh", NULL}) ==
          NULL); /* a label short */
    CHECK(c == metrics_series_of(&metric_quan_http_requests_total,
                                 (const char *const[]){"/sh", "200", NULL}));
    metrics_series_add(c, 2);
    metrics_series_add(h, 5);       /* not a counter: ignored */
    metrics_series_observe(c, 0.1); /* not a histogram: ignored */
    metrics_series_observe(h, 0.002);
    metrics_series_add(NULL, 1);
    metrics_series_observe(NULL, 1);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/sh", "200"), 2);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_request_duration_seconds, "/sh", "200"), 1);
    metrics_inc_l(&metric_quan_http_requests_total, "/sh", "200");
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/sh", "200"), 3);
    unsigned gen = metrics_generation();
    CHECK(gen != 0);
    metrics_shutdown();
    CHECK(metrics_generation() != gen);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/sh", "200"), 0);
    metrics_init("test", "1.2.3");
}

/* A kept handle follows the registry across metrics_shutdown. */
static void test_kept_handle(void)
{
    static const char *const labels[] = {"/kh", "200", NULL};
    metrics_handle k = {0};
    metrics_series *s = metrics_handle_series(&k, &metric_quan_http_requests_total, labels);
    CHECK(s != NULL);
    CHECK(metrics_handle_series(&k, &metric_quan_http_requests_total, labels) == s);
    metrics_series_add(s, 4);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/kh", "200"), 4);
    metrics_shutdown();
    metrics_init("test", "1.2.3");
    metrics_series_add(metrics_handle_series(&k, &metric_quan_http_requests_total, labels), 1);
    CHECK_EQ_INT(metrics_get_l(&metric_quan_http_requests_total, "/kh", "200"), 1);
}

int main(void)
{
    log_init("test", LOGL_OFF);
    metrics_init("test", "1.2.3");
    RUN(test_counter_and_gauge);
    RUN(test_label_escaping);
    RUN(test_histogram);
    RUN(test_kept_handle);
    RUN(test_concurrent);
    RUN(test_series_handle);
    RUN(test_cardinality_cap);
    metrics_shutdown();
    TEST_MAIN_END();
}
