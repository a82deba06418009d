/* common/mq/mq against a real RabbitMQ (QUAN_AMQP_URL). Queue names carry the pid, and every test
 * deletes its queues, so runs never collide. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <event2/event.h>

#include "log.h"
#include "metrics.h"
#include "mq.h"
#include "now.h"
#include "testhelp.h"

static const char *url;
/* The type of every queue the tests declare: each test that declares runs with classic queues,
 * and most again with quorum queues (a single node serves those too). */
static mq_conn_queue_type qtype = MQ_CONN_CLASSIC;

/* Polls *v until it reaches at least want or ms pass; returns the last value seen. */
static int wait_at_least(atomic_int *v, int want, int ms)
{
    int64_t end = now_mono_ms() + ms;
    while (atomic_load(v) < want && now_mono_ms() < end)
        usleep(10000);
    return atomic_load(v);
}

static void name_of(char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "t%d%s.%s", (int)getpid(), qtype == MQ_CONN_QUORUM ? "q" : "", what);
}

/* Names a test's consumer, routing key and queue after what (unique per run) and opens a
 * connection; NULL (a failed check) when the broker is unreachable. */
static mq_conn *test_conn(const char *what, char name[64], char rk[64], char q[96])
{
    char ev[64];
    snprintf(ev, sizeof(ev), "%s.event", what);
    name_of(name, 64, what);
    name_of(rk, 64, ev);
    snprintf(q, 96, "quan.%s", name);
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    return c;
}

static uint32_t queue_count(mq_conn *c, const char *queue)
{
    uint32_t n = 9999;
    if (mq_conn_queue_count(c, queue, &n) != QN_OK)
        return 9999;
    return n;
}

/* Waits until the queue holds exactly want messages; returns the last count. */
static uint32_t wait_count(mq_conn *c, const char *queue, uint32_t want, int ms)
{
    int64_t end = now_mono_ms() + ms;
    uint32_t n;
    while ((n = queue_count(c, queue)) != want && now_mono_ms() < end)
        usleep(20000);
    return n;
}

/* ---------------------------------------------------------------- envelope (no server) */

