#include "status.h"

#include <stdarg.h>
#include <stdio.h>

const char *qn_status_str(qn_status st)
{
    switch (st) {
    case QN_OK:
        return "ok";
    case QN_ERR:
        return "error";
    case QN_EAGAIN:
        return "try again";
    case QN_ENOMEM:
        return "out of memory";
    case QN_ETIMEDOUT:
        return "timed out";
    case QN_ENOTFOUND:
        return "not found";
    case QN_EBUSY:
        return "busy";
    case QN_EINVAL:
        return "invalid";
    case QN_ECONFLICT:
        return "conflict";
    case QN_EUNKNOWN:
        return "outcome unknown";
    }
    return "unknown";
}

void qn_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
