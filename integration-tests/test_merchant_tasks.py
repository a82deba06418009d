"""Distribution tasks of quan-merchant-admin, through HTTP against real servers, with TWO
replicas: create (every validation rule, template checks), the row count and its durable
fallback, the scheduled start (exactly once across replicas, never for a cancelled task),
page / find / cancel with shop isolation, and the failure report read back with openpyxl (also
one too large to build within the request timeout). Last, with one replica that refuses
internal addresses: create refuses such hosts, and a count that can never succeed ends."""

import http.client
import http.server
import io
import os
import random
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import make_merchant_template, new_shop, psql  # noqa: E402
from quan import TMP, Service, check, parallel, request, run  # noqa: E402
from xlsx_rows import first_difference, sheet_rows  # noqa: E402

import openpyxl  # noqa: E402

DS0 = os.environ["QUAN_DS0_DSN"]
BASE = "/api/merchant-admin/coupon-task/"
FALLBACK_MS = 3000  # QUAN_TASK_COUNT_RETRY_MS for this suite (20 s in production)

root = None  # QUAN_FILE_ROOT of the replicas
replicas = []
SHORT_TIMEOUT_MS = 200  # the request timeout of the replica the large report is asked of
FAILS = 300000  # failure rows of the large report: more than it can send in that time
RETRY_DELAY_S = 10  # QUAN_MQ_RETRY_DELAY_MS's default: when a failed message comes back
ENV = {}  # the replicas' settings (main)
http_srv = None
strict = None  # the replica of the last tests: internal addresses refused, alone on the queues


def make_template(shop, status=0, ended=False):
    return make_merchant_template(shop, "task test", status, ended)


def make_sheet(path, rows):
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["用户ID", "手机号", "邮箱"])
    for i in range(rows):
        ws.append([str(10 ** 15 + i), "1380000%04d" % (i % 10000), "u%d@example.com" % i])
    tmp = path + ".part"
    wb.save(tmp)
    os.rename(tmp, path)  # readers never see half a file
    return path


def hdr(shop, user=7):
    return {"X-User-Id": str(user), "X-Shop-Number": str(shop)}


def api(method, path, shop, body=None, replica=0, **q):
    url = replicas[replica].url + BASE + path
    if q:
        url += "?" + "&".join("%s=%s" % kv for kv in q.items())
    return request(method, url, body, hdr(shop) if shop else None)


