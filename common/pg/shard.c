#include "shard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shard_table {
    const char *name;
    int count;              /* physical tables; 0 = unsharded, lives in ds_0 */
    const char *key_column; /* NULL when unsharded */
} shard_table;

/* Adding a table here is the only change needed to route it. */
static const shard_table shard_tables[] = {
    {"t_coupon_template", 16, "shop_number"},
    {"t_coupon_template_log", 16, "shop_number"},
    {"t_user_coupon", 32, "user_id"},
    {"t_user_coupon_log", 32, "user_id"},
    {"t_coupon_settlement", 16, "user_id"},
    {"t_coupon_task", 0, NULL},
    {"t_coupon_task_fail", 0, NULL},
    {"t_coupon_template_remind", 0, NULL},
    {"t_user", 0, NULL},
    {"t_exchange_code", 0, NULL},
    {"t_exchange_code_batch", 0, NULL},
};

static const shard_table *shard_find(const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < sizeof(shard_tables) / sizeof(shard_tables[0]); i++)
        if (strcmp(shard_tables[i].name, name) == 0)
            return &shard_tables[i];
    return NULL;
}

int shard_index(int64_t v, int n)
{
    /* Long.hashCode: unsigned shift (>>>), then truncation to int. */
    int32_t h = (int32_t)(uint32_t)((uint64_t)v ^ ((uint64_t)v >> 32));
    /* Math.abs((long) h) is in [0, 2^31]; the Java (int) cast maps 2^31 to INT_MIN. The
     * conversion of 2^31 to int32_t is implementation-defined in C; gcc wraps, as Java does. */
    int64_t a = llabs((int64_t)h);
    int32_t t = (int32_t)(uint32_t)a;
    /* C's % truncates toward zero like Java's, so INT_MIN % n is 0 for n a power of two, and
     * generally in (-n, 0] — it can only be negative for INT_MIN and non-power-of-two n. */
    return t % n;
}

int shard_db_of_index(int idx, int n)
{
    return idx / (n / SHARD_DB_COUNT);
}

static qn_status shard_fill(const shard_table *t, int idx, shard_route *out)
{
    int len = snprintf(out->table, sizeof(out->table), "%s_%d", t->name, idx);
    if (len < 0 || (size_t)len >= sizeof(out->table))
        return QN_EINVAL;
    out->index = idx;
    out->ds = shard_db_of_index(idx, t->count);
    return QN_OK;
}

qn_status shard_route_for(const char *logical_table, int64_t key, shard_route *out)
{
    const shard_table *t = shard_find(logical_table);
    if (!t)
        return QN_EINVAL;
    if (t->count == 0) {
        out->ds = 0;
        out->index = -1;
        snprintf(out->table, sizeof(out->table), "%s", t->name);
        return QN_OK;
    }
    return shard_fill(t, shard_index(key, t->count), out);
}

qn_status shard_route_index(const char *logical_table, int idx, shard_route *out)
{
    const shard_table *t = shard_find(logical_table);
    if (!t || t->count == 0 || idx < 0 || idx >= t->count)
        return QN_EINVAL;
    return shard_fill(t, idx, out);
}

int shard_table_count(const char *logical_table)
{
    const shard_table *t = shard_find(logical_table);
    return t ? t->count : -1;
}

const char *shard_key_column(const char *logical_table)
{
    const shard_table *t = shard_find(logical_table);
    return t ? t->key_column : NULL;
}
