/*
 * A distribution task's status (t_coupon_task.status), for the two services that move it:
 * merchant-admin creates, schedules and cancels tasks; distribution runs and ends them.
 *
 * Header only. Statements compare and write the status in their text, so each number is written
 * once, as a macro the enum and TASK_STATUS_TEXT are both made of (pgparam.h).
 */
#ifndef QUAN_TASK_H
#define QUAN_TASK_H

#include "pgparam.h"

#define TASK_STATUS_PENDING_N   0 /* scheduled: waits for its send time (task.schedule) */
#define TASK_STATUS_RUNNING_N   1 /* to be run now, or being run (task.execute) */
#define TASK_STATUS_FAILED_N    2
#define TASK_STATUS_SUCCEEDED_N 3
#define TASK_STATUS_CANCELLED_N 4

enum {
    TASK_STATUS_PENDING = TASK_STATUS_PENDING_N,
    TASK_STATUS_RUNNING = TASK_STATUS_RUNNING_N,
    TASK_STATUS_FAILED = TASK_STATUS_FAILED_N,
    TASK_STATUS_SUCCEEDED = TASK_STATUS_SUCCEEDED_N,
    TASK_STATUS_CANCELLED = TASK_STATUS_CANCELLED_N,
};

/* A status as the text of a statement: TASK_STATUS_TEXT(RUNNING) is "1". */
#define TASK_STATUS_TEXT(name) PGPARAM_DIGIT_TEXT(TASK_STATUS_##name##_N)

#endif