static void test_envelope(void)
{
    mq_envelope e;
    char *s = mq_envelope_build("coupon.redeem", "k-1", "req-1",
                                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                1700000000123LL, "{\"userId\":\"42\"}");
    CHECK(s != NULL);
    CHECK_EQ_INT(mq_envelope_parse(s, strlen(s), &e), QN_OK);
    CHECK_EQ_STR(e.key, "k-1");
    CHECK_EQ_STR(e.type, "coupon.redeem");
    CHECK_EQ_STR(e.request_id, "req-1");
    CHECK_EQ_STR(e.traceparent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    CHECK_EQ_INT(e.ts_ms, 1700000000123LL);
    CHECK(e.data && cJSON_IsString(cJSON_GetObjectItem(e.data, "userId")));
    mq_envelope_free(&e);
    CHECK(e.key == NULL && e.data == NULL);
    free(s);

    /* optional fields omitted, data defaults to {} */
    s = mq_envelope_build("a.b", "k", NULL, NULL, 0, NULL);
    CHECK(s != NULL);
    CHECK_EQ_INT(mq_envelope_parse(s, strlen(s), &e), QN_OK);
    CHECK(e.request_id == NULL && e.traceparent == NULL && e.ts_ms > 0 && cJSON_IsObject(e.data));
    mq_envelope_free(&e);
    free(s);

    CHECK(mq_envelope_build("a.b", "k", NULL, NULL, 0, "{not json") == NULL);
    CHECK(mq_envelope_build("a.b", NULL, NULL, NULL, 0, NULL) == NULL);
    const char *bad[] = {"",
                         "[]",
                         "{\"type\":\"x\",\"data\":{}}",
                         "{\"key\":\"k\",\"data\":{}}",
                         "{\"key\":\"k\",\"type\":\"x\"}",
                         "{\"key\":1,\"type\":\"x\",\"data\":1}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(mq_envelope_parse(bad[i], strlen(bad[i]), &e), QN_EINVAL);
        CHECK(e.key == NULL && e.data == NULL);
    }
    /* length is honoured: a valid prefix cut short is malformed */
    s = mq_envelope_build("a.b", "k", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(mq_envelope_parse(s, strlen(s) - 1, &e), QN_EINVAL);
    free(s);
}

/* ---------------------------------------------------------------- packs */

static void test_pack_parse(void)
{
    mq_envelope *e = NULL;
    size_t n = 99;
    char *a = mq_envelope_build("a.b", "k1", NULL, NULL, 0, "{\"i\":1}");
    char *b = mq_envelope_build("a.b", "k2", "r2", NULL, 0, "{\"i\":2}");
    char pack[512];
    snprintf(pack, sizeof(pack), "[%s,%s]", a, b);
    CHECK_EQ_INT(mq_envelope_pack_parse(pack, strlen(pack), &e, &n), QN_OK);
    CHECK_EQ_INT((int)n, 2);
    if (n == 2) {
        CHECK_EQ_STR(e[0].key, "k1");
        CHECK_EQ_STR(e[1].key, "k2");
        CHECK_EQ_STR(e[1].request_id, "r2");
        CHECK(cJSON_IsNumber(cJSON_GetObjectItem(e[1].data, "i")));
    }
    mq_envelope_pack_free(e, n);
    /* a single envelope is a pack of one */
    CHECK_EQ_INT(mq_envelope_pack_parse(a, strlen(a), &e, &n), QN_OK);
    CHECK_EQ_INT((int)n, 1);
    mq_envelope_pack_free(e, n);
    /* one bad element spoils the pack; empty and non-JSON are refused */
    const char *bad[] = {"[]", "[1]", "", "x", "[{\"key\":\"k\"}]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ_INT(mq_envelope_pack_parse(bad[i], strlen(bad[i]), &e, &n), QN_EINVAL);
        CHECK(e == NULL && n == 0);
    }
    snprintf(pack, sizeof(pack), "[%s,{\"key\":\"k\",\"type\":\"t\"}]", a);
    CHECK_EQ_INT(mq_envelope_pack_parse(pack, strlen(pack), &e, &n), QN_EINVAL);
    free(a);
    free(b);
}

/* Takes every message of queue (no ack); counts messages and the envelopes in them, and checks
 * that each envelope key appears once. */
static void raw_take_all(const char *queue, int *msgs, int *envs, int *seen, int nseen)
{
    char err[MQ_CONN_ERR_MAX];
    mq_conn *c = mq_conn_connect(url, &(mq_conn_opts){.name = "test raw"}, err);
    *msgs = *envs = 0;
    CHECK(c != NULL);
    if (!c)
        return;
    amqp_connection_state_t st = mq_conn_amqp(c);
    for (;;) {
        amqp_rpc_reply_t r = amqp_basic_get(st, MQ_CONN_CHANNEL, amqp_cstring_bytes(queue), 1);
        if (r.reply_type != AMQP_RESPONSE_NORMAL || r.reply.id != AMQP_BASIC_GET_OK_METHOD)
            break;
        amqp_message_t msg;
        if (amqp_read_message(st, MQ_CONN_CHANNEL, &msg, 0).reply_type != AMQP_RESPONSE_NORMAL)
            break;
        mq_envelope *e = NULL;
        size_t n = 0;
        (*msgs)++;
        if (mq_envelope_pack_parse(msg.body.bytes, msg.body.len, &e, &n) == QN_OK) {
            for (size_t i = 0; i < n; i++) {
                int k = atoi(e[i].key + strlen("pack-"));
                if (k >= 0 && k < nseen)
                    seen[k]++;
            }
            *envs += (int)n;
        }
        mq_envelope_pack_free(e, n);
        amqp_destroy_message(&msg);
    }
    mq_conn_close(c);
}

#define PACK_N 300

static struct {
    struct event_base *base;
    mq_publisher *pub;
    const char *rk;
    int ok, other, done;
} P;

static void pack_on_published(qn_status st, void *arg)
{
    (void)arg;
    if (st == QN_OK)
        P.ok++;
    else
        P.other++;
    if (++P.done == PACK_N)
        event_base_loopbreak(P.base);
}

static void pack_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    event_base_loopbreak(P.base);
}

static void pack_start(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    char key[32], data[64];
    for (int i = 0; i < PACK_N; i++) {
        snprintf(key, sizeof(key), "pack-%d", i);
        snprintf(data, sizeof(data), "{\"i\":%d}", i);
        /* the last ten are not packable: they travel alone */
        mq_msg m = {
            .routing_key = P.rk, .key = key, .data_json = data, .packable = i < PACK_N - 10};
        if (mq_publish(P.pub, &m, pack_on_published, NULL) != QN_OK)
            P.other++, P.done++;
    }
}

/* Messages queued together travel as packs; every one is confirmed to its caller once; the
 * queue holds each envelope exactly once, in fewer messages. */
static void test_publisher_packs(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("packs", name, rk, q);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);
    memset(&P, 0, sizeof(P));
    P.rk = rk;
    P.base = event_base_new();
    bridge *br = bridge_new(P.base);
    P.pub = mq_publisher_new(&(mq_publisher_opts){.url = url, .bridge = br});
    CHECK(P.pub != NULL);
    for (int i = 0; i < 100 && !mq_publisher_ready(P.pub); i++)
        usleep(20000); /* connected first, so the messages below queue up together */
    struct event *start = evtimer_new(P.base, pack_start, NULL);
    struct timeval t0 = {0, 0};
    event_add(start, &t0);
    struct event *to = evtimer_new(P.base, pack_timeout, NULL);
    struct timeval t20s = {20, 0};
    event_add(to, &t20s);
    event_base_dispatch(P.base);
    CHECK_EQ_INT(P.ok, PACK_N);
    CHECK_EQ_INT(P.other, 0);

    static int seen[PACK_N];
    int msgs = 0, envs = 0, once = 1;
    memset(seen, 0, sizeof(seen));
    usleep(200000);
    raw_take_all(q, &msgs, &envs, seen, PACK_N);
    for (int i = 0; i < PACK_N; i++)
        once &= seen[i] == 1;
    printf("  %d envelopes in %d messages\n", envs, msgs);
    CHECK_EQ_INT(envs, PACK_N);
    CHECK(once);
    CHECK(msgs < PACK_N - 10); /* packed ... */
    CHECK(
        msgs >=
        10 +
            PACK_N /
                MQ_ENVELOPE_PACK_MAX); /* ... never past MQ_ENVELOPE_PACK_MAX, the last ten alone */

    mq_publisher_free(P.pub);
    event_free(start);
    event_free(to);
    bridge_free(br);
    event_base_free(P.base);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- the one opener */

/* Every failure says what failed, and never shows the password. */
static void test_connect_errors(void)
{
    char err[MQ_CONN_ERR_MAX], bad[512];
    mq_conn_opts o = {.name = "test"};

    CHECK(mq_conn_connect("http://x", &o, err) == NULL);
    CHECK_EQ_STR(err, "malformed AMQP URL");
    CHECK(mq_conn_connect("amqp://guest:s3cret@127.0.0.1:1/", &o, err) == NULL);
    CHECK(strncmp(err, "connect 127.0.0.1:1: ", 21) == 0);
    CHECK(strstr(err, "s3cret") == NULL);
    /* the harness's broker with a password it does not know */
    const char *at = strchr(url, '@'), *scheme = strstr(url, "://");
    CHECK(at != NULL && scheme != NULL);
    if (!at || !scheme)
        return;
    snprintf(bad, sizeof(bad), "%.*s://nobody:s3cret%s", (int)(scheme - url), url, at);
    CHECK(mq_conn_connect(bad, &o, err) == NULL);
    printf("  wrong password: %s\n", err);
    CHECK(strncmp(err, "login: ", 7) == 0);
    CHECK(strstr(err, "s3cret") == NULL);

    mq_conn *c = mq_conn_connect(url, &(mq_conn_opts){.name = "test", .heartbeat_s = 2}, err);
    CHECK(c != NULL && mq_conn_ok(c));
    if (c)
        CHECK_EQ_INT(amqp_get_heartbeat(mq_conn_amqp(c)), 2);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- URL lists */

/* What QUAN_AMQP_URL may hold, checked at start: every refusal names the URL by its place. */
static void test_url_list_check(void)
{
    char err[256], many[2048] = "";
    mq_conn_queue_type t = MQ_CONN_QUORUM;

    CHECK_EQ_INT(mq_conn_urls_check("amqp://guest:guest@127.0.0.1:5672/", err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(mq_conn_urls_check(" amqp://a:b@h1:1/, amqp://a:b@h2:2/ ,amqp://a:b@h3:3/", err,
                                    sizeof(err)),
                 QN_OK);
    CHECK_EQ_INT(mq_conn_urls_check("amqp://a:s3cret@h1:1/,,amqp://a:b@h3:3/", err, sizeof(err)),
                 QN_EINVAL);
    CHECK_EQ_STR(err, "URL 2 of 3 is empty");
    CHECK_EQ_INT(mq_conn_urls_check("amqp://a:b@h1:1/,", err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "URL 2 of 2 is empty");
    CHECK_EQ_INT(mq_conn_urls_check("", err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "no URL given");
    CHECK_EQ_INT(mq_conn_urls_check(" ", err, sizeof(err)), QN_EINVAL);
    CHECK_EQ_STR(err, "URL 1 of 1 is empty");
    CHECK_EQ_INT(mq_conn_urls_check("amqp://a:b@h1:1/,http://a:s3cret@h2/", err, sizeof(err)),
                 QN_EINVAL);
    CHECK_EQ_STR(err, "URL 2 of 2 is not amqp[s]://user:password@host:port/vhost[?query]");
    for (int i = 0; i <= MQ_CONN_URLS_MAX; i++) {
        size_t used = strlen(many);
        snprintf(many + used, sizeof(many) - used, "%samqp://a:b@h%d:1/", i ? "," : "", i);
    }
    CHECK_EQ_INT(mq_conn_urls_check(many, err, sizeof(err)), QN_EINVAL);
    CHECK(strstr(err, "more than") != NULL);

    CHECK_EQ_INT(mq_conn_queue_type_parse(NULL, &t), QN_OK);
    CHECK_EQ_INT(t, MQ_CONN_CLASSIC);
    CHECK_EQ_INT(mq_conn_queue_type_parse("quorum", &t), QN_OK);
    CHECK_EQ_INT(t, MQ_CONN_QUORUM);
    CHECK_EQ_INT(mq_conn_queue_type_parse("mirrored", &t), QN_EINVAL);
    CHECK_EQ_STR(mq_conn_queue_types[MQ_CONN_QUORUM], "quorum");
}

/* A list of the harness's broker and a refused port: a connection goes to the one that answers,
 * a cursor moves past it so that the next connect (a reconnect after a loss) tries the other
 * first, and a list that none answers says why for each, without a password. */
/* amqps:// URLs: their query (RabbitMQ's URI parameters) is checked whole at start, each refusal
 * naming the parameter and never the password; a plain URL takes no query. */
static void test_url_tls_check(void)
{
    char err[256];
    static const struct {
        const char *url, *err; /* err NULL: accepted */
    } cases[] = {
        {"amqps://a:s3cret@h1:5671/?cacertfile=/dev/null", NULL},
        {"amqps://a:s3cret@h1:5671/v?cacertfile=%2Fdev%2Fnull&verify=verify_peer", NULL},
        {"amqps://a:s3cret@h1/?certfile=/dev/null&keyfile=/dev/null&verify=verify_none", NULL},
        /* a '?' of a password is escaped; an '@' of a query is not a user's */
        {"amqps://a:s3%3Fcret@h1:5671/?cacertfile=/dev/null", NULL},
        {"amqps://h1:5671/?cacertfile=/nonexistent@x",
         "URL 1 of 1: cacertfile /nonexistent@x: No such file or directory"},
        {"amqp://a:s3cret@h1:5672/?cacertfile=/dev/null",
         "URL 1 of 1: query parameters are only read on amqps:// URLs"},
        {"amqps://a:s3cret@h1:5671/?cacert=/dev/null",
         "URL 1 of 1: unknown query parameter 'cacert' (cacertfile, certfile, keyfile, verify)"},
        {"amqps://a:s3cret@h1:5671/?cacertfile=/nonexistent/ca.crt",
         "URL 1 of 1: cacertfile /nonexistent/ca.crt: No such file or directory"},
        {"amqps://a:s3cret@h1:5671/?cacertfile=",
         "URL 1 of 1: query parameter cacertfile is empty"},
        {"amqps://a:s3cret@h1:5671/?cacertfile", "URL 1 of 1: query parameter 'cacertfile' is not "
                                                 "name=value"},
        {"amqps://a:s3cret@h1:5671/?cacertfile=/dev/null&cacertfile=/dev/null",
         "URL 1 of 1: query parameter cacertfile given twice"},
        {"amqps://a:s3cret@h1:5671/?cacertfile=%2", "URL 1 of 1: query parameter cacertfile: "
                                                    "malformed %-escape"},
        {"amqps://a:s3cret@h1:5671/?certfile=/dev/null",
         "URL 1 of 1: certfile and keyfile go together (a client certificate and its key)"},
        {"amqps://a:s3cret@h1:5671/?verify=yes",
         "URL 1 of 1: verify must be verify_peer or verify_none, not 'yes'"},
        {"amqp://a:b@h0:1/,amqps://a:s3cret@h1:5671/?keyfile=/dev/null",
         "URL 2 of 2: certfile and keyfile go together (a client certificate and its key)"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        err[0] = '\0';
        qn_status st = mq_conn_urls_check(cases[i].url, err, sizeof(err));
        if (!cases[i].err) {
            CHECK_EQ_INT(st, QN_OK);
            continue;
        }
        CHECK_EQ_INT(st, QN_EINVAL);
        CHECK_EQ_STR(err, cases[i].err);
        CHECK(strstr(err, "s3cret") == NULL);
    }
    /* the connect refuses the same, before any I/O */
    CHECK(mq_conn_connect("amqps://a:s3cret@127.0.0.1:1/?verify=no", &(mq_conn_opts){0}, err) ==
          NULL);
    CHECK_EQ_STR(err, "verify must be verify_peer or verify_none, not 'no'");
}

static void test_url_list_connect(void)
{
    char list[1024], err[MQ_CONN_ERR_MAX];
    mq_conn_cursor cur = {.next = 0, .started = 1};
    mq_conn_opts o = {.name = "test list", .cursor = &cur};
    mq_conn *c;

    snprintf(list, sizeof(list), "amqp://guest:s3cret@127.0.0.1:1/, %s", url);
    c = mq_conn_connect(list, &o, err);
    CHECK(c != NULL && mq_conn_ok(c));
    CHECK_EQ_INT(mq_conn_node(c), 1);
    CHECK_EQ_INT(cur.next, 2); /* past the node that answered: the refused one comes first */
    mq_conn_close(c);
    c = mq_conn_connect(list, &o, err); /* starts at 2 % 2 = the refused one, goes on */
    CHECK(c != NULL);
    CHECK_EQ_INT(mq_conn_node(c), 1);
    mq_conn_close(c);

    /* the same good URL twice: connections take turns, each past the last */
    snprintf(list, sizeof(list), "%s,%s", url, url);
    cur = (mq_conn_cursor){.next = 0, .started = 1};
    for (int i = 0; i < 4; i++) {
        c = mq_conn_connect(list, &o, err);
        CHECK(c != NULL);
        CHECK_EQ_INT(mq_conn_node(c), i % 2);
        mq_conn_close(c);
    }
    /* without a cursor the process's rotation spreads them: two in a row never share a URL */
    int first = -1, second = -1;
    if ((c = mq_conn_connect(list, &(mq_conn_opts){.name = "test rot"}, err))) {
        first = mq_conn_node(c);
        mq_conn_close(c);
    }
    if ((c = mq_conn_connect(list, &(mq_conn_opts){.name = "test rot"}, err))) {
        second = mq_conn_node(c);
        mq_conn_close(c);
    }
    CHECK(first >= 0 && second >= 0 && first != second);

    /* none answers: every reason, by position */
    c = mq_conn_connect("amqp://guest:s3cret@127.0.0.1:1/,amqp://guest:s3cret@127.0.0.1:1/", &o,
                        err);
    CHECK(c == NULL);
    printf("  none answered: %s\n", err);
    CHECK(strstr(err, "URL 1 of 2: connect 127.0.0.1:1: ") != NULL);
    CHECK(strstr(err, "URL 2 of 2: connect 127.0.0.1:1: ") != NULL);
    CHECK(strstr(err, "s3cret") == NULL);
    /* one URL: exactly as before lists existed */
    CHECK(mq_conn_connect("amqp://guest:s3cret@127.0.0.1:1/", &o, err) == NULL);
    CHECK(strncmp(err, "connect 127.0.0.1:1: ", 21) == 0);
}

/* ---------------------------------------------------------------- topology */

static void test_topology(void)
{
    char name[64], rk[64], q[96];
    name_of(name, sizeof(name), "topo");
    name_of(rk, sizeof(rk), "topo.event");
    const char *keys[] = {rk, "x.other", NULL};
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 1000, qtype), QN_OK);
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 1000, qtype), QN_OK);
    /* other arguments: a clear conflict, and the connection stays usable */
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 2000, qtype), QN_ECONFLICT);
    CHECK(strstr(mq_conn_errstr(c), "406") != NULL);
    CHECK(mq_conn_ok(c));
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 1000, qtype), QN_OK);
    snprintf(q, sizeof(q), "quan.%s.retry", name);
    CHECK_EQ_INT(queue_count(c, q), 0);
    snprintf(q, sizeof(q), "quan.%s.dead", name);
    CHECK_EQ_INT(queue_count(c, q), 0);
    /* a routed confirmed publish lands in the main queue; an unbound key is reported */
    mq_msg m = {.routing_key = rk, .key = "k1", .data_json = "{}"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    snprintf(q, sizeof(q), "quan.%s", name);
    CHECK_EQ_INT(wait_count(c, q, 1, 2000), 1);
    mq_msg m2 = {.routing_key = "nobody.listens.here", .key = "k2"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m2, 5000), QN_ENOTFOUND);
    mq_msg bad = {.routing_key = rk, .key = NULL};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &bad, 5000), QN_EINVAL);
    /* after a return, the next publish still pairs with its own confirm */
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    uint32_t n;
    CHECK_EQ_INT(mq_conn_queue_count(c, q, &n), QN_ENOTFOUND);
    CHECK(mq_conn_ok(c));
    mq_conn_close(c);
}

