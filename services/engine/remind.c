/* Claim-window reminders: routes, bitmap CAS, timers, and delivery (see remind.h). */
#include "remind.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "events.h"
#include "guard.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "notify_send.h"
#include "now.h"
#include "outbox.h"
#include "pgparam.h"
#include "reqjob.h"
#include "shard.h"
#include "template.h"

METRICS_DEFINE(REMIND_METRICS)

#define REMIND_ACQUIRE_MS 2000
#define REMIND_CAS_TRIES  8
#define REMIND_KEY_LEN    160
#define REMIND_GUARD_TTL  (24 * 3600 * 1000LL) /* a delivered reminder is not sent again */

static const char *const remind_type_names[REMIND_TYPES] = {"app", "email"};
/* The reference's descriptions, which its list view returns in remindType. */
static const char *const remind_type_desc[REMIND_TYPES] = {"App通知", "邮件提醒"};

typedef struct remind_settings {
    const char *remind_webhook_url;
    const char *smtp_url;
    const char *smtp_from;
    int64_t remind_timeout_ms;
} remind_settings;

/* Read at start; the running module reads them through its context. */
static remind_settings remind_cfg;

/* The module's context: its routes' and its consumer's arg. */
typedef struct remind {
    service *svc;
    const service_config *common;
    const remind_settings *cfg;
    redis_sync *rs; /* the consumer thread's own client */
} remind;

/* One HTTP request in flight; its work sets the answer in rj (reqjob.h). */
typedef struct remind_op {
    reqjob rj; /* first: the request and the reply being prepared */
    remind *rm;
    int64_t user_id, shop, tpl_id, generation;
    int type, minutes;
} remind_op;

int remind_bit(int type, int minutes)
{
    if (type < 0 || type >= REMIND_TYPES || minutes < REMIND_SLOT_MINUTE ||
        minutes > REMIND_SLOTS * REMIND_SLOT_MINUTE || minutes % REMIND_SLOT_MINUTE != 0)
        return -1;
    return type * REMIND_SLOTS + minutes / REMIND_SLOT_MINUTE - 1;
}

static void remind_key(char buf[REMIND_KEY_LEN], int64_t user, int64_t tpl_id, int type,
                       int minutes, int64_t generation)
{
    snprintf(buf, REMIND_KEY_LEN, "remind:%" PRId64 ":%" PRId64 ":%d:%d:%" PRId64, user, tpl_id,
             type, minutes, generation);
}

/* The template, from whichever database holds its shop's shard. c0 is the caller's ds_0
 * connection; another database's connection is borrowed only for the load. */
static qn_status remind_tpl_load(const remind *rm, pgpool_conn *c0, int64_t shop, int64_t tpl_id,
                                 tpl *out)
{
    shard_route r;
    pgpool_conn *c;
    qn_status st;

    if (shard_route_for("t_coupon_template", shop, &r) != QN_OK)
        return QN_EINVAL;
    if (r.ds == 0)
        return tpl_db_load(c0, shop, tpl_id, out);
    c = pgpool_acquire(service_pg(rm->svc, r.ds), REMIND_ACQUIRE_MS);
    if (!c)
        return QN_EBUSY;
    st = tpl_db_load(c, shop, tpl_id, out);
    pgpool_release(c);
    return st;
}

/* Loads the template and refuses when absent or when its claim window has started. */
static qn_status remind_check_template(pgpool_conn *c, remind_op *op, tpl *t)
{
    qn_status st = remind_tpl_load(op->rm, c, op->shop, op->tpl_id, t);
    if (st == QN_ENOTFOUND) {
        reqjob_fail(&op->rj, ERRCODE_NOT_FOUND, "couponTemplateId: no such template in this shop");
        return st;
    }
    if (st != QN_OK) {
        reqjob_fail(&op->rj, ERRCODE_UNAVAILABLE, "template could not be read");
        return st;
    }
    if (now_wall_ms() >= t->valid_start_ms) {
        reqjob_fail(&op->rj, ERRCODE_WINDOW, "the claim window has already started");
        return QN_ECONFLICT;
    }
    return QN_OK;
}

