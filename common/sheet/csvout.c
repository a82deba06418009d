/* A .csv written row by row: see csvout.h. */
#include "csvout.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct csvout {
    zipout_sink sink;
    void *arg;
    int ncols;
    char *buf; /* bytes not yet handed to the sink */
    size_t len, cap;
    qn_status st; /* the first failure */
};

static void co_put(csvout *c, const char *s, size_t n)
{
    if (c->st != QN_OK)
        return;
    if (grow(&c->buf, &c->cap, c->len + n, 1, CSVOUT_FLUSH + 1024) != QN_OK) {
        c->st = QN_ENOMEM;
        return;
    }
    memcpy(c->buf + c->len, s, n);
    c->len += n;
}

static void co_flush(csvout *c)
{
    if (c->st == QN_OK && c->len > 0)
        c->st = c->sink(c->arg, c->buf, c->len);
    c->len = 0;
}

static void co_field(csvout *c, const char *v)
{
    if (!v)
        return;
    if (!v[strcspn(v, ",\"\r\n")]) {
        co_put(c, v, strlen(v));
        return;
    }
    co_put(c, "\"", 1);
    for (const char *q; (q = strchr(v, '"')); v = q + 1) {
        co_put(c, v, (size_t)(q - v + 1));
        co_put(c, "\"", 1); /* the quote, doubled */
    }
    co_put(c, v, strlen(v));
    co_put(c, "\"", 1);
}

static qn_status co_row(csvout *c, const char *const *cells)
{
    for (int i = 0; i < c->ncols; i++) {
        if (i > 0)
            co_put(c, ",", 1);
        co_field(c, cells[i]);
    }
    co_put(c, "\r\n", 2);
    if (c->len >= CSVOUT_FLUSH)
        co_flush(c);
    return c->st;
}

qn_status csvout_open(zipout_sink sink, void *arg, const char *const *header, int ncols,
                      csvout **out)
{
    *out = NULL;
    if (ncols < 1)
        return QN_EINVAL;
    csvout *c = calloc(1, sizeof(*c));
    if (!c)
        return QN_ENOMEM;
    c->sink = sink;
    c->arg = arg;
    c->ncols = ncols;
    co_put(c, "\xEF\xBB\xBF", 3);
    qn_status st = co_row(c, header);
    if (st != QN_OK) {
        csvout_free(c);
        return st;
    }
    *out = c;
    return QN_OK;
}

qn_status csvout_row(csvout *c, const char *const *cells)
{
    return co_row(c, cells);
}

qn_status csvout_close(csvout *c)
{
    co_flush(c);
    return c->st;
}

void csvout_free(csvout *c)
{
    if (!c)
        return;
    free(c->buf);
    free(c);
}
