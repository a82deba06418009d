/*
 * quan-excode-check: reads exchange codes, one per line, on stdin and prints "<code> ok" or
 * "<code> bad" for each (excode_verify with QUAN_CODE_SECRET, or the file QUAN_CODE_SECRET_FILE
 * names), then "N ok, N bad" on the last line. Exit status 0 if all were ok, 1 otherwise, 2 on
 * usage errors. For tests and operators.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "excode.h"

int main(void)
{
    char line[256], err[512], *secret = NULL;
    long ok = 0, bad = 0;

    if (config_secret("QUAN_CODE_SECRET", &secret, err, sizeof(err)) != QN_OK) {
        fprintf(stderr, "quan-excode-check: %s\n", err);
        return 2;
    }
    if (!secret) {
        fprintf(stderr, "quan-excode-check: QUAN_CODE_SECRET (or QUAN_CODE_SECRET_FILE) is "
                        "required\n");
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
    free(secret);
    return bad ? 1 : 0;
}
