/* A loop turn's work, sent by group at its end (turnbatch.h). */
#include "turnbatch.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct turnbatch {
    struct event *due; /* made active by the turn's first item */
    size_t item_size, group_max;
    turnbatch_same_fn same;
    turnbatch_send_fn send;
    void *arg;
    unsigned char *items; /* waiting, in order of arrival */
    size_t n, cap;
    unsigned char *group; /* [group_max]: the group being sent */
};

static void turnbatch_on_due(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    turnbatch *b = arg;
    size_t size = b->item_size, n = b->n, cap = b->cap;
    unsigned char *all = b->items;
    b->items = NULL; /* what send() adds makes a new list */
    b->n = b->cap = 0;
    while (n > 0) {
        /* One pass: this group into b->group, the rest to the front of all, both in order. */
        size_t m = 0, rest = 0;
        for (size_t i = 0; i < n; i++) {
            const unsigned char *it = all + i * size;
            if (m == 0 || (m < b->group_max && b->same(b->group, it)))
                memcpy(b->group + m++ * size, it, size);
            else
                memmove(all + rest++ * size, it, size);
        }
        n = rest;
        b->send(b->group, m, b->arg);
    }
    if (!b->items) { /* nothing came during the sends: the list is kept for the next turn */
        b->items = all;
        b->cap = cap;
    } else {
        free(all);
    }
}

turnbatch *turnbatch_new(struct event_base *base, size_t item_size, size_t group_max,
                         turnbatch_same_fn same, turnbatch_send_fn send, void *arg)
{
    turnbatch *b = calloc(1, sizeof(*b));
    if (!b || item_size == 0 || group_max == 0 || group_max > (size_t)-1 / item_size)
        goto fail;
    b->item_size = item_size;
    b->group_max = group_max;
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
