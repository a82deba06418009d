/*
 * Work gathered during one turn of the event loop and sent at its end, one call per group:
 * what a burst asks of one key (a template's claims, a set's marks) goes as one command
 * instead of one each. A confirm or a read answers many clients in one turn, so their next
 * steps arrive together; the batch costs them no waiting beyond the turn they are in.
 *
 * Items are copied in (item_size bytes each). At the end of the turn they are split into
 * groups: the first item waiting and those same() as it, in their order of arrival, at most
 * group_max; then the next group from what is left. Each group goes to send() as one array.
 * The split hashes each item's key once (hash), so it costs about one same() per item however
 * many keys a turn holds. Items added during send() make a new list, sent once this one is done.
 * Loop thread only.
 *
 *     it = turnbatch_add(b);     fill *it     ...end of the turn: send(group, n, arg)
 */
#ifndef QUAN_TURNBATCH_H
#define QUAN_TURNBATCH_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The item's key, hashed: items that are same() must hash alike. */
typedef uint64_t (*turnbatch_hash_fn)(const void *item);
/* Nonzero when items a and b go in the same group. */
typedef int (*turnbatch_same_fn)(const void *a, const void *b);
/* One group: items[0..n), 1 <= n <= group_max, valid only during the call. */
typedef void (*turnbatch_send_fn)(void *items, size_t n, void *arg);

typedef struct turnbatch turnbatch;

/* Owned by the caller; free with turnbatch_free. NULL when out of memory. */
turnbatch *turnbatch_new(struct event_base *base, size_t item_size, size_t group_max,
                         turnbatch_hash_fn hash, turnbatch_same_fn same, turnbatch_send_fn send,
                         void *arg);
/* Items not sent yet are dropped unsent: the caller says what that means for its work. */
void turnbatch_free(turnbatch *b);
/* Room for one more item, which the caller fills before the turn ends. NULL when out of
 * memory (nothing is added). */
void *turnbatch_add(turnbatch *b) QN_MUSTCHECK;

#endif
