/*
 * Redis Cluster hash slots: which of the 16384 slots a key lives in, and the ranges a CLUSTER
 * SLOTS reply gives.
 *
 * A key's slot is CRC16 (XMODEM) of the key mod 16384, or of its hash tag: the part between
 * the first '{' and the next '}', when that is not empty. Every key Quan uses carries a tag
 * (keys.h), so the keys a script or a command touches together share one slot. Which arguments
 * of a command are keys, and the slot of a whole command, is the command table's (rcmd.h).
 *
 * Pure functions, any thread.
 */
#ifndef QUAN_RSLOT_H
#define QUAN_RSLOT_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#define RSLOT_COUNT 16384

/* The slot of key (len bytes). */
int rslot_of_key(const char *key, size_t len);

/* One range of a CLUSTER SLOTS reply: [from, to, [host, port, id, ...], replicas...]. */
typedef struct rslot_range {
    int from, to;     /* slots, inclusive */
    const char *host; /* borrowed from the reply; "" or "?" when the node does not know its own
                         address: then it is the address of the node that answered */
    size_t hostlen;
    int port;
} rslot_range;

/* 1 and *out filled when e is such a range with slots in 0..16383 and a port in 1..65535,
 * else 0. */
int rslot_range_of(const redisReply *e, rslot_range *out);

#endif
