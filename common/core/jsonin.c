#include "jsonin.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSONIN_EXACT_MAX 9007199254740992.0 /* 2^53: doubles are exact integers up to here */
#define TIME_FORMS       "a time \"yyyy-MM-dd HH:mm:ss\" (or RFC 3339 with an offset)"

/* Offset east of UTC in seconds; written only by jsonin_zone_init, at start-up. */
static int32_t jsonin_zone_offset = 8 * 3600; /* Asia/Shanghai */

/* ---------------------------------------------------------------- messages */

void jsonin_errf(jsonin_err *err, const char *field, const char *fmt, ...)
{
    if (!err)
        return;
    int n = snprintf(err->msg, sizeof(err->msg), "%s: ", field ? field : "(input)");
    if (n < 0 || (size_t)n >= sizeof(err->msg))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof(err->msg) - (size_t)n, fmt, ap);
    va_end(ap);
}

void jsonin_err_prefix(jsonin_err *err, const char *prefix)
{
    if (!err || !prefix || !*prefix)
        return;
    char tmp[sizeof(err->msg)];
    size_t plen = strlen(prefix);
    if (plen + 1 >= sizeof(tmp))
        return;
    memcpy(tmp, prefix, plen);
    tmp[plen] = '.';
    /* the message is truncated if prefix + message no longer fit */
    snprintf(tmp + plen + 1, sizeof(tmp) - plen - 1, "%.*s", (int)(sizeof(tmp) - plen - 2),
             err->msg);
    memcpy(err->msg, tmp, sizeof(tmp));
}

static void jsonin_required(jsonin_err *err, const char *field)
{
    jsonin_errf(err, field, "required");
}

/* What every reader does with an absent field: "required" (QN_EINVAL) when flags demand it,
 * else QN_OK and the caller stores its default. */
static qn_status jsonin_when_absent(const char *field, unsigned flags, jsonin_err *err)
{
    if (flags & JSONIN_REQUIRED) {
        jsonin_required(err, field);
        return QN_EINVAL;
    }
    return QN_OK;
}

/* jsonin_when_absent for the readers of an int64_t: *out = def when that is allowed. */
static qn_status jsonin_default_i64(const char *field, unsigned flags, int64_t def, int64_t *out,
                                    jsonin_err *err)
{
    qn_status st = jsonin_when_absent(field, flags, err);
    if (st == QN_OK)
        *out = def;
    return st;
}

/* The same for the readers of an int. */
static qn_status jsonin_default_int(const char *field, unsigned flags, int def, int *out,
                                    jsonin_err *err)
{
    qn_status st = jsonin_when_absent(field, flags, err);
    if (st == QN_OK)
        *out = def;
    return st;
}

static void jsonin_bounds_msg(jsonin_err *err, const char *field, int64_t min, int64_t max)
{
    if (min == INT64_MIN && max == INT64_MAX)
        jsonin_errf(err, field, "must be a 64-bit integer");
    else if (max == INT64_MAX)
        jsonin_errf(err, field, "must be at least %" PRId64, min);
    else if (min == INT64_MIN)
        jsonin_errf(err, field, "must be at most %" PRId64, max);
    else
        jsonin_errf(err, field, "must be between %" PRId64 " and %" PRId64, min, max);
}

/* cents as "12.34" / "-0.05" */
static void jsonin_yuan_text(int64_t cents, char *buf, size_t cap)
{
    uint64_t u = cents < 0 ? (uint64_t)0 - (uint64_t)cents : (uint64_t)cents;
    snprintf(buf, cap, "%s%" PRIu64 ".%02u", cents < 0 ? "-" : "", u / 100, (unsigned)(u % 100));
}

static void jsonin_money_bounds_msg(jsonin_err *err, const char *field, int64_t min, int64_t max)
{
    char a[32], b[32];
    jsonin_yuan_text(min, a, sizeof(a));
    jsonin_yuan_text(max, b, sizeof(b));
    if (max == INT64_MAX)
        jsonin_errf(err, field, "must be at least %s", a);
    else if (min == INT64_MIN)
        jsonin_errf(err, field, "must be at most %s", b);
    else
        jsonin_errf(err, field, "must be between %s and %s", a, b);
}

