/*
 * The workbook package: see xlzip.h. Small parts (workbook.xml, .rels) are read whole and
 * parsed at once; the sheet and the shared strings are streamed (xlzip_stream).
 */
#include "xlzip.h"

#include <expat.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#include <wmmintrin.h>
#define XLZIP_CLMUL 1
#endif

#define PART_MAX_BYTES (16u << 20) /* workbook.xml and .rels parts */
#define XLZIP_IN       (64u << 10) /* compressed bytes read at a time */

void xlzip_close(xlzip_book *b)
{
    if (b->zip)
        zip_discard(b->zip);
    b->zip = NULL;
}

/* Reads a whole (small) part into a NUL-terminated buffer, refusing more than max bytes. */
static qn_status part_read(xlzip_book *b, zip_int64_t idx, const char *name, size_t max, char **out,
                           size_t *outlen, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    zip_file_t *zf = NULL;
    char *buf = NULL;
    zip_stat_t zs;
    zip_stat_init(&zs);
    if (zip_stat_index(b->zip, (zip_uint64_t)idx, 0, &zs) != 0) {
        qn_errf(err, errlen, "spreadsheet: %s: %s", name, zip_strerror(b->zip));
        goto done;
    }
    if ((zs.valid & ZIP_STAT_SIZE) && zs.size > max) {
        qn_errf(err, errlen, "spreadsheet: %s is too large (%llu bytes uncompressed, limit %zu)",
                name, (unsigned long long)zs.size, max);
        goto done;
    }
    zf = zip_fopen_index(b->zip, (zip_uint64_t)idx, 0);
    if (!zf) {
        qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", name, zip_strerror(b->zip));
        goto done;
    }
    size_t cap = (zs.valid & ZIP_STAT_SIZE) ? (size_t)zs.size : 4096;
    buf = malloc(cap + 1);
    if (!buf) {
        st = QN_ENOMEM;
        goto done;
    }
    size_t len = 0;
    for (;;) {
        if (len == cap) {
            /* The declared size was a lie (or unknown): grow, but never past max. */
            if (cap >= max) {
                qn_errf(err, errlen, "spreadsheet: %s is too large (limit %zu bytes)", name, max);
                goto done;
            }
            size_t ncap = cap * 2 < max ? cap * 2 : max;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                st = QN_ENOMEM;
                goto done;
            }
            buf = nb;
            cap = ncap;
        }
        zip_int64_t n = zip_fread(zf, buf + len, cap - len);
        if (n < 0) {
            qn_errf(err, errlen, "spreadsheet: reading %s: %s", name,
                    zip_error_strerror(zip_file_get_error(zf)));
            goto done;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *out = buf;
    *outlen = len;
    buf = NULL;
    st = QN_OK;
done:
    if (zf)
        zip_fclose(zf);
    free(buf);
    return st;
}

const char *xlzip_local_name(const char *n)
{
    const char *bar = strrchr(n, XLZIP_NS_SEP);
    return bar ? bar + 1 : n;
}

static void XMLCALL small_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                                  const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    XML_Parser p = ud;
    XML_StopParser(p, XML_FALSE);
}

/* Parses a small XML document in one go with a namespace-aware expat; DTDs are refused. */
static qn_status xml_parse_all(const char *buf, size_t len, const char *name,
                               XML_StartElementHandler start, void *ud, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    XML_Parser p = XML_ParserCreateNS("UTF-8", XLZIP_NS_SEP);
    if (!p)
        return QN_ENOMEM;
    XML_SetStartElementHandler(p, start);
    /* The doctype handler gets the parser itself, to stop it: DTDs have no place in OOXML. */
    XML_SetStartDoctypeDeclHandler(p, small_doctype);
    XML_UseParserAsHandlerArg(p);
    XML_SetUserData(p, ud);
    if (XML_Parse(p, buf, (int)len, XML_TRUE) != XML_STATUS_OK) {
        qn_errf(err, errlen, "spreadsheet: %s: %s at line %lu", name,
                XML_GetErrorCode(p) == XML_ERROR_ABORTED ? "DTD not allowed"
                                                         : XML_ErrorString(XML_GetErrorCode(p)),
                (unsigned long)XML_GetCurrentLineNumber(p));
        goto done;
    }
    st = QN_OK;
done:
    XML_ParserFree(p);
    return st;
}

