/*
 * Fuzz target: request bodies through jsonin_parse and the typed readers of common/core/jsonin, the
 * way the services read them (template and task creation, claims, the settlement's order and
 * goodsList), then every reader over every field whatever its type. Beyond "no crash, no
 * sanitizer report", what a reader accepts must survive the trip out and back in: a time
 * formatted and parsed again, cents written as a JSON number and read again, an id written
 * as a string and read again, a rule's discountRate as merchant-admin stores it.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "discount.h"
#include "jsonin.h"
#include "template.h"

/* A broken property: abort, so that libFuzzer keeps the input. */
/* A value accepted as a time reads back from its own "yyyy-MM-dd HH:mm:ss" as the same second
 * (the format drops milliseconds, rounding toward the past; years outside 1-9999 are clamped
 * to text that need not read back). */
static void time_round_trip(int64_t ms)
{
    char buf[JSONIN_TIME_LEN];
    int64_t back;
    jsonin_time_format(ms, buf);
    if (jsonin_time_parse(buf, &back) == QN_OK && strncmp(buf, "0000", 4) != 0 &&
        strcmp(buf, "9999-12-31 23:59:59") != 0)
        PROPERTY(back == ms - ((ms % 1000 + 1000) % 1000));
}

/* Cents as the API answers them (a JSON number in yuan) read back as the same cents: exact
 * below 10^15 cents, far beyond any amount the services accept. */
static void money_round_trip(int64_t cents)
{
    if (cents <= -1000000000000000LL || cents >= 1000000000000000LL)
        return;
    cJSON *o = cJSON_CreateObject(), *n = jsonin_cents_to_json(cents);
    if (!o || !n) {
        cJSON_Delete(o);
        cJSON_Delete(n);
        return;
    }
    cJSON_AddItemToObject(o, "a", n);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text)
        return;
    jsonin_err err;
    cJSON *back = jsonin_parse(text, strlen(text), &err);
    int64_t v = 0;
    PROPERTY(back != NULL);
    PROPERTY(jsonin_money_cents(back, "a", JSONIN_REQUIRED, 0, INT64_MIN, INT64_MAX, &v, &err) ==
             QN_OK);
    PROPERTY(v == cents);
    cJSON_Delete(back);
    free(text);
}

static void id_round_trip(int64_t id)
{
    cJSON *o = cJSON_CreateObject(), *s = jsonin_id_to_json(id);
    if (!o || !s) {
        cJSON_Delete(o);
        cJSON_Delete(s);
        return;
    }
    cJSON_AddItemToObject(o, "id", s);
    int64_t v = 0;
    jsonin_err err;
    PROPERTY(jsonin_int64(o, "id", JSONIN_REQUIRED, 0, INT64_MIN, INT64_MAX, &v, &err) == QN_OK);
    PROPERTY(v == id);
    cJSON_Delete(o);
}

