/*
 * An outbox relay in a process of its own, for test_outbox's crash test (the test SIGKILLs it).
 *   helper_outbox_relay BATCH
 * Reads QUAN_DS0_DSN and QUAN_AMQP_URL; relays ds_0 until SIGTERM or SIGINT.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "outbox.h"

int main(int argc, char **argv)
{
    const char *dsn = getenv("QUAN_DS0_DSN"), *url = getenv("QUAN_AMQP_URL");
    outbox_relay_opts o = {0};
    outbox_relay *r;
    sigset_t set;
    int sig = 0;

    if (argc != 2 || !dsn || !url) {
        fprintf(stderr, "usage: QUAN_DS0_DSN=... QUAN_AMQP_URL=... %s BATCH\n", argv[0]);
        return 2;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* before the relay thread inherits the mask */
    o.dsn = dsn;
    o.ds = "ds_0";
    o.amqp_url = url;
    o.batch = atoi(argv[1]);
    o.poll_ms = 50;
    if (!(r = outbox_relay_start(&o)))
        return 1;
    sigwait(&set, &sig);
    outbox_relay_stop(r);
    return 0;
}
