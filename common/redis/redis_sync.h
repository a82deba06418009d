/*
 * The blocking Redis client of worker threads, consumers and tools (never the event loop), for
 * one Redis server or a Redis Cluster.
 *
 * Single node (cluster_nodes empty): one connection, made on first use and made again on the
 * call after it broke, as a bare hiredis context used that way. Nothing is ever resent.
 *
 * Sentinel (sentinels and master_name set): one connection as for a single node, to the master
 * the sentinels name (rsentinel.h), confirmed by ROLE; made again, asking them again, after it
 * broke, after a write was refused with -READONLY, and after a watch of this process saw the
 * sentinels switch the master (rsentinel_switches; the event loop's client runs one).
 *
 * Cluster (cluster_nodes = startup nodes "host:port,host:port"): the slot map comes from CLUSTER
 * SLOTS (the startup nodes in turn, then the masters known), each master gets one connection,
 * opened on first use (connect and I/O timeouts, AUTH), and each command goes to the master of its
 * slot (the command table's, rcmd.h; a keyless one to the first master). What then becomes of
 * it is the rule both clients share (rcmd_decide), within the call's budget
 * (command_timeout_ms), the waits slept here:
 *
 *   MOVED slot addr       the slot is moved in the map (and the whole map read again, at most
 *                         every 100 ms), the command sent to addr; at most RCMD_HOPS_MAX
 *                         redirects, then that reply is the answer
 *   ASK slot addr         ASKING and the command on addr, for this command only (a hop too)
 *   TRYAGAIN, CLUSTERDOWN, LOADING
 *                         resent after a short sleep (20 ms doubling to 200 ms) while the
 *                         budget lasts; then that error reply is the answer
 *   a connection error    the map is read again; the command is resent only when nothing of it
 *                         was written (the connect failed, or the connection was found dead
 *                         before writing) or it only reads. A command that may have run (INCR,
 *                         a claim script) never runs twice: the caller gets the failure ("...
 *                         its outcome is unknown"), which it already treats as "try again
 *                         later".
 *
 * In both modes a command whose keys lie in two hash slots is never sent: it fails with
 * "CROSSSLOT ..." (and the command's name is logged), so the single-node test suites catch what
 * a cluster would refuse. In cluster mode MULTI, EXEC, DISCARD, WATCH and UNWATCH are refused as
 * well (a script is how Quan does several things atomically). redis_sync_node_command follows
 * the one-server rule on its node.
 *
 * Pipelines: append N commands, then get_reply N times; the replies come in the order of the
 * appends. In cluster mode the appended commands are queued and, at the first get_reply, sent
 * to their nodes (one write per node), all replies read back, and a redirect of any one of them
 * followed for that command alone. Appending never fails by itself: a command that cannot be
 * sent (CROSSSLOT, out of memory, no connection) keeps its place and its get_reply fails.
 * A plain or node command while replies are unread sends what is appended and drops those
 * replies (redis_sync_discard does the same on its own).
 *
 * Per node: redis_sync_node_count and redis_sync_node_command address each master (ordered by
 * the first slot it serves) for what must run on all of them: SCAN, INFO, FLUSHALL.
 *
 * Replies are hiredis' (redisReply, freed with freeReplyObject). A redis_sync is one thread's:
 * nothing in it is locked.
 */
#ifndef QUAN_REDIS_SYNC_H
#define QUAN_REDIS_SYNC_H

#include <stdarg.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

#include "rcmd.h"
#include "redis.h"
#include "status.h"

#define REDIS_SYNC_NODES_MAX RCMD_STARTUP_MAX /* entries of cluster_nodes */

typedef struct redis_sync redis_sync;

/* The options (rcmd.h: one struct for both clients). The blocking client reads host, port,
 * password, cluster_nodes and the timeouts: connect_timeout_ms (a connection's connect) and
 * command_timeout_ms (its socket I/O timeout, and a call's budget for redirects and waits in
 * cluster mode), or timeout_ms for both; lua_dir and max_pending are the event loop's. */
typedef rcmd_opts redis_sync_opts;

/* Checks a list of startup nodes: entries "host:port" (or "[v6]:port") separated by commas, a port
 * in 1..65535, at most REDIS_SYNC_NODES_MAX. QN_OK for NULL or ""; QN_EINVAL with the reason in err
 * (naming the bad entry, not the variable: the caller knows its name). */
qn_status redis_sync_nodes_check(const char *list, char *err, size_t errlen) QN_MUSTCHECK;

/* Owned; free with redis_sync_free. Connects nothing yet. NULL (logged) on bad options or when
 * out of memory. */
redis_sync *redis_sync_new(const redis_sync_opts *o) QN_MUSTCHECK;
/* Closes every connection and drops unread replies. NULL is a no-op. */
void redis_sync_free(redis_sync *rs);

/* 1 in cluster mode. */
int redis_sync_is_cluster(const redis_sync *rs);

/* Connects now what is not connected (single node: the connection; cluster: the slot map,
 * read again if the last call lost a connection) and says whether Redis answers: for callers
 * that look before starting a batch. Commands connect by themselves anyway. QN_ERR when not. */
qn_status redis_sync_open(redis_sync *rs) QN_MUSTCHECK;

