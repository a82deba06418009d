/* A user coupon's history (chistory.h). */
#include "chistory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonin.h"
#include "pgparam.h"
#include "shard.h"

/* Columns of a branch's rows, in this order. */
enum {
    CH_ID,
    CH_USER,
    CH_TPL,
    CH_SHOP,
    CH_STATUS,
    CH_CHANNEL,
    CH_RECV,
    CH_REQ,
    CH_LOG_ID,
    CH_FROM,
    CH_TO,
    CH_DISC,
    CH_REF,
    CH_ACTOR,
    CH_LOG_TIME,
};

/* One coupon table (%1$d; %4$s "" for the hot one, "_archive" for its archive) and its log:
 * the coupon once per change (once, with NULL changes, when it has none). %2$s the condition on
 * c; one more change than answered is read, to tell that some were left out. Times are floored
 * to the millisecond, as they are to the second when answered: a time reads the same here and
 * in the database. */
static const char chistory_branch_fmt[] =
    "SELECT c.id, c.user_id, c.coupon_template_id, coalesce(c.shop_number, 0), c.status, "
    "coalesce(c.channel, -1), floor(extract(epoch FROM c.receive_time) * 1000)::bigint, "
    "c.request_id, l.id AS log_id, l.from_status, l.to_status, l.discount_cents, l.ref, "
    "l.actor, floor(extract(epoch FROM l.create_time) * 1000)::bigint "
    "FROM t_user_coupon%4$s_%1$d c LEFT JOIN LATERAL (SELECT id, from_status, to_status, "
    "discount_cents, ref, actor, create_time FROM t_user_coupon_log%4$s_%1$d "
    "WHERE coupon_id = c.id ORDER BY id LIMIT %3$d) l ON true WHERE %2$s";

void chistory_clear(chistory *h)
{
    free(h->changes);
    h->changes = NULL;
    h->n = 0;
}

/* The statement over tables[0..n) and their archives (a coupon is in one or the other; one
 * statement, so a move between them is seen whole or not at all), malloc'd; NULL when out of
 * memory. */
static char *chistory_sql(const int *tables, size_t n, const char *where)
{
    static const char *const parts[] = {"", "_archive"};
    size_t cap = 2 * n * (sizeof(chistory_branch_fmt) + strlen(where) + 64) + 64, len = 0;
    char *sql = malloc(cap);
    if (!sql)
        return NULL;
    for (size_t i = 0; i < 2 * n; i++) {
        if (i > 0)
            len += (size_t)snprintf(sql + len, cap - len, " UNION ALL ");
        len += (size_t)snprintf(sql + len, cap - len, chistory_branch_fmt, tables[i / 2], where,
                                CHISTORY_MAX + 1, parts[i % 2]);
    }
    snprintf(sql + len, cap - len, " ORDER BY log_id");
    return sql;
}

static void chistory_copy(char *dst, size_t size, const PGresult *r, int row, int col, int *has)
{
    int null = PQgetisnull(r, row, col);
    if (has)
        *has = !null;
    snprintf(dst, size, "%s", null ? "" : PQgetvalue(r, row, col));
}

/* The coupon of row 0 and its changes. Rows of another coupon with the same id (never written:
 * ids are unique, but nothing in the schema says so across tables) are left out. */
static qn_status chistory_from_result(const PGresult *r, chistory *h)
{
    int rows = PQntuples(r);
    memset(h, 0, sizeof(*h));
    if (rows == 0)
        return QN_ENOTFOUND;
    h->id = strtoll(PQgetvalue(r, 0, CH_ID), NULL, 10);
    h->user_id = strtoll(PQgetvalue(r, 0, CH_USER), NULL, 10);
    h->template_id = strtoll(PQgetvalue(r, 0, CH_TPL), NULL, 10);
    h->shop_number = strtoll(PQgetvalue(r, 0, CH_SHOP), NULL, 10);
    h->status = atoi(PQgetvalue(r, 0, CH_STATUS));
    h->channel = atoi(PQgetvalue(r, 0, CH_CHANNEL));
    h->receive_time_ms = strtoll(PQgetvalue(r, 0, CH_RECV), NULL, 10);
    chistory_copy(h->request_id, sizeof(h->request_id), r, 0, CH_REQ, NULL);
    h->changes = calloc((size_t)rows, sizeof(*h->changes));
    if (!h->changes)
        return QN_ENOMEM;
    for (int i = 0; i < rows; i++) {
        if (PQgetisnull(r, i, CH_LOG_ID) ||
            strtoll(PQgetvalue(r, i, CH_USER), NULL, 10) != h->user_id)
            continue;
        if (h->n == CHISTORY_MAX) {
            h->truncated = 1;
            break;
        }
        chistory_change *c = &h->changes[h->n++];
        c->id = strtoll(PQgetvalue(r, i, CH_LOG_ID), NULL, 10);
        c->from = atoi(PQgetvalue(r, i, CH_FROM));
        c->to = atoi(PQgetvalue(r, i, CH_TO));
        c->discount_cents = strtoll(PQgetvalue(r, i, CH_DISC), NULL, 10);
        c->time_ms = strtoll(PQgetvalue(r, i, CH_LOG_TIME), NULL, 10);
        chistory_copy(c->ref, sizeof(c->ref), r, i, CH_REF, &c->has_ref);
        chistory_copy(c->actor, sizeof(c->actor), r, i, CH_ACTOR, &c->has_actor);
    }
    return QN_OK;
}

