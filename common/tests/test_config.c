#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

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
    config_free(sample_vars, NVARS, &c);
    CHECK(c.name == NULL);
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
    config_free(sample_vars, NVARS, &c);
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
    config_free(vars, 1, &c);
    setenv("QT_LIST", "a,pxssword,c", 1);
    CHECK(config_load(vars, 1, &c, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "QT_LIST: item 2 of 3 holds an x");
    CHECK(strstr(err, "pxssword") == NULL);
    unsetenv("QT_LIST");
}

/* ---- secrets given as files (NAME_FILE) ---- */

typedef struct {
    const char *key;  /* required secret */
    const char *pass; /* secret with a default */
    const char *host; /* not a secret: NAME_FILE means nothing to it */
} secret_cfg;

/* Refuses a value holding "bad", without quoting it. */
static qn_status no_bad(const char *value, char *err, size_t errlen)
{
    if (strstr(value, "bad")) {
        snprintf(err, errlen, "refused");
        return QN_EINVAL;
    }
    return QN_OK;
}

static const config_var secret_vars[] = {
    {"QT_KEY", CONFIG_STR, offsetof(secret_cfg, key), NULL, 1, 32, NULL,
     CONFIG_REQUIRED | CONFIG_SECRET, "key", no_bad},
    {"QT_PASS", CONFIG_STR, offsetof(secret_cfg, pass), "dflt", 0, 0, NULL, CONFIG_SECRET, "pass"},
    {"QT_HOST", CONFIG_STR, offsetof(secret_cfg, host), "localhost", 1, 64, NULL, 0, "host"},
};
#define NSECRET (sizeof(secret_vars) / sizeof(secret_vars[0]))

static char secret_dir[512];

/* dir/name holding len bytes of text; its path into path. */
static void write_file(char *path, size_t cap, const char *name, const char *text, size_t len)
{
    snprintf(path, cap, "%s/%s", secret_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(text, 1, len, f) == len);
        fclose(f);
    }
}

/* A string literal's bytes, a NUL inside included. */
#define WRITE_LIT(path, name, lit) write_file(path, sizeof(path), name, lit, sizeof(lit) - 1)

static void secret_env_clear(void)
{
    unsetenv("QT_KEY"), unsetenv("QT_KEY_FILE"), unsetenv("QT_PASS"), unsetenv("QT_PASS_FILE");
    unsetenv("QT_HOST"), unsetenv("QT_HOST_FILE");
}

/* config_load into c; on QN_OK the copies are left for the caller to free. */
static qn_status load_secrets(secret_cfg *c, char *err, size_t errlen)
{
    memset(c, 0x5a, sizeof(*c)); /* whatever was there: config_load does not read it */
    err[0] = '\0';
    return config_load(secret_vars, NSECRET, c, err, errlen);
}

