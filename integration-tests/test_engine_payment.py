"""Payment lifecycle of a user coupon (engine payment.c): create-payment-record, process-payment,
process-refund, cancel-payment and the lock timeout, through HTTP against a real quan-engine,
checking the coupon row, the settlement row, the timeout timer and the wallet after each step.

The coupon and settlement tables are both sharded by user id but with different table counts,
so a user's two rows share a database for some users and not for others: every lifecycle test
runs for one user of each kind. Templates and coupons are written directly (SQL + Redis), as
the claim code would."""

import json
import random
import threading
import time

from engine_db import new_id, redis, shard_index, sql, template_table, user_coupon_table
from quan import Service, check, request, run
from stats_truth import stats_mismatches, stats_of_template

LOCK_TIMEOUT_S = 10  # the smallest QUAN_PAYMENT_LOCK_TIMEOUT_S allows
P = "/api/engine/user-coupon/"
SETTLE_LOCKED, SETTLE_CANCELLED, SETTLE_PAID, SETTLE_REFUNDED = 0, 1, 2, 3
UNUSED, LOCKED, USED = 0, 1, 2

engine = None
LIFECYCLE_TEMPLATES = set()  # templates driven through the API only
_receive_counts = {}  # (user, template) -> coupons made so far (the DB keeps them distinct)


def settlement_table(user):
    idx = shard_index(user, 16)
    return idx // 8, "t_coupon_settlement_%d" % idx


def user_of_kind(same_db):
    """A fresh user whose coupon and settlement rows are (not) in the same database."""
    while True:
        u = random.randrange(1 << 40, 1 << 52)
        if (user_coupon_table(u)[0] == settlement_table(u)[0]) == same_db:
            return u


def shop():
    return random.randrange(1 << 30, 1 << 40)


def make_template(shop_number, type_=0, target=1, goods=None, terms="0", max_="10",
                  rate=None, source=0, cache_only=False):
    tid = new_id()
    rule = {"termsOfUse": terms, "maximumDiscountAmount": max_,
            "explanationOfUnmetConditions": "x", "validityPeriod": 48}
    if rate is not None:
        rule["discountRate"] = rate
    now_ms = int(time.time() * 1000)
    start_ms, end_ms = now_ms - 86400000, now_ms + 30 * 86400000
    if cache_only:
        redis("HSET", "quan:tpl:{%d}" % tid, "id", tid, "shopNumber", shop_number, "name", "t",
              "source", source, "target", target, "goods", goods or "", "type", type_,
              "validStartTime", start_ms, "validEndTime", end_ms, "stock", 10,
              "receiveRule", '{"limitPerPerson":1}', "consumeRule", json.dumps(rule),
              "status", 0)
        redis("PEXPIRE", "quan:tpl:{%d}" % tid, 600000)
        return tid
    ds, table = template_table(shop_number)
    sql(ds, "INSERT INTO %s (id, name, shop_number, source, target, goods, type, "
            "valid_start_time, valid_end_time, stock, receive_rule, consume_rule, status) "
            "VALUES (%d, 'pay test', %d, %d, %d, %s, %d, to_timestamp(%f), to_timestamp(%f), "
            "10, '{\"limitPerPerson\": 1}', '%s', 0)"
        % (table, tid, shop_number, source, target, "'%s'" % goods if goods else "NULL", type_,
           start_ms / 1000.0, end_ms / 1000.0, json.dumps(rule)))
    return tid


def make_coupon(user, tid, shop_number, status=UNUSED, end_offset_s=86400, in_wallet=True):
    """A claimed coupon: the row and (when unused) its wallet member, score = receive time."""
    ds, table = user_coupon_table(user)
    cid = new_id()
    count = _receive_counts[(user, tid)] = _receive_counts.get((user, tid), 0) + 1
    recv_ms = int(time.time() * 1000) - random.randrange(1000, 100000)
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_time, "
            "receive_count, valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, %d, "
            "to_timestamp(%f), %d, now() - interval '1 day', now() + make_interval(secs => %f), %d)"
        % (table, cid, user, tid, shop_number, recv_ms / 1000.0, count, end_offset_s, status))
    if in_wallet:
        redis("ZADD", "quan:wallet:{%d}" % user, recv_ms, "%d_%d" % (tid, cid))
    return cid, recv_ms


