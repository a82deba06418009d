/*
 * The shop's statistics summary of merchant-admin: /coupon-template/stats/summary, every template
 * of the shop with its totals (stats.h's figures), sorted by any of them, paged.
 *
 * On the shop's template database first its templates (at most STATSUM_TEMPLATES_MAX, sorted in
 * memory: a figure is the sum of both databases, so no one database can sort them), then on
 * each database the sums of every template of the shop in one statement, added to theirs; after
 * the last, the page asked for.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>
#include <libpq-fe.h>

#include "statsum.h"
#include "jsonin.h"
#include "madmin.h"
#include "pgparam.h"
#include "stats.h"

#define STATSUM_TEMPLATES_MAX 10000 /* templates of a shop the summary sorts (more: 409) */

/* $1 the shop: a row per template with figures, its id then the sums (column 1 + SC_x). */
static const char statsum_sql[] =
    "SELECT coupon_template_id" STATS_SUMS " FROM ("
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat "
    "WHERE shop_number = $1 AND grain = 0 "
    "UNION ALL "
    "SELECT coupon_template_id" STATS_LIST " FROM t_template_stat_delta "
    "WHERE shop_number = $1) u "
    "GROUP BY coupon_template_id";

/* The module's context: the service alone. */
typedef struct statsum_ctx {
    madmin_ctx head;
} statsum_ctx;

typedef struct statsum_job {
    stats_walk w; /* first */
    int sort;     /* SF_x */
    int asc;
    madmin_page page;
    statsum_row *rows; /* the shop's templates, by id */
    size_t nrows;
} statsum_job;

static void statsum_clear(reqjob *rj)
{
    statsum_job *j = (statsum_job *)rj;
    for (size_t i = 0; i < j->nrows; i++)
        free(j->rows[i].name);
    free(j->rows);
}

/* The shop's templates, by id (at most STATSUM_TEMPLATES_MAX, else a 409 reply). */
static qn_status statsum_templates(pgpool_conn *conn, statsum_job *j)
{
    char sql[256];
    pgparam p = {0};
    qn_status st = QN_ENOMEM;
    snprintf(sql, sizeof(sql),
             "SELECT id, name, status, stock FROM %s WHERE shop_number = $1 AND del_flag = 0 "
             "ORDER BY id LIMIT $2",
             j->w.table);
    pgparam_i64(&p, j->w.job.shop);
    pgparam_i64(&p, STATSUM_TEMPLATES_MAX + 1);
    PGresult *r = pgpool_exec(conn, sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    size_t n = (size_t)PQntuples(r);
    if (n > STATSUM_TEMPLATES_MAX) {
        reqjob_fail(&j->w.job.rj, ERRCODE_STATE,
                    "the shop has more than %d templates, more than the summary sorts",
                    STATSUM_TEMPLATES_MAX);
        st = QN_OK;
        goto done;
    }
    if (!(j->rows = calloc(n ? n : 1, sizeof(*j->rows)))) /* never NULL: bsearch's base */
        goto done;
    for (size_t i = 0; i < n; i++) {
        statsum_row *row = &j->rows[j->nrows++];
        row->id = strtoll(PQgetvalue(r, (int)i, 0), NULL, 10);
        if (!(row->name = strdup(PQgetvalue(r, (int)i, 1))))
            goto done;
        row->status = atoi(PQgetvalue(r, (int)i, 2));
        row->stock = strtoll(PQgetvalue(r, (int)i, 3), NULL, 10);
    }
    st = QN_OK;
done:
    PQclear(r);
    return st;
}

static int statsum_row_by_id(const void *key, const void *elem)
{
    int64_t a = *(const int64_t *)key, b = ((const statsum_row *)elem)->id;
    return (a > b) - (a < b);
}

/* This database's sums of the shop's templates, added to theirs. QN_ERR: the database failed. */
static qn_status statsum_read(pgpool_conn *conn, statsum_job *j)
{
    pgparam p = {0};
    pgparam_i64(&p, j->w.job.shop);
    PGresult *r = pgpool_exec(conn, statsum_sql, p.n, p.v);
    if (!r)
        return QN_ERR;
    for (int i = 0; i < PQntuples(r); i++) {
        int64_t id = strtoll(PQgetvalue(r, i, 0), NULL, 10);
        statsum_row *row = bsearch(&id, j->rows, j->nrows, sizeof(*j->rows), statsum_row_by_id);
        if (!row)
            continue; /* a deleted template's */
        for (int c = 0; c < STATS_NCOLS; c++)
            row->v[c] += strtoll(PQgetvalue(r, i, 1 + c), NULL, 10);
    }
    PQclear(r);
    return QN_OK;
}

static int statsum_row_cmp(const void *a, const void *b)
{
    const statsum_row *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->id < y->id) - (x->id > y->id); /* ties: the newest first */
}

