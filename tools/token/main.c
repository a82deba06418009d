/*
 * quan-token: mints the HS256 token the gateway takes (common/http/token.h), for local use and
 * tests.
 *
 *   quan-token --user ID [--shop N] [--name S] [--ttl SECONDS] [--secret-file PATH]
 *       prints the token of user ID (claim sub), of shop N (shop) and username S (name) when
 *       given, valid from now for SECONDS (default 3600, at most 31536000: a year)
 *   quan-token --verify TOKEN [--secret-file PATH]
 *       checks a token as the gateway does: prints its claims, or why it is refused (exit 1)
 *
 * The key is the first line of PATH (deploy/local/gateway.sh keeps one in DIR/jwt-secret), else
 * QUAN_GATEWAY_JWT_SECRET, or the file QUAN_GATEWAY_JWT_SECRET_FILE names, as the gateway reads
 * it (one trailing newline dropped); at least 16 characters. Exit status 0, 1 for a refused token,
 * 2 on usage errors (with the reason on stderr).
 *
 *   curl -H "Authorization: Bearer $(build/bin/quan-token --user 42)" \
 *       localhost:10000/api/engine/user-coupon/list
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "token.h"

#define TOKEN_TTL_DEFAULT 3600
#define TOKEN_TTL_MAX     31536000

static int token_usage(FILE *f)
{
    fprintf(f, "usage: quan-token --user ID [--shop N] [--name S] [--ttl SECONDS] "
               "[--secret-file PATH]\n"
               "       quan-token --verify TOKEN [--secret-file PATH]\n"
               "The key: the first line of --secret-file PATH, else QUAN_GATEWAY_JWT_SECRET or\n"
               "the file QUAN_GATEWAY_JWT_SECRET_FILE names (as the gateway reads it).\n");
    return 2;
}

/* The reason on stderr; exit status 2. */
__attribute__((format(printf, 1, 2))) static int token_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "quan-token: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return 2;
}

/* A positive decimal int64 (digits only), or 0. */
static int64_t token_id(const char *s)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v <= 0 || s[0] == '+' || s[0] == ' ')
        return 0;
    return (int64_t)v;
}

/* The first line of path, without its line end, into key (cap bytes). */
static int token_read_secret(const char *path, char *key, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "quan-token: --secret-file %s: %s\n", path, strerror(errno));
        return 2;
    }
    if (!fgets(key, (int)cap, f))
        key[0] = '\0';
    fclose(f);
    key[strcspn(key, "\r\n")] = '\0';
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"user", required_argument, NULL, 'u'},
                                         {"shop", required_argument, NULL, 's'},
                                         {"name", required_argument, NULL, 'n'},
                                         {"ttl", required_argument, NULL, 't'},
                                         {"secret-file", required_argument, NULL, 'f'},
                                         {"verify", required_argument, NULL, 'v'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *user = NULL, *shop = NULL, *name = NULL, *ttl = NULL, *file = NULL, *verify = NULL;
    static char key[4096], token[TOKEN_MAX + 1];
    char err[512];
    int o;

    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'u':
            user = optarg;
            break;
        case 's':
            shop = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 't':
            ttl = optarg;
            break;
        case 'f':
            file = optarg;
            break;
        case 'v':
            verify = optarg;
            break;
        case 'h':
            token_usage(stdout);
            return 0;
        default:
            if (optopt)
                return token_fail("%s needs a value", argv[optind - 1]);
            return token_fail("unknown option: %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return token_fail("unexpected argument: %s", argv[optind]);

    if (file) {
        int rc = token_read_secret(file, key, sizeof(key));
        if (rc)
            return rc;
    } else {
        char *env = NULL;
        if (config_secret("QUAN_GATEWAY_JWT_SECRET", &env, err, sizeof(err)) != QN_OK)
            return token_fail("%s", err);
        if (!env) {
            fprintf(stderr, "quan-token: the key is missing: set QUAN_GATEWAY_JWT_SECRET (or "
                            "QUAN_GATEWAY_JWT_SECRET_FILE) or give --secret-file PATH\n");
            return token_usage(stderr);
        }
        snprintf(key, sizeof(key), "%s", env);
        free(env);
    }
    if (strlen(key) < TOKEN_KEY_MIN)
        return token_fail("the key must hold at least 16 characters (%s)",
                          file ? file : "QUAN_GATEWAY_JWT_SECRET");

    if (verify) {
        token_claims c;
        if (user || shop || name || ttl)
            return token_fail("%s", "--verify takes no claims");
        if (token_verify(key, strlen(key), verify, (int64_t)time(NULL), &c, err, sizeof(err)) !=
            QN_OK) {
            printf("refused: %s\n", err);
            return 1;
        }
        printf("ok: sub %" PRId64 " shop %" PRId64 " name \"%s\" exp %" PRId64 "\n", c.user_id,
               c.shop_number, c.name, c.exp);
        return 0;
    }

    token_claims c = {0};
    if (!user)
        return token_fail("%s", "--user ID is required");
    if (!(c.user_id = token_id(user)))
        return token_fail("--user: must be a positive decimal user id, not '%s'", user);
    if (shop && !(c.shop_number = token_id(shop)))
        return token_fail("--shop: must be a positive decimal shop number, not '%s'", shop);
    if (name) {
        if (!token_name_ok(name))
            return token_fail("%s", "--name: must be 1 to 64 characters of UTF-8 without "
                                    "control characters");
        snprintf(c.name, sizeof(c.name), "%s", name);
    }
    int64_t life = TOKEN_TTL_DEFAULT;
    if (ttl && ((life = token_id(ttl)) <= 0 || life > TOKEN_TTL_MAX))
        return token_fail("--ttl: must be a number of seconds from 1 to 31536000, not '%s'", ttl);
    c.iat = (int64_t)time(NULL);
    c.exp = c.iat + life;

    if (token_sign(key, strlen(key), &c, token, sizeof(token), err, sizeof(err)) != QN_OK)
        return token_fail("%s", err);
    printf("%s\n", token);
    return 0;
}
