"""Task notifications (distribution notify.c): task.notify messages written to the outbox, as the
executor writes them, and published by quan-distribution's relay to its own consumer. The
webhook gets each channel's users in batches, the SMTP sink one mail per address; a redelivered
message sends nothing twice; an unset URL counts skips; a 500 is retried without sending again
what went through, a 400 dead-lettered, and its replay sends only the rest."""

import json
import os
import random
import subprocess
import time

from engine_db import metric, queue_messages, redis, sql
from peers import SmtpSink, Webhook
from quan import BIN, Service, check, request, run, wait_for

BATCH = 2
FROM = "coupons@quan.test"
FAIL = {}  # (taskId, channel) -> statuses the webhook answers first, one per call
ALWAYS = {}  # (taskId, channel) -> the status it answers every time


def answer(body):
    k = (body["taskId"], body["channel"])
    if k in ALWAYS:
        return ALWAYS[k]
    return FAIL[k].pop(0) if FAIL.get(k) else 200


HOOK = Webhook(answer)
SMTP = SmtpSink()
CURRENT = {}  # "configured" or "bare" -> the running Service

def distribution(configured=True):
    """The running service, with the webhook and the SMTP sink configured or with neither; one
    at a time, since they consume the same queue."""
    want = "configured" if configured else "bare"
    if want not in CURRENT:
        for other in ("configured", "bare"):
            if other in CURRENT:
                CURRENT.pop(other).stop()
        env = {"QUAN_NOTIFY_WEBHOOK_URL": HOOK.url if configured else "",
               "QUAN_SMTP_URL": SMTP.url if configured else "",
               "QUAN_SMTP_FROM": FROM,
               "QUAN_NOTIFY_BATCH": str(BATCH),
               "QUAN_NOTIFY_TIMEOUT_MS": "2000",
               "QUAN_MQ_MAX_ATTEMPTS": "3"}
        CURRENT[want] = Service("distribution", env).wait_ready()
    return CURRENT[want]


def new_id():
    return str(random.randrange(1 << 50, 1 << 60))


def message(users, notify_type):
    """A task.notify message of users (dicts), as its key and data."""
    task = new_id()
    key = "task.notify:%s:%d" % (task, random.randrange(1000))
    return key, {"taskId": task, "couponTemplateId": new_id(), "shopNumber": new_id(),
                 "notifyType": notify_type, "users": users}


def publish(key, data, copies=1):
    """Writes the message to ds_0's outbox (copies rows of one key: a redelivery); the relay of
    quan-distribution publishes it."""
    payload = json.dumps(data).replace("'", "''")
    sql(0, "INSERT INTO t_outbox (topic, msg_key, payload) SELECT 'task.notify', '%s', '%s' "
           "FROM generate_series(1, %d)" % (key, payload, copies))


def user(phone=False, mail=False):
    u = {"userId": new_id()}
    if phone:
        u["phone"] = "138%08d" % random.randrange(10 ** 8)
    if mail:
        u["mail"] = "u%s@users.test" % u["userId"]
    return u


def posts(data, channel=None):
    return HOOK.received(lambda p: p["taskId"] == data["taskId"]
                         and (channel is None or p["channel"] == channel))


def mails(data):
    addrs = {"<%s>" % u["mail"] for u in data["users"] if "mail" in u}
    return SMTP.received(lambda m: set(m[1]) <= addrs)


def metrics(svc):
    return request("GET", svc.url + "/metrics")[2].decode()


def batches(data, channel):
    """The userIds (and phones) of each batch the webhook got for channel, in batch order."""
    got = sorted(posts(data, channel), key=lambda p: int(p["key"].rsplit(":", 1)[1]))
    return [(p["userIds"], p.get("phones")) for p in got]


# ---------------------------------------------------------------- tests

