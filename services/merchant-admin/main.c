/* quan-merchant-admin: coupon templates, distribution tasks, exchange-code batches. */
#include <stddef.h>
#include <stdlib.h>

#include "config.h"
#include "service.h"

typedef struct merchant_admin_config {
    service_config common;
} merchant_admin_config;

static const config_var merchant_admin_vars[] = {
    SERVICE_CONFIG_VARS(merchant_admin_config, common, "10010"),
};

/* The queues this binary consumes (event names in docs/events.md). */
static const service_queue merchant_admin_queues[] = {
    /* a template reached validEndTime: mark it ended */
    {"merchant-admin.template-ended", (const char *const[]){"template.ended", NULL}},
};

int main(int argc, char **argv)
{
    merchant_admin_config cfg = {0};
    int rc = 1;
    service_configure(
        argc, argv, "quan-merchant-admin",
        "Quan merchant back office: coupon templates, distribution tasks, exchange-code batches.",
        merchant_admin_vars, sizeof(merchant_admin_vars) / sizeof(merchant_admin_vars[0]), &cfg,
        &cfg.common);

    service *s =
        service_new("quan-merchant-admin", &cfg.common,
                    SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX);
    if (!s)
        return 1;
    if (service_start(s) != QN_OK ||
        service_declare_queues(s, merchant_admin_queues,
                               sizeof(merchant_admin_queues) / sizeof(merchant_admin_queues[0])) !=
            QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    return rc;
}
