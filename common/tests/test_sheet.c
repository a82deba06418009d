/*
 * sheet: workbooks written by libxlsxwriter (normal and constant-memory modes), hand-made zips
 * (libzip) for the edge cases, CSV; sheet_count_data_rows must agree with iteration.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xlsxwriter.h>
#include <zip.h>
#include <zlib.h>

#include "sheet.h"
#include "testhelp.h"
#include "xlzip.h"

static char dir[256];

static const char *tpath(const char *name)
{
    static char p[8][512];
    static int i;
    i = (i + 1) % 8;
    snprintf(p[i], sizeof(p[i]), "%s/%s", dir, name);
    return p[i];
}

/* ---- helpers */

/* Iterates the whole sheet; returns the row count (or -1 on error) and agrees-checks count. */
static int64_t iterate_count(const char *path, const sheet_limits *lim)
{
    char err[256] = "";
    sheet *s = sheet_open(path, lim, err, sizeof(err));
    if (!s)
        return -1;
    int64_t n = 0;
    sheet_row row;
    qn_status st;
    while ((st = sheet_next_row(s, &row)) == QN_OK)
        n++;
    sheet_free(s);
    return st == QN_ENOTFOUND ? n : -1;
}

static void check_count_agrees(const char *path, int64_t expect)
{
    char err[256] = "";
    int64_t rows = -1;
    qn_status st = sheet_count_data_rows(path, NULL, &rows, err, sizeof(err));
    if (st != QN_OK)
        printf("  count error: %s\n", err);
    CHECK_EQ_INT(st, QN_OK);
    CHECK_EQ_INT(rows, expect);
    CHECK_EQ_INT(iterate_count(path, NULL), expect);
}

typedef struct zpart {
    const char *name;
    const char *data;
    size_t len; /* 0: strlen(data) */
} zpart;

static int write_zip(const char *path, const zpart *parts, int n)
{
    int err = 0;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);
    if (!z)
        return -1;
    for (int i = 0; i < n; i++) {
        size_t len = parts[i].len ? parts[i].len : strlen(parts[i].data);
        /* libzip owns (frees) a non-empty buffer; an empty entry needs none. */
        char *copy = len ? malloc(len) : NULL;
        if (len)
            memcpy(copy, parts[i].data, len);
        zip_source_t *src = zip_source_buffer(z, copy, len, len ? 1 : 0);
        if (!src || zip_file_add(z, parts[i].name, src, ZIP_FL_OVERWRITE) < 0) {
            zip_source_free(src);
            zip_discard(z);
            return -1;
        }
    }
    return zip_close(z) == 0 ? 0 : -1;
}

#define ROOT_RELS                                                                                  \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Relationships "                                    \
    "xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship "        \
    "Id=\"rId1\" "                                                                                 \
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" " \
    "Target=\"xl/workbook.xml\"/></Relationships>"

#define WORKBOOK                                                                                   \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><workbook "                                         \
    "xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\" "                         \
    "xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\"><sheets>"     \
    "<sheet name=\"名单\" sheetId=\"3\" r:id=\"rId7\"/><sheet name=\"other\" sheetId=\"1\" "     \
    "r:id=\"rId1\"/></sheets></workbook>"

/* The first sheet (rId7) is worksheets/data.xml; sheet1.xml is the *second* sheet. */
#define WB_RELS_HEAD                                                                               \
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Relationships "                                    \
    "xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\">"                      \
    "<Relationship Id=\"rId1\" "                                                                   \
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet\" "      \
    "Target=\"worksheets/sheet1.xml\"/>"                                                           \
    "<Relationship Id=\"rId7\" "                                                                   \
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet\" "      \
    "Target=\"./worksheets/../worksheets/data.xml\"/>"
#define WB_RELS_SST                                                                                \
    "<Relationship Id=\"rId9\" "                                                                   \
    "Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings\" "  \
    "Target=\"/xl/sharedStrings.xml\"/>"
#define WB_RELS_TAIL "</Relationships>"

#define WS_HEAD                                                                                    \
    "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<worksheet "                   \
    "xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\"><sheetData>"
#define WS_TAIL "</sheetData></worksheet>"

#define HDR_INLINE                                                                                 \
    "<row r=\"1\"><c r=\"A1\" t=\"inlineStr\"><is><t>用户ID</t></is></c><c r=\"B1\" "            \
    "t=\"inlineStr\"><is><t>手机号</t></is></c><c r=\"C1\" "                                    \
    "t=\"inlineStr\"><is><t>邮箱</t></is></c></row>"

static const char *decoy = WS_HEAD HDR_INLINE
    "<row r=\"2\"><c r=\"A2\" t=\"inlineStr\"><is><t>DECOY</t></is></c></row>" WS_TAIL;

/* A workbook whose first sheet is sheet_xml (and shared strings sst_xml, if any). */
static int write_book(const char *path, const char *sheet_xml, const char *sst_xml)
{
    zpart parts[6] = {
        {"_rels/.rels", ROOT_RELS, 0},
        {"xl/workbook.xml", WORKBOOK, 0},
        {"xl/_rels/workbook.xml.rels",
         sst_xml ? WB_RELS_HEAD WB_RELS_SST WB_RELS_TAIL : WB_RELS_HEAD WB_RELS_TAIL, 0},
        {"xl/worksheets/sheet1.xml", decoy, 0},
    };
    int n = 4;
    if (sheet_xml)
        parts[n++] = (zpart){"xl/worksheets/data.xml", sheet_xml, 0};
    if (sst_xml)
        parts[n++] = (zpart){"xl/sharedStrings.xml", sst_xml, 0};
    return write_zip(path, parts, n);
}

