"""quan-settlement POST /api/settlement/coupon-query through HTTP against the real binary and
real servers. Templates are written to the Redis cache only (cache path) or to PostgreSQL only
(the database fallback); user coupons are rows of t_user_coupon_N plus their wallet member,
as the engine's claim code writes them."""

import json
import random
import threading
import time

from engine_db import (kill_redis_clients, metric, new_id, redis, redis_masters_count, sql,
                       template_table, user_coupon_table)
from quan import Service, check, pinned, request, run

PATH = "/api/settlement/coupon-query"
svc = None
_counts = {}


def user():
    return random.randrange(1 << 40, 1 << 52)


def shop():
    return random.randrange(1 << 30, 1 << 40)


def template(shop_number, type_=0, target=1, goods=None, terms="0", max_="10", rate=None,
             source=0, status=0, in_db=False, name=None):
    """A template in the cache hash only, or (in_db) in its shard table only."""
    tid = new_id()
    name = name or "st-%d" % tid
    rule = {"termsOfUse": terms, "maximumDiscountAmount": max_,
            "explanationOfUnmetConditions": "x", "validityPeriod": 48}
    if rate is not None:
        rule["discountRate"] = rate
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 86400000, now_ms + 30 * 86400000
    if not in_db:
        key = "quan:tpl:{%d}" % tid
        redis("HSET", key, "id", tid, "shopNumber", shop_number, "name", name, "source", source,
              "target", target, "goods", goods or "", "type", type_, "validStartTime", start_ms,
              "validEndTime", end_ms, "stock", 10, "receiveRule", '{"limitPerPerson":1}',
              "consumeRule", json.dumps(rule), "status", status)
        redis("PEXPIRE", key, 600000)
        return tid
    ds, table = template_table(shop_number)
    sql(ds, "INSERT INTO %s (id, name, shop_number, source, target, goods, type, "
            "valid_start_time, valid_end_time, stock, receive_rule, consume_rule, status) "
            "VALUES (%d, '%s', %d, %d, %d, %s, %d, to_timestamp(%f), to_timestamp(%f), "
            "10, '{\"limitPerPerson\": 1}', '%s', %d)"
        % (table, tid, name, shop_number, source, target, "'%s'" % goods if goods else "NULL",
           type_, start_ms / 1000.0, end_ms / 1000.0, json.dumps(rule), status))
    return tid


def coupon(u, tid, shop_number, status=0, end_offset_s=86400):
    """A user coupon row ending end_offset_s from now, and its wallet member when unused."""
    ds, table = user_coupon_table(u)
    cid = new_id()
    count = _counts[(u, tid)] = _counts.get((u, tid), 0) + 1
    recv_ms = int(time.time() * 1000) - 5000
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_time, "
            "receive_count, valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, %d, "
            "to_timestamp(%f), %d, now() - interval '1 day', now() + make_interval(secs => %f), "
            "%d)" % (table, cid, u, tid, shop_number, recv_ms / 1000.0, count, end_offset_s,
                     status))
    if status == 0:
        redis("ZADD", "quan:wallet:{%d}" % u, recv_ms, "%d_%d" % (tid, cid))
    return cid


def query(u, body, headers=None):
    h = {"X-User-Id": str(u)} if u else {}
    h.update(headers or {})
    st, _, js = request("POST", svc.url + PATH, body, h)
    return st, js


def lists(u, amount, shop_number, goods=None):
    body = {"orderAmount": amount, "shopNumber": str(shop_number)}
    if goods is not None:
        body["goodsList"] = goods
    st, js = query(u, body)
    check(st == 200 and js.get("success") is True, "query: %s %s" % (st, js))
    d = js["data"]
    return d["availableCouponList"], d["notAvailableCouponList"]


def cents(x):
    return int(round(float(x) * 100))


def by_id(entries):
    return {int(e["userCouponId"]): e for e in entries}


def expect_available(avail, cid, amount_cents, what):
    e = by_id(avail).get(cid)
    check(e is not None, "%s: coupon %d not available: %s" % (what, cid, avail))
    check(cents(e["couponAmount"]) == amount_cents,
          "%s: couponAmount %s, want %d cents" % (what, e["couponAmount"], amount_cents))


