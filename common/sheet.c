/*
 * Spreadsheet reader: see sheet.h. Layout of this file:
 *   limits and errors
 *   the package (zip): parts, relationships, locating the first sheet
 *   shared strings
 *   xlsx rows: expat, suspended at the end of every row
 *   csv rows
 *   rows, header
 *   counting: a structural scanner over the inflated XML (the benchmarked path)
 */
#include "sheet.h"

#include <errno.h>
#include <expat.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zip.h>

#define NS_SEP         '|'         /* expat namespace separator: names arrive as "uri|local" */
#define PART_MAX_BYTES (16u << 20) /* workbook.xml and .rels parts */
#define XML_CHUNK      (256u << 10)
#define CSV_CHUNK      (64u << 10)

enum { KIND_XLSX = 1, KIND_CSV };

void sheet_limits_resolve(const sheet_limits *lim, sheet_limits *out)
{
    sheet_limits d = {
        .max_sheet_bytes = 1ULL << 30,
        .max_sst_bytes = 256ULL << 20,
        .max_entries = 10000,
        .max_strings = 5000000,
        .max_cell_bytes = 131072,
        .max_row_bytes = 4u << 20,
    };
    if (lim) {
        if (lim->max_sheet_bytes)
            d.max_sheet_bytes = lim->max_sheet_bytes;
        if (lim->max_sst_bytes)
            d.max_sst_bytes = lim->max_sst_bytes;
        if (lim->max_entries)
            d.max_entries = lim->max_entries;
        if (lim->max_strings)
            d.max_strings = lim->max_strings;
        if (lim->max_cell_bytes)
            d.max_cell_bytes = lim->max_cell_bytes;
        if (lim->max_row_bytes)
            d.max_row_bytes = lim->max_row_bytes;
    }
    *out = d;
}

/* A growable byte buffer with a hard cap. */
typedef struct gbuf {
    char *p;
    size_t len, cap;
} gbuf;

