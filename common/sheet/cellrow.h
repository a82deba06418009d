/*
 * One spreadsheet row as the readers (xlsx, csv) assemble it: each column's text either copied
 * into the row's arena or borrowed from elsewhere (a shared string). The row is reused from one
 * row to the next, so its memory follows the widest row, never the number of rows.
 * Also the growable byte buffer with a hard cap the readers build texts in.
 */
#ifndef QUAN_CELLROW_H
#define QUAN_CELLROW_H

#include <stddef.h>
#include <stdint.h>

#include "sheet.h"
#include "status.h"

/* A growable byte buffer; zero-initialised is empty. p is owned (free with cellrow_buf_free). */
typedef struct cellrow_buf {
    char *p;
    size_t len, cap;
} cellrow_buf;

/* Appends n bytes (room for one more byte is kept, for a NUL). 0, or -1 when out of memory. */
int cellrow_buf_append(cellrow_buf *b, const char *s, size_t n);
void cellrow_buf_free(cellrow_buf *b);

typedef struct cellrow_slot {
    const char *ext; /* borrowed text, or NULL: the text is at off in the arena */
    size_t off;
} cellrow_slot;

/* Zero-initialised is an empty row; free with cellrow_free. */
typedef struct cellrow {
    int64_t number; /* the row's number in the sheet (set by the reader) */
    cellrow_buf arena;
    cellrow_slot *slots;
    int nslots, slots_cap;
    const char **cells; /* cellrow_cells's answer */
    int cells_cap;
} cellrow;

/* Empties the row (its buffers are kept for the next one). */
void cellrow_reset(cellrow *r);
/* Column col gets the NUL-terminated text at off in the arena (or, _ext, the borrowed text,
 * which must outlive the row's use); columns before it that have no text are "". QN_EINVAL
 * past SHEET_MAX_COLS, QN_ENOMEM. */
qn_status cellrow_set(cellrow *r, int col, size_t off) QN_MUSTCHECK;
qn_status cellrow_set_ext(cellrow *r, int col, const char *text) QN_MUSTCHECK;
/* The text of column col ("" past the last column). Borrowed until the row changes. */
const char *cellrow_text(const cellrow *r, int col);
/* 1 when some column's text is not "". */
int cellrow_nonempty(const cellrow *r);
/* *out gets every column's text, r->nslots strings borrowed until the row changes. */
qn_status cellrow_cells(cellrow *r, const char *const **out) QN_MUSTCHECK;
void cellrow_free(cellrow *r);

#endif
