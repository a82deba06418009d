/* What coupon-task create accepts (tasks_create_parse): each field's bounds and the 400's text,
 * the notification channels as stored, and a task's first status and send time from sendType
 * and sendTime. */
#include <stdint.h>
#include <string.h>

#include "../tasks.h"
#include "body_help.h"
#include "testhelp.h"

#define NOW 1779940800000LL /* 2026-05-28 12:00:00 +08:00 */

/* An immediate task. */
static const char base_body[] =
    "{\"taskName\":\"May users\",\"fileAddress\":\"tasks/may.xlsx\","
    "\"notifyType\":\"0,2\",\"couponTemplateId\":\"1810966706881941507\","
    "\"sendType\":0}";

/* tasks_create_parse of base_body with the changes ch made; *keep holds the body out's strings
 * are borrowed from (cJSON_Delete). */
static qn_status parse(const body_change *ch, tasks_create_body *out, jsonin_err *err, cJSON **keep)
{
    *keep = body_with(base_body, ch);
    err->msg[0] = '\0';
    return tasks_create_parse(*keep, NOW, out, err);
}

static void test_fields(void)
{
    static const body_case v[] = {
        {{{NULL, NULL}}, NULL},
        {{{"taskName", NULL}}, "taskName: required"},
        {{{"taskName", "\" \""}}, "taskName: required"},
        {{{"taskName", "7"}}, "taskName: must be a string"},
        {{{"fileAddress", NULL}}, "fileAddress: required"},
        {{{"fileAddress", "\"\""}}, "fileAddress: required"},
        {{{"notifyType", NULL}}, "notifyType: required"},
        {{{"notifyType", "\"\""}}, "notifyType: required"},
        {{{"notifyType", "[]"}}, "notifyType: required"},
        {{{"notifyType", "\"4\""}},
         "notifyType: must be a comma list of distinct values among 0, 1, 2, 3"},
        {{{"notifyType", "\"1,1\""}}, "notifyType: 1 is listed twice"},
        {{{"notifyType", "[3,0,1,2]"}}, NULL},
        {{{"couponTemplateId", NULL}}, "couponTemplateId: required"},
        {{{"couponTemplateId", "0"}}, "couponTemplateId: must be at least 1"},
        {{{"couponTemplateId", "\"x1\""}}, "couponTemplateId: must be an integer"},
        {{{"sendType", NULL}}, "sendType: required"},
        {{{"sendType", "2"}}, "sendType: must be one of 0, 1"},
        /* A scheduled task needs a send time still to come. */
        {{{"sendType", "1"}}, "sendTime: required"},
        {{{"sendType", "1"}, {"sendTime", "\"2026-05-28 11:00:00\""}},
         "sendTime: must be in the future for a scheduled task"},
        {{{"sendType", "1"}, {"sendTime", "\"2026-05-28 12:00:00\""}},
         "sendTime: must be in the future for a scheduled task"},
        {{{"sendType", "1"}, {"sendTime", "\"2026-05-28 12:00:01\""}}, NULL},
        /* An immediate one's send time is read, then dropped. */
        {{{"sendTime", "\"2020-01-01 00:00:00\""}}, NULL},
        {{{"sendTime", "\"yesterday\""}},
         "sendTime: must be a time \"yyyy-MM-dd HH:mm:ss\" (or RFC 3339 with an offset)"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tasks_create_body t;
        jsonin_err err;
        cJSON *b;
        body_expect(i, parse(v[i].ch, &t, &err, &b), &err, v[i].err);
        cJSON_Delete(b);
    }
}

static void test_text_lengths(void)
{
    static const struct {
        const char *field;
        int n;
        const char *err;
    } v[] = {
        {"taskName", 128, NULL},
        {"taskName", 129, "taskName: must be 1 to 128 characters long"},
        {"fileAddress", 512, NULL},
        {"fileAddress", 513, "fileAddress: must be 1 to 512 characters long"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        body_change ch[BODY_CHANGES] = {{v[i].field, body_text('t', v[i].n)}};
        tasks_create_body t;
        jsonin_err err;
        cJSON *b;
        body_expect(i, parse(ch, &t, &err, &b), &err, v[i].err);
        cJSON_Delete(b);
    }
}

/* The task as created: its first status, send time and channels. */
static void test_accepted(void)
{
    static const struct {
        body_change ch[BODY_CHANGES];
        int send_type, status;
        int64_t send_time_ms;
        const char *notify;
    } v[] = {
        {{{NULL, NULL}}, TASKS_SEND_NOW, TASK_STATUS_RUNNING, 0, "0,2"},
        {{{"sendTime", "\"2027-01-01 00:00:00\""}}, TASKS_SEND_NOW, TASK_STATUS_RUNNING, 0, "0,2"},
        {{{"sendType", "1"}, {"sendTime", "\"2026-05-28 12:00:01\""}},
         TASKS_SEND_SCHEDULED,
         TASK_STATUS_PENDING,
         NOW + 1000,
         "0,2"},
        {{{"notifyType", "[3,0,1,2]"}}, TASKS_SEND_NOW, TASK_STATUS_RUNNING, 0, "3,0,1,2"},
        {{{"notifyType", "\" 1 , 3 \""}}, TASKS_SEND_NOW, TASK_STATUS_RUNNING, 0, "1,3"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tasks_create_body t;
        jsonin_err err;
        cJSON *b;
        body_expect(i, parse(v[i].ch, &t, &err, &b), &err, NULL);
        CHECK_EQ_INT(t.send_type, v[i].send_type);
        CHECK_EQ_INT(t.status, v[i].status);
        CHECK_EQ_INT(t.send_time_ms, v[i].send_time_ms);
        CHECK_EQ_STR(t.notify, v[i].notify);
        CHECK_EQ_STR(t.task_name, "May users");
        CHECK_EQ_STR(t.file_address, "tasks/may.xlsx");
        CHECK_EQ_INT(t.tpl_id, 1810966706881941507LL);
        cJSON_Delete(b);
    }
}

int main(void)
{
    RUN(test_fields);
    RUN(test_text_lengths);
    RUN(test_accepted);
    TEST_MAIN_END();
}
