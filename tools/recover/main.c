/*
 * quan-recover: after the databases were restored from a backup, brings Redis, the claim queue
 * and the engines back in line with them (docs/architecture.md, "After a database restore").
 *
 *   quan-recover [--restored] [--settle-ms N]   recover
 *   quan-recover --check                        0: nothing waits for recovery, 1: it does
 *
 * The databases say whether they were restored (quan_restore, services/engine/restore.h): epoch
 * bumped by the restore (deploy/local/backup.sh does it; --restored does it first, after a
 * restore made with other tools), recovered_epoch by this tool. While they differ engines answer
 * claims 503. The recovery, in order:
 *   1. the Redis rebuild lock (KEYS_REGEN_LOCK), so that no engine rebuilds meanwhile;
 *   2. --settle-ms (default 11000, more than a request's timeout): the claims engines were
 *      running when they saw the mark end (0 when every service is stopped);
 *   3. the claim queue (quan.engine.redeem and its retry queue): claims accepted by /redeem-mq
 *      go to quan.engine.redeem.dead, x-dead-reason "restored: ...": they reserved in the Redis
 *      about to be flushed, so applying them would take stock and count users the rebuilt Redis
 *      knows nothing of; their users were told "accepted", never "succeeded", and may claim
 *      again. The safety-net checks of synchronous claims stay: they only settle what the
 *      databases hold. A claim a consumer holds meanwhile is not in the queue: the consumer
 *      dead-letters it itself, by the restore epoch it carries (claimq.h);
 *   4. every Quan key in Redis removed (SCAN "quan:*" on every master) but the leases of live
 *      processes (snowflake worker ids, reservation owners), the rebuild lock and the marks of
 *      notifications and reminders already sent (recover_keep): stock,
 *      counters, request markers, reservations, template hashes, wallets, the claim and task
 *      consume guards, distribution chunk outcomes, duplicate-submit keys, the bloom filter.
 * Processes that keep copies of keys are told by Redis (client tracking);
 *   5. the claim state of every template that can be claimed rebuilt from the databases
 *      (reconcile.h), and the generation marked current (rgen.h);
 *   6. recovered_epoch = epoch: the engines open claims again and drop their copies.
 * The bloom filter is then rebuilt by quan-bloom-rebuild (until then a template is looked up in
 * the databases). Run again after a failure: every step can be repeated.
 *
 * Reads QUAN_DS0_DSN, QUAN_DS1_DSN, QUAN_REDIS_HOST, QUAN_REDIS_PORT, QUAN_REDIS_PASSWORD,
 * QUAN_REDIS_CLUSTER_NODES, QUAN_AMQP_URL, QUAN_LUA_DIR; the secrets may be files,
 * QUAN_..._FILE (config.h). Exit status 0: recovered (or nothing to recover); 1: --check found a
 * restore waiting; 2: usage; 3: a database, Redis or broker error.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "claimq.h"
#include "config.h"
#include "keys.h"
#include "lock.h"
#include "log.h"
#include "mq_dead.h"
#include "mq_envelope.h"
#include "reconcile.h"
#include "rgen.h"

#define RECOVER_LOCK_MS    600000 /* the whole recovery; released at its end */
#define RECOVER_LOCK_WAIT  30     /* seconds for an engine's rebuild to finish */
#define RECOVER_BATCH      500    /* templates per reconcile_run */
#define RECOVER_SCAN_COUNT "1000"

/* Kept: the leases of processes alive now and the rebuild lock, which the databases know
 * nothing of; and what was sent to the outside world (task notifications' units, consumed
 * reminder and notification messages), which a restore does not take back: a message the
 * restored outbox publishes again must not notify anyone twice. */
static const char *const recover_keep[] = {KEYS_IDS_WORKER_PREFIX,
                                           "quan:resv:live:",
                                           KEYS_REGEN_LOCK,
                                           "quan:notify:",
                                           "quan:guard:{notify}:",
                                           "quan:guard:{remind}:",
                                           NULL};

typedef struct recover_epochs {
    int64_t epoch[2], recovered[2];
} recover_epochs;

