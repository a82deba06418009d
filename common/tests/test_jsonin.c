#include <stdint.h>
#include <time.h>

#include "jsonin.h"
#include "testhelp.h"

/* {"<field>": <value>} parsed the way handlers parse bodies. */
static cJSON *body1(const char *field, const char *value)
{
    char text[512];
    jsonin_err e = {""};
    snprintf(text, sizeof(text), "{\"%s\":%s}", field, value);
    cJSON *r = jsonin_parse(text, strlen(text), &e);
    if (!r)
        printf("  parse failed: %s: %s\n", text, e.msg);
    return r;
}

/* Epoch ms of a UTC civil time, computed by glibc (independent of jsonin). */
static int64_t utc_ms(int y, int mo, int d, int h, int mi, int s)
{
    struct tm tm = {0};
    tm.tm_year = y - 1900, tm.tm_mon = mo - 1, tm.tm_mday = d;
    tm.tm_hour = h, tm.tm_min = mi, tm.tm_sec = s;
    return (int64_t)timegm(&tm) * 1000;
}

#define NOMSG NULL

typedef struct {
    const char *value; /* JSON text of the field's value; NULL = field missing */
    unsigned flags;
    int64_t min, max;
    qn_status st;
    int64_t want;
    const char *msg;
} int_case;

static void test_int64_table(void)
{
    static const int_case cases[] = {
        {"\"1810966706881941507\"", 1, 1, INT64_MAX, QN_OK, 1810966706881941507LL, NOMSG},
        /* a JSON number beyond 2^53 is exact through jsonin_parse */
        {"1810966706881941507", 1, 1, INT64_MAX, QN_OK, 1810966706881941507LL, NOMSG},
        {"-1810966706881941507", 1, INT64_MIN, INT64_MAX, QN_OK, -1810966706881941507LL, NOMSG},
        {"9007199254740993", 1, 1, INT64_MAX, QN_OK, 9007199254740993LL, NOMSG},
        {"42", 1, 1, 100, QN_OK, 42, NOMSG},
        {"\"42\"", 1, 1, 100, QN_OK, 42, NOMSG},
        {"1e2", 1, 1, 1000, QN_OK, 100, NOMSG},
        {"7.0", 1, 1, 1000, QN_OK, 7, NOMSG},
        {"\"9223372036854775807\"", 1, INT64_MIN, INT64_MAX, QN_OK, INT64_MAX, NOMSG},
        {"\"-9223372036854775808\"", 1, INT64_MIN, INT64_MAX, QN_OK, INT64_MIN, NOMSG},
        {"\"9223372036854775808\"", 1, INT64_MIN, INT64_MAX, QN_EINVAL, 0,
         "n: must be a 64-bit integer"},
        {"\"99999999999999999999999\"", 1, 1, 100, QN_EINVAL, 0, "n: must be between 1 and 100"},
        {"0", 1, 1, 20000000, QN_EINVAL, 0, "n: must be between 1 and 20000000"},
        {"20000001", 1, 1, 20000000, QN_EINVAL, 0, "n: must be between 1 and 20000000"},
        {"20000000", 1, 1, 20000000, QN_OK, 20000000, NOMSG},
        {"\"-5\"", 1, 0, INT64_MAX, QN_EINVAL, 0, "n: must be at least 0"},
        {"5", 1, INT64_MIN, 3, QN_EINVAL, 0, "n: must be at most 3"},
        {"1.5", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"\"1.5\"", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"\"1e2\"", 1, 0, 1000, QN_EINVAL, 0, "n: must be an integer"},
        {"\"+5\"", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"\" 5\"", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"\"5 \"", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"\"-\"", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"true", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"[1]", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"{}", 1, 0, 10, QN_EINVAL, 0, "n: must be an integer"},
        {"1e300", 1, 0, 10, QN_EINVAL, 0, "n: must be between 0 and 10"},
        /* absent: missing, null, "" */
        {NULL, 1, 0, 10, QN_EINVAL, 0, "n: required"},
        {"null", 1, 0, 10, QN_EINVAL, 0, "n: required"},
        {"\"\"", 1, 0, 10, QN_EINVAL, 0, "n: required"},
        {NULL, 0, 0, 10, QN_OK, -77, NOMSG},
        {"null", 0, 0, 10, QN_OK, -77, NOMSG},
        {"\"\"", 0, 0, 10, QN_OK, -77, NOMSG},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int_case *c = &cases[i];
        cJSON *o = c->value ? body1("n", c->value) : body1("other", "1");
        int64_t v = 123456;
        jsonin_err e = {""};
        qn_status st = jsonin_int64(o, "n", c->flags, -77, c->min, c->max, &v, &e);
        if (st != c->st || (st == QN_OK && v != c->want) || (c->msg && strcmp(e.msg, c->msg))) {
            printf("  case %zu (%s): st %d v %lld msg \"%s\"\n", i, c->value ? c->value : "-", st,
                   (long long)v, e.msg);
            th_case_failed = 1;
        }
        if (st != QN_OK && v != 123456) {
            printf("  case %zu: out written on failure\n", i);
            th_case_failed = 1;
        }
        cJSON_Delete(o);
    }
}

