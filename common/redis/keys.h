/*
 * Every Redis key Quan uses, in one place. Keys a Lua script touches together share a hash
 * tag ({templateId} or {userId}) so the suite runs unchanged on Redis Cluster (one hash slot
 * per script call, never CROSSSLOT).
 * Each macro formats into a caller's buffer of KEYS_LEN bytes.
 */
#ifndef QUAN_KEYS_H
#define QUAN_KEYS_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

#define KEYS_LEN 128

/* The keys of every claim are built by copies (keys_cat) rather than snprintf: a claim's four
 * keys and the reservation member cost a measurable share of a refusal's time. Like snprintf,
 * they cut at KEYS_LEN - 1 bytes. */
static inline size_t keys_cat(char *buf, size_t n, const char *s)
{
    size_t len = strlen(s);
    if (len > KEYS_LEN - 1 - n)
        len = KEYS_LEN - 1 - n;
    memcpy(buf + n, s, len);
    buf[n + len] = '\0';
    return n + len;
}

static inline size_t keys_cat_i64(char *buf, size_t n, int64_t v)
{
    char num[24];
    log_i64_str(num, v);
    return keys_cat(buf, n, num);
}

/* The two keys whose changes invalidate copies kept in the processes (common/redis/rtrack.h names
 * a changed key as text; rtrack_key_id reads the id back): "<prefix>{<id>}". */
#define KEYS_TEMPLATE_PREFIX "quan:tpl:"
#define KEYS_WALLET_PREFIX   "quan:wallet:"

/* Template cache hash (fields: see template.h) and its per-template companions. */
static inline void keys_template(char *buf, int64_t tpl_id)
{
    keys_cat(buf, keys_cat_i64(buf, keys_cat(buf, 0, KEYS_TEMPLATE_PREFIX "{"), tpl_id), "}");
}
/* The claim state of a template's users (same slot as the template hash), ONE hash
 * "quan:tpl:{T}:users" instead of a key per user and per claim: a claim writes one field or
 * two, and the hash expires as one key (at the template's end, or an hour past its last claim
 * if that is later: writers only ever push the expiry out). Fields:
 *   "<U>"      the user's claim count on the template (integer text: HINCRBY works), counted by
 *              claims, exchange codes and distribution alike
 *   "<U>:<R>"  the marker of the user's claim with request id R: "<n>:<t>[:<owner>]", the count
 *              it got, the reservation's time (ms) and, when the claim recorded its
 *              reservation in keys_template_resv, the engine process that made it (resv.h; the
 *              sweeper reads it only while the record is open, and it stays after).
 *              claim.lua claims at most once per marker, claim_undo.lua gives back once (it
 *              deletes the field). The field's name is the reservation's member
 *              (keys_resv_member).
 *   "<U>#"     the request ids of the user's reservations recorded in keys_template_resv,
 *              ",<R>,<R>..." (absent: none), for claim.lua's "limit in doubt" without a scan of
 *              the set. Only claim.lua writes it: an id is added with its record, and whoever
 *              ends a record writes nothing here (a ZREM is the whole settle); a claim of the
 *              user at the limit keeps only the ids still in the set, and so does a claim
 *              whose list has grown long. */
static inline void keys_template_users(char *buf, int64_t tpl_id)
{
    keys_cat(buf, keys_cat_i64(buf, keys_cat(buf, 0, KEYS_TEMPLATE_PREFIX "{"), tpl_id), "}:users");
}
/* A user's count field in keys_template_users (the id as text). */
static inline void keys_user_field(char *buf, int64_t user_id)
{
    keys_cat_i64(buf, 0, user_id);
}
/* "No such template" marker of the query chain (30 minutes). */
#define keys_template_null(buf, tpl_id)                                                            \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:null", (int64_t)(tpl_id))
/* Lock taken while one request rebuilds the template cache from the database. */
#define keys_template_lock(buf, tpl_id)                                                            \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:lock", (int64_t)(tpl_id))
/* The user's wallet: sorted set, member "<templateId>_<userCouponId>", score = claim time ms. */
#define keys_wallet(buf, user_id)                                                                  \
    snprintf((buf), KEYS_LEN, KEYS_WALLET_PREFIX "{%" PRId64 "}", (int64_t)(user_id))
/* Bloom filter of existing template ids (a Redis bitmap). */
#define KEYS_TEMPLATE_BLOOM "quan:bloom:tpl"

/* Duplicate-submit guard (nodup.h): path, user id and the sha256 hex of the request; the path
 * makes it longer than KEYS_LEN, hence its own size. */
#define KEYS_NODUP_LEN 384
#define keys_nodup(buf, path, user_id, sha_hex)                                                    \
    snprintf((buf), KEYS_NODUP_LEN, "quan:nodup:%s:%" PRId64 ":%s", (path), (int64_t)(user_id),    \
             (sha_hex))
/* Where quan-bloom-rebuild builds a fresh filter before RENAMEing it over the live key: the
 * live key (which has no tag) is the tag, so both lie in one slot and the RENAME is not
 * CROSSSLOT. */
#define keys_bloom_rebuild(buf, live_key, pid)                                                     \
    snprintf((buf), KEYS_LEN, "{%s}:rebuild:%ld", (live_key), (long)(pid))

/* Exchange-code redemption: one redemption per user at a time (per user, never one global lock). */
#define keys_exchange_lock(buf, user_id)                                                           \
    snprintf((buf), KEYS_LEN, "quan:lock:exchange:{%" PRId64 "}", (int64_t)(user_id))
