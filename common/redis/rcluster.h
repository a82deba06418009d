/*
 * What both Redis clients know of a Redis Cluster, and decide from it, without any I/O: the
 * nodes seen (addresses), the slot map read from CLUSTER SLOTS, and what an error reply asks
 * for (MOVED, ASK, try again later). The asynchronous client (redis.h) and the blocking one
 * (redis_sync.h) each keep their connections beside a map, one per node index, and differ only
 * in how they wait.
 *
 * Nodes are never removed before the map is freed, so a node's index stays valid across map
 * changes (a slot map, or a command waiting for its reply, may hold it); a node that leaves the
 * map only stops being a master. A client learns of each node as it is added (new_node), before
 * any slot points at it, so that its connections array always covers the map.
 *
 * One thread at a time (the client's own).
 */
#ifndef QUAN_RCLUSTER_H
#define QUAN_RCLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "rslot.h"
#include "status.h"

#define RCLUSTER_HOST_MAX 256

typedef struct rcluster_addr {
    char host[RCLUSTER_HOST_MAX];
    int port;
} rcluster_addr;

/*
 * "host:port" in len bytes of s into *a; 1 when it is one. strict (configuration): "[v6]:port"
 * for an IPv6 host, never a bare one, and no empty host. Not strict (a redirect's "ip:port"):
 * the last colon splits, and an empty ip means the node that answered.
 */
int rcluster_addr_parse(const char *s, size_t len, rcluster_addr *a, int strict);

/* A comma-separated list of strict addresses (blanks around each allowed) into out (max of
 * them; out NULL: only counted). The count, or -1 with err set naming the bad entry. */
int rcluster_addrs_parse(const char *list, rcluster_addr *out, int max, char *err, size_t errlen);

typedef enum {
    RCLUSTER_FINAL = 0, /* the reply is the command's answer */
    RCLUSTER_MOVED,     /* the slot lives at *to now: send there, and remember it */
    RCLUSTER_ASK,       /* send once to *to, after ASKING (a slot being migrated) */
    RCLUSTER_RETRY      /* TRYAGAIN, CLUSTERDOWN, LOADING: the same node later, a new map first */
} rcluster_verdict;

/* What reply r asks of the command that got it; MOVED and ASK fill *slot and *to (to->host ""
 * when the reply did not say: the node that answered). */
rcluster_verdict rcluster_verdict_of(const redisReply *r, int *slot, rcluster_addr *to);

/* Called when a node is added (its index is the next one): 0, or -1 to refuse (then it is not
 * added, and what wanted it fails). */
typedef int (*rcluster_new_node_fn)(void *ctx, int node, const rcluster_addr *a);

typedef struct rcluster_map {
    rcluster_addr *addr; /* by node index */
    int *first_slot;     /* lowest slot each node serves; RSLOT_COUNT: not a master */
    int *masters;        /* the node indices of the map's masters, by first slot */
    size_t cap_addr, cap_first_slot, cap_masters;
    int nnodes, maxnodes, nmasters;
    int16_t *slot;          /* the master of each slot (a node index), -1 none; NULL
                               until the first map (a client of one server has none) */
    int have_map;           /* a CLUSTER SLOTS reply was applied */
    int complete;           /* every slot has a master */
    unsigned long topology; /* bumps whenever a slot changes master */
    rcluster_new_node_fn new_node;
    void *ctx;
} rcluster_map;

/* An empty map of at most maxnodes nodes; new_node may be NULL. Owns what it allocates: free
 * with rcluster_map_free (the struct itself is the caller's). */
void rcluster_map_init(rcluster_map *m, int maxnodes, rcluster_new_node_fn new_node, void *ctx);
void rcluster_map_free(rcluster_map *m);

/* The index of the node at a, or -1. */
int rcluster_map_find(const rcluster_map *m, const rcluster_addr *a);

/* The index of the node at a, added (new_node told) when new; -1 when the map is full, memory
 * is short or new_node refused (err says which). */
int rcluster_map_node(rcluster_map *m, const rcluster_addr *a, char *err, size_t errlen);

/*
 * A CLUSTER SLOTS reply (Redis 7: [from, to, [ip, port, id, ...], replicas...]) as the map;
 * from: the node that answered (an empty or "?" ip is its own address). QN_OK: the map is the
 * reply's (topology bumped when a slot moved); else err is set and the map is what it was.
 */
qn_status rcluster_map_apply(rcluster_map *m, const redisReply *r, const rcluster_addr *from,
                             char *err, size_t errlen) QN_MUSTCHECK;

/* A MOVED reply's news: slot's master is node now (the rest waits for the next map). */
void rcluster_map_moved(rcluster_map *m, int slot, int node);

/* The node index of slot's master, or -1 (none, or no map yet). */
int rcluster_map_master(const rcluster_map *m, int slot);

/* 1 when node serves slots in the current map. */
int rcluster_map_is_master(const rcluster_map *m, int node);

#endif
