/*
 * Stock buckets: one template's stock spread over N hashes on N hash tags, so that one flash
 * sale runs on N Redis masters of a cluster instead of one.
 *
 * Each bucket is a small template of its own: a hash holding a share of the stock and the
 * fields claim.lua reads (template.h), a users hash and a reservation set, all three in the
 * bucket's slot, so lua-scripts/claim.lua runs on a bucket unchanged. Bucket 0 is the
 * template's own keys (keys.h): a template of one bucket is exactly the template it always
 * was. A user belongs to one home bucket (bucket_home, a hash of the user id), where the
 * per-user limit, the claim's marker and the reservation live: the limit stays exact because
 * one user's claims of the template all run in one slot.
 *
 * When the home is dry while other buckets hold stock, the claim does not get a "no": units
 * move to the home by a transfer (bucket_give.lua, bucket_take.lua, bucket_settle.lua) that
 * is exactly-once under a crash at any step, and the claim runs again. A final "sold out"
 * comes only from bucket_verdict over two looks at every bucket (see there and
 * docs/architecture.md, "Stock buckets").
 */
#ifndef QUAN_BUCKET_H
#define QUAN_BUCKET_H

#include <hiredis/hiredis.h>
#include <stdint.h>

#include "keys.h"
#include "redis.h"
#include "redis_scripts.h"
#include "redis_sync.h"
#include "status.h"
#include "template.h"

#define BUCKET_MAX TPL_BUCKETS_MAX /* buckets of one template */

/* The bucket of user among n (n <= 1: 0). A mix of the id, so users with ids that step by a
 * multiple of n still spread. */
int bucket_home(int64_t user, int n);

/* The units bucket b of n holds when stock is first split: stock / n, and one more for the
 * first stock % n buckets; a negative stock all in bucket 0. The n shares sum to stock. */
int64_t bucket_share(int64_t stock, int b, int n);

/* The hash tag of bucket b of template tpl_id (n buckets), without the braces, in buf
 * (KEYS_LEN): bucket 0 is "<tpl_id>", the template's own; bucket b >= 1 is "<tpl_id>.<b>.<k>", k
 * the first number that puts the tag in the b-th n-th of the slot space counted from bucket
 * 0's, so n buckets lie on n different masters of a cluster whose masters hold equal ranges
 * (how `redis-cli --cluster create` divides the slots). */
void bucket_tag(char *buf, int64_t tpl_id, int b, int n);

/* The three keys of a bucket (claim.lua's KEYS[1..3]). */
typedef struct bucket_keys {
    char hash[KEYS_LEN];  /* bucket 0: quan:tpl_id:{T}; else quan:bkt:{tag} */
    char users[KEYS_LEN]; /* ...:users */
    char resv[KEYS_LEN];  /* ...:resv */
} bucket_keys;

void bucket_keys_of(bucket_keys *k, int64_t tpl_id, int b, int n);

/* ---- the cache hashes of a template's buckets ----
 *
 * Bucket b of t's n = t->buckets holds t's fields (tpl_cache_fields, "buckets" n among them)
 * with the stock bucket_share(stock, b, n), written only if absent (template_cache_put.lua: a
 * present hash holds live stock). Bucket 0, the template's own hash, is written last, so a
 * template hash that is there says every bucket was written once. A bucket missing while
 * others are there (a write cut short) gets its share of the stock the databases give now,
 * never more than the share it had: the sum never exceeds what is left (reconcile adds what
 * such a late share lacks). stock is what the databases leave to claim (t->stock, or less
 * the claims in flight). */

/* template_cache_put.lua's arguments for bucket b: the expiry (exp, the template's end), then
 * the fields (strings in bufs, exp and t). Returns how many. argv needs 1 + 2 x
 * TPL_CACHE_FIELDS slots. */
int bucket_cache_args(const tpl *t, int64_t stock, int b, const char **argv, tpl_cache_bufs *bufs,
                      char exp[24]);

/* While t's buckets are changing (t->relayout_from > 0) no hash is written: the databases
 * already say the new number while Redis still holds the old layout, closed, and only the
 * engine's re-layout (services/engine/relayout.h) writes the new one, from the databases once
 * nothing is in flight; a share written here would open a bucket beside counters not moved
 * yet. */

/* Writes the hashes on the blocking client, the template's own last. *written: how many were
 * absent and are now written (may be NULL). QN_ERR when a call failed (those after it are not
 * made: the next writer finishes). QN_OK, nothing written, while t's buckets are changing. */
qn_status bucket_cache_put_sync(redis_sync *rs, const redis_scripts *s, const tpl *t, int64_t stock,
                                int *written) QN_MUSTCHECK;

