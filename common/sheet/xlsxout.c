/* A one-sheet .xlsx written row by row: see xlsxout.h. The parts are the least a workbook
 * needs (Excel, LibreOffice and openpyxl open it): content types, the package and workbook
 * relationships, workbook.xml, a default style sheet and the sheet. */
#include "xlsxout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XO_MAX_COLS 16384 /* Excel's last column, XFD */
#define XO_LEVEL                                                                                   \
    1 /* zlib's fastest: the sheet XML is repetitive, level 1 already                              \
         compresses it about tenfold */

#define XO_XML_DECL "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n"
#define XO_NS_MAIN  "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
#define XO_NS_REL   "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
#define XO_NS_PKG   "http://schemas.openxmlformats.org/package/2006/relationships"
#define XO_CT_OFF   "application/vnd.openxmlformats-officedocument.spreadsheetml."

static const char xo_content_types[] = XO_XML_DECL
    "<Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\">"
    "<Default Extension=\"rels\" "
    "ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/>"
    "<Default Extension=\"xml\" ContentType=\"application/xml\"/>"
    "<Override PartName=\"/xl/workbook.xml\" ContentType=\"" XO_CT_OFF "sheet.main+xml\"/>"
    "<Override PartName=\"/xl/worksheets/sheet1.xml\" ContentType=\"" XO_CT_OFF "worksheet+xml\"/>"
    "<Override PartName=\"/xl/styles.xml\" ContentType=\"" XO_CT_OFF "styles+xml\"/></Types>";

static const char xo_root_rels[] =
    XO_XML_DECL "<Relationships xmlns=\"" XO_NS_PKG "\"><Relationship Id=\"rId1\" Type=\"" XO_NS_REL
                "/officeDocument\" Target=\"xl/workbook.xml\"/></Relationships>";

static const char xo_workbook_rels[] =
    XO_XML_DECL "<Relationships xmlns=\"" XO_NS_PKG "\"><Relationship Id=\"rId1\" Type=\"" XO_NS_REL
                "/worksheet\" Target=\"worksheets/sheet1.xml\"/><Relationship Id=\"rId2\" "
                "Type=\"" XO_NS_REL "/styles\" Target=\"styles.xml\"/></Relationships>";

static const char xo_styles[] =
    XO_XML_DECL "<styleSheet xmlns=\"" XO_NS_MAIN "\"><fonts count=\"1\"><font><sz val=\"11\"/>"
                "<name val=\"Calibri\"/></font></fonts><fills count=\"2\"><fill><patternFill "
                "patternType=\"none\"/></fill><fill><patternFill patternType=\"gray125\"/>"
                "</fill></fills><borders count=\"1\"><border><left/><right/><top/><bottom/>"
                "<diagonal/></border></borders><cellStyleXfs count=\"1\"><xf numFmtId=\"0\" "
                "fontId=\"0\" fillId=\"0\" borderId=\"0\"/></cellStyleXfs><cellXfs count=\"1\">"
                "<xf numFmtId=\"0\" fontId=\"0\" fillId=\"0\" borderId=\"0\" xfId=\"0\"/>"
                "</cellXfs><cellStyles count=\"1\"><cellStyle name=\"Normal\" xfId=\"0\" "
                "builtinId=\"0\"/></cellStyles></styleSheet>";

static const char xo_workbook_head[] =
    XO_XML_DECL "<workbook xmlns=\"" XO_NS_MAIN "\" xmlns:r=\"" XO_NS_REL "\"><sheets>"
                "<sheet name=\"";
static const char xo_workbook_tail[] = "\" sheetId=\"1\" r:id=\"rId1\"/></sheets></workbook>";

static const char xo_sheet_head[] = XO_XML_DECL "<worksheet xmlns=\"" XO_NS_MAIN "\"><sheetData>";
static const char xo_sheet_tail[] = "</sheetData></worksheet>";

struct xlsxout {
    zipout *z;
    int ncols;
    long long row;  /* the number of the next row */
    char (*col)[4]; /* column letters, "A".."XFD" */
};

/* The archive keeps its first failure: a sequence of writes is checked once, by its last. */

static qn_status xo_put(xlsxout *x, const char *s, size_t n)
{
    return zipout_write(x->z, s, n);
}

static qn_status xo_puts(xlsxout *x, const char *s)
{
    return zipout_write(x->z, s, strlen(s));
}

/* s as XML character data (quote too: also fit for an attribute value). Control characters
 * XML 1.0 cannot carry become U+FFFD; a CR is kept as a reference (a parser would drop it). */
