"""quan-distribution against real servers: tasks posted to merchant-admin run to their end.
Every row of a sheet ends in one outcome (issued, or a failure with its cause and row number);
the counters, the coupon rows, the wallets, the stock in PostgreSQL and Redis and the failure
report agree exactly: for an .xlsx written by openpyxl (shared strings, numbers, the Chinese
header), a CSV, per-user limits shared with the engine's claims, two replicas and a message
delivered three times, a replica killed (-9) in the middle of a large task, a template
terminated and a task cancelled while running, files that cannot be read, and templates whose
stock lies in three buckets (every user counted at its home bucket; a bucket that runs dry
takes stock from the others, and "out of stock" only once every bucket is empty)."""

import http.server
import io
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import (CLUSTER, Resp, redis, redis_pipe, sql,  # noqa: E402
                       template_table, user_coupon_table)
from peers import SmtpSink, Webhook  # noqa: E402
from quan import TMP, Service, check, request, run, wait_for  # noqa: E402

import openpyxl  # noqa: E402
from openpyxl.compat import safe_string  # noqa: E402
from stats_truth import statistics_baseline, test_statistics_equal_the_rows
import tplbuckets  # noqa: E402

MA = "/api/merchant-admin/"
ENGINE = "/api/engine"
CHUNK = 2000
LEASE_MS = 3000
SWEEP_MS = 2000
BIG = 200000  # rows of the task whose replica is killed

root = None
ma = en = None
dist = []  # the distribution replicas
ENV = {}
http_srv = None
HOOK = SMTP = None  # the notification peers every replica is configured with


def new_shop():
    return random.randint(10 ** 15, 10 ** 17)


def new_users(n):
    """n distinct user ids no other test uses, below 2^53 (a numeric cell holds them exactly)."""
    base = random.randint(10 ** 15, 8 * 10 ** 15)
    return [base + i * 7 for i in range(n)]


def hdr(shop=None, user=7):
    h = {"X-User-Id": str(user)}
    if shop:
        h["X-Shop-Number"] = str(shop)
    return h


def make_tpl(shop, stock, limit=1, days=30, buckets=None):
    """A template of the shop, open since yesterday, created through merchant-admin (so that the
    engine's Bloom filter knows it, as it knows every real template)."""
    fmt = "%Y-%m-%d %H:%M:%S"
    body = {"name": "test template", "source": 0, "target": 1, "type": 0,
            "validStartTime": time.strftime(fmt, time.localtime(time.time() - 86400)),
            "validEndTime": time.strftime(fmt, time.localtime(time.time() + days * 86400)),
            "stock": stock, "receiveRule": {"limitPerPerson": limit},
            "consumeRule": {"termsOfUse": 0, "maximumDiscountAmount": 10, "validityPeriod": 48}}
    if buckets is not None:
        body["stockBuckets"] = buckets
    st, _, r = request("POST", ma.url + MA + "coupon-template/create", body, hdr(shop))
    check(st == 200, "template create: %s %s" % (st, r))
    return int(r["data"]["id"])


def create_task(shop, tpl, addr, notify="0,2"):
    body = {"taskName": "push %d" % random.randint(1, 10 ** 9), "fileAddress": addr,
            "notifyType": notify, "couponTemplateId": str(tpl), "sendType": 0}
    st, _, r = request("POST", ma.url + MA + "coupon-task/create", body, hdr(shop))
    check(st == 200, "create: %s %s" % (st, r))
    return r["data"]["id"], r["data"]["batchId"]


def find(shop, task_id):
    st, _, r = request("GET", ma.url + MA + "coupon-task/find?taskId=%s" % task_id, None,
                       hdr(shop))
    check(st == 200, "find: %s %s" % (st, r))
    return r["data"]