def expect_not_available(notav, cid, reason, what):
    e = by_id(notav).get(cid)
    check(e is not None, "%s: coupon %d not in notAvailable: %s" % (what, cid, notav))
    check(e["reason"] == reason, "%s: reason %r, want %r" % (what, e["reason"], reason))


# ---------------------------------------------------------------------------------- tests


def test_unauthorized_without_user():
    st, js = query(None, {"orderAmount": 10, "shopNumber": "1"})
    check(st == 401 and js.get("code") == "A000401", "no identity: %s %s" % (st, js))


def test_bad_input_names_the_field():
    u = user()
    cases = [({"orderAmount": "1.005", "shopNumber": "1"}, "orderAmount"),
             ({"orderAmount": "-1", "shopNumber": "1"}, "orderAmount"),
             ({"shopNumber": "1"}, "orderAmount"),
             ({"orderAmount": 10}, "shopNumber"),
             ({"orderAmount": 10, "shopNumber": "1", "goodsList": {}}, "goodsList"),
             ({"orderAmount": 10, "shopNumber": "1",
               "goodsList": [{"goodsNumber": "A", "goodsAmount": "abc"}]},
              "goodsList[0].goodsAmount"),
             ({"orderAmount": 10, "shopNumber": "1",
               "goodsList": [{"goodsNumber": "A", "goodsAmount": 1}, {"goodsAmount": 1}]},
              "goodsList[1].goodsNumber")]
    for body, field in cases:
        st, js = query(u, body)
        check(st == 400 and js.get("code") == "A000001"
              and (js.get("message") or "").startswith(field + ":"),
              "%s: want 400 naming %s, got %s %s" % (body, field, st, js))


def test_empty_wallet():
    avail, notav = lists(user(), "100", shop())
    check(avail == [] and notav == [], "empty: %s %s" % (avail, notav))


def test_fixed_and_threshold_met_equal_not_met():
    u, s = user(), shop()
    fixed = coupon(u, template(s, type_=0, max_="10"), s)
    equal = coupon(u, template(s, type_=1, terms="100", max_="15"), s)
    above = coupon(u, template(s, type_=1, terms="100.01", max_="20"), s)
    below = coupon(u, template(s, type_=1, terms="50", max_="5.5"), s)
    avail, notav = lists(u, "100.00", s)
    expect_available(avail, fixed, 1000, "fixed")
    expect_available(avail, equal, 1500, "threshold equal")
    expect_available(avail, below, 550, "threshold met")
    expect_not_available(notav, above, "threshold not met", "threshold above the order")
    check([int(e["userCouponId"]) for e in avail] == [equal, fixed, below],
          "sorted by amount: %s" % avail)
    e = by_id(avail)[equal]
    check(e["couponTemplateId"] and e["type"] == 1 and e["target"] == 1
          and cents(e["consumeRule"]["termsOfUse"]) == 10000 and e["name"].startswith("st-"),
          "entry fields: %s" % e)
    check(cents(by_id(notav)[above]["couponAmount"]) == 0, "no amount when not available")


def test_percent_rounding_half_up_and_cap():
    u, s = user(), shop()
    half = coupon(u, template(s, type_=2, rate="0.85", max_="100"), s)   # 499.95 -> 500
    down = coupon(u, template(s, type_=2, rate="0.99", max_="100"), s)   # 33.33 -> 33
    cap = coupon(u, template(s, type_=2, rate="0.5", max_="10"), s)      # 16.665 capped at 10
    unmet = coupon(u, template(s, type_=2, rate="0.9", terms="40"), s)
    avail, notav = lists(u, "33.33", s)
    expect_available(avail, half, 500, "percent half up")
    expect_available(avail, down, 33, "percent round down")
    expect_available(avail, cap, 1000, "percent capped")
    expect_not_available(notav, unmet, "threshold not met", "percent threshold")


