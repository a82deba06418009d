/*
 * quan-dlq: the dead-letter queue of one consumer, for operators (reads QUAN_AMQP_URL, or the
 * file QUAN_AMQP_URL_FILE names).
 *
 *   quan-dlq list CONSUMER [MAX]     prints up to MAX (default 20) messages of
 *                                    quan.<CONSUMER>.dead without removing them: attempt,
 *                                    reason and body, one per line
 *   quan-dlq replay CONSUMER [MAX]   moves up to MAX (default all) of the messages dead when it
 *                                    starts back to quan.<CONSUMER> with x-attempt reset to 1
 *                                    (each confirmed before it leaves the dead queue; those
 *                                    that fail again stay for the next replay); prints the
 *                                    count
 *
 * CONSUMER is the name in docs/events.md, e.g. engine.redeem. Exit status 0, 1 when the
 * broker refused or could not be reached, 2 on usage errors.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "log.h"
#include "mq.h"

static void dlq_print(const char *body, size_t len, int attempt, const char *reason, void *arg)
{
    (void)arg;
    printf("attempt=%d reason=%s %.*s\n", attempt, reason && *reason ? reason : "-", (int)len,
           body);
}

static int dlq_usage(void)
{
    fprintf(stderr, "usage: quan-dlq list CONSUMER [MAX] | quan-dlq replay CONSUMER [MAX]\n");
    return 2;
}

int main(int argc, char **argv)
{
    char *url = NULL, err[512];
    int rc = 2;

    log_init("quan-dlq", LOGL_WARN);
    if (argc < 3 || argc > 4)
        return dlq_usage();
    if (config_secret("QUAN_AMQP_URL", &url, err, sizeof(err)) != QN_OK) {
        fprintf(stderr, "quan-dlq: %s\n", err);
        goto done;
    }
    if (!url) {
        fprintf(stderr, "quan-dlq: QUAN_AMQP_URL (or QUAN_AMQP_URL_FILE) is required\n");
        goto done;
    }
    char *end = NULL;
    long max = argc == 4 ? strtol(argv[3], &end, 10) : -1;
    if (argc == 4 && (!*argv[3] || *end || max < 1 || max > INT_MAX)) {
        rc = dlq_usage();
        goto done;
    }
    if (!strcmp(argv[1], "list")) {
        rc = 0;
        if (mq_dead_list(url, argv[2], max > 0 ? (int)max : 20, dlq_print, NULL) != QN_OK) {
            fprintf(stderr, "quan-dlq: cannot list quan.%s.dead\n", argv[2]);
            rc = 1;
        }
        goto done;
    }
    if (!strcmp(argv[1], "replay")) {
        int moved = 0;
        qn_status st = mq_dead_replay(url, argv[2], max > 0 ? (int)max : INT_MAX, &moved);
        printf("%d replayed\n", moved);
        rc = 0;
        if (st != QN_OK) {
            fprintf(stderr, "quan-dlq: replay stopped: %s\n", qn_status_str(st));
            rc = 1;
        }
        goto done;
    }
    rc = dlq_usage();
done:
    free(url);
    return rc;
}
