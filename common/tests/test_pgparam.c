/*
 * pgparam: parameters in order, NULLs, truncation; array literals in every form, and a round
 * trip of both through a real PostgreSQL (QUAN_DS0_DSN).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgparam.h"
#include "pgpool.h"
#include "testhelp.h"

static void test_fmt(void)
{
    char b[PGPARAM_NUM_LEN];
    static const int64_t v[] = {0, 7, 10, 99, -1, -10, 1000000007, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char want[32];
        size_t n = pgparam_fmt_i64(b, v[i]);
        snprintf(want, sizeof(want), "%lld", (long long)v[i]);
        CHECK_EQ_STR(b, want);
        CHECK_EQ_INT(n, strlen(want));
    }
}

static void test_params(void)
{
    pgparam p = {0};
    pgparam_i64(&p, 42);
    pgparam_str(&p, "x");
    pgparam_null(&p);
    pgparam_i64(&p, INT64_MIN);
    pgparam_i64(&p, INT64_MAX);
    pgparam_i64(&p, -1);
    CHECK_EQ_INT(p.n, 6);
    CHECK_EQ_STR(p.v[0], "42");
    CHECK_EQ_STR(p.v[1], "x");
    CHECK(p.v[2] == NULL);
    CHECK_EQ_STR(p.v[3], "-9223372036854775808");
    CHECK_EQ_STR(p.v[4], "9223372036854775807");
    CHECK_EQ_STR(p.v[5], "-1");

    /* the first two again, then others */
    pgparam_truncate(&p, 2);
    CHECK_EQ_INT(p.n, 2);
    pgparam_i64(&p, 7);
    CHECK_EQ_INT(p.n, 3);
    CHECK_EQ_STR(p.v[0], "42");
    CHECK_EQ_STR(p.v[2], "7");

    pgparam full = {0};
    for (int i = 0; i < PGPARAM_MAX; i++)
        pgparam_i64(&full, i);
    CHECK_EQ_INT(full.n, PGPARAM_MAX);
    CHECK_EQ_STR(full.v[PGPARAM_MAX - 1], "15");
}

static void test_array_literals(void)
{
    pgparam_array a = {0};
    CHECK_EQ_STR(pgparam_array_end(&a), "{}");
    CHECK_EQ_STR(pgparam_array_end(&a), "{}"); /* idempotent */
    pgparam_array_free(&a);

    pgparam_array_i64(&a, 1);
    CHECK_EQ_STR(pgparam_array_end(&a), "{1}");
    pgparam_array_i64(&a, -2); /* appending after end */
    pgparam_array_i64(&a, INT64_MAX);
    CHECK_EQ_STR(pgparam_array_end(&a), "{1,-2,9223372036854775807}");
    CHECK_EQ_INT(a.n, 3);
    pgparam_array_free(&a);
    CHECK(a.s == NULL && a.n == 0);

    pgparam_array_str(&a, "plain");
    pgparam_array_str(&a, "");
    pgparam_array_str(&a, NULL);
    pgparam_array_str(&a, "NULL");
    pgparam_array_str(&a, "a \"q\" \\ b");
    pgparam_array_str(&a, "{,}");
    pgparam_array_str(&a, "满100减10");
    CHECK_EQ_STR(pgparam_array_end(&a),
                 "{\"plain\",\"\",NULL,\"NULL\",\"a \\\"q\\\" \\\\ b\",\"{,}\",\"满100减10\"}");
    pgparam_array_free(&a);

    /* growth well past the first allocation */
    for (int i = 0; i < 10000; i++)
        pgparam_array_i64(&a, i);
    const char *lit = pgparam_array_end(&a);
    CHECK(lit && !strncmp(lit, "{0,1,2,", 7) && strstr(lit, ",9999}") &&
          lit[strlen(lit) - 1] == '}');
    pgparam_array_free(&a);

    /* out of memory is reported at the end, once; binding adds no parameter */
    pgparam p = {0};
    pgparam_array_i64(&a, 1);
    a.oom = true;
    pgparam_array_i64(&a, 2);
    CHECK(pgparam_array_end(&a) == NULL);
    CHECK_EQ_INT(pgparam_array_bind(&p, &a), QN_ENOMEM);
    CHECK_EQ_INT(p.n, 0);
    pgparam_array_free(&a);
    CHECK(!a.oom);

    pgparam_array_i64(&a, 5);
    CHECK_EQ_INT(pgparam_array_bind(&p, &a), QN_OK);
    CHECK_EQ_INT(p.n, 1);
    CHECK_EQ_STR(p.v[0], "{5}");
    pgparam_array_free(&a);
}