static int rv_usage(void)
{
    fprintf(stderr, "usage: quan-recover [--restored] [--settle-ms N] | --check\n");
    return 2;
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

static qn_status rv_epochs(pgpool_conn *pg[2], recover_epochs *e)
{
    for (int ds = 0; ds < 2; ds++) {
        PGresult *r = pgpool_exec(
            pg[ds], "SELECT epoch, recovered_epoch FROM quan_restore WHERE id = 1", 0, NULL);
        if (!r || PQntuples(r) != 1) {
            fprintf(stderr, "quan-recover: ds_%d: cannot read quan_restore (%s; quan-migrate?)\n",
                    ds, pgpool_conn_error(pg[ds]));
            if (r)
                PQclear(r);
            return QN_ERR;
        }
        e->epoch[ds] = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        e->recovered[ds] = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
        PQclear(r);
    }
    return QN_OK;
}

static int rv_pending(const recover_epochs *e)
{
    return e->epoch[0] != e->recovered[0] || e->epoch[1] != e->recovered[1];
}

/* A message of the claim queue stays when every claim in it is a check (mq_dead_keep_fn). */
static int rv_keep(const char *body, size_t len, void *arg)
{
    (void)arg;
    mq_envelope *env = NULL;
    size_t n = 0;
    int keep = 1;
    if (mq_envelope_pack_parse(body, len, &env, &n) != QN_OK)
        return 1; /* not a claim at all: the consumer dead-letters it as malformed */
    for (size_t i = 0; i < n && keep; i++) {
        claimdb_item it;
        if (claimq_claim_parse(env[i].data, &it) && !it.check)
            keep = 0;
    }
    mq_envelope_pack_free(env, n);
    return keep;
}

static int rv_kept_key(const char *key)
{
    for (int i = 0; recover_keep[i]; i++)
        if (!strncmp(key, recover_keep[i], strlen(recover_keep[i])))
            return 1;
    return 0;
}

/* Removes one pattern's keys on every master; *removed counts them. */
static qn_status rv_flush_pattern(redis_sync *rs, const char *pattern, long *removed)
{
    int nodes = redis_sync_node_count(rs);
    if (nodes <= 0)
        return QN_ERR;
    for (int node = 0; node < nodes; node++) {
        char cursor[32] = "0";
        do {
            redisReply *r = redis_sync_node_command(rs, node, "SCAN %s MATCH %s COUNT %s", cursor,
                                                    pattern, RECOVER_SCAN_COUNT);
            if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING) {
                freeReplyObject(r);
                return QN_ERR;
            }
            snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
            const redisReply *keys = r->element[1];
            for (size_t i = 0; i < keys->elements; i++) {
                const char *k = keys->element[i]->str;
                if (rv_kept_key(k))
                    continue;
                redisReply *d = redis_sync_node_command(rs, node, "UNLINK %s", k);
                int ok = d && d->type == REDIS_REPLY_INTEGER;
                freeReplyObject(d);
                if (!ok) {
                    freeReplyObject(r);
                    return QN_ERR;
                }
                (*removed)++;
            }
            freeReplyObject(r);
        } while (strcmp(cursor, "0") != 0);
    }
    return QN_OK;
}

static qn_status rv_lock(redis_sync *rs, const char *token)
{
    for (int i = 0; i <= RECOVER_LOCK_WAIT; i++) {
        redisReply *r =
            redis_sync_command(rs, "SET %s %s NX PX %d", KEYS_REGEN_LOCK, token, RECOVER_LOCK_MS);
        int ours = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (ours)
            return QN_OK;
        if (i == 0)
            fprintf(stderr, "quan-recover: an engine is rebuilding Redis; waiting up to %d s\n",
                    RECOVER_LOCK_WAIT);
        sleep(1);
    }
    fprintf(stderr, "quan-recover: %s is still held: an engine's rebuild did not end\n",
            KEYS_REGEN_LOCK);
    return QN_ERR;
}

