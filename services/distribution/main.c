/* quan-distribution: executes spreadsheet distribution tasks in batches. */
#include <stddef.h>
#include <stdlib.h>

#include "config.h"
#include "service.h"

typedef struct distribution_config {
    service_config common;
} distribution_config;

static const config_var distribution_vars[] = {
    SERVICE_CONFIG_VARS(distribution_config, common, "10040"),
};

/* The queues this binary consumes (event names in docs/events.md). */
static const service_queue distribution_queues[] = {
    /* a distribution task is due: run it */
    {"distribution.task-execute", (const char *const[]){"task.execute", NULL}},
};

int main(int argc, char **argv)
{
    distribution_config cfg = {0};
    int rc = 1;
    service_configure(argc, argv, "quan-distribution",
                      "Quan distribution: executes spreadsheet distribution tasks in batches.",
                      distribution_vars, sizeof(distribution_vars) / sizeof(distribution_vars[0]),
                      &cfg, &cfg.common);

    service *s =
        service_new("quan-distribution", &cfg.common,
                    SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX);
    if (!s)
        return 1;
    if (service_start(s) != QN_OK ||
        service_declare_queues(s, distribution_queues,
                               sizeof(distribution_queues) / sizeof(distribution_queues[0])) !=
            QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    return rc;
}