void statsum_sort_rows(statsum_row *rows, size_t n, int sort, int asc)
{
    int64_t f[STATS_NFIELDS];
    for (size_t i = 0; i < n; i++) {
        stats_values(rows[i].v, rows[i].stock, f);
        rows[i].key = asc ? f[sort] : -f[sort];
    }
    if (n > 0)
        qsort(rows, n, sizeof(*rows), statsum_row_cmp);
}

/* The page asked for, of every template sorted. NULL when out of memory. */
static cJSON *statsum_json(statsum_job *j)
{
    statsum_sort_rows(j->rows, j->nrows, j->sort, j->asc);
    cJSON *recs = cJSON_CreateArray();
    size_t total = j->nrows, from = (size_t)madmin_page_offset(&j->page);
    for (size_t i = from; recs && i < total && i < from + (size_t)j->page.size; i++) {
        const statsum_row *row = &j->rows[i];
        cJSON *o =
            stats_template_json(row->id, j->w.job.shop, row->name, row->status, row->v, row->stock);
        if (!o || !cJSON_AddItemToArray(recs, o)) {
            cJSON_Delete(o);
            cJSON_Delete(recs);
            return NULL;
        }
    }
    return madmin_page_json(recs, (int64_t)total, &j->page);
}

/* Pool worker: on the shop's template database first its templates; on each, their sums;
 * after the last, the answer. */
static qn_status statsum_work(pgpool_conn *conn, void *arg)
{
    statsum_job *j = arg;
    qn_status st = QN_OK;
    if (j->w.step == 0 &&
        ((st = statsum_templates(conn, j)) != QN_OK || reqjob_failed(&j->w.job.rj)))
        goto out;
    if ((st = statsum_read(conn, j)) != QN_OK || j->w.step + 1 < SERVICE_DS_COUNT)
        goto out;
    if (!(j->w.job.rj.data = statsum_json(j)))
        st = QN_ENOMEM;
out:
    return stats_work_end(conn, &j->w, st, "the summary of shop", j->w.job.shop);
}

qn_status statsum_sort_parse(const char *sort, const char *order, int *sort_out, int *asc,
                             jsonin_err *err)
{
    int by = SF_issuedTotal;
    if (sort && *sort) {
        by = -1;
        for (int i = 0; i < STATS_NFIELDS; i++)
            if (strcmp(sort, stats_fields[i].key) == 0)
                by = i;
        if (by < 0) {
            jsonin_errf(err, "sort",
                        "must name a figure of the records, e.g. issuedTotal, claim, used, "
                        "refunded, distinctUsers, discountAmount, stock (docs/api.md)");
            return QN_EINVAL;
        }
    }
    int up = 0;
    if (order && *order && strcmp(order, "desc") != 0) {
        if (strcmp(order, "asc") != 0) {
            jsonin_errf(err, "order", "must be desc or asc");
            return QN_EINVAL;
        }
        up = 1;
    }
    *sort_out = by;
    *asc = up;
    return QN_OK;
}

static void statsum_h_summary(http_req *req, void *arg)
{
    const statsum_ctx *ctx = arg;
    jsonin_err err = {{0}};
    statsum_job *j = stats_walk_new(&ctx->head, req, sizeof(*j), statsum_clear, statsum_work);
    if (!j)
        return;
    if (statsum_sort_parse(http_query(req, "sort"), http_query(req, "order"), &j->sort, &j->asc,
                           &err) != QN_OK ||
        madmin_page_parse(http_query(req, "current"), http_query(req, "size"), MADMIN_SIZE_REFUSE,
                          &j->page, &err) != QN_OK) {
        reqjob_reply_error(&j->w.job.rj, ERRCODE_INVALID, "%s", err.msg);
        return;
    }
    stats_walk_start(&j->w);
}

static qn_status statsum_start(service *s, void **state)
{
    return madmin_ctx_new(s, sizeof(statsum_ctx), state);
}

const service_module statsum_module = {
    .name = "statsum",
    .routes =
        (const service_route[]){
            {HTTP_GET, "/api/merchant-admin/coupon-template/stats/summary", statsum_h_summary,
             HTTP_NEED_SHOP},
            {0},
        },
    .start = statsum_start,
    .free = madmin_ctx_free,
};
