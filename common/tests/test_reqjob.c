/*
 * reqjob: the replies a job's outcome gives, its clear hook run exactly once, a work function
 * on a pool whose database is down (503), a refused submit (503, freed), an answer before the
 * job ends. A real http_server on a loopback port runs in a thread; libcurl asks. Needs no
 * database: the pool points at a closed port.
 */
#include <curl/curl.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bridge.h"
#include "log.h"
#include "metrics.h"
#include "pgpool.h"
#include "reqjob.h"
#include "testhelp.h"

static struct event_base *t_base;
static bridge *t_bridge;
static http_server *t_srv;
static pgpool *t_pool; /* one worker, one queued job, a database that is not there */
static uint16_t t_port;
static atomic_int t_clears;
static atomic_int t_work_saw_ids; /* the work function found the request's ids in the job */

/* Holds the pool's only worker until released. */
static pthread_mutex_t t_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t t_gate_cv = PTHREAD_COND_INITIALIZER;
static int t_gate_open;
static atomic_int t_gate_entered; /* the worker is inside t_work_gate */

typedef struct t_job {
    reqjob rj;
    char *owned; /* freed by the clear hook */
    struct event *later;
} t_job;

static void t_clear(reqjob *j)
{
    t_job *t = (t_job *)j;
    free(t->owned);
    if (t->later)
        event_free(t->later);
    atomic_fetch_add(&t_clears, 1);
}

/* ---- server side ---- */

static qn_status t_work_db(pgpool_conn *c, void *arg)
{
    t_job *t = arg;
    if (t->rj.request_id[0] && strlen(t->rj.traceparent) == HTTP_TRACEPARENT_LEN - 1)
        atomic_store(&t_work_saw_ids, 1);
    PGresult *r = pgpool_exec(c, "SELECT 1", 0, NULL);
    if (!r)
        return reqjob_db_fail(c);
    PQclear(r);
    return QN_OK;
}

static qn_status t_work_gate(pgpool_conn *c, void *arg)
{
    (void)c, (void)arg;
    atomic_store(&t_gate_entered, 1);
    pthread_mutex_lock(&t_gate_mu);
    while (!t_gate_open)
        pthread_cond_wait(&t_gate_cv, &t_gate_mu);
    pthread_mutex_unlock(&t_gate_mu);
    return QN_OK;
}

static void t_done_nothing(qn_status st, void *arg)
{
    (void)st, (void)arg;
}

static void t_free_later(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    reqjob_free(arg);
}

static void h_job(http_req *req, void *arg)
{
    (void)arg;
    const char *c = http_query(req, "case");
    t_job *t = reqjob_new(req, sizeof(*t), t_clear);
    if (!t)
        return;
    t->owned = strdup("x");
    if (!c)
        c = "";
    if (strcmp(c, "ok") == 0) {
        t->rj.data = cJSON_CreateObject();
        cJSON_AddNumberToObject(t->rj.data, "x", 1);
        reqjob_reply(&t->rj, QN_OK);
    } else if (strcmp(c, "accepted") == 0) {
        t->rj.status = 202;
        t->rj.data = cJSON_CreateObject();
        reqjob_reply(&t->rj, QN_OK);
    } else if (strcmp(c, "fail") == 0) {
        t->rj.data = cJSON_CreateObject(); /* not sent, still freed */
        reqjob_fail(&t->rj, ERRCODE_STATE, "batch %d busy", 7);
        reqjob_reply(&t->rj, QN_ERR); /* the error reply wins over the status */
    } else if (strcmp(c, "eagain") == 0) {
        reqjob_reply(&t->rj, QN_EAGAIN);
    } else if (strcmp(c, "err") == 0) {
        t->rj.data = cJSON_CreateObject();
        reqjob_reply(&t->rj, QN_ERR);
    } else if (strcmp(c, "db") == 0) {
        reqjob_submit(&t->rj, t_pool, t_work_db, reqjob_done);
    } else if (strcmp(c, "busy") == 0) {
        /* The worker held and the one queue slot taken: the job's submit is refused. The
         * filler goes in only once the worker holds the gate job, or the worker could take the
         * gate job between a refused filler and the job, leaving the job a free slot. */
        static int gate_arg, filler_arg;
        CHECK(pgpool_submit(t_pool, t_work_gate, t_done_nothing, &gate_arg) == QN_OK);
        for (int i = 0; i < 500 && !atomic_load(&t_gate_entered); i++)
            usleep(10000);
        CHECK(atomic_load(&t_gate_entered));
        CHECK(pgpool_submit(t_pool, t_work_gate, t_done_nothing, &filler_arg) == QN_OK);
        reqjob_submit(&t->rj, t_pool, t_work_db, reqjob_done);
        pthread_mutex_lock(&t_gate_mu);
        t_gate_open = 1;
        pthread_cond_broadcast(&t_gate_cv);
        pthread_mutex_unlock(&t_gate_mu);
    } else if (strcmp(c, "send") == 0) {
        /* Answered now; the job lives on (as templates' bloom retries do) and ends later. */
        struct timeval tv = {0, 50000};
        t->rj.data = cJSON_CreateString("early");
        reqjob_send(&t->rj, QN_OK);
        CHECK(t->rj.req == NULL && t->rj.data == NULL && t->rj.status == 200);
        t->later = evtimer_new(t_base, t_free_later, t);
        evtimer_add(t->later, &tv);
    } else {
        reqjob_reply_error(&t->rj, ERRCODE_INVALID, "case: %s", "unknown");
    }
}

