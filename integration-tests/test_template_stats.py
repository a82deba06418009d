"""Template statistics of quan-merchant-admin (/coupon-template/stats and /stats/series)
against real servers: coupons written and changed directly with SQL in t_user_coupon_N of both
databases (every channel, batches, lock with a discount, unlock, pay, refund, expire, revoke),
then the answer compared with the truth counted over the coupon tables (and the changes this
suite made), before the rollup ran (a replica with QUAN_STATS_ROLLUP_MS=0: every figure from
the deltas), after it drained them (a replica rolling every 100 ms; its counter moved) and with
both mixed; the series per minute, hour and day of deltas placed in the past on both databases,
before and after the rollup; the shop's summary (every template, zeros for one without coupons,
another shop's and a deleted template's figures left out) sorted by two figures both ways, ties
newest first, paged, each record equal to the template's own answer; a backlog of deltas no one
statement moves within the statement timeout drained in batches; the export as .xlsx
(read back with openpyxl) and .csv, its totals equal to the JSON answer and its series rows to
/stats/series; 404 for another shop's template; 400 naming the field for bad parameters."""

import csv
import datetime
import io
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import (make_merchant_template, metric, new_id, new_shop, sql,  # noqa: E402
                       template_table, user_coupon_table)
from quan import Service, check, request, run, wait_for  # noqa: E402

import openpyxl  # noqa: E402

BASE = "/api/merchant-admin/coupon-template/stats"
ZONE = datetime.timezone(datetime.timedelta(hours=8))  # QUAN_TIMEZONE below

svc = None  # rollup off: the deltas stay
roller = None  # rolls up every 100 ms (started by test_after_rollup)
shop = new_shop()
tpl = None
users = {0: [], 1: []}  # user ids whose coupons live in ds_0, ds_1
# What this suite changed, as the answer names it (the transitions the tables cannot tell).
done = {"locked": 0, "unlocked": 0, "used": 0, "refunded": 0, "expired": 0, "revoked": 0,
        "disc": 0, "refund_disc": 0}


def hdr(s):
    return {"X-User-Id": "7", "X-Shop-Number": str(s)}


def get(path, s=None, url=None, **q):
    qs = "&".join("%s=%s" % (k, str(v).replace(" ", "%20")) for k, v in q.items())
    return request("GET", (url or svc.url) + BASE + path + "?" + qs, None, hdr(s or shop))


def q(ds, text):
    """text on database ds: its rows, columns joined by |, one a line."""
    return "\n".join("|".join(row) for row in sql(ds, text))


def coupon_tables(ds):
    return ["t_user_coupon_%d" % i for i in range(16 * ds, 16 * ds + 16)]


def union(ds, cols):
    return " UNION ALL ".join("SELECT %s FROM %s WHERE coupon_template_id = %d" % (cols, t, tpl)
                              for t in coupon_tables(ds))


def truth():
    """The figures the coupon tables hold now, summed over both databases."""
    t = {"claim": 0, "mq": 0, "distribution": 0, "exchangeCode": 0, "other": 0, "users": 0,
         "unused": 0, "locked": 0, "used": 0, "expired": 0, "revoked": 0}
    for ds in (0, 1):
        row = q(ds, "SELECT count(*) FILTER (WHERE channel = 0), count(*) FILTER (WHERE channel = "
                "1), count(*) FILTER (WHERE channel = 2), count(*) FILTER (WHERE channel = 3), "
                "count(*) FILTER (WHERE channel IS NULL), count(DISTINCT user_id), "
                "count(*) FILTER (WHERE status = 0), count(*) FILTER (WHERE status = 1), "
                "count(*) FILTER (WHERE status = 2), count(*) FILTER (WHERE status = 3), "
                "count(*) FILTER (WHERE status = 4) FROM (%s) c"
                % union(ds, "user_id, channel, status")).split("|")
        for k, v in zip(list(t), row):
            t[k] += int(v)
    return t


