/* Every decision of a claim (claimstep.h): each step against its outcomes, for each kind, as a
 * table; then every step against every outcome, for what must always hold: a final "no" (409)
 * only on a settled fact, a reservation never given back while its write may have committed,
 * never left behind when nothing of it was written, and every claim reaching its answer. */
#include "../claimstep.h"
#include "excode.h"
#include "testhelp.h"

enum { S = CLAIM_SYNC, M = CLAIM_MQ, X = CLAIM_EXCHANGE, D = CLAIM_DRAIN };

/* Facts a case starts with. */
enum {
    F_TWO = 1 << 0,      /* two databases */
    F_RELOADED = 1 << 1, /* loaded once already */
    F_TOOK = 1 << 2,     /* took over once already */
    F_MISS = 1 << 3,     /* the copy was asked and could not answer */
    F_ZERO = 1 << 4,     /* the copy showed no stock, not known final */
    F_MARKED = 1 << 5,   /* the pending marker is set */
    F_CHECK = 1 << 6,    /* a check (drain) */
    F_UNUSED = 1 << 7,   /* the coupon found is unused (drain) */
    F_EXCHANGE = 1 << 8, /* an exchange's check (drain) */
    F_BUCKETED = 1 << 9, /* the template has more than one stock bucket */
    F_SEEKS = 1 << 10,   /* the claim sought CLAIM_SEEKS_MAX times already */
    F_REROUTED = 1 << 11 /* the gate ran again by the template's buckets */
};

/* What a case expects besides the step. */
enum {
    E_OK = 1 << 0,
    E_SETTLED = 1 << 1, /* copy_settled */
    E_FILL = 1 << 2,    /* copy_fill */
    E_END = 1 << 3,     /* end_record */
    E_QUEUED = 1 << 4,  /* mark_queued */
    E_UNMARK = 1 << 5,  /* unmark */
    E_RELEASE = 1 << 6, /* release_code */
    E_FAILED = 1 << 7,  /* the item becomes FAILED */
    E_NEW = 1 << 8,     /* the item becomes NEW */
};

typedef struct tcase {
    int kind;
    claim_step step;
    unsigned facts;
    claim_outcome o;
    claim_step want;
    unsigned expect;
    int status;        /* the answer's HTTP status when it is an error (0: none decided) */
    const char *label; /* NULL: not counted */
} tcase;

#define GATE(code_) .gate = {.code = (code_)}
#define OUT(...)    ((claim_outcome){__VA_ARGS__})
#define OK          OUT(.st = QN_OK)
#define ST(s)       OUT(.st = (s))
#define DB(s)       OUT(.st = QN_OK, .db = (s))

