#include "template.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonin.h"
#include "jsonout.h"
#include "pgparam.h"
#include "shard.h"

static char *tpl_strdup(const char *s)
{
    return strdup(s ? s : "");
}

/* A rule's JSON text, kept without the whitespace between its tokens: the answers send it as
 * it is, and a rule read from PostgreSQL's jsonb has a space after every colon and comma. */
static char *tpl_rule_dup(const char *s)
{
    char *d = tpl_strdup(s);
    if (d)
        jsonout_squeeze(d);
    return d;
}

void tpl_clear(tpl *t)
{
    if (!t)
        return;
    free(t->name);
    free(t->goods);
    free(t->receive_rule);
    free(t->consume_rule);
    memset(t, 0, sizeof(*t));
}

bool tpl_ended(const tpl *t, int64_t now_ms)
{
    return t->status != TPL_STATUS_ACTIVE || now_ms > t->valid_end_ms;
}

int tpl_parse_rate(const cJSON *v)
{
    char text[64];
    if (!v || cJSON_IsNull(v))
        return 0;
    if (cJSON_IsNumber(v))
        snprintf(text, sizeof(text), "%.15g", v->valuedouble);
    else if (cJSON_IsString(v))
        snprintf(text, sizeof(text), "%s", v->valuestring);
    else
        return -1;
    const char *p = text;
    long whole = 0, frac = 0;
    int digits = 0;
    if (*p < '0' || *p > '9')
        return -1;
    while (*p >= '0' && *p <= '9' && whole < 10)
        whole = whole * 10 + (*p++ - '0');
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++) {
            if (++digits > 4)
                return -1;
            frac = frac * 10 + (*p - '0');
        }
    }
    if (*p != '\0' || whole >= 1)
        return whole == 1 && frac == 0 && *p == '\0' ? TPL_RATE_SCALE : -1;
    while (digits++ < 4)
        frac *= 10;
    return (int)frac;
}

qn_status tpl_parse_rules(tpl *t)
{
    qn_status st = QN_EINVAL;
    jsonin_err err;
    int64_t v;
    cJSON *rr = cJSON_Parse(t->receive_rule ? t->receive_rule : "{}");
    cJSON *cr = cJSON_Parse(t->consume_rule ? t->consume_rule : "{}");
    if (!rr || !cr)
        goto done;
    if (jsonin_int64(rr, "limitPerPerson", JSONIN_OPTIONAL, 1, 1, TPL_LIMIT_MAX, &v, &err))
        goto done;
    t->limit_per_person = (int)v;
    if (jsonin_money_cents(cr, "termsOfUse", JSONIN_OPTIONAL, 0, 0, INT64_MAX / 2, &t->terms_cents,
                           &err) ||
        jsonin_money_cents(cr, "maximumDiscountAmount", JSONIN_OPTIONAL, 0, 0, INT64_MAX / 2,
                           &t->max_discount_cents, &err))
        goto done;
    if (jsonin_int64(cr, "validityPeriod", JSONIN_OPTIONAL, 24, 1, 24 * 365 * 10, &v, &err))
        goto done;
    t->validity_hours = (int)v;
    t->discount_rate = tpl_parse_rate(cJSON_GetObjectItemCaseSensitive(cr, "discountRate"));
    if (t->discount_rate < 0)
        goto done;
    st = QN_OK;
done:
    cJSON_Delete(rr);
    cJSON_Delete(cr);
    return st;
}

/* ---- database ---- */

