/* The streamed exports' `format` (export_format_parse): xlsx unless csv is asked for, nothing
 * else. */
#include <string.h>

#include "../export.h"
#include "testhelp.h"

static void test_format(void)
{
    static const struct {
        const char *in;
        int ok;
        export_format want;
    } v[] = {
        {NULL, 1, EXPORT_XLSX}, {"", 1, EXPORT_XLSX}, {"xlsx", 1, EXPORT_XLSX},
        {"csv", 1, EXPORT_CSV}, {"CSV", 0, 0},        {"xls", 0, 0},
        {"csv ", 0, 0},         {"xlsxx", 0, 0},      {"json", 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        export_format f = (export_format)-1;
        jsonin_err err = {{0}};
        qn_status st = export_format_parse(v[i].in, &f, &err);
        if ((st == QN_OK) != v[i].ok)
            printf("  case %zu: \"%s\"\n", i, v[i].in ? v[i].in : "(null)");
        if (v[i].ok) {
            CHECK_EQ_INT(st, QN_OK);
            CHECK_EQ_INT(f, v[i].want);
        } else {
            CHECK_EQ_INT(st, QN_EINVAL);
            CHECK_EQ_STR(err.msg, "format: must be xlsx or csv");
            CHECK_EQ_INT(f, (export_format)-1); /* untouched */
        }
    }
}

int main(void)
{
    RUN(test_format);
    TEST_MAIN_END();
}
