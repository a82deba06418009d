/* quan-settlement: which coupons fit an order, and how much each saves. */
#include <stddef.h>
#include <stdlib.h>

#include "config.h"
#include "coupon_query.h"
#include "service.h"

typedef struct settlement_config {
    service_config common;
} settlement_config;

static const config_var settlement_vars[] = {
    SERVICE_CONFIG_VARS(settlement_config, common, "10030"),
};

int main(int argc, char **argv)
{
    settlement_config cfg = {0};
    int rc = 1;
    service_configure(argc, argv, "quan-settlement",
                      "Quan settlement: which coupons fit an order, and how much each saves.",
                      settlement_vars, sizeof(settlement_vars) / sizeof(settlement_vars[0]), &cfg,
                      &cfg.common);

    service *s = service_new("quan-settlement", &cfg.common, SERVICE_USE_PG | SERVICE_USE_REDIS);
    if (!s)
        return 1;
    if (service_start(s) != QN_OK)
        goto done;
    /* Each module registers its routes (one line each). */
    /* MODULE-INIT */
    if (coupon_query_init(s) != QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    return rc;
}
