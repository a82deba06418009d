/*
 * The .xlsx side of the spreadsheet reader: the shared-string table, then the first sheet's
 * rows, its XML inflated chunk by chunk (xlzip_stream) into expat, which is suspended at the
 * end of every row. Memory is bounded by the shared strings and the widest row, never by the
 * number of rows. A numeric cell is the exact text stored in <v> (see sheet.h).
 * Blocking file I/O: off the event loop.
 */
#ifndef QUAN_XLSX_H
#define QUAN_XLSX_H

#include <stddef.h>

#include "cellrow.h"
#include "sheet.h"
#include "status.h"
#include "xlzip.h"

typedef struct xlsx xlsx;

/*
 * What a cell's value is: one rule for the reader (xlsx.c) and the fast counter (rowcount.c),
 * so that they agree on which rows are empty, hence which is the header and how many data rows
 * follow it. The value is the text directly inside a <v> child of <c>, or inside a <t> of the
 * cell's inline string <is>, either a child of <is> or of one of its rich-text runs <r>
 * (CT_Rst). Text anywhere else inside a <c> is not the value: a formula <f>, a phonetic run
 * <rPh>, or an element the format does not put there (a <si> copied into a cell, whose runs
 * are not the cell's <is>), at any depth.
 */
typedef enum xlsx_vk { XLSX_VK_OTHER = 0, XLSX_VK_V, XLSX_VK_IS, XLSX_VK_R, XLSX_VK_T } xlsx_vk;
#define XLSX_VALUE_DEPTH 3 /* the deepest value: <is><r><t> */

/* kinds[0..n-1]: the elements open below a <c>, outermost first (n >= 0). 1 when text directly
 * inside the innermost one is the cell's value. */
static inline int xlsx_value_path(const unsigned char *kinds, int n)
{
    switch (n) {
    case 1:
        return kinds[0] == XLSX_VK_V;
    case 2:
        return kinds[0] == XLSX_VK_IS && kinds[1] == XLSX_VK_T;
    case 3:
        return kinds[0] == XLSX_VK_IS && kinds[1] == XLSX_VK_R && kinds[2] == XLSX_VK_T;
    default:
        return 0;
    }
}

/* Opens the workbook at path and loads its shared strings. row is borrowed until xlsx_free:
 * each xlsx_next fills it. *out owned (xlsx_free). QN_EINVAL / QN_ERR / QN_ENOMEM with the
 * reason in err. */
qn_status xlsx_open(const char *path, const sheet_limits *lim, cellrow *row, xlsx **out, char *err,
                    size_t errlen) QN_MUSTCHECK;
/* The next <row> of the sheet (possibly empty) into the row, or *eof set at the end of the
 * sheet. QN_EINVAL (malformed XML, a limit) or QN_ENOMEM with err; the reader is then
 * unusable. */
qn_status xlsx_next(xlsx *x, int *eof, char *err, size_t errlen) QN_MUSTCHECK;
void xlsx_free(xlsx *x);

/* Reads b's shared strings only to tell whether one of them is empty (O(1) memory): a cell
 * pointing at an empty string is an empty cell, which only the full reader sees. */
qn_status xlsx_sst_any_empty(xlzip_book *b, const sheet_limits *lim, int *any_empty, char *err,
                             size_t errlen) QN_MUSTCHECK;

#endif
