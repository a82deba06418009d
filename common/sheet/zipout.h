/*
 * A zip archive written front to back, for files that are sent while they are made: every
 * entry is deflated (zlib) as its bytes arrive, its local header carries no sizes (general
 * purpose flag bit 3) and a data descriptor with the CRC and sizes follows its data; the
 * central directory closes the archive. Nothing is ever rewritten, so each byte can leave for
 * the sink as soon as it exists. Memory: the deflate state and two 64 KiB buffers, whatever
 * the size of the entries. No zip64: an entry or an archive past 4 GiB is refused (QN_EINVAL).
 * Not thread-safe; one thread at a time.
 */
#ifndef QUAN_ZIPOUT_H
#define QUAN_ZIPOUT_H

#include <stddef.h>

#include "status.h"

/* Takes len bytes of the archive (copied or consumed before it returns). Not QN_OK stops the
 * archive. */
typedef qn_status (*zipout_sink)(void *arg, const void *data, size_t len);

typedef struct zipout zipout;

/* level: zlib's 1 (fastest) .. 9. sink and arg are borrowed. Owned; free with zipout_free.
 * NULL when out of memory. */
zipout *zipout_new(zipout_sink sink, void *arg, int level);
/* The archive keeps its first failure (the sink's status; QN_EINVAL past 4 GiB; QN_ENOMEM) and
 * every later call returns it: a sequence of calls may be checked once, by its last. */

/* Starts an entry named name (ASCII; copied), ending the one before if it is open. */
qn_status zipout_begin(zipout *z, const char *name);
/* Adds len bytes to the open entry (buffered: they reach the sink in deflated pieces). */
qn_status zipout_write(zipout *z, const void *data, size_t len);
/* Ends the open entry, if any, and writes the central directory: the archive is complete. */
qn_status zipout_finish(zipout *z) QN_MUSTCHECK;
void zipout_free(zipout *z);

#endif
