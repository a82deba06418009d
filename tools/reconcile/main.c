/*
 * quan-reconcile: Redis claim state against the databases, for operators.
 *
 *   quan-reconcile [--dry-run] --template ID     one template
 *   quan-reconcile [--dry-run] --all             every template that can be claimed now
 *
 * For each template it prints one line: the stock in Redis, in the database, the claims in
 * flight (reservations open and not in the database yet), the stock Redis must have, and the
 * users whose claim counter is not what their coupons and claims in flight say. Without
 * --dry-run a template that differs is repaired (services/engine/reconcile.h): closed to claims
 * for the moment of the repair (they answer 503, try again), then written from the databases.
 * With --dry-run nothing is written; on a template being claimed the comparison is a snapshot,
 * so a small difference that a second run does not show was a claim in progress.
 *
 * Reads QUAN_DS0_DSN, QUAN_DS1_DSN, QUAN_REDIS_HOST, QUAN_REDIS_PORT, QUAN_REDIS_PASSWORD,
 * QUAN_REDIS_CLUSTER_NODES (a Redis Cluster's nodes to start from, host:port,...),
 * QUAN_REDIS_SENTINELS and QUAN_REDIS_MASTER_NAME (a Sentinel deployment), QUAN_LUA_DIR;
 * the secrets (the DSNs, the Redis password) may be files instead, QUAN_..._FILE (config.h).
 * Exit status 0: nothing differs (or everything was repaired); 1: differences found by --dry-run;
 * 2: usage; 3: a database or Redis error.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "reconcile.h"
#include "rsentinel.h"

static int rc_usage(void)
{
    fprintf(stderr, "usage: quan-reconcile [--dry-run] --template ID | --all\n");
    return 2;
}

static const char *env_or(const char *name, const char *dflt)
{
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

int main(int argc, char **argv)
{
    int dry = 0, all = 0, rc = 3;
    int64_t id = 0;
    pgpool_conn *pg[2] = {NULL, NULL};
    redis_sync *redis = NULL;
    redis_scripts *scripts = NULL;
    reconcile_tpl *t = NULL;
    size_t n = 0;
    /* The secrets: QUAN_DS0_DSN, QUAN_DS1_DSN, QUAN_REDIS_PASSWORD (or their _FILE). */
    static const char *const secret_names[3] = {"QUAN_DS0_DSN", "QUAN_DS1_DSN",
                                                "QUAN_REDIS_PASSWORD"};
    char *secrets[3] = {NULL, NULL, NULL}, err[512];

    log_init("quan-reconcile", LOGL_WARN);
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--dry-run"))
            dry = 1;
        else if (!strcmp(argv[i], "--all"))
            all = 1;
        else if (!strcmp(argv[i], "--template") && i + 1 < argc &&
                 (id = strtoll(argv[++i], &end, 10)) > 0 && !*end)
            continue;
        else
            return rc_usage();
    }
    if (all == (id > 0))
        return rc_usage();
    char why[256];
    const char *nodes = env_or("QUAN_REDIS_CLUSTER_NODES", "");
    if (redis_sync_nodes_check(nodes, why, sizeof(why)) != QN_OK) {
        fprintf(stderr, "quan-reconcile: QUAN_REDIS_CLUSTER_NODES: %s\n", why);
        return 2;
    }
    const char *sentinels = env_or("QUAN_REDIS_SENTINELS", "");
    const char *master_name = env_or("QUAN_REDIS_MASTER_NAME", "");
    if (rsentinel_check(sentinels, master_name, nodes, why, sizeof(why)) != QN_OK) {
        fprintf(stderr, "quan-reconcile: %s\n", why);
        return 2;
    }
    for (int i = 0; i < 3; i++) {
        if (config_secret(secret_names[i], &secrets[i], err, sizeof(err)) != QN_OK) {
            fprintf(stderr, "quan-reconcile: %s\n", err);
            rc = 2;
            goto out;
        }
    }
    for (int ds = 0; ds < 2; ds++) {
        const char *dsn = secrets[ds];
        pgpool_opts po = {
            .dsn = dsn, .name = ds ? "ds_1" : "ds_0", .application_name = "quan-reconcile"};
        if (!dsn || !(pg[ds] = pgpool_conn_open(&po)) || pgpool_conn_ensure(pg[ds]) != QN_OK) {
            fprintf(stderr, "quan-reconcile: cannot reach ds_%d (QUAN_DS%d_DSN)\n", ds, ds);
            goto out;
        }
    }
    redis_sync_opts ro = {.host = env_or("QUAN_REDIS_HOST", "127.0.0.1"),
                          .port = atoi(env_or("QUAN_REDIS_PORT", "6379")),
                          .password = secrets[2] ? secrets[2] : "",
                          .timeout_ms = 5000,
                          .cluster_nodes = nodes,
                          .sentinels = sentinels,
                          .master_name = master_name};
    redis = redis_sync_new(&ro);
    scripts = redis_scripts_load_dir(env_or("QUAN_LUA_DIR", "lua-scripts"));
    if (!redis || redis_sync_open(redis) != QN_OK || !scripts) {
        fprintf(stderr, "quan-reconcile: cannot reach Redis or read the Lua scripts\n");
        goto out;
    }
    if (all) {
        if (reconcile_list_active(pg, &t, &n) != QN_OK)
            goto out;
    } else {
        if (!(t = calloc(1, sizeof(*t))))
            goto out;
        t->id = id;
        qn_status st = reconcile_find(pg, id, &t->shop);
        if (st == QN_ENOTFOUND) {
            fprintf(stderr, "quan-reconcile: no template %" PRId64 "\n", id);
            rc = 1;
            goto out;
        }
        if (st != QN_OK)
            goto out;
        n = 1;
    }
    /* Compare all first; repair only those that differ. */
    reconcile_opts look = {.apply = 0}, fix = {.apply = 1};
    if (reconcile_run(redis, scripts, pg, t, n, &look) != QN_OK)
        goto out;
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        if (!reconcile_differs(&t[i]))
            continue;
        differ++;
        if (!dry && reconcile_run(redis, scripts, pg, &t[i], 1, &fix) != QN_OK)
            goto out;
    }
    for (size_t i = 0; i < n; i++)
        printf("template=%" PRId64 " shop=%" PRId64 " redis_stock=%lld db_stock=%lld "
               "inflight=%lld want_stock=%lld counters=%lld counters_wrong=%lld%s\n",
               t[i].id, t[i].shop, t[i].redis_stock, t[i].db_stock, t[i].inflight, t[i].want_stock,
               t[i].counters, t[i].counters_wrong, t[i].repaired ? " repaired" : "");
    printf("%zu templates, %d differ%s\n", n, differ,
           differ && !dry ? ", repaired"
           : differ       ? " (dry run: nothing written)"
                          : "");
    rc = differ && dry ? 1 : 0;
out:
    free(t);
    redis_scripts_free(scripts);
    redis_sync_free(redis);
    for (int ds = 0; ds < 2; ds++)
        pgpool_conn_close(pg[ds]);
    for (int i = 0; i < 3; i++)
        free(secrets[i]);
    return rc;
}