int main(int argc, char **argv)
{
    int restored = 0, check = 0, rc = 3, locked = 0;
    long settle_ms = 11000;
    pgpool_conn *pg[2] = {NULL, NULL};
    redis_sync *redis = NULL;
    redis_scripts *scripts = NULL;
    reconcile_tpl *t = NULL;
    size_t n = 0;
    recover_epochs e;
    char token[LOCK_TOKEN_LEN], run[RGEN_RUN_MAX], err[512], why[256];
    static const char *const secret_names[4] = {"QUAN_DS0_DSN", "QUAN_DS1_DSN",
                                                "QUAN_REDIS_PASSWORD", "QUAN_AMQP_URL"};
    char *secrets[4] = {NULL, NULL, NULL, NULL};

    log_init("quan-recover", LOGL_WARN);
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--restored"))
            restored = 1;
        else if (!strcmp(argv[i], "--check"))
            check = 1;
        else if (!strcmp(argv[i], "--settle-ms") && i + 1 < argc) {
            settle_ms = strtol(argv[++i], &end, 10);
            if (!*argv[i] || *end || settle_ms < 0 || settle_ms > 600000) {
                fprintf(stderr,
                        "quan-recover: --settle-ms must be milliseconds from 0 to 600000, "
                        "not '%s'\n",
                        argv[i]);
                return 2;
            }
        } else
            return rv_usage();
    }
    if (check && restored)
        return rv_usage();
    const char *nodes = env_or("QUAN_REDIS_CLUSTER_NODES", "");
    if (redis_sync_nodes_check(nodes, why, sizeof(why)) != QN_OK) {
        fprintf(stderr, "quan-recover: QUAN_REDIS_CLUSTER_NODES: %s\n", why);
        return 2;
    }
    for (int i = 0; i < 4; i++) {
        if (config_secret(secret_names[i], &secrets[i], err, sizeof(err)) != QN_OK) {
            fprintf(stderr, "quan-recover: %s\n", err);
            rc = 2;
            goto out;
        }
    }
    for (int ds = 0; ds < 2; ds++) {
        pgpool_opts po = {
            .dsn = secrets[ds], .name = ds ? "ds_1" : "ds_0", .application_name = "quan-recover"};
        if (!secrets[ds] || !(pg[ds] = pgpool_conn_open(&po)) ||
            pgpool_conn_ensure(pg[ds]) != QN_OK) {
            fprintf(stderr, "quan-recover: cannot reach ds_%d (QUAN_DS%d_DSN)\n", ds, ds);
            goto out;
        }
    }
    if (restored) {
        /* From here on engines refuse claims (within QUAN_RESTORE_CHECK_MS). */
        for (int ds = 0; ds < 2; ds++)
            if (pgpool_exec_cmd(pg[ds],
                                "UPDATE quan_restore SET epoch = epoch + 1, restored_at = now()", 0,
                                NULL, NULL) != QN_OK) {
                fprintf(stderr, "quan-recover: ds_%d: cannot mark the restore (%s)\n", ds,
                        pgpool_conn_error(pg[ds]));
                goto out;
            }
    }
    if (rv_epochs(pg, &e) != QN_OK)
        goto out;
    for (int ds = 0; ds < 2; ds++)
        printf("ds_%d epoch=%" PRId64 " recovered_epoch=%" PRId64 "\n", ds, e.epoch[ds],
               e.recovered[ds]);
    if (!rv_pending(&e)) {
        printf("nothing to recover: the databases are not marked restored (after a restore made "
               "with other tools: quan-recover --restored)\n");
        rc = 0;
        goto out;
    }
    if (check) {
        printf("restored: claims wait for quan-recover\n");
        rc = 1;
        goto out;
    }
    if (!secrets[3] || !*secrets[3]) {
        fprintf(stderr, "quan-recover: QUAN_AMQP_URL is not set (the claim queue is sorted)\n");
        rc = 2;
        goto out;
    }

    redis_sync_opts ro = {.host = env_or("QUAN_REDIS_HOST", "127.0.0.1"),
                          .port = atoi(env_or("QUAN_REDIS_PORT", "6379")),
                          .password = secrets[2] ? secrets[2] : "",
                          .timeout_ms = 10000,
                          .cluster_nodes = nodes};
    redis = redis_sync_new(&ro);
    scripts = redis_scripts_load_dir(env_or("QUAN_LUA_DIR", "lua-scripts"));
    if (!redis || redis_sync_open(redis) != QN_OK || !scripts) {
        fprintf(stderr,
                "quan-recover: cannot reach Redis or read the Lua scripts (QUAN_LUA_DIR)\n");
        goto out;
    }
    if (lock_token_new(token) != QN_OK || rv_lock(redis, token) != QN_OK)
        goto out;
    locked = 1;

    if (settle_ms > 0) {
        printf("settle: %ld ms for the claims engines were running\n", settle_ms);
        fflush(stdout);
        usleep((useconds_t)settle_ms * 1000);
    }

    int kept = 0, dead = 0;
    if (mq_dead_sort(secrets[3], "engine.redeem", rv_keep, NULL, CLAIMQ_RESTORED_REASON, &kept,
                     &dead) != QN_OK) {
        fprintf(stderr, "quan-recover: cannot sort the claim queue (QUAN_AMQP_URL)\n");
        goto out;
    }
    printf("claim queue: %d dead-lettered to quan.engine.redeem.dead (x-dead-reason restored), "
           "%d checks kept\n",
           dead, kept);

    long removed = 0;
    if (rv_flush_pattern(redis, "quan:*", &removed) != QN_OK ||
        rv_flush_pattern(redis, "{quan:*", &removed) != QN_OK) {
        fprintf(stderr, "quan-recover: removing the Redis keys failed (%s)\n",
                redis_sync_errstr(redis));
        goto out;
    }
    printf("redis: %ld keys removed\n", removed);

    if (reconcile_list_active(pg, &t, &n) != QN_OK)
        goto out;
    reconcile_opts o = {.apply = 1, .dead = 1};
    for (size_t i = 0; i < n; i += RECOVER_BATCH) {
        size_t m = n - i < RECOVER_BATCH ? n - i : RECOVER_BATCH;
        if (reconcile_run(redis, scripts, pg, t + i, m, &o) != QN_OK) {
            fprintf(stderr, "quan-recover: rebuilding the templates failed\n");
            goto out;
        }
    }
    long long voided = 0;
    for (size_t i = 0; i < n; i++)
        voided += t[i].voided;
    printf("templates rebuilt: %zu (reservations given up: %lld)\n", n, voided);
    if (rgen_sync_run_id(redis, run) != QN_OK || rgen_sync_mark(redis, run) != QN_OK) {
        fprintf(stderr, "quan-recover: marking the Redis generation failed (a server restarted "
                        "or failed over meanwhile: run again)\n");
        goto out;
    }

    for (int ds = 0; ds < 2; ds++) {
        char ep[24];
        const char *params[1] = {ep};
        int64_t rows = 0;
        snprintf(ep, sizeof(ep), "%" PRId64, e.epoch[ds]);
        if (pgpool_exec_cmd(pg[ds],
                            "UPDATE quan_restore SET recovered_epoch = $1::bigint, "
                            "recovered_at = now() WHERE epoch = $1::bigint",
                            1, params, &rows) != QN_OK ||
            rows != 1) {
            fprintf(stderr, "quan-recover: ds_%d: restored again meanwhile (or %s): run again\n",
                    ds, pgpool_conn_error(pg[ds]));
            goto out;
        }
    }
    printf("recovered: claims open again (run quan-bloom-rebuild for the bloom filter)\n");
    rc = 0;
out:
    if (locked) {
        const char *keys[1] = {KEYS_REGEN_LOCK};
        const char *args[1] = {token};
        freeReplyObject(REDIS_SYNC_SCRIPT(redis, scripts, lock_release, keys, args));
    }
    free(t);
    redis_scripts_free(scripts);
    redis_sync_free(redis);
    for (int ds = 0; ds < 2; ds++)
        pgpool_conn_close(pg[ds]);
    for (int i = 0; i < 4; i++)
        free(secrets[i]);
    return rc;
}
