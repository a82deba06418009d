#include "metrics.h"

#include <event2/buffer.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hash.h"
#include "log.h"
#include "namelist.h"

const double metrics_buckets[METRICS_NBUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                  0.1,    0.25,  0.5,    1,     2.5,  5,     10};
/* The same bounds as written in the output, so `le` values never depend on %g rounding. */
static const char *const metrics_bucket_str[METRICS_NBUCKETS] = {
    "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
    "0.1",    "0.25",  "0.5",    "1",     "2.5",  "5",     "10"};

METRICS_DEFINE(METRICS_PROCESS)

struct metrics_series {
    metrics_type type;
    char *labels[METRICS_MAX_LABELS];
    uint64_t hash;
    _Atomic int64_t value; /* counters and gauges */
    /* Histograms: per-bucket (not cumulative) counts, the last one is +Inf. The count is their
     * sum at render time, so _count always equals the +Inf bucket even mid-update. */
    _Atomic uint64_t buckets[METRICS_NBUCKETS + 1];
    _Atomic uint64_t sum_ns;
};

/* The registered families, in registration order: appended under metrics_mu, walked by the
 * render without it (a family's next is set before the family is linked). */
static _Atomic(metrics_family *) metrics_head;
static metrics_family *metrics_tail;
static pthread_mutex_t metrics_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic unsigned metrics_gen = 1; /* bumped by metrics_shutdown (0: never valid) */
static const char *const metrics_other[METRICS_MAX_LABELS + 1] = {"other", "other", "other", NULL};

static int metrics_nlabels(const metrics_family *f)
{
    return (int)namelist_count(f->labels);
}

/* Appends f to the render's list unless it is there. Caller holds metrics_mu. */
static void metrics_list_locked(metrics_family *f)
{
    if (f->listed)
        return;
    f->listed = true;
    atomic_store_explicit(&f->next, NULL, memory_order_relaxed);
    if (metrics_tail)
        atomic_store_explicit(&metrics_tail->next, f, memory_order_release);
    else
        atomic_store_explicit(&metrics_head, f, memory_order_release);
    metrics_tail = f;
}

void metrics_register(metrics_family *const *list)
{
    pthread_mutex_lock(&metrics_mu);
    for (size_t i = 0; list && list[i]; i++)
        metrics_list_locked(list[i]);
    pthread_mutex_unlock(&metrics_mu);
}

static uint64_t metrics_hash(const char *const *labels, int nl)
{
    uint64_t h = HASH_FNV_OFFSET;
    for (int i = 0; i < nl; i++) {
        h = hash_fnv1a(h, labels[i], strnlen(labels[i], METRICS_MAX_LABEL_LEN));
        h = (h ^ 0xff) * HASH_FNV_PRIME; /* a separator no label holds */
    }
    return h;
}

static int metrics_same(const metrics_series *s, const char *const *labels, int nl, uint64_t h)
{
    if (s->hash != h)
        return 0;
    for (int i = 0; i < nl; i++)
        if (strncmp(s->labels[i], labels[i], METRICS_MAX_LABEL_LEN) != 0)
            return 0;
    return 1;
}

/* Returns the series, or NULL with *slot_out set to the empty slot where it would go. */
static metrics_series *metrics_find(metrics_family *f, const char *const *labels, int nl,
                                    uint64_t h, size_t *slot_out)
{
    size_t i = h % METRICS_SLOTS;
    for (size_t probes = 0; probes < METRICS_SLOTS; probes++, i = (i + 1) % METRICS_SLOTS) {
        metrics_series *s = atomic_load_explicit(&f->slots[i], memory_order_acquire);
        if (!s) {
            if (slot_out)
                *slot_out = i;
            return NULL;
        }
        if (metrics_same(s, labels, nl, h))
            return s;
    }
    if (slot_out)
        *slot_out = METRICS_SLOTS; /* unreachable: the table is never more than half full */
    return NULL;
}

static metrics_series *metrics_create(metrics_family *f, const char *const *labels, int nl,
                                      uint64_t h)
{
    metrics_series *s = NULL;
    size_t slot;

    pthread_mutex_lock(&metrics_mu);
    s = metrics_find(f, labels, nl, h, &slot);
    if (s)
        goto done;
    unsigned n = atomic_load_explicit(&f->n, memory_order_relaxed);
    if (n >= METRICS_MAX_SERIES - 1 && labels != metrics_other) {
        /* Cardinality cap: keep one slot for the overflow series. */
        labels = metrics_other;
        h = metrics_hash(labels, nl);
        s = metrics_find(f, labels, nl, h, &slot);
        if (s)
            goto done;
    }
    if (n >= METRICS_MAX_SERIES || slot >= METRICS_SLOTS)
        goto done;
    s = calloc(1, sizeof(*s));
    if (!s)
        goto done;
    s->hash = h;
    s->type = f->type;
    for (int i = 0; i < nl; i++) {
        s->labels[i] = strndup(labels[i], METRICS_MAX_LABEL_LEN);
        if (!s->labels[i])
            goto fail;
    }
    f->order[n] = s;
    atomic_store_explicit(&f->slots[slot], s, memory_order_release);
    atomic_store_explicit(&f->n, n + 1, memory_order_release);
    metrics_list_locked(f);
    goto done;
fail:
    for (int i = 0; i < nl; i++)
        free(s->labels[i]);
    free(s);
    s = NULL;
done:
    pthread_mutex_unlock(&metrics_mu);
    return s;
}

