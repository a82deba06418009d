/*
 * The answers of lua-scripts/claim.lua, the claim gate, and the one reader of them. The script
 * answers {code, n, ...} per claim; this enum mirrors the list in the script's header, which
 * names these constants next to its numbers. Change the two together.
 *
 * In common/ rather than in the engine so that the script's own test
 * (common/tests/test_lua_claim.c) reads the script's answers as the engine does
 * (services/engine/claimrun.c, for /redeem, /redeem-mq and /exchange).
 */
#ifndef QUAN_CLAIMGATE_H
#define QUAN_CLAIMGATE_H

#include <hiredis/hiredis.h>

#include "status.h"

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
    CLAIMGATE_WRONG_BUCKETS = 10, /* {10, n}: the template has n stock buckets, not the caller's
                                     (bucket.h); nothing written: route by n and call again */
} claimgate_result;

#define CLAIMGATE_RESULTS 11 /* the codes above: 0 .. CLAIMGATE_RESULTS - 1 */

/* One claim's answer, read. */
typedef struct claimgate_reply {
    claimgate_result code;
    long long count;   /* n: the user's count (OK: the new one, the coupon's receive count) */
    long long hours;   /* OK: the coupon's validity in hours */
    long long end_ms;  /* OK: the template's end */
    long long resv_ms; /* REPEATED: the time of the reservation the request id made (0: unknown) */
    int reserved;      /* the script reserved (code OK): set even when the rest of the answer is
                          unreadable, for the caller must give that reservation back */
} claimgate_reply;

/* Reads r, one claim's answer ({code, n, ...}; an element of a batch call's array), into *out.
 * QN_OK when it is a whole answer of a known code; QN_EINVAL otherwise (not an array of
 * integers, a code this engine does not know, an OK without its hours and end), with
 * out->reserved telling whether the script reserved all the same. */
qn_status claimgate_parse(const redisReply *r, claimgate_reply *out) QN_MUSTCHECK;

/* The code's name, "CLAIMGATE_OK" ..., for logs and test messages; "unknown" past them. */
const char *claimgate_name(claimgate_result r);

#endif
