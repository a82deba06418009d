/*
 * quan-bloom-rebuild: rewrites the bloom filter of template ids (KEYS_TEMPLATE_BLOOM) from the
 * databases, for operators: after a Redis loss, after changing QUAN_BLOOM_EXPECTED or
 * QUAN_BLOOM_FP_PER_MILLION, or to drop ids of deleted templates.
 *
 * It scans every t_coupon_template_N of ds_0 and ds_1 (keyset pages by id), sets the bits of
 * each id in a temporary key, then RENAMEs that key over the live one: readers switch from the
 * old filter to the complete new one at once, never seeing a half-built filter. Templates
 * created while the scan ran set their bits in the old key, which the RENAME discards, so a
 * second pass adds the ids of rows created since the scan began (minus a minute, for
 * transactions that were open then) to the live key.
 *
 * Exit status: 0 done, 1 error, 2 usage.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloom.h"
#include "config.h"
#include "keys.h"
#include "log.h"
#include "now.h"
#include "pgparam.h"
#include "pgpool.h"
#include "redis.h"
#include "redis_sync.h"
#include "rsentinel.h"
#include "shard.h"

#define REBUILD_PAGE        5000
#define REBUILD_CATCHUP_S   60
#define REBUILD_REDIS_TO_MS 10000

static void usage(FILE *f)
{
    fprintf(f,
            "usage: quan-bloom-rebuild [--help]\n"
            "\n"
            "Rebuilds the bloom filter of template ids (Redis key %s) from every\n"
            "t_coupon_template_N of both databases, then switches it in atomically (RENAME).\n"
            "\n"
            "Environment (use the same bloom values as quan-merchant-admin and quan-engine):\n"
            "  QUAN_DS0_DSN, QUAN_DS1_DSN    libpq URIs (required)\n"
            "  QUAN_REDIS_HOST, QUAN_REDIS_PORT, QUAN_REDIS_PASSWORD (127.0.0.1, 6379, none)\n"
            "  QUAN_REDIS_CLUSTER_NODES      Redis Cluster nodes host:port,host:port (none)\n"
            "  QUAN_REDIS_SENTINELS, QUAN_REDIS_MASTER_NAME\n"
            "                                Redis Sentinel: the sentinels host:port,... and\n"
            "                                the master's name (none)\n"
            "  QUAN_BLOOM_EXPECTED           templates the filter is sized for (%d)\n"
            "  QUAN_BLOOM_FP_PER_MILLION     false-positive rate per million (%d)\n"
            "The secrets (the DSNs, the Redis password) may be given as files instead:\n"
            "QUAN_DS0_DSN_FILE=PATH etc., one trailing newline dropped.\n",
            KEYS_TEMPLATE_BLOOM, BLOOM_TPL_DEFAULT_EXPECTED, BLOOM_TPL_DEFAULT_FP_PER_MILLION);
}

static int64_t env_int(const char *name, int64_t def, int *bad)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return def;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (*end) {
        fprintf(stderr, "quan-bloom-rebuild: %s: not an integer\n", name);
        *bad = 1;
    }
    return x;
}

/* Sets the bits of ids[0..n) in key with one pipelined round trip. */
static qn_status rebuild_set_bits(redis_sync *rs, const char *key, const bloom_params *p,
                                  const int64_t *ids, int n)
{
    uint64_t pos[BLOOM_MAX_K];
    int sent = 0;
    qn_status st = QN_OK;
    for (int i = 0; i < n; i++) {
        bloom_positions(p, ids[i], pos);
        for (int k = 0; k < p->k; k++, sent++)
            redis_sync_append(rs, "SETBIT %s %llu 1", key, (unsigned long long)pos[k]);
    }
    for (int i = 0; i < sent; i++) {
        redisReply *r = NULL;
        if (redis_sync_get_reply(rs, &r) != QN_OK)
            return QN_ERR; /* the rest is dropped by the next command */
        if (r->type == REDIS_REPLY_ERROR) {
            fprintf(stderr, "quan-bloom-rebuild: SETBIT: %s\n", r->str);
            st = QN_ERR;
        }
        freeReplyObject(r);
    }
    return st;
}

