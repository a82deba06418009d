/* Every decision of a claim (claimstep.h). */
#include "claimstep.h"

#include <string.h>

#include "excode.h"

METRICS_DEFINE(CLAIMSTEP_METRICS)

#define CLAIM_STEP_NAME_(name) #name,
static const char *const claim_step_names[CLAIM_STEPS] = {CLAIM_STEP_LIST(CLAIM_STEP_NAME_)};
#undef CLAIM_STEP_NAME_

const char *claimstep_name(claim_step s)
{
    return (unsigned)s < CLAIM_STEPS ? claim_step_names[s] : "unknown";
}

/* The claim gate's refusals and their answers; the rows left empty (no message) are not
 * refusals. */
static const claim_refused claim_refusals[CLAIMGATE_RESULTS] = {
    [CLAIMGATE_SOLD_OUT] = {ERRCODE_SOLD_OUT, "stock exhausted", "sold_out"},
    [CLAIMGATE_LIMIT_REACHED] = {ERRCODE_LIMIT, "per-user limit reached", "limit"},
    [CLAIMGATE_NOT_ACTIVE] = {ERRCODE_ENDED, "the template has ended", "ended"},
    [CLAIMGATE_OUTSIDE_WINDOW] = {ERRCODE_WINDOW, "not within the claim window", "window"},
    [CLAIMGATE_OTHER_SHOP] = {ERRCODE_NOT_FOUND, "coupon template not found", NULL},
    /* Not refusals: a retryable answer (with Retry-After) while the facts are not settled. */
    [CLAIMGATE_STOCK_IN_DOUBT] = {ERRCODE_AGAIN,
                                  "no stock is free now, but some is held by claims not settled "
                                  "yet and may come back; try again shortly",
                                  "in_doubt"},
    [CLAIMGATE_LIMIT_IN_DOUBT] = {ERRCODE_AGAIN,
                                  "the per-user limit is reached only with claims of yours not "
                                  "settled yet; try again shortly",
                                  "in_doubt"},
};

const claim_refused *claim_refusal(claimgate_result r)
{
    if ((unsigned)r >= CLAIMGATE_RESULTS || !claim_refusals[r].msg)
        return NULL;
    return &claim_refusals[r];
}

/* An exchange code already redeemed: found so by its row, or by the write that would take it. */
static const claim_refused claim_code_used = {ERRCODE_STATE,
                                              "this exchange code has already been used", "used"};

void claimstep_begin(claim_course *c, claim_kind kind)
{
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->step = kind == CLAIM_EXCHANGE ? CLAIM_LOCK : kind == CLAIM_DRAIN ? CLAIM_WRITE : CLAIM_TOUCH;
}

/* ---- the ends of a claim ---- */

static void claim_end(claim_course *c, claim_step step, errcode err, const char *msg,
                      const char *label)
{
    c->step = step;
    c->ok = 0;
    c->err = err;
    c->msg = msg;
    c->label = label;
    /* a pending marker set for a claim that will not be a coupon goes with its give-back */
    if (step == CLAIM_UNDO && c->kind == CLAIM_MQ && c->marked)
        c->unmark = 1;
}

/* An error answered as it is: nothing was reserved, or what was stays (DOUBT, a void attempt
 * whose give-back was someone else's). An exchange counts every answer; a claim only those of
 * the outcomes it counts (label_claim). */
static void claim_fail(claim_course *c, errcode err, const char *msg, const char *label_claim,
                       const char *label_exchange)
{
    claim_end(c, CLAIM_REPLY, err, msg, c->kind == CLAIM_EXCHANGE ? label_exchange : label_claim);
}

/* The reservation back, then the error. A claim's give-back counts as an error whatever it
 * answers; an exchange's counts what it answers. */
static void claim_undo(claim_course *c, errcode err, const char *msg, const char *label_exchange)
{
    claim_end(c, CLAIM_UNDO, err, msg, c->kind == CLAIM_EXCHANGE ? label_exchange : "error");
}

