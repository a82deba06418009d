/*
 * A Redis Cluster for a unit test: three masters and three replicas started with
 * deploy/local/rcluster.sh in a temporary directory, on six free consecutive loopback ports,
 * without persistence; stopped (and its directory removed) by rch_stop.
 *
 * Tests that move slots, promote replicas or kill masters run against their own cluster, so
 * they need nothing from the environment and disturb nobody.
 */
#ifndef QUAN_RCLUSTER_HELP_H
#define QUAN_RCLUSTER_HELP_H

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "testhelp.h"

typedef struct rch_cluster {
    char dir[64];
    int base;        /* ports base .. base + 5 */
    char nodes[160]; /* "127.0.0.1:P,..." */
} rch_cluster;

/* The repository's root: where deploy/local/rcluster.sh is (tests run from it). */
static const char *rch_script(void)
{
    const char *root = getenv("QUAN_ROOT");
    static char path[512];
    snprintf(path, sizeof(path), "%s/deploy/local/rcluster.sh", root && *root ? root : ".");
    return path;
}

/* 0 on success. Ports come from 21000-22000, so that each node's cluster bus (its port +
 * 10000) stays below the kernel's ephemeral range (32768 up), as infra.sh's picks do. */
static int rch_start(rch_cluster *k)
{
    char cmd[1024];
    memset(k, 0, sizeof(*k));
    snprintf(k->dir, sizeof(k->dir), "/tmp/quan-rcluster-XXXXXX");
    if (!mkdtemp(k->dir))
        return -1;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    for (int attempt = 0; attempt < 50 && !k->base; attempt++) {
        int b = 21000 + (rand() % 1000);
        int ok = 1;
        for (int i = 0; i < 6 && ok; i++)
            ok = th_port_free(b + i) && th_port_free(b + i + 10000);
        if (ok)
            k->base = b;
    }
    if (!k->base)
        return -1;
    snprintf(cmd, sizeof(cmd), "QUAN_INFRA_DURABILITY=fast %s start %s %d >%s/start.log 2>&1",
             rch_script(), k->dir, k->base, k->dir);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof(cmd), "cat %s/start.log", k->dir);
        if (system(cmd) != 0)
            return -1;
        return -1;
    }
    for (int i = 0; i < 6; i++)
        snprintf(k->nodes + strlen(k->nodes), sizeof(k->nodes) - strlen(k->nodes), "%s127.0.0.1:%d",
                 i ? "," : "", k->base + i);
    return 0;
}

/* Starts the nodes that are not running (a node stopped by a test comes back). 0 on success. */
static int rch_restart_dead(rch_cluster *k)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "QUAN_INFRA_DURABILITY=fast %s start %s %d >>%s/start.log 2>&1",
             rch_script(), k->dir, k->base, k->dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void rch_stop(rch_cluster *k)
{
    char cmd[1024];
    if (!k->dir[0])
        return;
    snprintf(cmd, sizeof(cmd), "%s stop %s >/dev/null 2>&1; rm -rf %s", rch_script(), k->dir,
             k->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "rcluster_help: stopping %s failed\n", k->dir);
    k->dir[0] = '\0';
}

/* Runs "redis-cli -p PORT ARGS" and returns its first output line in out (may be NULL).
 * 0 when redis-cli exited 0. */
static int rch_cli(int port, const char *args, char *out, size_t outlen)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "redis-cli -h 127.0.0.1 -p %d %s 2>&1", port, args);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    char line[512] = "";
    if (!fgets(line, sizeof(line), p))
        line[0] = '\0';
    char rest[512];
    while (fgets(rest, sizeof(rest), p))
        ;
    int rc = pclose(p);
    line[strcspn(line, "\r\n")] = '\0';
    if (out)
        snprintf(out, outlen, "%s", line);
    return rc == 0 ? 0 : -1;
}

#endif