def coupon_row(user, cid):
    ds, table = user_coupon_table(user)
    rows = sql(ds, "SELECT status, use_time IS NOT NULL FROM %s WHERE id = %d" % (table, cid))
    return int(rows[0][0]), rows[0][1] == "t"


def coupon_status(user, cid):
    return coupon_row(user, cid)[0]


def settlements(user, cid):
    """[(id, order_id, status)] of the coupon, oldest first."""
    ds, table = settlement_table(user)
    return [(int(a), int(b), int(c)) for a, b, c in
            sql(ds, "SELECT id, order_id, status FROM %s WHERE user_id = %d AND coupon_id = %d "
                    "ORDER BY create_time, id" % (table, user, cid))]


def pending_timers(user, settlement_id):
    ds, _ = settlement_table(user)
    return int(sql(ds, "SELECT count(*) FROM t_outbox WHERE msg_key = 'payment.timeout:%d' "
                       "AND status = 0" % settlement_id)[0][0])


def wallet_score(user, tid, cid):
    """The member's score, or None when the coupon is not in the wallet."""
    s = redis("ZSCORE", "quan:wallet:{%d}" % user, "%d_%d" % (tid, cid))
    return int(float(s)) if s else None


def call(path, body, user):
    headers = {"X-User-Id": str(user)} if user else {}
    st, _, js = request("POST", engine.url + P + path, body, headers)
    return st, js


def create_body(cid, order, amount, payable, shop_number, goods=None):
    b = {"couponId": str(cid), "orderId": str(order), "orderAmount": amount,
         "payableAmount": payable, "shopNumber": str(shop_number)}
    if goods is not None:
        b["goodsList"] = goods
    return b


def ok(st_js, what):
    st, js = st_js
    check(st == 200 and js.get("success") is True, "%s: %s %s" % (what, st, js))


def refused(st_js, status, code, what, text=None):
    st, js = st_js
    check(st == status and js.get("code") == code,
          "%s: want %s %s, got %s %s" % (what, status, code, st, js))
    if text:
        check(text in (js.get("message") or ""), "%s: message %r lacks %r"
              % (what, js.get("message"), text))


