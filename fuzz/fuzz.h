/* What every fuzz target shares: PROPERTY, a check whose failure is a finding (abort, so
 * libFuzzer keeps the input), like a sanitizer report. */
#ifndef QUAN_FUZZ_H
#define QUAN_FUZZ_H

#include <stdio.h>
#include <stdlib.h>

#define PROPERTY(cond)                                                                             \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