/* Adds the ids of every template of database ds (since since_ms when > 0) to key. */
static qn_status rebuild_scan(pgpool_conn *c, int ds, redis_sync *rs, const char *key,
                              const bloom_params *p, int64_t since_ms, int64_t *count)
{
    int n = shard_table_count("t_coupon_template");
    int64_t *ids = malloc(sizeof(*ids) * REBUILD_PAGE);
    if (!ids)
        return QN_ENOMEM;
    qn_status st = QN_OK;
    for (int i = 0; i < n && st == QN_OK; i++) {
        shard_route r;
        if (shard_route_index("t_coupon_template", i, &r) != QN_OK || r.ds != ds)
            continue;
        char sql[256];
        snprintf(sql, sizeof(sql),
                 "SELECT id FROM %s WHERE del_flag = 0 AND id > $1 AND ($2::bigint = 0 OR "
                 "create_time >= to_timestamp($2::bigint / 1000.0) - interval '%d seconds') "
                 "ORDER BY id LIMIT %d",
                 r.table, REBUILD_CATCHUP_S, REBUILD_PAGE);
        int64_t last = 0;
        for (;;) {
            pgparam q = {0};
            pgparam_i64(&q, last);
            pgparam_i64(&q, since_ms);
            PGresult *res = pgpool_exec(c, sql, q.n, q.v);
            if (!res) {
                fprintf(stderr, "quan-bloom-rebuild: %s: %s\n", r.table, pgpool_conn_error(c));
                st = QN_ERR;
                break;
            }
            int rows = PQntuples(res);
            for (int k = 0; k < rows; k++)
                ids[k] = strtoll(PQgetvalue(res, k, 0), NULL, 10);
            PQclear(res);
            if (rows == 0)
                break;
            if (rebuild_set_bits(rs, key, p, ids, rows) != QN_OK) {
                fprintf(stderr, "quan-bloom-rebuild: redis: %s\n", redis_sync_errstr(rs));
                st = QN_ERR;
                break;
            }
            *count += rows;
            last = ids[rows - 1];
            if (rows < REBUILD_PAGE)
                break;
        }
    }
    free(ids);
    return st;
}

static redisReply *rebuild_cmd(redis_sync *rs, const char *what, redisReply *r)
{
    if (!r || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "quan-bloom-rebuild: %s: %s\n", what, r ? r->str : redis_sync_errstr(rs));
        if (r)
            freeReplyObject(r);
        return NULL;
    }
    return r;
}

