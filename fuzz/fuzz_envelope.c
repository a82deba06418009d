/*
 * Fuzz target: a message body as a consumer takes it off the queue (common/mq/mq_envelope): one
 * envelope (mq_envelope_parse, the one-at-a-time consumers) and a pack or one envelope
 * (mq_envelope_pack_parse, the batch consumers), then the engine's claim reader
 * (claimq_claim_parse) on the data of each envelope of the pack, as the engine.redeem consumer
 * reads coupon.redeem messages. Linked with the engine's modules.
 *
 * Properties: a parsed envelope has what mq_envelope.h promises (key, type, data), and built
 * again with mq_envelope_build it parses to the same fields; a pack holds 1 to
 * MQ_ENVELOPE_PACK_MAX envelopes; a claim the reader accepts has its ids and request id, and
 * written again by claimq_claim_json it reads back as the same coupon.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "../services/engine/claimq.h"
#include "mq_envelope.h"

static int same_str(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void envelope_checks(const mq_envelope *e)
{
    PROPERTY(e->key && *e->key && e->type && *e->type && e->data);
    char *data = cJSON_PrintUnformatted(e->data);
    if (!data)
        return;
    /* ts 0 means "now" to the builder; beyond 2^53 a double no longer holds every integer. */
    int64_t ts = e->ts_ms;
    int ts_kept = ts != 0 && ts > -(1LL << 53) && ts < (1LL << 53);
    char *body =
        mq_envelope_build(e->type, e->key, e->request_id, e->traceparent, ts_kept ? ts : 1, data);
    free(data);
    if (!body)
        return;
    mq_envelope back;
    PROPERTY(mq_envelope_parse(body, strlen(body), &back) == QN_OK);
    PROPERTY(same_str(back.key, e->key) && same_str(back.type, e->type));
    PROPERTY(same_str(back.request_id, e->request_id));
    PROPERTY(same_str(back.traceparent, e->traceparent));
    PROPERTY(back.ts_ms == (ts_kept ? ts : 1));
    mq_envelope_free(&back);
    free(body);
}

static void claim_checks(const cJSON *data)
{
    claimdb_item it;
    if (!claimq_claim_parse(data, &it))
        return;
    const ucoupon *u = &it.c;
    PROPERTY(u->id > 0 && u->user_id > 0 && u->template_id > 0 && u->shop_number > 0);
    PROPERTY(u->receive_count >= 1 && u->request_id[0]);
    PROPERTY(!strchr(u->request_id, '"') && !strchr(u->request_id, '\\'));
    PROPERTY((it.tpl_ds == 0 || it.tpl_ds == 1) && (it.user_ds == 0 || it.user_ds == 1));

    /* The claim as the producers write it reads back as the same coupon. Times go as JSON
     * numbers, exact up to 2^53 ms (the year 285,000); past that they may be rounded. */
    char buf[CLAIMQ_CLAIM_JSON];
    cJSON *again = cJSON_Parse(claimq_claim_json(buf, u, it.bkt, it.nbkt, it.check, it.epoch));
    PROPERTY(again != NULL);
    claimdb_item it2;
    PROPERTY(claimq_claim_parse(again, &it2) == 1);
    const ucoupon *v = &it2.c;
    PROPERTY(v->id == u->id && v->user_id == u->user_id && v->template_id == u->template_id &&
             v->shop_number == u->shop_number && v->source == u->source &&
             v->receive_count == u->receive_count && strcmp(v->request_id, u->request_id) == 0 &&
             it2.check == it.check);
    const int64_t exact = 1LL << 53;
    if (u->receive_time_ms > -exact && u->receive_time_ms < exact)
        PROPERTY(v->receive_time_ms == u->receive_time_ms);
    if (u->valid_end_ms > -exact && u->valid_end_ms < exact)
        PROPERTY(v->valid_end_ms == u->valid_end_ms);
    cJSON_Delete(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    mq_envelope one;
    if (mq_envelope_parse(body, size, &one) == QN_OK) {
        envelope_checks(&one);
        mq_envelope_free(&one);
    } else {
        PROPERTY(!one.key && !one.type && !one.data);
    }

    mq_envelope *env = NULL;
    size_t n = 0;
    if (mq_envelope_pack_parse(body, size, &env, &n) == QN_OK) {
        PROPERTY(env && n >= 1 && n <= MQ_ENVELOPE_PACK_MAX);
        for (size_t i = 0; i < n; i++) {
            envelope_checks(&env[i]);
            claim_checks(env[i].data);
        }
        mq_envelope_pack_free(env, n);
    } else {
        PROPERTY(!env && n == 0);
    }
    return 0;
}