/* Writes the reference layout with libxlsxwriter:
 *   1: 用户ID 手机号 邮箱          (header)
 *   2: "1810518709471555585" (text) 13800000001 a@example.com
 *   3: 1810518709471555585.0 (number) 13800000002 (no mail)
 *   4: (absent)
 *   5: "1810518709471555590" (no phone) c@example.com   (sparse: B missing)
 *   6: a blank formatted cell only (an empty row)
 *   7: 42 (number) "  spaced  "
 */
static int write_xlsxwriter(const char *path, int constant_memory)
{
    lxw_workbook_options opt = {.constant_memory = constant_memory ? LXW_TRUE : LXW_FALSE,
                                .tmpdir = dir};
    lxw_workbook *wb = workbook_new_opt(path, &opt);
    if (!wb)
        return -1;
    lxw_worksheet *ws = workbook_add_worksheet(wb, "名单");
    lxw_format *bold = workbook_add_format(wb);
    format_set_bold(bold);
    worksheet_write_string(ws, 0, 0, "用户ID", NULL);
    worksheet_write_string(ws, 0, 1, "手机号", NULL);
    worksheet_write_string(ws, 0, 2, "邮箱", NULL);
    worksheet_write_string(ws, 1, 0, "1810518709471555585", NULL);
    worksheet_write_string(ws, 1, 1, "13800000001", NULL);
    worksheet_write_string(ws, 1, 2, "a@example.com", NULL);
    worksheet_write_number(ws, 2, 0, 1810518709471555585.0, NULL);
    worksheet_write_string(ws, 2, 1, "13800000002", NULL);
    worksheet_write_string(ws, 4, 0, "1810518709471555590", NULL);
    worksheet_write_string(ws, 4, 2, "c@example.com", NULL);
    worksheet_write_blank(ws, 5, 1, bold);
    worksheet_write_number(ws, 6, 0, 42, NULL);
    worksheet_write_string(ws, 6, 1, "  spaced  ", NULL);
    /* A second sheet that must not be read. */
    lxw_worksheet *ws2 = workbook_add_worksheet(wb, "other");
    worksheet_write_string(ws2, 0, 0, "nope", NULL);
    return workbook_close(wb) == LXW_NO_ERROR ? 0 : -1;
}

static void check_reference_layout(const char *path)
{
    char err[256] = "";
    sheet *s = sheet_open(path, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (!s) {
        printf("  open: %s\n", err);
        return;
    }
    CHECK_EQ_INT(sheet_header_index(s, "用户ID"), 0);
    CHECK_EQ_INT(sheet_header_index(s, "手机号"), 1);
    CHECK_EQ_INT(sheet_header_index(s, " 邮箱 "), 2);
    CHECK_EQ_INT(sheet_header_index(s, "userId"), -1);
    sheet_row hdr;
    CHECK_EQ_INT(sheet_header(s, &hdr), QN_OK);
    CHECK_EQ_INT(hdr.number, 1);
    CHECK_EQ_INT(hdr.ncells, 3);

    sheet_row row;
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 2);
    CHECK_EQ_INT(row.ncells, 3);
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555585"); /* a text cell: digit-exact */
    CHECK_EQ_STR(sheet_cell(&row, 1), "13800000001");
    CHECK_EQ_STR(sheet_cell(&row, 2), "a@example.com");

    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 3);
    /* A number: libxlsxwriter stores the double with %.16G, so the id is already lossy in
     * the file; the reader returns that text unchanged (callers must reject it). */
    CHECK_EQ_STR(sheet_cell(&row, 0), "1.810518709471556E+18");
    CHECK_EQ_STR(sheet_cell(&row, 1), "13800000002");
    CHECK_EQ_STR(sheet_cell(&row, 2), "");

    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 5); /* row 4 is absent, row 6 empty */
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555590");
    CHECK_EQ_STR(sheet_cell(&row, 1), "");
    CHECK_EQ_STR(sheet_cell(&row, 2), "c@example.com");

    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 7);
    CHECK_EQ_STR(sheet_cell(&row, 0), "42");
    CHECK_EQ_STR(sheet_cell(&row, 1), "  spaced  ");
    CHECK_EQ_STR(sheet_cell(&row, 2), "");
    CHECK_EQ_STR(sheet_cell(&row, 99), "");

    CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
    CHECK_EQ_STR(sheet_error(s), "");
    sheet_free(s);
    check_count_agrees(path, 4);
}

/* ---- tests */

static void test_xlsxwriter_normal(void)
{
    const char *p = tpath("normal.xlsx");
    CHECK_EQ_INT(write_xlsxwriter(p, 0), 0);
    check_reference_layout(p);
}

static void test_xlsxwriter_constant_memory(void)
{
    const char *p = tpath("constmem.xlsx");
    CHECK_EQ_INT(write_xlsxwriter(p, 1), 0);
    check_reference_layout(p);
}

