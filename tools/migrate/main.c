/*
 * quan-migrate: applies the numbered SQL files of migrations/ds_0 to QUAN_DS0_DSN and those of
 * migrations/ds_1 to QUAN_DS1_DSN, each file in its own transaction, recording it in
 * schema_migrations. Safe to run twice and from several replicas at once: all work on a
 * database happens under one session advisory lock, and what is applied is re-read under it.
 * Refuses to go on if a file that was applied has changed since (its checksum differs), unless
 * the operator reviewed the change and names the file with --repair (a corrected comment, say):
 * then its new checksum is recorded.
 *
 * A line "\ir PATH" of a file (psql's \include_relative) stands for the text of PATH, relative to
 * the file's directory: the SQL both databases run lives once, in migrations/both/, and ds_0's and
 * ds_1's files of that number include it. A migration's text, the one applied and checksummed, is
 * its file with those lines replaced: a file that includes what it used to hold verbatim keeps
 * the checksum it was recorded with.
 *
 * Exit status: 0 up to date, 1 error, 2 usage, 3 an applied file changed, 4 (--status only)
 * migrations are pending.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "namelist.h"
#include "pgpool.h"

#define MIGRATE_LOCK_KEY  "8175547825470924658" /* "quanmigr" as a bigint */
#define MIGRATE_MAX_FILES 1000
#define MIGRATE_MAX_BYTES (16 * 1024 * 1024)
#define MIGRATE_MAX_PATH  512

enum { EXIT_ERR = 1, EXIT_USAGE = 2, EXIT_CHANGED = 3, EXIT_PENDING = 4 };

typedef struct migration {
    long number;
    char version[128]; /* file name without ".sql", e.g. "0001_init" */
    char *path;
    char *label;       /* path, and what it includes: for messages */
    char *sql;         /* the file's text with its includes in place */
    char checksum[65]; /* sha256 hex of sql */
    bool applied;
} migration;

typedef struct migrate_db {
    const char *name;    /* "ds_0" */
    const char *dsn_env; /* "QUAN_DS0_DSN" */
} migrate_db;

static const migrate_db migrate_dbs[] = {{"ds_0", "QUAN_DS0_DSN"}, {"ds_1", "QUAN_DS1_DSN"}};

static void usage(FILE *f)
{
    fprintf(f, "usage: quan-migrate [--dir DIR] [--only ds_0|ds_1] [--status] [--repair VERSION]\n"
               "                    [--help]\n"
               "\n"
               "Applies migrations/ds_0/NNNN_name.sql to $QUAN_DS0_DSN and migrations/ds_1/*.sql\n"
               "to $QUAN_DS1_DSN, in order, one transaction per file, recording each in\n"
               "schema_migrations(version, applied_at, checksum, data_source). Safe to run\n"
               "twice and from several replicas at once (advisory lock). A line \"\\ir PATH\"\n"
               "stands for the text of PATH (relative to the file; migrations/both/ holds what\n"
               "the two databases share); the checksum is of the text with it in place.\n"
               "QUAN_DS0_DSN_FILE and QUAN_DS1_DSN_FILE may name files holding the DSNs instead\n"
               "(a Kubernetes Secret mounted as files; one trailing newline is dropped).\n"
               "\n"
               "  --dir DIR    migrations directory (default: $QUAN_MIGRATIONS_DIR, else\n"
               "               ./migrations, else <binary dir>/../../migrations)\n"
               "  --only DB    only this database\n"
               "  --status     apply nothing; list pending files, exit 4 if any\n"
               "  --repair V,… the applied files V (e.g. 0001_init) were changed on purpose and\n"
               "               the change reviewed (a comment): record their new checksums\n"
               "\n"
               "Exit: 0 up to date, 1 error, 2 usage, 3 an applied file was changed,\n"
               "4 pending (--status).\n");
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* --dir, $QUAN_MIGRATIONS_DIR, ./migrations, then relative to the binary (build/bin/..). */
static char *resolve_dir(const char *opt)
{
    if (opt)
        return strdup(opt);
    const char *env = getenv("QUAN_MIGRATIONS_DIR");
    if (env && *env)
        return strdup(env);
    if (is_dir("migrations"))
        return strdup("migrations");
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        static const char *const rel[] = {"../../migrations", "../share/quan/migrations"};
        for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
            char *p = NULL;
            if (asprintf(&p, "%s/%s", exe, rel[i]) < 0)
                return NULL;
            if (is_dir(p))
                return p;
            free(p);
        }
    }
    return strdup("migrations");
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > MIGRATE_MAX_BYTES)
                goto fail;
            char *nb = realloc(buf, cap);
            if (!nb)
                goto fail;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    if (ferror(f))
        goto fail;
    buf[len] = '\0';
    if (strlen(buf) != len) /* a NUL byte: not an SQL file */
        goto fail;
    fclose(f);
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

