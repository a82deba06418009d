"""Exchange-code batches of quan-merchant-admin, through HTTP against real servers:
create (validation, template checks, shop isolation), background generation (count,
uniqueness, alphabet, keyed check verified by build/bin/quan-excode-check, forged codes
rejected), resume and redelivery, find, and the .xlsx export read back with openpyxl: also a
batch too large to build within the request timeout (streamed), a client that stops reading
(the export pauses) and one that goes away in the middle (the export stops)."""

import http.client
import io
import os
import random
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import make_merchant_template, new_shop, psql  # noqa: E402
from quan import BIN, Service, check, request, run  # noqa: E402
from xlsx_rows import first_difference, sheet_rows  # noqa: E402

import openpyxl  # noqa: E402

SECRET = os.environ.get("QUAN_CODE_SECRET", "test-secret-0123456789abcdef")
DS0 = os.environ["QUAN_DS0_DSN"]
ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"
CODE_RE = re.compile("^[%s]{10}$" % ALPHABET)
BASE = "/api/merchant-admin/coupon-template/exchange-code/"

svc = None
short = None  # a replica whose request timeout is 1 s (QUAN_HTTP_REQUEST_TIMEOUT_MS)
SHORT_TIMEOUT_MS = 1000
BIG = 1000000  # codes in the batch an export must stream past the short timeout (the most)
big_batch = None  # (shop, batch id, codes in order), made once
big_size = 0  # bytes of its export


def make_template(shop, status=0, ended=False):
    return make_merchant_template(shop, "codes test", status, ended)


def hdr(shop, user=7):
    return {"X-User-Id": str(user), "X-Shop-Number": str(shop)}


def post(path, body, shop):
    return request("POST", svc.url + BASE + path, body, hdr(shop))


def get(path, shop, **q):
    qs = "&".join("%s=%s" % kv for kv in q.items())
    return request("GET", svc.url + BASE + path + "?" + qs, None, hdr(shop))