static void test_first_sheet_and_numbers(void)
{
    /* Numbers come back as stored: a digit-exact id, and Excel's own lossy form. */
    const char *p = tpath("numbers.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE
                            "<row r=\"2\"><c r=\"A2\"><v>1810518709471555585</v></c></row>"
                            "<row r=\"3\"><c r=\"A3\"><v>1.8105187094715556E+18</v></c>"
                            "<c r=\"C3\" t=\"s\"><v>0</v></c></row>" WS_TAIL,
                            "<sst xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/"
                            "main\" count=\"1\" uniqueCount=\"1\"><si><t>x@y.z</t></si></sst>"),
                 0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    sheet_row row;
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555585"); /* not the decoy sheet1.xml */
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_STR(sheet_cell(&row, 0), "1.8105187094715556E+18");
    CHECK_EQ_STR(sheet_cell(&row, 2), "x@y.z");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
    sheet_free(s);
    check_count_agrees(p, 2);
}

static void test_inline_and_rich_text(void)
{
    const char *p = tpath("rich.xlsx");
    CHECK_EQ_INT(
        write_book(p,
                   WS_HEAD HDR_INLINE
                   /* rich inline text in runs, a phonetic run that is not part of the value,
                    * cells without r (placed after the previous one), entities */
                   "<row r=\"2\"><c t=\"inlineStr\"><is><r><t>18105</t></r><r><rPr><b/></rPr>"
                   "<t>18709471555585</t></r><rPh sb=\"0\" eb=\"1\"><t>ヨミ</t></rPh></is></c>"
                   "<c t=\"inlineStr\"><is><t xml:space=\"preserve\"> 138 &amp; </t></is></c>"
                   "<c t=\"s\"><v>1</v></c></row>"
                   /* a row of empty values only: skipped */
                   "<row r=\"3\"><c r=\"A3\" t=\"inlineStr\"><is><t></t></is></c><c r=\"B3\"/>"
                   "<c r=\"C3\"><v></v></c></row>"
                   /* a cell far to the right */
                   "<row r=\"9\"><c r=\"AB9\" t=\"s\"><v>0</v></c></row>" WS_TAIL,
                   "<sst xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\">"
                   "<si><r><t>ri</t></r><r><t>ch</t></r></si><si><t>m@x.y</t><rPh><t>p</t>"
                   "</rPh></si></sst>"),
        0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    sheet_row row;
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 2);
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555585");
    CHECK_EQ_STR(sheet_cell(&row, 1), " 138 & ");
    CHECK_EQ_STR(sheet_cell(&row, 2), "m@x.y");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 9);
    CHECK_EQ_INT(row.ncells, 28);
    CHECK_EQ_STR(sheet_cell(&row, 27), "rich");
    CHECK_EQ_STR(sheet_cell(&row, 0), "");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
    sheet_free(s);
    check_count_agrees(p, 2);
}

/* Which text inside a <c> is its value (xlsx_value_path): the reader and the fast counter
 * share the rule, so they agree on the header and on the number of data rows. */
static void test_value_rule(void)
{
    /* Found by fuzz_xlsx (fuzz/corpus/xlsx/stray-si-in-cell.xml): a cell holding <si>s, one
     * with rich-text runs. Their <t>s are not the cell's value, so row 1 is empty and the
     * header is row 5; the counter used to take a <t> in any run <r> for a value, made row 1
     * the header and counted 3 data rows where the reader returned 2. */
    const char *p = tpath("stray-si.xlsx");
    CHECK_EQ_INT(
        write_book(p,
                   "<worksheet xml1s=\"http://schemas.openxmlformats.org/spreadsheetml/2005/main\">"
                   "<sheetData><row r=\"1\"><c r=\"A1\" iqueCount=\"3\"><si><t>userId</t></si>"
                   "<si><r><rPr><b/></rPr><t>ma</t></r><r><t>il</t></r></si><si>"
                   "<t>1810518709471555586</t><rPh><t>phonetic</t></rPh></si>v></c></row>"
                   "<row r=\"5\"><c r=\"B5\" t=\"e\"><v>#N/A</v></c></row><row r=\"6\">"
                   "<c r=\"A6\" t=\"s\"><v>2</v></c></row><row><c t=\"inlineStr\"><is>"
                   "<t xml:space=\"preserve\"> 1002 </t></is></c></row></sheetData></worksheet>",
                   "<sst xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\" "
                   "count=\"3\" uniqueCount=\"3\"><si><t>userId</t></si><si><r><rPr><b/></rPr>"
                   "<t>ma</t></r><r><t>il</t></r></si><si><t>1810518709471555586</t><rPh>"
                   "<t>phonetic</t></rPh></si></sst>"),
        0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        sheet_row row;
        CHECK_EQ_INT(sheet_header(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 5);
        CHECK_EQ_STR(sheet_cell(&row, 1), "#N/A");
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 6);
        CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555586");
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 7);
        CHECK_EQ_STR(sheet_cell(&row, 0), " 1002 ");
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
        sheet_free(s);
    }
    check_count_agrees(p, 2);

    /* The rest of the rule, each way round: a value's text after a comment or a child element
     * counts; a <t> in a run inside a phonetic run, or under an element <is> does not hold,
     * or a formula alone, does not. */
    p = tpath("valuerule.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE "<row r=\"2\"><c><v><!-- c -->7</v></c></row>"
                                               "<row r=\"3\"><c><v><x/>8</v></c></row>"
                                               "<row r=\"4\"><c t=\"inlineStr\"><is><rPh><r><t>p"
                                               "</t></r></rPh></is></c></row>"
                                               "<row r=\"5\"><c t=\"inlineStr\"><is><x><t>q</t>"
                                               "</x></is></c></row>"
                                               "<row r=\"6\"><c><f>1+1</f></c></row>"
                                               "<row r=\"7\"><c><v>9</v></c></row>" WS_TAIL,
                            NULL),
                 0);
    s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        sheet_row row;
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 2);
        CHECK_EQ_STR(sheet_cell(&row, 0), "7");
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 3);
        CHECK_EQ_STR(sheet_cell(&row, 0), "8");
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
        CHECK_EQ_INT(row.number, 7);
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
        sheet_free(s);
    }
    check_count_agrees(p, 3);
}