def check_totals(url=None):
    st, _, r = get("", url=url, couponTemplateId=tpl)
    check(st == 200, "stats: %s %s" % (st, r))
    d, t = r["data"], truth()
    check(d["couponTemplateId"] == str(tpl) and d["shopNumber"] == str(shop), "ids: %s" % d)
    check(d["name"] == "stats test" and d["status"] == 0, "name and status: %s" % d)
    check(d["stock"] == 100, "stock: %s" % d["stock"])
    issued = {k: t[k] for k in ("claim", "mq", "distribution", "exchangeCode", "other")}
    issued["total"] = sum(issued.values())
    check(d["issued"] == issued, "issued %s, the tables hold %s" % (d["issued"], issued))
    check(d["distinctUsers"] == t["users"], "users %s, want %s" % (d["distinctUsers"], t["users"]))
    now = {k: t[k] for k in ("unused", "locked", "used", "expired", "revoked")}
    check(d["now"] == now, "now %s, the tables hold %s" % (d["now"], now))
    for k in ("locked", "unlocked", "used", "refunded", "expired", "revoked"):
        check(d[k] == done[k], "%s: %s, want %s" % (k, d[k], done[k]))
    check(d["discountAmount"] == done["disc"] / 100, "discount %s" % d["discountAmount"])
    check(d["refundedDiscountAmount"] == done["refund_disc"] / 100,
          "refunded discount %s" % d["refundedDiscountAmount"])
    check(d["netDiscountAmount"] == (done["disc"] - done["refund_disc"]) / 100,
          "net discount %s" % d["netDiscountAmount"])
    return d


def deltas(ds, tid=None):
    return int(q(ds, "SELECT count(*) FROM t_template_stat_delta WHERE coupon_template_id = %d"
                 % (tid or tpl)))


def insert(ds, rows):
    """rows: (user, receive_count, channel or None, status); one INSERT per table (a batch)."""
    by_table = {}
    for user, n, channel, status in rows:
        by_table.setdefault(user_coupon_table(user)[1], []).append(
            "(%d, %d, %d, %d, %d, now(), now() + interval '7 days', %d, %s)"
            % (new_id(), user, tpl, shop, n, status, "NULL" if channel is None else channel))
    for table, values in by_table.items():
        q(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
              "valid_start_time, valid_end_time, status, channel) VALUES %s"
          % (table, ", ".join(values)))


def change(ds, user, frm, to, disc=None):
    """Moves the user's coupons of the template in status frm to status to (one statement);
    how many."""
    table = user_coupon_table(user)[1]
    extra = ", discount_cents = %d" % disc if disc is not None else ""
    out = q(ds, "WITH u AS (UPDATE %s SET status = %d%s WHERE user_id = %d AND "
                "coupon_template_id = %d AND status = %d RETURNING 1) SELECT count(*) FROM u"
            % (table, to, extra, user, tpl, frm))
    return int(out)


def write_round(k):
    """Coupons of every channel in both databases, and every kind of change. k varies the
    amounts from round to round."""
    for ds in (0, 1):
        u = users[ds]
        n0 = k * 2 + 1  # receive counts: each round adds two coupons to u[0]
        insert(ds, [(u[0], n0, 0, 0), (u[0], n0 + 1, 1, 0), (u[1], k + 1, 2, 0),
                    (u[2], k + 1, 3, 0), (u[3], k + 1, None, 0)])
        # lock u[0]'s two new coupons with a discount, pay them, refund one (it comes back unused)
        c = change(ds, u[0], 0, 1, disc=150 + k)
        done["locked"] += c
        c = change(ds, u[0], 1, 2)
        done["used"] += c
        done["disc"] += c * (150 + k)
        table = user_coupon_table(u[0])[1]
        back = q(ds, "UPDATE %s SET status = 0 WHERE id = (SELECT id FROM %s WHERE user_id = %d "
                     "AND coupon_template_id = %d AND status = 2 LIMIT 1) RETURNING discount_cents"
                 % (table, table, u[0], tpl))
        done["refunded"] += 1
        done["refund_disc"] += int(back)
        # lock then cancel u[1]'s, expire u[2]'s, revoke u[3]'s
        c = change(ds, u[1], 0, 1, disc=99)
        done["locked"] += c
        done["unlocked"] += change(ds, u[1], 1, 0)
        done["expired"] += change(ds, u[2], 0, 3)
        done["revoked"] += change(ds, u[3], 0, 4)


