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
#include "testhelp.h"
#include "xlsxout.h"

static char dir[256];

typedef struct file_sink {
    FILE *f;
    size_t calls, total, fail_after;
} file_sink;

static qn_status to_file(void *arg, const void *data, size_t len)
{
    file_sink *s = arg;
    if (s->fail_after && s->total + len > s->fail_after)
        return QN_ENOMEM;
    s->calls++;
    s->total += len;
    return fwrite(data, 1, len, s->f) == len ? QN_OK : QN_ERR;
}

static void test_cells_read_back(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/cells.xlsx", dir);
    file_sink s = {.f = fopen(path, "wb")};
    static const char *const header[] = {"code", "n", "文本 & <x>"};
    xlsxout *x = NULL;
    CHECK_EQ_INT(xlsxout_open(to_file, &s, "a \"sheet\" & co", header, 3, &x), QN_OK);
    if (!x)
        return;
    const char *rows[][3] = {
        {"ABC", "1", "plain"},
        {"<&>\"'", "-12.5", "  leading and trailing  "},
        {"1810518709471555585", "1E+18", "tab\there\nnewline"},
        {"bell\x07here", "12abc", "cr\r\nlf"},
        {NULL, "7", NULL},
        {"用户未领取", NULL, ""},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        CHECK_EQ_INT(xlsxout_row(x, rows[i], 1u << 1), QN_OK);
    CHECK_EQ_INT(xlsxout_close(x), QN_OK);
    xlsxout_free(x);
    fclose(s.f);

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
    snprintf(path, sizeof(path), "%s/wide.xlsx", dir);
    file_sink s = {.f = fopen(path, "wb")};
    enum { N = 800 }; /* past ZZ: three-letter columns */
    static char names[N][16];
    const char *cells[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "c%d", i);
        cells[i] = names[i];
    }
    xlsxout *x = NULL;
    CHECK_EQ_INT(xlsxout_open(to_file, &s, "wide", cells, N, &x), QN_OK);
    CHECK_EQ_INT(xlsxout_row(x, cells, 0), QN_OK);
    CHECK_EQ_INT(xlsxout_close(x), QN_OK);
    xlsxout_free(x);
    fclose(s.f);
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

/* 300,000 rows: the file leaves in pieces while rows are added, and reads back whole. */
static void test_many_rows_streamed(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/many.xlsx", dir);
    file_sink s = {.f = fopen(path, "wb")};
    static const char *const header[] = {"code", "status"};
    xlsxout *x = NULL;
    CHECK_EQ_INT(xlsxout_open(to_file, &s, "codes", header, 2, &x), QN_OK);
    if (!x)
        return;
    size_t calls_at_half = 0;
    for (int i = 0; i < 300000; i++) {
        char code[16];
        snprintf(code, sizeof(code), "C%09d", i);
        const char *row[] = {code, "1"};
        if (xlsxout_row(x, row, 1u << 1) != QN_OK) {
            CHECK(0);
            break;
        }
        if (i == 150000)
            calls_at_half = s.calls;
    }
    CHECK_EQ_INT(xlsxout_close(x), QN_OK);
    xlsxout_free(x);
    fclose(s.f);
    printf("  %zu bytes, %zu sink calls (%zu by the middle)\n", s.total, s.calls, calls_at_half);
    CHECK(calls_at_half > 10);
    int64_t rows = 0;
    char err[256] = "";
    CHECK_EQ_INT(sheet_count_data_rows(path, NULL, &rows, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(rows, 300000);
}

static void test_failing_sink(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/fail.xlsx", dir);
    file_sink s = {.f = fopen(path, "wb"), .fail_after = 5000};
    static const char *const header[] = {"code"};
    xlsxout *x = NULL;
    qn_status st = xlsxout_open(to_file, &s, "codes", header, 1, &x);
    for (int i = 0; st == QN_OK && i < 100000; i++) {
        const char *row[] = {"ABCDEFGHJK"};
        st = xlsxout_row(x, row, 0);
    }
    if (st == QN_OK)
        st = xlsxout_close(x);
    CHECK_EQ_INT(st, QN_ENOMEM); /* the sink's status */
    xlsxout_free(x);
    fclose(s.f);
    CHECK_EQ_INT(xlsxout_open(to_file, &s, "x", header, 0, &x), QN_EINVAL);
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
