/* What a claim is told for each answer of claim.lua (claim_refusal, shared by /redeem,
 * /redeem-mq and /exchange): a final "no" (409) only on a settled fact, a retryable 429 with
 * Retry-After while claims not yet settled may change the answer, and no answer at all for the
 * results that are not refusals. */
#include "../claim.h"
#include "testhelp.h"

static void test_each_result(void)
{
    static const struct {
        claimgate_result r;
        int status;          /* 0: not a refusal (claim_refusal answers NULL) */
        const char *code;    /* the envelope's code */
        const char *outcome; /* quan_claims_total's label; NULL: not counted there */
    } v[] = {
        {CLAIMGATE_OK, 0, NULL, NULL},
        {CLAIMGATE_SOLD_OUT, 409, "B000100", "sold_out"},
        {CLAIMGATE_LIMIT_REACHED, 409, "B000101", "limit"},
        {CLAIMGATE_NOT_ACTIVE, 409, "B000103", "ended"},
        {CLAIMGATE_OUTSIDE_WINDOW, 409, "B000102", "window"},
        {CLAIMGATE_CACHE_MISS, 0, NULL, NULL},
        {CLAIMGATE_OTHER_SHOP, 404, "A000404", NULL},
        {CLAIMGATE_REPEATED, 0, NULL, NULL},
        {CLAIMGATE_STOCK_IN_DOUBT, 429, "A000409", "in_doubt"},
        {CLAIMGATE_LIMIT_IN_DOUBT, 429, "A000409", "in_doubt"},
        {(claimgate_result)10, 0, NULL, NULL}, /* a code this engine does not know */
        {(claimgate_result)-1, 0, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        const claim_refused *f = claim_refusal(v[i].r);
        if (!v[i].status) {
            if (f)
                printf("  case %d\n", (int)v[i].r);
            CHECK(f == NULL);
            continue;
        }
        CHECK(f != NULL);
        if (!f)
            continue;
        const errcode_info *e = errcode_of(f->err);
        if (e->status != v[i].status)
            printf("  case %d\n", (int)v[i].r);
        CHECK_EQ_INT(e->status, v[i].status);
        CHECK_EQ_STR(e->code, v[i].code);
        CHECK(f->msg && *f->msg);
        if (v[i].outcome)
            CHECK_EQ_STR(f->outcome, v[i].outcome);
        else
            CHECK(f->outcome == NULL);
    }
}

/* Doubt is never answered as a final "no", and every final "no" names a fact the script read
 * from settled state. */
static void test_doubt_is_retryable(void)
{
    for (int r = 0; r <= CLAIMGATE_LIMIT_IN_DOUBT; r++) {
        const claim_refused *f = claim_refusal((claimgate_result)r);
        if (!f)
            continue;
        int doubt = r == CLAIMGATE_STOCK_IN_DOUBT || r == CLAIMGATE_LIMIT_IN_DOUBT;
        CHECK((errcode_of(f->err)->status == 409) ==
              (r == CLAIMGATE_SOLD_OUT || r == CLAIMGATE_LIMIT_REACHED ||
               r == CLAIMGATE_NOT_ACTIVE || r == CLAIMGATE_OUTSIDE_WINDOW));
        if (doubt)
            CHECK_EQ_INT(errcode_of(f->err)->status, 429);
    }
}

int main(void)
{
    RUN(test_each_result);
    RUN(test_doubt_is_retryable);
    TEST_MAIN_END();
}
