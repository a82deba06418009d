/*
 * The Redis command core (rcmd.h) without a server, as tables: the command table itself, the
 * classification of commands (as argv and as RESP requests, which must agree), admission, RESP
 * formatting against hiredis' own, script calls and NOSCRIPT, the options, and the redirect
 * and retry rule (every verdict against the states it depends on).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "keys.h"
#include "log.h"
#include "rcmd.h"
#include "testhelp.h"

/* ---------------------------------------------------------------- the table */

static void test_table_sorted_and_found(void)
{
    size_t n;
    const rcmd_row *t = rcmd_rows(&n);
    CHECK(n > 50);
    for (size_t i = 0; i < n; i++) {
        char lower[32];
        size_t len = strlen(t[i].name);
        if (i > 0 && strcmp(t[i - 1].name, t[i].name) >= 0)
            printf("  out of order: %s, %s\n", t[i - 1].name, t[i].name);
        CHECK(i == 0 || strcmp(t[i - 1].name, t[i].name) < 0);
        CHECK(rcmd_lookup(t[i].name, len) == &t[i]);
        for (size_t k = 0; k <= len; k++)
            lower[k] = (char)(t[i].name[k] >= 'A' && t[i].name[k] <= 'Z' ? t[i].name[k] + 32
                                                                         : t[i].name[k]);
        CHECK(rcmd_lookup(lower, len) == &t[i]);
        /* a keyless row says nothing of keys */
        CHECK(!(t[i].flags & RCMD_NOKEY) || t[i].keys == RCMD_KEYS_FIRST);
    }
    CHECK(rcmd_lookup("GE", 2) == NULL);
    CHECK(rcmd_lookup("GETX", 4) == NULL);
    CHECK(rcmd_lookup("", 0) == NULL);
    CHECK(rcmd_lookup("SET", 3) == NULL); /* not in the table: a write with its key first */
}

/* What the rules depend on: nothing that may write is read-only, and the transactions. */
static void test_table_flags(void)
{
    static const struct {
        const char *name;
        unsigned flags;
    } v[] = {
        {"GET", RCMD_READONLY},
        {"MGET", RCMD_READONLY},
        {"HGETALL", RCMD_READONLY},
        {"ZRANGE", RCMD_READONLY},
        {"PING", RCMD_READONLY | RCMD_NOKEY},
        {"INFO", RCMD_READONLY | RCMD_NOKEY},
        {"SCAN", RCMD_READONLY | RCMD_NOKEY},
        {"EVAL_RO", RCMD_READONLY},
        {"EVALSHA_RO", RCMD_READONLY},
        {"EVAL", 0},
        {"EVALSHA", 0},
        {"FCALL", 0},
        {"DEL", 0},
        {"BLPOP", 0},
        {"TOUCH", 0},
        {"SCRIPT", RCMD_NOKEY},
        {"FLUSHALL", RCMD_NOKEY},
        {"MULTI", RCMD_TRANSACTION | RCMD_NOKEY},
        {"EXEC", RCMD_TRANSACTION | RCMD_NOKEY},
        {"DISCARD", RCMD_TRANSACTION | RCMD_NOKEY},
        {"UNWATCH", RCMD_TRANSACTION | RCMD_NOKEY},
        {"WATCH", RCMD_TRANSACTION},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        const rcmd_row *r = rcmd_lookup(v[i].name, strlen(v[i].name));
        if (!r || r->flags != v[i].flags)
            printf("  case %s\n", v[i].name);
        CHECK(r != NULL);
        CHECK_EQ_INT(r ? r->flags : 99u, v[i].flags);
    }
}

/* ---------------------------------------------------------------- classification */

#define MAXARG 12

typedef struct {
    const char *argv[MAXARG]; /* NULL-terminated */
    int slot;                 /* a slot, RCMD_SLOT_NONE, RCMD_SLOT_CROSS; or SLOT_OF_KEY */
    const char *key;          /* SLOT_OF_KEY: the slot of this key */
    unsigned flags;
} class_case;

#define SLOT_OF_KEY 99999

static int argc_of(const class_case *c)
{
    int n = 0;
    while (n < MAXARG && c->argv[n])
        n++;
    return n;
}

