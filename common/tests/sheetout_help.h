/*
 * What the tests of the streamed sheet writers (test_csvout, test_xlsxout) share: a sink that
 * writes to a file (and can fail past a size), each writer behind the same four calls, a whole
 * file written in one call, and the two tests they run alike: many rows leaving while they are
 * written, and a failing sink.
 */
#ifndef QUAN_SHEETOUT_HELP_H
#define QUAN_SHEETOUT_HELP_H

#include <stdint.h>
#include <stdio.h>

#include "sheet.h"
#include "status.h"
#include "testhelp.h"

typedef struct file_sink {
    FILE *f;
    size_t calls, total, fail_after; /* fail_after: QN_ENOMEM past that many bytes (0: never) */
} file_sink;

static inline qn_status to_file(void *arg, const void *data, size_t len)
{
    file_sink *s = arg;
    if (s->fail_after && s->total + len > s->fail_after)
        return QN_ENOMEM;
    s->calls++;
    s->total += len;
    return fwrite(data, 1, len, s->f) == len ? QN_OK : QN_ERR;
}

/* A writer under test (csvout, xlsxout) through the same calls; numeric_mask as xlsxout_row's
 * (csvout has none). */
typedef struct sheetout_writer sheetout_writer;
struct sheetout_writer {
    const char *ext;        /* of the files written: "csv", "xlsx" */
    const char *sheet_name; /* xlsxout's */
    qn_status (*open)(const sheetout_writer *wr, file_sink *s, const char *const *header, int ncols,
                      void **w);
    qn_status (*row)(void *w, const char *const *cells, unsigned numeric_mask);
    qn_status (*close)(void *w);
    void (*free)(void *w);
};

/* The file dir/name.<ext>: header, then nrows rows of ncols cells (rows[r * ncols + c]); the
 * path written into path. QN_OK when every call said so (each is checked). */
static inline qn_status sheetout_write(const sheetout_writer *wr, const char *dir, const char *name,
                                       char *path, size_t len, const char *const *header, int ncols,
                                       const char *const *rows, size_t nrows, unsigned mask)
{
    snprintf(path, len, "%s/%s.%s", dir, name, wr->ext);
    file_sink s = {.f = fopen(path, "wb")};
    void *w = NULL;
    qn_status st = QN_ERR;
    CHECK(s.f != NULL);
    if (!s.f)
        return st;
    CHECK_EQ_INT(st = wr->open(wr, &s, header, ncols, &w), QN_OK);
    for (size_t i = 0; st == QN_OK && i < nrows; i++)
        CHECK_EQ_INT(st = wr->row(w, rows + i * (size_t)ncols, mask), QN_OK);
    if (st == QN_OK)
        CHECK_EQ_INT(st = wr->close(w), QN_OK);
    wr->free(w);
    fclose(s.f);
    return st;
}

/* 300,000 rows: the file leaves in pieces while rows are added, and reads back whole. Its size
 * must be total bytes (0: any). */
static inline void sheetout_many_rows(const sheetout_writer *wr, const char *dir, size_t total)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/many.%s", dir, wr->ext);
    file_sink s = {.f = fopen(path, "wb")};
    static const char *const header[] = {"code", "status"};
    void *w = NULL;
    CHECK(s.f != NULL);
    if (!s.f)
        return;
    CHECK_EQ_INT(wr->open(wr, &s, header, 2, &w), QN_OK);
    if (!w) {
        fclose(s.f);
        return;
    }
    size_t calls_at_half = 0;
    for (int i = 0; i < 300000; i++) {
        char code[16];
        snprintf(code, sizeof(code), "C%09d", i);
        const char *row[] = {code, "1"};
        if (wr->row(w, row, 1u << 1) != QN_OK) {
            CHECK(0);
            break;
        }
        if (i == 150000)
            calls_at_half = s.calls;
    }
    CHECK_EQ_INT(wr->close(w), QN_OK);
    wr->free(w);
    fclose(s.f);
    printf("  %zu bytes, %zu sink calls (%zu by the middle)\n", s.total, s.calls, calls_at_half);
    CHECK(calls_at_half > 10);
    if (total)
        CHECK_EQ_INT(s.total, total);
    int64_t rows = 0;
    char err[256] = "";
    CHECK_EQ_INT(sheet_count_data_rows(path, NULL, &rows, err, sizeof(err)), QN_OK);
    CHECK_EQ_INT(rows, 300000);
}

/* A sink failing past fail_after bytes: its status comes back (from a row or the close), and,
 * when kept, from any row after it; no columns is QN_EINVAL. */
static inline void sheetout_failing_sink(const sheetout_writer *wr, const char *dir,
                                         size_t fail_after, int kept)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/fail.%s", dir, wr->ext);
    file_sink s = {.f = fopen(path, "wb"), .fail_after = fail_after};
    static const char *const header[] = {"code"};
    void *w = NULL;
    CHECK(s.f != NULL);
    if (!s.f)
        return;
    qn_status st = wr->open(wr, &s, header, 1, &w);
    for (int i = 0; st == QN_OK && i < 100000; i++) {
        const char *row[] = {"ABCDEFGHJK"};
        st = wr->row(w, row, 0);
    }
    if (st == QN_OK)
        st = wr->close(w);
    CHECK_EQ_INT(st, QN_ENOMEM); /* the sink's status */
    if (kept && w) {
        const char *row[] = {"more"};
        CHECK_EQ_INT(wr->row(w, row, 0), QN_ENOMEM);
    }
    wr->free(w);
    fclose(s.f);
    w = NULL;
    CHECK_EQ_INT(wr->open(wr, &s, header, 0, &w), QN_EINVAL);
    wr->free(w);
}

#endif
