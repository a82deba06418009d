"""The coupon archive (services/engine/archive.h) against real servers: coupons of an ended
template for users of both databases, changed through the engine's payment API (paid; paid,
refunded, locked again and cancelled; locked), by its expiry sweeper and revoked, and coupons of
a template still claimable; everything read (each coupon's history as its user and its shop read
it, the templates' statistics, their export, the wallets, the statistics against the rows),
then the coupons aged past QUAN_ARCHIVE_AFTER_DAYS and the engine's archiver left to run: only
the dead coupons of the ended template move, with their history, and everything reads the same
after; a refund of an archived coupon is refused. quan-archive restores a coupon and a user's
coupons (their history and statistics unchanged, not archived again); quan-archive run killed
with SIGKILL in the middle of a pass loses and doubles nothing."""

import os
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import (make_merchant_template, metric, new_id, new_shop, redis,  # noqa: E402
                       sql, user_coupon_table)
from quan import BIN, Service, check, request, run, wait_for  # noqa: E402
from stats_truth import stats_mismatches  # noqa: E402

MA = "/api/merchant-admin/"
EN = "/api/engine/user-coupon/"
DAYS = 180

madmin = engine = None
shop = new_shop()
ended = live = bulk = None
coupons = {}  # name -> (user, coupon id)
before = {}


def user_in(ds):
    while True:
        u = random.randrange(1 << 40, 1 << 52)
        if user_coupon_table(u)[0] == ds:
            return u


def issue(user, template, channel, end="interval '1 day'"):
    """A coupon as a claim writes it (the row and its wallet member); its id."""
    ds, table = user_coupon_table(user)
    cid = new_id()
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status, channel, request_id) VALUES (%d, %d, %d, "
            "%d, 1, now() - interval '1 hour', now() + %s, 0, %d, 'req-%d')"
        % (table, cid, user, template, shop, end, channel, cid))
    redis("ZADD", "quan:wallet:{%d}" % user, 1, "%d_%d" % (template, cid))
    return cid


def pay(path, user, cid, order, want=200):
    body = {"couponId": str(cid), "orderId": str(order)}
    if path == "create-payment-record":
        body.update({"orderAmount": "20", "payableAmount": "15", "shopNumber": str(shop)})
    st, _, js = request("POST", engine.url + EN + path, body, {"X-User-Id": str(user)})
    check(st == want, "%s of %d: %s %s" % (path, cid, st, js))


def merchant(path):
    st, _, js = request("GET", madmin.url + MA + path, None,
                        {"X-User-Id": "7", "X-Shop-Number": str(shop)})
    check(st == 200, "%s: %s %s" % (path, st, js))
    return js if isinstance(js, bytes) else js["data"]


def histories(name):
    """(the user's answer, the shop's answer) of a coupon's history."""
    user, cid = coupons[name]
    st, _, js = request("GET", engine.url + EN + "history?couponId=%d" % cid, None,
                        {"X-User-Id": str(user)})
    check(st == 200, "engine history of %s: %s %s" % (name, st, js))
    return js["data"], merchant("coupon/history?couponId=%d" % cid)


def wallet(user):
    st, _, js = request("GET", engine.url + EN + "list", None, {"X-User-Id": str(user)})
    check(st == 200, "list of %d: %s %s" % (user, st, js))
    return js["data"]


def where_is(name):
    """'hot' or 'archive' (or None) for a coupon, and its history rows in each."""
    user, cid = coupons[name]
    ds, table = user_coupon_table(user)
    idx = table.rsplit("_", 1)[1]
    r = sql(ds, "SELECT (SELECT count(*) FROM t_user_coupon_%s WHERE id = %d), "
                "(SELECT count(*) FROM t_user_coupon_archive_%s WHERE id = %d), "
                "(SELECT count(*) FROM t_user_coupon_log_%s WHERE coupon_id = %d), "
                "(SELECT count(*) FROM t_user_coupon_log_archive_%s WHERE coupon_id = %d)"
            % (idx, cid, idx, cid, idx, cid, idx, cid))[0]
    hot, arch, logs, alogs = map(int, r)
    check(hot + arch == 1, "%s: %d hot rows, %d archived" % (name, hot, arch))
    return ("hot" if hot else "archive"), logs, alogs


def snapshot():
    return {"history": {n: histories(n) for n in coupons},
            "stats": {t: merchant("coupon-template/stats?couponTemplateId=%d" % t)
                      for t in (ended, live)},
            "export": {t: merchant("coupon-template/stats/export?format=csv&couponTemplateId=%d"
                                   % t) for t in (ended, live)},
            "wallet": {n: wallet(u) for n, (u, _) in coupons.items()}}


# Which coupons move: dead, of the ended template, older than the retention.
MOVES = {"paid", "expired", "revoked", "paid other db"}


