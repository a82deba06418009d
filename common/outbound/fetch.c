/* File addresses of distribution tasks: see fetch.h. */
#include "fetch.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int fetch_is_url(const char *a)
{
    if (!a || !isalpha((unsigned char)a[0]))
        return 0;
    const char *p = a + 1;
    while (isalnum((unsigned char)*p) || *p == '+' || *p == '-' || *p == '.')
        p++;
    return strncmp(p, "://", 3) == 0;
}

/* Length, control characters: the same gate for URLs and paths. */
static qn_status address_sane(const char *a, char *err, size_t errlen)
{
    if (!a || !*a) {
        qn_errf(err, errlen, "fileAddress: empty");
        return QN_EINVAL;
    }
    size_t n = strlen(a);
    if (n > FETCH_ADDRESS_MAX) {
        qn_errf(err, errlen, "fileAddress: longer than %d characters", FETCH_ADDRESS_MAX);
        return QN_EINVAL;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)a[i] < 0x20 || a[i] == 0x7f) {
            qn_errf(err, errlen, "fileAddress: contains a control character");
            return QN_EINVAL;
        }
    return QN_OK;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* A failed init shows later as a failing curl_easy_init / curl_url. */
static void fetch_curl_once(void)
{
    pthread_once(&curl_once, curl_init_once);
}

qn_status fetch_curl_init(void)
{
    fetch_curl_once();
    return curl_init_rc == CURLE_OK ? QN_OK : QN_ERR;
}

/* An http/https URL with a host. */
static qn_status url_check(const char *url, char *err, size_t errlen)
{
    qn_status st = QN_EINVAL;
    char *host = NULL;
    fetch_curl_once();
    const char *sep = strstr(url, "://");
    if (!sep || !((sep - url == 4 && strncasecmp(url, "http", 4) == 0) ||
                  (sep - url == 5 && strncasecmp(url, "https", 5) == 0))) {
        qn_errf(err, errlen, "fileAddress: scheme \"%.*s\" is not allowed (http or https only)",
                sep ? (int)(sep - url > 16 ? 16 : sep - url) : 0, url);
        return QN_EINVAL;
    }
    /* curl reads "http:///x" as host "x"; an empty authority is no URL. */
    if (strchr("/?#", sep[3])) {
        qn_errf(err, errlen, "fileAddress: the URL has no host");
        return QN_EINVAL;
    }
    CURLU *u = curl_url();
    if (!u)
        return QN_ENOMEM;
    if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK) {
        qn_errf(err, errlen, "fileAddress: not a valid URL");
        goto done;
    }
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host || !*host) {
        qn_errf(err, errlen, "fileAddress: the URL has no host");
        goto done;
    }
    st = QN_OK;
done:
    curl_free(host);
    curl_url_cleanup(u);
    return st;
}

