/*
 * Every Redis key Quan uses, in one place. Keys a Lua script touches together share a hash
 * tag ({templateId} or {userId}) so the suite runs unchanged on Redis Cluster (D18).
 * Each macro formats into a caller's buffer of KEYS_LEN bytes.
 */
#ifndef QUAN_KEYS_H
#define QUAN_KEYS_H

#include <inttypes.h>
#include <stdio.h>

#define KEYS_LEN 128

/* Template cache hash (fields: see template.h) and its per-template companions. */
#define keys_template(buf, tpl_id)                                                                 \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}", (int64_t)(tpl_id))
/* Per-user claim counter of a template (same slot as the template hash). */
#define keys_template_user(buf, tpl_id, user_id)                                                   \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:user:%" PRId64, (int64_t)(tpl_id),           \
             (int64_t)(user_id))
/* "No such template" marker of the query chain (30 minutes). */
#define keys_template_null(buf, tpl_id)                                                            \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:null", (int64_t)(tpl_id))
/* Lock taken while one request rebuilds the template cache from the database. */
#define keys_template_lock(buf, tpl_id)                                                            \
    snprintf((buf), KEYS_LEN, "quan:tpl:{%" PRId64 "}:lock", (int64_t)(tpl_id))
/* The user's wallet: sorted set, member "<templateId>_<userCouponId>", score = claim time ms. */
#define keys_wallet(buf, user_id)                                                                  \
    snprintf((buf), KEYS_LEN, "quan:wallet:{%" PRId64 "}", (int64_t)(user_id))
/* Bloom filter of existing template ids (a Redis bitmap). */
#define KEYS_TEMPLATE_BLOOM "quan:bloom:tpl"

#endif
