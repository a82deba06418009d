/* quan-distribution: executes spreadsheet distribution tasks in batches. */
#include "events.h"
#include "notify.h"
#include "service.h"

typedef struct distribution_config {
    service_config common;
} distribution_config;

/* Declared now so that tasks published before the executor exists are kept; nothing consumes
 * them yet. */
static const service_module distribution_tasks_module = {
    .name = "tasks",
    .consumers =
        (const service_consumer[]){
            {"distribution.task-execute", (const char *const[]){EVENT_TASK_EXECUTE, NULL}}, {0}},
};

static const service_def distribution_def = {
    .name = "quan-distribution",
    .summary = "Quan distribution: executes spreadsheet distribution tasks in batches.",
    .http_port = "10040",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX,
    .config_size = sizeof(distribution_config),
    .modules =
        (const service_module *const[]){
            &distribution_tasks_module,
            &notify_module, /* notifications of the users a task issued coupons to */
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&distribution_def, argc, argv);
}