static void jsonin_allowed_list(char *buf, size_t cap, const int *allowed, size_t n)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < cap; i++) {
        int w = snprintf(buf + off, cap - off, "%s%d", i ? ", " : "", allowed[i]);
        if (w < 0)
            break;
        off += (size_t)w;
    }
}

/* ---------------------------------------------------------------- items */

static const cJSON *jsonin_item(const cJSON *obj, const char *field)
{
    if (!obj || !cJSON_IsObject(obj) || !field)
        return NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!it || cJSON_IsNull(it))
        return NULL;
    return it;
}

int jsonin_present(const cJSON *obj, const char *field)
{
    return jsonin_item(obj, field) != NULL;
}

/* Absent for the non-string readers: missing, null, or "". */
static int jsonin_absent(const cJSON *it)
{
    return !it || (cJSON_IsString(it) && (!it->valuestring || !it->valuestring[0]));
}

/* ---------------------------------------------------------------- integers */

enum { PARSE_OK = 0, PARSE_SYNTAX = -1, PARSE_RANGE = -2, PARSE_DECIMALS = -3, PARSE_BIG = -4 };

/* Strict decimal integer: -?[0-9]+, nothing else. */
static int jsonin_int_text(const char *s, int64_t *out)
{
    const char *p = s;
    int neg = 0;
    if (*p == '-')
        neg = 1, p++;
    if (!isdigit((unsigned char)*p))
        return PARSE_SYNTAX;
    uint64_t v = 0;
    int range = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            range = 1;
        else
            v = v * 10 + d;
    }
    if (*p)
        return PARSE_SYNTAX;
    if (range || v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return PARSE_RANGE;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return PARSE_OK;
}

qn_status jsonin_int64_text(const char *s, int64_t *out)
{
    return s && jsonin_int_text(s, out) == PARSE_OK ? QN_OK : QN_EINVAL;
}

static int jsonin_int_number(double d, int64_t *out)
{
    if (!isfinite(d) || d != trunc(d))
        return PARSE_SYNTAX;
    if (fabs(d) > JSONIN_EXACT_MAX)
        return PARSE_BIG;
    *out = (int64_t)d;
    return PARSE_OK;
}

/* Reads an integer item (present, not absent) with bounds; fills err on failure. */
static qn_status jsonin_int_value(const cJSON *it, const char *text, const char *field, int64_t min,
                                  int64_t max, int64_t *out, jsonin_err *err)
{
    int64_t v = 0;
    int rc;
    if (it && cJSON_IsNumber(it)) {
        rc = jsonin_int_number(it->valuedouble, &v);
        if (rc == PARSE_BIG &&
            (max > (int64_t)JSONIN_EXACT_MAX || min < -(int64_t)JSONIN_EXACT_MAX)) {
            jsonin_errf(err, field,
                        "integers beyond 2^53 lose precision as JSON numbers; send it as a string");
            return QN_EINVAL;
        }
        if (rc == PARSE_BIG)
            rc = PARSE_RANGE;
    } else if (it && !cJSON_IsString(it)) {
        rc = PARSE_SYNTAX;
    } else {
        rc = jsonin_int_text(it ? it->valuestring : text, &v);
    }
    if (rc == PARSE_SYNTAX) {
        jsonin_errf(err, field, "must be an integer");
        return QN_EINVAL;
    }
    if (rc != PARSE_OK || v < min || v > max) {
        jsonin_bounds_msg(err, field, min, max);
        return QN_EINVAL;
    }
    *out = v;
    return QN_OK;
}

qn_status jsonin_int64(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                       int64_t min, int64_t max, int64_t *out, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    if (jsonin_absent(it))
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_int_value(it, NULL, field, min, max, out, err);
}

qn_status jsonin_int(const cJSON *obj, const char *field, unsigned flags, int def, int min, int max,
                     int *out, jsonin_err *err)
{
    int64_t v;
    qn_status st = jsonin_int64(obj, field, flags, def, min, max, &v, err);
    if (st == QN_OK)
        *out = (int)v;
    return st;
}

static qn_status jsonin_enum_check(const char *field, int64_t v, const int *allowed, size_t n,
                                   int *out, jsonin_err *err)
{
    for (size_t i = 0; i < n; i++) {
        if (v == allowed[i]) {
            *out = allowed[i];
            return QN_OK;
        }
    }
    char list[160];
    jsonin_allowed_list(list, sizeof(list), allowed, n);
    jsonin_errf(err, field, "must be one of %s", list);
    return QN_EINVAL;
}