def setup():
    global ended, live
    ended = make_merchant_template(shop, "archive ended")
    live = make_merchant_template(shop, "archive live")
    for name, ds in (("paid", 0), ("paid other db", 1), ("refunded", 1), ("locked", 0),
                     ("expired", 1), ("revoked", 0), ("unused", 1), ("paid young", 0),
                     ("live paid", 1)):
        u = user_in(ds)
        tpl = live if name.startswith("live") else ended
        end = "interval '-1 second'" if name == "expired" else "interval '1 day'"
        coupons[name] = (u, issue(u, tpl, random.randrange(4), end))
    for name in ("paid", "paid other db", "paid young", "live paid", "refunded"):
        u, cid = coupons[name]
        o = new_id()
        pay("create-payment-record", u, cid, o)
        pay("process-payment", u, cid, o)
    u, cid = coupons["refunded"]
    pay("process-refund", u, cid, o)
    o = new_id()
    pay("create-payment-record", u, cid, o)
    pay("cancel-payment", u, cid, o)
    u, cid = coupons["locked"]
    pay("create-payment-record", u, cid, new_id())
    u, cid = coupons["revoked"]
    ds, table = user_coupon_table(u)
    sql(ds, "UPDATE %s SET status = 4, update_time = now(), last_actor = 'test' WHERE id = %d"
        % (table, cid))
    u, cid = coupons["expired"]
    ds, table = user_coupon_table(u)
    check(wait_for(lambda: sql(ds, "SELECT status FROM %s WHERE id = %d" % (table, cid))[0][0]
                   == "3", 15), "the sweeper expired the coupon")
    st, _, js = request("POST", madmin.url + MA + "coupon-template/terminate",
                        {"couponTemplateId": str(ended)},
                        {"X-User-Id": "7", "X-Shop-Number": str(shop)})
    check(st == 200, "terminate: %s %s" % (st, js))


def age(names, days=DAYS + 20):
    for name in names:
        u, cid = coupons[name]
        ds, table = user_coupon_table(u)
        sql(ds, "UPDATE %s SET update_time = now() - interval '%d days' WHERE id = %d"
            % (table, days, cid))


def test_only_dead_coupons_of_ended_templates_move_and_everything_reads_the_same():
    setup()
    before.update(snapshot())
    check(not stats_mismatches([ended, live]), "statistics equal the rows before")
    moved0 = metric(request("GET", engine.url + "/metrics")[2].decode(),
                    "quan_archive_coupons_total")
    age([n for n in coupons if n != "paid young"])
    check(wait_for(lambda: all(where_is(n)[0] == "archive" for n in MOVES), 20),
          "the dead coupons were archived: %s" % {n: where_is(n) for n in coupons})
    time.sleep(1)  # a few more passes: what stays, stays
    for name in coupons:
        place, logs, alogs = where_is(name)
        want = "archive" if name in MOVES else "hot"
        check(place == want, "%s is %s, want %s" % (name, place, want))
        # the history rows went with the coupon, none left behind
        check((logs == 0 and alogs > 0) if want == "archive" else alogs == 0,
              "%s: %d history rows hot, %d archived" % (name, logs, alogs))
    after = snapshot()
    for name in coupons:
        check(after["history"][name] == before["history"][name],
              "%s: history %s, was %s" % (name, after["history"][name],
                                          before["history"][name]))
    check(after["stats"] == before["stats"], "stats %s, were %s" % (after["stats"],
                                                                    before["stats"]))
    check(after["export"] == before["export"], "the statistics export changed")
    for name in coupons:
        want = [] if name in MOVES else before["wallet"][name]
        check(after["wallet"][name] == want, "%s: list %s, want %s" % (name, after["wallet"][name],
                                                                       want))
    m = stats_mismatches([ended, live])
    check(not m, "statistics equal the rows, archived ones included: %s" % m)
    moved = metric(request("GET", engine.url + "/metrics")[2].decode(),
                   "quan_archive_coupons_total") - moved0
    check(moved >= len(MOVES), "quan_archive_coupons_total grew by %s" % moved)
    # an archived coupon is not there for the payment API (the retention bounds refunds)
    u, cid = coupons["paid"]
    pay("process-refund", u, cid, new_id(), want=404)


def archive_tool(*args):
    return subprocess.run([os.path.join(BIN, "quan-archive")] + list(args), capture_output=True,
                          text=True, timeout=60)


def test_restore_puts_a_coupon_back_as_it_was():
    stats0 = {t: merchant("coupon-template/stats?couponTemplateId=%d" % t) for t in (ended,)}
    u, cid = coupons["paid other db"]
    out = archive_tool("restore", "--coupon", str(cid))
    check(out.returncode == 0 and "restored 1 coupons" in out.stdout, "restore: %s %s"
          % (out.stdout, out.stderr))
    out = archive_tool("restore", "--user", str(coupons["expired"][0]))
    check(out.returncode == 0 and "restored 1 coupons" in out.stdout, "restore by user: %s %s"
          % (out.stdout, out.stderr))
    out = archive_tool("restore", "--coupon", str(cid))
    check(out.returncode == 1 and "nothing archived" in out.stderr, "again: %s" % out.stderr)
    time.sleep(1.5)  # passes of the archiver: a restored coupon stays another retention period
    for name in ("paid other db", "expired"):
        place, logs, alogs = where_is(name)
        check(place == "hot" and logs > 0 and alogs == 0, "%s: %s %d %d" % (name, place, logs,
                                                                          alogs))
        check(histories(name) == before["history"][name], "%s: history changed" % name)
    check({t: merchant("coupon-template/stats?couponTemplateId=%d" % t) for t in (ended,)}
          == stats0, "the statistics changed with the restore")
    m = stats_mismatches([ended, live])
    check(not m, "statistics equal the rows: %s" % m)


