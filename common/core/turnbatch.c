/* A loop turn's work, sent by group at its end (turnbatch.h). */
#include "turnbatch.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

#define TB_NONE SIZE_MAX

/* One key's items of the turn: a chain through next[], in order of arrival. */
typedef struct tb_chain {
    size_t first, last, count;
    uint64_t hash;
} tb_chain;

struct turnbatch {
    struct event *due; /* made active by the turn's first item */
    size_t item_size, group_max;
    turnbatch_hash_fn hash;
    turnbatch_same_fn same;
    turnbatch_send_fn send;
    void *arg;
    unsigned char *items; /* waiting, in order of arrival */
    size_t n, cap;
    unsigned char *group; /* [group_max]: the group being sent */
    /* The split's scratch, kept for the next turns: */
    size_t *next, next_cap; /* [n]: the next item of the same key, or TB_NONE */
    unsigned char *starts;  /* [n]: 1 when the item begins a group */
    size_t starts_cap;
    tb_chain *chains; /* [at most n]: the keys, in order of first arrival */
    size_t chains_cap;
    size_t *slots, slots_cap; /* open addressing: chain index + 1, 0 = empty */
};

/* Chains the n items by key: one hash probe each, same() only against the chains whose hash
 * matches, so a turn of k keys costs about n calls, not n x k. QN_ENOMEM leaves nothing built. */
static qn_status turnbatch_chain(turnbatch *b, const unsigned char *all, size_t n)
{
    size_t nslots = 16;
    while (nslots < 2 * n)
        nslots *= 2;
    if (grow(&b->next, &b->next_cap, n, sizeof(*b->next), 64) != QN_OK ||
        grow(&b->starts, &b->starts_cap, n, 1, 64) != QN_OK ||
        grow(&b->chains, &b->chains_cap, n, sizeof(*b->chains), 64) != QN_OK ||
        grow(&b->slots, &b->slots_cap, nslots, sizeof(*b->slots), 64) != QN_OK)
        return QN_ENOMEM;
    memset(b->slots, 0, nslots * sizeof(*b->slots));
    size_t nchains = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *it = all + i * b->item_size;
        uint64_t h = b->hash(it);
        size_t s = (size_t)h & (nslots - 1);
        tb_chain *c = NULL;
        for (; b->slots[s]; s = (s + 1) & (nslots - 1)) {
            tb_chain *x = &b->chains[b->slots[s] - 1];
            if (x->hash == h && b->same(all + x->first * b->item_size, it)) {
                c = x;
                break;
            }
        }
        if (!c) {
            c = &b->chains[nchains++];
            *c = (tb_chain){.first = i, .last = i, .count = 0, .hash = h};
            b->slots[s] = nchains;
        } else {
            b->next[c->last] = i;
            c->last = i;
        }
        b->next[i] = TB_NONE;
        b->starts[i] = c->count++ % b->group_max == 0;
    }
    return QN_OK;
}

static void turnbatch_on_due(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    turnbatch *b = arg;
    size_t size = b->item_size, n = b->n, cap = b->cap;
    unsigned char *all = b->items;
    b->items = NULL; /* what send() adds makes a new list */
    b->n = b->cap = 0;
    if (turnbatch_chain(b, all, n) == QN_OK) {
        /* A group is a key's next group_max items; groups go in order of their first item, as
         * if each were taken in turn from the front of what is left. */
        for (size_t i = 0; i < n; i++) {
            if (!b->starts[i])
                continue;
            size_t m = 0;
            for (size_t j = i; j != TB_NONE && m < b->group_max; j = b->next[j])
                memcpy(b->group + m++ * size, all + j * size, size);
            b->send(b->group, m, b->arg);
        }
    } else {
        for (size_t i = 0; i < n; i++) /* no memory to split: one at a time, in order */
            b->send(all + i * size, 1, b->arg);
    }
    if (!b->items) { /* nothing came during the sends: the list is kept for the next turn */
        b->items = all;
        b->cap = cap;
    } else {
        free(all);
    }
}

turnbatch *turnbatch_new(struct event_base *base, size_t item_size, size_t group_max,
                         turnbatch_hash_fn hash, turnbatch_same_fn same, turnbatch_send_fn send,
                         void *arg)
{
    turnbatch *b = calloc(1, sizeof(*b));
    if (!b || item_size == 0 || group_max == 0 || group_max > (size_t)-1 / item_size)
        goto fail;
    b->item_size = item_size;
    b->group_max = group_max;
    b->hash = hash;
    b->same = same;
    b->send = send;
    b->arg = arg;
    if (!(b->group = malloc(group_max * item_size)) ||
        !(b->due = event_new(base, -1, 0, turnbatch_on_due, b)))
        goto fail;
    return b;
fail:
    turnbatch_free(b);
    return NULL;
}

void turnbatch_free(turnbatch *b)
{
    if (!b)
        return;
    if (b->due)
        event_free(b->due);
    free(b->items);
    free(b->group);
    free(b->next);
    free(b->starts);
    free(b->chains);
    free(b->slots);
    free(b);
}

void *turnbatch_add(turnbatch *b)
{
    if (grow(&b->items, &b->cap, b->n + 1, b->item_size, 64) != QN_OK)
        return NULL;
    if (b->n == 0)
        event_active(b->due, EV_TIMEOUT, 0);
    return b->items + b->n++ * b->item_size;
}
