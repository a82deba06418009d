"""Claims on a template of three stock buckets (common/coupon/bucket.h) through quan-engine's
HTTP routes (claimrun.c, seek.c, claimq.c, resv.c), against real servers, one Redis or the
three-master cluster (QUAN_TOPOLOGY=cluster: the three buckets lie on three masters): a flash
sale of concurrent clients demanding twice the stock (90 % of them in one home bucket), by
/redeem and by /redeem-mq (drained), sells exactly the stock (the database's stock = the buckets' sum, 0 left, no unit on its way),
nobody over the limit, each user's count in its home bucket, wallets = coupons; a sale where
most users share one home bucket, with demand equal to the stock, sells every unit with no
"sold out" (B000100) at all, then tells the next users "sold out"; a claim routed by a number
of buckets the engine did not know yet (a template it never read) finds its home."""

import random
import time
from concurrent.futures import ThreadPoolExecutor

import tplbuckets
from engine_db import db_coupons, metric, redis, sql, template_table
from quan import Service, check, pinned, request, run, wait_for

ENGINE = "/api/engine"
MA = "/api/merchant-admin/coupon-template/"
N = 3

ma = None
en = None


def new_shop():
    return random.randint(10**12, 9 * 10**12)


def new_users(n, home=None, share=None):
    """n user ids; with home, about share (0..1) of them in that home bucket of N."""
    base = random.randint(10**10, 9 * 10**13)
    if home is None:
        return [base + i * 7919 for i in range(n)]
    hot, cold, u = [], [], base
    want_hot = int(n * share)
    while len(hot) < want_hot or len(cold) < n - want_hot:
        u += 7919
        if tplbuckets.home(u, N) == home:
            if len(hot) < want_hot:
                hot.append(u)
        elif len(cold) < n - want_hot:
            cold.append(u)
    users = hot + cold
    random.shuffle(users)
    return users


def create(shop, stock, limit=1, buckets=N):
    b = {"name": "buckets-%x" % random.getrandbits(32), "source": 0, "target": 1, "type": 0,
         "validStartTime": "2025-01-01 00:00:00", "validEndTime": "2035-01-01 00:00:00",
         "stock": stock, "stockBuckets": buckets,
         "receiveRule": {"limitPerPerson": limit, "usageInstructions": "t"},
         "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}}
    st, _, r = request("POST", ma.url + MA + "create", b,
                       {"X-User-Id": "1", "X-Shop-Number": str(shop)})
    check(st == 200, "create: %s %s" % (st, r))
    return int(r["data"]["id"])


def redeem(user, shop, tpl, mq=False, request_id=None):
    """The final answer of one claim: 429 (in doubt) retried, as a client is told to."""
    body = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)}
    if request_id:
        body["requestId"] = request_id
    path = "/user-coupon/redeem-mq" if mq else "/user-coupon/redeem"
    doubts = 0
    for _ in range(200):
        st, _, r = request("POST", en.url + ENGINE + path, body, {"X-User-Id": str(user)},
                           timeout=30)
        if st != 429:
            return st, r, doubts
        doubts += 1
        time.sleep(0.05)
    return st, r, doubts


def bucket_stocks(tpl):
    out = []
    for b in range(N):
        h = tplbuckets.keys(tpl, b, N)[0]
        out.append(int(redis("HGET", h, "stock") or -1))
    return out


def on_their_way(tpl):
    """Transfers given and not yet settled (records xo:<id> in the buckets' hashes)."""
    n = 0
    for b in range(N):
        fields = redis("HKEYS", tplbuckets.keys(tpl, b, N)[0]).split()
        n += sum(1 for f in fields if f.startswith("xo:"))
    return n


def db_stock(shop, tpl):
    ds, table = template_table(shop)
    return int(sql(ds, "SELECT stock FROM %s WHERE id = %d" % (table, tpl))[0][0])