def test_kill_9_in_a_pass_loses_and_doubles_nothing():
    global bulk, engine
    # the tool's pass alone: an engine without its archiver
    engine.stop()
    engine = Service("engine", {"QUAN_ARCHIVE_INTERVAL_MS": "0"}).wait_ready()
    bulk = make_merchant_template(shop, "archive bulk", status=1, ended=True)
    n_per = 1500
    for ds in (0, 1):
        for idx in range(16 * ds, 16 * ds + 16):
            # users of other shards are fine here: only the rows are counted
            sql(ds, "WITH c AS (INSERT INTO t_user_coupon_%d (id, user_id, coupon_template_id, "
                    "shop_number, receive_count, valid_start_time, valid_end_time, status, "
                    "update_time) SELECT %d + g, %d + g, %d, %d, 1, now() - interval '300 days',"
                    " now() - interval '290 days', CASE WHEN g %% 10 = 0 THEN 0 ELSE 2 END, "
                    "now() - interval '%d days' FROM generate_series(1, %d) g RETURNING id, "
                    "user_id, status) INSERT INTO t_user_coupon_log_%d (user_id, coupon_id, "
                    "coupon_template_id, shop_number, from_status, to_status) SELECT user_id, "
                    "id, %d, %d, 0, status FROM c"
                % (idx, (idx + 1) << 40, (idx + 1) << 40, bulk, shop, DAYS + 1, n_per, idx,
                   bulk, shop))
    total = 32 * n_per

    def counts():
        """(coupons hot, archived, log rows hot, archived, ids in both), one statement a db."""
        out = [0] * 5
        for ds in (0, 1):
            parts = []
            for idx in range(16 * ds, 16 * ds + 16):
                parts.append("SELECT (SELECT count(*) FROM t_user_coupon_{i} WHERE "
                             "coupon_template_id = {t}), (SELECT count(*) FROM "
                             "t_user_coupon_archive_{i} WHERE coupon_template_id = {t}), "
                             "(SELECT count(*) FROM t_user_coupon_log_{i} WHERE "
                             "coupon_template_id = {t}), (SELECT count(*) FROM "
                             "t_user_coupon_log_archive_{i} WHERE coupon_template_id = {t}), "
                             "(SELECT count(*) FROM t_user_coupon_{i} h JOIN "
                             "t_user_coupon_archive_{i} a USING (id))".format(i=idx, t=bulk))
            for r in sql(ds, "SELECT sum(a), sum(b), sum(c), sum(d), sum(e) FROM (%s) x(a, b, c, "
                             "d, e)" % " UNION ALL ".join(parts)):
                out = [o + int(v) for o, v in zip(out, r)]
        return out

    tool = subprocess.Popen([os.path.join(BIN, "quan-archive"), "run", "--batch", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.4)
    check(tool.poll() is None, "the pass was still running when killed")
    tool.send_signal(signal.SIGKILL)
    tool.wait()
    hot, arch, logs, alogs, both = counts()
    check(hot + arch == total and logs + alogs == total and both == 0,
          "after kill -9: %d hot + %d archived coupons of %d, %d + %d history rows, %d in both"
          % (hot, arch, total, logs, alogs, both))
    check(0 < arch < total * 9 // 10, "killed in the middle: %d of %d archived" % (arch, total))
    out = archive_tool("run")
    check(out.returncode == 0, "a pass after it: %s %s" % (out.stdout, out.stderr))
    hot, arch, logs, alogs, both = counts()
    check(hot == total // 10 and arch == total - total // 10 and logs + alogs == total
          and both == 0 and alogs == arch,
          "then: %d hot (unused stay), %d archived, history %d + %d" % (hot, arch, logs, alogs))


def main():
    global madmin, engine
    madmin = Service("merchant-admin").wait_ready()
    engine = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": "300",
                                "QUAN_ARCHIVE_INTERVAL_MS": "300",
                                "QUAN_ARCHIVE_AFTER_DAYS": str(DAYS)}).wait_ready()
    try:
        run([test_only_dead_coupons_of_ended_templates_move_and_everything_reads_the_same,
             test_restore_puts_a_coupon_back_as_it_was,
             test_kill_9_in_a_pass_loses_and_doubles_nothing])
    finally:
        engine.stop()
        madmin.stop()


if __name__ == "__main__":
    main()
