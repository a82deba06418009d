#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "keys.h"
#include "pgparam.h"
#include "redis.h"
#include "redis_sync.h"
#include "shard.h"
#include "template.h"
#include "testhelp.h"

static tpl sample(int64_t id)
{
    tpl t = {0};
    t.id = id;
    t.shop_number = 1810714735922956666LL;
    t.name = strdup("满100减10 \"quoted\"");
    t.source = TPL_SOURCE_SHOP;
    t.target = TPL_TARGET_GOODS;
    t.goods = strdup("G-1");
    t.type = TPL_TYPE_PERCENT;
    t.valid_start_ms = 1767225600000LL; /* 2026-01-01T00:00:00Z */
    t.valid_end_ms = 4102444800000LL;   /* 2100-01-01 */
    t.stock = 100;
    t.receive_rule = strdup("{\"limitPerPerson\":2,\"usageInstructions\":\"x\"}");
    t.consume_rule = strdup("{\"termsOfUse\":100,\"maximumDiscountAmount\":10.5,"
                            "\"discountRate\":0.85,\"validityPeriod\":48}");
    return t;
}

static void test_rules(void)
{
    tpl t = sample(1);
    CHECK(tpl_parse_rules(&t) == QN_OK);
    CHECK_EQ_INT(t.limit_per_person, 2);
    CHECK_EQ_INT(t.terms_cents, 10000);
    CHECK_EQ_INT(t.max_discount_cents, 1050);
    CHECK_EQ_INT(t.discount_rate, 8500);
    CHECK_EQ_INT(t.validity_hours, 48);
    free(t.consume_rule);
    t.consume_rule = strdup("{\"discountRate\":\"0.12345\"}");
    CHECK(tpl_parse_rules(&t) == QN_EINVAL); /* more than 4 decimals */
    free(t.consume_rule);
    t.consume_rule = strdup("{\"discountRate\":1.5}");
    CHECK(tpl_parse_rules(&t) == QN_EINVAL);
    tpl_clear(&t);
}

static void test_ended(void)
{
    static const struct {
        int status;
        int64_t end, now;
        bool want;
    } v[] = {
        {TPL_STATUS_ACTIVE, 1000, 999, false},
        {TPL_STATUS_ACTIVE, 1000, 1000, false}, /* its last millisecond still counts */
        {TPL_STATUS_ACTIVE, 1000, 1001, true},
        {TPL_STATUS_ENDED, 1000, 999, true}, /* terminated before its end */
        {TPL_STATUS_ENDED, 1000, 1001, true},
        {7, 1000, 0, true}, /* a status this build does not know takes nothing */
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        tpl t = {.status = v[i].status, .valid_end_ms = v[i].end};
        if (tpl_ended(&t, v[i].now) != v[i].want)
            printf("  case %zu: status %d, end %lld, now %lld\n", i, v[i].status,
                   (long long)v[i].end, (long long)v[i].now);
        CHECK_EQ_INT(tpl_ended(&t, v[i].now), v[i].want);
    }
}

static void test_json(void)
{
    tpl t = sample(1810966706881941507LL);
    CHECK(tpl_parse_rules(&t) == QN_OK);
    cJSON *j = tpl_to_json(&t);
    char *s = cJSON_PrintUnformatted(j);
    CHECK(strstr(s, "\"id\":\"1810966706881941507\"") != NULL);
    CHECK(strstr(s, "\"shopNumber\":\"1810714735922956666\"") != NULL);
    CHECK(strstr(s, "\"validStartTime\":\"2026-01-01 08:00:00\"") != NULL); /* Asia/Shanghai */
    CHECK(strstr(s, "\"receiveRule\":{\"limitPerPerson\":2") != NULL);
    /* The text written without a tree (the query route's) is the same JSON, key for key. */
    struct evbuffer *b = evbuffer_new();
    CHECK(b && tpl_json_write(b, &t) == 0);
    evbuffer_add(b, "", 1);
    cJSON *w = cJSON_Parse((const char *)evbuffer_pullup(b, -1));
    CHECK(w && cJSON_Compare(w, j, 1));
    cJSON *a = j->child, *x = w ? w->child : NULL;
    for (; a && x; a = a->next, x = x->next) /* and in the same order */
        CHECK_EQ_STR(a->string, x->string);
    CHECK(!a && !x);
    cJSON_Delete(w);
    evbuffer_free(b);
    free(s);
    cJSON_Delete(j);
    tpl_clear(&t);
}

