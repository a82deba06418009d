/* quan-merchant-admin: coupon templates, distribution tasks, exchange-code batches, template
 * statistics, coupon histories. The binary is the list of its modules; each module's descriptor, at
 * the end of its .c file, lists its settings, routes, queues and timers, and its start hook
 * makes the context its handlers, consumers and timers get. Modules start in this order: one
 * that takes another's context (service_module_state) comes after it. */
#include "codes.h"
#include "export.h"
#include "history.h"
#include "statexport.h"
#include "stats.h"
#include "statsum.h"
#include "tasks.h"
#include "templates.h"

static const service_def madmin_def = {
    .name = "quan-merchant-admin",
    .summary = "Quan merchant back office: coupon templates, distribution tasks, exchange-code "
               "batches, template statistics, coupon histories.",
    .http_port = "10010",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX,
    .config_size = sizeof(service_config),
    .modules =
        (const service_module *const[]){
            &export_module,     /* the bound of the exports (tasks', codes', statexport's) */
            &templates_module,  /* /coupon-template/...; templates that ended */
            &tasks_module,      /* /coupon-task/...; scheduled tasks, row counts */
            &codes_module,      /* /coupon-template/exchange-code/...; code generation */
            &stats_module,      /* /coupon-template/stats, .../series; the statistics' rollup */
            &statsum_module,    /* /coupon-template/stats/summary */
            &statexport_module, /* /coupon-template/stats/export */
            &history_module,    /* /coupon/history */
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&madmin_def, argc, argv);
}
