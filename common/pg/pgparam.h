/*
 * Bound parameters of pgpool statements, formatted in place.
 *
 * A pgparam lives on the caller's stack and holds up to PGPARAM_MAX text parameters, each
 * number formatted into the struct's own buffer, so a statement reads as its parameters in
 * order:
 *
 *     pgparam p = {0};
 *     pgparam_i64(&p, op->user_id);      // $1
 *     pgparam_str(&p, op->request_id);   // $2, borrowed; NULL is SQL NULL
 *     st = pgpool_exec_cmd(c, sql, p.n, p.v, &n);
 *
 * Its entries point into itself: never copy a pgparam (pass a pointer). More parameters than
 * PGPARAM_MAX is a programming error (assert). To run a second statement with the same first
 * k parameters, pgparam_truncate(&p, k) and add the rest.
 *
 * A pgparam_array builds the literal of an array parameter ("{1,2,3}", "{\"a\",\"b\"}") for
 * statements such as `WHERE id = ANY($1::bigint[])` or `unnest($1::bigint[], $2::text[])`: one
 * bound parameter instead of one per element. It grows on the heap; appends never fail, and
 * running out of memory is reported once, by pgparam_array_end (or pgparam_array_bind).
 */
#ifndef QUAN_PGPARAM_H
#define QUAN_PGPARAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PGPARAM_MAX     16 /* the largest statement today binds 11 */
#define PGPARAM_NUM_LEN 21 /* "-9223372036854775808" and the NUL */

typedef struct pgparam {
    int n;                      /* parameters so far: pgpool's nparams */
    const char *v[PGPARAM_MAX]; /* pgpool's params; number entries point into buf */
    char buf[PGPARAM_MAX][PGPARAM_NUM_LEN];
} pgparam;

/* v in decimal into out (PGPARAM_NUM_LEN bytes), NUL-terminated; returns its length. Faster
 * than snprintf, for the many numbers of array literals (and of keys built in bulk). */
size_t pgparam_fmt_i64(char *out, int64_t v);

/* Appends $n+1: an integer of any width, in decimal. */
void pgparam_i64(pgparam *p, int64_t v);
/* Appends $n+1: s as is, borrowed until the statement has run; NULL is SQL NULL. */
void pgparam_str(pgparam *p, const char *s);
/* Appends $n+1: SQL NULL. */
void pgparam_null(pgparam *p);
/* Keeps $1..$n only (n <= p->n), for the next statement of the same parameters. */
void pgparam_truncate(pgparam *p, int n);

typedef struct pgparam_array {
    char *s;    /* "{e1,e2" while building; owned, NULL before the first append */
    size_t len; /* bytes of s, without the closing "}" */
    size_t cap;
    size_t n; /* elements */
    bool oom; /* an append ran out of memory: the literal is incomplete */
} pgparam_array;

/* Appends an element in decimal. */
void pgparam_array_i64(pgparam_array *a, int64_t v);
/* Appends a text element, quoted and escaped (any bytes); NULL is a NULL element. */
void pgparam_array_str(pgparam_array *a, const char *s);
/*
 * The literal, "{}" when empty; owned by a and valid until the next append or
 * pgparam_array_free (appending after it is allowed). NULL when an append or the literal
 * itself ran out of memory.
 */
const char *pgparam_array_end(pgparam_array *a) QN_MUSTCHECK;
/* Appends the literal of a as p's next parameter (borrowed from a); QN_ENOMEM as above. */
qn_status pgparam_array_bind(pgparam *p, pgparam_array *a) QN_MUSTCHECK;
/* Frees the literal; a is empty again and may be reused. */
void pgparam_array_free(pgparam_array *a);

/*
 * Not a parameter: a constant pasted into a statement's text at compile time, for the small
 * vocabularies of the rows (statuses) that statements compare and write, so that SQL names the
 * same constant the C code does at no cost per statement. PGPARAM_DIGIT_TEXT(x) is the text of
 * x, a macro that expands to one decimal digit ("1"); anything else (a misspelt name, an
 * enum constant, 10) does not compile.
 */
#define PGPARAM_DIGIT_TEXT(x)  PGPARAM_DIGIT_TEXT_(x)
#define PGPARAM_DIGIT_TEXT_(x) PGPARAM_DIGIT_##x
#define PGPARAM_DIGIT_0        "0"
#define PGPARAM_DIGIT_1        "1"
#define PGPARAM_DIGIT_2        "2"
#define PGPARAM_DIGIT_3        "3"
#define PGPARAM_DIGIT_4        "4"
#define PGPARAM_DIGIT_5        "5"
#define PGPARAM_DIGIT_6        "6"
#define PGPARAM_DIGIT_7        "7"
#define PGPARAM_DIGIT_8        "8"
#define PGPARAM_DIGIT_9        "9"

#endif