def setup():
    global tpl
    tpl = make_merchant_template(shop, "stats test")
    u = 10 ** 12
    while min(len(users[0]), len(users[1])) < 4:
        u += 7919
        ds = user_coupon_table(u)[0]
        if len(users[ds]) < 4:
            users[ds].append(u)


# ---------------------------------------------------------------- tests


def test_before_rollup():
    """Rollup off: every figure comes from the deltas, and equals the tables' truth."""
    d = check_totals()
    check(d["issued"]["total"] == 0 and d["distinctUsers"] == 0, "a new template: %s" % d)
    write_round(0)
    check(deltas(0) > 0 and deltas(1) > 0, "deltas in both databases")
    d = check_totals()
    check(d["issued"]["total"] == 10 and d["used"] == 4 and d["refunded"] == 2, "round 0: %s" % d)
    check(int(q(0, "SELECT count(*) FROM t_template_stat WHERE coupon_template_id = %d" % tpl))
          == 0, "nothing rolled up yet")


def test_after_rollup():
    """A replica rolling every 100 ms drains the deltas; the figures stay the truth, also with
    new deltas on top of rolled-up rows; its counter counts what it moved."""
    global roller
    roller = Service("merchant-admin", {"QUAN_STATS_ROLLUP_MS": "100",
                                        "QUAN_TIMEZONE": "Asia/Shanghai"}).wait_ready()
    check(wait_for(lambda: deltas(0) == 0 and deltas(1) == 0, 15), "deltas drained")
    check(int(q(0, "SELECT count(*) FROM t_template_stat WHERE coupon_template_id = %d AND "
                   "grain = 0" % tpl)) == 1, "one rolled-up row in ds_0")
    check_totals()
    check_totals(url=roller.url)
    _, _, text = request("GET", roller.url + "/metrics")
    if isinstance(text, bytes):
        text = text.decode()
    check(metric(text, "quan_stats_rolled_total") > 0, "quan_stats_rolled_total moved")
    roller.stop()
    write_round(1)
    check(deltas(0) > 0 and deltas(1) > 0, "new deltas")
    d = check_totals()
    check(d["issued"]["total"] == 20, "two rounds: %s" % d["issued"])


def _series_fixture():
    """A second template whose deltas sit in the past, in both databases: minute m0 (10:15 of
    the day before yesterday, zone +08) holds A (ds_0) and B (ds_1), m0 + 5 min holds C, the
    hour two later D, the next day E. Returns (template, m0 as a datetime)."""
    tid = make_merchant_template(shop, "stats series")
    today = datetime.datetime.now(ZONE).replace(hour=0, minute=0, second=0, microsecond=0)
    m0 = today - datetime.timedelta(days=2) + datetime.timedelta(hours=10, minutes=15)
    rows = [  # (ds, at, claim, mq, dist, code, used, refunded, expired, discount cents)
        (0, m0 + datetime.timedelta(seconds=20), 2, 0, 0, 0, 1, 0, 0, 300),
        (1, m0 + datetime.timedelta(seconds=50), 0, 1, 0, 0, 1, 1, 0, 120),
        (0, m0 + datetime.timedelta(minutes=5), 0, 0, 3, 0, 0, 0, 0, 0),
        (1, m0 + datetime.timedelta(hours=2, minutes=1), 0, 0, 0, 4, 0, 0, 0, 0),
        (0, m0 + datetime.timedelta(days=1), 1, 0, 0, 0, 0, 0, 1, 0),
    ]
    for ds, at, cl, mq, di, co, us, rf, ex, dc in rows:
        q(ds, "INSERT INTO t_template_stat_delta (coupon_template_id, shop_number, at, "
              "issued_claim, issued_mq, issued_dist, issued_code, used, refunded, expired, "
              "discount_cents) VALUES (%d, %d, '%s', %d, %d, %d, %d, %d, %d, %d, %d)"
          % (tid, shop, at.isoformat(), cl, mq, di, co, us, rf, ex, dc))
    return tid, m0