static const tcase cases[] = {
    /* ---- exchange: the lock, the code, its template ---- */
    {X, CLAIM_LOCK, 0, OK, CLAIM_CODE, 0, 0, NULL},
    {X, CLAIM_LOCK, 0, ST(QN_EBUSY), CLAIM_REPLY, 0, 429, "busy"},
    {X, CLAIM_LOCK, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},
    {X, CLAIM_CODE, 0, OUT(.st = QN_OK, .code_status = EXCODE_USABLE), CLAIM_TEMPLATE, 0, 0, NULL},
    {X, CLAIM_CODE, 0, OUT(.st = QN_OK, .code_status = 0), CLAIM_REPLY, 0, 404, "not_found"},
    {X, CLAIM_CODE, 0, OUT(.st = QN_OK, .code_status = EXCODE_REDEEMED), CLAIM_REPLY, 0, 409,
     "used"},
    {X, CLAIM_CODE, 0, OUT(.st = QN_OK, .code_status = EXCODE_REDEEMED, .code_own = 1),
     CLAIM_CODE_OWN, 0, 0, NULL},
    {X, CLAIM_CODE, 0, OUT(.st = QN_OK, .code_status = EXCODE_ENDED), CLAIM_REPLY, 0, 409, "ended"},
    {X, CLAIM_CODE, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},
    {X, CLAIM_CODE, 0, ST(QN_EBUSY), CLAIM_REPLY, 0, 503, "error"},
    {X, CLAIM_CODE_OWN, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_GONE), CLAIM_REPLY, 0, 409,
     "used"},
    {X, CLAIM_CODE_OWN, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_OPEN), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {X, CLAIM_CODE_OWN, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},
    {X, CLAIM_TEMPLATE, 0, OK, CLAIM_TOUCH, 0, 0, NULL},
    {X, CLAIM_TEMPLATE, 0, ST(QN_ENOTFOUND), CLAIM_REPLY, 0, 404, "not_found"},
    {X, CLAIM_TEMPLATE, 0, ST(QN_EBUSY), CLAIM_REPLY, 0, 429, "busy"},
    {X, CLAIM_TEMPLATE, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},

    /* ---- the index, then the gate ---- */
    {S, CLAIM_TOUCH, 0, OK, CLAIM_GATE, 0, 0, NULL},
    {S, CLAIM_TOUCH, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, NULL},
    {S, CLAIM_TOUCH, 0, ST(QN_EAGAIN), CLAIM_REPLY, 0, 503, NULL}, /* the rebuild: paused */
    {X, CLAIM_TOUCH, 0, ST(QN_EAGAIN), CLAIM_REPLY, 0, 503, "error"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OK)), CLAIM_WRITE, 0, 0, NULL},
    {M, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OK)), CLAIM_PUBLISH, 0, 0, NULL},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OK)), CLAIM_WRITE, 0, 0, NULL},
    /* Refusals: final only on settled facts; in doubt: 429. */
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY, 0, 409, "sold_out"},
    {M, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_LIMIT_REACHED)), CLAIM_REPLY, 0, 409,
     "limit"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_NOT_ACTIVE)), CLAIM_REPLY, 0, 409, "ended"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OUTSIDE_WINDOW)), CLAIM_REPLY, 0, 409,
     "window"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_STOCK_IN_DOUBT)), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_LIMIT_IN_DOUBT)), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY, 0, 409, "sold_out"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OTHER_SHOP)), CLAIM_REPLY, 0, 404, NULL},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_OTHER_SHOP)), CLAIM_REPLY, 0, 404,
     "not_found"},
    /* The engine's copy of the template: settled by a sold out it showed, filled after a
     * refusal it could not answer, never for the user's own limit. */
    {S, CLAIM_GATE, F_MISS | F_ZERO, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY,
     E_SETTLED, 409, "sold_out"},
    {S, CLAIM_GATE, F_MISS, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY, E_FILL, 409,
     "sold_out"},
    {M, CLAIM_GATE, F_MISS, OUT(.st = QN_OK, GATE(CLAIMGATE_NOT_ACTIVE)), CLAIM_REPLY, E_FILL, 409,
     "ended"},
    {S, CLAIM_GATE, F_MISS, OUT(.st = QN_OK, GATE(CLAIMGATE_LIMIT_REACHED)), CLAIM_REPLY, 0, 409,
     "limit"},
    {S, CLAIM_GATE, F_MISS, OUT(.st = QN_OK, GATE(CLAIMGATE_LIMIT_IN_DOUBT)), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {S, CLAIM_GATE, F_MISS, OUT(.st = QN_OK, GATE(CLAIMGATE_OTHER_SHOP)), CLAIM_REPLY, 0, 404,
     NULL},
    {S, CLAIM_GATE, F_MISS | F_ZERO, OUT(.st = QN_OK, GATE(CLAIMGATE_STOCK_IN_DOUBT)), CLAIM_REPLY,
     0, 429, "in_doubt"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY, 0, 409,
     "sold_out"}, /* a request id: the copy was not asked */
    /* A cache miss loads once. */
    /* ---- stock buckets: a dry home seeks; a final no only on the verdict ---- */
    {S, CLAIM_GATE, F_BUCKETED, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_SEEK, 0, 0, NULL},
    {M, CLAIM_GATE, F_BUCKETED, OUT(.st = QN_OK, GATE(CLAIMGATE_STOCK_IN_DOUBT)), CLAIM_SEEK, 0, 0,
     NULL},
    {X, CLAIM_GATE, F_BUCKETED, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_SEEK, 0, 0, NULL},
    {S, CLAIM_GATE, F_BUCKETED | F_SEEKS, OUT(.st = QN_OK, GATE(CLAIMGATE_SOLD_OUT)), CLAIM_REPLY,
     0, 429, "in_doubt"},
    {S, CLAIM_GATE, F_BUCKETED, OUT(.st = QN_OK, GATE(CLAIMGATE_LIMIT_REACHED)), CLAIM_REPLY, 0,
     409, "limit"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_WRONG_BUCKETS)), CLAIM_TOUCH, 0, 0, NULL},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_WRONG_BUCKETS)), CLAIM_TOUCH, 0, 0, NULL},
    {S, CLAIM_GATE, F_REROUTED, OUT(.st = QN_OK, GATE(CLAIMGATE_WRONG_BUCKETS)), CLAIM_REPLY, 0,
     503, NULL},
    {X, CLAIM_GATE, F_REROUTED, OUT(.st = QN_OK, GATE(CLAIMGATE_WRONG_BUCKETS)), CLAIM_REPLY, 0,
     503, "error"},
    {S, CLAIM_SEEK, F_BUCKETED, OUT(.st = QN_OK, .verdict = BUCKET_HAS_STOCK), CLAIM_GATE, 0, 0,
     NULL},
    {S, CLAIM_SEEK, F_BUCKETED | F_MISS | F_ZERO, OUT(.st = QN_OK, .verdict = BUCKET_SOLD_OUT),
     CLAIM_REPLY, E_SETTLED, 409, "sold_out"},
    {M, CLAIM_SEEK, F_BUCKETED, OUT(.st = QN_OK, .verdict = BUCKET_SOLD_OUT), CLAIM_REPLY, 0, 409,
     "sold_out"},
    {X, CLAIM_SEEK, F_BUCKETED, OUT(.st = QN_OK, .verdict = BUCKET_SOLD_OUT), CLAIM_REPLY, 0, 409,
     "sold_out"},
    {S, CLAIM_SEEK, F_BUCKETED, OUT(.st = QN_OK, .verdict = BUCKET_IN_DOUBT), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {M, CLAIM_SEEK, F_BUCKETED, OUT(.st = QN_ERR, .verdict = BUCKET_SOLD_OUT), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_CACHE_MISS)), CLAIM_LOAD, 0, 0, NULL},
    {S, CLAIM_GATE, F_RELOADED, OUT(.st = QN_OK, GATE(CLAIMGATE_CACHE_MISS)), CLAIM_REPLY, 0, 503,
     NULL},
    {X, CLAIM_GATE, F_RELOADED, OUT(.st = QN_OK, GATE(CLAIMGATE_CACHE_MISS)), CLAIM_REPLY, 0, 503,
     "error"},
    /* A repeated request id. */
    {S, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_REPEATED)), CLAIM_LOOKUP, 0, 0, NULL},
    {M, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_REPEATED)), CLAIM_RECORD, 0, 0, NULL},
    {X, CLAIM_GATE, 0, OUT(.st = QN_OK, GATE(CLAIMGATE_REPEATED)), CLAIM_RECORD, 0, 0, NULL},
    /* No answer, or one that cannot be read: a reservation in it goes back. */
    {S, CLAIM_GATE, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, NULL},
    {X, CLAIM_GATE, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},
    {S, CLAIM_GATE, 0, ST(QN_EINVAL), CLAIM_REPLY, 0, 500, NULL},
    {S, CLAIM_GATE, 0, OUT(.st = QN_EINVAL, .gate = {.reserved = 1}), CLAIM_UNDO, 0, 500, "error"},
    {X, CLAIM_GATE, 0, OUT(.st = QN_EINVAL, .gate = {.reserved = 1}), CLAIM_UNDO, 0, 503, "error"},

    /* ---- the template loaded after a miss ---- */
    {S, CLAIM_LOAD, F_RELOADED, OK, CLAIM_GATE, 0, 0, NULL},
    {X, CLAIM_LOAD, F_RELOADED, OK, CLAIM_TOUCH, 0, 0, NULL},
    {M, CLAIM_LOAD, F_RELOADED, ST(QN_ENOTFOUND), CLAIM_REPLY, 0, 404, NULL},
    {S, CLAIM_LOAD, F_RELOADED, ST(QN_EBUSY), CLAIM_REPLY, 0, 429, NULL},
    {S, CLAIM_LOAD, F_RELOADED, ST(QN_ERR), CLAIM_REPLY, 0, 503, NULL},

    /* ---- a repeated request id ---- */
    {M, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_QUEUED, .orphaned = 1),
     CLAIM_REPLY, E_OK, 0, NULL},
    {M, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_OPEN), CLAIM_REPLY, E_OK, 0, NULL},
    {M, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_GONE, .orphaned = 1), CLAIM_REPLY,
     E_OK, 0, NULL},
    {M, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_OPEN, .orphaned = 1),
     CLAIM_TAKEOVER, 0, 0, NULL},
    {M, CLAIM_RECORD, F_TOOK, OUT(.st = QN_OK, .record = CLAIM_RECORD_OPEN, .orphaned = 1),
     CLAIM_REPLY, E_OK, 0, NULL},
    {M, CLAIM_RECORD, 0, OUT(.st = QN_ERR, .record = CLAIM_RECORD_OPEN, .orphaned = 1), CLAIM_REPLY,
     E_OK, 0, NULL},
    {X, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_GONE), CLAIM_WRITE, 0, 0, NULL},
    {X, CLAIM_RECORD, 0, OUT(.st = QN_OK, .record = CLAIM_RECORD_OPEN), CLAIM_REPLY, 0, 429,
     "in_doubt"},
    {X, CLAIM_RECORD, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, "error"},
    {S, CLAIM_LOOKUP, 0, OK, CLAIM_REPLY, E_OK, 0, NULL},
    {S, CLAIM_LOOKUP, 0, ST(QN_ENOTFOUND), CLAIM_REPLY, 0, 429, NULL},
    {S, CLAIM_LOOKUP, 0, OUT(.st = QN_ENOTFOUND, .orphaned = 1), CLAIM_TAKEOVER, 0, 0, NULL},
    {S, CLAIM_LOOKUP, F_TOOK, OUT(.st = QN_ENOTFOUND, .orphaned = 1), CLAIM_REPLY, 0, 429, NULL},
    {S, CLAIM_LOOKUP, 0, ST(QN_ERR), CLAIM_REPLY, 0, 503, NULL},
    {S, CLAIM_TAKEOVER, F_TOOK, DB(CLAIMDB_VOID), CLAIM_TAKE_BACK, 0, 0, NULL},
    {S, CLAIM_TAKEOVER, F_TOOK, DB(CLAIMDB_PENDING), CLAIM_LOOKUP, 0, 0, NULL},
    {M, CLAIM_TAKEOVER, F_TOOK, DB(CLAIMDB_PENDING), CLAIM_REPLY, E_OK, 0, NULL},
    {M, CLAIM_TAKEOVER, F_TOOK, ST(QN_ERR), CLAIM_REPLY, 0, 429, NULL},
    {S, CLAIM_TAKE_BACK, F_TOOK, OK, CLAIM_GATE, 0, 0, NULL},
    {S, CLAIM_TAKE_BACK, F_TOOK, ST(QN_ERR), CLAIM_REPLY, 0, 503, NULL},

    /* ---- /redeem's database steps ---- */
    {S, CLAIM_WRITE, 0, DB(CLAIMDB_NEW), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {S, CLAIM_WRITE, 0, DB(CLAIMDB_DUP), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {S, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_STOCK), CLAIM_UNDO, 0, 409, "error"},
    {S, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_SLOT), CLAIM_UNDO, 0, 409, "error"},
    {S, CLAIM_WRITE, 0, DB(CLAIMDB_VOID), CLAIM_REPLY, 0, 503, "error"},
    {S, CLAIM_WRITE, F_TWO, DB(CLAIMDB_PENDING), CLAIM_COUPON, 0, 0, NULL},
    {S, CLAIM_WRITE, F_TWO, DB(CLAIMDB_REFUSED_STOCK), CLAIM_UNDO, 0, 409, "error"},
    {S, CLAIM_WRITE, 0, ST(QN_EUNKNOWN), CLAIM_RESOLVE, 0, 0, NULL},
    {S, CLAIM_WRITE, 0, ST(QN_ERR), CLAIM_UNDO, 0, 503, "error"},
    {S, CLAIM_WRITE, 0, ST(QN_EBUSY), CLAIM_UNDO, 0, 503, "error"},
    {S, CLAIM_WRITE, 0, OUT(.st = QN_ERR, .no_id = 1), CLAIM_UNDO, 0, 503, "error"},
    {S, CLAIM_COUPON, F_TWO, DB(CLAIMDB_NEW), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {S, CLAIM_COUPON, F_TWO, DB(CLAIMDB_DUP), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {S, CLAIM_COUPON, F_TWO, DB(CLAIMDB_REFUSED_SLOT), CLAIM_GIVE_BACK, 0, 0, NULL},
    {S, CLAIM_COUPON, F_TWO, ST(QN_ERR), CLAIM_GIVE_BACK, E_FAILED, 0, NULL},
    {S, CLAIM_COUPON, F_TWO, ST(QN_EBUSY), CLAIM_GIVE_BACK, E_FAILED, 0, NULL},
    {S, CLAIM_COUPON, F_TWO, ST(QN_EUNKNOWN), CLAIM_DOUBT, 0, 503, "error"},
    {S, CLAIM_GIVE_BACK, F_TWO, DB(CLAIMDB_FAILED), CLAIM_UNDO, 0, 503, "error"},
    {S, CLAIM_GIVE_BACK, F_TWO, DB(CLAIMDB_REFUSED_SLOT), CLAIM_UNDO, 0, 409, "error"},
    {S, CLAIM_GIVE_BACK, F_TWO, ST(QN_ERR), CLAIM_DOUBT, 0, 503, "error"},
    {S, CLAIM_RESOLVE, 0, DB(CLAIMDB_VOID), CLAIM_UNDO, 0, 503, "error"},
    {S, CLAIM_RESOLVE, 0, DB(CLAIMDB_PENDING), CLAIM_WALLET, E_OK | E_END | E_NEW, 0, "success"},
    {S, CLAIM_RESOLVE, F_TWO, DB(CLAIMDB_PENDING), CLAIM_COUPON, 0, 0, NULL},
    {S, CLAIM_RESOLVE, 0, ST(QN_ERR), CLAIM_DOUBT, 0, 503, "error"},

    /* ---- /redeem-mq's publish ---- */
    {M, CLAIM_PUBLISH, F_MARKED, OUT(.st = QN_OK, .queued = 1), CLAIM_REPLY, E_OK | E_QUEUED, 0,
     "success"},
    {M, CLAIM_PUBLISH, F_MARKED, OUT(.st = QN_ERR, .queued = 0), CLAIM_UNDO, E_UNMARK, 503,
     "error"},
    {M, CLAIM_PUBLISH, 0, OUT(.st = QN_ERR, .queued = 0), CLAIM_UNDO, 0, 503, "error"},
    {M, CLAIM_PUBLISH, F_MARKED, OUT(.st = QN_ERR, .queued = 1), CLAIM_RESOLVE, 0, 0, NULL},
    {M, CLAIM_PUBLISH, F_MARKED, OUT(.st = QN_EUNKNOWN, .queued = 1), CLAIM_RESOLVE, 0, 0, NULL},
    {M, CLAIM_PUBLISH, 0, OUT(.st = QN_ERR, .no_id = 1), CLAIM_UNDO, 0, 503, "error"},
    {M, CLAIM_RESOLVE, F_MARKED, DB(CLAIMDB_VOID), CLAIM_UNDO, E_UNMARK, 503, "error"},
    {M, CLAIM_RESOLVE, F_MARKED, DB(CLAIMDB_PENDING), CLAIM_REPLY, E_OK | E_END, 0, "success"},
    {M, CLAIM_RESOLVE, F_MARKED, ST(QN_ERR), CLAIM_DOUBT, 0, 503, "error"},

    /* ---- /exchange's database step ---- */
    {X, CLAIM_WRITE, 0, DB(CLAIMDB_NEW), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {X, CLAIM_WRITE, 0, OUT(.st = QN_OK, .db = CLAIMDB_PENDING, .code_used = 1), CLAIM_UNDO, 0, 409,
     "used"},
    {X, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_STOCK), CLAIM_UNDO, 0, 409, "sold_out"},
    {X, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_SLOT), CLAIM_UNDO, 0, 409, "limit"},
    {X, CLAIM_WRITE, 0, DB(CLAIMDB_VOID), CLAIM_REPLY, 0, 503, "error"},
    {X, CLAIM_WRITE, 0, ST(QN_EUNKNOWN), CLAIM_DOUBT, 0, 503, "error"},
    {X, CLAIM_WRITE, 0, ST(QN_ERR), CLAIM_UNDO, 0, 503, "error"},
    {X, CLAIM_WRITE, 0, ST(QN_EBUSY), CLAIM_UNDO, 0, 503, "error"},

    /* ---- the consumer's claims: what each batch does in Redis ---- */
    {D, CLAIM_WRITE, 0, DB(CLAIMDB_NEW), CLAIM_WALLET, E_OK | E_END | E_UNMARK, 0, "success"},
    {D, CLAIM_WRITE, F_UNUSED, DB(CLAIMDB_DUP), CLAIM_WALLET, E_OK | E_END | E_UNMARK, 0,
     "success"},
    {D, CLAIM_WRITE, 0, DB(CLAIMDB_DUP), CLAIM_REPLY, E_OK | E_END | E_UNMARK, 0, "success"},
    {D, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_STOCK), CLAIM_UNDO, E_UNMARK, 409, "error"},
    {D, CLAIM_WRITE, 0, DB(CLAIMDB_REFUSED_SLOT), CLAIM_UNDO, E_UNMARK, 409, "error"},
    {D, CLAIM_WRITE, 0, DB(CLAIMDB_VOID), CLAIM_REPLY, 0, 503, NULL},
    {D, CLAIM_WRITE, F_CHECK, DB(CLAIMDB_NEW), CLAIM_WALLET, E_OK | E_END, 0, "success"},
    {D, CLAIM_WRITE, F_CHECK, DB(CLAIMDB_FAILED), CLAIM_REPLY, 0, 503, NULL},
    {D, CLAIM_WRITE, F_CHECK | F_EXCHANGE, DB(CLAIMDB_FAILED), CLAIM_REPLY, E_RELEASE, 503, NULL},
    {D, CLAIM_WRITE, F_CHECK | F_EXCHANGE, DB(CLAIMDB_DUP), CLAIM_REPLY, E_OK | E_END, 0,
     "success"},

    /* ---- the ends ---- */
    {S, CLAIM_UNDO, 0, OK, CLAIM_REPLY, 0, 0, NULL},
    {S, CLAIM_WALLET, 0, ST(QN_ERR), CLAIM_REPLY, 0, 0, NULL}, /* the outbox event adds it */
    {X, CLAIM_DOUBT, 0, OK, CLAIM_REPLY, 0, 0, NULL},
    {M, CLAIM_REPLY, 0, OK, CLAIM_DONE, 0, 0, NULL},
};

