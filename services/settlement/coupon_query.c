/* Coupons that fit an order (coupon_query.h). */
#include "coupon_query.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cqfit.h"
#include "discount.h"
#include "grow.h"
#include "jsonin.h"
#include "jsonout.h"
#include "keys.h"
#include "log.h"
#include "metrics.h"
#include "now.h"
#include "pgparam.h"
#include "rcopy.h"
#include "rtrack.h"
#include "shard.h"
#include "template.h"
#include "ucoupon.h"

/* The longest int64 in decimal, with its sign. */
#define CPQ_ID_TEXT 21

/* What the answer writes of a coupon, formatted once when its row is read (the rows are kept
 * between requests; the answer lists hundreds). */
typedef struct cpq_rowtext {
    uint8_t id_len;
    char end[JSONIN_TIME_LEN]; /* valid_end_ms as the answer writes it */
    char id_text[CPQ_ID_TEXT]; /* id as the answer writes it */
} cpq_rowtext;

/* A user's unused coupons as the database listed them, in the answer's order (cqfit_cmp), with
 * their texts, and their distinct templates (cqfit_coupon.k indexes tpl_ids), in one
 * allocation; shared by the cache and the requests that use it (refs). */
typedef struct cpq_rows {
    int refs;
    size_t n, ntpl;
    int64_t stale_at_ms; /* cqfit_kept_until */
    int64_t *tpl_ids, *tpl_shops;
    cpq_rowtext *text; /* [n] */
    cqfit_coupon c[];
} cpq_rows;

/* A template with what every answer needs of it: its rule, and its part of an entry as JSON
 * text (name to consumeRule). Shared like cpq_rows. */
typedef struct cpq_tplv {
    int refs;
    tpl t;
    discount_rule rule;
    char *frag;
    size_t frag_len;
} cpq_tplv;

typedef struct cpq_settings {
    int64_t cache_users, cache_templates;
} cpq_settings;

static cpq_settings cpq_cfg;

typedef struct cpq_ctx cpq_ctx;
typedef struct cpq_job cpq_job;

/* One template read from the cache for a job. */
typedef struct cpq_fetch {
    cpq_job *j;
    size_t k;
    uint64_t ticket;
} cpq_fetch;

/* One fallback job: loads the missing templates of one database. */
typedef struct cpq_dsjob {
    cpq_job *j;
    int ds;
    qn_status st; /* written by the worker, read in done */
} cpq_dsjob;

struct cpq_job {
    cpq_ctx *ctx;
    http_req *req;
    int64_t user;
    discount_order order;
    discount_goods *goods; /* goods_number borrowed from the request body (lives until reply) */
    uint64_t epoch;        /* tracking epoch taken before the first read; 0: keep nothing */
    uint64_t ticket;       /* for the user's rows */
    cpq_rows *rows;        /* one reference */
    cpq_tplv **tv;         /* [rows->ntpl], one reference each, NULL until found */
    cpq_fetch *fetch;
    size_t pending;
    cpq_dsjob ds_jobs[SHARD_DB_COUNT];
    int fallback_failed;
};

/* The text of a template's entries in this answer. All its coupons read the same (cqfit.h),
 * so what an entry writes of them is made once per template and copied per coupon: mid, from
 * the template's part to the validEndTime key, and tail, from the time's closing quote on. */
typedef struct cpq_vtext {
    const char *mid, *tail; /* in the request's text (cpq_reply) */
    size_t mid_len, tail_len;
} cpq_vtext;

typedef struct cpq_texts cpq_texts;

/* An answer's text, lent to the reply's buffer (evbuffer_add_reference: not copied) and taken
 * back when it has been sent. Kept ones are reused with their pages mapped: a fresh block of
 * this size per answer was a heap grown and trimmed per request (page faults, brk: a third
 * of the process' time). */
typedef struct cpq_text {
    struct cpq_text *next;
    cpq_texts *home; /* where it goes back to */
    size_t cap;
    char data[];
} cpq_text;

/* What the kept texts may hold in all: about one per connection answered in a loop pass. */
#define CPQ_TEXTS_KEPT_BYTES ((size_t)8 << 20)
/* Texts grow in these steps, so that answers of about the same size share them. */
#define CPQ_TEXT_STEP ((size_t)16 << 10)

