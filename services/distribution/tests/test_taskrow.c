/* The rows of a task's sheet (taskrow.h): the user id rule, the header, and reading CSV and
 * .xlsx files (shared strings, inline strings, numbers) in chunks, with skips. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xlsxwriter.h>

#include "../taskrow.h"
#include "testhelp.h"

static char g_dir[] = "/tmp/test_taskrow.XXXXXX";

static const char *tmp_path(const char *name)
{
    static char p[256];
    snprintf(p, sizeof(p), "%s/%s", g_dir, name);
    return p;
}

static const char *write_file(const char *name, const char *text)
{
    const char *p = tmp_path(name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

static void test_user_id_rule(void)
{
    CHECK_EQ_INT(taskrow_user_id("1"), 1);
    CHECK_EQ_INT(taskrow_user_id(" 42\t"), 42);
    CHECK_EQ_INT(taskrow_user_id("1810518709471555585"), 1810518709471555585LL);
    CHECK_EQ_INT(taskrow_user_id("9223372036854775807"), INT64_MAX);
    CHECK_EQ_INT(taskrow_user_id("007"), 7);
    CHECK_EQ_INT(taskrow_user_id("9223372036854775808"), 0); /* past int64 */
    CHECK_EQ_INT(taskrow_user_id("99999999999999999999999"), 0);
    CHECK_EQ_INT(taskrow_user_id("0"), 0);
    CHECK_EQ_INT(taskrow_user_id("000"), 0);
    CHECK_EQ_INT(taskrow_user_id("-5"), 0);
    CHECK_EQ_INT(taskrow_user_id("+5"), 0);
    CHECK_EQ_INT(taskrow_user_id("1.5"), 0);
    CHECK_EQ_INT(taskrow_user_id("12.0"), 0);
    CHECK_EQ_INT(taskrow_user_id("1e5"), 0);
    CHECK_EQ_INT(taskrow_user_id("1.8105187094715556E+18"), 0); /* a lossy numeric cell */
    CHECK_EQ_INT(taskrow_user_id("abc"), 0);
    CHECK_EQ_INT(taskrow_user_id("12 34"), 0);
    CHECK_EQ_INT(taskrow_user_id(""), 0);
    CHECK_EQ_INT(taskrow_user_id("   "), 0);
    CHECK_EQ_INT(taskrow_user_id("１２"), 0); /* full-width digits are not ASCII digits */
}

static int is_header(int n, const char *const *cells, usersheet_cols *cols)
{
    sheet_row row = {.number = 1, .ncells = n, .cells = cells};
    return usersheet_is_header(&row, cols);
}

static void test_header(void)
{
    usersheet_cols c;
    CHECK(is_header(3, (const char *const[]){"用户ID", "手机号", "邮箱"}, &c));
    CHECK(c.phone == 1 && c.mail == 2);
    CHECK(is_header(3, (const char *const[]){"userId", "phone", "mail"}, &c));
    CHECK(is_header(1, (const char *const[]){" USERID "}, &c));
    CHECK(c.phone == 1 && c.mail == 2);
    CHECK(is_header(2, (const char *const[]){"用户id", "x"}, &c));
    CHECK(is_header(4, (const char *const[]){"UserId", "Mail", "note", "PHONE"}, &c));
    CHECK(c.phone == 3 && c.mail == 1);
    CHECK(!is_header(3, (const char *const[]){"1810518709471555585", "138", "a@b"}, &c));
    CHECK(c.phone == 1 && c.mail == 2);
    CHECK(!is_header(3, (const char *const[]){"id", "phone", "mail"}, &c));
    CHECK(!is_header(3, (const char *const[]){"", "phone", "mail"}, &c));
    CHECK(!is_header(0, NULL, &c));
}

