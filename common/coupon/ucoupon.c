/* User-coupon rows and wallet members (ucoupon.h). */
#include "ucoupon.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgparam.h"
#include "shard.h"

void ucoupon_claimed(ucoupon *u, int64_t id, int64_t user, int64_t tpl, int64_t shop, int source,
                     int channel, int receive_count, int64_t now_ms, int64_t hours,
                     const char *request_id)
{
    memset(u, 0, sizeof(*u));
    u->id = id;
    u->user_id = user;
    u->template_id = tpl;
    u->shop_number = shop;
    u->receive_time_ms = now_ms;
    u->valid_start_ms = now_ms;
    u->valid_end_ms = now_ms + hours * 3600000;
    u->receive_count = receive_count;
    u->source = source;
    u->channel = channel;
    u->status = UCOUPON_UNUSED;
    snprintf(u->request_id, sizeof(u->request_id), "%s", request_id);
}

int ucoupon_ds(int64_t user_id)
{
    shard_route r;
    return shard_route_for("t_user_coupon", user_id, &r) == QN_OK ? r.ds : 0;
}

void ucoupon_table(int64_t user_id, char table[64])
{
    shard_route r;
    if (shard_route_for("t_user_coupon", user_id, &r) != QN_OK)
        snprintf(r.table, sizeof(r.table), "t_user_coupon_0"); /* unreachable: known table */
    memcpy(table, r.table, 64);
}

/* UCOUPON_COLUMNS from column c0 of row on. */
static void ucoupon_from_row_at(const PGresult *r, int row, int c0, ucoupon *out)
{
    memset(out, 0, sizeof(*out));
    out->id = strtoll(PQgetvalue(r, row, c0 + 0), NULL, 10);
    out->user_id = strtoll(PQgetvalue(r, row, c0 + 1), NULL, 10);
    out->template_id = strtoll(PQgetvalue(r, row, c0 + 2), NULL, 10);
    out->shop_number = strtoll(PQgetvalue(r, row, c0 + 3), NULL, 10);
    out->receive_time_ms = strtoll(PQgetvalue(r, row, c0 + 4), NULL, 10);
    out->valid_start_ms = strtoll(PQgetvalue(r, row, c0 + 5), NULL, 10);
    out->valid_end_ms = strtoll(PQgetvalue(r, row, c0 + 6), NULL, 10);
    out->use_time_ms = strtoll(PQgetvalue(r, row, c0 + 7), NULL, 10);
    out->receive_count = atoi(PQgetvalue(r, row, c0 + 8));
    out->source = atoi(PQgetvalue(r, row, c0 + 9));
    out->status = atoi(PQgetvalue(r, row, c0 + 10));
    snprintf(out->request_id, sizeof(out->request_id), "%s", PQgetvalue(r, row, c0 + 11));
    out->channel = atoi(PQgetvalue(r, row, c0 + 12));
}

void ucoupon_from_row(const PGresult *r, int row, ucoupon *out)
{
    ucoupon_from_row_at(r, row, 0, out);
}

qn_status ucoupon_insert(pgpool_conn *c, const ucoupon *u)
{
    char sql[512], table[64];
    pgparam p = {0};
    ucoupon_table(u->user_id, table);
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_time, "
             "receive_count, valid_start_time, valid_end_time, source, status, request_id, "
             "channel) VALUES ($1, $2, $3, $4, to_timestamp($5::bigint / 1000.0), $6, "
             "to_timestamp($7::bigint / 1000.0), to_timestamp($8::bigint / 1000.0), $9, $10, "
             "nullif($11, ''), $12)",
             table);
    pgparam_i64(&p, u->id);
    pgparam_i64(&p, u->user_id);
    pgparam_i64(&p, u->template_id);
    pgparam_i64(&p, u->shop_number);
    pgparam_i64(&p, u->receive_time_ms);
    pgparam_i64(&p, u->receive_count);
    pgparam_i64(&p, u->valid_start_ms);
    pgparam_i64(&p, u->valid_end_ms);
    pgparam_i64(&p, u->source);
    pgparam_i64(&p, u->status);
    pgparam_str(&p, u->request_id);
    pgparam_i64(&p, u->channel);
    return pgpool_exec_cmd(c, sql, p.n, p.v, NULL);
}

