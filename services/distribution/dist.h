/* quan-distribution: what its modules share (header only). The binary is the list of its
 * modules (main.c): taskrun.c runs tasks (the task.execute consumers, with chunk.c for one
 * chunk's writes and taskrow.c for the sheet's rows), sweep.c starts again the tasks whose run
 * stopped. */
#ifndef QUAN_DIST_H
#define QUAN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "fetch.h"
#include "service.h"

typedef struct dist_config {
    service_config common;
    fetch_config file;  /* QUAN_FILE_*: as merchant-admin's (where task files may come from) */
    int64_t chunk_rows; /* QUAN_DIST_CHUNK_ROWS: rows of a chunk (one Redis call, one commit) */
    int64_t workers;    /* QUAN_DIST_WORKERS: tasks run at once by this replica */
    int64_t lease_ms;   /* QUAN_DIST_LEASE_MS: a run's hold on its task, renewed while it runs */
    int64_t sweep_ms;   /* QUAN_DIST_SWEEP_MS: how often stopped runs are looked for */
} dist_config;

_Static_assert(offsetof(dist_config, common) == 0,
               "service_config must come first: the common settings' offsets are within it");

/* The binary's configuration; valid until the service is freed. */
static inline const dist_config *dist_cfg(const service *s)
{
    return (const dist_config *)service_cfg(s);
}

/* t_coupon_task.status */
enum {
    DIST_TASK_PENDING = 0,
    DIST_TASK_RUNNING = 1,
    DIST_TASK_FAILED = 2,
    DIST_TASK_SUCCEEDED = 3,
    DIST_TASK_CANCELLED = 4
};

#define DIST_TASK_DS 0 /* tasks, their checkpoints and failure rows live in ds_0 */

/* taskrun.c: the task.execute consumers and their settings. */
extern const service_module taskrun_module;
/* sweep.c: the timer that publishes task.execute again for runs that stopped. */
extern const service_module sweep_module;

#endif