static void test_classify_table(void)
{
    static const class_case v[] = {
        {{"GET", "foo"}, SLOT_OF_KEY, "foo", RCMD_READONLY},
        {{"hgetall", "foo"}, SLOT_OF_KEY, "foo", RCMD_READONLY}, /* names are case-blind */
        {{"SET", "foo", "bar", "PX", "10"}, SLOT_OF_KEY, "foo", 0},
        {{"SET"}, RCMD_SLOT_NONE, NULL, 0}, /* malformed, the server answers */
        {{"PING"}, RCMD_SLOT_NONE, NULL, RCMD_READONLY | RCMD_NOKEY},
        {{"INFO", "server"}, RCMD_SLOT_NONE, NULL, RCMD_READONLY | RCMD_NOKEY},
        {{"SCRIPT", "LOAD", "return 1"}, RCMD_SLOT_NONE, NULL, RCMD_NOKEY},
        {{"CLIENT", "TRACKING", "on"}, RCMD_SLOT_NONE, NULL, RCMD_NOKEY},
        {{"DEL", "{foo}a", "{foo}b", "foo"}, SLOT_OF_KEY, "foo", 0},
        {{"DEL", "foo", "bar"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"EXISTS", "foo", "{bar}x"}, RCMD_SLOT_CROSS, NULL, RCMD_READONLY},
        {{"MGET", "{foo}1", "{foo}2"}, SLOT_OF_KEY, "foo", RCMD_READONLY},
        {{"MSET", "{foo}1", "bar", "{foo}2", "bar"}, SLOT_OF_KEY, "foo", 0}, /* values not keys */
        {{"MSET", "{foo}1", "v", "bar", "v"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"RENAME", "{foo}old", "{foo}new"}, SLOT_OF_KEY, "foo", 0},
        {{"RENAME", "foo", "bar"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"LMOVE", "{foo}a", "{foo}b", "LEFT", "RIGHT"}, SLOT_OF_KEY, "foo", 0},
        {{"BLPOP", "{foo}q", "bar"}, SLOT_OF_KEY, "foo", 0}, /* bar is the timeout */
        {{"BLPOP", "foo", "bar", "5"}, RCMD_SLOT_CROSS, NULL, 0},
        /* scripts: the keys only, never the arguments */
        {{"EVALSHA", "abc", "2", "{foo}1", "{foo}2", "bar"}, SLOT_OF_KEY, "foo", 0},
        {{"EVALSHA", "abc", "2", "{foo}1", "bar"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"EVALSHA_RO", "abc", "1", "foo"}, SLOT_OF_KEY, "foo", RCMD_READONLY},
        {{"EVAL", "return 1", "0", "bar"}, RCMD_SLOT_NONE, NULL, 0},
        {{"EVAL", "return 1", "3", "foo"}, RCMD_SLOT_CROSS, NULL, 0}, /* more keys than args */
        {{"EVAL", "return 1", "x", "foo"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"EVAL", "return 1", "-1", "foo"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"EVAL", "return 1", "", "foo"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"EVAL", "return 1"}, RCMD_SLOT_CROSS, NULL, 0},
        {{"FCALL", "f", "1", "foo", "a"}, SLOT_OF_KEY, "foo", 0},
        {{"MULTI"}, RCMD_SLOT_NONE, NULL, RCMD_TRANSACTION | RCMD_NOKEY},
        {{"WATCH", "{foo}a", "{foo}b"}, SLOT_OF_KEY, "foo", RCMD_TRANSACTION},
        {{"WATCH", "foo", "bar"}, RCMD_SLOT_CROSS, NULL, RCMD_TRANSACTION},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int argc = argc_of(&v[i]);
        size_t len[MAXARG], used = 0;
        char buf[512], *heap;
        rcmd_info a, r;
        int want = v[i].slot == SLOT_OF_KEY ? rslot_of_key(v[i].key, strlen(v[i].key)) : v[i].slot;
        for (int k = 0; k < argc; k++)
            len[k] = strlen(v[i].argv[k]);
        rcmd_classify_argv(argc, v[i].argv, len, &a);
        size_t n = rcmd_format(buf, sizeof(buf), &heap, argc, v[i].argv, len);
        CHECK(heap == NULL);
        CHECK(rcmd_classify_request(buf, n, &used, &r) == QN_OK);
        if (a.slot != want || r.slot != want || a.flags != v[i].flags)
            printf("  case %zu: %s %s\n", i, v[i].argv[0], argc > 1 ? v[i].argv[1] : "");
        CHECK_EQ_INT(a.slot, want);
        CHECK_EQ_INT(r.slot, want);
        CHECK_EQ_INT(a.flags, v[i].flags);
        CHECK_EQ_INT(r.flags, v[i].flags);
        CHECK_EQ_INT(used, n);
        CHECK_EQ_STR(a.name, v[i].argv[0]);
        CHECK_EQ_STR(r.name, v[i].argv[0]);
    }
}

