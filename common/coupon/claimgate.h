/*
 * The result codes of lua-scripts/claim.lua, the claim gate: it answers {code, n, ...} and this
 * enum mirrors the list in the script's header, which names these constants next to its
 * numbers. Change the two together.
 *
 * Header only, and in common/ rather than in the engine so that the script's own test
 * (common/tests/test_lua_claim.c) checks the script against the names the engine switches on
 * (services/engine/claim.c, exchange.c).
 */
#ifndef QUAN_CLAIMGATE_H
#define QUAN_CLAIMGATE_H

typedef enum claimgate_result {
    CLAIMGATE_OK = 0,             /* {0, n, h, e}: reserved (stock - 1, the user's count + 1) */
    CLAIMGATE_SOLD_OUT = 1,       /* stock exhausted */
    CLAIMGATE_LIMIT_REACHED = 2,  /* per-user limit reached */
    CLAIMGATE_NOT_ACTIVE = 3,     /* template terminated or ended (status not 0) */
    CLAIMGATE_OUTSIDE_WINDOW = 4, /* now before validStartTime or after validEndTime */
    CLAIMGATE_CACHE_MISS = 5,     /* hash missing or partial: load the template, call again */
    CLAIMGATE_OTHER_SHOP = 6,     /* the template is another shop's: "not found" */
    CLAIMGATE_REPEATED = 7,       /* this request id claimed before; n = the count it got */
    CLAIMGATE_STOCK_IN_DOUBT = 8, /* no stock, but reservations not yet settled hold some */
    CLAIMGATE_LIMIT_IN_DOUBT = 9, /* at the limit only with the user's own unsettled claims */
} claimgate_result;

#endif
