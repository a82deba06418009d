/*
 * ucoupon against the suite's PostgreSQL (QUAN_DS0_DSN, QUAN_DS1_DSN): a coupon read back by
 * each reader of UCOUPON_COLUMNS (by id, by request id, a batch's requests) carries what was
 * written, its channel included, and a row issued before the channel was kept reads -1. Every
 * write is in one transaction rolled back: nothing is left for the suites that follow.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "pgparam.h"
#include "pgpool.h"
#include "testhelp.h"
#include "ucoupon.h"

#define SHOP 1810714735922956666LL /* a vector of test_shard.c */

/* Every field of u as text, to compare two rows and show the difference. */
static const char *row_text(const ucoupon *u, char *buf, size_t len)
{
    snprintf(buf, len,
             "id %" PRId64 " user %" PRId64 " template %" PRId64 " shop %" PRId64
             " received %" PRId64 " valid %" PRId64 "..%" PRId64 " used %" PRId64
             " count %d source %d status %d channel %d request %s",
             u->id, u->user_id, u->template_id, u->shop_number, u->receive_time_ms,
             u->valid_start_ms, u->valid_end_ms, u->use_time_ms, u->receive_count, u->source,
             u->status, u->channel, u->request_id);
    return buf;
}

static void check_same(const ucoupon *got, const ucoupon *want)
{
    char a[512], b[512];
    CHECK_EQ_STR(row_text(got, a, sizeof(a)), row_text(want, b, sizeof(b)));
}

/* Each channel written by ucoupon_insert / ucoupon_insert_many, and read back three ways. */
static void test_round_trip_channel(void)
{
    int64_t user = 920000000000000000LL + getpid(), tpl = 930000000000000000LL + getpid();
    int64_t now = 1767225600000LL; /* 2026-01-01T00:00:00Z */
    pgpool_opts o = {.dsn = th_env(ucoupon_ds(user) ? "QUAN_DS1_DSN" : "QUAN_DS0_DSN"),
                     .name = "ds"};
    pgpool_conn *c = pgpool_conn_open(&o);
    CHECK(c && pgpool_conn_ok(c));
    if (!c)
        return;
    CHECK(pgpool_begin(c) == QN_OK);
    ucoupon u[4], back;
    const ucoupon *batch[2] = {&u[2], &u[3]};
    char req[4][32], hit[2];
    for (int i = 0; i < 4; i++) {
        snprintf(req[i], sizeof(req[i]), "test-ucoupon/%d", i);
        /* channel i: UCOUPON_CH_CLAIM, _MQ, _TASK, _CODE */
        ucoupon_claimed(&u[i], tpl + i, user, tpl, SHOP, 2, i, i + 1, now, 48, req[i]);
    }
    CHECK(ucoupon_insert(c, &u[0]) == QN_OK);
    CHECK(ucoupon_insert(c, &u[1]) == QN_OK);
    CHECK(ucoupon_insert_many(c, batch, 2, UCOUPON_ON_ANY, hit) == QN_OK);
    CHECK(hit[0] && hit[1]);

    for (int i = 0; i < 4; i++) {
        CHECK(ucoupon_load(c, user, u[i].id, &back) == QN_OK);
        check_same(&back, &u[i]);
        CHECK(ucoupon_load_by_request(c, user, u[i].request_id, &back) == QN_OK);
        check_same(&back, &u[i]);
    }
    ucoupon found[2] = {u[1], u[3]};
    ucoupon *rows[2] = {&found[0], &found[1]};
    CHECK(ucoupon_find_requests(c, rows, 2, hit) == QN_OK);
    CHECK(hit[0] && hit[1]);
    check_same(&found[0], &u[1]);
    check_same(&found[1], &u[3]);

    /* Issued before the channel was kept (migration 0012 added the column, NULL in old rows). */
    char sql[160], table[64];
    pgparam p = {0};
    ucoupon_table(user, table);
    snprintf(sql, sizeof(sql), "UPDATE %s SET channel = NULL WHERE user_id = $1 AND id = $2",
             table);
    pgparam_i64(&p, user);
    pgparam_i64(&p, u[0].id);
    CHECK(pgpool_exec_cmd(c, sql, p.n, p.v, NULL) == QN_OK);
    CHECK(ucoupon_load(c, user, u[0].id, &back) == QN_OK);
    CHECK_EQ_INT(back.channel, -1);

    (void)pgpool_rollback(c);
    CHECK(ucoupon_load(c, user, u[0].id, &back) == QN_ENOTFOUND); /* nothing left */
    pgpool_conn_close(c);
}

int main(void)
{
    RUN(test_round_trip_channel);
    TEST_MAIN_END();
}