/* Reads path whole in chunks of max rows after skipping skip; returns the rows in out. */
static size_t read_all(const char *path, int64_t skip, size_t max, taskrow_chunk *all)
{
    char err[256] = "";
    taskrow_reader *r = taskrow_open(path, NULL, err, sizeof(err));
    taskrow_chunk c = {0};
    size_t chunks = 0;
    CHECK(r != NULL);
    if (!r) {
        printf("  %s\n", err);
        return 0;
    }
    CHECK(taskrow_skip(r, skip) == QN_OK);
    all->n = 0;
    all->len = 0;
    for (;;) {
        CHECK(taskrow_read(r, &c, max) == QN_OK);
        if (c.n == 0)
            break;
        CHECK(c.n <= max);
        chunks++;
        /* keep copies: the chunk is reused */
        for (size_t i = 0; i < c.n; i++) {
            char line[1024];
            snprintf(line, sizeof(line), "%lld|%lld|%s|%s|%s", (long long)c.rows[i].row,
                     (long long)c.rows[i].user_id, taskrow_text(&c, c.rows[i].raw),
                     taskrow_text(&c, c.rows[i].phone), taskrow_text(&c, c.rows[i].mail));
            size_t l = strlen(line) + 1;
            if (all->len + l > all->acap) {
                all->acap = (all->acap + l) * 2;
                all->arena = realloc(all->arena, all->acap);
            }
            memcpy(all->arena + all->len, line, l);
            all->len += l;
            all->n++;
        }
    }
    taskrow_chunk_free(&c);
    taskrow_close(r);
    return chunks;
}

/* The i-th line kept by read_all. */
static const char *line_at(const taskrow_chunk *all, size_t i)
{
    const char *p = all->arena;
    while (i--)
        p += strlen(p) + 1;
    return p;
}

static void test_csv_with_header(void)
{
    const char *p = write_file("h.csv", "userId,phone,mail\r\n"
                                        "11,138,a@x\r\n"
                                        ",,\r\n" /* empty: not a row */
                                        "abc,139,\r\n"
                                        ",140,c@x\r\n" /* no user id: a row, invalid */
                                        "12,,d@x\r\n");
    taskrow_chunk all = {0};
    CHECK_EQ_INT(read_all(p, 0, 2, &all), 2);
    CHECK_EQ_INT(all.n, 4);
    CHECK_EQ_STR(line_at(&all, 0), "2|11|11|138|a@x");
    CHECK_EQ_STR(line_at(&all, 1), "4|0|abc|139|");
    CHECK_EQ_STR(line_at(&all, 2), "5|0||140|c@x");
    CHECK_EQ_STR(line_at(&all, 3), "6|12|12||d@x");
    /* a resume after the first two data rows */
    read_all(p, 2, 10, &all);
    CHECK_EQ_INT(all.n, 2);
    CHECK_EQ_STR(line_at(&all, 0), "5|0||140|c@x");
    /* skipping past the end */
    read_all(p, 99, 10, &all);
    CHECK_EQ_INT(all.n, 0);
    taskrow_chunk_free(&all);
}

static void test_csv_without_header(void)
{
    const char *p = write_file("n.csv", "21,1,m\n22\n");
    taskrow_chunk all = {0};
    read_all(p, 0, 10, &all);
    CHECK_EQ_INT(all.n, 2);
    CHECK_EQ_STR(line_at(&all, 0), "1|21|21|1|m");
    CHECK_EQ_STR(line_at(&all, 1), "2|22|22||");
    read_all(p, 1, 10, &all); /* the first data row is the sheet's first row */
    CHECK_EQ_INT(all.n, 1);
    CHECK_EQ_STR(line_at(&all, 0), "2|22|22||");
    read_all(write_file("e.csv", ""), 0, 10, &all);
    CHECK_EQ_INT(all.n, 0);
    taskrow_chunk_free(&all);
}

