/* merchant-admin's tasks module: /coupon-task/... (create from a spreadsheet, find, page, cancel,
 * the failure report), the task.schedule and task.count consumers; its settings: where task files
 * may come from. */
#ifndef QUAN_MADMIN_TASKS_H
#define QUAN_MADMIN_TASKS_H

#include <stdint.h>

#include <cJSON.h>

#include "jsonin.h"
#include "service.h"
#include "task.h"

extern const service_module tasks_module;

/* What the module decides without I/O, for its tests. */

#define TASKS_NAME_MAX   128 /* characters of taskName */
#define TASKS_ADDR_MAX   512 /* characters of fileAddress */
#define TASKS_NOTIFY_LEN 16  /* "0,1,2,3" and its NUL */

enum { TASKS_SEND_NOW = 0, TASKS_SEND_SCHEDULED = 1 }; /* sendType */

/* A create body as read. */
typedef struct tasks_create_body {
    const char *task_name, *file_address; /* borrowed from the body */
    int64_t tpl_id;
    int send_type;                 /* TASKS_SEND_* */
    int64_t send_time_ms;          /* scheduled: when; immediate: 0 */
    int status;                    /* its first: pending when scheduled, else running */
    char notify[TASKS_NOTIFY_LEN]; /* the channels as stored, in the order given: "2,0" */
} tasks_create_body;

/* A create body, validated as of now_ms (the file's address and the template are checked later,
 * with I/O), into out. QN_EINVAL with err naming the field and the reason (out untouched). */
qn_status tasks_create_parse(const cJSON *body, int64_t now_ms, tasks_create_body *out,
                             jsonin_err *err) QN_MUSTCHECK;

#endif