def shanghai(ms):
    """ms as the engine answers times (QUAN_TIMEZONE's default, UTC+8, to the second)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms // 1000 + 8 * 3600))


def get_history(cid, user):
    headers = {"X-User-Id": str(user)} if user else {}
    st, _, js = request("GET", engine.url + P + "history?couponId=%s" % cid, None, headers)
    return st, js


def history_of(cid, user):
    st, js = get_history(cid, user)
    check(st == 200 and js.get("success") is True, "history of %s: %s %s" % (cid, st, js))
    return js["data"]


# ---------------------------------------------------------------------------------- tests


def lifecycle(same_db):
    user, s = user_of_kind(same_db), shop()
    tid = make_template(s, type_=1, terms="100", max_="15")  # 15.00 off from 100.00
    cid, recv_ms = make_coupon(user, tid, s)
    order = new_id()
    check(wallet_score(user, tid, cid) == recv_ms, "coupon in the wallet at start")

    ok(call("create-payment-record", create_body(cid, order, "120.50", "105.50", s), user),
       "create")
    check(coupon_status(user, cid) == LOCKED, "locked after create")
    rows = settlements(user, cid)
    check(len(rows) == 1 and rows[0][1:] == (order, SETTLE_LOCKED), "settlement %s" % rows)
    sid = rows[0][0]
    check(pending_timers(user, sid) == 1, "timeout timer written with the settlement")
    check(wallet_score(user, tid, cid) is None, "locked coupon left the wallet")

    # the same coupon cannot be locked twice
    refused(call("create-payment-record", create_body(cid, new_id(), "120.50", "105.50", s),
                 user), 409, "B000104", "second create")

    ok(call("process-payment", {"couponId": str(cid), "orderId": str(order)}, user), "pay")
    check(coupon_row(user, cid) == (USED, True), "used with use_time: %s" % (coupon_row(user, cid),))
    check(settlements(user, cid)[0][2] == SETTLE_PAID, "settlement paid")
    check(pending_timers(user, sid) == 0, "timer cancelled by payment")
    check(wallet_score(user, tid, cid) is None, "used coupon not in the wallet")

    refused(call("process-payment", {"couponId": str(cid), "orderId": str(order)}, user),
            409, "B000104", "pay twice")
    refused(call("cancel-payment", {"couponId": str(cid), "orderId": str(order)}, user),
            409, "B000104", "cancel a paid settlement")

    ok(call("process-refund", {"couponId": str(cid), "orderId": str(order)}, user), "refund")
    check(coupon_row(user, cid) == (UNUSED, False), "unused again after refund")
    check(settlements(user, cid)[0][2] == SETTLE_REFUNDED, "settlement refunded")
    check(wallet_score(user, tid, cid) == recv_ms, "back in the wallet with its receive time")
    refused(call("process-refund", {"couponId": str(cid), "orderId": str(order)}, user),
            409, "B000104", "refund twice")

    # usable again for another order, then cancelled
    order2 = new_id()
    ok(call("create-payment-record", create_body(cid, order2, "100", "85", s), user),
       "create after refund (threshold equal)")
    check(wallet_score(user, tid, cid) is None, "left the wallet again")
    sid2 = settlements(user, cid)[-1][0]
    ok(call("cancel-payment", {"couponId": str(cid), "orderId": str(order2)}, user), "cancel")
    check(coupon_status(user, cid) == UNUSED, "unused after cancel")
    check(settlements(user, cid)[-1][1:] == (order2, SETTLE_CANCELLED), "settlement cancelled")
    check(pending_timers(user, sid2) == 0, "timer cancelled by cancel")
    check(wallet_score(user, tid, cid) == recv_ms, "back in the wallet after cancel")
    refused(call("cancel-payment", {"couponId": str(cid), "orderId": str(order2)}, user),
            409, "B000104", "cancel twice")
    refused(call("process-payment", {"couponId": str(cid), "orderId": str(order2)}, user),
            409, "B000104", "pay a cancelled settlement")

    # The coupon's history, written by the database with each change: lock, pay, refund,
    # lock, cancel, in order, each naming its order; the payment's saving counted once and
    # given back by the refund.
    ds, table = user_coupon_table(user)
    log = sql(ds, "SELECT from_status, to_status, discount_cents, ref, actor FROM %s WHERE "
                  "coupon_id = %d ORDER BY id" % (table.replace("coupon_", "coupon_log_"), cid))
    want = [["0", "1", "0", "order:%d" % order, "payment"],
            ["1", "2", "1500", "order:%d" % order, "payment"],
            ["2", "0", "1500", "order:%d" % order, "payment"],
            ["0", "1", "0", "order:%d" % order2, "payment"],
            ["1", "0", "0", "order:%d" % order2, "payment"]]
    check(log == want, "history %s" % log)
    # The user reads the same history: the issue (a row written without channel or request
    # id), then those changes in order, named, with their times as the database wrote them.
    times = [t for (t,) in sql(ds, "SELECT to_char(create_time AT TIME ZONE 'Asia/Shanghai', "
                                   "'YYYY-MM-DD HH24:MI:SS') FROM %s WHERE coupon_id = %d "
                                   "ORDER BY id" % (table.replace("coupon_", "coupon_log_"), cid))]
    d = history_of(cid, user)
    check({k: d.get(k) for k in ("couponId", "couponTemplateId", "shopNumber", "status",
                                  "truncated")}
          == {"couponId": str(cid), "couponTemplateId": str(tid), "shopNumber": str(s),
              "status": "unused", "truncated": False} and "userId" not in d, "history head %s" % d)
    ev = d["events"]
    check(ev[0] == {"event": "issued", "channel": "unknown", "ref": None,
                    "time": shanghai(recv_ms)}, "issued %s" % ev[0])
    named = [("locked", "unused", "locked", order, 0), ("paid", "locked", "used", order, 15),
             ("refunded", "used", "unused", order, 15), ("locked", "unused", "locked", order2, 0),
             ("unlocked", "locked", "unused", order2, 0)]
    want_ev = [{"event": e, "from": f, "to": t, "ref": "order:%d" % o, "actor": "payment",
                "discountAmount": a, "time": tm} for (e, f, t, o, a), tm in zip(named, times)]
    check(ev[1:] == want_ev, "history events %s, want %s" % (ev[1:], want_ev))
    LIFECYCLE_TEMPLATES.add(tid)
    stats = stats_of_template(tid)
    check((stats["discount_cents"], stats["refund_discount_cents"]) == (1500, 1500),
          "discount saved and given back: %s" % stats)


def test_statistics_of_the_lifecycles():
    """The lifecycle templates' counters equal their rows (the other tests here write
    settlements and coupon states directly, which no real path makes)."""
    m = stats_mismatches(LIFECYCLE_TEMPLATES)
    check(len(LIFECYCLE_TEMPLATES) == 2 and not m, "statistics equal the rows: %s" % m)


def test_lifecycle_rows_in_one_database():
    lifecycle(True)


def test_lifecycle_rows_in_two_databases():
    lifecycle(False)


def test_history_is_the_callers_own():
    """The history of a coupon issued with a channel and a request id, changed by other hands
    (revoked, then put back: a change no path makes is "changed"); at most 1000 changes,
    the oldest; another user's coupon and an unknown one are 404; the id is checked."""
    user, s = user_of_kind(random.random() < 0.5), shop()
    tid = make_template(s, type_=0, max_="5")
    ds, table = user_coupon_table(user)
    cid, req = new_id(), "req-%d" % random.getrandbits(40)
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_time, "
            "receive_count, valid_start_time, valid_end_time, status, channel, request_id) "
            "VALUES (%d, %d, %d, %d, now(), 1, now(), now() + interval '1 day', 0, 1, '%s')"
        % (table, cid, user, tid, s, req))
    sql(ds, "UPDATE %s SET status = 4, last_ref = 'ticket:7', last_actor = 'support' "
            "WHERE id = %d" % (table, cid))
    sql(ds, "UPDATE %s SET status = 0, last_ref = NULL, last_actor = NULL WHERE id = %d"
        % (table, cid))
    d = history_of(cid, user)
    ev = [{k: v for k, v in e.items() if k != "time"} for e in d["events"]]
    check(d["status"] == "unused" and ev == [
        {"event": "issued", "channel": "mq", "ref": req},
        {"event": "revoked", "from": "unused", "to": "revoked", "ref": "ticket:7",
         "actor": "support", "discountAmount": 0},
        {"event": "changed", "from": "revoked", "to": "unused", "ref": None, "actor": None,
         "discountAmount": 0}], "history %s" % d)
    # At most 1000 changes are answered (two so far, 998 more), the oldest, and the answer
    # says when some were left out.
    log = table.replace("coupon_", "coupon_log_")
    sql(ds, "INSERT INTO %s (user_id, coupon_id, coupon_template_id, shop_number, from_status, "
            "to_status, ref) SELECT %d, %d, %d, %d, g %% 2, 1 - g %% 2, 'n:' || g FROM "
            "generate_series(1, 998) g" % (log, user, cid, tid, s))
    d = history_of(cid, user)
    check(not d["truncated"] and len(d["events"]) == 1001 and d["events"][-1]["ref"] == "n:998",
          "1000 changes: %s %s" % (d["truncated"], len(d["events"])))
    sql(ds, "INSERT INTO %s (user_id, coupon_id, coupon_template_id, shop_number, from_status, "
            "to_status) VALUES (%d, %d, %d, %d, 0, 1)" % (log, user, cid, tid, s))
    d = history_of(cid, user)
    check(d["truncated"] and len(d["events"]) == 1001 and d["events"][-1]["ref"] == "n:998",
          "1001 changes: %s %s" % (d["truncated"], len(d["events"])))
    other = user_of_kind(random.random() < 0.5)
    for who, c, what in ((other, cid, "another user's coupon"), (user, new_id(), "unknown")):
        st, js = get_history(c, who)
        check(st == 404 and js.get("code") == "A000404" and js.get("data") is None,
              "%s: %s %s" % (what, st, js))
    for q, text in (("x", "couponId: "), ("0", "couponId: "), ("", "couponId: required")):
        st, js = get_history(q, user)
        check(st == 400 and js.get("code") == "A000001" and text in (js.get("message") or ""),
              "couponId=%r: %s %s" % (q, st, js))
    st, js = get_history(cid, None)
    check(st == 401, "no user: %s %s" % (st, js))


