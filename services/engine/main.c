/* quan-engine: template query, claims, wallet, expiry, payment lifecycle, reminders, exchange
 * codes. */
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

/* The queues this binary consumes (event names in docs/events.md). */
static const service_queue engine_queues[] = {
    /* claims accepted by /redeem-mq: write the coupon row */
    {"engine.redeem", (const char *const[]){"coupon.redeem", NULL}},
    /* a user coupon reached its end: mark it expired */
    {"engine.coupon-expire", (const char *const[]){"coupon.expire", NULL}},
    /* a reminder is due: notify the user */
    {"engine.remind", (const char *const[]){"remind.due", NULL}},
};

int main(int argc, char **argv)
{
    engine_config cfg = {0};
    int rc = 1;
    service_configure(argc, argv, "quan-engine",
                      "Quan engine: template query, claims, wallet, expiry, payment lifecycle, "
                      "reminders, exchange codes.",
                      engine_vars, sizeof(engine_vars) / sizeof(engine_vars[0]), &cfg, &cfg.common);

    service *s =
        service_new("quan-engine", &cfg.common,
                    SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX);
    if (!s)
        return 1;
    if (service_start(s) != QN_OK ||
        service_declare_queues(s, engine_queues,
                               sizeof(engine_queues) / sizeof(engine_queues[0])) != QN_OK)
        goto done;
    rc = service_run(s);
done:
    service_free(s);
    return rc;
}
