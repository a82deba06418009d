/* A Redis Cluster's nodes and slot map, and the verdict of a reply (see rcluster.h). */
#include "rcluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "namelist.h"

int rcluster_addr_parse(const char *s, size_t len, rcluster_addr *a, int strict)
{
    const char *h = s, *colon;
    size_t hlen;
    if (strict && len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close || close + 1 >= s + len || close[1] != ':')
            return 0;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = memrchr(s, ':', len);
        if (!colon)
            return 0;
        hlen = (size_t)(colon - s);
        if (strict && memchr(s, ':', hlen))
            return 0; /* a bare IPv6 address is ambiguous: [v6]:port */
    }
    if ((strict && hlen == 0) || hlen >= RCLUSTER_HOST_MAX)
        return 0;
    const char *p = colon + 1, *end = s + len;
    long port = 0;
    if (p == end || end - p > 5)
        return 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        port = port * 10 + (*p - '0');
    }
    if (port < 1 || port > 65535)
        return 0;
    memcpy(a->host, h, hlen);
    a->host[hlen] = '\0';
    a->port = (int)port;
    return 1;
}

int rcluster_addrs_parse(const char *list, rcluster_addr *out, int max, char *err, size_t errlen)
{
    int n = 0;
    namelist it = namelist_of(list);
    const char *a;
    size_t len;
    while (namelist_next(&it, NAMELIST_TRIM, &a, &len)) {
        rcluster_addr tmp;
        if (!rcluster_addr_parse(a, len, &tmp, 1)) {
            qn_errf(err, errlen, "\"%.*s\" is not host:port (a port 1..65535)", (int)len, a);
            return -1;
        }
        if (n == max) {
            qn_errf(err, errlen, "more than %d entries", max);
            return -1;
        }
        if (out)
            out[n] = tmp;
        n++;
    }
    if (n == 0) {
        qn_errf(err, errlen, "no host:port given");
        return -1;
    }
    return n;
}

rcluster_verdict rcluster_verdict_of(const redisReply *r, int *slot, rcluster_addr *to)
{
    rcluster_verdict k;
    const char *p;
    if (!r || r->type != REDIS_REPLY_ERROR || !r->str)
        return RCLUSTER_FINAL;
    if (!strncmp(r->str, "TRYAGAIN", 8) || !strncmp(r->str, "CLUSTERDOWN", 11) ||
        !strncmp(r->str, "LOADING", 7))
        return RCLUSTER_RETRY;
    if (!strncmp(r->str, "MOVED ", 6)) {
        k = RCLUSTER_MOVED;
        p = r->str + 6;
    } else if (!strncmp(r->str, "ASK ", 4)) {
        k = RCLUSTER_ASK;
        p = r->str + 4;
    } else {
        return RCLUSTER_FINAL;
    }
    char *end;
    long s = strtol(p, &end, 10);
    if (end == p || *end != ' ' || s < 0 || s >= RSLOT_COUNT ||
        !rcluster_addr_parse(end + 1, strlen(end + 1), to, 0))
        return RCLUSTER_FINAL;
    *slot = (int)s;
    return k;
}

void rcluster_map_init(rcluster_map *m, int maxnodes, rcluster_new_node_fn new_node, void *ctx)
{
    memset(m, 0, sizeof(*m));
    m->maxnodes = maxnodes;
    m->new_node = new_node;
    m->ctx = ctx;
}

void rcluster_map_free(rcluster_map *m)
{
    free(m->slot);
    free(m->addr);
    free(m->first_slot);
    free(m->masters);
    m->slot = NULL;
    m->addr = NULL;
    m->first_slot = m->masters = NULL;
    m->nnodes = m->nmasters = 0;
    m->cap_addr = m->cap_first_slot = m->cap_masters = 0;
}

int rcluster_map_find(const rcluster_map *m, const rcluster_addr *a)
{
    for (int i = 0; i < m->nnodes; i++)
        if (m->addr[i].port == a->port && !strcmp(m->addr[i].host, a->host))
            return i;
    return -1;
}