def test_refused_transitions():
    user, s = user_of_kind(random.random() < 0.5), shop()
    tid = make_template(s, type_=0, max_="5")
    cid, _ = make_coupon(user, tid, s)
    order = new_id()
    ids = {"couponId": str(cid), "orderId": str(order)}
    # nothing locked yet: no settlement for this order
    refused(call("process-payment", ids, user), 404, "A000404", "pay unlocked", "orderId")
    refused(call("process-refund", ids, user), 404, "A000404", "refund unlocked")
    refused(call("cancel-payment", ids, user), 404, "A000404", "cancel unlocked")
    ok(call("create-payment-record", create_body(cid, order, "20", "15", s), user), "create")
    refused(call("process-refund", ids, user), 409, "B000104", "refund unpaid")
    refused(call("process-payment", {"couponId": str(cid), "orderId": str(new_id())}, user),
            404, "A000404", "pay with another order id", "orderId")
    # another user's coupon looks absent
    other = user_of_kind(random.random() < 0.5)
    refused(call("process-payment", ids, other), 404, "A000404", "another user's settlement")
    refused(call("create-payment-record", create_body(cid, new_id(), "20", "15", s), other),
            404, "A000404", "lock another user's coupon")
    refused(call("create-payment-record", create_body(new_id(), new_id(), "20", "15", s), user),
            404, "A000404", "lock an unknown coupon")
    check(coupon_status(user, cid) == LOCKED, "still locked by its own order")
    # used, expired coupons cannot be locked
    used, _ = make_coupon(user, tid, s, status=USED, in_wallet=False)
    refused(call("create-payment-record", create_body(used, new_id(), "20", "15", s), user),
            409, "B000104", "lock a used coupon", "used")
    old, _ = make_coupon(user, tid, s, end_offset_s=-60)
    refused(call("create-payment-record", create_body(old, new_id(), "20", "15", s), user),
            409, "B000104", "lock an expired coupon", "expired")
    check(coupon_status(user, old) == UNUSED and settlements(user, old) == [],
          "refused lock left nothing behind")


