/* merchant-admin's codes module: /coupon-template/exchange-code/... (batches, their export), the
 * codes.generate consumer; its settings: the codes' HMAC key. */
#ifndef QUAN_MADMIN_CODES_H
#define QUAN_MADMIN_CODES_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "jsonin.h"
#include "service.h"

extern const service_module codes_module;

/* What the module decides without I/O, for its tests. */

#define CODES_COUNT_MAX 1000000 /* codes of a batch */
#define CODES_CHUNK     10000   /* codes one transaction of the generator writes at most */
#define CODES_KEY_LEN   80

/* A create body: the template and how many codes. QN_EINVAL with err naming the field. */
qn_status codes_create_parse(const cJSON *body, int64_t *tpl_id, int64_t *count,
                             jsonin_err *err) QN_MUSTCHECK;
/* The codes the generator's next chunk writes for a batch of count with generated stored: what
 * is missing, at most CODES_CHUNK; 0 when complete. */
int64_t codes_chunk_want(int64_t count, int64_t generated);
/* The message key of a batch's codes.generate event (len >= CODES_KEY_LEN): a continuation from
 * generated codes on has a key of its own, so the consume guard does not take it for the event
 * that started the batch. */
void codes_generate_key(char *buf, size_t len, int64_t batch_id, int64_t generated);

#endif