def check_consistent(shop, tpl, users, stock0, limit):
    """DB stock = the buckets' sum (nothing on its way); coupons = the stock taken; nobody over
    the limit; each user's count in its home bucket; wallets = coupons."""
    coupons = db_coupons(users, tpl)
    total = sum(len(v) for v in coupons.values())
    stocks, ds_ = bucket_stocks(tpl), db_stock(shop, tpl)
    check(on_their_way(tpl) == 0, "a transfer left on its way")
    check(sum(stocks) == ds_, "Redis buckets %s (sum %d) != DB stock %d" % (stocks, sum(stocks), ds_))
    check(total == stock0 - ds_, "%d coupons but stock went %d -> %d" % (total, stock0, ds_))
    for u in users:
        cs = coupons[u]
        check(len(cs) <= limit, "user %d holds %d > limit %d" % (u, len(cs), limit))
        users_key = tplbuckets.keys(tpl, tplbuckets.home(u, N), N)[1]
        cnt = redis("HGET", users_key, str(u))
        check(int(cnt or 0) == len(cs), "counter of %d at home: %s, coupons %d" % (u, cnt, len(cs)))
        members = redis("ZRANGE", "quan:wallet:{%d}" % u, 0, -1).split()
        w = sorted(int(m.split("_")[1]) for m in members if m.startswith("%d_" % tpl))
        check(w == sorted(c[0] for c in cs if c[2] == 0), "wallet of %d %s != DB %s" % (u, w, cs))
    return total


def wait_coupons(users, tpl, want, timeout=60):
    wait_for(lambda: sum(len(v) for v in db_coupons(users, tpl).values()) == want, timeout)
    time.sleep(0.5)


def sale(users, shop, tpl, mq):
    with ThreadPoolExecutor(max_workers=48) as pool:
        return list(pool.map(lambda u: redeem(u, shop, tpl, mq=mq, request_id="b%d" % u), users))


def flash_sale(mq):
    # 90 % of the users in bucket 0: the other two buckets' users cannot take their shares,
    # so the sale sells out only if bucket 0's users get them
    shop, stock = new_shop(), 150
    users = new_users(2 * stock, home=0, share=0.9)
    tpl = create(shop, stock)
    check(bucket_stocks(tpl) == [tplbuckets.share(stock, b, N) for b in range(N)],
          "the stock split over the buckets: %s" % bucket_stocks(tpl))
    answers = sale(users, shop, tpl, mq)
    ok = [a for a in answers if a[0] == (202 if mq else 200)]
    no = [a for a in answers if a[0] == 409]
    other = [a[:2] for a in answers if a[0] not in (200, 202, 409)]
    check(not other, "errors: %s" % other[:3])
    check(len(ok) == stock, "%d accepted, stock %d" % (len(ok), stock))
    check(len(no) == len(users) - stock and all(a[1]["code"] == "B000100" for a in no),
          "the others told sold out: %s" % {a[1]["code"] for a in no})
    if mq:
        wait_coupons(users, tpl, stock)
    check(bucket_stocks(tpl) == [0] * N, "every bucket empty: %s" % bucket_stocks(tpl))
    check(check_consistent(shop, tpl, users, stock, 1) == stock, "exactly the stock")
    print("      %d sold, %d told sold out, %d answers in doubt on the way" % (
        len(ok), len(no), sum(a[2] for a in answers)))


def test_flash_sale_sync_sells_exactly_the_stock():
    flash_sale(False)


def test_flash_sale_mq_sells_exactly_the_stock():
    flash_sale(True)


def test_most_users_in_one_bucket_sell_to_the_last_unit():
    # 80 % of the users share bucket 0, which holds a third of the stock: its users must get
    # the other buckets' units; demand equals the stock, so any "sold out" would be false
    shop, stock = new_shop(), 120
    users = new_users(stock, home=0, share=0.8)
    tpl = create(shop, stock)
    answers = sale(users, shop, tpl, False)
    bad = [(a[0], a[1].get("code")) for a in answers if a[0] != 200]
    check(not bad, "every claim served (no false sold out): %d not: %s" % (len(bad), bad[:5]))
    check(bucket_stocks(tpl) == [0] * N, "every bucket empty: %s" % bucket_stocks(tpl))
    # and now it is sold out, finally, wherever the next users' homes are
    late = new_users(12)
    for a in sale(late, shop, tpl, False):
        check(a[0] == 409 and a[1]["code"] == "B000100", "sold out: %s" % (a[:2],))
    check(check_consistent(shop, tpl, users + late, stock, 1) == stock, "exactly the stock")


def test_claim_before_the_engine_knows_the_buckets():
    # a template whose buckets this engine never heard of (its hash written by the API):
    # the first claim is routed by one bucket, told the template has three, and goes home
    shop, stock = new_shop(), 9
    tpl = create(shop, stock)
    users = new_users(30, home=2, share=1.0)[:3]
    for u in users:
        st, r, _ = redeem(u, shop, tpl, request_id="k%d" % u)
        check(st == 200, "claimed: %s %s" % (st, r))
    stocks = bucket_stocks(tpl)
    check(stocks[2] == tplbuckets.share(stock, 2, N) - 3 and sum(stocks) == stock - 3,
          "taken at their home bucket 2: %s" % stocks)
    for u in users:
        home = tplbuckets.keys(tpl, 2, N)
        check(redis("HGET", home[1], str(u)) == "1", "count of %d at home" % u)
        check(redis("HGET", tplbuckets.keys(tpl, 0, N)[1], str(u)) in ("", None),
              "nothing of %d in bucket 0" % u)