static void course_of(claim_course *c, int kind, claim_step step, unsigned facts)
{
    claimstep_begin(c, (claim_kind)kind);
    c->step = step;
    c->two_dbs = !!(facts & F_TWO);
    c->reloaded = !!(facts & F_RELOADED);
    c->took_over = !!(facts & F_TOOK);
    c->local_miss = !!(facts & F_MISS);
    c->local_zero = !!(facts & F_ZERO);
    c->marked = !!(facts & F_MARKED);
    c->check = !!(facts & F_CHECK);
    c->coupon_unused = !!(facts & F_UNUSED);
    c->exchange = !!(facts & F_EXCHANGE);
    c->bucketed = !!(facts & F_BUCKETED);
    c->seeks = facts & F_SEEKS ? CLAIM_SEEKS_MAX : 0;
    c->rerouted = !!(facts & F_REROUTED);
}

static unsigned effects_of(const claim_course *c)
{
    return (c->ok ? E_OK : 0) | (c->copy_settled ? E_SETTLED : 0) | (c->copy_fill ? E_FILL : 0) |
           (c->end_record ? E_END : 0) | (c->mark_queued ? E_QUEUED : 0) |
           (c->unmark ? E_UNMARK : 0) | (c->release_code ? E_RELEASE : 0) |
           (c->item_set && c->item_to == CLAIMDB_FAILED ? E_FAILED : 0) |
           (c->item_set && c->item_to == CLAIMDB_NEW ? E_NEW : 0);
}

