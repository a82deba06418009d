/* quan-engine: how its modules fit together. Each module (query.c, resv.c, restore.c, regen.c,
 * claim.c, claimq.c, wallet.c, history.c, payment.c, remind.c, exchange.c, expire.c) exports one
 * descriptor (service_module: its settings and their struct, routes, queues and consumers,
 * timers, start/drain/free hooks); main.c lists them. A module's settings are its own: adding one
 * touches the module's file alone.
 *
 * A module's start hook makes its context (the service, its shared configuration, the module's
 * settings, clients, pools and timers); its routes, consumers and timers get that context as
 * their arg, and its free hook frees it. A module that calls another takes the callee's context
 * with service_module_state at start (the callee is listed before it in main.c) and passes it
 * to every call: query, resv and regen are the ones called so, and claim's context (claimrun.h:
 * how a claim runs) is the one exchange runs its redemptions on. */
#ifndef QUAN_ENGINE_H
#define QUAN_ENGINE_H

#include "service.h"

#endif
