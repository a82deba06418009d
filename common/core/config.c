#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

/* Room for NAME_FILE: the tables' names are far shorter. */
#define CONFIG_NAME_MAX 128

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

/* Checks text as v's value and stores it into target, but for a CONFIG_STR, which is only checked
 * (config_load_one stores its copy). label names the variable in err. */
static qn_status config_set(const config_var *v, const char *label, const char *text, void *target,
                            char *err, size_t errlen)
{
    char *field = (char *)target + v->offset;
    int64_t num;
    int b;

    switch (v->type) {
    case CONFIG_STR:
        if (v->max > 0 && (int64_t)strlen(text) > v->max) {
            snprintf(err, errlen, "%s: longer than %" PRId64 " characters", label, v->max);
            return QN_EINVAL;
        }
        if (v->check) {
            char why[256] = "";
            if (v->check(text, why, sizeof(why)) != QN_OK) {
                snprintf(err, errlen, "%s: %s", label, *why ? why : "invalid value");
                return QN_EINVAL;
            }
        }
        return QN_OK;
    case CONFIG_INT:
        if (config_parse_int(text, &num) != QN_OK) {
            snprintf(err, errlen, "%s: not an integer", label);
            return QN_EINVAL;
        }
        if (num < v->min || num > v->max) {
            snprintf(err, errlen, "%s: %" PRId64 " is outside [%" PRId64 ", %" PRId64 "]", label,
                     num, v->min, v->max);
            return QN_EINVAL;
        }
        *(int64_t *)field = num;
        return QN_OK;
    case CONFIG_BOOL:
        if (config_parse_bool(text, &b) != QN_OK) {
            snprintf(err, errlen, "%s: expected true or false", label);
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
        snprintf(err, errlen, "%s: unknown value (allowed:", label);
        for (int i = 0; v->choices[i]; i++) {
            size_t used = strlen(err);
            snprintf(err + used, errlen - used, " %s", v->choices[i]);
        }
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, ")");
        return QN_EINVAL;
    }
    snprintf(err, errlen, "%s: unsupported type", label);
    return QN_ERR;
}

/* A copy's bytes wiped before it is freed: a secret does not stay behind in freed memory. */
static void config_wipe_free(char *text)
{
    if (text) {
        explicit_bzero(text, strlen(text));
        free(text);
    }
}

/* NAME_FILE of name into out; QN_EINVAL if it does not fit. */
static qn_status config_file_var(const char *name, char *out, size_t len)
{
    int n = snprintf(out, len, "%s_FILE", name);
    return n > 0 && (size_t)n < len ? QN_OK : QN_EINVAL;
}

/* The content of the file path (what var names) into *out, a copy: one trailing newline dropped,
 * at most CONFIG_FILE_MAX bytes, no NUL byte. A pipe is read as well as a file (a value given by
 * process substitution). The errors name var and path, never what was read. */
static qn_status config_read_file(const char *var, const char *path, char **out, char *err,
                                  size_t errlen)
{
    qn_status st = QN_EINVAL;
    char *buf = NULL;
    size_t len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0) {
        qn_errf(err, errlen, "%s: cannot read %s: %s", var, path, strerror(errno));
        goto done;
    }
    /* One byte over the bound tells a file at the bound from a larger one. */
    if (!(buf = malloc(CONFIG_FILE_MAX + 1))) {
        st = QN_ENOMEM;
        qn_errf(err, errlen, "%s: out of memory reading %s", var, path);
        goto done;
    }
    for (;;) {
        ssize_t got = read(fd, buf + len, CONFIG_FILE_MAX + 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            qn_errf(err, errlen, "%s: cannot read %s: %s", var, path, strerror(errno));
            goto done;
        }
        if (got == 0)
            break;
        len += (size_t)got;
        if (len > CONFIG_FILE_MAX) {
            qn_errf(err, errlen,
                    "%s: %s holds more than %d bytes (64 KiB), the most a secret's "
                    "file may hold",
                    var, path, CONFIG_FILE_MAX);
            goto done;
        }
    }
    if (memchr(buf, '\0', len)) {
        qn_errf(err, errlen, "%s: %s holds a NUL byte", var, path);
        goto done;
    }
    if (len > 0 && buf[len - 1] == '\n')
        len -= len > 1 && buf[len - 2] == '\r' ? 2 : 1;
    if (!(*out = strndup(buf, len))) {
        st = QN_ENOMEM;
        qn_errf(err, errlen, "%s: out of memory reading %s", var, path);
        goto done;
    }
    st = QN_OK;
done:
    if (buf) {
        explicit_bzero(buf, len);
        free(buf);
    }
    if (fd >= 0)
        close(fd);
    return st;
}

/* The value of name: the environment's, else for a secret the content of the file name_FILE
 * names. *text: a copy, NULL when neither is set or the value is empty; *path: the file's path
 * when the value came from one (even an empty one), else NULL. */