/* ---------------------------------------------------------------- create */

/* One attempt of a change to the user's reminder bits; QN_EAGAIN when a concurrent change won
 * the compare-and-set (remind_run retries). */
typedef qn_status (*remind_txn_fn)(pgpool_conn *c, remind_op *op, const tpl *t, int bit);
static qn_status remind_create_txn(pgpool_conn *c, remind_op *op, const tpl *t, int bit);
static qn_status remind_cancel_txn(pgpool_conn *c, remind_op *op, const tpl *t, int bit);

/* The work of create and cancel: the template check (need_active: it must not have ended),
 * then txn up to REMIND_CAS_TRIES times; fail_msg is the 503 when the database fails. The
 * outcome is in op (always QN_OK). */
static qn_status remind_run(pgpool_conn *c, remind_op *op, int need_active, remind_txn_fn txn,
                            const char *fail_msg)
{
    tpl t = {0};
    int bit = remind_bit(op->type, op->minutes);
    qn_status st = remind_check_template(c, op, &t);

    if (st != QN_OK)
        goto done;
    if (need_active && t.status != TPL_STATUS_ACTIVE) {
        reqjob_fail(&op->rj, ERRCODE_ENDED, "the template has ended");
        goto done;
    }
    for (int i = 0; i < REMIND_CAS_TRIES; i++) {
        st = txn(c, op, &t, bit);
        if (st != QN_EAGAIN)
            break;
    }
    if (st != QN_OK && !reqjob_failed(&op->rj))
        reqjob_fail(&op->rj, st == QN_EAGAIN ? ERRCODE_BUSY : ERRCODE_UNAVAILABLE, "%s",
                    st == QN_EAGAIN ? "too many concurrent changes, try again" : fail_msg);
done:
    tpl_clear(&t);
    return QN_OK;
}

/* Opens the transaction of one attempt and reads the user's reminder bits of the template;
 * *found 0 (and *bits 0) when the user has no row yet. p (empty) gets the parameters the
 * attempt's statements start with: $1 user, $2 template. */
static qn_status remind_begin_bits(pgpool_conn *c, const remind_op *op, pgparam *p, int *found,
                                   int64_t *bits)
{
    pgparam_i64(p, op->user_id);
    pgparam_i64(p, op->tpl_id);
    if (pgpool_begin(c) != QN_OK)
        return QN_ERR;
    PGresult *res = pgpool_exec(c,
                                "SELECT information FROM t_coupon_template_remind WHERE "
                                "user_id = $1 AND coupon_template_id = $2",
                                p->n, p->v);
    if (!res)
        return QN_ERR;
    *found = PQntuples(res) > 0;
    *bits = *found ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : 0;
    PQclear(res);
    return QN_OK;
}