qn_status jsonin_enum_int(const cJSON *obj, const char *field, unsigned flags, int def,
                          const int *allowed, size_t n_allowed, int *out, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    int64_t v;
    if (jsonin_absent(it))
        return jsonin_default_int(field, flags, def, out, err);
    /* any integer syntax error or range error reads as "not one of the allowed values" */
    jsonin_err scratch;
    if (jsonin_int_value(it, NULL, field, INT64_MIN, INT64_MAX, &v, &scratch) != QN_OK)
        v = INT64_MIN;
    return jsonin_enum_check(field, v, allowed, n_allowed, out, err);
}

qn_status jsonin_parse_int64_str(const char *field, const char *s, unsigned flags, int64_t def,
                                 int64_t min, int64_t max, int64_t *out, jsonin_err *err)
{
    if (!s || !*s)
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_int_value(NULL, s, field, min, max, out, err);
}

qn_status jsonin_parse_enum_str(const char *field, const char *s, unsigned flags, int def,
                                const int *allowed, size_t n_allowed, int *out, jsonin_err *err)
{
    int64_t v;
    if (!s || !*s)
        return jsonin_default_int(field, flags, def, out, err);
    if (jsonin_int_text(s, &v) != PARSE_OK)
        v = INT64_MIN;
    return jsonin_enum_check(field, v, allowed, n_allowed, out, err);
}

/* ---------------------------------------------------------------- money */

/* -?[0-9]+(.[0-9]+)? in yuan -> cents; digits past the second decimal must be zeros. */
static int jsonin_money_text(const char *s, int64_t *out)
{
    const char *p = s;
    int neg = 0;
    if (*p == '-')
        neg = 1, p++;
    if (!isdigit((unsigned char)*p))
        return PARSE_SYNTAX;
    uint64_t yuan = 0;
    int range = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (yuan > (UINT64_MAX - d) / 10)
            range = 1;
        else
            yuan = yuan * 10 + d;
    }
    unsigned frac = 0;
    int decimals_ok = 1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return PARSE_SYNTAX;
        int i = 0;
        for (; isdigit((unsigned char)*p); p++, i++) {
            if (i < 2)
                frac = frac * 10 + (unsigned)(*p - '0');
            else if (*p != '0')
                decimals_ok = 0;
        }
        if (i == 1)
            frac *= 10; /* "1.5" is 50 cents */
    }
    if (*p)
        return PARSE_SYNTAX;
    if (!decimals_ok)
        return PARSE_DECIMALS;
    if (range || yuan > (UINT64_MAX - frac) / 100)
        return PARSE_RANGE;
    uint64_t cents = yuan * 100 + frac;
    if (cents > (uint64_t)INT64_MAX + (uint64_t)neg)
        return PARSE_RANGE;
    *out = neg ? (int64_t)(0 - cents) : (int64_t)cents;
    return PARSE_OK;
}

static int jsonin_money_number(double d, int64_t *out)
{
    if (!isfinite(d))
        return PARSE_SYNTAX;
    if (fabs(d) >= 1e15)
        return PARSE_RANGE;
    /* %.15g gives back the decimal a client wrote for any literal of up to 15 significant
     * digits (DBL_DIG), e.g. 19.99 -> "19.99" where %.17g would give 19.989999999999998. */
    char buf[64];
    snprintf(buf, sizeof(buf), "%.15g", d);
    if (strchr(buf, 'e'))
        return PARSE_DECIMALS; /* below 1e-4 and not zero: more than two decimals */
    return jsonin_money_text(buf, out);
}

static qn_status jsonin_money_value(const cJSON *it, const char *text, const char *field,
                                    int64_t min, int64_t max, int64_t *out, jsonin_err *err)
{
    int64_t v = 0;
    int rc;
    if (it && cJSON_IsNumber(it))
        rc = jsonin_money_number(it->valuedouble, &v);
    else if (it && !cJSON_IsString(it))
        rc = PARSE_SYNTAX;
    else
        rc = jsonin_money_text(it ? it->valuestring : text, &v);
    if (rc == PARSE_SYNTAX) {
        jsonin_errf(err, field, "must be an amount in yuan, like 100.5 or \"100.50\"");
        return QN_EINVAL;
    }
    if (rc == PARSE_DECIMALS) {
        jsonin_errf(err, field, "must have at most two decimals");
        return QN_EINVAL;
    }
    if (rc != PARSE_OK || v < min || v > max) {
        jsonin_money_bounds_msg(err, field, min, max);
        return QN_EINVAL;
    }
    *out = v;
    return QN_OK;
}

