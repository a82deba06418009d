/*
 * Every Lua script of lua-scripts/, once: its name (the file's, without ".lua") and how many
 * keys and arguments a call passes (a range where some are optional; -1: no upper bound, for
 * the scripts that take a list). Callers name a script through SCRIPT(name), which does not
 * compile for a name that is not listed here, and the call macros of redis.h / redis_sync.h
 * check the counts: at compile time where the keys and arguments are arrays of a fixed size,
 * else on the call (refused and logged, before anything is sent). At start every binary checks
 * that lua-scripts/ holds exactly these scripts (redis_scripts_check), so a script renamed on
 * one side stops the start, not a sale.
 */
#ifndef QUAN_SCRIPTS_H
#define QUAN_SCRIPTS_H

#include <stddef.h>

/* X(name, keys min, keys max, arguments min, arguments max) */
#define SCRIPTS_LIST(X)                                                                            \
    X(bloom_add, 1, 1, 1, -1)                                                                      \
    X(bloom_check, 1, 1, 1, -1)                                                                    \
    X(bucket_give, 2, 2, 4, 4)                                                                     \
    X(bucket_settle, 1, 1, 1, 1)                                                                   \
    X(bucket_take, 1, 1, 3, 3)                                                                     \
    X(claim, 2, 3, 6, -1)                                                                          \
    X(claim_undo, 2, 3, 2, 3)                                                                      \
    X(consume_guard, 1, 1, 2, 2)                                                                   \
    X(dist_chunk, 4, 4, 4, -1)                                                                     \
    X(dist_chunk_undo, 3, 3, 0, -1)                                                                \
    X(lock_acquire, 1, 1, 2, 2)                                                                    \
    X(lock_release, 1, 1, 1, 1)                                                                    \
    X(lock_renew, 1, 1, 2, 2)                                                                      \
    X(nodup_release, 1, 1, 2, 2)                                                                   \
    X(resv_prune, 1, 1, 2, 2)                                                                      \
    X(template_cache_put, 1, 1, 1, -1)                                                             \
    X(template_status_set, 1, 1, 1, 1)                                                             \
    X(template_stock_add, 1, 1, 1, 2)

#define SCRIPTS_ENUM_(name, kmin, kmax, amin, amax) SCRIPT_ID_##name,
typedef enum { SCRIPTS_LIST(SCRIPTS_ENUM_) SCRIPTS_COUNT } script_id;
#undef SCRIPTS_ENUM_

/* The counts of each script, as enum constants (for the compile-time checks below). */
#define SCRIPTS_ARITY_(name, kmin, kmax, amin, amax)                                               \
    enum {                                                                                         \
        SCRIPT_KMIN_##name = (kmin),                                                               \
        SCRIPT_KMAX_##name = (kmax),                                                               \
        SCRIPT_AMIN_##name = (amin),                                                               \
        SCRIPT_AMAX_##name = (amax)                                                                \
    };
SCRIPTS_LIST(SCRIPTS_ARITY_)
#undef SCRIPTS_ARITY_

typedef struct script_info {
    const char *name;
    int keys_min, keys_max, args_min, args_max; /* max -1: any */
} script_info;

/* The row of script id. */
static inline const script_info *script_of(script_id id)
{
#define SCRIPTS_ROW_(name, kmin, kmax, amin, amax) {#name, kmin, kmax, amin, amax},
    static const script_info rows[SCRIPTS_COUNT] = {SCRIPTS_LIST(SCRIPTS_ROW_)};
#undef SCRIPTS_ROW_
    return &rows[(unsigned)id < SCRIPTS_COUNT ? id : 0];
}

/* The row of the script called name, or NULL when it is not listed. */
static inline const script_info *script_named(const char *name)
{
    for (int i = 0; i < SCRIPTS_COUNT; i++) {
        const script_info *s = script_of((script_id)i);
        const char *a = s->name, *b = name;
        while (*a && *a == *b)
            a++, b++;
        if (*a == *b)
            return s;
    }
    return NULL;
}

/* 1 when nkeys keys and nargs arguments fit script s. */
static inline int script_arity_ok(const script_info *s, int nkeys, int nargs)
{
    return nkeys >= s->keys_min && (s->keys_max < 0 || nkeys <= s->keys_max) &&
           nargs >= s->args_min && (s->args_max < 0 || nargs <= s->args_max);
}

/* The name of a listed script, as a string; does not compile for one that is not listed. */
#define SCRIPT(name) ((void)SCRIPT_ID_##name, #name)

/* Fails to compile unless the constant counts nk, na fit script name. */
#define SCRIPT_ARITY_CHECK(name, nk, na)                                                           \
    ((void)sizeof(char[((nk) >= SCRIPT_KMIN_##name &&                                              \
                        (SCRIPT_KMAX_##name < 0 || (nk) <= SCRIPT_KMAX_##name) &&                  \
                        (na) >= SCRIPT_AMIN_##name &&                                              \
                        (SCRIPT_AMAX_##name < 0 || (na) <= SCRIPT_AMAX_##name))                    \
                           ? 1                                                                     \
                           : -1]))

/* The number of elements of an array (not of a pointer). */
#define SCRIPT_COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

#endif