/* Inputs the fast counter hands over to the full parser: the result must be the same. */
static void test_count_fallbacks(void)
{
    /* namespace prefixes */
    const char *p = tpath("prefixed.xlsx");
    CHECK_EQ_INT(
        write_book(p,
                   "<x:worksheet xmlns:x=\"http://schemas.openxmlformats.org/spreadsheetml/2006/"
                   "main\"><x:sheetData><x:row r=\"1\"><x:c t=\"inlineStr\"><x:is><x:t>用户ID"
                   "</x:t></x:is></x:c></x:row><x:row r=\"2\"><x:c><x:v>7</x:v></x:c></x:row>"
                   "<x:row r=\"3\"><x:c><x:v>8</x:v></x:c></x:row></x:sheetData></x:worksheet>",
                   NULL),
        0);
    check_count_agrees(p, 2);
    /* CDATA */
    p = tpath("cdata.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE "<row r=\"2\"><c><v><![CDATA[5]]></v></c></row>"
                                               "<row r=\"3\"><c><v><![CDATA[]]></v></c></row>"
                                               "<!-- a comment --><row r=\"4\"><c><v>6</v></c>"
                                               "</row>" WS_TAIL,
                            NULL),
                 0);
    check_count_agrees(p, 2);
    /* an empty shared string: the row referring to it is empty */
    p = tpath("emptysst.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE "<row r=\"2\"><c t=\"s\"><v>0</v></c></row>"
                                               "<row r=\"3\"><c t=\"s\"><v>1</v></c></row>" WS_TAIL,
                            "<sst><si><t></t></si><si><t>v</t></si></sst>"),
                 0);
    check_count_agrees(p, 1);
    /* only a header, and nothing at all */
    p = tpath("headeronly.xlsx");
    CHECK_EQ_INT(write_book(p, WS_HEAD HDR_INLINE WS_TAIL, NULL), 0);
    check_count_agrees(p, 0);
    p = tpath("empty.xlsx");
    CHECK_EQ_INT(write_book(p, WS_HEAD WS_TAIL, NULL), 0);
    check_count_agrees(p, 0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        CHECK_EQ_INT(sheet_header_index(s, "用户ID"), -1);
        sheet_row row;
        CHECK_EQ_INT(sheet_header(s, &row), QN_ENOTFOUND);
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
        sheet_free(s);
    }
}

/* Every way to read path fails with QN_EINVAL (or open fails) and a message containing want. */
static void check_refused(const char *path, const sheet_limits *lim, const char *want)
{
    char err[256] = "";
    int64_t rows = -1;
    qn_status st = sheet_count_data_rows(path, lim, &rows, err, sizeof(err));
    CHECK(st != QN_OK);
    if (want && !strstr(err, want)) {
        printf("  count: \"%s\" does not mention \"%s\"\n", err, want);
        CHECK(0);
    }
    err[0] = '\0';
    sheet *s = sheet_open(path, lim, err, sizeof(err));
    if (s) {
        sheet_row row;
        qn_status rs;
        while ((rs = sheet_next_row(s, &row)) == QN_OK)
            ;
        CHECK_EQ_INT(rs, QN_EINVAL);
        snprintf(err, sizeof(err), "%s", sheet_error(s));
        CHECK(sheet_next_row(s, &row) == QN_EINVAL); /* sticky */
        sheet_free(s);
    }
    CHECK(err[0] != '\0');
    if (want && !strstr(err, want)) {
        printf("  read: \"%s\" does not mention \"%s\"\n", err, want);
        CHECK(0);
    }
}