static void claim_refuse(claim_course *c, const claim_refused *f)
{
    claim_end(c, CLAIM_REPLY, f->err, f->msg, f->outcome);
}

static void claim_success(claim_course *c, claim_step step)
{
    c->step = step;
    c->ok = 1;
    c->label = "success";
}

/* The outcome is not known: the reservation stays in doubt, settled once the database answers. */
static void claim_doubt(claim_course *c)
{
    claim_end(c, CLAIM_DOUBT, ERRCODE_UNAVAILABLE,
              c->kind == CLAIM_EXCHANGE
                  ? "the redemption's outcome is not known yet; try again shortly"
                  : "the claim's outcome is not known yet; retry with the same requestId",
              "error");
}

static const char *claim_unwritten(const claim_course *c)
{
    return c->kind == CLAIM_EXCHANGE ? "the redemption could not be written; nothing was taken"
                                     : "the claim could not be written; nothing was taken";
}

/* ---- the steps ---- */

/* The database has decided the claim (db): a coupon, or why not. */
static void claim_decided(claim_course *c, claimdb_state db, int code_used)
{
    if (c->kind == CLAIM_EXCHANGE && code_used) {
        claim_undo(c, claim_code_used.err, claim_code_used.msg, claim_code_used.outcome);
        return;
    }
    switch (db) {
    case CLAIMDB_NEW:
    case CLAIMDB_DUP:
        c->end_record = 1;
        claim_success(c, CLAIM_WALLET);
        return;
    case CLAIMDB_REFUSED_STOCK: { /* the database had none left: as sold out */
        const claim_refused *f = claim_refusal(CLAIMGATE_SOLD_OUT);
        claim_undo(c, f->err, f->msg, f->outcome);
        return;
    }
    case CLAIMDB_REFUSED_SLOT: /* another coupon holds the receive count */
        if (c->kind == CLAIM_EXCHANGE) {
            const claim_refused *f = claim_refusal(CLAIMGATE_LIMIT_REACHED);
            claim_undo(c, f->err, f->msg, f->outcome);
        } else {
            claim_undo(c, ERRCODE_LIMIT, "the user already holds this coupon (receive count taken)",
                       "limit");
        }
        return;
    case CLAIMDB_VOID: /* the sweeper gave this attempt up, and its reservation back */
        claim_fail(c, ERRCODE_UNAVAILABLE,
                   c->kind == CLAIM_EXCHANGE
                       ? "the redemption took too long and was given up; nothing was taken"
                       : "the claim took too long and was given up; nothing was taken",
                   "error", "error");
        return;
    default:
        claim_undo(c, ERRCODE_UNAVAILABLE, claim_unwritten(c), "error");
        return;
    }
}

/* A consumer's claim: what its batch does in Redis (and for an exchange's code) once its
 * database step decided it. The batch itself failing is not decided here: it comes back. */
static void claim_drained(claim_course *c, const claim_outcome *o)
{
    int succeeded = o->db == CLAIMDB_NEW || o->db == CLAIMDB_DUP;
    c->release_code = c->check && c->exchange && !succeeded;
    /* No longer pending for /redeem-result: written, or refused (a check has no marker; a given
     * up attempt's marker may be a later attempt's by now). */
    c->unmark = !c->check && o->db != CLAIMDB_VOID;
    switch (o->db) {
    case CLAIMDB_NEW:
        c->end_record = 1;
        claim_success(c, CLAIM_WALLET);
        return;
    case CLAIMDB_DUP: /* into the wallet again only while unused: it may be locked or used */
        c->end_record = 1;
        claim_success(c, c->coupon_unused ? CLAIM_WALLET : CLAIM_REPLY);
        return;
    case CLAIMDB_REFUSED_STOCK:
    case CLAIMDB_REFUSED_SLOT:
        claim_undo(c, ERRCODE_SOLD_OUT, "refused by the database", "error");
        return;
    default: /* VOID: given back by whoever gave it up; FAILED: a check's probe found nothing */
        claim_fail(c, ERRCODE_UNAVAILABLE, "not written", NULL, NULL);
        return;
    }
}