int main(int argc, char **argv)
{
    int rc_exit = 1, bad = 0;
    redis_sync *rs = NULL;
    pgpool_conn *conns[SHARD_DB_COUNT] = {NULL};
    char tmp[KEYS_LEN], header[BLOOM_HEADER_LEN + 1];
    int tmp_made = 0;
    bloom_params p;
    /* The secrets, from the environment or their _FILE: ds_0's DSN, ds_1's, the Redis password. */
    static const char *const secret_names[3] = {"QUAN_DS0_DSN", "QUAN_DS1_DSN",
                                                "QUAN_REDIS_PASSWORD"};
    char *secrets[3] = {NULL, NULL, NULL}, err[512];

    if (argc > 1) {
        int help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    rc_exit = 2;
    for (int i = 0; i < 3; i++) {
        if (config_secret(secret_names[i], &secrets[i], err, sizeof(err)) != QN_OK) {
            fprintf(stderr, "quan-bloom-rebuild: %s\n", err);
            goto done;
        }
    }
    const char *dsn[SHARD_DB_COUNT] = {secrets[0], secrets[1]};
    const char *host = getenv("QUAN_REDIS_HOST");
    const char *password = secrets[2];
    const char *nodes = getenv("QUAN_REDIS_CLUSTER_NODES");
    char why[256];
    int64_t port = env_int("QUAN_REDIS_PORT", 6379, &bad);
    if (redis_sync_nodes_check(nodes, why, sizeof(why)) != QN_OK) {
        fprintf(stderr, "quan-bloom-rebuild: QUAN_REDIS_CLUSTER_NODES: %s\n", why);
        goto done;
    }
    const char *sentinels = getenv("QUAN_REDIS_SENTINELS");
    const char *master_name = getenv("QUAN_REDIS_MASTER_NAME");
    if (rsentinel_check(sentinels, master_name, nodes, why, sizeof(why)) != QN_OK) {
        fprintf(stderr, "quan-bloom-rebuild: %s\n", why);
        goto done;
    }
    int64_t expected = env_int("QUAN_BLOOM_EXPECTED", BLOOM_TPL_DEFAULT_EXPECTED, &bad);
    int64_t fp = env_int("QUAN_BLOOM_FP_PER_MILLION", BLOOM_TPL_DEFAULT_FP_PER_MILLION, &bad);
    if (bad || !dsn[0] || !dsn[1]) {
        if (!bad)
            fprintf(stderr, "quan-bloom-rebuild: QUAN_DS0_DSN and QUAN_DS1_DSN are required "
                            "(or their _FILE)\n");
        goto done;
    }
    if (bloom_params_for(expected, fp, &p) != QN_OK) {
        fprintf(stderr,
                "quan-bloom-rebuild: bad QUAN_BLOOM_EXPECTED / QUAN_BLOOM_FP_PER_MILLION\n");
        goto done;
    }
    rc_exit = 1;
    int64_t start_ms = now_wall_ms();

    redis_sync_opts ro = {.host = host && *host ? host : "127.0.0.1",
                          .port = (int)port,
                          .password = password,
                          .timeout_ms = REBUILD_REDIS_TO_MS,
                          .cluster_nodes = nodes,
                          .sentinels = sentinels,
                          .master_name = master_name};
    rs = redis_sync_new(&ro);
    if (!rs || redis_sync_open(rs) != QN_OK) {
        fprintf(stderr, "quan-bloom-rebuild: redis: %s\n",
                rs ? redis_sync_errstr(rs) : "bad address");
        goto done;
    }
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++) {
        pgpool_opts o = {
            .dsn = dsn[ds], .name = ds ? "ds_1" : "ds_0", .application_name = "quan-bloom-rebuild"};
        conns[ds] = pgpool_conn_open(&o);
        if (!conns[ds] || !pgpool_conn_ok(conns[ds])) {
            fprintf(stderr, "quan-bloom-rebuild: ds_%d: %s\n", ds,
                    conns[ds] ? pgpool_conn_error(conns[ds]) : "out of memory");
            goto done;
        }
    }

    /* A fresh key: the header, then every bit allocated up front (one SETBIT at the end). */
    keys_bloom_rebuild(tmp, KEYS_TEMPLATE_BLOOM, getpid());
    bloom_header(&p, header);
    redisReply *r = rebuild_cmd(rs, "DEL", redis_sync_command(rs, "DEL %s", tmp));
    if (!r)
        goto done;
    freeReplyObject(r);
    tmp_made = 1;
    if (!(r = rebuild_cmd(rs, "SETRANGE", redis_sync_command(rs, "SETRANGE %s 0 %s", tmp, header))))
        goto done;
    freeReplyObject(r);
    if (!(r = rebuild_cmd(rs, "SETBIT",
                          redis_sync_command(rs, "SETBIT %s %llu 0", tmp,
                                             (unsigned long long)(BLOOM_HEADER_BITS + p.m - 1)))))
        goto done;
    freeReplyObject(r);

    int64_t count = 0, late = 0;
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++)
        if (rebuild_scan(conns[ds], ds, rs, tmp, &p, 0, &count) != QN_OK)
            goto done;
    if (!(r = rebuild_cmd(rs, "RENAME",
                          redis_sync_command(rs, "RENAME %s %s", tmp, KEYS_TEMPLATE_BLOOM))))
        goto done;
    freeReplyObject(r);
    tmp_made = 0;
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++)
        if (rebuild_scan(conns[ds], ds, rs, KEYS_TEMPLATE_BLOOM, &p, start_ms, &late) != QN_OK)
            goto done;
    printf("bloom filter %s rebuilt: %" PRId64 " templates (%" PRId64
           " re-added after the switch), %" PRIu64 " bits, %d hashes\n",
           KEYS_TEMPLATE_BLOOM, count, late, p.m, p.k);
    rc_exit = 0;
done:
    if (rs && tmp_made)
        freeReplyObject(redis_sync_command(rs, "DEL %s", tmp));
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++)
        if (conns[ds])
            pgpool_conn_close(conns[ds]);
    redis_sync_free(rs);
    for (int i = 0; i < 3; i++)
        free(secrets[i]);
    return rc_exit;
}
