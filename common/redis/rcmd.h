/*
 * The Redis command core under both clients: the asynchronous one of the event loop (redis.h)
 * and the blocking one of threads, consumers and tools (redis_sync.h). Everything a client
 * decides about a command is here, once; a client keeps only its way of waiting (libevent
 * timers and hiredis callbacks, or nanosleep and redisGetReply).
 *
 * - The command table: one row per command Quan knows (name, where its keys are, flags:
 *   read-only, transaction, no key). An unknown command has its key first and is a write.
 * - Classification: a command (argv, or a formatted RESP request) -> its slot (RSLOT_COUNT
 *   slots, or none, or CROSSSLOT), flags and name.
 * - Admission: a command whose keys lie in two slots is never sent, on one server too, so that
 *   every suite catches what a cluster would refuse; a transaction (MULTI, EXEC, DISCARD,
 *   WATCH, UNWATCH) is refused on a cluster, where a script does several things atomically.
 * - RESP formatting of an argument vector.
 * - Script calls: EVALSHA, and on a NOSCRIPT error reply EVAL of the source once, whose reply
 *   is then the answer.
 * - The options of both clients, checked and copied once, and the AUTH command.
 * - The redirect and retry rule (rcmd_decide): from a command's retry state and what its last
 *   try brought, the next step. The same limits for both clients:
 *
 *     MOVED, ASK             followed at most RCMD_HOPS_MAX times; then that reply is the answer
 *     TRYAGAIN, CLUSTERDOWN, LOADING
 *                            sent again after a wait of RCMD_RETRY_MIN_MS doubling to
 *                            RCMD_RETRY_MAX_MS while the command's deadline allows; then that
 *                            reply is the answer
 *     nothing written        (no connection, or it failed before the request was written)
 *                            sent again after such a wait, within the deadline
 *     connection lost after the request was (maybe) written
 *                            a read-only command is sent again as above; any other (a write,
 *                            any script but EVAL_RO/EVALSHA_RO) may have run and is never sent
 *                            twice: it fails, its outcome unknown
 *     no node for the slot   the map is read again, then the command routed again after a wait
 *
 *   On one server (not a cluster) nothing is resent and nothing waited for: every reply is the
 *   answer and a failed connection fails the command at once (the client reconnects on its own).
 *
 * Pure functions without I/O, any thread (rcmd_admit and rcmd_script_new log a refusal).
 */
#ifndef QUAN_RCMD_H
#define QUAN_RCMD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "rcluster.h"
#include "redis_scripts.h"
#include "rsentinel.h"
#include "status.h"

/* ---------------------------------------------------------------- limits of both clients */

#define RCMD_HOPS_MAX       5    /* MOVED/ASK redirects one command follows */
#define RCMD_RETRY_MIN_MS   20   /* the first wait before a command is sent again */
#define RCMD_RETRY_MAX_MS   200  /* the longest (each wait doubles the one before) */
#define RCMD_REFRESH_GAP_MS 100  /* CLUSTER SLOTS asked again at most this often when errors ask */
#define RCMD_NODES_MAX      4096 /* cluster node addresses one client knows (kept for its life) */
#define RCMD_STARTUP_MAX    64   /* entries of cluster_nodes */
#define RCMD_TIMEOUT_MS     1000 /* a timeout left at 0 */
#define RCMD_NAME_MAX       24   /* a command's name as kept for messages, NUL included */

/* ---------------------------------------------------------------- options */

/* The options of both clients (redis.h's redis_opts, redis_sync.h's redis_sync_opts). */
typedef struct rcmd_opts {
    const char *host; /* one server (unused in cluster mode); copied */
    int port;
    const char *password; /* NULL or "": no AUTH; every node's; copied */
    /* Each timeout left at 0 is timeout_ms, or else RCMD_TIMEOUT_MS. */
    int connect_timeout_ms;
    /* A command's budget: its redirects and waits end there (the blocking client's socket I/O
     * timeout as well). */
    int command_timeout_ms;
    int timeout_ms; /* both at once */
    /* "host:port,host:port": nodes of a Redis Cluster, any of them (then host and port are
     * unused); NULL or "": the one server at host:port. Copied. */
    const char *cluster_nodes;
    /* A Sentinel deployment (rsentinel.h): "host:port,..." of the sentinels and the name of the
     * master they watch, both or neither, never with cluster_nodes; then host and port are
     * unused: the master is asked of the sentinels before every connect. Copied. */
    const char *sentinels;
    const char *master_name;
    /* The asynchronous client's alone. */
    const char *lua_dir; /* NULL -> no scripts (then ready == connected) */
    int max_pending;     /* commands in flight before failing fast; 0 -> 10000 */
} rcmd_opts;

/* Options checked and resolved; owns its strings (rcmd_conf_free). */
typedef struct rcmd_conf {
    int cluster;
    char *host; /* one server */
    int port;
    /* "host:port" of the one server (" (master NAME)" after it in a Sentinel deployment) */
    char name[RCLUSTER_HOST_MAX + RSENTINEL_NAME_MAX + 24];
    char *password; /* NULL: no AUTH */
    int connect_timeout_ms, command_timeout_ms;
    rcluster_addr *startup; /* cluster: the nodes of cluster_nodes */
    int nstartup;
    rsentinel *sentinel; /* a Sentinel deployment: host, port and name are the master's of the
                            last resolution (rcmd_conf_set_server) */
} rcmd_conf;

