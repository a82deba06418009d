/*
 * Counting the rows of an .xlsx sheet fast, in O(1) memory, without materialising cells: what
 * task creation pays for a distribution sheet (bench/sheet.sh holds it to decompression
 * speed). A scanner walks the tags of the inflated XML instead of expat; it checks tag
 * structure (nesting and names) but not every XML rule, and hands anything it does not model
 * back to the full reader. Blocking file I/O: off the event loop.
 */
#ifndef QUAN_ROWCOUNT_H
#define QUAN_ROWCOUNT_H

#include <stddef.h>
#include <stdint.h>

#include "sheet.h"
#include "status.h"
#include "xlzip.h"

/* Counts the non-empty rows (the header included) of b's first sheet into *nonempty, with
 * *modelled 1. *modelled 0 (and QN_OK): the sheet uses something the scanner does not model
 * (namespace prefixes, CDATA, a DTD, a non-UTF-8 encoding, an empty shared string, a construct
 * longer than its buffer): count it with the full reader. QN_EINVAL with err: malformed. */
qn_status rowcount_xlsx(xlzip_book *b, const sheet_limits *lim, int64_t *nonempty, int *modelled,
                        char *err, size_t errlen) QN_MUSTCHECK;

#endif
