/*
 * quan-archive: the coupon archive (services/engine/archive.h), for operators.
 *
 *   quan-archive run [--after-days N] [--batch N]   one whole pass now, as the engines'
 *                                                   archiver makes it, with its batch times
 *   quan-archive restore --coupon ID                an archived coupon and its history back
 *   quan-archive restore --user ID                  every archived coupon of a user back
 *
 * `run` takes QUAN_ARCHIVE_AFTER_DAYS (180), QUAN_ARCHIVE_BATCH (500) and
 * QUAN_ARCHIVE_STATEMENT_TIMEOUT_MS (1000) from the environment, as the engine does, unless a
 * flag says otherwise; it runs beside the engines' archivers safely (each row moves once). A
 * restored coupon is back in t_user_coupon_N as it was, with its history, its update_time now:
 * the archiver leaves it there for another retention period. Its statistics did not change
 * when it moved and do not change now.
 *
 * Reads QUAN_DS0_DSN and QUAN_DS1_DSN (or QUAN_..._FILE, config.h). Exit status 0: done; 1: the
 * coupon or user has nothing archived; 2: usage; 3: a database error, or a restore the hot table
 * refuses (a row in its way: nothing moved).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "archive.h"
#include "config.h"
#include "log.h"
#include "now.h"

static int ar_usage(void)
{
    fprintf(stderr, "usage: quan-archive run [--after-days N] [--batch N]\n"
                    "       quan-archive restore --coupon ID | --user ID\n");
    return 2;
}

/* A positive integer argument, or the environment's, or dflt; -1 when malformed. */
static int64_t ar_number(const char *arg, const char *env, int64_t dflt)
{
    const char *v = arg ? arg : getenv(env);
    char *end = NULL;
    if (!v || !*v)
        return dflt;
    long long n = strtoll(v, &end, 10);
    return *end || n < 0 ? -1 : (int64_t)n;
}

static int ar_run(pgpool_conn *pg[2], const archive_opts *o)
{
    pgparam_array keep = {0};
    archive_cursor cur = {0};
    archive_totals t = {0};
    const char *lit;
    int done = 0, rc = 3;
    double t0 = now_mono_s();

    if (archive_keep_list(pg, &keep) != QN_OK || !(lit = pgparam_array_end(&keep)) ||
        archive_pass(pg, o, lit, &cur, 0, NULL, NULL, &t, &done) != QN_OK) {
        fprintf(stderr,
                "quan-archive: the pass failed at t_user_coupon_%d (moved so far: %" PRId64
                " coupons)\n",
                cur.idx, t.coupons);
        goto out;
    }
    printf("archived %" PRId64 " coupons, %" PRId64 " history rows; %zu templates claimable "
           "(kept); %" PRId64 " batches, batch max %.1f ms, mean %.1f ms; %.2f s\n",
           t.coupons, t.logs, keep.n, t.batches, t.max_batch_s * 1000,
           t.batches ? t.sum_batch_s * 1000 / (double)t.batches : 0.0, now_mono_s() - t0);
    rc = 0;
out:
    pgparam_array_free(&keep);
    return rc;
}

int main(int argc, char **argv)
{
    const char *after = NULL, *batch = NULL;
    int64_t coupon = 0, user = 0;
    int rc = 3, run = 0;
    pgpool_conn *pg[2] = {NULL, NULL};
    char *dsn[2] = {NULL, NULL}, err[512];

    log_init("quan-archive", LOGL_WARN);
    if (argc < 2)
        return ar_usage();
    run = !strcmp(argv[1], "run");
    if (!run && strcmp(argv[1], "restore") != 0)
        return ar_usage();
    for (int i = 2; i < argc; i++) {
        char *end = NULL;
        if (i + 1 >= argc)
            return ar_usage();
        if (run && !strcmp(argv[i], "--after-days"))
            after = argv[++i];
        else if (run && !strcmp(argv[i], "--batch"))
            batch = argv[++i];
        else if (!run && !strcmp(argv[i], "--coupon") &&
                 (coupon = strtoll(argv[++i], &end, 10)) > 0 && !*end)
            continue;
        else if (!run && !strcmp(argv[i], "--user") && (user = strtoll(argv[++i], &end, 10)) > 0 &&
                 !*end)
            continue;
        else
            return ar_usage();
    }
    archive_opts o = {
        .after_days = ar_number(after, "QUAN_ARCHIVE_AFTER_DAYS", 180),
        .batch = ar_number(batch, "QUAN_ARCHIVE_BATCH", 500),
        .statement_ms = ar_number(NULL, "QUAN_ARCHIVE_STATEMENT_TIMEOUT_MS", 1000),
    };
    if (run ? o.after_days < 1 || o.batch < 1 || o.statement_ms < 10 : (coupon > 0) == (user > 0))
        return ar_usage();
    for (int ds = 0; ds < 2; ds++) {
        const char *name = ds ? "QUAN_DS1_DSN" : "QUAN_DS0_DSN";
        if (config_secret(name, &dsn[ds], err, sizeof(err)) != QN_OK) {
            fprintf(stderr, "quan-archive: %s\n", err);
            rc = 2;
            goto out;
        }
        pgpool_opts po = {
            .dsn = dsn[ds], .name = ds ? "ds_1" : "ds_0", .application_name = "quan-archive"};
        if (!dsn[ds] || !(pg[ds] = pgpool_conn_open(&po)) || pgpool_conn_ensure(pg[ds]) != QN_OK) {
            fprintf(stderr, "quan-archive: cannot reach ds_%d (%s)\n", ds, name);
            goto out;
        }
    }
    if (run) {
        rc = ar_run(pg, &o);
        goto out;
    }
    int64_t coupons = 0, logs = 0;
    qn_status st = coupon ? archive_restore_coupon(pg, coupon, &coupons, &logs)
                          : archive_restore_user(pg, user, &coupons, &logs);
    if (st == QN_ENOTFOUND) {
        fprintf(stderr, "quan-archive: nothing archived for %s %" PRId64 "\n",
                coupon ? "coupon" : "user", coupon ? coupon : user);
        rc = 1;
    } else if (st != QN_OK) {
        fprintf(stderr, "quan-archive: restore failed%s; nothing moved\n",
                st == QN_ECONFLICT ? " (a row of the hot table is in the way)" : "");
    } else {
        printf("restored %" PRId64 " coupons, %" PRId64 " history rows\n", coupons, logs);
        rc = 0;
    }
out:
    for (int ds = 0; ds < 2; ds++) {
        pgpool_conn_close(pg[ds]);
        free(dsn[ds]);
    }
    return rc;
}