/* A path under root: no ".." component, and realpath (symlinks resolved) inside root. */
static qn_status path_check(const char *path, const char *root, char *out, size_t len, char *err,
                            size_t errlen)
{
    char rroot[PATH_MAX], cand[PATH_MAX * 2], real[PATH_MAX];
    if (!root || !*root) {
        qn_errf(err, errlen, "fileAddress: local paths are not allowed (no file root configured)");
        return QN_EINVAL;
    }
    for (const char *p = path; (p = strstr(p, "..")) != NULL; p += 2) {
        int starts = p == path || p[-1] == '/';
        int ends = p[2] == '\0' || p[2] == '/';
        if (starts && ends) {
            qn_errf(err, errlen, "fileAddress: \"..\" is not allowed in a path");
            return QN_EINVAL;
        }
    }
    if (!realpath(root, rroot)) {
        qn_errf(err, errlen, "fileAddress: the file root %s is unusable: %s", root,
                strerror(errno));
        return QN_ERR;
    }
    if (path[0] == '/')
        snprintf(cand, sizeof(cand), "%s", path);
    else
        snprintf(cand, sizeof(cand), "%s/%s", rroot, path);
    if (!realpath(cand, real)) {
        if (errno == ENOENT || errno == ENOTDIR)
            qn_errf(err, errlen, "fileAddress: no such file: %s", path);
        else
            qn_errf(err, errlen, "fileAddress: %s: %s", path, strerror(errno));
        return QN_EINVAL;
    }
    size_t rl = strlen(rroot);
    int inside = strcmp(rroot, "/") == 0 || (strncmp(real, rroot, rl) == 0 && real[rl] == '/');
    if (!inside) {
        qn_errf(err, errlen, "fileAddress: %s is outside the allowed directory", path);
        return QN_EINVAL;
    }
    struct stat sb;
    if (stat(real, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        qn_errf(err, errlen, "fileAddress: %s is not a regular file", path);
        return QN_EINVAL;
    }
    if (out) {
        if (strlen(real) + 1 > len) {
            qn_errf(err, errlen, "fileAddress: the resolved path is too long");
            return QN_EINVAL;
        }
        memcpy(out, real, strlen(real) + 1);
    }
    return QN_OK;
}

qn_status fetch_check_address(const char *file_address, const char *file_root, char *err,
                              size_t errlen)
{
    qn_status st = address_sane(file_address, err, errlen);
    if (st != QN_OK)
        return st;
    if (fetch_is_url(file_address))
        return url_check(file_address, err, errlen);
    st = path_check(file_address, file_root, NULL, 0, err, errlen);
    return st == QN_ERR ? QN_EINVAL : st; /* an unusable root refuses every path */
}

typedef struct dl {
    FILE *f;
    uint64_t got, max;
    int too_big, write_failed;
} dl;

static size_t dl_write(char *data, size_t size, size_t n, void *ud)
{
    dl *d = ud;
    size_t bytes = size * n;
    if (d->got + bytes > d->max) {
        d->too_big = 1;
        return 0; /* aborts the transfer */
    }
    if (fwrite(data, 1, bytes, d->f) != bytes) {
        d->write_failed = 1;
        return 0;
    }
    d->got += bytes;
    return bytes;
}

/* Keeps a known extension of the URL's path on the temporary file (for people reading logs;
 * the reader itself goes by content). */
static const char *url_suffix(const char *url)
{
    const char *end = url + strcspn(url, "?#");
    static const char *known[] = {".xlsx", ".csv"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        size_t kl = strlen(known[i]);
        if ((size_t)(end - url) > kl && strncasecmp(end - kl, known[i], kl) == 0)
            return known[i];
    }
    return "";
}

/* 1 for addresses a merchant's URL must not reach from inside the cluster (SSRF): loopback,
 * private, carrier-grade NAT, link-local (cloud metadata), unspecified, multicast, reserved. */
static int addr_internal(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET6) {
        const uint8_t *b = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        int zero = 1;
        for (int i = 0; i < 15; i++)
            zero &= b[i] == 0;
        if (zero) /* :: and ::1 */
            return b[15] <= 1;
        if ((b[0] & 0xfe) == 0xfc || (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) || b[0] == 0xff)
            return 1; /* unique local fc00::/7, link-local fe80::/10, multicast */
        if (memcmp(b, mapped, sizeof(mapped)) != 0)
            return 0;
        struct sockaddr_in v4 = {.sin_family = AF_INET};
        memcpy(&v4.sin_addr, b + 12, 4);
        return addr_internal((const struct sockaddr *)&v4);
    }
    if (sa->sa_family != AF_INET)
        return 1;
    uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
    return (a >> 24) == 0 || (a >> 24) == 10 || (a >> 24) == 127 || (a >> 22) == (100u << 2 | 1) ||
           (a >> 16) == (169u << 8 | 254) || (a >> 20) == (172u << 4 | 1) ||
           (a >> 16) == (192u << 8 | 168) || (a >> 8) == (192u << 16) ||
           (a >> 17) == (198u << 7 | 9) || (a >> 28) >= 14;
}

typedef struct dl_guard {
    int allow_internal;
    int probe;                      /* only note the addresses: connect to none */
    int allowed;                    /* addresses that passed */
    char blocked[INET6_ADDRSTRLEN]; /* the first internal address refused, "" if none */
} dl_guard;

/* Every connection libcurl opens (redirects included) passes here, after name resolution:
 * checking the address itself also defeats names that resolve to internal ones. */
