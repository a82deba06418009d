/* The task.notify message read, its recipients per channel, the webhook body of a batch, and the
 * units a delivery records as sent (their numbers, the bitmap, the batches). */
#include "../notify.h"
#include "jsonin.h"
#include "testhelp.h"

static const char good[] =
    "{\"taskId\":\"1810966706881941507\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\","
    "\"notifyType\":\"0,2,3\",\"users\":[{\"userId\":\"11\",\"phone\":\"13800000001\","
    "\"mail\":\"a@users.test\"},{\"userId\":12},{\"userId\":\"13\",\"phone\":\"\","
    "\"mail\":\"not an address\"},{\"userId\":\"14\",\"mail\":\"b@users.test\","
    "\"phone\":\"13800000004\"}]}";

static cJSON *parse(const char *text)
{
    jsonin_err e;
    return jsonin_parse(text, strlen(text), &e);
}

static void test_parse(void)
{
    cJSON *j = parse(good);
    notify_task t;
    char err[256] = "";
    CHECK(j != NULL);
    CHECK_EQ_INT(notify_task_parse(j, &t, err, sizeof(err)), QN_OK);
    CHECK(t.task_id == 1810966706881941507LL);
    CHECK_EQ_INT(t.tpl_id, 7);
    CHECK_EQ_INT(t.shop, 9);
    CHECK_EQ_INT(t.channels, (1u << 0) | (1u << 2) | (1u << 3));
    CHECK_EQ_INT(t.nusers, 4);
    CHECK_EQ_STR(t.users[0].phone, "13800000001");
    CHECK_EQ_STR(t.users[0].mail, "a@users.test");
    CHECK_EQ_INT(t.users[1].user_id, 12);
    CHECK(t.users[1].phone == NULL && t.users[1].mail == NULL);
    CHECK(t.users[2].phone == NULL); /* empty */
    CHECK(t.users[2].mail == NULL);  /* not an address: as if absent */
    notify_task_clear(&t);
    cJSON_Delete(j);
}