/* One attempt; QN_EAGAIN when a concurrent change won the CAS (the caller retries). */
static qn_status remind_create_txn(pgpool_conn *c, remind_op *op, const tpl *t, int bit)
{
    char key[REMIND_KEY_LEN], *data = NULL;
    pgparam p = {0};
    PGresult *res = NULL;
    int64_t n = 0, oldv = 0, newv;
    int found = 0;
    qn_status st = QN_ERR;

    if (remind_begin_bits(c, op, &p, &found, &oldv) != QN_OK)
        goto done;
    if (!found) {
        newv = (int64_t)(UINT64_C(1) << bit);
        pgparam_i64(&p, newv);
        pgparam_i64(&p, op->shop);
        pgparam_i64(&p, t->valid_start_ms);
        if (pgpool_exec_cmd(c,
                            "INSERT INTO t_coupon_template_remind (user_id, coupon_template_id, "
                            "information, shop_number, start_time) VALUES ($1, $2, $3, $4, "
                            "to_timestamp($5::double precision / 1000)) ON CONFLICT DO NOTHING",
                            p.n, p.v, &n) != QN_OK)
            goto done;
    } else {
        if (oldv & (int64_t)(UINT64_C(1) << bit)) {
            reqjob_fail(&op->rj, ERRCODE_DUPLICATE, "this reminder already exists");
            st = QN_ECONFLICT;
            goto done;
        }
        newv = oldv | (int64_t)(UINT64_C(1) << bit);
        pgparam_i64(&p, newv);
        pgparam_i64(&p, oldv);
        if (pgpool_exec_cmd(c,
                            "UPDATE t_coupon_template_remind SET information = $3, update_time = "
                            "now() WHERE user_id = $1 AND coupon_template_id = $2 AND "
                            "information = $4",
                            p.n, p.v, &n) != QN_OK)
            goto done;
    }
    if (n != 1) {
        st = QN_EAGAIN;
        goto done;
    }
    int64_t due = t->valid_start_ms - (int64_t)op->minutes * 60000;
    pgparam_truncate(&p, 2); /* user, template */
    pgparam_i64(&p, bit);
    pgparam_i64(&p, op->generation);
    pgparam_i64(&p, due);
    if (pgpool_exec_cmd(c,
                        "INSERT INTO t_coupon_template_remind_timer (user_id, coupon_template_id, "
                        "slot, generation, fire_at) VALUES ($1, $2, $3, $4, "
                        "to_timestamp($5::double precision / 1000)) ON CONFLICT (user_id, "
                        "coupon_template_id, slot) DO UPDATE SET generation = EXCLUDED.generation, "
                        "fire_at = EXCLUDED.fire_at, sent_at = NULL, create_time = now()",
                        p.n, p.v, NULL) != QN_OK)
        goto done;
    remind_key(key, op->user_id, op->tpl_id, op->type, op->minutes, op->generation);
    cJSON *d = cJSON_CreateObject();
    if (!d)
        goto done;
    cJSON_AddItemToObject(d, "userId", jsonin_id_to_json(op->user_id));
    cJSON_AddItemToObject(d, "couponTemplateId", jsonin_id_to_json(op->tpl_id));
    cJSON_AddItemToObject(d, "shopNumber", jsonin_id_to_json(op->shop));
    cJSON_AddNumberToObject(d, "type", op->type);
    cJSON_AddNumberToObject(d, "remindTime", op->minutes);
    cJSON_AddItemToObject(d, "generation", jsonin_id_to_json(op->generation));
    cJSON_AddItemToObject(d, "validStartTime", jsonin_time_to_json(t->valid_start_ms));
    cJSON_AddStringToObject(d, "name", t->name ? t->name : "");
    data = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    if (!data)
        goto done;
    outbox_event ev = {.routing_key = EVENT_REMIND_DUE,
                       .key = key,
                       .data_json = data,
                       .request_id = op->rj.request_id,
                       .traceparent = op->rj.traceparent,
                       .due_at_ms = due > 0 ? due : 1};
    if (outbox_add(c, &ev) != QN_OK || pgpool_commit(c) != QN_OK)
        goto done;
    st = QN_OK;
done:
    if (st != QN_OK)
        (void)pgpool_rollback(c);
    PQclear(res);
    free(data);
    return st;
}

static qn_status remind_create_work(pgpool_conn *c, void *arg)
{
    return remind_run(c, arg, 1, remind_create_txn, "reminder could not be saved");
}

/* ---------------------------------------------------------------- cancel */

