/* The database half of claims (claimdb.h). */
#include "claimdb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "excode.h"
#include "log.h"
#include "pgparam.h"
#include "shard.h"

static void claimdb_arrays_free(pgparam_array *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pgparam_array_free(&a[i]);
}

void claimdb_route(claimdb_item *it)
{
    shard_route r;
    it->tpl_ds = shard_route_for("t_coupon_template", it->c.shop_number, &r) == QN_OK ? r.ds : 0;
    it->user_ds = ucoupon_ds(it->c.user_id);
}

int claimdb_change_ok(claimdb_state from, claimdb_state to)
{
    if ((unsigned)from >= CLAIMDB_STATES || (unsigned)to >= CLAIMDB_STATES)
        return 0;
    if (to == CLAIMDB_PENDING) /* forgotten: asked again (or not decided yet) */
        return 1;
    if (from == CLAIMDB_PENDING) /* decided */
        return 1;
    /* a coupon its transaction did not keep */
    return (from == CLAIMDB_NEW || from == CLAIMDB_DUP) && to == CLAIMDB_FAILED;
}

const char *claimdb_state_name(claimdb_state s)
{
    static const char *const names[CLAIMDB_STATES] = {
        "pending", "new", "dup", "refused_stock", "refused_slot", "failed", "void"};
    return (unsigned)s < CLAIMDB_STATES ? names[s] : "unknown";
}

void claimdb_set(claimdb_item *it, claimdb_state to)
{
    if (claimdb_change_ok(it->state, to)) {
        it->state = to;
        return;
    }
    log_errorf(NULL,
               ((log_field[]){LOG_S("from", claimdb_state_name(it->state)),
                              LOG_S("to", claimdb_state_name(to)),
                              LOG_S("request_id", it->c.request_id), LOG_END}),
               "claimdb: a claim's state cannot change so; kept");
}

int claimdb_succeeded(const claimdb_item *it)
{
    return it->state == CLAIMDB_NEW || it->state == CLAIMDB_DUP;
}

const char *claimdb_reason(const claimdb_item *it)
{
    return claimdb_state_reason(it->state);
}

const char *claimdb_state_reason(claimdb_state s)
{
    switch (s) {
    case CLAIMDB_REFUSED_STOCK:
        return "stock exhausted";
    case CLAIMDB_REFUSED_SLOT:
        return "the user already holds a coupon with this receive count";
    case CLAIMDB_FAILED:
        return "the coupon could not be written";
    case CLAIMDB_VOID:
        return "the claim was interrupted before it was written; nothing was taken";
    default:
        return "";
    }
}

/* Marks idx[o - 1] for each ordinal in column 0 of r. */
static void claimdb_mark(const PGresult *r, size_t *idx, size_t m, char *hit)
{
    for (int i = 0; i < PQntuples(r); i++) {
        long o = strtol(PQgetvalue(r, i, 0), NULL, 10);
        if (o >= 1 && (size_t)o <= m)
            hit[o - 1] = 1;
    }
    (void)idx;
}

static qn_status claimdb_stock_update(pgpool_conn *c, const char *table, int64_t shop,
                                      int64_t tpl_id, int64_t delta_down, int64_t *affected)
{
    char sql[256];
    pgparam p = {0};
    snprintf(sql, sizeof(sql),
             delta_down > 0 ? "UPDATE %s SET stock = stock - $3, update_time = now() "
                              "WHERE shop_number = $1 AND id = $2 AND stock >= $3"
                            : "UPDATE %s SET stock = stock - $3, update_time = now() "
                              "WHERE shop_number = $1 AND id = $2",
             table);
    pgparam_i64(&p, shop);
    pgparam_i64(&p, tpl_id);
    pgparam_i64(&p, delta_down);
    return pgpool_exec_cmd(c, sql, p.n, p.v, affected);
}

/* Removes the ledger rows of items idx[0..m) (refused after step 1 in the same transaction);
 * returns the ordinals actually deleted in del (m entries). */
