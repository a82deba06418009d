/* A zip archive written front to back: see zipout.h. Formats: PKWARE APPNOTE 4.3.7 (local
 * header), 4.3.9 (data descriptor), 4.3.12 (central directory header), 4.3.16 (end record). */
#include "zipout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "grow.h"

#define ZO_BUF         (64u << 10)
#define ZO_VERSION     20     /* 2.0: deflate */
#define ZO_FLAGS       0x0008 /* sizes and CRC in the data descriptor after the data */
#define ZO_DEFLATE     8
#define ZO_MAX         UINT32_MAX
#define ZO_MAX_ENTRY   0xFFFFu
#define ZO_LOCAL_SIG   0x04034b50u
#define ZO_DESC_SIG    0x08074b50u
#define ZO_CENTRAL_SIG 0x02014b50u
#define ZO_END_SIG     0x06054b50u

typedef struct zo_entry {
    char *name;
    uint32_t crc, csize, usize, offset;
} zo_entry;

struct zipout {
    zipout_sink sink;
    void *arg;
    int level;
    qn_status st; /* the first failure, returned by every later call */
    z_stream zs;
    int zinit;             /* zs initialised */
    int open;              /* an entry is open */
    uint64_t offset;       /* bytes given to the sink */
    uint64_t usize, csize; /* of the open entry */
    uint32_t crc;
    uint16_t dos_time, dos_date;
    zo_entry *ents;
    size_t n, cap;
    size_t inlen;
    unsigned char in[ZO_BUF], out[ZO_BUF];
};

static unsigned char *put16(unsigned char *p, unsigned v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    return p + 2;
}

static unsigned char *put32(unsigned char *p, uint32_t v)
{
    p = put16(p, v & 0xFFFFu);
    return put16(p, v >> 16);
}

static qn_status zo_fail(zipout *z, qn_status st)
{
    if (!z->st)
        z->st = st;
    return z->st;
}

static qn_status zo_emit(zipout *z, const void *data, size_t len)
{
    if (z->st)
        return z->st;
    if (z->offset + len > ZO_MAX)
        return zo_fail(z, QN_EINVAL); /* past what a zip without zip64 can address */
    qn_status st = z->sink(z->arg, data, len);
    if (st != QN_OK)
        return zo_fail(z, st);
    z->offset += len;
    return QN_OK;
}

/* Deflates the buffered input; flush is Z_NO_FLUSH, or Z_FINISH to end the entry's stream. */
static qn_status zo_deflate(zipout *z, int flush)
{
    z->zs.next_in = z->in;
    z->zs.avail_in = (uInt)z->inlen;
    for (;;) {
        z->zs.next_out = z->out;
        z->zs.avail_out = ZO_BUF;
        int rc = deflate(&z->zs, flush);
        if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
            return zo_fail(z, QN_ERR);
        size_t have = ZO_BUF - z->zs.avail_out;
        z->csize += have;
        if (have && zo_emit(z, z->out, have) != QN_OK)
            return z->st;
        if (flush == Z_FINISH ? rc == Z_STREAM_END : z->zs.avail_out != 0)
            break;
    }
    z->inlen = 0;
    return QN_OK;
}

zipout *zipout_new(zipout_sink sink, void *arg, int level)
{
    zipout *z = calloc(1, sizeof(*z));
    if (!z)
        return NULL;
    z->sink = sink;
    z->arg = arg;
    z->level = level;
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm) && tm.tm_year >= 80) {
        z->dos_time = (uint16_t)(tm.tm_hour << 11 | tm.tm_min << 5 | tm.tm_sec / 2);
        z->dos_date = (uint16_t)((tm.tm_year - 80) << 9 | (tm.tm_mon + 1) << 5 | tm.tm_mday);
    } else {
        z->dos_date = 1 << 5 | 1; /* 1980-01-01 */
    }
    return z;
}

/* Ends the open entry: the rest of its deflate stream, then its data descriptor. */
static qn_status zo_end_entry(zipout *z)
{
    if (zo_deflate(z, Z_FINISH) != QN_OK)
        return z->st;
    if (z->usize > ZO_MAX || z->csize > ZO_MAX)
        return zo_fail(z, QN_EINVAL);
    zo_entry *e = &z->ents[z->n - 1];
    e->crc = z->crc;
    e->csize = (uint32_t)z->csize;
    e->usize = (uint32_t)z->usize;
    unsigned char d[16], *p = d;
    p = put32(p, ZO_DESC_SIG);
    p = put32(p, e->crc);
    p = put32(p, e->csize);
    put32(p, e->usize);
    z->open = 0;
    return zo_emit(z, d, sizeof(d));
}

