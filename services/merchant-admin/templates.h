/* merchant-admin's templates module: /coupon-template/... (create, page, find, increase stock,
 * change stock buckets, terminate), the template.ended consumer; its settings: the bloom filter's size. */
#ifndef QUAN_MADMIN_TEMPLATES_H
#define QUAN_MADMIN_TEMPLATES_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "errcode.h"
#include "jsonin.h"
#include "service.h"
#include "template.h"

extern const service_module templates_module;

/* What the module decides without I/O, for its tests. */

/* A create body, validated as of now_ms, into t: its fields, the rules normalised (numbers,
 * money in yuan, only the fields of its type) and read back, status active; t's strings owned
 * (tpl_clear, also after a failure). QN_EINVAL with err naming the field and the reason;
 * QN_ENOMEM. */
qn_status templates_create_parse(const cJSON *body, int64_t now_ms, tpl *t,
                                 jsonin_err *err) QN_MUSTCHECK;
/* Whether increase-number (number > 0) or terminate (number 0) may change a template found with
 * status and stock: 1; else 0 with *code and the answer's message in msg (ERRCODE_ENDED when it
 * has ended, ERRCODE_INVALID when the stock would exceed TPL_STOCK_MAX). */
int templates_change_allowed(int status, int64_t stock, int64_t number, errcode *code, char *msg,
                             size_t len);
/* What a stockBuckets asked (0: not given) does to a template of stored buckets whose change
 * from relayout_from buckets is under way (0: none), in increase-number or change-buckets
 * (terminate 0) or terminate (1): TEMPLATES_BUCKETS_KEPT, TEMPLATES_BUCKETS_CHANGED (a change
 * from stored to asked starts), or TEMPLATES_BUCKETS_REFUSED with *code and the message in msg:
 * ERRCODE_STATE while a change is under way (increase-number would add stock to a bucket that
 * is being rebuilt; a second change waits for the first), ERRCODE_INVALID for terminate naming
 * another number. */
enum { TEMPLATES_BUCKETS_REFUSED = -1, TEMPLATES_BUCKETS_KEPT = 0, TEMPLATES_BUCKETS_CHANGED = 1 };
int templates_buckets_change(int stored, int relayout_from, int asked, int terminate, errcode *code,
                             char *msg, size_t len);
/* The stock buckets a create without stockBuckets gets: as many as Redis masters the peak
 * (claims a second, expectedPeakPerSecond; 0: not given) needs at per_master claims a second
 * each, at most the masters there are, at most one a TEMPLATES_BUCKET_SHARE_MIN units of stock,
 * at least 1. */
#define TEMPLATES_BUCKET_SHARE_MIN 1000
int templates_auto_buckets(int64_t stock, int64_t peak, int masters, int64_t per_master);
/* A filter's substring s as a LIKE pattern: "%", s with each \ % _ escaped by a \, "%" (for
 * LIKE ... ESCAPE '\'). Owned; NULL when out of memory. */
char *templates_like_pattern(const char *s);

#endif