static void claim_after_gate(claim_course *c, const claim_outcome *o)
{
    const claimgate_reply *g = &o->gate;
    int x = c->kind == CLAIM_EXCHANGE;
    if (o->st != QN_OK) {
        if (g->reserved) /* reserved, but the rest of its answer is unreadable */
            claim_undo(c, x ? ERRCODE_UNAVAILABLE : ERRCODE_INTERNAL,
                       x ? "claim unavailable" : "unexpected claim reply", "error");
        else if (o->st == QN_EINVAL)
            claim_fail(c, x ? ERRCODE_UNAVAILABLE : ERRCODE_INTERNAL,
                       x ? "claim unavailable" : "unexpected claim result", NULL, "error");
        else
            claim_fail(c, ERRCODE_UNAVAILABLE, x ? "claim unavailable" : "claim store unavailable",
                       NULL, "error");
        return;
    }
    switch (g->code) {
    case CLAIMGATE_OK:
        c->step = c->kind == CLAIM_MQ ? CLAIM_PUBLISH : CLAIM_WRITE;
        return;
    case CLAIMGATE_CACHE_MISS:
        if (c->reloaded) {
            claim_fail(c, ERRCODE_UNAVAILABLE,
                       x ? "template cache unavailable" : "template cache unavailable; try again",
                       NULL, "error");
            return;
        }
        c->reloaded = 1;
        c->step = CLAIM_LOAD;
        return;
    case CLAIMGATE_REPEATED:
        c->step = c->kind == CLAIM_SYNC ? CLAIM_LOOKUP : CLAIM_RECORD;
        return;
    case CLAIMGATE_WRONG_BUCKETS: /* the runner now routes by the template's number */
        if (c->rerouted) {
            claim_fail(c, ERRCODE_UNAVAILABLE,
                       x ? "claim unavailable" : "the template is changing; try again", NULL,
                       "error");
            return;
        }
        c->rerouted = 1;
        c->step = CLAIM_TOUCH; /* the sweeper's index learns the buckets too */
        return;
    case CLAIMGATE_SOLD_OUT:
    case CLAIMGATE_STOCK_IN_DOUBT:
        if (!c->bucketed)
            break;
        /* Only the home bucket is dry: the others' stock is taken home, or the verdict over
         * all of them decides. Past the bound, stock moves faster than this claim: retry. */
        if (c->seeks < CLAIM_SEEKS_MAX) {
            c->seeks++;
            c->step = CLAIM_SEEK;
            return;
        }
        claim_refuse(c, claim_refusal(CLAIMGATE_STOCK_IN_DOUBT));
        return;
    case CLAIMGATE_OTHER_SHOP:
        if (x) { /* the code named that template: the user is told about the code */
            claim_fail(c, ERRCODE_NOT_FOUND, "no such exchange code", NULL, "not_found");
            return;
        }
        break;
    default:
        break;
    }
    const claim_refused *f = claim_refusal(g->code);
    if (!f) { /* cannot be: claimgate_parse knows every code */
        claim_fail(c, ERRCODE_INTERNAL, "unexpected claim result", NULL, "error");
        return;
    }
    if (!x) {
        /* The engine's copy of the template may answer the next refusals (claim.c): a sold out
         * it showed is final now; one it could not show is worth reading, unless the refusal is
         * this user's own (the copy holds no user's count). */
        c->copy_settled = g->code == CLAIMGATE_SOLD_OUT && c->local_zero;
        c->copy_fill = c->local_miss && !c->local_zero && g->code != CLAIMGATE_LIMIT_REACHED &&
                       g->code != CLAIMGATE_OTHER_SHOP && g->code != CLAIMGATE_LIMIT_IN_DOUBT;
    }
    claim_refuse(c, f);
}

/* The seek over the buckets (a dry home): stock taken home, GATE again; a final "sold out" only
 * on the verdict's (every bucket empty at one instant); anything else "in doubt", retryable. */
