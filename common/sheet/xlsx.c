/*
 * .xlsx rows: see xlsx.h. Layout of this file:
 *   shared strings (loaded whole, or only checked for an empty string)
 *   the sheet's rows: expat handlers, suspended at the end of every row
 */
#include "xlsx.h"

#include <expat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XML_CHUNK (256u << 10)

/* ---------------------------------------------------------------- shared strings */

/* <sst><si> text </si>...: the text of an <si> is its <t> elements, directly or in rich-text
 * runs <r>, but not the phonetic runs <rPh>. */
typedef struct sst_load {
    cellrow_buf data; /* strings, each NUL-terminated */
    uint64_t *off;    /* start of string i in data */
    int64_t n, cap;   /* strings loaded */
    int count_only;   /* only count and note empty strings (the counting path) */
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
    const char *ln = xlzip_local_name(name);
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
    const char *ln = xlzip_local_name(name);
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
        if (cellrow_buf_append(&l->data, "", 1) != 0) /* the NUL */
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
    if (cellrow_buf_append(&l->data, s, (size_t)len) != 0)
        return sst_fail(l, "out of memory");
}

static void XMLCALL sst_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                                const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    sst_fail(ud, "DTD not allowed");
}

/* A namespace-aware expat parser whose handlers get ud; NULL when out of memory. */
static XML_Parser xml_parser(void *ud, XML_StartElementHandler start, XML_EndElementHandler end,
                             XML_CharacterDataHandler text, XML_StartDoctypeDeclHandler doctype)
{
    XML_Parser p = XML_ParserCreateNS("UTF-8", XLZIP_NS_SEP);
    if (!p)
        return NULL;
    XML_SetUserData(p, ud);
    XML_SetElementHandler(p, start, end);
    XML_SetCharacterDataHandler(p, text);
    XML_SetStartDoctypeDeclHandler(p, doctype);
    return p;
}