qn_status zipout_begin(zipout *z, const char *name)
{
    if (z->st)
        return z->st;
    if (z->open && zo_end_entry(z) != QN_OK)
        return z->st;
    size_t nl = strlen(name);
    if (nl > ZO_MAX_ENTRY || z->n >= ZO_MAX_ENTRY)
        return zo_fail(z, QN_EINVAL);
    if (grow(&z->ents, &z->cap, z->n + 1, sizeof(*z->ents), 8) != QN_OK)
        return zo_fail(z, QN_ENOMEM);
    zo_entry *e = &z->ents[z->n];
    *e = (zo_entry){.name = strdup(name), .offset = (uint32_t)z->offset};
    if (!e->name)
        return zo_fail(z, QN_ENOMEM);
    z->n++;
    int rc = z->zinit
                 ? deflateReset(&z->zs)
                 : deflateInit2(&z->zs, z->level, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    if (rc != Z_OK)
        return zo_fail(z, rc == Z_MEM_ERROR ? QN_ENOMEM : QN_ERR);
    z->zinit = 1;
    z->open = 1;
    z->usize = z->csize = 0;
    z->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    unsigned char h[30], *p = h;
    p = put32(p, ZO_LOCAL_SIG);
    p = put16(p, ZO_VERSION);
    p = put16(p, ZO_FLAGS);
    p = put16(p, ZO_DEFLATE);
    p = put16(p, z->dos_time);
    p = put16(p, z->dos_date);
    p = put32(p, 0); /* CRC and sizes: in the data descriptor */
    p = put32(p, 0);
    p = put32(p, 0);
    p = put16(p, (unsigned)nl);
    put16(p, 0); /* no extra field */
    if (zo_emit(z, h, sizeof(h)) != QN_OK)
        return z->st;
    return zo_emit(z, name, nl);
}

qn_status zipout_write(zipout *z, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (z->st)
        return z->st;
    if (!z->open)
        return zo_fail(z, QN_EINVAL);
    z->crc = (uint32_t)crc32(z->crc, p, (uInt)len);
    z->usize += len;
    while (len > 0) {
        size_t n = ZO_BUF - z->inlen < len ? ZO_BUF - z->inlen : len;
        memcpy(z->in + z->inlen, p, n);
        z->inlen += n;
        p += n;
        len -= n;
        if (z->inlen == ZO_BUF && zo_deflate(z, Z_NO_FLUSH) != QN_OK)
            return z->st;
    }
    return QN_OK;
}

qn_status zipout_finish(zipout *z)
{
    if (z->st)
        return z->st;
    if (z->open && zo_end_entry(z) != QN_OK)
        return z->st;
    uint64_t cd_start = z->offset;
    for (size_t i = 0; i < z->n; i++) {
        const zo_entry *e = &z->ents[i];
        unsigned char h[46], *p = h;
        size_t nl = strlen(e->name);
        p = put32(p, ZO_CENTRAL_SIG);
        p = put16(p, ZO_VERSION); /* made by: MS-DOS attributes, version 2.0 */
        p = put16(p, ZO_VERSION);
        p = put16(p, ZO_FLAGS);
        p = put16(p, ZO_DEFLATE);
        p = put16(p, z->dos_time);
        p = put16(p, z->dos_date);
        p = put32(p, e->crc);
        p = put32(p, e->csize);
        p = put32(p, e->usize);
        p = put16(p, (unsigned)nl);
        p = put16(p, 0); /* extra */
        p = put16(p, 0); /* comment */
        p = put16(p, 0); /* disk */
        p = put16(p, 0); /* internal attributes */
        p = put32(p, 0); /* external attributes */
        put32(p, e->offset);
        if (zo_emit(z, h, sizeof(h)) != QN_OK || zo_emit(z, e->name, nl) != QN_OK)
            return z->st;
    }
    uint64_t cd_size = z->offset - cd_start;
    unsigned char end[22], *p = end;
    p = put32(p, ZO_END_SIG);
    p = put16(p, 0); /* this disk */
    p = put16(p, 0); /* the disk with the central directory */
    p = put16(p, (unsigned)z->n);
    p = put16(p, (unsigned)z->n);
    p = put32(p, (uint32_t)cd_size);
    p = put32(p, (uint32_t)cd_start);
    put16(p, 0); /* no comment */
    return zo_emit(z, end, sizeof(end));
}

void zipout_free(zipout *z)
{
    if (!z)
        return;
    if (z->zinit)
        deflateEnd(&z->zs);
    for (size_t i = 0; i < z->n; i++)
        free(z->ents[i].name);
    free(z->ents);
    free(z);
}
