"""Claim-window reminders (engine remind.c): create, list, cancel with the reference's bitmap,
delivery through a local webhook receiver (type 0) and a local SMTP sink (type 1), cancel never
fires, re-create fires once, failed deliveries retried and then dead-lettered."""

import json
import random
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from engine_db import insert_template, metric, new_id, queue_messages, sql
from quan import Service, check, request, run, wait_for

START_LEAD_S = 5 * 60 + 3  # template starts 5 min + 3 s ahead: a 5-minute reminder fires in ~3 s


# ---------------------------------------------------------------- local receivers

class Webhook:
    """Records JSON POSTs; answers 500 to the first fail_first[tpl] posts of a template, and
    always to templates in fail_always."""

    def __init__(self):
        self.posts = []
        self.fail_first = {}
        self.fail_always = set()
        self.lock = threading.Lock()
        hook = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                tpl = int(body["couponTemplateId"])
                with hook.lock:
                    hook.posts.append(body)
                    fail = tpl in hook.fail_always or hook.fail_first.get(tpl, 0) > 0
                    if hook.fail_first.get(tpl, 0) > 0:
                        hook.fail_first[tpl] -= 1
                self.send_response(500 if fail else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def for_template(self, tpl):
        with self.lock:
            return [p for p in self.posts if int(p["couponTemplateId"]) == tpl]


class SmtpSink:
    """A minimal SMTP responder: records (mail from, recipients, data) per message."""

    def __init__(self):
        self.messages = []
        sink = self

        class H(socketserver.StreamRequestHandler):
            def handle(self):
                self.wfile.write(b"220 sink ESMTP\r\n")
                frm, rcpt = None, []
                while True:
                    line = self.rfile.readline()
                    if not line:
                        return
                    cmd = line.decode(errors="replace").strip()
                    up = cmd.upper()
                    if up.startswith("EHLO") or up.startswith("HELO"):
                        self.wfile.write(b"250 sink\r\n")
                    elif up.startswith("MAIL FROM:"):
                        frm, rcpt = cmd[10:].strip(), []
                        self.wfile.write(b"250 ok\r\n")
                    elif up.startswith("RCPT TO:"):
                        rcpt.append(cmd[8:].strip())
                        self.wfile.write(b"250 ok\r\n")
                    elif up == "DATA":
                        self.wfile.write(b"354 go on\r\n")
                        data = []
                        while True:
                            dl = self.rfile.readline()
                            if not dl or dl == b".\r\n":
                                break
                            data.append(dl.decode(errors="replace"))
                        sink.messages.append((frm, rcpt, "".join(data)))
                        self.wfile.write(b"250 queued\r\n")
                    elif up == "QUIT":
                        self.wfile.write(b"221 bye\r\n")
                        return
                    else:
                        self.wfile.write(b"250 ok\r\n")

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = "smtp://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


HOOK = Webhook()
SMTP = SmtpSink()
ENGINE = None


def engine():
    global ENGINE
    if ENGINE is None:
        ENGINE = Service("engine", {"QUAN_REMIND_WEBHOOK_URL": HOOK.url,
                                    "QUAN_SMTP_URL": SMTP.url,
                                    "QUAN_SMTP_FROM": "reminders@quan.test",
                                    "QUAN_MQ_MAX_ATTEMPTS": "2",
                                    "QUAN_REMIND_TIMEOUT_MS": "2000"}).wait_ready()
    return ENGINE


def user():
    return random.randrange(1 << 40, 1 << 52)


def template(start_in_s, end_in_s=86400, shop=None):
    shop = shop or random.randrange(1 << 30, 1 << 40)
    tpl = new_id()
    now = time.time() * 1000
    insert_template(shop, tpl, now + start_in_s * 1000, now + end_in_s * 1000,
                    name="remind %d" % tpl)
    return shop, tpl


def call(path, uid, body=None, method="POST"):
    hdrs = {"X-User-Id": str(uid)} if uid else {}
    return request(method, engine().url + "/api/engine/coupon-template-remind/" + path, body,
                   hdrs)


def remind(path, uid, shop, tpl, typ, minutes):
    return call(path, uid, {"couponTemplateId": str(tpl), "shopNumber": str(shop), "type": typ,
                            "remindTime": minutes})


# ---------------------------------------------------------------- tests

def test_validation():
    shop, tpl = template(3600)
    u = user()
    cases = [({"shopNumber": str(shop), "type": 0, "remindTime": 5}, "couponTemplateId"),
             ({"couponTemplateId": str(tpl), "type": 0, "remindTime": 5}, "shopNumber"),
             ({"couponTemplateId": str(tpl), "shopNumber": str(shop), "type": 2,
               "remindTime": 5}, "type"),
             ({"couponTemplateId": str(tpl), "shopNumber": str(shop), "type": 0,
               "remindTime": 7}, "remindTime"),
             ({"couponTemplateId": str(tpl), "shopNumber": str(shop), "type": 0,
               "remindTime": 65}, "remindTime"),
             ({"couponTemplateId": str(tpl), "shopNumber": str(shop), "type": 1,
               "remindTime": 0}, "remindTime")]
    for path in ("create", "cancel"):
        for body, field in cases:
            st, _, b = call(path, u, body)
            check(st == 400 and b["code"] == "A000001" and b["message"].startswith(field),
                  "%s %s: %s %s" % (path, body, st, b))
    st, _, b = remind("create", None, shop, tpl, 0, 5)
    check(st == 401, "no identity: %s" % st)
    # another shop's template is not found
    st, _, b = remind("create", u, shop + 1, tpl, 0, 5)
    check(st == 404 and b["code"] == "A000404", "other shop: %s %s" % (st, b))
    # the claim window has started: refused
    shop2, tpl2 = template(-10)
    st, _, b = remind("create", u, shop2, tpl2, 0, 5)
    check(st == 409 and b["code"] == "B000102", "started: %s %s" % (st, b))
    st, _, b = remind("cancel", u, shop2, tpl2, 0, 5)
    check(st == 409 and b["code"] == "B000102", "cancel started: %s %s" % (st, b))
    # nothing to cancel
    st, _, b = remind("cancel", u, shop, tpl, 0, 5)
    check(st == 404, "cancel of nothing: %s %s" % (st, b))
    # nothing was stored by any of that
    rows = sql(0, "SELECT count(*) FROM t_coupon_template_remind WHERE user_id = %d" % u)
    check(rows[0][0] == "0", "rows written by refused requests")


def test_app_reminder_fires_once_and_duplicate_refused():
    shop, tpl = template(START_LEAD_S)
    u = user()
    st, _, b = remind("create", u, shop, tpl, 0, 5)
    check(st == 200 and b["success"], "create: %s %s" % (st, b))
    st, _, b = remind("create", u, shop, tpl, 0, 5)
    check(st == 409, "duplicate create: %s %s" % (st, b))
    bits = sql(0, "SELECT information FROM t_coupon_template_remind WHERE user_id = %d AND "
                  "coupon_template_id = %d" % (u, tpl))
    check(bits == [["1"]], "bitmap: %s" % bits)  # type 0, 5 minutes: bit 0
    check(HOOK.for_template(tpl) == [], "fired early")
    check(wait_for(lambda: HOOK.for_template(tpl), 15), "webhook never called")
    p = HOOK.for_template(tpl)[0]
    check(p["userId"] == str(u) and p["shopNumber"] == str(shop) and p["remindTime"] == 5
          and p["type"] == 0 and p["name"] == "remind %d" % tpl, "payload %s" % p)
    time.sleep(2)
    check(len(HOOK.for_template(tpl)) == 1, "fired %d times" % len(HOOK.for_template(tpl)))


def test_email_reminder_through_smtp():
    shop, tpl = template(START_LEAD_S)
    u = user()
    st, _, b = remind("create", u, shop, tpl, 1, 5)
    check(st == 200, "create: %s %s" % (st, b))
    bits = sql(0, "SELECT information FROM t_coupon_template_remind WHERE user_id = %d AND "
                  "coupon_template_id = %d" % (u, tpl))
    check(bits == [[str(1 << 12)]], "bitmap: %s" % bits)  # type 1: bit 12
    mine = lambda: [m for m in SMTP.messages if "<%d@users.invalid>" % u in m[1]]  # noqa: E731
    check(wait_for(mine, 15), "no mail")
    frm, rcpt, data = mine()[0]
    check(frm == "<reminders@quan.test>", "from %s" % frm)
    check("remind %d" % tpl in data and "Subject: Coupon reminder" in data, data)
    check(HOOK.for_template(tpl) == [], "an e-mail reminder went to the webhook")
    time.sleep(1.5)
    check(len(mine()) == 1, "mailed %d times" % len(mine()))


def test_cancel_never_fires_and_recreate_fires_once():
    shop, tpl = template(START_LEAD_S + 2)
    ua, ub, uc = user(), user(), user()
    for u in (ua, ub, uc):
        st, _, b = remind("create", u, shop, tpl, 0, 5)
        check(st == 200, "create: %s %s" % (st, b))
    # uc's timer message will be delivered even though it is cancelled: put its (already
    # "published") outbox row back after the cancel, as if the relay had sent it first.
    old = sql(0, "SELECT msg_key, payload::text FROM t_outbox WHERE msg_key LIKE 'remind:%d:%d:%%' "
                 "AND status = 0" % (uc, tpl))
    check(len(old) == 1, "timer row of uc: %s" % old)
    for u in (ua, ub, uc):
        st, _, b = remind("cancel", u, shop, tpl, 0, 5)
        check(st == 200, "cancel: %s %s" % (st, b))
    left = sql(0, "SELECT count(*) FROM t_outbox WHERE status = 0 AND (msg_key LIKE "
                  "'remind:%d:%d:%%' OR msg_key LIKE 'remind:%d:%d:%%')" % (ua, tpl, ub, tpl))
    check(left == [["0"]], "timers not withdrawn: %s" % left)
    sql(0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('remind.due', '%s', '%s')"
        % (old[0][0], old[0][1].replace("'", "''")))
    # ub re-creates: a new generation, which fires once
    st, _, b = remind("create", ub, shop, tpl, 0, 5)
    check(st == 200, "re-create: %s %s" % (st, b))
    got = lambda u: [p for p in HOOK.for_template(tpl) if p["userId"] == str(u)]  # noqa: E731
    check(wait_for(lambda: got(ub), 15), "re-created reminder never fired")
    time.sleep(3)
    check(len(got(ub)) == 1, "re-created reminder fired %d times" % len(got(ub)))
    check(got(ua) == [], "cancelled reminder fired")
    check(got(uc) == [], "cancelled reminder fired from an already published message")
    _, _, text = request("GET", engine().url + "/metrics")
    check(metric(text.decode(), "quan_reminders_total", type="app", outcome="skipped") >= 1,
          "skip not counted")


def test_list_and_cancel_one():
    shop, tpl = template(7200)
    u = user()
    for typ, minutes in ((0, 10), (1, 5), (0, 60)):
        st, _, b = remind("create", u, shop, tpl, typ, minutes)
        check(st == 200, "create: %s %s" % (st, b))
    st, _, b = call("list", u, method="GET")
    check(st == 200, "list: %s %s" % (st, b))
    mine = [x for x in b["data"] if x["id"] == str(tpl)]
    check(len(mine) == 1, "list: %s" % b["data"])
    x = mine[0]
    check(x["shopNumber"] == str(shop) and x["name"] == "remind %d" % tpl, x)
    start = x["validStartTime"]
    check(len(x["remindTime"]) == 3 and x["remindType"] == ["App通知", "App通知", "邮件提醒"],
          "list %s" % x)
    # earliest first: start - 60 min, start - 10 min, start - 5 min
    ts = [time.mktime(time.strptime(t, "%Y-%m-%d %H:%M:%S")) for t in x["remindTime"] + [start]]
    check([round((ts[3] - t) / 60) for t in ts[:3]] == [60, 10, 5], "times %s" % x["remindTime"])
    st, _, b = remind("cancel", u, shop, tpl, 0, 60)
    check(st == 200, "cancel: %s %s" % (st, b))
    st, _, b = call("list", u, method="GET")
    x = [x for x in b["data"] if x["id"] == str(tpl)][0]
    check(x["remindType"] == ["App通知", "邮件提醒"], "after cancel %s" % x)
    for typ, minutes in ((0, 10), (1, 5)):
        st, _, b = remind("cancel", u, shop, tpl, typ, minutes)
        check(st == 200, "cancel: %s %s" % (st, b))
    st, _, b = call("list", u, method="GET")
    check(not [x for x in b["data"] if x["id"] == str(tpl)], "all cancelled but listed")
    # another user sees none of it
    st, _, b = call("list", user(), method="GET")
    check(st == 200 and b["data"] == [], "other user: %s" % b)


def test_failed_delivery_retried_then_dead_lettered():
    shop, tpl_retry = template(START_LEAD_S)
    _, tpl_dead = template(START_LEAD_S, shop=shop)
    HOOK.fail_first[tpl_retry] = 1
    HOOK.fail_always.add(tpl_dead)
    u = user()
    _, _, text = request("GET", engine().url + "/metrics")
    dead0 = metric(text.decode(), "quan_reminders_total", type="app", outcome="dead")
    for tpl in (tpl_retry, tpl_dead):
        st, _, b = remind("create", u, shop, tpl, 0, 5)
        check(st == 200, "create: %s %s" % (st, b))
    # first attempt fails for both; the retry (after QUAN_MQ_RETRY_DELAY_MS, 10 s) succeeds for
    # one; the other has used its 2 attempts and goes to the dead-letter queue
    check(wait_for(lambda: len(HOOK.for_template(tpl_retry)) >= 2, 30), "no retry")
    check(wait_for(lambda: len(HOOK.for_template(tpl_dead)) >= 2, 10), "no second attempt")

    def dead_counted():
        _, _, t = request("GET", engine().url + "/metrics")
        return metric(t.decode(), "quan_reminders_total", type="app", outcome="dead") > dead0
    check(wait_for(dead_counted, 5), "dead letter not counted")
    time.sleep(1)
    check(len(HOOK.for_template(tpl_retry)) == 2, "retried reminder: %d posts"
          % len(HOOK.for_template(tpl_retry)))
    check(len(HOOK.for_template(tpl_dead)) == 2, "dead reminder: %d posts"
          % len(HOOK.for_template(tpl_dead)))
    # A quorum queue (the cluster topology) reports its length some seconds late.
    check(wait_for(lambda: queue_messages().get("quan.engine.remind.dead", 0) >= 1, 15),
          "dead-letter queue: %s" % queue_messages().get("quan.engine.remind.dead"))


if __name__ == "__main__":
    try:
        run([test_validation, test_app_reminder_fires_once_and_duplicate_refused,
             test_email_reminder_through_smtp, test_cancel_never_fires_and_recreate_fires_once,
             test_list_and_cancel_one, test_failed_delivery_retried_then_dead_lettered])
    finally:
        if ENGINE:
            ENGINE.stop()