qn_status jsonin_money_cents(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                             int64_t min, int64_t max, int64_t *out, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    if (jsonin_absent(it))
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_money_value(it, NULL, field, min, max, out, err);
}

qn_status jsonin_parse_money_str(const char *field, const char *s, unsigned flags, int64_t def,
                                 int64_t min, int64_t max, int64_t *out, jsonin_err *err)
{
    if (!s || !*s)
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_money_value(NULL, s, field, min, max, out, err);
}

cJSON *jsonin_cents_to_json(int64_t cents)
{
    /* One correctly rounded division: the nearest double to the decimal, which cJSON prints
     * back as the short decimal (1999 -> 19.99). */
    return cJSON_CreateNumber((double)cents / 100.0);
}

cJSON *jsonin_id_to_json(int64_t id)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%" PRId64, id);
    return cJSON_CreateString(buf);
}

/* ---------------------------------------------------------------- times */

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t jsonin_days_from_civil(int64_t y, unsigned m, unsigned d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

static void jsonin_civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int64_t)yoe + era * 400 + (*m <= 2);
}

static int jsonin_leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

/* Exactly n digits at *p, advancing it. */
static int jsonin_digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)(*p)[i]))
            return 0;
        v = v * 10 + ((*p)[i] - '0');
    }
    *p += n;
    *out = v;
    return 1;
}

static int jsonin_time_text(const char *s, int64_t *out)
{
    static const unsigned char mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    const char *p = s;
    int y, mo, d, h, mi, se, ms = 0;
    if (!jsonin_digits(&p, 4, &y) || *p++ != '-' || !jsonin_digits(&p, 2, &mo) || *p++ != '-' ||
        !jsonin_digits(&p, 2, &d))
        return PARSE_SYNTAX;
    if (*p != ' ' && *p != 'T' && *p != 't')
        return PARSE_SYNTAX;
    p++;
    if (!jsonin_digits(&p, 2, &h) || *p++ != ':' || !jsonin_digits(&p, 2, &mi) || *p++ != ':' ||
        !jsonin_digits(&p, 2, &se))
        return PARSE_SYNTAX;
    if (*p == '.') {
        p++;
        int n = 0;
        for (; isdigit((unsigned char)*p); p++, n++)
            if (n < 3)
                ms = ms * 10 + (*p - '0'); /* truncated to milliseconds */
        if (n == 0 || n > 9)
            return PARSE_SYNTAX;
        for (; n < 3; n++)
            ms *= 10;
    }
    int32_t offset = jsonin_zone_offset;
    if (*p == 'Z' || *p == 'z') {
        offset = 0;
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om;
        if (!jsonin_digits(&p, 2, &oh) || *p++ != ':' || !jsonin_digits(&p, 2, &om))
            return PARSE_SYNTAX;
        if (oh > 23 || om > 59)
            return PARSE_RANGE;
        offset = sign * (oh * 3600 + om * 60);
    }
    if (*p)
        return PARSE_SYNTAX;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || se > 59)
        return PARSE_RANGE;
    if (d > mdays[mo - 1] + (mo == 2 && jsonin_leap(y)))
        return PARSE_RANGE;
    int64_t days = jsonin_days_from_civil(y, (unsigned)mo, (unsigned)d);
    int64_t secs = days * 86400 + h * 3600 + mi * 60 + se - offset;
    *out = secs * 1000 + ms;
    return PARSE_OK;
}

qn_status jsonin_time_parse(const char *s, int64_t *out_ms)
{
    return s && jsonin_time_text(s, out_ms) == PARSE_OK ? QN_OK : QN_EINVAL;
}

