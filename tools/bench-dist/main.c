/*
 * quan-bench-dist: the baseline of bench/distribution.sh, the fastest plain way to put N
 * user coupons into the sharded tables: each row routed by the sharding rule, then COPY into
 * each t_user_coupon_N, one transaction per database, the two databases in parallel. It prints
 * the rate (rows/s). The users are those quan-sheet-gen writes (1810518709471555585 + row).
 *
 *   quan-bench-dist copy N TEMPLATE_ID SHOP_NUMBER       (QUAN_DS0_DSN, QUAN_DS1_DSN)
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "now.h"
#include "shard.h"

#define DIST_SHEET_USER0 1810518709471555585LL /* quan-sheet-gen's first user id minus one */
#define DIST_TABLES      32
#define DIST_FLUSH       (64 * 1024)

typedef struct copy_db {
    int ds;
    const char *dsn;
    long n;
    int64_t tpl, shop, id0;
    long rows;
    int ok;
} copy_db;

/* COPY buffer of one table: flushed to the server every DIST_FLUSH bytes. */
typedef struct copy_buf {
    char *s;
    size_t len;
} copy_buf;

static int copy_flush(PGconn *pg, copy_buf *b)
{
    int ok = b->len == 0 || PQputCopyData(pg, b->s, (int)b->len) == 1;
    b->len = 0;
    return ok;
}

/* The rows (sheet row numbers) of table t, in one COPY. */
static int copy_table(PGconn *pg, copy_db *d, int t, const long *rows, long nrows, copy_buf *b)
{
    char sql[256];
    snprintf(sql, sizeof(sql),
             "COPY t_user_coupon_%d (id, user_id, coupon_template_id, shop_number, receive_count, "
             "valid_start_time, valid_end_time, source, status, request_id) FROM STDIN",
             t);
    PGresult *r = PQexec(pg, sql);
    int ok = PQresultStatus(r) == PGRES_COPY_IN;
    PQclear(r);
    for (long k = 0; ok && k < nrows; k++) {
        long i = rows[k];
        int64_t user = DIST_SHEET_USER0 + i;
        if (b->len + 256 > DIST_FLUSH && !copy_flush(pg, b)) {
            ok = 0;
            break;
        }
        b->len += (size_t)snprintf(b->s + b->len, 256,
                                   "%" PRId64 "\t%" PRId64 "\t%" PRId64 "\t%" PRId64
                                   "\t1\t2026-01-01 00:00:00+00\t2027-01-01 00:00:00+00\t1\t0"
                                   "\tbench:%ld\n",
                                   d->id0 + i, user, d->tpl, d->shop, i);
        d->rows++;
    }
    ok = copy_flush(pg, b) && ok;
    ok = PQputCopyEnd(pg, ok ? NULL : "failed") == 1 && ok;
    r = PQgetResult(pg);
    ok = PQresultStatus(r) == PGRES_COMMAND_OK && ok;
    if (!ok)
        fprintf(stderr, "t_user_coupon_%d: %s", t, PQerrorMessage(pg));
    PQclear(r);
    while ((r = PQgetResult(pg)))
        PQclear(r);
    return ok;
}

static void *copy_main(void *arg)
{
    copy_db *d = arg;
    copy_buf b = {malloc(DIST_FLUSH), 0};
    long *rows = malloc(sizeof(long) * (size_t)(d->n > 0 ? d->n : 1));
    long start[DIST_TABLES + 1] = {0}, fill[DIST_TABLES] = {0};
    PGconn *pg = PQconnectdb(d->dsn);
    if (!b.s || !rows || PQstatus(pg) != CONNECTION_OK) {
        fprintf(stderr, "ds_%d: cannot connect\n", d->ds);
        goto done;
    }
    /* The server's own speed: the statistics triggers of t_user_coupon_N (the services' cost,
     * which the benchmarks measure) are not this baseline's. Needs a superuser, as the
     * benchmarks' own servers run; elsewhere the baseline keeps them (and says so). */
    PGresult *role = PQexec(pg, "SET session_replication_role = replica");
    if (PQresultStatus(role) != PGRES_COMMAND_OK)
        fprintf(stderr, "ds_%d: the COPY runs with the triggers (%s)", d->ds, PQerrorMessage(pg));
    PQclear(role);
    /* The rows of each table, in sheet order (a counting sort by table index). */
    for (long i = 1; i <= d->n; i++)
        start[shard_index(DIST_SHEET_USER0 + i, DIST_TABLES) + 1]++;
    for (int t = 0; t < DIST_TABLES; t++)
        start[t + 1] += start[t];
    for (long i = 1; i <= d->n; i++) {
        int t = shard_index(DIST_SHEET_USER0 + i, DIST_TABLES);
        rows[start[t] + fill[t]++] = i;
    }
    PQclear(PQexec(pg, "BEGIN"));
    d->ok = 1;
    for (int t = 0; d->ok && t < DIST_TABLES; t++)
        if (shard_db_of_index(t, DIST_TABLES) == d->ds)
            d->ok = copy_table(pg, d, t, rows + start[t], start[t + 1] - start[t], &b);
    PGresult *r = PQexec(pg, d->ok ? "COMMIT" : "ROLLBACK");
    d->ok = d->ok && PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
done:
    PQfinish(pg);
    free(rows);
    free(b.s);
    return NULL;
}

int main(int argc, char **argv)
{
    log_init("quan-bench-dist", LOGL_ERROR);
    if (argc != 5 || strcmp(argv[1], "copy") != 0) {
        fprintf(stderr, "usage: %s copy N TEMPLATE_ID SHOP_NUMBER\n", argv[0]);
        return 2;
    }
    long n = strtol(argv[2], NULL, 10);
    int64_t tpl = strtoll(argv[3], NULL, 10), shop = strtoll(argv[4], NULL, 10);
    /* ids far from the snowflake ids of the services, distinct per run */
    int64_t id0 = (int64_t)3 << 60 | (int64_t)(now_wall_ms() % 1000000) << 24;
    copy_db d[2] = {{.ds = 0, .dsn = getenv("QUAN_DS0_DSN")},
                    {.ds = 1, .dsn = getenv("QUAN_DS1_DSN")}};
    pthread_t th[2];
    double t0 = now_mono_s();
    for (int i = 0; i < 2; i++) {
        d[i].n = n;
        d[i].tpl = tpl;
        d[i].shop = shop;
        d[i].id0 = id0;
        if (!d[i].dsn || pthread_create(&th[i], NULL, copy_main, &d[i]) != 0)
            return 1;
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double dt = now_mono_s() - t0;
    if (!d[0].ok || !d[1].ok || d[0].rows + d[1].rows != n) {
        fprintf(stderr, "copy failed (%ld + %ld rows of %ld)\n", d[0].rows, d[1].rows, n);
        return 1;
    }
    printf("%.0f\n", (double)n / dt);
    return 0;
}
