/*
 * The JSON envelope every Quan message carries, and packs of envelopes (several in one AMQP
 * message). Text in, structs out: no connection here.
 *
 *   {"key":..., "requestId":..., "traceparent":..., "ts":<epoch ms>, "type":<routing key>,
 *    "data":{...}}
 */
#ifndef QUAN_MQ_ENVELOPE_H
#define QUAN_MQ_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "status.h"

#define MQ_ENVELOPE_PACK_MAX   128   /* envelopes in one pack */
#define MQ_ENVELOPE_PACK_BYTES 65536 /* about the most bytes of one pack */

/* All fields owned by the struct; free with mq_envelope_free (which does not free the struct). */
typedef struct mq_envelope {
    char *key;         /* stable key (idempotency), never NULL after a successful parse */
    char *type;        /* event name = routing key, never NULL after a successful parse */
    char *request_id;  /* may be NULL */
    char *traceparent; /* may be NULL */
    int64_t ts_ms;     /* 0 if absent */
    cJSON *data;       /* never NULL after a successful parse */
} mq_envelope;

/* data_json is JSON text for "data" (NULL means {}); ts_ms 0 means now. request_id and
 * traceparent may be NULL (omitted). Returns an owned string (free()), NULL on bad input. */
char *mq_envelope_build(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json);
/* The same for data_json this process wrote itself (the hot path's claims): not parsed to be
 * checked, inserted as it is. */
char *mq_envelope_write(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json);
/* Needs "key" and "type" strings and a "data" member. On failure *out is left zeroed. */
qn_status mq_envelope_parse(const char *body, size_t len, mq_envelope *out) QN_MUSTCHECK;
/* Frees the fields and zeroes them; NULL-safe and safe on a zeroed struct. */
void mq_envelope_free(mq_envelope *e);

/*
 * A pack: several envelopes in one AMQP message, [envelope, envelope, ...] (header x-pack =
 * their count). The threaded publisher makes packs of packable messages (mq_msg.packable)
 * queued at the same moment, so that under load the broker's cost per message is shared by
 * many; only consumers that read packs may be bound to such routing keys.
 * Parses a pack or a single envelope into *out (n entries, owned: mq_envelope_pack_free).
 * QN_EINVAL when any element is not an envelope or there are more than MQ_ENVELOPE_PACK_MAX.
 */
qn_status mq_envelope_pack_parse(const char *body, size_t len, mq_envelope **out,
                                 size_t *n) QN_MUSTCHECK;
void mq_envelope_pack_free(mq_envelope *e, size_t n);

#endif
