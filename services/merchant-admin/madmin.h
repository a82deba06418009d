/* quan-merchant-admin: what its modules share. Each module (templates.c, tasks.c, codes.c)
 * registers its routes and consumers in its own *_init, called from main.c. */
#ifndef QUAN_MADMIN_H
#define QUAN_MADMIN_H

#include "service.h"

typedef struct madmin_config {
    service_config common;
    /* templates.c */
    int64_t nodup_window_ms;
    int64_t bloom_expected;
    int64_t bloom_fp_per_million;
    /* tasks.c */
    const char *file_root;
    int64_t file_max_bytes;
    int64_t file_timeout_s;
    /* codes.c */
    const char *code_secret;
} madmin_config;

typedef struct madmin {
    service *svc;
    const madmin_config *cfg;
} madmin;

qn_status madmin_templates_init(madmin *m) QN_MUSTCHECK;
qn_status madmin_tasks_init(madmin *m) QN_MUSTCHECK;
qn_status madmin_codes_init(madmin *m) QN_MUSTCHECK;

#endif