/* The broker's word for each of consumer name's queues' type: "quorum quorum quorum" (main,
 * retry, dead), read with rabbitmqctl; "" without it. */
static void queue_types(const char *name, char *out, size_t cap)
{
    const char *ctl = getenv("QUAN_INFRA_RABBITMQCTL");
    const char *suffix[] = {"", ".retry", ".dead"};
    char cmd[1024], line[512], want[160];
    FILE *f;

    out[0] = '\0';
    if (!ctl ||
        !(f = popen(strcat(strcpy(cmd, ctl), " -q list_queues name type 2>/dev/null"), "r")))
        return;
    char found[3][32] = {"", "", ""};
    while (fgets(line, sizeof(line), f)) {
        char qn[256], type[32];
        if (sscanf(line, "%255s %31s", qn, type) != 2)
            continue;
        for (int i = 0; i < 3; i++) {
            snprintf(want, sizeof(want), "quan.%s%s", name, suffix[i]);
            if (!strcmp(qn, want))
                snprintf(found[i], sizeof(found[i]), "%s", type);
        }
    }
    pclose(f);
    snprintf(out, cap, "%s %s %s", found[0], found[1], found[2]);
}

/* Quorum queues on the one-node broker: all three queues are of that type, the retry queue
 * carries the arguments a quorum queue accepts, and a classic declaration of the same names is
 * the clear conflict a deployment that switches type meets. */
static void test_quorum_declared(void)
{
    char name[64], rk[64], q[96], types[128];
    const char *keys[] = {rk, NULL};
    mq_conn_queue_type saved = qtype;
    qtype = MQ_CONN_QUORUM;
    mq_conn *c = test_conn("qtype", name, rk, q);
    qtype = saved;
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 500, MQ_CONN_QUORUM), QN_OK);
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 500, MQ_CONN_QUORUM), QN_OK);
    queue_types(name, types, sizeof(types));
    if (getenv("QUAN_INFRA_RABBITMQCTL"))
        CHECK_EQ_STR(types, "quorum quorum quorum");
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 500, MQ_CONN_CLASSIC), QN_ECONFLICT);
    CHECK(strstr(mq_conn_errstr(c), "x-queue-type") != NULL);
    CHECK(mq_conn_ok(c));
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 500, 7), QN_EINVAL);
    /* the retry queue's TTL dead-letters back into the main queue */
    char retry[96];
    snprintf(retry, sizeof(retry), "quan.%s.retry", name);
    mq_msg m = {.routing_key = "", .key = "back", .body = "{}"};
    mq_conn_props mp;
    mq_conn_pending pend = {.key = "back", .rk = retry};
    mq_conn_props_init(&mp, m.key, NULL, NULL, now_wall_ms());
    CHECK_EQ_INT(mq_conn_publish_raw(c, "", retry, &mp.p, "{}", 2, &pend.tag), QN_OK);
    mq_conn_confirm(c, &pend, 1, 5000);
    CHECK_EQ_INT(pend.st, QN_OK);
    CHECK_EQ_INT(wait_count(c, q, 1, 5000), 1);
    CHECK_EQ_INT(queue_count(c, retry), 0);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- publisher on a loop */

#define LOOP_N 200

static struct {
    struct event_base *base;
    mq_publisher *pub;
    pthread_t loop_thread;
    const char *rk;
    int ok, other, unroutable, wrong_thread, ready_seen, done;
    int ticks;
    int64_t last_tick, max_gap;
} L;

