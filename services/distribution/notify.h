/*
 * Task notifications: the consumer of task.notify, which the executor writes to the outbox once
 * per committed chunk of a distribution task (key task.notify:<taskId>:<chunk>):
 *
 *   {"taskId","couponTemplateId","shopNumber","notifyType":"0,2",
 *    "users":[{"userId","phone","mail"}, ...]}          phone and mail absent when empty
 *
 * notifyType lists the channels: 0 in-app and 1 popup (the users' ids) and 3 SMS (their
 * phones) are POSTed to QUAN_NOTIFY_WEBHOOK_URL in batches of at most QUAN_NOTIFY_BATCH users,
 * one JSON body per batch and channel; 2 e-mail sends one mail per user with a valid address
 * through QUAN_SMTP_URL from QUAN_SMTP_FROM (notify_send.h, QUAN_NOTIFY_TIMEOUT_MS per call).
 * A channel with no URL (relay) set is skipped and counted, never an error.
 *
 * Each webhook batch and each mail is a unit. The consume guard (guard.h) lets one consumer at a
 * time work on a message, and a bitmap in Redis records each unit once sent, so a redelivery,
 * a retry or a replay from the dead-letter queue sends only what was not sent yet (both kept a
 * week). A retryable failure (notify_send.h) stops its channel for this delivery and the message
 * comes back after QUAN_MQ_RETRY_DELAY_MS; a permanent one (HTTP 4xx, SMTP 5xx) dead-letters it
 * once everything else was tried. Batches are counted under the QUAN_NOTIFY_BATCH of the time:
 * changing it between two deliveries of a message may send a batch's users again.
 *
 * Issuance never waits for any of it: a queue and consumer thread of its own, and Redis only.
 */
#ifndef QUAN_DISTRIBUTION_NOTIFY_H
#define QUAN_DISTRIBUTION_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

#include <cJSON.h>

#include "metrics.h"
#include "service.h"
#include "status.h"

#define NOTIFY_CHANNELS  4     /* 0 in-app, 1 popup, 2 e-mail, 3 SMS: notifyType's values */
#define NOTIFY_EMAIL     2     /* the channel sent by mail; the others go to the webhook */
#define NOTIFY_SMS       3     /* the webhook channel that carries phones */
#define NOTIFY_MAX_USERS 50000 /* users of one message */

/* One user of a message; the strings are borrowed from the message, NULL when absent or empty
 * (mail also when it is not an address notify_send accepts). */
typedef struct notify_user {
    int64_t user_id;
    const char *phone;
    const char *mail;
} notify_user;

/* A task.notify message's data. */
typedef struct notify_task {
    int64_t task_id, tpl_id, shop;
    unsigned channels;  /* bit c set: channel c was asked for */
    notify_user *users; /* owned: notify_task_clear */
    size_t nusers;
} notify_task;

/* Reads data into t (zeroed first); QN_EINVAL with err naming the field otherwise. */
qn_status notify_task_parse(const cJSON *data, notify_task *t, char *err,
                            size_t errlen) QN_MUSTCHECK;
void notify_task_clear(notify_task *t);

/* "app", "popup", "email", "sms". */
const char *notify_channel_name(int channel);

/* The users channel reaches (all for 0 and 1, those with a phone for 3, with a mail for 2), as
 * indexes into t->users, in order, into idx (room for t->nusers); their count. */
size_t notify_recipients(const notify_task *t, int channel, size_t *idx);

/* The webhook body of one batch: the users idx[0..n) of channel (0, 1 or 3) of t; key is the
 * batch's own (the message key, channel and batch number), for the receiver to drop a batch it
 * already has. Owned (free); NULL when out of memory. */
char *notify_batch_json(const notify_task *t, int channel, const char *key, const size_t *idx,
                        size_t n);

/* A message's units (a webhook batch, a mail) are numbered channel * nusers + i, i the batch
 * number, or the user's index for mail: stable across deliveries of one message. */
uint64_t notify_unit(int channel, size_t nusers, size_t i);
/* 1 if unit is recorded in sent[0..nsent), the bitmap SETBIT writes (unit 0: the first byte's
 * highest bit); a unit past its end is not. */
int notify_unit_sent(const char *sent, size_t nsent, uint64_t unit);
/* Webhook batch b of n recipients in batches of batch: its first recipient (*first) and its
 * size; 0 past the last batch. */
size_t notify_batch_span(size_t n, size_t batch, size_t b, size_t *first);

/* The task.notify consumer (queue distribution.task-notify) and its settings. */
extern const service_module notify_module;

/* The notifications, in users, by channel. */
#define NOTIFY_METRICS(X)                                                                          \
    X(quan_notify_sent_total, COUNTER,                                                             \
      "Task notifications sent, in users, by channel (app, popup, email, sms).", "channel")        \
    X(quan_notify_failed_total, COUNTER,                                                           \
      "Task notifications whose attempt failed (retried or dead-lettered), in users, by channel.", \
      "channel")                                                                                   \
    X(quan_notify_skipped_total, COUNTER,                                                          \
      "Task notifications not sent, in users, by channel and reason (unconfigured: no URL or "     \
      "relay set; no_address: the user has no phone or valid mail address).",                      \
      "channel,reason")
METRICS_DECLARE(NOTIFY_METRICS)

#endif
