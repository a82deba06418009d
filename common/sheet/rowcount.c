/* The fast row counter: see rowcount.h. */
#include "rowcount.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "hash.h"
#include "xlsx.h"

/*
 * Instead of expat (which costs twice the inflate time on a 1M-row sheet), a scanner walks the
 * tags of the inflated XML: it keeps the element stack (names as 64-bit keys) to check nesting,
 * and counts <row>s of <sheetData> with text inside a cell's value, which xlsx_value_path
 * decides for it as for the reader (so a <t> in a run of a stray <si> is not a value), text
 * after a comment or a child element included. It gives up (SC_FALLBACK, and the full reader counts
 * instead) on anything it does not model: prefixed names, CDATA, DTDs, a non-UTF-8 encoding, a
 * construct longer than its buffer. It keeps up with the inflate by doing little per tag: the bytes
 * it stops at are found 64 at a time (blk), an end tag is matched against the open element in one
 * 8-byte compare (end_of_top), and a tag whose attributes hold nothing unusual is closed without
 * walking its quotes (tag_end).
 */
#define SCAN_BUF      (1u << 20)
#define SCAN_PAD      64 /* zeroed bytes after the buffer: a block (blk) begun in it stays inside */
#define SCAN_READ     (256u << 10) /* inflated per step: scanned while still in the L2 cache */
#define SCAN_MAXDEPTH 128

enum { SC_MORE = 0, SC_DONE, SC_FALLBACK, SC_ERROR };

typedef struct scan {
    uint64_t stack[SCAN_MAXDEPTH];
    int depth;
    int root_seen, root_closed;
    int row_depth; /* depth of the open <row>, 0 if none */
    int row_value;
    int in_value; /* text here is a cell's value (xlsx_value_path) */
    int started;
    int64_t nonempty;
    uint64_t k_row, k_sheetdata, k_worksheet, k_v, k_c, k_t, k_is, k_r;
} scan;

/* Nonzero: ends a name. 1: may end a start tag's name; 2: ':' (a prefix: fall back); 3: may
 * not. Constant, so threads can share it. */
enum { NS_END = 1, NS_PREFIX, NS_BAD };
static const unsigned char name_stop[256] = {
    [' '] = NS_END,  ['\t'] = NS_END,   ['\r'] = NS_END, ['\n'] = NS_END, ['>'] = NS_END,
    ['/'] = NS_END,  [':'] = NS_PREFIX, ['<'] = NS_BAD,  ['='] = NS_BAD,  ['"'] = NS_BAD,
    ['\''] = NS_BAD, ['?'] = NS_BAD,    ['!'] = NS_BAD,
};

/* 8 bytes from p, the first in the low byte whatever the byte order. */
static inline uint64_t w_load(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/*
 * The bytes the scanner stops at, found 64 at a time: a block holds, for the 64 bytes from
 * where a search began, one bitmask per kind (bit i: byte i is of that kind). A search is then
 * a shift and a count of trailing zeros instead of a chain of loads and compares from byte to
 * byte (what bounds the scanner's speed is how long each step waits for the one before), and
 * a tag within the block is checked as a whole (tag_end).
 */
typedef struct blk {
    const char *base;            /* the block: the 64 bytes from base */
    const char *end;             /* the end of the data; no bit is set past it */
    uint64_t lt, gt, quot, apos; /* where the '<' '>' '"' '\'' are */
} blk;

/* What a search stops at. */
enum { BK_LT, BK_TAG, BK_QUOT, BK_APOS };

#if defined(__SSE2__)
static inline uint64_t blk_bits(__m128i x0, __m128i x1, __m128i x2, __m128i x3, __m128i c)
{
    uint64_t m0 = (uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x0, c));
    uint64_t m1 = (uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x1, c));
    uint64_t m2 = (uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x2, c));
    uint64_t m3 = (uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x3, c));
    return m0 | m1 << 16 | m2 << 32 | m3 << 48;
}

static void blk_masks(blk *b, const char *p)
{
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    b->lt = blk_bits(x0, x1, x2, x3, _mm_set1_epi8('<'));
    b->gt = blk_bits(x0, x1, x2, x3, _mm_set1_epi8('>'));
    b->quot = blk_bits(x0, x1, x2, x3, _mm_set1_epi8('"'));
    b->apos = blk_bits(x0, x1, x2, x3, _mm_set1_epi8('\''));
}
#else
/* Without SSE2: 8 bytes at a time. w_eq flags (high bit) exactly the bytes of w equal to those
 * of c; w_bits gathers the 8 flags into 8 bits. */