def test_amount_checks_name_the_field():
    user, s = user_of_kind(random.random() < 0.5), shop()
    whole = make_template(s, type_=1, terms="50", max_="8")
    cid, recv_ms = make_coupon(user, whole, s)
    cases = [
        (create_body(cid, new_id(), "60", "52.01", s), "payableAmount: must be 52.00"),
        (create_body(cid, new_id(), "49.99", "41.99", s), "orderAmount: below"),
        (create_body(cid, new_id(), "60", "52", s + 1), "shopNumber"),
    ]
    for body, text in cases:
        refused(call("create-payment-record", body, user), 400, "A000001", text, text)
    # a goods coupon: base is the matching item's amount, its payable must match too
    goods_tpl = make_template(s, type_=2, target=0, goods="sku-9", terms="0", max_="100",
                              rate="0.85")
    gid, _ = make_coupon(user, goods_tpl, s)
    items = [{"goodsNumber": "sku-1", "goodsAmount": "10", "goodsPayableAmount": "10"},
             {"goodsNumber": "sku-9", "goodsAmount": "33.33", "goodsPayableAmount": "28.34"}]
    refused(call("create-payment-record", create_body(gid, new_id(), "43.33", "38.33", s, items),
                 user), 400, "A000001", "goods payable", "goodsList[1].goodsPayableAmount")
    refused(call("create-payment-record",
                 create_body(gid, new_id(), "10", "10", s, items[:1]), user),
            400, "A000001", "goods not in order", "goodsList")
    for c in (cid, gid):
        check(coupon_status(user, c) == UNUSED and settlements(user, c) == [],
              "refused create changed nothing")
    check(wallet_score(user, whole, cid) == recv_ms, "still in the wallet")
    # 33.33 x (1 - 0.85) = 4.9995 -> 5.00 off (half-up): goods payable 28.33, order 38.33
    items[1]["goodsPayableAmount"] = "28.33"
    ok(call("create-payment-record", create_body(gid, new_id(), "43.33", "38.33", s, items), user),
       "goods percent coupon with exact amounts")
    check(coupon_status(user, gid) == LOCKED, "goods coupon locked")