static qn_status jsonin_time_value(const char *text, const char *field, int64_t *out,
                                   jsonin_err *err)
{
    int64_t v;
    int rc = text ? jsonin_time_text(text, &v) : PARSE_SYNTAX;
    if (rc == PARSE_RANGE) {
        jsonin_errf(err, field, "is not a valid date and time");
        return QN_EINVAL;
    }
    if (rc != PARSE_OK) {
        jsonin_errf(err, field, "must be " TIME_FORMS);
        return QN_EINVAL;
    }
    *out = v;
    return QN_OK;
}

qn_status jsonin_time_ms(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                         int64_t *out, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    if (jsonin_absent(it))
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_time_value(cJSON_IsString(it) ? it->valuestring : NULL, field, out, err);
}

qn_status jsonin_parse_time_str(const char *field, const char *s, unsigned flags, int64_t def,
                                int64_t *out, jsonin_err *err)
{
    if (!s || !*s)
        return jsonin_default_i64(field, flags, def, out, err);
    return jsonin_time_value(s, field, out, err);
}

void jsonin_time_format(int64_t ms, char buf[JSONIN_TIME_LEN])
{
    int64_t secs = ms / 1000 - (ms % 1000 < 0); /* floor */
    int64_t local = secs + jsonin_zone_offset;
    int64_t days = local / 86400 - (local % 86400 < 0);
    int64_t sod = local - days * 86400;
    int64_t y;
    unsigned m, d;
    jsonin_civil_from_days(days, &y, &m, &d);
    if (y < 0 || y > 9999) {
        snprintf(buf, JSONIN_TIME_LEN, "%s", y < 0 ? "0000-01-01 00:00:00" : "9999-12-31 23:59:59");
        return;
    }
    /* By hand: settlement writes one per coupon listed, hundreds per answer. */
    unsigned v[6] = {(unsigned)y,         m, d, (unsigned)(sod / 3600), (unsigned)(sod / 60 % 60),
                     (unsigned)(sod % 60)};
    char *p = buf;
    *p++ = (char)('0' + v[0] / 1000);
    *p++ = (char)('0' + v[0] / 100 % 10);
    for (int i = 0; i < 6; i++) {
        *p++ = (char)('0' + v[i] / 10 % 10);
        *p++ = (char)('0' + v[i] % 10);
        if (i < 5)
            *p++ = i < 2 ? '-' : i == 2 ? ' ' : ':';
    }
    *p = '\0';
}

cJSON *jsonin_time_to_json(int64_t ms)
{
    char buf[JSONIN_TIME_LEN];
    jsonin_time_format(ms, buf);
    return cJSON_CreateString(buf);
}

/* ---------------------------------------------------------------- zone */

/* [+-]hh[:mm[:ss]] or [+-]h..., as in POSIX TZ and Java's GMT+8; returns chars used or 0. */
static int jsonin_offset_text(const char *s, int *out_s)
{
    const char *p = s;
    int sign = 1, h = 0, m = 0, sec = 0, n = 0;
    if (*p == '+' || *p == '-')
        sign = *p++ == '-' ? -1 : 1;
    for (; isdigit((unsigned char)*p) && n < 2; p++, n++)
        h = h * 10 + (*p - '0');
    if (n == 0)
        return 0;
    if (*p == ':') {
        p++;
        if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]))
            return 0;
        m = (p[0] - '0') * 10 + (p[1] - '0');
        p += 2;
        if (*p == ':') {
            p++;
            if (!isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]))
                return 0;
            sec = (p[0] - '0') * 10 + (p[1] - '0');
            p += 2;
        }
    }
    if (h > 24 || m > 59 || sec > 59)
        return 0;
    *out_s = sign * (h * 3600 + m * 60 + sec);
    return (int)(p - s);
}

/* The POSIX TZ rule at the end of a TZif v2+ file, e.g. "CST-8" or "CET-1CEST,M3.5.0,...". */
static qn_status jsonin_tzif_footer(const char *path, char *rule, size_t cap, char *errbuf,
                                    size_t errlen)
{
    qn_status st = QN_EINVAL;
    char *data = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(errbuf, errlen, "zone file %s: %s", path, strerror(errno));
        goto done;
    }
    size_t cap_data = 1 << 20, n;
    data = malloc(cap_data);
    if (!data) {
        st = QN_ENOMEM;
        goto done;
    }
    n = fread(data, 1, cap_data, f);
    if (n < 6 || memcmp(data, "TZif", 4) != 0 || data[4] < '2' || data[n - 1] != '\n') {
        snprintf(errbuf, errlen, "zone file %s: not a TZif v2+ file", path);
        goto done;
    }
    size_t end = n - 1, start = end;
    while (start > 0 && data[start - 1] != '\n')
        start--;
    if (start == 0 || end - start >= cap || end == start) {
        snprintf(errbuf, errlen, "zone file %s: no present-day rule", path);
        goto done;
    }
    memcpy(rule, data + start, end - start);
    rule[end - start] = '\0';
    st = QN_OK;