static void test_texts_bounded_and_utf8(void)
{
    char text[1200];
    memset(text, 'x', 300);
    /* 300 x, then a row whose user id has an invalid byte and a 3-byte character */
    snprintf(text + 300, sizeof(text) - 300,
             ",1,2\n\xff"
             "1\xe6\x89\x8b,p,m\n");
    const char *p = write_file("u.csv", text);
    taskrow_chunk all = {0};
    read_all(p, 0, 10, &all);
    CHECK_EQ_INT(all.n, 2);
    const char *l0 = line_at(&all, 0);
    CHECK(strncmp(l0, "1|0|", 4) == 0 && strlen(l0) == 4 + TASKROW_TEXT_MAX + 4);
    CHECK_EQ_STR(line_at(&all, 1), "2|0|?1\xe6\x89\x8b|p|m");
    taskrow_chunk_free(&all);
}

/* An .xlsx with the Chinese header, shared strings (normal mode) or inline strings (constant
 * memory), text and numeric user ids. */
static const char *write_xlsx(const char *name, int constant_memory)
{
    const char *p = tmp_path(name);
    lxw_workbook_options opt = {.constant_memory = constant_memory ? LXW_TRUE : LXW_FALSE};
    lxw_workbook *wb = workbook_new_opt(p, &opt);
    lxw_worksheet *ws = workbook_add_worksheet(wb, NULL);
    worksheet_write_string(ws, 0, 0, "用户ID", NULL);
    worksheet_write_string(ws, 0, 1, "手机号", NULL);
    worksheet_write_string(ws, 0, 2, "邮箱", NULL);
    worksheet_write_string(ws, 1, 0, "1810518709471555586", NULL);
    worksheet_write_string(ws, 1, 1, "13800000001", NULL);
    worksheet_write_number(ws, 2, 0, 12345, NULL);  /* a whole number: valid */
    worksheet_write_number(ws, 3, 0, 12.5, NULL);   /* a fraction */
    worksheet_write_number(ws, 4, 0, -3, NULL);     /* negative */
    worksheet_write_number(ws, 5, 0, 1.8e18, NULL); /* exponent form in the file */
    worksheet_write_string(ws, 7, 0, "用户", NULL); /* row 7 is empty: skipped */
    worksheet_write_string(ws, 7, 2, "u@x", NULL);
    CHECK(workbook_close(wb) == LXW_NO_ERROR);
    return p;
}

static void test_xlsx(void)
{
    for (int cm = 0; cm < 2; cm++) {
        taskrow_chunk all = {0};
        read_all(write_xlsx(cm ? "i.xlsx" : "s.xlsx", cm), 0, 3, &all);
        CHECK_EQ_INT(all.n, 6);
        CHECK_EQ_STR(line_at(&all, 0), "2|1810518709471555586|1810518709471555586|13800000001|");
        CHECK_EQ_STR(line_at(&all, 1), "3|12345|12345||");
        CHECK_EQ_STR(line_at(&all, 2), "4|0|12.5||");
        CHECK_EQ_STR(line_at(&all, 3), "5|0|-3||");
        CHECK(strncmp(line_at(&all, 4), "6|0|1.8", 7) == 0);
        CHECK_EQ_STR(line_at(&all, 5), "8|0|用户||u@x");
        taskrow_chunk_free(&all);
    }
}

static void test_not_a_sheet(void)
{
    char err[256] = "";
    const char *p = write_file("x.xlsx", "not a zip at all");
    taskrow_reader *r = taskrow_open(p, NULL, err, sizeof(err));
    CHECK(r == NULL);
    CHECK(strstr(err, "not an xlsx") != NULL);
    r = taskrow_open(tmp_path("missing.csv"), NULL, err, sizeof(err));
    CHECK(r == NULL && err[0]);
}

int main(void)
{
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_user_id_rule);
    RUN(test_header);
    RUN(test_csv_with_header);
    RUN(test_csv_without_header);
    RUN(test_texts_bounded_and_utf8);
    RUN(test_xlsx);
    RUN(test_not_a_sheet);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
    if (system(cmd) != 0)
        printf("  could not remove %s\n", g_dir);
    TEST_MAIN_END();
}