static qn_status remind_cancel_txn(pgpool_conn *c, remind_op *op, const tpl *t, int bit)
{
    (void)t;
    char key[REMIND_KEY_LEN];
    pgparam p = {0};
    PGresult *res = NULL;
    int64_t n = 0, oldv = 0, newv;
    int found = 0;
    qn_status st = QN_ERR;

    if (remind_begin_bits(c, op, &p, &found, &oldv) != QN_OK)
        goto done;
    if (!(oldv & (int64_t)(UINT64_C(1) << bit))) {
        reqjob_fail(&op->rj, ERRCODE_NOT_FOUND, "no reminder of this type at this time");
        st = QN_ENOTFOUND;
        goto done;
    }
    newv = oldv & ~(int64_t)(UINT64_C(1) << bit);
    pgparam_i64(&p, oldv);
    pgparam_i64(&p, newv);
    if (pgpool_exec_cmd(c,
                        newv == 0 ? "DELETE FROM t_coupon_template_remind WHERE user_id = $1 AND "
                                    "coupon_template_id = $2 AND information = $3 AND $4::bigint "
                                    "= 0"
                                  : "UPDATE t_coupon_template_remind SET information = $4, "
                                    "update_time = now() WHERE user_id = $1 AND "
                                    "coupon_template_id = $2 AND information = $3",
                        p.n, p.v, &n) != QN_OK)
        goto done;
    if (n != 1) {
        st = QN_EAGAIN;
        goto done;
    }
    PQclear(res);
    pgparam_truncate(&p, 2); /* user, template */
    pgparam_i64(&p, bit);
    res = pgpool_exec(c,
                      "DELETE FROM t_coupon_template_remind_timer WHERE user_id = $1 AND "
                      "coupon_template_id = $2 AND slot = $3 RETURNING generation",
                      p.n, p.v);
    if (!res)
        goto done;
    /* Withdraw the timer if the relay has not sent it; if it has, the consumer finds the bit
     * clear and the timer row gone, and skips it. */
    if (PQntuples(res) == 1) {
        remind_key(key, op->user_id, op->tpl_id, op->type, op->minutes,
                   strtoll(PQgetvalue(res, 0, 0), NULL, 10));
        if (outbox_cancel(c, key, NULL) != QN_OK)
            goto done;
    }
    if (pgpool_commit(c) != QN_OK)
        goto done;
    st = QN_OK;
done:
    if (st != QN_OK)
        (void)pgpool_rollback(c);
    PQclear(res);
    return st;
}

static qn_status remind_cancel_work(pgpool_conn *c, void *arg)
{
    return remind_run(c, arg, 0, remind_cancel_txn, "reminder could not be cancelled");
}

/* ---------------------------------------------------------------- list */

static qn_status remind_list_work(pgpool_conn *c, void *arg)
{
    remind_op *op = arg;
    pgparam p = {0};
    PGresult *res = NULL;

    pgparam_i64(&p, op->user_id);
    res = pgpool_exec(c,
                      "SELECT coupon_template_id, shop_number, information FROM "
                      "t_coupon_template_remind WHERE user_id = $1 AND information <> 0 ORDER BY "
                      "start_time, coupon_template_id LIMIT 1000",
                      p.n, p.v);
    if (!res)
        goto fail;
    op->rj.data = cJSON_CreateArray();
    if (!op->rj.data)
        goto fail;
    for (int i = 0; i < PQntuples(res); i++) {
        tpl t = {0};
        int64_t tid = strtoll(PQgetvalue(res, i, 0), NULL, 10);
        int64_t shop = strtoll(PQgetvalue(res, i, 1), NULL, 10);
        uint64_t info = (uint64_t)strtoll(PQgetvalue(res, i, 2), NULL, 10);
        qn_status st = remind_tpl_load(op->rm, c, shop, tid, &t);
        if (st == QN_ENOTFOUND)
            continue; /* template gone: nothing to show */
        if (st != QN_OK)
            goto fail;
        cJSON *o = tpl_to_json(&t);
        cJSON *times = cJSON_CreateArray(), *types = cJSON_CreateArray();
        if (o && times && types) {
            /* The reference's order: earliest reminder first, app before e-mail. */
            for (int s = REMIND_SLOTS - 1; s >= 0; s--)
                for (int ty = 0; ty < REMIND_TYPES; ty++)
                    if (info & (UINT64_C(1) << (ty * REMIND_SLOTS + s))) {
                        cJSON_AddItemToArray(
                            times,
                            jsonin_time_to_json(t.valid_start_ms -
                                                (int64_t)(s + 1) * REMIND_SLOT_MINUTE * 60000));
                        cJSON_AddItemToArray(types, cJSON_CreateString(remind_type_desc[ty]));
                    }
            cJSON_AddItemToObject(o, "remindTime", times);
            cJSON_AddItemToObject(o, "remindType", types);
            cJSON_AddItemToArray(op->rj.data, o);
        } else {
            cJSON_Delete(o);
            cJSON_Delete(times);
            cJSON_Delete(types);
            tpl_clear(&t);
            goto fail;
        }
        tpl_clear(&t);
    }
    PQclear(res);
    return QN_OK;
fail:
    PQclear(res);
    cJSON_Delete(op->rj.data);
    op->rj.data = NULL;
    reqjob_fail(&op->rj, ERRCODE_UNAVAILABLE, "reminders could not be read");
    return QN_OK;
}

