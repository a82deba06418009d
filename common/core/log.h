/*
 * JSON-lines logging to stdout (12-factor): one object per line with ts, level, service, msg,
 * request_id, trace_id and optional fields. The level is checked before any formatting, and
 * each line is one write(2), so threads can log without a lock. A thread may buffer its info
 * and debug lines (log_buffer_start: the event loop's access log) and write them in one go
 * (log_flush, from a timer); a warning or an error writes the buffer first, then itself.
 */
#ifndef QUAN_LOG_H
#define QUAN_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { LOGL_DEBUG = 0, LOGL_INFO, LOGL_WARN, LOGL_ERROR, LOGL_OFF } log_level;

/* Carried by requests and messages; both strings are borrowed and may be NULL. */
typedef struct log_ctx {
    const char *request_id;
    const char *trace_id;
} log_ctx;

/* One extra field of a log line. Build with LOG_S / LOG_I; end the list with LOG_END. */
typedef struct log_field {
    const char *key;
    const char *str; /* used when is_num == 0 */
    int64_t num;
    int is_num;
} log_field;

#define LOG_S(k, v) ((log_field){.key = (k), .str = (v)})
#define LOG_I(k, v) ((log_field){.key = (k), .num = (int64_t)(v), .is_num = 1})
#define LOG_END     ((log_field){0})

extern log_level log_min_level;

/* service is borrowed for the process lifetime. */
void log_init(const char *service, log_level level);
/* "debug", "info", "warn", "error", "off" -> level; returns -1 if unknown. */
int log_level_parse(const char *s);

void log_emit(log_level level, const log_ctx *ctx, const log_field *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_at(lvl, ctx, fields, ...)                                                              \
    do {                                                                                           \
        if ((lvl) >= log_min_level)                                                                \
            log_emit((lvl), (ctx), (fields), __VA_ARGS__);                                         \
    } while (0)

#define log_debug(ctx, ...) log_at(LOGL_DEBUG, ctx, NULL, __VA_ARGS__)
#define log_info(ctx, ...)  log_at(LOGL_INFO, ctx, NULL, __VA_ARGS__)
#define log_warn(ctx, ...)  log_at(LOGL_WARN, ctx, NULL, __VA_ARGS__)
#define log_error(ctx, ...) log_at(LOGL_ERROR, ctx, NULL, __VA_ARGS__)
/* With fields: log_infof(ctx, ((log_field[]){LOG_S("k", v), LOG_END}), "msg"). */
#define log_infof(ctx, fields, ...)  log_at(LOGL_INFO, ctx, fields, __VA_ARGS__)
#define log_warnf(ctx, fields, ...)  log_at(LOGL_WARN, ctx, fields, __VA_ARGS__)
#define log_errorf(ctx, fields, ...) log_at(LOGL_ERROR, ctx, fields, __VA_ARGS__)

/* Every thread's lines go through one buffer (up to 64 KiB): info and debug ones until
 * log_flush (or at once with each_line), a warning or an error at once, after them. Nobody waits
 * for stdout: a pipe or a socket is made non-blocking, what it does not take waits in the buffer
 * (a line it took in part is finished first, never cut by another), and what finds the buffer
 * full is dropped (log_dropped_lines). log_buffer_stop gives stdout its blocking mode back,
 * flushes and ends it. Lines still buffered when the process is killed are lost: the flush timer
 * bounds how many (service.c, QUAN_LOG_FLUSH_MS; 0 is each_line). */
void log_buffer_start(int each_line);
void log_flush(void);
void log_buffer_stop(void);
/* Lines stdout did not take, since the start (quan_log_lines_dropped_total). */
int64_t log_dropped_lines(void);

/* One call site's repeated line, let through at most once per interval: for a failure that
 * repeats per batch while a dependency is down, one line a second says as much as hundreds.
 * Zero-initialised (static); any thread. */
typedef struct log_limit {
    _Atomic int64_t next_ms;    /* monotonic: the next line may go out from then on */
    _Atomic int64_t suppressed; /* lines held back since the last one let through */
} log_limit;

/* 1 when the caller's line goes out now, with *suppressed (when not NULL) the lines held back
 * since the previous one; 0 when it is held back (and counted). */
int log_limit_pass(log_limit *l, int64_t interval_ms, int64_t *suppressed);

/* The interval of log_warn_limited, and how many of the caller's fields it carries. */
#define LOG_LIMIT_MS     1000
#define LOG_LIMIT_FIELDS 8

/* log_warnf through l: at most one line per LOG_LIMIT_MS (the others counted, not formatted),
 * its fields (LOG_END-terminated, or NULL) followed by "suppressed", the lines held back since
 * the one before. With l NULL every line goes out (suppressed 0). */
void log_warn_limited(log_limit *l, const log_ctx *ctx, const log_field *fields, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));

/* Decimal digits of v into out (room for 21 bytes); returns their count. */
size_t log_i64_str(char *out, int64_t v);

/* Appends s to buf as JSON string content (no quotes); returns bytes written, truncating at cap
 * (an escape is written whole or not at all); buf is NUL-terminated. */
size_t log_json_escape(char *buf, size_t cap, const char *s);
/* The length of s's first run of bytes that JSON writes as they are (up to its NUL or the first
 * byte to escape): strlen(s) when nothing in s needs escaping. */
size_t log_json_plain_len(const char *s);

#endif
