/*
 * Template query chain (cache, bloom filter, null marker, lock, database), asynchronous on the
 * event loop, and the route /api/engine/coupon-template/query (GET, and POST with a JSON body):
 *
 *   1. HGETALL quan:tpl:{id}: a complete hash of the named shop answers (another shop's: 404);
 *   2. the bloom filter says the id was never created: 404;
 *   3. the null marker quan:tpl:{id}:null holds this shop: 404;
 *   4. the per-template lock (waits up to 3 s, else 429), then the null marker and the hash
 *      again, and only then the database (by shop and id): found -> the whole hash is written
 *      at once, expiring at the template's end (template_cache_put.lua, never over a live
 *      hash, whose stock is live state); absent -> the null marker for QUAN_NULL_TTL_MS.
 * So N concurrent first queries of a cold template read the database once
 * (quan_template_db_loads_total counts the reads).
 *
 * The null marker's value is the shop number that found the id absent, so a query naming the
 * wrong shop never hides the template from its own shop.
 */
#ifndef QUAN_QUERY_H
#define QUAN_QUERY_H

#include <stdint.h>

#include "metrics.h"
#include "service.h"
#include "status.h"
#include "template.h"

/* The module's context: made by its start hook, freed by its free hook; other modules reach it
 * with service_module_state(s, &query_module) and pass it to the calls below. */
typedef struct query query;

/* st: QN_OK (t borrowed for the call), QN_ENOTFOUND, QN_EBUSY (lock not acquired in time),
 * QN_EAGAIN (database pool full), QN_ERR (Redis or database failure). Runs on the loop thread,
 * never inside query_template. */
typedef void (*query_cb)(qn_status st, const tpl *t, void *arg);

/* Runs the chain for template id of shop. QN_OK: cb runs exactly once, later; otherwise
 * (QN_ENOMEM, or the first Redis command could not be issued) cb never runs. */
qn_status query_template(query *q, int64_t shop_number, int64_t id, query_cb cb,
                         void *arg) QN_MUSTCHECK;

/* The template's copy as the query keeps it: current (every change of its hash since it was
 * read has been heard of, rtrack.h), or NULL when none is kept (QUAN_QUERY_COPIES=0, tracking
 * not on, never read, changed since). Borrowed until control returns to the loop. *serial
 * names the copy (0: none); *settled is 1 once query_copy_settled marked it. */
const tpl *query_copy_peek(query *q, int64_t id, uint64_t *serial, int *settled);
/* claim.lua found no stock and no reservation in doubt while copy serial was current: its
 * zero stock is final (no stock can come back without a change of the hash, which drops the
 * copy). Marks it, if it is still the current one. */
void query_copy_settled(query *q, int64_t id, uint64_t serial);
/* Reads the template's hash into a copy in the background (the query chain with nobody
 * waiting), at most QUERY_FILLS_MAX at a time: after a refusal, so that the next refusals of a
 * sold-out template need no Redis call. Does nothing when copies are off or the budget is
 * spent. */
void query_copy_fill(query *q, int64_t shop_number, int64_t id);
/* Drops every template copy kept (after quan-recover rebuilt Redis, restore.h). Loop thread. */
void query_copies_drop(query *q);

/* The routes above and QUAN_NULL_TTL_MS, the bloom filter's settings. */
extern const service_module query_module;

/* The query chain's reads of the database. */
#define QUERY_METRICS(X)                                                                           \
    X(quan_template_db_loads_total, COUNTER,                                                       \
      "Template cache misses that read the database (query chain), by result (found, absent).",    \
      "result")
METRICS_DECLARE(QUERY_METRICS)

#endif
