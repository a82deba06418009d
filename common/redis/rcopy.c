/* Values by id with tickets, epochs and an LRU bound (rcopy.h). */
#include "rcopy.h"

#include <stdlib.h>

METRICS_DEFINE(RCOPY_METRICS)

typedef struct rcopy_entry rcopy_entry;
struct rcopy_entry {
    int64_t id;
    uint64_t gen; /* a fresh number when the entry is made: tickets compare with it; an
                   * invalidation removes the entry, so a ticket from before never matches */
    uint64_t epoch;
    int64_t stale_at_ms;
    void *value; /* NULL: a ticket's placeholder */
    rcopy_entry *hnext;
    rcopy_entry *newer, *older; /* the LRU list */
};

struct rcopy {
    rcopy_entry **buckets;
    size_t nbuckets; /* a power of two */
    size_t count, max;
    uint64_t seq;
    rcopy_entry *newest, *oldest;
    rcopy_release_fn release;
};

static size_t rcopy_bucket(const rcopy *c, int64_t id)
{
    return (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 32) & (c->nbuckets - 1);
}

static rcopy_entry *rcopy_find(const rcopy *c, int64_t id)
{
    rcopy_entry *e = c->buckets[rcopy_bucket(c, id)];
    while (e && e->id != id)
        e = e->hnext;
    return e;
}

static void rcopy_lru_unlink(rcopy *c, rcopy_entry *e)
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

static void rcopy_lru_front(rcopy *c, rcopy_entry *e)
{
    e->older = c->newest;
    e->newer = NULL;
    if (c->newest)
        c->newest->newer = e;
    c->newest = e;
    if (!c->oldest)
        c->oldest = e;
}

static void rcopy_remove(rcopy *c, rcopy_entry *e)
{
    rcopy_entry **p = &c->buckets[rcopy_bucket(c, e->id)];
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    rcopy_lru_unlink(c, e);
    c->count--;
    if (e->value)
        c->release(e->value);
    free(e);
}

rcopy *rcopy_new(size_t max_entries, rcopy_release_fn release)
{
    rcopy *c = calloc(1, sizeof(*c));
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

void rcopy_clear(rcopy *c)
{
    while (c->oldest)
        rcopy_remove(c, c->oldest);
}

void rcopy_free(rcopy *c)
{
    if (!c)
        return;
    rcopy_clear(c);
    free(c->buckets);
    free(c);
}

void *rcopy_get(rcopy *c, int64_t id, uint64_t epoch, int64_t now_ms)
{
    rcopy_entry *e = rcopy_find(c, id);
    if (!e || !e->value || !epoch || e->epoch != epoch || now_ms >= e->stale_at_ms)
        return NULL;
    rcopy_lru_unlink(c, e);
    rcopy_lru_front(c, e);
    return e->value;
}

uint64_t rcopy_ticket(rcopy *c, int64_t id)
{
    rcopy_entry *e = rcopy_find(c, id);
    if (e)
        return e->gen;
    e = calloc(1, sizeof(*e));
    if (!e)
        return 0;
    e->id = id;
    e->gen = ++c->seq;
    size_t b = rcopy_bucket(c, id);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    rcopy_lru_front(c, e);
    c->count++;
    while (c->count > c->max && c->oldest != e)
        rcopy_remove(c, c->oldest);
    return e->gen;
}

void rcopy_put(rcopy *c, int64_t id, uint64_t ticket, uint64_t epoch, int64_t stale_at_ms,
               void *value)
{
    rcopy_entry *e = rcopy_find(c, id);
    if (!e || !ticket || e->gen != ticket || !epoch) {
        c->release(value);
        return;
    }
    if (e->value)
        c->release(e->value);
    e->value = value;
    e->epoch = epoch;
    e->stale_at_ms = stale_at_ms;
    /* gen stays: another read of the key in flight since the same ticket may put too. */
    rcopy_lru_unlink(c, e);
    rcopy_lru_front(c, e);
}

void rcopy_invalidate(rcopy *c, int64_t id)
{
    rcopy_entry *e = rcopy_find(c, id);
    if (e)
        rcopy_remove(c, e);
}

size_t rcopy_count(const rcopy *c)
{
    return c->count;
}
