/*
 * The .csv side of the spreadsheet reader: RFC 4180 records (fields separated by commas,
 * quoted fields with doubled quotes inside, CRLF, LF or CR line ends, a UTF-8 byte-order mark
 * skipped), read in chunks so that memory follows the longest record, never the file.
 * Blocking file I/O: off the event loop.
 */
#ifndef QUAN_CSV_H
#define QUAN_CSV_H

#include <stddef.h>

#include "cellrow.h"
#include "sheet.h"
#include "status.h"

typedef struct csv csv;

/* Opens path (refused when larger than lim->max_sheet_bytes). row is borrowed until csv_free:
 * each csv_next fills it. *out owned (csv_free). QN_EINVAL / QN_ERR / QN_ENOMEM with err. */
qn_status csv_open(const char *path, const sheet_limits *lim, cellrow *row, csv **out, char *err,
                   size_t errlen) QN_MUSTCHECK;
/* The next record (possibly empty) into the row, numbered from 1, or *eof set at the end.
 * QN_EINVAL (malformed, a limit), QN_ERR (I/O) or QN_ENOMEM with err. */
qn_status csv_next(csv *c, int *eof, char *err, size_t errlen) QN_MUSTCHECK;
void csv_free(csv *c);

#endif