/* ---------------------------------------------------------------- HTTP glue */

static void remind_done(qn_status st, void *arg)
{
    remind_op *op = arg;

    reqjob_reply(&op->rj, st);
}

static void remind_submit(remind_op *op, pgpool_work_fn work)
{
    /* Reminders, timers and their outbox rows all live in ds_0. */
    reqjob_submit(&op->rj, service_pg(op->rm->svc, 0), work, remind_done);
}

/* Reads and validates the body shared by create and cancel; replies 400 itself. */
static remind_op *remind_parse(remind *rm, http_req *req)
{
    const cJSON *b = http_body_json(req);
    static const int types[] = {0, 1};
    jsonin_err err;
    remind_op *op = reqjob_new(req, sizeof(*op), NULL);

    if (!op)
        return NULL;
    op->rm = rm;
    op->user_id = req->user_id;
    if (jsonin_int64(b, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &op->tpl_id, &err) !=
            QN_OK ||
        jsonin_int64(b, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &op->shop, &err) != QN_OK ||
        jsonin_enum_int(b, "type", JSONIN_REQUIRED, 0, types, 2, &op->type, &err) != QN_OK ||
        jsonin_int(b, "remindTime", JSONIN_REQUIRED, 0, REMIND_SLOT_MINUTE,
                   REMIND_SLOTS * REMIND_SLOT_MINUTE, &op->minutes, &err) != QN_OK)
        goto bad;
    if (remind_bit(op->type, op->minutes) < 0) {
        jsonin_errf(&err, "remindTime", "must be a multiple of %d between %d and %d",
                    REMIND_SLOT_MINUTE, REMIND_SLOT_MINUTE, REMIND_SLOTS * REMIND_SLOT_MINUTE);
        goto bad;
    }
    return op;
bad:
    reqjob_reply_error(&op->rj, ERRCODE_INVALID, "%s", err.msg);
    return NULL;
}

static void remind_on_create(http_req *req, void *arg)
{
    remind_op *op = remind_parse(arg, req);
    if (!op)
        return;
    if (ids_next(service_ids(op->rm->svc), &op->generation) != QN_OK) {
        reqjob_reply_error(&op->rj, ERRCODE_UNAVAILABLE, "no id available");
        return;
    }
    remind_submit(op, remind_create_work);
}

static void remind_on_cancel(http_req *req, void *arg)
{
    remind_op *op = remind_parse(arg, req);
    if (op)
        remind_submit(op, remind_cancel_work);
}

static void remind_on_list(http_req *req, void *arg)
{
    remind_op *op = reqjob_new(req, sizeof(*op), NULL);
    if (!op)
        return;
    op->rm = arg;
    op->user_id = req->user_id;
    remind_submit(op, remind_list_work);
}

