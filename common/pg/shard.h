/*
 * Shard router: which database (ds_0/ds_1) and which physical table hold a row of a logical
 * table, by the rule of the platform Quan replaces (bit-exact with its Java code):
 *
 *     h   = (int32)(v ^ (v >>> 32))        Long.hashCode
 *     t   = (int32) abs((int64) h)          INT_MIN stays INT_MIN, and INT_MIN % N == 0
 *     idx = t % N                           physical table {logical}_{idx}
 *     db  = idx / (N / 2)                   two databases, the lower half of tables in ds_0
 *
 * Each logical table carries its own table count N (one count shared by all tables would route
 * some shops to the wrong database). Pure functions, no state: safe from
 * any thread.
 *
 *   t_coupon_template, t_coupon_template_log   16 tables, key shop_number
 *   t_user_coupon, t_user_coupon_log           32 tables, key user_id
 *   t_coupon_settlement                        16 tables, key user_id
 *
 * Unsharded tables known here (tasks, task failures, reminders, users, exchange codes) live in
 * ds_0 only. Per-database tables that exist in *every* database (the outbox, delayed events,
 * migrations) are not routed by this module: the caller already knows which database it is on.
 */
#ifndef QUAN_SHARD_H
#define QUAN_SHARD_H

#include <stdint.h>

#include "status.h"

#define SHARD_DB_COUNT 2 /* ds_0, ds_1 */

typedef struct shard_route {
    int ds;         /* 0 or 1: index of the data source (QUAN_DS0_DSN / QUAN_DS1_DSN) */
    int index;      /* physical table index in [0, N), or -1 for an unsharded table */
    char table[64]; /* physical table name, e.g. "t_user_coupon_13"; logical name if unsharded */
} shard_route;

/* The table index of key v among n tables (n > 0), by the rule above. */
int shard_index(int64_t v, int n);
/* The database of table index idx when n tables are split over SHARD_DB_COUNT databases. */
int shard_db_of_index(int idx, int n);

/*
 * Route key to its physical table. QN_EINVAL for an unknown logical table (out is untouched).
 * For a known unsharded table: ds 0, index -1, table = the logical name, key ignored.
 */
qn_status shard_route_for(const char *logical_table, int64_t key, shard_route *out) QN_MUSTCHECK;

/*
 * Route by table index instead of key: for scans over every physical table (expiry sweeps,
 * per-database IN queries). QN_EINVAL if the table is unknown, unsharded, or idx out of range.
 */
qn_status shard_route_index(const char *logical_table, int idx, shard_route *out) QN_MUSTCHECK;

/* Number of physical tables of a sharded table; 0 for a known unsharded table; -1 if unknown. */
int shard_table_count(const char *logical_table);

/* The shard-key column of a sharded table ("shop_number", "user_id"); NULL otherwise. */
const char *shard_key_column(const char *logical_table);

#endif