/* "0001_name.sql": four or more digits, '_', then [a-z0-9_-]. */
static bool parse_name(const char *name, long *number, char *version, size_t cap)
{
    size_t len = strlen(name), digits = 0;
    if (len < 5 || strcmp(name + len - 4, ".sql") != 0 || len - 4 >= cap)
        return false;
    while (isdigit((unsigned char)name[digits]))
        digits++;
    if (digits < 4 || digits > 9 || name[digits] != '_' || digits + 1 >= len - 4)
        return false;
    for (size_t i = digits + 1; i < len - 4; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!(islower(c) || isdigit(c) || c == '_' || c == '-'))
            return false;
    }
    *number = strtol(name, NULL, 10);
    memcpy(version, name, len - 4);
    version[len - 4] = '\0';
    return true;
}

/*
 * Whether line [p, end) is "\ir PATH" or "\include_relative PATH" (PATH may be in single
 * quotes): 1 with PATH in out, 0 if it is not, -1 if it is but PATH is empty or too long.
 */
static int include_line(const char *p, const char *end, char *out, size_t cap)
{
    static const char *const cmds[] = {"\\ir", "\\include_relative"};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        size_t n = strlen(cmds[i]);
        if ((size_t)(end - p) <= n || memcmp(p, cmds[i], n) != 0 || !isblank((unsigned char)p[n]))
            continue;
        const char *a = p + n, *b = end;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (b - a >= 2 && *a == '\'' && b[-1] == '\'') {
            a++;
            b--;
        }
        if (a == b || (size_t)(b - a) >= cap)
            return -1;
        memcpy(out, a, (size_t)(b - a));
        out[b - a] = '\0';
        return 1;
    }
    return 0;
}

/* The end of the line at p (its '\n' or the string's end) and the start of the next. */
static const char *line_end(const char *p, const char **next)
{
    const char *nl = strchr(p, '\n');
    *next = nl ? nl + 1 : p + strlen(p);
    return nl ? nl : *next;
}

/* Whether text has an include line. */
static bool includes_any(const char *text)
{
    char path[MIGRATE_MAX_PATH];
    for (const char *p = text, *next; *p; p = next) {
        const char *end = line_end(p, &next);
        if (include_line(p, end, path, sizeof(path)) != 0)
            return true;
    }
    return false;
}

/*
 * The text of the migration m->path (its file's text: raw, taken over): every include line
 * replaced by the included file's text, which must include nothing further. Sets m->sql and
 * m->label. False on failure (logged).
 */