def fmt(t):
    return t.astimezone(ZONE).strftime("%Y-%m-%d %H:%M:%S")


def point(t, claim=0, mq=0, dist=0, code=0, used=0, refunded=0, expired=0, disc=0):
    return {"time": fmt(t), "issued": claim + mq + dist + code, "claim": claim, "mq": mq,
            "distribution": dist, "exchangeCode": code, "used": used, "refunded": refunded,
            "expired": expired, "discountAmount": disc / 100}


def check_series(tid, m0, url=None):
    h = datetime.timedelta(hours=1)
    day0 = m0.replace(hour=0, minute=0)
    want = {
        "minute": (m0 - h, m0 + h, [point(m0, claim=2, mq=1, used=2, refunded=1, disc=420),
                                    point(m0 + datetime.timedelta(minutes=5), dist=3)]),
        "hour": (m0 - h, m0 + datetime.timedelta(days=1, hours=1),
                 [point(m0.replace(minute=0), claim=2, mq=1, dist=3, used=2, refunded=1,
                        disc=420),
                  point(m0.replace(minute=0) + 2 * h, code=4),
                  point(m0.replace(minute=0) + datetime.timedelta(days=1), claim=1, expired=1)]),
        "day": (m0 - datetime.timedelta(days=1), m0 + datetime.timedelta(days=3),
                [point(day0, claim=2, mq=1, dist=3, code=4, used=2, refunded=1, disc=420),
                 point(day0 + datetime.timedelta(days=1), claim=1, expired=1)]),
    }
    for grain, (frm, to, pts) in want.items():
        st, _, r = get("/series", url=url, couponTemplateId=tid, grain=grain, **{"from": fmt(frm),
                                                                                  "to": fmt(to)})
        check(st == 200, "%s: %s %s" % (grain, st, r))
        check(r["data"]["grain"] == grain, "grain: %s" % r["data"])
        check(r["data"]["points"] == pts, "%s: %s\nwant %s" % (grain, r["data"]["points"], pts))
    # a range that starts inside a bucket keeps it; one that ends before the data has none
    st, _, r = get("/series", url=url, couponTemplateId=tid, grain="minute",
                   **{"from": fmt(m0 + datetime.timedelta(seconds=30)),
                      "to": fmt(m0 + datetime.timedelta(minutes=1))})
    check(st == 200 and len(r["data"]["points"]) == 1, "inside the minute: %s" % r)
    st, _, r = get("/series", url=url, couponTemplateId=tid, grain="hour",
                   **{"from": fmt(m0 - 3 * h), "to": fmt(m0 - 2 * h)})
    check(st == 200 and r["data"]["points"] == [], "before the data: %s" % r)


def test_series():
    """Per minute, hour and day, the two databases' deltas added up; the same after the rollup
    put them into the minute and hour rows; the default range (the last 24 h) and grain."""
    tid, m0 = _series_fixture()
    check_series(tid, m0)
    r2 = Service("merchant-admin", {"QUAN_STATS_ROLLUP_MS": "100",
                                    "QUAN_TIMEZONE": "Asia/Shanghai"}).wait_ready()
    try:
        check(wait_for(lambda: deltas(0, tid) == 0 and deltas(1, tid) == 0, 15),
              "deltas drained")
        check(int(q(1, "SELECT count(*) FROM t_template_stat WHERE coupon_template_id = %d AND "
                       "grain IN (1, 2)" % tid)) == 4, "ds_1's minute and hour rows")
        check_series(tid, m0)
    finally:
        r2.stop()
    st, _, r = get("/series", couponTemplateId=tpl)
    check(st == 200 and r["data"]["grain"] == "minute", "defaults: %s %s" % (st, r))
    total = sum(p["issued"] for p in r["data"]["points"])
    check(total == 20, "the last 24 h of the first template: %s" % r["data"]["points"])