static qn_status config_text(const char *name, int secret, char **text, const char **path,
                             char *err, size_t errlen)
{
    char file_var[CONFIG_NAME_MAX];
    const char *env = getenv(name), *file = NULL;

    *text = NULL;
    *path = NULL;
    if (env && !*env)
        env = NULL;
    if (secret) {
        if (config_file_var(name, file_var, sizeof(file_var)) != QN_OK) {
            qn_errf(err, errlen, "%s: name too long", name);
            return QN_EINVAL;
        }
        file = getenv(file_var);
        if (file && !*file)
            file = NULL;
    }
    if (env && file) {
        qn_errf(err, errlen, "%s and %s are both set: give the value one way only", name, file_var);
        return QN_EINVAL;
    }
    if (file) {
        qn_status st = config_read_file(file_var, file, text, err, errlen);
        if (st != QN_OK)
            return st;
        *path = file;
        if (!**text) {
            free(*text);
            *text = NULL;
        }
        return QN_OK;
    }
    if (env && !(*text = strdup(env))) {
        qn_errf(err, errlen, "%s: out of memory", name);
        return QN_ENOMEM;
    }
    return QN_OK;
}

static qn_status config_load_one(const config_var *v, void *target, char *err, size_t errlen)
{
    char *own = NULL, label[2 * CONFIG_NAME_MAX];
    const char *path = NULL;
    int secret = (v->flags & CONFIG_SECRET) != 0;
    qn_status st = config_text(v->name, secret, &own, &path, err, errlen);

    if (st != QN_OK)
        goto done;
    /* A value from a file says so in its errors: the variable the operator set is NAME_FILE. */
    if (path)
        snprintf(label, sizeof(label), "%s (from %s_FILE)", v->name, v->name);
    else
        snprintf(label, sizeof(label), "%s", v->name);
    if (!own && (v->flags & CONFIG_REQUIRED)) {
        st = QN_EINVAL;
        if (path)
            qn_errf(err, errlen, "%s: required, but %s is empty", label, path);
        else if (secret)
            qn_errf(err, errlen, "%s: required but not set (nor %s_FILE)", v->name, v->name);
        else
            qn_errf(err, errlen, "%s: required but not set", v->name);
        goto done;
    }
    const char *text = own ? own : v->def ? v->def : "";
    if ((st = config_set(v, label, text, target, err, errlen)) != QN_OK)
        goto done;
    if (v->type == CONFIG_STR) {
        char *copy = own ? own : strdup(text);
        if (!copy) {
            st = QN_ENOMEM;
            qn_errf(err, errlen, "%s: out of memory", v->name);
            goto done;
        }
        own = NULL;
        *(const char **)((char *)target + v->offset) = copy;
    }
done:
    config_wipe_free(own);
    return st;
}

qn_status config_load(const config_var *vars, size_t n, void *target, char *err, size_t errlen)
{
    qn_status st = QN_OK;

    /* Every string field NULL first: a failure frees what this call copied, and only that. */
    for (size_t i = 0; i < n; i++)
        if (vars[i].type == CONFIG_STR)
            *(const char **)((char *)target + vars[i].offset) = NULL;
    for (size_t i = 0; i < n && st == QN_OK; i++)
        st = config_load_one(&vars[i], target, err, errlen);
    if (st != QN_OK)
        config_free(vars, n, target);
    return st;
}

void config_free(const config_var *vars, size_t n, void *target)
{
    for (size_t i = 0; i < n; i++) {
        if (vars[i].type != CONFIG_STR)
            continue;
        const char **field = (const char **)((char *)target + vars[i].offset);
        if (vars[i].flags & CONFIG_SECRET)
            config_wipe_free((char *)*field);
        else
            free((char *)*field);
        *field = NULL;
    }
}

qn_status config_secret(const char *name, char **out, char *err, size_t errlen)
{
    const char *path;
    return config_text(name, 1, out, &path, err, errlen);
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
            fprintf(out, " (secret; or %s_FILE)", v->name);
        fputc('\n', out);
    }
    fprintf(out,
            "\nA secret NAME may be given instead as NAME_FILE, the path of a file holding "
            "the value\n(a Kubernetes Secret mounted as files): one trailing newline is "
            "dropped, at most %d\nbytes (64 KiB); NAME and NAME_FILE both set is an "
            "error.\n",
            CONFIG_FILE_MAX);
}

void config_log(const config_var *vars, size_t n, const void *target)
{
    for (size_t i = 0; i < n; i++) {
        char value[256], file_var[CONFIG_NAME_MAX], file[CONFIG_NAME_MAX + 32];
        config_format(&vars[i], target, value, sizeof(value));
        if (!(vars[i].flags & CONFIG_SECRET) ||
            config_file_var(vars[i].name, file_var, sizeof(file_var)) != QN_OK) {
            log_infof(NULL,
                      ((log_field[]){LOG_S("var", vars[i].name), LOG_S("value", value), LOG_END}),
                      "config");
            continue;
        }
        /* The path is not secret, and says where to look when the value is wrong. */
        const char *path = getenv(file_var);
        if (!path || !*path) {
            snprintf(file, sizeof(file), "(none: %s not set)", file_var);
            path = file;
        }
        log_infof(NULL,
                  ((log_field[]){LOG_S("var", vars[i].name), LOG_S("value", value),
                                 LOG_S("file", path), LOG_END}),
                  "config");
    }
}
