/* The rows of a task's spreadsheet (taskrow.h). */
#include "taskrow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct taskrow_reader {
    sheet *s;
    usersheet_cols cols;
    int first_is_data; /* the first row is not a header: it is delivered first */
    int eof;
    char err[256];
};

static int taskrow_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* cell without the ASCII blanks around it: *len bytes from the return value. */
static const char *taskrow_trim(const char *cell, size_t *len)
{
    size_t n = strlen(cell);
    while (n && taskrow_blank(*cell))
        cell++, n--;
    while (n && taskrow_blank(cell[n - 1]))
        n--;
    *len = n;
    return cell;
}

int64_t taskrow_user_id(const char *cell)
{
    size_t n;
    const char *p = taskrow_trim(cell, &n);
    uint64_t v = 0;
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return 0; /* sign, point, exponent, text */
        v = v * 10 + (uint64_t)(p[i] - '0');
        if (v > (uint64_t)INT64_MAX)
            return 0;
    }
    return (int64_t)v;
}

/* Length of the valid UTF-8 sequence at p (at most left bytes), 0 when invalid. */
static size_t taskrow_utf8_len(const unsigned char *p, size_t left)
{
    unsigned char c = p[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (left < n || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* Appends text to c's arena (bounded, UTF-8 made valid); its offset, or 0 ("") when empty. */
static qn_status taskrow_put(taskrow_chunk *c, const char *text, uint32_t *off)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t left = strlen(text);
    *off = 0;
    if (left == 0)
        return QN_OK;
    if (grow(&c->arena, &c->acap, c->len + TASKROW_TEXT_MAX + 1, 1, 64 * 1024) != QN_OK)
        return QN_ENOMEM;
    *off = (uint32_t)c->len;
    char *out = c->arena + c->len;
    size_t w = 0;
    while (left) {
        size_t n = taskrow_utf8_len(p, left);
        size_t take = n ? n : 1;
        if (w + (n ? n : 1) > TASKROW_TEXT_MAX)
            break;
        if (n)
            memcpy(out + w, p, n);
        else
            out[w] = '?';
        w += n ? n : 1;
        p += take;
        left -= take;
    }
    out[w] = '\0';
    c->len += w + 1;
    return QN_OK;
}

static qn_status taskrow_append(taskrow_reader *r, taskrow_chunk *c, const sheet_row *row)
{
    if (grow(&c->rows, &c->cap, c->n + 1, sizeof(*c->rows), 1024) != QN_OK)
        return QN_ENOMEM;
    taskrow *t = &c->rows[c->n];
    const char *id = sheet_cell(row, 0);
    t->row = row->number;
    t->user_id = taskrow_user_id(id);
    if (taskrow_put(c, id, &t->raw) != QN_OK ||
        taskrow_put(c, sheet_cell(row, r->cols.phone), &t->phone) != QN_OK ||
        taskrow_put(c, sheet_cell(row, r->cols.mail), &t->mail) != QN_OK)
        return QN_ENOMEM;
    c->n++;
    return QN_OK;
}

/* The next data row into *row: QN_OK, QN_ENOTFOUND at the end, or an error. */
static qn_status taskrow_next(taskrow_reader *r, sheet_row *row)
{
    if (r->first_is_data) {
        r->first_is_data = 0;
        return sheet_header(r->s, row);
    }
    if (r->eof)
        return QN_ENOTFOUND;
    qn_status st = sheet_next_row(r->s, row);
    if (st == QN_ENOTFOUND)
        r->eof = 1;
    else if (st != QN_OK)
        snprintf(r->err, sizeof(r->err), "%s", sheet_error(r->s));
    return st;
}

taskrow_reader *taskrow_open(const char *path, const sheet_limits *lim, char *err, size_t errlen)
{
    taskrow_reader *r = calloc(1, sizeof(*r));
    sheet_row first;
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!(r->s = sheet_open(path, lim, err, errlen)))
        goto fail;
    qn_status st = sheet_header(r->s, &first);
    if (st == QN_ENOTFOUND) {
        r->eof = 1; /* no row at all */
        usersheet_is_header(&(sheet_row){0}, &r->cols);
        return r;
    }
    if (st != QN_OK) {
        snprintf(err, errlen, "%s", sheet_error(r->s));
        goto fail;
    }
    r->first_is_data = !usersheet_is_header(&first, &r->cols);
    return r;
fail:
    taskrow_close(r);
    return NULL;
}

void taskrow_close(taskrow_reader *r)
{
    if (!r)
        return;
    sheet_free(r->s);
    free(r);
}

qn_status taskrow_skip(taskrow_reader *r, int64_t n)
{
    sheet_row row;
    for (int64_t i = 0; i < n; i++) {
        qn_status st = taskrow_next(r, &row);
        if (st == QN_ENOTFOUND)
            return QN_OK;
        if (st != QN_OK)
            return st;
    }
    return QN_OK;
}

qn_status taskrow_read(taskrow_reader *r, taskrow_chunk *c, size_t max)
{
    sheet_row row;
    c->n = 0;
    c->len = 0;
    if (!c->arena) {
        if (!(c->arena = malloc(64 * 1024)))
            return QN_ENOMEM;
        c->acap = 64 * 1024;
    }
    c->arena[c->len++] = '\0'; /* offset 0: "" */
    while (c->n < max) {
        qn_status st = taskrow_next(r, &row);
        if (st == QN_ENOTFOUND)
            break;
        if (st != QN_OK)
            return st;
        if (taskrow_append(r, c, &row) != QN_OK) {
            snprintf(r->err, sizeof(r->err), "out of memory");
            return QN_ENOMEM;
        }
    }
    return QN_OK;
}

const char *taskrow_error(const taskrow_reader *r)
{
    return r ? r->err : "";
}

void taskrow_chunk_free(taskrow_chunk *c)
{
    free(c->rows);
    free(c->arena);
    memset(c, 0, sizeof(*c));
}