def test_percent_rounding_and_cap_from_cache():
    """Template only in the Redis cache (no DB row): the cache path of the template lookup."""
    user, s = user_of_kind(random.random() < 0.5), shop()
    tid = make_template(s, type_=2, terms="0", max_="3", rate="0.8", source=1, cache_only=True)
    cid, _ = make_coupon(user, tid, s)
    # 20 % of 10.00 = 2.00, under the 3.00 cap; platform coupon (source 1) in any shop
    refused(call("create-payment-record", create_body(cid, new_id(), "10", "8.01", s + 7), user),
            400, "A000001", "rate is the fraction paid", "payableAmount: must be 8.00")
    ok(call("create-payment-record", create_body(cid, new_id(), "10", "8", s + 7), user),
       "percent under the cap")
    cid2, _ = make_coupon(user, tid, s)
    # 20 % of 100.00 = 20.00, capped at 3.00
    ok(call("create-payment-record", create_body(cid2, new_id(), "100", "97", s), user),
       "percent capped")


def test_input_validation():
    user = user_of_kind(True)
    cases = [
        ({"orderId": "1", "orderAmount": 1, "payableAmount": 1, "shopNumber": "1"}, "couponId"),
        ({"couponId": "1", "orderId": "1", "orderAmount": "1.005", "payableAmount": 1,
          "shopNumber": "1"}, "orderAmount"),
        ({"couponId": "1", "orderId": "1", "orderAmount": -1, "payableAmount": 1,
          "shopNumber": "1"}, "orderAmount"),
        ({"couponId": "1", "orderId": "1", "orderAmount": 1, "payableAmount": 1,
          "shopNumber": "1", "goodsList": {"a": 1}}, "goodsList"),
        ({"couponId": "1", "orderId": "1", "orderAmount": 1, "payableAmount": 1,
          "shopNumber": "1", "goodsList": [{"goodsNumber": "x"}]}, "goodsList[0].goodsAmount"),
        ({"couponId": "x", "orderId": "1", "orderAmount": 1, "payableAmount": 1,
          "shopNumber": "1"}, "couponId"),
    ]
    for body, field in cases:
        refused(call("create-payment-record", body, user), 400, "A000001", field, field + ":")
    for path in ("process-payment", "process-refund", "cancel-payment"):
        refused(call(path, {"couponId": "1"}, user), 400, "A000001", path, "orderId: required")
        refused(call(path, {"couponId": "1", "orderId": "1"}, None), 401, "A000401", path)