def wait_ready(batch_id, shop, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, _, body = get("find", shop, batchId=batch_id)
        check(st == 200, "find: %s %s" % (st, body))
        if body["data"]["status"] == 1:
            return body["data"]
        time.sleep(0.2)
    raise AssertionError("batch %s not ready: %s" % (batch_id, body))


def excode_check(codes):
    out = subprocess.run([os.path.join(BIN, "quan-excode-check")], input="\n".join(codes) + "\n",
                         capture_output=True, text=True, env=dict(os.environ,
                                                                  QUAN_CODE_SECRET=SECRET),
                         timeout=60)
    last = out.stdout.strip().splitlines()[-1]
    ok, bad = re.match(r"^(\d+) ok, (\d+) bad$", last).groups()
    return int(ok), int(bad)


def db_codes(batch_id):
    return psql(DS0, "SELECT code FROM t_exchange_code WHERE batch_id = %d ORDER BY id"
                % int(batch_id)).splitlines()


# ---------------------------------------------------------------- tests


def test_create_validation():
    shop = new_shop()
    tid = make_template(shop)
    cases = [({"count": 10}, "couponTemplateId"),
             ({"couponTemplateId": str(tid)}, "count"),
             ({"couponTemplateId": str(tid), "count": 0}, "count"),
             ({"couponTemplateId": str(tid), "count": 1000001}, "count"),
             ({"couponTemplateId": str(tid), "count": "ten"}, "count"),
             ({"couponTemplateId": str(tid), "count": 1.5}, "count"),
             ({"couponTemplateId": "x1", "count": 5}, "couponTemplateId"),
             ({"couponTemplateId": -3, "count": 5}, "couponTemplateId")]
    for body, field in cases:
        st, _, resp = post("create", body, shop)
        check(st == 400 and resp["code"] == "A000001" and field in resp["message"],
              "%s -> %s %s" % (body, st, resp))
    st, _, resp = request("POST", svc.url + BASE + "create", {"couponTemplateId": str(tid),
                                                              "count": 5})
    check(st == 401, "no identity: %s" % st)
    st, _, resp = request("POST", svc.url + BASE + "create", b"{bad json",
                          hdr(shop))
    check(st == 400, "bad json: %s" % st)
    # nothing was stored by any of these
    n = psql(DS0, "SELECT count(*) FROM t_exchange_code_batch WHERE shop_number = %d" % shop)
    check(n == "0", "batches after invalid input: %s" % n)
    check(svc.proc.poll() is None, "process alive")


def test_template_checks_and_isolation():
    shop, other = new_shop(), new_shop()
    mine = make_template(shop)
    theirs = make_template(other)
    ended = make_template(shop, status=1)
    expired = make_template(shop, ended=True)
    st, _, resp = post("create", {"couponTemplateId": str(theirs), "count": 5}, shop)
    check(st == 404 and resp["code"] == "A000404", "other shop's template: %s %s" % (st, resp))
    st, _, resp = post("create", {"couponTemplateId": "12345", "count": 5}, shop)
    check(st == 404, "missing template: %s" % st)
    for t in (ended, expired):
        st, _, resp = post("create", {"couponTemplateId": str(t), "count": 5}, shop)
        check(st == 409 and resp["code"] == "B000103", "ended template: %s %s" % (st, resp))
    st, _, resp = post("create", {"couponTemplateId": str(mine), "count": 3}, shop)
    check(st == 200, "create: %s %s" % (st, resp))
    bid = resp["data"]["batchId"]
    wait_ready(bid, shop)
    # another shop sees nothing of it
    for path in ("find", "export"):
        st, _, resp = get(path, other, batchId=bid)
        check(st == 404 and resp["code"] == "A000404", "%s by other shop: %s" % (path, st))
    st, _, resp = get("find", shop, batchId="abc")
    check(st == 400, "bad batchId: %s" % st)
    st, _, resp = get("export", shop)
    check(st == 400 and "batchId" in resp["message"], "missing batchId: %s" % st)
    st, _, resp = get("find", shop, batchId=987654321)
    check(st == 404, "unknown batch: %s" % st)


def test_batch_of_5000():
    shop = new_shop()
    tid = make_template(shop)
    t0 = time.time()
    st, _, resp = post("create", {"couponTemplateId": str(tid), "count": 5000}, shop)
    check(st == 200, "create: %s %s" % (st, resp))
    bid = resp["data"]["batchId"]
    check(isinstance(bid, str) and bid.isdigit(), "batchId is an id string: %r" % bid)
    data = wait_ready(bid, shop)
    print("  5000 codes in %.1fs" % (time.time() - t0))
    check(data["count"] == 5000 and data["generated"] == 5000, "find: %s" % data)
    check(data["couponTemplateId"] == str(tid), "template: %s" % data)
    codes = db_codes(bid)
    check(len(codes) == 5000, "stored codes: %d" % len(codes))
    check(len(set(codes)) == 5000, "codes unique")
    check(all(CODE_RE.match(c) for c in codes), "alphabet and length")
    row = psql(DS0, "SELECT count(*), count(DISTINCT coupon_template_id), min(shop_number),"
               " min(status), max(status) FROM t_exchange_code WHERE batch_id = %s" % bid)
    check(row == "5000|1|%d|1|1" % shop, "code rows: %s" % row)
    ok, bad = excode_check(codes)
    check((ok, bad) == (5000, 0), "keyed check of the issued codes: %d ok %d bad" % (ok, bad))

    # Forged codes: one character changed, and uniformly random strings.
    rnd = random.Random(7)
    forged = []
    for c in codes[:2000]:
        i = rnd.randrange(10)
        forged.append(c[:i] + rnd.choice(ALPHABET.replace(c[i], "")) + c[i + 1:])
    forged += ["".join(rnd.choice(ALPHABET) for _ in range(10)) for _ in range(3000)]
    ok, bad = excode_check(forged)
    # 2^-20 per forged string: 5000 forgeries pass ~0.005 times on average.
    check(ok <= 1 and ok + bad == 5000, "forged codes accepted: %d" % ok)
    # A wrong secret accepts none of the real ones (the check is keyed).
    out = subprocess.run([os.path.join(BIN, "quan-excode-check")], input="\n".join(codes[:500]),
                         capture_output=True, text=True,
                         env=dict(os.environ, QUAN_CODE_SECRET="another-secret-0123456789"))
    check(out.stdout.strip().splitlines()[-1].startswith(("0 ok", "1 ok")),
          "wrong secret: %s" % out.stdout.strip().splitlines()[-1])

    # The export, read back by an independent reader.
    st, hd, raw = get("export", shop, batchId=bid)
    check(st == 200, "export: %s" % st)
    check(hd["Content-Type"] ==
          "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
          "content type: %s" % hd["Content-Type"])
    check(("codes-%s.xlsx" % bid) in hd["Content-Disposition"], hd["Content-Disposition"])
    wb = openpyxl.load_workbook(io.BytesIO(raw), read_only=True)
    rows = list(wb.worksheets[0].iter_rows(values_only=True))
    check(rows[0] == ("code", "status"), "header: %s" % (rows[0],))
    check(len(rows) == 5001, "export rows: %d" % len(rows))
    check([r[0] for r in rows[1:]] == codes, "export holds the batch's codes in order")
    check(all(r[1] == 1 for r in rows[1:]), "status column")


def test_resume_and_redelivery():
    """A batch interrupted after some chunks resumes from what the database holds, and a
    redelivered event for a finished batch adds nothing."""
    shop = new_shop()
    tid = make_template(shop)
    bid = random.randint(10 ** 15, 10 ** 17)
    psql(DS0, "INSERT INTO t_exchange_code_batch (id, shop_number, coupon_template_id, count,"
         " generated, status) VALUES (%d, %d, %d, 300, 120, 0)" % (bid, shop, tid))
    # 120 codes already written by an earlier (crashed) delivery
    psql(DS0, "INSERT INTO t_exchange_code (id, batch_id, coupon_template_id, shop_number, code)"
         " SELECT %d + g, %d, %d, %d, 'OLD%d-' || g FROM generate_series(1, 120) g"
         % (bid, bid, tid, shop, bid))
    psql(DS0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('codes.generate',"
         " 'test-resume-%d', '{\"batchId\":\"%d\"}')" % (bid, bid))
    data = wait_ready(bid, shop)
    check(data["generated"] == 300, "resumed: %s" % data)
    n = psql(DS0, "SELECT count(*), count(DISTINCT code) FROM t_exchange_code WHERE batch_id = %d"
             % bid)
    check(n == "300|300", "codes after resume: %s" % n)
    # redeliver twice
    for k in range(2):
        psql(DS0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('codes.generate',"
             " 'test-redeliver-%d-%d', '{\"batchId\":\"%d\"}')" % (bid, k, bid))
    deadline = time.time() + 15
    while time.time() < deadline:
        pending = psql(DS0, "SELECT count(*) FROM t_outbox WHERE msg_key LIKE 'test-redeliver-%d-%%'"
                       " AND status = 0" % bid)
        if pending == "0":
            break
        time.sleep(0.2)
    time.sleep(1.0)  # let the consumer handle what the relay published
    n = psql(DS0, "SELECT count(*) FROM t_exchange_code WHERE batch_id = %d" % bid)
    check(n == "300", "codes after redelivery: %s" % n)


def test_export_before_ready():
    shop = new_shop()
    tid = make_template(shop)
    bid = random.randint(10 ** 15, 10 ** 17)
    # a batch whose generation has not run (no event): still generating
    psql(DS0, "INSERT INTO t_exchange_code_batch (id, shop_number, coupon_template_id, count,"
         " generated, status) VALUES (%d, %d, %d, 10, 0, 0)" % (bid, shop, tid))
    st, _, resp = get("export", shop, batchId=bid)
    check(st == 409 and resp["code"] == "B000104", "export while generating: %s %s"
          % (st, resp))


def test_single_code():
    shop = new_shop()
    tid = make_template(shop)
    st, _, resp = post("create", {"couponTemplateId": tid, "count": 1}, shop)
    check(st == 200, "create: %s %s" % (st, resp))
    data = wait_ready(resp["data"]["batchId"], shop)
    check(data["generated"] == 1, "one code: %s" % data)


def make_big_batch():
    """A ready batch of BIG codes written straight into the database (generating them through
    the service would take minutes): codes X<batch>-<n>, in id order."""
    global big_batch
    if big_batch:
        return big_batch
    shop = new_shop()
    tid = make_template(shop)
    bid = random.randint(10 ** 15, 10 ** 17)
    psql(DS0, "INSERT INTO t_exchange_code_batch (id, shop_number, coupon_template_id, count,"
         " generated, status) VALUES (%d, %d, %d, %d, %d, 1)" % (bid, shop, tid, BIG, BIG))
    psql(DS0, "INSERT INTO t_exchange_code (id, batch_id, coupon_template_id, shop_number, code)"
         " SELECT %d + g, %d, %d, %d, 'X%d-' || g FROM generate_series(1, %d) g"
         % (bid, bid, tid, shop, bid, BIG))
    psql(DS0, "ANALYZE t_exchange_code")
    big_batch = (shop, bid, ["X%d-%d" % (bid, g) for g in range(1, BIG + 1)])
    return big_batch


def open_export(replica, shop, bid, rcvbuf=None):
    """GET export on a raw connection: (connection, response, seconds until the headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", replica.port, timeout=120)
    conn.connect()
    if rcvbuf:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    t0 = time.time()
    conn.request("GET", BASE + "export?batchId=%d" % bid, headers=hdr(shop))
    resp = conn.getresponse()
    return conn, resp, time.time() - t0


def test_large_export_streams_past_the_request_timeout():
    """A batch whose whole .xlsx takes longer to make than the request timeout: the answer
    starts at once and the body follows in chunks until every code is there (the old export
    built the file first and got the timeout's 503)."""
    shop, bid, codes = make_big_batch()
    t0 = time.time()
    conn, resp, first = open_export(short, shop, bid)
    raw = resp.read()
    total = time.time() - t0
    conn.close()
    global big_size
    big_size = len(raw)
    print("  %d codes: headers after %.2fs, %d bytes after %.2fs (timeout %d ms)"
          % (BIG, first, len(raw), total, SHORT_TIMEOUT_MS))
    check(resp.status == 200, "export: %s %s" % (resp.status, raw[:200]))
    check(resp.getheader("Transfer-Encoding") == "chunked", "chunked: %s" % resp.getheaders())
    check(first < SHORT_TIMEOUT_MS / 1000.0, "headers after %.2fs" % first)
    check(("codes-%d.xlsx" % bid) in resp.getheader("Content-Disposition"), "file name")
    check(total > SHORT_TIMEOUT_MS / 1000.0,
          "the whole file took longer than the request timeout (%.2fs): grow BIG" % total)
    # openpyxl opens it as a spreadsheet program would; every row is read by the faster reader
    wb = openpyxl.load_workbook(io.BytesIO(raw), read_only=True)
    check(next(wb.worksheets[0].iter_rows(values_only=True)) == ("code", "status"), "header")
    got = list(sheet_rows(raw))
    diff = first_difference(got, [("code", "status")] + [(code, 1) for code in codes])
    check(diff is None, "%d rows; row %s: %s" % (len(got), diff and diff[0] + 1, diff))
    check(short.proc.poll() is None, "replica alive")


def test_export_pauses_for_a_slow_client():
    """A client that stops reading: the export stops producing once the connection's output
    buffer is full (what it handed over, its buffer and the kernel's, stays far below the
    file), and stops for good when the client goes."""
    shop, bid, _ = make_big_batch()
    seen = len(log_lines(short, GONE))
    conn, resp, _ = open_export(short, shop, bid, rcvbuf=4096)
    check(resp.status == 200, "export: %s" % resp.status)
    resp.read(1000)
    time.sleep(3)  # the service would have made the whole file by now
    conn.close()
    line = wait_log(short, GONE, seen + 1)
    sent = int(re.search(r"after (\d+) bytes", line).group(1))
    print("  stalled client: %d bytes of %d handed over before it left" % (sent, big_size))
    check(big_size and sent < big_size / 2,
          "handed over %d bytes of %d to a client that reads nothing" % (sent, big_size))
    check(request("GET", short.url + "/readyz")[0] == 200, "ready")


def test_export_client_leaves_midway():
    """A client that reads part of a large export and closes: the export stops and frees
    what it held (the sanitized run checks for leaks at exit); the service goes on serving."""
    shop, bid, _ = make_big_batch()
    seen = len(log_lines(short, GONE))
    for _ in range(3):
        conn, resp, _ = open_export(short, shop, bid)
        check(resp.status == 200, "export: %s" % resp.status)
        resp.read(200000)
        conn.close()
    wait_log(short, GONE, seen + 3)
    # nothing of those exports is still running: a small one and the probes answer at once
    st, _, body = get("find", shop, batchId=bid)
    check(st == 200, "find: %s" % st)
    tid = make_template(shop)
    st, _, resp = post("create", {"couponTemplateId": str(tid), "count": 3}, shop)
    check(st == 200, "create: %s %s" % (st, resp))
    small = resp["data"]["batchId"]
    wait_ready(small, shop)
    st, _, raw = request("GET", short.url + BASE + "export?batchId=" + small, None, hdr(shop))
    check(st == 200 and len(openpyxl.load_workbook(io.BytesIO(raw)).worksheets[0]["A"]) == 4,
          "a small export after: %s" % st)
    check(request("GET", short.url + "/readyz")[0] == 200, "ready")


GONE = "client closed during the body"


def log_lines(replica, text):
    with open(replica.log_path, "rb") as f:
        return [ln.decode(errors="replace") for ln in f if text.encode() in ln]


def wait_log(replica, text, count, timeout=15):
    """The count-th line of replica's log holding text, once there is one."""
    deadline = time.time() + timeout
    while True:
        lines = log_lines(replica, text)
        if len(lines) >= count:
            return lines[count - 1]
        if time.time() > deadline:
            raise AssertionError("%d log lines with %r, wanted %d" % (len(lines), text, count))
        time.sleep(0.1)


def main():
    global svc, short
    svc = Service("merchant-admin", {"QUAN_CODE_SECRET": SECRET}).wait_ready()
    short = Service("merchant-admin", {"QUAN_CODE_SECRET": SECRET, "QUAN_LOG_LEVEL": "info",
                                       "QUAN_HTTP_REQUEST_TIMEOUT_MS": str(SHORT_TIMEOUT_MS)})
    short.wait_ready()
    try:
        run([test_create_validation, test_template_checks_and_isolation, test_batch_of_5000,
             test_resume_and_redelivery, test_export_before_ready, test_single_code,
             test_large_export_streams_past_the_request_timeout,
             test_export_pauses_for_a_slow_client, test_export_client_leaves_midway])
    finally:
        svc.stop()
        short.stop()


if __name__ == "__main__":
    main()
