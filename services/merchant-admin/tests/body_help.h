/* What the tests of merchant-admin's request bodies share (header only): a body made of a valid
 * one with a few fields changed, texts of a given length, and a case's outcome checked against
 * the message it expects. */
#ifndef QUAN_MADMIN_BODY_HELP_H
#define QUAN_MADMIN_BODY_HELP_H

#include <stdio.h>
#include <string.h>

#include <cJSON.h>

#include "jsonin.h"
#include "testhelp.h"

#define BODY_CHANGES 3 /* changes of a case at most */

/* A field set to a JSON text (value NULL: removed); "a.b" is field b of object a. A NULL field
 * ends a case's changes. */
typedef struct body_change {
    const char *field, *value;
} body_change;

/* A case of a table: the changes, and the message of the 400 (NULL: accepted). */
typedef struct body_case {
    body_change ch[BODY_CHANGES];
    const char *err;
} body_case;

static inline void body_set(cJSON *obj, const char *field, const char *value)
{
    const char *dot = strchr(field, '.');
    if (dot) {
        char outer[64];
        snprintf(outer, sizeof(outer), "%.*s", (int)(dot - field), field);
        body_set(cJSON_GetObjectItemCaseSensitive(obj, outer), dot + 1, value);
        return;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, field);
    if (value) {
        jsonin_err err;
        cJSON_AddItemToObject(obj, field, jsonin_parse(value, strlen(value), &err));
    }
}

/* The JSON text base with the changes ch made, as jsonin_parse reads a body. Owned
 * (cJSON_Delete). */
static inline cJSON *body_with(const char *base, const body_change *ch)
{
    jsonin_err err;
    cJSON *b = jsonin_parse(base, strlen(base), &err);
    for (int i = 0; b && i < BODY_CHANGES && ch[i].field; i++)
        body_set(b, ch[i].field, ch[i].value);
    return b;
}

/* n characters c as a JSON string, in a static buffer (one at a time). */
static inline const char *body_text(char c, int n)
{
    static char buf[2100];
    if (n < 0 || (size_t)n + 3 > sizeof(buf))
        n = 0;
    buf[0] = '"';
    memset(buf + 1, c, (size_t)n);
    buf[n + 1] = '"';
    buf[n + 2] = '\0';
    return buf;
}

/* Case i's outcome, st and err, against the message it expects (want NULL: accepted). Whether
 * it is as expected. */
static inline int body_expect(size_t i, qn_status st, const jsonin_err *err, const char *want)
{
    int as_expected = want ? st == QN_EINVAL && strcmp(err->msg, want) == 0 : st == QN_OK;
    if (!as_expected)
        printf("  case %zu: %s\n", i, st == QN_OK ? "accepted" : err->msg);
    if (want) {
        CHECK_EQ_INT(st, QN_EINVAL);
        CHECK_EQ_STR(err->msg, want);
    } else {
        CHECK_EQ_INT(st, QN_OK);
    }
    return as_expected;
}

#endif
