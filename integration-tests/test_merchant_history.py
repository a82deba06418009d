"""merchant-admin's coupon history (/coupon/history) against real servers: coupons of the shop's
template for users of both databases, changed through the engine's payment API (lock, pay,
refund, lock, cancel; lock, pay) and by its expiry sweeper, then read by the shop and compared
with what the engine answers each coupon's user (the same answer, plus userId); a coupon of
another shop's template is 404 for this shop and answered to its own; an unknown id 404; bad ids
400 naming the field."""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_db import (make_merchant_template, new_id, new_shop, redis, sql,  # noqa: E402
                       user_coupon_table)
from quan import Service, check, request, run, wait_for  # noqa: E402

MA = "/api/merchant-admin/coupon/history"
EN = "/api/engine/user-coupon/"

madmin = engine = None
shop, other_shop = new_shop(), new_shop()
tpl = other_tpl = None
coupons = {}  # name -> (user, coupon id)


def user_in(ds):
    while True:
        u = random.randrange(1 << 40, 1 << 52)
        if user_coupon_table(u)[0] == ds:
            return u


def issue(user, template, shop_number, channel, request_id=None, end="interval '1 day'"):
    """A coupon as a claim writes it (the row and its wallet member); its id."""
    ds, table = user_coupon_table(user)
    cid = new_id()
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status, channel, request_id) VALUES (%d, %d, %d, "
            "%d, 1, now() - interval '1 hour', now() + %s, 0, %d, %s)"
        % (table, cid, user, template, shop_number, end, channel,
           "'%s'" % request_id if request_id else "NULL"))
    redis("ZADD", "quan:wallet:{%d}" % user, 1, "%d_%d" % (template, cid))
    return cid


def pay(path, user, cid, order, shop_number=None):
    body = {"couponId": str(cid), "orderId": str(order)}
    if path == "create-payment-record":
        body.update({"orderAmount": "20", "payableAmount": "15", "shopNumber": str(shop_number)})
    st, _, js = request("POST", engine.url + EN + path, body, {"X-User-Id": str(user)})
    check(st == 200 and js.get("success") is True, "%s: %s %s" % (path, st, js))


def shop_history(cid, s=None):
    st, _, js = request("GET", madmin.url + MA + "?couponId=%s" % cid, None,
                        {"X-User-Id": "7", "X-Shop-Number": str(s or shop)})
    return st, js


def user_history(cid, user):
    st, _, js = request("GET", engine.url + EN + "history?couponId=%d" % cid, None,
                        {"X-User-Id": str(user)})
    check(st == 200, "engine history of %d: %s %s" % (cid, st, js))
    return js["data"]


def setup():
    global tpl, other_tpl
    tpl = make_merchant_template(shop, "history")  # 5.00 off, whole shop
    other_tpl = make_merchant_template(other_shop, "history other")
    a, b, c = user_in(0), user_in(1), user_in(random.randrange(2))
    # a: lock, pay, refund, then locked again and cancelled
    ca = issue(a, tpl, shop, 0, "req-%d" % new_id())
    o1, o2 = new_id(), new_id()
    pay("create-payment-record", a, ca, o1, shop)
    pay("process-payment", a, ca, o1)
    pay("process-refund", a, ca, o1)
    pay("create-payment-record", a, ca, o2, shop)
    pay("cancel-payment", a, ca, o2)
    # b (the other database): issued by a distribution task, paid
    cb = issue(b, tpl, shop, 2)
    o3 = new_id()
    pay("create-payment-record", b, cb, o3, shop)
    pay("process-payment", b, cb, o3)
    # c: an exchange code's coupon, expired by the sweeper
    cc = issue(c, tpl, shop, 3, end="interval '-1 second'")
    ds, table = user_coupon_table(c)
    check(wait_for(lambda: sql(ds, "SELECT status FROM %s WHERE id = %d" % (table, cc))[0][0]
                   == "3", 15), "the sweeper expired the coupon")
    # d: another shop's, never changed
    d = user_in(random.randrange(2))
    cd = issue(d, other_tpl, other_shop, 1, "req-%d" % new_id())
    coupons.update({"paid refunded cancelled": (a, ca), "paid": (b, cb), "expired": (c, cc),
                    "other shop's": (d, cd)})
    return o1, o2, o3


