/*
 * quan-sheet-count: prints the number of data rows of a spreadsheet (what a distribution task
 * would send), through sheet_count_data_rows. `--iterate` counts through sheet_next_row instead.
 *
 *   quan-sheet-count FILE [--iterate]
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "sheet.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [--iterate]\n", argv[0]);
        return 2;
    }
    char err[256] = "";
    int64_t rows = 0;
    if (argc > 2 && strcmp(argv[2], "--iterate") == 0) {
        sheet *s = sheet_open(argv[1], NULL, err, sizeof(err));
        if (!s) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        sheet_row row;
        qn_status st;
        while ((st = sheet_next_row(s, &row)) == QN_OK)
            rows++;
        if (st != QN_ENOTFOUND) {
            fprintf(stderr, "%s\n", sheet_error(s));
            sheet_free(s);
            return 1;
        }
        sheet_free(s);
    } else if (sheet_count_data_rows(argv[1], NULL, &rows, err, sizeof(err)) != QN_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%" PRId64 "\n", rows);
    return 0;
}