#define W_ONES    0x0101010101010101ULL
#define W_BYTE(c) (W_ONES * (unsigned char)(c))

static inline uint64_t w_eq(uint64_t w, uint64_t c)
{
    uint64_t x = w ^ c;
    return ~(((x & W_BYTE(0x7F)) + W_BYTE(0x7F)) | x) & W_BYTE(0x80);
}

static inline uint64_t w_bits(uint64_t flags)
{
    return ((flags >> 7) * 0x0102040810204080ULL) >> 56;
}

static void blk_masks(blk *b, const char *p)
{
    b->lt = b->gt = b->quot = b->apos = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t w = w_load(p + 8 * i);
        int sh = 8 * i;
        b->lt |= w_bits(w_eq(w, W_BYTE('<'))) << sh;
        b->gt |= w_bits(w_eq(w, W_BYTE('>'))) << sh;
        b->quot |= w_bits(w_eq(w, W_BYTE('"'))) << sh;
        b->apos |= w_bits(w_eq(w, W_BYTE('\''))) << sh;
    }
}
#endif

/* Makes the block the 64 bytes from p (< b->end; the buffer's padding covers the rest). */
static void blk_load(blk *b, const char *p)
{
    blk_masks(b, p);
    b->base = p;
    if (b->end - p < 64) {
        uint64_t keep = (1ULL << (b->end - p)) - 1;
        b->lt &= keep;
        b->gt &= keep;
        b->quot &= keep;
        b->apos &= keep;
    }
}

static inline uint64_t blk_kind(const blk *b, int kind)
{
    switch (kind) {
    case BK_LT:
        return b->lt;
    case BK_TAG:
        return b->lt | b->gt | b->quot | b->apos;
    case BK_QUOT:
        return b->quot | b->lt;
    default:
        return b->apos | b->lt;
    }
}

/* The first byte of kind in [p, end), or end. Inlined where called, so that kind is a
 * constant there. */
static inline __attribute__((always_inline)) const char *blk_find(blk *b, const char *p, int kind)
{
    while (p < b->end) {
        size_t in = (size_t)(p - b->base); /* huge if p is before the block */
        if (in >= 64) {
            blk_load(b, p);
            in = 0;
        }
        uint64_t m = blk_kind(b, kind) >> in;
        if (m)
            return p + __builtin_ctzll(m);
        p = b->base + 64;
    }
    return b->end;
}

/* Names longer than 7 bytes: hashed (FNV-1a), with the top byte telling them apart. */
static uint64_t name_hash(const char *p, size_t n)
{
    uint64_t k = hash_fnv1a(HASH_FNV_OFFSET, p, n);
    return (k & 0x00FFFFFFFFFFFFFFULL) | ((uint64_t)(0x80 | (n & 0x7F)) << 56);
}

/* Names up to 7 bytes are their bytes plus the length (exact). p must have 8 readable bytes
 * (the buffer's padding). */
static inline uint64_t name_key(const char *p, size_t n)
{
    if (n <= 7)
        return (w_load(p) & ((1ULL << (8 * n)) - 1)) | ((uint64_t)n << 56);
    return name_hash(p, n);
}

/* name_key of a constant name, copied where the 8-byte load may read. */
static uint64_t name_key_of(const char *name)
{
    char tmp[32] = {0};
    size_t n = strlen(name);
    memcpy(tmp, name, n);
    return name_key(tmp, n);
}

/* The first byte from p on that ends a name (name_stop), or end. Names are short: byte by
 * byte. */