/*
 * One command and its reply. Owned reply (freeReplyObject), possibly an error reply; NULL
 * without a reply (no connection, lost connection, refused before sending, out of memory):
 * redis_sync_errstr says why. fmt is hiredis' (%s, %d, %lld, %b = pointer + size_t).
 */
redisReply *redis_sync_command(redis_sync *rs, const char *fmt, ...) QN_MUSTCHECK;
redisReply *redis_sync_vcommand(redis_sync *rs, const char *fmt, va_list ap) QN_MUSTCHECK;
/* argvlen NULL: strlen of each argument. */
redisReply *redis_sync_command_argv(redis_sync *rs, int argc, const char **argv,
                                    const size_t *argvlen) QN_MUSTCHECK;
/* EVALSHA of the script called name (s borrowed), in the slot of its keys; on NOSCRIPT (the
 * node never loaded it, or flushed its scripts) EVAL of the source once, whose reply is then
 * the answer. As redis_sync_command; an unknown name is NULL ("unknown Lua script"). */
redisReply *redis_sync_run_script(redis_sync *rs, const redis_scripts *s, const char *name,
                                  int nkeys, const char **keys, int nargs,
                                  const char **args) QN_MUSTCHECK;

/* Pipelines (see above). */
void redis_sync_append(redis_sync *rs, const char *fmt, ...);
/* EVALSHA of script name, pipelined. Its reply may be a NOSCRIPT error (nothing ran): the
 * caller then runs it again with redis_sync_run_script. An unknown name is a failed command. */
void redis_sync_append_script(redis_sync *rs, const redis_scripts *s, const char *name, int nkeys,
                              const char **keys, int nargs, const char **args);

/* The calls above for a script of scripts.h, checked as REDIS_EVAL (redis.h) checks them. */
#define REDIS_SYNC_SCRIPT(rs, s, name, keys, args)                                                 \
    (SCRIPT_ARITY_CHECK(name, SCRIPT_COUNT_OF(keys), SCRIPT_COUNT_OF(args)),                       \
     redis_sync_run_script((rs), (s), SCRIPT(name), SCRIPT_COUNT_OF(keys), (keys),                 \
                           SCRIPT_COUNT_OF(args), (args)))
#define REDIS_SYNC_SCRIPT_N(rs, s, name, nkeys, keys, nargs, args)                                 \
    redis_sync_run_script((rs), (s), SCRIPT(name), (nkeys), (keys), (nargs), (args))
#define REDIS_SYNC_APPEND_SCRIPT(rs, s, name, keys, args)                                          \
    (SCRIPT_ARITY_CHECK(name, SCRIPT_COUNT_OF(keys), SCRIPT_COUNT_OF(args)),                       \
     redis_sync_append_script((rs), (s), SCRIPT(name), SCRIPT_COUNT_OF(keys), (keys),              \
                              SCRIPT_COUNT_OF(args), (args)))
#define REDIS_SYNC_APPEND_SCRIPT_N(rs, s, name, nkeys, keys, nargs, args)                          \
    redis_sync_append_script((rs), (s), SCRIPT(name), (nkeys), (keys), (nargs), (args))
void redis_sync_append_argv(redis_sync *rs, int argc, const char **argv, const size_t *argvlen);
/* cmds: one or more whole requests in RESP (arrays of bulk strings, as hiredis formats them),
 * len bytes, each taking its place as if appended one by one. Returns how many it held (a
 * malformed tail counts as one failing command). */
size_t redis_sync_append_formatted(redis_sync *rs, const char *cmds, size_t len);
/*
 * The reply of the oldest appended command not read yet. QN_OK: *reply is it (owned, possibly
 * an error reply). QN_ERR: none (that command failed without a reply: redis_sync_errstr says
 * why), *reply NULL. QN_EINVAL: no command is waiting. reply NULL: the reply is read and
 * dropped, and QN_OK means it was not an error reply (a single node then makes no reply object
 * at all: for long pipelines of writes whose replies only need to be successes).
 */
qn_status redis_sync_get_reply(redis_sync *rs, redisReply **reply) QN_MUSTCHECK;
/* Appended commands whose replies are not read yet. */
size_t redis_sync_pending(const redis_sync *rs);
/* Sends what is appended and drops every unread reply. */
void redis_sync_discard(redis_sync *rs);

/* The nodes to run per-node commands on: 1 for a single node; in cluster mode the masters, the
 * slot map read afresh first, ordered by the first slot each serves (0 when no node answers).
 * Indices stay valid until the map next changes (a redirect, a connection error). */
int redis_sync_node_count(redis_sync *rs);
/* "host:port" of node i (borrowed, valid until the map changes), or NULL. */
const char *redis_sync_node_name(const redis_sync *rs, int node);
/* One command on node i as it is (no redirect followed), as redis_sync_command. */
redisReply *redis_sync_node_command(redis_sync *rs, int node, const char *fmt, ...) QN_MUSTCHECK;

/* Why the last call (or the last failed get_reply) failed without a reply; "" otherwise.
 * Borrowed, valid until the next call. */
const char *redis_sync_errstr(const redis_sync *rs);
/* 1 when a connection is known to be down (nothing connected yet, or the last call lost one):
 * the next call connects again. For best-effort clean-ups that would only wait. */
int redis_sync_broken(const redis_sync *rs);

#endif
