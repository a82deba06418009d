/*
 * Typed readers of request input (cJSON bodies and query strings) with the conventions of
 * docs/api.md, producing 400 messages that name the field and the reason, e.g.
 * "stock: must be between 1 and 20000000", "type: must be one of 0, 1, 2",
 * "couponTemplateId: required".
 *
 * Conventions, applied the same way to JSON fields and to query-string values:
 *   - Absent: a missing field and JSON null are absent. For every reader except
 *     jsonin_string an empty string "" is absent too (forms send "" for unset fields).
 *     Absent + JSONIN_REQUIRED -> "<field>: required"; absent and optional -> QN_OK with *out
 *     set to the default given.
 *   - Integers (ids, counts, enums): a JSON number with no fraction, or a string of decimal
 *     digits with an optional '-' (no '+', spaces or exponent). A JSON *number* beyond 2^53 is
 *     rejected ("send it as a string"): cJSON keeps numbers as doubles, so such a number may
 *     already have been rounded. Bodies parsed with jsonin_parse never hit this: it turns
 *     number literals of more than 15 digits into strings before cJSON sees them, so
 *     {"id":1810966706881941507} is read exactly.
 *   - Money: yuan with at most two decimals, as a number (100.5) or a string ("100.50"),
 *     converted to integer cents from the decimal text, never through float arithmetic. Extra
 *     trailing zeros are fine ("1.500"); a third significant decimal ("1.005") is refused. A
 *     JSON number is turned back into its shortest decimal text (%.15g, exact for any decimal
 *     of up to 15 significant digits) before parsing.
 *   - Times: "yyyy-MM-dd HH:mm:ss" in the configured zone, or RFC 3339 with 'T' (or a space)
 *     and an offset ("2026-01-02T03:04:05+08:00", "...Z"), with an optional fraction of 1-9
 *     digits, truncated to milliseconds. Leap seconds (:60) and invalid dates (02-30) are
 *     refused. Output: epoch milliseconds (int64).
 *   - Strings: valid UTF-8, length bounds counted in characters (code points). Not trimmed;
 *     JSONIN_NOT_BLANK refuses a string of only white space.
 *
 * The zone: default Asia/Shanghai (UTC+8). jsonin_zone_init resolves a zone once at start-up
 * to a fixed UTC offset, read from the tz database's rule for the present (the TZif footer);
 * zones that currently observe daylight saving time are refused, since a fixed offset would be
 * wrong half the year. Instants before the zone's last change use today's offset (for
 * Asia/Shanghai: before 1991). No setenv("TZ")/localtime: conversion is pure arithmetic and
 * thread-safe.
 *
 * All functions are thread-safe once jsonin_zone_init (if used) has returned.
 */
#ifndef QUAN_JSONIN_H
#define QUAN_JSONIN_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "status.h"

/* Flags of every reader. */
#define JSONIN_OPTIONAL  0u
#define JSONIN_REQUIRED  1u
#define JSONIN_NOT_BLANK 2u /* jsonin_string: refuse a string of only white space */

#define JSONIN_TIME_LEN 20 /* "yyyy-MM-dd HH:mm:ss" + NUL */

/* The message of a refused input, always "<field>: <reason>". */
typedef struct jsonin_err {
    char msg[256];
} jsonin_err;