static void *server_thread(void *arg)
{
    (void)arg;
    event_base_dispatch(t_base);
    return NULL;
}

/* ---- client side ---- */

/* The envelope of GET /t/job?case=c (owned), and its status (-1 when the request failed). */
static cJSON *ask(const char *c, long *status)
{
    char url[256], *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len); /* curl's default writer fwrites into it */
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/t/job?case=%s", t_port, c);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    *status = -1;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    fclose(f);
    cJSON *o = cJSON_Parse(body);
    free(body);
    return o;
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* One case: the status, code and message it must answer; the clear hook ran once. */
static void expect(const char *c, long status, const char *code, const char *msg)
{
    long got = 0;
    int clears = atomic_load(&t_clears);
    cJSON *o = ask(c, &got);
    CHECK_EQ_INT(got, status);
    CHECK(o != NULL);
    CHECK_EQ_STR(jstr(o, "code"), code);
    if (msg)
        CHECK_EQ_STR(jstr(o, "message"), msg);
    cJSON_Delete(o);
    for (int i = 0; i < 100 && atomic_load(&t_clears) == clears; i++)
        usleep(10000); /* a job may end just after its answer ("send") */
    CHECK_EQ_INT(atomic_load(&t_clears), clears + 1);
}

/* ---- tests ---- */

static void test_success_and_data(void)
{
    long st = 0;
    cJSON *o = ask("ok", &st);
    CHECK_EQ_INT(st, 200);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, "data");
    CHECK(cJSON_IsObject(d) && cJSON_GetObjectItemCaseSensitive(d, "x") &&
          cJSON_GetObjectItemCaseSensitive(d, "x")->valueint == 1);
    cJSON_Delete(o);
    expect("ok", 200, "0", NULL);
    expect("accepted", 202, "0", NULL);
}

static void test_outcomes(void)
{
    expect("fail", 409, "B000104", "batch 7 busy");
    expect("eagain", 503, "C000001", "database unavailable");
    expect("err", 500, "B000001", "internal error");
    expect("nope", 400, "A000001", "case: unknown");
}

static void test_database_down(void)
{
    expect("db", 503, "C000001", "database unavailable");
    CHECK(atomic_load(&t_work_saw_ids) == 1);
}

static void test_refused_submit(void)
{
    expect("busy", 503, "C000001", "database busy, retry later");
}

static void test_answer_before_the_end(void)
{
    expect("send", 200, "0", NULL);
}

int main(void)
{
    log_init("test", LOGL_OFF);
    evthread_use_pthreads();
    curl_global_init(CURL_GLOBAL_ALL);
    metrics_init("test", "0.0.0");

    t_base = event_base_new();
    t_bridge = bridge_new(t_base);
    pgpool_opts po = {.dsn = "postgresql://quan@127.0.0.1:1/none",
                      .name = "ds_test",
                      .size = 1,
                      .queue_cap = 1,
                      .connect_timeout_s = 2};
    t_pool = pgpool_new(t_base, t_bridge, &po);
    http_server_opts o = {
        .bind_addr = "127.0.0.1", .port = 0, .request_timeout_ms = 4000, .service = "test"};
    t_srv = http_server_new(t_base, &o);
    CHECK(t_bridge && t_pool && t_srv);
    if (!t_bridge || !t_pool || !t_srv)
        return 1;
    CHECK(http_route(t_srv, HTTP_GET, "/t/job", h_job, NULL, 0) == QN_OK);
    CHECK(http_server_listen(t_srv) == QN_OK);
    t_port = http_server_port(t_srv);

    pthread_t th;
    pthread_create(&th, NULL, server_thread, NULL);
    RUN(test_success_and_data);
    RUN(test_outcomes);
    RUN(test_database_down);
    RUN(test_refused_submit);
    RUN(test_answer_before_the_end);
    event_base_loopexit(t_base, NULL);
    pthread_join(th, NULL);

    http_server_free(t_srv);
    pgpool_free(t_pool);
    bridge_free(t_bridge);
    event_base_free(t_base);
    metrics_shutdown();
    curl_global_cleanup();
    libevent_global_shutdown();
    TEST_MAIN_END();
}
