/* quan-settlement: which coupons fit an order, and how much each saves. */
#include "coupon_query.h"
#include "service.h"

typedef struct settlement_config {
    service_config common;
} settlement_config;

static const service_def settlement_def = {
    .name = "quan-settlement",
    .summary = "Quan settlement: which coupons fit an order, and how much each saves.",
    .http_port = "10030",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS,
    .config_size = sizeof(settlement_config),
    .modules =
        (const service_module *const[]){
            &coupon_query_module, /* POST /coupon-query */
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&settlement_def, argc, argv);
}
