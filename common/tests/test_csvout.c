/*
 * csvout: files read back with the sheet reader (commas, quotes, line breaks inside fields,
 * empty fields, UTF-8 behind the byte-order mark), a large file whose bytes leave while it is
 * written, and a failing sink.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "csvout.h"
#include "sheet.h"
#include "sheetout_help.h"
#include "testhelp.h"

static char dir[256];

static qn_status csv_open(const sheetout_writer *wr, file_sink *s, const char *const *header,
                          int ncols, void **w)
{
    (void)wr;
    csvout *c = NULL;
    qn_status st = csvout_open(to_file, s, header, ncols, &c);
    *w = c;
    return st;
}

static qn_status csv_row(void *w, const char *const *cells, unsigned numeric_mask)
{
    (void)numeric_mask; /* a .csv cell has no type */
    return csvout_row(w, cells);
}

static qn_status csv_close(void *w)
{
    return csvout_close(w);
}

static void csv_free(void *w)
{
    csvout_free(w);
}

static const sheetout_writer csv = {"csv", NULL, csv_open, csv_row, csv_close, csv_free};

static void test_fields_read_back(void)
{
    char path[300];
    static const char *const header[] = {"code", "n", "文本, \"x\""};
    /* clang-format off */
    static const char *const rows[] = {
        "ABC",         "1",          "plain",
        "a,b",         "\"quoted\"", "  spaces kept  ",
        "line\nbreak", "cr\r\nlf",   "say \"hi\", then go",
        NULL,          "7",          NULL,
        "用户未领取",  "-12.5",      "",
    };
    /* clang-format on */
    if (sheetout_write(&csv, dir, "fields", path, sizeof(path), header, 3, rows, 5, 0) != QN_OK)
        return;

    /* the exact bytes of a row that needs no quoting and of one that does */
    FILE *f = fopen(path, "rb");
    char raw[512] = "";
    size_t n = f ? fread(raw, 1, sizeof(raw) - 1, f) : 0;
    if (f)
        fclose(f);
    raw[n] = '\0';
    static const char start[] = "\xEF\xBB\xBF"
                                "code,n,\"文本, \"\"x\"\"\"\r\nABC,1,plain\r\n";
    CHECK(strncmp(raw, start, sizeof(start) - 1) == 0);
    CHECK(strstr(raw, "\r\n,7,\r\n") != NULL);

    char err[256] = "";
    sheet *sh = sheet_open(path, NULL, err, sizeof(err));
    CHECK(sh != NULL);
    if (!sh) {
        printf("  %s\n", err);
        return;
    }
    CHECK_EQ_INT(sheet_header_index(sh, "code"), 0); /* the mark is not part of the name */
    CHECK_EQ_INT(sheet_header_index(sh, "文本, \"x\""), 2);
    sheet_row r;
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 2), "plain");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "a,b");
    CHECK_EQ_STR(sheet_cell(&r, 1), "\"quoted\"");
    CHECK_EQ_STR(sheet_cell(&r, 2), "  spaces kept  ");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "line\nbreak");
    CHECK_EQ_STR(sheet_cell(&r, 1), "cr\r\nlf");
    CHECK_EQ_STR(sheet_cell(&r, 2), "say \"hi\", then go");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "");
    CHECK_EQ_STR(sheet_cell(&r, 1), "7");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "用户未领取");
    CHECK_EQ_STR(sheet_cell(&r, 1), "-12.5");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_ENOTFOUND);
    sheet_free(sh);
}

static void test_many_rows_streamed(void)
{
    sheetout_many_rows(&csv, dir, 3 + 13 + 300000 * 14); /* the mark, the header, the rows */
}

static void test_failing_sink(void)
{
    sheetout_failing_sink(&csv, dir, 50000, 1);
}

int main(void)
{
    th_tmpdir(dir, sizeof(dir), "csvout-test");
    RUN(test_fields_read_back);
    RUN(test_many_rows_streamed);
    RUN(test_failing_sink);
    th_rmtree(dir);
    TEST_MAIN_END();
}