static void loop_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    int64_t t = now_mono_ms();
    if (L.last_tick && t - L.last_tick > L.max_gap)
        L.max_gap = t - L.last_tick;
    L.last_tick = t;
    L.ticks++;
}

static void loop_on_published(qn_status st, void *arg)
{
    if (!pthread_equal(pthread_self(), L.loop_thread))
        L.wrong_thread++;
    if (arg == &L.unroutable)
        L.unroutable = st == QN_ENOTFOUND ? 1 : -1;
    else if (st == QN_OK)
        L.ok++;
    else
        L.other++;
    L.ready_seen |= mq_publisher_ready(L.pub);
    if (++L.done == LOOP_N + 1)
        event_base_loopbreak(L.base);
}

static void loop_start(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    char key[32], data[64];
    for (int i = 0; i < LOOP_N; i++) {
        snprintf(key, sizeof(key), "loop-%d", i);
        snprintf(data, sizeof(data), "{\"i\":%d}", i);
        mq_msg m = {.routing_key = L.rk, .key = key, .request_id = "req-loop", .data_json = data};
        if (mq_publish(L.pub, &m, loop_on_published, NULL) != QN_OK)
            L.other++, L.done++;
    }
    mq_msg m = {.routing_key = "nobody.listens.here", .key = "lost"};
    if (mq_publish(L.pub, &m, loop_on_published, &L.unroutable) != QN_OK)
        L.done++;
}

static void loop_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    event_base_loopbreak(L.base);
}

static void test_publisher_loop(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("loop", name, rk, q);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);

    memset(&L, 0, sizeof(L));
    L.rk = rk;
    L.loop_thread = pthread_self();
    L.base = event_base_new();
    bridge *br = bridge_new(L.base);
    CHECK(br != NULL);
    L.pub = mq_publisher_new(&(mq_publisher_opts){.url = url, .bridge = br});
    CHECK(L.pub != NULL);
    mq_msg bad = {.routing_key = "", .key = "k"};
    CHECK_EQ_INT(mq_publish(L.pub, &bad, NULL, NULL), QN_EINVAL);
    mq_msg badjson = {.routing_key = rk, .key = "k", .data_json = "{"};
    CHECK_EQ_INT(mq_publish(L.pub, &badjson, NULL, NULL), QN_EINVAL);

    struct event *tick = event_new(L.base, -1, EV_PERSIST, loop_tick, NULL);
    struct event *start = evtimer_new(L.base, loop_start, NULL);
    struct event *to = evtimer_new(L.base, loop_timeout, NULL);
    struct timeval t10 = {0, 10000}, t0 = {0, 0}, t20s = {20, 0};
    event_add(tick, &t10);
    event_add(start, &t0);
    event_add(to, &t20s);
    int64_t ok0 = metrics_get(&metric_quan_mq_published_total),
            failed0 = metrics_get(&metric_quan_mq_publish_failures_total),
            timed0 = metrics_get(&metric_quan_mq_publish_duration_seconds);
    int64_t t_start = now_mono_ms();
    event_base_dispatch(L.base);
    int64_t elapsed = now_mono_ms() - t_start;

    CHECK_EQ_INT(L.ok, LOOP_N);
    CHECK_EQ_INT(L.other, 0);
    CHECK_EQ_INT(L.unroutable, 1);
    /* Each outcome counted once, as confirmed or failed (the unroutable one), and timed. */
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_published_total) - ok0, LOOP_N);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_publish_failures_total) - failed0, 1);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_publish_duration_seconds) - timed0, LOOP_N + 1);
    CHECK_EQ_INT(L.wrong_thread, 0);
    CHECK(L.ready_seen);
    /* the loop kept ticking while the publisher worked: no long stall */
    CHECK(L.ticks >= 2 || elapsed < 30);
    CHECK(L.max_gap < 150);
    printf("  %d publishes confirmed in %lld ms, %d ticks, max tick gap %lld ms\n", L.ok,
           (long long)elapsed, L.ticks, (long long)L.max_gap);
    CHECK_EQ_INT(wait_count(c, q, LOOP_N, 3000), LOOP_N);

    mq_publisher_free(L.pub);
    event_free(tick);
    event_free(start);
    event_free(to);
    bridge_free(br);
    event_base_free(L.base);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* Publishing while the broker is unreachable: the callback still comes, with an error. */
static int down_status = 1;
static struct event_base *down_base;
static void down_cb(qn_status st, void *arg)
{
    (void)arg;
    down_status = st;
    event_base_loopbreak(down_base);
}

static void test_publisher_unreachable(void)
{
    down_base = event_base_new();
    bridge *br = bridge_new(down_base);
    /* port 1 on loopback: connection refused */
    mq_publisher *p = mq_publisher_new(&(mq_publisher_opts){
        .url = "amqp://guest:guest@127.0.0.1:1/", .bridge = br, .confirm_timeout_ms = 300});
    CHECK(p != NULL);
    mq_msg m = {.routing_key = "a.b", .key = "k"};
    int64_t ok0 = metrics_get(&metric_quan_mq_published_total),
            failed0 = metrics_get(&metric_quan_mq_publish_failures_total);
    CHECK_EQ_INT(mq_publish(p, &m, down_cb, NULL), QN_OK);
    struct timeval t5 = {5, 0};
    event_base_loopexit(down_base, &t5);
    event_base_dispatch(down_base);
    CHECK_EQ_INT(down_status, QN_EAGAIN);
    CHECK(!mq_publisher_ready(p));
    /* Known down, its backoff grown past a second: a publish fails at once, not after the
     * next attempt to connect. */
    usleep(1500 * 1000);
    down_status = 1;
    int64_t t0 = now_mono_ms();
    CHECK_EQ_INT(mq_publish(p, &m, down_cb, NULL), QN_OK);
    event_base_loopexit(down_base, &t5);
    event_base_dispatch(down_base);
    CHECK_EQ_INT(down_status, QN_EAGAIN);
    CHECK(now_mono_ms() - t0 < 100);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_publish_failures_total) - failed0, 2);
    CHECK_EQ_INT(metrics_get(&metric_quan_mq_published_total) - ok0, 0);
    mq_publisher_free(p);
    bridge_free(br);
    event_base_free(down_base);
}

/* ---------------------------------------------------------------- consumer: envelope */

static struct {
    pthread_mutex_t mu;
    atomic_int calls;
    char key[64], request_id[64], traceparent[64], type[64], rk[64], consumer[64];
    int attempt, n, redelivered, thread_ok;
    pthread_t main_thread;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static mq_handler_result recv_handler(const mq_envelope *env, const mq_delivery_info *info,
                                      void *arg)
{
    (void)arg;
    pthread_mutex_lock(&R.mu);
    snprintf(R.key, sizeof(R.key), "%s", env->key);
    snprintf(R.request_id, sizeof(R.request_id), "%s", env->request_id ? env->request_id : "");
    snprintf(R.traceparent, sizeof(R.traceparent), "%s", env->traceparent ? env->traceparent : "");
    snprintf(R.type, sizeof(R.type), "%s", env->type);
    snprintf(R.rk, sizeof(R.rk), "%s", info->routing_key);
    snprintf(R.consumer, sizeof(R.consumer), "%s", info->consumer);
    const cJSON *n = cJSON_GetObjectItem(env->data, "n");
    R.n = cJSON_IsNumber(n) ? n->valueint : -1;
    R.attempt = info->attempt;
    R.redelivered = info->redelivered;
    R.thread_ok = !pthread_equal(pthread_self(), R.main_thread);
    pthread_mutex_unlock(&R.mu);
    atomic_fetch_add(&R.calls, 1);
    return MQ_ACK;
}

static void test_consumer_envelope(void)
{
    char name[64], rk[64], q[96];
    const char *tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    name_of(name, sizeof(name), "recv");
    name_of(rk, sizeof(rk), "recv.event");
    snprintf(q, sizeof(q), "quan.%s", name);
    const char *keys[] = {rk, NULL};
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (!c)
        return;
    atomic_store(&R.calls, 0);
    R.main_thread = pthread_self();
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .handler = recv_handler});
    CHECK(cons != NULL);
    int64_t end = now_mono_ms() + 5000;
    while (!mq_consumer_ready(cons) && now_mono_ms() < end)
        usleep(10000);
    CHECK(mq_consumer_ready(cons));
    mq_msg m = {.routing_key = rk,
                .key = "coupon-77",
                .request_id = "req-abc",
                .traceparent = tp,
                .data_json = "{\"n\":42}"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    CHECK_EQ_INT(wait_at_least(&R.calls, 1, 5000), 1);
    pthread_mutex_lock(&R.mu);
    CHECK_EQ_STR(R.key, "coupon-77");
    CHECK_EQ_STR(R.request_id, "req-abc");
    CHECK_EQ_STR(R.traceparent, tp);
    CHECK_EQ_STR(R.type, rk);
    CHECK_EQ_STR(R.rk, rk);
    CHECK_EQ_STR(R.consumer, name);
    CHECK_EQ_INT(R.n, 42);
    CHECK_EQ_INT(R.attempt, 1);
    CHECK_EQ_INT(R.redelivered, 0);
    CHECK(R.thread_ok);
    pthread_mutex_unlock(&R.mu);

    /* a malformed body goes straight to the dead queue, the handler never sees it */
    char dq[96];
    snprintf(dq, sizeof(dq), "quan.%s.dead", name);
    mq_msg junk = {.routing_key = rk, .key = "junk", .body = "this is not json"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &junk, 5000), QN_OK);
    CHECK_EQ_INT(wait_count(c, dq, 1, 5000), 1);
    CHECK_EQ_INT(atomic_load(&R.calls), 1);

    mq_consumer_stop(cons);
    CHECK_EQ_INT(queue_count(c, q), 0);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* A publisher and a consumer given a list whose first URL is refused work as with one URL. */