/* The kept texts. Allocated apart from the module's context: a text the reply's buffer still
 * holds when the module stops comes back here, and the last one back frees it. */
struct cpq_texts {
    cpq_text *free; /* LIFO: the last one sent is likeliest still in the cache */
    size_t kept;    /* bytes in free */
    size_t lent;    /* texts in replies' buffers */
    int closed;     /* the module stopped: a text back from now on is freed */
};

/* A reply's working arrays (cpq_reply), kept between requests like the texts: a reply runs to
 * its end on the loop thread, and blocks of these sizes freed per request cost more than
 * their use (a free next to the heap's top consolidates the small free blocks). */
typedef struct cpq_scratch {
    size_t *ok, *no;   /* the answer's lists, as indexes of rows (cqfit_order) */
    unsigned char *vd; /* bytes: cpq_reply lays out its verdicts, their texts, cqfit's scratch */
    char *text;
    size_t ok_cap, no_cap, vd_cap, text_cap;
} cpq_scratch;

/* The module's context (its start hook's state), the arg of its route: everything a request
 * reaches besides its job. Loop thread only. */
struct cpq_ctx {
    service *svc;
    const cpq_settings *cfg;
    rtrack *track; /* NULL: nothing is kept between requests */
    rcopy *users;  /* user id -> cpq_rows */
    rcopy *tpls;   /* template id -> cpq_tplv */
    cpq_texts *texts;
    struct evbuffer *brace; /* empty between answers (cpq_answer_write) */
    cpq_scratch scratch;
    metrics_handle lookups[2][2]; /* quan_rcopy_lookups_total by [rows or template][hit] */
};

static void cpq_rows_release(void *p)
{
    cpq_rows *r = p;
    if (r && --r->refs == 0)
        free(r);
}

static void cpq_tplv_release(void *p)
{
    cpq_tplv *v = p;
    if (v && --v->refs == 0) {
        tpl_clear(&v->t);
        free(v->frag);
        free(v);
    }
}

/* The template's part of every entry: couponTemplateId to consumeRule (jsonout_writer). */
static int cpq_tpl_part_write(struct evbuffer *b, const void *arg)
{
    const tpl *x = arg;
    return jsonout_key(b, "couponTemplateId", 0) || jsonout_id(b, x->id) ||
                   jsonout_key(b, "name", 0) || jsonout_str(b, x->name) ||
                   jsonout_key(b, "target", 0) || jsonout_i64(b, x->target) ||
                   jsonout_key(b, "goods", 0) || jsonout_str(b, x->goods) ||
                   jsonout_key(b, "type", 0) || jsonout_i64(b, x->type) ||
                   jsonout_key(b, "consumeRule", 0) ||
                   jsonout_raw(b, x->consume_rule && *x->consume_rule ? x->consume_rule : "{}")
               ? -1
               : 0;
}

/* Takes over t's strings (t is left cleared either way). NULL on allocation failure. */
static cpq_tplv *cpq_tplv_new(tpl *t)
{
    cpq_tplv *v = calloc(1, sizeof(*v));
    if (!v) {
        tpl_clear(t);
        return NULL;
    }
    v->refs = 1;
    v->t = *t;
    memset(t, 0, sizeof(*t));
    discount_rule_from_tpl(&v->t, &v->rule);
    if (!(v->frag = jsonout_render(cpq_tpl_part_write, &v->t, &v->frag_len))) {
        cpq_tplv_release(v);
        return NULL;
    }
    return v;
}

/* A text of room bytes or more, lent until cpq_text_put. */
static cpq_text *cpq_text_get(cpq_texts *ts, size_t room)
{
    cpq_text *t = ts->free;
    if (t) {
        ts->free = t->next;
        ts->kept -= t->cap;
        if (t->cap < room) {
            free(t);
            t = NULL;
        }
    }
    if (!t) {
        size_t cap = (room + CPQ_TEXT_STEP - 1) / CPQ_TEXT_STEP * CPQ_TEXT_STEP;
        if (!(t = malloc(sizeof(*t) + cap)))
            return NULL;
        t->home = ts;
        t->cap = cap;
    }
    ts->lent++;
    return t;
}

