/*
 * Prometheus metrics (twemproxy's STATS_POOL_CODEC, per subsystem). A metric is a
 * metrics_family: its name, type, help and label names, and its series. The module that updates
 * a metric owns it: it lists its metrics in an X-macro in its header, METRICS_DECLARE(LIST)
 * there, METRICS_DEFINE(LIST) in its .c file, and names them in its service_module's metrics
 * (METRICS_REFS), which the service shell registers when the binary starts; the render lists
 * the registered families in registration order.
 *
 * Values are integers held in C11 atomics, so worker threads update them without a lock; a
 * mutex is taken only to create a new label series. Each labelled metric keeps at most
 * METRICS_MAX_SERIES series; past that, updates land in a series whose every label is "other"
 * (labels must be bounded: route templates, outcomes, never user ids).
 *
 * Histograms observe seconds into fixed buckets (metrics_buckets); the sum is kept in
 * nanoseconds. Functions here never fail and may be called before metrics_init.
 */
#ifndef QUAN_METRICS_H
#define QUAN_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

struct evbuffer;

typedef enum { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM } metrics_type;

#define METRICS_MAX_LABELS    3
#define METRICS_MAX_SERIES    512 /* per metric, including the "other" overflow series */
#define METRICS_NBUCKETS      14
#define METRICS_MAX_LABEL_LEN 128                      /* longer label values are truncated */
#define METRICS_SLOTS         (METRICS_MAX_SERIES * 2) /* open addressing, load <= 0.5 */

typedef struct metrics_series metrics_series;

/*
 * A metric. Defined by its owner with METRICS_DEFINE, in static storage: it lives as long as
 * the process, and the registry only borrows it. The fields after labels are metrics.c's.
 */
typedef struct metrics_family {
    const char *name;
    metrics_type type;
    const char *help;
    const char *labels; /* comma-separated label names, "" for none (at most 3) */

    /* Lookups are lock-free: a slot, once set, never changes until metrics_shutdown. */
    _Atomic(metrics_series *) slots[METRICS_SLOTS];
    metrics_series *order[METRICS_MAX_SERIES]; /* creation order, for stable output */
    _Atomic unsigned n;
    /* The render's list, in registration order; both under the registry's mutex, next read
     * without it by the render. */
    _Atomic(struct metrics_family *) next;
    bool listed;
} metrics_family;

/*
 * An owner's list is an X-macro of entries X(name, TYPE, help, "label1,label2"), TYPE one of
 * COUNTER, GAUGE, HISTOGRAM:
 *
 *   #define CLAIMSTEP_METRICS(X) X(quan_claims_total, COUNTER, "Claims by outcome.", "outcome")
 *   METRICS_DECLARE(CLAIMSTEP_METRICS)  header: extern metrics_family metric_quan_claims_total;
 *   METRICS_DEFINE(CLAIMSTEP_METRICS)   .c file: the definitions, one per entry
 *   METRICS_REFS(CLAIMSTEP_METRICS)     &metric_quan_claims_total, (for a NULL-terminated array)
 *
 * The families are never static: a metric defined twice in one binary is a link error rather
 * than two families of one name in the render.
 */
#define METRICS_DEFINE_(n, t, h, l)  metrics_family metric_##n = {#n, METRICS_##t, h, l};
#define METRICS_DECLARE_(n, t, h, l) extern metrics_family metric_##n;
#define METRICS_REF_(n, t, h, l)     &metric_##n,
#define METRICS_DEFINE(LIST)         LIST(METRICS_DEFINE_)
#define METRICS_DECLARE(LIST)        LIST(METRICS_DECLARE_)
#define METRICS_REFS(LIST)           LIST(METRICS_REF_)

/* The process's own metrics, every binary's: metrics_init registers them, and the render reads
 * the memory and the dropped log lines when it runs. */
#define METRICS_PROCESS(X)                                                                         \
    X(quan_log_lines_dropped_total, COUNTER,                                                       \
      "Log lines stdout did not take (a pipe whose reader stopped reading): the event loop "       \
      "drops them rather than wait.",                                                              \
      "")                                                                                          \
    X(quan_build_info, GAUGE, "Build information; the value is always 1.", "version,service")      \
    X(quan_process_resident_memory_bytes, GAUGE, "Resident memory size in bytes.", "")             \
    X(quan_process_start_time_seconds, GAUGE, "Start time of the process since the Unix epoch.", "")
