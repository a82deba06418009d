/*
 * Claim-window reminders: /api/engine/coupon-template-remind/create, /list and /cancel, and
 * the consumer of remind.due that delivers them.
 *
 * State: t_coupon_template_remind (ds_0) keeps the reference's bitmap, bit = type * 12 +
 * remindTime / 5 - 1 (type 0 app, 1 e-mail; remindTime 5, 10, ..., 60, validated), changed only
 * by compare-and-set (WHERE information = old, retried). t_coupon_template_remind_timer holds,
 * per set bit, the generation (a snowflake id) of its timer: an outbox row remind.due due at
 * validStartTime - remindTime with key remind:<user>:<tpl>:<type>:<minutes>:<generation>,
 * written in the same transaction. Cancel clears the bit, deletes the timer row and the outbox
 * row if not yet sent. The consumer delivers only if the bit is set, the generation is the
 * slot's current one and it was not sent yet, so a cancelled reminder never fires (even when
 * its message was already published) and one re-created after a cancel fires once.
 * Create and cancel are refused (409 B000102) once the claim window has started.
 *
 * Delivery (notify_send.h, on the consumer thread, QUAN_REMIND_TIMEOUT_MS per attempt): type 0
 * POSTs a JSON notification to QUAN_REMIND_WEBHOOK_URL (2xx = delivered); type 1 sends a mail
 * through QUAN_SMTP_URL from QUAN_SMTP_FROM to <userId>@users.invalid (there is no user directory
 * with addresses yet; the relay or a gateway is expected to map that address). A failed attempt is
 * retried after QUAN_MQ_RETRY_DELAY_MS and dead-lettered after QUAN_MQ_MAX_ATTEMPTS; with no
 * URL configured for its type a reminder goes straight to the dead-letter queue.
 */
#ifndef QUAN_REMIND_H
#define QUAN_REMIND_H

#include <stdint.h>

#include "metrics.h"
#include "service.h"
#include "status.h"

#define REMIND_TYPES       2  /* 0 app, 1 e-mail */
#define REMIND_SLOTS       12 /* 5-minute slots per type, up to 60 minutes */
#define REMIND_SLOT_MINUTE 5

/* The bitmap bit of (type, remindTime in minutes); -1 when either is out of range or the time
 * is not a multiple of 5. */
int remind_bit(int type, int minutes);

/* The three routes, the remind.due consumer and the delivery settings. */
extern const service_module remind_module;

/* Reminder deliveries. */
#define REMIND_METRICS(X)                                                                          \
    X(quan_reminders_total, COUNTER,                                                               \
      "Reminder deliveries by type (app, email) and outcome (sent, failed, skipped, dead).",       \
      "type,outcome")
METRICS_DECLARE(REMIND_METRICS)

#endif
