/*
 * Spreadsheet reader: see sheet.h. This file is the public face: which format a file is, the
 * header and the non-empty rows after it, and the row count. The formats are read by xlsx.c
 * (over the zip package of xlzip.c) and csv.c into a cellrow; rowcount.c counts fast.
 */
#include "sheet.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cellrow.h"
#include "csv.h"
#include "rowcount.h"
#include "xlsx.h"
#include "xlzip.h"

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

struct sheet {
    sheet_limits lim;
    char err[256];
    qn_status sticky; /* first error, returned again by every later call */
    int eof;
    cellrow row; /* the current raw row */
    xlsx *x;     /* one of the two readers */
    csv *c;

    /* header (owned copy) */
    int hdr_state; /* 0 not read, 1 read, 2 none */
    int64_t hdr_num;
    char *hdr_data;
    const char **hdr_cells;
    int hdr_n;
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

/* ---------------------------------------------------------------- rows, header */

/* The next non-empty raw row, QN_ENOTFOUND at the end. */
static qn_status nonempty_next(sheet *s)
{
    for (;;) {
        if (s->sticky)
            return s->sticky;
        if (s->eof)
            return QN_ENOTFOUND;
        char msg[256];
        qn_status st = s->x ? xlsx_next(s->x, &s->eof, msg, sizeof(msg))
                            : csv_next(s->c, &s->eof, msg, sizeof(msg));
        if (st != QN_OK)
            return sheet_fail(s, st, "%s", msg);
        if (!s->eof && cellrow_nonempty(&s->row))
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
    const cellrow *r = &s->row;
    size_t bytes = 0;
    for (int i = 0; i < r->nslots; i++)
        bytes += strlen(cellrow_text(r, i)) + 1;
    s->hdr_data = malloc(bytes ? bytes : 1);
    s->hdr_cells = malloc((size_t)(r->nslots ? r->nslots : 1) * sizeof(*s->hdr_cells));
    if (!s->hdr_data || !s->hdr_cells)
        return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
    size_t o = 0;
    for (int i = 0; i < r->nslots; i++) {
        const char *t = cellrow_text(r, i);
        size_t l = strlen(t) + 1;
        memcpy(s->hdr_data + o, t, l);
        s->hdr_cells[i] = s->hdr_data + o;
        o += l;
    }
    s->hdr_n = r->nslots;
    s->hdr_num = r->number;
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

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
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
    if (cellrow_cells(&s->row, &row->cells) != QN_OK)
        return sheet_fail(s, QN_ENOMEM, "spreadsheet: out of memory");
    row->number = s->row.number;
    row->ncells = s->row.nslots;
    return QN_OK;
}

const char *sheet_cell(const sheet_row *row, int idx)
{
    return idx >= 0 && idx < row->ncells ? row->cells[idx] : "";
}

/* ---------------------------------------------------------------- open */

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
    xlsx_free(s->x);
    csv_free(s->c);
    cellrow_free(&s->row);
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
    if ((kind == KIND_XLSX ? xlsx_open(path, &s->lim, &s->row, &s->x, err, errlen)
                           : csv_open(path, &s->lim, &s->row, &s->c, err, errlen)) != QN_OK)
        goto fail;
    return s;
fail:
    sheet_free(s);
    return NULL;
}

/* ---------------------------------------------------------------- counting */

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
    sheet_limits l;
    sheet_limits_resolve(lim, &l);
    xlzip_book b = {0};
    int kind = detect_kind(path, err, errlen);
    if (kind < 0)
        return QN_ERR;
    if (kind == 0)
        return QN_EINVAL;
    if (kind == KIND_CSV)
        return count_slow(path, &l, rows, err, errlen);
    qn_status st = xlzip_open(path, &l, &b, err, errlen);
    if (st != QN_OK)
        return st;
    int64_t nonempty = 0;
    int modelled = 0;
    st = rowcount_xlsx(&b, &l, &nonempty, &modelled, err, errlen);
    xlzip_close(&b);
    if (st != QN_OK)
        return st;
    if (!modelled)
        return count_slow(path, &l, rows, err, errlen);
    *rows = nonempty > 0 ? nonempty - 1 : 0; /* the first non-empty row is the header */
    return QN_OK;
}