done:
    free(data);
    if (f)
        fclose(f);
    return st;
}

qn_status jsonin_zone_init(const char *zone, char *errbuf, size_t errlen)
{
    char path[512], rule[128];
    int off = 0, used;
    const char *p;

    if (!zone || !*zone) {
        snprintf(errbuf, errlen, "empty time zone");
        return QN_EINVAL;
    }
    if (!strcmp(zone, "Z") || !strcmp(zone, "UTC") || !strcmp(zone, "GMT")) {
        jsonin_zone_offset = 0;
        return QN_OK;
    }
    /* Fixed offsets: "+08:00", "UTC+8", "GMT+8" (Java: east of UTC). */
    p = zone;
    if (!strncmp(p, "UTC", 3) || !strncmp(p, "GMT", 3))
        p += 3;
    if ((*p == '+' || *p == '-') && (used = jsonin_offset_text(p, &off)) > 0 && !p[used]) {
        jsonin_zone_offset = off;
        return QN_OK;
    }
    /* An IANA name: no absolute paths or "..", looked up in the tz database. */
    if (zone[0] == '/' || strstr(zone, "..")) {
        snprintf(errbuf, errlen, "time zone %s: not a zone name", zone);
        return QN_EINVAL;
    }
    const char *dir = getenv("TZDIR");
    snprintf(path, sizeof(path), "%s/%s", dir && *dir ? dir : "/usr/share/zoneinfo", zone);
    qn_status st = jsonin_tzif_footer(path, rule, sizeof(rule), errbuf, errlen);
    if (st != QN_OK)
        return st;
    /* std name: letters, or <...> quoted, then the POSIX offset (west of UTC, so negated) */
    p = rule;
    if (*p == '<') {
        p = strchr(p, '>');
        p = p ? p + 1 : rule + strlen(rule);
    } else {
        while (isalpha((unsigned char)*p))
            p++;
    }
    if (p == rule || (used = jsonin_offset_text(p, &off)) == 0) {
        snprintf(errbuf, errlen, "time zone %s: cannot read its rule \"%s\"", zone, rule);
        return QN_EINVAL;
    }
    if (p[used]) {
        snprintf(errbuf, errlen,
                 "time zone %s observes daylight saving time (rule \"%s\"); use a zone with a "
                 "fixed offset",
                 zone, rule);
        return QN_EINVAL;
    }
    jsonin_zone_offset = -off;
    return QN_OK;
}

int32_t jsonin_zone_offset_s(void)
{
    return jsonin_zone_offset;
}

/* ---------------------------------------------------------------- strings */

/* Code points in s if it is valid UTF-8 (no overlongs, surrogates or > U+10FFFF), else -1. */
static long jsonin_utf8_chars(const unsigned char *s)
{
    long n = 0;
    while (*s) {
        unsigned c = *s;
        int len;
        uint32_t cp;
        if (c < 0x80)
            len = 1, cp = c;
        else if ((c & 0xE0) == 0xC0)
            len = 2, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0)
            len = 3, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0)
            len = 4, cp = c & 0x07;
        else
            return -1;
        for (int i = 1; i < len; i++) {
            if ((s[i] & 0xC0) != 0x80)
                return -1;
            cp = (cp << 6) | (s[i] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return -1;
        s += len;
        n++;
    }
    return n;
}