static qn_status claimdb_ledger_delete(pgpool_conn *c, claimdb_item *items, const size_t *idx,
                                       size_t m, char *del)
{
    pgparam_array a[2] = {{0}};
    pgparam p = {0};
    qn_status st = QN_ENOMEM;
    for (size_t i = 0; i < m; i++) {
        pgparam_array_i64(&a[0], items[idx[i]].c.user_id);
        pgparam_array_str(&a[1], items[idx[i]].c.request_id);
    }
    if (pgparam_array_bind(&p, &a[0]) != QN_OK || pgparam_array_bind(&p, &a[1]) != QN_OK)
        goto done;
    PGresult *r = pgpool_exec(
        c,
        "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY "
        "AS x(u, r, o)), del AS (DELETE FROM t_claim_ledger l USING input "
        "WHERE l.user_id = input.u AND l.request_id = input.r AND l.void_resv_ms IS NULL "
        "RETURNING l.user_id, l.request_id) "
        "SELECT input.o FROM input JOIN del ON del.user_id = input.u AND del.request_id = input.r",
        p.n, p.v);
    st = QN_ERR;
    if (!r)
        goto done;
    memset(del, 0, m);
    claimdb_mark(r, NULL, m, del);
    PQclear(r);
    st = QN_OK;
done:
    claimdb_arrays_free(a, 2);
    return st;
}

/* The items idx[k] whose ledger row existed (isnew[k] == 0): a row that gave up another attempt
 * of the claim is taken over (isnew[k] = 1: this attempt takes the stock); a row that gave up
 * this very attempt makes it CLAIMDB_VOID. Rows of earlier successful attempts stay as they
 * are (the stock was taken once). Usually every row is new and this costs nothing. */