static void test_malformed_xml(void)
{
    static const char *bad[] = {
        WS_HEAD HDR_INLINE "<row r=\"2\"><c><v>1</c></row>" WS_TAIL, /* mismatched */
        WS_HEAD HDR_INLINE "<row r=\"2\"><c><v>1</v></c></row>",     /* truncated */
        WS_HEAD HDR_INLINE "<row r=\"2\"><c r=\"A<2\"><v>1</v></c></row>" WS_TAIL,
        WS_HEAD HDR_INLINE WS_TAIL "<worksheet/>", /* two roots */
        WS_HEAD HDR_INLINE "<row r=\"2\"><c><v>1</v></c></row></sheetData></nope>",
        "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\">]><worksheet><sheetData>"
        "<row><c><v>&lol;</v></c></row></sheetData></worksheet>", /* DTDs are refused */
        "\x01\x02garbage",
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *p = tpath("bad.xlsx");
        CHECK_EQ_INT(write_book(p, bad[i], NULL), 0);
        size_t failed = (size_t)th_case_failed;
        check_refused(p, NULL, "spreadsheet");
        if (th_case_failed && !failed)
            printf("  (case %zu)\n", i);
    }
    /* Bad cell-level content the fast counter does not model: the reader refuses it. */
    const char *p = tpath("badref.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE "<row r=\"2\"><c r=\"2A\"><v>1</v></c></row>"
                                               "<row r=\"2\"><c><v>1</v></c></row>" WS_TAIL,
                            NULL),
                 0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        sheet_row row;
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_EINVAL);
        CHECK(strstr(sheet_error(s), "cell reference") != NULL);
        sheet_free(s);
    }
    p = tpath("badsst.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE "<row r=\"2\"><c t=\"s\"><v>5</v></c></row>" WS_TAIL,
                            "<sst><si><t>a</t></si></sst>"),
                 0);
    s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        sheet_row row;
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_EINVAL);
        CHECK(strstr(sheet_error(s), "shared string index") != NULL);
        sheet_free(s);
    }
    p = tpath("badsst2.xlsx");
    CHECK_EQ_INT(write_book(p, WS_HEAD HDR_INLINE WS_TAIL, "<sst><si><t>a</si></sst>"), 0);
    s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s == NULL);
    CHECK(strstr(err, "sharedStrings.xml") != NULL);
    sheet_free(s);
}

static void test_missing_parts_and_not_zip(void)
{
    char err[256];
    const char *p = tpath("nosheet.xlsx");
    CHECK_EQ_INT(write_book(p, NULL, NULL), 0); /* rId7 -> data.xml, which is absent */
    CHECK(sheet_open(p, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "xl/worksheets/data.xml") != NULL);
    int64_t rows;
    CHECK_EQ_INT(sheet_count_data_rows(p, NULL, &rows, err, sizeof(err)), QN_EINVAL);
    CHECK(strstr(err, "missing") != NULL);

    p = tpath("nowb.xlsx");
    zpart only[] = {{"hello.txt", "hi", 0}};
    CHECK_EQ_INT(write_zip(p, only, 1), 0);
    CHECK(sheet_open(p, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "workbook") != NULL);

    /* Not a zip although named .xlsx; a zip cut in half; a legacy .xls. */
    p = tpath("fake.xlsx");
    FILE *f = fopen(p, "wb");
    fputs("用户ID,手机号\n1,2\n", f);
    fclose(f);
    CHECK(sheet_open(p, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "not an xlsx") != NULL);

    const char *full = tpath("normal.xlsx"); /* from test_xlsxwriter_normal */
    p = tpath("cut.xlsx");
    f = fopen(full, "rb");
    char *buf = malloc(1 << 20);
    size_t n = f ? fread(buf, 1, 1 << 20, f) : 0;
    if (f)
        fclose(f);
    CHECK(n > 1000);
    for (size_t cut = 8; cut < n; cut = cut * 3 / 2 + 1) {
        f = fopen(p, "wb");
        fwrite(buf, 1, cut, f);
        fclose(f);
        CHECK(sheet_open(p, NULL, err, sizeof(err)) == NULL);
        CHECK(sheet_count_data_rows(p, NULL, &rows, err, sizeof(err)) != QN_OK);
    }
    /* Flipped bytes inside the compressed data: an error (CRC or inflate or XML), no crash. */
    for (size_t i = 0; i < 40; i++) {
        char *copy = malloc(n);
        memcpy(copy, buf, n);
        copy[(i * 7919) % n] ^= 0x5A;
        f = fopen(p, "wb");
        fwrite(copy, 1, n, f);
        fclose(f);
        free(copy);
        sheet *s = sheet_open(p, NULL, err, sizeof(err));
        if (s) {
            sheet_row row;
            while (sheet_next_row(s, &row) == QN_OK)
                ;
            sheet_free(s);
        }
        if (sheet_count_data_rows(p, NULL, &rows, err, sizeof(err)) == QN_OK)
            CHECK(rows >= 0);
    }
    free(buf);

    p = tpath("legacy.xls");
    f = fopen(p, "wb");
    fwrite("\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1 rest", 1, 13, f);
    fclose(f);
    CHECK(sheet_open(p, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "legacy") != NULL);
    CHECK(sheet_open(tpath("does-not-exist.xlsx"), NULL, err, sizeof(err)) == NULL);
    CHECK_EQ_INT(sheet_count_data_rows(tpath("does-not-exist.xlsx"), NULL, &rows, err, sizeof(err)),
                 QN_ERR);
}

/* Patches a 32-bit field of entry `name` in both its local header (at local_at) and its central
 * one (at central_at): sets it to v, or adds v to it. */
