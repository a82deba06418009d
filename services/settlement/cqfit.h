/*
 * What coupon-query decides, without I/O (coupon_query.h does the reading and the writing):
 * the order a request describes, whether each of the user's templates fits it and what it
 * saves, which coupons the answer lists, and in which order.
 *
 *   the order      orderAmount (money, 0 .. DISCOUNT_MAX_CENTS), shopNumber (>= 0) and the
 *                  optional goodsList (discount_read_goods): a 400 names the field.
 *   a template     not available with reason "template ended" when terminated or past its end
 *                  (tpl_ended), else discount_apply's verdict: available saving its discount, or
 *                  not with discount_reason_str's reason. All coupons of a template read alike.
 *   the coupons    those whose own end has passed (since they were read) are left out, and so
 *                  are those whose template was found nowhere; the others are listed as their
 *                  template's verdict says.
 *   sorting        the rows come in cqfit_cmp's order (ending first, then by id); not-available
 *                  ones keep it; available ones are sorted by the amount saved, largest first,
 *                  and keep it among equal amounts.
 *   kept rows      a user's rows are kept between requests until their wallet changes; a list
 *                  cut at its limit only until its first coupon ends (the next one would appear
 *                  then): cqfit_kept_until.
 */
#ifndef QUAN_CQFIT_H
#define QUAN_CQFIT_H

#include <stddef.h>
#include <stdint.h>

#include "discount.h"
#include "jsonin.h"
#include "status.h"
#include "template.h"

#define CQFIT_TEMPLATE_ENDED "template ended"

/* One of the user's unused coupons as the decisions see it. */
typedef struct cqfit_coupon {
    int64_t id, tpl_id, valid_end_ms;
    uint32_t k; /* its template: an index into the request's verdicts */
} cqfit_coupon;

/* What one template's coupons are in an answer. */
typedef struct cqfit_verdict {
    int found;            /* 0: the template exists nowhere; its coupons are left out */
    const char *reason;   /* NULL: available; else a fixed phrase */
    int64_t amount_cents; /* available: what it saves; else 0 */
    size_t rank;          /* available: among the answer's distinct amounts, largest first */
} cqfit_verdict;

/* Reads the request's order from body into *o; *goods (owned by the caller: free; NULL when the
 * list is absent or empty) holds its goods, which o->goods points to, with goods_number borrowed
 * from body. QN_EINVAL (or QN_ENOMEM) with err naming the field. */
qn_status cqfit_read_order(const cJSON *body, discount_order *o, discount_goods **goods,
                           jsonin_err *err) QN_MUSTCHECK;

/* The verdict of template t (r its rule, discount_rule_from_tpl) on order o at now_ms. */
void cqfit_judge(const tpl *t, const discount_rule *r, const discount_order *o, int64_t now_ms,
                 cqfit_verdict *v);

/* qsort's comparison of cqfit_coupon: ending first, then by id. */
int cqfit_cmp(const void *a, const void *b);

/* Until when n rows read with LIMIT limit stay the user's whole list: for ever (INT64_MAX)
 * unless the list was cut, else until the first of them ends. */
int64_t cqfit_kept_until(const cqfit_coupon *c, size_t n, size_t limit);

/* Bytes of the scratch cqfit_order needs for ntpl templates (aligned for int64_t). */
size_t cqfit_scratch_size(size_t ntpl);

/* The answer's two lists, as indexes into c[0..n) (in cqfit_cmp's order; c[i].k < ntpl):
 * ok[0..*nok) the available coupons, no[0..*nno) the others (each has room for n), left out
 * the coupons ended by now_ms and those of a template not found. Sets the rank of each
 * available verdict. A counting sort over the distinct amounts (one per template at most):
 * O(n + ntpl log ntpl), stable, no allocation. */
void cqfit_order(const cqfit_coupon *c, size_t n, cqfit_verdict *vd, size_t ntpl, int64_t now_ms,
                 void *scratch, size_t *ok, size_t *nok, size_t *no, size_t *nno);

#endif