def test_goods_coupon_uses_the_goods_amount():
    u, s = user(), shop()
    ga = coupon(u, template(s, type_=1, target=0, goods="G-A", terms="10", max_="4"), s)
    gb = coupon(u, template(s, type_=1, target=0, goods="G-B", terms="10", max_="4"), s)
    gc = coupon(u, template(s, type_=0, target=0, goods="G-C", max_="1"), s)
    goods = [{"goodsNumber": "G-A", "goodsAmount": "20"},
             {"goodsNumber": "G-B", "goodsAmount": "5.00"}]
    avail, notav = lists(u, "25", s, goods)
    expect_available(avail, ga, 400, "goods in the order")
    expect_not_available(notav, gb, "threshold not met", "goods amount below threshold")
    expect_not_available(notav, gc, "goods not in order", "goods absent")
    check(by_id(avail)[ga]["goods"] == "G-A", "goods field")
    # without a goodsList every goods coupon is not available
    avail, notav = lists(u, "25", s)
    check(avail == [] and len(notav) == 3, "no goods: %s %s" % (avail, notav))


def test_other_shop_coupons():
    u, s, other = user(), shop(), shop()
    mine = coupon(u, template(s, max_="3"), s)
    theirs = coupon(u, template(other, max_="3"), other)
    platform = coupon(u, template(other, max_="2", source=1), other)
    avail, notav = lists(u, "50", s)
    expect_available(avail, mine, 300, "own shop coupon")
    expect_not_available(notav, theirs, "other shop", "another shop's shop coupon")
    expect_available(avail, platform, 200, "platform coupon of another shop")


def test_expired_used_locked_excluded_ended_not_available():
    u, s = user(), shop()
    tid = template(s, max_="3")
    good = coupon(u, tid, s)
    expired = coupon(u, tid, s, end_offset_s=-60)
    redis("ZADD", "quan:wallet:{%d}" % u, 1, "%d_%d" % (tid, expired))  # stale wallet member
    used = coupon(u, tid, s, status=2)
    locked = coupon(u, tid, s, status=1)
    ended_tpl = template(s, max_="4", status=1)
    ended = coupon(u, ended_tpl, s)
    ghost = coupon(u, new_id(), s)  # its template exists nowhere (left out, no crash)
    avail, notav = lists(u, "50", s)
    ids = set(by_id(avail)) | set(by_id(notav))
    check(by_id(avail).keys() == {good}, "only the valid coupon is available: %s" % avail)
    for cid, what in ((expired, "expired"), (used, "used"), (locked, "locked"),
                      (ghost, "template missing")):
        check(cid not in ids, "%s coupon listed: %s %s" % (what, avail, notav))
    expect_not_available(notav, ended, "template ended", "ended template")
    check(len(notav) == 1, "not available: %s" % notav)
    check(query(u, {"orderAmount": "1", "shopNumber": str(s)})[0] == 200, "still serving")


def test_sorting_amount_then_expiry():
    u, s = user(), shop()
    t5, t8 = template(s, max_="5"), template(s, max_="8")
    later = coupon(u, t5, s, end_offset_s=7200)
    sooner = coupon(u, t5, s, end_offset_s=3600)
    big = coupon(u, t8, s, end_offset_s=9000)
    small = coupon(u, template(s, max_="1"), s, end_offset_s=60)
    avail, _ = lists(u, "50", s)
    got = [int(e["userCouponId"]) for e in avail]
    check(got == [big, sooner, later, small], "order %s, want %s"
          % (got, [big, sooner, later, small]))
    check(avail[1]["validEndTime"] < avail[2]["validEndTime"], "validEndTime shown")


