/*
 * xlsxout: workbooks read back with the sheet reader (escaping, spaces, control characters,
 * numbers and text in a numeric column, empty cells, wide rows), a large sheet whose bytes
 * leave while it is written, and a failing sink.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sheet.h"
#include "sheetout_help.h"
#include "testhelp.h"
#include "xlsxout.h"

static char dir[256];

static qn_status xlsx_open(const sheetout_writer *wr, file_sink *s, const char *const *header,
                           int ncols, void **w)
{
    xlsxout *x = NULL;
    qn_status st = xlsxout_open(to_file, s, wr->sheet_name, header, ncols, &x);
    *w = x;
    return st;
}

static qn_status xlsx_row(void *w, const char *const *cells, unsigned numeric_mask)
{
    return xlsxout_row(w, cells, numeric_mask);
}

static qn_status xlsx_close(void *w)
{
    return xlsxout_close(w);
}

static void xlsx_free(void *w)
{
    xlsxout_free(w);
}

static const sheetout_writer xlsx = {"xlsx", "codes", xlsx_open, xlsx_row, xlsx_close, xlsx_free};

static void test_cells_read_back(void)
{
    char path[300];
    static const char *const header[] = {"code", "n", "文本 & <x>"};
    /* clang-format off */
    static const char *const rows[] = {
        "ABC",                 "1",     "plain",
        "<&>\"'",              "-12.5", "  leading and trailing  ",
        "1810518709471555585", "1E+18", "tab\there\nnewline",
        "bell\x07here",        "12abc", "cr\r\nlf",
        NULL,                  "7",     NULL,
        "用户未领取",          NULL,    "",
    };
    /* clang-format on */
    sheetout_writer named = xlsx;
    named.sheet_name = "a \"sheet\" & co";
    if (sheetout_write(&named, dir, "cells", path, sizeof(path), header, 3, rows, 6, 1u << 1) !=
        QN_OK)
        return;

    char err[256] = "";
    sheet *sh = sheet_open(path, NULL, err, sizeof(err));
    CHECK(sh != NULL);
    if (!sh) {
        printf("  %s\n", err);
        return;
    }
    CHECK_EQ_INT(sheet_header_index(sh, "文本 & <x>"), 2);
    sheet_row r;
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_INT(r.number, 2);
    CHECK_EQ_STR(sheet_cell(&r, 0), "ABC");
    CHECK_EQ_STR(sheet_cell(&r, 1), "1");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "<&>\"'");
    CHECK_EQ_STR(sheet_cell(&r, 1), "-12.5");
    CHECK_EQ_STR(sheet_cell(&r, 2), "  leading and trailing  ");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "1810518709471555585"); /* text: every digit */
    CHECK_EQ_STR(sheet_cell(&r, 1), "1E+18");
    CHECK_EQ_STR(sheet_cell(&r, 2), "tab\there\nnewline");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "bell\xEF\xBF\xBDhere");
    CHECK_EQ_STR(sheet_cell(&r, 1), "12abc"); /* not a number: written as text */
    CHECK_EQ_STR(sheet_cell(&r, 2), "cr\r\nlf");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_STR(sheet_cell(&r, 0), "");
    CHECK_EQ_STR(sheet_cell(&r, 1), "7");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_INT(r.number, 7);
    CHECK_EQ_STR(sheet_cell(&r, 0), "用户未领取");
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_ENOTFOUND);
    sheet_free(sh);
}

static void test_wide_row(void)
{
    char path[300];
    enum { N = 800 }; /* past ZZ: three-letter columns */
    static char names[N][16];
    const char *cells[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "c%d", i);
        cells[i] = names[i];
    }
    sheetout_writer named = xlsx;
    named.sheet_name = "wide";
    if (sheetout_write(&named, dir, "wide", path, sizeof(path), cells, N, cells, 1, 0) != QN_OK)
        return;
    char err[256];
    sheet *sh = sheet_open(path, NULL, err, sizeof(err));
    CHECK(sh != NULL);
    if (!sh)
        return;
    sheet_row r;
    CHECK_EQ_INT(sheet_next_row(sh, &r), QN_OK);
    CHECK_EQ_INT(r.ncells, N);
    CHECK_EQ_STR(sheet_cell(&r, 702), "c702"); /* column AAA */
    CHECK_EQ_STR(sheet_cell(&r, N - 1), "c799");
    sheet_free(sh);
}

static void test_many_rows_streamed(void)
{
    sheetout_many_rows(&xlsx, dir, 0);
}

static void test_failing_sink(void)
{
    sheetout_failing_sink(&xlsx, dir, 5000, 0);
}

int main(void)
{
    th_tmpdir(dir, sizeof(dir), "xlsxout-test");
    RUN(test_cells_read_back);
    RUN(test_wide_row);
    RUN(test_many_rows_streamed);
    RUN(test_failing_sink);
    th_rmtree(dir);
    TEST_MAIN_END();
}