static bool expand_includes(const char *db, migration *m, char *raw)
{
    const char *slash = strrchr(m->path, '/');
    int dirlen = slash ? (int)(slash - m->path) : 1;
    const char *dir = slash ? m->path : ".";
    char *out = NULL, *incs = NULL, rel[MIGRATE_MAX_PATH];
    size_t outlen = 0, incslen = 0;
    FILE *o = open_memstream(&out, &outlen), *l = open_memstream(&incs, &incslen);
    bool ok = o && l;
    for (const char *p = raw, *next; ok && *p; p = next) {
        const char *end = line_end(p, &next);
        int is = include_line(p, end, rel, sizeof(rel));
        if (is == 0) {
            fwrite(p, 1, (size_t)(next - p), o);
            continue;
        }
        char *path = NULL, *text = NULL;
        if (is < 0) {
            log_error(NULL, "%s: %s: an include line without a file (or a too long name): %.*s", db,
                      m->path, (int)(end - p), p);
            ok = false;
        } else if (asprintf(&path, "%.*s/%s", dirlen, dir, rel) < 0) {
            path = NULL;
            ok = false;
        } else if (!(text = read_file(path))) {
            log_error(NULL, "%s: cannot read %s, included by %s (missing, too large or binary)", db,
                      path, m->path);
            ok = false;
        } else if (includes_any(text)) {
            log_error(NULL,
                      "%s: %s, included by %s, includes a file itself: an included file "
                      "holds SQL only",
                      db, path, m->path);
            ok = false;
        } else {
            size_t len = strlen(text);
            fwrite(text, 1, len, o);
            if (len > 0 && text[len - 1] != '\n' && *next) /* the next line stays a line */
                fputc('\n', o);
            fprintf(l, "%s%s", ftell(l) > 0 ? ", " : "", rel);
        }
        free(text);
        free(path);
    }
    if (o && fclose(o) != 0)
        ok = false;
    if (l && fclose(l) != 0)
        ok = false;
    if (ok) {
        int r = incslen ? asprintf(&m->label, "%s (with %s)", m->path, incs)
                        : asprintf(&m->label, "%s", m->path);
        if (r < 0) {
            m->label = NULL;
            ok = false;
        }
    }
    free(incs);
    free(raw);
    if (!ok) {
        free(out);
        return false;
    }
    m->sql = out;
    return true;
}

static int cmp_migration(const void *a, const void *b)
{
    const migration *x = a, *y = b;
    return x->number < y->number ? -1 : x->number > y->number;
}

static void free_migrations(migration *m, int n)
{
    for (int i = 0; i < n; i++) {
        free(m[i].path);
        free(m[i].label);
        free(m[i].sql);
    }
    free(m);
}

/* Loads the .sql files of dir, sorted by number. Returns the count, or -1 (logged). */
static int load_migrations(const char *dir, const char *db, migration **out)
{
    DIR *d = opendir(dir);
    migration *m = NULL;
    int n = 0;
    *out = NULL;
    if (!d) {
        log_error(NULL, "%s: cannot open migrations directory %s: %s", db, dir, strerror(errno));
        return -1;
    }
    m = calloc(MIGRATE_MAX_FILES, sizeof(*m));
    if (!m)
        goto fail;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || len < 4 || strcmp(e->d_name + len - 4, ".sql") != 0)
            continue;
        if (n == MIGRATE_MAX_FILES) {
            log_error(NULL, "%s: more than %d migration files", db, MIGRATE_MAX_FILES);
            goto fail;
        }
        migration *x = &m[n];
        if (!parse_name(e->d_name, &x->number, x->version, sizeof(x->version))) {
            log_error(NULL, "%s: %s/%s is not named NNNN_lowercase_name.sql", db, dir, e->d_name);
            goto fail;
        }
        if (asprintf(&x->path, "%s/%s", dir, e->d_name) < 0) {
            x->path = NULL;
            goto fail;
        }
        n++;
        char *raw = read_file(x->path);
        if (!raw) {
            log_error(NULL, "%s: cannot read %s (missing, too large or binary)", db, x->path);
            goto fail;
        }
        if (!expand_includes(db, x, raw))
            goto fail;
    }
    qsort(m, (size_t)n, sizeof(*m), cmp_migration);
    for (int i = 1; i < n; i++) {
        if (m[i].number == m[i - 1].number) {
            log_error(NULL, "%s: %s and %s have the same number", db, m[i - 1].path, m[i].path);
            goto fail;
        }
    }
    closedir(d);
    *out = m;
    return n;
fail:
    closedir(d);
    if (m)
        free_migrations(m, n);
    return -1;
}

static bool exec_ok(pgpool_conn *c, const char *db, const char *what, const char *sql, int n,
                    const char *const *p)
{
    if (pgpool_exec_cmd(c, sql, n, p, NULL) == QN_OK)
        return true;
    log_error(NULL, "%s: %s failed: %s", db, what, pgpool_conn_error(c));
    return false;
}

