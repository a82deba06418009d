/*
 * Fuzz target: what an HTTP request brings that nobody vouches for, through the functions of
 * common/http/http that read it. The input is lines:
 *
 *   X-Request-Id \n traceparent \n X-User-Id \n X-Shop-Number \n X-Username \n query \n body
 *
 * (the body is the rest, newlines and all). The headers go through the checks http_ids applies
 * to every request; the query string through http_req_set_query as the dispatcher reads it
 * (refused, or read, as evhttp_parse_query_str reads it: every name evhttp finds gives the same
 * first value), and with the body through http_param (the body first, then the query) and the
 * readers the routes apply to their parameters. What reaches logs and reply headers is checked: a
 * kept request id is safe in a header, a kept traceparent is written back as it came, an escaped
 * log value reads back as JSON.
 */
#include <event2/http.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "fuzz.h"
#include "http.h"
#include "jsonin.h"
#include "log.h"

static int is_lhex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return s[n] == '\0';
}

static void headers(const char *rid, const char *tp, const char *uid, const char *shop)
{
    if (http_request_id_ok(rid)) {
        size_t n = strlen(rid);
        PROPERTY(n >= 1 && n <= HTTP_REQUEST_ID_MAX);
        PROPERTY(
            strspn(rid, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-") == n);
    }

    http_req req;
    memset(&req, 0, sizeof(req));
    if (http_traceparent_parse(tp, req.trace_id, req.span_id, req.trace_flags)) {
        PROPERTY(is_lhex(req.trace_id, 32) && is_lhex(req.span_id, 16) &&
                 is_lhex(req.trace_flags, 2));
        PROPERTY(strspn(req.trace_id, "0") < 32 && strspn(req.span_id, "0") < 16);
        /* Sent downstream with this request's span in the caller's place: the same text. */
        char out[HTTP_TRACEPARENT_LEN];
        PROPERTY(strcmp(http_req_traceparent(&req, out), tp) == 0);
    }

    const char *ids[] = {uid, shop};
    for (size_t i = 0; i < 2; i++) {
        int64_t v = http_parse_id(ids[i]);
        PROPERTY(v >= 0);
        if (v > 0) {
            /* The digits as given, leading zeros aside. */
            char buf[24];
            snprintf(buf, sizeof(buf), "%" PRId64, v);
            const char *s = ids[i] + strspn(ids[i], "0");
            PROPERTY(strcmp(buf, s) == 0);
        }
    }
}

/* A value escaped for a log line reads back, as a JSON string, as a prefix of itself. */
static void log_value(const char *s, size_t cap)
{
    char buf[300], quoted[310];
    size_t n = log_json_escape(buf, cap, s);
    PROPERTY(n < cap && strlen(buf) == n);
    for (size_t i = 0; i < n; i++)
        PROPERTY((unsigned char)buf[i] >= 0x20);
    snprintf(quoted, sizeof(quoted), "\"%s\"", buf);
    cJSON *j = cJSON_Parse(quoted);
    PROPERTY(cJSON_IsString(j));
    PROPERTY(strncmp(j->valuestring, s, strlen(j->valuestring)) == 0);
    cJSON_Delete(j);
}

/* An id parameter as merchant-admin and the engine read it: a JSON string through jsonin's
 * rule, otherwise http_param_i64. */
static void param_id(http_req *req, const char *name)
{
    jsonin_err err;
    int64_t v;
    const cJSON *p = http_param(req, name);
    const char *s = http_param_str(req, name);
    PROPERTY((s != NULL) == cJSON_IsString(p));
    if (cJSON_IsString(p))
        (void)jsonin_parse_int64_str(name, p->valuestring, JSONIN_REQUIRED, 0, 1, INT64_MAX, &v,
                                     &err);
    qn_status st = http_param_i64(req, name, &v);
    PROPERTY(st == QN_OK || st == QN_EINVAL || st == QN_ENOTFOUND);
    PROPERTY((st == QN_ENOTFOUND) == (p == NULL));
}

static void query(http_req *req)
{
    static const int types[] = {0, 1, 2}, bin[] = {0, 1}, statuses[] = {0, 1, 2, 3, 4};
    static const char *const ids[] = {"couponTemplateId", "shopNumber", "taskId", "batchId",
                                      "userCouponId",     "ms",         NULL};
    jsonin_err err;
    int64_t v;
    int e;

    for (const char *const *n = ids; *n; n++)
        param_id(req, *n);
    (void)jsonin_parse_int64_str("current", http_param_str(req, "current"), JSONIN_OPTIONAL, 1, 1,
                                 1000000, &v, &err);
    (void)jsonin_parse_int64_str("size", http_query(req, "size"), JSONIN_OPTIONAL, 10, 1, INT32_MAX,
                                 &v, &err);
    (void)jsonin_parse_enum_str("type", http_query(req, "type"), JSONIN_OPTIONAL, -1, types, 3, &e,
                                &err);
    (void)jsonin_parse_enum_str("target", http_query(req, "target"), JSONIN_OPTIONAL, -1, bin, 2,
                                &e, &err);
    (void)jsonin_parse_enum_str("status", http_query(req, "status"), JSONIN_OPTIONAL, -1, statuses,
                                5, &e, &err);
    (void)jsonin_parse_money_str("orderAmount", http_query(req, "orderAmount"), JSONIN_OPTIONAL, 0,
                                 0, INT64_MAX, &v, &err);
    (void)jsonin_parse_time_str("sendTime", http_query(req, "sendTime"), JSONIN_OPTIONAL, 0, &v,
                                &err);
    const char *name = http_param_str(req, "taskName");
    if (name)
        log_value(name, 64);
}

/* The query as the dispatcher reads it, against evhttp's reading of the same text. Returns
 * whether it was taken. */
static int query_read(http_req *req, const char *q)
{
    struct evkeyvalq want;
    int ev_ok = evhttp_parse_query_str(q, &want) == 0;
    qn_status st = http_req_set_query(req, q);
    if (st == QN_ENOMEM) {
        evhttp_clear_headers(&want);
        return 0;
    }
    PROPERTY((st == QN_OK) == ev_ok);
    if (st == QN_OK) {
        PROPERTY(strcmp(http_query_raw(req), q) == 0);
        /* Whatever names the query holds: the first value of each, read the ways a route may. */
        const struct evkeyval *kv;
        TAILQ_FOREACH(kv, &want, next)
        {
            const char *got = http_query(req, kv->key);
            PROPERTY(got && strcmp(got, evhttp_find_header(&want, kv->key)) == 0);
            param_id(req, kv->key);
        }
    }
    evhttp_clear_headers(&want);
    return st == QN_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Header values are C strings: a NUL ends one as it would end evhttp's copy. */
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char *part[7] = {0};
    char *p = text;
    for (int i = 0; i < 6; i++) {
        part[i] = p;
        char *nl = strchr(p, '\n');
        if (!nl) {
            p += strlen(p);
            continue;
        }
        *nl = '\0';
        p = nl + 1;
    }
    part[6] = p;
    const char *body = part[6];
    size_t body_len = size - (size_t)(body - text);

    headers(part[0], part[1], part[2], part[3]);
    log_value(part[0], sizeof(((http_req *)0)->request_id));
    log_value(part[4], 256);

    /* A request as http_dispatch leaves it for a handler: http_param and http_query read only
     * its body and query, so one made here needs no connection. */
    http_req *req = calloc(1, sizeof(*req));
    if (!req) {
        free(text);
        return 0;
    }
    if (body[strspn(body, " \t\r\n")] != '\0') {
        jsonin_err err;
        req->json = jsonin_parse(body, body_len, &err);
    }
    if (query_read(req, part[5]))
        query(req);
    if (req->query_raw && req->query_raw != req->query_inline)
        free(req->query_raw);
    cJSON_Delete(req->json);
    cJSON_Delete(req->scratch);
    free(req);
    free(text);
    return 0;
}
