/* Bound parameters and array literals of pgpool statements (see pgparam.h). */
#include "pgparam.h"

#include "log.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

size_t pgparam_fmt_i64(char *out, int64_t v)
{
    return log_i64_str(out, v);
}

static void pgparam_push(pgparam *p, const char *v)
{
    assert(p->n >= 0 && p->n < PGPARAM_MAX && "pgparam: more than PGPARAM_MAX parameters");
    p->v[p->n++] = v;
}

void pgparam_i64(pgparam *p, int64_t v)
{
    assert(p->n >= 0 && p->n < PGPARAM_MAX && "pgparam: more than PGPARAM_MAX parameters");
    pgparam_fmt_i64(p->buf[p->n], v);
    pgparam_push(p, p->buf[p->n]);
}

void pgparam_str(pgparam *p, const char *s)
{
    pgparam_push(p, s);
}

void pgparam_null(pgparam *p)
{
    pgparam_push(p, NULL);
}

void pgparam_truncate(pgparam *p, int n)
{
    assert(n >= 0 && n <= p->n);
    p->n = n;
}

/* ------------------------------------------------------------------ array literals */

/* Room for extra more bytes, the closing "}" and the NUL. */
static bool pgparam_array_room(pgparam_array *a, size_t extra)
{
    size_t need = a->len + extra + 2;
    if (a->oom)
        return false;
    if (need <= a->cap)
        return true;
    size_t cap = a->cap ? a->cap : 64;
    while (cap < need)
        cap *= 2;
    char *s = realloc(a->s, cap);
    if (!s) {
        a->oom = true;
        return false;
    }
    a->s = s;
    a->cap = cap;
    return true;
}

/* The "{" or "," before an element; false when out of memory. */
static bool pgparam_array_sep(pgparam_array *a, size_t extra)
{
    if (!pgparam_array_room(a, extra + 1))
        return false;
    a->s[a->len++] = a->n++ ? ',' : '{';
    return true;
}

void pgparam_array_i64(pgparam_array *a, int64_t v)
{
    char num[PGPARAM_NUM_LEN];
    size_t k = pgparam_fmt_i64(num, v);
    if (!pgparam_array_sep(a, k))
        return;
    memcpy(a->s + a->len, num, k);
    a->len += k;
}

void pgparam_array_str(pgparam_array *a, const char *s)
{
    if (!s) {
        if (pgparam_array_sep(a, 4)) {
            memcpy(a->s + a->len, "NULL", 4);
            a->len += 4;
        }
        return;
    }
    /* Quoted always, so that "", "NULL", spaces, commas and braces stay text; only " and \
     * are escaped inside quotes. The worst case doubles every byte. */
    size_t n = strlen(s);
    if (!pgparam_array_sep(a, 2 * n + 2))
        return;
    a->s[a->len++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"' || s[i] == '\\')
            a->s[a->len++] = '\\';
        a->s[a->len++] = s[i];
    }
    a->s[a->len++] = '"';
}

const char *pgparam_array_end(pgparam_array *a)
{
    if (a->n == 0 && !a->oom) {
        /* "{}": the "{" an element would have written, kept out of len. */
        if (!pgparam_array_room(a, 1))
            return NULL;
        memcpy(a->s, "{}", 3);
        return a->s;
    }
    if (a->oom)
        return NULL;
    /* pgparam_array_room always left two bytes past len. */
    a->s[a->len] = '}';
    a->s[a->len + 1] = '\0';
    return a->s;
}

qn_status pgparam_array_bind(pgparam *p, pgparam_array *a)
{
    const char *lit = pgparam_array_end(a);
    if (!lit)
        return QN_ENOMEM;
    pgparam_str(p, lit);
    return QN_OK;
}

void pgparam_array_free(pgparam_array *a)
{
    free(a->s);
    *a = (pgparam_array){0};
}
