/*
 * Bloom filter on a plain Redis bitmap (Debian's Redis has no bloom module), e.g. the filter of
 * existing template ids (KEYS_TEMPLATE_BLOOM) that lets the engine answer "no such template"
 * without touching the cache or the database.
 *
 * Layout of the key: a 32-byte ASCII header naming the parameters ("QBLOOM1 m=... k=..."),
 * then m bits. Bit positions are computed here, in C, by double hashing of a 64-bit mix of the
 * id (pos_i = h1 + i * h2 mod m), and handed to lua-scripts/bloom_add.lua / bloom_check.lua,
 * which SETBIT / GETBIT them in one step each. The scripts compare the header first, so a
 * reader or writer configured with other parameters never reads or writes garbage: it gets
 * BLOOM_UNKNOWN and must treat the id as "maybe present" (as when the key is missing, e.g.
 * after a Redis flush). quan-bloom-rebuild rewrites the whole filter from the database.
 *
 * Every process that uses one filter must compute the same bloom_params (same expected count
 * and false-positive rate; QUAN_BLOOM_EXPECTED / QUAN_BLOOM_FP_PER_MILLION).
 *
 * Never add an id on a lookup miss (every probe of an unknown id would become "maybe
 * present"): only ids whose rows exist are added.
 */
#ifndef QUAN_BLOOM_H
#define QUAN_BLOOM_H

#include <stdint.h>

#include "redis.h"
#include "redis_sync.h"
#include "status.h"

#define BLOOM_HEADER_LEN  32 /* bytes before the first bit */
#define BLOOM_HEADER_BITS (BLOOM_HEADER_LEN * 8)
#define BLOOM_MAX_K       30
#define BLOOM_MAX_BITS    ((UINT64_C(1) << 32) - BLOOM_HEADER_BITS) /* Redis strings: 512 MiB */
/* Defaults shared by the binaries that use the template filter. */
#define BLOOM_TPL_DEFAULT_EXPECTED       1000000
#define BLOOM_TPL_DEFAULT_FP_PER_MILLION 1000

enum { BLOOM_UNKNOWN = -1, BLOOM_ABSENT = 0, BLOOM_PRESENT = 1 };

typedef struct bloom_params {
    uint64_t m; /* bits */
    int k;      /* hash functions */
} bloom_params;

/* m = -n ln p / (ln 2)^2 and k = m/n ln 2 for n expected items and false-positive rate
 * fp_per_million / 10^6; m is capped at BLOOM_MAX_BITS, k kept in 1..BLOOM_MAX_K.
 * QN_EINVAL when n < 1 or the rate is not in (0, 10^6). */
qn_status bloom_params_for(int64_t n, int64_t fp_per_million, bloom_params *out) QN_MUSTCHECK;
/* The header text of p (BLOOM_HEADER_LEN characters plus NUL). */
void bloom_header(const bloom_params *p, char out[BLOOM_HEADER_LEN + 1]);
/* The k absolute bit offsets in the key (header included) of id. */
void bloom_positions(const bloom_params *p, int64_t id, uint64_t out[BLOOM_MAX_K]);

/* ---- asynchronous, on the loop thread (redis_client) ---- */

/* st: QN_OK when the bits are set; QN_ECONFLICT when the key holds a filter of other
 * parameters; QN_ERR on a Redis failure. */
typedef void (*bloom_add_cb)(qn_status st, void *arg);
/* result: BLOOM_PRESENT, BLOOM_ABSENT, or BLOOM_UNKNOWN (no filter, other parameters, or a
 * Redis failure: treat as "maybe present"). */
typedef void (*bloom_check_cb)(int result, void *arg);

/* key and p are copied/read before return. QN_OK: cb runs exactly once, later. Otherwise cb
 * never runs. cb may be NULL for add. */
qn_status bloom_add(redis_client *c, const char *key, const bloom_params *p, int64_t id,
                    bloom_add_cb cb, void *arg) QN_MUSTCHECK;
qn_status bloom_check(redis_client *c, const char *key, const bloom_params *p, int64_t id,
                      bloom_check_cb cb, void *arg) QN_MUSTCHECK;

/* ---- synchronous, for threads and tools (scripts must hold bloom_add / bloom_check) ---- */

qn_status bloom_add_sync(redis_sync *rs, const redis_scripts *s, const char *key,
                         const bloom_params *p, int64_t id) QN_MUSTCHECK;
int bloom_check_sync(redis_sync *rs, const redis_scripts *s, const char *key, const bloom_params *p,
                     int64_t id);

/* The two config rows that size the template filter; merchant-admin (which adds) and engine
 * (which checks) must agree, so both binaries take them from here. T is the binary's config
 * struct with int64_t fields bloom_expected and bloom_fp_per_million. */
#define BLOOM_CONFIG_VARS(T)                                                                       \
    {"QUAN_BLOOM_EXPECTED",                                                                        \
     CONFIG_INT,                                                                                   \
     offsetof(T, bloom_expected),                                                                  \
     "1000000",                                                                                    \
     1000,                                                                                         \
     1000000000,                                                                                   \
     NULL,                                                                                         \
     0,                                                                                            \
     "templates the bloom filter is sized for (the same in merchant-admin and engine)"},           \
    {                                                                                              \
        "QUAN_BLOOM_FP_PER_MILLION", CONFIG_INT, offsetof(T, bloom_fp_per_million), "1000", 1,     \
            100000, NULL, 0, "bloom filter false-positive rate, per million (the same in both)"    \
    }

#endif
