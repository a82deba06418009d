/* quan-distribution: what its modules share (header only). The binary is the list of its
 * modules (main.c): taskrun.c runs tasks (the task.execute consumers, with chunk.c for one
 * chunk's writes and taskrow.c for the sheet's rows), sweep.c starts again the tasks whose run
 * stopped. */
#ifndef QUAN_DIST_H
#define QUAN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "service.h"
#include "task.h" /* t_coupon_task.status: TASK_STATUS_* */

#define DIST_TASK_DS 0 /* tasks, their checkpoints and failure rows live in ds_0 */

/* taskrun.c: the task.execute consumers and their settings. */
extern const service_module taskrun_module;
/* sweep.c: the timer that publishes task.execute again for runs that stopped. */
extern const service_module sweep_module;

#endif
