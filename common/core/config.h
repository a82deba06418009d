/*
 * Configuration: one declarative table of QUAN_* environment variables per binary
 * (pgbouncer's CF_ABS table, redis' static_configs[]), read once at start and validated.
 * A bad or missing value stops the process with a message naming the variable; secrets are
 * never printed. A secret NAME may come instead from the file NAME_FILE names (the Kubernetes
 * convention, a Secret mounted as files), which keeps it out of /proc/<pid>/environ, out of
 * what child processes inherit and out of the environment a crash dump records.
 */
#ifndef QUAN_CONFIG_H
#define QUAN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef enum {
    CONFIG_STR,  /* const char *: a copy owned by the target struct (config_free) */
    CONFIG_INT,  /* int64_t within [min, max] */
    CONFIG_BOOL, /* int: 1/0 from true/false/1/0/yes/no */
    CONFIG_ENUM, /* int: index into choices[] */
} config_type;

enum {
    CONFIG_REQUIRED = 1 << 0, /* no default: the variable must be set */
    CONFIG_SECRET = 1 << 1,   /* never logged or printed; NAME_FILE accepted (config_load) */
};

/* The most a secret's NAME_FILE may hold, in bytes: a key, a password or a URL list is far less,
 * and a path naming the wrong file (a log, a device) fails fast instead of filling memory. */
#define CONFIG_FILE_MAX (64 * 1024)

typedef struct config_var {
    const char *name; /* environment variable, QUAN_... */
    config_type type;
    size_t offset;   /* of the field in the caller's struct */
    const char *def; /* default, as text; NULL with CONFIG_REQUIRED */
    int64_t min, max;
    const char *const *choices; /* CONFIG_ENUM: NULL-terminated */
    unsigned flags;
    const char *help;
    /* CONFIG_STR: a further check of the value (NULL: none), e.g. a list's syntax. It writes
     * its reason into err without the value (the value may be a secret); config_load adds the
     * variable's name. */
    qn_status (*check)(const char *value, char *err, size_t errlen);
} config_var;

/* Reads every variable of vars into target. A CONFIG_SECRET variable NAME may be given instead
 * as NAME_FILE, the path of a file holding the value: its content, one trailing newline (\n or
 * \r\n) dropped, at most CONFIG_FILE_MAX bytes, no NUL byte; an empty file is an empty value,
 * that is unset (the default, or "required but not set"). NAME and NAME_FILE both set is an
 * error, as is a NAME_FILE that cannot be read. An empty variable counts as unset.
 *
 * Every CONFIG_STR field then points to a copy owned by target, whatever the value came from (the
 * environment, a file, the default): config_free releases them. The fields' previous values are
 * overwritten, not freed. On failure err names the variable (and the file's path) and the
 * reason, never a secret's value, and nothing is left allocated (the string fields are NULL). */
qn_status config_load(const config_var *vars, size_t n, void *target, char *err,
                      size_t errlen) QN_MUSTCHECK;
/* Frees the strings config_load copied into target (a secret's bytes are wiped first, so that it
 * does not linger in freed memory) and sets the fields to NULL. Safe on NULL fields. */
void config_free(const config_var *vars, size_t n, void *target);
/* A secret read outside a table (the tools): NAME, or the file NAME_FILE names, with
 * config_load's rules. *out: a copy the caller frees, NULL when neither is set or the value is
 * empty. On failure err says why (never the value). */
qn_status config_secret(const char *name, char **out, char *err, size_t errlen) QN_MUSTCHECK;
/* The --help text: one line per variable with its default and bounds, then how a secret is given
 * as a file (NAME_FILE). */
void config_print_help(FILE *out, const char *prog, const char *summary, const config_var *vars,
                       size_t n);
/* Logs the effective configuration at info level, secrets masked; a secret's line says which file
 * it was read from (the NAME_FILE the environment names) or that NAME_FILE was not used. */
void config_log(const config_var *vars, size_t n, const void *target);

#endif
