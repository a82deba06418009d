/* What coupon-task create accepts (tasks_create_parse): each field's bounds and the 400's text,
 * the notification channels as stored, and a task's first status and send time from sendType
 * and sendTime. */
#include <stdint.h>
#include <string.h>

#include "../tasks.h"
#include "testhelp.h"

#define NOW 1779940800000LL /* 2026-05-28 12:00:00 +08:00 */

/* An immediate task. */
static const char base_body[] = "{\"taskName\":\"May users\",\"fileAddress\":\"tasks/may.xlsx\","
                                "\"notifyType\":\"0,2\",\"couponTemplateId\":\"1810966706881941507\","
                                "\"sendType\":0}";

/* n characters of c, as a JSON string (static: one at a time). */
static const char *repeat(char c, int n)
{
    static char buf[600];
    buf[0] = '"';
    memset(buf + 1, c, (size_t)n);
    buf[n + 1] = '"';
    buf[n + 2] = '\0';
    return buf;
}

typedef struct change {
    const char *field, *value; /* value: JSON text; NULL removes the field */
} change;

/* tasks_create_parse of base_body changed by up to two fields (a NULL field ends them). */
static qn_status parse(const change *ch, tasks_create_body *out, jsonin_err *err, cJSON **keep)
{
    jsonin_err perr;
    cJSON *b = jsonin_parse(base_body, strlen(base_body), &perr);
    for (int i = 0; i < 2 && ch[i].field; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(b, ch[i].field);
        if (ch[i].value)
            cJSON_AddItemToObject(b, ch[i].field,
                                  jsonin_parse(ch[i].value, strlen(ch[i].value), &perr));
    }
    err->msg[0] = '\0';
    *keep = b; /* out's strings are borrowed from it */
    return tasks_create_parse(b, NOW, out, err);
}

static void test_fields(void)
{
    static const struct {
        change ch[2];
        const char *err; /* NULL: accepted */
    } v[] = {
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
        qn_status st = parse(v[i].ch, &t, &err, &b);
        if ((st == QN_OK) != (v[i].err == NULL) || (v[i].err && strcmp(err.msg, v[i].err) != 0))
            printf("  case %zu (%s): %s\n", i, v[i].ch[0].field ? v[i].ch[0].field : "-",
                   st == QN_OK ? "accepted" : err.msg);
        if (v[i].err) {
            CHECK_EQ_INT(st, QN_EINVAL);
            CHECK_EQ_STR(err.msg, v[i].err);
        } else {
            CHECK_EQ_INT(st, QN_OK);
        }
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
        change ch[2] = {{v[i].field, repeat('t', v[i].n)}};
        tasks_create_body t;
        jsonin_err err;
        cJSON *b;
        qn_status st = parse(ch, &t, &err, &b);
        if (v[i].err)
            CHECK_EQ_STR(err.msg, v[i].err);
        else
            CHECK_EQ_INT(st, QN_OK);
        cJSON_Delete(b);
    }
}

/* The task as created: its first status, send time and channels. */
static void test_accepted(void)
{
    static const struct {
        change ch[2];
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
        qn_status st = parse(v[i].ch, &t, &err, &b);
        if (st != QN_OK)
            printf("  case %zu: %s\n", i, err.msg);
        CHECK_EQ_INT(st, QN_OK);
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