static int gbuf_reserve(gbuf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int gbuf_append(gbuf *b, const char *s, size_t n)
{
    if (gbuf_reserve(b, n + 1) != 0)
        return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}

/* ---------------------------------------------------------------- package (zip) */

/* The parts of the workbook the reader needs. */
typedef struct book {
    zip_t *zip;
    zip_int64_t sheet_idx; /* the first sheet's XML */
    zip_int64_t sst_idx;   /* sharedStrings.xml, -1 if none */
    char sheet_part[512];
} book;

static void book_close(book *b)
{
    if (b->zip)
        zip_discard(b->zip);
    b->zip = NULL;
}

/* Reads a whole (small) part into a NUL-terminated buffer, refusing more than max bytes. */
static qn_status part_read(book *b, zip_int64_t idx, const char *name, size_t max, char **out,
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

/* "uri|local" or "local" -> "local". */
static const char *local_name(const char *n)
{
    const char *bar = strrchr(n, NS_SEP);
    return bar ? bar + 1 : n;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Parses a small XML document in one go with a namespace-aware expat; DTDs are refused. */
typedef struct xml_small {
    int refused;
} xml_small;

static void XMLCALL small_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                                  const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    XML_Parser p = ud;
    XML_StopParser(p, XML_FALSE);
}

static qn_status xml_parse_all(const char *buf, size_t len, const char *name,
                               XML_StartElementHandler start, void *ud, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    XML_Parser p = XML_ParserCreateNS("UTF-8", NS_SEP);
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
    if (rf->found || strcmp(local_name(name), "Relationship") != 0)
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
    if (wf->found || strcmp(local_name(name), "sheet") != 0)
        return;
    for (int i = 0; atts[i]; i += 2) {
        const char *bar = strrchr(atts[i], NS_SEP);
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
static int rels_lookup(book *b, const char *source_part, const char *id, const char *type_suffix,
                       char *target_part, size_t tplen, char *err, size_t errlen)
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

static qn_status book_open(const char *path, const sheet_limits *lim, book *b, char *err,
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
    book_close(b);
    return st == QN_OK ? QN_EINVAL : st;
}

/* A streamed part: inflated chunk by chunk, the real size checked against the limit (the
 * declared size is checked first, but a zip can lie about it). */
typedef struct zstream {
    zip_file_t *zf;
    uint64_t total, max;
    const char *what;
} zstream;

static qn_status zstream_open(book *b, zip_int64_t idx, uint64_t max, const char *what, zstream *zs,
                              char *err, size_t errlen)
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
    zs->zf = zip_fopen_index(b->zip, (zip_uint64_t)idx, 0);
    if (!zs->zf) {
        qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", what, zip_strerror(b->zip));
        return QN_EINVAL;
    }
    return QN_OK;
}

/* Bytes read (0 at the end), or -1 with err set. */
static zip_int64_t zstream_read(zstream *zs, char *buf, size_t len, char *err, size_t errlen)
{
    zip_int64_t n = zip_fread(zs->zf, buf, len);
    if (n < 0) {
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

static void zstream_close(zstream *zs)
{
    if (zs->zf)
        zip_fclose(zs->zf);
    zs->zf = NULL;
}

/* ---------------------------------------------------------------- shared strings */

/* <sst><si> text </si>...: the text of an <si> is its <t> elements, directly or in rich-text
 * runs <r>, but not the phonetic runs <rPh>. */
typedef struct sst_load {
    gbuf data;      /* strings, each NUL-terminated */
    uint64_t *off;  /* start of string i in data */
    int64_t n, cap; /* strings loaded */
    int count_only; /* only count and note empty strings (the counting path) */
    int any_empty;
    int in_si, in_t, in_rph;
    size_t si_start;
    const sheet_limits *lim;
    char err[256];
    XML_Parser p;
} sst_load;

static void sst_fail(sst_load *l, const char *msg)
{
    if (!l->err[0])
        snprintf(l->err, sizeof(l->err), "spreadsheet: shared strings: %s", msg);
    XML_StopParser(l->p, XML_FALSE);
}

static void XMLCALL sst_start(void *ud, const XML_Char *name, const XML_Char **atts)
{
    (void)atts;
    sst_load *l = ud;
    const char *ln = local_name(name);
    if (strcmp(ln, "si") == 0) {
        if (l->in_si)
            return sst_fail(l, "nested <si>");
        l->in_si = 1;
        l->si_start = l->data.len;
    } else if (l->in_si && strcmp(ln, "rPh") == 0) {
        l->in_rph++;
    } else if (l->in_si && !l->in_rph && strcmp(ln, "t") == 0) {
        l->in_t = 1;
    }
}

static void XMLCALL sst_end(void *ud, const XML_Char *name)
{
    sst_load *l = ud;
    const char *ln = local_name(name);
    if (strcmp(ln, "t") == 0) {
        l->in_t = 0;
    } else if (strcmp(ln, "rPh") == 0) {
        if (l->in_rph)
            l->in_rph--;
    } else if (strcmp(ln, "si") == 0 && l->in_si) {
        l->in_si = 0;
        if (l->n >= l->lim->max_strings)
            return sst_fail(l, "too many strings");
        if (l->count_only) {
            if (l->data.len == 0)
                l->any_empty = 1;
            l->data.len = 0;
            l->n++;
            return;
        }
        if (l->n == l->cap) {
            int64_t ncap = l->cap ? l->cap * 2 : 1024;
            uint64_t *no = realloc(l->off, (size_t)ncap * sizeof(*no));
            if (!no)
                return sst_fail(l, "out of memory");
            l->off = no;
            l->cap = ncap;
        }
        if (gbuf_append(&l->data, "", 1) != 0) /* the NUL */
            return sst_fail(l, "out of memory");
        l->off[l->n++] = l->si_start;
    }
}

static void XMLCALL sst_text(void *ud, const XML_Char *s, int len)
{
    sst_load *l = ud;
    if (!l->in_si || !l->in_t || l->in_rph)
        return;
    if (l->count_only) {
        /* Only emptiness matters: keep a length, no bytes. */
        l->data.len += (size_t)len;
        return;
    }
    if (l->data.len - l->si_start + (size_t)len > l->lim->max_cell_bytes)
        return sst_fail(l, "a string is longer than the cell limit");
    if (gbuf_append(&l->data, s, (size_t)len) != 0)
        return sst_fail(l, "out of memory");
}

static void XMLCALL sst_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                                const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    sst_fail(ud, "DTD not allowed");
}

/* Loads (or, count_only, just checks) the shared strings, streaming the part into expat. */
static qn_status sst_run(book *b, sst_load *l, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    zstream zs = {0};
    l->p = XML_ParserCreateNS("UTF-8", NS_SEP);
    if (!l->p)
        return QN_ENOMEM;
    XML_SetUserData(l->p, l);
    XML_SetElementHandler(l->p, sst_start, sst_end);
    XML_SetCharacterDataHandler(l->p, sst_text);
    XML_SetStartDoctypeDeclHandler(l->p, sst_doctype);
    if (zstream_open(b, b->sst_idx, l->lim->max_sst_bytes, "sharedStrings.xml", &zs, err, errlen) !=
        QN_OK)
        goto done;
    for (;;) {
        void *buf = XML_GetBuffer(l->p, XML_CHUNK);
        if (!buf) {
            st = QN_ENOMEM;
            goto done;
        }
        zip_int64_t n = zstream_read(&zs, buf, XML_CHUNK, err, errlen);
        if (n < 0)
            goto done;
        if (XML_ParseBuffer(l->p, (int)n, n == 0) != XML_STATUS_OK) {
            if (l->err[0])
                qn_errf(err, errlen, "%s", l->err);
            else
                qn_errf(err, errlen, "spreadsheet: sharedStrings.xml: %s at line %lu",
                        XML_ErrorString(XML_GetErrorCode(l->p)),
                        (unsigned long)XML_GetCurrentLineNumber(l->p));
            st = l->err[0] && strstr(l->err, "out of memory") ? QN_ENOMEM : QN_EINVAL;
            goto done;
        }
        if (n == 0)
            break;
    }
    st = QN_OK;
done:
    zstream_close(&zs);
    XML_ParserFree(l->p);
    l->p = NULL;
    return st;
}

/* ---------------------------------------------------------------- the reader */

enum { CELL_EMPTY = 0, CELL_ARENA, CELL_SST };

typedef struct cell_slot {
    int kind;
    size_t off; /* in the row arena or in the shared-string data */
} cell_slot;

enum { CSV_FIELD_START = 0, CSV_UNQUOTED, CSV_QUOTED, CSV_QUOTE_IN_QUOTED };

struct sheet {
    int kind;
    sheet_limits lim;
    char err[256];
    qn_status sticky; /* first error, returned again by every later call */
    int eof;

    /* the current raw row */
    int64_t row_num;
    gbuf arena; /* cell texts, NUL-terminated */
    cell_slot *slots;
    int nslots, slots_cap;
    const char **cells;
    int cells_cap;
    int row_ready;

    /* header (owned copy) */
    int hdr_state; /* 0 not read, 1 read, 2 none */
    int64_t hdr_num;
    char *hdr_data;
    const char **hdr_cells;
    int hdr_n;

    /* xlsx */
    book bk;
    zstream zs;
    XML_Parser xp;
    int suspended, final;
    sst_load sst;
    int in_sheetdata, in_row, in_cell, collecting, in_is, in_rph, depth, root_seen;
    int64_t prev_row;
    int prev_col, cell_col, cell_type_s;
    size_t cell_start;

    /* csv */
    FILE *fp;
    char *cbuf;
    size_t clen, cpos;
    int cstate, skip_lf, at_start;
    int64_t records;
};

static qn_status sheet_fail(sheet *s, qn_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static qn_status sheet_fail(sheet *s, qn_status st, const char *fmt, ...)
{
    if (!s->sticky) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(s->err, sizeof(s->err), fmt, ap);
        va_end(ap);
        s->sticky = st;
    }
    return s->sticky;
}

const char *sheet_error(const sheet *s)
{
    return s ? s->err : "";
}

/* Row assembly (both formats). */
static void row_reset(sheet *s)
{
    s->arena.len = 0;
    s->nslots = 0;
}

static int row_slot(sheet *s, int col)
{
    if (col >= SHEET_MAX_COLS)
        return -1;
    if (col >= s->slots_cap) {
        int ncap = s->slots_cap ? s->slots_cap : 16;
        while (ncap <= col)
            ncap *= 2;
        cell_slot *ns = realloc(s->slots, (size_t)ncap * sizeof(*ns));
        if (!ns)
            return -2;
        s->slots = ns;
        s->slots_cap = ncap;
    }
    while (s->nslots <= col)
        s->slots[s->nslots++] = (cell_slot){CELL_EMPTY, 0};
    return 0;
}

static const char *slot_text(const sheet *s, const cell_slot *c)
{
    switch (c->kind) {
    case CELL_ARENA:
        return s->arena.p + c->off;
    case CELL_SST:
        return s->sst.data.p + c->off;
    default:
        return "";
    }
}

static int row_nonempty(const sheet *s)
{
    for (int i = 0; i < s->nslots; i++)
        if (slot_text(s, &s->slots[i])[0])
            return 1;
    return 0;
}

static qn_status row_publish(sheet *s, sheet_row *row)
{
    if (s->nslots > s->cells_cap) {
        const char **nc = realloc(s->cells, (size_t)s->nslots * sizeof(*nc));
        if (!nc)
            return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
        s->cells = nc;
        s->cells_cap = s->nslots;
    }
    for (int i = 0; i < s->nslots; i++)
        s->cells[i] = slot_text(s, &s->slots[i]);
    row->number = s->row_num;
    row->ncells = s->nslots;
    row->cells = s->cells;
    return QN_OK;
}

/* ---- xlsx rows */

static void xfail(sheet *s, qn_status st, const char *msg)
{
    sheet_fail(s, st, "spreadsheet: %s at line %lu", msg,
               (unsigned long)XML_GetCurrentLineNumber(s->xp));
    XML_StopParser(s->xp, XML_FALSE);
}

/* "BC12" -> column 54 (0-based); -1 if not a cell reference. */
static int col_of_ref(const char *r)
{
    int col = 0, letters = 0;
    for (; *r >= 'A' && *r <= 'Z'; r++) {
        col = col * 26 + (*r - 'A' + 1);
        if (++letters > 3)
            return -1;
    }
    if (letters == 0 || col > SHEET_MAX_COLS)
        return -1;
    for (; *r; r++)
        if (*r < '0' || *r > '9')
            return -1;
    return col - 1;
}

static int parse_i64(const char *p, int64_t *out)
{
    int64_t v = 0;
    while (is_ws(*p))
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    while (is_ws(*p))
        p++;
    if (*p)
        return -1;
    *out = v;
    return 0;
}

static void XMLCALL xs_start(void *ud, const XML_Char *name, const XML_Char **atts)
{
    sheet *s = ud;
    const char *ln = local_name(name);
    s->depth++;
    if (!s->root_seen) {
        s->root_seen = 1;
        if (strcmp(ln, "worksheet") != 0)
            return xfail(s, QN_EINVAL, "the first sheet is not a worksheet");
        return;
    }
    if (!s->in_sheetdata) {
        if (s->depth == 2 && strcmp(ln, "sheetData") == 0)
            s->in_sheetdata = 1;
        return;
    }
    if (!s->in_row) {
        if (s->depth != 3 || strcmp(ln, "row") != 0)
            return;
        int64_t r = s->prev_row + 1;
        for (int i = 0; atts[i]; i += 2)
            if (strcmp(atts[i], "r") == 0 && (parse_i64(atts[i + 1], &r) != 0 || r < 1))
                return xfail(s, QN_EINVAL, "bad row number");
        if (r <= s->prev_row)
            return xfail(s, QN_EINVAL, "row numbers are not ascending");
        s->in_row = 1;
        s->row_num = s->prev_row = r;
        s->prev_col = -1;
        row_reset(s);
        return;
    }
    if (!s->in_cell) {
        if (s->depth != 4 || strcmp(ln, "c") != 0)
            return;
        int col = s->prev_col + 1, is_s = 0;
        for (int i = 0; atts[i]; i += 2) {
            if (strcmp(atts[i], "r") == 0) {
                col = col_of_ref(atts[i + 1]);
                if (col < 0)
                    return xfail(s, QN_EINVAL, "bad cell reference");
            } else if (strcmp(atts[i], "t") == 0) {
                is_s = strcmp(atts[i + 1], "s") == 0;
            }
        }
        if (col >= SHEET_MAX_COLS)
            return xfail(s, QN_EINVAL, "too many columns");
        s->in_cell = 1;
        s->cell_col = s->prev_col = col;
        s->cell_type_s = is_s;
        s->cell_start = s->arena.len;
        return;
    }
    /* Inside <c>: the value is <v> text, or the <t> texts of <is> (also inside rich-text runs
     * <r>, not inside phonetic runs <rPh>). */
    if (s->depth == 5 && strcmp(ln, "v") == 0) {
        s->collecting = 1;
    } else if (s->depth == 5 && strcmp(ln, "is") == 0) {
        s->in_is = 1;
    } else if (s->in_is && strcmp(ln, "rPh") == 0) {
        s->in_rph++;
    } else if (s->in_is && !s->in_rph && strcmp(ln, "t") == 0) {
        s->collecting = 1;
    }
}

static void XMLCALL xs_end(void *ud, const XML_Char *name)
{
    sheet *s = ud;
    int depth = s->depth--;
    if (!s->in_sheetdata)
        return;
    const char *ln = local_name(name);
    if (s->in_cell && depth == 4) { /* </c> */
        s->in_cell = s->collecting = s->in_is = s->in_rph = 0;
        if (gbuf_append(&s->arena, "", 1) != 0)
            return xfail(s, QN_ENOMEM, "out of memory");
        int rc = row_slot(s, s->cell_col);
        if (rc != 0)
            return xfail(s, rc == -2 ? QN_ENOMEM : QN_EINVAL, "too many columns");
        cell_slot *c = &s->slots[s->cell_col];
        if (s->cell_type_s) {
            int64_t idx;
            const char *txt = s->arena.p + s->cell_start;
            if (!txt[0]) {
                *c = (cell_slot){CELL_EMPTY, 0};
            } else if (parse_i64(txt, &idx) != 0 || idx >= s->sst.n) {
                return xfail(s, QN_EINVAL, "bad shared string index");
            } else {
                *c = (cell_slot){CELL_SST, s->sst.off[idx]};
            }
            s->arena.len = s->cell_start; /* the index text is no longer needed */
        } else {
            *c = (cell_slot){CELL_ARENA, s->cell_start};
        }
        return;
    }
    if (s->in_cell) {
        if (strcmp(ln, "v") == 0 || strcmp(ln, "t") == 0)
            s->collecting = 0;
        else if (strcmp(ln, "is") == 0)
            s->in_is = 0;
        else if (strcmp(ln, "rPh") == 0 && s->in_rph)
            s->in_rph--;
        return;
    }
    if (s->in_row && depth == 3) { /* </row> */
        s->in_row = 0;
        s->row_ready = 1;
        XML_StopParser(s->xp, XML_TRUE); /* resumed by the next sheet_next_row */
        return;
    }
    if (depth == 2)
        s->in_sheetdata = 0;
}

static void XMLCALL xs_text(void *ud, const XML_Char *t, int len)
{
    sheet *s = ud;
    if (!s->collecting)
        return;
    if (s->arena.len - s->cell_start + (size_t)len > s->lim.max_cell_bytes)
        return xfail(s, QN_EINVAL, "a cell is longer than the limit");
    if (s->arena.len + (size_t)len > s->lim.max_row_bytes)
        return xfail(s, QN_EINVAL, "a row is longer than the limit");
    if (gbuf_append(&s->arena, t, (size_t)len) != 0)
        return xfail(s, QN_ENOMEM, "out of memory");
}

static void XMLCALL xs_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                               const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    xfail(ud, QN_EINVAL, "DTD not allowed");
}

static qn_status xlsx_parse_error(sheet *s)
{
    if (s->sticky)
        return s->sticky;
    return sheet_fail(s, QN_EINVAL, "spreadsheet: %s: %s at line %lu", s->bk.sheet_part,
                      XML_ErrorString(XML_GetErrorCode(s->xp)),
                      (unsigned long)XML_GetCurrentLineNumber(s->xp));
}

/* Parses until a row is complete (s->row_ready) or the document ends (s->eof). */
static qn_status xlsx_raw_next(sheet *s)
{
    s->row_ready = 0;
    while (!s->row_ready) {
        enum XML_Status xs;
        if (s->suspended) {
            xs = XML_ResumeParser(s->xp);
        } else if (s->final) {
            if (!s->root_seen)
                return sheet_fail(s, QN_EINVAL, "spreadsheet: %s is empty", s->bk.sheet_part);
            s->eof = 1;
            return QN_OK;
        } else {
            void *buf = XML_GetBuffer(s->xp, XML_CHUNK);
            if (!buf)
                return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
            char msg[256];
            zip_int64_t n = zstream_read(&s->zs, buf, XML_CHUNK, msg, sizeof(msg));
            if (n < 0)
                return sheet_fail(s, QN_EINVAL, "%s", msg);
            s->final = n == 0;
            xs = XML_ParseBuffer(s->xp, (int)n, s->final);
        }
        if (xs == XML_STATUS_ERROR)
            return xlsx_parse_error(s);
        s->suspended = xs == XML_STATUS_SUSPENDED;
    }
    return QN_OK;
}

static qn_status xlsx_open(sheet *s, const char *path, char *err, size_t errlen)
{
    qn_status st = book_open(path, &s->lim, &s->bk, err, errlen);
    if (st != QN_OK)
        return st;
    s->sst.lim = &s->lim;
    if (s->bk.sst_idx >= 0) {
        st = sst_run(&s->bk, &s->sst, err, errlen);
        if (st != QN_OK)
            return st;
    }
    st = zstream_open(&s->bk, s->bk.sheet_idx, s->lim.max_sheet_bytes, s->bk.sheet_part, &s->zs,
                      err, errlen);
    if (st != QN_OK)
        return st;
    s->xp = XML_ParserCreateNS("UTF-8", NS_SEP);
    if (!s->xp)
        return QN_ENOMEM;
    XML_SetUserData(s->xp, s);
    XML_SetElementHandler(s->xp, xs_start, xs_end);
    XML_SetCharacterDataHandler(s->xp, xs_text);
    XML_SetStartDoctypeDeclHandler(s->xp, xs_doctype);
    return QN_OK;
}

/* ---- csv rows (RFC 4180: quotes doubled inside quoted fields; CRLF, LF or CR) */

static qn_status csv_end_field(sheet *s)
{
    if (gbuf_append(&s->arena, "", 1) != 0)
        return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
    int col = s->nslots;
    if (row_slot(s, col) != 0)
        return sheet_fail(s, QN_EINVAL, "spreadsheet: csv record %lld has too many fields",
                          (long long)s->records + 1);
    s->slots[col] = (cell_slot){CELL_ARENA, s->cell_start};
    s->cell_start = s->arena.len;
    return QN_OK;
}

static qn_status csv_byte(sheet *s, char c)
{
    if (s->arena.len - s->cell_start >= s->lim.max_cell_bytes)
        return sheet_fail(s, QN_EINVAL, "spreadsheet: csv record %lld: a field is too long",
                          (long long)s->records + 1);
    if (s->arena.len >= s->lim.max_row_bytes)
        return sheet_fail(s, QN_EINVAL, "spreadsheet: csv record %lld is too long",
                          (long long)s->records + 1);
    if (gbuf_append(&s->arena, &c, 1) != 0)
        return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
    return QN_OK;
}

static qn_status csv_raw_next(sheet *s)
{
    s->row_ready = 0;
    row_reset(s);
    s->cell_start = 0;
    s->cstate = CSV_FIELD_START;
    int any = 0; /* the record has a byte or a delimiter */
    for (;;) {
        if (s->cpos == s->clen) {
            s->clen = fread(s->cbuf, 1, CSV_CHUNK, s->fp);
            s->cpos = 0;
            if (s->clen == 0) {
                if (ferror(s->fp))
                    return sheet_fail(s, QN_ERR, "spreadsheet: reading the csv file: %s",
                                      strerror(errno));
                if (s->cstate == CSV_QUOTED)
                    return sheet_fail(s, QN_EINVAL,
                                      "spreadsheet: csv record %lld: unterminated quoted field",
                                      (long long)s->records + 1);
                if (!any) {
                    s->eof = 1;
                    return QN_OK;
                }
                goto record;
            }
            if (s->at_start) {
                s->at_start = 0;
                if (s->clen >= 3 && memcmp(s->cbuf, "\xEF\xBB\xBF", 3) == 0)
                    s->cpos = 3; /* UTF-8 byte-order mark */
            }
        }
        char c = s->cbuf[s->cpos++];
        if (c == '\0')
            return sheet_fail(s, QN_EINVAL, "spreadsheet: csv file contains a NUL byte (binary?)");
        if (s->skip_lf) {
            s->skip_lf = 0;
            if (c == '\n')
                continue;
        }
        qn_status st = QN_OK;
        switch (s->cstate) {
        case CSV_QUOTED:
            if (c == '"')
                s->cstate = CSV_QUOTE_IN_QUOTED;
            else
                st = csv_byte(s, c);
            break;
        case CSV_QUOTE_IN_QUOTED:
            if (c == '"') {
                s->cstate = CSV_QUOTED;
                st = csv_byte(s, c);
                break;
            }
            if (c != ',' && c != '\n' && c != '\r')
                return sheet_fail(s, QN_EINVAL,
                                  "spreadsheet: csv record %lld: text after a closing quote",
                                  (long long)s->records + 1);
            /* the field ended: handle c as after an unquoted field */
            __attribute__((fallthrough));
        default:
            if (c == ',') {
                st = csv_end_field(s);
                s->cstate = CSV_FIELD_START;
                any = 1;
            } else if (c == '\n' || c == '\r') {
                s->skip_lf = c == '\r';
                goto record;
            } else if (s->cstate == CSV_FIELD_START && c == '"') {
                s->cstate = CSV_QUOTED;
                any = 1;
            } else {
                /* A quote inside an unquoted field is kept as it is (lenient, like Excel). */
                s->cstate = CSV_UNQUOTED;
                st = csv_byte(s, c);
                any = 1;
            }
        }
        if (st != QN_OK)
            return st;
    }
record : {
    qn_status st = csv_end_field(s);
    if (st != QN_OK)
        return st;
    s->records++;
    s->row_num = s->records;
    s->row_ready = 1;
    return QN_OK;
}
}

/* ---- rows, header */

static qn_status raw_next(sheet *s)
{
    if (s->sticky)
        return s->sticky;
    return s->kind == KIND_XLSX ? xlsx_raw_next(s) : csv_raw_next(s);
}

/* The next non-empty raw row, QN_ENOTFOUND at the end. */
static qn_status nonempty_next(sheet *s)
{
    for (;;) {
        if (s->eof)
            return QN_ENOTFOUND;
        qn_status st = raw_next(s);
        if (st != QN_OK)
            return st;
        if (s->row_ready && row_nonempty(s))
            return QN_OK;
    }
}

static qn_status header_load(sheet *s)
{
    if (s->hdr_state)
        return s->hdr_state == 1 ? QN_OK : QN_ENOTFOUND;
    qn_status st = nonempty_next(s);
    if (st == QN_ENOTFOUND)
        s->hdr_state = 2;
    if (st != QN_OK)
        return st;
    size_t bytes = 0;
    for (int i = 0; i < s->nslots; i++)
        bytes += strlen(slot_text(s, &s->slots[i])) + 1;
    s->hdr_data = malloc(bytes ? bytes : 1);
    s->hdr_cells = malloc((size_t)(s->nslots ? s->nslots : 1) * sizeof(*s->hdr_cells));
    if (!s->hdr_data || !s->hdr_cells)
        return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
    size_t o = 0;
    for (int i = 0; i < s->nslots; i++) {
        const char *t = slot_text(s, &s->slots[i]);
        size_t l = strlen(t) + 1;
        memcpy(s->hdr_data + o, t, l);
        s->hdr_cells[i] = s->hdr_data + o;
        o += l;
    }
    s->hdr_n = s->nslots;
    s->hdr_num = s->row_num;
    s->hdr_state = 1;
    return QN_OK;
}

qn_status sheet_header(sheet *s, sheet_row *row)
{
    qn_status st = header_load(s);
    if (st != QN_OK)
        return st;
    row->number = s->hdr_num;
    row->ncells = s->hdr_n;
    row->cells = s->hdr_cells;
    return QN_OK;
}

static void trim(const char **p, size_t *n)
{
    while (*n && is_ws(**p))
        (*p)++, (*n)--;
    while (*n && is_ws((*p)[*n - 1]))
        (*n)--;
}

int sheet_header_index(sheet *s, const char *name)
{
    if (header_load(s) != QN_OK)
        return -1;
    const char *want = name;
    size_t wn = strlen(name);
    trim(&want, &wn);
    for (int i = 0; i < s->hdr_n; i++) {
        const char *h = s->hdr_cells[i];
        size_t hn = strlen(h);
        trim(&h, &hn);
        if (hn == wn && memcmp(h, want, wn) == 0)
            return i;
    }
    return -1;
}

qn_status sheet_next_row(sheet *s, sheet_row *row)
{
    qn_status st = header_load(s);
    if (st != QN_OK)
        return st;
    st = nonempty_next(s);
    if (st != QN_OK)
        return st;
    return row_publish(s, row);
}

const char *sheet_cell(const sheet_row *row, int idx)
{
    return idx >= 0 && idx < row->ncells ? row->cells[idx] : "";
}

/* Zip magic -> xlsx; a legacy OLE2 file (.xls, or an encrypted .xlsx) is refused; an .xlsx
 * name without the magic is refused; anything else is CSV. */
static int detect_kind(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char m[8] = {0};
    size_t n = fread(m, 1, sizeof(m), f);
    fclose(f);
    if (n >= 4 && memcmp(m, "PK\x03\x04", 4) == 0)
        return KIND_XLSX;
    if (n >= 8 && memcmp(m, "\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1", 8) == 0) {
        qn_errf(err, errlen, "spreadsheet: legacy .xls or encrypted workbook: save it as .xlsx");
        return 0;
    }
    const char *dot = strrchr(path, '.');
    if (dot && (strcasecmp(dot, ".xlsx") == 0 || strcasecmp(dot, ".xlsm") == 0)) {
        qn_errf(err, errlen, "spreadsheet: %s is not an xlsx (zip) file", path);
        return 0;
    }
    return KIND_CSV;
}

void sheet_free(sheet *s)
{
    if (!s)
        return;
    if (s->xp)
        XML_ParserFree(s->xp);
    zstream_close(&s->zs);
    book_close(&s->bk);
    free(s->sst.data.p);
    free(s->sst.off);
    if (s->fp)
        fclose(s->fp);
    free(s->cbuf);
    free(s->arena.p);
    free(s->slots);
    free(s->cells);
    free(s->hdr_data);
    free(s->hdr_cells);
    free(s);
}

sheet *sheet_open(const char *path, const sheet_limits *lim, char *err, size_t errlen)
{
    sheet *s = calloc(1, sizeof(*s));
    if (!s) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        return NULL;
    }
    sheet_limits_resolve(lim, &s->lim);
    int kind = detect_kind(path, err, errlen);
    if (kind <= 0)
        goto fail;
    s->kind = kind;
    if (kind == KIND_XLSX) {
        qn_status st = xlsx_open(s, path, err, errlen);
        if (st == QN_ENOMEM)
            qn_errf(err, errlen, "spreadsheet: out of memory");
        if (st != QN_OK)
            goto fail;
    } else {
        s->fp = fopen(path, "rb");
        s->cbuf = malloc(CSV_CHUNK);
        if (!s->fp || !s->cbuf) {
            qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", path, strerror(errno));
            goto fail;
        }
        if (fseeko(s->fp, 0, SEEK_END) == 0) {
            off_t size = ftello(s->fp);
            if (size > 0 && (uint64_t)size > s->lim.max_sheet_bytes) {
                qn_errf(err, errlen,
                        "spreadsheet: the csv file is too large (%lld bytes, limit %llu)",
                        (long long)size, (unsigned long long)s->lim.max_sheet_bytes);
                goto fail;
            }
            rewind(s->fp);
        }
        s->at_start = 1;
    }
    return s;
fail:
    sheet_free(s);
    return NULL;
}

/* ---------------------------------------------------------------- counting */

/*
 * The benchmarked path. Instead of expat (which costs twice the inflate time on a 1M-row
 * sheet), a scanner walks the tags of the inflated XML: it keeps the element stack (names as
 * 64-bit keys) to check nesting, and counts <row>s of <sheetData> holding a <v> (in <c>) or a
 * <t> (in <is> or a run <r>) whose first byte is text. It gives up (SC_FALLBACK, and the full
 * reader counts instead) on anything it does not model: prefixed names, CDATA, DTDs, a
 * non-UTF-8 encoding, a construct longer than its buffer.
 */
#define SCAN_BUF      (1u << 20)
#define SCAN_MAXDEPTH 128

enum { SC_MORE = 0, SC_DONE, SC_FALLBACK, SC_ERROR };

typedef struct scan {
    uint64_t stack[SCAN_MAXDEPTH];
    int depth;
    int root_seen, root_closed;
    int row_depth; /* depth of the open <row>, 0 if none */
    int row_value;
    int started;
    int64_t nonempty;
    uint64_t k_row, k_sheetdata, k_worksheet, k_v, k_c, k_t, k_is, k_r;
} scan;

/* 1: ends a name; 2: ':' (a prefix: fall back). Constant, so threads can share it. */
static const unsigned char name_stop[256] = {
    [' '] = 1, ['\t'] = 1, ['\r'] = 1, ['\n'] = 1, ['>'] = 1, ['/'] = 1, ['<'] = 1,
    ['='] = 1, ['"'] = 1,  ['\''] = 1, ['?'] = 1,  ['!'] = 1, [':'] = 2,
};

/* Names up to 7 bytes are their bytes plus the length (exact); longer ones are hashed. */
static uint64_t name_key(const char *p, size_t n)
{
    uint64_t k = 0;
    if (n <= 7) {
        memcpy(&k, p, n);
        return k | ((uint64_t)n << 56);
    }
    k = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        k = (k ^ (unsigned char)p[i]) * 1099511628211ULL;
    return (k & 0x00FFFFFFFFFFFFFFULL) | ((uint64_t)(0x80 | (n & 0x7F)) << 56);
}

static int all_ws(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!is_ws(p[i]))
            return 0;
    return 1;
}

/* The '>' closing the tag whose attributes start at p, honouring quotes; NULL if the buffer
 * ends first; *bad set on a '<' (not allowed inside a tag or an attribute value). */
static const char *tag_end(const char *p, const char *end, int *bad)
{
    while (p < end) {
        char c = *p;
        if (c == '>')
            return p;
        if (c == '<') {
            *bad = 1;
            return NULL;
        }
        if (c == '"' || c == '\'') {
            const char *q = memchr(p + 1, c, (size_t)(end - p - 1));
            if (!q)
                return NULL;
            const char *lt = memchr(p + 1, '<', (size_t)(q - p - 1));
            if (lt) {
                *bad = 1;
                return NULL;
            }
            p = q + 1;
            continue;
        }
        p++;
    }
    return NULL;
}

/* The encoding named in an XML declaration is UTF-8 (or absent). */
static int decl_is_utf8(const char *p, size_t n)
{
    const char *e = memmem(p, n, "encoding", 8);
    if (!e)
        return 1;
    e += 8;
    while (e < p + n && (is_ws(*e) || *e == '='))
        e++;
    if (e >= p + n || (*e != '"' && *e != '\''))
        return 0;
    e++;
    return (size_t)(p + n - e) >= 6 && strncasecmp(e, "utf-8", 5) == 0 &&
           (e[5] == '"' || e[5] == '\'');
}

/* Scans buf[*pos, len). SC_MORE: *pos is where the next (incomplete) construct starts. */
static int scan_run(scan *sc, const char *buf, size_t len, size_t *pos, int eof, char *err,
                    size_t errlen)
{
    size_t p = *pos;
    const char *end = buf + len;
    if (!sc->started) {
        if (len - p < 4 && !eof)
            return SC_MORE;
        sc->started = 1;
        if (len - p >= 3 && memcmp(buf + p, "\xEF\xBB\xBF", 3) == 0)
            p += 3;
        else if (len - p >= 2 && ((unsigned char)buf[p] >= 0xFE || buf[p + 1] == '\0'))
            return SC_FALLBACK; /* UTF-16 */
    }
    for (;;) {
        const char *lt = memchr(buf + p, '<', len - p);
        size_t q = lt ? (size_t)(lt - buf) : len;
        if (sc->depth == 0 && !all_ws(buf + p, q - p)) {
            qn_errf(err, errlen, "text outside the root element");
            return SC_ERROR;
        }
        if (!lt) {
            *pos = len;
            return SC_MORE;
        }
        p = q;
        if (q + 2 >= len)
            goto more;
        char c = buf[q + 1];
        if (c == '/') {
            const char *n = buf + q + 2, *ne = n;
            while (ne < end && !name_stop[(unsigned char)*ne])
                ne++;
            if (ne == end)
                goto more;
            if (name_stop[(unsigned char)*ne] == 2)
                return SC_FALLBACK;
            const char *gt = ne;
            while (gt < end && is_ws(*gt))
                gt++;
            if (gt == end)
                goto more;
            if (*gt != '>' || ne == n) {
                qn_errf(err, errlen, "malformed end tag");
                return SC_ERROR;
            }
            if (sc->depth == 0 || sc->stack[sc->depth - 1] != name_key(n, (size_t)(ne - n))) {
                qn_errf(err, errlen, "mismatched end tag </%.*s>", (int)(ne - n > 40 ? 40 : ne - n),
                        n);
                return SC_ERROR;
            }
            if (sc->row_depth == sc->depth) {
                sc->row_depth = 0;
                sc->nonempty += sc->row_value;
            }
            if (--sc->depth == 0)
                sc->root_closed = 1;
            p = (size_t)(gt - buf) + 1;
            continue;
        }
        if (c == '?') {
            const char *qe = memmem(buf + q + 2, len - q - 2, "?>", 2);
            if (!qe)
                goto more;
            if (len - q >= 5 && memcmp(buf + q, "<?xml", 5) == 0 && is_ws(buf[q + 5]) &&
                !decl_is_utf8(buf + q, (size_t)(qe - buf) - q))
                return SC_FALLBACK;
            p = (size_t)(qe - buf) + 2;
            continue;
        }
        if (c == '!') {
            if (q + 4 > len)
                goto more;
            if (memcmp(buf + q, "<!--", 4) != 0)
                return SC_FALLBACK; /* CDATA or a DTD: the full parser decides */
            const char *ce = memmem(buf + q + 4, len - q - 4, "-->", 3);
            if (!ce)
                goto more;
            p = (size_t)(ce - buf) + 3;
            continue;
        }
        /* a start tag */
        const char *n = buf + q + 1, *ne = n;
        while (ne < end && !name_stop[(unsigned char)*ne])
            ne++;
        if (ne == end)
            goto more;
        if (name_stop[(unsigned char)*ne] == 2)
            return SC_FALLBACK;
        if (ne == n || (!is_ws(*ne) && *ne != '>' && *ne != '/')) {
            qn_errf(err, errlen, "malformed start tag");
            return SC_ERROR;
        }
        int bad = 0;
        const char *gt = tag_end(ne, end, &bad);
        if (bad) {
            qn_errf(err, errlen, "'<' inside a tag");
            return SC_ERROR;
        }
        if (!gt || (gt + 1 >= end && !eof)) /* the byte after '>': is a value empty? */
            goto more;
        int text_follows = gt + 1 < end && gt[1] != '<';
        int empty_elem = gt[-1] == '/';
        uint64_t key = name_key(n, (size_t)(ne - n));
        if (sc->root_closed) {
            qn_errf(err, errlen, "content after the root element");
            return SC_ERROR;
        }
        if (!sc->root_seen) {
            sc->root_seen = 1;
            if (key != sc->k_worksheet) {
                qn_errf(err, errlen, "the first sheet is not a worksheet");
                return SC_ERROR;
            }
        }
        uint64_t parent = sc->depth ? sc->stack[sc->depth - 1] : 0;
        if (!empty_elem) {
            if (sc->depth == SCAN_MAXDEPTH)
                return SC_FALLBACK;
            sc->stack[sc->depth++] = key;
            if (key == sc->k_row && sc->depth == 3 && parent == sc->k_sheetdata) {
                sc->row_depth = sc->depth;
                sc->row_value = 0;
            } else if (sc->row_depth && text_follows &&
                       ((key == sc->k_v && parent == sc->k_c && sc->depth == sc->row_depth + 2) ||
                        (key == sc->k_t && (parent == sc->k_is || parent == sc->k_r)))) {
                sc->row_value = 1;
            }
        } else if (sc->depth == 0) {
            sc->root_closed = 1;
        }
        p = (size_t)(gt - buf) + 1;
        continue;
    more:
        if (eof) {
            qn_errf(err, errlen, "the XML ends in the middle of a tag");
            return SC_ERROR;
        }
        *pos = p;
        return SC_MORE;
    }
}

/* 0 counted, 1 fall back to the full reader, -1 error. */
static int count_fast(book *b, const sheet_limits *lim, int64_t *nonempty, char *err, size_t errlen)
{
    int rc = -1;
    zstream zs = {0};
    scan *sc = calloc(1, sizeof(*sc));
    char *buf = malloc(SCAN_BUF);
    char msg[160] = "";
    if (!sc || !buf) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        goto done;
    }
    sc->k_row = name_key("row", 3);
    sc->k_sheetdata = name_key("sheetData", 9);
    sc->k_worksheet = name_key("worksheet", 9);
    sc->k_v = name_key("v", 1);
    sc->k_c = name_key("c", 1);
    sc->k_t = name_key("t", 1);
    sc->k_is = name_key("is", 2);
    sc->k_r = name_key("r", 1);
    if (zstream_open(b, b->sheet_idx, lim->max_sheet_bytes, b->sheet_part, &zs, err, errlen) !=
        QN_OK)
        goto done;
    size_t len = 0, pos = 0;
    int eof = 0;
    for (;;) {
        /* Keep the unfinished construct, refill behind it. */
        if (pos > 0) {
            memmove(buf, buf + pos, len - pos);
            len -= pos;
            pos = 0;
        }
        if (len == SCAN_BUF) {
            rc = 1; /* one construct fills the buffer */
            goto done;
        }
        zip_int64_t n = zstream_read(&zs, buf + len, SCAN_BUF - len, err, errlen);
        if (n < 0)
            goto done;
        eof = n == 0;
        len += (size_t)n;
        int r = scan_run(sc, buf, len, &pos, eof, msg, sizeof(msg));
        if (r == SC_FALLBACK) {
            rc = 1;
            goto done;
        }
        if (r == SC_ERROR) {
            qn_errf(err, errlen, "spreadsheet: %s: %s", b->sheet_part, msg);
            goto done;
        }
        if (eof)
            break;
    }
    if (!sc->root_seen || sc->depth != 0) {
        qn_errf(err, errlen, "spreadsheet: %s: %s", b->sheet_part,
                sc->root_seen ? "the XML ends before its root element closes" : "no root element");
        goto done;
    }
    *nonempty = sc->nonempty;
    rc = 0;
done:
    zstream_close(&zs);
    free(buf);
    free(sc);
    return rc;
}