/* ---------------------------------------------------------------- delivery */

typedef struct remind_msg {
    int64_t user_id, tpl_id, shop, generation;
    int type, minutes;
    const char *name;       /* borrowed from the envelope */
    const char *start_text; /* validStartTime as sent, borrowed */
} remind_msg;

/* One delivery attempt through the common sender. QN_OK delivered; QN_EINVAL not configured
 * (dead-letter); else failed (retried, whatever the failure). */
static qn_status remind_deliver(const remind *rm, const remind_msg *m, const char *msg_key)
{
    const remind_settings *cfg = rm->cfg;
    char *json = NULL, *text = NULL, *subject = NULL, to[64], msg_id[KEYS_LEN + 8];
    char err[NOTIFY_SEND_ERR_LEN];
    cJSON *o = NULL;
    qn_status st = QN_ERR;
    const char *url = m->type == 0 ? cfg->remind_webhook_url : cfg->smtp_url;

    if (!url || !*url)
        return QN_EINVAL;
    if (m->type == 0) {
        o = cJSON_CreateObject();
        if (!o)
            goto done;
        cJSON_AddStringToObject(o, "event", "coupon.remind");
        cJSON_AddStringToObject(o, "key", msg_key);
        cJSON_AddItemToObject(o, "userId", jsonin_id_to_json(m->user_id));
        cJSON_AddItemToObject(o, "couponTemplateId", jsonin_id_to_json(m->tpl_id));
        cJSON_AddItemToObject(o, "shopNumber", jsonin_id_to_json(m->shop));
        cJSON_AddStringToObject(o, "name", m->name);
        cJSON_AddStringToObject(o, "validStartTime", m->start_text);
        cJSON_AddNumberToObject(o, "remindTime", m->minutes);
        cJSON_AddNumberToObject(o, "type", m->type);
        json = cJSON_PrintUnformatted(o);
        if (!json)
            goto done;
        st = notify_send_webhook(url, json, (long)cfg->remind_timeout_ms, err, sizeof(err));
    } else {
        snprintf(to, sizeof(to), "%" PRId64 "@users.invalid", m->user_id);
        snprintf(msg_id, sizeof(msg_id), "%s@quan", msg_key);
        if (asprintf(&subject, "Coupon reminder: %s", m->name) < 0)
            subject = NULL;
        if (asprintf(&text,
                     "The claim window of \"%s\" (template %" PRId64 ") opens at %s, in %d "
                     "minutes.\n",
                     m->name, m->tpl_id, m->start_text, m->minutes) < 0)
            text = NULL;
        if (!subject || !text)
            goto done;
        notify_send_msg mail = {.smtp_url = url,
                                .from = cfg->smtp_from,
                                .to = (const char *const[]){to, NULL},
                                .subject = subject,
                                .body = text,
                                .msg_id = msg_id,
                                .timeout_ms = (long)cfg->remind_timeout_ms};
        st = notify_send_mail(&mail, err, sizeof(err));
    }
    if (st != QN_OK) {
        log_warn(NULL, "reminder %s: %s", msg_key, err);
        st = QN_ERR; /* not the "not configured" of QN_EINVAL */
    }
done:
    cJSON_Delete(o);
    free(json);
    free(text);
    free(subject);
    return st;
}

/* Runs sql on ds_0 with the parameters naming m's timer row ($1 user, $2 template, $3 slot,
 * $4 generation); *rows (may be NULL) gets the rows it returned or changed. */
