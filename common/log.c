#include "log.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
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

size_t log_json_escape(char *buf, size_t cap, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (cap == 0)
        return 0;
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[7];
        size_t elen = 0;
        switch (c) {
        case '"':
            memcpy(esc, "\\\"", elen = 2);
            break;
        case '\\':
            memcpy(esc, "\\\\", elen = 2);
            break;
        case '\n':
            memcpy(esc, "\\n", elen = 2);
            break;
        case '\r':
            memcpy(esc, "\\r", elen = 2);
            break;
        case '\t':
            memcpy(esc, "\\t", elen = 2);
            break;
        default:
            if (c < 0x20) {
                esc[0] = '\\', esc[1] = 'u', esc[2] = '0', esc[3] = '0';
                esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
                elen = 6;
            } else {
                esc[0] = (char)c;
                elen = 1;
            }
        }
        if (n + elen >= cap)
            break;
        memcpy(buf + n, esc, elen);
        n += elen;
    }
    buf[n] = '\0';
    return n;
}

/* Appends formatted text, never past cap - 1; returns the new length. */
static size_t log_append(char *buf, size_t len, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t log_append(char *buf, size_t len, size_t cap, const char *fmt, ...)
{
    if (len >= cap - 1)
        return len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (n < 0)
        return len;
    return (size_t)n >= cap - len ? cap - 1 : len + (size_t)n;
}

static size_t log_append_str(char *buf, size_t len, size_t cap, const char *key, const char *val)
{
    len = log_append(buf, len, cap, ",\"%s\":\"", key);
    size_t room = len + 2 < cap ? cap - len - 2 : 0; /* keep space for the closing quote */
    len += log_json_escape(buf + len, room, val);
    return log_append(buf, len, cap, "\"");
}

void log_emit(log_level level, const log_ctx *ctx, const log_field *fields, const char *fmt, ...)
{
    char msg[2048];
    char line[4096];
    size_t len = 0;
    const size_t cap = sizeof(line) - 1; /* room for the newline */

    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    int64_t now = now_wall_ms();
    time_t sec = (time_t)(now / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);

    len = log_append(line, len, cap,
                     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (long)(now % 1000), log_level_names[level]);
    len = log_append_str(line, len, cap, "service", log_service);
    len = log_append_str(line, len, cap, "msg", msg);
    if (ctx && ctx->request_id)
        len = log_append_str(line, len, cap, "request_id", ctx->request_id);
    if (ctx && ctx->trace_id)
        len = log_append_str(line, len, cap, "trace_id", ctx->trace_id);
    for (const log_field *f = fields; f && f->key; f++) {
        if (f->is_num)
            len = log_append(line, len, cap, ",\"%s\":%lld", f->key, (long long)f->num);
        else
            len = log_append_str(line, len, cap, f->key, f->str ? f->str : "");
    }
    len = log_append(line, len, cap, "}");
    line[len++] = '\n';

    /* One write per line keeps lines whole across threads; a short write is not retried
     * because a blocked stdout must not stall the event loop forever. */
    if (write(STDOUT_FILENO, line, len) < 0)
        return;
}