METRICS_DECLARE(METRICS_PROCESS)

/* Upper bounds in seconds of the histogram buckets (+Inf is implicit). */
extern const double metrics_buckets[METRICS_NBUCKETS];

/* Registers METRICS_PROCESS, sets quan_build_info{version,service} = 1 and the start time.
 * Strings are copied. */
void metrics_init(const char *service, const char *version);
/* Adds the families of list (NULL-terminated; the array borrowed for this call only) to the
 * render, after those registered before. A family registered already keeps its place: modules
 * that share a metric may each name it. */
void metrics_register(metrics_family *const *list);
/* Frees every series (tests, valgrind) and unregisters every family; the registry is empty
 * and usable afterwards. */
void metrics_shutdown(void);

/*
 * Updates. `labels` is a NULL-terminated array of label values, one per label of the metric,
 * in the order of its list entry; a wrong count is logged and ignored. The _l macros build it:
 *   metrics_inc_l(&metric_quan_claims_total, "success");
 *   metrics_observe_l(&metric_quan_http_request_duration_seconds, 0.012, route, "200");
 * Counter deltas must be >= 0; gauges take any delta. Observe is for histograms only. A family
 * updated before it is registered is registered with its first series, so that nothing updated
 * is missing from the render (nor from metrics_shutdown).
 */
void metrics_add_v(metrics_family *f, const char *const *labels, int64_t delta);
void metrics_set_v(metrics_family *f, const char *const *labels, int64_t value);
void metrics_observe_v(metrics_family *f, const char *const *labels, double seconds);

#define metrics_inc(f)           metrics_add_v((f), NULL, 1)
#define metrics_add(f, d)        metrics_add_v((f), NULL, (d))
#define metrics_set(f, v)        metrics_set_v((f), NULL, (v))
#define metrics_observe(f, s)    metrics_observe_v((f), NULL, (s))
#define metrics_inc_l(f, ...)    metrics_add_v((f), (const char *const[]){__VA_ARGS__, NULL}, 1)
#define metrics_add_l(f, d, ...) metrics_add_v((f), (const char *const[]){__VA_ARGS__, NULL}, (d))
#define metrics_set_l(f, v, ...) metrics_set_v((f), (const char *const[]){__VA_ARGS__, NULL}, (v))
#define metrics_observe_l(f, s, ...)                                                               \
    metrics_observe_v((f), (const char *const[]){__VA_ARGS__, NULL}, (s))

/*
 * One series, looked up once by a caller that updates it on every request (the HTTP layer's
 * route and status): metrics_series_of finds or creates it (NULL for a wrong label count), and
 * the updates then skip the hashing and comparing of the labels. A series pointer is valid
 * until metrics_shutdown, which bumps metrics_generation; metrics_handle keeps one with the
 * generation it was found in and looks it up again when that changed.
 */
metrics_series *metrics_series_of(metrics_family *f, const char *const *labels);
unsigned metrics_generation(void);
/* A series kept by a caller: looked up on first use and again after metrics_shutdown. */
typedef struct metrics_handle {
    metrics_series *s;
    unsigned gen;
} metrics_handle;
metrics_series *metrics_handle_series(metrics_handle *h, metrics_family *f,
                                      const char *const *labels);
/* As metrics_add_v and metrics_observe_v; s may be NULL (nothing happens). */
void metrics_series_add(metrics_series *s, int64_t delta);
void metrics_series_observe(metrics_series *s, double seconds);

/* Current value (counter, gauge) or observation count (histogram) of a series; 0 when the
 * series does not exist. Never creates a series. For tests and readiness checks. */
int64_t metrics_get_v(metrics_family *f, const char *const *labels);
#define metrics_get(f)        metrics_get_v((f), NULL)
#define metrics_get_l(f, ...) metrics_get_v((f), (const char *const[]){__VA_ARGS__, NULL})

/* Appends the Prometheus text format 0.0.4 of every registered metric to out (borrowed).
 * QN_ENOMEM when the buffer could not grow (out then holds a truncated rendering). */
qn_status metrics_render(struct evbuffer *out) QN_MUSTCHECK;

/* Content-Type of metrics_render's output. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
