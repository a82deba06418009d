/*
 * The workbook package of an .xlsx: a zip (libzip) whose parts are found through OPC
 * relationships. xlzip_open locates the first worksheet (workbook.xml's first <sheet>, through
 * its relationship) and the shared strings; xlzip_stream inflates one part chunk by chunk.
 *
 * Untrusted input: the number of entries and every part's uncompressed size (declared, and
 * actual while inflating: a zip bomb is refused) are limited; XML with a DTD is refused.
 * Blocking file I/O: off the event loop.
 */
#ifndef QUAN_XLZIP_H
#define QUAN_XLZIP_H

#include <stddef.h>
#include <stdint.h>
#include <zip.h>
#include <zlib.h>

#include "sheet.h"
#include "status.h"

/* The separator of the namespace-aware expat parsers: names arrive as "uri|local". */
#define XLZIP_NS_SEP '|'

/* The parts of the workbook the readers need. Close with xlzip_close (also after a failed
 * open: it is then already closed, and closing again is harmless). */
typedef struct xlzip_book {
    zip_t *zip;
    zip_int64_t sheet_idx; /* the first sheet's XML */
    zip_int64_t sst_idx;   /* sharedStrings.xml, -1 if none */
    char sheet_part[512];
} xlzip_book;

/* Opens path and locates the first sheet and the shared strings. QN_EINVAL (not a workbook, a
 * limit, a missing part) or QN_ERR (I/O) with the reason in err; QN_ENOMEM. */
qn_status xlzip_open(const char *path, const sheet_limits *lim, xlzip_book *b, char *err,
                     size_t errlen) QN_MUSTCHECK;
void xlzip_close(xlzip_book *b);

/* "uri|local" or "local" -> "local" (a pointer into n). */
const char *xlzip_local_name(const char *n);

/* A part inflated chunk by chunk; what names it in messages (borrowed). A deflated part is
 * inflated here with zlib, straight into the reader's buffer, and its CRC-32 checked at its end
 * as libzip would (the same messages); any other part is read through libzip. */
typedef struct xlzip_stream {
    zip_file_t *zf;
    uint64_t total, max;
    const char *what;
    unsigned char *in; /* compressed bytes read ahead (XLZIP_IN); NULL: libzip inflates */
    z_stream z;
    uint32_t crc, want_crc;
    int in_end; /* all the compressed bytes are in */
    int z_end;  /* the deflate stream ended (or its bytes did) */
    int zerr;   /* an inflate error, reported once the bytes before it are read */
} xlzip_stream;

/* Opens part idx of b, refusing more than max uncompressed bytes. QN_EINVAL or QN_ENOMEM with
 * err. */
qn_status xlzip_stream_open(xlzip_book *b, zip_int64_t idx, uint64_t max, const char *what,
                            xlzip_stream *zs, char *err, size_t errlen) QN_MUSTCHECK;
/* Bytes read into buf (0 at the end), or -1 with err set (a read error, or past max). */
zip_int64_t xlzip_stream_read(xlzip_stream *zs, char *buf, size_t len, char *err, size_t errlen);
void xlzip_stream_close(xlzip_stream *zs);

/* The CRC-32 of zip (and zlib's crc32) of len bytes at buf, continuing crc (0 to start);
 * PCLMULQDQ where the CPU has it. */
uint32_t xlzip_crc32(uint32_t crc, const void *buf, size_t len);

#endif