static void claim_after_seek(claim_course *c, const claim_outcome *o)
{
    if (o->st == QN_OK && o->verdict == BUCKET_HAS_STOCK) {
        c->step = CLAIM_GATE;
        return;
    }
    if (o->st == QN_OK && o->verdict == BUCKET_SOLD_OUT) {
        /* as a sold out of one bucket: the copy settled, or read so the next refusals are
         * its own (query.c keeps a copy of N buckets told of a change to any of them) */
        if (c->kind != CLAIM_EXCHANGE) {
            c->copy_settled = c->local_zero;
            c->copy_fill = c->local_miss && !c->local_zero;
        }
        claim_refuse(c, claim_refusal(CLAIMGATE_SOLD_OUT));
        return;
    }
    claim_refuse(c, claim_refusal(CLAIMGATE_STOCK_IN_DOUBT));
}

/* The template was read (the query chain): a claim asks the gate again; an exchange, whose
 * claim has not started, goes on to reserve. */
static void claim_after_load(claim_course *c, const claim_outcome *o)
{
    int x = c->kind == CLAIM_EXCHANGE;
    if (o->st == QN_OK)
        c->step = x ? CLAIM_TOUCH : CLAIM_GATE;
    else if (o->st == QN_ENOTFOUND)
        claim_fail(c, ERRCODE_NOT_FOUND,
                   x ? "the code's coupon template is gone" : "coupon template not found", NULL,
                   "not_found");
    else if (o->st == QN_EBUSY)
        claim_fail(c, ERRCODE_BUSY,
                   x ? "busy; try again" : "the template is being loaded; try again", NULL, "busy");
    else
        claim_fail(c, ERRCODE_UNAVAILABLE,
                   x ? "template unavailable" : "template store unavailable", NULL, "error");
}

static void claim_after_write(claim_course *c, const claim_outcome *o)
{
    if (c->kind == CLAIM_DRAIN) {
        claim_drained(c, o);
        return;
    }
    if (o->no_id) {
        claim_undo(c, ERRCODE_UNAVAILABLE, "no id available; try again", "error");
        return;
    }
    switch (o->st) {
    case QN_OK:
        break;
    case QN_EBUSY: /* refused before anything ran */
        claim_undo(c, ERRCODE_UNAVAILABLE, "database busy; nothing was taken", "error");
        return;
    case QN_EUNKNOWN: /* committed with the answer lost, or not */
        if (c->kind == CLAIM_EXCHANGE)
            claim_doubt(c); /* ds_0's answer decides, and the sweep asks it */
        else
            c->step = CLAIM_RESOLVE;
        return;
    default: /* rolled back: nothing was written */
        claim_undo(c, ERRCODE_UNAVAILABLE, claim_unwritten(c), "error");
        return;
    }
    if (c->kind == CLAIM_SYNC && c->two_dbs && o->db == CLAIMDB_PENDING) {
        c->step = CLAIM_COUPON; /* the stock is taken: the coupon goes to the user's database */
        return;
    }
    claim_decided(c, o->db, o->code_used);
}

static void claim_after_coupon(claim_course *c, const claim_outcome *o)
{
    if (o->st == QN_EUNKNOWN) {
        /* Rolled back or committed, nobody can tell: the check written with the stock completes
         * the claim either way, so neither the stock nor the reservation goes back here. */
        claim_doubt(c);
        return;
    }
    if (o->st != QN_OK || o->db == CLAIMDB_FAILED || o->db == CLAIMDB_REFUSED_SLOT) {
        /* Not written: the stock goes back in the template's database first. */
        if (o->st != QN_OK) {
            c->item_set = 1;
            c->item_to = CLAIMDB_FAILED;
        }
        c->step = CLAIM_GIVE_BACK;
        return;
    }
    claim_decided(c, o->db, 0);
}

