/*
 * The user sheet of a distribution task: the rule that tells its header row from data, shared
 * by merchant-admin (the row count a task shows as sendNum) and distribution (the rows it
 * issues to), so that both count the same rows.
 *
 * The first column holds the user ids. The first non-empty row is a header when its first cell
 * names that column ("用户ID" or "userId", ASCII case and blanks aside); the header may name the
 * phone ("手机号", "phone") and mail ("邮箱", "mail") columns, which are otherwise B and C. A
 * sheet whose first row is not a header has data from its first row on.
 */
#ifndef QUAN_USERSHEET_H
#define QUAN_USERSHEET_H

#include <stdint.h>

#include "sheet.h"
#include "status.h"

/* Where phone and mail are (column indexes). */
typedef struct usersheet_cols {
    int phone, mail;
} usersheet_cols;

/* 1 when row is a header; then cols gets where its phone and mail headers are (B and C when it
 * does not name them). 0 otherwise, and cols is B and C. */
int usersheet_is_header(const sheet_row *row, usersheet_cols *cols);

/* The data rows of the sheet at path: every non-empty row but a header. Errors as
 * sheet_count_data_rows. */
qn_status usersheet_count_rows(const char *path, const sheet_limits *lim, int64_t *rows, char *err,
                               size_t errlen) QN_MUSTCHECK;

#endif
