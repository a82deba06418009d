/* merchant-admin's tasks module: /coupon-task/... (create from a spreadsheet, find, page, cancel,
 * the failure report), the task.schedule and task.count consumers; its settings: where task files
 * may come from. */
#ifndef QUAN_MADMIN_TASKS_H
#define QUAN_MADMIN_TASKS_H

#include "service.h"

extern const service_module tasks_module;

#endif