def stat_delta(ds, tid, s, table="t_template_stat_delta", **cols):
    """A delta of template tid of shop s on database ds (or, with table t_template_stat, a
    rolled-up row since the start)."""
    names = ["coupon_template_id", "shop_number"] + list(cols)
    values = [str(tid), str(s)] + [str(v) for v in cols.values()]
    if table == "t_template_stat":
        names += ["grain", "bucket"]
        values += ["0", "'epoch'"]
    q(ds, "INSERT INTO %s (%s) VALUES (%s)" % (table, ", ".join(names), ", ".join(values)))


def summary(s, **qs):
    st, _, r = get("/summary", s=s, **qs)
    check(st == 200, "summary %s: %s %s" % (qs, st, r))
    return r["data"]


def test_summary():
    """Every template of a shop with its totals: a template without coupons with zeros, another
    shop's template and a deleted one left out; sorted by issuedTotal
    and by used, both ways, ties newest first; paged; each record is the template's own answer;
    400 naming sort, order, current, size."""
    s = new_shop()
    t1, t2, t3, t4 = (make_merchant_template(s, "sum %d" % i) for i in range(1, 5))
    gone = make_merchant_template(s, "sum deleted")
    ds, table = template_table(s)
    q(ds, "UPDATE %s SET del_flag = 1 WHERE id = %d" % (table, gone))
    # issuedTotal: t1 7, t3 3, t2 1, t4 0; used: t2 4, t3 2, t1 1, t4 0
    stat_delta(0, t1, s, issued_claim=5, used=1, discount_cents=250)
    stat_delta(1, t1, s, issued_claim=2, st_unused=2)
    stat_delta(1, t2, s, issued_dist=1)
    stat_delta(0, t2, s, used=4, refunded=1)
    stat_delta(0, t3, s, table="t_template_stat", issued_mq=3, new_users=2)
    stat_delta(1, t3, s, used=2)
    stat_delta(0, gone, s, issued_claim=100, used=100)
    other = new_shop()
    stat_delta(1, make_merchant_template(other, "another shop"), other, issued_claim=50)
    d = summary(s, size=100)
    check(d["total"] == 4 and d["current"] == 1 and d["size"] == 100 and d["pages"] == 1,
          "page fields: %s" % {k: v for k, v in d.items() if k != "records"})
    ids = [r["couponTemplateId"] for r in d["records"]]
    check(ids == [str(t) for t in (t1, t3, t2, t4)], "default: issuedTotal desc: %s" % ids)
    for rec in d["records"]:
        st, _, one = get("", s=s, couponTemplateId=rec["couponTemplateId"])
        check(st == 200 and one["data"] == rec, "record %s\n  one template: %s" % (rec, one))
    check(d["records"][3]["issued"]["total"] == 0 and d["records"][3]["used"] == 0
          and d["records"][3]["stock"] == 100 and d["records"][3]["name"] == "sum 4",
          "a template without coupons: %s" % d["records"][3])
    check(d["records"][0]["issued"]["claim"] == 7 and d["records"][0]["discountAmount"] == 2.5,
          "both databases added: %s" % d["records"][0])
    want = {("issuedTotal", "desc"): [t1, t3, t2, t4], ("issuedTotal", "asc"): [t4, t2, t3, t1],
            ("used", "desc"): [t2, t3, t1, t4], ("used", "asc"): [t4, t1, t3, t2],
            ("refunded", "desc"): [t2] + sorted((t1, t3, t4), reverse=True),
            ("refunded", "asc"): sorted((t1, t3, t4), reverse=True) + [t2]}
    for (key, order), tids in want.items():
        got = [r["couponTemplateId"] for r in summary(s, sort=key, order=order)["records"]]
        check(got == [str(t) for t in tids], "%s %s: %s, want %s" % (key, order, got, tids))
    pages = [summary(s, sort="used", order="asc", current=c, size=3) for c in (1, 2, 3)]
    got = [[r["couponTemplateId"] for r in p["records"]] for p in pages]
    check(got == [[str(t4), str(t1), str(t3)], [str(t2)], []], "pages of 3: %s" % got)
    check(all(p["total"] == 4 and p["pages"] == 2 and p["size"] == 3 for p in pages),
          "page fields: %s" % [(p["total"], p["pages"], p["current"]) for p in pages])
    empty = summary(new_shop())
    check(empty["records"] == [] and empty["total"] == 0, "a shop without templates: %s" % empty)
    for qs, field in (({"sort": "bogus"}, "sort"), ({"sort": "issued"}, "sort"),
                      ({"order": "up"}, "order"), ({"size": "101"}, "size"),
                      ({"current": "0"}, "current"), ({"size": "x"}, "size")):
        st, _, r = get("/summary", s=s, **qs)
        check(st == 400 and r["code"] == "A000001" and r["message"].startswith(field + ":"),
              "%s: %s %s" % (qs, st, r))


