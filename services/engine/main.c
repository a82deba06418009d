/* quan-engine: template query, claims, wallet, expiry, payment lifecycle, reminders, exchange
 * codes. The binary is the list of its modules; each module's descriptor, at the end of its .c
 * file, lists its settings, routes, queues and timers. They start in this order: a module whose
 * start hook takes another's context (service_module_state) comes after it. */
#include "archive.h"
#include "claim.h"
#include "claimq.h"
#include "engine.h"
#include "exchange.h"
#include "expire.h"
#include "history.h"
#include "payment.h"
#include "query.h"
#include "regen.h"
#include "relayout.h"
#include "restore.h"
#include "remind.h"
#include "resv.h"
#include "wallet.h"

static const service_def engine_def = {
    .name = "quan-engine",
    .summary = "Quan engine: template query, claims, wallet, expiry, archive, payment "
               "lifecycle, reminders, exchange codes.",
    .http_port = "10020",
    .uses = SERVICE_USE_PG | SERVICE_USE_REDIS | SERVICE_USE_MQ | SERVICE_USE_OUTBOX,
    .config_size = sizeof(service_config),
    .modules =
        (const service_module *const[]){
            &query_module,    /* GET|POST /coupon-template/query */
            &resv_module,     /* reservations nobody finished: their sweeper */
            &restore_module,  /* after a database restore: claims wait for quan-recover */
            &regen_module,    /* after Redis lost state: rebuild it, claims wait */
            &relayout_module, /* a template's stock buckets changed: rebuild them */
            &claim_module,    /* /user-coupon/redeem, redeem-mq, redeem-result */
            &claimq_module,   /* the claims queue, written in batches */
            &wallet_module,   /* /user-coupon/list */
            &history_module,  /* /user-coupon/history */
            &payment_module,  /* lock, pay, refund, cancel; payment timeouts */
            &remind_module,   /* /coupon-template-remind/...; reminders due */
            &exchange_module, /* /user-coupon/exchange */
            &expire_module,   /* the expiry sweeper */
            &archive_module,  /* dead coupons to the archive tables */
            NULL,
        },
};

int main(int argc, char **argv)
{
    return service_main(&engine_def, argc, argv);
}