/* Sets err to "<field>: <reason>" (printf format for the reason). err may be NULL. */
void jsonin_errf(jsonin_err *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Turns "limitPerPerson: ..." into "receiveRule.limitPerPerson: ..." for nested objects. */
void jsonin_err_prefix(jsonin_err *err, const char *prefix);

/*
 * Resolve the zone once, before other threads use this module: an IANA name without daylight
 * saving ("Asia/Shanghai", "UTC", "Asia/Kolkata"; read from $TZDIR or /usr/share/zoneinfo),
 * or a fixed offset "+08:00", "-05:30", "UTC+8", "GMT+8" (Java's sense: GMT+8 is 8 h east),
 * "Z". On failure errbuf says why and the previous zone stays.
 */
qn_status jsonin_zone_init(const char *zone, char *errbuf, size_t errlen) QN_MUSTCHECK;
/* The zone's offset east of UTC, in seconds. */
int32_t jsonin_zone_offset_s(void);

/*
 * Parse a request body. Returns an owned tree (cJSON_Delete), or NULL with err set to
 * "body: ..." if it is not valid JSON. Number literals of more than 15 significant digits
 * become strings holding the literal's exact text (see above).
 */
cJSON *jsonin_parse(const char *text, size_t len, jsonin_err *err) QN_MUSTCHECK;

/* 1 if obj has field with a value other than null (an empty string counts as present). */
int jsonin_present(const cJSON *obj, const char *field);

/*
 * The readers. obj may be NULL (every field is then absent); field is the JSON name and is
 * used in messages. On QN_OK *out holds the value (or def when absent and optional); on
 * QN_EINVAL err says why and *out is untouched.
 */
qn_status jsonin_int64(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                       int64_t min, int64_t max, int64_t *out, jsonin_err *err) QN_MUSTCHECK;
qn_status jsonin_int(const cJSON *obj, const char *field, unsigned flags, int def, int min, int max,
                     int *out, jsonin_err *err) QN_MUSTCHECK;
/* One of allowed[0..n_allowed): "type: must be one of 0, 1, 2". */
qn_status jsonin_enum_int(const cJSON *obj, const char *field, unsigned flags, int def,
                          const int *allowed, size_t n_allowed, int *out,
                          jsonin_err *err) QN_MUSTCHECK;
/* Money in cents within [min, max] cents; the message states the bounds in yuan. */
qn_status jsonin_money_cents(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                             int64_t min, int64_t max, int64_t *out, jsonin_err *err) QN_MUSTCHECK;
/* A time as epoch milliseconds. */
qn_status jsonin_time_ms(const cJSON *obj, const char *field, unsigned flags, int64_t def,
                         int64_t *out, jsonin_err *err) QN_MUSTCHECK;
/*
 * A string of min_chars..max_chars characters. *out is borrowed from obj (valid while obj
 * lives); NULL when absent and optional.
 */
qn_status jsonin_string(const cJSON *obj, const char *field, unsigned flags, size_t min_chars,
                        size_t max_chars, const char **out, jsonin_err *err) QN_MUSTCHECK;
/*
 * A JSON object, given either as an object or as a string holding one (the reference sends
 * receiveRule/consumeRule as strings). *out is always an owned copy (cJSON_Delete), NULL when
 * absent and optional, so callers free it the same way whichever form came in.
 */
qn_status jsonin_object(const cJSON *obj, const char *field, unsigned flags, cJSON **out,
                        jsonin_err *err) QN_MUSTCHECK;
/*
 * A list of distinct allowed ints given as a comma list "0,1,3" (spaces around items allowed)
 * or a JSON array [0,1,3]. Values in input order go to out[0..*out_n); cap must be at least
 * n_allowed. Absent and optional: *out_n = 0.
 */
qn_status jsonin_int_list_csv(const cJSON *obj, const char *field, unsigned flags,
                              const int *allowed, size_t n_allowed, int *out, size_t cap,
                              size_t *out_n, jsonin_err *err) QN_MUSTCHECK;

/*
 * The same rules for query-string values (already percent-decoded). s NULL or "" is absent.
 */
qn_status jsonin_parse_int64_str(const char *field, const char *s, unsigned flags, int64_t def,
                                 int64_t min, int64_t max, int64_t *out,
                                 jsonin_err *err) QN_MUSTCHECK;
qn_status jsonin_parse_enum_str(const char *field, const char *s, unsigned flags, int def,
                                const int *allowed, size_t n_allowed, int *out,
                                jsonin_err *err) QN_MUSTCHECK;
qn_status jsonin_parse_money_str(const char *field, const char *s, unsigned flags, int64_t def,
                                 int64_t min, int64_t max, int64_t *out,
                                 jsonin_err *err) QN_MUSTCHECK;
qn_status jsonin_parse_time_str(const char *field, const char *s, unsigned flags, int64_t def,
                                int64_t *out, jsonin_err *err) QN_MUSTCHECK;

/* Pure conversions, no field: QN_EINVAL if s is not of the form described above. */
qn_status jsonin_time_parse(const char *s, int64_t *out_ms) QN_MUSTCHECK;
/* A strict decimal int64: -?[0-9]+ and nothing else, within range. */
qn_status jsonin_int64_text(const char *s, int64_t *out) QN_MUSTCHECK;
/* "yyyy-MM-dd HH:mm:ss" of ms in the zone (milliseconds dropped, rounding toward the past). */
void jsonin_time_format(int64_t ms, char buf[JSONIN_TIME_LEN]);

/* Response values (owned by the caller until added to a tree; NULL on out of memory):
 * cents as a JSON number in yuan (1050 -> 10.5, exact for |cents| < 2^53), a time as a
 * "yyyy-MM-dd HH:mm:ss" string, an id as a JSON string. */
cJSON *jsonin_cents_to_json(int64_t cents);
cJSON *jsonin_time_to_json(int64_t ms);
cJSON *jsonin_id_to_json(int64_t id);

#endif