def flat(d):
    """The one-template answer by the export's column names."""
    out = {}
    for k, v in d.items():
        if k == "issued":
            out.update({("issuedTotal" if n == "total" else n): x for n, x in v.items()})
        elif k == "now":
            out.update({"now" + n[0].upper() + n[1:]: x for n, x in v.items()})
        else:
            out[k] = v
    return out


def export(tid, kind, **qs):
    """The export's rows (lists of cells: strings from .csv, typed from .xlsx), after checking
    its headers."""
    st, hd, raw = get("/export", couponTemplateId=tid, format=kind, **qs)
    check(st == 200 and isinstance(raw, bytes), "export %s %s: %s %s" % (kind, qs, st, raw))
    name = "template-%d-stats.%s" % (tid, kind)
    check(('filename="%s"' % name) in hd["Content-Disposition"], hd["Content-Disposition"])
    if kind == "csv":
        check(hd["Content-Type"].startswith("text/csv"), "content type %s" % hd["Content-Type"])
        check(raw.startswith(b"\xef\xbb\xbf") and raw.endswith(b"\r\n"), "BOM, CRLF: %r" % raw[:40])
        return [row for row in csv.reader(io.StringIO(raw.decode("utf-8-sig"), newline=""))]
    check(hd["Content-Type"] == "application/vnd.openxmlformats-officedocument.spreadsheetml."
          "sheet", "content type %s" % hd["Content-Type"])
    wb = openpyxl.load_workbook(io.BytesIO(raw), read_only=True)
    return [list(r) for r in wb.worksheets[0].iter_rows(values_only=True)]


def same(cell, want):
    """An exported cell against the JSON value: ids and text as text, figures as numbers."""
    if isinstance(want, str):
        return cell == want
    try:
        return float(cell) == float(want)
    except (TypeError, ValueError):
        return False


def check_export(tid, kind, grain, frm, to):
    rows = export(tid, kind, grain=grain, **{"from": fmt(frm), "to": fmt(to)})
    rows = [[c for c in r if c not in (None, "")] if i != 1 else r for i, r in enumerate(rows)]
    st, _, one = get("", couponTemplateId=tid)
    want = flat(one["data"])
    check(len(rows) >= 3 and rows[0][:4] == ["couponTemplateId", "shopNumber", "name", "status"]
          and sorted(rows[0]) == sorted(want), "%s totals header: %s" % (kind, rows[:1]))
    got = dict(zip(rows[0], rows[1]))
    bad = {k: (got.get(k), v) for k, v in want.items() if not same(got.get(k), v)}
    check(not bad, "%s totals differ from /stats (got, want): %s" % (kind, bad))
    st, _, ser = get("/series", couponTemplateId=tid, grain=grain,
                     **{"from": fmt(frm), "to": fmt(to)})
    pts = ser["data"]["points"]
    check(rows[2] == ["time", "claim", "mq", "distribution", "exchangeCode", "issued", "used",
                      "refunded", "expired", "discountAmount"], "%s series header: %s"
          % (kind, rows[2]))
    check(len(rows) - 3 == len(pts), "%s: %d series rows, %d points" % (kind, len(rows) - 3,
                                                                         len(pts)))
    for row, p in zip(rows[3:], pts):
        got = dict(zip(rows[2], row))
        check(set(got) == set(p) and all(same(got[k], v) for k, v in p.items()),
              "%s series row %s\n  point %s" % (kind, row, p))
    return pts


