/* Values by id with tickets, epochs and an LRU bound (cq_cache.h). */
#include "cq_cache.h"

#include <stdlib.h>

typedef struct cq_entry_ cq_entry_;
struct cq_entry_ {
    int64_t id;
    uint64_t gen; /* a fresh number at creation and at every put: tickets compare with it */
    uint64_t epoch;
    int64_t stale_at_ms;
    void *value; /* NULL: a ticket's placeholder */
    cq_entry_ *hnext;
    cq_entry_ *newer, *older; /* the LRU list */
};

struct cq_cache {
    cq_entry_ **buckets;
    size_t nbuckets; /* a power of two */
    size_t count, max;
    uint64_t seq;
    cq_entry_ *newest, *oldest;
    cq_cache_release_fn release;
};

static size_t cq_bucket(const cq_cache *c, int64_t id)
{
    return (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 32) & (c->nbuckets - 1);
}

static cq_entry_ *cq_find(const cq_cache *c, int64_t id)
{
    cq_entry_ *e = c->buckets[cq_bucket(c, id)];
    while (e && e->id != id)
        e = e->hnext;
    return e;
}

static void cq_lru_unlink(cq_cache *c, cq_entry_ *e)
{
    if (e->newer)
        e->newer->older = e->older;
    else
        c->newest = e->older;
    if (e->older)
        e->older->newer = e->newer;
    else
        c->oldest = e->newer;
    e->newer = e->older = NULL;
}

static void cq_lru_front(cq_cache *c, cq_entry_ *e)
{
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest)
        c->newest->newer = e;
    c->newest = e;
    if (!c->oldest)
        c->oldest = e;
}

static void cq_remove(cq_cache *c, cq_entry_ *e)
{
    cq_entry_ **p = &c->buckets[cq_bucket(c, e->id)];
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    cq_lru_unlink(c, e);
    c->count--;
    if (e->value)
        c->release(e->value);
    free(e);
}

cq_cache *cq_cache_new(size_t max_entries, cq_cache_release_fn release)
{
    cq_cache *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->max = max_entries ? max_entries : 1;
    c->release = release;
    c->nbuckets = 16;
    while (c->nbuckets < c->max)
        c->nbuckets <<= 1;
    c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    return c;
}

void cq_cache_clear(cq_cache *c)
{
    while (c->oldest)
        cq_remove(c, c->oldest);
}

void cq_cache_free(cq_cache *c)
{
    if (!c)
        return;
    cq_cache_clear(c);
    free(c->buckets);
    free(c);
}

void *cq_cache_get(cq_cache *c, int64_t id, uint64_t epoch, int64_t now_ms)
{
    cq_entry_ *e = cq_find(c, id);
    if (!e || !e->value || !epoch || e->epoch != epoch || now_ms >= e->stale_at_ms)
        return NULL;
    cq_lru_unlink(c, e);
    cq_lru_front(c, e);
    return e->value;
}

uint64_t cq_cache_ticket(cq_cache *c, int64_t id)
{
    cq_entry_ *e = cq_find(c, id);
    if (e)
        return e->gen;
    e = calloc(1, sizeof(*e));
    if (!e)
        return 0;
    e->id = id;
    e->gen = ++c->seq;
    size_t b = cq_bucket(c, id);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    cq_lru_front(c, e);
    c->count++;
    while (c->count > c->max && c->oldest != e)
        cq_remove(c, c->oldest);
    return e->gen;
}

void cq_cache_put(cq_cache *c, int64_t id, uint64_t ticket, uint64_t epoch, int64_t stale_at_ms,
                  void *value)
{
    cq_entry_ *e = cq_find(c, id);
    if (!e || !ticket || e->gen != ticket || !epoch) {
        c->release(value);
        return;
    }
    if (e->value)
        c->release(e->value);
    e->value = value;
    e->epoch = epoch;
    e->stale_at_ms = stale_at_ms;
    /* Another put with the same ticket stays allowed (two misses of one key in flight), and an
     * invalidation still removes the entry: only the number moves on. */
    cq_lru_unlink(c, e);
    cq_lru_front(c, e);
}

void cq_cache_invalidate(cq_cache *c, int64_t id)
{
    cq_entry_ *e = cq_find(c, id);
    if (e)
        cq_remove(c, e);
}

size_t cq_cache_count(const cq_cache *c)
{
    return c->count;
}