/* With XML_UseParserAsHandlerArg the handlers get the parser; the state is its user data. */
#define XML_UD(arg) XML_GetUserData((XML_Parser)(arg))

/* Relationship lookup: by Id, or by the suffix of its Type. */
typedef struct rel_find {
    const char *id;          /* wanted Id, or NULL */
    const char *type_suffix; /* wanted Type suffix, or NULL */
    char target[512];
    int found;
} rel_find;

static void XMLCALL rel_start(void *arg, const XML_Char *name, const XML_Char **atts)
{
    rel_find *rf = XML_UD(arg);
    if (rf->found || strcmp(xlzip_local_name(name), "Relationship") != 0)
        return;
    const char *id = NULL, *type = NULL, *target = NULL, *mode = NULL;
    for (int i = 0; atts[i]; i += 2) {
        if (strcmp(atts[i], "Id") == 0)
            id = atts[i + 1];
        else if (strcmp(atts[i], "Type") == 0)
            type = atts[i + 1];
        else if (strcmp(atts[i], "Target") == 0)
            target = atts[i + 1];
        else if (strcmp(atts[i], "TargetMode") == 0)
            mode = atts[i + 1];
    }
    if (!target || (mode && strcmp(mode, "External") == 0))
        return;
    if (rf->id && (!id || strcmp(id, rf->id) != 0))
        return;
    if (rf->type_suffix) {
        size_t tl = type ? strlen(type) : 0, sl = strlen(rf->type_suffix);
        if (tl < sl || strcmp(type + tl - sl, rf->type_suffix) != 0)
            return;
    }
    snprintf(rf->target, sizeof(rf->target), "%s", target);
    rf->found = 1;
}

/* First <sheet> of <sheets>: its relationship id (r:id, in whatever namespace). */
typedef struct wb_find {
    char rid[256];
    int found;
} wb_find;

static void XMLCALL wb_start(void *arg, const XML_Char *name, const XML_Char **atts)
{
    wb_find *wf = XML_UD(arg);
    if (wf->found || strcmp(xlzip_local_name(name), "sheet") != 0)
        return;
    for (int i = 0; atts[i]; i += 2) {
        const char *bar = strrchr(atts[i], XLZIP_NS_SEP);
        if (bar && strcmp(bar + 1, "id") == 0) {
            snprintf(wf->rid, sizeof(wf->rid), "%s", atts[i + 1]);
            wf->found = 1;
            return;
        }
    }
}

/* Resolves a relationship target against the directory of the source part (OPC: a leading
 * '/' is the package root), normalising "." and "..". */