static void test_url_list_consumer(void)
{
    char name[64], rk[64], q[96], list[1024];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("list", name, rk, q);
    if (!c)
        return;
    snprintf(list, sizeof(list), "amqp://guest:guest@127.0.0.1:1/,%s", url);
    atomic_store(&R.calls, 0);
    R.main_thread = pthread_self();
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = list,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .handler = recv_handler});
    CHECK(cons != NULL);
    int64_t end = now_mono_ms() + 15000;
    while (!mq_consumer_ready(cons) && now_mono_ms() < end)
        usleep(10000);
    CHECK(mq_consumer_ready(cons));
    mq_conn *p = mq_conn_open(list, "test list");
    CHECK(p != NULL);
    if (p) {
        mq_msg m = {.routing_key = rk, .key = "listed", .data_json = "{\"n\":7}"};
        CHECK_EQ_INT(mq_conn_publish_confirmed(p, &m, 5000), QN_OK);
        CHECK_EQ_INT(wait_at_least(&R.calls, 1, 5000), 1);
        pthread_mutex_lock(&R.mu);
        CHECK_EQ_STR(R.key, "listed");
        CHECK_EQ_INT(R.n, 7);
        pthread_mutex_unlock(&R.mu);
        mq_conn_close(p);
    }
    mq_consumer_stop(cons);
    CHECK_EQ_INT(queue_count(c, q), 0);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- retry, dead, replay */

#define RD_MAX 16
static struct {
    atomic_int calls;
    atomic_int replayed; /* after the replay, the handler succeeds */
    int attempt[RD_MAX];
    int64_t at[RD_MAX];
    char rk[RD_MAX][64];
} RD;

static mq_handler_result retry_handler(const mq_envelope *env, const mq_delivery_info *info,
                                       void *arg)
{
    (void)env, (void)arg;
    int i = atomic_load(&RD.calls);
    if (i < RD_MAX) {
        RD.attempt[i] = info->attempt;
        RD.at[i] = now_mono_ms();
        snprintf(RD.rk[i], sizeof(RD.rk[i]), "%s", info->routing_key);
    }
    atomic_fetch_add(&RD.calls, 1);
    return atomic_load(&RD.replayed) ? MQ_ACK : MQ_RETRY;
}

static struct {
    int n, attempt;
    char reason[32], key_seen[64];
} DL;

static void dead_seen(const char *body, size_t len, int attempt, const char *reason, void *arg)
{
    (void)arg;
    mq_envelope e;
    DL.n++;
    DL.attempt = attempt;
    snprintf(DL.reason, sizeof(DL.reason), "%s", reason ? reason : "");
    if (mq_envelope_parse(body, len, &e) == QN_OK) {
        snprintf(DL.key_seen, sizeof(DL.key_seen), "%s", e.key);
        mq_envelope_free(&e);
    }
}

static void test_retry_dead_replay(void)
{
    char name[64], rk[64], q[96], rq[96], dq[96];
    name_of(name, sizeof(name), "retry");
    name_of(rk, sizeof(rk), "retry.event");
    snprintf(q, sizeof(q), "quan.%s", name);
    snprintf(rq, sizeof(rq), "quan.%s.retry", name);
    snprintf(dq, sizeof(dq), "quan.%s.dead", name);
    const char *keys[] = {rk, NULL};
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (!c)
        return;
    memset(&RD, 0, sizeof(RD));
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 300, qtype), QN_OK);
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .retry_delay_ms = 300,
                                                              .max_attempts = 3,
                                                              .handler = retry_handler});
    CHECK(cons != NULL);
    mq_msg m = {.routing_key = rk, .key = "retry-me", .data_json = "{}"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);

    CHECK_EQ_INT(wait_at_least(&RD.calls, 3, 10000), 3);
    CHECK_EQ_INT(wait_count(c, dq, 1, 5000), 1);
    usleep(500000); /* nothing more may come: it is dead, not retried */
    CHECK_EQ_INT(atomic_load(&RD.calls), 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(RD.attempt[i], i + 1);
        CHECK_EQ_STR(RD.rk[i], rk);
    }
    CHECK(RD.at[1] - RD.at[0] >= 250);
    CHECK(RD.at[2] - RD.at[1] >= 250);
    CHECK_EQ_INT(queue_count(c, rq), 0);

    memset(&DL, 0, sizeof(DL));
    CHECK_EQ_INT(mq_dead_list(url, name, 10, dead_seen, NULL), QN_OK);
    CHECK_EQ_INT(DL.n, 1);
    CHECK_EQ_INT(DL.attempt, 3);
    CHECK_EQ_STR(DL.reason, "max-attempts");
    CHECK_EQ_STR(DL.key_seen, "retry-me");
    CHECK_EQ_INT(wait_count(c, dq, 1, 2000), 1); /* listing did not consume */

    atomic_store(&RD.replayed, 1);
    int moved = -1;
    CHECK_EQ_INT(mq_dead_replay(url, name, 10, &moved), QN_OK);
    CHECK_EQ_INT(moved, 1);
    CHECK_EQ_INT(wait_at_least(&RD.calls, 4, 5000), 4);
    CHECK_EQ_INT(RD.attempt[3], 1); /* x-attempt reset */
    CHECK_EQ_STR(RD.rk[3], rk);     /* original event name survives the detours */
    CHECK_EQ_INT(wait_count(c, dq, 0, 2000), 0);
    CHECK_EQ_INT(wait_count(c, q, 0, 2000), 0);

    mq_consumer_stop(cons);
    CHECK_EQ_INT(atomic_load(&RD.calls), 4);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- retries during an outage */

static atomic_int deps_up;
static int deps_ready_fn(void *arg)
{
    (void)arg;
    return atomic_load(&deps_up);
}

/* While deps_ready says a store is down, MQ_RETRY waits in the retry queue uncounted: far more
 * failures than max_attempts, no dead letter, the attempt still 1; once it is up again, the
 * failures count as before. */
