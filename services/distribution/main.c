/* quan-distribution: runs spreadsheet distribution tasks in chunks. The binary is the list of
 * its modules; each module's descriptor, at the end of its .c file, lists its settings, queues
 * and timers. */
#include "dist.h"
#include "notify.h"
#include "sweep.h"
#include "taskrun.h"

static const service_def distribution_def = {
    .name = "quan-distribution",
    .summary = "Quan distribution: runs spreadsheet distribution tasks in chunks.",
    .http_port = "10040",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX,
    .config_size = sizeof(service_config),
    .modules =
        (const service_module *const[]){
            &taskrun_module, /* the task.execute consumers: chunks, checkpoints, the end */
            &sweep_module,   /* task.execute again for tasks whose run stopped */
            &notify_module,  /* notifications of the users a task issued coupons to */
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&distribution_def, argc, argv);
}
