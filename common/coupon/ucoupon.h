/*
 * User-coupon rows (t_user_coupon_N, sharded by user_id over 32 tables) and their wallet
 * members, shared by every module that writes coupons: the engine's claims (claim.c, claimq.c),
 * payment and exchange-code redemption, and distribution tasks. Blocking helpers: call them from
 * pgpool work functions or consumer threads, with a connection of the user's database
 * (ucoupon_ds(user_id)).
 *
 * The wallet is the sorted set quan:wallet:{<userId>} (keys.h), member "<templateId>_<id>",
 * score = claim time in epoch ms.
 */
#ifndef QUAN_UCOUPON_H
#define QUAN_UCOUPON_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "pgparam.h"
#include "pgpool.h"
#include "status.h"

/* A coupon's status. Statements compare and write it in their text too, so each number is
 * written once, as a macro the enum and UCOUPON_STATUS_TEXT are both made of (pgparam.h). */
#define UCOUPON_UNUSED_N  0
#define UCOUPON_LOCKED_N  1
#define UCOUPON_USED_N    2
#define UCOUPON_EXPIRED_N 3
#define UCOUPON_REVOKED_N 4
enum {
    UCOUPON_UNUSED = UCOUPON_UNUSED_N,
    UCOUPON_LOCKED = UCOUPON_LOCKED_N,
    UCOUPON_USED = UCOUPON_USED_N,
    UCOUPON_EXPIRED = UCOUPON_EXPIRED_N,
    UCOUPON_REVOKED = UCOUPON_REVOKED_N,
};
/* A status as a statement's text: UCOUPON_STATUS_TEXT(UNUSED) is "0". */
#define UCOUPON_STATUS_TEXT(name) PGPARAM_DIGIT_TEXT(UCOUPON_##name##_N)

/* How a coupon was issued (t_user_coupon_N.channel): the template statistics count by it. */
enum {
    UCOUPON_CH_CLAIM = 0, /* POST /redeem, or its check completing it */
    UCOUPON_CH_MQ = 1,    /* POST /redeem-mq */
    UCOUPON_CH_TASK = 2,  /* a distribution task's row */
    UCOUPON_CH_CODE = 3,  /* an exchange code */
};

#define UCOUPON_REQUEST_ID_MAX 64
#define UCOUPON_MEMBER_LEN     48 /* "<int64>_<int64>" + NUL */

/* One row; no pointers, so it can be copied freely. Times in epoch ms, 0 when NULL. */
typedef struct ucoupon {
    int64_t id;
    int64_t user_id;
    int64_t template_id;
    int64_t shop_number; /* the template's shop (routes back to the template) */
    int64_t receive_time_ms;
    int64_t valid_start_ms;
    int64_t valid_end_ms;
    int64_t use_time_ms;
    int receive_count; /* 1 = the user's first coupon of this template, by any path */
    int source;        /* 0 claim centre, 1 platform, 2 shop */
    int status;        /* UCOUPON_* */
    int channel;       /* UCOUPON_CH_*; read back: -1 when unknown (issued before it was kept) */
    char request_id[UCOUPON_REQUEST_ID_MAX + 1]; /* "" when none */
} ucoupon;

/* The columns ucoupon_from_row reads, in order, for SELECTs of other modules. */
#define UCOUPON_COLUMNS                                                                            \
    "id, user_id, coupon_template_id, coalesce(shop_number, 0), "                                  \
    "(extract(epoch from receive_time) * 1000)::bigint, "                                          \
    "(extract(epoch from valid_start_time) * 1000)::bigint, "                                      \
    "(extract(epoch from valid_end_time) * 1000)::bigint, "                                        \
    "coalesce((extract(epoch from use_time) * 1000)::bigint, 0), receive_count, source, status, "  \
    "coalesce(request_id, ''), coalesce(channel, -1)"

/* The database (0 or 1) and physical table of a user's coupons. table gets 64 bytes. */
/* The coupon a claim makes (claim.c, exchange.c, distribution): user's receive_count-th coupon
 * of template tpl of shop, issued through channel (UCOUPON_CH_*) at now_ms, valid from then for
 * hours, unused; id from the caller's id generator. */
void ucoupon_claimed(ucoupon *u, int64_t id, int64_t user, int64_t tpl, int64_t shop, int source,
                     int channel, int receive_count, int64_t now_ms, int64_t hours,
                     const char *request_id);
