/* merchant-admin's codes module: /coupon-template/exchange-code/... (batches, their export), the
 * codes.generate consumer; its settings: the codes' HMAC key. */
#ifndef QUAN_MADMIN_CODES_H
#define QUAN_MADMIN_CODES_H

#include "service.h"

extern const service_module codes_module;

#endif
