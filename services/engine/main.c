/* quan-engine: template query, claims, wallet, expiry, payment lifecycle, reminders, exchange
 * codes. */
#include <stddef.h>
#include <stdlib.h>

#include "bloom.h"
#include "config.h"
#include "excode.h"
#include "engine.h"
#include "claim.h"
#include "query.h"
#include "wallet.h"
#include "exchange.h"
#include "expire.h"
#include "remind.h"
#include "payment.h"

static const config_var engine_vars[] = {
    SERVICE_CONFIG_VARS(engine_config, common, "10020"),
    /* query.c */
    {"QUAN_NULL_TTL_MS", CONFIG_INT, offsetof(engine_config, null_ttl_ms), "1800000", 1000,
     86400000, NULL, 0, "how long an unknown template id is remembered as absent"},
    BLOOM_CONFIG_VARS(engine_config),
    /* claim.c */
    {"QUAN_CLAIM_BATCH", CONFIG_INT, offsetof(engine_config, claim_batch), "1000", 1, 10000, NULL,
     0, "MQ claims written to the database per transaction"},
    {"QUAN_CLAIM_CONSUMERS", CONFIG_INT, offsetof(engine_config, claim_consumers), "2", 0, 16, NULL,
     0,
     "claim batch consumer threads (their batches overlap); 0: this replica writes no MQ claims"},
    {"QUAN_CLAIM_WALLET_CHECK_MS", CONFIG_INT, offsetof(engine_config, claim_wallet_check_ms),
     "30000", 0, 86400000, NULL, 0,
     "after a sync claim or exchange, when its outbox check completes or undoes it if half-done"},
    /* payment.c */
    {"QUAN_PAYMENT_LOCK_TIMEOUT_S", CONFIG_INT, offsetof(engine_config, payment_lock_timeout_s),
     "900", 10, 86400, NULL, 0, "a coupon locked for an order returns to unused after this"},
    /* remind.c */
    {"QUAN_REMIND_WEBHOOK_URL", CONFIG_STR, offsetof(engine_config, remind_webhook_url), "", 0,
     2048, NULL, 0, "app reminders are POSTed here as JSON (empty: not sent, dead-lettered)"},
    {"QUAN_SMTP_URL", CONFIG_STR, offsetof(engine_config, smtp_url), "", 0, 2048, NULL,
     CONFIG_SECRET, "smtp://host:port of the mail relay for e-mail reminders"},
    {"QUAN_SMTP_FROM", CONFIG_STR, offsetof(engine_config, smtp_from), "quan@localhost", 1, 256,
     NULL, 0, "sender address of e-mail reminders"},
    /* exchange.c */
    EXCODE_CONFIG_VAR(engine_config),
    /* expire.c */
    {"QUAN_EXPIRE_INTERVAL_MS", CONFIG_INT, offsetof(engine_config, expire_interval_ms), "20000",
     100, 3600000, NULL, 0, "how often expired user coupons are swept out of the wallets"},
    {"QUAN_EXPIRE_BATCH", CONFIG_INT, offsetof(engine_config, expire_batch), "1000", 1, 100000,
     NULL, 0, "user coupons expired per transaction by the sweeper"},
    /* remind.c (continued) */
    {"QUAN_REMIND_TIMEOUT_MS", CONFIG_INT, offsetof(engine_config, remind_timeout_ms), "5000", 100,
     60000, NULL, 0, "time limit of one reminder delivery (webhook POST or SMTP session)"},
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

    engine e = {.cfg = &cfg};
    e.svc = service_new("quan-engine", &cfg.common,
                        SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX);
    if (!e.svc)
        return 1;
    if (service_start(e.svc) != QN_OK ||
        service_declare_queues(e.svc, engine_queues,
                               sizeof(engine_queues) / sizeof(engine_queues[0])) != QN_OK)
        goto done;
    /* Each module registers its routes and consumers (one line each). */
    /* MODULE-INIT */
    if (query_init(&e) != QN_OK || claim_init(&e) != QN_OK || wallet_init(&e) != QN_OK)
        goto done;
    if (expire_init(&e) != QN_OK)
        goto done;
    if (remind_init(&e) != QN_OK)
        goto done;
    if (exchange_init(&e) != QN_OK)
        goto done;
    if (payment_init(&e) != QN_OK)
        goto done;
    rc = service_run(e.svc);
done:
    service_free(e.svc);
    return rc;
}
