/* The fast row counter: see rowcount.h. */
#include "rowcount.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "xlsx.h"

/*
 * Instead of expat (which costs twice the inflate time on a 1M-row
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

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
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
static int count_fast(xlzip_book *b, const sheet_limits *lim, int64_t *nonempty, char *err,
                      size_t errlen)
{
    int rc = -1;
    xlzip_stream zs = {0};
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
    if (xlzip_stream_open(b, b->sheet_idx, lim->max_sheet_bytes, b->sheet_part, &zs, err, errlen) !=
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
        zip_int64_t n = xlzip_stream_read(&zs, buf + len, SCAN_BUF - len, err, errlen);
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
    xlzip_stream_close(&zs);
    free(buf);
    free(sc);
    return rc;
}

qn_status rowcount_xlsx(xlzip_book *b, const sheet_limits *lim, int64_t *nonempty, int *modelled,
                        char *err, size_t errlen)
{
    int any_empty = 0;
    *modelled = 0;
    /* A <v> pointing at an empty shared string is an empty cell: only the full reader knows, so
     * the scanner runs only when the table has no empty string. */
    qn_status st = xlsx_sst_any_empty(b, lim, &any_empty, err, errlen);
    if (st != QN_OK || any_empty)
        return st;
    int rc = count_fast(b, lim, nonempty, err, errlen);
    if (rc < 0)
        return QN_EINVAL;
    *modelled = rc == 0;
    return QN_OK;
}
