/*
 * The file behind a distribution task's fileAddress: an http(s) URL is downloaded
 * with libcurl to a temporary file under size and time limits (no other protocol, also not
 * through a redirect; no internal address, checked on every connection after name resolution,
 * unless allowed); a local path must resolve, symlinks included, to a regular file under
 * the configured file root. Everything else is refused with QN_EINVAL and a clear message.
 * Blocking: call these from a worker thread, never on the event loop.
 */
#ifndef QUAN_FETCH_H
#define QUAN_FETCH_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

/* Download limits; a zero field (or a NULL pointer) means its default. */
typedef struct fetch_limits {
    uint64_t max_bytes;      /* body size (64 MiB) */
    long timeout_ms;         /* whole transfer (120000) */
    long connect_timeout_ms; /* connection (5000) */
    long max_redirects;      /* http(s) redirects followed (3) */
    const char *tmp_dir;     /* where downloads go ($TMPDIR, else /tmp); borrowed */
    int allow_internal;      /* 1: also hosts at loopback, private, link-local... addresses
                                (refused by default: a merchant's URL must not reach inside) */
} fetch_limits;

#define FETCH_ADDRESS_MAX 2048

/* 1 if file_address is a URL ("scheme://..."), whatever its scheme; 0 for a path. */
int fetch_is_url(const char *file_address);

/* Validates an address at task creation, without downloading: an http/https URL with a host,
 * or a path that resolves to an existing regular file under file_root (file_root NULL or ""
 * refuses every path). QN_OK, or QN_EINVAL with the reason in err. No name is resolved. */
qn_status fetch_check_address(const char *file_address, const char *file_root, char *err,
                              size_t errlen) QN_MUSTCHECK;

/* A URL's host under the address policy, at task creation: unless lim->allow_internal, its
 * name is resolved as the download would resolve it (bounded by lim->connect_timeout_ms) and
 * refused when no address it has may be fetched. QN_OK also for a path (nothing to resolve).
 * QN_EINVAL: an internal host, or a name that does not resolve; QN_ETIMEDOUT, QN_ERR: the
 * check could not be made now. Every message starts with "fileAddress: ". */
qn_status fetch_check_host(const char *file_address, const fetch_limits *lim, char *err,
                           size_t errlen) QN_MUSTCHECK;

/* Makes the file available at out_path: a URL is downloaded to a new temporary file, which the
 * caller must unlink when done (fetch_is_url tells); a path is checked as above and out_path
 * is its resolved real path (not to be unlinked). QN_EINVAL, what trying again will not
 * change: a refused address, an HTTP 4xx status (but 408 and 429), over the size limit;
 * QN_EAGAIN: an HTTP 5xx, 408 or 429 status; QN_ETIMEDOUT; QN_ERR: network or local I/O
 * failure. On failure no temporary file is left behind. */
qn_status fetch_resolve(const char *file_address, const char *file_root, char *out_path, size_t len,
                        char *err, size_t errlen) QN_MUSTCHECK;
qn_status fetch_resolve_opt(const char *file_address, const char *file_root,
                            const fetch_limits *lim, char *out_path, size_t len, char *err,
                            size_t errlen) QN_MUSTCHECK;

/* The settings of a task's file, read from the same variables by merchant-admin (create, the
 * row count) and distribution (the run): a binary's config struct holds a fetch_config and
 * lists FETCH_CONFIG_VARS(its type, the member) among its rows. */
typedef struct fetch_config {
    const char *root;   /* QUAN_FILE_ROOT: paths must lie under it */
    int64_t max_bytes;  /* QUAN_FILE_MAX_BYTES: the file as stored or downloaded */
    int64_t max_xml;    /* QUAN_FILE_MAX_XML_BYTES: a .xlsx's sheet and strings, uncompressed */
    int64_t timeout_s;  /* QUAN_FILE_TIMEOUT_S: the whole download */
    int allow_internal; /* QUAN_FILE_ALLOW_INTERNAL */
} fetch_config;

/* One row per variable; the rows are in the order of fetch_config. */
#define FETCH_CONFIG_ROOT(type, m)                                                                 \
    {                                                                                              \
        "QUAN_FILE_ROOT", CONFIG_STR, offsetof(type, m.root), "/var/lib/quan/files", 1, 4096,      \
            NULL, 0, "spreadsheet paths (fileAddress) must lie under this directory"               \
    }
#define FETCH_CONFIG_MAX_BYTES(type, m)                                                            \
    {                                                                                              \
        "QUAN_FILE_MAX_BYTES", CONFIG_INT, offsetof(type, m.max_bytes), "209715200", 1024,         \
            10737418240, NULL, 0, "largest spreadsheet file accepted (stored or downloaded)"       \
    }
/* A million-row sheet with a few columns is 200-400 MB of XML; read streaming, its size costs
 * time, never memory. The limit stops a zip bomb from running for minutes. */
#define FETCH_CONFIG_MAX_XML(type, m)                                                              \
    {                                                                                              \
        "QUAN_FILE_MAX_XML_BYTES", CONFIG_INT, offsetof(type, m.max_xml), "2147483648", 1024,      \
            68719476736, NULL, 0, "largest uncompressed sheet (or shared strings) of a .xlsx"      \
    }
#define FETCH_CONFIG_TIMEOUT(type, m)                                                              \
    {                                                                                              \
        "QUAN_FILE_TIMEOUT_S", CONFIG_INT, offsetof(type, m.timeout_s), "120", 1, 3600, NULL, 0,   \
            "longest download of an http(s) fileAddress"                                           \
    }
#define FETCH_CONFIG_INTERNAL(type, m)                                                             \
    {                                                                                              \
        "QUAN_FILE_ALLOW_INTERNAL", CONFIG_BOOL, offsetof(type, m.allow_internal), "false", 0, 0,  \
            NULL, 0,                                                                               \
            "also download fileAddress URLs of loopback, private and link-local hosts (closed "    \
            "networks)"                                                                            \
    }
#define FETCH_CONFIG_VARS(type, m)                                                                 \
    FETCH_CONFIG_ROOT(type, m), FETCH_CONFIG_MAX_BYTES(type, m), FETCH_CONFIG_MAX_XML(type, m),    \
        FETCH_CONFIG_TIMEOUT(type, m), FETCH_CONFIG_INTERNAL(type, m)

/* The download limits of cfg (size, time, address policy; the rest default). */
fetch_limits fetch_config_limits(const fetch_config *cfg);
/* fetch_resolve_opt with cfg's root and limits. */
qn_status fetch_resolve_cfg(const fetch_config *cfg, const char *file_address, char *out_path,
                            size_t len, char *err, size_t errlen) QN_MUSTCHECK;

/* libcurl's global initialisation, once per process, on first use from any thread (it loads
 * the TLS stack: an idle process that never fetches never pays for it). */
qn_status fetch_curl_init(void) QN_MUSTCHECK;

#endif