/* A list of startup nodes: entries "host:port" (or "[v6]:port") separated by commas, a port in
 * 1..65535, at most RCMD_STARTUP_MAX. QN_OK for NULL or ""; QN_EINVAL with the reason in err
 * (naming the bad entry, not the variable: the caller knows its name). */
qn_status rcmd_nodes_check(const char *list, char *err, size_t errlen) QN_MUSTCHECK;

/* *cf from o (cf's fields are the caller's to read). QN_EINVAL (err says why) for no address or a
 * bad node list; QN_ENOMEM. On failure *cf holds nothing to free. */
qn_status rcmd_conf_init(rcmd_conf *cf, const rcmd_opts *o, char *err, size_t errlen) QN_MUSTCHECK;
void rcmd_conf_free(rcmd_conf *cf);
/* The one server is host:port from now on (a Sentinel deployment's master, just resolved).
 * QN_ENOMEM leaves cf as it was. */
qn_status rcmd_conf_set_server(rcmd_conf *cf, const char *host, int port) QN_MUSTCHECK;

/* The AUTH command of cf into argv/argvlen (borrowed from cf): 2 arguments, or 0 when no
 * password is set. */
int rcmd_auth_argv(const rcmd_conf *cf, const char *argv[2], size_t argvlen[2]);

/* ms as a struct timeval (a connect, I/O or timer timeout). */
struct timeval rcmd_timeval(int ms);

/* ---------------------------------------------------------------- the command table */

/* A command's flags. */
#define RCMD_READONLY    (1u << 0) /* only reads: running it twice is harmless */
#define RCMD_TRANSACTION (1u << 1) /* MULTI, EXEC, DISCARD, WATCH, UNWATCH */
#define RCMD_NOKEY       (1u << 2) /* no key: any node answers it (PING, INFO, SCRIPT) */

/* Where a command's keys are (a row with RCMD_NOKEY has none, whatever this says). */
typedef enum {
    RCMD_KEYS_FIRST = 0,    /* argv[1] (every single-key command: the default) */
    RCMD_KEYS_ALL,          /* argv[1..] */
    RCMD_KEYS_ALL_BUT_LAST, /* argv[1..argc-2] (BLPOP k1 k2 timeout) */
    RCMD_KEYS_TWO,          /* argv[1], argv[2] */
    RCMD_KEYS_PAIRS,        /* argv[1], argv[3], ... (MSET k v k v) */
    RCMD_KEYS_NUMKEYS,      /* argv[2] is the count, keys from argv[3] (EVAL, EVALSHA, FCALL) */
} rcmd_keys;

typedef struct rcmd_row {
    const char *name; /* upper case */
    rcmd_keys keys;
    unsigned flags;
} rcmd_row;

/* The table (borrowed, static), sorted by name in byte order; *n rows. */
const rcmd_row *rcmd_rows(size_t *n);
/* The row of the command name (len bytes, any case), or NULL for a command not in the table. */
const rcmd_row *rcmd_lookup(const char *name, size_t len);

/* ---------------------------------------------------------------- classification */

/* rcmd_info.slot besides a slot (0..RSLOT_COUNT-1). */
#define RCMD_SLOT_NONE  -1 /* no key: any node (a keyless command, a script called with none) */
#define RCMD_SLOT_CROSS -2 /* keys in two slots or more, or a malformed EVAL: never sent */

typedef struct rcmd_info {
    int slot;
    unsigned flags;           /* its row's (0 for a command not in the table) */
    char name[RCMD_NAME_MAX]; /* argv[0] as given, cut to fit */
} rcmd_info;

/* The command argv (argvlen: each argument's length; argc >= 1). A malformed EVAL/EVALSHA
 * (numkeys not a number, or more keys than arguments) is RCMD_SLOT_CROSS: it too must not be
 * sent. */
void rcmd_classify_argv(int argc, const char *const *argv, const size_t *argvlen, rcmd_info *ci);

/* The first request of cmd (len bytes: one or more RESP requests, arrays of bulk strings as
 * hiredis formats them), its length into *used. QN_EINVAL when cmd does not start with a whole
 * such request. */
qn_status rcmd_classify_request(const char *cmd, size_t len, size_t *used,
                                rcmd_info *ci) QN_MUSTCHECK;

/* argv classified into *ci and formatted as rcmd_format does (buf, cap, *heap): what a client
 * does with a caller's argv. argvlen NULL: strlen of each. The length, or 0 when out of
 * memory or argc < 1. */
size_t rcmd_format_command(char *buf, size_t cap, char **heap, int argc, const char *const *argv,
                           const size_t *argvlen, rcmd_info *ci);