static void test_int64_plain_cjson_big_number(void)
{
    /* Without jsonin_parse, cJSON has already rounded the number: refuse, say why. */
    cJSON *o = cJSON_Parse("{\"couponTemplateId\":1810966706881941507,\"small\":123}");
    int64_t v = 0;
    jsonin_err e = {""};
    CHECK(o != NULL);
    CHECK(jsonin_int64(o, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &v, &e) ==
          QN_EINVAL);
    CHECK(strstr(e.msg, "couponTemplateId: ") == e.msg);
    CHECK(strstr(e.msg, "string") != NULL);
    /* with small bounds the range message is the useful one */
    CHECK(jsonin_int64(o, "couponTemplateId", JSONIN_REQUIRED, 0, 1, 1000, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "couponTemplateId: must be between 1 and 1000");
    CHECK(jsonin_int64(o, "small", JSONIN_REQUIRED, 0, 1, INT64_MAX, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 123);
    cJSON_Delete(o);

    o = cJSON_Parse("{\"a\":9007199254740992}"); /* 2^53 itself is exact */
    CHECK(jsonin_int64(o, "a", JSONIN_REQUIRED, 0, 0, INT64_MAX, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 9007199254740992LL);
    cJSON_Delete(o);
    /* obj NULL or not an object: every field is absent */
    CHECK(jsonin_int64(NULL, "a", JSONIN_REQUIRED, 0, 0, 1, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "a: required");
    CHECK(jsonin_int64(NULL, "a", JSONIN_OPTIONAL, 9, 0, 1, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 9);
}

static void test_int_and_enum(void)
{
    static const int types[] = {0, 1, 2};
    cJSON *o = cJSON_Parse("{\"type\":3,\"t2\":\"1\",\"t3\":1.0,\"t4\":\"x\",\"t5\":-1,"
                           "\"stock\":\"20000000\",\"neg\":-3}");
    int v = -1;
    jsonin_err e = {""};
    CHECK(jsonin_enum_int(o, "type", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "type: must be one of 0, 1, 2");
    CHECK_EQ_INT(v, -1);
    CHECK(jsonin_enum_int(o, "t2", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 1);
    CHECK(jsonin_enum_int(o, "t3", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 1);
    CHECK(jsonin_enum_int(o, "t4", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "t4: must be one of 0, 1, 2");
    CHECK(jsonin_enum_int(o, "t5", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_EINVAL);
    CHECK(jsonin_enum_int(o, "missing", JSONIN_REQUIRED, 0, types, 3, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "missing: required");
    CHECK(jsonin_enum_int(o, "missing", JSONIN_OPTIONAL, 2, types, 3, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 2);

    CHECK(jsonin_int(o, "stock", JSONIN_REQUIRED, 0, 1, 20000000, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 20000000);
    CHECK(jsonin_int(o, "neg", JSONIN_REQUIRED, 0, 1, 20000000, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "neg: must be between 1 and 20000000");
    CHECK(jsonin_int(o, "type", JSONIN_REQUIRED, 0, 0, 2, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "type: must be between 0 and 2");
    cJSON_Delete(o);
}

#define YUAN_MAX 100000000000000LL /* cents */

static void test_money_table(void)
{
    static const int_case cases[] = {
        {"\"19.99\"", 1, 0, YUAN_MAX, QN_OK, 1999, NOMSG},
        {"19.99", 1, 0, YUAN_MAX, QN_OK, 1999, NOMSG},
        {"0.07", 1, 0, YUAN_MAX, QN_OK, 7, NOMSG},
        {"\"0.07\"", 1, 0, YUAN_MAX, QN_OK, 7, NOMSG},
        {"0.29", 1, 0, YUAN_MAX, QN_OK, 29, NOMSG},  /* 0.29*100 = 28.999999999999996 */
        {"1.15", 1, 0, YUAN_MAX, QN_OK, 115, NOMSG}, /* 1.15*100 = 114.99999999999999 */
        {"4.35", 1, 0, YUAN_MAX, QN_OK, 435, NOMSG}, /* 4.35*100 = 434.99999999999994 */
        {"100.5", 1, 0, YUAN_MAX, QN_OK, 10050, NOMSG},
        {"\"100.50\"", 1, 0, YUAN_MAX, QN_OK, 10050, NOMSG},
        {"\"100.5\"", 1, 0, YUAN_MAX, QN_OK, 10050, NOMSG},
        {"100", 1, 0, YUAN_MAX, QN_OK, 10000, NOMSG},
        {"1e2", 1, 0, YUAN_MAX, QN_OK, 10000, NOMSG},
        {"0.01", 1, 0, YUAN_MAX, QN_OK, 1, NOMSG},
        {"0", 1, 0, YUAN_MAX, QN_OK, 0, NOMSG},
        {"\"-0.00\"", 1, 0, YUAN_MAX, QN_OK, 0, NOMSG},
        {"-0.0", 1, 0, YUAN_MAX, QN_OK, 0, NOMSG},
        {"\"1.500\"", 1, 0, YUAN_MAX, QN_OK, 150, NOMSG},
        {"1234567.89", 1, 0, YUAN_MAX, QN_OK, 123456789, NOMSG},
        {"9999999999999.99", 1, 0, INT64_MAX, QN_OK, 999999999999999LL, NOMSG},
        {"\"92233720368547758.07\"", 1, 0, INT64_MAX, QN_OK, INT64_MAX, NOMSG},
        {"\"92233720368547758.08\"", 1, 0, INT64_MAX, QN_EINVAL, 0, "m: must be at least 0.00"},
        {"\"-1\"", 1, INT64_MIN, YUAN_MAX, QN_OK, -100, NOMSG},
        {"-2.5", 1, INT64_MIN, YUAN_MAX, QN_OK, -250, NOMSG},
        {"\"-1\"", 1, 0, 1000000, QN_EINVAL, 0, "m: must be between 0.00 and 10000.00"},
        {"-0.01", 1, 1, 1000000, QN_EINVAL, 0, "m: must be between 0.01 and 10000.00"},
        {"10000.01", 1, 1, 1000000, QN_EINVAL, 0, "m: must be between 0.01 and 10000.00"},
        {"\"1.005\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must have at most two decimals"},
        {"1.005", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must have at most two decimals"},
        {"0.001", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must have at most two decimals"},
        {"1e-5", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must have at most two decimals"},
        /* 0.1 + 0.2 as a client's double would print it: 17 digits, not two decimals */
        {"0.30000000000000004", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must have at most two decimals"},
        {"\"1e2\"", 1, 0, YUAN_MAX, QN_EINVAL, 0,
         "m: must be an amount in yuan, like 100.5 or \"100.50\""},
        {"\"12.\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\".5\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\"1,5\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\"+1\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\" 1\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\"¥1\"", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"true", 1, 0, YUAN_MAX, QN_EINVAL, 0, NOMSG},
        {"\"99999999999999999999999\"", 1, 0, YUAN_MAX, QN_EINVAL, 0,
         "m: must be between 0.00 and 1000000000000.00"},
        {"1e300", 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: must be between 0.00 and 1000000000000.00"},
        {"123456789012345678", 1, 0, INT64_MAX, QN_EINVAL, 0, "m: must be at least 0.00"},
        {NULL, 1, 0, YUAN_MAX, QN_EINVAL, 0, "m: required"},
        {NULL, 0, 0, YUAN_MAX, QN_OK, -77, NOMSG},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const int_case *c = &cases[i];
        cJSON *o = c->value ? body1("m", c->value) : body1("other", "1");
        int64_t v = 123456;
        jsonin_err e = {""};
        qn_status st = jsonin_money_cents(o, "m", c->flags, -77, c->min, c->max, &v, &e);
        if (st != c->st || (st == QN_OK && v != c->want) || (c->msg && strcmp(e.msg, c->msg))) {
            printf("  case %zu (%s): st %d v %lld msg \"%s\"\n", i, c->value ? c->value : "-", st,
                   (long long)v, e.msg);
            th_case_failed = 1;
        }
        if (st != QN_OK && v != 123456)
            th_case_failed = 1;
        cJSON_Delete(o);
    }
}

/* Every cents value 0.00 .. 99.99 written as a JSON number comes back exactly. */
static void test_money_all_cents_as_numbers(void)
{
    int bad = 0;
    for (int cents = 0; cents < 10000; cents++) {
        char lit[32];
        snprintf(lit, sizeof(lit), "%d.%02d", cents / 100, cents % 100);
        cJSON *o = cJSON_Parse(lit); /* a bare number, as cJSON holds it */
        cJSON *obj = cJSON_CreateObject();
        int64_t v = -1;
        jsonin_err e;
        if (o && obj) {
            cJSON_AddItemToObject(obj, "m", o);
            if (jsonin_money_cents(obj, "m", JSONIN_REQUIRED, 0, 0, 1000000, &v, &e) != QN_OK ||
                v != cents)
                bad++;
            /* and back out: the response number prints as the same decimal */
            cJSON *out = jsonin_cents_to_json(cents);
            char *txt = out ? cJSON_PrintUnformatted(out) : NULL;
            char want[32];
            snprintf(want, sizeof(want), "%.15g", cents / 100.0);
            if (!txt || strcmp(txt, want) != 0 || out->valuedouble * 100 != (double)cents * 1.0) {
                /* valuedouble*100 may be off by an ulp; the printed text is what matters */
                if (!txt || strcmp(txt, want) != 0)
                    bad++;
            }
            cJSON_free(txt);
            cJSON_Delete(out);
        } else {
            cJSON_Delete(o);
            bad++;
        }
        cJSON_Delete(obj);
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_cents_to_json(void)
{
    static const struct {
        int64_t cents;
        const char *text;
    } cases[] = {{1050, "10.5"},
                 {1999, "19.99"},
                 {7, "0.07"},
                 {0, "0"},
                 {-250, "-2.5"},
                 {100, "1"},
                 {29, "0.29"},
                 {115, "1.15"},
                 {1, "0.01"},
                 {123456789, "1234567.89"},
                 {2000000000, "20000000"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *n = jsonin_cents_to_json(cases[i].cents);
        char *t = n ? cJSON_PrintUnformatted(n) : NULL;
        CHECK(n && cJSON_IsNumber(n));
        CHECK_EQ_STR(t, cases[i].text);
        cJSON_free(t);
        cJSON_Delete(n);
    }
    cJSON *id = jsonin_id_to_json(1810966706881941507LL);
    char *t = id ? cJSON_PrintUnformatted(id) : NULL;
    CHECK_EQ_STR(t, "\"1810966706881941507\"");
    cJSON_free(t);
    cJSON_Delete(id);
}

typedef struct {
    const char *text;
    qn_status st;
    int64_t want;
} time_case;

static void test_time_parse_table(void)
{
    int64_t base = utc_ms(2026, 1, 1, 19, 4, 5); /* 2026-01-02 03:04:05 +08:00 */
    time_case cases[] = {
        {"2026-01-02 03:04:05", QN_OK, base},
        {"2026-01-02T03:04:05+08:00", QN_OK, base},
        {"2026-01-02t03:04:05+08:00", QN_OK, base},
        {"2026-01-02 03:04:05+08:00", QN_OK, base},
        {"2026-01-01T19:04:05Z", QN_OK, base},
        {"2026-01-01T19:04:05z", QN_OK, base},
        {"2026-01-01T14:04:05-05:00", QN_OK, base},
        {"2026-01-01T19:04:05.123Z", QN_OK, base + 123},
        {"2026-01-01T19:04:05.5Z", QN_OK, base + 500},
        {"2026-01-01T19:04:05.123456789Z", QN_OK, base + 123},
        {"2026-01-02 03:04:05.9", QN_OK, base + 900},
        {"1970-01-01T00:00:00Z", QN_OK, 0},
        {"1970-01-01 08:00:00", QN_OK, 0},
        {"1969-12-31T23:59:59.999Z", QN_OK, -1},
        {"2024-02-29 00:00:00", QN_OK, utc_ms(2024, 2, 28, 16, 0, 0)},
        {"2000-02-29T12:00:00Z", QN_OK, utc_ms(2000, 2, 29, 12, 0, 0)},
        {"9999-12-31T23:59:59Z", QN_OK, utc_ms(9999, 12, 31, 23, 59, 59)},
        {"2026-02-30 10:00:00", QN_EINVAL, 0},
        {"2026-02-29 10:00:00", QN_EINVAL, 0},
        {"2100-02-29 10:00:00", QN_EINVAL, 0},
        {"2026-04-31 10:00:00", QN_EINVAL, 0},
        {"2026-13-01 10:00:00", QN_EINVAL, 0},
        {"2026-00-01 10:00:00", QN_EINVAL, 0},
        {"2026-01-00 10:00:00", QN_EINVAL, 0},
        {"2026-01-01 24:00:00", QN_EINVAL, 0},
        {"2026-01-01 23:60:00", QN_EINVAL, 0},
        {"2026-01-01 23:59:60", QN_EINVAL, 0},
        {"0000-01-01 00:00:00", QN_EINVAL, 0},
        {"2026-01-01T00:00:00+24:00", QN_EINVAL, 0},
        {"2026-01-01T00:00:00+0800", QN_EINVAL, 0},
        {"2026-01-01T00:00:00+08", QN_EINVAL, 0},
        {"2026-1-02 03:04:05", QN_EINVAL, 0},
        {"2026-01-02", QN_EINVAL, 0},
        {"2026-01-02 03:04", QN_EINVAL, 0},
        {"2026-01-02 03:04:05 ", QN_EINVAL, 0},
        {" 2026-01-02 03:04:05", QN_EINVAL, 0},
        {"2026-01-02_03:04:05", QN_EINVAL, 0},
        {"2026-01-02 03:04:05.", QN_EINVAL, 0},
        {"2026-01-02 03:04:05.1234567890", QN_EINVAL, 0},
        {"2026/01/02 03:04:05", QN_EINVAL, 0},
        {"", QN_EINVAL, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int64_t v = 0;
        qn_status st = jsonin_time_parse(cases[i].text, &v);
        if (st != cases[i].st || (st == QN_OK && v != cases[i].want)) {
            printf("  case %zu \"%s\": st %d got %lld want %lld\n", i, cases[i].text, st,
                   (long long)v, (long long)cases[i].want);
            th_case_failed = 1;
        }
    }
    int64_t v;
    CHECK(jsonin_time_parse(NULL, &v) == QN_EINVAL);
}

static void test_time_fields_and_messages(void)
{
    cJSON *o = cJSON_Parse("{\"validStartTime\":\"2026-01-02 03:04:05\","
                           "\"validEndTime\":\"2026-02-30 10:00:00\",\"num\":1767293045000,"
                           "\"bad\":\"tomorrow\",\"empty\":\"\"}");
    int64_t v = 0;
    jsonin_err e = {""};
    CHECK(jsonin_time_ms(o, "validStartTime", JSONIN_REQUIRED, 0, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, utc_ms(2026, 1, 1, 19, 4, 5));
    CHECK(jsonin_time_ms(o, "validEndTime", JSONIN_REQUIRED, 0, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "validEndTime: is not a valid date and time");
    CHECK(jsonin_time_ms(o, "num", JSONIN_REQUIRED, 0, &v, &e) == QN_EINVAL);
    CHECK(strncmp(e.msg, "num: must be a time \"yyyy-MM-dd HH:mm:ss\"", 41) == 0);
    CHECK(jsonin_time_ms(o, "bad", JSONIN_REQUIRED, 0, &v, &e) == QN_EINVAL);
    CHECK(strncmp(e.msg, "bad: must be a time", 19) == 0);
    CHECK(jsonin_time_ms(o, "empty", JSONIN_REQUIRED, 0, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "empty: required");
    CHECK(jsonin_time_ms(o, "sendTime", JSONIN_OPTIONAL, -1, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, -1);
    /* a cross-field message the handler writes with the same helper */
    jsonin_errf(&e, "validEndTime", "must be after %s", "validStartTime");
    CHECK_EQ_STR(e.msg, "validEndTime: must be after validStartTime");
    cJSON_Delete(o);
}

static void test_time_format(void)
{
    char buf[JSONIN_TIME_LEN];
    jsonin_time_format(utc_ms(2026, 1, 1, 19, 4, 5) + 999, buf);
    CHECK_EQ_STR(buf, "2026-01-02 03:04:05");
    jsonin_time_format(0, buf);
    CHECK_EQ_STR(buf, "1970-01-01 08:00:00");
    jsonin_time_format(-1, buf); /* rounds toward the past */
    CHECK_EQ_STR(buf, "1970-01-01 07:59:59");
    jsonin_time_format(utc_ms(2024, 2, 28, 16, 0, 0), buf);
    CHECK_EQ_STR(buf, "2024-02-29 00:00:00");
    cJSON *t = jsonin_time_to_json(utc_ms(2026, 12, 31, 16, 0, 0));
    CHECK(t && cJSON_IsString(t));
    CHECK_EQ_STR(t ? t->valuestring : NULL, "2027-01-01 00:00:00");
    cJSON_Delete(t);

    /* brute: format agrees with glibc's gmtime_r shifted by +8 h, and parse inverts it,
     * from 1900 to 2200 */
    uint64_t x = 88172645463325252ULL;
    int bad = 0;
    for (int i = 0; i < 5000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int64_t lo = utc_ms(1900, 1, 1, 0, 0, 0), hi = utc_ms(2200, 1, 1, 0, 0, 0);
        int64_t ms = lo + (int64_t)(x % (uint64_t)(hi - lo));
        char want[64];
        time_t secs = (time_t)((ms - (((ms % 1000) + 1000) % 1000)) / 1000) + 8 * 3600;
        struct tm tm;
        gmtime_r(&secs, &tm);
        strftime(want, sizeof(want), "%Y-%m-%d %H:%M:%S", &tm);
        jsonin_time_format(ms, buf);
        int64_t back = 0;
        if (strcmp(buf, want) != 0 || jsonin_time_parse(buf, &back) != QN_OK ||
            back != ms - (((ms % 1000) + 1000) % 1000))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_zones(void)
{
    char err[256] = "";
    int64_t v = 0;
    CHECK_EQ_INT(jsonin_zone_offset_s(), 8 * 3600); /* default Asia/Shanghai */

    CHECK(jsonin_zone_init("UTC", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 0);
    CHECK(jsonin_time_parse("2026-01-02 03:04:05", &v) == QN_OK);
    CHECK_EQ_INT(v, utc_ms(2026, 1, 2, 3, 4, 5));
    /* an explicit offset wins over the zone */
    CHECK(jsonin_time_parse("2026-01-02T03:04:05+08:00", &v) == QN_OK);
    CHECK_EQ_INT(v, utc_ms(2026, 1, 1, 19, 4, 5));

    CHECK(jsonin_zone_init("Asia/Kolkata", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 5 * 3600 + 1800);
    CHECK(jsonin_zone_init("Asia/Kathmandu", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 5 * 3600 + 45 * 60);
    CHECK(jsonin_zone_init("America/Sao_Paulo", err, sizeof(err)) == QN_OK); /* no DST now */
    CHECK_EQ_INT(jsonin_zone_offset_s(), -3 * 3600);
    CHECK(jsonin_zone_init("Etc/GMT-8", err, sizeof(err)) == QN_OK); /* POSIX sign: UTC+8 */
    CHECK_EQ_INT(jsonin_zone_offset_s(), 8 * 3600);
    CHECK(jsonin_zone_init("GMT+8", err, sizeof(err)) == QN_OK); /* Java sign: UTC+8 */
    CHECK_EQ_INT(jsonin_zone_offset_s(), 8 * 3600);
    CHECK(jsonin_zone_init("-05:30", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), -(5 * 3600 + 1800));
    CHECK(jsonin_zone_init("UTC+05:45", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 5 * 3600 + 45 * 60);

    CHECK(jsonin_zone_init("Europe/Berlin", err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "daylight") != NULL);
    CHECK(jsonin_zone_init("Nowhere/Atlantis", err, sizeof(err)) == QN_EINVAL);
    CHECK(jsonin_zone_init("../../etc/passwd", err, sizeof(err)) == QN_EINVAL);
    CHECK(jsonin_zone_init("/etc/passwd", err, sizeof(err)) == QN_EINVAL);
    CHECK(jsonin_zone_init("", err, sizeof(err)) == QN_EINVAL);
    CHECK(jsonin_zone_init("+25:00", err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 5 * 3600 + 45 * 60); /* failures keep the zone */

    CHECK(jsonin_zone_init("Asia/Shanghai", err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(jsonin_zone_offset_s(), 8 * 3600);
    char buf[JSONIN_TIME_LEN];
    jsonin_time_format(0, buf);
    CHECK_EQ_STR(buf, "1970-01-01 08:00:00");
}

static void test_strings(void)
{
    cJSON *o = cJSON_Parse("{\"name\":\"abc\",\"cn\":\"优惠券\",\"blank\":\"   \",\"num\":5,"
                           "\"empty\":\"\",\"nul\":null}");
    cJSON_AddItemToObject(o, "bad", cJSON_CreateString("a\xff"));
    cJSON_AddItemToObject(o, "overlong", cJSON_CreateString("\xc0\xaf"));
    cJSON_AddItemToObject(o, "surrogate", cJSON_CreateString("\xed\xa0\x80"));
    const char *s = "untouched";
    jsonin_err e = {""};
    CHECK(jsonin_string(o, "name", JSONIN_REQUIRED, 1, 256, &s, &e) == QN_OK);
    CHECK_EQ_STR(s, "abc");
    CHECK(jsonin_string(o, "name", JSONIN_REQUIRED, 1, 2, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "name: must be 1 to 2 characters long");
    CHECK(jsonin_string(o, "name", JSONIN_REQUIRED, 0, 2, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "name: must be at most 2 characters long");
    CHECK(jsonin_string(o, "cn", JSONIN_REQUIRED, 3, 3, &s, &e) == QN_OK); /* 3 chars, 9 bytes */
    CHECK_EQ_STR(s, "优惠券");
    CHECK(jsonin_string(o, "cn", JSONIN_REQUIRED, 1, 2, &s, &e) == QN_EINVAL);
    CHECK(jsonin_string(o, "blank", JSONIN_REQUIRED, 1, 10, &s, &e) == QN_OK); /* not trimmed */
    CHECK(jsonin_string(o, "blank", JSONIN_REQUIRED | JSONIN_NOT_BLANK, 1, 10, &s, &e) ==
          QN_EINVAL);
    CHECK_EQ_STR(e.msg, "blank: required");
    CHECK(jsonin_string(o, "blank", JSONIN_NOT_BLANK, 0, 10, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "blank: must not be blank");
    CHECK(jsonin_string(o, "num", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "num: must be a string");
    CHECK(jsonin_string(o, "empty", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_OK); /* present */
    CHECK_EQ_STR(s, "");
    CHECK(jsonin_string(o, "empty", JSONIN_REQUIRED, 1, 10, &s, &e) == QN_EINVAL);
    CHECK(jsonin_string(o, "nul", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "nul: required");
    s = "x";
    CHECK(jsonin_string(o, "nul", JSONIN_OPTIONAL, 0, 10, &s, &e) == QN_OK);
    CHECK(s == NULL);
    CHECK(jsonin_string(o, "bad", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "bad: is not valid UTF-8");
    CHECK(jsonin_string(o, "overlong", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_EINVAL);
    CHECK(jsonin_string(o, "surrogate", JSONIN_REQUIRED, 0, 10, &s, &e) == QN_EINVAL);
    CHECK(jsonin_present(o, "empty") == 1);
    CHECK(jsonin_present(o, "nul") == 0);
    CHECK(jsonin_present(o, "missing") == 0);
    cJSON_Delete(o);
}

static void test_objects(void)
{
    static const char *const bodies[] = {
        "{\"receiveRule\":{\"limitPerPerson\":1,\"usageInstructions\":\"3\"}}",
        "{\"receiveRule\":\"{\\\"limitPerPerson\\\":1,\\\"usageInstructions\\\":\\\"3\\\"}\"}",
    };
    for (size_t i = 0; i < 2; i++) {
        jsonin_err e = {""};
        cJSON *o = jsonin_parse(bodies[i], strlen(bodies[i]), &e);
        cJSON *rule = NULL;
        int lim = 0;
        const char *ui = NULL;
        CHECK(o != NULL);
        CHECK(jsonin_object(o, "receiveRule", JSONIN_REQUIRED, &rule, &e) == QN_OK);
        CHECK(rule != NULL && rule != cJSON_GetObjectItem(o, "receiveRule")); /* an owned copy */
        CHECK(jsonin_int(rule, "limitPerPerson", JSONIN_REQUIRED, 0, 1, 1000, &lim, &e) == QN_OK);
        CHECK_EQ_INT(lim, 1);
        CHECK(jsonin_string(rule, "usageInstructions", JSONIN_OPTIONAL, 0, 1024, &ui, &e) == QN_OK);
        CHECK_EQ_STR(ui, "3");
        cJSON_Delete(o); /* the copy outlives the body */
        CHECK(jsonin_int(rule, "limitPerPerson", JSONIN_REQUIRED, 0, 1, 1000, &lim, &e) == QN_OK);
        cJSON_Delete(rule);
    }

    cJSON *o =
        cJSON_Parse("{\"a\":\"[1,2]\",\"b\":\"nope\",\"c\":5,\"d\":\"\","
                    "\"r\":{\"limitPerPerson\":0},\"big\":\"{\\\"id\\\":1810966706881941507}\"}");
    cJSON *r = (cJSON *)1;
    jsonin_err e = {""};
    CHECK(jsonin_object(o, "a", JSONIN_REQUIRED, &r, &e) == QN_EINVAL);
    CHECK(strncmp(e.msg, "a: must be a JSON object", 24) == 0);
    CHECK(jsonin_object(o, "b", JSONIN_REQUIRED, &r, &e) == QN_EINVAL);
    CHECK(jsonin_object(o, "c", JSONIN_REQUIRED, &r, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "c: must be a JSON object");
    CHECK(r == (cJSON *)1);
    CHECK(jsonin_object(o, "d", JSONIN_REQUIRED, &r, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "d: required");
    CHECK(jsonin_object(o, "consumeRule", JSONIN_OPTIONAL, &r, &e) == QN_OK);
    CHECK(r == NULL);
    /* nested messages name the path */
    CHECK(jsonin_object(o, "r", JSONIN_REQUIRED, &r, &e) == QN_OK);
    int lim = 0;
    CHECK(jsonin_int(r, "limitPerPerson", JSONIN_REQUIRED, 0, 1, 1000, &lim, &e) == QN_EINVAL);
    jsonin_err_prefix(&e, "receiveRule");
    CHECK_EQ_STR(e.msg, "receiveRule.limitPerPerson: must be between 1 and 1000");
    cJSON_Delete(r);
    /* a rule string with a big id keeps it exact too */
    CHECK(jsonin_object(o, "big", JSONIN_REQUIRED, &r, &e) == QN_OK);
    int64_t id = 0;
    CHECK(jsonin_int64(r, "id", JSONIN_REQUIRED, 0, 1, INT64_MAX, &id, &e) == QN_OK);
    CHECK_EQ_INT(id, 1810966706881941507LL);
    cJSON_Delete(r);
    cJSON_Delete(o);
}

static void test_int_lists(void)
{
    static const int notify[] = {0, 1, 2, 3};
    static const struct {
        const char *value;
        qn_status st;
        size_t n;
        int vals[4];
        const char *msg;
    } cases[] = {
        {"\"0,1,3\"", QN_OK, 3, {0, 1, 3}, NOMSG},
        {"\"3\"", QN_OK, 1, {3}, NOMSG},
        {"\" 2 , 0 \"", QN_OK, 2, {2, 0}, NOMSG},
        {"[0,3]", QN_OK, 2, {0, 3}, NOMSG},
        {"[\"1\",2]", QN_OK, 2, {1, 2}, NOMSG},
        {"\"0,1,2,3\"", QN_OK, 4, {0, 1, 2, 3}, NOMSG},
        {"\"1,1\"", QN_EINVAL, 0, {0}, "notifyType: 1 is listed twice"},
        {"\"0,5\"",
         QN_EINVAL,
         0,
         {0},
         "notifyType: must be a comma list of distinct values among 0, 1, 2, 3"},
        {"\"0,,1\"", QN_EINVAL, 0, {0}, NOMSG},
        {"\"0,1,\"", QN_EINVAL, 0, {0}, NOMSG},
        {"\",0\"", QN_EINVAL, 0, {0}, NOMSG},
        {"\"0 1\"", QN_EINVAL, 0, {0}, NOMSG},
        {"\"a\"", QN_EINVAL, 0, {0}, NOMSG},
        {"\"-0\"", QN_OK, 1, {0}, NOMSG},
        {"2", QN_EINVAL, 0, {0}, NOMSG},
        {"[0,[1]]", QN_EINVAL, 0, {0}, NOMSG},
        {"\"\"", QN_EINVAL, 0, {0}, "notifyType: required"},
        {"[]", QN_EINVAL, 0, {0}, "notifyType: required"},
        {"null", QN_EINVAL, 0, {0}, "notifyType: required"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *o = body1("notifyType", cases[i].value);
        int out[4] = {-1, -1, -1, -1};
        size_t n = 99;
        jsonin_err e = {""};
        qn_status st =
            jsonin_int_list_csv(o, "notifyType", JSONIN_REQUIRED, notify, 4, out, 4, &n, &e);
        int ok = st == cases[i].st;
        if (ok && st == QN_OK)
            ok = n == cases[i].n && !memcmp(out, cases[i].vals, n * sizeof(int));
        if (ok && cases[i].msg)
            ok = !strcmp(e.msg, cases[i].msg);
        if (!ok) {
            printf("  case %zu (%s): st %d n %zu msg \"%s\"\n", i, cases[i].value, st, n, e.msg);
            th_case_failed = 1;
        }
        cJSON_Delete(o);
    }
    size_t n = 9;
    int out[4];
    jsonin_err e;
    CHECK(jsonin_int_list_csv(NULL, "notifyType", JSONIN_OPTIONAL, notify, 4, out, 4, &n, &e) ==
          QN_OK);
    CHECK_EQ_INT(n, 0);
}

static void test_query_strings(void)
{
    static const int status[] = {0, 1, 2, 3, 4};
    int64_t v = 0;
    int iv = 0;
    jsonin_err e = {""};
    CHECK(jsonin_parse_int64_str("current", NULL, JSONIN_OPTIONAL, 1, 1, INT64_MAX, &v, &e) ==
          QN_OK);
    CHECK_EQ_INT(v, 1);
    CHECK(jsonin_parse_int64_str("current", "", JSONIN_OPTIONAL, 1, 1, INT64_MAX, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 1);
    CHECK(jsonin_parse_int64_str("size", "101", JSONIN_OPTIONAL, 10, 1, 100, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "size: must be between 1 and 100");
    CHECK(jsonin_parse_int64_str("size", "abc", JSONIN_OPTIONAL, 10, 1, 100, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "size: must be an integer");
    CHECK(jsonin_parse_int64_str("couponTemplateId", NULL, JSONIN_REQUIRED, 0, 1, INT64_MAX, &v,
                                 &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "couponTemplateId: required");
    CHECK(jsonin_parse_int64_str("couponTemplateId", "1810966706881941507", JSONIN_REQUIRED, 0, 1,
                                 INT64_MAX, &v, &e) == QN_OK);
    CHECK_EQ_INT(v, 1810966706881941507LL);
    CHECK(jsonin_parse_enum_str("status", "4", JSONIN_OPTIONAL, -1, status, 5, &iv, &e) == QN_OK);
    CHECK_EQ_INT(iv, 4);
    CHECK(jsonin_parse_enum_str("status", "5", JSONIN_OPTIONAL, -1, status, 5, &iv, &e) ==
          QN_EINVAL);
    CHECK_EQ_STR(e.msg, "status: must be one of 0, 1, 2, 3, 4");
    CHECK(jsonin_parse_enum_str("status", NULL, JSONIN_OPTIONAL, -1, status, 5, &iv, &e) == QN_OK);
    CHECK_EQ_INT(iv, -1);
    CHECK(jsonin_parse_money_str("orderAmount", "10.5", JSONIN_REQUIRED, 0, 0, INT64_MAX, &v, &e) ==
          QN_OK);
    CHECK_EQ_INT(v, 1050);
    CHECK(jsonin_parse_money_str("orderAmount", "10.555", JSONIN_REQUIRED, 0, 0, INT64_MAX, &v,
                                 &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "orderAmount: must have at most two decimals");
    CHECK(jsonin_parse_time_str("sendTime", "2026-01-02 03:04:05", JSONIN_REQUIRED, 0, &v, &e) ==
          QN_OK);
    CHECK_EQ_INT(v, utc_ms(2026, 1, 1, 19, 4, 5));
    CHECK(jsonin_parse_time_str("sendTime", "2026-02-30 03:04:05", JSONIN_REQUIRED, 0, &v, &e) ==
          QN_EINVAL);
    CHECK_EQ_STR(e.msg, "sendTime: is not a valid date and time");
    CHECK(jsonin_parse_time_str("sendTime", NULL, JSONIN_REQUIRED, 0, &v, &e) == QN_EINVAL);
    CHECK_EQ_STR(e.msg, "sendTime: required");
}

static void test_parse_bodies(void)
{
    jsonin_err e = {""};
    const char *t;
    cJSON *o;

    /* trailing garbage, truncation, NUL bytes, empty input: refused with "body: ..." */
    static const char *const bad[] = {"{\"a\":01}",
                                      "{\"a\":1.e5}",
                                      "{\"a\":+1}",
                                      "{\"a\":1e}",
                                      "{\"a\":-}",
                                      "{\"a\":.5}",
                                      "{\"a\":1} x",
                                      "{\"a\":",
                                      "",
                                      "[1,]",
                                      "{\"a\":--1}",
                                      "{\"a\":1.}",
                                      "{\"a\":12345678901234567x}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o = jsonin_parse(bad[i], strlen(bad[i]), &e);
        if (o) {
            printf("  accepted %s\n", bad[i]);
            th_case_failed = 1;
            cJSON_Delete(o);
        } else {
            CHECK(strncmp(e.msg, "body: malformed JSON", 20) == 0);
        }
    }
    o = jsonin_parse("{\"a\":1}\0{", 9, &e);
    CHECK(o == NULL);
    o = jsonin_parse(NULL, 0, &e);
    CHECK(o == NULL);
    /* bodies are not NUL-terminated (evbuffer): an exact-size copy, checked under ASan */
    static const char *const tails[] = {"{\"a\":[1,2,3]}", "[1810966706881941507]", "12",
                                        "{\"a\":1"};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        size_t len = strlen(tails[i]);
        char *exact = malloc(len);
        if (!exact)
            continue;
        memcpy(exact, tails[i], len);
        o = jsonin_parse(exact, len, &e);
        CHECK((o != NULL) == (i < 3));
        cJSON_Delete(o);
        free(exact);
    }

    /* long literals become exact strings anywhere; short ones and strings stay as they were */
    t = "{\"ids\":[1810966706881941507,-1810518709471555585,12],"
        "\"s\":\"x\\\"1810966706881941507\",\"f\":1.2345678901234567e5,\"n\":{\"k\":0.5},"
        "\"1234567890123456789\":true}";
    o = jsonin_parse(t, strlen(t), &e);
    CHECK(o != NULL);
    if (!o)
        return;
    cJSON *ids = cJSON_GetObjectItem(o, "ids");
    CHECK(cJSON_IsString(cJSON_GetArrayItem(ids, 0)));
    CHECK_EQ_STR(cJSON_GetArrayItem(ids, 0)->valuestring, "1810966706881941507");
    CHECK_EQ_STR(cJSON_GetArrayItem(ids, 1)->valuestring, "-1810518709471555585");
    CHECK(cJSON_IsNumber(cJSON_GetArrayItem(ids, 2)));
    CHECK_EQ_STR(cJSON_GetObjectItem(o, "s")->valuestring, "x\"1810966706881941507");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(o, "f")));
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "n"), "k")));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(o, "1234567890123456789")));
    cJSON_Delete(o);

    t = "  {\"a\" : 1 }\n";
    o = jsonin_parse(t, strlen(t), &e);
    CHECK(o != NULL && cJSON_GetObjectItem(o, "a")->valuedouble == 1);
    cJSON_Delete(o);
}

int main(void)
{
    RUN(test_int64_table);
    RUN(test_int64_plain_cjson_big_number);
    RUN(test_int_and_enum);
    RUN(test_money_table);
    RUN(test_money_all_cents_as_numbers);
    RUN(test_cents_to_json);
    RUN(test_time_parse_table);
    RUN(test_time_fields_and_messages);
    RUN(test_time_format);
    RUN(test_zones);
    RUN(test_strings);
    RUN(test_objects);
    RUN(test_int_lists);
    RUN(test_query_strings);
    RUN(test_parse_bodies);
    TEST_MAIN_END();
}
