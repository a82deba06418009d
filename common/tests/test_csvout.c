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
#include "testhelp.h"

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

static void test_fields_read_back(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/fields.csv", dir);
    file_sink s = {.f = fopen(path, "wb")};
    static const char *const header[] = {"code", "n", "文本, \"x\""};
    csvout *c = NULL;
    CHECK_EQ_INT(csvout_open(to_file, &s, header, 3, &c), QN_OK);
    if (!c)
        return;
    const char *rows[][3] = {
        {"ABC", "1", "plain"},
        {"a,b", "\"quoted\"", "  spaces kept  "},
        {"line\nbreak", "cr\r\nlf", "say \"hi\", then go"},
        {NULL, "7", NULL},
        {"用户未领取", "-12.5", ""},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        CHECK_EQ_INT(csvout_row(c, rows[i]), QN_OK);
    CHECK_EQ_INT(csvout_close(c), QN_OK);
    csvout_free(c);
    fclose(s.f);

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

/* 300,000 rows: the file leaves in pieces while rows are added, and reads back whole. */
static void test_many_rows_streamed(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/many.csv", dir);
    file_sink s = {.f = fopen(path, "wb")};
    static const char *const header[] = {"code", "status"};
    csvout *c = NULL;
    CHECK_EQ_INT(csvout_open(to_file, &s, header, 2, &c), QN_OK);
    if (!c)
        return;
    size_t calls_at_half = 0;
    for (int i = 0; i < 300000; i++) {
        char code[16];
        snprintf(code, sizeof(code), "C%09d", i);
        const char *row[] = {code, "1"};
        if (csvout_row(c, row) != QN_OK) {
            CHECK(0);
            break;
        }
        if (i == 150000)
            calls_at_half = s.calls;
    }
    CHECK_EQ_INT(csvout_close(c), QN_OK);
    csvout_free(c);
    fclose(s.f);
    printf("  %zu bytes, %zu sink calls (%zu by the middle)\n", s.total, s.calls, calls_at_half);
    CHECK(calls_at_half > 10);
    CHECK_EQ_INT(s.total, 3 + 13 + 300000 * 14);
    int64_t rows = 0;
    char err[256] = "";
    CHECK_EQ_INT(sheet_count_data_rows(path, NULL, &rows, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(rows, 300000);
}

static void test_failing_sink(void)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/fail.csv", dir);
    file_sink s = {.f = fopen(path, "wb"), .fail_after = 50000};
    static const char *const header[] = {"code"};
    csvout *c = NULL;
    qn_status st = csvout_open(to_file, &s, header, 1, &c);
    for (int i = 0; st == QN_OK && i < 100000; i++) {
        const char *row[] = {"ABCDEFGHJK"};
        st = csvout_row(c, row);
    }
    if (st == QN_OK)
        st = csvout_close(c);
    CHECK_EQ_INT(st, QN_ENOMEM); /* the sink's status */
    const char *row[] = {"more"};
    CHECK_EQ_INT(csvout_row(c, row), QN_ENOMEM); /* kept */
    csvout_free(c);
    fclose(s.f);
    CHECK_EQ_INT(csvout_open(to_file, &s, header, 0, &c), QN_EINVAL);
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
