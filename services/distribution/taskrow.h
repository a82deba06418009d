/*
 * The rows of a distribution task's spreadsheet as the executor sees them, read in chunks
 * through common/sheet/sheet (first sheet; .xlsx with shared, inline or numeric cells, or .csv),
 * with memory bounded by the chunk, never by the sheet:
 *
 *   - column A is the user id, B the phone, C the mail; a first row whose column A is a header
 *     name ("用户ID" or "userId", case-insensitive) is the header and is skipped, and its
 *     "手机号"/"phone" and "邮箱"/"mail" cells, wherever they are, say where phone and mail are;
 *     any other first row is a data row;
 *   - a data row is every non-empty row after the header, numbered as in the sheet (the header
 *     is row 1; sheet.h);
 *   - a user id is valid only as a positive 64-bit decimal integer: digits alone, ASCII blanks
 *     around allowed; text, 0, negatives, fractions and exponent forms are not (a numeric cell
 *     holding a whole number is stored as its digits, so it is valid);
 *   - texts are kept as written, up to TASKROW_TEXT_MAX bytes, invalid UTF-8 replaced by '?'
 *     (they go into the failure report and the notification events).
 *
 * Blocking file I/O: worker threads only.
 */
#ifndef QUAN_TASKROW_H
#define QUAN_TASKROW_H

#include <stddef.h>
#include <stdint.h>

#include "sheet.h"
#include "usersheet.h"
#include "usersheet.h"
#include "status.h"

#define TASKROW_TEXT_MAX 255 /* bytes kept of the user id, phone and mail texts */

/* The user id in cell (NUL-terminated text), 1..INT64_MAX; 0 when it is not one. */
int64_t taskrow_user_id(const char *cell);

/* One data row of a chunk; the texts are offsets into the chunk's arena (taskrow_text). */
typedef struct taskrow {
    int64_t row;     /* the sheet's row number */
    int64_t user_id; /* 0 when the cell is not a valid user id */
    uint32_t raw, phone, mail;
} taskrow;

/* A chunk's rows; reused from chunk to chunk (its memory is that of the largest). Owned by the
 * caller; taskrow_chunk_free frees it. */
typedef struct taskrow_chunk {
    taskrow *rows;
    size_t n, cap;
    char *arena;
    size_t len, acap;
} taskrow_chunk;

void taskrow_chunk_free(taskrow_chunk *c);
/* The text at offset off of c (the user id as written, the phone or the mail); "" when none. */
static inline const char *taskrow_text(const taskrow_chunk *c, uint32_t off)
{
    return c->arena + off;
}

typedef struct taskrow_reader taskrow_reader;

/* Opens the sheet at path (a local file) and reads its first row to tell a header from data.
 * NULL with the reason in err (not a spreadsheet, a limit, an I/O error). */
taskrow_reader *taskrow_open(const char *path, const sheet_limits *lim, char *err,
                             size_t errlen) QN_MUSTCHECK;
void taskrow_close(taskrow_reader *r);

/* Passes over the next n data rows (a run resuming after its last committed chunk). QN_OK also
 * when the sheet ends before. Errors as taskrow_read. */
qn_status taskrow_skip(taskrow_reader *r, int64_t n) QN_MUSTCHECK;

/* The next up to max data rows into c (c->n = 0 at the end of the sheet). QN_EINVAL (malformed
 * input, a limit), QN_ERR (I/O), QN_ENOMEM with the reason in taskrow_error. */
qn_status taskrow_read(taskrow_reader *r, taskrow_chunk *c, size_t max) QN_MUSTCHECK;

/* Why the last call failed ("" if nothing failed). Borrowed. */
const char *taskrow_error(const taskrow_reader *r);

#endif