/* The reply's buffer is done with the text (evbuffer_ref_cleanup_cb): sent, or dropped. */
static void cpq_text_put(const void *data, size_t len, void *arg)
{
    (void)data;
    (void)len;
    cpq_text *t = arg;
    cpq_texts *ts = t->home;
    ts->lent--;
    if (ts->closed || ts->kept + t->cap > CPQ_TEXTS_KEPT_BYTES) {
        free(t);
        if (ts->closed && ts->lent == 0)
            free(ts);
        return;
    }
    t->next = ts->free;
    ts->free = t;
    ts->kept += t->cap;
}

/* The module stops: what is kept goes; a text still being sent goes when it has been, and the
 * last one takes ts with it. */
static void cpq_texts_close(cpq_texts *ts)
{
    if (!ts)
        return;
    while (ts->free) {
        cpq_text *t = ts->free;
        ts->free = t->next;
        free(t);
    }
    ts->kept = 0;
    ts->closed = 1;
    if (ts->lent == 0)
        free(ts);
}

static void cpq_free(cpq_job *j)
{
    if (!j)
        return;
    if (j->tv)
        for (size_t k = 0; k < j->rows->ntpl; k++)
            cpq_tplv_release(j->tv[k]);
    free(j->tv);
    free(j->fetch);
    cpq_rows_release(j->rows);
    free(j->goods);
    free(j);
}

/* ------------------------------------------------------------------ answer */

#define CPQ_PUT(p, lit) (memcpy((p), (lit), sizeof(lit) - 1), (p) + sizeof(lit) - 1)
/* The most an entry adds besides its template's mid and tail: the id's key and quotes, the
 * id copied whole (cpq_entry_text), the time, a comma. */
#define CPQ_ENTRY_FIXED 64
/* The most a template's mid and tail add besides its part and its reason. */
#define CPQ_VERDICT_FIXED (64 + JSONOUT_CENTS_LEN)

/* The template's mid and tail for this answer (verdict v), at p (room checked by the caller);
 * returns the end. The template fields read the same as in the engine's answers
 * (tpl_json_write). */
static char *cpq_verdict_text(char *p, cpq_vtext *d, const cqfit_verdict *v, const cpq_tplv *tv)
{
    d->mid = p;
    memcpy(p, tv->frag, tv->frag_len);
    p += tv->frag_len;
    p = CPQ_PUT(p, ",\"couponAmount\":");
    p += jsonout_cents_text(p, v->amount_cents);
    p = CPQ_PUT(p, ",\"validEndTime\":\"");
    d->mid_len = (size_t)(p - d->mid);
    d->tail = p;
    *p++ = '"';
    if (v->reason) {
        /* The reasons are fixed ASCII phrases: nothing to escape. */
        size_t n = strlen(v->reason);
        p = CPQ_PUT(p, ",\"reason\":\"");
        memcpy(p, v->reason, n);
        p += n;
        *p++ = '"';
    }
    *p++ = '}';
    d->tail_len = (size_t)(p - d->tail);
    return p;
}

/* The entry of a coupon (x) of a template (d) as JSON text, at p (room checked by the caller);
 * returns the end. */
static char *cpq_entry_text(char *p, const cpq_rowtext *x, const cpq_vtext *d)
{
    p = CPQ_PUT(p, "{\"userCouponId\":\"");
    /* The whole array: a copy of fixed size, cheaper than one of the id's; what lies past the
     * id is overwritten next. */
    memcpy(p, x->id_text, sizeof(x->id_text));
    p += x->id_len;
    *p++ = '"';
    memcpy(p, d->mid, d->mid_len);
    p += d->mid_len;
    memcpy(p, x->end, JSONIN_TIME_LEN - 1);
    p += JSONIN_TIME_LEN - 1;
    memcpy(p, d->tail, d->tail_len);
    return p + d->tail_len;
}

/* The two sorted lists (http_data_writer), as indexes of rows: written in one piece, since a
 * user may hold hundreds of coupons, and lent to the buffer. */
typedef struct cpq_answer {
    cpq_ctx *ctx;
    const cpq_rows *rows;
    const cpq_vtext *vt; /* per template */
    const size_t *ok, *no;
    size_t nok, nno;
} cpq_answer;