#define UCOUPON_TABLES 32

/* Index N of the user's "t_user_coupon_N". */
static int ucoupon_table_no(int64_t user_id)
{
    shard_route r;
    if (shard_route_for("t_user_coupon", user_id, &r) != QN_OK || r.index < 0 ||
        r.index >= UCOUPON_TABLES)
        return 0; /* unreachable: shard.c knows 32 tables */
    return r.index;
}

static void ucoupon_arrays_free(pgparam_array *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pgparam_array_free(&a[i]);
}

/* An id and the index of its row, to find the rows an INSERT returned. */
typedef struct ucoupon_idx {
    int64_t id;
    size_t i;
} ucoupon_idx;

static int ucoupon_idx_cmp(const void *a, const void *b)
{
    int64_t x = ((const ucoupon_idx *)a)->id, y = ((const ucoupon_idx *)b)->id;
    return (x > y) - (x < y);
}

qn_status ucoupon_insert_many(pgpool_conn *c, const ucoupon *const *rows, size_t n,
                              ucoupon_conflict on, char *inserted)
{
    pgparam_array a[11] = {{0}};
    pgparam p = {0};
    size_t count[UCOUPON_TABLES + 1] = {0}, fill[UCOUPON_TABLES] = {0};
    size_t cap = 1024 + UCOUPON_TABLES * 900, len = 0;
    size_t *order = NULL;
    ucoupon_idx *ids = NULL;
    char *sql = NULL;
    PGresult *r = NULL;
    qn_status st = QN_OK;

    memset(inserted, 0, n);
    if (n == 0)
        return QN_OK;
    st = QN_ENOMEM;
    order = malloc(n * sizeof(*order));
    ids = malloc(n * sizeof(*ids));
    if (!order || !ids || !(sql = malloc(cap)))
        goto out;
    /* The rows by table (a counting sort), so that each table's INSERT reads only its own slice
     * of the arrays instead of filtering all of them. */
    for (size_t i = 0; i < n; i++)
        count[ucoupon_table_no(rows[i]->user_id) + 1]++;
    for (int k = 0; k < UCOUPON_TABLES; k++)
        count[k + 1] += count[k];
    for (size_t i = 0; i < n; i++) {
        int tb = ucoupon_table_no(rows[i]->user_id);
        order[count[tb] + fill[tb]++] = i;
    }
    for (size_t k = 0; k < n; k++) {
        const ucoupon *u = rows[order[k]];
        ids[k] = (ucoupon_idx){u->id, order[k]};
        pgparam_array_i64(&a[0], u->id);
        pgparam_array_i64(&a[1], u->user_id);
        pgparam_array_i64(&a[2], u->template_id);
        pgparam_array_i64(&a[3], u->shop_number);
        pgparam_array_i64(&a[4], u->receive_time_ms);
        pgparam_array_i64(&a[5], u->receive_count);
        pgparam_array_i64(&a[6], u->valid_start_ms);
        pgparam_array_i64(&a[7], u->valid_end_ms);
        pgparam_array_i64(&a[8], u->source);
        pgparam_array_str(&a[9], u->request_id);
        pgparam_array_i64(&a[10], u->channel);
    }
    for (int k = 0; k < 11; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    /* ONE statement for every physical table (a data-modifying CTE per table, each on its slice
     * [lo:hi] of the arrays): one round trip per batch instead of one per table. */
    len += (size_t)snprintf(sql, cap, "WITH");
    for (int k = 0, first = 1; k < UCOUPON_TABLES; k++) {
        size_t lo = count[k] + 1, hi = count[k + 1];
        if (lo > hi)
            continue;
        len += (size_t)snprintf(
            sql + len, cap - len,
            "%s i%d AS (INSERT INTO t_user_coupon_%d (id, user_id, coupon_template_id, "
            "shop_number, receive_time, receive_count, valid_start_time, valid_end_time, source, "
            "status, request_id, channel) SELECT id, u, t, s, to_timestamp(rt::float8 / 1000), "
            "cnt, to_timestamp(vs::float8 / 1000), to_timestamp(ve::float8 / 1000), src, 0, rid, "
            "ch FROM unnest(($1::bigint[])[%zu:%zu], ($2::bigint[])[%zu:%zu], "
            "($3::bigint[])[%zu:%zu], ($4::bigint[])[%zu:%zu], ($5::bigint[])[%zu:%zu], "
            "($6::int[])[%zu:%zu], ($7::bigint[])[%zu:%zu], ($8::bigint[])[%zu:%zu], "
            "($9::smallint[])[%zu:%zu], ($10::text[])[%zu:%zu], ($11::smallint[])[%zu:%zu]) AS "
            "x(id, u, t, s, rt, cnt, vs, ve, src, rid, ch)%s)",
            first ? "" : ",", k, k, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi, lo, hi,
            lo, hi, lo, hi, lo, hi,
            on == UCOUPON_ON_NONE   ? ""
            : on == UCOUPON_ON_SLOT ? " ON CONFLICT (user_id, coupon_template_id, receive_count) "
                                      "DO NOTHING RETURNING id"
                                    : " ON CONFLICT DO NOTHING RETURNING id");
        first = 0;
    }
    if (on == UCOUPON_ON_NONE) {
        /* The CTEs run to completion whatever the main query reads. */
        len += (size_t)snprintf(sql + len, cap - len, " SELECT 1");
        st = pgpool_exec_cmd(c, sql, p.n, p.v, NULL);
        if (st == QN_OK)
            memset(inserted, 1, n);
        goto out;
    }
    for (int k = 0, first = 1; k < UCOUPON_TABLES; k++)
        if (count[k] < count[k + 1]) {
            len += (size_t)snprintf(sql + len, cap - len, "%sSELECT id FROM i%d",
                                    first ? " " : " UNION ALL ", k);
            first = 0;
        }
    st = QN_ERR;
    if (!(r = pgpool_exec(c, sql, p.n, p.v)))
        goto out;
    /* The rows inserted, by the ids returned. */
    qsort(ids, n, sizeof(*ids), ucoupon_idx_cmp);
    for (int k = 0; k < PQntuples(r); k++) {
        ucoupon_idx key = {strtoll(PQgetvalue(r, k, 0), NULL, 10), 0};
        const ucoupon_idx *hit = bsearch(&key, ids, n, sizeof(*ids), ucoupon_idx_cmp);
        if (hit)
            inserted[hit->i] = 1;
    }
    st = QN_OK;
out:
    PQclear(r);
    ucoupon_arrays_free(a, 11);
    free(order);
    free(ids);
    free(sql);
    return st;
}

qn_status ucoupon_find_requests(pgpool_conn *c, ucoupon *const *rows, size_t n, char *found)
{
    pgparam_array a[3] = {{0}};
    pgparam p = {0};
    int used[UCOUPON_TABLES] = {0};
    size_t cap = 256 + UCOUPON_TABLES * (200 + sizeof(UCOUPON_COLUMNS)), len = 0;
    char *sql = NULL;
    PGresult *r = NULL;
    qn_status st = QN_OK;

    memset(found, 0, n);
    if (n == 0)
        return QN_OK;
    st = QN_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int tb = ucoupon_table_no(rows[i]->user_id);
        used[tb] = 1;
        pgparam_array_i64(&a[0], rows[i]->user_id);
        pgparam_array_str(&a[1], rows[i]->request_id);
        pgparam_array_i64(&a[2], tb);
    }
    for (int k = 0; k < 3; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    if (!(sql = malloc(cap)))
        goto out;
    len = (size_t)snprintf(sql, cap, "%s",
                           "WITH x AS (SELECT * FROM unnest($1::bigint[], $2::text[], "
                           "$3::int[]) WITH ORDINALITY AS x(u, r, tb, o)) ");
    for (int k = 0, first = 1; k < UCOUPON_TABLES; k++)
        if (used[k]) {
            len += (size_t)snprintf(sql + len, cap - len,
                                    "%sSELECT x.o, " UCOUPON_COLUMNS " FROM x JOIN "
                                    "t_user_coupon_%d c ON x.tb = %d AND c.user_id = x.u AND "
                                    "c.request_id = x.r",
                                    first ? "" : " UNION ALL ", k, k);
            first = 0;
        }
    st = QN_ERR;
    if (!(r = pgpool_exec(c, sql, p.n, p.v)))
        goto out;
    for (int k = 0; k < PQntuples(r); k++) {
        long o = strtol(PQgetvalue(r, k, 0), NULL, 10);
        if (o < 1 || (size_t)o > n)
            continue;
        /* UCOUPON_COLUMNS start at column 1: read them as a row of their own. */
        ucoupon_from_row_at(r, k, 1, rows[o - 1]);
        found[o - 1] = 1;
    }
    st = QN_OK;
out:
    PQclear(r);
    ucoupon_arrays_free(a, 3);
    free(sql);
    return st;
}

/* The coupon of user_id matching where, whose parameters p are $1 user_id, then where's own. */
static qn_status ucoupon_load_where(pgpool_conn *c, int64_t user_id, const char *where,
                                    const pgparam *p, ucoupon *out)
{
    char sql[1024], table[64];
    ucoupon_table(user_id, table);
    snprintf(sql, sizeof(sql), "SELECT " UCOUPON_COLUMNS " FROM %s WHERE user_id = $1 AND %s",
             table, where);
    PGresult *r = pgpool_exec(c, sql, p->n, p->v);
    if (!r)
        return QN_ERR;
    qn_status st = QN_ENOTFOUND;
    if (PQntuples(r) >= 1) {
        ucoupon_from_row(r, 0, out);
        st = QN_OK;
    }
    PQclear(r);
    return st;
}

qn_status ucoupon_load(pgpool_conn *c, int64_t user_id, int64_t id, ucoupon *out)
{
    pgparam p = {0};
    pgparam_i64(&p, user_id);
    pgparam_i64(&p, id);
    return ucoupon_load_where(c, user_id, "id = $2", &p, out);
}

qn_status ucoupon_load_by_request(pgpool_conn *c, int64_t user_id, const char *request_id,
                                  ucoupon *out)
{
    if (!request_id || !*request_id)
        return QN_ENOTFOUND;
    pgparam p = {0};
    pgparam_i64(&p, user_id);
    pgparam_str(&p, request_id);
    return ucoupon_load_where(c, user_id, "request_id = $2", &p, out);
}

qn_status ucoupon_set_status(pgpool_conn *c, int64_t user_id, int64_t id, int from, int to,
                             const ucoupon_why *why, int64_t *affected)
{
    char sql[768], table[64];
    pgparam p = {0};
    ucoupon_table(user_id, table);
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET status = $4::smallint, update_time = now(), use_time = CASE WHEN "
             "$4::smallint = %d THEN now() WHEN $4::smallint = %d THEN NULL ELSE use_time END, "
             "discount_cents = CASE $4::smallint WHEN %d THEN $7::bigint WHEN %d THEN "
             "discount_cents ELSE 0 END, last_ref = nullif($5, ''), last_actor = nullif($6, '') "
             "WHERE user_id = $1 AND id = $2 AND status = $3::smallint",
             table, UCOUPON_USED, UCOUPON_UNUSED, UCOUPON_LOCKED, UCOUPON_USED);
    pgparam_i64(&p, user_id);
    pgparam_i64(&p, id);
    pgparam_i64(&p, from);
    pgparam_i64(&p, to);
    pgparam_str(&p, why && why->ref ? why->ref : "");
    pgparam_str(&p, why && why->actor ? why->actor : "");
    pgparam_i64(&p, why ? why->discount_cents : 0);
    return pgpool_exec_cmd(c, sql, p.n, p.v, affected);
}

char *ucoupon_member(char *buf, int64_t template_id, int64_t id)
{
    snprintf(buf, UCOUPON_MEMBER_LEN, "%" PRId64 "_%" PRId64, template_id, id);
    return buf;
}

qn_status ucoupon_member_parse(const char *m, int64_t *template_id, int64_t *id)
{
    char *end;
    if (!m || *m < '0' || *m > '9')
        return QN_EINVAL;
    long long t = strtoll(m, &end, 10);
    if (*end != '_' || end[1] < '0' || end[1] > '9')
        return QN_EINVAL;
    long long i = strtoll(end + 1, &end, 10);
    if (*end != '\0' || t <= 0 || i <= 0)
        return QN_EINVAL;
    *template_id = t;
    *id = i;
    return QN_OK;
}
