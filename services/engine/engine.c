/* The context the engine's modules share. */
#include "engine.h"

static engine engine_ctx;

engine *engine_of(service *s)
{
    engine_ctx.svc = s;
    engine_ctx.cfg = service_cfg(s);
    return &engine_ctx;
}