def test_channels_batched_and_one_mail_per_address():
    svc = distribution()
    quiet(svc)
    before = metrics(svc)
    users = [user(phone=True, mail=True), user(), user(phone=True), user(mail=True),
             user(phone=True)]
    users[4]["mail"] = "not an address"
    key, data = message(users, "0,1,2,3")
    publish(key, data)
    ids = [u["userId"] for u in users]
    check(wait_for(lambda: len(posts(data)) == 8 and len(mails(data)) == 2, 15),
          "posts %s, mails %s" % (posts(data), mails(data)))
    for channel in ("app", "popup"):
        check(batches(data, channel) == [(ids[0:2], None), (ids[2:4], None), (ids[4:5], None)],
              "%s: %s" % (channel, batches(data, channel)))
    phones = [(u["userId"], u["phone"]) for u in users if "phone" in u]
    check(batches(data, "sms") == [([phones[0][0], phones[1][0]], [phones[0][1], phones[1][1]]),
                                   ([phones[2][0]], [phones[2][1]])],
          "sms: %s" % batches(data, "sms"))
    p = posts(data, "app")[0]
    check(p["event"] == "task.notify" and p["notifyType"] == 0
          and p["couponTemplateId"] == data["couponTemplateId"]
          and p["shopNumber"] == data["shopNumber"] and p["key"].startswith(key + ":app:"),
          "body %s" % p)
    got = mails(data)
    want = ["<%s>" % users[0]["mail"], "<%s>" % users[3]["mail"]]
    check(sorted(r for m in got for r in m[1]) == sorted(want), "recipients %s" % got)
    for frm, rcpt, text in got:
        check(frm == "<%s>" % FROM and len(rcpt) == 1, "envelope %s %s" % (frm, rcpt))
        check("Subject: A coupon for you\r\n" in text and data["couponTemplateId"] in text
              and "\r\nTo: %s\r\n" % rcpt[0] in text, text)
    want = [("quan_notify_sent_total", n, {"channel": c}, "sent %s" % c)
            for c, n in (("app", 5), ("popup", 5), ("sms", 3), ("email", 2))]
    want += [("quan_notify_skipped_total", 2, {"channel": "sms", "reason": "no_address"},
              "sms skips"),
             ("quan_notify_skipped_total", 3, {"channel": "email", "reason": "no_address"},
              "mail skips")]
    seen = {}

    def grew(name, by, labels):
        return metric(seen["after"], name, **labels) - metric(before, name, **labels) == by

    def all_counted():
        seen["after"] = metrics(svc)
        return all(grew(name, by, labels) for name, by, labels, _ in want)

    # The webhook holds a post before the service has read its answer and counted it.
    wait_for(all_counted, 15)
    for name, by, labels, what in want:
        check(grew(name, by, labels), what)


def test_redelivery_sends_nothing_twice():
    distribution()
    key, data = message([user(phone=True, mail=True) for _ in range(3)], "0,2,3")
    publish(key, data, copies=2)  # two deliveries at once: the second waits for the first
    check(wait_for(lambda: len(posts(data)) == 4 and len(mails(data)) == 3, 15),
          "posts %d, mails %d" % (len(posts(data)), len(mails(data))))
    check(wait_for(lambda: redis("GET", "quan:guard:{notify}:" + key) == "1", 5),
          "guard not committed")
    check(redis("EXISTS", "quan:notify:{notify}:sent:" + key) == "0", "sent units kept")
    publish(key, data)  # and once more, later
    check(not wait_for(lambda: len(posts(data)) > 4 or len(mails(data)) > 3, 3),
          "sent again: posts %d, mails %d" % (len(posts(data)), len(mails(data))))


def quiet(svc):
    """Until no task.notify of an earlier suite is still coming, they would count here too: its
    tasks' outbox rows sent, nothing in the queue or in its .retry queue (where a delivery that
    found another's consume guard, or failed, waits out a 10 s TTL), and the sent and skip
    counters still, for longer than a quorum queue's count may lag (queue_messages)."""
    def counted():
        return sum(v for line in metrics(svc).splitlines()
                   if line.startswith(("quan_notify_sent_total", "quan_notify_skipped_total"))
                   for v in [float(line.rsplit(" ", 1)[1])])

    queues = ("quan.distribution.task-notify", "quan.distribution.task-notify.retry")
    state = {"seen": None, "since": 0.0}

    def still():
        unsent = sql(0, "SELECT count(*) FROM t_outbox WHERE topic = 'task.notify' AND "
                        "sent_at IS NULL")[0][0]
        counts = queue_messages()
        seen = (unsent, counted(), tuple(counts.get(q) for q in queues))
        if seen != state["seen"] or seen[0] != "0" or seen[2] != (0, 0):
            state["seen"], state["since"] = seen, time.time()
            return False
        return time.time() - state["since"] >= 6

    check(wait_for(still, 120), "earlier notifications drained")