static qn_status claimdb_ledger_seen(pgpool_conn *c, claimdb_item *items, const size_t *idx,
                                     size_t m, char *isnew)
{
    pgparam_array a[3] = {{0}};
    pgparam p = {0};
    size_t *pos = calloc(m ? m : 1, sizeof(*pos)), nseen = 0;
    qn_status st = QN_ENOMEM;
    if (!pos)
        goto out;
    for (size_t k = 0; k < m; k++)
        if (!isnew[k]) {
            const ucoupon *u = &items[idx[k]].c;
            pos[nseen++] = k;
            pgparam_array_i64(&a[0], u->user_id);
            pgparam_array_str(&a[1], u->request_id);
            pgparam_array_i64(&a[2], u->receive_time_ms);
        }
    st = QN_OK;
    if (nseen == 0)
        goto out;
    st = QN_ENOMEM;
    for (int k = 0; k < 3; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    st = QN_ERR;
    PGresult *r = pgpool_exec(
        c,
        "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[]) "
        "WITH ORDINALITY AS x(u, r, ms, o)), rev AS (UPDATE t_claim_ledger l SET void_resv_ms = "
        "NULL, create_time = now() FROM input WHERE l.user_id = input.u AND l.request_id = "
        "input.r AND l.void_resv_ms IS NOT NULL AND l.void_resv_ms <> input.ms "
        "RETURNING l.user_id, l.request_id) "
        "SELECT input.o, 1 FROM input JOIN rev ON rev.user_id = input.u AND rev.request_id = "
        "input.r UNION ALL SELECT input.o, 2 FROM input JOIN t_claim_ledger l ON l.user_id = "
        "input.u AND l.request_id = input.r WHERE l.void_resv_ms = input.ms",
        p.n, p.v);
    if (!r)
        goto out;
    for (int i = 0; i < PQntuples(r); i++) {
        long o = strtol(PQgetvalue(r, i, 0), NULL, 10);
        if (o < 1 || (size_t)o > nseen)
            continue;
        size_t k = pos[o - 1];
        if (PQgetvalue(r, i, 1)[0] == '1')
            isnew[k] = 1;
        else
            claimdb_set(&items[idx[k]], CLAIMDB_VOID);
    }
    PQclear(r);
    st = QN_OK;
out:
    claimdb_arrays_free(a, 3);
    free(pos);
    return st;
}

/* fresh: the ledger rows are written by a plain INSERT (claimdb_take_stock_new). */
static qn_status claimdb_take(pgpool_conn *c, int ds, claimdb_item *items, size_t n, int fresh)
{
    qn_status st = QN_ENOMEM;
    pgparam_array a[3] = {{0}};
    pgparam p = {0};
    size_t m = 0, *idx = calloc(n ? n : 1, sizeof(*idx)), *grp = calloc(n ? n : 1, sizeof(*grp));
    char *isnew = calloc(n ? n : 1, 1), *done = calloc(n ? n : 1, 1), *del = calloc(n ? n : 1, 1);
    PGresult *r = NULL;
    if (!idx || !grp || !isnew || !done || !del)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (items[i].state == CLAIMDB_PENDING && items[i].tpl_ds == ds && !items[i].probe) {
            idx[m++] = i;
            pgparam_array_i64(&a[0], items[i].c.user_id);
            pgparam_array_str(&a[1], items[i].c.request_id);
            pgparam_array_i64(&a[2], items[i].c.template_id);
        }
    if (m == 0) {
        st = QN_OK;
        goto out;
    }
    for (int k = 0; k < 3; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    if (fresh) {
        /* All new or none written (QN_ECONFLICT): what the statement below would find when no
         * row existed, without its arbiter and join. */
        st = pgpool_exec_cmd(c,
                             "INSERT INTO t_claim_ledger (user_id, request_id, coupon_template_id) "
                             "SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[])",
                             p.n, p.v, NULL);
        if (st != QN_OK)
            goto out;
        memset(isnew, 1, m);
        goto stock;
    }
    st = QN_ERR;
    r = pgpool_exec(c,
                    "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[]) "
                    "WITH ORDINALITY AS x(u, r, t, o)), ins AS (INSERT INTO t_claim_ledger "
                    "(user_id, request_id, coupon_template_id) SELECT u, r, t FROM input "
                    "ON CONFLICT DO NOTHING RETURNING user_id, request_id) "
                    "SELECT input.o FROM input JOIN ins ON ins.user_id = input.u "
                    "AND ins.request_id = input.r",
                    p.n, p.v);
    if (!r)
        goto out;
    claimdb_mark(r, idx, m, isnew);
    PQclear(r);
    r = NULL;
    if (claimdb_ledger_seen(c, items, idx, m, isnew) != QN_OK)
        goto out;

stock:
    st = QN_ERR;
    /* One stock update per template, for its claims whose ledger row is new. */
    for (size_t i = 0; i < m; i++) {
        if (!isnew[i] || done[i])
            continue;
        const ucoupon *head = &items[idx[i]].c;
        size_t k = 0;
        for (size_t j = i; j < m; j++)
            if (isnew[j] && !done[j] && items[idx[j]].c.template_id == head->template_id) {
                grp[k++] = j;
                done[j] = 1;
            }
        shard_route route;
        if (shard_route_for("t_coupon_template", head->shop_number, &route) != QN_OK)
            goto out;
        int64_t affected = 0, granted = (int64_t)k;
        if (claimdb_stock_update(c, route.table, head->shop_number, head->template_id, (int64_t)k,
                                 &affected) != QN_OK)
            goto out;
        if (affected == 0) {
            /* Fewer left than claimed (or no such template): grant what is left. */
            char sql[200];
            pgparam q = {0};
            snprintf(sql, sizeof(sql),
                     "SELECT stock FROM %s WHERE shop_number = $1 AND id = $2 FOR UPDATE",
                     route.table);
            pgparam_i64(&q, head->shop_number);
            pgparam_i64(&q, head->template_id);
            r = pgpool_exec(c, sql, q.n, q.v);
            if (!r)
                goto out;
            granted = PQntuples(r) == 1 ? strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
            PQclear(r);
            r = NULL;
            if (granted > (int64_t)k)
                granted = (int64_t)k; /* changed under us: cannot, the row is locked */
            if (granted < 0)
                granted = 0;
            if (granted > 0 && claimdb_stock_update(c, route.table, head->shop_number,
                                                    head->template_id, granted, &affected) != QN_OK)
                goto out;
            size_t nref = k - (size_t)granted, *ref = grp + granted;
            size_t *ridx = calloc(nref ? nref : 1, sizeof(*ridx));
            if (!ridx)
                goto out;
            for (size_t x = 0; x < nref; x++)
                ridx[x] = idx[ref[x]];
            qn_status ds_st = claimdb_ledger_delete(c, items, ridx, nref, del);
            for (size_t x = 0; x < nref && ds_st == QN_OK; x++)
                claimdb_set(&items[ridx[x]], CLAIMDB_REFUSED_STOCK);
            free(ridx);
            if (ds_st != QN_OK)
                goto out;
            log_warnf(
                NULL,
                ((log_field[]){LOG_I("template", head->template_id), LOG_I("claimed", (int64_t)k),
                               LOG_I("granted", granted), LOG_END}),
                "claim: the database has less stock than Redis; refusing the rest");
        }
    }
    st = QN_OK;
out:
    if (r)
        PQclear(r);
    claimdb_arrays_free(a, 3);
    free(idx);
    free(grp);
    free(isnew);
    free(done);
    free(del);
    return st;
}

/* Items idx[0..m) whose coupon already exists, found by (user_id, request_id): CLAIMDB_DUP
 * with the stored row; the others are left as they are. */
static qn_status claimdb_lookup(pgpool_conn *c, claimdb_item *items, const size_t *idx, size_t m)
{
    ucoupon **rows = calloc(m ? m : 1, sizeof(*rows));
    char *found = calloc(m ? m : 1, 1);
    qn_status st = QN_ENOMEM;
    if (!rows || !found)
        goto out;
    for (size_t k = 0; k < m; k++)
        rows[k] = &items[idx[k]].c;
    if ((st = ucoupon_find_requests(c, rows, m, found)) != QN_OK)
        goto out;
    for (size_t k = 0; k < m; k++)
        if (found[k])
            claimdb_set(&items[idx[k]], CLAIMDB_DUP);
out:
    free(rows);
    free(found);
    return st;
}

qn_status claimdb_find_coupons(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    size_t m = 0, *idx = calloc(n ? n : 1, sizeof(*idx));
    qn_status st = QN_ENOMEM;
    if (!idx)
        return st;
    for (size_t i = 0; i < n; i++)
        if (items[i].user_ds == ds && items[i].state == CLAIMDB_PENDING && items[i].probe)
            idx[m++] = i;
    st = claimdb_lookup(c, items, idx, m);
    for (size_t k = 0; k < m && st == QN_OK; k++)
        if (items[idx[k]].state == CLAIMDB_PENDING)
            claimdb_set(&items[idx[k]], CLAIMDB_FAILED); /* no coupon: its stock goes back */
    free(idx);
    return st;
}

qn_status claimdb_take_stock(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    return claimdb_take(c, ds, items, n, 0);
}

qn_status claimdb_take_stock_new(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    return claimdb_take(c, ds, items, n, 1);
}

/* fresh: a plain INSERT (claimdb_insert_coupons_new). */
static qn_status claimdb_insert(pgpool_conn *c, int ds, claimdb_item *items, size_t n, int fresh)
{
    qn_status st = QN_ENOMEM;
    size_t m = 0, *idx = calloc(n ? n : 1, sizeof(*idx));
    char *hit = calloc(n ? n : 1, 1);
    const ucoupon **rows = calloc(n ? n : 1, sizeof(*rows));
    if (!idx || !hit || !rows)
        goto out;
    for (size_t i = 0; i < n; i++) {
        /* user_ds first: callers may run the two databases on two threads over one array,
         * each touching only its own items. */
        if (items[i].user_ds != ds || items[i].state != CLAIMDB_PENDING || items[i].probe)
            continue;
        rows[m] = &items[i].c;
        idx[m++] = i;
    }
    if ((st = ucoupon_insert_many(c, rows, m, fresh ? UCOUPON_ON_NONE : UCOUPON_ON_ANY, hit)) !=
        QN_OK)
        goto out;
    size_t nm = 0;
    for (size_t k = 0; k < m; k++) {
        if (hit[k])
            claimdb_set(&items[idx[k]], CLAIMDB_NEW);
        else
            idx[nm++] = idx[k];
    }
    /* Not inserted: our own row from an earlier attempt (same request), or another coupon's
     * slot. */
    if ((st = claimdb_lookup(c, items, idx, nm)) != QN_OK)
        goto out;
    for (size_t k = 0; k < nm; k++)
        if (items[idx[k]].state == CLAIMDB_PENDING)
            claimdb_set(&items[idx[k]], CLAIMDB_REFUSED_SLOT);
out:
    free(idx);
    free(hit);
    free(rows);
    return st;
}

qn_status claimdb_insert_coupons(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    return claimdb_insert(c, ds, items, n, 0);
}

qn_status claimdb_insert_coupons_new(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    return claimdb_insert(c, ds, items, n, 1);
}

qn_status claimdb_give_back(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    qn_status st = QN_ENOMEM;
    size_t m = 0, *idx = calloc(n ? n : 1, sizeof(*idx));
    char *del = calloc(n ? n : 1, 1), *done = calloc(n ? n : 1, 1);
    if (!idx || !del || !done)
        goto out;
    for (size_t i = 0; i < n; i++)
        if ((items[i].state == CLAIMDB_REFUSED_SLOT || items[i].state == CLAIMDB_FAILED) &&
            items[i].tpl_ds == ds && !items[i].returned)
            idx[m++] = i;
    st = QN_OK;
    if (m == 0)
        goto out;
    if ((st = claimdb_ledger_delete(c, items, idx, m, del)) != QN_OK)
        goto out;
    /* Stock back only for the ledger rows this call deleted (once per claim). */
    for (size_t i = 0; i < m; i++) {
        if (!del[i] || done[i])
            continue;
        const ucoupon *head = &items[idx[i]].c;
        int64_t k = 0;
        for (size_t j = i; j < m; j++)
            if (del[j] && !done[j] && items[idx[j]].c.template_id == head->template_id) {
                done[j] = 1;
                k++;
            }
        shard_route route;
        int64_t affected = 0;
        if (shard_route_for("t_coupon_template", head->shop_number, &route) != QN_OK ||
            claimdb_stock_update(c, route.table, head->shop_number, head->template_id, -k,
                                 &affected) != QN_OK) {
            st = QN_ERR;
            goto out;
        }
    }
    for (size_t i = 0; i < m; i++)
        items[idx[i]].returned = 1;
out:
    free(idx);
    free(del);
    free(done);
    return st;
}

qn_status claimdb_void(pgpool_conn *c, int ds, claimdb_item *items, size_t n)
{
    pgparam_array a[4] = {{0}};
    pgparam p = {0};
    size_t m = 0, *idx = calloc(n ? n : 1, sizeof(*idx));
    char *hit = calloc(n ? n : 1, 1);
    qn_status st = QN_ENOMEM;
    if (!idx || !hit)
        goto out;
    for (size_t i = 0; i < n; i++)
        if (items[i].state == CLAIMDB_PENDING && items[i].tpl_ds == ds) {
            const ucoupon *u = &items[i].c;
            idx[m++] = i;
            pgparam_array_i64(&a[0], u->user_id);
            pgparam_array_str(&a[1], u->request_id);
            pgparam_array_i64(&a[2], u->template_id);
            pgparam_array_i64(&a[3], u->receive_time_ms);
        }
    st = QN_OK;
    if (m == 0)
        goto out;
    st = QN_ENOMEM;
    for (int k = 0; k < 4; k++)
        if (pgparam_array_bind(&p, &a[k]) != QN_OK)
            goto out;
    /* A row without void_resv_ms took the stock: left alone. Otherwise (no row, or a row that
     * gave up another attempt) this attempt is given up. The conflict waits for a writer of the
     * same claim still in its transaction, so the two never both win. */
    st = QN_ERR;
    PGresult *r = pgpool_exec(
        c,
        "WITH input AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], "
        "$4::bigint[]) WITH ORDINALITY AS x(u, r, t, ms, o)), v AS (INSERT INTO t_claim_ledger "
        "AS l (user_id, request_id, coupon_template_id, void_resv_ms) SELECT DISTINCT ON (u, r) "
        "u, r, t, ms FROM input ON CONFLICT (user_id, request_id) DO UPDATE SET void_resv_ms = "
        "excluded.void_resv_ms WHERE l.void_resv_ms IS NOT NULL RETURNING l.user_id, "
        "l.request_id) SELECT input.o FROM input JOIN v ON v.user_id = input.u AND "
        "v.request_id = input.r",
        p.n, p.v);
    if (!r)
        goto out;
    claimdb_mark(r, NULL, m, hit);
    PQclear(r);
    for (size_t k = 0; k < m; k++)
        if (hit[k])
            claimdb_set(&items[idx[k]], CLAIMDB_VOID);
    st = QN_OK;
out:
    claimdb_arrays_free(a, 4);
    free(idx);
    free(hit);
    return st;
}

qn_status claimdb_save_failed(pgpool_conn *c, const claimdb_item *items, size_t n)
{
    pgparam_array users = {0}, requests = {0}, templates = {0}, reasons = {0}, attempts = {0};
    pgparam p = {0};
    qn_status st = QN_OK;
    for (size_t i = 0; i < n; i++) {
        if (items[i].state != CLAIMDB_REFUSED_STOCK && items[i].state != CLAIMDB_REFUSED_SLOT &&
            items[i].state != CLAIMDB_VOID)
            continue;
        pgparam_array_i64(&users, items[i].c.user_id);
        pgparam_array_str(&requests, items[i].c.request_id);
        pgparam_array_i64(&templates, items[i].c.template_id);
        pgparam_array_str(&reasons, claimdb_reason(&items[i]));
        pgparam_array_i64(&attempts, items[i].c.receive_time_ms);
    }
    if (users.n == 0)
        goto done;
    if ((st = pgparam_array_bind(&p, &users)) != QN_OK ||
        (st = pgparam_array_bind(&p, &requests)) != QN_OK ||
        (st = pgparam_array_bind(&p, &templates)) != QN_OK ||
        (st = pgparam_array_bind(&p, &reasons)) != QN_OK ||
        (st = pgparam_array_bind(&p, &attempts)) != QN_OK)
        goto done;
    st = pgpool_exec_cmd(
        c,
        "INSERT INTO t_claim_result (user_id, request_id, coupon_template_id, "
        "status, reason, resv_ms) SELECT DISTINCT ON (u, r) u, r, t, " CLAIMDB_RESULT_TEXT(
            FAILED) ", why, ms "
                    "FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], "
                    "$5::bigint[]) AS x(u, r, t, why, ms) ON CONFLICT (user_id, request_id) "
                    "DO UPDATE SET status = " CLAIMDB_RESULT_TEXT(
                        FAILED) ", reason = excluded.reason, resv_ms = "
                                "excluded.resv_ms, update_time = now()",
        p.n, p.v, NULL);
done:
    pgparam_array_free(&users);
    pgparam_array_free(&requests);
    pgparam_array_free(&templates);
    pgparam_array_free(&reasons);
    pgparam_array_free(&attempts);
    return st;
}

/* One statement on an exchange code's row, with $1 the code, $2 the user, $3 the coupon id;
 * *changed (may be NULL): 1 if it changed the row. */
static qn_status claimdb_code_update(pgpool_conn *c, const char *sql, const char *code,
                                     const ucoupon *u, int *changed)
{
    pgparam p = {0};
    int64_t rows = 0;
    pgparam_str(&p, code);
    pgparam_i64(&p, u->user_id);
    pgparam_i64(&p, u->id);
    if (pgpool_exec_cmd(c, sql, p.n, p.v, &rows) != QN_OK)
        return QN_ERR;
    if (changed)
        *changed = rows > 0;
    return QN_OK;
}

qn_status claimdb_mark_code(pgpool_conn *c, const char *code, const ucoupon *u, int *marked)
{
    return claimdb_code_update(
        c,
        "UPDATE t_exchange_code SET status = " EXCODE_STATUS_TEXT(
            REDEEMED) ", user_id = $2, user_coupon_id = $3, redeem_time = now() WHERE "
                      "code = $1 AND status = " EXCODE_STATUS_TEXT(USABLE),
        code, u, marked);
}

qn_status claimdb_free_code(pgpool_conn *c, const char *code, const ucoupon *u, int *freed)
{
    return claimdb_code_update(
        c,
        "UPDATE t_exchange_code SET status = " EXCODE_STATUS_TEXT(
            USABLE) ", user_id = NULL, user_coupon_id = NULL, redeem_time = NULL WHERE "
                    "code = $1 AND status = " EXCODE_STATUS_TEXT(
                        REDEEMED) " AND user_id = $2 AND user_coupon_id = $3",
        code, u, freed);
}