static void test_malformed(void)
{
    static const struct {
        const char *json, *field;
    } cases[] = {
        {"{\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"notifyType\":\"0\",\"users\":[]}",
         "taskId"},
        {"{\"taskId\":\"1\",\"shopNumber\":\"9\",\"notifyType\":\"0\",\"users\":[]}",
         "couponTemplateId"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"notifyType\":\"0\",\"users\":[]}",
         "shopNumber"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"users\":[]}",
         "notifyType"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"notifyType\":\"4\","
         "\"users\":[]}",
         "notifyType"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"notifyType\":\"0\"}",
         "users"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"notifyType\":\"0\","
         "\"users\":[1]}",
         "users"},
        {"{\"taskId\":\"1\",\"couponTemplateId\":\"7\",\"shopNumber\":\"9\",\"notifyType\":\"0\","
         "\"users\":[{\"phone\":\"1\"}]}",
         "userId"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *j = parse(cases[i].json);
        notify_task t;
        char err[256] = "";
        CHECK(j != NULL);
        CHECK_EQ_INT(notify_task_parse(j, &t, err, sizeof(err)), QN_EINVAL);
        CHECK(strncmp(err, cases[i].field, strlen(cases[i].field)) == 0);
        CHECK(t.users == NULL);
        cJSON_Delete(j);
    }
}

static void test_recipients_and_batches(void)
{
    cJSON *j = parse(good);
    notify_task t;
    char err[256];
    size_t idx[4];
    CHECK_EQ_INT(notify_task_parse(j, &t, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(notify_recipients(&t, 0, idx), 4);
    CHECK_EQ_INT(notify_recipients(&t, 1, idx), 4);
    CHECK_EQ_INT(notify_recipients(&t, NOTIFY_EMAIL, idx), 2);
    CHECK(idx[0] == 0 && idx[1] == 3);
    CHECK_EQ_INT(notify_recipients(&t, NOTIFY_SMS, idx), 2);
    CHECK(idx[0] == 0 && idx[1] == 3);

    char *json = notify_batch_json(&t, NOTIFY_SMS, "task.notify:1:0:sms:0", idx, 2);
    CHECK_EQ_STR(json, "{\"event\":\"task.notify\",\"key\":\"task.notify:1:0:sms:0\","
                       "\"channel\":\"sms\",\"notifyType\":3,\"taskId\":\"1810966706881941507\","
                       "\"couponTemplateId\":\"7\",\"shopNumber\":\"9\","
                       "\"userIds\":[\"11\",\"14\"],\"phones\":[\"13800000001\",\"13800000004\"]}");
    free(json);
    CHECK_EQ_INT(notify_recipients(&t, 0, idx), 4);
    json = notify_batch_json(&t, 0, "k", idx + 2, 2);
    CHECK(json && strstr(json, "\"channel\":\"app\",\"notifyType\":0,") &&
          strstr(json, "\"userIds\":[\"13\",\"14\"]}") && !strstr(json, "phones"));
    free(json);
    CHECK_EQ_STR(notify_channel_name(1), "popup");
    CHECK_EQ_STR(notify_channel_name(NOTIFY_EMAIL), "email");
    notify_task_clear(&t);
    cJSON_Delete(j);
}

/* Batches of recipients: every one in exactly one, in order, none empty. */
static void test_batch_spans(void)
{
    static const struct {
        size_t n, batch;
        size_t sizes[6]; /* of batches 0, 1, ...; then 0 */
    } v[] = {
        {0, 100, {0}},
        {1, 100, {1, 0}},
        {100, 100, {100, 0}},
        {101, 100, {100, 1, 0}},
        {250, 100, {100, 100, 50, 0}},
        {3, 1, {1, 1, 1, 0}},
        {5, 2, {2, 2, 1, 0}},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        size_t first = 0, at = 0, b = 0;
        for (;; b++) {
            size_t cnt = notify_batch_span(v[i].n, v[i].batch, b, &first);
            if (cnt != v[i].sizes[b] || (cnt && first != at)) {
                printf("  case %zu (%zu in %zu): batch %zu is %zu from %zu\n", i, v[i].n,
                       v[i].batch, b, cnt, first);
                CHECK(0);
                break;
            }
            if (!cnt)
                break;
            at += cnt;
        }
        CHECK_EQ_INT(at, v[i].n);
    }
}

/* Units: numbered per channel after the ones before it, read from SETBIT's bitmap. */
static void test_units_sent(void)
{
    /* SETBIT k 0, 9 and 17: bytes 0x80 0x40 0x40 */
    static const char sent[] = {(char)0x80, 0x40, 0x40};
    static const struct {
        int channel;
        size_t nusers, i;
        uint64_t unit;
        int sent;
    } v[] = {
        {0, 10, 0, 0, 1},  {0, 10, 1, 1, 0}, {0, 10, 9, 9, 1},
        {1, 10, 0, 10, 0}, {1, 8, 1, 9, 1},  {2, 8, 1, 17, 1},
        {2, 8, 0, 16, 0},  {3, 8, 7, 31, 0}, {3, 1000, 5, 3005, 0}, /* past the bitmap: not sent */
    };
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
        uint64_t unit = notify_unit(v[k].channel, v[k].nusers, v[k].i);
        int got = notify_unit_sent(sent, sizeof(sent), unit);
        if (unit != v[k].unit || got != v[k].sent)
            printf("  case %zu: unit %llu, sent %d\n", k, (unsigned long long)unit, got);
        CHECK_EQ_INT(unit, v[k].unit);
        CHECK_EQ_INT(got, v[k].sent);
    }
    CHECK_EQ_INT(notify_unit_sent(NULL, 0, 0), 0); /* nothing recorded yet */
}

int main(void)
{
    RUN(test_parse);
    RUN(test_malformed);
    RUN(test_recipients_and_batches);
    RUN(test_batch_spans);
    RUN(test_units_sent);
    TEST_MAIN_END();
}
