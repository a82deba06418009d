/*
 * Redis access for Quan.
 *
 * - redis_client: asynchronous hiredis connections attached to a libevent loop: one to a
 *   single server, or one per node of a Redis Cluster. Each reconnects with backoff (100 ms
 *   doubling to 2 s); the client fails commands fast while disconnected, enforces a
 *   per-command timeout itself (hiredis 0.14 has none: an overdue reply drops the connection,
 *   failing everything pending on it, and a reconnect follows), and calls every callback
 *   exactly once, never from inside the call that issued the command.
 * - In cluster mode (redis_opts.cluster_nodes: some of its nodes) it keeps the slot map (CLUSTER
 *   SLOTS, asked again every 2 s, and soon after a redirect or a lost master) and sends each
 *   command to the master of its key's slot. Commands without a key go to any connected
 *   master. Commands in flight at once are pipelined per node by hiredis. The scripts are loaded
 *   on every master, and on a replica as soon as it is promoted.
 * - What becomes of a command is the rule both clients share (rcmd.h, rcmd_decide): MOVED and
 *   ASK followed (at most RCMD_HOPS_MAX hops; ASK with ASKING, for that command alone);
 *   TRYAGAIN, CLUSTERDOWN, LOADING, a slot without a master and a master not connected waited
 *   out (20 ms doubling to 200 ms) within the command's timeout; after a lost connection a
 *   read-only command is sent again, while one that may have run (a write, any script) never
 *   is: it fails, its outcome unknown, and the caller is told so. On one server nothing is
 *   resent or waited for. A command whose keys lie in two slots is never sent, on one server
 *   too, so that every suite catches what a cluster would refuse (it fails with "CROSSSLOT
 *   ...", and an error is logged); MULTI, EXEC, DISCARD, WATCH and UNWATCH are refused on a
 *   cluster (a script does several things atomically). redis_command_node follows the
 *   one-server rule on its node.
 * - In a Sentinel deployment (redis_opts.sentinels and master_name) the one server is the master
 *   the sentinels name (rsentinel.h), asked before every connect, on the loop without blocking
 *   it (commands fail meanwhile as while disconnected), and confirmed by ROLE after it; the
 *   client connects anew when a write is refused with -READONLY and when the sentinels announce
 *   a new master (+switch-master, watched on one sentinel at a time), so it follows a failover
 *   within about a second of the election. Its node 0 is wherever the master is now.
 * - Scripts come from a registry (redis_scripts.h). The client SCRIPT LOADs them after every
 *   (re)connect and is ready only when all are loaded; redis_eval (and redis_sync_run_script)
 *   call EVALSHA and fall back to EVAL of the source on NOSCRIPT.
 *
 * The blocking client of worker threads, consumers and tools is common/redis/redis_sync.h.
 *
 * All functions of redis_client must be called on the loop thread.
 */
#ifndef QUAN_REDIS_H
#define QUAN_REDIS_H

#include <stddef.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>

#include "rcmd.h"
#include "redis_scripts.h"
#include "status.h"

typedef struct redis_client redis_client;

/* ---------------------------------------------------------------- asynchronous client */

/* The options (rcmd.h: one struct for both clients). */
typedef rcmd_opts redis_opts;

/*
 * Called exactly once per accepted command, on the loop thread.
 * reply: borrowed (freed when the callback returns); NULL when the command failed without a
 *        reply (disconnected, timeout, client freed).
 * err:   NULL on success; otherwise why: the error reply's text when reply is an error reply
 *        (REDIS_REPLY_ERROR), or a description like "timeout", "not connected".
 */
typedef void (*redis_cb)(redis_client *c, const redisReply *reply, const char *err, void *arg);

/* Owned; free with redis_client_free. Starts connecting at once. NULL (logged) if the Lua
 * directory cannot be read or on allocation failure. The base is borrowed. */
redis_client *redis_client_new(struct event_base *base, const redis_opts *opts) QN_MUSTCHECK;
/* Fails every pending callback with "client closed" (inside this call), then frees. Must not
 * be called from inside a redis_cb. NULL is a no-op. */
void redis_client_free(redis_client *c);

/* Connected (and authenticated, if a password is set); in cluster mode: the slot map covers
 * every slot and every master in it is connected. */
