/* merchant-admin's templates module: /coupon-template/... (create, page, find, increase stock,
 * terminate), the template.ended consumer; its settings: the bloom filter's size. */
#ifndef QUAN_MADMIN_TEMPLATES_H
#define QUAN_MADMIN_TEMPLATES_H

#include "service.h"

extern const service_module templates_module;

#endif