static size_t cpq_list_room(const cpq_answer *a, const size_t *idx, size_t n)
{
    size_t room = 2;
    for (size_t i = 0; i < n; i++) {
        const cpq_vtext *d = &a->vt[a->rows->c[idx[i]].k];
        room += CPQ_ENTRY_FIXED + d->mid_len + d->tail_len;
    }
    return room;
}

static char *cpq_list_text(char *p, const cpq_answer *a, const size_t *idx, size_t n)
{
    *p++ = '[';
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        p = cpq_entry_text(p, &a->rows->text[idx[i]], &a->vt[a->rows->c[idx[i]].k]);
    }
    *p++ = ']';
    return p;
}

static int cpq_answer_write(struct evbuffer *b, const void *arg)
{
    const cpq_answer *a = arg;
    cpq_ctx *ctx = a->ctx;
    size_t room = 64 + cpq_list_room(a, a->ok, a->nok) + cpq_list_room(a, a->no, a->nno);
    cpq_text *t = cpq_text_get(ctx->texts, room);
    if (!t)
        return -1;
    char *p = t->data;
    p = CPQ_PUT(p, "{\"availableCouponList\":");
    p = cpq_list_text(p, a, a->ok, a->nok);
    p = CPQ_PUT(p, ",\"notAvailableCouponList\":");
    p = cpq_list_text(p, a, a->no, a->nno);
    if (evbuffer_add_reference(b, t->data, (size_t)(p - t->data), cpq_text_put, t) != 0) {
        cpq_text_put(t->data, 0, t); /* not taken: no cleanup comes */
        return -1;
    }
    /* The closing brace in a small chain of its own, for what the envelope adds next: libevent
     * would size that chain after the last one, as large as the answer, allocated per request. */
    if (!ctx->brace && !(ctx->brace = evbuffer_new()))
        return -1;
    if (evbuffer_add(ctx->brace, "}", 1) != 0 || evbuffer_add_buffer(b, ctx->brace) != 0) {
        evbuffer_drain(ctx->brace, evbuffer_get_length(ctx->brace));
        return -1;
    }
    return 0;
}

/* The coupons of a template found nowhere are left out of the answer (the reference threw on
 * them): each is logged. */
static void cpq_log_missing(const cpq_job *j, const cqfit_verdict *vd, int64_t now)
{
    for (size_t i = 0; i < j->rows->n; i++) {
        const cqfit_coupon *c = &j->rows->c[i];
        if (c->valid_end_ms > now && !vd[c->k].found)
            log_warn(&j->req->log,
                     "coupon-query: template %" PRId64 " of coupon %" PRId64 " not found",
                     c->tpl_id, c->id);
    }
}

/* Replies and frees the job: each template judged and its text made once, then the lists
 * (cqfit_order). */
static void cpq_reply(cpq_job *j)
{
    cpq_scratch *sc = &j->ctx->scratch;
    cqfit_verdict *vd; /* [ntpl], followed by their texts [ntpl] and cqfit_order's scratch */
    cpq_vtext *vt;
    size_t nok = 0, nno = 0, n = j->rows ? j->rows->n : 0, ntpl = j->rows ? j->rows->ntpl : 0;
    size_t text_room = 1;
    int64_t now = now_wall_ms();
    int missing = 0;

    if (j->fallback_failed) {
        http_reply_error(j->req, ERRCODE_UNAVAILABLE, "database unavailable");
        goto done;
    }
    if (grow(&sc->ok, &sc->ok_cap, n ? n : 1, sizeof(*sc->ok), 256) != QN_OK ||
        grow(&sc->no, &sc->no_cap, n ? n : 1, sizeof(*sc->no), 256) != QN_OK ||
        grow(&sc->vd, &sc->vd_cap, ntpl * (sizeof(*vd) + sizeof(*vt)) + cqfit_scratch_size(ntpl), 1,
             4096) != QN_OK)
        goto oom;
    vd = (cqfit_verdict *)(void *)sc->vd;
    vt = (cpq_vtext *)(vd + ntpl);
    for (size_t k = 0; k < ntpl; k++) {
        const cpq_tplv *v = j->tv[k];
        vd[k] = (cqfit_verdict){0};
        if (!v) {
            missing = 1;
            continue;
        }
        cqfit_judge(&v->t, &v->rule, &j->order, now, &vd[k]);
        text_room += CPQ_VERDICT_FIXED + v->frag_len + (vd[k].reason ? strlen(vd[k].reason) : 0);
    }
    if (grow(&sc->text, &sc->text_cap, text_room, 1, 4096) != QN_OK)
        goto oom;
    char *p = sc->text;
    for (size_t k = 0; k < ntpl; k++)
        if (j->tv[k])
            p = cpq_verdict_text(p, &vt[k], &vd[k], j->tv[k]);
    if (n)
        cqfit_order(j->rows->c, n, vd, ntpl, now, vt + ntpl, sc->ok, &nok, sc->no, &nno);
    if (missing)
        cpq_log_missing(j, vd, now);
    cpq_answer a = {j->ctx, j->rows, vt, sc->ok, sc->no, nok, nno};
    http_reply_ok_write(j->req, cpq_answer_write, &a);
    goto done;
oom:
    http_reply_error(j->req, ERRCODE_INTERNAL, "out of memory");
done:
    cpq_free(j);
}

