/*
 * Writing JSON text straight into an evbuffer, for the replies of the hot path: no tree to
 * build and free, no printf. The caller writes the punctuation (jsonout_key adds the comma).
 * Every function returns 0, or -1 when the buffer could not grow (the text is then unusable).
 */
#ifndef QUAN_JSONOUT_H
#define QUAN_JSONOUT_H

#include <event2/buffer.h>
#include <stddef.h>
#include <stdint.h>

/* "s", escaped (NULL writes ""). */
int jsonout_str(struct evbuffer *b, const char *s);
/* v as a JSON number. */
int jsonout_i64(struct evbuffer *b, int64_t v);
/* An amount in cents as the decimal number of yuan: 1999 -> 19.99, 1990 -> 19.9, 1900 -> 19
 * (what cJSON prints for cents / 100.0). */
int jsonout_cents(struct evbuffer *b, int64_t cents);
/* The same into out (at least JSONOUT_CENTS_LEN bytes, not NUL-terminated); returns the length. */
#define JSONOUT_CENTS_LEN 24
size_t jsonout_cents_text(char *out, int64_t cents);
/* v as a string: ids beyond 2^53 stay exact in JavaScript clients. */
int jsonout_id(struct evbuffer *b, int64_t v);
/* ,"key": (or "key": when first is set); key is a plain name, not escaped. */
int jsonout_key(struct evbuffer *b, const char *key, int first);
/* Text that is JSON already, as it is. */
int jsonout_raw(struct evbuffer *b, const char *json);
/* Removes the whitespace between the tokens of the JSON text s, in place (what its strings hold
 * is kept); returns the new length. For stored JSON sent as it is: PostgreSQL prints a jsonb
 * value with a space after every colon and comma, bytes every answer would carry. */
size_t jsonout_squeeze(char *s);

/* What w writes for arg, as text to keep (an answer's part prepared once): owned (free),
 * NUL-terminated, its length in *len. NULL when w failed or on allocation failure. */
typedef int (*jsonout_writer)(struct evbuffer *b, const void *arg);
char *jsonout_render(jsonout_writer w, const void *arg, size_t *len);

#endif
