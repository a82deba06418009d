/* The user sheet of a distribution task (usersheet.h). */
#include "usersheet.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static int usersheet_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* 1 when cell, without the ASCII blanks around it, is one of names (ASCII case-insensitive). */
static int usersheet_named(const char *cell, const char *const *names)
{
    size_t n = strlen(cell);
    while (n && usersheet_blank(*cell))
        cell++, n--;
    while (n && usersheet_blank(cell[n - 1]))
        n--;
    for (; *names; names++)
        if (strlen(*names) == n && strncasecmp(cell, *names, n) == 0)
            return 1;
    return 0;
}

static const char *const usersheet_user_names[] = {"用户ID", "userId", NULL};
static const char *const usersheet_phone_names[] = {"手机号", "phone", NULL};
static const char *const usersheet_mail_names[] = {"邮箱", "mail", NULL};

int usersheet_is_header(const sheet_row *row, usersheet_cols *cols)
{
    cols->phone = 1;
    cols->mail = 2;
    if (!usersheet_named(sheet_cell(row, 0), usersheet_user_names))
        return 0;
    for (int i = 1; i < row->ncells; i++) {
        if (usersheet_named(row->cells[i], usersheet_phone_names))
            cols->phone = i;
        else if (usersheet_named(row->cells[i], usersheet_mail_names))
            cols->mail = i;
    }
    return 1;
}

qn_status usersheet_count_rows(const char *path, const sheet_limits *lim, int64_t *rows, char *err,
                               size_t errlen)
{
    sheet_row first;
    usersheet_cols cols;
    qn_status st = sheet_count_data_rows(path, lim, rows, err, errlen);
    if (st != QN_OK)
        return st;
    /* The count skips the first non-empty row; it is data unless it is a header. Reading it
     * costs one row of the sheet. */
    sheet *s = sheet_open(path, lim, err, errlen);
    if (!s)
        return QN_EINVAL;
    st = sheet_header(s, &first);
    if (st == QN_OK && !usersheet_is_header(&first, &cols))
        (*rows)++;
    else if (st == QN_ENOTFOUND)
        st = QN_OK;
    else if (st != QN_OK)
        snprintf(err, errlen, "%s", sheet_error(s));
    sheet_free(s);
    return st;
}