static inline const char *name_end(const char *p, const char *end)
{
    while (p < end && !name_stop[(unsigned char)*p])
        p++;
    return p;
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

/* The usual end tag, fast: when n (after "</") holds the open element's name, if short, and
 * '>' straight after it, that '>'; NULL otherwise (the general path decides). */
static inline const char *end_of_top(const scan *sc, const char *n, const char *end)
{
    if (sc->depth == 0)
        return NULL;
    uint64_t top = sc->stack[sc->depth - 1];
    size_t len = (size_t)(top >> 56);
    if (len > 7 || n + len >= end)
        return NULL;
    uint64_t want = (top & 0x00FFFFFFFFFFFFFFULL) | ((uint64_t)'>' << (8 * len));
    return (w_load(n) & (~0ULL >> (56 - 8 * len))) == want ? n + len : NULL;
}

/* The quote c closing an attribute value that starts at p; NULL if the buffer ends first; *bad
 * set on a '<' inside the value (once the value is known to close). */
static inline const char *quote_end(blk *b, const char *p, char c, int *bad)
{
    p = blk_find(b, p, c == '"' ? BK_QUOT : BK_APOS);
    if (p == b->end)
        return NULL;
    if (*p == c)
        return p;
    if (memchr(p, c, (size_t)(b->end - p)))
        *bad = 1;
    return NULL;
}

/* tag_end, quote by quote. */
static const char *tag_end_walk(blk *b, const char *p, int *bad)
{
    for (;;) {
        p = blk_find(b, p, BK_TAG);
        if (p == b->end)
            return NULL;
        if (*p == '>')
            return p;
        if (*p == '<') {
            *bad = 1;
            return NULL;
        }
        const char *q = quote_end(b, p + 1, *p, bad);
        if (!q)
            return NULL;
        p = q + 1;
    }
}

/* The '>' closing the tag whose attributes start at p (< end), honouring quotes; NULL if the
 * buffer ends first; *bad set on a '<' (not allowed inside a tag or an attribute value). At
 * once when the first '>' is in the block with no '<' or '\'' before it and an even number of
 * '"' (those pair up, so it is outside them); otherwise quote by quote. */
static inline const char *tag_end(blk *b, const char *p, int *bad)
{
    size_t in = (size_t)(p - b->base);
    if (in >= 64 || (in > 0 && !(b->gt >> in))) {
        blk_load(b, p);
        in = 0;
    }
    uint64_t gts = b->gt >> in;
    if (gts) {
        unsigned k = (unsigned)__builtin_ctzll(gts);
        uint64_t span = ((1ULL << k) - 1) << in;
        if (!((b->lt | b->apos) & span) && !__builtin_parityll(b->quot & span))
            return p + k;
    }
    return tag_end_walk(b, p, bad);
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

/* An element's part in xlsx_value_path, by its key. */
static inline unsigned char scan_kind(const scan *sc, uint64_t key)
{
    if (key == sc->k_v)
        return XLSX_VK_V;
    if (key == sc->k_is)
        return XLSX_VK_IS;
    if (key == sc->k_r)
        return XLSX_VK_R;
    if (key == sc->k_t)
        return XLSX_VK_T;
    return XLSX_VK_OTHER;
}

/* Whether text directly inside the open element is a cell's value: the reader's rule
 * (xlsx_value_path) over the elements open below a <c> child of the open <row>. */
static int scan_in_value(const scan *sc)
{
    if (!sc->row_depth)
        return 0;
    int below = sc->depth - sc->row_depth - 1;
    if (below < 1 || below > XLSX_VALUE_DEPTH || sc->stack[sc->row_depth] != sc->k_c)
        return 0;
    unsigned char kinds[XLSX_VALUE_DEPTH];
    for (int i = 0; i < below; i++)
        kinds[i] = scan_kind(sc, sc->stack[sc->row_depth + 1 + i]);
    return xlsx_value_path(kinds, below);
}

/* Scans buf[*pos, len), which has SCAN_PAD readable bytes after it. SC_MORE: *pos is where
 * the next (incomplete) construct starts. */
static int scan_run(scan *sc, const char *buf, size_t len, size_t *pos, int eof, char *err,
                    size_t errlen)
{
    const char *p = buf + *pos, *end = buf + len;
    blk bk = {.base = end, .end = end}; /* no block yet: the buffer changed since the last call */
    if (!sc->started) {
        if (end - p < 4 && !eof)
            return SC_MORE;
        sc->started = 1;
        if (end - p >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
            p += 3;
        else if (end - p >= 2 && ((unsigned char)p[0] >= 0xFE || p[1] == '\0'))
            return SC_FALLBACK; /* UTF-16 */
    }
    for (;;) {
        /* Most tags follow one another: the next byte is tested before searching. */
        const char *lt = p;
        if (p == end || *p != '<') {
            lt = blk_find(&bk, p, BK_LT);
            if (sc->depth == 0 && !all_ws(p, (size_t)(lt - p))) {
                qn_errf(err, errlen, "text outside the root element");
                return SC_ERROR;
            }
            /* Any text in a value makes it non-empty (the reader keeps whitespace). */
            sc->row_value |= sc->in_value && lt > p;
            if (lt == end) {
                *pos = len;
                return SC_MORE;
            }
            p = lt;
        }
        if (end - lt <= 2)
            goto more;
        char c = lt[1];
        if (c == '/') {
            const char *n = lt + 2, *gt = end_of_top(sc, n, end);
            if (!gt) {
                const char *ne = name_end(n, end);
                if (ne == end)
                    goto more;
                if (name_stop[(unsigned char)*ne] == NS_PREFIX)
                    return SC_FALLBACK;
                gt = ne;
                while (gt < end && is_ws(*gt))
                    gt++;
                if (gt == end)
                    goto more;
                if (*gt != '>' || ne == n) {
                    qn_errf(err, errlen, "malformed end tag");
                    return SC_ERROR;
                }
                if (sc->depth == 0 || sc->stack[sc->depth - 1] != name_key(n, (size_t)(ne - n))) {
                    qn_errf(err, errlen, "mismatched end tag </%.*s>",
                            (int)(ne - n > 40 ? 40 : ne - n), n);
                    return SC_ERROR;
                }
            }
            if (sc->row_depth == sc->depth) {
                sc->row_depth = 0;
                sc->nonempty += sc->row_value;
            }
            if (--sc->depth == 0)
                sc->root_closed = 1;
            sc->in_value = scan_in_value(sc);
            p = gt + 1;
            continue;
        }
        if (c == '?') {
            const char *qe = memmem(lt + 2, (size_t)(end - lt - 2), "?>", 2);
            if (!qe)
                goto more;
            if (end - lt >= 5 && memcmp(lt, "<?xml", 5) == 0 && is_ws(lt[5]) &&
                !decl_is_utf8(lt, (size_t)(qe - lt)))
                return SC_FALLBACK;
            p = qe + 2;
            continue;
        }
        if (c == '!') {
            if (end - lt < 4)
                goto more;
            if (memcmp(lt, "<!--", 4) != 0)
                return SC_FALLBACK; /* CDATA or a DTD: the full parser decides */
            const char *ce = memmem(lt + 4, (size_t)(end - lt - 4), "-->", 3);
            if (!ce)
                goto more;
            p = ce + 3;
            continue;
        }
        /* a start tag */
        const char *n = lt + 1, *ne = name_end(n, end);
        if (ne == end)
            goto more;
        unsigned char stop = name_stop[(unsigned char)*ne];
        if (stop == NS_PREFIX)
            return SC_FALLBACK;
        if (ne == n || stop == NS_BAD) {
            qn_errf(err, errlen, "malformed start tag");
            return SC_ERROR;
        }
        int bad = 0;
        const char *gt = *ne == '>' ? ne : tag_end(&bk, ne, &bad);
        if (bad) {
            qn_errf(err, errlen, "'<' inside a tag");
            return SC_ERROR;
        }
        if (!gt)
            goto more;
        uint64_t key = name_key(n, (size_t)(ne - n)), parent = 0;
        int depth = sc->depth;
        if (depth > 0) {
            parent = sc->stack[depth - 1]; /* so the root is open, and was a worksheet */
        } else {
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
        }
        p = gt + 1;
        if (gt[-1] == '/') { /* an empty element */
            if (depth == 0)
                sc->root_closed = 1;
            continue;
        }
        if (depth == SCAN_MAXDEPTH)
            return SC_FALLBACK;
        sc->stack[depth++] = key;
        sc->depth = depth;
        if (key == sc->k_row && depth == 3 && parent == sc->k_sheetdata) {
            sc->row_depth = depth;
            sc->row_value = 0;
        }
        sc->in_value = scan_in_value(sc);
        continue;
    more:
        if (eof) {
            qn_errf(err, errlen, "the XML ends in the middle of a tag");
            return SC_ERROR;
        }
        *pos = (size_t)(p - buf);
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
    char *buf = calloc(1, SCAN_BUF + SCAN_PAD);
    char msg[160] = "";
    if (!sc || !buf) {
        qn_errf(err, errlen, "spreadsheet: out of memory");
        goto done;
    }
    sc->k_row = name_key_of("row");
    sc->k_sheetdata = name_key_of("sheetData");
    sc->k_worksheet = name_key_of("worksheet");
    sc->k_v = name_key_of("v");
    sc->k_c = name_key_of("c");
    sc->k_t = name_key_of("t");
    sc->k_is = name_key_of("is");
    sc->k_r = name_key_of("r");
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
        size_t want = SCAN_BUF - len < SCAN_READ ? SCAN_BUF - len : SCAN_READ;
        zip_int64_t n = xlzip_stream_read(&zs, buf + len, want, err, errlen);
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
