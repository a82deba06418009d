/*
 * Every event name, once: the routing keys of the topic exchange quan.events. Producers name
 * an event here when they write it to the outbox or publish it; consumers bind their queues to
 * it in their module descriptor. docs/events.md says who produces and consumes each.
 */
#ifndef QUAN_EVENTS_H
#define QUAN_EVENTS_H

#define EVENT_TEMPLATE_ENDED  "template.ended"  /* a template reached its end time */
#define EVENT_TASK_SCHEDULE   "task.schedule"   /* a scheduled distribution task is due */
#define EVENT_TASK_EXECUTE    "task.execute"    /* run a distribution task */
#define EVENT_TASK_COUNT      "task.count"      /* count a task's spreadsheet rows */
#define EVENT_CODES_GENERATE  "codes.generate"  /* generate (the rest of) a code batch */
#define EVENT_COUPON_REDEEM   "coupon.redeem"   /* write an accepted claim; or check one */
#define EVENT_COUPON_EXPIRE   "coupon.expire"   /* expire one user coupon */
#define EVENT_REMIND_DUE      "remind.due"      /* a claim-window reminder is due */
#define EVENT_PAYMENT_TIMEOUT "payment.timeout" /* a coupon locked for an order times out */
#define EVENT_TASK_NOTIFY     "task.notify"     /* notify the users of a task's committed chunk */

#endif
