/*
 * Claims:
 *
 *   POST /api/engine/user-coupon/redeem      synchronous: claim.lua, then the database steps
 *                                             of claimdb.h, in transactions shared with the
 *                                             claims arriving meanwhile (claimbatch.h);
 *                                             wallet ZADD after the commit, before the
 *                                             answer; 200 {userCouponId, receiveCount}
 *   POST /api/engine/user-coupon/redeem-mq   claim.lua, then publish coupon.redeem with a
 *                                             confirm; 202 {requestId}; the engine.redeem
 *                                             consumer (claimq.h) writes the coupon
 *   GET  /api/engine/user-coupon/redeem-result?requestId=  PENDING | SUCCESS | FAILED, for
 *                                             the caller's own request ids only; 404 for
 *                                             one it never used
 *
 * The claim step is ONE Redis round trip (lua-scripts/claim.lua): status, window, stock and
 * the per-user limit, read from the template hash. A reservation that does not become a coupon
 * is given back exactly once (claim_undo.lua with the claim's marker): refused database write,
 * refused MQ claim, or a write or publish the template's database confirms never happened (it
 * gives that attempt up first, so nothing of it can commit later: claimdb_void). The
 * reservation is also recorded for the sweeper (resv.h) until it is complete or given back, so
 * a process that dies holding it leaks nothing; a retry of its requestId after the request
 * timeout settles it at once (TAKEOVER, claimstep.h). An optional body `requestId`
 * ([A-Za-z0-9._:-], 1-64) makes both endpoints idempotent for that user (a client retry never
 * claims twice); without it the engine makes one up (it is the MQ claim's key either way).
 *
 * Safety net of the synchronous claim: the transaction that commits first (the stock's,
 * or the only one when template and coupon share a database) also writes a coupon.redeem
 * "check" of the claim due QUAN_CLAIM_WALLET_CHECK_MS later (claimq.h): a process that dies
 * between the two commits, or before the wallet write, leaves nothing half-done.
 *
 * /redeem-result: an accepted MQ claim is marked pending in Redis (keys_claim_pending, before
 * the 202) until the consumer has written its coupon or FAILED row; a request id with neither
 * a marker nor a row is 404.
 */
#ifndef QUAN_CLAIM_H
#define QUAN_CLAIM_H

#include "claimrun.h"
#include "claimstep.h"
#include "status.h"

#define CLAIM_PENDING_TTL_MS (7 * 86400000) /* a bound only: the consumer deletes the marker */

/* 1 when s is a valid client request id. */
int claim_request_id_ok(const char *s);

/* The three routes and QUAN_CLAIM_WALLET_CHECK_MS. Its state is the claims' claimrun, which the
 * exchange module shares (service_module_state). */
extern const service_module claim_module;

#endif
