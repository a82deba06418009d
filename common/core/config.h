/*
 * Configuration: one declarative table of QUAN_* environment variables per binary
 * (pgbouncer's CF_ABS table, redis' static_configs[]), read once at start and validated.
 * A bad or missing value stops the process with a message naming the variable; secrets are
 * never printed.
 */
#ifndef QUAN_CONFIG_H
#define QUAN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef enum {
    CONFIG_STR,  /* const char * (borrowed from the environment or the default) */
    CONFIG_INT,  /* int64_t within [min, max] */
    CONFIG_BOOL, /* int: 1/0 from true/false/1/0/yes/no */
    CONFIG_ENUM, /* int: index into choices[] */
} config_type;

enum {
    CONFIG_REQUIRED = 1 << 0, /* no default: the variable must be set */
    CONFIG_SECRET = 1 << 1,   /* never logged or printed */
};

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

/* Reads every variable of vars into target. On failure err names the variable and the reason. */
qn_status config_load(const config_var *vars, size_t n, void *target, char *err,
                      size_t errlen) QN_MUSTCHECK;
/* The --help text: one line per variable with its default and bounds. */
void config_print_help(FILE *out, const char *prog, const char *summary, const config_var *vars,
                       size_t n);
/* Logs the effective configuration at info level, secrets masked. */
void config_log(const config_var *vars, size_t n, const void *target);

#endif