static void test_retry_uncounted_while_deps_down(void)
{
    char name[64], rk[64], dq[96];
    name_of(name, sizeof(name), "outage");
    name_of(rk, sizeof(rk), "outage.event");
    snprintf(dq, sizeof(dq), "quan.%s.dead", name);
    const char *keys[] = {rk, NULL};
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (!c)
        return;
    memset(&RD, 0, sizeof(RD));
    atomic_store(&deps_up, 0);
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 100, qtype), QN_OK);
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .retry_delay_ms = 100,
                                                              .max_attempts = 2,
                                                              .handler = retry_handler,
                                                              .deps_ready = deps_ready_fn});
    CHECK(cons != NULL);
    mq_msg m = {.routing_key = rk, .key = "outage-me", .data_json = "{}"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    CHECK_EQ_INT(wait_at_least(&RD.calls, 6, 10000), 6);
    CHECK_EQ_INT(queue_count(c, dq), 0);
    for (int i = 0; i < 6; i++)
        CHECK_EQ_INT(RD.attempt[i], 1);

    atomic_store(&deps_up, 1); /* back: two more failures and it is dead */
    CHECK_EQ_INT(wait_count(c, dq, 1, 5000), 1);
    int n = atomic_load(&RD.calls);
    CHECK(n >= 8 && n <= RD_MAX);
    if (n >= 8 && n <= RD_MAX) {
        CHECK_EQ_INT(RD.attempt[n - 2], 1);
        CHECK_EQ_INT(RD.attempt[n - 1], 2);
    }
    mq_consumer_stop(cons);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- replay while it fails again */

#define RP_N 20
static atomic_int rp_calls[RP_N];

/* Dead-letters everything at once: a replayed message is back in the dead-letter queue within
 * a round trip or two, long before a replay of RP_N messages ends. */
static mq_handler_result always_dead_handler(const mq_envelope *env, const mq_delivery_info *info,
                                             void *arg)
{
    (void)info, (void)arg;
    int k = atoi(env->key + strlen("rp-"));
    if (k >= 0 && k < RP_N)
        atomic_fetch_add(&rp_calls[k], 1);
    return MQ_DEAD;
}

static struct {
    const char *name;
    int moved;
    qn_status st;
    atomic_int done;
} RP;

static void *replay_main(void *arg)
{
    (void)arg;
    RP.st = mq_dead_replay(url, RP.name, INT_MAX, &RP.moved);
    atomic_store(&RP.done, 1);
    return NULL;
}

/* A replay moves exactly the messages that were dead when it started, even while a consumer
 * sends each of them straight back: it does not chase its own output. */
static void test_replay_takes_only_what_was_dead(void)
{
    char name[64], rk[64], q[96], dq[112];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("replay", name, rk, q);
    if (!c)
        return;
    snprintf(dq, sizeof(dq), "%s.dead", q);
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);
    for (int i = 0; i < RP_N; i++)
        atomic_store(&rp_calls[i], 0);
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .handler = always_dead_handler});
    CHECK(cons != NULL);
    for (int i = 0; i < RP_N; i++) {
        char key[16];
        snprintf(key, sizeof(key), "rp-%d", i);
        mq_msg m = {.routing_key = rk, .key = key};
        CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    }
    CHECK_EQ_INT(wait_count(c, dq, RP_N, 5000), RP_N);

    memset(&RP, 0, sizeof(RP));
    RP.name = name;
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, replay_main, NULL), 0);
    int64_t end = now_mono_ms() + 15000;
    while (!atomic_load(&RP.done) && now_mono_ms() < end)
        usleep(10000);
    int returned = atomic_load(&RP.done);
    if (returned) /* each message: dead-lettered once, replayed once, dead-lettered again */
        CHECK_EQ_INT(wait_count(c, dq, RP_N, 5000), RP_N);
    mq_consumer_stop(cons); /* lets a replay that chases its output see an empty queue at last */
    pthread_join(th, NULL);
    printf("  replay %s, %d moved\n", returned ? "returned" : "did not return in 15 s", RP.moved);
    CHECK(returned);
    CHECK_EQ_INT(RP.st, QN_OK);
    CHECK_EQ_INT(RP.moved, RP_N);
    for (int i = 0; i < RP_N; i++)
        CHECK_EQ_INT(atomic_load(&rp_calls[i]), 2);
    CHECK_EQ_INT(queue_count(c, q), 0);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- stop mid-handler */

static atomic_int slow_entered, slow_finished, late_calls;

static mq_handler_result slow_handler(const mq_envelope *env, const mq_delivery_info *info,
                                      void *arg)
{
    (void)env, (void)info, (void)arg;
    atomic_store(&slow_entered, 1);
    usleep(300000);
    atomic_store(&slow_finished, 1);
    return MQ_ACK;
}

static mq_handler_result count_handler(const mq_envelope *env, const mq_delivery_info *info,
                                       void *arg)
{
    (void)env, (void)info, (void)arg;
    atomic_fetch_add(&late_calls, 1);
    return MQ_ACK;
}

static void test_stop_midway(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("stop", name, rk, q);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);
    mq_consumer *a = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                           .queue_type = qtype,
                                                           .name = name,
                                                           .routing_keys = keys,
                                                           .handler = slow_handler});
    CHECK(a != NULL);
    mq_msg m = {.routing_key = rk, .key = "slow"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    CHECK_EQ_INT(wait_at_least(&slow_entered, 1, 5000), 1);
    CHECK_EQ_INT(atomic_load(&slow_finished), 0);
    int64_t t0 = now_mono_ms();
    mq_consumer_stop(a); /* must wait for the handler and ack */
    int64_t waited = now_mono_ms() - t0;
    CHECK_EQ_INT(atomic_load(&slow_finished), 1);
    CHECK(waited >= 100);

    mq_consumer *b = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                           .queue_type = qtype,
                                                           .name = name,
                                                           .routing_keys = keys,
                                                           .handler = count_handler});
    CHECK(b != NULL);
    int64_t end = now_mono_ms() + 5000;
    while (!mq_consumer_ready(b) && now_mono_ms() < end)
        usleep(10000);
    usleep(700000);
    CHECK_EQ_INT(atomic_load(&late_calls), 0); /* it was acked: no redelivery */
    CHECK_EQ_INT(queue_count(c, q), 0);
    mq_consumer_stop(b);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- consumer killed */

static mq_handler_result die_handler(const mq_envelope *env, const mq_delivery_info *info,
                                     void *arg)
{
    (void)env, (void)info, (void)arg;
    _exit(42); /* a crash with the message in hand, unacked */
}

static void test_killed_consumer(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn("kill", name, rk, q);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);
    mq_msg m = {.routing_key = rk, .key = "survivor", .request_id = "req-kill"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        mq_consumer *k = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                               .queue_type = qtype,
                                                               .name = name,
                                                               .routing_keys = keys,
                                                               .handler = die_handler});
        (void)k;
        sleep(10);
        _exit(1); /* never got the message */
    }
    CHECK(pid > 0);
    int wst = 0;
    CHECK_EQ_INT(waitpid(pid, &wst, 0), pid);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 42);

    atomic_store(&R.calls, 0);
    R.main_thread = pthread_self();
    mq_consumer *b = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                           .queue_type = qtype,
                                                           .name = name,
                                                           .routing_keys = keys,
                                                           .handler = recv_handler});
    CHECK(b != NULL);
    CHECK_EQ_INT(wait_at_least(&R.calls, 1, 5000), 1);
    pthread_mutex_lock(&R.mu);
    CHECK_EQ_STR(R.key, "survivor");
    CHECK_EQ_STR(R.request_id, "req-kill");
    CHECK_EQ_INT(R.redelivered, 1);
    pthread_mutex_unlock(&R.mu);
    mq_consumer_stop(b);
    CHECK_EQ_INT(queue_count(c, q), 0);
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* ---------------------------------------------------------------- broker closes connections */

/* Closes every broker connection whose client properties mention tag (rabbitmqctl); returns
 * how many. Only our own connections: their names carry this test's pid. */
static int close_connections(const char *ctl, const char *tag)
{
    char cmd[1024], line[4096];
    int n = 0;
    snprintf(cmd, sizeof(cmd), "%.400s -q list_connections pid client_properties 2>/dev/null", ctl);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    char pids[16][128];
    while (n < 16 && fgets(line, sizeof(line), f)) {
        char *sp = strpbrk(line, " \t");
        if (!strstr(line, tag) || !sp || line[0] != '<')
            continue;
        *sp = '\0';
        snprintf(pids[n++], sizeof(pids[0]), "%.120s", line);
    }
    pclose(f);
    for (int i = 0; i < n; i++) {
        snprintf(cmd, sizeof(cmd), "%.400s -q close_connection '%.120s' test >/dev/null 2>&1", ctl,
                 pids[i]);
        if (system(cmd) != 0)
            printf("  close_connection %s failed\n", pids[i]);
    }
    return n;
}

static struct event_base *rc_base;
static int rc_status;
static void rc_cb(qn_status st, void *arg)
{
    (void)arg;
    rc_status = st;
    event_base_loopbreak(rc_base);
}

/* Publishes through the threaded publisher and runs the loop until the callback. */
static qn_status rc_publish(mq_publisher *p, const mq_msg *m)
{
    struct timeval t10 = {10, 0};
    rc_status = 1;
    if (mq_publish(p, m, rc_cb, NULL) != QN_OK)
        return QN_ERR;
    event_base_loopexit(rc_base, &t10);
    event_base_dispatch(rc_base);
    return rc_status;
}