def test_stock_back_in_another_bucket_after_sold_out():
    # Sold out, and the engine's copy of the template settled: the next refusals of claims
    # without a request id are its own (claim.c). Then a unit comes back in bucket 2 alone (as
    # a give-back there does; the database's row with it): the copy must be dropped, not go on
    # refusing while a bucket holds stock.
    with pinned(en):  # what one process keeps
        shop, stock = new_shop(), 3
        tpl = create(shop, stock)
        for u in new_users(stock):
            st, r, _ = redeem(u, shop, tpl, request_id="s%d" % u)
            check(st == 200, "claimed: %s %s" % (st, r))

        def copy_refusals():
            text = request("GET", en.url + "/metrics")[2].decode()
            return metric(text, "quan_rcopy_lookups_total", what="claim_gate", result="hit") or 0

        before = copy_refusals()
        for u in new_users(6):
            st, r, _ = redeem(u, shop, tpl)
            check(st == 409 and r["code"] == "B000100", "sold out: %s %s" % (st, r))
            time.sleep(0.2)  # the copy is read in the background after a refusal
        check(copy_refusals() - before >= 3, "the last refusals are the copy's (the long tail "
              "costs no Redis call): %s" % (copy_refusals() - before))
        ds, table = template_table(shop)
        sql(ds, "UPDATE %s SET stock = stock + 1 WHERE id = %d" % (table, tpl))
        bucket2 = tplbuckets.keys(tpl, 2, N)[0]
        redis("HINCRBY", bucket2, "stock", "1")
        redis("HINCRBY", bucket2, "gen", "1")
        u = new_users(30, home=0, share=1.0)[0]  # served by a transfer from bucket 2
        st, r, _ = redeem(u, shop, tpl)
        check(st == 200, "the unit back in bucket 2 is claimed, not refused: %s %s" % (st, r))
        check(bucket_stocks(tpl) == [0] * N and db_stock(shop, tpl) == 0,
              "all sold: %s, database %d" % (bucket_stocks(tpl), db_stock(shop, tpl)))


def test_result_looks_for_the_record_at_the_users_home():
    """/redeem-result of a client's own requestId whose claim is still on its way after 30 s (its
    pending marker that old, its record open in the set of the user's home bucket, not bucket
    0's): PENDING, and the marker stays (a record not found would remove it, and the next
    answer would be 404 while the claim may still become a coupon). The engine has never
    claimed on the template: the number of buckets comes from the template's hash."""
    shop, user = new_shop(), new_users(1, home=N - 1, share=1.0)[0]
    tpl = create(shop, 100)
    old = int(time.time() * 1000) - 60000
    marker = "quan:claim:{%d}:far" % user
    record = tplbuckets.keys(tpl, tplbuckets.home(user, N), N)[2]
    redis("SET", marker, "%d:%d" % (tpl, old), "PX", 600000)
    redis("ZADD", record, old, "%d:far" % user)
    try:
        for _ in range(2):
            st, _, r = request("GET", en.url + ENGINE + "/user-coupon/redeem-result?requestId=far",
                               None, {"X-User-Id": str(user)})
            check(st == 200 and r["data"]["status"] == "PENDING", "PENDING: %s %s" % (st, r))
        time.sleep(0.5)
        check(redis("EXISTS", marker) == "1", "the pending marker stays")
    finally:
        redis("ZREM", record, "%d:far" % user)
        redis("DEL", marker)


def main():
    global ma, en
    ma = Service("merchant-admin").wait_ready()
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()
    try:
        run([test_claim_before_the_engine_knows_the_buckets,
             test_flash_sale_sync_sells_exactly_the_stock,
             test_flash_sale_mq_sells_exactly_the_stock,
             test_most_users_in_one_bucket_sell_to_the_last_unit,
             test_stock_back_in_another_bucket_after_sold_out,
             test_result_looks_for_the_record_at_the_users_home])
    finally:
        en.stop()
        ma.stop()


if __name__ == "__main__":
    main()