static qn_status remind_timer_sql(const remind *rm, const remind_msg *m, const char *sql,
                                  int64_t *rows)
{
    pgparam p = {0};
    pgpool_conn *c = pgpool_acquire(service_pg(rm->svc, 0), REMIND_ACQUIRE_MS);
    qn_status st;

    if (!c)
        return QN_EBUSY;
    pgparam_i64(&p, m->user_id);
    pgparam_i64(&p, m->tpl_id);
    pgparam_i64(&p, remind_bit(m->type, m->minutes));
    pgparam_i64(&p, m->generation);
    st = pgpool_exec_cmd(c, sql, p.n, p.v, rows);
    pgpool_release(c);
    return st;
}

/* 1 if the reminder is still wanted (bit set, same generation, not sent), 0 if not, -1 on a
 * database error. */
static int remind_still_due(const remind *rm, const remind_msg *m)
{
    int64_t n = 0;
    if (remind_timer_sql(rm, m,
                         "SELECT 1 FROM t_coupon_template_remind r JOIN "
                         "t_coupon_template_remind_timer t USING (user_id, coupon_template_id) "
                         "WHERE r.user_id = $1 AND r.coupon_template_id = $2 AND t.slot = $3 AND "
                         "t.generation = $4 AND t.sent_at IS NULL AND "
                         "(r.information >> $3::int) & 1 = 1",
                         &n) != QN_OK)
        return -1;
    return n > 0;
}

static qn_status remind_mark_sent(const remind *rm, const remind_msg *m)
{
    return remind_timer_sql(rm, m,
                            "UPDATE t_coupon_template_remind_timer SET sent_at = now() WHERE "
                            "user_id = $1 AND coupon_template_id = $2 AND slot = $3 AND "
                            "generation = $4",
                            NULL);
}

