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
 *   5. the database, in ds_0's transaction UPDATE t_exchange_code SET status = 2, user_id,
 *      user_coupon_id WHERE code AND status = 1 (exactly one row, else refused: of two users
 *      racing one code exactly one wins) and the redemption's check (claimq.h); then the
 *      claim's own steps (claimdb.h: stock ledger and decrement, coupon insert), each in the
 *      transaction of the database it lives in (ds_1's opened inside the same work function,
 *      committed right after ds_0's). Redemptions that arrive together share these
 *      transactions (group commit, pgbatch.h, like /redeem's: at most 32 in one, two such
 *      transactions in flight per process, the rest wait for the next): each code is marked
 *      inside its own savepoint, and the claim steps run once for all of them, one stock
 *      UPDATE per template: one UPDATE of the template's row per redemption cost PostgreSQL
 *      more than all the rest of the redemption. A redemption refused or failed on its own is
 *      rolled back alone (its savepoint, or its code unmarked and its check withdrawn when the
 *      database refuses its claim) and gives its Redis reservation back (claim_undo.lua,
 *      exactly once through the marker). If ds_1's COMMIT fails after ds_0's, the
 *      redemptions with a part there are in doubt (503) until their checks, committed with the
 *      codes, complete them.
 *   6. after the commit, the wallet ZADD; then the reply, then the lock is released.
 */
#ifndef QUAN_EXCHANGE_H
#define QUAN_EXCHANGE_H

#include "service.h"
#include "status.h"

/* The route above and QUAN_CODE_SECRET (the same as merchant-admin's). */
extern const service_module exchange_module;

#endif