int ucoupon_ds(int64_t user_id);
void ucoupon_table(int64_t user_id, char table[64]);

/* Row `row` of a SELECT of UCOUPON_COLUMNS. */
void ucoupon_from_row(const PGresult *r, int row, ucoupon *out);

/* Inserts u (every field but use_time; request_id "" is stored as NULL). QN_ECONFLICT on a
 * unique violation: the (user, template, receive_count) slot or the (user, request_id) is
 * taken. Rolls back nothing itself: inside a transaction the caller must roll back. */
qn_status ucoupon_insert(pgpool_conn *c, const ucoupon *u) QN_MUSTCHECK;

/*
 * Batches, for rows[0..n) whose users all live in the connection's database (the caller splits
 * by ucoupon_ds). ONE statement for all the physical tables they fall in, whatever n:
 *
 * ucoupon_insert_many inserts them (ON CONFLICT ... DO NOTHING); inserted[i] = 1 for the rows
 * written now, 0 for those a unique key kept out. With UCOUPON_ON_ANY that is any of them: the
 * same (user, request id), the (user, template, receive_count) slot, or the id. UCOUPON_ON_SLOT
 * lets only the slot pass (the other two raise an error): one arbiter index instead of three,
 * for callers whose ids and request ids cannot be taken already. UCOUPON_ON_NONE has no
 * arbiter at all: a plain INSERT, about a third cheaper in the server's CPU, for rows believed
 * new: all are written (inserted[i] = 1), or, when any unique key is taken, none
 * (QN_ECONFLICT; inside a transaction the caller must roll back). Every row needs its request id.
 *
 * ucoupon_find_requests reads back the coupons these rows' requests made: found[i] = 1 and
 * *rows[i] replaced by the stored row when the user has a coupon with rows[i]'s request id.
 *
 * Both run inside the caller's transaction, if any; neither rolls back.
 */
typedef enum { UCOUPON_ON_ANY = 0, UCOUPON_ON_SLOT, UCOUPON_ON_NONE } ucoupon_conflict;
qn_status ucoupon_insert_many(pgpool_conn *c, const ucoupon *const *rows, size_t n,
                              ucoupon_conflict on, char *inserted) QN_MUSTCHECK;
qn_status ucoupon_find_requests(pgpool_conn *c, ucoupon *const *rows, size_t n,
                                char *found) QN_MUSTCHECK;

/* QN_ENOTFOUND when the user has no coupon of that id (another user's coupon included). */
qn_status ucoupon_load(pgpool_conn *c, int64_t user_id, int64_t id, ucoupon *out) QN_MUSTCHECK;
/* The user's coupon made by the claim with this request id; QN_ENOTFOUND when none. */
qn_status ucoupon_load_by_request(pgpool_conn *c, int64_t user_id, const char *request_id,
                                  ucoupon *out) QN_MUSTCHECK;

/* What a status change belongs to, for the coupon's history (t_user_coupon_log_N, written by
 * the database in the same transaction): ref names the cause ("order:<id>"), actor who made
 * the change ("payment", "payment-timeout"); discount_cents is what the order saves, kept
 * from the lock to the payment (the statistics count it when the payment commits). */
typedef struct ucoupon_why {
    const char *ref;   /* may be NULL */
    const char *actor; /* may be NULL */
    int64_t discount_cents;
} ucoupon_why;

/*
 * Compare-and-set of the status: UPDATE ... SET status = to WHERE user_id AND id AND status =
 * from. *affected (may be NULL) gets 1 when it changed, 0 when the coupon is absent or not in
 * `from`. use_time is set to now() when `to` is UCOUPON_USED and cleared when `to` is
 * UCOUPON_UNUSED (refund). The discount is set when `to` is UCOUPON_LOCKED, kept when
 * UCOUPON_USED, and cleared when UCOUPON_UNUSED.
 */
qn_status ucoupon_set_status(pgpool_conn *c, int64_t user_id, int64_t id, int from, int to,
                             const ucoupon_why *why, int64_t *affected) QN_MUSTCHECK;

/* "<templateId>_<userCouponId>" into buf (UCOUPON_MEMBER_LEN bytes); returns buf. */
char *ucoupon_member(char *buf, int64_t template_id, int64_t id);
/* Parses a wallet member; QN_EINVAL when malformed. */
qn_status ucoupon_member_parse(const char *m, int64_t *template_id, int64_t *id) QN_MUSTCHECK;

#endif