/* QN_OK when the command may be sent (on a cluster when cluster != 0). Else QN_EINVAL, *why the
 * reason (static text), and the refusal logged with the command's name: CROSSSLOT always, a
 * transaction on a cluster. */
qn_status rcmd_admit(const rcmd_info *ci, int cluster, const char **why) QN_MUSTCHECK;

/* ---------------------------------------------------------------- RESP */

/* ASKING, formatted: sent before a command redirected by ASK. */
#define RCMD_ASKING "*1\r\n$6\r\nASKING\r\n"

/* The RESP request of argv (argvlen NULL: strlen of each) into buf (cap bytes), or, when it
 * does not fit, into a malloc'ed buffer *heap the caller frees (cap 0: always there, owned).
 * *heap is NULL when buf was used. The length, or 0 when out of memory. */
size_t rcmd_format(char *buf, size_t cap, char **heap, int argc, const char *const *argv,
                   const size_t *argvlen);

/* ---------------------------------------------------------------- script calls */

/* A script call with its own copies of the keys and arguments, so that it can be sent again
 * after the caller's arrays are gone. Owned: free with free(). */
typedef struct rcmd_script {
    const redis_script *script; /* borrowed from the registry */
    int argc;                   /* 3 + nkeys + nargs */
    const char **argv;          /* EVALSHA sha1 nkeys keys... args... (then EVAL source ...) */
    size_t *argvlen;
    int fell_back; /* EVAL was sent after NOSCRIPT */
    size_t extra;  /* bytes of the caller's, after the struct */
    char numkeys[16];
} rcmd_script;

/*
 * The EVALSHA call of script name of s into *out, with extra bytes of the caller's own in it
 * (rcmd_script_extra; zeroed). QN_EINVAL: counts that do not fit scripts.h, or negative;
 * QN_ENOTFOUND: no script of that name in s (logged); *why says which. QN_ENOMEM.
 */
qn_status rcmd_script_new(const redis_scripts *s, const char *name, int nkeys, const char **keys,
                          int nargs, const char **args, size_t extra, rcmd_script **out,
                          const char **why) QN_MUSTCHECK;
/* The caller's extra bytes of sc (aligned for any type), or NULL when it asked for none. */
void *rcmd_script_extra(rcmd_script *sc);

/* The NOSCRIPT rule, after reply r of the call: 1 when r is a NOSCRIPT error of the EVALSHA
 * (nothing ran) and the call is now EVAL of the source, to be sent once; 0 when r is the
 * answer. */
int rcmd_script_fallback(rcmd_script *sc, const redisReply *r);

/* ---------------------------------------------------------------- redirects and retries */

/* What the last try of a command brought. */
typedef enum {
    RCMD_REPLY = 0, /* a reply that is the answer (an error reply too) */
    RCMD_MOVED,     /* MOVED slot addr */
    RCMD_ASK,       /* ASK slot addr */
    RCMD_BUSY,      /* TRYAGAIN, CLUSTERDOWN, LOADING */
    RCMD_UNSENT,    /* no connection, or it failed before anything of the request was written */
    RCMD_LOST,      /* the connection failed after the request was (maybe) written */
    RCMD_NO_NODE,   /* no node for the command's slot (no map, or a slot nobody serves) */
} rcmd_verdict;

/* What the client does next. */
typedef enum {
    RCMD_DONE = 0,    /* the reply it has is the answer */
    RCMD_SEND,        /* send to the node MOVED named, remembering the slot is there now */
    RCMD_SEND_ASKING, /* ASKING and the command on the node ASK named, for this command alone */
    RCMD_WAIT,        /* wait wait_ms (the map asked again), then route and send again */
    RCMD_REFRESH,     /* read the map again, then route and send again after wait_ms */
    RCMD_FAIL,        /* fail without a reply: why */
} rcmd_action;

/* A command's retry state, kept by the client from its first try to its answer. */
typedef struct rcmd_retry {
    int64_t deadline_ms; /* monotonic: no wait ends past it */
    int hops;            /* MOVED and ASK followed so far */
    int wait_ms;         /* the last wait, 0 before the first; the next doubles it */
    unsigned flags;      /* the command's (RCMD_READONLY: may be sent twice) */
    int cluster;         /* 0: one server */
    int written;         /* a try may have reached a server and brought no reply */
} rcmd_retry;

typedef struct rcmd_decision {
    rcmd_action action;
    int wait_ms;     /* RCMD_WAIT, RCMD_REFRESH */
    const char *why; /* RCMD_FAIL: static text */
} rcmd_decision;

void rcmd_retry_init(rcmd_retry *st, unsigned flags, int cluster, int64_t deadline_ms);

/* The verdict of reply r (NULL: RCMD_REPLY); MOVED and ASK fill *slot and *to (to->host ""
 * when the reply did not say: the node that answered). */
rcmd_verdict rcmd_verdict_of(const redisReply *r, int *slot, rcluster_addr *to);

/* The next step of a command whose last try brought v, at now_ms (monotonic); st is updated
 * (hops, wait, written). See the rule at the top. */
rcmd_decision rcmd_decide(rcmd_retry *st, rcmd_verdict v, int64_t now_ms);

#endif
