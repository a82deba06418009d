/*
 * The Lua scripts of one directory (lua-scripts/: name = file name without ".lua"), each with
 * its source and its SHA1, for EVALSHA by either client (redis.h, redis_sync.h) and EVAL of the
 * source when a server answers NOSCRIPT. scripts.h lists the scripts the code calls; a binary
 * checks at start that the directory holds exactly those (redis_scripts_check).
 *
 * Read-only once loaded: any number of threads may share one registry.
 */
#ifndef QUAN_REDIS_SCRIPTS_H
#define QUAN_REDIS_SCRIPTS_H

#include <stddef.h>
#include <stdint.h>

#include "scripts.h"
#include "status.h"

typedef struct redis_scripts redis_scripts;

/* One script; every field borrowed from its registry. */
typedef struct redis_script {
    char *name;
    char *source;
    size_t source_len;
    char sha1[41];
} redis_script;

/* Reads every "*.lua" of dir. Owned; free with redis_scripts_free. NULL (logged) if the
 * directory or a file cannot be read. An empty directory, or dir NULL, gives an empty registry. */
redis_scripts *redis_scripts_load_dir(const char *dir) QN_MUSTCHECK;
void redis_scripts_free(redis_scripts *s);
size_t redis_scripts_count(const redis_scripts *s);
/* Borrowed strings, valid until redis_scripts_free; NULL if i is out of range. */
const char *redis_scripts_name(const redis_scripts *s, size_t i);
/* 40 lowercase hex digits, or NULL if name is unknown. */
const char *redis_scripts_sha1(const redis_scripts *s, const char *name);
const char *redis_scripts_source(const redis_scripts *s, const char *name);
/* QN_OK when s holds exactly the scripts of scripts.h (the binaries' check at start); else
 * QN_EINVAL with the first difference in err. */
qn_status redis_scripts_check(const redis_scripts *s, char *err, size_t errlen) QN_MUSTCHECK;
/* 1 when a call of script name with these counts fits scripts.h (or name is not listed there:
 * a test's own script); else 0, logged. */
int redis_scripts_call_ok(const char *name, int nkeys, int nargs);
/* The i-th script (by name), or NULL when i is out of range. */
const redis_script *redis_scripts_at(const redis_scripts *s, size_t i);
/* The script called name, or NULL. */
const redis_script *redis_scripts_find(const redis_scripts *s, const char *name);

/* The registry's SHA1, fed in pieces, for digests of other things (the claim consumer's guard
 * key of a pack, claimq.c): init, any number of updates, then hex (40 lowercase digits and a
 * NUL), after which the context is spent. */
typedef struct redis_scripts_sha1_ctx {
    uint32_t h[5];
    unsigned char buf[64];
    size_t nbuf;
    uint64_t len;
} redis_scripts_sha1_ctx;
void redis_scripts_sha1_init(redis_scripts_sha1_ctx *x);
void redis_scripts_sha1_update(redis_scripts_sha1_ctx *x, const void *data, size_t len);
void redis_scripts_sha1_hex(redis_scripts_sha1_ctx *x, char out[41]);

#endif
