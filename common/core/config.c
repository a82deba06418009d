#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "log.h"

static qn_status config_parse_int(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0')
        return QN_EINVAL;
    *out = v;
    return QN_OK;
}

static qn_status config_parse_bool(const char *text, int *out)
{
    if (!strcasecmp(text, "1") || !strcasecmp(text, "true") || !strcasecmp(text, "yes") ||
        !strcasecmp(text, "on"))
        *out = 1;
    else if (!strcasecmp(text, "0") || !strcasecmp(text, "false") || !strcasecmp(text, "no") ||
             !strcasecmp(text, "off"))
        *out = 0;
    else
        return QN_EINVAL;
    return QN_OK;
}

static qn_status config_set(const config_var *v, const char *text, void *target, char *err,
                            size_t errlen)
{
    char *field = (char *)target + v->offset;
    int64_t num;
    int b;

    switch (v->type) {
    case CONFIG_STR:
        if (v->max > 0 && (int64_t)strlen(text) > v->max) {
            snprintf(err, errlen, "%s: longer than %" PRId64 " characters", v->name, v->max);
            return QN_EINVAL;
        }
        if (v->check) {
            char why[256] = "";
            if (v->check(text, why, sizeof(why)) != QN_OK) {
                snprintf(err, errlen, "%s: %s", v->name, *why ? why : "invalid value");
                return QN_EINVAL;
            }
        }
        *(const char **)field = text;
        return QN_OK;
    case CONFIG_INT:
        if (config_parse_int(text, &num) != QN_OK) {
            snprintf(err, errlen, "%s: not an integer", v->name);
            return QN_EINVAL;
        }
        if (num < v->min || num > v->max) {
            snprintf(err, errlen, "%s: %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", v->name,
                     num, v->min, v->max);
            return QN_EINVAL;
        }
        *(int64_t *)field = num;
        return QN_OK;
    case CONFIG_BOOL:
        if (config_parse_bool(text, &b) != QN_OK) {
            snprintf(err, errlen, "%s: expected true or false", v->name);
            return QN_EINVAL;
        }
        *(int *)field = b;
        return QN_OK;
    case CONFIG_ENUM:
        for (int i = 0; v->choices[i]; i++) {
            if (!strcasecmp(text, v->choices[i])) {
                *(int *)field = i;
                return QN_OK;
            }
        }
        snprintf(err, errlen, "%s: unknown value (allowed:", v->name);
        for (int i = 0; v->choices[i]; i++) {
            size_t used = strlen(err);
            snprintf(err + used, errlen - used, " %s", v->choices[i]);
        }
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, ")");
        return QN_EINVAL;
    }
    snprintf(err, errlen, "%s: unsupported type", v->name);
    return QN_ERR;
}

qn_status config_load(const config_var *vars, size_t n, void *target, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        const config_var *v = &vars[i];
        const char *text = getenv(v->name);
        if (text == NULL || *text == '\0') {
            if (v->flags & CONFIG_REQUIRED) {
                snprintf(err, errlen, "%s: required but not set", v->name);
                return QN_EINVAL;
            }
            text = v->def ? v->def : "";
        }
        qn_status st = config_set(v, text, target, err, errlen);
        if (st != QN_OK)
            return st;
    }
    return QN_OK;
}

static void config_format(const config_var *v, const void *target, char *buf, size_t len)
{
    const char *field = (const char *)target + v->offset;
    if (v->flags & CONFIG_SECRET) {
        snprintf(buf, len, "%s",
                 *(const char *const *)field && **(const char *const *)field ? "(set)" : "(unset)");
        return;
    }
    switch (v->type) {
    case CONFIG_STR:
        snprintf(buf, len, "%s", *(const char *const *)field);
        break;
    case CONFIG_INT:
        snprintf(buf, len, "%" PRId64, *(const int64_t *)field);
        break;
    case CONFIG_BOOL:
        snprintf(buf, len, "%s", *(const int *)field ? "true" : "false");
        break;
    case CONFIG_ENUM:
        snprintf(buf, len, "%s", v->choices[*(const int *)field]);
        break;
    }
}

void config_print_help(FILE *out, const char *prog, const char *summary, const config_var *vars,
                       size_t n)
{
    fprintf(out, "usage: %s [--help]\n%s\n\nConfiguration (environment variables):\n", prog,
            summary);
    for (size_t i = 0; i < n; i++) {
        const config_var *v = &vars[i];
        fprintf(out, "  %-30s %s", v->name, v->help);
        if (v->type == CONFIG_INT)
            fprintf(out, " [%" PRId64 "..%" PRId64 "]", v->min, v->max);
        if (v->type == CONFIG_ENUM) {
            fprintf(out, " [");
            for (int c = 0; v->choices[c]; c++)
                fprintf(out, "%s%s", c ? "|" : "", v->choices[c]);
            fprintf(out, "]");
        }
        if (v->flags & CONFIG_REQUIRED)
            fprintf(out, " (required)");
        else if (v->def && *v->def && !(v->flags & CONFIG_SECRET))
            fprintf(out, " (default %s)", v->def);
        if (v->flags & CONFIG_SECRET)
            fprintf(out, " (secret)");
        fputc('\n', out);
    }
}

void config_log(const config_var *vars, size_t n, const void *target)
{
    for (size_t i = 0; i < n; i++) {
        char value[256];
        config_format(&vars[i], target, value, sizeof(value));
        log_infof(NULL, ((log_field[]){LOG_S("var", vars[i].name), LOG_S("value", value), LOG_END}),
                  "config");
    }
}
