/*
 * Coupon templates as both services see them: the row (sharded by shop_number), the Redis
 * cache hash, and the API's JSON. merchant-admin writes them; engine, settlement and
 * distribution read them. Money is integer cents, times epoch milliseconds.
 */
#ifndef QUAN_TEMPLATE_H
#define QUAN_TEMPLATE_H

#include <cJSON.h>
#include <event2/buffer.h>
#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stdint.h>

#include "pgparam.h"
#include "pgpool.h"
#include "status.h"

enum { TPL_SOURCE_SHOP = 0, TPL_SOURCE_PLATFORM = 1 };
enum { TPL_TARGET_GOODS = 0, TPL_TARGET_SHOP = 1 };
enum { TPL_TYPE_FIXED = 0, TPL_TYPE_THRESHOLD = 1, TPL_TYPE_PERCENT = 2 };
/* The status is compared and written in statements' text too: each number is written once, as
 * a macro the enum and TPL_STATUS_TEXT are made of (pgparam.h). */
#define TPL_STATUS_ACTIVE_N 0
#define TPL_STATUS_ENDED_N  1 /* terminated, or validEndTime reached */
enum { TPL_STATUS_ACTIVE = TPL_STATUS_ACTIVE_N, TPL_STATUS_ENDED = TPL_STATUS_ENDED_N };
/* A status as text (a statement's, the cache hash's): TPL_STATUS_TEXT(ENDED) is "1". */
#define TPL_STATUS_TEXT(name) PGPARAM_DIGIT_TEXT(TPL_STATUS_##name##_N)

#define TPL_STOCK_MAX   20000000
#define TPL_LIMIT_MAX   1000
#define TPL_NAME_MAX    256
#define TPL_GOODS_MAX   64
#define TPL_BUCKETS_MAX 64    /* stockBuckets (bucket.h's BUCKET_MAX) */
#define TPL_RATE_SCALE  10000 /* discountRate in parts per ten thousand (0.85 = 8500) */

/* One template; strings owned (tpl_clear frees them). */
typedef struct tpl {
    int64_t id;
    int64_t shop_number;
    char *name;
    int source, target, type, status;
    char *goods; /* "" when target is the whole shop */
    int64_t valid_start_ms, valid_end_ms;
    int64_t stock;
    int buckets;        /* stockBuckets: the Redis stock buckets (bucket.h), 1..TPL_BUCKETS_MAX */
    int relayout_from;  /* a change of buckets under way: the number Redis is still laid out
                         * on (the row's buckets_relayout_from); 0 when none */
    char *receive_rule; /* JSON object text, as stored and served */
    char *consume_rule; /* JSON object text */
    /* Parsed from the rules: */
    int limit_per_person;
    int64_t terms_cents;        /* termsOfUse: threshold, 0 when none */
    int64_t max_discount_cents; /* maximumDiscountAmount */
    int discount_rate;          /* fraction paid x TPL_RATE_SCALE (type 2 only), else 0 */
    int validity_hours;         /* validityPeriod of a claimed coupon */
} tpl;

void tpl_clear(tpl *t);

/* true once t takes no claims and issues nothing: terminated, or now_ms past its end. The end
 * millisecond itself still counts, as claim.lua and dist_chunk.lua decide. */
bool tpl_ended(const tpl *t, int64_t now_ms);

/* discountRate as parts per TPL_RATE_SCALE, from a JSON number or decimal string of at most
 * 4 decimals, without floating-point arithmetic on the digits (0.85 -> 8500; 1 -> 10000).
 * 0 when absent (NULL or JSON null); -1 when malformed or above 1. */
int tpl_parse_rate(const cJSON *v);

/* Reads limit_per_person and the consume-rule numbers from t->receive_rule / t->consume_rule. */
qn_status tpl_parse_rules(tpl *t) QN_MUSTCHECK;

/* Database. The connection must be the shard's (ds of shard_route_for("t_coupon_template",
 * shop)). load: QN_ENOTFOUND when absent or of another shop. */
qn_status tpl_db_load(pgpool_conn *c, int64_t shop_number, int64_t id, tpl *out) QN_MUSTCHECK;
qn_status tpl_db_insert(pgpool_conn *c, const tpl *t) QN_MUSTCHECK;
/* Row of a SELECT of TPL_DB_COLUMNS into out (strings copied). */
#define TPL_DB_COLUMNS                                                                             \
    "id, name, shop_number, source, target, coalesce(goods, ''), type, "                           \
    "(extract(epoch from valid_start_time) * 1000)::bigint, "                                      \
    "(extract(epoch from valid_end_time) * 1000)::bigint, stock, receive_rule::text, "             \
    "consume_rule::text, status, stock_buckets, coalesce(buckets_relayout_from, 0)"
qn_status tpl_from_row(const PGresult *r, int row, tpl *out) QN_MUSTCHECK;

/* Cache: the hash quan:tpl:{id} (keys.h) holds every field as text, times in epoch ms, and the
 * two rule numbers the claim script needs, limitPerPerson and validityHours, beside the rules'
 * JSON: reading two numbers costs a script less than decoding two JSON objects on every call
 * (claim.lua decodes the JSON when a hash written before them lacks them).
 * tpl_cache_fields fills argv with "field", "value" pairs (values point into bufs, which must
 * live as long as argv); returns the number of strings (at most 2 x TPL_CACHE_FIELDS: the two
 * numbers only once the rules are parsed); argv needs that many slots. The field "buckets" is
 * the template's stockBuckets: every bucket's hash carries it (bucket.h), and a hash without it
 * (written before buckets) has one. */
#define TPL_CACHE_FIELDS 16
typedef struct tpl_cache_bufs {
    char num[12][24];
} tpl_cache_bufs;
int tpl_cache_fields(const tpl *t, const char **argv, tpl_cache_bufs *bufs);
/* From an HGETALL reply; QN_ENOTFOUND when empty, QN_EINVAL when a field is missing. */
qn_status tpl_from_cache(const redisReply *hgetall, tpl *out) QN_MUSTCHECK;

/* The API's JSON (docs/api.md): ids as strings, times "yyyy-MM-dd HH:mm:ss", rules as objects. */
cJSON *tpl_to_json(const tpl *t);
/* The same object as JSON text appended to b, without a tree (an http_data_writer; arg is the
 * const tpl *, whose rules parsed when it was loaded). 0, or -1 when b could not grow. */
int tpl_json_write(struct evbuffer *b, const void *arg);

#endif
