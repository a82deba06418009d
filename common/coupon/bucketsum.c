/* A template's stock over its buckets (bucketsum.h). */
#include "bucketsum.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

void bucketsum_clear(bucketsum_bucket *b)
{
    for (size_t i = 0; i < b->nxo; i++)
        free(b->xo[i].id);
    for (size_t i = 0; i < b->nxi; i++)
        free(b->xi[i]);
    free(b->xo);
    free(b->xi);
    memset(b, 0, sizeof(*b));
}

qn_status bucketsum_read(bucketsum_bucket *b, const redisReply *h)
{
    size_t capxo = 0, capxi = 0;
    memset(b, 0, sizeof(*b));
    if (!h || h->type != REDIS_REPLY_ARRAY)
        return QN_EINVAL;
    b->exists = h->elements > 0;
    for (size_t i = 0; i + 1 < h->elements; i += 2) {
        const char *f = h->element[i]->str, *v = h->element[i + 1]->str;
        if (!f || !v)
            continue;
        if (!strcmp(f, "stock")) {
            b->has_stock = 1;
            b->stock = strtoll(v, NULL, 10);
        } else if (!strncmp(f, "xo:", 3)) {
            int64_t units, home, at;
            if (sscanf(v, "%" SCNd64 ":%" SCNd64 ":%" SCNd64, &units, &home, &at) != 3 || units < 1)
                continue; /* not a record bucket_give.lua writes */
            if (grow(&b->xo, &capxo, b->nxo + 1, sizeof(*b->xo), 4) != QN_OK)
                goto oom;
            bucketsum_xo *x = &b->xo[b->nxo];
            if (!(x->id = strdup(f + 3)))
                goto oom;
            x->units = units;
            x->home = (int)home;
            b->nxo++;
        } else if (!strncmp(f, "xi:", 3)) {
            if (grow(&b->xi, &capxi, b->nxi + 1, sizeof(*b->xi), 8) != QN_OK ||
                !(b->xi[b->nxi] = strdup(f + 3)))
                goto oom;
            b->nxi++;
        }
    }
    return QN_OK;
oom:
    bucketsum_clear(b);
    return QN_ENOMEM;
}

int bucketsum_took(const bucketsum_bucket *b, const char *id)
{
    for (size_t i = 0; i < b->nxi; i++)
        if (!strcmp(b->xi[i], id))
            return 1;
    return 0;
}

int64_t bucketsum_on_way(const bucketsum_bucket *b, int n)
{
    int64_t units = 0;
    for (int d = 0; d < n; d++)
        for (size_t i = 0; i < b[d].nxo; i++) {
            const bucketsum_xo *x = &b[d].xo[i];
            /* a home out of range is no bucket of these: its units are still on their way */
            if (x->home < 0 || x->home >= n || !bucketsum_took(&b[x->home], x->id))
                units += x->units;
        }
    return units;
}

int64_t bucketsum_total(const bucketsum_bucket *b, int n)
{
    int64_t stock = 0;
    int any = 0;
    for (int i = 0; i < n; i++)
        if (b[i].has_stock) {
            stock += b[i].stock;
            any = 1;
        }
    return any ? stock + bucketsum_on_way(b, n) : -1;
}