int redis_client_connected(const redis_client *c);
/* Connected AND every script of the registry loaded on this connection (on every master):
 * for /readyz. */
int redis_client_ready(const redis_client *c);
/* redis_client_ready as last set on the loop thread, readable from any thread. */
int redis_client_up(const redis_client *c);
/* Borrowed, valid until redis_client_free; never NULL (may be empty). */
const redis_scripts *redis_client_scripts(const redis_client *c);
/* The loop the client runs on (borrowed). */
struct event_base *redis_client_base(const redis_client *c);
/* Connections made so far (1 after the first connect), plus, in cluster mode, the changes of
 * the slot map: it moves whenever what a caller checked on "the server" may no longer hold. */
unsigned long redis_client_connects(const redis_client *c);

/* The nodes, for what must be done on each server (CLIENT TRACKING per connection, the run id
 * of every master). Numbers 0..count-1, stable for the client's life (nodes are added, never
 * removed); one node (0) when not in cluster mode. Loop thread. */
int redis_client_cluster(const redis_client *c);
int redis_client_node_count(const redis_client *c);
/* It serves slots in the current map (single mode: node 0 always). */
int redis_client_node_master(const redis_client *c, int node);
int redis_client_node_connected(const redis_client *c, int node);
/* Connections the node has made so far. */
unsigned long redis_client_node_connects(const redis_client *c, int node);
/* Borrowed, valid until redis_client_free. */
const char *redis_client_node_host(const redis_client *c, int node);
int redis_client_node_port(const redis_client *c, int node);
/* The first slot a master serves (0 in single mode), -1 for a node that is no master: orders
 * the masters the same way in every process. */
int redis_client_node_first_slot(const redis_client *c, int node);
/* Bumps whenever the slot map changes (0 in single mode). */
unsigned long redis_client_topology(const redis_client *c);

/*
 * QN_OK: cb will be called exactly once, later (on failure too, e.g. when disconnected).
 * Anything else (QN_ENOMEM, QN_EINVAL): cb will not be called.
 * fmt is hiredis' format (%s, %d, %lld, %b = pointer + size_t); not printf-checked.
 */
qn_status redis_command(redis_client *c, redis_cb cb, void *arg, const char *fmt, ...) QN_MUSTCHECK;
/* As redis_command, to one node (no redirect is followed: for keyless commands that must run on
 * that server). */
qn_status redis_command_node(redis_client *c, int node, redis_cb cb, void *arg, const char *fmt,
                             ...) QN_MUSTCHECK;
/* argvlen may be NULL (then strlen of each argument). Arguments are copied before return. */
qn_status redis_command_argv(redis_client *c, redis_cb cb, void *arg, int argc, const char **argv,
                             const size_t *argvlen) QN_MUSTCHECK;
/*
 * EVALSHA of the script called name with nkeys keys and nargs arguments (all copied before
 * return). On a NOSCRIPT error reply it re-sends EVAL with the source once and reports that
 * reply instead. Same callback contract as redis_command; an unknown name is reported to cb
 * as an error ("unknown script").
 */
qn_status redis_eval(redis_client *c, const char *name, int nkeys, const char **keys, int nargs,
                     const char **args, redis_cb cb, void *arg) QN_MUSTCHECK;

/* redis_eval of a script of scripts.h: the name must be listed (else it does not compile), and
 * the counts of the arrays keys and args must fit it (checked at compile time). _N: counts
 * known only on the call, checked then (a misfit is refused, logged, before anything is sent:
 * QN_EINVAL). */
#define REDIS_EVAL(c, name, keys, args, cb, arg)                                                   \
    (SCRIPT_ARITY_CHECK(name, SCRIPT_COUNT_OF(keys), SCRIPT_COUNT_OF(args)),                       \
     redis_eval((c), SCRIPT(name), SCRIPT_COUNT_OF(keys), (keys), SCRIPT_COUNT_OF(args), (args),   \
                (cb), (arg)))
#define REDIS_EVAL_N(c, name, nkeys, keys, nargs, args, cb, arg)                                   \
    redis_eval((c), SCRIPT(name), (nkeys), (keys), (nargs), (args), (cb), (arg))

#endif