static qn_status chistory_read(pgpool_conn *c, const int *tables, size_t n, const char *where,
                               const pgparam *p, chistory *out)
{
    qn_status st = QN_ENOMEM;
    PGresult *r = NULL;
    memset(out, 0, sizeof(*out));
    char *sql = chistory_sql(tables, n, where);
    if (!sql)
        goto done;
    r = pgpool_exec(c, sql, p->n, p->v);
    if (!r) {
        st = QN_ERR;
        goto done;
    }
    st = chistory_from_result(r, out);
    if (st != QN_OK)
        chistory_clear(out);
done:
    PQclear(r);
    free(sql);
    return st;
}

qn_status chistory_load_user(pgpool_conn *c, int64_t user_id, int64_t id, chistory *out)
{
    shard_route rt;
    pgparam p = {0};
    memset(out, 0, sizeof(*out));
    if (shard_route_for("t_user_coupon", user_id, &rt) != QN_OK)
        return QN_ERR; /* unreachable: a known table */
    pgparam_i64(&p, user_id);
    pgparam_i64(&p, id);
    return chistory_read(c, &rt.index, 1, "c.user_id = $1 AND c.id = $2", &p, out);
}

qn_status chistory_find(pgpool_conn *c, int ds, int64_t id, chistory *out)
{
    int tables[64];
    size_t n = 0;
    int count = shard_table_count("t_user_coupon");
    pgparam p = {0};
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < count && n < sizeof(tables) / sizeof(tables[0]); i++) {
        shard_route rt;
        if (shard_route_index("t_user_coupon", i, &rt) == QN_OK && rt.ds == ds)
            tables[n++] = i;
    }
    if (n == 0)
        return QN_ENOTFOUND;
    pgparam_i64(&p, id);
    return chistory_read(c, tables, n, "c.id = $1", &p, out);
}

/* ---------------------------------------------------------------- the answer */

static const char *const chistory_statuses[] = {"unused", "locked", "used", "expired", "revoked"};
static const char *const chistory_channels[] = {"claim", "mq", "distribution", "exchangeCode"};

const char *chistory_status_name(int status)
{
    return status >= 0 && status <= UCOUPON_REVOKED ? chistory_statuses[status] : "unknown";
}

const char *chistory_channel_name(int channel)
{
    return channel >= 0 && channel <= UCOUPON_CH_CODE ? chistory_channels[channel] : "unknown";
}

const char *chistory_event_name(int from, int to)
{
    if (to == UCOUPON_EXPIRED)
        return "expired";
    if (to == UCOUPON_REVOKED)
        return "revoked";
    if (from == UCOUPON_UNUSED && to == UCOUPON_LOCKED)
        return "locked";
    if (from == UCOUPON_LOCKED && to == UCOUPON_UNUSED)
        return "unlocked";
    if (from == UCOUPON_LOCKED && to == UCOUPON_USED)
        return "paid";
    if (from == UCOUPON_USED && to == UCOUPON_UNUSED)
        return "refunded";
    return "changed";
}

/* A string, or JSON null when absent. */
static cJSON *chistory_str(int has, const char *s)
{
    return has ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* Adds item to o; false (and item freed) when either is missing. */
static int chistory_add(cJSON *o, const char *name, cJSON *item)
{
    if (!item)
        return 0;
    if (!cJSON_AddItemToObject(o, name, item)) {
        cJSON_Delete(item);
        return 0;
    }
    return 1;
}

static cJSON *chistory_issued_json(const chistory *h)
{
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddStringToObject(e, "event", "issued") ||
        !cJSON_AddStringToObject(e, "channel", chistory_channel_name(h->channel)) ||
        !chistory_add(e, "ref", chistory_str(h->request_id[0] != '\0', h->request_id)) ||
        !chistory_add(e, "time", jsonin_time_to_json(h->receive_time_ms))) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

static cJSON *chistory_change_json(const chistory_change *c)
{
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddStringToObject(e, "event", chistory_event_name(c->from, c->to)) ||
        !cJSON_AddStringToObject(e, "from", chistory_status_name(c->from)) ||
        !cJSON_AddStringToObject(e, "to", chistory_status_name(c->to)) ||
        !chistory_add(e, "ref", chistory_str(c->has_ref, c->ref)) ||
        !chistory_add(e, "actor", chistory_str(c->has_actor, c->actor)) ||
        !chistory_add(e, "discountAmount", jsonin_cents_to_json(c->discount_cents)) ||
        !chistory_add(e, "time", jsonin_time_to_json(c->time_ms))) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

cJSON *chistory_to_json(const chistory *h, int with_user)
{
    cJSON *d = cJSON_CreateObject(), *events = NULL;
    if (!d || !chistory_add(d, "couponId", jsonin_id_to_json(h->id)) ||
        (with_user && !chistory_add(d, "userId", jsonin_id_to_json(h->user_id))) ||
        !chistory_add(d, "couponTemplateId", jsonin_id_to_json(h->template_id)) ||
        !chistory_add(d, "shopNumber", jsonin_id_to_json(h->shop_number)) ||
        !cJSON_AddStringToObject(d, "status", chistory_status_name(h->status)) ||
        !cJSON_AddBoolToObject(d, "truncated", h->truncated) ||
        !(events = cJSON_AddArrayToObject(d, "events")))
        goto fail;
    cJSON *e = chistory_issued_json(h);
    if (!e || !cJSON_AddItemToArray(events, e)) {
        cJSON_Delete(e);
        goto fail;
    }
    for (size_t i = 0; i < h->n; i++) {
        e = chistory_change_json(&h->changes[i]);
        if (!e || !cJSON_AddItemToArray(events, e)) {
            cJSON_Delete(e);
            goto fail;
        }
    }
    return d;
fail:
    cJSON_Delete(d);
    return NULL;
}
