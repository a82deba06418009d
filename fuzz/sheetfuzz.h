/*
 * What the two spreadsheet fuzz targets share (fuzz_sheet.c, fuzz_xlsx.c): a scratch file the
 * input is written to (the readers take a path), and one file read every way the services
 * read it, with small limits:
 *   - sheet_open, the header (sheet_header, sheet_header_index, usersheet_is_header) and every
 *     row (sheet_next_row, sheet_cell), as distribution's task run reads a sheet;
 *   - sheet_count_data_rows and usersheet_count_rows, as merchant-admin counts it at task
 *     creation (the fast scanner of an .xlsx, the full reader otherwise).
 * Beyond "no crash, no sanitizer report": every row handed out is non-empty and within the
 * limits, and when both succeed the counts equal the rows read (a task's sendNum is the number
 * of rows it issues to).
 */
#ifndef QUAN_FUZZ_SHEETFUZZ_H
#define QUAN_FUZZ_SHEETFUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "sheet.h"
#include "usersheet.h"

/* Small enough that a zip bomb or a huge cell hits a limit within milliseconds. */
static const sheet_limits sheetfuzz_limits = {
    .max_sheet_bytes = 1u << 20,
    .max_sst_bytes = 1u << 20,
    .max_entries = 64,
    .max_strings = 10000,
    .max_cell_bytes = 1024,
    .max_row_bytes = 16384,
};

static char sheetfuzz_path[4096];

static void sheetfuzz_cleanup(void)
{
    if (sheetfuzz_path[0])
        unlink(sheetfuzz_path);
}

/* The scratch file, made once under $TMPDIR (integration-tests/fuzz.sh points it at its own
 * temporary directory, removed afterwards even when a crash skips the atexit). */
static const char *sheetfuzz_scratch(void)
{
    if (!sheetfuzz_path[0]) {
        const char *dir = getenv("TMPDIR");
        snprintf(sheetfuzz_path, sizeof(sheetfuzz_path), "%s/quan-fuzz-sheet-XXXXXX",
                 dir && *dir ? dir : "/tmp");
        int fd = mkstemp(sheetfuzz_path);
        if (fd < 0) {
            perror("mkstemp");
            abort();
        }
        close(fd);
        atexit(sheetfuzz_cleanup);
    }
    return sheetfuzz_path;
}

static void sheetfuzz_row_ok(const sheet_row *row)
{
    int nonempty = 0;
    size_t bytes = 0;
    PROPERTY(row->ncells >= 0 && row->ncells <= SHEET_MAX_COLS);
    for (int i = 0; i < row->ncells; i++) {
        const char *c = row->cells[i];
        PROPERTY(c != NULL);
        size_t n = strlen(c);
        PROPERTY(n <= sheetfuzz_limits.max_cell_bytes);
        bytes += n;
        nonempty |= n > 0;
        PROPERTY(sheet_cell(row, i) == c);
    }
    PROPERTY(nonempty);
    PROPERTY(bytes <= sheetfuzz_limits.max_row_bytes);
    PROPERTY(*sheet_cell(row, -1) == '\0' && *sheet_cell(row, row->ncells) == '\0');
}

static void sheetfuzz_read(const char *path)
{
    char err[256];
    int64_t rows = 0;
    int read_all = 0, first_is_data = 0;

    sheet *s = sheet_open(path, &sheetfuzz_limits, err, sizeof(err));
    if (s) {
        sheet_row row;
        qn_status st = sheet_header(s, &row);
        if (st == QN_OK) {
            usersheet_cols cols;
            sheetfuzz_row_ok(&row);
            first_is_data = !usersheet_is_header(&row, &cols);
            PROPERTY(cols.phone >= 0 && cols.phone < SHEET_MAX_COLS);
            PROPERTY(cols.mail >= 0 && cols.mail < SHEET_MAX_COLS);
            int idx = sheet_header_index(s, "userId");
            PROPERTY(idx >= -1 && idx < row.ncells);
        }
        if (st == QN_OK || st == QN_ENOTFOUND) {
            while ((st = sheet_next_row(s, &row)) == QN_OK) {
                sheetfuzz_row_ok(&row);
                rows++;
            }
        }
        if (st == QN_ENOTFOUND)
            read_all = 1;
        else
            PROPERTY(*sheet_error(s) != '\0');
        sheet_free(s);
    }

    int64_t counted = -1;
    if (sheet_count_data_rows(path, &sheetfuzz_limits, &counted, err, sizeof(err)) == QN_OK &&
        read_all) {
        if (counted != rows)
            fprintf(stderr, "sheet_count_data_rows: %lld, rows read: %lld\n", (long long)counted,
                    (long long)rows);
        PROPERTY(counted == rows);
    }
    if (usersheet_count_rows(path, &sheetfuzz_limits, &counted, err, sizeof(err)) == QN_OK &&
        read_all) {
        if (counted != rows + first_is_data)
            fprintf(stderr, "usersheet_count_rows: %lld, rows read: %lld + %d\n",
                    (long long)counted, (long long)rows, first_is_data);
        PROPERTY(counted == rows + first_is_data);
    }
}

#endif