/* Loads (or, count_only, just checks) the shared strings, streaming the part into expat. */
static qn_status sst_run(xlzip_book *b, sst_load *l, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    xlzip_stream zs = {0};
    l->p = xml_parser(l, sst_start, sst_end, sst_text, sst_doctype);
    if (!l->p)
        return QN_ENOMEM;
    if (xlzip_stream_open(b, b->sst_idx, l->lim->max_sst_bytes, "sharedStrings.xml", &zs, err,
                          errlen) != QN_OK)
        goto done;
    for (;;) {
        void *buf = XML_GetBuffer(l->p, XML_CHUNK);
        if (!buf) {
            st = QN_ENOMEM;
            goto done;
        }
        zip_int64_t n = xlzip_stream_read(&zs, buf, XML_CHUNK, err, errlen);
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
    xlzip_stream_close(&zs);
    XML_ParserFree(l->p);
    l->p = NULL;
    return st;
}

qn_status xlsx_sst_any_empty(xlzip_book *b, const sheet_limits *lim, int *any_empty, char *err,
                             size_t errlen)
{
    *any_empty = 0;
    if (b->sst_idx < 0)
        return QN_OK;
    sst_load l = {.count_only = 1, .lim = lim};
    qn_status st = sst_run(b, &l, err, errlen);
    *any_empty = l.any_empty;
    return st;
}

/* ---------------------------------------------------------------- the sheet's rows */

struct xlsx {
    sheet_limits lim;
    cellrow *row; /* borrowed: the row being filled */
    xlzip_book bk;
    xlzip_stream zs;
    XML_Parser xp;
    sst_load sst;
    qn_status st; /* the first failure inside the parse, with err */
    char err[256];
    int suspended, final, row_ready;
    int in_sheetdata, in_row, in_cell, collecting, depth, root_seen;
    unsigned char cell_path[XLSX_VALUE_DEPTH]; /* kinds of the elements open below <c> */
    int64_t prev_row;
    int prev_col, cell_col, cell_type_s;
    size_t cell_start;
};

/* Records the first failure (msg is copied); its status. */
static qn_status xlsx_fail(xlsx *x, qn_status st, const char *msg)
{
    if (!x->st) {
        qn_errf(x->err, sizeof(x->err), "%s", msg);
        x->st = st;
    }
    return x->st;
}

/* A failure inside an expat handler: recorded, and the parse stops. */
static void xfail(xlsx *x, qn_status st, const char *msg)
{
    char m[256];
    snprintf(m, sizeof(m), "spreadsheet: %s at line %lu", msg,
             (unsigned long)XML_GetCurrentLineNumber(x->xp));
    xlsx_fail(x, st, m);
    XML_StopParser(x->xp, XML_FALSE);
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

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
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

/* An element's part in xlsx_value_path, by its local name. */
static xlsx_vk value_kind(const char *ln)
{
    if (strcmp(ln, "v") == 0)
        return XLSX_VK_V;
    if (strcmp(ln, "is") == 0)
        return XLSX_VK_IS;
    if (strcmp(ln, "r") == 0)
        return XLSX_VK_R;
    if (strcmp(ln, "t") == 0)
        return XLSX_VK_T;
    return XLSX_VK_OTHER;
}

static void XMLCALL xs_start(void *ud, const XML_Char *name, const XML_Char **atts)
{
    xlsx *x = ud;
    const char *ln = xlzip_local_name(name);
    x->depth++;
    if (!x->root_seen) {
        x->root_seen = 1;
        if (strcmp(ln, "worksheet") != 0)
            return xfail(x, QN_EINVAL, "the first sheet is not a worksheet");
        return;
    }
    if (!x->in_sheetdata) {
        if (x->depth == 2 && strcmp(ln, "sheetData") == 0)
            x->in_sheetdata = 1;
        return;
    }
    if (!x->in_row) {
        if (x->depth != 3 || strcmp(ln, "row") != 0)
            return;
        int64_t r = x->prev_row + 1;
        for (int i = 0; atts[i]; i += 2)
            if (strcmp(atts[i], "r") == 0 && (parse_i64(atts[i + 1], &r) != 0 || r < 1))
                return xfail(x, QN_EINVAL, "bad row number");
        if (r <= x->prev_row)
            return xfail(x, QN_EINVAL, "row numbers are not ascending");
        x->in_row = 1;
        x->row->number = x->prev_row = r;
        x->prev_col = -1;
        cellrow_reset(x->row);
        return;
    }
    if (!x->in_cell) {
        if (x->depth != 4 || strcmp(ln, "c") != 0)
            return;
        int col = x->prev_col + 1, is_s = 0;
        for (int i = 0; atts[i]; i += 2) {
            if (strcmp(atts[i], "r") == 0) {
                col = col_of_ref(atts[i + 1]);
                if (col < 0)
                    return xfail(x, QN_EINVAL, "bad cell reference");
            } else if (strcmp(atts[i], "t") == 0) {
                is_s = strcmp(atts[i + 1], "s") == 0;
            }
        }
        if (col >= SHEET_MAX_COLS)
            return xfail(x, QN_EINVAL, "too many columns");
        x->in_cell = 1;
        x->cell_col = x->prev_col = col;
        x->cell_type_s = is_s;
        x->cell_start = x->row->arena.len;
        return;
    }
    /* Inside <c>: which text is the value is xlsx_value_path's rule (the counter's too). */
    int below = x->depth - 4;
    if (below <= XLSX_VALUE_DEPTH)
        x->cell_path[below - 1] = (unsigned char)value_kind(ln);
    x->collecting = xlsx_value_path(x->cell_path, below);
}

/* </c>: the cell's text becomes its column of the row. */
static void xs_cell_end(xlsx *x)
{
    cellrow *r = x->row;
    qn_status st;
    x->in_cell = x->collecting = 0;
    if (cellrow_buf_append(&r->arena, "", 1) != 0)
        return xfail(x, QN_ENOMEM, "out of memory");
    if (x->cell_type_s) {
        int64_t idx;
        const char *txt = r->arena.p + x->cell_start, *text = "";
        if (txt[0] && (parse_i64(txt, &idx) != 0 || idx >= x->sst.n))
            return xfail(x, QN_EINVAL, "bad shared string index");
        if (txt[0])
            text = x->sst.data.p + x->sst.off[idx];
        r->arena.len = x->cell_start; /* the index text is no longer needed */
        st = cellrow_set_ext(r, x->cell_col, text);
    } else {
        st = cellrow_set(r, x->cell_col, x->cell_start);
    }
    if (st != QN_OK)
        xfail(x, st, st == QN_ENOMEM ? "out of memory" : "too many columns");
}

static void XMLCALL xs_end(void *ud, const XML_Char *name)
{
    xlsx *x = ud;
    int depth = x->depth--;
    (void)name; /* depths tell the elements apart; expat has checked that the names match */
    if (!x->in_sheetdata)
        return;
    if (x->in_cell && depth == 4)
        return xs_cell_end(x);
    if (x->in_cell) {
        /* Text after a child ends belongs to the element around it again: <v>1<x/>2</v>. */
        x->collecting = xlsx_value_path(x->cell_path, x->depth - 4);
        return;
    }
    if (x->in_row && depth == 3) { /* </row> */
        x->in_row = 0;
        x->row_ready = 1;
        XML_StopParser(x->xp, XML_TRUE); /* resumed by the next xlsx_next */
        return;
    }
    if (depth == 2)
        x->in_sheetdata = 0;
}

static void XMLCALL xs_text(void *ud, const XML_Char *t, int len)
{
    xlsx *x = ud;
    if (!x->collecting)
        return;
    cellrow_buf *a = &x->row->arena;
    if (a->len - x->cell_start + (size_t)len > x->lim.max_cell_bytes)
        return xfail(x, QN_EINVAL, "a cell is longer than the limit");
    if (a->len + (size_t)len > x->lim.max_row_bytes)
        return xfail(x, QN_EINVAL, "a row is longer than the limit");
    if (cellrow_buf_append(a, t, (size_t)len) != 0)
        return xfail(x, QN_ENOMEM, "out of memory");
}

static void XMLCALL xs_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
                               const XML_Char *pubid, int has_internal)
{
    (void)name, (void)sysid, (void)pubid, (void)has_internal;
    xfail(ud, QN_EINVAL, "DTD not allowed");
}

/* Parses until a row is complete or the document ends. */
static qn_status xlsx_parse(xlsx *x, int *eof)
{
    x->row_ready = 0;
    while (!x->row_ready) {
        enum XML_Status xs;
        char msg[640]; /* the part's name is up to 511 bytes */
        if (x->suspended) {
            xs = XML_ResumeParser(x->xp);
        } else if (x->final) {
            if (!x->root_seen) {
                snprintf(msg, sizeof(msg), "spreadsheet: %s is empty", x->bk.sheet_part);
                return xlsx_fail(x, QN_EINVAL, msg);
            }
            *eof = 1;
            return QN_OK;
        } else {
            void *buf = XML_GetBuffer(x->xp, XML_CHUNK);
            if (!buf)
                return xlsx_fail(x, QN_ENOMEM, "spreadsheet: out of memory");
            zip_int64_t n = xlzip_stream_read(&x->zs, buf, XML_CHUNK, msg, sizeof(msg));
            if (n < 0)
                return xlsx_fail(x, QN_EINVAL, msg);
            x->final = n == 0;
            xs = XML_ParseBuffer(x->xp, (int)n, x->final);
        }
        if (xs == XML_STATUS_ERROR) {
            snprintf(msg, sizeof(msg), "spreadsheet: %s: %s at line %lu", x->bk.sheet_part,
                     XML_ErrorString(XML_GetErrorCode(x->xp)),
                     (unsigned long)XML_GetCurrentLineNumber(x->xp));
            return xlsx_fail(x, QN_EINVAL, msg);
        }
        x->suspended = xs == XML_STATUS_SUSPENDED;
    }
    return QN_OK;
}

qn_status xlsx_next(xlsx *x, int *eof, char *err, size_t errlen)
{
    *eof = 0;
    qn_status st = x->st ? x->st : xlsx_parse(x, eof);
    if (st != QN_OK)
        qn_errf(err, errlen, "%s", x->err);
    return st;
}

void xlsx_free(xlsx *x)
{
    if (!x)
        return;
    if (x->xp)
        XML_ParserFree(x->xp);
    xlzip_stream_close(&x->zs);
    xlzip_close(&x->bk);
    cellrow_buf_free(&x->sst.data);
    free(x->sst.off);
    free(x);
}

qn_status xlsx_open(const char *path, const sheet_limits *lim, cellrow *row, xlsx **out, char *err,
                    size_t errlen)
{
    qn_status st = QN_ENOMEM;
    xlsx *x = calloc(1, sizeof(*x));
    if (!x)
        goto fail;
    x->lim = *lim;
    x->row = row;
    x->sst.lim = &x->lim;
    st = xlzip_open(path, &x->lim, &x->bk, err, errlen);
    if (st == QN_OK && x->bk.sst_idx >= 0)
        st = sst_run(&x->bk, &x->sst, err, errlen);
    if (st == QN_OK)
        st = xlzip_stream_open(&x->bk, x->bk.sheet_idx, x->lim.max_sheet_bytes, x->bk.sheet_part,
                               &x->zs, err, errlen);
    if (st != QN_OK)
        goto fail;
    st = QN_ENOMEM;
    x->xp = xml_parser(x, xs_start, xs_end, xs_text, xs_doctype);
    if (!x->xp)
        goto fail;
    *out = x;
    return QN_OK;
fail:
    if (st == QN_ENOMEM)
        qn_errf(err, errlen, "spreadsheet: out of memory");
    xlsx_free(x);
    return st;
}
