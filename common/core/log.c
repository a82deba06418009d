#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "now.h"
#include "status.h"

log_level log_min_level = LOGL_INFO;
static const char *log_service = "quan";

static const char *const log_level_names[] = {"debug", "info", "warn", "error", "off"};

void log_init(const char *service, log_level level)
{
    log_service = service;
    log_min_level = level;
}

int log_level_parse(const char *s)
{
    for (int i = 0; i <= LOGL_OFF; i++)
        if (strcasecmp(s, log_level_names[i]) == 0)
            return i;
    return -1;
}

/* What a byte becomes in a JSON string: 0 itself, 1 the end (NUL), 'u' \u00XX, else a backslash
 * and this character. A table, so that the plain runs that are nearly every log line and answer
 * are found a byte per step and copied whole (the access log escapes each request's fields). */
static const unsigned char log_esc[256] = {
    [0] = 1,    [1] = 'u',  [2] = 'u',    [3] = 'u',    [4] = 'u',   [5] = 'u',     [6] = 'u',
    [7] = 'u',  [8] = 'u',  ['\t'] = 't', ['\n'] = 'n', [11] = 'u',  [12] = 'u',    ['\r'] = 'r',
    [14] = 'u', [15] = 'u', [16] = 'u',   [17] = 'u',   [18] = 'u',  [19] = 'u',    [20] = 'u',
    [21] = 'u', [22] = 'u', [23] = 'u',   [24] = 'u',   [25] = 'u',  [26] = 'u',    [27] = 'u',
    [28] = 'u', [29] = 'u', [30] = 'u',   [31] = 'u',   ['"'] = '"', ['\\'] = '\\',
};

size_t log_json_plain_len(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (!log_esc[*p])
        p++;
    return (size_t)(p - (const unsigned char *)s);
}

size_t log_json_escape(char *buf, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (cap == 0)
        return 0;
    for (const char *p = s ? s : ""; n < cap - 1;) {
        size_t k = log_json_plain_len(p);
        if (k > cap - 1 - n)
            k = cap - 1 - n;
        memcpy(buf + n, p, k);
        n += k;
        p += k;
        unsigned char c = (unsigned char)*p, e = log_esc[c];
        if (e <= 1 || n + (e == 'u' ? 6 : 2) >= cap)
            break; /* the end, or an escape that does not fit whole */
        buf[n++] = '\\';
        buf[n++] = (char)e;
        if (e == 'u') {
            buf[n++] = '0';
            buf[n++] = '0';
            buf[n++] = hex[c >> 4];
            buf[n++] = hex[c & 15];
        }
        p++;
    }
    buf[n] = '\0';
    return n;
}

/* Buffered lines (log_buffer_start): the lines of every thread go into one buffer, in order, and
 * out in writes of many lines; info and debug lines wait for log_flush (the loop's timer), a
 * warning or an error goes at once, after what came before it.
 *
 * Nobody waits for stdout. When stdout is a pipe or a socket (a container runtime, journald, a
 * log shipper: a reader that can stop reading), it is made non-blocking: what the reader does
 * not take stays at the head of the buffer, and lines that find the buffer full are dropped and
 * counted (log_dropped_lines). A file or a terminal is left as it is. Since only the buffer
 * writes to stdout, a line a socket took in part is finished by the next write, never cut by
 * another thread's line; to a pipe, which other processes may share, whole lines of at most
 * PIPE_BUF bytes go at once or not at all. The lock is held for a copy or a non-blocking write. */
#define LOG_BUF_SIZE (64 * 1024)
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char *log_buf; /* log_mu; NULL: unbuffered, each line written at once */
static size_t log_buf_len;
static int log_each_line;         /* log_mu: flush after every line (QUAN_LOG_FLUSH_MS 0) */
static int log_stdout_flags = -1; /* log_mu: stdout's flags before log_buffer_start changed them */
static atomic_llong log_dropped;

/* Writes what stdout takes now (all of it, unless it is non-blocking and full, or failing);
 * returns how many bytes it took. */
