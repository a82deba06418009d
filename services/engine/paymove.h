/*
 * The payment lifecycle's state machine, without I/O (payment.c runs it): the move each kind
 * of call makes on the settlement row and the coupon row, and what to do given the two rows as
 * they are now. Two databases may hold the two rows, so a crash between the two steps leaves
 * a state the next call (or the timeout) must finish rather than refuse.
 */
#ifndef QUAN_PAYMOVE_H
#define QUAN_PAYMOVE_H

#include <stdbool.h>

/* t_coupon_settlement.status */
#define SETTLE_LOCKED_N    0
#define SETTLE_CANCELLED_N 1
#define SETTLE_PAID_N      2
#define SETTLE_REFUNDED_N  3
enum {
    SETTLE_LOCKED = SETTLE_LOCKED_N,
    SETTLE_CANCELLED = SETTLE_CANCELLED_N,
    SETTLE_PAID = SETTLE_PAID_N,
    SETTLE_REFUNDED = SETTLE_REFUNDED_N,
};
/* A status as a statement's text (each number written once): SETTLE_STATUS_TEXT(PAID) is "2". */
#define SETTLE_STATUS_TEXT(name) PGPARAM_DIGIT_TEXT(SETTLE_##name##_N)

typedef enum { PAY_CREATE, PAY_PROCESS, PAY_REFUND, PAY_CANCEL, PAY_TIMEOUT } pay_kind;

/* The move a kind makes: settlement from -> to (create: none before, -1), coupon from -> to. */
typedef struct paymove {
    int s_from, s_to, c_from, c_to;
    const char *verb; /* "lock", "pay", ...: for messages */
} paymove;

/* kind's move (a static row). */
const paymove *paymove_of(pay_kind kind);

typedef enum {
    PAYMOVE_NOT_FOUND,       /* no settlement for the call (404) */
    PAYMOVE_BOTH,            /* the move: both rows */
    PAYMOVE_COUPON_ONLY,     /* the settlement moved, the coupon did not: finish the coupon */
    PAYMOVE_SETTLEMENT_ONLY, /* a create stopped between the databases: end the settlement */
    PAYMOVE_REFUSE           /* the rows do not allow it (409 B000104) */
} paymove_plan;

/* What a call of kind (not create) does, given its settlement (found, its status, whether
 * another settlement of the coupon is active), the coupon's status, and whether the two rows
 * live in two databases. */
paymove_plan paymove_decide(pay_kind kind, bool found, int settle_status, bool other_active,
                            int coupon_status, bool two_databases);

/* The names of a settlement's and a coupon's statuses ("unknown" past them). */
const char *paymove_settle_name(int s);
const char *paymove_coupon_name(int s);

#endif