static int zip_patch32(const char *path, const char *name, int local_at, int central_at, uint32_t v,
                       int add)
{
    FILE *f = fopen(path, "r+b");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    unsigned char *b = malloc((size_t)n);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(b);
        return -1;
    }
    size_t nl = strlen(name);
    int patched = 0;
    for (long i = 0; i + 46 < n; i++) {
        size_t at = 0;
        if (memcmp(b + i, "PK\x03\x04", 4) == 0 && (size_t)(b[i + 26] | b[i + 27] << 8) == nl &&
            memcmp(b + i + 30, name, nl) == 0)
            at = (size_t)i + (size_t)local_at;
        else if (memcmp(b + i, "PK\x01\x02", 4) == 0 &&
                 (size_t)(b[i + 28] | b[i + 29] << 8) == nl && memcmp(b + i + 46, name, nl) == 0)
            at = (size_t)i + (size_t)central_at;
        if (at) {
            uint32_t was = (uint32_t)b[at] | (uint32_t)b[at + 1] << 8 | (uint32_t)b[at + 2] << 16 |
                           (uint32_t)b[at + 3] << 24;
            uint32_t now = add ? was + v : v;
            for (int k = 0; k < 4; k++)
                b[at + k] = (unsigned char)(now >> (8 * k));
            patched++;
        }
    }
    rewind(f);
    fwrite(b, 1, (size_t)n, f);
    fclose(f);
    free(b);
    return patched == 2 ? 0 : -1;
}

/* The uncompressed size of entry `name`, in both its headers. */
static int zip_lie_about_size(const char *path, const char *name, uint32_t size)
{
    return zip_patch32(path, name, 22, 24, size, 0);
}

