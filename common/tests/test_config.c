#include <stdlib.h>

#include "config.h"
#include "log.h"
#include "testhelp.h"

typedef struct {
    const char *name;
    int64_t port;
    int verbose;
    int mode;
} sample_cfg;

static const char *const sample_modes[] = {"fast", "safe", NULL};

static const config_var sample_vars[] = {
    {"QT_NAME", CONFIG_STR, offsetof(sample_cfg, name), "quan", 0, 8, NULL, 0, "name"},
    {"QT_PORT", CONFIG_INT, offsetof(sample_cfg, port), NULL, 1, 65535, NULL, CONFIG_REQUIRED,
     "port"},
    {"QT_VERBOSE", CONFIG_BOOL, offsetof(sample_cfg, verbose), "false", 0, 0, NULL, 0, "verbose"},
    {"QT_MODE", CONFIG_ENUM, offsetof(sample_cfg, mode), "safe", 0, 0, sample_modes, 0, "mode"},
};
#define NVARS (sizeof(sample_vars) / sizeof(sample_vars[0]))

static void test_defaults_and_required(void)
{
    sample_cfg c = {0};
    char err[256] = "";
    unsetenv("QT_NAME"), unsetenv("QT_PORT"), unsetenv("QT_VERBOSE"), unsetenv("QT_MODE");
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_PORT") != NULL);

    setenv("QT_PORT", "8080", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(c.name, "quan");
    CHECK_EQ_INT(c.port, 8080);
    CHECK_EQ_INT(c.verbose, 0);
    CHECK_EQ_INT(c.mode, 1);
}

static void test_bad_values_name_the_variable(void)
{
    sample_cfg c = {0};
    char err[256] = "";
    setenv("QT_PORT", "70000", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_PORT") && strstr(err, "outside"));

    setenv("QT_PORT", "12ab", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "not an integer") != NULL);

    setenv("QT_PORT", "80", 1);
    setenv("QT_MODE", "turbo", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_MODE") && strstr(err, "fast"));
    unsetenv("QT_MODE");

    setenv("QT_VERBOSE", "maybe", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_VERBOSE") != NULL);
    setenv("QT_VERBOSE", "yes", 1);

    setenv("QT_NAME", "much-too-long", 1);
    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_NAME") != NULL);
    unsetenv("QT_NAME");

    CHECK(config_load(sample_vars, NVARS, &c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(c.verbose, 1);
}

/* A value's own check: the reason comes with the variable's name, never the value. */
static qn_status no_x(const char *value, char *err, size_t errlen)
{
    if (strchr(value, 'x')) {
        snprintf(err, errlen, "item 2 of 3 holds an x");
        return QN_EINVAL;
    }
    return QN_OK;
}

static void test_check_hook(void)
{
    typedef struct {
        const char *secret;
    } hook_cfg;
    static const config_var vars[] = {{"QT_LIST", CONFIG_STR, offsetof(hook_cfg, secret), "a,b", 0,
                                       64, NULL, CONFIG_SECRET, "list", no_x}};
    hook_cfg c = {0};
    char err[256] = "";

    unsetenv("QT_LIST");
    CHECK(config_load(vars, 1, &c, err, sizeof(err)) == QN_OK); /* the default is checked too */
    CHECK_EQ_STR(c.secret, "a,b");
    setenv("QT_LIST", "a,pxssword,c", 1);
    CHECK(config_load(vars, 1, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "QT_LIST: item 2 of 3 holds an x");
    CHECK(strstr(err, "pxssword") == NULL);
    unsetenv("QT_LIST");
}

static void test_help_lists_every_variable(void)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print_help(f, "prog", "summary", sample_vars, NVARS);
    fclose(f);
    for (size_t i = 0; i < NVARS; i++)
        CHECK(strstr(buf, sample_vars[i].name) != NULL);
    CHECK(strstr(buf, "(required)") != NULL);
    free(buf);
}

static void test_log_escape(void)
{
    char buf[64];
    log_json_escape(buf, sizeof(buf), "a\"b\\c\nd\x01");
    CHECK_EQ_STR(buf, "a\\\"b\\\\c\\nd\\u0001");
    log_json_escape(buf, 4, "abcdef");
    CHECK_EQ_STR(buf, "abc");
    CHECK_EQ_INT(log_level_parse("WARN"), LOGL_WARN);
    CHECK_EQ_INT(log_level_parse("loud"), -1);
}

int main(void)
{
    RUN(test_defaults_and_required);
    RUN(test_bad_values_name_the_variable);
    RUN(test_check_hook);
    RUN(test_help_lists_every_variable);
    RUN(test_log_escape);
    TEST_MAIN_END();
}
