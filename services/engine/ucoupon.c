/* User-coupon rows and wallet members (ucoupon.h). */
#include "ucoupon.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgparam.h"
#include "shard.h"

void ucoupon_claimed(ucoupon *u, int64_t id, int64_t user, int64_t tpl, int64_t shop, int source,
                     int receive_count, int64_t now_ms, int64_t hours, const char *request_id)
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

void ucoupon_from_row(const PGresult *r, int row, ucoupon *out)
{
    memset(out, 0, sizeof(*out));
    out->id = strtoll(PQgetvalue(r, row, 0), NULL, 10);
    out->user_id = strtoll(PQgetvalue(r, row, 1), NULL, 10);
    out->template_id = strtoll(PQgetvalue(r, row, 2), NULL, 10);
    out->shop_number = strtoll(PQgetvalue(r, row, 3), NULL, 10);
    out->receive_time_ms = strtoll(PQgetvalue(r, row, 4), NULL, 10);
    out->valid_start_ms = strtoll(PQgetvalue(r, row, 5), NULL, 10);
    out->valid_end_ms = strtoll(PQgetvalue(r, row, 6), NULL, 10);
    out->use_time_ms = strtoll(PQgetvalue(r, row, 7), NULL, 10);
    out->receive_count = atoi(PQgetvalue(r, row, 8));
    out->source = atoi(PQgetvalue(r, row, 9));
    out->status = atoi(PQgetvalue(r, row, 10));
    snprintf(out->request_id, sizeof(out->request_id), "%s", PQgetvalue(r, row, 11));
}

qn_status ucoupon_insert(pgpool_conn *c, const ucoupon *u)
{
    char sql[512], table[64];
    pgparam p = {0};
    ucoupon_table(u->user_id, table);
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_time, "
             "receive_count, valid_start_time, valid_end_time, source, status, request_id) "
             "VALUES ($1, $2, $3, $4, to_timestamp($5::bigint / 1000.0), $6, "
             "to_timestamp($7::bigint / 1000.0), to_timestamp($8::bigint / 1000.0), $9, $10, "
             "nullif($11, ''))",
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
    return pgpool_exec_cmd(c, sql, p.n, p.v, NULL);
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
                             int64_t *affected)
{
    char sql[512], table[64];
    pgparam p = {0};
    ucoupon_table(user_id, table);
    snprintf(sql, sizeof(sql),
             "UPDATE %s SET status = $4::smallint, update_time = now(), use_time = CASE WHEN "
             "$4::smallint = %d THEN now() WHEN $4::smallint = %d THEN NULL ELSE use_time END "
             "WHERE user_id = $1 AND id = $2 AND status = $3::smallint",
             table, UCOUPON_USED, UCOUPON_UNUSED);
    pgparam_i64(&p, user_id);
    pgparam_i64(&p, id);
    pgparam_i64(&p, from);
    pgparam_i64(&p, to);
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