static void test_reconnect(void)
{
    const char *ctl = getenv("QUAN_INFRA_RABBITMQCTL");
    if (!ctl || !*ctl) {
        printf("  skipped: QUAN_INFRA_RABBITMQCTL not set\n");
        return;
    }
    char name[64], rk[64], tag[64];
    name_of(name, sizeof(name), "reco");
    name_of(rk, sizeof(rk), "reco.event");
    snprintf(tag, sizeof(tag), "t%d", (int)getpid());
    const char *keys[] = {rk, NULL};
    mq_conn *c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (!c)
        return;
    CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 0, qtype), QN_OK);
    mq_conn_close(c); /* the broker closes every connection tagged with our pid below */

    rc_base = event_base_new();
    bridge *br = bridge_new(rc_base);
    mq_publisher *p = mq_publisher_new(&(mq_publisher_opts){.url = url, .bridge = br, .name = tag});
    atomic_store(&R.calls, 0);
    R.main_thread = pthread_self();
    mq_consumer *cons = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                              .queue_type = qtype,
                                                              .name = name,
                                                              .routing_keys = keys,
                                                              .handler = recv_handler});
    int64_t end = now_mono_ms() + 5000;
    while ((!mq_consumer_ready(cons) || !mq_publisher_ready(p)) && now_mono_ms() < end)
        usleep(10000);
    CHECK(mq_consumer_ready(cons) && mq_publisher_ready(p));

    int64_t t0 = now_mono_ms();
    CHECK(close_connections(ctl, tag) >= 3); /* publisher, consumer, consumer's republish */
    printf("  closed connections in %lld ms\n", (long long)(now_mono_ms() - t0));
    t0 = now_mono_ms();

    /* Both come back on their own; a publish in the gap fails loudly, never silently. */
    mq_msg m = {.routing_key = rk, .key = "after-reconnect"};
    qn_status st = QN_ERR;
    end = now_mono_ms() + 15000;
    while (now_mono_ms() < end && (st = rc_publish(p, &m)) != QN_OK) {
        CHECK(st == QN_EAGAIN || st == QN_ETIMEDOUT || st == QN_ENOTFOUND);
        usleep(200000);
    }
    CHECK_EQ_INT(st, QN_OK);
    printf("  published again after %lld ms\n", (long long)(now_mono_ms() - t0));
    CHECK(wait_at_least(&R.calls, 1, 5000) >= 1);
    pthread_mutex_lock(&R.mu);
    CHECK_EQ_STR(R.key, "after-reconnect");
    pthread_mutex_unlock(&R.mu);

    mq_consumer_stop(cons);
    mq_publisher_free(p);
    bridge_free(br);
    event_base_free(rc_base);
    c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (c) {
        CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
        mq_conn_close(c);
    }
}

/* ---------------------------------------------------------------- batch consumer */

#define BT_MAX 64 /* keys k0..k63 */

static struct {
    pthread_mutex_t mu;
    atomic_int calls;      /* handler calls */
    atomic_int fail_first; /* the first call fails as a whole */
    int sleep_ms;          /* each call sleeps this long first */
    int seen[BT_MAX];      /* handled per key (calls that did not fail) */
    int attempt[BT_MAX];   /* the last attempt seen per key */
    int redelivered[BT_MAX];
    int max_items, max_envs;
    int retried;   /* "retry" was asked once */
    atomic_int in; /* inside the handler */
} BT = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int bt_key(const char *key)
{
    int k = key[0] == 'k' ? atoi(key + 1) : -1;
    return k >= 0 && k < BT_MAX ? k : -1;
}

/* k5: dead with a reason; k6: retried once; everything else acked. */
static qn_status bt_handler(mq_batch_item *items, size_t n, void *arg)
{
    (void)arg;
    int call = atomic_fetch_add(&BT.calls, 1);
    atomic_store(&BT.in, 1);
    if (BT.sleep_ms)
        usleep((useconds_t)BT.sleep_ms * 1000);
    atomic_store(&BT.in, 0);
    if (call == 0 && atomic_load(&BT.fail_first))
        return QN_EAGAIN;
    pthread_mutex_lock(&BT.mu);
    int envs = 0;
    for (size_t i = 0; i < n; i++) {
        envs += (int)items[i].nenv;
        for (size_t j = 0; j < items[i].nenv; j++) {
            int k = bt_key(items[i].env[j].key);
            if (k < 0)
                continue;
            BT.seen[k]++;
            BT.attempt[k] = items[i].info.attempt;
            BT.redelivered[k] |= items[i].info.redelivered;
            if (k == 5) {
                items[i].verdict = MQ_DEAD;
                items[i].reason = "test-reason";
            } else if (k == 6 && !BT.retried) {
                BT.retried = 1;
                items[i].verdict = MQ_RETRY;
            }
        }
    }
    if ((int)n > BT.max_items)
        BT.max_items = (int)n;
    if (envs > BT.max_envs)
        BT.max_envs = envs;
    pthread_mutex_unlock(&BT.mu);
    return QN_OK;
}

static void bt_reset(void)
{
    pthread_mutex_lock(&BT.mu);
    atomic_store(&BT.calls, 0);
    atomic_store(&BT.fail_first, 0);
    atomic_store(&BT.in, 0);
    BT.sleep_ms = 0;
    memset(BT.seen, 0, sizeof(BT.seen));
    memset(BT.attempt, 0, sizeof(BT.attempt));
    memset(BT.redelivered, 0, sizeof(BT.redelivered));
    BT.max_items = BT.max_envs = BT.retried = 0;
    pthread_mutex_unlock(&BT.mu);
}

static int bt_seen(int k)
{
    pthread_mutex_lock(&BT.mu);
    int v = BT.seen[k];
    pthread_mutex_unlock(&BT.mu);
    return v;
}

/* Waits until every key in [0, n) was handled at least want times. */
static int bt_wait_all(int n, int want, int ms)
{
    int64_t end = now_mono_ms() + ms;
    for (;;) {
        int ok = 1;
        for (int k = 0; k < n && ok; k++)
            ok = bt_seen(k) >= want;
        if (ok || now_mono_ms() >= end)
            return ok;
        usleep(10000);
    }
}

static mq_consumer *bt_start(const char *name, const char *const *keys, int batch_max,
                             int heartbeat_s)
{
    mq_consumer *c = mq_consumer_start(&(mq_consumer_opts){.url = url,
                                                           .queue_type = qtype,
                                                           .name = name,
                                                           .routing_keys = keys,
                                                           .retry_delay_ms = 300,
                                                           .heartbeat_s = heartbeat_s,
                                                           .batch_handler = bt_handler,
                                                           .batch_max = batch_max,
                                                           .batch_wait_ms = 50});
    int64_t end = now_mono_ms() + 5000;
    CHECK(c != NULL);
    while (c && !mq_consumer_ready(c) && now_mono_ms() < end)
        usleep(10000);
    return c;
}

/* Publishes keys k<from>..k<to-1>, one message each. */
static void bt_publish(mq_conn *c, const char *rk, int from, int to)
{
    for (int k = from; k < to; k++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", k);
        mq_msg m = {.routing_key = rk, .key = key};
        CHECK_EQ_INT(mq_conn_publish_confirmed(c, &m, 5000), QN_OK);
    }
}

/* A batch test's queues (retry delay 300 ms), with the handler's record reset. */
static mq_conn *bt_setup(const char *what, char name[64], char rk[64], char q[96])
{
    const char *keys[] = {rk, NULL};
    mq_conn *c = test_conn(what, name, rk, q);
    if (c)
        CHECK_EQ_INT(mq_conn_declare_consumer(c, name, keys, 300, qtype), QN_OK);
    bt_reset();
    return c;
}

static void bt_teardown(mq_conn *c, const char *name)
{
    CHECK_EQ_INT(mq_conn_delete_consumer(c, name), QN_OK);
    mq_conn_close(c);
}

/* Waits until key k was handled at least want times. */
static int bt_wait_seen(int k, int want, int ms)
{
    int64_t end = now_mono_ms() + ms;
    while (bt_seen(k) < want && now_mono_ms() < end)
        usleep(10000);
    return bt_seen(k) >= want;
}

/* Deliveries come in batches (packs read), are acked together, and each one can be retried
 * (attempts counted) or dead-lettered with its reason; a malformed one never reaches it. */
static void test_batch_consumer(void)
{
    char name[64], rk[64], q[96], dq[112];
    const char *keys[] = {rk, NULL};
    mq_conn *c = bt_setup("batch", name, rk, q);
    if (!c)
        return;
    snprintf(dq, sizeof(dq), "%s.dead", q);
    /* all queued before the consumer starts: they arrive together */
    bt_publish(c, rk, 0, 30);
    char *a = mq_envelope_build(rk, "k30", NULL, NULL, 0, NULL);
    char *b = mq_envelope_build(rk, "k31", NULL, NULL, 0, NULL);
    char pack[512];
    snprintf(pack, sizeof(pack), "[%s,%s]", a, b);
    mq_msg pm = {.routing_key = rk, .key = "pack", .body = pack};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &pm, 5000), QN_OK);
    mq_msg junk = {.routing_key = rk, .key = "junk", .body = "[1,2]"};
    CHECK_EQ_INT(mq_conn_publish_confirmed(c, &junk, 5000), QN_OK);
    free(a);
    free(b);

    mq_consumer *cons = bt_start(name, keys, 10, 0);
    CHECK(bt_wait_all(32, 1, 5000));
    CHECK_EQ_INT(wait_count(c, dq, 2, 5000), 2); /* k5 and the junk */
    int64_t end = now_mono_ms() + 5000;          /* k6 comes back from the retry queue */
    while (bt_seen(6) < 2 && now_mono_ms() < end)
        usleep(10000);
    mq_consumer_stop(cons);

    pthread_mutex_lock(&BT.mu);
    printf("  %d calls, at most %d deliveries and %d envelopes in one\n", atomic_load(&BT.calls),
           BT.max_items, BT.max_envs);
    CHECK(BT.max_items > 1);  /* batches, not one by one */
    CHECK(BT.max_envs <= 11); /* batch_max, passed by at most one pack less one */
    for (int k = 0; k < 32; k++) {
        CHECK_EQ_INT(BT.seen[k], k == 6 ? 2 : 1);
        CHECK_EQ_INT(BT.redelivered[k], 0);
    }
    CHECK_EQ_INT(BT.attempt[6], 2);
    pthread_mutex_unlock(&BT.mu);
    /* acked: nothing came back to the queue when the consumer closed */
    CHECK_EQ_INT(queue_count(c, q), 0);
    memset(&DL, 0, sizeof(DL));
    CHECK_EQ_INT(mq_dead_list(url, name, 10, dead_seen, NULL), QN_OK);
    CHECK_EQ_INT(DL.n, 2);
    bt_teardown(c, name);
}