/* The claim's keys (keys.h) share the template's slot, through the script call. */
static void test_classify_claim(void)
{
    char a[KEYS_LEN], b[KEYS_LEN], c[KEYS_LEN], m[KEYS_LEN];
    keys_template(a, 1810714735922956666);
    keys_template_users(b, 1810714735922956666);
    keys_template_resv(c, 1810714735922956666);
    keys_resv_member(m, 42, "r-1");
    const char *argv[] = {"EVALSHA", "sha", "3", a, b, c, "host:1/run", "now", "shop", "42", m};
    size_t len[11];
    rcmd_info ci;
    for (int i = 0; i < 11; i++)
        len[i] = strlen(argv[i]);
    rcmd_classify_argv(11, argv, len, &ci);
    CHECK_EQ_INT(ci.slot, 10314);
    CHECK_EQ_INT(ci.flags, 0);
}

static void test_classify_requests(void)
{
    static const char two[] = "*3\r\n$3\r\nSET\r\n$3\r\nfoo\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n";
    static const struct {
        const char *in;
        qn_status st;
    } bad[] = {
        {"*1\r\n$5\r\nPING\r\n", QN_EINVAL},
        {"PING\r\n", QN_EINVAL},
        {"*1\r\n$4\r\nPINGxx", QN_EINVAL},
        {"*0\r\n", QN_EINVAL},
        {"*2\r\n$4\r\nPING\r\n", QN_EINVAL}, /* cut short */
        {"*1\r\n$-1\r\n", QN_EINVAL},
        {"*1\r\n$4\r\nPING\r", QN_EINVAL},
        {"", QN_EINVAL},
    };
    size_t used = 0;
    rcmd_info ci;
    CHECK(rcmd_classify_request(two, sizeof(two) - 1, &used, &ci) == QN_OK);
    CHECK_EQ_INT(used, 28);
    CHECK_EQ_STR(ci.name, "SET");
    CHECK_EQ_INT(ci.slot, rslot_of_key("foo", 3));
    CHECK(rcmd_classify_request(two + used, sizeof(two) - 1 - used, &used, &ci) == QN_OK);
    CHECK_EQ_INT(used, 14);
    CHECK_EQ_STR(ci.name, "PING");
    CHECK(rcmd_classify_request(two, 27, &used, &ci) == QN_EINVAL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ_INT(rcmd_classify_request(bad[i].in, strlen(bad[i].in), &used, &ci), bad[i].st);
    /* a long name is cut to fit */
    const char *longname[] = {"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"};
    size_t ll = strlen(longname[0]);
    rcmd_classify_argv(1, longname, &ll, &ci);
    CHECK_EQ_INT(strlen(ci.name), RCMD_NAME_MAX - 1);
    /* many arguments: no limit from a stack array */
    const char *many[300];
    size_t mlen[300];
    many[0] = "DEL";
    for (int i = 1; i < 300; i++)
        many[i] = "{foo}k";
    for (int i = 0; i < 300; i++)
        mlen[i] = strlen(many[i]);
    char *heap;
    char small[64];
    size_t n = rcmd_format(small, sizeof(small), &heap, 300, many, mlen);
    CHECK(heap != NULL);
    CHECK(heap && rcmd_classify_request(heap, n, &used, &ci) == QN_OK);
    CHECK_EQ_INT(ci.slot, rslot_of_key("foo", 3));
    free(heap);
}

static void test_admission_table(void)
{
    static const struct {
        const char *argv[4];
        int cluster;
        qn_status st;
        const char *why;
    } v[] = {
        {{"GET", "foo"}, 0, QN_OK, NULL},
        {{"GET", "foo"}, 1, QN_OK, NULL},
        {{"DEL", "foo", "bar"}, 0, QN_EINVAL, "CROSSSLOT"}, /* one server too */
        {{"DEL", "foo", "bar"}, 1, QN_EINVAL, "CROSSSLOT"},
        {{"EVAL", "s", "x"}, 0, QN_EINVAL, "CROSSSLOT"},
        {{"MULTI"}, 0, QN_OK, NULL},
        {{"MULTI"}, 1, QN_EINVAL, "transactions are refused"},
        {{"EXEC"}, 1, QN_EINVAL, "transactions are refused"},
        {{"WATCH", "foo"}, 1, QN_EINVAL, "transactions are refused"},
        {{"WATCH", "foo"}, 0, QN_OK, NULL},
        {{"PING"}, 1, QN_OK, NULL},
    };
    th_capture cap = th_capture_start();
    qn_status got[sizeof(v) / sizeof(v[0])];
    const char *why[sizeof(v) / sizeof(v[0])];
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        size_t len[4];
        int argc = 0;
        rcmd_info ci;
        while (argc < 4 && v[i].argv[argc]) {
            len[argc] = strlen(v[i].argv[argc]);
            argc++;
        }
        rcmd_classify_argv(argc, v[i].argv, len, &ci);
        why[i] = NULL;
        got[i] = rcmd_admit(&ci, v[i].cluster, &why[i]);
    }
    char *out = th_capture_end(cap);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        if (got[i] != v[i].st)
            printf("  case %zu: %s cluster=%d\n", i, v[i].argv[0], v[i].cluster);
        CHECK_EQ_INT(got[i], v[i].st);
        CHECK(v[i].why ? why[i] && strstr(why[i], v[i].why) != NULL : why[i] == NULL);
    }
    /* each refusal is logged with the command's name */
    CHECK(out && strstr(out, "\"command\":\"DEL\"") != NULL);
    CHECK(out && strstr(out, "\"command\":\"MULTI\"") != NULL);
    free(out);
}