def test_concurrent_creates_one_wins():
    for same in (True, False):
        user, s = user_of_kind(same), shop()
        tid = make_template(s, type_=0, max_="1")
        cid, _ = make_coupon(user, tid, s)
        results = []
        barrier = threading.Barrier(6)

        def attempt():
            body = create_body(cid, new_id(), "9", "8", s)
            barrier.wait()
            results.append(call("create-payment-record", body, user))

        threads = [threading.Thread(target=attempt) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(st for st, _ in results)
        check(statuses.count(200) == 1, "exactly one create succeeds: %s" % statuses)
        check(all(st in (200, 409, 429) for st in statuses), "others 409 or 429: %s" % results)
        rows = settlements(user, cid)
        check([r[2] for r in rows if r[2] in (SETTLE_LOCKED, SETTLE_PAID)] == [SETTLE_LOCKED],
              "one active settlement: %s" % rows)
        check(coupon_status(user, cid) == LOCKED, "coupon locked once")


def test_lock_held_elsewhere_is_429_not_silent():
    user, s = user_of_kind(random.random() < 0.5), shop()
    tid = make_template(s, type_=0, max_="1")
    cid, recv_ms = make_coupon(user, tid, s)
    key = "quan:lock:coupon:{%d}" % cid
    redis("SET", key, "someone-else", "PX", 20000)
    try:
        refused(call("create-payment-record", create_body(cid, new_id(), "9", "8", s), user),
                429, "A000429", "create while the coupon lock is held")
        refused(call("cancel-payment", {"couponId": str(cid), "orderId": "1"}, user),
                429, "A000429", "cancel while the coupon lock is held")
        check(coupon_status(user, cid) == UNUSED and settlements(user, cid) == [],
              "nothing done without the lock")
        check(wallet_score(user, tid, cid) == recv_ms, "wallet untouched")
    finally:
        redis("DEL", key)
    ok(call("create-payment-record", create_body(cid, new_id(), "9", "8", s), user),
       "create once the lock is free")
    check(redis("EXISTS", key) == "0", "lock released after the call")


def test_interrupted_two_database_steps_are_completed():
    """States a crash between the two databases leaves; the next call finishes them."""
    user, s = user_of_kind(False), shop()
    tid = make_template(s, type_=0, max_="1")
    sds, stable = settlement_table(user)
    # cancel interrupted: settlement cancelled, coupon still locked and out of the wallet
    cid, recv_ms = make_coupon(user, tid, s, status=LOCKED, in_wallet=False)
    order = new_id()
    sql(sds, "INSERT INTO %s (id, order_id, user_id, coupon_id, status) VALUES (%d, %d, %d, %d, 1)"
        % (stable, new_id(), order, user, cid))
    ok(call("cancel-payment", {"couponId": str(cid), "orderId": str(order)}, user),
       "cancel completes the coupon step")
    check(coupon_status(user, cid) == UNUSED, "coupon unused")
    check(wallet_score(user, tid, cid) == recv_ms, "back in the wallet")
    # create interrupted: settlement locked, coupon still unused; cancel ends the settlement
    cid2, _ = make_coupon(user, tid, s)
    order2 = new_id()
    sql(sds, "INSERT INTO %s (id, order_id, user_id, coupon_id, status) VALUES (%d, %d, %d, %d, 0)"
        % (stable, new_id(), order2, user, cid2))
    ok(call("cancel-payment", {"couponId": str(cid2), "orderId": str(order2)}, user),
       "cancel ends a settlement whose coupon was never locked")
    check(settlements(user, cid2)[0][2] == SETTLE_CANCELLED, "settlement cancelled")
    check(coupon_status(user, cid2) == UNUSED, "coupon unused")
    # pay interrupted: settlement paid, coupon still locked; paying again completes it
    cid3, _ = make_coupon(user, tid, s, status=LOCKED, in_wallet=False)
    order3 = new_id()
    sql(sds, "INSERT INTO %s (id, order_id, user_id, coupon_id, status) VALUES (%d, %d, %d, %d, 2)"
        % (stable, new_id(), order3, user, cid3))
    ok(call("process-payment", {"couponId": str(cid3), "orderId": str(order3)}, user),
       "pay completes the coupon step")
    check(coupon_row(user, cid3) == (USED, True), "coupon used")


def test_timeout_returns_locked_coupons_and_spares_paid_ones():
    cases = []
    for same in (True, False):
        user, s = user_of_kind(same), shop()
        tid = make_template(s, type_=0, max_="2")
        cid, recv_ms = make_coupon(user, tid, s)
        ok(call("create-payment-record", create_body(cid, new_id(), "10", "8", s), user),
           "create")
        cases.append((user, tid, cid, recv_ms))
    # a paid settlement whose timer fires anyway (a stray or duplicate message): nothing changes
    puser, ps = user_of_kind(random.random() < 0.5), shop()
    ptid = make_template(ps, type_=0, max_="2")
    pcid, _ = make_coupon(puser, ptid, ps)
    porder = new_id()
    ok(call("create-payment-record", create_body(pcid, porder, "10", "8", ps), puser), "create")
    ok(call("process-payment", {"couponId": str(pcid), "orderId": str(porder)}, puser), "pay")
    psid = settlements(puser, pcid)[0][0]
    sds, _ = settlement_table(puser)
    sql(sds, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('payment.timeout', "
             "'payment.timeout:test:%d', '{\"settlementId\":\"%d\",\"userId\":\"%d\","
             "\"couponId\":\"%d\"}')" % (psid, psid, puser, pcid))
    for user, tid, cid, _ in cases:
        check(coupon_status(user, cid) == LOCKED, "locked before the timeout")
    deadline = time.time() + LOCK_TIMEOUT_S + 20
    while time.time() < deadline:
        if all(coupon_status(u, c) == UNUSED for u, _, c, _ in cases):
            break
        time.sleep(0.5)
    for user, tid, cid, recv_ms in cases:
        check(coupon_status(user, cid) == UNUSED, "unused after the timeout")
        check(settlements(user, cid)[0][2] == SETTLE_CANCELLED, "settlement cancelled by timeout")
        check(wallet_score(user, tid, cid) == recv_ms, "back in the wallet after the timeout")
    ds, _ = settlement_table(puser)
    check(int(sql(ds, "SELECT count(*) FROM t_outbox WHERE msg_key = 'payment.timeout:test:%d' "
                      "AND status = 1" % psid)[0][0]) == 1, "stray timer was published")
    time.sleep(1.0)
    check(coupon_row(puser, pcid) == (USED, True), "paid coupon untouched by the stray timer")
    check(settlements(puser, pcid)[0][2] == SETTLE_PAID, "paid settlement untouched")


def main():
    global engine
    engine = Service("engine", {"QUAN_PAYMENT_LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S)}).wait_ready()
    try:
        run([test_lifecycle_rows_in_one_database, test_lifecycle_rows_in_two_databases,
             test_statistics_of_the_lifecycles, test_history_is_the_callers_own,
             test_refused_transitions, test_amount_checks_name_the_field,
             test_percent_rounding_and_cap_from_cache, test_input_validation,
             test_concurrent_creates_one_wins, test_lock_held_elsewhere_is_429_not_silent,
             test_interrupted_two_database_steps_are_completed,
             test_timeout_returns_locked_coupons_and_spares_paid_ones])
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
