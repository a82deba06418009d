/*
 * A user coupon's history, as its user (engine /user-coupon/history) and its shop
 * (merchant-admin /coupon/history) read it: the issue, from the coupon's own row of
 * t_user_coupon_N (channel, request id, receive time), then every status change, from the rows
 * the database's trigger appends to t_user_coupon_log_N (same shard and database,
 * migrations/ds_0/0012_coupon_stats.sql), in their order.
 *
 * The coupon and its log are read in ONE statement (one snapshot: the status answered and the
 * last change agree), at most CHISTORY_MAX changes. A dead coupon moved to the archive tables
 * (t_user_coupon_archive_N, t_user_coupon_log_archive_N; services/engine/archive.h) is read
 * there, in the same statement, so its history answers the same after the move. Blocking: call the
 * readers from pgpool work functions, on the coupon's database.
 */
#ifndef QUAN_CHISTORY_H
#define QUAN_CHISTORY_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "pgpool.h"
#include "status.h"
#include "ucoupon.h"

#define CHISTORY_MAX       1000 /* status changes answered per coupon (the oldest) */
#define CHISTORY_REF_MAX   96   /* t_user_coupon_log_N.ref */
#define CHISTORY_ACTOR_MAX 64   /* t_user_coupon_log_N.actor */

/* One status change (a log row). ref and actor "" with has_* 0 when NULL. */
typedef struct chistory_change {
    int64_t id;   /* the log row's: the order */
    int from, to; /* UCOUPON_* */
    int64_t discount_cents;
    int64_t time_ms;
    int has_ref, has_actor;
    char ref[CHISTORY_REF_MAX + 1];
    char actor[CHISTORY_ACTOR_MAX + 1];
} chistory_change;

typedef struct chistory {
    int64_t id, user_id, template_id, shop_number;
    int status;  /* UCOUPON_* now */
    int channel; /* UCOUPON_CH_*, -1 when not known (NULL: issued before it was kept) */
    int64_t receive_time_ms;
    char request_id[UCOUPON_REQUEST_ID_MAX + 1]; /* "" when none */
    chistory_change *changes;                    /* owned; oldest first */
    size_t n;
    int truncated; /* more than CHISTORY_MAX changes: the later ones are left out */
} chistory;

/* The user's coupon id (t_user_coupon_N of user_id, on its database). QN_ENOTFOUND when the
 * user has no such coupon (another user's included); QN_ERR a database failure; QN_ENOMEM. */
qn_status chistory_load_user(pgpool_conn *c, int64_t user_id, int64_t id,
                             chistory *out) QN_MUSTCHECK;

/* The coupon id in any coupon table of database ds (the caller does not know its user): one
 * statement, a UNION ALL over that database's tables. Errors as chistory_load_user. */
qn_status chistory_find(pgpool_conn *c, int ds, int64_t id, chistory *out) QN_MUSTCHECK;

/* Frees the changes; h may be zeroed or loaded. */
void chistory_clear(chistory *h);

/* The answer's names: "unused", "locked", "used", "expired", "revoked" ("unknown" otherwise);
 * "claim", "mq", "distribution", "exchangeCode" ("unknown" otherwise); the event of a change:
 * 0->1 "locked", 1->0 "unlocked", 1->2 "paid", 2->0 "refunded", any->3 "expired",
 * any->4 "revoked", else "changed". */
const char *chistory_status_name(int status);
const char *chistory_channel_name(int channel);
const char *chistory_event_name(int from, int to);

/* The answer: {couponId, [userId,] couponTemplateId, shopNumber, status, truncated, events:
 * [issued, changes...]} (docs/api.md, "A coupon's history"). NULL when out of memory. */
cJSON *chistory_to_json(const chistory *h, int with_user);

#endif