static void claim_after_resolve(claim_course *c, const claim_outcome *o)
{
    if (o->st != QN_OK) {
        claim_doubt(c); /* asked again as soon as the database answers */
        return;
    }
    if (o->db == CLAIMDB_VOID) { /* nothing committed, and now nothing will */
        claim_undo(c, ERRCODE_UNAVAILABLE,
                   c->kind == CLAIM_MQ ? "the claim could not be queued; nothing was taken"
                                       : "the claim could not be written; nothing was taken",
                   "error");
        return;
    }
    if (c->kind == CLAIM_MQ) { /* delivered after all, and written: the result tells which way */
        c->end_record = 1;
        claim_success(c, CLAIM_REPLY);
        return;
    }
    if (c->two_dbs) { /* the stock is taken; the coupon is the user's database's */
        c->step = CLAIM_COUPON;
        return;
    }
    c->item_set = 1; /* one database: the coupon went with the stock */
    c->item_to = CLAIMDB_NEW;
    claim_decided(c, CLAIMDB_NEW, 0);
}

static void claim_after_code(claim_course *c, const claim_outcome *o)
{
    if (o->st == QN_EBUSY)
        claim_fail(c, ERRCODE_UNAVAILABLE, "database busy, retry later", NULL, "error");
    else if (o->st != QN_OK)
        claim_fail(c, ERRCODE_UNAVAILABLE, "database unavailable", NULL, "error");
    else if (o->code_status == 0)
        claim_fail(c, ERRCODE_NOT_FOUND, "no such exchange code", NULL, "not_found");
    else if (o->code_status == EXCODE_REDEEMED && o->code_own) /* unless its record is open */
        c->step = CLAIM_CODE_OWN;
    else if (o->code_status == EXCODE_REDEEMED)
        claim_refuse(c, &claim_code_used);
    else if (o->code_status != EXCODE_USABLE)
        claim_fail(c, ERRCODE_ENDED, "the exchange campaign has ended", NULL, "ended");
    else
        c->step = CLAIM_TEMPLATE;
}

