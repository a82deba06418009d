/* JSON text into an evbuffer (jsonout.h). */
#include "jsonout.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

int jsonout_str(struct evbuffer *b, const char *s)
{
    if (!s)
        s = ""; /* NULL is written as "": memcpy must not see it even for zero bytes */
    size_t len = strlen(s);
    if (log_json_plain_len(s) == len) {
        /* Nothing to escape (ids, codes, names): the quotes and the text in one piece. */
        struct evbuffer_iovec v;
        if (evbuffer_reserve_space(b, (ev_ssize_t)(len + 2), &v, 1) != 1 || v.iov_len < len + 2)
            return -1;
        char *p = v.iov_base;
        p[0] = '"';
        memcpy(p + 1, s, len);
        p[len + 1] = '"';
        v.iov_len = len + 2;
        return evbuffer_commit_space(b, &v, 1);
    }
    /* Escaped in slices: 256 input bytes are at most 1536 escaped. */
    char esc[256 * 6 + 1], part[257];
    if (evbuffer_add(b, "\"", 1))
        return -1;
    while (len) {
        size_t n = len < 256 ? len : 256;
        memcpy(part, s, n);
        part[n] = '\0';
        size_t e = log_json_escape(esc, sizeof(esc), part);
        if (evbuffer_add(b, esc, e))
            return -1;
        s += n;
        len -= n;
    }
    return evbuffer_add(b, "\"", 1);
}

int jsonout_i64(struct evbuffer *b, int64_t v)
{
    char num[24];
    return evbuffer_add(b, num, log_i64_str(num, v));
}

int jsonout_id(struct evbuffer *b, int64_t v)
{
    char num[26];
    size_t n = log_i64_str(num + 1, v);
    num[0] = num[n + 1] = '"';
    return evbuffer_add(b, num, n + 2);
}

int jsonout_key(struct evbuffer *b, const char *key, int first)
{
    return (first ? 0 : evbuffer_add(b, ",", 1)) || evbuffer_add(b, "\"", 1) ||
                   evbuffer_add(b, key, strlen(key)) || evbuffer_add(b, "\":", 2)
               ? -1
               : 0;
}

int jsonout_raw(struct evbuffer *b, const char *json)
{
    return evbuffer_add(b, json, strlen(json));
}

size_t jsonout_squeeze(char *s)
{
    char *w = s;
    int in_string = 0;
    for (const char *r = s; *r; r++) {
        char c = *r;
        if (in_string) {
            *w++ = c;
            if (c == '\\' && r[1])
                *w++ = *++r; /* an escaped quote does not end the string */
            else if (c == '"')
                in_string = 0;
        } else if (c == '"') {
            *w++ = c;
            in_string = 1;
        } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            *w++ = c;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

size_t jsonout_cents_text(char *num, int64_t cents)
{
    uint64_t u = cents < 0 ? (uint64_t)0 - (uint64_t)cents : (uint64_t)cents;
    size_t n = 0;
    if (cents < 0)
        num[n++] = '-';
    n += log_i64_str(num + n, (int64_t)(u / 100));
    unsigned frac = (unsigned)(u % 100);
    if (frac) {
        num[n++] = '.';
        num[n++] = (char)('0' + frac / 10);
        if (frac % 10)
            num[n++] = (char)('0' + frac % 10);
    }
    return n;
}

int jsonout_cents(struct evbuffer *b, int64_t cents)
{
    char num[JSONOUT_CENTS_LEN];
    return evbuffer_add(b, num, jsonout_cents_text(num, cents));
}

char *jsonout_render(jsonout_writer w, const void *arg, size_t *len)
{
    char *text = NULL;
    struct evbuffer *b = evbuffer_new();
    if (!b || w(b, arg) != 0)
        goto done;
    *len = evbuffer_get_length(b);
    text = malloc(*len + 1);
    if (text && evbuffer_copyout(b, text, *len) != (ev_ssize_t)*len) {
        free(text);
        text = NULL;
    }
    if (text)
        text[*len] = '\0';
done:
    if (b)
        evbuffer_free(b);
    return text;
}
