/*
 * The one growing array: room for `need` elements of `size` bytes in *v, its capacity doubled
 * (from `first`) until it holds them. The pattern every appender needs, written once.
 *
 *     if (grow(&r->items, &r->cap, r->n + 1, sizeof(*r->items), 64) != QN_OK)
 *         return QN_ENOMEM;
 *     r->items[r->n++] = item;
 *
 * On failure *v and *cap are as they were (nothing lost). Header only.
 */
#ifndef QUAN_GROW_H
#define QUAN_GROW_H

#include <stdlib.h>
#include <string.h>

#include "status.h"

/* vp: the address of the array's pointer (any element type). */
static inline qn_status grow(void *vp, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return QN_OK;
    size_t c = *cap ? *cap : (first ? first : 1);
    while (c < need) {
        if (c > (size_t)-1 / 2)
            return QN_ENOMEM;
        c *= 2;
    }
    void *old, *n;
    memcpy(&old, vp, sizeof(old)); /* vp may point at any object pointer type */
    if (c > (size_t)-1 / size || !(n = realloc(old, c * size)))
        return QN_ENOMEM;
    memcpy(vp, &n, sizeof(n));
    *cap = c;
    return QN_OK;
}

#endif