qn_status jsonin_string(const cJSON *obj, const char *field, unsigned flags, size_t min_chars,
                        size_t max_chars, const char **out, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    if (!it) {
        if (jsonin_when_absent(field, flags, err) != QN_OK)
            return QN_EINVAL;
        *out = NULL;
        return QN_OK;
    }
    if (!cJSON_IsString(it) || !it->valuestring) {
        jsonin_errf(err, field, "must be a string");
        return QN_EINVAL;
    }
    const char *s = it->valuestring;
    long n = jsonin_utf8_chars((const unsigned char *)s);
    if (n < 0) {
        jsonin_errf(err, field, "is not valid UTF-8");
        return QN_EINVAL;
    }
    if ((flags & JSONIN_NOT_BLANK) && s[strspn(s, " \t\r\n")] == '\0') {
        jsonin_errf(err, field, (flags & JSONIN_REQUIRED) ? "required" : "must not be blank");
        return QN_EINVAL;
    }
    if ((size_t)n < min_chars || (size_t)n > max_chars) {
        if (min_chars == max_chars)
            jsonin_errf(err, field, "must be %zu characters long", min_chars);
        else if (min_chars == 0)
            jsonin_errf(err, field, "must be at most %zu characters long", max_chars);
        else
            jsonin_errf(err, field, "must be %zu to %zu characters long", min_chars, max_chars);
        return QN_EINVAL;
    }
    *out = s;
    return QN_OK;
}

/* ---------------------------------------------------------------- bodies and objects */

/* A byte that may be part of a number literal (what jsonin_number_len then checks). */
static inline int jsonin_number_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Length of a JSON number literal at s (at most n bytes), or 0 if it is not one. */
static size_t jsonin_number_len(const char *s, size_t n, size_t *digits)
{
    size_t i = 0, dg = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0') {
        i++, dg++;
    } else if (i < n && s[i] >= '1' && s[i] <= '9') {
        while (i < n && isdigit((unsigned char)s[i]))
            i++, dg++;
    } else {
        return 0;
    }
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !isdigit((unsigned char)s[i]))
            return 0;
        while (i < n && isdigit((unsigned char)s[i]))
            i++, dg++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || !isdigit((unsigned char)s[i]))
            return 0;
        while (i < n && isdigit((unsigned char)s[i]))
            i++;
    }
    *digits = dg;
    return i;
}

cJSON *jsonin_parse(const char *text, size_t len, jsonin_err *err)
{
    cJSON *root = NULL;
    /* each quoted literal has at least 16 bytes and gains 2 */
    char *buf = malloc(len + len / 8 + 3);
    size_t o = 0, quoted = 0;
    int in_str = 0;

    if (!text)
        text = "", len = 0;
    if (!buf) {
        jsonin_errf(err, "body", "out of memory");
        goto done;
    }
    if (memchr(text, '\0', len)) {
        jsonin_errf(err, "body", "malformed JSON (a NUL byte)");
        goto done;
    }
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (in_str) {
            /* the string's plain run in one copy, then its escape or its end */
            size_t k = i;
            while (k < len && text[k] != '"' && text[k] != '\\')
                k++;
            memcpy(buf + o, text + i, k - i);
            o += k - i;
            if ((i = k) == len)
                break;
            c = buf[o++] = text[i++];
            if (c == '\\' && i < len)
                buf[o++] = text[i++];
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
            buf[o++] = c, i++;
        } else if (c == '-' || isdigit((unsigned char)c)) {
            /* cJSON's number parser is lenient ("1.", "01", "1.e5"): hold numbers to the
             * JSON grammar here, and quote the ones a double cannot hold exactly */
            size_t run = 0, digits = 0;
            while (i + run < len && jsonin_number_char(text[i + run]))
                run++;
            size_t n = jsonin_number_len(text + i, run, &digits);
            if (n == 0 || n != run) {
                jsonin_errf(err, "body", "malformed JSON (bad number at byte %zu)", i);
                goto done;
            }
            if (digits > 15)
                buf[o++] = '"';
            memcpy(buf + o, text + i, n);
            o += n;
            if (digits > 15)
                buf[o++] = '"', quoted++;
            i += n;
        } else {
            buf[o++] = c, i++;
        }
    }
    buf[o] = '\0';
    const char *end = NULL;
    /* length includes the NUL so cJSON's trailing-garbage check can see the end */
    root = cJSON_ParseWithLengthOpts(buf, o + 1, &end, 1);
    if (!root) {
        if (!quoted && end && end >= buf && end <= buf + o)
            jsonin_errf(err, "body", "malformed JSON at byte %zu", (size_t)(end - buf));
        else
            jsonin_errf(err, "body", "malformed JSON");
    }