/* sha256 of the text, computed by the server so the tool needs no crypto library. */
static bool checksum_of(pgpool_conn *c, migration *m)
{
    const char *p[] = {m->sql};
    PGresult *r = pgpool_exec(c, "SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')", 1, p);
    if (!r)
        return false;
    snprintf(m->checksum, sizeof(m->checksum), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return true;
}

static const char schema_migrations_ddl[] = "CREATE TABLE IF NOT EXISTS schema_migrations ("
                                            " version text PRIMARY KEY,"
                                            " applied_at timestamptz NOT NULL DEFAULT now(),"
                                            " checksum text NOT NULL,"
                                            " data_source text NOT NULL)";

/*
 * Under the lock: compares what is recorded with the files. Returns 0 if consistent, else the
 * exit status. Marks the applied files.
 */
static int check_applied(pgpool_conn *c, const char *db, migration *m, int n, const char *repair)
{
    PGresult *r =
        pgpool_exec(c, "SELECT version, checksum, data_source FROM schema_migrations", 0, NULL);
    int rc = 0;
    if (!r) {
        log_error(NULL, "%s: reading schema_migrations failed: %s", db, pgpool_conn_error(c));
        return EXIT_ERR;
    }
    for (int row = 0; row < PQntuples(r) && rc == 0; row++) {
        const char *version = PQgetvalue(r, row, 0);
        const char *sum = PQgetvalue(r, row, 1);
        const char *source = PQgetvalue(r, row, 2);
        if (strcmp(source, db) != 0) {
            log_error(NULL,
                      "%s: this database was migrated as %s (version %s): does the DSN point "
                      "at the wrong database? refusing",
                      db, source, version);
            rc = EXIT_ERR;
            break;
        }
        int i;
        for (i = 0; i < n && strcmp(m[i].version, version) != 0; i++)
            ;
        if (i == n) {
            log_warn(NULL, "%s: applied migration %s has no file here (newer schema?)", db,
                     version);
            continue;
        }
        m[i].applied = true;
        if (strcmp(m[i].checksum, sum) == 0)
            continue;
        if (namelist_has(repair, version)) {
            const char *p[] = {m[i].checksum, version};
            if (!exec_ok(c, db, "recording the repaired checksum",
                         "UPDATE schema_migrations SET checksum = $1 WHERE version = $2", 2, p)) {
                rc = EXIT_ERR;
                break;
            }
            log_warn(NULL,
                     "%s: %s changed after it was applied; its new checksum %s is recorded "
                     "(--repair)",
                     db, m[i].label, m[i].checksum);
            continue;
        }
        log_error(NULL,
                  "%s: %s was changed after it was applied (recorded checksum %s, file %s); "
                  "refusing. Add a new migration instead of editing an applied one; if the "
                  "change is harmless (a comment) and reviewed: quan-migrate --repair %s",
                  db, m[i].label, sum, m[i].checksum, version);
        rc = EXIT_CHANGED;
    }
    PQclear(r);
    return rc;
}

static int apply_one(pgpool_conn *c, const char *db, const migration *m)
{
    const char *p[] = {m->version, m->checksum, db};
    log_info(NULL, "%s: applying %s", db, m->version);
    if (pgpool_begin(c) != QN_OK || pgpool_exec_script(c, m->sql) != QN_OK) {
        log_error(NULL, "%s: %s failed, rolled back: %s (sqlstate %s)", db, m->label,
                  pgpool_conn_error(c), pgpool_conn_sqlstate(c));
        goto fail;
    }
    if (!exec_ok(c, db, "recording the migration",
                 "INSERT INTO schema_migrations (version, checksum, data_source) "
                 "VALUES ($1, $2, $3)",
                 3, p))
        goto fail;
    if (pgpool_commit(c) != QN_OK) {
        log_error(NULL, "%s: commit of %s failed: %s", db, m->version, pgpool_conn_error(c));
        goto fail;
    }
    return 0;
fail:
    (void)pgpool_rollback(c);
    return EXIT_ERR;
}

static int migrate_one(const migrate_db *db, const char *root, bool status_only, const char *repair)
{
    char *dir = NULL, *dsn = NULL, err[512];
    migration *m = NULL;
    pgpool_conn *c = NULL;
    bool locked = false;
    int n = -1, rc = EXIT_ERR, pending = 0;

    if (config_secret(db->dsn_env, &dsn, err, sizeof(err)) != QN_OK) {
        log_error(NULL, "%s: %s", db->name, err);
        goto done;
    }
    if (!dsn) {
        log_error(NULL, "%s: %s is not set (nor %s_FILE)", db->name, db->dsn_env, db->dsn_env);
        goto done;
    }
    if (asprintf(&dir, "%s/%s", root, db->name) < 0)
        goto done;
    n = load_migrations(dir, db->name, &m);
    if (n < 0)
        goto done;

    pgpool_opts o = {
        .dsn = dsn, .name = db->name, .application_name = "quan-migrate", .connect_timeout_s = 10};
    c = pgpool_conn_open(&o);
    if (!c || !pgpool_conn_ok(c)) {
        log_error(NULL, "%s", c ? pgpool_conn_error(c) : "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        if (!checksum_of(c, &m[i])) {
            log_error(NULL, "%s: checksum of %s: %s", db->name, m[i].path, pgpool_conn_error(c));
            goto done;
        }
    }

    /* One migrator per database at a time; the others wait, then find nothing to do. */
    const char *key[] = {MIGRATE_LOCK_KEY};
    PGresult *r = pgpool_exec(c, "SELECT pg_try_advisory_lock($1::bigint)", 1, key);
    if (!r) {
        log_error(NULL, "%s: advisory lock: %s", db->name, pgpool_conn_error(c));
        goto done;
    }
    locked = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (!locked) {
        log_info(NULL, "%s: another migrator holds the lock; waiting", db->name);
        if (!exec_ok(c, db->name, "advisory lock", "SELECT pg_advisory_lock($1::bigint)", 1, key))
            goto done;
        locked = true;
    }
    if (!exec_ok(c, db->name, "creating schema_migrations", schema_migrations_ddl, 0, NULL))
        goto done;
    rc = check_applied(c, db->name, m, n, repair);
    if (rc != 0)
        goto done;
    for (int i = 0; i < n; i++) {
        if (m[i].applied)
            continue;
        pending++;
        if (status_only) {
            log_info(NULL, "%s: pending %s", db->name, m[i].version);
            continue;
        }
        rc = apply_one(c, db->name, &m[i]);
        if (rc != 0)
            goto done;
    }
    if (status_only && pending)
        rc = EXIT_PENDING;
    log_info(NULL, "%s: %s (%d files, %d %s)", db->name,
             pending && status_only ? "migrations pending" : "up to date", n, pending,
             status_only ? "pending" : "applied now");
done:
    if (locked && pgpool_conn_ok(c) &&
        !exec_ok(c, db->name, "advisory unlock", "SELECT pg_advisory_unlock($1::bigint)", 1,
                 (const char *const[]){MIGRATE_LOCK_KEY}))
        rc = rc ? rc : EXIT_ERR;
    pgpool_conn_close(c); /* closing the session also drops the lock */
    if (m)
        free_migrations(m, n);
    free(dir);
    free(dsn);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir_opt = NULL, *only = NULL, *repair = NULL;
    bool status_only = false;
    int rc = 0;

    const char *lvl = getenv("QUAN_LOG_LEVEL");
    int level = lvl ? log_level_parse(lvl) : LOGL_INFO;
    log_init("quan-migrate", level < 0 ? LOGL_INFO : (log_level)level);

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
            dir_opt = argv[++i];
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(argv[i], "--status") == 0) {
            status_only = true;
        } else if (strcmp(argv[i], "--repair") == 0 && i + 1 < argc) {
            repair = argv[++i];
        } else {
            fprintf(stderr, "quan-migrate: unknown or incomplete option %s\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    if (only && strcmp(only, "ds_0") != 0 && strcmp(only, "ds_1") != 0) {
        fprintf(stderr, "quan-migrate: --only takes ds_0 or ds_1\n");
        return EXIT_USAGE;
    }
    char *root = resolve_dir(dir_opt);
    if (!root)
        return EXIT_ERR;
    log_info(NULL, "migrations from %s", root);
    for (size_t i = 0; i < sizeof(migrate_dbs) / sizeof(migrate_dbs[0]); i++) {
        if (only && strcmp(only, migrate_dbs[i].name) != 0)
            continue;
        int one = migrate_one(&migrate_dbs[i], root, status_only, repair);
        if (one != 0 && one != EXIT_PENDING) {
            rc = one; /* stop at the first real failure */
            break;
        }
        if (one)
            rc = one;
    }
    free(root);
    return rc;
}