/* A batch that fails as a whole comes back whole, redelivered, and is handled again. */
static void test_batch_failure_returns_all(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = bt_setup("bfail", name, rk, q);
    if (!c)
        return;
    atomic_store(&BT.fail_first, 1);
    bt_publish(c, rk, 10, 20);
    mq_consumer *cons = bt_start(name, keys, 100, 0);
    for (int k = 10; k < 20; k++)
        CHECK(bt_wait_seen(k, 1, 8000));
    mq_consumer_stop(cons);
    pthread_mutex_lock(&BT.mu);
    CHECK(atomic_load(&BT.calls) >= 2);
    for (int k = 10; k < 20; k++) {
        CHECK_EQ_INT(BT.seen[k], 1);
        CHECK_EQ_INT(BT.attempt[k], 1); /* back at once, not through the retry queue */
        CHECK_EQ_INT(BT.redelivered[k], 1);
    }
    pthread_mutex_unlock(&BT.mu);
    CHECK_EQ_INT(queue_count(c, q), 0);
    bt_teardown(c, name);
}

/* A batch that takes longer than the broker waits for heartbeats (two of 1 s) keeps its
 * connection: handled once, acked, never redelivered. */
static void test_batch_heartbeats_while_busy(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = bt_setup("beat", name, rk, q);
    if (!c)
        return;
    BT.sleep_ms = 4000;
    mq_consumer *cons = bt_start(name, keys, 100, 1);
    bt_publish(c, rk, 40, 41);
    CHECK(bt_wait_seen(40, 1, 10000));
    BT.sleep_ms = 0;
    usleep(1500000); /* a redelivery, had the connection been dropped, would come by now */
    mq_consumer_stop(cons);
    pthread_mutex_lock(&BT.mu);
    printf("  handler calls: %d\n", atomic_load(&BT.calls));
    CHECK_EQ_INT(BT.seen[40], 1);
    CHECK_EQ_INT(BT.redelivered[40], 0);
    CHECK_EQ_INT(atomic_load(&BT.calls), 1);
    pthread_mutex_unlock(&BT.mu);
    CHECK_EQ_INT(queue_count(c, q), 0);
    bt_teardown(c, name);
}

/* Stopping mid-batch finishes and acks the batch in hand; the rest stays queued. */
static void test_batch_stop_finishes_batch(void)
{
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = bt_setup("bstop", name, rk, q);
    if (!c)
        return;
    BT.sleep_ms = 500;
    bt_publish(c, rk, 0, 20);
    mq_consumer *cons = bt_start(name, keys, 5, 0);
    int64_t end = now_mono_ms() + 5000;
    while (!atomic_load(&BT.in) && now_mono_ms() < end)
        usleep(1000);
    CHECK(atomic_load(&BT.in));
    mq_consumer_stop(cons); /* waits for the batch in hand */
    int handled = 0;
    pthread_mutex_lock(&BT.mu);
    for (int k = 0; k < 20; k++)
        handled += BT.seen[k];
    pthread_mutex_unlock(&BT.mu);
    printf("  %d handled before the stop\n", handled);
    CHECK(handled >= 1 && handled <= 5);
    CHECK_EQ_INT(wait_count(c, q, (uint32_t)(20 - handled), 3000), 20 - handled);
    bt_teardown(c, name);
}

/* rabbitmqctl stop_app + start_app: the broker goes away and comes back; the consumer
 * reconnects on its own and consumes what is published afterwards. */
static void test_batch_broker_restart(void)
{
    const char *ctl = getenv("QUAN_INFRA_RABBITMQCTL");
    char cmd[600];
    if (!ctl || !*ctl) {
        printf("  skipped: QUAN_INFRA_RABBITMQCTL not set\n");
        return;
    }
    char name[64], rk[64], q[96];
    const char *keys[] = {rk, NULL};
    mq_conn *c = bt_setup("brestart", name, rk, q);
    if (!c)
        return;
    mq_conn_close(c); /* the broker goes away below */
    mq_consumer *cons = bt_start(name, keys, 100, 0);
    CHECK(mq_consumer_ready(cons));
    snprintf(cmd, sizeof(cmd), "%.500s -q stop_app >/dev/null 2>&1", ctl);
    CHECK_EQ_INT(system(cmd), 0);
    int64_t end = now_mono_ms() + 5000;
    while (mq_consumer_ready(cons) && now_mono_ms() < end)
        usleep(10000);
    CHECK(!mq_consumer_ready(cons)); /* it noticed */
    snprintf(cmd, sizeof(cmd), "%.500s -q start_app >/dev/null 2>&1", ctl);
    CHECK_EQ_INT(system(cmd), 0);
    end = now_mono_ms() + 20000;
    while (!mq_consumer_ready(cons) && now_mono_ms() < end)
        usleep(50000);
    CHECK(mq_consumer_ready(cons));
    c = mq_conn_open(url, "test");
    CHECK(c != NULL);
    if (c) {
        bt_publish(c, rk, 50, 53);
        for (int k = 50; k < 53; k++)
            CHECK(bt_wait_seen(k, 1, 5000));
    }
    mq_consumer_stop(cons);
    if (c) {
        CHECK_EQ_INT(queue_count(c, q), 0);
        bt_teardown(c, name);
    }
}

/* The same tests on quorum queues. */
#define ON_QUORUM(fn)                                                                              \
    static void fn##_quorum(void)                                                                  \
    {                                                                                              \
        qtype = MQ_CONN_QUORUM;                                                                    \
        fn();                                                                                      \
        qtype = MQ_CONN_CLASSIC;                                                                   \
    }
ON_QUORUM(test_topology)
ON_QUORUM(test_publisher_loop)
ON_QUORUM(test_consumer_envelope)
ON_QUORUM(test_url_list_consumer)
ON_QUORUM(test_retry_dead_replay)
ON_QUORUM(test_retry_uncounted_while_deps_down)
ON_QUORUM(test_replay_takes_only_what_was_dead)
ON_QUORUM(test_killed_consumer)
ON_QUORUM(test_batch_consumer)
ON_QUORUM(test_batch_failure_returns_all)

int main(void)
{
    log_init("test_mq", LOGL_ERROR);
    RUN(test_envelope);
    url = th_env("QUAN_AMQP_URL");
    RUN(test_connect_errors);
    RUN(test_url_list_check);
    RUN(test_url_tls_check);
    RUN(test_url_list_connect);
    RUN(test_topology);
    RUN(test_publisher_loop);
    RUN(test_publisher_unreachable);
    RUN(test_pack_parse);
    RUN(test_publisher_packs);
    RUN(test_consumer_envelope);
    RUN(test_url_list_consumer);
    RUN(test_retry_dead_replay);
    RUN(test_retry_uncounted_while_deps_down);
    RUN(test_replay_takes_only_what_was_dead);
    RUN(test_stop_midway);
    RUN(test_killed_consumer);
    RUN(test_reconnect);
    RUN(test_batch_consumer);
    RUN(test_batch_failure_returns_all);
    RUN(test_batch_heartbeats_while_busy);
    RUN(test_batch_stop_finishes_batch);
    RUN(test_batch_broker_restart);
    RUN(test_quorum_declared);
    RUN(test_topology_quorum);
    RUN(test_publisher_loop_quorum);
    RUN(test_consumer_envelope_quorum);
    RUN(test_url_list_consumer_quorum);
    RUN(test_retry_dead_replay_quorum);
    RUN(test_retry_uncounted_while_deps_down_quorum);
    RUN(test_replay_takes_only_what_was_dead_quorum);
    RUN(test_killed_consumer_quorum);
    RUN(test_batch_consumer_quorum);
    RUN(test_batch_failure_returns_all_quorum);
    TEST_MAIN_END();
}
