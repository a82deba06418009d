/* The JSON envelope and packs of envelopes (mq_envelope.h). */
#include "mq_envelope.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/buffer.h>

#include "jsonout.h"
#include "now.h"

/* The envelope around data_json, written straight (no tree): data_json is inserted as it is. */
static char *envelope_write(const char *type, const char *key, const char *request_id,
                            const char *traceparent, int64_t ts_ms, const char *data_json)
{
    char *out = NULL;
    struct evbuffer *b = evbuffer_new();
    size_t len;

    if (!b)
        return NULL;
    if (evbuffer_add(b, "{", 1) || jsonout_key(b, "key", 1) || jsonout_str(b, key) ||
        (request_id && (jsonout_key(b, "requestId", 0) || jsonout_str(b, request_id))) ||
        (traceparent && (jsonout_key(b, "traceparent", 0) || jsonout_str(b, traceparent))) ||
        jsonout_key(b, "ts", 0) || jsonout_i64(b, ts_ms ? ts_ms : now_wall_ms()) ||
        jsonout_key(b, "type", 0) || jsonout_str(b, type) || jsonout_key(b, "data", 0) ||
        jsonout_raw(b, data_json ? data_json : "{}") || evbuffer_add(b, "}", 1))
        goto done;
    len = evbuffer_get_length(b);
    if (!(out = malloc(len + 1)))
        goto done;
    evbuffer_copyout(b, out, len);
    out[len] = '\0';
done:
    evbuffer_free(b);
    return out;
}

char *mq_envelope_build(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json)
{
    if (!type || !*type || !key || !*key)
        return NULL;
    if (data_json) { /* a caller's text: it must be JSON */
        cJSON *data = cJSON_Parse(data_json);
        if (!data)
            return NULL;
        cJSON_Delete(data);
    }
    return envelope_write(type, key, request_id, traceparent, ts_ms, data_json);
}

char *mq_envelope_write(const char *type, const char *key, const char *request_id,
                        const char *traceparent, int64_t ts_ms, const char *data_json)
{
    if (!type || !*type || !key || !*key)
        return NULL;
    return envelope_write(type, key, request_id, traceparent, ts_ms, data_json);
}

static char *json_str_dup(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) && v->valuestring ? strdup(v->valuestring) : NULL;
}

/* Fills out from the envelope object o, taking o's "data" (o is changed, not freed). */
static qn_status envelope_take(cJSON *o, mq_envelope *out)
{
    const cJSON *ts;

    memset(out, 0, sizeof(*out));
    if (!cJSON_IsObject(o))
        goto fail;
    out->key = json_str_dup(o, "key");
    out->type = json_str_dup(o, "type");
    if (!out->key || !out->type || !*out->key || !*out->type)
        goto fail;
    out->request_id = json_str_dup(o, "requestId");
    out->traceparent = json_str_dup(o, "traceparent");
    ts = cJSON_GetObjectItemCaseSensitive(o, "ts");
    /* Only a time an int64 holds (else 0, as when absent): the cast of a larger number (1e300)
     * is undefined. */
    if (cJSON_IsNumber(ts) && ts->valuedouble >= -9223372036854775808.0 &&
        ts->valuedouble < 9223372036854775808.0)
        out->ts_ms = (int64_t)ts->valuedouble;
    out->data = cJSON_DetachItemFromObjectCaseSensitive(o, "data");
    if (!out->data)
        goto fail;
    return QN_OK;
fail:
    mq_envelope_free(out);
    return QN_EINVAL;
}

qn_status mq_envelope_parse(const char *body, size_t len, mq_envelope *out)
{
    cJSON *root = body ? cJSON_ParseWithLength(body, len) : NULL;
    qn_status st = envelope_take(root, out);
    cJSON_Delete(root);
    return st;
}

qn_status mq_envelope_pack_parse(const char *body, size_t len, mq_envelope **out, size_t *n)
{
    qn_status st = QN_EINVAL;
    cJSON *root = body ? cJSON_ParseWithLength(body, len) : NULL;
    size_t count = 0, i = 0;
    mq_envelope *e = NULL;

    *out = NULL;
    *n = 0;
    if (cJSON_IsObject(root))
        count = 1;
    else if (cJSON_IsArray(root))
        count = (size_t)cJSON_GetArraySize(root);
    if (count == 0 || count > MQ_ENVELOPE_PACK_MAX)
        goto done;
    st = QN_ENOMEM;
    if (!(e = calloc(count, sizeof(*e))))
        goto done;
    st = QN_EINVAL;
    if (cJSON_IsObject(root)) {
        if (envelope_take(root, &e[i++]) != QN_OK)
            goto done;
    } else {
        cJSON *item;
        cJSON_ArrayForEach(item, root)
        {
            if (envelope_take(item, &e[i++]) != QN_OK)
                goto done;
        }
    }
    st = QN_OK;
    *out = e;
    *n = count;
    e = NULL;
done:
    mq_envelope_pack_free(e, i);
    cJSON_Delete(root);
    return st;
}

void mq_envelope_pack_free(mq_envelope *e, size_t n)
{
    if (!e)
        return;
    for (size_t i = 0; i < n; i++)
        mq_envelope_free(&e[i]);
    free(e);
}

void mq_envelope_free(mq_envelope *e)
{
    if (!e)
        return;
    free(e->key);
    free(e->type);
    free(e->request_id);
    free(e->traceparent);
    cJSON_Delete(e->data);
    memset(e, 0, sizeof(*e));
}