def wait_end(shop, task_id, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = find(shop, task_id)
        if t["status"] in (2, 3, 4):
            return t
        time.sleep(0.2)
    raise AssertionError("task %s did not end: %s\n%s" % (
        task_id, find(shop, task_id), "\n".join(d.tail(15) for d in dist)))


def wait_progress(shop, task_id, rows, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = find(shop, task_id)
        if t["processedRows"] >= rows or t["status"] != 1:
            return t
        time.sleep(0.05)
    raise AssertionError("task %s made no progress: %s" % (task_id, find(shop, task_id)))


# ---------------------------------------------------------------- sheets and the model

INLINE = re.compile(r'<c r="([A-Z]+[0-9]+)"( s="[0-9]+")? t="inlineStr"><is><t( [^>]*)?>(.*?)</t>'
                    r'</is></c>', re.S)


def shared_strings(path):
    """Rewrites the .xlsx at path the way Excel saves it: its text cells (openpyxl writes them
    inline) into the shared-string table xl/sharedStrings.xml."""
    index, table = {}, []

    def ref(m):
        text = m.group(4)
        if text not in index:
            index[text] = len(table)
            table.append(text)
        return '<c r="%s"%s t="s"><v>%d</v></c>' % (m.group(1), m.group(2) or "", index[text])
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    sheet = INLINE.sub(ref, parts["xl/worksheets/sheet1.xml"].decode())
    parts["xl/worksheets/sheet1.xml"] = sheet.encode()
    parts["xl/sharedStrings.xml"] = (
        '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<sst xmlns="http://schemas.'
        'openxmlformats.org/spreadsheetml/2006/main" count="%d" uniqueCount="%d">%s</sst>'
        % (len(table), len(table), "".join('<si><t xml:space="preserve">%s</t></si>' % t
                                           for t in table))).encode()
    parts["[Content_Types].xml"] = parts["[Content_Types].xml"].replace(
        b"</Types>", b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.'
        b'openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/></Types>')
    parts["xl/_rels/workbook.xml.rels"] = parts["xl/_rels/workbook.xml.rels"].replace(
        b"</Relationships>", b'<Relationship Id="rIdSst" Type="http://schemas.openxmlformats.org/'
        b'officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
        b"</Relationships>")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in parts.items():
            z.writestr(n, data)
    return len(table)


def write_xlsx(name, rows, header=("用户ID", "手机号", "邮箱"), shared=False):
    """rows: (user id cell: str, int, float or None, phone, mail), written by openpyxl: strings
    inline (as openpyxl writes them) or, shared, in the shared-string table; numbers as
    numeric cells."""
    path = os.path.join(root, name)
    wb = openpyxl.Workbook(write_only=True)
    ws = wb.create_sheet()
    if header:
        ws.append(list(header))
    for r in rows:
        ws.append(list(r))
    wb.save(path + ".part")
    if shared:
        check(shared_strings(path + ".part") > len(rows) // 2, "a shared-string table")
    os.rename(path + ".part", path)
    return path


def write_csv(name, rows, header=("userId", "phone", "mail")):
    path = os.path.join(root, name)
    with open(path, "w", encoding="utf-8") as f:
        if header:
            f.write(",".join(header) + "\r\n")
        for r in rows:
            f.write(",".join("" if v is None else str(v) for v in r) + "\r\n")
    return path


def as_written(v):
    """The user id cell as the sheet stores it (what the failure report shows): a number as
    openpyxl writes it (an int beyond 2^53 as the double it becomes, in exponent form)."""
    if v is None or v == "":
        return None
    return safe_string(v)


def user_id(v):
    """taskrow.h's rule: digits only (ASCII blanks around), 1..2^63-1."""
    if v is None:
        return 0
    if isinstance(v, (int, float)):
        v = as_written(v)
    s = v.strip(" \t\r\n")
    if not s or not all("0" <= c <= "9" for c in s):
        return 0
    n = int(s)
    return n if 0 < n < 2 ** 63 else 0


def model(rows, stock, limit=1, held=None, first_row=2):
    """The outcome of every row, in order: (row number, user id or 0, cause or None, count)."""
    held = dict(held or {})
    seen = set()
    out = []
    for i, r in enumerate(rows):
        u = user_id(r[0])
        if not u:
            out.append((first_row + i, 0, "invalid user id", 0))
        elif u in seen:
            out.append((first_row + i, u, "duplicate in file", 0))
        else:
            seen.add(u)
            if held.get(u, 0) >= limit:
                out.append((first_row + i, u, "limit reached", 0))
            elif stock <= 0:
                out.append((first_row + i, u, "out of stock", 0))
            else:
                stock -= 1
                held[u] = held.get(u, 0) + 1
                out.append((first_row + i, u, None, held[u]))
    return out


# ---------------------------------------------------------------- what the stores hold

def coupons(task_id):
    """Every coupon of the task: (user, id, template, receive_count, status, valid hours)."""
    out = []
    for ds in (0, 1):
        parts = ["SELECT user_id, id, coupon_template_id, receive_count, status, "
                 "round(extract(epoch from valid_end_time - valid_start_time) / 3600) "
                 "FROM t_user_coupon_%d WHERE request_id LIKE 'dist/%s:%%'" % (t, task_id)
                 for t in range(16 * ds, 16 * ds + 16)]
        out += [tuple(int(x) for x in row[:5]) + (int(float(row[5])),)
                for row in sql(ds, " UNION ALL ".join(parts))]
    return out


def user_coupon_counts(tpl, users):
    """How many coupons of tpl each of users holds, in the database."""
    by = {}
    for u in users:
        by.setdefault(user_coupon_table(u), []).append(u)
    got = {}
    for (ds, table), us in by.items():
        for u, n in sql(ds, "SELECT user_id, count(*) FROM %s WHERE coupon_template_id = %d AND "
                            "user_id IN (%s) GROUP BY user_id"
                        % (table, tpl, ",".join(map(str, us)))):
            got[int(u)] = int(n)
    return got


def db_stock(shop, tpl):
    ds, table = template_table(shop)
    return int(sql(ds, "SELECT stock FROM %s WHERE id = %d" % (table, tpl))[0][0])


def tpl_buckets(tpl):
    """The template's stock buckets, as its cache hash says (absent: one)."""
    return int(redis("HGET", "quan:tpl:{%d}" % tpl, "buckets") or 1)


def redis_stock(tpl):
    """The stock over the template's buckets (none on its way between two once a task ended:
    a chunk finishes the transfers it begins)."""
    n = tpl_buckets(tpl)
    total = 0
    for b in range(n):
        h = tplbuckets.keys(tpl, b, n)[0]
        check(int(redis("HGET", h, "xo") or 0) == 0, "no transfer on its way at bucket %d" % b)
        total += int(redis("HGET", h, "stock"))
    return total


WALLET_LUA = """
local bad, prefix = 0, ARGV[1]
for i = 1, #KEYS do
  local n = 0
  for _, v in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
    if string.sub(v, 1, #prefix) == prefix then n = n + 1 end
  end
  if n ~= tonumber(ARGV[2 * i + 1]) or not redis.call('ZSCORE', KEYS[i], ARGV[2 * i]) then
    bad = bad + 1
  end
end
return bad
"""


def wallets_bad(tpl, cs, held_before):
    """Issued coupons cs whose user's wallet does not hold that coupon, and as many of tpl as
    the user held before plus this one."""
    sha = redis("SCRIPT", "LOAD", WALLET_LUA)
    if CLUSTER:
        # Wallets of many users lie in many slots: one key a script, pipelined (MOVED followed).
        r = Resp()
        out = r.pipeline([["EVALSHA", sha, 1, "quan:wallet:{%d}" % c[0], "%d_" % tpl,
                           "%d_%d" % (tpl, c[1]), held_before.get(c[0], 0) + 1] for c in cs])
        r.close()
        return sum(int(x) for x in out)
    cmds = []
    for i in range(0, len(cs), 1000):
        part = cs[i:i + 1000]
        args = []
        for c in part:
            args += ["%d_%d" % (tpl, c[1]), held_before.get(c[0], 0) + 1]
        cmds.append(["EVALSHA", sha, len(part)] + ["quan:wallet:{%d}" % c[0] for c in part]
                    + ["%d_" % tpl] + args)
    out = redis_pipe(cmds).split()
    return sum(int(x) for x in out) if cmds else 0


def fail_report(shop, task_id):
    st, _, raw = request("GET", ma.url + MA + "coupon-task/fail-report?taskId=%s" % task_id,
                         None, hdr(shop), timeout=60)
    check(st == 200, "fail report: %s" % st)
    rows = list(openpyxl.load_workbook(io.BytesIO(raw), read_only=True).worksheets[0]
                .iter_rows(values_only=True))
    check(rows[0] == ("row number", "user id", "cause"), "report header: %s" % (rows[0],))
    return rows[1:]


def verify(shop, tpl, task_id, rows, expected, stock0, held_before=None):
    """Everything a finished task must show, against the model's outcomes."""
    t = find(shop, task_id)
    issued = [e for e in expected if e[2] is None]
    failed = [e for e in expected if e[2] is not None]
    check(t["status"] == 3 and t["completionTime"], "succeeded: %s" % t)
    check(t["sendNum"] == len(rows) and t["processedRows"] == len(rows),
          "rows: %s of %d" % (t, len(rows)))
    check(t["successNum"] == len(issued) and t["failNum"] == len(failed),
          "counters %s/%s, wanted %d/%d" % (t["successNum"], t["failNum"], len(issued),
                                            len(failed)))
    cs = coupons(task_id)
    check(len(cs) == len(issued), "coupon rows: %d, issued %d" % (len(cs), len(issued)))
    by_user = {}
    for c in cs:
        by_user.setdefault(c[0], []).append(c)
    check(all(len(v) == 1 for v in by_user.values()), "a user with two coupons of the task")
    want_users = {e[1] for e in issued}
    check(set(by_user) == want_users, "the issued users: %s more, %s missing" % (
        sorted(set(by_user) - want_users)[:3], sorted(want_users - set(by_user))[:3]))
    counts = {e[1]: e[3] for e in issued}
    check(all(c[3] == counts[c[0]] and c[2] == tpl and c[4] == 0 and c[5] == 48 for c in cs),
          "receive counts, template, status, validity: %s" % cs[:3])
    held_before = held_before or {}
    check(wallets_bad(tpl, cs, held_before) == 0,
          "every issued user's wallet holds its coupon, once")
    counts = user_coupon_counts(tpl, list(by_user))
    check(all(counts[u] == held_before.get(u, 0) + 1 for u in by_user),
          "each issued user holds one more coupon of the template")
    check(db_stock(shop, tpl) == stock0 - len(issued),
          "database stock %d, wanted %d" % (db_stock(shop, tpl), stock0 - len(issued)))
    check(redis_stock(tpl) == db_stock(shop, tpl),
          "Redis stock %d = database stock %d" % (redis_stock(tpl), db_stock(shop, tpl)))
    report = fail_report(shop, task_id)
    want = [(e[0], as_written(rows[e[0] - expected[0][0]][0]), e[2]) for e in failed]
    check(len(report) == t["failNum"], "report rows %d = failNum %d" % (len(report), t["failNum"]))
    check(report == want, "report: first differences %s" % [
        (a, b) for a, b in zip(report, want) if a != b][:3])
    return t, cs


# ---------------------------------------------------------------- tests

def test_xlsx_exact():
    """20,000 rows written by openpyxl (shared strings, numeric and text ids, the Chinese
    header), 500 duplicates and 100 malformed ids, stock below the valid users."""
    shop = new_shop()
    users = new_users(19400)
    rows = []
    for i, u in enumerate(users):
        cell = u if i % 5 == 0 else str(u)  # every fifth a numeric cell
        rows.append((cell, "1380000%04d" % (i % 10000), "u%d@example.com" % i if i % 3 else None))
    bad = ["abc", "0", "-12", "1.5", 1.5, "1e5", 1e20, None, 3574555643696200708,
           "9223372036854775808"]
    for k in range(100):
        rows.insert(random.randrange(len(rows)), (bad[k % 10], "139%08d" % k, None))
    for k in range(500):
        rows.insert(random.randrange(len(rows)), (str(random.choice(users[:5000])), None, None))
    check(len(rows) == 20000, "20,000 rows")
    stock = 15000
    tpl = make_tpl(shop, stock)
    path = write_xlsx("exact.xlsx", rows, shared=True)
    task_id, _ = create_task(shop, tpl, path)
    t0 = time.time()
    t = wait_end(shop, task_id)
    print("  20,000 rows in %.1fs: %s issued, %s failed" % (time.time() - t0, t["successNum"],
                                                           t["failNum"]))
    expected = model(rows, stock)
    verify(shop, tpl, task_id, rows, expected, stock)
    causes = {}
    for e in expected:
        causes[e[2]] = causes.get(e[2], 0) + 1
    check(causes["duplicate in file"] == 500 and causes["invalid user id"] == 100 and
          causes["out of stock"] == 19400 - stock and causes[None] == stock, "causes: %s" % causes)
    # the notification events: one per chunk, issued users only, empty fields left out
    evs = [json.loads(r[0]) for r in sql(0, "SELECT payload FROM t_outbox WHERE topic = "
                                            "'task.notify' AND msg_key LIKE 'task.notify:%s:%%' "
                                            "ORDER BY id" % task_id)]
    chunks = {(e[0] - 2) // CHUNK for e in expected if e[2] is None}
    check(len(evs) == len(chunks), "one event per chunk that issued: %d of %d"
          % (len(evs), len(chunks)))
    d = evs[0]
    check(d["taskId"] == task_id and d["couponTemplateId"] == str(tpl) and
          d["shopNumber"] == str(shop) and d["notifyType"] == "0,2", "event: %s" % d)
    want = []
    for e in expected[:CHUNK]:
        if e[2] is None:
            _, phone, mail = rows[e[0] - 2]
            u = {"userId": str(e[1])}
            u.update({"mail": mail} if mail else {})  # no SMS (3) in "0,2": no phone
            want.append(u)
    check(d["users"] == want, "the first chunk's issued users, the mail as written (e-mail is "
          "sent), no phone (SMS is not), empty ones left out")
    check(sum(len(e["users"]) for e in evs) == stock, "every issued user notified once")


def home_counts_bad(tpl, users):
    """Users of users whose count is not 1 at their home bucket, or who have one elsewhere."""
    n = tpl_buckets(tpl)
    bad = []
    for b in range(n):
        key = tplbuckets.keys(tpl, b, n)[1]
        mine = [u for u in users if tplbuckets.home(u, n) == b]
        other = [u for u in users if tplbuckets.home(u, n) != b]
        for i in range(0, len(mine), 500):
            got = redis("HMGET", key, *mine[i:i + 500]).split("\n")
            bad += [u for u, v in zip(mine[i:i + 500], got) if v.strip() != "1"]
        for i in range(0, len(other), 500):
            got = redis("HMGET", key, *other[i:i + 500]).split("\n")
            bad += [u for u, v in zip(other[i:i + 500], got) if v.strip()]
    return bad


def users_at_home(n, counts):
    """Fresh user ids whose home buckets among n are counts[b] for bucket b, shuffled."""
    want = list(counts)
    out = []
    u = random.randint(10 ** 15, 8 * 10 ** 15)
    while any(want):
        b = tplbuckets.home(u, n)
        if want[b]:
            want[b] -= 1
            out.append(u)
        u += 1
    random.shuffle(out)
    return out


def test_three_buckets_exact():
    """A template of three buckets, more stock than users: each user one coupon, counted at
    its home bucket only; the buckets' stock sums to the database's."""
    shop = new_shop()
    users = new_users(4500)
    rows = [(str(u), None, None) for u in users]
    for k in range(100):
        rows.insert(random.randrange(len(rows)), (str(random.choice(users)), None, None))
    stock = 6000
    tpl = make_tpl(shop, stock, buckets=3)
    check(tpl_buckets(tpl) == 3, "the template has three buckets")
    path = write_csv("three.csv", rows)
    task_id, _ = create_task(shop, tpl, path, notify="0")
    wait_end(shop, task_id)
    expected = model(rows, stock)
    verify(shop, tpl, task_id, rows, expected, stock)
    check(redis_stock(tpl) == stock - len(users), "Redis stock over the buckets")
    homes = [tplbuckets.home(u, 3) for u in users]
    check(all(homes.count(b) > 1000 for b in range(3)), "users in every bucket")
    bad = home_counts_bad(tpl, users)
    check(not bad, "%d users not counted once at their home bucket: %s" % (len(bad), bad[:3]))


def test_task_waits_while_buckets_change():
    """A task of a template whose stock buckets are changing does not start (its chunks route
    users by the number the run reads at its start) and runs once the engine's re-layout is
    over, on the new number; while it is in progress, another change is refused."""
    shop, stock = new_shop(), 1000
    users = new_users(300)
    tpl = make_tpl(shop, stock, buckets=1)
    # a claim in flight on the old bucket (its reservation open): the re-layout waits for it
    held = tplbuckets.keys(tpl, 0, 1)[2]
    redis("ZADD", held, str(int(time.time() * 1000)), "77:held")
    body = {"couponTemplateId": str(tpl), "stockBuckets": 3}
    st, _, r = request("POST", ma.url + MA + "coupon-template/change-buckets", body, hdr(shop))
    check(st == 202, "the change is under way: %s %s" % (st, r))
    task_id, _ = create_task(shop, tpl, write_csv("relayout.csv", [(str(u), None, None)
                                                                   for u in users]), notify="0")
    time.sleep(3)
    t = find(shop, task_id)
    check(t["processedRows"] == 0 and not coupons(task_id), "the task waits: %s" % t)
    body["stockBuckets"] = 2
    st, _, r = request("POST", ma.url + MA + "coupon-template/change-buckets", body, hdr(shop))
    check(st == 409 and r["code"] == "B000104", "no change while a change is under way: %s %s"
          % (st, r))
    redis("ZREM", held, "77:held")
    ds, table = template_table(shop)
    check(wait_for(lambda: sql(ds, "SELECT coalesce(buckets_relayout_from, 0) FROM %s WHERE "
                                   "id = %d" % (table, tpl)) == [["0"]], 60),
          "the re-layout is over:\n%s" % en.tail(10))
    t = wait_end(shop, task_id, timeout=180)
    check(t["status"] == 3 and t["successNum"] == len(users), "the task ran after it: %s" % t)
    check(tpl_buckets(tpl) == 3, "on the new number")
    bad = home_counts_bad(tpl, users)
    check(not bad, "%d users not counted once at their home among 3: %s" % (len(bad), bad[:3]))
    check(redis_stock(tpl) == stock - len(users) == db_stock(shop, tpl),
          "Redis stock over the buckets = the database's")


def check_sold_to_the_stock(shop, tpl, task_id, stock, total, sample=None):
    """A task of total users on a template of stock below them, ended: one coupon per issued
    user, no stock left in the database or any bucket, every other user "out of stock", and
    each issued user (or sample of them) counted once at the home bucket. Returns the coupons."""
    cs = coupons(task_id)
    check(len(cs) == stock and len({c[0] for c in cs}) == stock, "one coupon per issued user")
    check(db_stock(shop, tpl) == 0 and redis_stock(tpl) == 0, "no stock left anywhere")
    report = fail_report(shop, task_id)
    check(len(report) == total - stock and all(r[2] == "out of stock" for r in report),
          "every failure is out of stock: %s" % {r[2] for r in report})
    issued = {c[0] for c in cs}
    check(not (issued & {int(r[1]) for r in report}), "no user both issued and failed")
    users = sorted(issued)
    bad = home_counts_bad(tpl, random.sample(users, sample) if sample else users)
    check(not bad, "%d users not counted once at their home bucket" % len(bad))
    return cs


def test_three_buckets_one_hot():
    """Stock below the users, 80 % of whom share one bucket: the hot bucket takes the others'
    stock, every unit is issued, and only the users after the last unit are out of stock."""
    shop = new_shop()
    n, total, stock = 3, 5000, 3000
    hot = random.randrange(n)
    counts = [total // 10] * n
    counts[hot] = total - (n - 1) * (total // 10)
    users = users_at_home(n, counts)
    rows = [(str(u), None, None) for u in users]
    tpl = make_tpl(shop, stock, buckets=n)
    path = write_csv("hot.csv", rows)
    task_id, _ = create_task(shop, tpl, path, notify="0")
    t = wait_end(shop, task_id)
    check(t["status"] == 3, "succeeded: %s" % t)
    check(t["successNum"] == stock and t["failNum"] == total - stock,
          "every unit issued, the rest failed: %s" % t)
    cs = check_sold_to_the_stock(shop, tpl, task_id, stock, total)
    print("  hot bucket %d: %d of %d users, %d issued" % (hot, counts[hot], total, len(cs)))


def test_three_buckets_killed():
    """kill -9 of the replica running a task on a template of three buckets, 80 % of the users
    in one, stock below the users: started again, every unit is issued once, the rest are out
    of stock, no unit lost in a bucket or on its way."""
    while len(dist) > 1:
        dist.pop().stop()
    shop = new_shop()
    n, total, stock = 3, 80000, 50000
    counts = [total // 10] * n
    counts[0] = total - (n - 1) * (total // 10)
    users = users_at_home(n, counts)
    rows = [(str(u), None, None) for u in users]
    tpl = make_tpl(shop, stock, buckets=n)
    path = write_csv("hot-killed.csv", rows)
    task_id, _ = create_task(shop, tpl, path, notify="0")
    t = wait_progress(shop, task_id, 16000)
    check(t["status"] == 1, "still running at %s rows" % t["processedRows"])
    dist[0].proc.send_signal(signal.SIGKILL)
    dist[0].proc.wait()
    print("  killed after %d rows" % find(shop, task_id)["processedRows"])
    dist[0] = Service("distribution", ENV).wait_ready()
    t = wait_end(shop, task_id, 180)
    check(t["status"] == 3 and t["successNum"] == stock and t["failNum"] == total - stock,
          "every unit issued, the rest failed: %s" % t)
    check_sold_to_the_stock(shop, tpl, task_id, stock, total, sample=2000)


def claim(user, shop, tpl):
    st, _, r = request("POST", en.url + ENGINE + "/user-coupon/redeem",
                       {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)},
                       hdr(None, user), timeout=30)
    check(st == 200, "claim: %s %s" % (st, r))


def test_limits_shared_with_claims_csv():
    """CSV; stock above the users; a user who claimed in the engine (limit 1) is refused with
    'limit reached'; with limit 2 a user who claimed once gets a second coupon (receive count
    2)."""
    shop = new_shop()
    one = make_tpl(shop, 1000, limit=1)
    two = make_tpl(shop, 1000, limit=2)
    users = new_users(60)
    claim(users[3], shop, one)
    claim(users[5], shop, two)
    rows = [(str(u), "1381234%04d" % i, "m%d@x" % i) for i, u in enumerate(users)]
    for tpl, held in ((one, {users[3]: 1}), (two, {users[5]: 1})):
        path = write_csv("limits-%d.csv" % tpl, rows)
        task_id, _ = create_task(shop, tpl, path)
        wait_end(shop, task_id)
        expected = model(rows, 999, limit=1 if tpl == one else 2, held=held)
        _, cs = verify(shop, tpl, task_id, rows, expected, 999, held_before=held)
        if tpl == one:
            check([e[2] for e in expected if e[1] == users[3]] == ["limit reached"],
                  "the claimer is refused")
        else:
            check([c[3] for c in cs if c[0] == users[5]] == [2], "its second coupon: count 2")
        check(len(cs) == 59 if tpl == one else len(cs) == 60, "issued: %d" % len(cs))


def test_no_header_and_rows_numbered():
    """A sheet without a header: its first row is data (row 1); an empty row keeps the sheet's
    numbering."""
    shop = new_shop()
    tpl = make_tpl(shop, 100)
    users = new_users(3)
    path = write_csv("nohead.csv", [(users[0], None, None), (users[1], None, None),
                                     (None, None, None), ("x", None, None),
                                     (users[2], None, None)], header=None)
    task_id, _ = create_task(shop, tpl, path)
    t = wait_end(shop, task_id)
    check(t["status"] == 3 and t["successNum"] == 3 and t["failNum"] == 1, "counts: %s" % t)
    check(fail_report(shop, task_id) == [(4, "x", "invalid user id")], "row 4 (row 3 empty)")


def test_notified_end_to_end():
    """notifyType "0,2,3": once the task ends, the webhook has had every issued user once per
    webhook channel (in-app, SMS with the phones) and the SMTP sink one mail per issued user with
    an address; refused rows are told nothing."""
    shop = new_shop()
    tpl = make_tpl(shop, 5)
    users = new_users(7)
    rows = [(u, "1390000%04d" % i, "n%d@users.test" % i if i % 2 == 0 else None)
            for i, u in enumerate(users)]
    path = write_csv("notify.csv", rows)
    task_id, _ = create_task(shop, tpl, path, notify="0,2,3")
    t = wait_end(shop, task_id)
    check(t["status"] == 3 and t["successNum"] == 5 and t["failNum"] == 2, "counts: %s" % t)
    issued = {str(u) for u in users[:5]}
    mails = {"<n%d@users.test>" % i for i in range(0, 5, 2)}

    def sent():
        posts = HOOK.received(lambda p: p["taskId"] == task_id)
        got = {c: [u for p in posts if p["channel"] == c for u in p["userIds"]]
               for c in ("app", "sms")}
        to = [r for m in SMTP.received(lambda m: set(m[1]) <= mails) for r in m[1]]
        return got, sorted(to)

    def complete():
        got, to = sent()
        return (sorted(got["app"]) == sorted(issued) and sorted(got["sms"]) == sorted(issued)
                and to == sorted(mails))

    wait_for(complete, 60)  # a retried delivery (QUAN_MQ_RETRY_DELAY_MS) fits in too
    got, to = sent()
    check(sorted(got["app"]) == sorted(issued) and sorted(got["sms"]) == sorted(issued),
          "in-app and SMS: each issued user once: %s" % got)
    check(to == sorted(mails), "one mail per issued user with an address: %s" % to)
    phones = [ph for p in HOOK.received(lambda p: p["taskId"] == task_id and p["channel"] == "sms")
              for ph in p.get("phones", [])]
    check(sorted(phones) == sorted(r[1] for r in rows[:5]), "SMS carries the phones: %s" % phones)


def dist_logs(text, task_id):
    n = 0
    for d in dist:
        with open(d.log_path, "rb") as f:
            n += sum(1 for ln in f if ("task %s: %s" % (task_id, text)).encode() in ln)
    return n


def test_two_replicas_three_deliveries():
    """Two replicas consume; the task's task.execute is delivered three times: one run."""
    if len(dist) < 2:
        dist.append(Service("distribution", ENV).wait_ready())
    shop = new_shop()
    users = new_users(30000)
    rows = [(str(u), None, None) for u in users]
    tpl = make_tpl(shop, 30000)
    path = write_xlsx("twice.xlsx", rows)
    task_id, batch = create_task(shop, tpl, path)
    payload = json.dumps({"taskId": task_id, "batchId": batch, "shopNumber": str(shop),
                          "couponTemplateId": str(tpl)})
    for _ in range(2):  # a relay publishing twice, a replayed dead letter...
        sql(0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('task.execute', "
               "'task.execute:%s', '%s')" % (task_id, payload))
    wait_end(shop, task_id)
    verify(shop, tpl, task_id, rows, model(rows, 30000), 30000)
    time.sleep(1.5)  # the extra deliveries are consumed by now
    check(dist_logs("run started", task_id) == 1 and dist_logs("run resumed", task_id) == 0,
          "one run: %d started, %d resumed" % (dist_logs("run started", task_id),
                                                dist_logs("run resumed", task_id)))
    ex = sql(0, "SELECT count(DISTINCT execution_id), count(*) FROM t_coupon_task_chunk WHERE "
                "task_id = %s" % task_id)[0]
    check(ex == ["1", str(30000 // CHUNK)], "every chunk by the one run: %s" % ex)
    pending = sql(0, "SELECT count(*) FROM t_outbox WHERE msg_key = 'task.execute:%s' AND "
                     "status = 0" % task_id)[0][0]
    check(pending == "0", "all three were published")


def test_kill_in_the_middle():
    """kill -9 of the replica running a 200,000-row task; it is started again: the task ends
    with exact counts, nothing issued twice or lost (DB, Redis, wallets, report)."""
    while len(dist) > 1:
        dist.pop().stop()
    shop = new_shop()
    users = new_users(BIG - 1000)
    rows = [(str(u), "137%08d" % (i % 10 ** 8), None) for i, u in enumerate(users)]
    for k in range(1000):
        rows.insert(random.randrange(len(rows)), (str(users[k * 37]) if k % 2 else "bad%d" % k,
                                                  None, None))
    stock = BIG - 20000
    tpl = make_tpl(shop, stock)
    t0 = time.time()
    path = write_xlsx("big.xlsx", rows)
    print("  sheet of %d rows written in %.1fs" % (len(rows), time.time() - t0))
    task_id, _ = create_task(shop, tpl, path)
    t = wait_progress(shop, task_id, 40000)
    check(t["status"] == 1, "still running at %s rows" % t["processedRows"])
    dist[0].proc.send_signal(signal.SIGKILL)
    dist[0].proc.wait()
    at = find(shop, task_id)["processedRows"]
    print("  killed after %d rows" % at)
    dist[0] = Service("distribution", ENV).wait_ready()
    t0 = time.time()
    t = wait_end(shop, task_id, 180)
    print("  resumed and ended in %.1fs" % (time.time() - t0))
    check(dist_logs("run resumed", task_id) >= 1, "the new process resumed the run")
    verify(shop, tpl, task_id, rows, model(rows, stock), stock)
    first = sql(0, "SELECT min(chunk_no) FROM t_coupon_task_chunk WHERE task_id = %s AND "
                   "execution_id <> (SELECT execution_id FROM t_coupon_task_chunk WHERE task_id = "
                   "%s AND chunk_no = 0)" % (task_id, task_id))[0][0]
    check(int(first) * CHUNK >= at - CHUNK, "resumed from the last committed chunk (%s), not "
          "from the first row" % first)


def running_task(name, n):
    """A task of n new users (stock n) past its first chunk: (shop, template, task id)."""
    shop = new_shop()
    tpl = make_tpl(shop, n)
    path = write_csv(name, [(str(u), None, None) for u in new_users(n)])
    task_id, _ = create_task(shop, tpl, path)
    wait_progress(shop, task_id, CHUNK)
    return shop, tpl, task_id


def test_template_terminated_mid_run():
    shop, tpl, task_id = running_task("term.csv", 60000)
    st, _, r = request("POST", ma.url + MA + "coupon-template/terminate",
                       {"couponTemplateId": str(tpl)}, hdr(shop))
    check(st == 200, "terminate: %s %s" % (st, r))
    t = wait_end(shop, task_id)
    check(t["status"] == 3 and t["processedRows"] == 60000 and
          t["successNum"] + t["failNum"] == 60000, "all rows have an outcome: %s" % t)
    check(0 < t["successNum"] < 60000, "some issued before the end: %s" % t["successNum"])
    report = fail_report(shop, task_id)
    check(len(report) == t["failNum"] and all(c == "template ended" for _, _, c in report),
          "the rest failed with 'template ended'")
    check(report[0][0] == t["successNum"] + 2 and report[-1][0] == 60001,
          "the rows after the end, in order")
    check(len(coupons(task_id)) == t["successNum"], "coupons = successNum")
    check(db_stock(shop, tpl) == 60000 - t["successNum"], "database stock")


def test_cancel_mid_run():
    shop, tpl, task_id = running_task("cancel.csv", 80000)
    st, _, r = request("POST", ma.url + MA + "coupon-task/cancel", {"taskId": task_id}, hdr(shop))
    check(st == 200, "cancel a running task: %s %s" % (st, r))
    t = wait_end(shop, task_id)
    check(t["status"] == 4, "cancelled: %s" % t)
    check(0 < t["processedRows"] < 80000 and t["processedRows"] % CHUNK == 0,
          "stopped at a chunk boundary: %s" % t["processedRows"])
    check(t["successNum"] == t["processedRows"] and t["failNum"] == 0, "counters: %s" % t)
    check(len(coupons(task_id)) == t["successNum"], "coupons = successNum")
    check(db_stock(shop, tpl) == 80000 - t["successNum"] and
          redis_stock(tpl) == db_stock(shop, tpl), "stock")
    st, _, r = request("POST", ma.url + MA + "coupon-task/cancel", {"taskId": task_id}, hdr(shop))
    check(st == 409, "a cancelled task: %s" % st)


class Files(http.server.BaseHTTPRequestHandler):
    """The files of root by name, over http; 404 for any other path."""

    def do_GET(self):  # noqa: N802 - http.server's naming
        path = os.path.join(root, os.path.basename(self.path))
        if not os.path.isfile(path):
            self.send_response(404)
            self.end_headers()
            return
        with open(path, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_from_a_url():
    """An http fileAddress: the sheet is downloaded (common/outbound/fetch) and run like a local one."""
    shop = new_shop()
    tpl = make_tpl(shop, 10)
    users = new_users(3)
    write_csv("by-url.csv", [(u, None, None) for u in users])
    url = "http://127.0.0.1:%d/by-url.csv" % http_srv.server_address[1]
    task_id, _ = create_task(shop, tpl, url)
    t = wait_end(shop, task_id)
    check(t["status"] == 3 and t["successNum"] == 3 and t["failNum"] == 0, "counts: %s" % t)
    check(sorted(c[0] for c in coupons(task_id)) == sorted(users), "the three users' coupons")


def test_unreadable_files():
    shop = new_shop()
    tpl = make_tpl(shop, 10)
    bad = os.path.join(root, "notes.xlsx")
    with open(bad, "w") as f:
        f.write("this is not a workbook\n")
    url = "http://127.0.0.1:%d/users.xlsx" % http_srv.server_address[1]
    for addr, why in ((bad, "not an xlsx"), (url, "404")):
        task_id, _ = create_task(shop, tpl, addr)
        t = wait_end(shop, task_id, 60)
        check(t["status"] == 2 and t["failReason"].startswith("the spreadsheet cannot be read")
              and why in t["failReason"], "failed with a reason: %s" % t)
        check(t["completionTime"] and t["successNum"] == 0, "ended: %s" % t)


def main():
    global root, ma, en, http_srv, HOOK, SMTP
    root = tempfile.mkdtemp(prefix="quan-dist-", dir=TMP)
    http_srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=http_srv.serve_forever, daemon=True).start()
    ENV.update({"QUAN_FILE_ROOT": root, "QUAN_FILE_ALLOW_INTERNAL": "true",
                "QUAN_DIST_CHUNK_ROWS": str(CHUNK), "QUAN_DIST_LEASE_MS": str(LEASE_MS),
                "QUAN_DIST_SWEEP_MS": str(SWEEP_MS),
                "QUAN_LOG_LEVEL": "info"})  # the runs' start and end lines are checked
    HOOK, SMTP = Webhook(), SmtpSink()
    ENV.update({"QUAN_NOTIFY_WEBHOOK_URL": HOOK.url, "QUAN_SMTP_URL": SMTP.url,
                "QUAN_SMTP_FROM": "coupons@quan.test"})
    try:
        ma = Service("merchant-admin", ENV)
        en = Service("engine", ENV)
        dist.append(Service("distribution", ENV))
        for s in [ma, en] + dist:
            s.wait_ready()
        statistics_baseline()
        run([test_xlsx_exact, test_limits_shared_with_claims_csv, test_no_header_and_rows_numbered,
             test_notified_end_to_end,
             test_two_replicas_three_deliveries, test_kill_in_the_middle,
             test_template_terminated_mid_run, test_cancel_mid_run, test_from_a_url,
             test_unreadable_files, test_three_buckets_exact, test_three_buckets_one_hot,
             test_three_buckets_killed, test_task_waits_while_buckets_change,
             test_statistics_equal_the_rows])
    finally:
        for s in [ma, en] + dist:
            if s:
                s.stop()
        http_srv.shutdown()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
