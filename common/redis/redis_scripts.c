/* The Lua script registry (see redis_scripts.h). */
#include "redis_scripts.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define REDIS_SCRIPTS_MAX_BYTES (1 << 20)

/* SHA1 (FIPS 180-1), for EVALSHA: computed here so that a registry is usable before, or
 * without, SCRIPT LOAD, e.g. by consumer threads with their own synchronous connection. Not
 * OpenSSL's: its one-shot digest loads OpenSSL's provider machinery on first use, about 2.4 MB
 * resident in every process, most of which never touch OpenSSL otherwise; these 60 lines cost
 * nothing, and test_redis checks them against the server's own SCRIPT LOAD answers. Exported
 * (redis_scripts.h) for digests of other things. */
static uint32_t sha1_rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

static void sha1_block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = sha1_rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5A827999;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ED9EBA1;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8F1BBCDC;
        } else {
            f = b ^ c ^ d;
            k = 0xCA62C1D6;
        }
        uint32_t t = sha1_rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = sha1_rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void redis_scripts_sha1_init(redis_scripts_sha1_ctx *x)
{
    static const uint32_t h0[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    memcpy(x->h, h0, sizeof(h0));
    x->nbuf = 0;
    x->len = 0;
}

void redis_scripts_sha1_update(redis_scripts_sha1_ctx *x, const void *data, size_t len)
{
    const unsigned char *p = data;
    if (len == 0)
        return;
    x->len += len;
    if (x->nbuf > 0) {
        size_t k = 64 - x->nbuf < len ? 64 - x->nbuf : len;
        memcpy(x->buf + x->nbuf, p, k);
        x->nbuf += k;
        p += k;
        len -= k;
        if (x->nbuf < 64)
            return;
        sha1_block(x->h, x->buf);
        x->nbuf = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        sha1_block(x->h, p);
    memcpy(x->buf, p, len);
    x->nbuf = len;
}

void redis_scripts_sha1_hex(redis_scripts_sha1_ctx *x, char out[41])
{
    unsigned char tail[128] = {0};
    size_t rest = x->nbuf, tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = x->len * 8;

    memcpy(tail, x->buf, rest);
    tail[rest] = 0x80;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha1_block(x->h, tail);
    if (tail_len == 128)
        sha1_block(x->h, tail + 64);
    for (int i = 0; i < 5; i++)
        snprintf(out + 8 * i, 9, "%08x", x->h[i]);
}

static void sha1_hex(const char *data, size_t len, char out[41])
{
    redis_scripts_sha1_ctx x;
    redis_scripts_sha1_init(&x);
    redis_scripts_sha1_update(&x, data, len);
    redis_scripts_sha1_hex(&x, out);
}

struct redis_scripts {
    redis_script *v;
    size_t n;
};

static int scripts_is_lua(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return d->d_name[0] != '.' && len > 4 && strcmp(d->d_name + len - 4, ".lua") == 0;
}

static char *scripts_read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0;

    if (!f)
        goto fail;
    buf = malloc(REDIS_SCRIPTS_MAX_BYTES + 1);
    if (!buf)
        goto fail;
    len = fread(buf, 1, REDIS_SCRIPTS_MAX_BYTES + 1, f);
    if (ferror(f) || len > REDIS_SCRIPTS_MAX_BYTES)
        goto fail;
    buf[len] = '\0';
    fclose(f);
    /* Kept for the process's life, once per loader: a 1 MiB buffer per script would hold
     * megabytes of address space (and of "in use" heap in malloc_stats and heap profilers). */
    char *fit = realloc(buf, len + 1);
    if (fit)
        buf = fit;
    *len_out = len;
    return buf;
fail:
    if (f)
        fclose(f);
    free(buf);
    return NULL;
}

redis_scripts *redis_scripts_load_dir(const char *dir)
{
    struct dirent **ents = NULL;
    int nents = -1;
    redis_scripts *s = calloc(1, sizeof(*s));

    if (!s)
        goto fail;
    if (!dir)
        return s; /* no scripts */
    nents = scandir(dir, &ents, scripts_is_lua, alphasort);
    if (nents < 0) {
        log_error(NULL, "redis: cannot read the Lua directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    if (nents > 0) {
        s->v = calloc((size_t)nents, sizeof(*s->v));
        if (!s->v)
            goto fail;
    }
    for (int i = 0; i < nents; i++) {
        redis_script *sc = &s->v[s->n];
        const char *fname = ents[i]->d_name;
        char *path = NULL;

        if (asprintf(&path, "%s/%s", dir, fname) < 0)
            goto fail;
        sc->source = scripts_read_file(path, &sc->source_len);
        if (!sc->source) {
            log_error(NULL, "redis: cannot read the Lua script %s", path);
            free(path);
            goto fail;
        }
        free(path);
        sc->name = strndup(fname, strlen(fname) - 4);
        if (!sc->name) {
            free(sc->source);
            goto fail;
        }
        sha1_hex(sc->source, sc->source_len, sc->sha1);
        s->n++;
    }
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
    return s;
fail:
    for (int i = 0; i < nents; i++)
        free(ents[i]);
    free(ents);
    redis_scripts_free(s);
    return NULL;
}

void redis_scripts_free(redis_scripts *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].name);
        free(s->v[i].source);
    }
    free(s->v);
    free(s);
}

size_t redis_scripts_count(const redis_scripts *s)
{
    return s ? s->n : 0;
}

const redis_script *redis_scripts_at(const redis_scripts *s, size_t i)
{
    return s && i < s->n ? &s->v[i] : NULL;
}

const char *redis_scripts_name(const redis_scripts *s, size_t i)
{
    return s && i < s->n ? s->v[i].name : NULL;
}

const redis_script *redis_scripts_find(const redis_scripts *s, const char *name)
{
    for (size_t i = 0; s && name && i < s->n; i++)
        if (strcmp(s->v[i].name, name) == 0)
            return &s->v[i];
    return NULL;
}

const char *redis_scripts_sha1(const redis_scripts *s, const char *name)
{
    const redis_script *sc = redis_scripts_find(s, name);
    return sc ? sc->sha1 : NULL;
}

const char *redis_scripts_source(const redis_scripts *s, const char *name)
{
    const redis_script *sc = redis_scripts_find(s, name);
    return sc ? sc->source : NULL;
}

qn_status redis_scripts_check(const redis_scripts *s, char *err, size_t errlen)
{
    for (int i = 0; i < SCRIPTS_COUNT; i++)
        if (!redis_scripts_find(s, script_of((script_id)i)->name)) {
            qn_errf(err, errlen, "the Lua script %s.lua is missing", script_of((script_id)i)->name);
            return QN_EINVAL;
        }
    for (size_t i = 0; s && i < s->n; i++)
        if (!script_named(s->v[i].name)) {
            qn_errf(err, errlen, "the Lua script %s.lua is not listed in common/redis/scripts.h",
                    s->v[i].name);
            return QN_EINVAL;
        }
    return QN_OK;
}

int redis_scripts_call_ok(const char *name, int nkeys, int nargs)
{
    const script_info *si = script_named(name);
    if (!si || script_arity_ok(si, nkeys, nargs))
        return 1;
    log_error(NULL, "redis: %s.lua called with %d keys and %d arguments (scripts.h): not sent",
              name, nkeys, nargs);
    return 0;
}
