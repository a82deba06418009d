/* One status type for every fallible function in Quan (twemproxy's rstatus_t). */
#ifndef QUAN_STATUS_H
#define QUAN_STATUS_H

#include <stddef.h>

typedef int qn_status;

#define QN_OK        0
#define QN_ERR       -1 /* generic failure; detail is in the context object or the log */
#define QN_EAGAIN    -2 /* try again later (busy, retry) */
#define QN_ENOMEM    -3
#define QN_ETIMEDOUT -4
#define QN_ENOTFOUND -5
#define QN_EBUSY     -6 /* a bounded queue or pool is full */
#define QN_EINVAL    -7 /* invalid input */
#define QN_ECONFLICT -8 /* business conflict (duplicate, state does not allow) */
#define QN_EUNKNOWN  -9 /* the outcome is not known: a COMMIT was sent and its answer was lost */

#define QN_MUSTCHECK __attribute__((warn_unused_result))
#define QN_UNUSED    __attribute__((unused))

const char *qn_status_str(qn_status st);

/* Formats an error message into a caller's buffer (the err/errlen convention of functions that
 * explain their failure); err may be NULL or errlen 0. */
void qn_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
