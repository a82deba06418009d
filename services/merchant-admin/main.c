/* quan-merchant-admin: coupon templates, distribution tasks, exchange-code batches. The binary
 * is the list of its modules; each module's descriptor, at the end of its .c file, lists its
 * settings, routes, queues and timers. */
#include <stddef.h>

#include "excode.h"
#include "madmin.h"

static madmin madmin_ctx;

/* Tasks and exchange-code batches, until they have descriptors of their own. */
static qn_status madmin_start(service *s, void **state)
{
    madmin *m = &madmin_ctx;
    m->svc = s;
    m->cfg = (const madmin_config *)service_cfg(s);
    *state = m;
    if (madmin_init(m) != QN_OK || madmin_tasks_init(m) != QN_OK || madmin_codes_init(m) != QN_OK)
        return QN_ERR;
    return QN_OK;
}

static const config_var madmin_vars[] = {
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

static const service_module madmin_tasks_codes_module = {
    .name = "tasks+codes",
    .vars = madmin_vars,
    .nvars = sizeof(madmin_vars) / sizeof(madmin_vars[0]),
    .start = madmin_start,
};

static const service_def madmin_def = {
    .name = "quan-merchant-admin",
    .summary = "Quan merchant back office: coupon templates, distribution tasks, exchange-code "
               "batches.",
    .http_port = "10010",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX,
    .config_size = sizeof(madmin_config),
    .modules =
        (const service_module *const[]){
            &madmin_templates_module, /* /coupon-template/...; templates that ended */
            &madmin_tasks_codes_module,
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&madmin_def, argc, argv);
}