qn_status tpl_from_row(const PGresult *r, int row, tpl *out)
{
    memset(out, 0, sizeof(*out));
    out->id = strtoll(PQgetvalue(r, row, 0), NULL, 10);
    out->name = tpl_strdup(PQgetvalue(r, row, 1));
    out->shop_number = strtoll(PQgetvalue(r, row, 2), NULL, 10);
    out->source = atoi(PQgetvalue(r, row, 3));
    out->target = atoi(PQgetvalue(r, row, 4));
    out->goods = tpl_strdup(PQgetvalue(r, row, 5));
    out->type = atoi(PQgetvalue(r, row, 6));
    out->valid_start_ms = strtoll(PQgetvalue(r, row, 7), NULL, 10);
    out->valid_end_ms = strtoll(PQgetvalue(r, row, 8), NULL, 10);
    out->stock = strtoll(PQgetvalue(r, row, 9), NULL, 10);
    out->receive_rule = tpl_rule_dup(PQgetvalue(r, row, 10));
    out->consume_rule = tpl_rule_dup(PQgetvalue(r, row, 11));
    out->status = atoi(PQgetvalue(r, row, 12));
    out->buckets = atoi(PQgetvalue(r, row, 13));
    out->relayout_from = atoi(PQgetvalue(r, row, 14));
    if (!out->name || !out->goods || !out->receive_rule || !out->consume_rule) {
        tpl_clear(out);
        return QN_ENOMEM;
    }
    return tpl_parse_rules(out);
}