static int part_resolve(const char *source_dir, const char *target, char *out, size_t outlen)
{
    char tmp[1024];
    int n = target[0] == '/' ? snprintf(tmp, sizeof(tmp), "%s", target + 1)
                             : snprintf(tmp, sizeof(tmp), "%s%s", source_dir, target);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return -1;
    size_t o = 0;
    char *save = NULL;
    for (char *seg = strtok_r(tmp, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
        if (strcmp(seg, ".") == 0)
            continue;
        if (strcmp(seg, "..") == 0) {
            if (o == 0)
                return -1;
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--; /* the '/' before the dropped segment */
            continue;
        }
        size_t sl = strlen(seg);
        if (o + (o ? 1 : 0) + sl + 1 > outlen)
            return -1;
        if (o)
            out[o++] = '/';
        memcpy(out + o, seg, sl);
        o += sl;
    }
    if (o == 0)
        return -1;
    out[o] = '\0';
    return 0;
}

/* Finds a relationship in the .rels part of source_part; 0 found, 1 absent, -1 error. */
static int rels_lookup(xlzip_book *b, const char *source_part, const char *id,
                       const char *type_suffix, char *target_part, size_t tplen, char *err,
                       size_t errlen)
{
    char dir[512], rels[600];
    const char *slash = strrchr(source_part, '/');
    size_t dl = slash ? (size_t)(slash - source_part + 1) : 0;
    if (dl >= sizeof(dir))
        return -1;
    memcpy(dir, source_part, dl);
    dir[dl] = '\0';
    snprintf(rels, sizeof(rels), "%s_rels/%s.rels", dir, slash ? slash + 1 : source_part);
    zip_int64_t idx = zip_name_locate(b->zip, rels, ZIP_FL_NOCASE);
    if (idx < 0)
        return 1;
    char *buf = NULL;
    size_t len = 0;
    if (part_read(b, idx, rels, PART_MAX_BYTES, &buf, &len, err, errlen) != QN_OK)
        return -1;
    rel_find rf = {.id = id, .type_suffix = type_suffix};
    qn_status st = xml_parse_all(buf, len, rels, rel_start, &rf, err, errlen);
    free(buf);
    if (st != QN_OK)
        return -1;
    if (!rf.found)
        return 1;
    if (part_resolve(dir, rf.target, target_part, tplen) != 0) {
        qn_errf(err, errlen, "spreadsheet: %s: bad target \"%s\"", rels, rf.target);
        return -1;
    }
    return 0;
}

qn_status xlzip_open(const char *path, const sheet_limits *lim, xlzip_book *b, char *err,
                     size_t errlen)
{
    qn_status st = QN_EINVAL;
    char *wbuf = NULL;
    memset(b, 0, sizeof(*b));
    b->sheet_idx = b->sst_idx = -1;
    int zerr = 0;
    b->zip = zip_open(path, ZIP_RDONLY, &zerr);
    if (!b->zip) {
        zip_error_t ze;
        zip_error_init_with_code(&ze, zerr);
        qn_errf(err, errlen, "spreadsheet: not a readable xlsx (zip) file: %s",
                zip_error_strerror(&ze));
        zip_error_fini(&ze);
        st = (zerr == ZIP_ER_OPEN || zerr == ZIP_ER_READ) ? QN_ERR : QN_EINVAL;
        goto fail;
    }
    zip_int64_t n = zip_get_num_entries(b->zip, 0);
    if (n > lim->max_entries) {
        qn_errf(err, errlen, "spreadsheet: the archive has %lld entries (limit %lld)", (long long)n,
                (long long)lim->max_entries);
        goto fail;
    }

    /* _rels/.rels names the workbook part; xl/workbook.xml when the package has no root rels. */
    char wb_part[512] = "xl/workbook.xml";
    int r = rels_lookup(b, "", NULL, "/officeDocument", wb_part, sizeof(wb_part), err, errlen);
    if (r < 0)
        goto fail;
    if (r > 0)
        snprintf(wb_part, sizeof(wb_part), "xl/workbook.xml");
    zip_int64_t wi = zip_name_locate(b->zip, wb_part, ZIP_FL_NOCASE);
    if (wi < 0) {
        qn_errf(err, errlen, "spreadsheet: no workbook part (%s) in the archive", wb_part);
        goto fail;
    }
    size_t wlen = 0;
    st = part_read(b, wi, wb_part, PART_MAX_BYTES, &wbuf, &wlen, err, errlen);
    if (st != QN_OK)
        goto fail;
    st = QN_EINVAL;
    wb_find wf = {{0}};
    if (xml_parse_all(wbuf, wlen, wb_part, wb_start, &wf, err, errlen) != QN_OK)
        goto fail;
    if (!wf.found) {
        qn_errf(err, errlen, "spreadsheet: the workbook has no sheet");
        goto fail;
    }
    r = rels_lookup(b, wb_part, wf.rid, NULL, b->sheet_part, sizeof(b->sheet_part), err, errlen);
    if (r < 0)
        goto fail;
    if (r > 0) {
        qn_errf(err, errlen, "spreadsheet: the first sheet's relationship %s is missing", wf.rid);
        goto fail;
    }
    b->sheet_idx = zip_name_locate(b->zip, b->sheet_part, ZIP_FL_NOCASE);
    if (b->sheet_idx < 0) {
        qn_errf(err, errlen, "spreadsheet: the first sheet (%s) is missing from the archive",
                b->sheet_part);
        goto fail;
    }
    char sst_part[512];
    r = rels_lookup(b, wb_part, NULL, "/sharedStrings", sst_part, sizeof(sst_part), err, errlen);
    if (r < 0)
        goto fail;
    if (r == 0) {
        b->sst_idx = zip_name_locate(b->zip, sst_part, ZIP_FL_NOCASE);
        if (b->sst_idx < 0) {
            qn_errf(err, errlen, "spreadsheet: the shared strings (%s) are missing", sst_part);
            goto fail;
        }
    }
    free(wbuf);
    return QN_OK;
fail:
    free(wbuf);
    xlzip_close(b);
    return st == QN_OK ? QN_EINVAL : st;
}

qn_status xlzip_stream_open(xlzip_book *b, zip_int64_t idx, uint64_t max, const char *what,
                            xlzip_stream *zs, char *err, size_t errlen)
{
    zip_stat_t st;
    zip_stat_init(&st);
    memset(zs, 0, sizeof(*zs));
    zs->max = max;
    zs->what = what;
    if (zip_stat_index(b->zip, (zip_uint64_t)idx, 0, &st) != 0) {
        qn_errf(err, errlen, "spreadsheet: %s: %s", what, zip_strerror(b->zip));
        return QN_EINVAL;
    }
    if ((st.valid & ZIP_STAT_SIZE) && st.size > max) {
        qn_errf(err, errlen,
                "spreadsheet: %s is too large (%llu bytes uncompressed, limit %llu): refused", what,
                (unsigned long long)st.size, (unsigned long long)max);
        return QN_EINVAL;
    }
    /* A deflated part is read raw and inflated here: libzip would check its CRC with zlib's
     * crc32, a sixth of a row count's time (xlzip_crc32 takes a fifth of that). */
    const zip_uint64_t known = ZIP_STAT_CRC | ZIP_STAT_COMP_METHOD | ZIP_STAT_ENCRYPTION_METHOD;
    int direct = (st.valid & known) == known && st.comp_method == ZIP_CM_DEFLATE &&
                 st.encryption_method == ZIP_EM_NONE;
    zs->zf = zip_fopen_index(b->zip, (zip_uint64_t)idx, direct ? ZIP_FL_COMPRESSED : 0);
    if (!zs->zf) {
        qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", what, zip_strerror(b->zip));
        return QN_EINVAL;
    }
    if (direct) {
        if (inflateInit2(&zs->z, -MAX_WBITS) != Z_OK) {
            xlzip_stream_close(zs);
            qn_errf(err, errlen, "spreadsheet: out of memory");
            return QN_ENOMEM;
        }
        zs->in = malloc(XLZIP_IN);
        if (!zs->in) {
            inflateEnd(&zs->z);
            xlzip_stream_close(zs);
            qn_errf(err, errlen, "spreadsheet: out of memory");
            return QN_ENOMEM;
        }
        zs->want_crc = st.crc;
    }
    return QN_OK;
}

/* A failure of the direct path, worded by libzip as its own reader would word it. */
static void inflate_fail(xlzip_stream *zs, int ze_code, int sys, char *err, size_t errlen)
{
    zip_error_t ze;
    zip_error_init(&ze);
    zip_error_set(&ze, ze_code, sys);
    qn_errf(err, errlen, "spreadsheet: reading %s: %s", zs->what, zip_error_strerror(&ze));
    zip_error_fini(&ze);
}

/* xlzip_stream_read of a deflated part, as libzip's reader: a stream whose bytes end early ends
 * there, and at the end the CRC is checked (libzip 1.7 checks no size there: the one it would
 * compare is the one it inflated; the limit is xlzip_stream_read's). */
static zip_int64_t inflate_read(xlzip_stream *zs, char *buf, size_t len, char *err, size_t errlen)
{
    size_t got = 0;
    if (len > UINT_MAX)
        len = UINT_MAX;
    while (got < len && !zs->z_end && !zs->zerr) {
        if (zs->z.avail_in == 0 && !zs->in_end) {
            zip_int64_t n = zip_fread(zs->zf, zs->in, XLZIP_IN);
            if (n < 0) {
                qn_errf(err, errlen, "spreadsheet: reading %s: %s", zs->what,
                        zip_error_strerror(zip_file_get_error(zs->zf)));
                return -1;
            }
            zs->in_end = n == 0;
            zs->z.next_in = zs->in;
            zs->z.avail_in = (uInt)n;
        }
        zs->z.next_out = (Bytef *)buf + got;
        zs->z.avail_out = (uInt)(len - got);
        int r = inflate(&zs->z, Z_NO_FLUSH);
        size_t n = len - got - zs->z.avail_out;
        zs->crc = xlzip_crc32(zs->crc, buf + got, n);
        got += n;
        if (r == Z_STREAM_END || (r == Z_BUF_ERROR && zs->z.avail_in == 0 && zs->in_end))
            zs->z_end = 1;
        else if (r != Z_OK && !(r == Z_BUF_ERROR && zs->z.avail_in == 0))
            zs->zerr = r;
    }
    if (got > 0)
        return (zip_int64_t)got; /* a failure after these bytes comes with the next call */
    if (zs->zerr) {
        inflate_fail(zs, ZIP_ER_ZLIB, zs->zerr, err, errlen);
        return -1;
    }
    if (zs->crc != zs->want_crc) {
        inflate_fail(zs, ZIP_ER_CRC, 0, err, errlen);
        return -1;
    }
    return 0;
}

/* Bytes read (0 at the end), or -1 with err set. */
zip_int64_t xlzip_stream_read(xlzip_stream *zs, char *buf, size_t len, char *err, size_t errlen)
{
    zip_int64_t n = zs->in ? inflate_read(zs, buf, len, err, errlen) : zip_fread(zs->zf, buf, len);
    if (n < 0) {
        if (!zs->in)
            qn_errf(err, errlen, "spreadsheet: reading %s: %s", zs->what,
                    zip_error_strerror(zip_file_get_error(zs->zf)));
        return -1;
    }
    zs->total += (uint64_t)n;
    if (zs->total > zs->max) {
        qn_errf(err, errlen, "spreadsheet: %s inflates past the limit of %llu bytes: refused",
                zs->what, (unsigned long long)zs->max);
        return -1;
    }
    return n;
}

void xlzip_stream_close(xlzip_stream *zs)
{
    if (zs->in) {
        inflateEnd(&zs->z);
        free(zs->in);
        zs->in = NULL;
    }
    if (zs->zf)
        zip_fclose(zs->zf);
    zs->zf = NULL;
}

/* ---------------------------------------------------------------- CRC-32 */

#ifdef XLZIP_CLMUL
/*
 * The CRC-32 of len bytes (at least 64, a multiple of 16) by carry-less multiplication, crc
 * and result inverted as the polynomial arithmetic wants them: "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ Instruction" (Gopal et al., Intel, 2009), with its
 * constants for the bit-reflected polynomial 0xEDB88320: four 16-byte lanes folded 64 bytes
 * ahead (k1, k2), folded into one (k3, k4), 128 bits to 64 (k5), then Barrett's reduction
 * (P', P). The folding of Linux's crc32-pclmul and Chromium's zlib.
 */
__attribute__((target("pclmul"))) static uint32_t crc_fold(uint32_t crc, const unsigned char *p,
                                                           size_t len)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p);
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    __m128i t;
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    for (p += 64, len -= 64; len >= 64; p += 64, len -= 64) {
        __m128i y1 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        __m128i y2 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        __m128i y3 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        __m128i y4 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
        x2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
        x3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
        x4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, y1), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(x2, y2), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(x3, y3), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(x4, y4), _mm_loadu_si128((const __m128i *)(p + 48)));
    }
    t = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x2), t);
    t = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x3), t);
    t = _mm_clmulepi64_si128(x1, k3k4, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, k3k4, 0x11), x4), t);
    for (; len >= 16; p += 16, len -= 16) {
        t = _mm_clmulepi64_si128(x1, k3k4, 0x00);
        x1 = _mm_clmulepi64_si128(x1, k3k4, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)p)), t);
    }
    t = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
    t = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), t);
    t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, t);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x1, 4));
}
#endif

uint32_t xlzip_crc32(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
#ifdef XLZIP_CLMUL
    if (len >= 64 && __builtin_cpu_supports("pclmul")) {
        size_t n = len & ~(size_t)15;
        crc = ~crc_fold(~crc, p, n);
        p += n;
        len -= n;
    }
#endif
    return (uint32_t)crc32_z(crc, p, len);
}