def test_unset_urls_are_skipped_and_counted():
    svc = distribution(configured=False)
    quiet(svc)
    before = metrics(svc)
    users = [user(phone=True, mail=True), user(phone=True), user(mail=True)]
    key, data = message(users, "0,1,2,3")
    publish(key, data)
    check(wait_for(lambda: redis("GET", "quan:guard:{notify}:" + key) == "1", 15),
          "message not done")
    after = metrics(svc)
    for channel, reason, n in (("app", "unconfigured", 3), ("popup", "unconfigured", 3),
                               ("sms", "unconfigured", 2), ("sms", "no_address", 1),
                               ("email", "unconfigured", 2), ("email", "no_address", 1)):
        got = (metric(after, "quan_notify_skipped_total", channel=channel, reason=reason)
               - metric(before, "quan_notify_skipped_total", channel=channel, reason=reason))
        check(got == n, "skipped %s %s: %s" % (channel, reason, got))
    check(posts(data) == [] and mails(data) == [], "sent without a URL")


def test_500_retried_without_sending_again():
    svc = distribution()
    before = metrics(svc)
    users = [user(mail=True) for _ in range(3)]
    key, data = message(users, "0,1,2")
    FAIL[(data["taskId"], "popup")] = [500]
    publish(key, data)
    # first delivery: app's 2 batches and the 3 mails go, popup's first batch gets 500 (its
    # second is not tried); after QUAN_MQ_RETRY_DELAY_MS (10 s) only popup's 2 batches go
    check(wait_for(lambda: len(posts(data, "popup")) == 3, 30),
          "popup posts %s" % posts(data, "popup"))
    check(wait_for(lambda: redis("GET", "quan:guard:{notify}:" + key) == "1", 5),
          "guard not committed")
    check(len(posts(data, "app")) == 2, "app posts %d" % len(posts(data, "app")))
    check(len(mails(data)) == 3, "mails %d" % len(mails(data)))
    ids = [u["userId"] for u in users]
    check(batches(data, "popup") == [(ids[0:2], None), (ids[0:2], None), (ids[2:3], None)],
          "popup batches %s" % batches(data, "popup"))
    after = metrics(svc)
    failed = (metric(after, "quan_notify_failed_total", channel="popup")
              - metric(before, "quan_notify_failed_total", channel="popup"))
    check(failed == 2, "popup failures counted: %s" % failed)


def test_400_dead_lettered_then_replay_sends_the_rest():
    distribution()
    users = [user(mail=True) for _ in range(3)]
    key, data = message(users, "0,2")
    ALWAYS[(data["taskId"], "app")] = 400
    publish(key, data)

    def dead():
        out = subprocess.run([os.path.join(BIN, "quan-dlq"), "list", "distribution.task-notify",
                              "100"], capture_output=True, text=True, timeout=30).stdout
        return key in out

    check(wait_for(dead, 15), "not dead-lettered")
    check(len(posts(data, "app")) == 1, "app tried %d times" % len(posts(data, "app")))
    check(len(mails(data)) == 3, "mails %d" % len(mails(data)))
    # the receiver is fixed: the replay sends app's two batches, and no mail again
    del ALWAYS[(data["taskId"], "app")]
    out = subprocess.run([os.path.join(BIN, "quan-dlq"), "replay", "distribution.task-notify"],
                         capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, "replay: %s" % out.stderr)
    check(wait_for(lambda: redis("GET", "quan:guard:{notify}:" + key) == "1", 15),
          "replayed message not done")
    check(len(posts(data, "app")) == 3, "app posts %d" % len(posts(data, "app")))
    check(len(mails(data)) == 3, "mails sent again: %d" % len(mails(data)))


if __name__ == "__main__":
    try:
        run([test_channels_batched_and_one_mail_per_address, test_redelivery_sends_nothing_twice,
             test_500_retried_without_sending_again,
             test_400_dead_lettered_then_replay_sends_the_rest,
             test_unset_urls_are_skipped_and_counted])
    finally:
        for s in CURRENT.values():
            s.stop()
