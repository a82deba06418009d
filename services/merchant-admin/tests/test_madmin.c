/* The pages of merchant-admin's lists (madmin.h): `current` and `size` as the three lists read
 * them (refused past the bounds; the template page's size capped instead), where a page starts,
 * how many pages a total fills, and the answer's fields. */
#include <stdint.h>

#include "../madmin.h"
#include "testhelp.h"

static void test_page_parse(void)
{
    static const struct {
        const char *current, *size;
        int over_max;
        int64_t want_current, want_size; /* when err is NULL */
        const char *err;
    } v[] = {
        /* Absent: the first page of 10 (forms send "" for unset fields). */
        {NULL, NULL, MADMIN_SIZE_REFUSE, 1, 10, NULL},
        {"", "", MADMIN_SIZE_REFUSE, 1, 10, NULL},
        {"3", "100", MADMIN_SIZE_REFUSE, 3, 100, NULL},
        {"1000000", "1", MADMIN_SIZE_REFUSE, 1000000, 1, NULL},
        /* current's bounds. */
        {"0", NULL, MADMIN_SIZE_REFUSE, 0, 0, "current: must be between 1 and 1000000"},
        {"1000001", NULL, MADMIN_SIZE_CAP, 0, 0, "current: must be between 1 and 1000000"},
        {"-1", NULL, MADMIN_SIZE_REFUSE, 0, 0, "current: must be between 1 and 1000000"},
        {"two", NULL, MADMIN_SIZE_REFUSE, 0, 0, "current: must be an integer"},
        /* size: over 100 refused (tasks, the summary) or capped (templates). */
        {NULL, "0", MADMIN_SIZE_REFUSE, 0, 0, "size: must be between 1 and 100"},
        {NULL, "101", MADMIN_SIZE_REFUSE, 0, 0, "size: must be between 1 and 100"},
        {NULL, "0", MADMIN_SIZE_CAP, 0, 0, "size: must be between 1 and 2147483647"},
        {NULL, "101", MADMIN_SIZE_CAP, 1, 100, NULL},
        {"2", "2147483647", MADMIN_SIZE_CAP, 2, 100, NULL},
        {NULL, "2147483648", MADMIN_SIZE_CAP, 0, 0, "size: must be between 1 and 2147483647"},
        {NULL, "99", MADMIN_SIZE_CAP, 1, 99, NULL},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        madmin_page pg = {-7, -7};
        jsonin_err err = {{0}};
        qn_status st = madmin_page_parse(v[i].current, v[i].size, v[i].over_max, &pg, &err);
        if ((st == QN_OK) != (v[i].err == NULL))
            printf("  case %zu: %s\n", i, err.msg);
        if (v[i].err) {
            CHECK_EQ_INT(st, QN_EINVAL);
            CHECK_EQ_STR(err.msg, v[i].err);
            CHECK_EQ_INT(pg.current, -7); /* untouched */
        } else {
            CHECK_EQ_INT(st, QN_OK);
            CHECK_EQ_INT(pg.current, v[i].want_current);
            CHECK_EQ_INT(pg.size, v[i].want_size);
        }
    }
}

static void test_page_offset_and_count(void)
{
    static const struct {
        int64_t current, size, offset;
    } o[] = {{1, 10, 0}, {2, 10, 10}, {3, 7, 14}, {1000000, 100, 99999900}};
    for (size_t i = 0; i < sizeof(o) / sizeof(o[0]); i++) {
        madmin_page pg = {o[i].current, o[i].size};
        CHECK_EQ_INT(madmin_page_offset(&pg), o[i].offset);
    }
    static const struct {
        int64_t total, size, pages;
    } c[] = {
        {0, 10, 0}, {1, 10, 1}, {9, 10, 1}, {10, 10, 1}, {11, 10, 2}, {1000, 100, 10}, {7, 1, 7},
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        if (madmin_page_count(c[i].total, c[i].size) != c[i].pages)
            printf("  case %zu: %lld rows of %lld\n", i, (long long)c[i].total,
                   (long long)c[i].size);
        CHECK_EQ_INT(madmin_page_count(c[i].total, c[i].size), c[i].pages);
    }
}

static double num(const cJSON *o, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static void test_page_json(void)
{
    cJSON *recs = cJSON_CreateArray();
    cJSON_AddItemToArray(recs, cJSON_CreateNumber(1));
    madmin_page pg = {2, 10};
    cJSON *d = madmin_page_json(recs, 11, &pg);
    CHECK(d != NULL);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(d, "records")) == 1);
    CHECK_EQ_INT(num(d, "total"), 11);
    CHECK_EQ_INT(num(d, "size"), 10);
    CHECK_EQ_INT(num(d, "current"), 2);
    CHECK_EQ_INT(num(d, "pages"), 2);
    cJSON_Delete(d);
    /* No rows: no pages. */
    d = madmin_page_json(cJSON_CreateArray(), 0, &pg);
    CHECK_EQ_INT(num(d, "pages"), 0);
    cJSON_Delete(d);
    CHECK(madmin_page_json(NULL, 0, &pg) == NULL);
}

int main(void)
{
    RUN(test_page_parse);
    RUN(test_page_offset_and_count);
    RUN(test_page_json);
    TEST_MAIN_END();
}