static void test_zip_bomb(void)
{
    /* 16 MiB of XML (whitespace between rows compresses ~1000:1) against a 1 MiB limit. */
    size_t big = 16u << 20;
    char *xml = malloc(big + 1);
    const char *head = WS_HEAD HDR_INLINE;
    size_t hl = strlen(head), tl = strlen(WS_TAIL);
    memcpy(xml, head, hl);
    memset(xml + hl, ' ', big - hl - tl);
    memcpy(xml + big - tl, WS_TAIL, tl);
    xml[big] = '\0';
    const char *p = tpath("bomb.xlsx");
    CHECK_EQ_INT(write_book(p, xml, NULL), 0);
    free(xml);
    sheet_limits lim = {.max_sheet_bytes = 1u << 20};
    check_refused(p, &lim, "too large");
    /* The default limit lets it through: it is a valid (if silly) sheet. */
    int64_t rows = -1;
    char err[256];
    CHECK_EQ_INT(sheet_count_data_rows(p, NULL, &rows, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(rows, 0);
    /* A zip that declares a small size: the real, inflated size is what is limited. */
    CHECK_EQ_INT(zip_lie_about_size(p, "xl/worksheets/data.xml", 1000), 0);
    sheet *s = sheet_open(p, &lim, err, sizeof(err));
    if (s) {
        sheet_row row;
        CHECK(sheet_next_row(s, &row) != QN_OK);
        CHECK(sheet_error(s)[0] != '\0');
        sheet_free(s);
    }
    CHECK(sheet_count_data_rows(p, &lim, &rows, err, sizeof(err)) != QN_OK);
    printf("  lying zip: %s\n", err);
}

/* A part whose bytes do not match its CRC-32 (or end early) is refused, by the count as by the
 * reader, whichever path inflates it. */
static void test_integrity(void)
{
    static const char *sheet_xml =
        WS_HEAD HDR_INLINE "<row r=\"2\"><c t=\"s\"><v>0</v></c></row>" WS_TAIL;
    static const char *sst_xml = "<sst><si><t>a</t></si></sst>";
    const char *p = tpath("crc.xlsx");
    CHECK_EQ_INT(write_book(p, sheet_xml, sst_xml), 0);
    check_count_agrees(p, 1);
    CHECK_EQ_INT(zip_patch32(p, "xl/worksheets/data.xml", 14, 16, 1, 1), 0);
    check_refused(p, NULL, "CRC error");

    p = tpath("crcsst.xlsx");
    CHECK_EQ_INT(write_book(p, sheet_xml, sst_xml), 0);
    CHECK_EQ_INT(zip_patch32(p, "xl/sharedStrings.xml", 14, 16, 1, 1), 0);
    check_refused(p, NULL, "CRC error");

    /* The compressed size cut short: the deflate stream ends early. */
    p = tpath("short.xlsx");
    CHECK_EQ_INT(write_book(p, sheet_xml, sst_xml), 0);
    CHECK_EQ_INT(zip_patch32(p, "xl/worksheets/data.xml", 18, 20, (uint32_t)-8, 1), 0);
    check_refused(p, NULL, "spreadsheet");
}

/* xlzip_crc32 is zlib's crc32, at every length, alignment and split. */
static void test_crc32(void)
{
    size_t n = 1u << 16;
    unsigned char *b = malloc(n + 16);
    uint32_t lcg = 12345;
    for (size_t i = 0; i < n + 16; i++) {
        lcg = lcg * 1103515245u + 12345u;
        b[i] = (unsigned char)(lcg >> 16);
    }
    int bad = 0;
    for (size_t len = 0; len <= 300; len++)
        for (size_t off = 0; off < 16; off++)
            bad += xlzip_crc32(0, b + off, len) != (uint32_t)crc32_z(0, b + off, len);
    for (size_t len = 1000; len < n; len = len * 3 + 7)
        bad += xlzip_crc32(0x12345678u, b + 3, len) != (uint32_t)crc32_z(0x12345678u, b + 3, len);
    uint32_t whole = (uint32_t)crc32_z(0, b, n), split = 0;
    for (size_t at = 0, k = 1; at < n; at += k, k = k * 2 + 1)
        split = xlzip_crc32(split, b + at, at + k > n ? n - at : k);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(split, whole);
    free(b);
}

static void test_limits(void)
{
    /* too many entries */
    zpart parts[40];
    char names[40][32];
    parts[0] = (zpart){"_rels/.rels", ROOT_RELS, 0};
    parts[1] = (zpart){"xl/workbook.xml", WORKBOOK, 0};
    parts[2] = (zpart){"xl/_rels/workbook.xml.rels", WB_RELS_HEAD WB_RELS_TAIL, 0};
    parts[3] = (zpart){"xl/worksheets/data.xml", WS_HEAD HDR_INLINE WS_TAIL, 0};
    for (int i = 4; i < 40; i++) {
        snprintf(names[i], sizeof(names[i]), "junk/%d.bin", i);
        parts[i] = (zpart){names[i], "x", 0};
    }
    const char *p = tpath("entries.xlsx");
    CHECK_EQ_INT(write_zip(p, parts, 40), 0);
    sheet_limits lim = {.max_entries = 20};
    check_refused(p, &lim, "entries");
    check_count_agrees(p, 0); /* fine under the default limit */

    /* cell length, shared-string count, shared-string size */
    p = tpath("limits.xlsx");
    CHECK_EQ_INT(write_book(p,
                            WS_HEAD HDR_INLINE
                            "<row r=\"2\"><c t=\"inlineStr\"><is><t>0123456789abcdef0123</t></is>"
                            "</c><c t=\"s\"><v>2</v></c></row>" WS_TAIL,
                            "<sst><si><t>a</t></si><si><t>b</t></si><si><t>c</t></si></sst>"),
                 0);
    check_count_agrees(p, 1);
    sheet_limits cell = {.max_cell_bytes = 16};
    char err[256];
    sheet *s = sheet_open(p, &cell, err, sizeof(err));
    CHECK(s != NULL);
    if (s) {
        sheet_row row;
        CHECK_EQ_INT(sheet_next_row(s, &row), QN_EINVAL);
        CHECK(strstr(sheet_error(s), "longer than the limit") != NULL);
        sheet_free(s);
    }
    sheet_limits strings = {.max_strings = 2};
    check_refused(p, &strings, "too many strings");
    sheet_limits sst_bytes = {.max_sst_bytes = 20};
    check_refused(p, &sst_bytes, "sharedStrings.xml is too large");
}

static int write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    fwrite(data, 1, len, f);
    return fclose(f);
}

static void test_csv(void)
{
    static const char csv[] = "\xEF\xBB\xBF用户ID,手机号,邮箱\r\n"
                              "1810518709471555585,13800000001,a@example.com\r\n"
                              "\r\n"
                              ",,\r\n"
                              "\"1810518709471555586\",\"138\"\"00\",\"multi\r\nline\"\r\n"
                              "1810518709471555587,,\"\"\n"
                              "lastline,\"x,y\"";
    const char *p = tpath("list.csv");
    CHECK_EQ_INT(write_file(p, csv, sizeof(csv) - 1), 0);
    char err[256];
    sheet *s = sheet_open(p, NULL, err, sizeof(err));
    CHECK(s != NULL);
    if (!s)
        return;
    CHECK_EQ_INT(sheet_header_index(s, "用户ID"), 0); /* the BOM is gone */
    CHECK_EQ_INT(sheet_header_index(s, "邮箱"), 2);
    sheet_row row;
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 2);
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555585");
    CHECK_EQ_STR(sheet_cell(&row, 2), "a@example.com");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 5); /* records 3 and 4 are empty */
    CHECK_EQ_STR(sheet_cell(&row, 0), "1810518709471555586");
    CHECK_EQ_STR(sheet_cell(&row, 1), "138\"00");
    CHECK_EQ_STR(sheet_cell(&row, 2), "multi\r\nline");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.ncells, 3);
    CHECK_EQ_STR(sheet_cell(&row, 1), "");
    CHECK_EQ_STR(sheet_cell(&row, 2), "");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_OK);
    CHECK_EQ_INT(row.number, 7);
    CHECK_EQ_STR(sheet_cell(&row, 0), "lastline");
    CHECK_EQ_STR(sheet_cell(&row, 1), "x,y");
    CHECK_EQ_INT(sheet_next_row(s, &row), QN_ENOTFOUND);
    sheet_free(s);
    check_count_agrees(p, 4);

    static const char *bad[] = {"a,b\n\"unterminated,c\n", "a,b\n\"x\"y,c\n", "a,b\n1,\0\n"};
    size_t lens[] = {strlen(bad[0]), strlen(bad[1]), 7};
    for (int i = 0; i < 3; i++) {
        p = tpath("bad.csv");
        CHECK_EQ_INT(write_file(p, bad[i], lens[i]), 0);
        check_refused(p, NULL, "spreadsheet");
    }
    p = tpath("long.csv");
    CHECK_EQ_INT(write_file(p, "h\n0123456789abcdef0123\n", 23), 0);
    sheet_limits lim = {.max_cell_bytes = 8};
    check_refused(p, &lim, "too long");
}

/* A constant-memory workbook of rows data rows under a header, every 7th row absent (sparse)
 * and every 3rd with a number. The data rows written, or -1. */
