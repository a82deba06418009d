/*
 * Group commit of synchronous claims (/redeem, claim.c).
 *
 * A claim's first database step takes its template's stock: an UPDATE of the template's row,
 * whose lock is held until the transaction commits. With one transaction per claim a template
 * takes one claim per commit, however many connections wait: about 700 claims a second on
 * this machine, all of them queued on that row. claimbatch gathers the claims of a template
 * that arrive while a transaction of that template is in flight and writes them together in
 * the next one (at most CLAIMBATCH_MAX):
 *
 *   the ledger rows and the stock            claimdb_take_stock, one UPDATE for all
 *   the coupons whose user is in the         claimdb_insert_coupons; the give-back of those
 *   template's database                      refused a receive-count slot
 *   the checks (claimq.h)                    one statement: of the coupons written here, and
 *                                            of the claims whose coupon goes to the other
 *                                            database next (claim.c writes it)
 *
 * The second step of a claim whose user lives in the other database, its coupon
 * (claimdb_insert_coupons), is grouped the same way by that database: a commit per transaction
 * instead of one per claim.
 *
 * Each claim's item then holds its own outcome, exactly as if it had been written alone, and
 * its done callback runs. A transaction that fails fails each of its claims alike: nothing of
 * it was written (rolled back), or with QN_EUNKNOWN nobody knows whether the commit happened,
 * and each caller resolves its own claim (claimdb_void).
 *
 * The gathering is pgbatch's (pgbatch.h): one transaction per template (and per database for
 * coupons) is in flight per process; a claim waits for at most the one ahead of it.
 *
 * Loop thread only.
 */
#ifndef QUAN_CLAIMBATCH_H
#define QUAN_CLAIMBATCH_H

#include <stdint.h>

#include "claimdb.h"
#include "metrics.h"
#include "service.h"
#include "status.h"

#define CLAIMBATCH_MAX      256  /* claims per transaction */
#define CLAIMBATCH_WAIT_MAX 4096 /* claims waiting per template; beyond, refused at once */

/* st: QN_OK (the transaction committed; the item tells each outcome), QN_EUNKNOWN (the COMMIT's
 * answer was lost), anything else (nothing of the claim was written). */
typedef void (*claimbatch_done_fn)(qn_status st, void *arg);

/* One claim; it and what it points at are borrowed by claimbatch_submit until done runs. */
typedef struct claimbatch_claim {
    claimdb_item *item;     /* routed (claimdb_route) and PENDING; its outcome is written back
                               before done runs */
    const char *request_id; /* the HTTP request's id, carried by its check's event */
    int64_t check_due_ms;   /* when its check becomes due (wall clock) */
    claimbatch_done_fn done;
    void *arg;
} claimbatch_claim;

typedef struct claimbatch claimbatch;

typedef enum {
    CLAIMBATCH_STOCK,  /* the template's database: ledger, stock, same-database coupons, checks */
    CLAIMBATCH_COUPON, /* the user's database, after the stock: the coupon */
} claimbatch_step;

/* The transactions run on svc's pools (service_pg), which must outlive it. Owned by the caller;
 * free with claimbatch_free. NULL when out of memory. */
claimbatch *claimbatch_new(service *svc) QN_MUSTCHECK;
/* After the service drained (no claim in flight). NULL is allowed. */
void claimbatch_free(claimbatch *b);

/* Queues c for the next transaction of its template (or database), or starts one at once when
 * none is in flight. QN_EBUSY (done will not run) when CLAIMBATCH_WAIT_MAX claims wait there
 * already or the pool refused the transaction; QN_ENOMEM likewise. */
qn_status claimbatch_submit(claimbatch *b, claimbatch_step step, claimbatch_claim *c) QN_MUSTCHECK;

/* The shared transactions and the claims they wrote, by step; exchange.c counts its own (step
 * exchange). */
#define CLAIMBATCH_METRICS(X)                                                                      \
    X(quan_claim_transactions_total, COUNTER,                                                      \
      "Database transactions of synchronous claims, by step (stock: /redeem in the template's "    \
      "database; coupon: the user's, when it is the other one; exchange: exchange-code "           \
      "redemptions, ds_0's and ds_1's together). Concurrent claims share them.",                   \
      "step")                                                                                      \
    X(quan_claim_transaction_claims_total, COUNTER,                                                \
      "Synchronous claims those transactions wrote, by step: divided by "                          \
      "quan_claim_transactions_total, the claims per transaction.",                                \
      "step")
METRICS_DECLARE(CLAIMBATCH_METRICS)

#endif