static void test_table(void)
{
    static const char *const kinds[] = {"sync", "mq", "exchange", "drain"};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const tcase *t = &cases[i];
        claim_course c;
        course_of(&c, t->kind, t->step, t->facts);
        claimstep_next(&c, &t->o);
        int status = c.step == CLAIM_REPLY || c.step == CLAIM_UNDO || c.step == CLAIM_DOUBT ||
                             c.step == CLAIM_WALLET
                         ? (c.ok ? 0 : errcode_of(c.err)->status)
                         : 0;
        /* the steps that only carry an answer decided earlier have none of their own */
        if (t->step == CLAIM_UNDO || t->step == CLAIM_WALLET || t->step == CLAIM_DOUBT ||
            t->step == CLAIM_REPLY)
            status = 0;
        int bad = c.step != t->want || effects_of(&c) != t->expect || status != t->status ||
                  (t->label ? !c.label || strcmp(c.label, t->label) : c.label != NULL);
        if (bad)
            printf("  case %zu (%s %s): got %s effects %#x status %d label %s; want %s effects "
                   "%#x status %d label %s\n",
                   i, kinds[t->kind], claimstep_name(t->step), claimstep_name(c.step),
                   effects_of(&c), status, c.label ? c.label : "-", claimstep_name(t->want),
                   t->expect, t->status, t->label ? t->label : "-");
        CHECK(!bad);
    }
}