/* ------------------------------------------------------------------ 3. database fallback */

/* Which database holds a template of shop, -1 when the shop cannot be routed. */
static int cpq_tpl_ds(int64_t shop)
{
    shard_route r;
    return shard_route_for("t_coupon_template", shop, &r) == QN_OK ? r.ds : -1;
}

static qn_status cpq_work_tpls(pgpool_conn *c, void *arg)
{
    cpq_dsjob *d = arg;
    cpq_job *j = d->j;
    d->st = QN_OK;
    for (size_t k = 0; k < j->rows->ntpl; k++) {
        tpl t = {0};
        if (j->tv[k] || cpq_tpl_ds(j->rows->tpl_shops[k]) != d->ds)
            continue;
        qn_status st = tpl_db_load(c, j->rows->tpl_shops[k], j->rows->tpl_ids[k], &t);
        if (st == QN_OK) {
            /* Not kept between requests: no Redis key stands behind it to tell a change. */
            if (!(j->tv[k] = cpq_tplv_new(&t)))
                d->st = QN_ENOMEM;
        } else if (st != QN_ENOTFOUND) {
            d->st = st;
        }
    }
    return d->st;
}

static void cpq_done_tpls(qn_status st, void *arg)
{
    cpq_dsjob *d = arg;
    cpq_job *j = d->j;
    if (st != QN_OK) {
        log_warn(&j->req->log, "coupon-query: templates of ds_%d not loaded: %s", d->ds,
                 qn_status_str(st));
        j->fallback_failed = 1;
    }
    if (--j->pending == 0)
        cpq_reply(j);
}

/* Loads what the cache did not have, one job per database that holds any of it. */
static void cpq_fallback(cpq_job *j)
{
    int need[SHARD_DB_COUNT] = {0};
    for (size_t k = 0; k < j->rows->ntpl; k++) {
        int ds = j->tv[k] ? -1 : cpq_tpl_ds(j->rows->tpl_shops[k]); /* a found one needs none */
        if (ds >= 0)
            need[ds] = 1;
    }
    j->pending = 1; /* the reply cannot come before every job is submitted */
    for (int ds = 0; ds < SHARD_DB_COUNT; ds++) {
        if (!need[ds])
            continue;
        j->ds_jobs[ds] = (cpq_dsjob){.j = j, .ds = ds};
        j->pending++;
        if (pgpool_submit(service_pg(j->ctx->svc, ds), cpq_work_tpls, cpq_done_tpls,
                          &j->ds_jobs[ds]) != QN_OK) {
            j->pending--;
            j->fallback_failed = 1;
        }
    }
    if (--j->pending == 0)
        cpq_reply(j);
}

/* ------------------------------------------------------------------ 2. templates */

