/* Task notifications: the task.notify consumer (see notify.h). */
#include "notify.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "guard.h"
#include "jsonin.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "notify_send.h"

METRICS_DEFINE(NOTIFY_METRICS)

#define NOTIFY_KEY_MAX    80 /* of a message key: its Redis keys fit in KEYS_LEN */
#define NOTIFY_DONE_TTL   (7 * 24 * 3600 * 1000LL) /* a message sent, and its sent units */
#define NOTIFY_LEASE_MS   30000 /* the guard's hold beyond one call's timeout: renewed per unit */
#define NOTIFY_MAIL_FAILS 5     /* refused mails after which the rest wait for the next delivery */

/* The module's settings (service_module.settings: no field in the binary's struct). */
typedef struct notify_settings {
    const char *webhook_url;
    const char *smtp_url;
    const char *smtp_from;
    int64_t batch;
    int64_t timeout_ms;
} notify_settings;

static notify_settings notify_cfg;

/* The module's context (its start hook's state), the arg of its consumer. */
typedef struct notify_ctx {
    service *svc;
    const notify_settings *cfg;
    redis_sync *rs; /* the consumer thread's own client */
} notify_ctx;

static const char *const notify_names[NOTIFY_CHANNELS] = {"app", "popup", "email", "sms"};

const char *notify_channel_name(int channel)
{
    return channel >= 0 && channel < NOTIFY_CHANNELS ? notify_names[channel] : "other";
}

/* ---------------------------------------------------------------- the message */

void notify_task_clear(notify_task *t)
{
    free(t->users);
    memset(t, 0, sizeof(*t));
}

/* An optional string field of a user, NULL when absent or empty. */
static qn_status notify_opt_string(const cJSON *u, const char *field, size_t max, const char **out,
                                   jsonin_err *e)
{
    if (jsonin_string(u, field, JSONIN_OPTIONAL, 0, max, out, e) != QN_OK)
        return QN_EINVAL;
    if (*out && !**out)
        *out = NULL;
    return QN_OK;
}