qn_status tpl_db_load(pgpool_conn *c, int64_t shop_number, int64_t id, tpl *out)
{
    char sql[512];
    pgparam p = {0};
    shard_route route;
    if (shard_route_for("t_coupon_template", shop_number, &route) != QN_OK)
        return QN_EINVAL;
    snprintf(sql, sizeof(sql),
             "SELECT " TPL_DB_COLUMNS
             " FROM %s WHERE shop_number = $1 AND id = $2 AND del_flag = 0",
             route.table);
    pgparam_i64(&p, shop_number);
    pgparam_i64(&p, id);
    PGresult *r = pgpool_exec(c, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    qn_status st = PQntuples(r) == 1 ? tpl_from_row(r, 0, out) : QN_ENOTFOUND;
    PQclear(r);
    return st;
}

qn_status tpl_db_insert(pgpool_conn *c, const tpl *t)
{
    char sql[640];
    shard_route route;
    if (shard_route_for("t_coupon_template", t->shop_number, &route) != QN_OK)
        return QN_EINVAL;
    snprintf(sql, sizeof(sql),
             "INSERT INTO %s (id, name, shop_number, source, target, goods, type, "
             "valid_start_time, valid_end_time, stock, receive_rule, consume_rule, status, "
             "stock_buckets) "
             "VALUES ($1, $2, $3, $4, $5, nullif($6, ''), $7, to_timestamp($8::bigint / 1000.0), "
             "to_timestamp($9::bigint / 1000.0), $10, $11::jsonb, $12::jsonb, $13, $14)",
             route.table);
    pgparam p = {0};
    pgparam_i64(&p, t->id);
    pgparam_str(&p, t->name);
    pgparam_i64(&p, t->shop_number);
    pgparam_i64(&p, t->source);
    pgparam_i64(&p, t->target);
    pgparam_str(&p, t->goods ? t->goods : "");
    pgparam_i64(&p, t->type);
    pgparam_i64(&p, t->valid_start_ms);
    pgparam_i64(&p, t->valid_end_ms);
    pgparam_i64(&p, t->stock);
    pgparam_str(&p, t->receive_rule);
    pgparam_str(&p, t->consume_rule);
    pgparam_i64(&p, t->status);
    pgparam_i64(&p, t->buckets >= 1 ? t->buckets : 1);
    return pgpool_exec_cmd(c, sql, p.n, p.v, NULL);
}

/* ---- cache ---- */

/* The fields tpl_from_cache needs: all but the two rule numbers, which the rules give. */
#define TPL_CACHE_NEEDED 13

int tpl_cache_fields(const tpl *t, const char **argv, tpl_cache_bufs *b)
{
    snprintf(b->num[0], sizeof(b->num[0]), "%" PRId64, t->id);
    snprintf(b->num[1], sizeof(b->num[1]), "%" PRId64, t->shop_number);
    snprintf(b->num[2], sizeof(b->num[2]), "%d", t->source);
    snprintf(b->num[3], sizeof(b->num[3]), "%d", t->target);
    snprintf(b->num[4], sizeof(b->num[4]), "%d", t->type);
    snprintf(b->num[5], sizeof(b->num[5]), "%" PRId64, t->valid_start_ms);
    snprintf(b->num[6], sizeof(b->num[6]), "%" PRId64, t->valid_end_ms);
    snprintf(b->num[7], sizeof(b->num[7]), "%" PRId64, t->stock);
    snprintf(b->num[8], sizeof(b->num[8]), "%d", t->status);
    snprintf(b->num[11], sizeof(b->num[11]), "%d", t->buckets >= 1 ? t->buckets : 1);
    /* the fields in pairs, as they go to Redis */
    /* clang-format off */
    const char *pairs[2 * TPL_CACHE_FIELDS] = {
        "id",           b->num[0],       "shopNumber",     b->num[1],
        "name",         t->name,         "source",         b->num[2],
        "target",       b->num[3],       "goods",          t->goods ? t->goods : "",
        "type",         b->num[4],       "validStartTime", b->num[5],
        "validEndTime", b->num[6],       "stock",          b->num[7],
        "receiveRule",  t->receive_rule, "consumeRule",    t->consume_rule,
        "status",       b->num[8],       "buckets",        b->num[11],
        "limitPerPerson", b->num[9],     "validityHours",  b->num[10]};
    /* clang-format on */
    int n = 2 * TPL_CACHE_FIELDS;
    if (t->limit_per_person >= 1 && t->validity_hours >= 1) {
        snprintf(b->num[9], sizeof(b->num[9]), "%d", t->limit_per_person);
        snprintf(b->num[10], sizeof(b->num[10]), "%d", t->validity_hours);
    } else {
        n -= 4; /* rules not parsed: claim.lua reads the JSON */
    }
    memcpy(argv, pairs, (size_t)n * sizeof(*pairs));
    return n;
}

qn_status tpl_from_cache(const redisReply *h, tpl *out)
{
    memset(out, 0, sizeof(*out));
    if (!h || h->type != REDIS_REPLY_ARRAY || h->elements == 0)
        return QN_ENOTFOUND;
    unsigned seen = 0;
    out->buckets = 1; /* a hash written before buckets */
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const char *k = h->element[i]->str, *v = h->element[i + 1]->str;
        if (!k || !v)
            continue;
        if (!strcmp(k, "id"))
            out->id = strtoll(v, NULL, 10), seen |= 1u << 0;
        else if (!strcmp(k, "shopNumber"))
            out->shop_number = strtoll(v, NULL, 10), seen |= 1u << 1;
        else if (!strcmp(k, "name"))
            out->name = tpl_strdup(v), seen |= 1u << 2;
        else if (!strcmp(k, "source"))
            out->source = atoi(v), seen |= 1u << 3;
        else if (!strcmp(k, "target"))
            out->target = atoi(v), seen |= 1u << 4;
        else if (!strcmp(k, "goods"))
            out->goods = tpl_strdup(v), seen |= 1u << 5;
        else if (!strcmp(k, "type"))
            out->type = atoi(v), seen |= 1u << 6;
        else if (!strcmp(k, "validStartTime"))
            out->valid_start_ms = strtoll(v, NULL, 10), seen |= 1u << 7;
        else if (!strcmp(k, "validEndTime"))
            out->valid_end_ms = strtoll(v, NULL, 10), seen |= 1u << 8;
        else if (!strcmp(k, "stock"))
            out->stock = strtoll(v, NULL, 10), seen |= 1u << 9;
        else if (!strcmp(k, "receiveRule"))
            out->receive_rule = tpl_rule_dup(v), seen |= 1u << 10;
        else if (!strcmp(k, "consumeRule"))
            out->consume_rule = tpl_rule_dup(v), seen |= 1u << 11;
        else if (!strcmp(k, "status"))
            out->status = atoi(v), seen |= 1u << 12;
        else if (!strcmp(k, "buckets"))
            out->buckets = atoi(v) >= 1 ? atoi(v) : 1;
    }
    if (seen != (1u << TPL_CACHE_NEEDED) - 1) {
        tpl_clear(out);
        return QN_EINVAL; /* a partial hash (e.g. only "stock") is never served */
    }
    qn_status st = tpl_parse_rules(out);
    if (st != QN_OK)
        tpl_clear(out);
    return st;
}