static void test_secret_from_file(void)
{
    static const struct {
        const char *content;
        const char *want;
    } cases[] = {
        {"Key-One-4711\n", "Key-One-4711"},     /* one trailing newline dropped */
        {"Key-One-4711\r\n", "Key-One-4711"},   /* or CR LF */
        {"Key-One-4711", "Key-One-4711"},       /* none: as it is */
        {"Key-One-4711\n\n", "Key-One-4711\n"}, /* one only */
        {" Key One \n", " Key One "},           /* spaces are the value's */
        {"line1\nline2\n", "line1\nline2"},     /* inner newlines too */
    };
    secret_cfg c;
    char err[512], path[600];

    secret_env_clear();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_file(path, sizeof(path), "key", cases[i].content, strlen(cases[i].content));
        setenv("QT_KEY_FILE", path, 1);
        CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
        if (!c.key || strcmp(c.key, cases[i].want))
            printf("  case %zu: \"%s\" (%s)\n", i, c.key ? c.key : "(null)", err);
        CHECK_EQ_STR(c.key, cases[i].want);
        CHECK_EQ_STR(c.pass, "dflt");
        CHECK_EQ_STR(c.host, "localhost");
        config_free(secret_vars, NSECRET, &c);
        CHECK(c.key == NULL && c.pass == NULL && c.host == NULL);
    }

    /* The optional secret from a file too; an empty file is an empty value: the default. */
    WRITE_LIT(path, "pass", "Pass-4711\n");
    setenv("QT_PASS_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(c.pass, "Pass-4711");
    config_free(secret_vars, NSECRET, &c);
    WRITE_LIT(path, "pass", "\n");
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(c.pass, "dflt");
    config_free(secret_vars, NSECRET, &c);
    unsetenv("QT_PASS_FILE");

    /* The environment's value is still taken, and an empty NAME_FILE is unset. */
    unsetenv("QT_KEY_FILE");
    setenv("QT_KEY", "Key-From-Env", 1);
    setenv("QT_KEY_FILE", "", 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(c.key, "Key-From-Env");
    config_free(secret_vars, NSECRET, &c);

    /* NAME_FILE of a variable that is not a secret is not read. */
    WRITE_LIT(path, "host", "db.example\n");
    setenv("QT_HOST_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(c.host, "localhost");
    config_free(secret_vars, NSECRET, &c);
    secret_env_clear();
}

static void test_secret_file_errors(void)
{
    const char *secret = "Key-Never-Shown-4711";
    secret_cfg c;
    char err[512], path[600], missing[600];

    secret_env_clear();
    WRITE_LIT(path, "key", "Key-Never-Shown-4711\n");

    /* Both ways at once: refused, both named, the value in neither. */
    setenv("QT_KEY", secret, 1);
    setenv("QT_KEY_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_KEY and QT_KEY_FILE are both set") != NULL);
    CHECK(strstr(err, secret) == NULL);
    CHECK(c.key == NULL && c.pass == NULL && c.host == NULL); /* nothing left allocated */
    unsetenv("QT_KEY");

    /* A file that is not there: the variable and the path, and why. */
    snprintf(missing, sizeof(missing), "%s/no-such-file", secret_dir);
    setenv("QT_KEY_FILE", missing, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_KEY_FILE: cannot read") && strstr(err, missing) &&
          strstr(err, "No such file"));
    /* A directory cannot be read either. */
    setenv("QT_KEY_FILE", secret_dir, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_KEY_FILE: cannot read") && strstr(err, secret_dir));
    /* Nor a file this process may not read (root reads anything: then it is read). */
    WRITE_LIT(path, "closed", "Key-Never-Shown-4711");
    chmod(path, 0);
    setenv("QT_KEY_FILE", path, 1);
    qn_status st = load_secrets(&c, err, sizeof(err));
    if (geteuid() != 0)
        CHECK(st == QN_EINVAL && strstr(err, "Permission denied") && strstr(err, path));
    if (st == QN_OK)
        config_free(secret_vars, NSECRET, &c);
    CHECK(strstr(err, secret) == NULL);

    /* An empty file for a required secret: the file is named, as empty. */
    WRITE_LIT(path, "empty", "");
    setenv("QT_KEY_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_KEY (from QT_KEY_FILE): required") && strstr(err, path) &&
          strstr(err, "empty"));
    /* Neither set: the file's variable is named as the other way. */
    unsetenv("QT_KEY_FILE");
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "QT_KEY: required but not set (nor QT_KEY_FILE)");

    /* The file's value is checked like any other, and the error says where it came from. */
    WRITE_LIT(path, "key", "Key-Never-Shown-bad\n");
    setenv("QT_KEY_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "QT_KEY (from QT_KEY_FILE): refused");
    WRITE_LIT(path, "key", "Key-Never-Shown-4711-and-much-more-than-32\n");
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK_EQ_STR(err, "QT_KEY (from QT_KEY_FILE): longer than 32 characters");

    /* A NUL byte would cut the value short without a word: refused. */
    WRITE_LIT(path, "key", "Key-Never\0Shown-4711");
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
    CHECK(strstr(err, "QT_KEY_FILE") && strstr(err, "NUL byte") && !strstr(err, "Key-Never"));

    /* The bound: 64 KiB is read (QT_PASS has no length limit of its own), a byte more is not. */
    char *big = malloc(CONFIG_FILE_MAX + 2);
    CHECK(big != NULL);
    if (big) {
        memset(big, 'k', CONFIG_FILE_MAX + 1);
        unsetenv("QT_KEY_FILE");
        setenv("QT_KEY", "Key-From-Env", 1);
        write_file(path, sizeof(path), "big", big, CONFIG_FILE_MAX);
        setenv("QT_PASS_FILE", path, 1);
        CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
        CHECK(c.pass && strlen(c.pass) == CONFIG_FILE_MAX);
        config_free(secret_vars, NSECRET, &c);
        write_file(path, sizeof(path), "big", big, CONFIG_FILE_MAX + 1);
        CHECK(load_secrets(&c, err, sizeof(err)) == QN_EINVAL);
        CHECK(strstr(err, "QT_PASS_FILE") && strstr(err, path) && strstr(err, "64 KiB"));
        CHECK(strstr(err, "kkkk") == NULL);
        free(big);
    }
    secret_env_clear();
}

static void test_secret_outside_a_table(void)
{
    char err[512] = "", path[600], *v = NULL;

    secret_env_clear();
    CHECK(config_secret("QT_KEY", &v, err, sizeof(err)) == QN_OK);
    CHECK(v == NULL);
    setenv("QT_KEY", "Key-From-Env", 1);
    CHECK(config_secret("QT_KEY", &v, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(v, "Key-From-Env");
    free(v);
    v = NULL;
    WRITE_LIT(path, "key", "Key-From-File\r\n");
    setenv("QT_KEY_FILE", path, 1);
    CHECK(config_secret("QT_KEY", &v, err, sizeof(err)) == QN_EINVAL);
    CHECK(v == NULL && strstr(err, "QT_KEY and QT_KEY_FILE are both set"));
    unsetenv("QT_KEY");
    CHECK(config_secret("QT_KEY", &v, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(v, "Key-From-File");
    free(v);
    secret_env_clear();
}

/* config_log: secrets masked, and the file a secret came from named. */
static void test_log_names_the_file(void)
{
    secret_cfg c;
    char err[512], path[600];

    secret_env_clear();
    WRITE_LIT(path, "key", "Key-Never-Logged-4711\n");
    setenv("QT_KEY_FILE", path, 1);
    CHECK(load_secrets(&c, err, sizeof(err)) == QN_OK);
    log_init("test_config", LOGL_INFO);
    th_capture cap = th_capture_start();
    config_log(secret_vars, NSECRET, &c);
    char *out = th_capture_end(cap);
    char want[800];
    snprintf(want, sizeof(want), "\"var\":\"QT_KEY\",\"value\":\"(set)\",\"file\":\"%s\"", path);
    CHECK(out && strstr(out, want));
    CHECK(out && strstr(out, "\"var\":\"QT_PASS\",\"value\":\"(set)\",\"file\":\"(none: "
                             "QT_PASS_FILE not set)\""));
    CHECK(out && strstr(out, "\"var\":\"QT_HOST\",\"value\":\"localhost\"}"));
    CHECK(out && !strstr(out, "Key-Never-Logged"));
    free(out);
    config_free(secret_vars, NSECRET, &c);
    secret_env_clear();
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

    /* A secret's line names its file variable; the text says what NAME_FILE is. */
    f = open_memstream(&buf, &len);
    config_print_help(f, "prog", "summary", secret_vars, NSECRET);
    fclose(f);
    CHECK(strstr(buf, "(secret; or QT_KEY_FILE)") != NULL);
    CHECK(strstr(buf, "QT_HOST_FILE") == NULL);
    CHECK(strstr(buf, "NAME_FILE, the path of a file holding the value") != NULL);
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
    th_tmpdir(secret_dir, sizeof(secret_dir), "test_config");
    RUN(test_defaults_and_required);
    RUN(test_bad_values_name_the_variable);
    RUN(test_check_hook);
    RUN(test_secret_from_file);
    RUN(test_secret_file_errors);
    RUN(test_secret_outside_a_table);
    RUN(test_log_names_the_file);
    RUN(test_help_lists_every_variable);
    RUN(test_log_escape);
    th_rmtree(secret_dir);
    TEST_MAIN_END();
}
