/* quan-merchant-admin: coupon templates, distribution tasks, exchange-code batches. */
#include <stddef.h>
#include <stdlib.h>

#include "bloom.h"
#include "config.h"
#include "excode.h"
#include "madmin.h"

static const config_var madmin_vars[] = {
    SERVICE_CONFIG_VARS(madmin_config, common, "10010"),
    /* madmin.c */
    {"QUAN_NODUP_WINDOW_MS", CONFIG_INT, offsetof(madmin_config, nodup_window_ms), "3000", 0,
     600000, NULL, 0, "the same merchant posting the same body again within this gets 429"},
    /* templates.c */
    BLOOM_CONFIG_VARS(madmin_config),
    /* tasks.c */
    {"QUAN_FILE_ROOT", CONFIG_STR, offsetof(madmin_config, file_root), "/var/lib/quan/files", 1,
     4096, NULL, 0, "spreadsheet paths (fileAddress) must lie under this directory"},
    {"QUAN_FILE_MAX_BYTES", CONFIG_INT, offsetof(madmin_config, file_max_bytes), "209715200", 1024,
     10737418240, NULL, 0, "largest spreadsheet accepted (download and uncompressed)"},
    {"QUAN_FILE_TIMEOUT_S", CONFIG_INT, offsetof(madmin_config, file_timeout_s), "120", 1, 3600,
     NULL, 0, "longest download of an http(s) fileAddress"},
    {"QUAN_FILE_ALLOW_INTERNAL", CONFIG_BOOL, offsetof(madmin_config, file_allow_internal), "false",
     0, 0, NULL, 0,
     "also download fileAddress URLs of loopback, private and link-local hosts (closed networks)"},
    {"QUAN_TASK_COUNT_RETRY_MS", CONFIG_INT, offsetof(madmin_config, task_count_retry_ms), "20000",
     100, 3600000, NULL, 0, "a task's row count is redone this long after create if it was lost"},
    /* codes.c */
    EXCODE_CONFIG_VAR(madmin_config),
};

/* The queues this binary consumes (event names in docs/events.md). */
static const service_queue madmin_queues[] = {
    /* a template reached validEndTime: mark it ended */
    {"merchant-admin.template-ended", (const char *const[]){"template.ended", NULL}},
};

int main(int argc, char **argv)
{
    madmin_config cfg = {0};
    int rc = 1;
    service_configure(argc, argv, "quan-merchant-admin",
                      "Quan merchant back office: coupon templates, distribution tasks, "
                      "exchange-code batches.",
                      madmin_vars, sizeof(madmin_vars) / sizeof(madmin_vars[0]), &cfg, &cfg.common);

    madmin m = {.cfg = &cfg};
    m.svc = service_new("quan-merchant-admin", &cfg.common,
                        SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX);
    if (!m.svc)
        return 1;
    if (service_start(m.svc) != QN_OK ||
        service_declare_queues(m.svc, madmin_queues,
                               sizeof(madmin_queues) / sizeof(madmin_queues[0])) != QN_OK)
        goto done;
    /* Each module registers its routes and consumers (one line each). */
    /* MODULE-INIT */
    if (madmin_init(&m) != QN_OK || madmin_tasks_init(&m) != QN_OK ||
        madmin_codes_init(&m) != QN_OK)
        goto done;
    if (madmin_templates_init(&m) != QN_OK)
        goto done;
    rc = service_run(m.svc);
done:
    service_free(m.svc);
    return rc;
}
