/*
 * quan-buckets: where a template's stock buckets live (common/coupon/bucket.h), for operators
 * and tests: the keys of each bucket and the home bucket of users, from the same functions the
 * services route by, so nothing outside C computes them again.
 *
 *   quan-buckets keys TEMPLATE N          one line a bucket: "b hash users resv"
 *   quan-buckets home N USER...           one line a user: "user b"
 *
 * Exit 2 on bad arguments.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"

static int buckets_usage(void)
{
    fprintf(stderr, "usage: quan-buckets keys TEMPLATE N | home N USER...\n");
    return 2;
}

/* A positive integer argument, or -1. */
static int64_t buckets_arg(const char *s)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    return *s && !*end && v > 0 ? (int64_t)v : -1;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "keys")) {
        int64_t tpl_id = buckets_arg(argv[2]), n = buckets_arg(argv[3]);
        if (tpl_id < 0 || n < 1 || n > BUCKET_MAX || argc != 4)
            return buckets_usage();
        for (int b = 0; b < n; b++) {
            bucket_keys k;
            bucket_keys_of(&k, tpl_id, b, (int)n);
            printf("%d %s %s %s\n", b, k.hash, k.users, k.resv);
        }
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "home")) {
        int64_t n = buckets_arg(argv[2]);
        if (n < 1 || n > BUCKET_MAX)
            return buckets_usage();
        for (int i = 3; i < argc; i++) {
            int64_t user = buckets_arg(argv[i]);
            if (user < 0)
                return buckets_usage();
            printf("%" PRId64 " %d\n", user, bucket_home(user, (int)n));
        }
        return 0;
    }
    return buckets_usage();
}