/* Consume guard of one reminder timer message (its outbox key). */
#define keys_remind_guard(buf, msg_key)                                                            \
    snprintf((buf), KEYS_LEN, "quan:guard:{remind}:%s", (msg_key))

/* Task notifications (distribution notify.c): the consume guard of one task.notify message
 * (its key), and the bitmap of its units (webhook batches, mails) already sent. */
#define keys_notify_guard(buf, msg_key)                                                            \
    snprintf((buf), KEYS_LEN, "quan:guard:{notify}:%s", (msg_key))
#define keys_notify_sent(buf, msg_key)                                                             \
    snprintf((buf), KEYS_LEN, "quan:notify:{notify}:sent:%s", (msg_key))

/* Payment lifecycle: one step at a time per user coupon (create, pay, refund, cancel, timeout). */
#define keys_lock_coupon(buf, coupon_id)                                                           \
    snprintf((buf), KEYS_LEN, "quan:lock:coupon:{%" PRId64 "}", (int64_t)(coupon_id))

/* The reservations claim.lua made on a template and nobody has completed or given back yet
 * (sorted set in the template's slot, member keys_resv_member, score = reservation time ms):
 * "quan:tpl:{T}:resv", members "U:R". */
static inline void keys_template_resv(char *buf, int64_t tpl_id)
{
    keys_cat(buf, keys_cat_i64(buf, keys_cat(buf, 0, KEYS_TEMPLATE_PREFIX "{"), tpl_id), "}:resv");
}
/* "U:R": also the name of the claim's marker field in keys_template_users. */
static inline void keys_resv_member(char *buf, int64_t user_id, const char *req_id)
{
    keys_cat(buf, keys_cat(buf, keys_cat_i64(buf, 0, user_id), ":"), req_id);
}
/* An engine process's lease on the reservations it makes (resv.h): value = the process's run
 * id, expiring unless renewed; keyed by its instance name. "quan:resv:live:{I}". */
#define keys_resv_live(buf, instance) snprintf((buf), KEYS_LEN, "quan:resv:live:{%s}", (instance))
/* The templates engines reserve on (sorted set, member "<templateId>:<shopNumber>", score = the
 * last time an engine said so): where the reservation sweeper looks. */
#define KEYS_RESV_INDEX "quan:resv:tpls"
/* The generation of the claim state this Redis holds (rgen.h). */
#define KEYS_GEN "quan:gen"
/* The lock of the one engine that rebuilds the claim state after Redis lost it (regen.h). */
#define KEYS_REGEN_LOCK "quan:lock:regen"
/* The lock of the one engine that rebuilds templates whose stock buckets change (relayout.h). */
#define KEYS_RELAYOUT_LOCK "quan:lock:relayout"
/* A process's lease on its worker id of the id generator (ids.h): + the worker number. */
#define KEYS_IDS_WORKER_PREFIX "quan:ids:worker:"
/* Held by the engine replica sweeping abandoned reservations this round. */
#define KEYS_RESV_SWEEP_LOCK "quan:lock:resv-sweep"
/* An accepted /redeem-mq claim not yet written (coupon or FAILED row), in the user's slot:
 * /redeem-result tells PENDING from a request id it never saw. The consumer deletes it. Only
 * for a request id that does not name the claim's template (keys_claim_pending_used). */
#define keys_claim_pending(buf, user_id, req_id)                                                   \
    snprintf((buf), KEYS_LEN, "quan:claim:{%" PRId64 "}:%s", (int64_t)(user_id), (req_id))
/* The template a request id names: the number after its last '.', as in the ids the engine
 * makes for claims that come without one ("g<id>.<templateId>"); 0 when it names none. */
static inline int64_t keys_request_template(const char *req_id)
{
    const char *dot = strrchr(req_id, '.');
    int64_t tpl = 0;
    if (!dot || !dot[1])
        return 0;
    for (const char *p = dot + 1; *p; p++) {
        if (*p < '0' || *p > '9' || tpl > (INT64_MAX - 9) / 10)
            return 0;
        tpl = tpl * 10 + (*p - '0');
    }
    return tpl;
}
/* 1 when an MQ claim of template tpl_id with this request id has a pending marker. One whose
 * request id names its own template has none: the claim's marker in keys_template_users
 * (keys_resv_member), written by the claim script itself and deleted only by its give-back,
 * tells /redeem-result the same at no cost of its own, a command fewer at the claim and at the
 * drain. */
static inline int keys_claim_pending_used(int64_t tpl_id, const char *req_id)
{
    return keys_request_template(req_id) != tpl_id;
}
/* Consume guard of one attempt of an MQ claim or check (claimq_attempt_key). */
#define keys_redeem_guard(buf, msg_key)                                                            \
    snprintf((buf), KEYS_LEN, "quan:guard:{redeem}:%s", (msg_key))

/* Distribution tasks (dist_chunk.lua), in the template's slot: the record of a task's chunk n
 * (its outcomes; given back; committed), and the user ids of the task's file seen so far. */
#define keys_task_chunk(buf, tpl_id, task_id, chunk)                                               \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:task:%" PRId64 ":chunk:%" PRId64,            \
             (int64_t)(tpl_id), (int64_t)(task_id), (int64_t)(chunk))
#define keys_task_seen(buf, tpl_id, task_id)                                                       \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:task:%" PRId64 ":seen", (int64_t)(tpl_id),   \
             (int64_t)(task_id))
/* Consume guard of one task.execute message (its key). */
#define keys_task_guard(buf, msg_key) snprintf((buf), KEYS_LEN, "quan:guard:{task}:%s", (msg_key))

#endif