/* ---- JSON ---- */

static cJSON *tpl_rule_json(const char *text)
{
    cJSON *o = cJSON_Parse(text ? text : "{}");
    return o ? o : cJSON_CreateObject();
}

/* A rule as stored: it parsed when the template was loaded (tpl_parse_rules). */
static int tpl_rule_write(struct evbuffer *b, const char *text)
{
    return jsonout_raw(b, text && *text ? text : "{}");
}

static int tpl_time_write(struct evbuffer *b, int64_t ms)
{
    char buf[JSONIN_TIME_LEN];
    jsonin_time_format(ms, buf);
    return jsonout_str(b, buf);
}

int tpl_json_write(struct evbuffer *b, const void *arg)
{
    const tpl *t = arg;
    return evbuffer_add(b, "{", 1) || jsonout_key(b, "id", 1) || jsonout_id(b, t->id) ||
                   jsonout_key(b, "name", 0) || jsonout_str(b, t->name) ||
                   jsonout_key(b, "shopNumber", 0) || jsonout_id(b, t->shop_number) ||
                   jsonout_key(b, "source", 0) || jsonout_i64(b, t->source) ||
                   jsonout_key(b, "target", 0) || jsonout_i64(b, t->target) ||
                   jsonout_key(b, "goods", 0) || jsonout_str(b, t->goods) ||
                   jsonout_key(b, "type", 0) || jsonout_i64(b, t->type) ||
                   jsonout_key(b, "validStartTime", 0) || tpl_time_write(b, t->valid_start_ms) ||
                   jsonout_key(b, "validEndTime", 0) || tpl_time_write(b, t->valid_end_ms) ||
                   jsonout_key(b, "stock", 0) || jsonout_i64(b, t->stock) ||
                   jsonout_key(b, "receiveRule", 0) || tpl_rule_write(b, t->receive_rule) ||
                   jsonout_key(b, "consumeRule", 0) || tpl_rule_write(b, t->consume_rule) ||
                   jsonout_key(b, "status", 0) || jsonout_i64(b, t->status) ||
                   jsonout_key(b, "stockBuckets", 0) ||
                   jsonout_i64(b, t->buckets >= 1 ? t->buckets : 1) ||
                   (t->relayout_from > 0 && (jsonout_key(b, "stockBucketsChangingFrom", 0) ||
                                             jsonout_i64(b, t->relayout_from))) ||
                   evbuffer_add(b, "}", 1)
               ? -1
               : 0;
}

cJSON *tpl_to_json(const tpl *t)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddItemToObject(o, "id", jsonin_id_to_json(t->id));
    cJSON_AddStringToObject(o, "name", t->name ? t->name : "");
    cJSON_AddItemToObject(o, "shopNumber", jsonin_id_to_json(t->shop_number));
    cJSON_AddNumberToObject(o, "source", t->source);
    cJSON_AddNumberToObject(o, "target", t->target);
    cJSON_AddStringToObject(o, "goods", t->goods ? t->goods : "");
    cJSON_AddNumberToObject(o, "type", t->type);
    cJSON_AddItemToObject(o, "validStartTime", jsonin_time_to_json(t->valid_start_ms));
    cJSON_AddItemToObject(o, "validEndTime", jsonin_time_to_json(t->valid_end_ms));
    cJSON_AddNumberToObject(o, "stock", (double)t->stock);
    cJSON_AddItemToObject(o, "receiveRule", tpl_rule_json(t->receive_rule));
    cJSON_AddItemToObject(o, "consumeRule", tpl_rule_json(t->consume_rule));
    cJSON_AddNumberToObject(o, "status", t->status);
    cJSON_AddNumberToObject(o, "stockBuckets", t->buckets >= 1 ? t->buckets : 1);
    if (t->relayout_from > 0) /* a change of buckets under way (absent when none) */
        cJSON_AddNumberToObject(o, "stockBucketsChangingFrom", t->relayout_from);
    return o;
}
