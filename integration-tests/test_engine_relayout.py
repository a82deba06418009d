"""A live template's stock buckets changed (services/engine/relayout.h; merchant-admin's
change-buckets and increase-number with stockBuckets), against real servers, one Redis or the
three-master cluster (QUAN_TOPOLOGY=cluster: two engine replicas behind a gateway).

A sale of concurrent clients (threads, /redeem and /redeem-mq, retrying what they are told to
retry: 429, 503) on one bucket is changed to three buckets mid-sale, then to two by an
increase-number that also adds stock. Demand equals the stock, so every claim must be served:
any 409 would be a false "no". At the end: coupons = accepted claims = the stock taken, every
user at the limit and not over it, each user's counter at its home among two, the buckets' sum
= the database's stock = 0, nothing on its way, the change over in the row; new users are then
told "sold out". A change is refused while a distribution task of the template is in progress
and while another change is under way (and so is increase-number). The engine killed (-9)
while its re-layout waits for a claim in flight: the engine started again finishes it, exactly;
and a run whose end did not reach the row (killed between its Redis writes and the database)
is done again by the next one, exactly."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import tplbuckets
from engine_db import db_coupons, redis, sql, template_table
from quan import Service, check, request, run, wait_for
from test_engine_claims import new_shop, new_users

ENGINE = "/api/engine"
MA = "/api/merchant-admin/coupon-template/"
# no reservation of a dead process is swept during these tests (the one held on purpose stays)
ENGINE_ENV = {"QUAN_CLAIM_BATCH": "64", "QUAN_RESV_ABANDON_MS": "600000",
              "QUAN_RELAYOUT_CHECK_MS": "200"}

ma = None
en = None


def headers(shop):
    return {"X-User-Id": "1", "X-Shop-Number": str(shop)}


def create(shop, stock, limit, buckets):
    b = {"name": "relayout-%x" % random.getrandbits(32), "source": 0, "target": 1, "type": 0,
         "validStartTime": "2025-01-01 00:00:00", "validEndTime": "2035-01-01 00:00:00",
         "stock": stock, "stockBuckets": buckets,
         "receiveRule": {"limitPerPerson": limit, "usageInstructions": "t"},
         "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}}
    st, _, r = request("POST", ma.url + MA + "create", b, headers(shop))
    check(st == 200, "create: %s %s" % (st, r))
    return int(r["data"]["id"])


def change(shop, tpl, buckets, number=None):
    """change-buckets, or increase-number naming stockBuckets when number is given."""
    body = {"couponTemplateId": str(tpl), "stockBuckets": buckets}
    if number is None:
        return request("POST", ma.url + MA + "change-buckets", body, headers(shop))
    body["number"] = number
    return request("POST", ma.url + MA + "increase-number", body, headers(shop))


def find(shop, tpl):
    st, _, r = request("GET", ma.url + MA + "find?couponTemplateId=%d" % tpl, None, headers(shop))
    check(st == 200, "find: %s %s" % (st, r))
    return r["data"]


def row(shop, tpl):
    ds, table = template_table(shop)
    stock, n, frm = sql(ds, "SELECT stock, stock_buckets, coalesce(buckets_relayout_from, 0) "
                            "FROM %s WHERE id = %d" % (table, tpl))[0]
    return int(stock), int(n), int(frm)


def changed(shop, tpl, n, timeout=90):
    """Waits until the row says n buckets and no change under way."""
    check(wait_for(lambda: row(shop, tpl)[1:] == (n, 0), timeout),
          "the change to %d buckets is over: %s\n%s" % (n, row(shop, tpl), en.tail(20)))


def redeem(user, shop, tpl, request_id, mq=False, give_up=120):
    """The final answer of one claim: 429 and 503 (try again) retried, as a client is told."""
    body = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl),
            "requestId": request_id}
    path = "/user-coupon/redeem-mq" if mq else "/user-coupon/redeem"
    deadline, retries = time.time() + give_up, 0
    while True:
        st, _, r = request("POST", en.url + ENGINE + path, body, {"X-User-Id": str(user)},
                           timeout=30)
        if st not in (429, 503) or time.time() > deadline:
            return st, r, retries
        retries += 1
        time.sleep(0.05)


def bucket_sum(tpl, n):
    return sum(int(redis("HGET", tplbuckets.keys(tpl, b, n)[0], "stock") or 0) for b in range(n))


def on_their_way(tpl, n):
    return sum(1 for b in range(n)
               for f in redis("HKEYS", tplbuckets.keys(tpl, b, n)[0]).split()
               if f.startswith("xo:"))


def check_exact(shop, tpl, users, stock_given, n, limit):
    """Coupons = the stock taken; nobody over the limit; counters at the home among n; the
    buckets' sum = the database's stock; nothing on its way; the change over."""
    coupons = db_coupons(users, tpl)
    total = sum(len(v) for v in coupons.values())
    db_stock, nb, frm = row(shop, tpl)
    check((nb, frm) == (n, 0), "the row says %d buckets, change from %d" % (nb, frm))
    check(total == stock_given - db_stock, "%d coupons, stock %d -> %d" % (
        total, stock_given, db_stock))
    check(bucket_sum(tpl, n) == db_stock, "Redis %d != DB stock %d" % (bucket_sum(tpl, n),
                                                                        db_stock))
    check(on_their_way(tpl, n) == 0, "a transfer left on its way")
    for u in users:
        cs = coupons[u]
        check(len(cs) <= limit, "user %d holds %d > limit %d" % (u, len(cs), limit))
        for b in range(n):
            cnt = redis("HGET", tplbuckets.keys(tpl, b, n)[1], str(u))
            want = len(cs) if b == tplbuckets.home(u, n) and cs else None
            check((int(cnt) if cnt else None) == want,
                  "counter of %d in bucket %d of %d: %s, coupons %d" % (u, b, n, cnt, len(cs)))
    return total


def test_live_sale_changed_to_three_then_two():
    shop, stock, extra, limit = new_shop(), 300, 10, 2
    users = new_users((stock + extra) // limit)
    tpl = create(shop, stock, limit, 1)
    # every user claims twice (the limit), a third of the claims by /redeem-mq
    claims = [(u, "r%d.%d" % (u, k), (u + k) % 3 == 0) for k in range(limit) for u in users]
    random.shuffle(claims)
    done = [0]
    lock = threading.Lock()
    last_quarter = threading.Event()  # held until the added stock is in the row

    def one(c):
        with lock:
            idx = done[0]
        if idx >= len(claims) * 3 // 4:
            last_quarter.wait(120)
        a = redeem(c[0], shop, tpl, c[1], mq=c[2])
        with lock:
            done[0] += 1
        return c, a

    def progress(frac):
        check(wait_for(lambda: done[0] >= len(claims) * frac, 120), "the sale goes on")

    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [pool.submit(one, c) for c in claims]
        progress(0.25)
        st, _, r = change(shop, tpl, 3)
        check(st == 202 and r["data"]["stockBucketsChangingFrom"] == 1
              and r["data"]["stockBuckets"] == 3, "the change to 3 is under way: %s %s" % (st, r))
        changed(shop, tpl, 3)
        progress(0.5)
        st, _, r = change(shop, tpl, 2, number=extra)
        check(st == 202 and r["data"]["stockBucketsChangingFrom"] == 3,
              "increase-number changes to 2: %s %s" % (st, r))
        last_quarter.set()
        changed(shop, tpl, 2)
        answers = [f.result() for f in futures]
    ok = [a for c, a in answers if a[0] == (202 if c[2] else 200)]
    bad = [(c[1], a[0], a[1]) for c, a in answers if a[0] != (202 if c[2] else 200)]
    check(not bad, "every claim served (no false no, no lost answer): %d not, e.g. %s" % (
        len(bad), bad[:3]))
    check(wait_for(lambda: sum(len(v) for v in db_coupons(users, tpl).values()) == len(ok), 60),
          "every accepted claim is a coupon")
    time.sleep(0.5)
    check(check_exact(shop, tpl, users, stock + extra, 2, limit) == stock + extra,
          "exactly the stock sold")
    check(all(len(v) == limit for v in db_coupons(users, tpl).values()), "each user at the limit")
    d = find(shop, tpl)
    check(d["stockBuckets"] == 2 and "stockBucketsChangingFrom" not in d,
          "the query shows the change over: %s" % d)
    for b in range(1, 3):  # bucket b of 3 that is no bucket of 2 is gone
        h = tplbuckets.keys(tpl, b, 3)[0]
        if h not in [tplbuckets.keys(tpl, k, 2)[0] for k in range(2)]:
            check(redis("EXISTS", h) == "0", "bucket %d of 3 deleted" % b)
    late = new_users(6)
    for u in late:
        st, r, _ = redeem(u, shop, tpl, "late%d" % u)
        check(st == 409 and r["code"] == "B000100", "sold out at last: %s %s" % (st, r))
    print("      %d claims served through two changes, %d retries on the way" % (
        len(ok), sum(a[2] for c, a in answers)))


def test_change_refused_while_a_task_runs():
    shop = new_shop()
    tpl = create(shop, 10, 1, 2)
    task = random.randint(10**12, 9 * 10**12)
    sql(0, "INSERT INTO t_coupon_task (id, shop_number, batch_id, task_name, file_address, "
           "coupon_template_id, status) VALUES (%d, %d, 1, 'relayout', 'x', %d, 1)"
        % (task, shop, tpl))
    try:
        st, _, r = change(shop, tpl, 3)
        check(st == 409 and r["code"] == "B000104" and "task" in r["message"],
              "refused while a task runs: %s %s" % (st, r))
        check(row(shop, tpl)[1:] == (2, 0), "nothing changed")
    finally:
        sql(0, "DELETE FROM t_coupon_task WHERE id = %d" % task)
    st, _, r = change(shop, tpl, 2)
    check(st == 200, "the same number changes nothing: %s %s" % (st, r))
    st, _, r = change(shop, tpl, 65)
    check(st == 400, "65 buckets refused: %s %s" % (st, r))


def test_engine_killed_while_the_relayout_waits():
    global en
    shop, stock, n0, n1 = new_shop(), 40, 2, 3
    tpl = create(shop, stock, 1, n0)
    users = new_users(24)
    first, second = users[:10], users[10:]
    for u in first:
        st, r, _ = redeem(u, shop, tpl, "k%d" % u)
        check(st == 200, "claimed: %s %s" % (st, r))
    # a claim in flight on the old buckets: its reservation is open (as a sync claim's is
    # until its coupon is written): the re-layout must wait for it
    held = tplbuckets.keys(tpl, 1, n0)[2]
    redis("ZADD", held, str(int(time.time() * 1000)), "77:held")
    st, _, r = change(shop, tpl, n1)
    check(st == 202, "the change is under way: %s %s" % (st, r))
    d = find(shop, tpl)
    check(d["stockBuckets"] == n1 and d["stockBucketsChangingFrom"] == n0,
          "the query shows it: %s" % d)
    st, _, r = change(shop, tpl, 1)
    check(st == 409 and r["code"] == "B000104", "a second change waits: %s %s" % (st, r))
    st, _, r = change(shop, tpl, n1, number=5)
    check(st == 409 and r["code"] == "B000104", "so does increase-number: %s %s" % (st, r))
    check(wait_for(lambda: redis("HEXISTS", tplbuckets.keys(tpl, 0, n0)[0], "stock") == "0", 10),
          "the engine closed the old buckets")
    st, _, r = redeem(second[0], shop, tpl, "w%d" % second[0], give_up=1)
    check(st == 503, "a claim meanwhile is told to try again, not 'no': %s %s" % (st, r))
    time.sleep(2)
    check(row(shop, tpl)[2] == n0, "the re-layout waits for the claim in flight")
    en.signal(9)
    en.wait_exit(10)
    en.stop()
    redis("ZREM", held, "77:held")  # the claim in flight ended (it never took a unit)
    en = Service("engine", ENGINE_ENV).wait_ready()
    changed(shop, tpl, n1, timeout=60)
    for u in second:
        st, r, _ = redeem(u, shop, tpl, "k%d" % u)
        check(st == 200, "claimed after the change: %s %s" % (st, r))
        st, r, _ = redeem(u, shop, tpl, "k%d" % u)
        check(st == 200, "the same request id answers the same coupon: %s %s" % (st, r))
    for u in first:  # their markers and counters moved to their homes among 3
        st, r, _ = redeem(u, shop, tpl, "k%d" % u)
        check(st == 200, "a request id of before the change answers its coupon: %s %s" % (st, r))
        st, r, _ = redeem(u, shop, tpl, "again%d" % u)
        check(st == 409 and r["code"] == "B000101", "limit kept across the change: %s %s" % (
            st, r))
    check(check_exact(shop, tpl, users, stock, n1, 1) == len(users), "exactly the claims")
    # a replica killed after writing the new buckets, before the row said the change was over:
    # the next run finds the old buckets gone and the users moved, and does it all again
    ds, table = template_table(shop)
    sql(ds, "UPDATE %s SET buckets_relayout_from = %d WHERE id = %d" % (table, n0, tpl))
    changed(shop, tpl, n1, timeout=60)
    for u in first + second:
        st, r, _ = redeem(u, shop, tpl, "k%d" % u)
        check(st == 200, "a request id answers its coupon after a second run: %s %s" % (st, r))
        st, r, _ = redeem(u, shop, tpl, "third%d" % u)
        check(st == 409 and r["code"] == "B000101", "the limit after a second run: %s %s" % (
            st, r))
    more = new_users(6)
    for u in more:
        st, r, _ = redeem(u, shop, tpl, "m%d" % u)
        check(st == 200, "claimed after a second run: %s %s" % (st, r))
    check(check_exact(shop, tpl, users + more, stock, n1, 1) == len(users) + len(more),
          "exactly the claims after a second run")


def main():
    global ma, en
    ma = Service("merchant-admin").wait_ready()
    en = Service("engine", ENGINE_ENV).wait_ready()
    try:
        run([test_change_refused_while_a_task_runs,
             test_live_sale_changed_to_three_then_two,
             test_engine_killed_while_the_relayout_waits])
    finally:
        en.stop()
        ma.stop()


if __name__ == "__main__":
    main()