static metrics_series *metrics_series_get(metrics_family *f, const char *const *labels, int create)
{
    if (!f)
        return NULL;
    int nl = metrics_nlabels(f), given = 0;
    while (labels && labels[given])
        given++;
    if (given != nl) {
        log_error(NULL, "metrics: %s takes %d labels, got %d", f->name, nl, given);
        return NULL;
    }
    if (!labels)
        labels = metrics_other; /* unread when nl == 0; avoids NULL checks below */
    uint64_t h = metrics_hash(labels, nl);
    metrics_series *s = metrics_find(f, labels, nl, h, NULL);
    if (!s && create)
        s = metrics_create(f, labels, nl, h);
    return s;
}

metrics_series *metrics_series_of(metrics_family *f, const char *const *labels)
{
    return metrics_series_get(f, labels, 1);
}

unsigned metrics_generation(void)
{
    return atomic_load_explicit(&metrics_gen, memory_order_acquire);
}

metrics_series *metrics_handle_series(metrics_handle *h, metrics_family *f,
                                      const char *const *labels)
{
    unsigned gen = metrics_generation();
    if (h->gen != gen || !h->s) {
        h->s = metrics_series_of(f, labels);
        h->gen = gen;
    }
    return h->s;
}

void metrics_series_add(metrics_series *s, int64_t delta)
{
    if (s && s->type != METRICS_HISTOGRAM)
        atomic_fetch_add_explicit(&s->value, delta, memory_order_relaxed);
}

void metrics_add_v(metrics_family *f, const char *const *labels, int64_t delta)
{
    metrics_series_add(metrics_series_get(f, labels, 1), delta);
}

void metrics_set_v(metrics_family *f, const char *const *labels, int64_t value)
{
    metrics_series *s = metrics_series_get(f, labels, 1);
    if (s && s->type != METRICS_HISTOGRAM)
        atomic_store_explicit(&s->value, value, memory_order_relaxed);
}

void metrics_observe_v(metrics_family *f, const char *const *labels, double seconds)
{
    if (!f || f->type != METRICS_HISTOGRAM)
        return;
    metrics_series_observe(metrics_series_get(f, labels, 1), seconds);
}

void metrics_series_observe(metrics_series *s, double seconds)
{
    if (!s || s->type != METRICS_HISTOGRAM)
        return;
    if (!(seconds > 0)) /* negative and NaN count as 0 */
        seconds = 0;
    int b = 0;
    while (b < METRICS_NBUCKETS && seconds > metrics_buckets[b])
        b++;
    atomic_fetch_add_explicit(&s->buckets[b], 1, memory_order_relaxed);
    double ns = seconds * 1e9;
    atomic_fetch_add_explicit(&s->sum_ns, ns < 1.8e19 ? (uint64_t)llround(ns) : UINT64_MAX / 2,
                              memory_order_relaxed);
}

static int64_t metrics_series_count(metrics_series *s)
{
    uint64_t n = 0;
    for (int b = 0; b <= METRICS_NBUCKETS; b++)
        n += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
    return (int64_t)n;
}

int64_t metrics_get_v(metrics_family *f, const char *const *labels)
{
    metrics_series *s = metrics_series_get(f, labels, 0);
    if (!s)
        return 0;
    if (s->type == METRICS_HISTOGRAM)
        return metrics_series_count(s);
    return atomic_load_explicit(&s->value, memory_order_relaxed);
}

void metrics_init(const char *service, const char *version)
{
    static metrics_family *const own[] = {METRICS_REFS(METRICS_PROCESS) NULL};
    metrics_register(own);
    metrics_set_l(&metric_quan_build_info, 1, version ? version : "unknown",
                  service ? service : "quan");
    metrics_set(&metric_quan_process_start_time_seconds, (int64_t)time(NULL));
}

void metrics_shutdown(void)
{
    pthread_mutex_lock(&metrics_mu);
    metrics_family *next;
    for (metrics_family *f = atomic_load(&metrics_head); f; f = next) {
        next = atomic_load(&f->next);
        unsigned n = atomic_load(&f->n);
        for (unsigned i = 0; i < n; i++) {
            for (int k = 0; k < METRICS_MAX_LABELS; k++)
                free(f->order[i]->labels[k]);
            free(f->order[i]);
            f->order[i] = NULL;
        }
        for (size_t i = 0; i < METRICS_SLOTS; i++)
            atomic_store(&f->slots[i], NULL);
        atomic_store(&f->n, 0);
        atomic_store(&f->next, NULL);
        f->listed = false;
    }
    atomic_store(&metrics_head, NULL);
    metrics_tail = NULL;
    atomic_fetch_add(&metrics_gen, 1);
    pthread_mutex_unlock(&metrics_mu);
}

