/* The task.notify message read, its recipients per channel and the webhook body of a batch. */
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

int main(void)
{
    RUN(test_parse);
    RUN(test_malformed);
    RUN(test_recipients_and_batches);
    TEST_MAIN_END();
}