done:
    free(buf);
    return root;
}

qn_status jsonin_object(const cJSON *obj, const char *field, unsigned flags, cJSON **out,
                        jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    cJSON *copy = NULL;
    if (jsonin_absent(it)) {
        if (jsonin_when_absent(field, flags, err) != QN_OK)
            return QN_EINVAL;
        *out = NULL;
        return QN_OK;
    }
    if (cJSON_IsObject(it)) {
        copy = cJSON_Duplicate(it, 1);
        if (!copy) {
            jsonin_errf(err, field, "out of memory");
            return QN_ENOMEM;
        }
    } else if (cJSON_IsString(it)) {
        jsonin_err inner;
        copy = jsonin_parse(it->valuestring, strlen(it->valuestring), &inner);
        if (!copy || !cJSON_IsObject(copy)) {
            cJSON_Delete(copy);
            jsonin_errf(err, field, "must be a JSON object (the string does not hold one)");
            return QN_EINVAL;
        }
    } else {
        jsonin_errf(err, field, "must be a JSON object");
        return QN_EINVAL;
    }
    *out = copy;
    return QN_OK;
}

/* ---------------------------------------------------------------- int lists */

static qn_status jsonin_list_add(const char *field, int64_t v, int ok, const int *allowed,
                                 size_t n_allowed, int *out, size_t cap, size_t *n, jsonin_err *err)
{
    char list[160];
    size_t i;
    for (i = 0; ok && i < n_allowed; i++)
        if (allowed[i] == v)
            break;
    if (!ok || i == n_allowed) {
        jsonin_allowed_list(list, sizeof(list), allowed, n_allowed);
        jsonin_errf(err, field, "must be a comma list of distinct values among %s", list);
        return QN_EINVAL;
    }
    for (i = 0; i < *n; i++) {
        if (out[i] == v) {
            jsonin_errf(err, field, "%d is listed twice", (int)v);
            return QN_EINVAL;
        }
    }
    if (*n >= cap) {
        jsonin_errf(err, field, "too many values");
        return QN_EINVAL;
    }
    out[(*n)++] = (int)v;
    return QN_OK;
}

qn_status jsonin_int_list_csv(const cJSON *obj, const char *field, unsigned flags,
                              const int *allowed, size_t n_allowed, int *out, size_t cap,
                              size_t *out_n, jsonin_err *err)
{
    const cJSON *it = jsonin_item(obj, field);
    size_t n = 0;
    int64_t v = 0;
    int ok;
    if (jsonin_absent(it) || (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 0)) {
        if (jsonin_when_absent(field, flags, err) != QN_OK)
            return QN_EINVAL;
        *out_n = 0;
        return QN_OK;
    }
    if (cJSON_IsArray(it)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, it)
        {
            jsonin_err scratch;
            ok = (cJSON_IsNumber(e) || cJSON_IsString(e)) &&
                 jsonin_int_value(e, NULL, field, INT64_MIN, INT64_MAX, &v, &scratch) == QN_OK;
            if (jsonin_list_add(field, v, ok, allowed, n_allowed, out, cap, &n, err) != QN_OK)
                return QN_EINVAL;
        }
    } else if (cJSON_IsString(it)) {
        const char *p = it->valuestring;
        for (;;) {
            char item[24];
            size_t len;
            while (*p == ' ')
                p++;
            len = strcspn(p, ", ");
            ok = len > 0 && len < sizeof(item);
            if (ok) {
                memcpy(item, p, len);
                item[len] = '\0';
                ok = jsonin_int_text(item, &v) == PARSE_OK;
            }
            p += len;
            while (*p == ' ')
                p++;
            if (*p && *p != ',')
                ok = 0;
            if (jsonin_list_add(field, v, ok, allowed, n_allowed, out, cap, &n, err) != QN_OK)
                return QN_EINVAL;
            if (!*p)
                break;
            p++; /* the comma; a trailing comma leaves an empty item, refused above */
        }
    } else {
        (void)jsonin_list_add(field, 0, 0, allowed, n_allowed, out, cap, &n, err);
        return QN_EINVAL;
    }
    *out_n = n;
    return QN_OK;
}
