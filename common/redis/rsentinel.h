/*
 * Redis Sentinel: where the master of a name is now, for both Redis clients (redis.h on the
 * event loop, redis_sync.h in threads and tools).
 *
 * It follows Redis' Sentinel client guidelines:
 *   - the sentinels are asked in turn, each with a short timeout (connect and answer within
 *     RSENTINEL_QUERY_MS, and within what is left of the caller's budget), starting from the
 *     one that answered last: SENTINEL get-master-addr-by-name <name>;
 *   - the first address given is the answer; the client connects there and asks ROLE, which
 *     must say master (rsentinel_role_master): a sentinel that has not seen a failover yet
 *     names the old master, now a replica, and then rsentinel_skip makes the next resolution
 *     start from the next sentinel;
 *   - the address is asked again before every (re)connect, never remembered across one;
 *   - a write refused with -READONLY (rsentinel_readonly) means the connection is to a demoted
 *     master: the client drops it, and its reconnect asks the sentinels again. The sentinels
 *     also close the clients of a master they demote (CLIENT KILL), which does the same.
 *
 * Two ways of asking, one walk over the sentinels (the order, the skip, the verdict) shared by
 * both: rsentinel_resolve blocks, for threads and tools (redis_sync.h), where a short wait is
 * fine; rsentinel_resolver asks on the event loop (redis.h) with hiredis' asynchronous API,
 * each sentinel's RSENTINEL_QUERY_MS kept by a timer of the loop, so a sentinel host that
 * swallows packets costs the client that time, never the loop (a sentinel given by host name
 * is still looked up by hiredis' connect, as every server of that client is).
 *
 * Sentinels are asked without AUTH (a sentinel's own requirepass is not supported); the
 * servers get QUAN_REDIS_PASSWORD as ever.
 *
 * An rsentinel is one client's: nothing in it is locked.
 */
#ifndef QUAN_RSENTINEL_H
#define QUAN_RSENTINEL_H

#include <stddef.h>

#include <hiredis/hiredis.h>

#include "rcluster.h"
#include "status.h"

#define RSENTINEL_MAX       16  /* entries of a list of sentinels */
#define RSENTINEL_NAME_MAX  128 /* a master's name, NUL included */
#define RSENTINEL_QUERY_MS  100 /* one sentinel: connect and answer */
#define RSENTINEL_BUDGET_MS 500 /* one resolution, every sentinel asked */
#define RSENTINEL_ERR_MAX   512 /* a resolution's error text, NUL included */

typedef struct rsentinel rsentinel;

/*
 * Checks the settings of a Sentinel deployment: sentinels ("host:port,..." as the cluster's
 * node lists, at most RSENTINEL_MAX) and the master's name (letters, digits, '.', '_', '-',
 * shorter than RSENTINEL_NAME_MAX) must be given together, and not with cluster_nodes. QN_OK
 * when all three are empty or NULL, or for a valid pair; QN_EINVAL with the reason in err,
 * naming the setting (QUAN_REDIS_SENTINELS, QUAN_REDIS_MASTER_NAME, QUAN_REDIS_CLUSTER_NODES).
 */
qn_status rsentinel_check(const char *sentinels, const char *master_name, const char *cluster_nodes,
                          char *err, size_t errlen) QN_MUSTCHECK;

/* Owned; free with rsentinel_free. NULL with err set when the pair is not valid
 * (rsentinel_check) or out of memory. Connects nothing. */
rsentinel *rsentinel_new(const char *sentinels, const char *master_name, char *err,
                         size_t errlen) QN_MUSTCHECK;
void rsentinel_free(rsentinel *s);

/* Borrowed, valid until rsentinel_free. */
const char *rsentinel_master_name(const rsentinel *s);
/* "host:port,..." as given, blanks removed (for messages). Borrowed. */
const char *rsentinel_list(const rsentinel *s);

/*
 * The master's address now, into *out: the sentinels asked in turn until one names it, within
 * budget_ms in all (at least one sentinel is always asked). QN_OK: *out is set. QN_ENOTFOUND:
 * every sentinel that answered knows no master of that name (a wrong QUAN_REDIS_MASTER_NAME).
 * QN_ERR: no sentinel answered in time. err says why in both cases, naming the name and the
 * sentinels.
 */
qn_status rsentinel_resolve(rsentinel *s, int budget_ms, rcluster_addr *out, char *err,
                            size_t errlen) QN_MUSTCHECK;

/* The address of the last resolution was no master (ROLE): the next starts from the next
 * sentinel. */
void rsentinel_skip(rsentinel *s);

/* ---------------------------------------------------------------- on the event loop */

struct event_base;

/*
 * rsentinel_resolve without blocking: the sentinels asked in turn on the loop, the same walk,
 * the first answer winning. cb is called on the loop thread once per start, never inside
 * rsentinel_resolver_start, with st as rsentinel_resolve's: QN_OK and master (borrowed for the
 * call), or err (borrowed for the call) naming the name and the sentinels.
 */
typedef struct rsentinel_resolver rsentinel_resolver;
typedef void (*rsentinel_resolved_cb)(qn_status st, const rcluster_addr *master, const char *err,
                                      void *arg);

/* Owned; rsentinel_resolver_free. s and base are borrowed and must outlive it (s is updated as
 * by rsentinel_resolve: only ever use it from the loop thread then). NULL when out of memory. */
rsentinel_resolver *rsentinel_resolver_new(struct event_base *base, rsentinel *s,
                                           rsentinel_resolved_cb cb, void *arg) QN_MUSTCHECK;
/* Starts a resolution within budget_ms (RSENTINEL_BUDGET_MS when <= 0); a no-op while one is
 * under way. */
void rsentinel_resolver_start(rsentinel_resolver *r, int budget_ms);
/* Ends the resolution under way, if any: its cb is not called. Not from inside cb. */
void rsentinel_resolver_cancel(rsentinel_resolver *r);
/* Cancels and frees; NULL is a no-op. Not from inside cb. */
void rsentinel_resolver_free(rsentinel_resolver *r);

/* ---------------------------------------------------------------- following a failover */

/*
 * A watch on the event loop: a connection to one sentinel at a time (in turn, 1 s between
 * tries), subscribed to +switch-master. When the sentinels switch the master of the name, cb
 * is called on the loop thread with the new master's address, and the process's switch count
 * goes up (rsentinel_switches), which the blocking clients of its threads compare at every
 * command: a client connected before the switch connects again, asking the sentinels. So the
 * clients leave the old master as soon as the sentinels elect the new one, rather than when
 * the old one is reconfigured as a replica (some seconds later, when it is alive) or its
 * connections fail (when it is not).
 *
 * Owned; rsentinel_watch_free. s and base are borrowed and must outlive it. NULL when out of
 * memory.
 */
typedef struct rsentinel_watch rsentinel_watch;
typedef void (*rsentinel_switch_cb)(const rcluster_addr *master, void *arg);

rsentinel_watch *rsentinel_watch_new(struct event_base *base, const rsentinel *s,
                                     rsentinel_switch_cb cb, void *arg) QN_MUSTCHECK;
void rsentinel_watch_free(rsentinel_watch *w);

/* Switches of any master seen by the watches of this process so far (any thread). */
unsigned long rsentinel_switches(void);

/* 1 when r, a ROLE reply, says master. */
int rsentinel_role_master(const redisReply *r);
/* 1 when r is a -READONLY error reply: a replica refused a write, the master is elsewhere. */
int rsentinel_readonly(const redisReply *r);
/* The same for an error text. */
int rsentinel_readonly_text(const char *err);

#endif
