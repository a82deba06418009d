/* The context the engine's modules share. */
#include "engine.h"

_Static_assert(offsetof(engine_config, common) == 0,
               "service_config must come first: the common settings' offsets are within it");

static engine engine_ctx;

engine *engine_of(service *s)
{
    engine_ctx.svc = s;
    engine_ctx.cfg = (const engine_config *)service_cfg(s);
    return &engine_ctx;
}
