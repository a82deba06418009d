/*
 * quan-sheet-gen: writes a distribution spreadsheet (header 用户ID, 手机号, 邮箱, then ROWS data
 * rows) for benchmarks and manual tests. Constant-memory mode by default, so a million rows
 * need no more memory than one row.
 *
 *   quan-sheet-gen OUT.xlsx ROWS [--normal] [--numeric-ids]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xlsxwriter.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUT.xlsx ROWS [--normal] [--numeric-ids]\n", argv[0]);
        return 2;
    }
    const char *out = argv[1];
    long long rows = strtoll(argv[2], NULL, 10);
    int normal = 0, numeric = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--normal") == 0)
            normal = 1;
        else if (strcmp(argv[i], "--numeric-ids") == 0)
            numeric = 1;
    }
    if (rows < 0 || rows > 1048575) {
        fprintf(stderr, "ROWS must be 0..1048575 (one header row + data rows)\n");
        return 2;
    }
    lxw_workbook_options opt = {.constant_memory = normal ? LXW_FALSE : LXW_TRUE};
    lxw_workbook *wb = workbook_new_opt(out, &opt);
    if (!wb) {
        fprintf(stderr, "cannot create %s\n", out);
        return 1;
    }
    lxw_worksheet *ws = workbook_add_worksheet(wb, NULL);
    worksheet_write_string(ws, 0, 0, "用户ID", NULL);
    worksheet_write_string(ws, 0, 1, "手机号", NULL);
    worksheet_write_string(ws, 0, 2, "邮箱", NULL);
    char id[32], phone[32], mail[64];
    for (long long r = 1; r <= rows; r++) {
        uint64_t uid = 1810518709471555585ULL + (uint64_t)r;
        snprintf(phone, sizeof phone, "1%010lld", 3000000000LL + r);
        snprintf(mail, sizeof mail, "user%lld@example.com", r);
        if (numeric) {
            worksheet_write_number(ws, (lxw_row_t)r, 0, (double)uid, NULL);
        } else {
            snprintf(id, sizeof id, "%" PRIu64, uid);
            worksheet_write_string(ws, (lxw_row_t)r, 0, id, NULL);
        }
        worksheet_write_string(ws, (lxw_row_t)r, 1, phone, NULL);
        worksheet_write_string(ws, (lxw_row_t)r, 2, mail, NULL);
    }
    lxw_error e = workbook_close(wb);
    if (e != LXW_NO_ERROR) {
        fprintf(stderr, "workbook_close: %s\n", lxw_strerror(e));
        return 1;
    }
    return 0;
}
