/* quan-engine: template query, claims, wallet, expiry, payment lifecycle, reminders, exchange codes. */
#include <stddef.h>
#include <stdlib.h>

#include "config.h"
#include "service.h"

typedef struct engine_config {
    service_config common;
} engine_config;

static const config_var engine_vars[] = {
    SERVICE_CONFIG_VARS(engine_config, common, "10020"),
};

int main(int argc, char **argv)
{
    engine_config cfg = {0};
    int rc = 1;
    service_configure(argc, argv, "quan-engine", "Quan engine: template query, claims, wallet, expiry, payment lifecycle, reminders, exchange codes.", engine_vars,
                      sizeof(engine_vars) / sizeof(engine_vars[0]), &cfg, &cfg.common);

    service *s = service_new("quan-engine", &cfg.common, SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ);
    if (!s)
        return 1;
    if (service_start(s) != QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    return rc;
}