static curl_socket_t dl_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    dl_guard *g = ud;
    if (purpose == CURLSOCKTYPE_IPCXN && !g->allow_internal && addr_internal(&a->addr)) {
        if (!g->blocked[0]) {
            const void *raw = a->family == AF_INET6
                                  ? (const void *)&((struct sockaddr_in6 *)&a->addr)->sin6_addr
                                  : (const void *)&((struct sockaddr_in *)&a->addr)->sin_addr;
            if (!inet_ntop(a->family, raw, g->blocked, sizeof(g->blocked)))
                snprintf(g->blocked, sizeof(g->blocked), "?");
        }
        return CURL_SOCKET_BAD;
    }
    g->allowed++;
    return g->probe ? CURL_SOCKET_BAD : socket(a->family, a->socktype, a->protocol);
}

/* A handle for url with what every request shares: http(s) only, also through redirects, no
 * signals (threads), the connect (and name resolution) bound, the address guard. NULL when
 * out of memory. */
static CURL *fetch_easy(const char *url, const fetch_limits *lim, dl_guard *guard, char *cerr)
{
    fetch_curl_once();
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L); /* threads: no SIGALRM for DNS timeouts */
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, lim->connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "quan-fetch/1");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, dl_open_socket);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, guard);
    return c;
}

static void fetch_blocked_msg(const dl_guard *g, char *err, size_t errlen)
{
    qn_errf(err, errlen,
            "fileAddress: the host is an internal address (%s), which is not fetched "
            "(QUAN_FILE_ALLOW_INTERNAL)",
            g->blocked);
}

static qn_status download(const char *url, const fetch_limits *lim, char *out, size_t len,
                          char *err, size_t errlen)
{
    dl_guard guard = {.allow_internal = lim->allow_internal};
    qn_status st = QN_ERR;
    CURL *c = NULL;
    dl d = {.max = lim->max_bytes};
    char path[PATH_MAX];
    char cerr[CURL_ERROR_SIZE] = "";
    int fd = -1;
    const char *suffix = url_suffix(url);
    const char *tmp = lim->tmp_dir;
    if (!tmp || !*tmp)
        tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    int n = snprintf(path, sizeof(path), "%s/quan-fetch-XXXXXX%s", tmp, suffix);
    if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n + 1 > len) {
        qn_errf(err, errlen, "fileAddress: temporary path too long");
        return QN_ERR;
    }
    fd = mkstemps(path, (int)strlen(suffix));
    if (fd < 0) {
        qn_errf(err, errlen, "download: cannot create a temporary file in %s: %s", tmp,
                strerror(errno));
        return QN_ERR;
    }
    d.f = fdopen(fd, "wb");
    if (!d.f) {
        close(fd);
        qn_errf(err, errlen, "download: %s", strerror(errno));
        goto done;
    }
    c = fetch_easy(url, lim, &guard, cerr);
    if (!c) {
        st = QN_ENOMEM;
        qn_errf(err, errlen, "download: out of memory");
        goto done;
    }
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, lim->max_redirects);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, lim->timeout_ms);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)lim->max_bytes);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, dl_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &d);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK && fflush(d.f) != 0)
        d.write_failed = 1;
    if (rc != CURLE_OK && guard.blocked[0]) {
        st = QN_EINVAL;
        fetch_blocked_msg(&guard, err, errlen);
    } else if (d.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
        st = QN_EINVAL;
        qn_errf(err, errlen, "download: the file is larger than the limit of %llu bytes",
                (unsigned long long)lim->max_bytes);
    } else if (d.write_failed) {
        qn_errf(err, errlen, "download: writing %s failed: %s", path, strerror(errno));
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        st = QN_ETIMEDOUT;
        qn_errf(err, errlen, "download: timed out (%s)", cerr[0] ? cerr : curl_easy_strerror(rc));
    } else if (rc == CURLE_HTTP_RETURNED_ERROR) {
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        /* A 4xx will be the same next time, but for a timeout or a rate limit; a 5xx may
         * not. */
        st = code >= 500 || code == 408 || code == 429 ? QN_EAGAIN : QN_EINVAL;
        qn_errf(err, errlen, "download: the server answered HTTP %ld", code);
    } else if (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_TOO_MANY_REDIRECTS) {
        st = QN_EINVAL;
        qn_errf(err, errlen, "download: refused redirect (%s)",
                cerr[0] ? cerr : curl_easy_strerror(rc));
    } else if (rc != CURLE_OK) {
        qn_errf(err, errlen, "download: %s", cerr[0] ? cerr : curl_easy_strerror(rc));
    } else {
        st = QN_OK;
    }
