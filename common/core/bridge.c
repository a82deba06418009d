#include "bridge.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct bridge_item {
    bridge_fn fn;
    void *arg;
    struct bridge_item *next;
} bridge_item;

struct bridge {
    int efd;
    struct event *ev;
    pthread_mutex_t mu;
    bridge_item *head, *tail;
};

static void bridge_run_all(bridge *b)
{
    pthread_mutex_lock(&b->mu);
    bridge_item *it = b->head;
    b->head = b->tail = NULL;
    pthread_mutex_unlock(&b->mu);

    while (it) {
        bridge_item *next = it->next;
        it->fn(it->arg);
        free(it);
        it = next;
    }
}

static void bridge_on_event(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    uint64_t count;
    if (read(fd, &count, sizeof(count)) < 0) {
        /* EAGAIN: another wake-up already drained the counter; the list is what matters */
    }
    bridge_run_all(arg);
}

bridge *bridge_new(struct event_base *base)
{
    bridge *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (b->efd < 0)
        goto fail;
    pthread_mutex_init(&b->mu, NULL);
    b->ev = event_new(base, b->efd, EV_READ | EV_PERSIST, bridge_on_event, b);
    if (!b->ev || event_add(b->ev, NULL) != 0)
        goto fail;
    return b;
fail:
    if (b->ev)
        event_free(b->ev);
    if (b->efd >= 0)
        close(b->efd);
    free(b);
    return NULL;
}

void bridge_free(bridge *b)
{
    if (!b)
        return;
    bridge_run_all(b);
    event_free(b->ev);
    close(b->efd);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

qn_status bridge_post(bridge *b, bridge_fn fn, void *arg)
{
    bridge_item *it = malloc(sizeof(*it));
    if (!it)
        return QN_ENOMEM;
    it->fn = fn;
    it->arg = arg;
    it->next = NULL;

    pthread_mutex_lock(&b->mu);
    int was_empty = b->head == NULL;
    if (b->tail)
        b->tail->next = it;
    else
        b->head = it;
    b->tail = it;
    pthread_mutex_unlock(&b->mu);

    /* Only the first item wakes the loop: it takes the whole list at once, and until it has,
     * the list is not empty (a write per item cost a system call per published claim). */
    uint64_t one = 1;
    if (was_empty && write(b->efd, &one, sizeof(one)) < 0) {
        /* EAGAIN only if the counter is saturated: the loop is already woken */
    }
    return QN_OK;
}