/* Bucket b of t's buckets written in place with its share of stock, whatever it holds (a
 * rebuild from the databases: reconcile.h, relayout.h): every field of t, the generation
 * raised (its stock may have risen), a rebuild's mark dropped, the expiry; which opens it.
 * Other fields stay (a transfer's "xi:X": a late take adds nothing). QN_ERR when a command
 * failed. Blocking. */
qn_status bucket_rewrite_sync(redis_sync *rs, const tpl *t, int64_t stock, int b) QN_MUSTCHECK;

/* The same on the loop's client: done(st, arg) once every call answered (QN_ERR when one
 * failed), never before this returns QN_OK. QN_ENOMEM or the first call's error, done never
 * called, when nothing could be sent; QN_EAGAIN, done never called, while t's buckets are
 * changing. */
typedef void (*bucket_put_cb)(qn_status st, void *arg);
qn_status bucket_cache_put(redis_client *c, const tpl *t, int64_t stock, bucket_put_cb done,
                           void *arg) QN_MUSTCHECK;

/* One look at a bucket (bucket_give.lua's answer). */
typedef struct bucket_look {
    int64_t given; /* the units the call gave (a transfer) */
    int64_t stock;
    int64_t gen;          /* raised by every call that raises the stock */
    int64_t open;         /* open reservations */
    int64_t xo;           /* transfers out of the bucket on their way */
    int64_t xo_oldest_ms; /* the oldest of those's time (0: none) */
    int missing;          /* the bucket's hash is missing */
} bucket_look;

/* Reads bucket_give.lua's reply. QN_EINVAL when it is not one. */
qn_status bucket_look_parse(const redisReply *r, bucket_look *out) QN_MUSTCHECK;

typedef enum bucket_verdict_t {
    BUCKET_SOLD_OUT, /* final: at one instant every bucket held nothing, none was in flight */
    BUCKET_IN_DOUBT, /* stock may come back (reservations, transfers on their way) */
    BUCKET_HAS_STOCK /* a bucket holds stock: take some (a transfer) */
} bucket_verdict_t;

/* The verdict of two looks at every one of n buckets, the second pass begun after the first
 * ended. Sold out only when, in both looks, every bucket held no stock, no open reservation and
 * no transfer on its way, with the same generation: a bucket's stock rises only by calls that
 * raise its generation and falls only while it holds some, so each bucket held nothing from
 * its first look to its second, and all of them at the instant between the two passes. */
bucket_verdict_t bucket_verdict(const bucket_look *first, const bucket_look *second, int n);

/* ---- the steps, on the blocking client (tools, tests) ---- */

/* claim.lua for user at its home bucket among n of template tpl_id, now, naming shop (text),
 * recording the reservation as member (keys_resv_member; "" for none), owner "" (no engine
 * process). The answer's code (claimgate_result), -1 when there is none. */
int bucket_claim_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int64_t user,
                      const char *shop, const char *member);

/* One bucket_give.lua call on bucket b: up to want units given towards bucket home as transfer
 * xid, or, with want 0, only a look. The first step of a transfer alone: the rest is
 * bucket_finish_sync's (or a crash test's). */
qn_status bucket_give_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int b,
                           int home, int64_t want, const char *xid, bucket_look *out) QN_MUSTCHECK;

/* Moves up to want units from bucket from to bucket to (n buckets) as transfer xid: give,
 * take, settle. *moved: the units that reached to (0: the donor had none). QN_ERR when a step
 * failed: the transfer is then finished by bucket_finish_sync, by anyone. */
qn_status bucket_transfer_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n,
                               int from, int to, int64_t want, const char *xid,
                               int64_t *moved) QN_MUSTCHECK;

/* Finishes every transfer out of bucket from older than min_age_ms (take at its recorded home,
 * then settle). *finished: how many. */
qn_status bucket_finish_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n,
                             int from, int64_t min_age_ms, int *finished) QN_MUSTCHECK;

/* What a claim whose home bucket answered "no stock" does: take stock from the others, or
 * learn that there is none. Tries each other bucket in turn for half what it holds (at least
 * one unit); the first that gives ends it: *v BUCKET_HAS_STOCK, the units now at home. When
 * none gives, a second look at all n decides (bucket_verdict). xid_prefix makes the transfer
 * ids ("<prefix>.<donor>"): unique per call. */
qn_status bucket_seek_sync(redis_sync *rs, const redis_scripts *s, int64_t tpl_id, int n, int home,
                           const char *xid_prefix, bucket_verdict_t *v) QN_MUSTCHECK;

#endif
