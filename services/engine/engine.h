/* quan-engine: what its modules share. Each module (query.c, claim.c, wallet.c, payment.c,
 * remind.c, exchange.c, expire.c) exports one descriptor (service_module: its settings,
 * routes, queues and consumers, timers, start/drain/free hooks); main.c lists them. */
#ifndef QUAN_ENGINE_H
#define QUAN_ENGINE_H

#include "service.h"

typedef struct engine_config {
    service_config common;
    /* query.c */
    int64_t null_ttl_ms;
    int64_t query_copies;   /* templates the query keeps in the process (0: none) */
    int64_t bloom_expected; /* same as merchant-admin's: both compute one bloom_params */
    int64_t bloom_fp_per_million;
    /* claim.c */
    int64_t claim_batch;
    int64_t claim_consumers;
    int64_t claim_wallet_check_ms; /* when the sync claim's wallet safety net is checked */
    /* payment.c */
    int64_t payment_lock_timeout_s;
    /* remind.c */
    const char *remind_webhook_url;
    const char *smtp_url;
    const char *smtp_from;
    /* exchange.c */
    const char *code_secret;
    /* expire.c */
    int64_t expire_interval_ms;
    int64_t expire_batch;
    /* remind.c (continued) */
    int64_t remind_timeout_ms;
    /* resv.c */
    int64_t resv_sweep_ms;
    int64_t resv_lease_ms;
    int64_t resv_abandon_ms;
    const char *instance_id;
    /* regen.c */
    int64_t regen_settle_ms;
    int64_t regen_drain_max_ms;
    int64_t regen_check_ms;
} engine_config;

typedef struct engine {
    service *svc;
    const engine_config *cfg;
} engine;

/* The engine's context for a module's start hook: the service and its configuration. The
 * same for every module (one engine per process); valid until the service is freed. */
engine *engine_of(service *s);

#endif