int rcluster_map_node(rcluster_map *m, const rcluster_addr *a, char *err, size_t errlen)
{
    int i = rcluster_map_find(m, a);
    if (i >= 0)
        return i;
    if (m->nnodes == m->maxnodes) {
        qn_errf(err, errlen, "more than %d cluster nodes seen", m->maxnodes);
        return -1;
    }
    size_t need = (size_t)m->nnodes + 1;
    if (grow(&m->addr, &m->cap_addr, need, sizeof(*m->addr), 8) != QN_OK ||
        grow(&m->first_slot, &m->cap_first_slot, need, sizeof(*m->first_slot), 8) != QN_OK ||
        grow(&m->masters, &m->cap_masters, need, sizeof(*m->masters), 8) != QN_OK) {
        qn_errf(err, errlen, "out of memory");
        return -1;
    }
    i = m->nnodes;
    m->addr[i] = *a;
    m->first_slot[i] = RSLOT_COUNT;
    if (m->new_node && m->new_node(m->ctx, i, a) != 0) {
        qn_errf(err, errlen, "cannot add the node %s:%d", a->host, a->port);
        return -1;
    }
    m->nnodes++;
    return i;
}

static int by_first_slot(const void *x, const void *y, void *arg)
{
    const rcluster_map *m = arg;
    int a = m->first_slot[*(const int *)x], b = m->first_slot[*(const int *)y];
    return (a > b) - (a < b);
}

qn_status rcluster_map_apply(rcluster_map *m, const redisReply *r, const rcluster_addr *from,
                             char *err, size_t errlen)
{
    int16_t *next = NULL;
    qn_status st = QN_ERR;
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
        qn_errf(err, errlen, "%s:%d: CLUSTER SLOTS: %s", from->host, from->port,
                r->type == REDIS_REPLY_ERROR ? r->str : "no slot is served");
        return QN_ERR;
    }
    next = malloc(RSLOT_COUNT * sizeof(*next));
    if (!next) {
        qn_errf(err, errlen, "out of memory");
        return QN_ENOMEM;
    }
    memset(next, 0xff, RSLOT_COUNT * sizeof(*next)); /* -1 */
    for (size_t i = 0; i < r->elements; i++) {
        rslot_range g;
        if (!rslot_range_of(r->element[i], &g)) {
            qn_errf(err, errlen, "%s:%d: CLUSTER SLOTS: unexpected reply", from->host, from->port);
            goto out;
        }
        rcluster_addr a;
        if (g.hostlen == 0 || (g.hostlen == 1 && g.host[0] == '?'))
            a = *from;
        else if (g.hostlen >= sizeof(a.host))
            continue;
        else {
            memcpy(a.host, g.host, g.hostlen);
            a.host[g.hostlen] = '\0';
            a.port = g.port;
        }
        int k = rcluster_map_node(m, &a, err, errlen);
        if (k < 0)
            goto out;
        for (int s = g.from; s <= g.to; s++)
            next[s] = (int16_t)k;
    }
    int complete = 1, changed = 0;
    for (int s = 0; s < RSLOT_COUNT; s++) {
        if (next[s] < 0)
            complete = 0;
        if (!m->slot || next[s] != m->slot[s])
            changed = 1;
    }
    m->topology += (unsigned long)changed;
    free(m->slot); /* the new table replaces it */
    m->slot = next;
    for (int i = 0; i < m->nnodes; i++)
        m->first_slot[i] = RSLOT_COUNT;
    for (int s = RSLOT_COUNT - 1; s >= 0; s--)
        if (next[s] >= 0)
            m->first_slot[next[s]] = s;
    m->nmasters = 0;
    for (int i = 0; i < m->nnodes; i++)
        if (m->first_slot[i] < RSLOT_COUNT)
            m->masters[m->nmasters++] = i;
    qsort_r(m->masters, (size_t)m->nmasters, sizeof(*m->masters), by_first_slot, m);
    m->have_map = 1;
    m->complete = complete;
    return QN_OK;
out:
    free(next);
    return st;
}

void rcluster_map_moved(rcluster_map *m, int slot, int node)
{
    if (!m->slot || slot < 0 || slot >= RSLOT_COUNT || node < 0 || node >= m->nnodes ||
        m->slot[slot] == node)
        return;
    m->slot[slot] = (int16_t)node;
    m->topology++;
}

int rcluster_map_master(const rcluster_map *m, int slot)
{
    return m->slot && slot >= 0 && slot < RSLOT_COUNT ? m->slot[slot] : -1;
}

int rcluster_map_is_master(const rcluster_map *m, int node)
{
    return node >= 0 && node < m->nnodes && m->first_slot[node] < RSLOT_COUNT;
}