def utc(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def task_body(tid, addr, **kw):
    b = {"taskName": "push %d" % random.randint(1, 10 ** 6), "fileAddress": addr,
         "notifyType": "0,3", "couponTemplateId": str(tid), "sendType": 0}
    b.update(kw)
    return {k: v for k, v in b.items() if v is not None}


def create(shop, body, replica=0):
    st, _, resp = api("POST", "create", shop, body, replica)
    check(st == 200, "create: %s %s" % (st, resp))
    return resp["data"]["id"], resp["data"]["batchId"]


def find(shop, task_id):
    st, _, resp = api("GET", "find", shop, taskId=task_id)
    check(st == 200, "find: %s %s" % (st, resp))
    return resp["data"]


def wait_for(what, fn, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError("timed out waiting for " + what)


def outbox_count(topic, task_id):
    return int(psql(DS0, "SELECT count(*) FROM t_outbox WHERE topic = '%s' AND msg_key = '%s:%s'"
                    % (topic, topic, task_id)))


# ---------------------------------------------------------------- a flaky file server

class FlakyHandler(http.server.BaseHTTPRequestHandler):
    """Serves files under root; a path asked for the first time answers 503 when its name
    contains 'flaky' (a lost first count); one whose name contains 'slow' answers after 4 s."""
    seen = set()
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802 - http.server's naming
        name = self.path.lstrip("/")
        with FlakyHandler.lock:
            first = name not in FlakyHandler.seen
            FlakyHandler.seen.add(name)
        path = os.path.join(root, os.path.basename(name))
        if "slow" in name:
            time.sleep(4)  # a slow merchant server
        if ("flaky" in name and first) or not os.path.isfile(path):
            self.send_response(503 if first else 404)
            self.end_headers()
            return
        with open(path, "rb") as f:
            data = f.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


# ---------------------------------------------------------------- tests


def test_create_validation():
    shop = new_shop()
    tid = make_template(shop)
    good = make_sheet(os.path.join(root, "v.xlsx"), 3)
    future = utc(time.time() + 3600)
    cases = [
        (task_body(tid, good, taskName=None), "taskName"),
        (task_body(tid, good, taskName="   "), "taskName"),
        (task_body(tid, good, taskName="x" * 129), "taskName"),
        (task_body(tid, None), "fileAddress"),
        (task_body(tid, os.path.join(root, "..", "etc", "passwd")), "fileAddress"),
        (task_body(tid, "/etc/passwd"), "fileAddress"),
        (task_body(tid, os.path.join(root, "missing.xlsx")), "fileAddress"),
        (task_body(tid, "users.xlsx"), "fileAddress"),
        (task_body(tid, "ftp://127.0.0.1/users.xlsx"), "fileAddress"),
        (task_body(tid, "file://" + good), "fileAddress"),
        (task_body(tid, good, notifyType=None), "notifyType"),
        (task_body(tid, good, notifyType="0,5"), "notifyType"),
        (task_body(tid, good, notifyType="sms"), "notifyType"),
        (task_body(None, good), "couponTemplateId"),
        (task_body("abc", good), "couponTemplateId"),
        (task_body(tid, good, sendType=None), "sendType"),
        (task_body(tid, good, sendType=2), "sendType"),
        (task_body(tid, good, sendType=1), "sendTime"),
        (task_body(tid, good, sendType=1, sendTime=utc(time.time() - 60)), "sendTime"),
        (task_body(tid, good, sendType=1, sendTime="tomorrow"), "sendTime"),
        (task_body(tid, good, sendType=1, sendTime="2030-02-30 10:00:00"), "sendTime"),
    ]
    for body, field in cases:
        st, _, resp = api("POST", "create", shop, body)
        check(st == 400 and resp["code"] == "A000001" and resp["message"].startswith(field),
              "%s -> %s %s" % (body, st, resp))
    st, _, resp = api("POST", "create", None, task_body(tid, good))
    check(st == 401, "no identity: %s" % st)
    st, _, resp = request("POST", replicas[0].url + BASE + "create", b'{"taskName":', hdr(shop))
    check(st == 400, "malformed JSON: %s" % st)
    # a valid scheduled body passes validation (sanity: the cases above fail for their reason)
    create(shop, task_body(tid, good, sendType=1, sendTime=future))
    n = psql(DS0, "SELECT count(*) FROM t_coupon_task WHERE shop_number = %d" % shop)
    check(n == "1", "only the valid task was stored: %s" % n)
    for r in replicas:
        check(r.proc.poll() is None, "replica alive")


def test_template_checks():
    shop, other = new_shop(), new_shop()
    good = make_sheet(os.path.join(root, "t.xlsx"), 2)
    theirs = make_template(other)
    ended = make_template(shop, status=1)
    st, _, resp = api("POST", "create", shop, task_body(theirs, good))
    check(st == 404 and resp["code"] == "A000404", "other shop's template: %s %s" % (st, resp))
    st, _, resp = api("POST", "create", shop, task_body(424242, good))
    check(st == 404, "unknown template: %s" % st)
    st, _, resp = api("POST", "create", shop, task_body(ended, good))
    check(st == 409 and resp["code"] == "B000103", "ended template: %s %s" % (st, resp))
    n = psql(DS0, "SELECT count(*) FROM t_coupon_task WHERE shop_number = %d" % shop)
    check(n == "0", "no task stored: %s" % n)


def test_immediate_task_and_row_count():
    shop = new_shop()
    tid = make_template(shop)
    path = make_sheet(os.path.join(root, "imm.xlsx"), 57)
    task_id, batch_id = create(shop, task_body(tid, path))
    check(task_id.isdigit() and batch_id.isdigit() and task_id != batch_id, "ids")
    t = find(shop, task_id)
    check(t["status"] == 1 and t["batchId"] == batch_id and t["sendType"] == 0,
          "immediate task is running: %s" % t)
    check(t["notifyType"] == "0,3" and t["operatorId"] == "7" and t["fileAddress"] == path,
          "stored fields: %s" % t)
    for k in ("successNum", "failNum", "processedRows"):
        check(t[k] == 0, "%s: %s" % (k, t))
    check(t["failReason"] is None and t["cancelRequested"] is False, "no failure, no cancel")
    t = wait_for("sendNum", lambda: (lambda x: x if x["sendNum"] is not None else None)(
        find(shop, task_id)), 10)
    check(t["sendNum"] == 57, "sendNum: %s" % t["sendNum"])
    check(outbox_count("task.execute", task_id) == 1, "one task.execute")
    check(outbox_count("task.count", task_id) == 1, "the fallback timer")
    check(int(psql(DS0, "SELECT count(*) FROM t_outbox WHERE msg_key = 'task.count:%s:first'"
                   % task_id)) == 1, "the first count, an event of its own")
    check(outbox_count("task.schedule", task_id) == 0, "no schedule timer")


def test_row_count_header_rule():
    """sendNum counts the rows distribution will read: a first row naming the user-id column is
    a header, any other first row is data (an empty row counts for nothing)."""
    shop = new_shop()
    tid = make_template(shop)
    for name, text, want in (("head.csv", "userId,phone\r\n11\r\n12\r\n", 2),
                             ("nohead.csv", "11,138\r\n\r\n12\r\nx\r\n13\r\n", 4),
                             ("cn.csv", " 用户ID ,手机号\r\n11\r\n", 1)):
        path = os.path.join(root, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        task_id, _ = create(shop, task_body(tid, path))
        t = wait_for("sendNum", lambda: (lambda x: x if x["sendNum"] is not None else None)(
            find(shop, task_id)), 10)
        check(t["sendNum"] == want, "%s: sendNum %s, wanted %d" % (name, t["sendNum"], want))


def test_row_count_fallback():
    """The first count fails (the file is not complete yet; test_row_count_fallback_url: the
    URL answers 503); the durable timer recounts FALLBACK_MS later and sets sendNum."""
    shop = new_shop()
    tid = make_template(shop)
    late = os.path.join(root, "late-%d.xlsx" % random.randint(1, 10 ** 9))
    with open(late, "wb") as f:
        f.write(b"PK\x03\x04 not yet a workbook")
    task_id, _ = create(shop, task_body(tid, late))
    time.sleep(0.8)
    check(find(shop, task_id)["sendNum"] is None, "first count failed")
    make_sheet(late, 23)
    t0 = time.time()
    t = wait_for("fallback count", lambda: (lambda x: x if x["sendNum"] is not None else None)(
        find(shop, task_id)), FALLBACK_MS / 1000 + 15)
    check(t["sendNum"] == 23, "fallback sendNum: %s" % t["sendNum"])
    print("  fallback counted after %.1fs" % (time.time() - t0 + 0.8))


def test_row_count_fallback_url():
    shop = new_shop()
    tid = make_template(shop)
    name = "flaky-%d.xlsx" % random.randint(1, 10 ** 9)
    make_sheet(os.path.join(root, name), 11)
    url = "http://127.0.0.1:%d/%s" % (http_srv.server_address[1], name)
    task_id, _ = create(shop, task_body(tid, url))
    time.sleep(0.8)
    check(find(shop, task_id)["sendNum"] is None, "first count got 503")
    t = wait_for("fallback count", lambda: (lambda x: x if x["sendNum"] is not None else None)(
        find(shop, task_id)), FALLBACK_MS / 1000 + 15)
    check(t["sendNum"] == 11, "sendNum from the URL: %s" % t["sendNum"])


def test_scheduled_started_once_by_two_replicas():
    shop = new_shop()
    tid = make_template(shop)
    path = make_sheet(os.path.join(root, "sched.xlsx"), 5)
    send_at = int(time.time()) + 4
    task_id, _ = create(shop, task_body(tid, path, sendType=1, sendTime=utc(send_at)), replica=1)
    t = find(shop, task_id)
    check(t["status"] == 0 and t["sendType"] == 1, "pending before sendTime: %s" % t)
    check(t["sendTime"] is not None, "sendTime shown")
    # Extra copies of the timer (as a redelivery or a second relay would produce): both
    # replicas' consumers get some and race on the same task.
    for k in range(5):
        psql(DS0, "INSERT INTO t_outbox (topic, msg_key, payload, due_at) VALUES"
             " ('task.schedule', 'task.schedule:%s', '{\"taskId\":\"%s\"}', to_timestamp(%d))"
             % (task_id, task_id, send_at))
    check(outbox_count("task.execute", task_id) == 0, "not started early")
    wait_for("task started", lambda: find(shop, task_id)["status"] == 1, 20)
    check(time.time() >= send_at - 0.5, "not before sendTime")
    wait_for("timers consumed", lambda: psql(
        DS0, "SELECT count(*) FROM t_outbox WHERE msg_key = 'task.schedule:%s' AND status = 0"
        % task_id) == "0", 15)
    time.sleep(1.5)  # the consumers handle what the relays published
    check(outbox_count("task.execute", task_id) == 1,
          "task.execute published exactly once: %d" % outbox_count("task.execute", task_id))


def test_cancel():
    shop, other = new_shop(), new_shop()
    tid = make_template(shop)
    path = make_sheet(os.path.join(root, "cancel.xlsx"), 4)
    send_at = int(time.time()) + 3
    task_id, _ = create(shop, task_body(tid, path, sendType=1, sendTime=utc(send_at)))
    st, _, resp = api("POST", "cancel", other, {"taskId": task_id})
    check(st == 404 and resp["code"] == "A000404", "cancel by another shop: %s" % st)
    check(find(shop, task_id)["status"] == 0, "still pending")
    st, _, resp = api("POST", "cancel", shop, {"taskId": task_id})
    check(st == 200, "cancel: %s %s" % (st, resp))
    check(find(shop, task_id)["status"] == 4, "cancelled")
    st, _, resp = api("POST", "cancel", shop, {"taskId": task_id})
    check(st == 409 and resp["code"] == "B000104", "cancel twice: %s %s" % (st, resp))
    # a running (immediate) task no run has taken yet is cancelled at once
    run_id, _ = create(shop, task_body(tid, path))
    st, _, resp = api("POST", "cancel", shop, None, taskId=run_id)
    check(st == 200, "cancel running, not taken: %s %s" % (st, resp))
    t = find(shop, run_id)
    check(t["status"] == 4 and not t["cancelRequested"], "cancelled at once: %s" % t)
    # one a run has taken is asked to stop: its run ends it at a chunk boundary
    taken_id, _ = create(shop, task_body(tid, path))
    psql(DS0, "UPDATE t_coupon_task SET execution_id = 'run-1' WHERE id = %s" % taken_id)
    for _ in range(2):  # asking twice is asking once
        st, _, resp = api("POST", "cancel", shop, None, taskId=taken_id)
        check(st == 200, "cancel a taken task: %s %s" % (st, resp))
        t = find(shop, taken_id)
        check(t["status"] == 1 and t["cancelRequested"], "cancel requested: %s" % t)
    psql(DS0, "UPDATE t_coupon_task SET status = 3 WHERE id = %s" % taken_id)
    st, _, resp = api("POST", "cancel", shop, None, taskId=taken_id)
    check(st == 409 and resp["code"] == "B000104", "cancel a finished task: %s %s" % (st, resp))
    st, _, resp = api("POST", "cancel", shop, {"taskId": "99"})
    check(st == 404, "unknown task: %s" % st)
    st, _, resp = api("POST", "cancel", shop, {})
    check(st == 400 and resp["message"].startswith("taskId"), "missing taskId: %s" % st)
    # a timer that still fires (e.g. already claimed by a relay) does not start it
    psql(DS0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('task.schedule',"
         " 'task.schedule:%s', '{\"taskId\":\"%s\"}')" % (task_id, task_id))
    time.sleep(max(0, send_at - time.time()) + 2.0)
    check(find(shop, task_id)["status"] == 4, "cancelled task never starts")
    check(outbox_count("task.execute", task_id) == 0, "no task.execute for a cancelled task")


def test_page_find_isolation():
    shop, other = new_shop(), new_shop()
    tid = make_template(shop)
    tid2 = make_template(shop)
    path = make_sheet(os.path.join(root, "page.xlsx"), 2)
    a, ba = create(shop, task_body(tid, path, taskName="spring sale"))
    b, _ = create(shop, task_body(tid2, path, taskName="summer sale"))
    c, _ = create(shop, task_body(tid, path, taskName="vip push", sendType=1,
                                  sendTime=utc(time.time() + 3600)))
    st, _, resp = api("GET", "page", shop)
    check(st == 200, "page: %s %s" % (st, resp))
    d = resp["data"]
    check(d["total"] == 3 and d["current"] == 1 and d["size"] == 10 and d["pages"] == 1,
          "page meta: %s" % d)
    check([r["id"] for r in d["records"]] == [c, b, a], "newest first")

    def ids(**q):
        st, _, resp = api("GET", "page", shop, **q)
        check(st == 200, "page %s: %s %s" % (q, st, resp))
        return sorted(r["id"] for r in resp["data"]["records"])
    check(ids(taskName="sale") == sorted([a, b]), "taskName substring")
    check(ids(status=0) == [c], "status filter")
    check(ids(batchId=ba) == [a], "batchId filter")
    check(ids(couponTemplateId=tid2) == [b], "template filter")
    st, _, resp = api("GET", "page", shop, size=2, current=2)
    check(resp["data"]["pages"] == 2 and [r["id"] for r in resp["data"]["records"]] == [a],
          "second page: %s" % resp["data"])
    for q, field in (({"size": 0}, "size"), ({"size": 101}, "size"), ({"current": 0}, "current"),
                     ({"status": 9}, "status"), ({"batchId": "x"}, "batchId")):
        st, _, resp = api("GET", "page", shop, **q)
        check(st == 400 and resp["message"].startswith(field), "page %s: %s %s" % (q, st, resp))
    # another shop sees none of them
    st, _, resp = api("GET", "page", other)
    check(st == 200 and resp["data"]["total"] == 0, "other shop's page: %s" % resp["data"])
    for t in (a, b, c):
        st, _, resp = api("GET", "find", other, taskId=t)
        check(st == 404 and resp["code"] == "A000404", "find by other shop: %s" % st)
    st, _, resp = api("GET", "find", shop)
    check(st == 400, "find without taskId: %s" % st)
    st, _, resp = api("GET", "find", shop, taskId="12x")
    check(st == 400, "find with a bad taskId: %s" % st)


def read_xlsx(raw):
    wb = openpyxl.load_workbook(io.BytesIO(raw), read_only=True)
    return list(wb.worksheets[0].iter_rows(values_only=True))


def test_fail_report():
    shop, other = new_shop(), new_shop()
    tid = make_template(shop)
    path = make_sheet(os.path.join(root, "fail.xlsx"), 3)
    task_id, batch_id = create(shop, task_body(tid, path))
    empty_id, _ = create(shop, task_body(tid, path))
    psql(DS0, "INSERT INTO t_coupon_task_fail (batch_id, task_id, row_num, user_id, cause) VALUES"
         " (%s, %s, 7, 'abc', 'user id is not a number'),"
         " (%s, %s, 2, '1810000000000000001', 'already received'),"
         " (%s, %s, 40, NULL, 'stock exhausted: 用户未领取')"
         % (batch_id, task_id, batch_id, task_id, batch_id, task_id))
    st, hd, raw = api("GET", "fail-report", shop, taskId=task_id)
    check(st == 200, "report: %s" % st)
    check(hd["Content-Type"] ==
          "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", hd["Content-Type"])
    check(hd["Content-Disposition"] ==
          'attachment; filename="task-%s-failures.xlsx"' % task_id, hd["Content-Disposition"])
    rows = read_xlsx(raw)
    check(rows[0] == ("row number", "user id", "cause"), "header: %s" % (rows[0],))
    check(rows[1:] == [(2, "1810000000000000001", "already received"),
                       (7, "abc", "user id is not a number"),
                       (40, None, "stock exhausted: 用户未领取")], "rows: %s" % rows[1:])
    st, _, raw = api("GET", "fail-report", shop, taskId=empty_id)
    check(st == 200, "empty report: %s" % st)
    rows = read_xlsx(raw)
    check(rows == [("row number", "user id", "cause")], "header only: %s" % rows)
    st, _, resp = api("GET", "fail-report", other, taskId=task_id)
    check(st == 404 and resp["code"] == "A000404", "other shop's report: %s" % st)
    st, _, resp = api("GET", "fail-report", shop)
    check(st == 400, "no taskId: %s" % st)


def test_large_fail_report_streams():
    """A report too large to build within the request timeout (0.2 s): it starts at once and
    streams every failure row, in row order (rows with the same row number by id: the pages
    must not lose or repeat one at their edges)."""
    shop = new_shop()
    tid = make_template(shop)
    task_id, batch_id = create(shop, task_body(tid, make_sheet(os.path.join(root, "big.xlsx"), 2)))
    # row numbers come down in pairs as ids go up; every 10th user id is missing
    psql(DS0, "INSERT INTO t_coupon_task_fail (batch_id, task_id, row_num, user_id, cause)"
         " SELECT %s, %s, %d - (g - 1) / 2, CASE WHEN g %% 10 = 0 THEN NULL ELSE 'u' || g END,"
         " 'cause & <%%> ' || (g %% 7) || ' 未领取' FROM generate_series(1, %d) g"
         % (batch_id, task_id, FAILS, FAILS))
    psql(DS0, "ANALYZE t_coupon_task_fail")
    short = Service("merchant-admin", dict(ENV, QUAN_HTTP_REQUEST_TIMEOUT_MS=str(SHORT_TIMEOUT_MS)))
    try:
        short.wait_ready()
        conn = http.client.HTTPConnection("127.0.0.1", short.port, timeout=120)
        t0 = time.time()
        conn.request("GET", BASE + "fail-report?taskId=" + task_id, headers=hdr(shop))
        resp = conn.getresponse()
        first = time.time() - t0
        raw = resp.read()
        conn.close()
        print("  %d failure rows: headers after %.2fs, %d bytes after %.2fs"
              % (FAILS, first, len(raw), time.time() - t0))
        check(resp.status == 200, "report: %s %s" % (resp.status, raw[:200]))
        check(first < SHORT_TIMEOUT_MS / 1000.0, "headers after %.2fs" % first)
        check(time.time() - t0 > SHORT_TIMEOUT_MS / 1000.0,
              "the whole report took longer than the request timeout: grow FAILS")
    finally:
        short.stop()
    # openpyxl opens it as a spreadsheet program would; every row is read by the faster reader
    rows = openpyxl.load_workbook(io.BytesIO(raw), read_only=True).worksheets[0].iter_rows(
        values_only=True)
    check(next(rows) == ("row number", "user id", "cause"), "header")
    want = [("row number", "user id", "cause")]
    for row_num in range(FAILS // 2 + 1, FAILS + 1):
        g_hi = 2 * (FAILS - row_num) + 2  # the pair (g_hi - 1, g_hi), ids ascending
        for g in (g_hi - 1, g_hi):
            want.append((row_num, None if g % 10 == 0 else "u%d" % g,
                         "cause & <%%> %d 未领取" % (g % 7)))
    got = list(sheet_rows(raw))
    diff = first_difference(got, want)
    check(diff is None, "%d rows; row %s: %s" % (len(got), diff and diff[0] + 1, diff))


def test_duplicate_submit():
    """The same merchant posting the same task twice at once, on two replicas: one task."""
    shop = new_shop()
    tid = make_template(shop)
    body = task_body(tid, make_sheet(os.path.join(root, "dup.xlsx"), 3))
    results = parallel(lambda i: api("POST", "create", shop, body, i % 2)[:3:2], range(4))
    ok = [r for st, r in results if st == 200]
    dup = [r for st, r in results if st == 429 and r["code"] == "A000409"]
    check(len(ok) == 1 and len(dup) == 3, "one created, three refused: %s" % results)
    n = psql(DS0, "SELECT count(*) FROM t_coupon_task WHERE "
             "shop_number = %d AND task_name = '%s'" % (shop, body["taskName"]))
    check(n == "1", "one row: %s" % n)


def test_slow_download_holds_no_database_connection():
    """One pool connection only: while a task's sheet downloads slowly, the replica still
    answers requests that need the database at once."""
    shop = new_shop()
    tid = make_template(shop)
    name = "slow-%d.xlsx" % random.randint(1, 10 ** 9)
    make_sheet(os.path.join(root, name), 4)
    url = "http://127.0.0.1:%d/%s" % (http_srv.server_address[1], name)
    one = Service("merchant-admin", dict(ENV, QUAN_PG_POOL_SIZE="1")).wait_ready()
    try:
        st, _, r = request("POST", one.url + "/api/merchant-admin/coupon-task/create",
                           task_body(tid, url), hdr(shop))
        check(st == 200, "create: %s %s" % (st, r))
        task_id = r["data"]["id"]
        time.sleep(0.5)  # the first count is downloading now
        for _ in range(3):
            t0 = time.time()
            st, _, r = request("GET", one.url + "/api/merchant-admin/coupon-task/find?taskId="
                               + task_id, None, hdr(shop))
            check(st == 200 and time.time() - t0 < 1.5,
                  "find while downloading: %s in %.1fs" % (st, time.time() - t0))
        t = wait_for("count", lambda: (lambda x: x if x["sendNum"] is not None else None)(
            find(shop, task_id)), 20)
        check(t["sendNum"] == 4, "sendNum: %s" % t["sendNum"])
    finally:
        one.stop()


STRICT_XML = 65536  # the strict replica's limit of a sheet's XML, uncompressed


def start_strict():
    """Stops the two replicas (their consumers would take the count events) and starts one
    that refuses internal addresses (the default) and sheets of more than STRICT_XML bytes of
    XML."""
    global strict
    if strict is None:
        for r in replicas:
            r.stop()
        strict = Service("merchant-admin", dict(ENV, QUAN_FILE_ALLOW_INTERNAL="false",
                                                QUAN_FILE_MAX_XML_BYTES=str(STRICT_XML)))
        strict.wait_ready()
    return strict


def test_create_refuses_internal_hosts():
    """fileAddress is checked when the task is posted: a URL whose host is (or resolves to) an
    internal address is a 400 naming fileAddress, and no task is written."""
    svc = start_strict()
    shop = new_shop()
    tid = make_template(shop)
    port = http_srv.server_address[1]
    make_sheet(os.path.join(root, "inside.xlsx"), 2)
    for addr in ("http://127.0.0.1:1/x.xlsx", "http://127.0.0.1:%d/inside.xlsx" % port,
                 "http://localhost:%d/inside.xlsx" % port, "http://[::1]:1/x.xlsx",
                 "https://169.254.169.254/latest/meta-data/x.xlsx", "http://10.0.0.1/x.xlsx"):
        t0 = time.time()
        st, _, resp = request("POST", svc.url + BASE + "create", task_body(tid, addr), hdr(shop))
        check(st == 400 and resp["code"] == "A000001"
              and resp["message"].startswith("fileAddress: the host is an internal address"),
              "%s -> %s %s" % (addr, st, resp))
        check(time.time() - t0 < 3, "%s answered in %.1fs" % (addr, time.time() - t0))
    for addr, why in ((os.path.join(root, "..", "x.xlsx"), '".."'), ("/etc/passwd", "outside"),
                      ("ftp://127.0.0.1/x.xlsx", "http or https only"),
                      ("file:///etc/passwd", "http or https only")):
        st, _, resp = request("POST", svc.url + BASE + "create", task_body(tid, addr), hdr(shop))
        check(st == 400 and resp["message"].startswith("fileAddress: ") and why in resp["message"],
              "%s -> %s %s" % (addr, st, resp))
    n = psql(DS0, "SELECT count(*) FROM t_coupon_task WHERE shop_number = %d" % shop)
    check(n == "0", "no task written: %s" % n)


def count_log(svc, task_id, text):
    with open(svc.log_path, "rb") as f:
        return sum(1 for ln in f if ("task %s: %s" % (task_id, text)).encode() in ln)


def test_count_ends_on_a_permanent_failure():
    """A task whose file can never be fetched (here a host the policy refuses, as for a task
    written before create checked hosts): each of its two counts, the first and the fallback,
    tries once and ends; nothing is retried (it used to be, at every retry delay, until the
    dead-letter queue)."""
    svc = start_strict()
    shop = new_shop()
    tid = make_template(shop)
    task_id = str(random.randint(10 ** 15, 10 ** 17))
    psql(DS0, "INSERT INTO t_coupon_task (id, shop_number, batch_id, task_name, file_address,"
         " coupon_template_id, send_type, status, operator_id) VALUES (%s, %d, %s, 'old task',"
         " 'http://127.0.0.1:1/x.xlsx', %s, 0, 1, 7)" % (task_id, shop, int(task_id) + 1, tid))
    psql(DS0, "INSERT INTO t_outbox (topic, msg_key, payload, due_at) VALUES"
         " ('task.count', 'task.count:%s:first', '{\"taskId\":\"%s\"}', now()),"
         " ('task.count', 'task.count:%s', '{\"taskId\":\"%s\"}', now() + interval '1 second')"
         % (task_id, task_id, task_id, task_id))
    wait_for("both counts", lambda: count_log(svc, task_id, "the sheet cannot be counted") >= 2,
             15)
    time.sleep(RETRY_DELAY_S + 1.5)  # a retried message would be back by now
    ended = count_log(svc, task_id, "the sheet cannot be counted")
    retried = count_log(svc, task_id, "row count failed")
    check(ended == 2 and retried == 0, "counts ended: %d, retries: %d" % (ended, retried))
    st, _, resp = request("GET", svc.url + BASE + "find?taskId=" + task_id, None, hdr(shop))
    check(st == 200 and resp["data"]["sendNum"] is None, "not counted: %s %s" % (st, resp))
    check(svc.proc.poll() is None, "replica alive")


def test_count_refuses_a_sheet_over_the_xml_limit():
    """QUAN_FILE_MAX_XML_BYTES bounds the uncompressed sheet, not the file: a sheet whose XML is
    over it (a few KB on disk) is refused by the count, for good; a small one is counted."""
    svc = start_strict()
    shop = new_shop()
    tid = make_template(shop)

    def post(path):
        st, _, resp = request("POST", svc.url + BASE + "create", task_body(tid, path), hdr(shop))
        check(st == 200, "create: %s %s" % (st, resp))
        return resp["data"]["id"]

    def send_num(task_id):
        st, _, resp = request("GET", svc.url + BASE + "find?taskId=" + task_id, None, hdr(shop))
        check(st == 200, "find: %s %s" % (st, resp))
        return resp["data"]["sendNum"]

    big = make_sheet(os.path.join(root, "wide.xlsx"), 3000)
    check(os.path.getsize(big) < STRICT_XML, "the file itself is under the limit")
    task_id = post(big)
    wait_for("the count ends", lambda: count_log(svc, task_id, "the sheet cannot be counted")
             >= 1, 15)
    check(send_num(task_id) is None, "not counted")
    task_id = post(make_sheet(os.path.join(root, "narrow.xlsx"), 5))
    check(wait_for("sendNum", lambda: send_num(task_id), 10) == 5, "the small sheet counted")


def main():
    global root, http_srv
    root = tempfile.mkdtemp(prefix="quan-tasks-", dir=TMP)
    http_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    threading.Thread(target=http_srv.serve_forever, daemon=True).start()
    # the test web server is on 127.0.0.1, which is refused by default (SSRF)
    ENV.update({"QUAN_FILE_ROOT": root, "QUAN_TASK_COUNT_RETRY_MS": str(FALLBACK_MS),
                "QUAN_FILE_ALLOW_INTERNAL": "true"})
    env = ENV
    try:
        replicas.append(Service("merchant-admin", env))
        replicas.append(Service("merchant-admin", env))
        for r in replicas:
            r.wait_ready()
        tests = [test_create_validation, test_template_checks, test_immediate_task_and_row_count,
                 test_row_count_header_rule, test_row_count_fallback, test_row_count_fallback_url,
                 test_scheduled_started_once_by_two_replicas, test_cancel,
                 test_page_find_isolation, test_fail_report, test_large_fail_report_streams,
                 test_duplicate_submit,
                 test_slow_download_holds_no_database_connection,
                 test_create_refuses_internal_hosts, test_count_ends_on_a_permanent_failure,
                 test_count_refuses_a_sheet_over_the_xml_limit]
        run(tests)
    finally:
        for r in replicas:
            r.stop()
        if strict:
            strict.stop()
        http_srv.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
