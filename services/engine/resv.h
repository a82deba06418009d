/*
 * Reservations (claim.lua's) that nobody finishes, and the sweeper that finishes them.
 *
 * A claim reserves in Redis first (stock - 1, the user's count + 1, its marker) and writes the
 * database after. claim.lua also records the reservation in the template's slot
 * (keys_template_resv: member "<userId>:<requestId>", score = its time); whoever completes it
 * (the coupon's commit, the broker's confirm of an MQ claim) or gives it back (claim_undo.lua)
 * removes it. A process killed in between leaves it there, and with it a stock unit and the
 * user's count: the sweeper, on any engine replica, resolves every reservation older than
 * QUAN_RESV_ABANDON_MS against the template's database (claimdb_void): if its ledger row shows
 * the stock taken, the claim is being completed (the synchronous claim's check, the claim's
 * message) and the record goes; otherwise the attempt is given up in the database first (so
 * that a late writer of it writes nothing), its FAILED outcome recorded for /redeem-result,
 * and the reservation given back in Redis, after which the user can claim again.
 *
 * Where to look: before reserving on a template, the engine says so in the index
 * KEYS_RESV_INDEX (at most once a minute per template and process, so it costs nothing); the
 * sweeper walks the index. Every key a script touches stays in one slot (cluster-safe).
 */
#ifndef QUAN_RESV_H
#define QUAN_RESV_H

#include <stdint.h>

#include "engine.h"
#include "keys.h"
#include "status.h"

/* The keys and argument that name one claim's reservation for claim.lua / claim_undo.lua. */
typedef struct resv_keys {
    char set[KEYS_LEN];    /* keys_template_resv */
    char member[KEYS_LEN]; /* keys_resv_member */
} resv_keys;

void resv_keys_of(resv_keys *k, int64_t tpl, int64_t user, const char *request_id);

/* Called with QN_OK once the index names the template (at once when it did recently), else an
 * error status: then nothing may be reserved. On the loop thread. */
typedef void (*resv_touch_cb)(qn_status st, void *arg);
void resv_touch(int64_t tpl, int64_t shop, resv_touch_cb cb, void *arg);

/* The reservation is complete (or given back by other means): its record goes. Fire and
 * forget: a record left over is resolved by the sweeper as complete. */
void resv_done(const resv_keys *k);

/* An MQ claim the broker confirmed: its record stays, marked queued (score RESV_QUEUED_BASE +
 * the reservation's time), until the consumer has written it. The sweeper leaves queued
 * records alone (redelivery finishes them); reconcile.h counts them in flight. Fire and
 * forget. */
#define RESV_QUEUED_BASE 1000000000000000LL
void resv_queued(const resv_keys *k, int64_t reserved_ms);

extern const service_module resv_module;

#endif
