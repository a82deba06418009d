/* The template statistics' decisions without a database (stats.h, statsum.h): a series' grain
 * and range (defaults, each grain's widest range, the start moved to its bucket), the figures
 * made of the summed columns and written as text, the merge of both databases' points, and the
 * summary's sort (its parameters, the order, ties). */
#include <stdint.h>
#include <string.h>

#include "../stats.h"
#include "../statsum.h"
#include "testhelp.h"

#define NOW 1779940830500LL /* 2026-05-28 12:00:30.5 +08:00 */

static void test_series_range(void)
{
    static const struct {
        const char *grain, *from, *to;
        int first;
        const char *err; /* NULL: accepted */
        int grain_want;
        int64_t from_ms, to_ms;
    } v[] = {
        /* Absent: the last day, per minute (the export: per hour); from at its bucket's start
         * (12:00 of the day before). */
        {NULL, NULL, NULL, STATS_GRAIN_MINUTE, NULL, STATS_GRAIN_MINUTE, 1779854400000LL, NOW},
        {"", "", "", STATS_GRAIN_MINUTE, NULL, STATS_GRAIN_MINUTE, 1779854400000LL, NOW},
        {NULL, NULL, NULL, STATS_GRAIN_HOUR, NULL, STATS_GRAIN_HOUR, 1779854400000LL, NOW},
        {"day", NULL, NULL, STATS_GRAIN_MINUTE, NULL, STATS_GRAIN_DAY, 1779811200000LL, NOW},
        /* Grains. */
        {"minute", NULL, NULL, STATS_GRAIN_HOUR, "grain: must be hour or day", 0, 0, 0},
        {"week", NULL, NULL, STATS_GRAIN_MINUTE, "grain: must be minute, hour or day", 0, 0, 0},
        {"Hour", NULL, NULL, STATS_GRAIN_MINUTE, "grain: must be minute, hour or day", 0, 0, 0},
        /* from not after to. */
        {"hour", "2026-05-28 10:00:00", "2026-05-28 09:59:59", STATS_GRAIN_MINUTE,
         "from: must not be after to", 0, 0, 0},
        {"hour", "2026-05-28 10:00:00", "2026-05-28 10:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_HOUR, 1779933600000LL, 1779933600000LL},
        /* Each grain's widest range, and a second more. */
        {"minute", "2026-05-27 12:00:00", "2026-05-28 12:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_MINUTE, 1779854400000LL, 1779940800000LL},
        {"minute", "2026-05-27 12:00:00", "2026-05-28 12:00:01", STATS_GRAIN_MINUTE,
         "to: at most 24 hours after from for grain minute", 0, 0, 0},
        {"hour", "2026-04-27 12:00:00", "2026-05-28 12:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_HOUR, 1777262400000LL, 1779940800000LL},
        {"hour", "2026-04-27 12:00:00", "2026-05-28 12:00:01", STATS_GRAIN_MINUTE,
         "to: at most 31 days after from for grain hour", 0, 0, 0},
        {"day", "2025-05-27 12:00:00", "2026-05-28 12:00:00", STATS_GRAIN_HOUR, NULL,
         STATS_GRAIN_DAY, 1748275200000LL, 1779940800000LL},
        {"day", "2025-05-27 12:00:00", "2026-05-28 12:00:01", STATS_GRAIN_HOUR,
         "to: at most 366 days after from for grain day", 0, 0, 0},
        /* from at the start of its minute, hour, or day in the configured zone (+08:00). */
        {"minute", "2026-03-10 05:30:10", "2026-03-10 06:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_MINUTE, 1773091800000LL, 1773093600000LL},
        {"hour", "2026-03-10 05:30:10", "2026-03-10 06:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_HOUR, 1773090000000LL, 1773093600000LL},
        {"day", "2026-03-10 05:30:10", "2026-03-10 06:00:00", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_DAY, 1773072000000LL, 1773093600000LL},
        {"day", "2026-03-10T00:30:00Z", "2026-03-10T01:00:00Z", STATS_GRAIN_MINUTE, NULL,
         STATS_GRAIN_DAY, 1773072000000LL, 1773104400000LL},
        {"hour", NULL, "tomorrow", STATS_GRAIN_MINUTE,
         "to: must be a time \"yyyy-MM-dd HH:mm:ss\" (or RFC 3339 with an offset)", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        stats_data d = {0};
        jsonin_err err = {{0}};
        qn_status st =
            stats_series_range(v[i].grain, v[i].from, v[i].to, v[i].first, NOW, &d, &err);
        if ((st == QN_OK) != (v[i].err == NULL) || (st == QN_OK && d.from_ms != v[i].from_ms))
            printf("  case %zu: %s (from %lld)\n", i, st == QN_OK ? "accepted" : err.msg,
                   (long long)d.from_ms);
        if (v[i].err) {
            CHECK_EQ_INT(st, QN_EINVAL);
            CHECK_EQ_STR(err.msg, v[i].err);
        } else {
            CHECK_EQ_INT(st, QN_OK);
            CHECK_EQ_INT(d.grain, v[i].grain_want);
            CHECK_EQ_INT(d.from_ms, v[i].from_ms);
            CHECK_EQ_INT(d.to_ms, v[i].to_ms);
        }
    }
}

/* The figures of the summed columns: the issued total, the net discount, the stock. */
static void test_values(void)
{
    int64_t v[STATS_NCOLS] = {0}, f[STATS_NFIELDS];
    v[SC_issued_claim] = 1;
    v[SC_issued_mq] = 2;
    v[SC_issued_dist] = 3;
    v[SC_issued_code] = 4;
    v[SC_issued_other] = 5;
    v[SC_discount_cents] = 1000;
    v[SC_refund_discount_cents] = 1250;
    v[SC_st_used] = 6;
    stats_values(v, 77, f);
    CHECK_EQ_INT(f[SF_issuedTotal], 15);
    CHECK_EQ_INT(f[SF_claim], 1);
    CHECK_EQ_INT(f[SF_other], 5);
    CHECK_EQ_INT(f[SF_stock], 77);
    CHECK_EQ_INT(f[SF_nowUsed], 6);
    CHECK_EQ_INT(f[SF_netDiscountAmount], -250);
    CHECK_EQ_STR(stats_fields[SF_issuedTotal].key, "issuedTotal");
    CHECK_EQ_STR(stats_fields[SF_issuedTotal].group, "issued");
    CHECK_EQ_STR(stats_fields[SF_issuedTotal].name, "total");
    CHECK(stats_fields[SF_other].series == NULL);
    CHECK(stats_fields[SF_discountAmount].cents);
}

/* A figure as the export writes it: counts as they are, amounts in yuan with two decimals. */
static void test_value_text(void)
{
    static const struct {
        int cents;
        int64_t x;
        const char *text;
    } v[] = {
        {0, 0, "0"},      {0, 12, "12"},        {0, -12, "-12"},
        {1, 0, "0.00"},   {1, 5, "0.05"},       {1, 1205, "12.05"},
        {1, -5, "-0.05"}, {1, -1205, "-12.05"}, {1, INT64_MIN, "-92233720368547758.08"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char buf[32];
        stats_field f = {.key = "x", .cents = v[i].cents};
        stats_value_text(&f, v[i].x, buf, sizeof(buf));
        CHECK_EQ_STR(buf, v[i].text);
    }
}

/* Both databases' points of a bucket become one, in time order. */
static void test_series_merge(void)
{
    stats_point pts[4] = {{0}};
    stats_data d = {.pts = pts, .npts = 4};
    pts[0].ms = 2000, pts[0].v[SC_used] = 1;
    pts[1].ms = 1000, pts[1].v[SC_used] = 2;
    pts[2].ms = 3000, pts[2].v[SC_used] = 4;
    pts[3].ms = 2000, pts[3].v[SC_used] = 8, pts[3].v[SC_expired] = 1;
    stats_series_merge(&d);
    CHECK_EQ_INT(d.npts, 3);
    CHECK_EQ_INT(pts[0].ms, 1000);
    CHECK_EQ_INT(pts[1].ms, 2000);
    CHECK_EQ_INT(pts[1].v[SC_used], 9);
    CHECK_EQ_INT(pts[1].v[SC_expired], 1);
    CHECK_EQ_INT(pts[2].ms, 3000);
    CHECK_EQ_INT(pts[2].v[SC_used], 4);
    d.npts = 0;
    stats_series_merge(&d);
    CHECK_EQ_INT(d.npts, 0);
}

static void test_sort_parse(void)
{
    static const struct {
        const char *sort, *order, *err;
        int by, asc;
    } v[] = {
        {NULL, NULL, NULL, SF_issuedTotal, 0},
        {"", "", NULL, SF_issuedTotal, 0},
        {"stock", "asc", NULL, SF_stock, 1},
        {"netDiscountAmount", "desc", NULL, SF_netDiscountAmount, 0},
        {"nowRevoked", NULL, NULL, SF_nowRevoked, 0},
        {"total", NULL,
         "sort: must name a figure of the records, e.g. issuedTotal, claim, used, refunded, "
         "distinctUsers, discountAmount, stock (docs/api.md)",
         0, 0},
        {"Stock", NULL,
         "sort: must name a figure of the records, e.g. issuedTotal, claim, used, refunded, "
         "distinctUsers, discountAmount, stock (docs/api.md)",
         0, 0},
        {NULL, "up", "order: must be desc or asc", 0, 0},
        {NULL, "ASC", "order: must be desc or asc", 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int by = -7, asc = -7;
        jsonin_err err = {{0}};
        qn_status st = statsum_sort_parse(v[i].sort, v[i].order, &by, &asc, &err);
        if ((st == QN_OK) != (v[i].err == NULL))
            printf("  case %zu: %s\n", i, st == QN_OK ? "accepted" : err.msg);
        if (v[i].err) {
            CHECK_EQ_INT(st, QN_EINVAL);
            CHECK_EQ_STR(err.msg, v[i].err);
            CHECK_EQ_INT(by, -7);
        } else {
            CHECK_EQ_INT(st, QN_OK);
            CHECK_EQ_INT(by, v[i].by);
            CHECK_EQ_INT(asc, v[i].asc);
        }
    }
}

/* The summary's order: by the figure, either way; ties newest (highest id) first. */
static void test_sort_rows(void)
{
    static const struct {
        int sort, asc;
        int64_t ids[4];
    } v[] = {
        {SF_used, 0, {3, 2, 1, 4}},
        {SF_used, 1, {4, 2, 1, 3}},
        {SF_stock, 0, {1, 2, 4, 3}},
        {SF_stock, 1, {3, 4, 2, 1}},
        {SF_netDiscountAmount, 0, {4, 3, 2, 1}}, /* all 0 but 1's refund: -1 */
        {SF_issuedTotal, 1, {4, 3, 2, 1}},       /* all 0: newest first either way */
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        statsum_row rows[4] = {{0}};
        static const int64_t used[] = {5, 5, 9, 0}, stock[] = {40, 30, 10, 20};
        for (int r = 0; r < 4; r++) {
            rows[r].id = r + 1;
            rows[r].v[SC_used] = used[r];
            rows[r].stock = stock[r];
        }
        rows[0].v[SC_refund_discount_cents] = 1;
        statsum_sort_rows(rows, 4, v[i].sort, v[i].asc);
        int same = 1;
        for (int r = 0; r < 4; r++)
            same &= rows[r].id == v[i].ids[r];
        if (!same)
            printf("  case %zu: %lld %lld %lld %lld\n", i, (long long)rows[0].id,
                   (long long)rows[1].id, (long long)rows[2].id, (long long)rows[3].id);
        CHECK(same);
    }
    statsum_sort_rows(NULL, 0, SF_used, 0); /* a shop without templates */
}

int main(void)
{
    char zerr[128];
    if (jsonin_zone_init("+08:00", zerr, sizeof(zerr)) != QN_OK) {
        printf("zone: %s\n0 passed, 1 failed\n", zerr);
        return 1;
    }
    RUN(test_series_range);
    RUN(test_values);
    RUN(test_value_text);
    RUN(test_series_merge);
    RUN(test_sort_parse);
    RUN(test_sort_rows);
    TEST_MAIN_END();
}