/* merchant-admin's /coupon-template/create, reader by reader. */
static void template_create(const cJSON *b)
{
    static const int src[] = {0, 1}, tgt[] = {0, 1}, types[] = {0, 1, 2};
    jsonin_err err;
    const char *name, *goods, *usage, *expl;
    int source, target, type;
    int64_t start, end, stock, limit, terms, maxd, validity;
    cJSON *rr = NULL, *cr = NULL;

    if (jsonin_string(b, "name", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, TPL_NAME_MAX, &name,
                      &err) ||
        jsonin_enum_int(b, "source", JSONIN_REQUIRED, 0, src, 2, &source, &err) ||
        jsonin_enum_int(b, "target", JSONIN_REQUIRED, 0, tgt, 2, &target, &err) ||
        jsonin_string(b, "goods", JSONIN_OPTIONAL, 0, TPL_GOODS_MAX, &goods, &err) ||
        jsonin_enum_int(b, "type", JSONIN_REQUIRED, 0, types, 3, &type, &err))
        return;
    if (jsonin_time_ms(b, "validStartTime", JSONIN_REQUIRED, 0, &start, &err) == QN_OK)
        time_round_trip(start);
    if (jsonin_time_ms(b, "validEndTime", JSONIN_REQUIRED, 0, &end, &err) == QN_OK)
        time_round_trip(end);
    (void)jsonin_int64(b, "stock", JSONIN_REQUIRED, 0, 1, TPL_STOCK_MAX, &stock, &err);

    if (jsonin_object(b, "receiveRule", JSONIN_REQUIRED, &rr, &err) ||
        jsonin_object(b, "consumeRule", JSONIN_REQUIRED, &cr, &err))
        goto done;
    if (jsonin_int64(rr, "limitPerPerson", JSONIN_REQUIRED, 0, 1, TPL_LIMIT_MAX, &limit, &err) ||
        jsonin_string(rr, "usageInstructions", JSONIN_OPTIONAL, 0, 1024, &usage, &err))
        jsonin_err_prefix(&err, "receiveRule");
    if (jsonin_money_cents(cr, "termsOfUse", JSONIN_OPTIONAL, -1, 0, 10000000000LL, &terms, &err) ==
        QN_OK)
        money_round_trip(terms);
    if (jsonin_money_cents(cr, "maximumDiscountAmount", JSONIN_REQUIRED, 0, 1, 10000000000LL, &maxd,
                           &err) == QN_OK)
        money_round_trip(maxd);
    if (jsonin_string(cr, "explanationOfUnmetConditions", JSONIN_OPTIONAL, 0, 1024, &expl, &err) ||
        jsonin_int64(cr, "validityPeriod", JSONIN_REQUIRED, 0, 1, 87600, &validity, &err))
        jsonin_err_prefix(&err, "consumeRule");

    /* The rate as merchant-admin normalises it ((double)rate / scale in the stored rule) is
     * what every service reads back. */
    int rate = tpl_parse_rate(cJSON_GetObjectItemCaseSensitive(cr, "discountRate"));
    PROPERTY(rate >= -1 && rate <= TPL_RATE_SCALE);
    if (rate > 0 && rate < TPL_RATE_SCALE) {
        cJSON *n = cJSON_CreateNumber((double)rate / TPL_RATE_SCALE);
        if (n)
            PROPERTY(tpl_parse_rate(n) == rate);
        cJSON_Delete(n);
    }
    /* The stored rule texts, read back as the engine and settlement read them. */
    tpl t = {0};
    t.receive_rule = cJSON_PrintUnformatted(rr);
    t.consume_rule = cJSON_PrintUnformatted(cr);
    if (t.receive_rule && t.consume_rule)
        (void)tpl_parse_rules(&t);
    free(t.receive_rule);
    free(t.consume_rule);
done:
    cJSON_Delete(rr);
    cJSON_Delete(cr);
}

/* merchant-admin's /coupon-task/create; distribution's notify reads notifyType the same way. */
static void task_create(const cJSON *b)
{
    static const int notify_allowed[] = {0, 1, 2, 3}, send_types[] = {0, 1};
    jsonin_err err;
    const char *name, *addr;
    int notify[4], send_type = 0;
    size_t n_notify = 0;
    int64_t tpl_id, send_time;

    (void)jsonin_string(b, "taskName", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, 128, &name, &err);
    (void)jsonin_string(b, "fileAddress", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, 512, &addr, &err);
    if (jsonin_int_list_csv(b, "notifyType", JSONIN_REQUIRED, notify_allowed, 4, notify, 4,
                            &n_notify, &err) == QN_OK) {
        PROPERTY(n_notify <= 4);
        for (size_t i = 0; i < n_notify; i++) {
            PROPERTY(notify[i] >= 0 && notify[i] <= 3);
            for (size_t j = 0; j < i; j++)
                PROPERTY(notify[i] != notify[j]);
        }
    }
    if (jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &tpl_id, &err) ==
        QN_OK)
        id_round_trip(tpl_id);
    (void)jsonin_enum_int(b, "sendType", JSONIN_REQUIRED, 0, send_types, 2, &send_type, &err);
    if (jsonin_time_ms(b, "sendTime", send_type ? JSONIN_REQUIRED : JSONIN_OPTIONAL, 0, &send_time,
                       &err) == QN_OK)
        time_round_trip(send_time);
}

