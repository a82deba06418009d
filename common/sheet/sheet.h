/*
 * Streaming reader for the distribution spreadsheets (.xlsx, or .csv): the first worksheet of
 * the workbook, row by row, with memory bounded by the shared-string table (never by the
 * number of rows). The sheet XML is inflated chunk by chunk (libzip) into expat.
 *
 * Rows: the first non-empty row is the header; sheet_next_row returns only the non-empty rows
 * after it (a row is empty when all its cells are ""). sheet_count_data_rows counts exactly
 * those rows, fast, without materialising cells.
 *
 * Numbers: a numeric cell comes back as the exact text stored in the XML (<v>...</v>), never
 * re-formatted through a double. A 19-digit id typed into Excel as a number is already lossy
 * *in the file*: Excel keeps 15 significant digits and stores e.g. "1.8105187094715556E+18"
 * (libxlsxwriter writes the double with %.16G: "1.810518709471556E+18"). That text is
 * returned unchanged; callers must reject it rather than guess. Ids survive only as text cells.
 *
 * Untrusted input: zip entry count, uncompressed sizes (declared and actual: a zip bomb is
 * refused), number of shared strings, cell and row sizes are all limited; malformed archives,
 * XML or CSV give QN_EINVAL with a message, never a crash. DTDs are refused.
 *
 * This is the public face; the work is done by xlzip (the zip package), xlsx (shared strings
 * and rows), csv, cellrow (the row the readers fill) and rowcount (the fast count).
 */
#ifndef QUAN_SHEET_H
#define QUAN_SHEET_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Limits; a zero field means its default (so `{.max_cell_bytes = 64}` changes one). */
typedef struct sheet_limits {
    uint64_t max_sheet_bytes; /* uncompressed sheet XML, or the CSV file size (1 GiB) */
    uint64_t max_sst_bytes;   /* uncompressed sharedStrings.xml (256 MiB) */
    int64_t max_entries;      /* entries in the zip archive (10000) */
    int64_t max_strings;      /* shared strings (5,000,000) */
    size_t max_cell_bytes;    /* one cell's text, UTF-8 bytes (131072: Excel's 32767 chars) */
    size_t max_row_bytes;     /* all cells of one row together (4 MiB) */
} sheet_limits;

#define SHEET_MAX_COLS 16384 /* Excel's last column, XFD */

/* The limits in effect for lim (NULL or zero fields -> defaults). */
void sheet_limits_resolve(const sheet_limits *lim, sheet_limits *out);

typedef struct sheet sheet;

/* One row. cells[i] is column i (A = 0); missing cells are "". Everything is borrowed until
 * the next sheet_next_row or sheet_free. */
typedef struct sheet_row {
    int64_t number; /* 1-based row number in the sheet (rows can be sparse); CSV: record number */
    int ncells;
    const char *const *cells;
} sheet_row;

/* Opens path: .xlsx when it starts with the zip magic, otherwise CSV (a file named .xlsx/.xlsm
 * that is not a zip, and legacy .xls, are refused). Finds the first sheet through
 * workbook.xml and its relationships and loads the shared strings. NULL on failure with the
 * reason in err. Free with sheet_free. Blocking file I/O: call it off the event loop. */
sheet *sheet_open(const char *path, const sheet_limits *lim, char *err, size_t errlen) QN_MUSTCHECK;
void sheet_free(sheet *s);

/* The next non-empty data row: QN_OK, QN_ENOTFOUND at the end, QN_EINVAL (malformed input, a
 * limit) or QN_ERR (I/O) / QN_ENOMEM with sheet_error(s). Errors are sticky. */
qn_status sheet_next_row(sheet *s, sheet_row *row) QN_MUSTCHECK;

/* Cell idx of row, "" when the row is shorter (rows end at their last present cell). */
const char *sheet_cell(const sheet_row *row, int idx);

/* The header row (first non-empty row), read lazily; borrowed until sheet_free.
 * QN_ENOTFOUND when the sheet has no non-empty row; errors as sheet_next_row. */
qn_status sheet_header(sheet *s, sheet_row *row) QN_MUSTCHECK;

/* Column index of the header cell whose text (ASCII-whitespace trimmed) equals name (also
 * trimmed); -1 if absent, or if reading the header failed (then sheet_error(s) is not ""). */
int sheet_header_index(sheet *s, const char *name);

/* Why the last call failed ("" if nothing failed). Borrowed. */
const char *sheet_error(const sheet *s);

/* Counts the data rows (non-empty rows after the header) of path, as sheet_next_row would
 * return them, in O(1) memory. For xlsx a dedicated scanner checks tag structure (nesting and
 * names) but not every XML rule; anything unusual for it (namespace prefixes, CDATA, a
 * non-UTF-8 encoding, empty shared strings) falls back to the full parser. */
qn_status sheet_count_data_rows(const char *path, const sheet_limits *lim, int64_t *rows, char *err,
                                size_t errlen) QN_MUSTCHECK;

#endif