/* ---------------------------------------------------------------- RESP */

static void test_format_is_hiredis(void)
{
    static const char *argvs[][4] = {
        {"PING"},
        {"SET", "k", "", NULL},
        {"EVALSHA", "0123456789012345678901234567890123456789", "1", "{t}k"},
    };
    static const int argcs[] = {1, 3, 4};
    for (size_t i = 0; i < 3; i++) {
        char buf[256], *heap, *want = NULL;
        size_t n = rcmd_format(buf, sizeof(buf), &heap, argcs[i], argvs[i], NULL);
        int wn = redisFormatCommandArgv(&want, argcs[i], argvs[i], NULL);
        CHECK(heap == NULL);
        CHECK_EQ_INT(n, wn);
        CHECK(want && memcmp(buf, want, n) == 0);
        redisFreeCommand(want);
    }
    /* binary arguments, and cap 0: an owned buffer */
    const char *bin[2] = {"SET", "a\0b\r\n"};
    size_t blen[2] = {3, 5};
    char *heap = NULL, *want = NULL;
    size_t n = rcmd_format(NULL, 0, &heap, 2, bin, blen);
    int wn = redisFormatCommandArgv(&want, 2, bin, blen);
    CHECK(heap != NULL);
    CHECK_EQ_INT(n, wn);
    CHECK(heap && want && memcmp(heap, want, n) == 0);
    free(heap);
    redisFreeCommand(want);
}

/* ---------------------------------------------------------------- script calls */