static mq_handler_result remind_on_message(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg)
{
    remind_msg m = {0};
    jsonin_err err;
    char gkey[KEYS_LEN];
    const cJSON *d = env->data;
    static const int types[] = {0, 1};
    mq_handler_result out = MQ_RETRY;
    const char *tname;
    remind *rm = arg;

    if (jsonin_int64(d, "userId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &m.user_id, &err) != QN_OK ||
        jsonin_int64(d, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &m.tpl_id, &err) !=
            QN_OK ||
        jsonin_int64(d, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &m.shop, &err) != QN_OK ||
        jsonin_int64(d, "generation", JSONIN_REQUIRED, 0, 1, INT64_MAX, &m.generation, &err) !=
            QN_OK ||
        jsonin_enum_int(d, "type", JSONIN_REQUIRED, 0, types, 2, &m.type, &err) != QN_OK ||
        jsonin_int(d, "remindTime", JSONIN_REQUIRED, 0, 5, 60, &m.minutes, &err) != QN_OK ||
        jsonin_string(d, "name", JSONIN_OPTIONAL, 0, 1024, &m.name, &err) != QN_OK ||
        jsonin_string(d, "validStartTime", JSONIN_OPTIONAL, 0, 64, &m.start_text, &err) != QN_OK ||
        remind_bit(m.type, m.minutes) < 0) {
        log_warn(NULL, "remind.due %s: malformed (%s)", env->key, err.msg);
        return MQ_DEAD;
    }
    if (!m.name)
        m.name = "";
    if (!m.start_text)
        m.start_text = "";
    tname = remind_type_names[m.type];

    if (redis_sync_open(rm->rs) != QN_OK)
        return MQ_RETRY;
    keys_remind_guard(gkey, env->key);
    switch (
        guard_begin(rm->rs, redis_client_scripts(service_redis(rm->svc)), gkey, REMIND_GUARD_TTL)) {
    case GUARD_RUN:
        break;
    case GUARD_DONE:
        return MQ_ACK;
    case GUARD_BUSY:
        return MQ_REQUEUE_LATER;
    default:
        return MQ_RETRY;
    }
    int due = remind_still_due(rm, &m);
    if (due < 0)
        goto failed;
    if (due == 0) {
        metrics_inc_l(&metric_quan_reminders_total, tname, "skipped");
        log_infof(NULL, ((log_field[]){LOG_S("key", env->key), LOG_END}),
                  "reminder cancelled or already sent; skipped");
        out = MQ_ACK;
        goto commit;
    }
    qn_status st = remind_deliver(rm, &m, env->key);
    if (st == QN_EINVAL) {
        log_warn(NULL, "reminder %s: no %s configured; dead-lettered", env->key,
                 m.type == 0 ? "QUAN_REMIND_WEBHOOK_URL" : "QUAN_SMTP_URL");
        metrics_inc_l(&metric_quan_reminders_total, tname, "dead");
        out = MQ_DEAD;
        goto failed;
    }
    if (st != QN_OK) {
        metrics_inc_l(&metric_quan_reminders_total, tname, "failed");
        if (info->attempt >= info->max_attempts) {
            metrics_inc_l(&metric_quan_reminders_total, tname, "dead");
            log_error(NULL, "reminder %s: delivery failed %d times; dead-lettered", env->key,
                      info->attempt);
        }
        goto failed;
    }
    metrics_inc_l(&metric_quan_reminders_total, tname, "sent");
    /* Delivered: record it (a redelivery after the guard's TTL is then skipped). If this
     * fails, the guard still says done for a day. */
    if (remind_mark_sent(rm, &m) != QN_OK)
        log_warn(NULL, "reminder %s: delivered but not marked sent", env->key);
    out = MQ_ACK;
commit:
    if (guard_commit(rm->rs, gkey, REMIND_GUARD_TTL) != QN_OK)
        log_warn(NULL, "reminder %s: consume guard not committed", env->key);
    return out;
failed:
    if (guard_abort(rm->rs, gkey) != QN_OK)
        log_warn(NULL, "reminder %s: consume guard not released", env->key);
    return out;
}

static qn_status remind_start(service *s, void **state)
{
    remind *rm = calloc(1, sizeof(*rm));
    if (!rm)
        return QN_ENOMEM;
    *state = rm; /* freed by remind_free from here on, whatever happens below */
    rm->svc = s;
    rm->common = service_cfg(s);
    rm->cfg = &remind_cfg;
    rm->rs = service_redis_sync_new(rm->common, 0);
    return rm->rs ? QN_OK : QN_ENOMEM;
}

/* After the consumer thread stopped. */
static void remind_free(void *state)
{
    remind *rm = state;
    if (!rm)
        return;
    redis_sync_free(rm->rs);
    free(rm);
}

static const config_var remind_vars[] = {
    {"QUAN_REMIND_WEBHOOK_URL", CONFIG_STR, offsetof(remind_settings, remind_webhook_url), "", 0,
     2048, NULL, 0, "app reminders are POSTed here as JSON (empty: not sent, dead-lettered)"},
    NOTIFY_SEND_SMTP_CONFIG_VARS(remind_settings),
    {"QUAN_REMIND_TIMEOUT_MS", CONFIG_INT, offsetof(remind_settings, remind_timeout_ms), "5000",
     100, 60000, NULL, 0, "time limit of one reminder delivery (webhook POST or SMTP session)"},
};

const service_module remind_module = {
    .name = "remind",
    .vars = remind_vars,
    .nvars = sizeof(remind_vars) / sizeof(remind_vars[0]),
    .settings = &remind_cfg,
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/engine/coupon-template-remind/create", remind_on_create,
             HTTP_NEED_USER},
            {HTTP_POST, "/api/engine/coupon-template-remind/cancel", remind_on_cancel,
             HTTP_NEED_USER},
            {HTTP_GET, "/api/engine/coupon-template-remind/list", remind_on_list, HTTP_NEED_USER},
            {0},
        },
    .consumers =
        (const service_consumer[]){
            /* a reminder is due: notify the user */
            {"engine.remind", (const char *const[]){EVENT_REMIND_DUE, NULL}, remind_on_message},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(REMIND_METRICS) NULL},
    .start = remind_start,
    .free = remind_free,
};
