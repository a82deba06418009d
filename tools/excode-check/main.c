/*
 * quan-excode-check: reads exchange codes, one per line, on stdin and prints "<code> ok" or
 * "<code> bad" for each (excode_verify with QUAN_CODE_SECRET), then "N ok, N bad" on the last
 * line. Exit status 0 if all were ok, 1 otherwise, 2 on usage errors. For tests and operators.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "excode.h"

int main(void)
{
    const char *secret = getenv("QUAN_CODE_SECRET");
    char line[256];
    long ok = 0, bad = 0;

    if (!secret || !*secret) {
        fprintf(stderr, "quan-excode-check: QUAN_CODE_SECRET is required\n");
        return 2;
    }
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0])
            continue;
        if (excode_verify(secret, line)) {
            ok++;
            printf("%s ok\n", line);
        } else {
            bad++;
            printf("%s bad\n", line);
        }
    }
    printf("%ld ok, %ld bad\n", ok, bad);
    return bad ? 1 : 0;
}
