/*
 * The database half of a claim, for one claim (/redeem) or a batch (the engine.redeem
 * consumer). A claim whose Redis reservation succeeded becomes a coupon row in up to three
 * steps, because the template (sharded by shop) and the coupon (sharded by user) often live in
 * different databases:
 *
 *   1. stock   (template's database): one ledger row per claim (t_claim_ledger, ON CONFLICT
 *              DO NOTHING) and ONE `UPDATE ... SET stock = stock - k WHERE ... AND stock >= k`
 *              per template for the k claims whose ledger row is new. If the database has
 *              fewer than k left, the last claims are refused ("sold out") and their ledger
 *              rows removed. A claim seen before (redelivery) finds its ledger row: no second
 *              decrement.
 *   2. coupons (user's database): one multi-row INSERT per physical table, ON CONFLICT DO
 *              NOTHING. A row not inserted is either this claim's own row from an earlier
 *              attempt (found by (user_id, request_id): CLAIMDB_DUP, a success) or another
 *              coupon holding the (user, template, receive_count) slot: CLAIMDB_REFUSED_SLOT.
 *   3. give back (template's database), for claims refused in step 2 or whose step 2 failed:
 *              delete the ledger row and add the stock back, only for rows actually deleted,
 *              so a repeated give-back adds nothing.
 * A ledger row may also say that one attempt of the claim (its reservation's time, the coupon's
 * receive_time_ms) was given up (claimdb_void): step 1 then answers CLAIMDB_VOID for that
 * attempt and takes the row over for any later one.
 * When both databases are the same, the caller runs the steps in one transaction. Every step
 * is idempotent, so a batch redelivered after a crash between steps ends the same.
 *
 * Functions here block (libpq): pgpool work functions or consumer threads only. Each runs its
 * statements on the caller's connection inside the caller's transaction.
 */
#ifndef QUAN_CLAIMDB_H
#define QUAN_CLAIMDB_H

#include <stddef.h>
#include <stdint.h>

#include "pgpool.h"
#include "status.h"
#include "ucoupon.h"

/* t_claim_result.status of a claim that did not become a coupon (/redeem-result's FAILED), and
 * as a statement's text: CLAIMDB_RESULT_TEXT(FAILED) is "2" (pgparam.h). */
#define CLAIMDB_RESULT_FAILED_N 2
enum { CLAIMDB_RESULT_FAILED = CLAIMDB_RESULT_FAILED_N };
#define CLAIMDB_RESULT_TEXT(name) PGPARAM_DIGIT_TEXT(CLAIMDB_RESULT_##name##_N)

typedef enum {
    CLAIMDB_PENDING = 0,   /* not decided yet */
    CLAIMDB_NEW,           /* the coupon row was inserted now */
    CLAIMDB_DUP,           /* the row already existed (same request): success, coupon_id set */
    CLAIMDB_REFUSED_STOCK, /* the database had no stock left: give back in Redis */
    CLAIMDB_REFUSED_SLOT,  /* another coupon holds (user, template, receive_count) */
    CLAIMDB_FAILED,        /* step 2 failed (database error): give back */
    CLAIMDB_VOID,          /* this attempt was given up (claimdb_void): nothing written, and
                              its reservation is given back by whoever voided it */
} claimdb_state;

typedef struct claimdb_item {
    ucoupon c;   /* the coupon to write: id, user, template, shop, times, count, source,
                    request_id (required, unique per user) */
    int tpl_ds;  /* database of the template (by shop) */
    int user_ds; /* database of the coupon (by user) */
    claimdb_state state;
    int returned;  /* step 3 gave the database stock back */
    int check;     /* the safety net of a synchronous claim (claimq.h), not a new claim */
    int probe;     /* a check whose reservation was given back in Redis: no stock is taken and
                      no coupon written; claimdb_find_coupons decides DUP or FAILED */
    int64_t epoch; /* a /redeem-mq claim's restore epoch when accepted (restore.h); 0: none */
    int bkt, nbkt; /* the reservation's stock bucket among the template's nbkt (bucket.h), where
                      its record, marker and count are; 0, 0 (or 1): the template's own keys */
} claimdb_item;

/*
 * The one way an item's state changes (every writer of it calls this): PENDING is decided once,
 * into any other state; an item decided NEW or DUP in a transaction that then failed becomes
 * FAILED (its coupon was not written after all, and its stock goes back); and any item goes back
 * to PENDING when what it was decided in is forgotten (a transaction whose COMMIT's answer was
 * lost: the database is asked again, claimdb_void). Any other change is a programming error:
 * logged, and the state is kept. claimdb_change_ok is the table itself.
 */
