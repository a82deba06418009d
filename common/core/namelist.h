/*
 * Comma-separated lists, as settings and definitions write them: "a,b,c". One walk for all of
 * them (URL and node lists, queue names, migration versions, metrics label names), so that every
 * list means the same: an empty text has no entries; otherwise there is one entry more than
 * commas, and an entry may be empty ("a,,b", or a comma at either end), which the caller
 * refuses or ignores.
 *
 *     namelist it = namelist_of(list);
 *     const char *name;
 *     size_t len;
 *     while (namelist_next(&it, NAMELIST_TRIM, &name, &len))
 *         use the len bytes at name
 *
 * The list is borrowed and never written. Header only.
 */
#ifndef QUAN_NAMELIST_H
#define QUAN_NAMELIST_H

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct namelist {
    const char *at; /* the next entry's start; NULL once the last has been given */
} namelist;

typedef enum {
    NAMELIST_EXACT = 0, /* entries as written */
    NAMELIST_TRIM = 1,  /* blanks (isspace) around each entry left out */
} namelist_mode;

/* A walk over list (NULL or "": no entries). */
static inline namelist namelist_of(const char *list)
{
    return (namelist){.at = list && *list ? list : NULL};
}

/* The next entry: its start and length. False once there is none. */
static inline bool namelist_next(namelist *it, namelist_mode mode, const char **name, size_t *len)
{
    if (!it->at)
        return false;
    const char *a = it->at, *b = a + strcspn(a, ",");
    it->at = *b == ',' ? b + 1 : NULL;
    if (mode == NAMELIST_TRIM) {
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
    }
    *name = a;
    *len = (size_t)(b - a);
    return true;
}

/* Whether name is one of list's entries, compared whole (NAMELIST_EXACT). */
static inline bool namelist_has(const char *list, const char *name)
{
    namelist it = namelist_of(list);
    const char *e;
    size_t len, n = strlen(name);
    while (namelist_next(&it, NAMELIST_EXACT, &e, &len))
        if (len == n && !memcmp(e, name, n))
            return true;
    return false;
}

/* How many entries list has. */
static inline size_t namelist_count(const char *list)
{
    namelist it = namelist_of(list);
    const char *e;
    size_t len, n = 0;
    while (namelist_next(&it, NAMELIST_EXACT, &e, &len))
        n++;
    return n;
}

#endif /* QUAN_NAMELIST_H */