/* quan_rcopy_lookups_total{what,result} += n, by handles kept (a request counts once). */
static void cpq_count(cpq_ctx *ctx, const char *what, int hit, size_t n)
{
    metrics_handle *h = &ctx->lookups[strcmp(what, "rows") != 0][hit];
    if (n)
        metrics_series_add(
            metrics_handle_series(h, &metric_quan_rcopy_lookups_total,
                                  (const char *const[]){what, hit ? "hit" : "miss", NULL}),
            (int64_t)n);
}

static void cpq_on_hgetall(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    cpq_fetch *f = arg;
    cpq_job *j = f->j;
    tpl t = {0};
    /* An error, a missing or a partial hash: the database decides (step 3). */
    if (!err && tpl_from_cache(reply, &t) == QN_OK) {
        if (t.id == j->rows->tpl_ids[f->k] && (j->tv[f->k] = cpq_tplv_new(&t))) {
            if (j->ctx->track) {
                j->tv[f->k]->refs++;
                rcopy_put(j->ctx->tpls, j->rows->tpl_ids[f->k], f->ticket, j->epoch, INT64_MAX,
                          j->tv[f->k]);
            }
        } else {
            tpl_clear(&t);
        }
    }
    if (--j->pending == 0)
        cpq_fallback(j);
}

/* Each template from this process' copy, else from the Redis cache (HGETALLs back to back:
 * one round trip), else from the database. */
static void cpq_templates(cpq_job *j)
{
    cpq_ctx *ctx = j->ctx;
    redis_client *rc = service_redis(ctx->svc);
    char key[KEYS_LEN];
    size_t ntpl = j->rows->ntpl;
    int64_t now = now_wall_ms();
    j->tv = calloc(ntpl ? ntpl : 1, sizeof(*j->tv));
    j->fetch = calloc(ntpl ? ntpl : 1, sizeof(*j->fetch));
    if (!j->tv || !j->fetch) {
        http_reply_error(j->req, ERRCODE_INTERNAL, "out of memory");
        cpq_free(j);
        return;
    }
    size_t hits = 0;
    j->pending = 1;
    for (size_t k = 0; k < ntpl; k++) {
        int64_t id = j->rows->tpl_ids[k];
        cpq_tplv *v = ctx->track ? rcopy_get(ctx->tpls, id, j->epoch, now) : NULL;
        if (v) {
            v->refs++;
            j->tv[k] = v;
            hits++;
            continue;
        }
        j->fetch[k] =
            (cpq_fetch){.j = j, .k = k, .ticket = ctx->track ? rcopy_ticket(ctx->tpls, id) : 0};
        keys_template(key, id);
        j->pending++;
        if (redis_command(rc, cpq_on_hgetall, &j->fetch[k], "HGETALL %s", key) != QN_OK)
            j->pending--;
    }
    if (ctx->track) {
        cpq_count(ctx, "template", 1, hits);
        cpq_count(ctx, "template", 0, ntpl - hits);
    }
    if (--j->pending == 0)
        cpq_fallback(j);
}

/* ------------------------------------------------------------------ 1. the user's coupons */

/* The rows of res (id, template, shop, valid end) with their distinct templates. */
static cpq_rows *cpq_rows_new(PGresult *res)
{
    size_t n = (size_t)PQntuples(res), nn = n ? n : 1;
    cpq_rows *r = malloc(sizeof(*r) + n * sizeof(cqfit_coupon) + 2 * nn * sizeof(int64_t) +
                         n * sizeof(cpq_rowtext));
    if (!r)
        return NULL;
    r->refs = 1;
    r->n = n;
    r->ntpl = 0;
    r->tpl_ids = (int64_t *)(r->c + n);
    r->tpl_shops = r->tpl_ids + nn;
    r->text = (cpq_rowtext *)(r->tpl_shops + nn);
    for (size_t i = 0; i < n; i++) {
        cqfit_coupon *c = &r->c[i];
        int64_t shop = strtoll(PQgetvalue(res, (int)i, 2), NULL, 10);
        c->id = strtoll(PQgetvalue(res, (int)i, 0), NULL, 10);
        c->tpl_id = strtoll(PQgetvalue(res, (int)i, 1), NULL, 10);
        c->valid_end_ms = strtoll(PQgetvalue(res, (int)i, 3), NULL, 10);
        size_t k = 0;
        while (k < r->ntpl && r->tpl_ids[k] != c->tpl_id)
            k++;
        if (k == r->ntpl) {
            r->tpl_ids[k] = c->tpl_id;
            r->tpl_shops[k] = shop;
            r->ntpl++;
        }
        c->k = (uint32_t)k;
    }
    /* The query sorts by the timestamp; the answer compares milliseconds. */
    qsort(r->c, n, sizeof(*r->c), cqfit_cmp);
    for (size_t i = 0; i < n; i++) {
        cpq_rowtext *x = &r->text[i];
        memset(x, 0, sizeof(*x)); /* id_text is copied whole */
        jsonin_time_format(r->c[i].valid_end_ms, x->end);
        x->id_len = (uint8_t)log_i64_str(x->id_text, r->c[i].id);
    }
    r->stale_at_ms = cqfit_kept_until(r->c, n, COUPON_QUERY_MAX_COUPONS);
    return r;
}