done:
    if (c)
        curl_easy_cleanup(c);
    if (d.f && fclose(d.f) != 0 && st == QN_OK) {
        st = QN_ERR;
        qn_errf(err, errlen, "download: writing %s failed: %s", path, strerror(errno));
    }
    if (st != QN_OK)
        unlink(path);
    else
        memcpy(out, path, strlen(path) + 1);
    return st;
}

/* The limits in effect for lim (NULL or zero fields: the defaults). */
static void fetch_limits_fill(const fetch_limits *lim, fetch_limits *l)
{
    *l = (fetch_limits){
        .max_bytes = 64u << 20,
        .timeout_ms = 120000,
        .connect_timeout_ms = 5000,
        .max_redirects = 3,
    };
    if (lim) {
        if (lim->max_bytes)
            l->max_bytes = lim->max_bytes;
        if (lim->timeout_ms)
            l->timeout_ms = lim->timeout_ms;
        if (lim->connect_timeout_ms)
            l->connect_timeout_ms = lim->connect_timeout_ms;
        if (lim->max_redirects)
            l->max_redirects = lim->max_redirects;
        l->tmp_dir = lim->tmp_dir;
        l->allow_internal = lim->allow_internal;
    }
}

qn_status fetch_check_host(const char *url, const fetch_limits *lim, char *err, size_t errlen)
{
    fetch_limits l;
    fetch_limits_fill(lim, &l);
    if (l.allow_internal || !fetch_is_url(url))
        return QN_OK;
    qn_status st = address_sane(url, err, errlen);
    if (st == QN_OK)
        st = url_check(url, err, errlen);
    if (st != QN_OK)
        return st;
    /* The name is resolved as the download will resolve it, through libcurl with the same
     * guard, which here only notes each address (CONNECT_ONLY, and no socket is opened). */
    dl_guard guard = {.probe = 1};
    char cerr[CURL_ERROR_SIZE] = "";
    CURL *c = fetch_easy(url, &l, &guard, cerr);
    if (!c) {
        qn_errf(err, errlen, "fileAddress: out of memory");
        return QN_ENOMEM;
    }
    curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, l.connect_timeout_ms);
    CURLcode rc = curl_easy_perform(c);
    if (guard.allowed) {
        st = QN_OK; /* the download has an address it may use */
    } else if (guard.blocked[0]) {
        st = QN_EINVAL;
        fetch_blocked_msg(&guard, err, errlen);
    } else if (rc == CURLE_COULDNT_RESOLVE_HOST) {
        st = QN_EINVAL;
        qn_errf(err, errlen, "fileAddress: the host cannot be resolved");
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        st = QN_ETIMEDOUT;
        qn_errf(err, errlen, "fileAddress: resolving the host timed out (%ld ms)",
                l.connect_timeout_ms);
    } else {
        st = QN_ERR;
        qn_errf(err, errlen, "fileAddress: %s", cerr[0] ? cerr : curl_easy_strerror(rc));
    }
    curl_easy_cleanup(c);
    return st;
}

qn_status fetch_resolve_opt(const char *file_address, const char *file_root,
                            const fetch_limits *lim, char *out_path, size_t len, char *err,
                            size_t errlen)
{
    fetch_limits l;
    fetch_limits_fill(lim, &l);
    qn_status st = address_sane(file_address, err, errlen);
    if (st != QN_OK)
        return st;
    if (fetch_is_url(file_address)) {
        st = url_check(file_address, err, errlen);
        if (st != QN_OK)
            return st;
        return download(file_address, &l, out_path, len, err, errlen);
    }
    return path_check(file_address, file_root, out_path, len, err, errlen);
}

qn_status fetch_resolve(const char *file_address, const char *file_root, char *out_path, size_t len,
                        char *err, size_t errlen)
{
    return fetch_resolve_opt(file_address, file_root, NULL, out_path, len, err, errlen);
}

fetch_limits fetch_config_limits(const fetch_config *cfg)
{
    return (fetch_limits){.max_bytes = (uint64_t)cfg->max_bytes,
                          .timeout_ms = (long)cfg->timeout_s * 1000,
                          .allow_internal = cfg->allow_internal};
}

qn_status fetch_resolve_cfg(const fetch_config *cfg, const char *file_address, char *out_path,
                            size_t len, char *err, size_t errlen)
{
    fetch_limits lim = fetch_config_limits(cfg);
    return fetch_resolve_opt(file_address, cfg->root, &lim, out_path, len, err, errlen);
}