qn_status notify_task_parse(const cJSON *data, notify_task *t, char *err, size_t errlen)
{
    static const int allowed[NOTIFY_CHANNELS] = {0, 1, 2, 3};
    int types[NOTIFY_CHANNELS];
    size_t ntypes = 0, i = 0;
    const cJSON *users = cJSON_GetObjectItemCaseSensitive(data, "users"), *u;
    jsonin_err e = {""};

    memset(t, 0, sizeof(*t));
    if (jsonin_int64(data, "taskId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &t->task_id, &e) != QN_OK ||
        jsonin_int64(data, "couponTemplateId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &t->tpl_id, &e) !=
            QN_OK ||
        jsonin_int64(data, "shopNumber", JSONIN_REQUIRED, 0, 1, INT64_MAX, &t->shop, &e) != QN_OK ||
        jsonin_int_list_csv(data, "notifyType", JSONIN_REQUIRED, allowed, NOTIFY_CHANNELS, types,
                            NOTIFY_CHANNELS, &ntypes, &e) != QN_OK)
        goto bad;
    for (size_t k = 0; k < ntypes; k++)
        t->channels |= 1u << types[k];
    if (!cJSON_IsArray(users) || cJSON_GetArraySize(users) > NOTIFY_MAX_USERS) {
        jsonin_errf(&e, "users", "must be an array of at most %d users", NOTIFY_MAX_USERS);
        goto bad;
    }
    t->nusers = (size_t)cJSON_GetArraySize(users);
    t->users = calloc(t->nusers ? t->nusers : 1, sizeof(*t->users));
    if (!t->users) {
        jsonin_errf(&e, "users", "out of memory");
        goto bad;
    }
    cJSON_ArrayForEach(u, users)
    {
        notify_user *nu = &t->users[i++];
        if (!cJSON_IsObject(u)) {
            jsonin_errf(&e, "users", "user %zu is not an object", i);
            goto bad;
        }
        if (jsonin_int64(u, "userId", JSONIN_REQUIRED, 0, 1, INT64_MAX, &nu->user_id, &e) !=
                QN_OK ||
            notify_opt_string(u, "phone", 32, &nu->phone, &e) != QN_OK ||
            notify_opt_string(u, "mail", NOTIFY_SEND_ADDRESS_MAX, &nu->mail, &e) != QN_OK)
            goto bad;
        if (nu->mail && !notify_send_address_ok(nu->mail))
            nu->mail = NULL; /* counted as no address, not a malformed message */
    }
    return QN_OK;
bad:
    qn_errf(err, errlen, "%s", e.msg);
    notify_task_clear(t);
    return QN_EINVAL;
}

uint64_t notify_unit(int channel, size_t nusers, size_t i)
{
    return (uint64_t)channel * nusers + i;
}

int notify_unit_sent(const char *sent, size_t nsent, uint64_t unit)
{
    return unit / 8 < nsent && ((unsigned char)sent[unit / 8] & (0x80u >> (unit % 8)));
}

size_t notify_batch_span(size_t n, size_t batch, size_t b, size_t *first)
{
    *first = b * batch;
    if (batch == 0 || b >= (n + batch - 1) / batch)
        return 0;
    return n - *first < batch ? n - *first : batch;
}

size_t notify_recipients(const notify_task *t, int channel, size_t *idx)
{
    size_t n = 0;
    for (size_t i = 0; i < t->nusers; i++)
        if ((channel == NOTIFY_SMS && t->users[i].phone) ||
            (channel == NOTIFY_EMAIL && t->users[i].mail) ||
            (channel != NOTIFY_SMS && channel != NOTIFY_EMAIL))
            idx[n++] = i;
    return n;
}

char *notify_batch_json(const notify_task *t, int channel, const char *key, const size_t *idx,
                        size_t n)
{
    cJSON *o = cJSON_CreateObject(), *ids = cJSON_CreateArray();
    cJSON *phones = channel == NOTIFY_SMS ? cJSON_CreateArray() : NULL;
    char *json = NULL;

    if (!o || !ids || (channel == NOTIFY_SMS && !phones))
        goto done;
    cJSON_AddStringToObject(o, "event", EVENT_TASK_NOTIFY);
    cJSON_AddStringToObject(o, "key", key);
    cJSON_AddStringToObject(o, "channel", notify_channel_name(channel));
    cJSON_AddNumberToObject(o, "notifyType", channel);
    cJSON_AddItemToObject(o, "taskId", jsonin_id_to_json(t->task_id));
    cJSON_AddItemToObject(o, "couponTemplateId", jsonin_id_to_json(t->tpl_id));
    cJSON_AddItemToObject(o, "shopNumber", jsonin_id_to_json(t->shop));
    for (size_t k = 0; k < n; k++) {
        cJSON_AddItemToArray(ids, jsonin_id_to_json(t->users[idx[k]].user_id));
        if (phones)
            cJSON_AddItemToArray(phones, cJSON_CreateString(t->users[idx[k]].phone));
    }
    cJSON_AddItemToObject(o, "userIds", ids);
    ids = NULL;
    if (phones) {
        cJSON_AddItemToObject(o, "phones", phones);
        phones = NULL;
    }
    json = cJSON_PrintUnformatted(o);
done:
    cJSON_Delete(o);
    cJSON_Delete(ids);
    cJSON_Delete(phones);
    return json;
}

/* ---------------------------------------------------------------- one delivery */

/* What one delivery of a message has done so far. */
typedef struct notify_run {
    notify_ctx *ctx;
    const char *key; /* the message's */
    const notify_task *t;
    char gkey[KEYS_LEN], skey[KEYS_LEN]; /* guard, sent units */
    char *sent;                          /* the sent-units bitmap as read at the start */
    size_t nsent;
    size_t *idx;                         /* recipients of the channel at hand */
    int64_t skipped[NOTIFY_CHANNELS][2]; /* users, by reason: unconfigured, no address */
    int retry, dead, redis_failed;       /* what the delivery ends in */
} notify_run;

/* Records a unit as sent and extends the guard's hold, in one round trip. On failure the
 * delivery stops there: a unit not recorded would be sent again by the next one. */
static void notify_mark_sent(notify_run *r, uint64_t unit)
{
    redis_sync *rs = r->ctx->rs;
    long long lease = (long long)r->ctx->cfg->timeout_ms + NOTIFY_LEASE_MS;
    int ok = 1;
    /* the record and the guard share the message's tag: one node */
    redis_sync_append(rs, "SETBIT %s %llu 1", r->skey, (unsigned long long)unit);
    redis_sync_append(rs, "PEXPIRE %s %lld", r->skey, NOTIFY_DONE_TTL);
    redis_sync_append(rs, "PEXPIRE %s %lld", r->gkey, lease);
    for (int i = 0; i < 3 && ok; i++) {
        redisReply *reply = NULL;
        ok = redis_sync_get_reply(rs, &reply) == QN_OK && reply->type == REDIS_REPLY_INTEGER;
        freeReplyObject(reply);
    }
    if (!ok) {
        log_warn(NULL, "task.notify %s: sent, but not recorded (%s); stopping this delivery",
                 r->key, redis_sync_errstr(rs)[0] ? redis_sync_errstr(rs) : "unexpected reply");
        redis_sync_discard(rs);
        r->redis_failed = 1;
    }
}

/* The outcome of one unit's call: counted and logged; 1 if the channel goes on. */
static int notify_settle(notify_run *r, int channel, uint64_t unit, size_t users, qn_status st,
                         const char *err)
{
    const char *name = notify_channel_name(channel);

    if (st == QN_OK) {
        metrics_add_l(&metric_quan_notify_sent_total, (int64_t)users, name);
        notify_mark_sent(r, unit);
        return !r->redis_failed;
    }
    metrics_add_l(&metric_quan_notify_failed_total, (int64_t)users, name);
    log_warnf(NULL, ((log_field[]){LOG_S("key", r->key), LOG_S("channel", name), LOG_END}),
              "task notification failed (%s): %s",
              notify_send_retryable(st) ? "retried" : "dead-lettered", err);
    if (notify_send_retryable(st))
        r->retry = 1; /* the peer is unwell: the rest of the channel waits for the retry */
    else
        r->dead = 1;
    return 0;
}

/* Channel 0, 1 or 3: batches of recipients POSTed to the webhook. */
static void notify_webhook_channel(notify_run *r, int channel)
{
    const notify_settings *cfg = r->ctx->cfg;
    const notify_task *t = r->t;
    size_t n = notify_recipients(t, channel, r->idx), batch = (size_t)cfg->batch;
    char key[KEYS_LEN], err[NOTIFY_SEND_ERR_LEN];

    r->skipped[channel][1] += (int64_t)(t->nusers - n);
    if (!cfg->webhook_url[0]) {
        r->skipped[channel][0] += (int64_t)n;
        return;
    }
    size_t first, cnt;
    for (size_t b = 0; (cnt = notify_batch_span(n, batch, b, &first)) > 0 && !r->redis_failed;
         b++) {
        uint64_t unit = notify_unit(channel, t->nusers, b);
        if (notify_unit_sent(r->sent, r->nsent, unit))
            continue;
        snprintf(key, sizeof(key), "%s:%s:%zu", r->key, notify_channel_name(channel), b);
        char *json = notify_batch_json(t, channel, key, r->idx + first, cnt);
        qn_status st = QN_ENOMEM;
        snprintf(err, sizeof(err), "out of memory");
        if (json)
            st = notify_send_webhook(cfg->webhook_url, json, (long)cfg->timeout_ms, err,
                                     sizeof(err));
        free(json);
        if (!notify_settle(r, channel, unit, cnt, st, err))
            return;
    }
}

/* Channel 2: one mail per recipient. */
static void notify_mail_channel(notify_run *r)
{
    const notify_settings *cfg = r->ctx->cfg;
    const notify_task *t = r->t;
    size_t n = notify_recipients(t, NOTIFY_EMAIL, r->idx);
    char subject[64], body[512], msg_id[NOTIFY_SEND_MSGID_MAX + 1], err[NOTIFY_SEND_ERR_LEN];
    int refused = 0;

    r->skipped[NOTIFY_EMAIL][1] += (int64_t)(t->nusers - n);
    if (!cfg->smtp_url[0]) {
        r->skipped[NOTIFY_EMAIL][0] += (int64_t)n;
        return;
    }
    snprintf(subject, sizeof(subject), "A coupon for you");
    snprintf(body, sizeof(body),
             "A coupon (template %" PRId64 ") from shop %" PRId64
             " is now in your wallet.\n\nDistribution task %" PRId64 ".\n",
             t->tpl_id, t->shop, t->task_id);
    for (size_t k = 0; k < n && !r->redis_failed; k++) {
        const notify_user *u = &t->users[r->idx[k]];
        uint64_t unit = notify_unit(NOTIFY_EMAIL, t->nusers, r->idx[k]);
        if (notify_unit_sent(r->sent, r->nsent, unit))
            continue;
        snprintf(msg_id, sizeof(msg_id), "%s:%" PRId64 "@quan", r->key, u->user_id);
        notify_send_msg m = {.smtp_url = cfg->smtp_url,
                             .from = cfg->smtp_from,
                             .to = (const char *const[]){u->mail, NULL},
                             .subject = subject,
                             .body = body,
                             .msg_id = msg_id,
                             .timeout_ms = (long)cfg->timeout_ms};
        qn_status st = notify_send_mail(&m, err, sizeof(err));
        /* One refused address leaves the others to go; a relay that refuses them all does not
         * get a call per user. */
        if (!notify_settle(r, NOTIFY_EMAIL, unit, 1, st, err) &&
            (notify_send_retryable(st) || r->redis_failed || ++refused >= NOTIFY_MAIL_FAILS))
            return;
    }
}

/* The sent units of earlier deliveries. */
static qn_status notify_read_sent(notify_run *r)
{
    redisReply *reply = redis_sync_command(r->ctx->rs, "GET %s", r->skey);
    qn_status st = QN_ERR;

    if (reply && reply->type == REDIS_REPLY_NIL) {
        st = QN_OK;
    } else if (reply && reply->type == REDIS_REPLY_STRING) {
        r->sent = malloc(reply->len ? reply->len : 1);
        if (r->sent) {
            memcpy(r->sent, reply->str, reply->len);
            r->nsent = reply->len;
            st = QN_OK;
        }
    }
    if (reply)
        freeReplyObject(reply);
    return st;
}

static mq_handler_result notify_on_message(const mq_envelope *env, const mq_delivery_info *info,
                                           void *arg)
{
    notify_ctx *ctx = arg;
    notify_task t;
    notify_run r = {.ctx = ctx, .key = env->key, .t = &t};
    char err[256];
    mq_handler_result out = MQ_RETRY;
    int64_t lease = ctx->cfg->timeout_ms + NOTIFY_LEASE_MS;

    if (strlen(env->key) > NOTIFY_KEY_MAX) {
        log_warn(NULL, "task.notify: key longer than %d characters; dead-lettered", NOTIFY_KEY_MAX);
        return MQ_DEAD;
    }
    if (notify_task_parse(env->data, &t, err, sizeof(err)) != QN_OK) {
        log_warn(NULL, "task.notify %s: malformed (%s)", env->key, err);
        return MQ_DEAD;
    }
    if (redis_sync_open(ctx->rs) != QN_OK)
        goto done;
    keys_notify_guard(r.gkey, env->key);
    keys_notify_sent(r.skey, env->key);
    switch (guard_begin(ctx->rs, redis_client_scripts(service_redis(ctx->svc)), r.gkey, lease)) {
    case GUARD_RUN:
        break;
    case GUARD_DONE:
        out = MQ_ACK;
        goto done;
    case GUARD_BUSY:
        out = MQ_REQUEUE_LATER;
        goto done;
    default:
        goto done;
    }
    r.idx = malloc((t.nusers ? t.nusers : 1) * sizeof(*r.idx));
    if (!r.idx || notify_read_sent(&r) != QN_OK)
        goto release;
    for (int c = 0; c < NOTIFY_CHANNELS && !r.redis_failed; c++)
        if (t.channels & (1u << c)) {
            if (c == NOTIFY_EMAIL)
                notify_mail_channel(&r);
            else
                notify_webhook_channel(&r, c);
        }
    if (r.retry || r.redis_failed) {
        if (info->attempt >= info->max_attempts)
            log_error(NULL, "task.notify %s: failed %d times; dead-lettered", env->key,
                      info->attempt);
        goto release;
    }
    if (r.dead) {
        out = MQ_DEAD;
        goto release;
    }
    /* Everything sent or skipped: counted once, when the message is done. */
    for (int c = 0; c < NOTIFY_CHANNELS; c++) {
        if (r.skipped[c][0])
            metrics_add_l(&metric_quan_notify_skipped_total, r.skipped[c][0],
                          notify_channel_name(c), "unconfigured");
        if (r.skipped[c][1])
            metrics_add_l(&metric_quan_notify_skipped_total, r.skipped[c][1],
                          notify_channel_name(c), "no_address");
    }
    out = MQ_ACK;
    if (guard_commit(ctx->rs, r.gkey, NOTIFY_DONE_TTL) != QN_OK)
        log_warn(NULL, "task.notify %s: consume guard not committed", env->key);
    else /* the guard says it all */
        freeReplyObject(redis_sync_command(ctx->rs, "DEL %s", r.skey));
    goto done;
release:
    if (guard_abort(ctx->rs, r.gkey) != QN_OK)
        log_warn(NULL, "task.notify %s: consume guard not released", env->key);
done:
    free(r.idx);
    free(r.sent);
    notify_task_clear(&t);
    return out;
}

/* ---------------------------------------------------------------- the module */

static void notify_free(void *state)
{
    notify_ctx *ctx = state;
    if (!ctx)
        return;
    redis_sync_free(ctx->rs);
    free(ctx);
}

static qn_status notify_start(service *s, void **state)
{
    notify_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return QN_ENOMEM;
    *state = ctx; /* freed by notify_free from here on */
    ctx->svc = s;
    ctx->cfg = &notify_cfg;
    ctx->rs = service_redis_sync_new(service_cfg(s), 0);
    return ctx->rs ? QN_OK : QN_ENOMEM;
}

static const config_var notify_vars[] = {
    {"QUAN_NOTIFY_WEBHOOK_URL", CONFIG_STR, offsetof(notify_settings, webhook_url), "", 0, 2048,
     NULL, 0,
     "in-app, popup and SMS notifications of distributed coupons are POSTed here in batches "
     "(empty: not sent, counted as skipped)"},
    NOTIFY_SEND_SMTP_CONFIG_VARS(notify_settings),
    {"QUAN_NOTIFY_BATCH", CONFIG_INT, offsetof(notify_settings, batch), "100", 1, 1000, NULL, 0,
     "users per webhook call"},
    {"QUAN_NOTIFY_TIMEOUT_MS", CONFIG_INT, offsetof(notify_settings, timeout_ms), "5000", 100,
     60000, NULL, 0, "time limit of one webhook call or SMTP session"},
};

const service_module notify_module = {
    .name = "notify",
    .vars = notify_vars,
    .nvars = sizeof(notify_vars) / sizeof(notify_vars[0]),
    .settings = &notify_cfg,
    .consumers =
        (const service_consumer[]){
            /* a chunk of a task was committed: notify its users */
            {"distribution.task-notify", (const char *const[]){EVENT_TASK_NOTIFY, NULL},
             notify_on_message},
            {0},
        },
    .metrics = (metrics_family *const[]){METRICS_REFS(NOTIFY_METRICS) NULL},
    .start = notify_start,
    .free = notify_free,
};