/* What PostgreSQL reads: every element back, in order, NULL as NULL. */
static void test_round_trip(void)
{
    static const char *const texts[] = {"plain", "",     "NULL",      "a \"q\" \\ b",
                                        "{,}",   " sp ", "满100减10", "\\\\\"\""};
    const size_t ntexts = sizeof(texts) / sizeof(texts[0]);
    pgpool_opts po = {.dsn = th_env("QUAN_DS0_DSN"), .name = "ds_0"};
    pgpool_conn *c = pgpool_conn_open(&po);
    pgparam_array t = {0}, n = {0}, e = {0};
    pgparam p = {0};
    PGresult *r = NULL;
    CHECK(c && pgpool_conn_ok(c));
    if (!c || !pgpool_conn_ok(c))
        goto done;

    for (size_t i = 0; i < ntexts; i++)
        pgparam_array_str(&t, texts[i]);
    pgparam_array_str(&t, NULL);
    pgparam_array_i64(&n, INT64_MIN);
    pgparam_array_i64(&n, 0);
    pgparam_array_i64(&n, INT64_MAX);

    CHECK_EQ_INT(pgparam_array_bind(&p, &t), QN_OK);
    CHECK_EQ_INT(pgparam_array_bind(&p, &n), QN_OK);
    CHECK_EQ_INT(pgparam_array_bind(&p, &e), QN_OK);
    pgparam_i64(&p, -5);
    pgparam_null(&p);
    r = pgpool_exec(c,
                    "SELECT x, x IS NULL, (SELECT array_agg(y ORDER BY o)::text FROM "
                    "unnest($2::bigint[]) WITH ORDINALITY AS u(y, o)), cardinality($3::int[]), "
                    "$4::bigint, $5::text IS NULL FROM unnest($1::text[]) WITH ORDINALITY "
                    "AS u(x, o) ORDER BY o",
                    p.n, p.v);
    CHECK(r != NULL);
    if (!r) {
        printf("  %s\n", pgpool_conn_error(c));
        goto done;
    }
    CHECK_EQ_INT(PQntuples(r), (int)ntexts + 1);
    for (int i = 0; i < PQntuples(r) && i < (int)ntexts; i++) {
        CHECK_EQ_STR(PQgetvalue(r, i, 0), texts[i]);
        CHECK_EQ_STR(PQgetvalue(r, i, 1), "f");
    }
    if (PQntuples(r) == (int)ntexts + 1) {
        CHECK(PQgetisnull(r, (int)ntexts, 0));
        CHECK_EQ_STR(PQgetvalue(r, (int)ntexts, 1), "t");
        CHECK_EQ_STR(PQgetvalue(r, 0, 2), "{-9223372036854775808,0,9223372036854775807}");
        CHECK_EQ_STR(PQgetvalue(r, 0, 3), "0");
        CHECK_EQ_STR(PQgetvalue(r, 0, 4), "-5");
        CHECK_EQ_STR(PQgetvalue(r, 0, 5), "t");
    }
done:
    PQclear(r);
    pgparam_array_free(&t);
    pgparam_array_free(&n);
    pgparam_array_free(&e);
    pgpool_conn_close(c);
}

int main(void)
{
    RUN(test_fmt);
    RUN(test_params);
    RUN(test_array_literals);
    RUN(test_round_trip);
    TEST_MAIN_END();
}