static size_t log_write(const char *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(STDOUT_FILENO, p + done, n - done);
        if (w > 0)
            done += (size_t)w;
        else if (w < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    return done;
}

int64_t log_dropped_lines(void)
{
    return atomic_load_explicit(&log_dropped, memory_order_relaxed);
}

void log_buffer_start(int each_line)
{
    struct stat st;
    pthread_mutex_lock(&log_mu);
    if (!log_buf)
        log_buf = malloc(LOG_BUF_SIZE);
    log_each_line = each_line;
    if (log_buf && log_stdout_flags < 0 && fstat(STDOUT_FILENO, &st) == 0 &&
        (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        int fl = fcntl(STDOUT_FILENO, F_GETFL);
        if (fl >= 0 && !(fl & O_NONBLOCK) && fcntl(STDOUT_FILENO, F_SETFL, fl | O_NONBLOCK) == 0)
            log_stdout_flags = fl;
    }
    pthread_mutex_unlock(&log_mu);
}

/* Under log_mu. */
static void log_flush_locked(void)
{
    size_t w = 0;
    if (!log_buf_len)
        return;
    if (log_stdout_flags < 0) {
        w = log_write(log_buf, log_buf_len);
    } else {
        /* Pieces of whole lines of at most PIPE_BUF bytes (a line is never longer: log_vemit),
         * so that a pipe takes each whole or not at all. */
        while (w < log_buf_len) {
            size_t n = log_buf_len - w < PIPE_BUF ? log_buf_len - w : PIPE_BUF;
            const char *nl = memrchr(log_buf + w, '\n', n);
            size_t piece = nl ? (size_t)(nl - (log_buf + w)) + 1 : n, took;
            w += took = log_write(log_buf + w, piece);
            if (took < piece)
                break;
        }
    }
    if (w < log_buf_len) /* the rest waits for the next flush */
        memmove(log_buf, log_buf + w, log_buf_len - w);
    log_buf_len -= w;
}

void log_flush(void)
{
    pthread_mutex_lock(&log_mu);
    log_flush_locked();
    pthread_mutex_unlock(&log_mu);
}

void log_buffer_stop(void)
{
    pthread_mutex_lock(&log_mu);
    /* Nothing is served any more: the last lines may wait for the reader. */
    if (log_stdout_flags >= 0)
        (void)fcntl(STDOUT_FILENO, F_SETFL, log_stdout_flags);
    log_stdout_flags = -1;
    log_flush_locked();
    free(log_buf);
    log_buf = NULL;
    log_buf_len = 0;
    pthread_mutex_unlock(&log_mu);
}

/* One line (with its newline) into the buffer, or straight out when there is none. */
static void log_put(log_level level, const char *line, size_t len)
{
    pthread_mutex_lock(&log_mu);
    if (!log_buf) {
        pthread_mutex_unlock(&log_mu);
        if (log_write(line, len) < len)
            atomic_fetch_add_explicit(&log_dropped, 1, memory_order_relaxed);
        return;
    }
    if (log_buf_len + len > LOG_BUF_SIZE)
        log_flush_locked();
    if (log_buf_len + len > LOG_BUF_SIZE) { /* stdout is not taking lines */
        atomic_fetch_add_explicit(&log_dropped, 1, memory_order_relaxed);
    } else {
        memcpy(log_buf + log_buf_len, line, len);
        log_buf_len += len;
        if (level > LOGL_INFO || log_each_line)
            log_flush_locked();
    }
    pthread_mutex_unlock(&log_mu);
}

/* Appends n bytes of s, never past cap - 1. */
static size_t log_append_raw(char *buf, size_t len, size_t cap, const char *s, size_t n)
{
    if (len + n > cap - 1)
        n = len < cap - 1 ? cap - 1 - len : 0;
    memcpy(buf + len, s, n);
    return len + n;
}

/* ,"key": (keys are plain names: nothing to escape) */
static size_t log_append_key(char *buf, size_t len, size_t cap, const char *key)
{
    len = log_append_raw(buf, len, cap, ",\"", 2);
    len = log_append_raw(buf, len, cap, key, strlen(key));
    return log_append_raw(buf, len, cap, "\":", 2);
}

static size_t log_append_str(char *buf, size_t len, size_t cap, const char *key, const char *val)
{
    len = log_append_key(buf, len, cap, key);
    len = log_append_raw(buf, len, cap, "\"", 1);
    size_t room = len + 2 < cap ? cap - len - 2 : 0; /* keep space for the closing quote */
    len += log_json_escape(buf + len, room, val);
    return log_append_raw(buf, len, cap, "\"", 1);
}

/* Decimal digits of v into out (at least 21 bytes); returns their count. No printf: the
 * access log writes several numbers per request. */
size_t log_i64_str(char *out, int64_t v)
{
    /* Two digits per division: ids have 19, and an answer may list hundreds of them. */
    static const char pairs[] =
        "00010203040506070809101112131415161718192021222324252627282930313233"
        "34353637383940414243444546474849505152535455565758596061626364656667"
        "6869707172737475767778798081828384858687888990919293949596979899";
    char tmp[24];
    char *p = tmp + sizeof(tmp);
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    while (u >= 100) {
        unsigned r = (unsigned)(u % 100);
        u /= 100;
        p -= 2;
        memcpy(p, pairs + 2 * r, 2);
    }
    if (u >= 10) {
        p -= 2;
        memcpy(p, pairs + 2 * u, 2);
    } else {
        *--p = (char)('0' + u);
    }
    if (v < 0)
        *--p = '-';
    size_t k = (size_t)(tmp + sizeof(tmp) - p);
    memcpy(out, p, k);
    out[k] = '\0';
    return k;
}

/* "YYYY-MM-DDTHH:MM:SS" of the current second, formatted once per second per thread. */
static const char *log_second(int64_t sec)
{
    static __thread int64_t cached = -1;
    static __thread char text[64];
    if (sec != cached) {
        time_t t = (time_t)sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(text, sizeof(text), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        cached = sec;
    }
    return text;
}

__attribute__((format(printf, 4, 0))) static void
log_vemit(log_level level, const log_ctx *ctx, const log_field *fields, const char *fmt, va_list ap)
{
    char msg[2048];
    char line[4096];
    size_t len = 0;
    const size_t cap = sizeof(line) - 1; /* room for the newline */

    const char *text = fmt;
    if (strchr(fmt, '%')) { /* a message without arguments is used as it is */
        vsnprintf(msg, sizeof(msg), fmt, ap);
        text = msg;
    }

    int64_t now = now_wall_ms();
    char ms[4] = {(char)('0' + now % 1000 / 100), (char)('0' + now % 100 / 10),
                  (char)('0' + now % 10), 0};
    const char *lvl = log_level_names[level];
    len = log_append_raw(line, len, cap, "{\"ts\":\"", 7);
    len = log_append_raw(line, len, cap, log_second(now / 1000), 19);
    len = log_append_raw(line, len, cap, ".", 1);
    len = log_append_raw(line, len, cap, ms, 3);
    len = log_append_raw(line, len, cap, "Z\",\"level\":\"", 12);
    len = log_append_raw(line, len, cap, lvl, strlen(lvl));
    len = log_append_raw(line, len, cap, "\"", 1);
    len = log_append_str(line, len, cap, "service", log_service);
    len = log_append_str(line, len, cap, "msg", text);
    if (ctx && ctx->request_id)
        len = log_append_str(line, len, cap, "request_id", ctx->request_id);
    if (ctx && ctx->trace_id)
        len = log_append_str(line, len, cap, "trace_id", ctx->trace_id);
    for (const log_field *f = fields; f && f->key; f++) {
        if (f->is_num) {
            char num[24];
            len = log_append_key(line, len, cap, f->key);
            len = log_append_raw(line, len, cap, num, log_i64_str(num, f->num));
        } else {
            len = log_append_str(line, len, cap, f->key, f->str ? f->str : "");
        }
    }
    len = log_append_raw(line, len, cap, "}", 1);
    line[len++] = '\n';

    log_put(level, line, len);
}

void log_emit(log_level level, const log_ctx *ctx, const log_field *fields, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vemit(level, ctx, fields, fmt, ap);
    va_end(ap);
}

int log_limit_pass(log_limit *l, int64_t interval_ms, int64_t *suppressed)
{
    int64_t now = now_mono_ms(), next = atomic_load(&l->next_ms);
    /* Of the threads that see the interval over, the one that moves next_ms speaks. */
    if (now < next || !atomic_compare_exchange_strong(&l->next_ms, &next, now + interval_ms)) {
        atomic_fetch_add(&l->suppressed, 1);
        return 0;
    }
    int64_t held = atomic_exchange(&l->suppressed, 0);
    if (suppressed)
        *suppressed = held;
    return 1;
}

void log_warn_limited(log_limit *l, const log_ctx *ctx, const log_field *fields, const char *fmt,
                      ...)
{
    int64_t held = 0;
    if (l && !log_limit_pass(l, LOG_LIMIT_MS, &held))
        return;
    if (LOGL_WARN < log_min_level)
        return;
    /* The caller's fields, then the count; fields past LOG_LIMIT_FIELDS are left out. */
    log_field all[LOG_LIMIT_FIELDS + 2];
    size_t n = 0;
    for (const log_field *f = fields; f && f->key && n < LOG_LIMIT_FIELDS; f++)
        all[n++] = *f;
    all[n++] = LOG_I("suppressed", held);
    all[n] = LOG_END;
    va_list ap;
    va_start(ap, fmt);
    log_vemit(LOGL_WARN, ctx, all, fmt, ap);
    va_end(ap);
}