static void test_cache_round_trip(void)
{
    redis_sync *c = redis_sync_new(&(redis_sync_opts){
        .host = getenv("QUAN_REDIS_HOST") ? getenv("QUAN_REDIS_HOST") : "127.0.0.1",
        .port = atoi(th_env("QUAN_REDIS_PORT")),
        .timeout_ms = 2000});
    redis_scripts *sc = redis_scripts_load_dir(th_env("QUAN_LUA_DIR"));
    CHECK(c && sc);
    if (!c || !sc)
        return;
    tpl t = sample(900000000000000000LL + getpid());
    CHECK(tpl_parse_rules(&t) == QN_OK);
    char key[KEYS_LEN], exp[24];
    keys_template(key, t.id);
    snprintf(exp, sizeof(exp), "%" PRId64, t.valid_end_ms);
    const char *argv[1 + 2 * TPL_CACHE_FIELDS];
    tpl_cache_bufs bufs;
    argv[0] = exp;
    int n = tpl_cache_fields(&t, argv + 1, &bufs);
    const char *keys[] = {key};
    redisReply *r = redis_sync_run_script(c, sc, "template_cache_put", 1, keys, n + 1, argv);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
    freeReplyObject(r);
    r = redis_sync_run_script(c, sc, "template_cache_put", 1, keys, n + 1, argv);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 0); /* never overwritten */
    freeReplyObject(r);

    r = redis_sync_command(c, "PEXPIRETIME %s", key);
    CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == t.valid_end_ms);
    freeReplyObject(r);

    r = redis_sync_command(c, "HGETALL %s", key);
    tpl back;
    CHECK(tpl_from_cache(r, &back) == QN_OK);
    CHECK_EQ_INT(back.id, t.id);
    CHECK_EQ_INT(back.shop_number, t.shop_number);
    CHECK_EQ_STR(back.name, t.name);
    CHECK_EQ_STR(back.goods, "G-1");
    CHECK_EQ_INT(back.valid_end_ms, t.valid_end_ms);
    CHECK_EQ_INT(back.discount_rate, 8500);
    tpl_clear(&back);
    freeReplyObject(r);
    /* the claim script's rule numbers, beside the rules */
    r = redis_sync_command(c, "HMGET %s limitPerPerson validityHours", key);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->str &&
          r->element[1]->str);
    if (r && r->elements == 2 && r->element[0]->str && r->element[1]->str) {
        CHECK_EQ_INT(atoi(r->element[0]->str), t.limit_per_person);
        CHECK_EQ_INT(atoi(r->element[1]->str), t.validity_hours);
    }
    freeReplyObject(r);

    /* A partial hash (only stock) is refused, never served. */
    freeReplyObject(redis_sync_command(c, "HDEL %s name", key));
    r = redis_sync_command(c, "HGETALL %s", key);
    CHECK(tpl_from_cache(r, &back) == QN_EINVAL);
    freeReplyObject(r);
    freeReplyObject(redis_sync_command(c, "DEL %s", key));
    r = redis_sync_command(c, "HGETALL %s", key);
    CHECK(tpl_from_cache(r, &back) == QN_ENOTFOUND);
    freeReplyObject(r);

    tpl_clear(&t);
    redis_scripts_free(sc);
    redis_sync_free(c);
}

static void test_db_round_trip(void)
{
    tpl t = sample(910000000000000000LL + getpid());
    CHECK(tpl_parse_rules(&t) == QN_OK);
    shard_route route;
    CHECK(shard_route_for("t_coupon_template", t.shop_number, &route) == QN_OK);
    CHECK_EQ_INT(route.ds, 1); /* shop 1810714735922956666: a vector of test_shard.c */
    pgpool_opts o = {.dsn = th_env(route.ds ? "QUAN_DS1_DSN" : "QUAN_DS0_DSN"), .name = "ds"};
    pgpool_conn *c = pgpool_conn_open(&o);
    CHECK(c && pgpool_conn_ok(c));
    if (!c)
        return;
    CHECK(tpl_db_insert(c, &t) == QN_OK);
    CHECK(tpl_db_insert(c, &t) == QN_ECONFLICT);
    tpl back;
    CHECK(tpl_db_load(c, t.shop_number, t.id, &back) == QN_OK);
    CHECK_EQ_STR(back.name, t.name);
    CHECK_EQ_INT(back.valid_start_ms, t.valid_start_ms);
    CHECK_EQ_INT(back.stock, 100);
    CHECK_EQ_INT(back.limit_per_person, 2);
    CHECK_EQ_INT(back.discount_rate, 8500);
    /* jsonb's own order and spacing, the spaces gone: the answers send these texts as they are */
    CHECK_EQ_STR(back.consume_rule,
                 "{\"termsOfUse\":100,\"discountRate\":0.85,\"validityPeriod\":48,"
                 "\"maximumDiscountAmount\":10.5}");
    CHECK_EQ_STR(back.receive_rule, "{\"limitPerPerson\":2,\"usageInstructions\":\"x\"}");
    tpl_clear(&back);
    CHECK(tpl_db_load(c, t.shop_number + 1, t.id, &back) == QN_ENOTFOUND); /* another shop */
    pgparam p = {0};
    pgparam_i64(&p, t.id);
    char sql[128];
    snprintf(sql, sizeof(sql), "DELETE FROM %s WHERE id = $1", route.table);
    CHECK(pgpool_exec_cmd(c, sql, p.n, p.v, NULL) == QN_OK);
    pgpool_conn_close(c);
    tpl_clear(&t);
}

int main(void)
{
    RUN(test_rules);
    RUN(test_ended);
    RUN(test_json);
    RUN(test_cache_round_trip);
    RUN(test_db_round_trip);
    TEST_MAIN_END();
}