/* The outcomes tried against every step below. */
static const qn_status statuses[] = {QN_OK,        QN_ERR,    QN_EUNKNOWN, QN_EBUSY,
                                     QN_ENOTFOUND, QN_EAGAIN, QN_EINVAL};

static int final_no(const claim_course *c)
{
    return !c->ok && errcode_of(c->err)->status == 409;
}

/* Steps at which the claim holds a reservation in Redis (the gate said OK). */
static int holds_reservation(int kind, claim_step s)
{
    if (kind == D)
        return 0;
    return s == CLAIM_WRITE || s == CLAIM_COUPON || s == CLAIM_GIVE_BACK || s == CLAIM_RESOLVE ||
           s == CLAIM_PUBLISH;
}

/* Every step, every kind, every outcome of the list: a valid next step; a 409 only on a settled
 * refusal; a reservation given back (UNDO) never when its write may have committed, and not
 * left behind when nothing of it was written. */
static void test_every_outcome(void)
{
    int checked = 0;
    for (int kind = S; kind <= D; kind++)
        for (int step = 0; step < CLAIM_STEPS; step++)
            for (size_t si = 0; si < sizeof(statuses) / sizeof(statuses[0]); si++)
                for (int db = 0; db < CLAIMDB_STATES; db++)
                    for (int code = 0; code < CLAIMGATE_RESULTS; code++)
                        for (int rec = 0; rec <= CLAIM_RECORD_QUEUED; rec++)
                            for (int bits = 0; bits < 16; bits++) {
                                claim_course c;
                                course_of(&c, kind, (claim_step)step,
                                          (bits & 1 ? F_TWO : 0) | (bits & 2 ? F_MARKED : 0) |
                                              (bits & 8 ? F_BUCKETED : 0));
                                claim_outcome o = {.st = statuses[si],
                                                   .db = (claimdb_state)db,
                                                   .record = (claim_record)rec,
                                                   .orphaned = !!(bits & 4),
                                                   .queued = 1,
                                                   .code_status = 1};
                                o.gate.code = (claimgate_result)code;
                                o.gate.reserved = code == CLAIMGATE_OK;
                                claimstep_next(&c, &o);
                                checked++;
                                CHECK((unsigned)c.step < CLAIM_STEPS);
                                if (kind == D)
                                    continue;
                                /* a final no names a settled fact */
                                if (final_no(&c) && c.step == CLAIM_REPLY)
                                    CHECK((step == CLAIM_GATE && o.st == QN_OK &&
                                           code != CLAIMGATE_STOCK_IN_DOUBT &&
                                           code != CLAIMGATE_LIMIT_IN_DOUBT &&
                                           !(bits & 8 && code == CLAIMGATE_SOLD_OUT)) ||
                                          (step == CLAIM_SEEK && o.st == QN_OK &&
                                           o.verdict == BUCKET_SOLD_OUT) ||
                                          step == CLAIM_CODE || step == CLAIM_CODE_OWN);
                                if (!holds_reservation(kind, (claim_step)step))
                                    continue;
                                /* what may have committed is never given back here */
                                if (o.st == QN_EUNKNOWN)
                                    CHECK(c.step != CLAIM_UNDO);
                                /* an error leaves through the give-back, the doubt, or a void
                                 * attempt (given back by whoever gave it up) */
                                if ((c.step == CLAIM_REPLY || c.step == CLAIM_DONE) && !c.ok)
                                    CHECK(o.st == QN_OK && o.db == CLAIMDB_VOID);
                            }
    CHECK(checked > 100000);
}