def test_export():
    """A template's totals and series as .xlsx and .csv: the totals equal /stats, the series
    rows /stats/series, per hour and per day, deltas and rolled-up rows; the first template's
    (coupons of every kind) over the last day; 404 and 400s."""
    tid, m0 = _series_fixture()
    h = datetime.timedelta(hours=1)
    for kind in ("xlsx", "csv"):
        pts = check_export(tid, kind, "hour", m0 - h, m0 + datetime.timedelta(days=1, hours=1))
        check(len(pts) == 3 and pts[0]["issued"] == 6, "hour points: %s" % pts)
        pts = check_export(tid, kind, "day", m0 - datetime.timedelta(days=1),
                           m0 + datetime.timedelta(days=3))
        check(len(pts) == 2, "day points: %s" % pts)
        now = datetime.datetime.now(ZONE)
        pts = check_export(tpl, kind, "hour", now - datetime.timedelta(days=1), now)
        check(sum(p["issued"] for p in pts) == 20, "the first template's last day: %s" % pts)
    # defaults: xlsx, per hour over the last 24 h
    st, hd, raw = get("/export", couponTemplateId=tpl)
    check(st == 200 and ("template-%d-stats.xlsx" % tpl) in hd["Content-Disposition"],
          "defaults: %s %s" % (st, hd))
    rows = list(openpyxl.load_workbook(io.BytesIO(raw), read_only=True).worksheets[0]
                .iter_rows(values_only=True))
    check(sum(r[5] for r in rows[3:]) == 20, "defaults: the last 24 h per hour: %s" % rows[3:])
    st, _, r = get("/export", s=new_shop(), couponTemplateId=tpl, format="csv")
    check(st == 404 and r["code"] == "A000404", "another shop's: %s %s" % (st, r))
    for qs, field in (({}, "couponTemplateId"), ({"format": "pdf"}, "format"),
                      ({"grain": "minute"}, "grain"),
                      ({"grain": "hour", "from": "2026-01-01 00:00:00",
                        "to": "2026-02-01 00:00:01"}, "to"),
                      ({"from": "2026-01-02 00:00:00", "to": "2026-01-01 00:00:00"}, "from")):
        if field != "couponTemplateId":
            qs = dict(qs, couponTemplateId=tpl)
        st, _, r = get("/export", **qs)
        check(st == 400 and r["code"] == "A000001" and r["message"].startswith(field + ":"),
              "export %s: %s %s" % (qs, st, r))


