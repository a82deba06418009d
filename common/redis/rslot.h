/*
 * Redis Cluster hash slots: which of the 16384 slots a key lives in, and which slot a whole
 * command goes to.
 *
 * A key's slot is CRC16 (XMODEM) of the key mod 16384, or of its hash tag: the part between
 * the first '{' and the next '}', when that is not empty. Every key Quan uses carries a tag
 * (keys.h), so the keys a script or a command touches together share one slot.
 *
 * A command's keys are found by its name (a table of the multi-key and keyless commands; any
 * other command's key is its first argument). A command whose keys lie in two slots can never
 * be sent to a cluster: rslot_of_command says so, and the clients refuse it.
 *
 * Pure functions, any thread.
 */
#ifndef QUAN_RSLOT_H
#define QUAN_RSLOT_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#define RSLOT_COUNT 16384

/* rslot_of_command's answers besides a slot (0..16383). */
#define RSLOT_NONE  -1 /* the command has no key: any node answers it (PING, INFO, SCRIPT) */
#define RSLOT_CROSS -2 /* its keys lie in two slots or more: a programming error */

/* The slot of key (len bytes). */
int rslot_of_key(const char *key, size_t len);

/* The slot of the command argv (argvlen: each argument's length), RSLOT_NONE or RSLOT_CROSS.
 * A malformed EVAL/EVALSHA (numkeys not a number, or more keys than arguments) is RSLOT_CROSS:
 * it too must not be sent. */
int rslot_of_command(int argc, const char *const *argv, const size_t *argvlen);

/* Splits a RESP request (an array of bulk strings, as hiredis formats a command) into argv and
 * argvlen, pointing into cmd (nothing is copied): at most max arguments. The number of
 * arguments, or -1 when cmd is not such a request or has more than max. */
int rslot_parse_request(const char *cmd, size_t len, const char **argv, size_t *argvlen, int max);

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
