/*
 * A one-sheet .xlsx written row by row into a zipout, for exports that are sent while they are
 * read (libxlsxwriter needs the whole file on disk before the first byte can go). The fixed
 * parts come first, then the sheet's XML as rows arrive: strings inline (no shared-string
 * table to hold), numbers as stored. Memory does not depend on the number of rows.
 * Not thread-safe; one thread at a time.
 */
#ifndef QUAN_XLSXOUT_H
#define QUAN_XLSXOUT_H

#include <stddef.h>

#include "status.h"
#include "zipout.h"

#define XLSXOUT_CONTENT_TYPE "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"

typedef struct xlsxout xlsxout;

/* Writes the workbook's fixed parts and the sheet up to its first row, a header of ncols
 * strings (ncols 1..16384). Every byte goes to sink (see zipout.h). sheet_name is Excel's
 * (at most 31 characters, none of []:*?/\). *out owned: xlsxout_free. */
qn_status xlsxout_open(zipout_sink sink, void *arg, const char *sheet_name,
                       const char *const *header, int ncols, xlsxout **out) QN_MUSTCHECK;
/* One row of ncols cells: NULL is an empty cell; a column whose bit is set in numeric_mask is
 * a number when its text is one (-12, 3.5, 1E+18), otherwise text like the others. Texts are
 * UTF-8; control characters XML cannot carry become U+FFFD. */
qn_status xlsxout_row(xlsxout *x, const char *const *cells, unsigned numeric_mask) QN_MUSTCHECK;
/* Ends the sheet and the archive: the file is complete. */
qn_status xlsxout_close(xlsxout *x) QN_MUSTCHECK;
void xlsxout_free(xlsxout *x);

#endif
