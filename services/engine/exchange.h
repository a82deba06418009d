/*
 * Exchange-code redemption, POST /api/engine/user-coupon/exchange {"code"} -> {"userCouponId"}:
 * codes cannot be forged or spent twice, and a refusal does not burn the code.
 *
 *   1. excode_verify (keyed check, common/coupon/excode.h) before anything else: a forged code gets
 *      404 A000404 without touching Redis or the database (counted as
 *      quan_exchange_total{outcome="forged"}). 404 rather than 400 so a forged code and an
 *      unknown one look the same to a guesser.
 *   2. the per-user lock quan:lock:exchange:{userId} (FAIL_FAST: busy -> 429 A000429,
 *      never a silent success; per user, never one global lock);
 *   3. the code row (ds_0): unknown -> 404, redeemed -> 409 B000104, campaign ended -> 409
 *      B000103;
 *   4. the template through the query chain (query.h: fills the cache), then claim.lua with
 *      the marker "excode:<code>": status, window, stock and per-user limit in one Redis step,
 *      like a claim, so Redis stock stays equal to database stock; a refusal burns nothing
 *      (checks first, the code is marked last);
 *   5. the database, with the claim's own steps (claimdb.h): in ds_0's transaction
 *      UPDATE t_exchange_code SET status = 2, user_id, user_coupon_id WHERE code AND status = 1
 *      (exactly one row, else rollback: of two users racing one code exactly one wins),
 *      plus the stock ledger/decrement and the coupon insert of whichever of them live in ds_0;
 *      the ones living in ds_1 run in a ds_1 transaction opened inside the same work function,
 *      committed right after ds_0's. Any refusal or error rolls both back and gives the Redis
 *      reservation back (claim_undo.lua, exactly once through the marker). If ds_1's COMMIT
 *      itself fails after ds_0 committed, ds_0's part is undone by a compensating transaction.
 *   6. after the commit, the wallet ZADD; then the reply, then the lock is released.
 */
#ifndef QUAN_EXCHANGE_H
#define QUAN_EXCHANGE_H

#include "engine.h"
#include "status.h"

/* The route above and QUAN_CODE_SECRET (the same as merchant-admin's). */
extern const service_module exchange_module;

#endif