static qn_status xo_text(xlsxout *x, const char *s)
{
    const char *run = s;
    qn_status st = QN_OK;
    for (const char *p = s;; p++) {
        unsigned char c = (unsigned char)*p;
        const char *rep = NULL;
        if (c == '&')
            rep = "&amp;";
        else if (c == '<')
            rep = "&lt;";
        else if (c == '>')
            rep = "&gt;";
        else if (c == '"')
            rep = "&quot;";
        else if (c == '\r')
            rep = "&#13;";
        else if (c && c < 0x20 && c != '\t' && c != '\n')
            rep = "\xEF\xBF\xBD";
        if (!rep && c)
            continue;
        if (p > run)
            st = xo_put(x, run, (size_t)(p - run));
        if (!c)
            return st;
        st = xo_puts(x, rep);
        run = p + 1;
    }
}

static int xo_digits(const char **p)
{
    const char *s = *p;
    while (**p >= '0' && **p <= '9')
        (*p)++;
    return *p > s;
}

/* -12, 3.5, 1E+18: what a <v> may hold. */
static int xo_is_number(const char *s)
{
    if (*s == '-')
        s++;
    if (!xo_digits(&s))
        return 0;
    if (*s == '.' && (s++, !xo_digits(&s)))
        return 0;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!xo_digits(&s))
            return 0;
    }
    return *s == '\0';
}

static int xo_is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static qn_status xo_row(xlsxout *x, const char *const *cells, unsigned numeric_mask)
{
    char buf[96];
    long long r = x->row++;
    snprintf(buf, sizeof(buf), "<row r=\"%lld\">", r);
    (void)xo_puts(x, buf);
    for (int c = 0; c < x->ncols; c++) {
        const char *v = cells[c];
        if (!v)
            continue;
        if (c < 32 && (numeric_mask >> c & 1u) && xo_is_number(v)) {
            snprintf(buf, sizeof(buf), "<c r=\"%s%lld\"><v>", x->col[c], r);
            (void)xo_puts(x, buf);
            (void)xo_puts(x, v);
            (void)xo_puts(x, "</v></c>");
            continue;
        }
        size_t n = strlen(v);
        int keep = n && (xo_is_space(v[0]) || xo_is_space(v[n - 1]));
        snprintf(buf, sizeof(buf), "<c r=\"%s%lld\" t=\"inlineStr\"><is><t%s>", x->col[c], r,
                 keep ? " xml:space=\"preserve\"" : "");
        (void)xo_puts(x, buf);
        (void)xo_text(x, v);
        (void)xo_puts(x, "</t></is></c>");
    }
    return xo_puts(x, "</row>");
}

qn_status xlsxout_row(xlsxout *x, const char *const *cells, unsigned numeric_mask)
{
    return xo_row(x, cells, numeric_mask);
}

/* One small part, whole. */
static qn_status xo_part(xlsxout *x, const char *name, const char *data)
{
    (void)zipout_begin(x->z, name);
    return xo_puts(x, data);
}

qn_status xlsxout_open(zipout_sink sink, void *arg, const char *sheet_name,
                       const char *const *header, int ncols, xlsxout **out)
{
    qn_status st = QN_ENOMEM;
    if (ncols < 1 || ncols > XO_MAX_COLS)
        return QN_EINVAL;
    xlsxout *x = calloc(1, sizeof(*x));
    if (!x || !(x->col = calloc((size_t)ncols, sizeof(*x->col))) ||
        !(x->z = zipout_new(sink, arg, XO_LEVEL)))
        goto fail;
    x->ncols = ncols;
    x->row = 1;
    for (int c = 0; c < ncols; c++) {
        char rev[4];
        int n = 0;
        for (int v = c + 1; v > 0; v = (v - 1) / 26)
            rev[n++] = (char)('A' + (v - 1) % 26);
        for (int i = 0; i < n; i++)
            x->col[c][i] = rev[n - 1 - i];
    }
    (void)xo_part(x, "[Content_Types].xml", xo_content_types);
    (void)xo_part(x, "_rels/.rels", xo_root_rels);
    (void)xo_part(x, "xl/workbook.xml", xo_workbook_head);
    (void)xo_text(x, sheet_name);
    (void)xo_puts(x, xo_workbook_tail);
    (void)xo_part(x, "xl/_rels/workbook.xml.rels", xo_workbook_rels);
    (void)xo_part(x, "xl/styles.xml", xo_styles);
    (void)xo_part(x, "xl/worksheets/sheet1.xml", xo_sheet_head);
    st = xo_row(x, header, 0);
    if (st != QN_OK)
        goto fail;
    *out = x;
    return QN_OK;
fail:
    xlsxout_free(x);
    return st;
}

qn_status xlsxout_close(xlsxout *x)
{
    (void)xo_puts(x, xo_sheet_tail);
    return zipout_finish(x->z);
}

void xlsxout_free(xlsxout *x)
{
    if (!x)
        return;
    zipout_free(x->z);
    free(x->col);
    free(x);
}