static qn_status cpq_work_rows(pgpool_conn *c, void *arg)
{
    cpq_job *j = arg;
    shard_route r;
    char sql[512];
    pgparam p = {0};
    if (shard_route_for("t_user_coupon", j->user, &r) != QN_OK)
        return QN_EINVAL;
    snprintf(sql, sizeof(sql),
             "SELECT id, coupon_template_id, coalesce(shop_number, 0), "
             "(extract(epoch from valid_end_time) * 1000)::bigint FROM %s "
             "WHERE user_id = $1 AND status = " UCOUPON_STATUS_TEXT(
                 UNUSED) " AND valid_end_time > now() "
                         "ORDER BY valid_end_time, id LIMIT %d",
             r.table, COUPON_QUERY_MAX_COUPONS);
    pgparam_i64(&p, j->user);
    PGresult *res = pgpool_exec(c, sql, p.n, p.v);
    if (!res)
        return QN_ERR;
    j->rows = cpq_rows_new(res);
    PQclear(res);
    return j->rows ? QN_OK : QN_ENOMEM;
}

static void cpq_done_rows(qn_status st, void *arg)
{
    cpq_job *j = arg;
    if (st != QN_OK) {
        http_reply_error(j->req, ERRCODE_UNAVAILABLE, "database unavailable");
        cpq_free(j);
        return;
    }
    if (j->ctx->track) {
        j->rows->refs++;
        rcopy_put(j->ctx->users, j->user, j->ticket, j->epoch, j->rows->stale_at_ms, j->rows);
    }
    cpq_templates(j);
}

static void cpq_read_rows(cpq_job *j)
{
    shard_route r;
    if (shard_route_for("t_user_coupon", j->user, &r) != QN_OK ||
        pgpool_submit(service_pg(j->ctx->svc, r.ds), cpq_work_rows, cpq_done_rows, j) != QN_OK) {
        http_reply_error(j->req, ERRCODE_UNAVAILABLE, "database busy");
        cpq_free(j);
    }
}

/* The wallet key has been read under tracking: a change to the user's coupons from now on
 * (every writer writes the wallet after the row) reaches us, so the rows may be kept. */
static void cpq_on_wallet_read(redis_client *c, const redisReply *reply, const char *err, void *arg)
{
    (void)c;
    (void)reply;
    cpq_job *j = arg;
    if (err)
        j->epoch = 0; /* not tracked: use the rows, keep nothing */
    cpq_read_rows(j);
}

/* ------------------------------------------------------------------ input */

static void cpq_handle(http_req *req, void *arg)
{
    cpq_ctx *ctx = arg;
    jsonin_err err = {{0}};
    const cJSON *body = http_body_json(req);
    cpq_job *j = calloc(1, sizeof(*j));
    if (!j) {
        http_reply_error(req, ERRCODE_INTERNAL, "out of memory");
        return;
    }
    j->ctx = ctx;
    j->req = req;
    j->user = req->user_id;
    if (cqfit_read_order(body, &j->order, &j->goods, &err) != QN_OK) {
        http_reply_error(req, ERRCODE_INVALID, "%s", err.msg);
        cpq_free(j);
        return;
    }
    if (!ctx->track || !(j->epoch = rtrack_epoch(ctx->track))) {
        cpq_read_rows(j);
        return;
    }
    cpq_rows *rows = rcopy_get(ctx->users, j->user, j->epoch, now_wall_ms());
    if (rows) {
        cpq_count(ctx, "rows", 1, 1);
        rows->refs++;
        j->rows = rows;
        cpq_templates(j);
        return;
    }
    cpq_count(ctx, "rows", 0, 1);
    char key[KEYS_LEN];
    keys_wallet(key, j->user);
    j->ticket = rcopy_ticket(ctx->users, j->user);
    if (redis_command(service_redis(ctx->svc), cpq_on_wallet_read, j, "EXISTS %s", key) != QN_OK) {
        j->epoch = 0;
        cpq_read_rows(j);
    }
}

