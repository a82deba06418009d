/* quan-engine: what its modules share. Each module (query.c, claim.c, claimq.c, resv.c,
 * regen.c, wallet.c, history.c, payment.c, remind.c, exchange.c, expire.c) exports one
 * descriptor (service_module: its settings and their struct, routes, queues and consumers,
 * timers, start/drain/free hooks); main.c lists them. A module's settings are its own: adding one
 * touches the module's file alone. */
#ifndef QUAN_ENGINE_H
#define QUAN_ENGINE_H

#include "service.h"

typedef struct engine {
    service *svc;
    const service_config *cfg; /* the settings every binary shares */
} engine;

/* The engine's context for a module's start hook: the service and its shared configuration.
 * The same for every module (one engine per process); valid until the service is freed. */
engine *engine_of(service *s);

#endif