void claimstep_next(claim_course *c, const claim_outcome *o)
{
    int x = c->kind == CLAIM_EXCHANGE;
    c->item_set = 0;
    switch (c->step) {
    case CLAIM_LOCK:
        if (o->st == QN_OK)
            c->step = CLAIM_CODE;
        else if (o->st == QN_EBUSY)
            claim_fail(c, ERRCODE_BUSY, "another exchange of this user is in progress; try again",
                       NULL, "busy");
        else
            claim_fail(c, ERRCODE_UNAVAILABLE, "lock service unavailable", NULL, "error");
        return;
    case CLAIM_CODE:
        claim_after_code(c, o);
        return;
    case CLAIM_CODE_OWN:
        if (o->st != QN_OK)
            claim_fail(c, ERRCODE_UNAVAILABLE, "claim unavailable", NULL, "error");
        else if (o->record != CLAIM_RECORD_GONE)
            claim_fail(c, ERRCODE_AGAIN,
                       "this code's redemption is still being completed; try again shortly", NULL,
                       "in_doubt");
        else
            claim_refuse(c, &claim_code_used);
        return;
    case CLAIM_TEMPLATE:
    case CLAIM_LOAD:
        claim_after_load(c, o);
        return;
    case CLAIM_TOUCH:
        if (o->st == QN_OK)
            c->step = CLAIM_GATE;
        else if (o->st == QN_EAGAIN) /* Redis may have lost stock and counters */
            claim_fail(c, ERRCODE_UNAVAILABLE,
                       x ? "redemptions are paused while the claim state is rebuilt; try again"
                         : "claims are paused while the claim state is rebuilt; try again",
                       NULL, "error");
        else
            claim_fail(c, ERRCODE_UNAVAILABLE, x ? "claim unavailable" : "claim store unavailable",
                       NULL, "error");
        return;
    case CLAIM_GATE:
        claim_after_gate(c, o);
        return;
    case CLAIM_SEEK:
        claim_after_seek(c, o);
        return;
    case CLAIM_RECORD:
        if (x) { /* an earlier attempt of this user with this code reserved and did not finish */
            if (o->st != QN_OK)
                claim_fail(c, ERRCODE_UNAVAILABLE, "claim unavailable", NULL, "error");
            else if (o->record != CLAIM_RECORD_GONE) /* whoever settles it must not meet us */
                claim_fail(c, ERRCODE_AGAIN,
                           "an earlier redemption of this code is still being settled; try again "
                           "shortly",
                           NULL, "in_doubt");
            else /* settled without a give-back: finished here, under that reservation */
                c->step = CLAIM_WRITE;
            return;
        }
        /* /redeem-mq: queued (or ended) answers 202 again; an attempt gone before its confirm is
         * taken over. A record that cannot be read is taken as queued: 202, nothing claimed. */
        if (o->st == QN_OK && o->record == CLAIM_RECORD_OPEN && o->orphaned && !c->took_over) {
            c->took_over = 1;
            c->step = CLAIM_TAKEOVER;
            return;
        }
        c->step = CLAIM_REPLY;
        c->ok = 1;
        c->label = NULL;
        return;
    case CLAIM_LOOKUP:
        if (o->st == QN_OK) {
            c->step = CLAIM_REPLY; /* the coupon that request id made: the same answer */
            c->ok = 1;
            c->label = NULL;
        } else if (o->st == QN_ENOTFOUND && o->orphaned && !c->took_over) {
            c->took_over = 1;
            c->step = CLAIM_TAKEOVER;
        } else if (o->st == QN_ENOTFOUND) {
            claim_fail(c, ERRCODE_AGAIN, "a claim with this requestId is still in progress", NULL,
                       NULL);
        } else {
            claim_fail(c, ERRCODE_UNAVAILABLE, "database unavailable", NULL, NULL);
        }
        return;
    case CLAIM_TAKEOVER:
        if (o->st != QN_OK)
            claim_fail(c, ERRCODE_AGAIN, "a claim with this requestId is still in progress", NULL,
                       NULL);
        else if (o->db == CLAIMDB_VOID) /* given up: its reservation back, then a new attempt */
            c->step = CLAIM_TAKE_BACK;
        else if (c->kind == CLAIM_MQ) { /* it reached the database: the consumer wrote it */
            c->step = CLAIM_REPLY;
            c->ok = 1;
            c->label = NULL;
        } else /* its stock was taken: the coupon is there or its check completes it */
            c->step = CLAIM_LOOKUP;
        return;
    case CLAIM_TAKE_BACK:
        if (o->st == QN_OK)
            c->step = CLAIM_GATE;
        else
            claim_fail(c, ERRCODE_UNAVAILABLE, "claim store unavailable", NULL, NULL);
        return;
    case CLAIM_WRITE:
        claim_after_write(c, o);
        return;
    case CLAIM_COUPON:
        claim_after_coupon(c, o);
        return;
    case CLAIM_GIVE_BACK:
        if (o->st != QN_OK) /* the ledger still holds the stock: its check completes the claim */
            claim_doubt(c);
        else
            claim_decided(c, o->db, 0);
        return;
    case CLAIM_RESOLVE:
        claim_after_resolve(c, o);
        return;
    case CLAIM_PUBLISH:
        if (o->no_id)
            claim_undo(c, ERRCODE_UNAVAILABLE, "no id available; try again", "error");
        else if (!o->queued)
            claim_undo(c, ERRCODE_UNAVAILABLE, "the claim queue is full; nothing was taken",
                       "error");
        else if (o->st != QN_OK) /* nacked, or lost after sending: it may arrive all the same */
            c->step = CLAIM_RESOLVE;
        else {
            c->mark_queued = 1; /* the broker has it: the consumer ends its record */
            claim_success(c, CLAIM_REPLY);
        }
        return;
    case CLAIM_UNDO:
    case CLAIM_DOUBT:
    case CLAIM_WALLET:
        c->step = CLAIM_REPLY; /* the answer decided before */
        return;
    case CLAIM_REPLY:
    case CLAIM_DONE:
    case CLAIM_STEPS:
        c->step = CLAIM_DONE;
        return;
    }
}