/* The full reader's count: the reference, and the fallback. */
static qn_status count_slow(const char *path, const sheet_limits *lim, int64_t *rows, char *err,
                            size_t errlen)
{
    sheet *s = sheet_open(path, lim, err, errlen);
    if (!s)
        return QN_EINVAL;
    int64_t n = 0;
    sheet_row row;
    qn_status st;
    while ((st = sheet_next_row(s, &row)) == QN_OK)
        n++;
    if (st == QN_ENOTFOUND) {
        *rows = n;
        st = QN_OK;
    } else {
        qn_errf(err, errlen, "%s", sheet_error(s));
    }
    sheet_free(s);
    return st;
}

qn_status sheet_count_data_rows(const char *path, const sheet_limits *lim, int64_t *rows, char *err,
                                size_t errlen)
{
    qn_status st = QN_EINVAL;
    sheet_limits l;
    sheet_limits_resolve(lim, &l);
    book b = {0};
    int kind = detect_kind(path, err, errlen);
    if (kind < 0)
        return QN_ERR;
    if (kind == 0)
        return QN_EINVAL;
    if (kind == KIND_CSV)
        return count_slow(path, &l, rows, err, errlen);
    st = book_open(path, &l, &b, err, errlen);
    if (st != QN_OK)
        return st;
    st = QN_EINVAL;
    if (b.sst_idx >= 0) {
        /* A <v> pointing at an empty shared string is an empty cell: only the full reader
         * knows, so the scanner runs only when the table has no empty string. */
        sst_load l2 = {.count_only = 1, .lim = &l};
        st = sst_run(&b, &l2, err, errlen);
        if (st != QN_OK)
            goto done;
        st = QN_EINVAL;
        if (l2.any_empty) {
            book_close(&b);
            return count_slow(path, &l, rows, err, errlen);
        }
    }
    int64_t nonempty = 0;
    int rc = count_fast(&b, &l, &nonempty, err, errlen);
    if (rc < 0)
        goto done;
    if (rc > 0) {
        book_close(&b);
        return count_slow(path, &l, rows, err, errlen);
    }
    *rows = nonempty > 0 ? nonempty - 1 : 0; /* the first non-empty row is the header */
    st = QN_OK;
done:
    book_close(&b);
    return st;
}
