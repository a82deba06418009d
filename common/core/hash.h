/*
 * Hashes for the in-memory tables of one process (never stored or sent, except the bloom
 * filter's positions and a user's stock bucket (bucket.h), which every process must compute
 * alike: both depend on hash_mix64 staying as it is). Header only.
 *
 *   hash_mix64(x)        splitmix64's finaliser: ids that differ in a few low bits spread over
 *                        all 64
 *   hash_fnv1a(h, p, n)  FNV-1a of n bytes, continuing from h (HASH_FNV_OFFSET to begin)
 *   hash_str(s)          FNV-1a of a string
 */
#ifndef QUAN_HASH_H
#define QUAN_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define HASH_FNV_OFFSET UINT64_C(1469598103934665603)
#define HASH_FNV_PRIME  UINT64_C(1099511628211)

static inline uint64_t hash_mix64(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static inline uint64_t hash_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * HASH_FNV_PRIME;
    return h;
}

static inline uint64_t hash_str(const char *s)
{
    return hash_fnv1a(HASH_FNV_OFFSET, s, strlen(s));
}

#endif