/* The settlement's /coupon-query and the engine's claims and payments. */
static void order_and_claim(const cJSON *b)
{
    jsonin_err err;
    int64_t amount, shop, tpl_id;
    const char *rid;
    discount_goods *goods = NULL;
    size_t n_goods = 0;

    if (jsonin_money_cents(b, "orderAmount", JSONIN_REQUIRED, 0, 0, DISCOUNT_MAX_CENTS, &amount,
                           &err) == QN_OK)
        money_round_trip(amount);
    if (jsonin_int64(b, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &shop, &err) == QN_OK)
        id_round_trip(shop);
    (void)jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &tpl_id, &err);
    (void)jsonin_string(b, "requestId", JSONIN_OPTIONAL | JSONIN_NOT_BLANK, 1, 64, &rid, &err);
    if (discount_read_goods(b, &goods, &n_goods, &err) == QN_OK) {
        PROPERTY(n_goods <= DISCOUNT_MAX_GOODS && (n_goods == 0) == (goods == NULL));
        for (size_t i = 0; i < n_goods; i++) {
            PROPERTY(goods[i].goods_number != NULL);
            PROPERTY(goods[i].amount_cents >= 0 && goods[i].amount_cents <= DISCOUNT_MAX_CENTS);
        }
    }
    free(goods);
}

/* Every reader on one field, whatever its JSON type. */
static void every_reader(const cJSON *obj, const char *field)
{
    static const int allowed[] = {0, 1, 2, 3};
    jsonin_err err;
    int64_t v;
    int iv, list[4];
    size_t n;
    const char *s;
    cJSON *o = NULL;

    if (jsonin_int64(obj, field, JSONIN_REQUIRED, 0, INT64_MIN, INT64_MAX, &v, &err) == QN_OK)
        id_round_trip(v);
    (void)jsonin_int(obj, field, JSONIN_OPTIONAL, 7, -5, 5, &iv, &err);
    (void)jsonin_enum_int(obj, field, JSONIN_OPTIONAL, -1, allowed, 4, &iv, &err);
    if (jsonin_money_cents(obj, field, JSONIN_REQUIRED, 0, INT64_MIN, INT64_MAX, &v, &err) == QN_OK)
        money_round_trip(v);
    if (jsonin_time_ms(obj, field, JSONIN_REQUIRED, 0, &v, &err) == QN_OK)
        time_round_trip(v);
    (void)jsonin_string(obj, field, JSONIN_REQUIRED | JSONIN_NOT_BLANK, 2, 8, &s, &err);
    if (jsonin_object(obj, field, JSONIN_OPTIONAL, &o, &err) == QN_OK)
        cJSON_Delete(o);
    (void)jsonin_int_list_csv(obj, field, JSONIN_REQUIRED, allowed, 4, list, 4, &n, &err);
    jsonin_err_prefix(&err, field);

    /* The same text as a query-string value. */
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (cJSON_IsString(it)) {
        const char *q = it->valuestring;
        (void)jsonin_parse_int64_str(field, q, JSONIN_REQUIRED, 0, 1, INT64_MAX, &v, &err);
        (void)jsonin_parse_enum_str(field, q, JSONIN_OPTIONAL, -1, allowed, 4, &iv, &err);
        if (jsonin_parse_money_str(field, q, JSONIN_REQUIRED, 0, INT64_MIN, INT64_MAX, &v, &err) ==
            QN_OK)
            money_round_trip(v);
        if (jsonin_parse_time_str(field, q, JSONIN_REQUIRED, 0, &v, &err) == QN_OK)
            time_round_trip(v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jsonin_err err;
    cJSON *root = jsonin_parse((const char *)data, size, &err);
    if (!root)
        return 0;
    template_create(root);
    task_create(root);
    order_and_claim(root);
    const cJSON *it;
    if (cJSON_IsObject(root)) {
        cJSON_ArrayForEach(it, root)
        {
            if (it->string)
                every_reader(root, it->string);
            /* Nested objects too: rules and goods items are read one level down. */
            if (cJSON_IsObject(it)) {
                const cJSON *in;
                cJSON_ArrayForEach(in, it)
                {
                    if (in->string)
                        every_reader(it, in->string);
                }
            }
        }
    }
    cJSON_Delete(root);
    return 0;
}