def test_the_shop_reads_what_the_user_reads():
    o1, o2, o3 = setup()
    want_events = {
        "paid refunded cancelled": [("issued", None), ("locked", "order:%d" % o1),
                                    ("paid", "order:%d" % o1), ("refunded", "order:%d" % o1),
                                    ("locked", "order:%d" % o2), ("unlocked", "order:%d" % o2)],
        "paid": [("issued", None), ("locked", "order:%d" % o3), ("paid", "order:%d" % o3)],
        "expired": [("issued", None), ("expired", None)],
    }
    for name, events in want_events.items():
        user, cid = coupons[name]
        st, js = shop_history(cid)
        check(st == 200 and js.get("success") is True, "%s: %s %s" % (name, st, js))
        d = js["data"]
        mine = user_history(cid, user)
        check(d.pop("userId", None) == str(user), "%s: userId %s" % (name, js["data"]))
        check(d == mine, "%s: the shop reads %s, the user %s" % (name, d, mine))
        check(d["shopNumber"] == str(shop) and d["couponTemplateId"] == str(tpl),
              "%s: %s" % (name, d))
        got = [(e["event"], e["ref"] if e["event"] != "issued" else None) for e in d["events"]]
        check(got == events, "%s: events %s, want %s" % (name, got, events))
    d = shop_history(coupons["paid refunded cancelled"][1])[1]["data"]
    ev = d["events"]
    check(ev[0]["channel"] == "claim" and ev[0]["ref"].startswith("req-")
          and d["status"] == "unused", "claimed coupon %s" % d)
    check([e["discountAmount"] for e in ev[1:]] == [0, 5, 5, 0, 0]
          and {e["actor"] for e in ev[1:]} == {"payment"}, "savings and actors %s" % ev)
    d = shop_history(coupons["paid"][1])[1]["data"]
    check(d["status"] == "used" and d["events"][0]["channel"] == "distribution"
          and d["events"][0]["ref"] is None, "distributed coupon %s" % d)
    d = shop_history(coupons["expired"][1])[1]["data"]
    check(d["status"] == "expired" and d["events"][0]["channel"] == "exchangeCode"
          and d["events"][1]["actor"] == "expiry", "expired coupon %s" % d)


def test_another_shops_coupon_and_unknown_ids_are_404():
    user, cid = coupons["other shop's"]
    st, js = shop_history(cid)
    check(st == 404 and js.get("code") == "A000404" and js.get("data") is None,
          "another shop's coupon: %s %s" % (st, js))
    st, js = shop_history(cid, other_shop)
    check(st == 200 and js["data"]["userId"] == str(user)
          and js["data"]["events"][0]["channel"] == "mq", "its own shop: %s %s" % (st, js))
    # this shop's coupon, asked by the other shop
    st, js = shop_history(coupons["paid"][1], other_shop)
    check(st == 404 and js.get("code") == "A000404", "asked by another shop: %s %s" % (st, js))
    st, js = shop_history(new_id())
    check(st == 404 and js.get("code") == "A000404", "unknown coupon: %s %s" % (st, js))


def test_bad_ids_are_400_naming_the_field():
    for q, text in (("abc", "couponId: "), ("0", "couponId: "), ("-5", "couponId: "),
                    ("", "couponId: required"), ("99999999999999999999", "couponId: ")):
        st, js = shop_history(q)
        check(st == 400 and js.get("code") == "A000001" and text in (js.get("message") or "")
              and len(js.get("message") or "") > len("couponId: "),
              "couponId=%r: %s %s" % (q, st, js))
    st, _, js = request("GET", madmin.url + MA + "?couponId=1", None, {"X-User-Id": "7"})
    check(st == 401, "no shop: %s %s" % (st, js))


def main():
    global madmin, engine
    madmin = Service("merchant-admin").wait_ready()
    engine = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": "300"}).wait_ready()
    try:
        run([test_the_shop_reads_what_the_user_reads,
             test_another_shops_coupon_and_unknown_ids_are_404,
             test_bad_ids_are_400_naming_the_field])
    finally:
        engine.stop()
        madmin.stop()


if __name__ == "__main__":
    main()