/* ---- text format ---- */

/* Escapes a label value (\\, \", \n) or, with quote == 0, a HELP text (\\, \n). */
static size_t metrics_escape(char *dst, const char *src, int quote)
{
    size_t n = 0;
    for (; *src; src++) {
        if (*src == '\\')
            dst[n++] = '\\', dst[n++] = '\\';
        else if (*src == '\n')
            dst[n++] = '\\', dst[n++] = 'n';
        else if (*src == '"' && quote)
            dst[n++] = '\\', dst[n++] = '"';
        else
            dst[n++] = *src;
    }
    dst[n] = '\0';
    return n;
}

/* Writes `{a="x",b="y"` plus `,le="..."` if le, then `}`; nothing when there are no labels. */
static int metrics_put_labels(struct evbuffer *out, const metrics_family *f,
                              const metrics_series *s, const char *le)
{
    namelist names = namelist_of(f->labels);
    const char *name;
    size_t len;
    int nl = metrics_nlabels(f), rc = 0;
    char esc[METRICS_MAX_LABEL_LEN * 2 + 1];

    if (nl == 0 && !le)
        return 0;
    rc |= evbuffer_add(out, "{", 1);
    for (int i = 0; i < nl && namelist_next(&names, NAMELIST_EXACT, &name, &len); i++) {
        metrics_escape(esc, s->labels[i], 1);
        rc |= evbuffer_add_printf(out, "%s%.*s=\"%s\"", i ? "," : "", (int)len, name, esc) < 0;
    }
    if (le)
        rc |= evbuffer_add_printf(out, "%sle=\"%s\"", nl ? "," : "", le) < 0;
    rc |= evbuffer_add(out, "}", 1);
    return rc;
}

static int metrics_put_series(struct evbuffer *out, const metrics_family *f, metrics_series *s)
{
    const char *name = f->name;
    int rc = 0;

    if (f->type != METRICS_HISTOGRAM) {
        rc |= evbuffer_add_printf(out, "%s", name) < 0;
        rc |= metrics_put_labels(out, f, s, NULL);
        rc |= evbuffer_add_printf(
                  out, " %lld\n",
                  (long long)atomic_load_explicit(&s->value, memory_order_relaxed)) < 0;
        return rc;
    }
    /* Snapshot the buckets first so cumulative counts and _count agree with each other. */
    uint64_t cum = 0, snap[METRICS_NBUCKETS + 1];
    for (int b = 0; b <= METRICS_NBUCKETS; b++)
        snap[b] = atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
    for (int b = 0; b <= METRICS_NBUCKETS; b++) {
        cum += snap[b];
        rc |= evbuffer_add_printf(out, "%s_bucket", name) < 0;
        rc |= metrics_put_labels(out, f, s, b < METRICS_NBUCKETS ? metrics_bucket_str[b] : "+Inf");
        rc |= evbuffer_add_printf(out, " %llu\n", (unsigned long long)cum) < 0;
    }
    uint64_t sum_ns = atomic_load_explicit(&s->sum_ns, memory_order_relaxed);
    rc |= evbuffer_add_printf(out, "%s_sum", name) < 0;
    rc |= metrics_put_labels(out, f, s, NULL);
    rc |= evbuffer_add_printf(out, " %llu.%09llu\n", (unsigned long long)(sum_ns / 1000000000ULL),
                              (unsigned long long)(sum_ns % 1000000000ULL)) < 0;
    rc |= evbuffer_add_printf(out, "%s_count", name) < 0;
    rc |= metrics_put_labels(out, f, s, NULL);
    rc |= evbuffer_add_printf(out, " %llu\n", (unsigned long long)cum) < 0;
    return rc;
}

/* Resident set size from /proc/self/statm (second field, in pages); read at scrape time. */
static void metrics_update_process(void)
{
    FILE *fp = fopen("/proc/self/statm", "r");
    unsigned long size, resident;
    if (!fp)
        return;
    if (fscanf(fp, "%lu %lu", &size, &resident) == 2)
        metrics_set(&metric_quan_process_resident_memory_bytes,
                    (int64_t)resident * (int64_t)sysconf(_SC_PAGESIZE));
    fclose(fp);
    metrics_set(&metric_quan_log_lines_dropped_total, log_dropped_lines());
}

qn_status metrics_render(struct evbuffer *out)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    char help[512];
    int rc = 0;

    metrics_update_process();
    for (metrics_family *f = atomic_load_explicit(&metrics_head, memory_order_acquire); f;
         f = atomic_load_explicit(&f->next, memory_order_acquire)) {
        if (strlen(f->help) * 2 < sizeof(help))
            metrics_escape(help, f->help, 0);
        else
            snprintf(help, sizeof(help), "%s", f->name);
        rc |= evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, help, f->name,
                                  type_names[f->type]) < 0;
        unsigned n = atomic_load_explicit(&f->n, memory_order_acquire);
        for (unsigned i = 0; i < n; i++)
            rc |= metrics_put_series(out, f, f->order[i]);
    }
    return rc ? QN_ENOMEM : QN_OK;
}