def test_backlog_beyond_the_statement_timeout_drains():
    """A backlog no one statement moves within the statement timeout (merchant-admin down for a
    while under load): the rollup moves it in batches, each its own transaction within the
    timeout, and drains it (one statement over all of it was cancelled on every tick, forever)."""
    tid = make_merchant_template(shop, "stats backlog")
    n = 300000
    for ds in (0, 1):  # +1 and -1 in turn: whatever is moved, the figures stay 0
        q(ds, "INSERT INTO t_template_stat_delta (coupon_template_id, shop_number, issued_claim, "
              "st_unused) SELECT %d, %d, 1 - 2 * (g %% 2), 1 - 2 * (g %% 2) FROM "
              "generate_series(1, %d) g" % (tid, shop, n))
    timeout_ms = 250
    try:  # the premise: all of it in one statement outlasts the timeout
        q(0, "BEGIN; SET LOCAL statement_timeout = %d; SELECT quan_template_stat_rollup(%d); "
             "ROLLBACK" % (timeout_ms, 2 * n))
        moved_at_once = True
    except AssertionError as e:
        moved_at_once = False
        check("statement timeout" in str(e), "the one-statement rollup: %s" % e)
    check(not moved_at_once and deltas(0, tid) == n, "the whole backlog moved at once within "
          "%d ms: this machine is too fast for the test's premise" % timeout_ms)
    r = Service("merchant-admin", {"QUAN_STATS_ROLLUP_MS": "100", "QUAN_STATS_ROLLUP_BATCH": "5000",
                                   "QUAN_PG_STATEMENT_TIMEOUT_MS": str(timeout_ms)}).wait_ready()
    try:
        check(wait_for(lambda: deltas(0, tid) == 0 and deltas(1, tid) == 0, 60),
              "the backlog drained: %d and %d left\n%s" % (deltas(0, tid), deltas(1, tid),
                                                          r.tail(5)))
        st, _, d = get("", couponTemplateId=tid)
        check(st == 200 and d["data"]["issued"]["total"] == 0 and d["data"]["now"]["unused"] == 0,
              "the figures after the backlog: %s %s" % (st, d))
        rows = q(0, "SELECT issued_claim, st_unused FROM t_template_stat WHERE "
                    "coupon_template_id = %d AND grain = 0" % tid)
        check(rows == "0|0", "rolled up to zeros: %r" % rows)
    finally:
        r.stop()


def test_other_shop_and_bad_params():
    other = new_shop()
    for path in ("", "/series"):
        st, _, r = get(path, s=other, couponTemplateId=tpl)
        check(st == 404 and r["code"] == "A000404", "%s of another shop: %s %s" % (path, st, r))
        st, _, r = get(path, couponTemplateId=new_id())
        check(st == 404, "%s of no template: %s %s" % (path, st, r))
        for qs, field in (({}, "couponTemplateId"), ({"couponTemplateId": "x"}, "couponTemplateId"),
                          ({"couponTemplateId": "-3"}, "couponTemplateId")):
            st, _, r = get(path, **qs)
            check(st == 400 and r["message"].startswith(field + ":"), "%s %s: %s %s"
                  % (path, qs, st, r))
    bad = [({"grain": "week"}, "grain"),
           ({"from": "yesterday"}, "from"),
           ({"to": "2026-13-01 00:00:00"}, "to"),
           ({"from": "2026-01-02 00:00:00", "to": "2026-01-01 00:00:00"}, "from"),
           ({"from": "2026-01-01 00:00:00", "to": "2026-01-02 00:00:01"}, "to"),
           ({"grain": "hour", "from": "2026-01-01 00:00:00", "to": "2026-02-01 00:00:01"}, "to"),
           ({"grain": "day", "from": "2026-01-01 00:00:00", "to": "2027-01-02 00:00:01"}, "to")]
    for qs, field in bad:
        st, _, r = get("/series", couponTemplateId=tpl, **qs)
        check(st == 400 and r["code"] == "A000001" and r["message"].startswith(field + ":"),
              "%s: %s %s" % (qs, st, r))
    # the widest ranges are accepted
    for grain, frm, to in (("minute", "2026-01-01 00:00:00", "2026-01-02 00:00:00"),
                           ("hour", "2026-01-01 00:00:00", "2026-02-01 00:00:00"),
                           ("day", "2026-01-01 00:00:00", "2027-01-02 00:00:00")):
        st, _, r = get("/series", couponTemplateId=tpl, grain=grain, **{"from": frm, "to": to})
        check(st == 200, "%s over its widest range: %s %s" % (grain, st, r))


def main():
    global svc
    svc = Service("merchant-admin", {"QUAN_STATS_ROLLUP_MS": "0",
                                     "QUAN_TIMEZONE": "Asia/Shanghai"}).wait_ready()
    setup()
    try:
        run([test_before_rollup, test_after_rollup, test_series, test_summary, test_export,
             test_backlog_beyond_the_statement_timeout_drains, test_other_shop_and_bad_params])
    finally:
        svc.stop()
        if roller:
            roller.stop()


if __name__ == "__main__":
    main()