static void test_script_calls(void)
{
    char dir[256], path[300];
    th_tmpdir(dir, sizeof(dir), "test_rcmd");
    snprintf(path, sizeof(path), "%s/t_script.lua", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("return KEYS[1]", f);
    fclose(f);
    redis_scripts *s = redis_scripts_load_dir(dir);
    CHECK(s != NULL);
    const char *keys[2] = {"{a}1", "{a}2"}, *args[1] = {"x"};
    const char *why = NULL;
    rcmd_script *sc = NULL;

    CHECK(rcmd_script_new(s, "t_script", 2, keys, 1, args, 0, &sc, &why) == QN_OK);
    CHECK(sc != NULL);
    if (sc) {
        CHECK_EQ_INT(sc->argc, 6);
        CHECK_EQ_STR(sc->argv[0], "EVALSHA");
        CHECK_EQ_STR(sc->argv[1], redis_scripts_sha1(s, "t_script"));
        CHECK_EQ_STR(sc->argv[2], "2");
        CHECK_EQ_INT(sc->argvlen[2], 1);
        CHECK_EQ_STR(sc->argv[4], "{a}2");
        CHECK_EQ_INT(sc->argvlen[5], 1);
        CHECK(sc->argv[3] != keys[0]); /* copies */
        CHECK(rcmd_script_extra(sc) == NULL);
        redisReply other = {.type = REDIS_REPLY_ERROR, .str = (char *)"ERR boom", .len = 8};
        redisReply noscript = {
            .type = REDIS_REPLY_ERROR, .str = (char *)"NOSCRIPT No matching script", .len = 27};
        redisReply ok = {.type = REDIS_REPLY_STRING, .str = (char *)"{a}1", .len = 4};
        CHECK_EQ_INT(rcmd_script_fallback(sc, &ok), 0);
        CHECK_EQ_INT(rcmd_script_fallback(sc, &other), 0);
        CHECK_EQ_INT(rcmd_script_fallback(sc, NULL), 0);
        CHECK_EQ_STR(sc->argv[0], "EVALSHA");
        CHECK_EQ_INT(rcmd_script_fallback(sc, &noscript), 1); /* EVAL of the source, once */
        CHECK_EQ_STR(sc->argv[0], "EVAL");
        CHECK_EQ_STR(sc->argv[1], "return KEYS[1]");
        CHECK_EQ_INT(sc->argvlen[1], 14);
        CHECK_EQ_INT(rcmd_script_fallback(sc, &noscript), 0); /* then that reply is the answer */
        free(sc);
    }
    /* the caller's own bytes, aligned, beside copies that stay whole */
    CHECK(rcmd_script_new(s, "t_script", 2, keys, 1, args, 24, &sc, &why) == QN_OK);
    if (sc) {
        char *extra = rcmd_script_extra(sc);
        CHECK(extra != NULL && (uintptr_t)extra % _Alignof(max_align_t) == 0);
        CHECK(extra && extra[0] == 0 && extra[23] == 0);
        if (extra)
            memset(extra, 0x7f, 24);
        CHECK_EQ_STR(sc->argv[0], "EVALSHA");
        CHECK_EQ_STR(sc->argv[5], "x");
        free(sc);
    }
    th_capture cap = th_capture_start();
    qn_status unknown = rcmd_script_new(s, "nope", 0, NULL, 0, NULL, 0, &sc, &why);
    const char *why_unknown = why;
    qn_status counts = rcmd_script_new(s, "claim", 0, NULL, 0, NULL, 0, &sc, &why);
    const char *why_counts = why;
    qn_status negative = rcmd_script_new(s, "t_script", -1, keys, 0, NULL, 0, &sc, &why);
    free(th_capture_end(cap));
    CHECK_EQ_INT(unknown, QN_ENOTFOUND);
    CHECK_EQ_STR(why_unknown, "unknown script");
    CHECK_EQ_INT(counts, QN_EINVAL); /* claim takes keys: scripts.h says how many */
    CHECK(strstr(why_counts, "wrong number") != NULL);
    CHECK_EQ_INT(negative, QN_EINVAL);
    CHECK(sc == NULL);
    redis_scripts_free(s);
    th_rmtree(dir);
}

/* ---------------------------------------------------------------- options */

static void test_conf_table(void)
{
    static const struct {
        rcmd_opts o;
        qn_status st;
        int cluster, nstartup, connect, command;
        const char *err;
    } v[] = {
        {{.host = "127.0.0.1", .port = 6379}, QN_OK, 0, 0, 1000, 1000, NULL},
        {{.host = "h", .port = 1, .connect_timeout_ms = 5, .command_timeout_ms = 7},
         QN_OK,
         0,
         0,
         5,
         7,
         NULL},
        {{.host = "h", .port = 0}, QN_EINVAL, 0, 0, 0, 0, "no Redis address"},
        {{.host = "h", .port = 65536}, QN_EINVAL, 0, 0, 0, 0, "no Redis address"},
        {{.host = "", .port = 6379}, QN_EINVAL, 0, 0, 0, 0, "no Redis address"},
        {{.port = 6379}, QN_EINVAL, 0, 0, 0, 0, "no Redis address"},
        {{.host = "h", .port = 1, .timeout_ms = 300}, QN_OK, 0, 0, 300, 300, NULL},
        {{.host = "h", .port = 1, .timeout_ms = 300, .command_timeout_ms = 9},
         QN_OK,
         0,
         0,
         300,
         9,
         NULL},
        {{.cluster_nodes = "a:1, b:2"}, QN_OK, 1, 2, 1000, 1000, NULL},
        {{.host = "ignored", .port = 0, .cluster_nodes = "[::1]:7000"},
         QN_OK,
         1,
         1,
         1000,
         1000,
         NULL},
        {{.cluster_nodes = "a:99999"}, QN_EINVAL, 0, 0, 0, 0, "is not host:port"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        rcmd_conf cf;
        char err[160] = "";
        qn_status st = rcmd_conf_init(&cf, &v[i].o, err, sizeof(err));
        if (st != v[i].st)
            printf("  case %zu: %s\n", i, err);
        CHECK_EQ_INT(st, v[i].st);
        if (st == QN_OK) {
            CHECK_EQ_INT(cf.cluster, v[i].cluster);
            CHECK_EQ_INT(cf.nstartup, v[i].nstartup);
            CHECK_EQ_INT(cf.connect_timeout_ms, v[i].connect);
            CHECK_EQ_INT(cf.command_timeout_ms, v[i].command);
            CHECK(cf.password == NULL);
            rcmd_conf_free(&cf);
        } else {
            CHECK(strstr(err, v[i].err) != NULL);
        }
    }
    rcmd_conf cf;
    char err[160];
    rcmd_opts o = {.host = "h", .port = 2, .password = "s3cret"};
    const char *argv[2];
    size_t argvlen[2];
    CHECK(rcmd_conf_init(&cf, &o, err, sizeof(err)) == QN_OK);
    CHECK_EQ_STR(cf.name, "h:2");
    CHECK(cf.password != o.password);
    CHECK_EQ_INT(rcmd_auth_argv(&cf, argv, argvlen), 2);
    CHECK_EQ_STR(argv[0], "AUTH");
    CHECK_EQ_STR(argv[1], "s3cret");
    CHECK_EQ_INT(argvlen[1], 6);
    rcmd_conf_free(&cf);
    o.password = "";
    CHECK(rcmd_conf_init(&cf, &o, err, sizeof(err)) == QN_OK);
    CHECK_EQ_INT(rcmd_auth_argv(&cf, argv, argvlen), 0);
    rcmd_conf_free(&cf);
    CHECK(rcmd_nodes_check(NULL, err, sizeof(err)) == QN_OK);
    CHECK(rcmd_nodes_check("a:1", err, sizeof(err)) == QN_OK);
    CHECK(rcmd_nodes_check("a:0", err, sizeof(err)) == QN_EINVAL);
    struct timeval tv = rcmd_timeval(1500);
    CHECK(tv.tv_sec == 1 && tv.tv_usec == 500000);
}

/* ---------------------------------------------------------------- the rule */

#define W   RCMD_WAIT
#define RW  RCMD_READONLY
#define NOW 100000 /* the clock at each decision */

typedef struct {
    const char *what;
    rcmd_verdict v;
    int cluster;
    unsigned flags;
    int hops, wait_ms, written;
    int left_ms; /* deadline - now */
    rcmd_action action;
    int wait_after, hops_after, written_after;
    const char *why; /* a part of it, for RCMD_FAIL */
} rule_case;

static const char *action_name(rcmd_action a)
{
    static const char *names[] = {"DONE", "SEND", "SEND_ASKING", "WAIT", "REFRESH", "FAIL"};
    return a >= RCMD_DONE && a <= RCMD_FAIL ? names[a] : "?";
}

static void test_decide_table(void)
{
    static const rule_case v[] = {
        /* a reply is the answer */
        {"reply", RCMD_REPLY, 1, 0, 0, 0, 0, 1000, RCMD_DONE, 0, 0, 0, NULL},
        {"reply, after waits", RCMD_REPLY, 1, RW, 3, 80, 1, 10, RCMD_DONE, 80, 3, 1, NULL},
        {"reply, one server", RCMD_REPLY, 0, 0, 0, 0, 0, 1000, RCMD_DONE, 0, 0, 0, NULL},
        /* MOVED: to the node named, up to the hop cap; then that reply is the answer */
        {"moved", RCMD_MOVED, 1, 0, 0, 0, 0, 1000, RCMD_SEND, 0, 1, 0, NULL},
        {"moved, late", RCMD_MOVED, 1, 0, 0, 0, 0, 0, RCMD_SEND, 0, 1, 0, NULL},
        /* the limits are written out: both clients' rule is these numbers */
        {"moved, last hop", RCMD_MOVED, 1, 0, 4, 0, 0, 1000, RCMD_SEND, 0, 5, 0, NULL},
        {"moved, hops spent", RCMD_MOVED, 1, 0, 5, 0, 0, 1000, RCMD_DONE, 0, 5, 0, NULL},
        {"moved, one server", RCMD_MOVED, 0, 0, 0, 0, 0, 1000, RCMD_DONE, 0, 0, 0, NULL},
        /* ASK: ASKING and the command there, the same cap */
        {"ask", RCMD_ASK, 1, 0, 0, 0, 0, 1000, RCMD_SEND_ASKING, 0, 1, 0, NULL},
        {"ask, read-only", RCMD_ASK, 1, RW, 2, 40, 0, 1000, RCMD_SEND_ASKING, 40, 3, 0, NULL},
        {"ask, hops spent", RCMD_ASK, 1, 0, 5, 0, 0, 1000, RCMD_DONE, 0, 5, 0, NULL},
        {"ask, one server", RCMD_ASK, 0, 0, 0, 0, 0, 1000, RCMD_DONE, 0, 0, 0, NULL},
        /* TRYAGAIN, CLUSTERDOWN, LOADING: waits doubling to the cap, within the deadline */
        {"busy, first", RCMD_BUSY, 1, 0, 0, 0, 0, 1000, W, 20, 0, 0, NULL},
        {"busy, second", RCMD_BUSY, 1, 0, 0, 20, 0, 1000, W, 40, 0, 0, NULL},
        {"busy, to the cap", RCMD_BUSY, 1, 0, 0, 160, 0, 1000, W, 200, 0, 0, NULL},
        {"busy, at the cap", RCMD_BUSY, 1, 0, 0, 200, 0, 1000, W, 200, 0, 0, NULL},
        {"busy, wait ends at deadline", RCMD_BUSY, 1, 0, 0, 20, 0, 40, RCMD_DONE, 20, 0, 0, NULL},
        {"busy, wait ends before", RCMD_BUSY, 1, 0, 0, 20, 0, 41, W, 40, 0, 0, NULL},
        {"busy, deadline passed", RCMD_BUSY, 1, RW, 0, 0, 0, -5, RCMD_DONE, 0, 0, 0, NULL},
        {"busy, hops do not count", RCMD_BUSY, 1, 0, 5, 0, 0, 1000, W, 20, 5, 0, NULL},
        {"busy, one server", RCMD_BUSY, 0, 0, 0, 0, 0, 1000, RCMD_DONE, 0, 0, 0, NULL},
        /* nothing written: safe to send again, whatever the command */
        {"unsent, write", RCMD_UNSENT, 1, 0, 0, 0, 0, 1000, W, 20, 0, 0, NULL},
        {"unsent, read", RCMD_UNSENT, 1, RW, 0, 40, 0, 1000, W, 80, 0, 0, NULL},
        {"unsent, late", RCMD_UNSENT, 1, 0, 0, 0, 0, 20, RCMD_FAIL, 0, 0, 0, "not sent"},
        {"unsent, write lost before", RCMD_UNSENT, 1, 0, 0, 20, 1, 1000, RCMD_FAIL, 20, 0, 1,
         "outcome is unknown"},
        {"unsent, read lost before", RCMD_UNSENT, 1, RW, 0, 20, 1, 1000, W, 40, 0, 1, NULL},
        {"unsent, one server", RCMD_UNSENT, 0, RW, 0, 0, 0, 1000, RCMD_FAIL, 0, 0, 0,
         "not connected"},
        /* written, then the connection failed: only a read runs again */
        {"lost, write", RCMD_LOST, 1, 0, 0, 0, 0, 1000, RCMD_FAIL, 0, 0, 1, "outcome is unknown"},
        {"lost, read", RCMD_LOST, 1, RW, 0, 0, 0, 1000, W, 20, 0, 1, NULL},
        {"lost, read, late", RCMD_LOST, 1, RW, 0, 200, 0, 150, RCMD_FAIL, 200, 0, 1,
         "connection lost"},
        {"lost, write, one server", RCMD_LOST, 0, 0, 0, 0, 0, 1000, RCMD_FAIL, 0, 0, 1,
         "outcome is unknown"},
        {"lost, read, one server", RCMD_LOST, 0, RW, 0, 0, 0, 1000, RCMD_FAIL, 0, 0, 1,
         "connection lost"},
        /* no node for the slot: a new map, then route again */
        {"no node", RCMD_NO_NODE, 1, 0, 0, 0, 0, 1000, RCMD_REFRESH, 20, 0, 0, NULL},
        {"no node, again", RCMD_NO_NODE, 1, 0, 0, 200, 0, 1000, RCMD_REFRESH, 200, 0, 0, NULL},
        {"no node, late", RCMD_NO_NODE, 1, 0, 0, 0, 0, 10, RCMD_FAIL, 0, 0, 0, "no node"},
        {"no node, one server", RCMD_NO_NODE, 0, 0, 0, 0, 0, 1000, RCMD_FAIL, 0, 0, 0,
         "not connected"},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        rcmd_retry st;
        rcmd_retry_init(&st, v[i].flags, v[i].cluster, NOW + v[i].left_ms);
        st.hops = v[i].hops;
        st.wait_ms = v[i].wait_ms;
        st.written = v[i].written;
        rcmd_decision d = rcmd_decide(&st, v[i].v, NOW);
        int ok = d.action == v[i].action && st.wait_ms == v[i].wait_after &&
                 st.hops == v[i].hops_after && st.written == v[i].written_after &&
                 (d.action == W || d.action == RCMD_REFRESH ? d.wait_ms == v[i].wait_after
                                                            : d.wait_ms == 0) &&
                 (v[i].why ? d.why && strstr(d.why, v[i].why) != NULL : d.why == NULL);
        if (!ok)
            printf("  case \"%s\": %s wait %d (state: wait %d hops %d written %d) why %s; "
                   "expected %s\n",
                   v[i].what, action_name(d.action), d.wait_ms, st.wait_ms, st.hops, st.written,
                   d.why ? d.why : "-", action_name(v[i].action));
        CHECK(ok);
    }
}

/* A command that keeps hearing TRYAGAIN waits 20, 40, ... 200 ms while its budget lasts, then
 * has that reply as its answer; MOVED chains stop at the cap. */
static void test_decide_sequences(void)
{
    static const int waits[] = {20, 40, 80, 160, 200, 200, 200};
    rcmd_retry st;
    int64_t now = NOW;
    size_t k = 0;
    rcmd_retry_init(&st, 0, 1, NOW + 1000);
    for (;;) {
        rcmd_decision d = rcmd_decide(&st, RCMD_BUSY, now);
        if (d.action != W)
            break;
        CHECK(k < sizeof(waits) / sizeof(waits[0]));
        if (k < sizeof(waits) / sizeof(waits[0]))
            CHECK_EQ_INT(d.wait_ms, waits[k]);
        k++;
        now += d.wait_ms;
    }
    CHECK_EQ_INT(k, sizeof(waits) / sizeof(waits[0]));
    CHECK(now < NOW + 1000);

    int sends = 0;
    rcmd_retry_init(&st, 0, 1, NOW + 1000);
    for (int i = 0; i < 50; i++) {
        rcmd_decision d = rcmd_decide(&st, i % 2 ? RCMD_ASK : RCMD_MOVED, NOW);
        if (d.action == RCMD_DONE)
            break;
        sends++;
    }
    CHECK_EQ_INT(sends, 5);
}

/* What a command may suffer, by what classification says of it: a script or any write never
 * runs twice after its connection failed; a read does. */
static void test_decide_by_command(void)
{
    static const struct {
        const char *argv[4];
        rcmd_action after_loss;
    } v[] = {
        {{"GET", "k"}, W},
        {{"MGET", "k"}, W},
        {{"EVALSHA_RO", "sha", "1", "k"}, W},
        {{"INCR", "k"}, RCMD_FAIL},
        {{"SET", "k", "v"}, RCMD_FAIL},
        {{"EVALSHA", "sha", "1", "k"}, RCMD_FAIL},
        {{"EVAL", "return 1", "0"}, RCMD_FAIL},
        {{"DEL", "k"}, RCMD_FAIL},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        size_t len[4];
        int argc = 0;
        rcmd_info ci;
        rcmd_retry st;
        while (argc < 4 && v[i].argv[argc]) {
            len[argc] = strlen(v[i].argv[argc]);
            argc++;
        }
        rcmd_classify_argv(argc, v[i].argv, len, &ci);
        rcmd_retry_init(&st, ci.flags, 1, NOW + 1000);
        rcmd_decision d = rcmd_decide(&st, RCMD_LOST, NOW);
        if (d.action != v[i].after_loss)
            printf("  case %s: %s\n", v[i].argv[0], action_name(d.action));
        CHECK_EQ_INT(d.action, v[i].after_loss);
    }
}

int main(void)
{
    log_init("test_rcmd", LOGL_INFO);
    RUN(test_table_sorted_and_found);
    RUN(test_table_flags);
    RUN(test_classify_table);
    RUN(test_classify_claim);
    RUN(test_classify_requests);
    RUN(test_admission_table);
    RUN(test_format_is_hiredis);
    RUN(test_script_calls);
    RUN(test_conf_table);
    RUN(test_decide_table);
    RUN(test_decide_sequences);
    RUN(test_decide_by_command);
    TEST_MAIN_END();
}
