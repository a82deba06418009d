/* .csv records: see csv.h. */
#include "csv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define CSV_CHUNK (64u << 10)

enum { CSV_FIELD_START = 0, CSV_UNQUOTED, CSV_QUOTED, CSV_QUOTE_IN_QUOTED };

struct csv {
    sheet_limits lim;
    cellrow *row; /* borrowed: the record being filled */
    FILE *fp;
    char *buf;
    size_t len, pos;
    size_t field_start; /* in the row's arena */
    int state, skip_lf, at_start;
    int64_t records;
};

static qn_status csv_end_field(csv *c, char *err, size_t errlen)
{
    cellrow *r = c->row;
    if (cellrow_buf_append(&r->arena, "", 1) != 0) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        return QN_ENOMEM;
    }
    qn_status st = cellrow_set(r, r->nslots, c->field_start);
    if (st == QN_ENOMEM)
        qn_errf(err, errlen, "spreadsheet: out of memory");
    else if (st != QN_OK)
        qn_errf(err, errlen, "spreadsheet: csv record %lld has too many fields",
                (long long)c->records + 1);
    c->field_start = r->arena.len;
    return st;
}

static qn_status csv_byte(csv *c, char ch, char *err, size_t errlen)
{
    cellrow_buf *a = &c->row->arena;
    if (a->len - c->field_start >= c->lim.max_cell_bytes) {
        qn_errf(err, errlen, "spreadsheet: csv record %lld: a field is too long",
                (long long)c->records + 1);
        return QN_EINVAL;
    }
    if (a->len >= c->lim.max_row_bytes) {
        qn_errf(err, errlen, "spreadsheet: csv record %lld is too long", (long long)c->records + 1);
        return QN_EINVAL;
    }
    if (cellrow_buf_append(a, &ch, 1) != 0) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        return QN_ENOMEM;
    }
    return QN_OK;
}

/* The next chunk of the file into buf: 1 read, 0 at the end, -1 on a read error. */
static int csv_fill(csv *c, char *err, size_t errlen)
{
    c->len = fread(c->buf, 1, CSV_CHUNK, c->fp);
    c->pos = 0;
    if (c->len == 0) {
        if (!ferror(c->fp))
            return 0;
        qn_errf(err, errlen, "spreadsheet: reading the csv file: %s", strerror(errno));
        return -1;
    }
    if (c->at_start) {
        c->at_start = 0;
        if (c->len >= 3 && memcmp(c->buf, "\xEF\xBB\xBF", 3) == 0)
            c->pos = 3; /* UTF-8 byte-order mark */
    }
    return 1;
}

qn_status csv_next(csv *c, int *eof, char *err, size_t errlen)
{
    qn_status st = QN_OK;
    *eof = 0;
    cellrow_reset(c->row);
    c->field_start = 0;
    c->state = CSV_FIELD_START;
    int any = 0; /* the record has a byte or a delimiter */
    for (;;) {
        if (c->pos == c->len) {
            int r = csv_fill(c, err, errlen);
            if (r < 0)
                return QN_ERR;
            if (r == 0) {
                if (c->state == CSV_QUOTED) {
                    qn_errf(err, errlen, "spreadsheet: csv record %lld: unterminated quoted field",
                            (long long)c->records + 1);
                    return QN_EINVAL;
                }
                if (!any) {
                    *eof = 1;
                    return QN_OK;
                }
                break;
            }
        }
        char ch = c->buf[c->pos++];
        if (ch == '\0') {
            qn_errf(err, errlen, "spreadsheet: csv file contains a NUL byte (binary?)");
            return QN_EINVAL;
        }
        if (c->skip_lf) {
            c->skip_lf = 0;
            if (ch == '\n')
                continue;
        }
        switch (c->state) {
        case CSV_QUOTED:
            if (ch == '"')
                c->state = CSV_QUOTE_IN_QUOTED;
            else
                st = csv_byte(c, ch, err, errlen);
            break;
        case CSV_QUOTE_IN_QUOTED:
            if (ch == '"') {
                c->state = CSV_QUOTED;
                st = csv_byte(c, ch, err, errlen);
                break;
            }
            if (ch != ',' && ch != '\n' && ch != '\r') {
                qn_errf(err, errlen, "spreadsheet: csv record %lld: text after a closing quote",
                        (long long)c->records + 1);
                return QN_EINVAL;
            }
            /* the field ended: handle ch as after an unquoted field */
            __attribute__((fallthrough));
        default:
            if (ch == ',') {
                st = csv_end_field(c, err, errlen);
                c->state = CSV_FIELD_START;
                any = 1;
            } else if (ch == '\n' || ch == '\r') {
                c->skip_lf = ch == '\r';
                goto record;
            } else if (c->state == CSV_FIELD_START && ch == '"') {
                c->state = CSV_QUOTED;
                any = 1;
            } else {
                /* A quote inside an unquoted field is kept as it is (lenient, like Excel). */
                c->state = CSV_UNQUOTED;
                st = csv_byte(c, ch, err, errlen);
                any = 1;
            }
        }
        if (st != QN_OK)
            return st;
    }
record:
    st = csv_end_field(c, err, errlen);
    if (st != QN_OK)
        return st;
    c->row->number = ++c->records;
    return QN_OK;
}

void csv_free(csv *c)
{
    if (!c)
        return;
    if (c->fp)
        fclose(c->fp);
    free(c->buf);
    free(c);
}

qn_status csv_open(const char *path, const sheet_limits *lim, cellrow *row, csv **out, char *err,
                   size_t errlen)
{
    qn_status st = QN_ENOMEM;
    csv *c = calloc(1, sizeof(*c));
    if (!c || !(c->buf = malloc(CSV_CHUNK))) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        goto fail;
    }
    c->lim = *lim;
    c->row = row;
    c->at_start = 1;
    st = QN_ERR;
    c->fp = fopen(path, "rb");
    if (!c->fp) {
        qn_errf(err, errlen, "spreadsheet: cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (fseeko(c->fp, 0, SEEK_END) == 0) {
        off_t size = ftello(c->fp);
        if (size > 0 && (uint64_t)size > c->lim.max_sheet_bytes) {
            qn_errf(err, errlen, "spreadsheet: the csv file is too large (%lld bytes, limit %llu)",
                    (long long)size, (unsigned long long)c->lim.max_sheet_bytes);
            st = QN_EINVAL;
            goto fail;
        }
        rewind(c->fp);
    }
    *out = c;
    return QN_OK;
fail:
    csv_free(c);
    return st;
}