def test_sorting_many_coupons_over_templates_of_equal_amounts():
    """Sixty coupons over five templates, two of them worth the same: the available list is
    by amount (largest first), then expiry, then id, the coupons of equal templates interleaved;
    the other list by expiry, then id."""
    u, s = user(), shop()
    tpls = {template(s, max_="5"): 500, template(s, max_="5"): 500, template(s, max_="8"): 800,
            template(s, type_=1, terms="100", max_="9"): None,  # threshold above the order
            template(s, max_="7", status=1): None}  # ended
    ids = list(tpls)
    for _ in range(60):
        coupon(u, random.choice(ids), s, end_offset_s=random.randrange(600, 86400))
    ds, table = user_coupon_table(u)
    rows = [(int(i), int(t), int(e)) for i, t, e in sql(
        ds, "SELECT id, coupon_template_id, (extract(epoch from valid_end_time) * 1000)::bigint "
            "FROM %s WHERE user_id = %d" % (table, u))]
    want_ok = [i for i, t, e in sorted((r for r in rows if tpls[r[1]]),
                                       key=lambda r: (-tpls[r[1]], r[2], r[0]))]
    want_no = [i for i, t, e in sorted((r for r in rows if not tpls[r[1]]),
                                       key=lambda r: (r[2], r[0]))]
    avail, notav = lists(u, "50", s)
    got_ok = [int(e["userCouponId"]) for e in avail]
    got_no = [int(e["userCouponId"]) for e in notav]
    check(got_ok == want_ok, "available order %s, want %s" % (got_ok, want_ok))
    check(got_no == want_no, "not-available order %s, want %s" % (got_no, want_no))
    check(all(cents(e["couponAmount"]) == tpls[int(e["couponTemplateId"])] for e in avail),
          "amounts")


def test_template_missing_from_cache_falls_back_to_db():
    u, s, other = user(), shop(), shop()
    tdb = template(s, type_=1, terms="20", max_="6", in_db=True, name="from-db")
    tdb2 = template(other, max_="2", in_db=True)  # other shop, maybe other database
    check(redis("EXISTS", "quan:tpl:{%d}" % tdb) == "0", "not cached")
    a = coupon(u, tdb, s)
    b = coupon(u, tdb, s)
    c = coupon(u, tdb2, other)
    cached = coupon(u, template(s, max_="1"), s)
    avail, notav = lists(u, "30", s)
    expect_available(avail, a, 600, "db template")
    expect_available(avail, b, 600, "db template, second coupon")
    expect_available(avail, cached, 100, "cached template beside")
    expect_not_available(notav, c, "other shop", "db template of another shop")
    check(by_id(avail)[a]["name"] == "from-db", "name from the database row")
    avail, notav = lists(u, "10", s)
    expect_not_available(notav, a, "threshold not met", "db template under threshold")


def cache_count(what, result):
    text = request("GET", svc.url + "/metrics")[2].decode()
    return metric(text, "quan_rcopy_lookups_total", what=what, result=result)


def set_status(u, cid, status):
    """The row alone, as no service writes it: the wallet does not hear of it."""
    ds, table = user_coupon_table(u)
    sql(ds, "UPDATE %s SET status = %d WHERE id = %d" % (table, status, cid))


def test_kept_rows_follow_every_wallet_write():
    """Rows and templates are kept between requests, and a write of the wallet or of the
    template's hash (which every writer makes after the row) is seen by the next answer."""
    with pinned(svc):  # what one process keeps
        u, s = user(), shop()
        tid = template(s, max_="2")
        a = coupon(u, tid, s)
        avail, _ = lists(u, "50", s)
        check(by_id(avail).keys() == {a}, "first answer: %s" % avail)
        hits = cache_count("rows", "hit")
        avail, _ = lists(u, "50", s)
        check(cache_count("rows", "hit") == hits + 1, "the second answer came from the kept rows")
        check(by_id(avail).keys() == {a}, "kept answer: %s" % avail)
        b = coupon(u, tid, s)  # a claim: the row, then the wallet
        avail, _ = lists(u, "50", s)
        check(by_id(avail).keys() == {a, b}, "a new coupon shows at once: %s" % avail)
        set_status(u, a, 1)  # a lock: the row, then the wallet
        redis("ZREM", "quan:wallet:{%d}" % u, "%d_%d" % (tid, a))
        avail, _ = lists(u, "50", s)
        check(by_id(avail).keys() == {b}, "a locked coupon goes at once: %s" % avail)
        redis("HSET", "quan:tpl:{%d}" % tid, "status", 1)  # the merchant ended the template
        avail, notav = lists(u, "50", s)
        check(not avail, "nothing available once the template ended: %s" % avail)
        expect_not_available(notav, b, "template ended", "ended after it was kept")
        misses = cache_count("template", "miss")
        lists(u, "50", s)
        check(cache_count("template", "miss") == misses, "the ended template is kept in turn")