/* rtrack: a key we read changed (NULL: any may have). */
static void cpq_on_invalidate(const char *key, size_t len, void *arg)
{
    cpq_ctx *ctx = arg;
    int64_t id;
    if (!key) {
        rcopy_clear(ctx->users);
        rcopy_clear(ctx->tpls);
    } else if (rtrack_key_id(key, len, KEYS_WALLET_PREFIX, &id)) {
        rcopy_invalidate(ctx->users, id);
    } else if (rtrack_key_id(key, len, KEYS_TEMPLATE_PREFIX, &id)) {
        rcopy_invalidate(ctx->tpls, id);
    }
}

/* After every connection is gone: the texts still lent, if any, free theirs when they come
 * back. */
static void cpq_free_ctx(void *state)
{
    cpq_ctx *ctx = state;
    if (!ctx)
        return;
    rtrack_free(ctx->track);
    rcopy_free(ctx->users);
    rcopy_free(ctx->tpls);
    cpq_texts_close(ctx->texts);
    if (ctx->brace)
        evbuffer_free(ctx->brace);
    free(ctx->scratch.ok);
    free(ctx->scratch.no);
    free(ctx->scratch.vd);
    free(ctx->scratch.text);
    free(ctx);
}

static qn_status cpq_start(service *s, void **state)
{
    const service_config *cfg = service_cfg(s);
    cpq_ctx *ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return QN_ENOMEM;
    *state = ctx; /* freed by cpq_free_ctx from here on */
    ctx->svc = s;
    ctx->cfg = &cpq_cfg;
    if (!(ctx->texts = calloc(1, sizeof(*ctx->texts))))
        return QN_ENOMEM;
    if (ctx->cfg->cache_users == 0)
        return QN_OK;
    ctx->users = rcopy_new((size_t)ctx->cfg->cache_users, cpq_rows_release);
    ctx->tpls = rcopy_new((size_t)ctx->cfg->cache_templates, cpq_tplv_release);
    rtrack_opts o = {.password = cfg->redis_password,
                     .reader = service_redis(s),
                     .cb = cpq_on_invalidate,
                     .arg = ctx};
    if (!ctx->users || !ctx->tpls || !(ctx->track = rtrack_new(service_base(s), &o)))
        return QN_ENOMEM;
    return QN_OK;
}

static const config_var cpq_vars[] = {
    {"QUAN_CQ_CACHE_USERS", CONFIG_INT, offsetof(cpq_settings, cache_users), "10000", 0, 10000000,
     NULL, 0,
     "users whose coupon rows coupon-query keeps between requests, dropped when their wallet "
     "key changes in Redis (0: read the database every time)"},
    {"QUAN_CQ_CACHE_TEMPLATES", CONFIG_INT, offsetof(cpq_settings, cache_templates), "10000", 1,
     10000000, NULL, 0,
     "templates coupon-query keeps between requests, dropped when their Redis hash changes"},
};

const service_module coupon_query_module = {
    .name = "coupon-query",
    .routes =
        (const service_route[]){
            {HTTP_POST, "/api/settlement/coupon-query", cpq_handle, HTTP_NEED_USER},
            {0},
        },
    .vars = cpq_vars,
    .nvars = sizeof(cpq_vars) / sizeof(cpq_vars[0]),
    .settings = &cpq_cfg,
    .metrics = (metrics_family *const[]){METRICS_REFS(RCOPY_METRICS) NULL},
    .start = cpq_start,
    .free = cpq_free_ctx,
};