/* From its first step, along outcomes that keep it going, every kind reaches its answer in a
 * bounded number of steps (no decision sends a claim round in a circle). */
static void test_terminates(void)
{
    for (int kind = S; kind <= X; kind++)
        for (unsigned walk = 1; walk < 4000; walk++) {
            claim_course c;
            unsigned r = walk;
            claimstep_begin(&c, (claim_kind)kind);
            c.two_dbs = walk & 1;
            c.bucketed = (walk >> 1) & 1;
            int n = 0;
            while (c.step != CLAIM_DONE && n < 64) {
                r = r * 1103515245u + 12345u;
                claim_outcome o = {.st = statuses[(r >> 8) % 3],
                                   .db = (claimdb_state)((r >> 12) % CLAIMDB_STATES),
                                   .record = (claim_record)((r >> 16) % 3),
                                   .orphaned = (r >> 20) & 1,
                                   .queued = 1,
                                   .code_status = 1};
                o.gate.code = (claimgate_result)((r >> 22) % CLAIMGATE_RESULTS);
                claimstep_next(&c, &o);
                n++;
            }
            if (c.step != CLAIM_DONE)
                printf("  kind %d walk %u stuck at %s\n", kind, walk, claimstep_name(c.step));
            CHECK(c.step == CLAIM_DONE);
        }
}

static void test_names(void)
{
    CHECK_EQ_STR(claimstep_name(CLAIM_GATE), "GATE");
    CHECK_EQ_STR(claimstep_name(CLAIM_DONE), "DONE");
    CHECK_EQ_STR(claimstep_name(CLAIM_STEPS), "unknown");
}

int main(void)
{
    RUN(test_table);
    RUN(test_every_outcome);
    RUN(test_terminates);
    RUN(test_names);
    TEST_MAIN_END();
}