def test_each_writer_reads_its_write_under_concurrency():
    """Eight writers on one user, each adding a coupon (row, then wallet) and locking it (row,
    then wallet) while the others do the same and query: every answer after a write that
    returned shows that write, whatever the others' reads kept in between."""
    u, s = user(), shop()
    tid = template(s, max_="2")
    errors = []
    ds, table = user_coupon_table(u)

    def writer(w):
        for i in range(12):
            cid = coupon(u, tid, s)
            avail, _ = lists(u, "50", s)
            if cid not in by_id(avail):
                errors.append("writer %d round %d: new coupon %d missing" % (w, i, cid))
            set_status(u, cid, 1)
            redis("ZREM", "quan:wallet:{%d}" % u, "%d_%d" % (tid, cid))
            avail, _ = lists(u, "50", s)
            if cid in by_id(avail):
                errors.append("writer %d round %d: locked coupon %d listed" % (w, i, cid))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "%d stale answers: %s" % (len(errors), errors[:5]))
    left = sql(ds, "SELECT count(*) FROM %s WHERE user_id = %d AND status = 0" % (table, u))
    check(left == [["0"]], "every coupon locked: %s" % left)
    avail, _ = lists(u, "50", s)
    check(not avail, "none listed at the end: %s" % avail)


def test_copies_dropped_when_a_redis_connection_is_lost():
    """While a connection is down, Redis tells nothing: every copy goes, and the next answer is
    read from the database (here: a row changed behind the wallet's back shows)."""
    with pinned(svc):  # what one process keeps
        for flag in ("P", "t"):
            u, s = user(), shop()
            tid = template(s, max_="2")
            a = coupon(u, tid, s)
            lists(u, "50", s)
            set_status(u, a, 1)
            avail, _ = lists(u, "50", s)
            check(by_id(avail).keys() == {a}, "%s: the kept rows answered: %s" % (flag, avail))
            # every replica's, one per master (single topology: the one)
            check(kill_redis_clients(flag) == len(svc.ports) * redis_masters_count(),
                  "%s: settlement's connections" % flag)
            deadline = time.time() + 5
            while True:
                avail, _ = lists(u, "50", s)
                if not avail or time.time() > deadline:
                    break
                time.sleep(0.05)
            check(not avail, "%s: after the loss the database answered: %s" % (flag, avail))
            # Tracking comes back: rows are kept again.
            deadline = time.time() + 5
            while True:
                hits = cache_count("rows", "hit")
                lists(u, "50", s)
                lists(u, "50", s)
                if cache_count("rows", "hit") > hits or time.time() > deadline:
                    break
                time.sleep(0.1)
            check(cache_count("rows", "hit") > hits,
                  "%s: rows kept again after the reconnect" % flag)


def test_flushed_redis_drops_copies():
    u, s = user(), shop()
    tid = template(s, max_="2")
    a = coupon(u, tid, s)
    lists(u, "50", s)
    set_status(u, a, 1)
    redis("FLUSHALL")
    avail, _ = lists(u, "50", s)
    check(not avail, "FLUSHALL drops the kept rows: %s" % avail)


def main():
    global svc
    svc = Service("settlement").wait_ready()
    try:
        run([test_unauthorized_without_user, test_bad_input_names_the_field, test_empty_wallet,
             test_fixed_and_threshold_met_equal_not_met, test_percent_rounding_half_up_and_cap,
             test_goods_coupon_uses_the_goods_amount, test_other_shop_coupons,
             test_expired_used_locked_excluded_ended_not_available, test_sorting_amount_then_expiry,
             test_sorting_many_coupons_over_templates_of_equal_amounts,
             test_template_missing_from_cache_falls_back_to_db,
             test_kept_rows_follow_every_wallet_write,
             test_each_writer_reads_its_write_under_concurrency,
             test_copies_dropped_when_a_redis_connection_is_lost,
             test_flushed_redis_drops_copies])
    finally:
        svc.stop()


if __name__ == "__main__":
    main()