static int64_t write_many(const char *path, int rows)
{
    lxw_workbook_options opt = {.constant_memory = LXW_TRUE, .tmpdir = dir};
    lxw_workbook *wb = workbook_new_opt(path, &opt);
    lxw_worksheet *ws = wb ? workbook_add_worksheet(wb, NULL) : NULL;
    if (!ws)
        return -1;
    worksheet_write_string(ws, 0, 0, "用户ID", NULL);
    worksheet_write_string(ws, 0, 1, "手机号", NULL);
    int64_t n = 0;
    for (int r = 1; r <= rows; r++) {
        char id[32];
        snprintf(id, sizeof(id), "1810518709%09d", r);
        if (r % 7 == 0)
            continue;
        worksheet_write_string(ws, (lxw_row_t)r, 0, id, NULL);
        if (r % 3 == 0)
            worksheet_write_number(ws, (lxw_row_t)r, 1, r, NULL);
        n++;
    }
    return workbook_close(wb) == LXW_NO_ERROR ? n : -1;
}

/* The same rows as a CSV file. */
static int64_t write_many_csv(const char *path, int rows)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    fputs("用户ID,手机号\n", f);
    int64_t n = 0;
    for (int r = 1; r <= rows; r++) {
        if (r % 7 == 0) {
            fputs(",\n", f); /* an empty record */
            continue;
        }
        fprintf(f, "1810518709%09d,%d\n", r, r % 3 == 0 ? r : 0);
        n++;
    }
    return fclose(f) == 0 ? n : -1;
}

/* A kB value of /proc/self/status ("VmRSS:", "VmHWM:"), -1 if absent. */
static long status_kb(const char *key)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, strlen(key)) == 0)
            v = strtol(line + strlen(key), NULL, 10);
    fclose(f);
    return v;
}

/* The child's side of peak_growth_kb (test_sheet --peak PATH read|count EXPECT): prints the
 * growth, or -1. */
static int peak_child(const char *path, const char *how, const char *expect)
{
    long before = status_kb("VmRSS:");
    int64_t n = -1;
    char err[256];
    if (strcmp(how, "read") == 0)
        n = iterate_count(path, NULL);
    else if (sheet_count_data_rows(path, NULL, &n, err, sizeof(err)) != QN_OK)
        n = -1;
    long peak = status_kb("VmHWM:");
    printf("%ld\n",
           n == strtoll(expect, NULL, 10) && before >= 0 && peak >= 0 ? peak - before : -1);
    return 0;
}

/* How much the peak RSS grows (kB) while path is read row by row (iterate) or counted, in a
 * new process: a fork would share this one's heap, whose free pages are resident already and
 * so hide growth. -1 if the child failed or read other than expect rows. */
static long peak_growth_kb(const char *path, int iterate, int64_t expect)
{
    char cmd[1024], out[64] = "";
    snprintf(cmd, sizeof(cmd), "/proc/%d/exe --peak '%s' %s %lld", (int)getpid(), path,
             iterate ? "read" : "count", (long long)expect);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char *got = fgets(out, sizeof(out), p);
    int rc = pclose(p);
    return got && rc == 0 ? strtol(out, NULL, 10) : -1;
}

/* Memory does not grow with the number of rows: reading (and counting) ten times more rows
 * raises the peak RSS by less than FLAT_KB. A reader that kept every row would need about
 * 20 bytes more per row, several MB here. Count == iteration on both sizes. */
#define MANY_ROWS 20000
#define FLAT_KB   1024
static void test_many_rows(void)
{
    static const char *const names[][2] = {{"many.xlsx", "many10.xlsx"},
                                           {"many.csv", "many10.csv"}};
    for (int k = 0; k < 2; k++) {
        const char *small = tpath(names[k][0]), *big = tpath(names[k][1]);
        int64_t n = k ? write_many_csv(small, MANY_ROWS) : write_many(small, MANY_ROWS);
        int64_t n10 = k ? write_many_csv(big, 10 * MANY_ROWS) : write_many(big, 10 * MANY_ROWS);
        CHECK(n > 0 && n10 > 9 * n);
        check_count_agrees(small, n);
        check_count_agrees(big, n10);
        for (int iterate = 1; iterate >= 0; iterate--) {
            long a = peak_growth_kb(small, iterate, n), b = peak_growth_kb(big, iterate, n10);
            printf("  %s %s: peak RSS +%ld kB for %lld rows, +%ld kB for %lld rows\n",
                   k ? "csv" : "xlsx", iterate ? "read" : "count", a, (long long)n, b,
                   (long long)n10);
            CHECK(a >= 0 && b >= 0);
            CHECK(b - a < FLAT_KB);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--peak") == 0)
        return peak_child(argv[2], argv[3], argv[4]);
    th_tmpdir(dir, sizeof(dir), "sheet-test");
    RUN(test_xlsxwriter_normal);
    RUN(test_xlsxwriter_constant_memory);
    RUN(test_first_sheet_and_numbers);
    RUN(test_inline_and_rich_text);
    RUN(test_value_rule);
    RUN(test_count_fallbacks);
    RUN(test_malformed_xml);
    RUN(test_missing_parts_and_not_zip);
    RUN(test_zip_bomb);
    RUN(test_integrity);
    RUN(test_crc32);
    RUN(test_limits);
    RUN(test_csv);
    RUN(test_many_rows);
    th_rmtree(dir);
    TEST_MAIN_END();
}
