/*
 * A .csv written row by row, for exports that are sent while they are read (the streamed
 * counterpart of xlsxout): RFC 4180 records, CRLF line ends, a field quoted (quotes doubled)
 * only when it holds a comma, a quote, CR or LF. The file starts with a UTF-8 byte-order mark,
 * without which Excel reads UTF-8 text as the local code page (the sheet reader skips it).
 * Bytes go to the sink in pieces of about CSVOUT_FLUSH; memory is that and the longest row.
 * Not thread-safe; one thread at a time.
 */
#ifndef QUAN_CSVOUT_H
#define QUAN_CSVOUT_H

#include <stddef.h>

#include "status.h"
#include "zipout.h"

#define CSVOUT_CONTENT_TYPE "text/csv; charset=utf-8"
#define CSVOUT_FLUSH        (16u << 10)

typedef struct csvout csvout;

/* Writes the byte-order mark and a header of ncols strings (ncols >= 1). Every byte goes to
 * sink (the type of zipout.h: not QN_OK stops the file). *out owned: csvout_free. */
qn_status csvout_open(zipout_sink sink, void *arg, const char *const *header, int ncols,
                      csvout **out) QN_MUSTCHECK;
/* One record of ncols fields: NULL is an empty field. Texts are written as given (UTF-8). The
 * file keeps its first failure: every later call returns it. */
qn_status csvout_row(csvout *c, const char *const *cells) QN_MUSTCHECK;
/* Hands what is buffered to the sink: the file is complete. */
qn_status csvout_close(csvout *c) QN_MUSTCHECK;
void csvout_free(csvout *c);

#endif