void claimdb_set(claimdb_item *it, claimdb_state to);
int claimdb_change_ok(claimdb_state from, claimdb_state to);
/* The state's name ("pending", "new", ...), for logs and tests. */
const char *claimdb_state_name(claimdb_state s);
#define CLAIMDB_STATES 7 /* PENDING .. VOID */

/* Fills tpl_ds and user_ds from the coupon's shop and user. */
void claimdb_route(claimdb_item *it);

/* Step 1 for the PENDING items whose template is in database ds. QN_ERR on a database error
 * (the caller rolls back; nothing is decided). */
qn_status claimdb_take_stock(pgpool_conn *c, int ds, claimdb_item *items, size_t n) QN_MUSTCHECK;
/* Step 2 for the PENDING items whose user is in database ds: one statement for all its
 * tables. Reads and writes only those items, so the two databases may run on two threads over
 * the same array. */
qn_status claimdb_insert_coupons(pgpool_conn *c, int ds, claimdb_item *items,
                                 size_t n) QN_MUSTCHECK;
/* Steps 1 and 2 for claims believed new (first deliveries, no checks): plain INSERTs of the
 * ledger rows and coupons, without the conflict handling that costs PostgreSQL about a third
 * more CPU. Either every item ends as the ordinary step would end it when none of its rows
 * existed, or, when any unique key is taken already, QN_ECONFLICT with nothing decided: the
 * caller rolls back and runs the ordinary step (which then finds those rows). */
qn_status claimdb_take_stock_new(pgpool_conn *c, int ds, claimdb_item *items,
                                 size_t n) QN_MUSTCHECK;
qn_status claimdb_insert_coupons_new(pgpool_conn *c, int ds, claimdb_item *items,
                                     size_t n) QN_MUSTCHECK;
/* Instead of steps 1 and 2, for the PENDING probe items whose user is in database ds: DUP
 * when the coupon exists, else FAILED (step 3 then gives the stock back if its ledger row is
 * still there). */
qn_status claimdb_find_coupons(pgpool_conn *c, int ds, claimdb_item *items, size_t n) QN_MUSTCHECK;
/* Step 3 for the REFUSED_SLOT / FAILED items whose template is in database ds. */
qn_status claimdb_give_back(pgpool_conn *c, int ds, claimdb_item *items, size_t n) QN_MUSTCHECK;

/* Gives up the attempts of the PENDING items whose template is in database ds, unless they
 * reached the database: one statement, autocommit or the caller's transaction. An item whose
 * ledger row exists without being void (its stock was taken: the claim is being completed)
 * stays PENDING; the others become CLAIMDB_VOID, and from then on no writer of that attempt
 * takes stock or writes a coupon, so the caller may give their reservation back in Redis. */
qn_status claimdb_void(pgpool_conn *c, int ds, claimdb_item *items, size_t n) QN_MUSTCHECK;
/* The FAILED outcomes (REFUSED_STOCK, REFUSED_SLOT, VOID) into t_claim_result, where
 * /redeem-result reads them; c is ds_0's. */
qn_status claimdb_save_failed(pgpool_conn *c, const claimdb_item *items, size_t n) QN_MUSTCHECK;
/* An exchange redemption takes its code (t_exchange_code, in ds_0: c) for coupon u while the code
 * is usable: *marked is 1 if it took it now, 0 if the code is used (or not usable) already. */
qn_status claimdb_mark_code(pgpool_conn *c, const char *code, const ucoupon *u,
                            int *marked) QN_MUSTCHECK;
/* An exchange redemption that did not become a coupon: its code (t_exchange_code, in ds_0: c) is
 * usable again, if it is still held by that very redemption (user and coupon id): a later
 * redemption by anyone keeps it. *freed (may be NULL): 1 if the code was freed now, 0 if it was
 * free or another's already. */
qn_status claimdb_free_code(pgpool_conn *c, const char *code, const ucoupon *u,
                            int *freed) QN_MUSTCHECK;

/* 1 for NEW and DUP (the user has the coupon). */
int claimdb_succeeded(const claimdb_item *it);
/* Why a refused or failed claim did not become a coupon (API words): the reason of its FAILED
 * row, which also tells a given-up attempt (CLAIMDB_VOID) from a refused one. */
const char *claimdb_reason(const claimdb_item *it);
const char *claimdb_state_reason(claimdb_state s);

#endif
