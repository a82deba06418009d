"""Template query chain, claims (synchronous and via MQ), claim results and the coupon list of
quan-engine (query.c, claim.c, claimdb.c, claimq.c, wallet.c), through HTTP against real
servers: the chain's single database read under 1000 concurrent cold queries, every refusal
code, request-id idempotency, hundreds of concurrent users over a small stock (limits 1 and 2,
sync and MQ: exactly `stock` coupons, nobody over the limit, Redis = DB = wallets), a forced
database failure (reservation given back exactly), a publish the broker refuses (given back,
no pending result left), a pending marker that outlived its claim (removed by the result
query that finds it so), a claim message delivered twice, packs under
the consume guard (one key per message, named by its content: a pack again is skipped whole,
another pack sharing a claim is not, a pack holding a later attempt comes back whole and is
written), and the consumer killed mid-batch and restarted; a sync claim whose process dies between the two
databases' commits (its check event completes it, or gives the stock back when the reservation
was returned); a replica that only accepts (QUAN_CLAIM_CONSUMERS=0)
and packs concurrent claims into fewer messages, drained later by another."""

import hashlib
import json
import os
import random
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from engine_db import (Resp, db_coupons, insert_template, kill_redis_clients, metric, new_id,
                       queue_messages, rabbitmqctl, redis, redis_masters_count, sql,
                       template_table, user_coupon_table)
from quan import BIN, Service, check, pinned, request, run, wait_for
from stats_truth import statistics_baseline, test_statistics_equal_the_rows

ENGINE = "/api/engine"
MA = "/api/merchant-admin/coupon-template/"
TOOL = os.path.join(BIN, "quan-bench-claims")

ma = None
en = None


def new_shop():
    return random.randint(10**12, 9 * 10**12)


def new_users(n):
    base = random.randint(10**10, 9 * 10**13)
    return [base + i * 7919 for i in range(n)]


def create(shop, stock=10, limit=1, start="2025-01-01 00:00:00", end="2035-01-01 00:00:00"):
    b = {"name": "claims-%x" % random.getrandbits(32), "source": 0, "target": 1, "type": 0,
         "validStartTime": start, "validEndTime": end, "stock": stock,
         "receiveRule": {"limitPerPerson": limit, "usageInstructions": "t"},
         "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}}
    st, _, r = request("POST", ma.url + MA + "create", b,
                       {"X-User-Id": "1", "X-Shop-Number": str(shop)})
    check(st == 200, "create: %s %s" % (st, r))
    return int(r["data"]["id"])


def hdr(user):
    return {"X-User-Id": str(user)}


def redeem(user, shop, tpl, mq=False, request_id=None, svc=None):
    body = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)}
    if request_id:
        body["requestId"] = request_id
    path = "/user-coupon/redeem-mq" if mq else "/user-coupon/redeem"
    st, _, r = request("POST", (svc or en).url + ENGINE + path, body, hdr(user), timeout=30)
    return st, r


def query(user, shop, tpl):
    return request("GET", en.url + ENGINE + "/coupon-template/query?shopNumber=%s&"
                   "couponTemplateId=%s" % (shop, tpl), None, hdr(user))


def result(user, rid, svc=None):
    st, _, r = request("GET", (svc or en).url + ENGINE + "/user-coupon/redeem-result?requestId="
                       + rid, None, hdr(user))
    check(st == 200, "result: %s %s" % (st, r))
    return r["data"]


def redis_stock(tpl):
    v = redis("HGET", "quan:tpl:{%d}" % tpl, "stock")
    return int(v) if v else None


def db_stock(shop, tpl):
    ds, table = template_table(shop)
    return int(sql(ds, "SELECT stock FROM %s WHERE id = %d" % (table, tpl))[0][0])


def wallet(user, tpl):
    members = redis("ZRANGE", "quan:wallet:{%d}" % user, 0, -1).split()
    return sorted(int(m.split("_")[1]) for m in members if m.startswith("%d_" % tpl))


def check_consistent(shop, tpl, users, stock0, limit):
    """Redis stock = DB stock; coupons = stock taken; nobody over the limit; DB = wallets."""
    coupons = db_coupons(users, tpl)
    total = sum(len(v) for v in coupons.values())
    rs, ds_ = redis_stock(tpl), db_stock(shop, tpl)
    check(rs == ds_, "Redis stock %s != DB stock %s" % (rs, ds_))
    check(total == stock0 - ds_, "%d coupons but stock went %d -> %d" % (total, stock0, ds_))
    r = Resp()
    replies = r.pipeline([c for u in users
                          for c in (["ZRANGE", "quan:wallet:{%d}" % u, 0, -1],
                                    ["HGET", "quan:tpl:{%d}:users" % tpl, str(u)])])
    r.close()
    for i, u in enumerate(users):
        cs = coupons[u]
        check(len(cs) <= limit, "user %d holds %d > limit %d" % (u, len(cs), limit))
        check(sorted(c[1] for c in cs) == list(range(1, len(cs) + 1)),
              "receive counts of %d: %s" % (u, cs))
        w = sorted(int(m.split("_")[1]) for m in replies[2 * i] if m.startswith("%d_" % tpl))
        check(w == sorted(c[0] for c in cs if c[2] == 0),
              "wallet of %d %s != DB %s" % (u, w, cs))
        cnt = replies[2 * i + 1]
        check(int(cnt or 0) == len(cs), "counter of %d: %s, coupons %d" % (u, cnt, len(cs)))
    return total


def wait_coupons(users, tpl, want, timeout=40):
    """Until users hold want coupons of tpl in the database; then a moment for the wallet
    writes that follow the commits."""
    wait_for(lambda: sum(len(v) for v in db_coupons(users, tpl).values()) == want, timeout)
    time.sleep(0.5)


def metrics_text(svc=None):
    return request("GET", (svc or en).url + "/metrics")[2].decode()


# ---------------------------------------------------------------- query chain


def test_query_hit_other_shop_and_unknown():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=7, limit=2)
    st, _, r = query(user, shop, tpl)
    check(st == 200, "query: %s %s" % (st, r))
    d = r["data"]
    check(d["id"] == str(tpl) and d["shopNumber"] == str(shop) and d["stock"] == 7, d)
    check(d["receiveRule"]["limitPerPerson"] == 2 and d["status"] == 0, d)
    st, _, r = query(user, shop + 1, tpl)  # another shop's template: 404, never served
    check(st == 404 and r["code"] == "A000404", "other shop: %s %s" % (st, r))
    st, _, r = query(user, shop, tpl + 12345)
    check(st == 404, "unknown: %s %s" % (st, r))
    st, _, r = request("GET", en.url + ENGINE + "/coupon-template/query?shopNumber=x",
                       None, hdr(user))
    check(st == 400 and r["code"] == "A000001", "bad input: %s %s" % (st, r))
    st, _, r = request("POST", en.url + ENGINE + "/coupon-template/query",
                       {"shopNumber": str(shop), "couponTemplateId": str(tpl)}, hdr(user))
    check(st == 200 and r["data"]["id"] == str(tpl), "POST query: %s %s" % (st, r))
    st, _, _ = request("GET", en.url + ENGINE + "/coupon-template/query?shopNumber=%d&"
                       "couponTemplateId=%d" % (shop, tpl))
    check(st == 401, "no identity: %s" % st)


def test_query_thousand_cold_queries_read_the_database_once():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=9)
    redis("DEL", "quan:tpl:{%d}" % tpl)  # cold: only the database has it
    before = metric(metrics_text(), "quan_template_db_loads_total", result="found")
    barrier = threading.Barrier(250)
    codes = []

    def worker():
        barrier.wait()
        for _ in range(4):
            codes.append(query(user, shop, tpl)[0])

    threads = [threading.Thread(target=worker) for _ in range(250)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = metric(metrics_text(), "quan_template_db_loads_total", result="found")
    check(len(codes) == 1000 and all(c == 200 for c in codes),
          "answers: %s" % {c: codes.count(c) for c in set(codes)})
    check(after - before == 1, "database reads: %s" % (after - before))
    check(redis_stock(tpl) == 9, "cache rebuilt with the DB stock")
    ttl = int(redis("PTTL", "quan:tpl:{%d}" % tpl))
    check(ttl > 0, "the cache expires at the template's end: %d" % ttl)


def test_query_absent_template_null_marker():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop)
    ds, table = template_table(shop)
    sql(ds, "DELETE FROM %s WHERE id = %d" % (table, tpl))  # in the bloom filter, not in the DB
    redis("DEL", "quan:tpl:{%d}" % tpl)
    text = metrics_text()
    before = metric(text, "quan_template_db_loads_total", result="absent")
    for _ in range(3):
        st, _, r = query(user, shop, tpl)
        check(st == 404, "absent: %s %s" % (st, r))
    after = metric(metrics_text(), "quan_template_db_loads_total", result="absent")
    check(after - before == 1, "one database read, then the null marker: %s" % (after - before))
    check(redis("GET", "quan:tpl:{%d}:null" % tpl) == str(shop), "null marker holds the shop")
    ttl = int(redis("PTTL", "quan:tpl:{%d}:null" % tpl))
    check(0 < ttl <= 1800000, "null marker TTL %d" % ttl)


def test_query_unreadable_hash_reads_the_database():
    """A cache hash that is there but cannot be read (its rules are not JSON) proves the id
    exists: the database answers, even for an id the bloom filter never saw."""
    shop, user = new_shop(), new_users(1)[0]
    create(shop)  # the bloom filter exists (merchant-admin made it) ...
    tpl = new_id()  # ... and holds nothing of this one, written as an older writer would have
    now = int(time.time() * 1000)
    insert_template(shop, tpl, now - 60000, now + 86400000, stock=6, limit=3, name="unreadable")
    redis("HSET", "quan:tpl:{%d}" % tpl, "id", tpl, "shopNumber", shop, "stock", 6,
          "receiveRule", "{not json", "status", 0)
    st, _, r = query(user, shop, tpl)
    check(st == 200, "query: %s %s" % (st, r))
    d = r["data"]
    check(d["name"] == "unreadable" and d["receiveRule"]["limitPerPerson"] == 3, d)
    check(redis("HGET", "quan:tpl:{%d}" % tpl, "receiveRule") == "{not json",
          "the hash (live stock) is never overwritten from the database")


def copy_lookups(result):
    return metric(metrics_text(), "quan_rcopy_lookups_total", what="template_query", result=result)


def stock_of(user, shop, tpl):
    st, _, r = query(user, shop, tpl)
    check(st == 200, "query: %s %s" % (st, r))
    return r["data"]["stock"]


def test_query_kept_copy_follows_every_change():
    """The engine keeps the hashes it served; a claim, a merchant's change or a lost connection
    shows in the very next answer."""
    with pinned(en):  # what one process keeps
        shop, user = new_shop(), new_users(1)[0]
        tpl = create(shop, stock=5)
        check(stock_of(user, shop, tpl) == 5, "first answer")
        hits = copy_lookups("hit")
        first = query(user, shop, tpl)[2]["data"]
        check(copy_lookups("hit") == hits + 1, "the second answer came from the kept copy")
        check(redeem(user, shop, tpl)[0] == 200, "claim")
        check(stock_of(user, shop, tpl) == 4, "a claim shows at once")
        redis("HSET", "quan:tpl:{%d}" % tpl, "status", 1)
        st, _, r = query(user, shop, tpl)
        check(st == 200 and r["data"]["status"] == 1, "a status change shows at once: %s" % r)
        redis("HSET", "quan:tpl:{%d}" % tpl, "status", 0)
        st, _, r = query(user, shop + 1, tpl)
        check(st == 404, "another shop's kept template is not served: %s %s" % (st, r))
        # While the tracked connection is down, Redis tells nothing: what it kept goes.
        check(stock_of(user, shop, tpl) == 4, "kept again")
        # Every replica's, on every master (one of each; single topology: just the one).
        killed = kill_redis_clients("t")
        check(killed == len(en.ports) * redis_masters_count(),
              "the engine's tracked connections: %d" % killed)
        redis("HSET", "quan:tpl:{%d}" % tpl, "stock", 77)  # unannounced: nobody tracks it now
        check(wait_for(lambda: stock_of(user, shop, tpl) == 77, 5),
              "the lost copy is not served")
        redis("HSET", "quan:tpl:{%d}" % tpl, "stock", 4)
        check(wait_for(lambda: copy_lookups("hit") > hits + 1 and
                       stock_of(user, shop, tpl) == 4, 5), "kept again after the reconnect")
        st, _, r = query(user, shop, tpl)
        d = r["data"]
        check(st == 200 and {k: v for k, v in d.items() if k != "stock"} ==
              {k: v for k, v in first.items() if k != "stock"},
              "same answer: %s vs %s" % (d, first))


# ---------------------------------------------------------------- claims


def test_sync_claim_success_list_and_refusals():
    shop, (u1, u2) = new_shop(), new_users(2)
    tpl = create(shop, stock=2, limit=1)
    st, r = redeem(u1, shop, tpl)
    check(st == 200 and r["data"]["receiveCount"] == 1, "claim: %s %s" % (st, r))
    cid = int(r["data"]["userCouponId"])
    check(db_coupons([u1], tpl)[u1] == [(cid, 1, 0)], "row")
    check(wallet(u1, tpl) == [cid], "wallet")
    check(redis_stock(tpl) == 1 and db_stock(shop, tpl) == 1, "stock 1 left in both")
    st, r = redeem(u1, shop, tpl)
    check(st == 409 and r["code"] == "B000101", "limit: %s %s" % (st, r))
    st, r = redeem(u2, shop, tpl)
    check(st == 200, "second user: %s %s" % (st, r))
    st, r = redeem(new_users(1)[0], shop, tpl)
    check(st == 409 and r["code"] == "B000100", "sold out: %s %s" % (st, r))
    st, r = redeem(u2, shop + 1, tpl)
    check(st == 404 and r["code"] == "A000404", "other shop: %s %s" % (st, r))
    st, r = redeem(u2, shop, tpl + 7)
    check(st == 404, "unknown template: %s %s" % (st, r))
    st, _, r = request("POST", en.url + ENGINE + "/user-coupon/redeem", {"shopNumber": shop},
                       hdr(u2))
    check(st == 400 and "couponTemplateId" in r["message"], "bad input: %s %s" % (st, r))
    st, r = redeem(u2, shop, tpl, request_id="bad id!")
    check(st == 400 and "requestId" in r["message"], "bad request id: %s %s" % (st, r))

    # the list, with template fields, filterable by status
    st, _, r = request("GET", en.url + ENGINE + "/user-coupon/list", None, hdr(u1))
    check(st == 200 and len(r["data"]) == 1, "list: %s %s" % (st, r))
    c = r["data"][0]
    check(c["userCouponId"] == str(cid) and c["couponTemplateId"] == str(tpl)
          and c["status"] == 0 and c["receiveCount"] == 1 and c["shopNumber"] == str(shop)
          and c["name"].startswith("claims-") and c["consumeRule"]["validityPeriod"] == 48, c)
    st, _, r = request("GET", en.url + ENGINE + "/user-coupon/list?status=2", None, hdr(u1))
    check(st == 200 and r["data"] == [], "used: %s" % r)
    st, _, r = request("GET", en.url + ENGINE + "/user-coupon/list?status=9", None, hdr(u1))
    check(st == 400, "bad status: %s" % st)


def gate_lookups(result):
    return metric(metrics_text(), "quan_rcopy_lookups_total", what="claim_gate", result=result)


def test_sold_out_refusals_answered_from_the_kept_copy():
    """Once a template is sold out, claims without a request id are refused from the engine's
    copy of its hash, without a script call; a give-back, a merchant's new stock, a status
    change or a request id's earlier claim is seen at once."""
    with pinned(en):  # what one process keeps
        shop, (u1, u2, u3, u4) = new_shop(), new_users(4)
        tpl = create(shop, stock=1, limit=1)
        st, r = redeem(u1, shop, tpl, request_id="gate-1")
        check(st == 200, "the one coupon: %s %s" % (st, r))
        first = r["data"]
        st, r = redeem(u2, shop, tpl)
        check(st == 409 and r["code"] == "B000100", "sold out, from the script: %s %s" % (st, r))
        # The refusal had the copy read in the background; the next ones come from it.
        hits = gate_lookups("hit")
        check(wait_for(lambda: redeem(u3, shop, tpl)[1]["code"] == "B000100" and
                       gate_lookups("hit") > hits, 5), "refused from the copy")
        hits = gate_lookups("hit")
        for u in new_users(20):
            st, r = redeem(u, shop, tpl)
            check(st == 409 and r["code"] == "B000100", "sold out: %s %s" % (st, r))
        check(gate_lookups("hit") == hits + 20, "all twenty from the copy")
        # A request id that claimed before gets its own answer, not the copy's refusal.
        st, r = redeem(u1, shop, tpl, request_id="gate-1")
        check(st == 200 and r["data"] == first, "the earlier claim's answer: %s %s" % (st, r))
        # The merchant adds stock: the very next claim sees it.
        st, _, r = request("POST", ma.url + MA + "increase-number",
                           {"couponTemplateId": str(tpl), "number": 1},
                           {"X-User-Id": "1", "X-Shop-Number": str(shop)})
        check(st == 200, "increase-number: %s %s" % (st, r))
        st, r = redeem(u4, shop, tpl)
        check(st == 200, "the new coupon: %s %s" % (st, r))
        st, r = redeem(new_users(1)[0], shop, tpl)
        check(st == 409 and r["code"] == "B000100", "sold out again: %s %s" % (st, r))
        # Ended by the merchant: the copy tells that too, once it is read again.
        st, _, r = request("POST", ma.url + MA + "terminate", {"couponTemplateId": str(tpl)},
                           {"X-User-Id": "1", "X-Shop-Number": str(shop)})
        check(st == 200, "terminate: %s %s" % (st, r))

        def ended_from_the_copy():
            hits = gate_lookups("hit")
            st, r = redeem(new_users(1)[0], shop, tpl)
            check(st == 409 and r["code"] == "B000103", "ended: %s %s" % (st, r))
            return gate_lookups("hit") == hits + 1

        # The first refusal after the change comes from the script, which has the copy read again.
        check(wait_for(ended_from_the_copy, 5), "ended, from the copy")
        # Another shop's claim is never answered from the copy.
        st, r = redeem(u2, shop + 1, tpl)
        check(st == 404 and r["code"] == "A000404", "other shop: %s %s" % (st, r))
        check(redis_stock(tpl) == 0 and db_stock(shop, tpl) == 0, "nothing taken twice")


def test_claim_window_and_ended():
    shop, user = new_shop(), new_users(1)[0]
    later = create(shop, start="2034-01-01 00:00:00")
    st, r = redeem(user, shop, later)
    check(st == 409 and r["code"] == "B000102", "not started: %s %s" % (st, r))
    tpl = create(shop)
    st, _, r = request("POST", ma.url + MA + "terminate", {"couponTemplateId": str(tpl)},
                       {"X-User-Id": "1", "X-Shop-Number": str(shop)})
    check(st == 200, "terminate: %s %s" % (st, r))
    for mq in (False, True):
        st, r = redeem(user, shop, tpl, mq=mq)
        check(st == 409 and r["code"] == "B000103", "ended: %s %s" % (st, r))
    check(redis_stock(tpl) == 10, "untouched")


def test_request_id_makes_claims_idempotent():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=10, limit=3)
    a = redeem(user, shop, tpl, request_id="retry-1")
    b = redeem(user, shop, tpl, request_id="retry-1")
    check(a[0] == 200 and b[0] == 200 and a[1]["data"] == b[1]["data"], "sync: %s %s" % (a, b))
    a = redeem(user, shop, tpl, mq=True, request_id="retry-2")
    b = redeem(user, shop, tpl, mq=True, request_id="retry-2")
    check(a[0] == 202 and b[0] == 202 and a[1]["data"] == b[1]["data"] == {"requestId": "retry-2"},
          "mq: %s %s" % (a, b))
    deadline = time.time() + 20
    while result(user, "retry-2")["status"] == "PENDING" and time.time() < deadline:
        time.sleep(0.1)
    res = result(user, "retry-2")
    check(res["status"] == "SUCCESS" and res["userCouponId"], res)
    # another user never sees it, and an id never used is not a claim
    for u, rid in ((new_users(1)[0], "retry-2"), (user, "never-used")):
        st, _, r = request("GET", en.url + ENGINE + "/user-coupon/redeem-result?requestId="
                           + rid, None, hdr(u))
        check(st == 404 and r["code"] == "A000404", "%s %s: %s %s" % (u, rid, st, r))
    check(check_consistent(shop, tpl, [user], 10, 3) == 2, "two claims, not four")


def test_forced_database_failure_gives_the_reservation_back():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=5, limit=2)
    # Another coupon already holds (user, template, receive_count 1): the insert is refused.
    ds, table = user_coupon_table(user)
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, %d, 1, now(), "
            "now() + interval '1 day', 2)" % (table, random.getrandbits(60), user, tpl, shop))
    st, r = redeem(user, shop, tpl)
    check(st == 409 and r["code"] == "B000101", "refused: %s %s" % (st, r))
    check(redis_stock(tpl) == 5, "Redis stock given back: %s" % redis_stock(tpl))
    check(db_stock(shop, tpl) == 5, "DB stock given back: %s" % db_stock(shop, tpl))
    check(int(redis("HGET", "quan:tpl:{%d}:users" % tpl, user) or 0) == 0, "counter back")
    check(not [f for f in redis("HKEYS", "quan:tpl:{%d}:users" % tpl).split("\n")
               if f.startswith("%d:" % user)], "marker gone")
    check(wallet(user, tpl) == [], "no phantom wallet entry")
    # The same through MQ: recorded FAILED with the reason, given back once; with a pending
    # marker, and with an id naming the template (the claim's own marker, gone with the
    # give-back, then the FAILED row tell).
    for rid in ("forced-mq", "forced-mq.%d" % tpl):
        st, r = redeem(user, shop, tpl, mq=True, request_id=rid)
        check(st == 202, "mq accepted: %s %s" % (st, r))
        deadline = time.time() + 20
        while result(user, rid)["status"] == "PENDING" and time.time() < deadline:
            time.sleep(0.1)
        res = result(user, rid)
        check(res["status"] == "FAILED" and "receive count" in res["reason"], res)
        check(redis_stock(tpl) == 5 and db_stock(shop, tpl) == 5, "MQ refusal given back")
        check(int(redis("HGET", "quan:tpl:{%d}:users" % tpl, user) or 0) == 0, "counter back")


def redeem_queue_full(on):
    """Makes quan.engine.redeem a queue that holds one message and rejects publishes beyond it
    (a policy: the broker nacks them; classic and quorum queues alike), or takes the policy
    away; returns once the queue shows it, since a policy reaches its queue some time after
    rabbitmqctl returns."""
    if on:
        rabbitmqctl("set_policy", "--apply-to", "queues", "--priority", "100", "quan-test-full",
                    "^quan\\.engine\\.redeem$", '{"max-length":1,"overflow":"reject-publish"}')
    else:
        rabbitmqctl("clear_policy", "quan-test-full")

    def shown():
        for line in rabbitmqctl("list_queues", "-q", "name", "policy").splitlines():
            f = line.split()
            if f and f[0] == "quan.engine.redeem":
                return (len(f) > 1 and f[1] == "quan-test-full") == on
        return False
    check(wait_for(shown, 30), "quan.engine.redeem %s the policy" % ("shows" if on else "lost"))


def test_refused_publish_gives_back_and_leaves_no_pending_result():
    """The broker refuses a claim's message: nobody consumes, and a policy lets
    quan.engine.redeem hold one message, rejecting publishes beyond it (a nack). The pending
    marker, set while the publish was in flight, goes with the give-back: 503, stock and counter
    back, /redeem-result 404, no marker left. Once the queue takes messages again (and is
    drained) the same request id is accepted and written, and so are the claims that filled it."""
    global en
    shop = new_shop()
    tpl = create(shop, stock=100, limit=1)
    en.stop()
    acc = Service("engine", {"QUAN_CLAIM_CONSUMERS": "0"}).wait_ready()
    redeem_queue_full(True)
    try:
        # A classic queue refuses the second claim, a quorum queue one a little later (it
        # enforces the limit once over it): claims of new users until one is refused.
        filled, user = [], None
        for u in new_users(10):
            st, r = redeem(u, shop, tpl, mq=True, request_id="full-%d" % u, svc=acc)
            if st != 202:
                user = u
                break
            filled.append(u)
        check(user is not None and filled, "a claim refused after one accepted: %s" % filled)
        rid = "full-%d" % user
        check(st == 503 and r["code"] == "C000001", "refused: a retryable 503: %s %s" % (st, r))
        st, _, r = request("GET", acc.url + ENGINE + "/user-coupon/redeem-result?requestId=" +
                           rid, None, hdr(user))
        check(st == 404, "result of the refused claim: %s %s" % (st, r))
        check(redis("EXISTS", "quan:claim:{%d}:%s" % (user, rid)) == "0", "no pending marker")
        check(int(redis("HGET", "quan:tpl:{%d}:users" % tpl, user) or 0) == 0, "counter back")
        check(redis_stock(tpl) == 100 - len(filled), "stock back: %s, %d accepted" % (
            redis_stock(tpl), len(filled)))
    finally:
        redeem_queue_full(False)
        acc.stop()
        en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()
    st, r = redeem(user, shop, tpl, mq=True, request_id=rid)
    check(st == 202, "accepted once the queue takes messages: %s %s" % (st, r))
    for u in filled + [user]:
        check(wait_for(lambda: result(u, "full-%d" % u)["status"] == "SUCCESS", 20),
              result(u, "full-%d" % u))
    n = len(filled) + 1
    check(check_consistent(shop, tpl, filled + [user], 100, 1) == n, "%d coupons" % n)


def test_pending_marker_that_outlived_its_claim_is_removed():
    """A pending marker left behind by a claim that ended without a coupon (its give-back's DEL
    refused while Redis was failing): once it is older than 30 s, the first result query still
    says PENDING, finds the claim's record gone with no outcome, and removes the marker, so the
    next says 404 (not PENDING for the marker's week). A younger one is not looked into (no
    command per poll during a sale); one whose record is open stays PENDING and stays."""
    shop, (user, other, young) = new_shop(), new_users(3)
    tpl = create(shop, stock=5, limit=1)
    now = int(time.time() * 1000)
    old = now - 60000
    left = "quan:claim:{%d}:left" % user
    redis("SET", left, "%d:%d" % (tpl, old), "PX", 600000)

    def ask(u, rid):
        st, _, r = request("GET", en.url + ENGINE + "/user-coupon/redeem-result?requestId=" + rid,
                           None, hdr(u))
        return st, r
    st, r = ask(user, "left")
    check(st == 200 and r["data"]["status"] == "PENDING", "the first answer: %s %s" % (st, r))
    check(wait_for(lambda: redis("EXISTS", left) == "0", 5), "the marker removed")
    st, r = ask(user, "left")
    check(st == 404, "then no claim with this requestId: %s %s" % (st, r))

    def stays_pending(u, rid, at):
        """A marker of u's request rid reserved at `at`: PENDING twice, and it stays."""
        key = "quan:claim:{%d}:%s" % (u, rid)
        redis("SET", key, "%d:%d" % (tpl, at), "PX", 600000)
        try:
            for _ in range(2):
                st, r = ask(u, rid)
                check(st == 200 and r["data"]["status"] == "PENDING", "%s: %s %s" % (rid, st, r))
            check(redis("EXISTS", key) == "1", "the %s marker stays" % rid)
        finally:
            redis("DEL", key)
    # young: left behind too, but not yet looked into
    stays_pending(young, "young", now)
    # open: the record of a claim still on its way (written here as claim.lua writes it)
    record, mine = "quan:tpl:{%d}:resv" % tpl, "%d:open" % other
    redis("ZADD", record, old, mine)
    try:
        stays_pending(other, "open", old)
    finally:
        redis("ZREM", record, mine)


def run_concurrent(mq, limit):
    shop, users, stock = new_shop(), new_users(300), 60
    tpl = create(shop, stock=stock, limit=limit)
    jobs = [(u, i) for u in users for i in range(limit + 1)]
    random.shuffle(jobs)
    with ThreadPoolExecutor(max_workers=64) as pool:
        answers = list(pool.map(lambda j: redeem(j[0], shop, tpl, mq=mq,
                                                 request_id="c%d-%d" % j), jobs))
    ok = [a for a in answers if a[0] == (202 if mq else 200)]
    codes = {a[1]["code"] for a in answers if a[0] == 409}
    check(len(ok) == stock, "%d accepted, stock %d: %s" % (len(ok), stock,
                                                          [a for a in answers if a[0] >= 500][:3]))
    check(codes <= {"B000100", "B000101"}, codes)
    if mq:
        wait_coupons(users, tpl, stock)
    check(check_consistent(shop, tpl, users, stock, limit) == stock, "exactly the stock")


def test_concurrent_sync_limit_1():
    run_concurrent(False, 1)


def test_concurrent_sync_limit_2():
    run_concurrent(False, 2)


def test_concurrent_mq_limit_1():
    run_concurrent(True, 1)


def test_concurrent_mq_limit_2():
    run_concurrent(True, 2)


def test_concurrent_sync_claims_share_transactions():
    """/redeem claims of one template arriving together are written in shared transactions
    (the template's row is locked until each commit): fewer transactions than claims, in both
    steps (and fewer claim.lua calls than claims), and each claim still gets its own answer. One user's receive-count slot is taken by
    a coupon written behind the engine's back, in the template's database: refused alone
    (B000101, its stock given back) while the claims sharing its transaction succeed."""
    shop = new_shop()
    tds, _ = template_table(shop)
    users = new_users(400)
    same = [u for u in users if user_coupon_table(u)[0] == tds]
    other = [u for u in users if user_coupon_table(u)[0] != tds]
    check(same and other, "users in both databases")
    tpl = create(shop, stock=len(users), limit=1)
    taken = same[0]
    ds, table = user_coupon_table(taken)
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, %d, 1, now(), "
            "now() + interval '1 day', 2)" % (table, random.getrandbits(60), taken, tpl, shop))
    before = metrics_text()
    with ThreadPoolExecutor(max_workers=64) as pool:
        answers = dict(zip(users, pool.map(lambda u: redeem(u, shop, tpl), users)))
    after = metrics_text()
    st, r = answers[taken]
    check(st == 409 and r["code"] == "B000101", "the taken slot refused: %s %s" % (st, r))
    bad = [(u, a) for u, a in answers.items() if u != taken and a[0] != 200]
    check(not bad, "%d claims not 200: %s" % (len(bad), bad[:3]))
    rest = [u for u in users if u != taken]
    coupons = db_coupons(rest, tpl)
    wrong = [u for u in rest if [c[0] for c in coupons[u]] !=
             [int(answers[u][1]["data"]["userCouponId"])]]
    check(not wrong, "answers naming another coupon than the database's: %s" % wrong[:3])

    def delta(name, step):
        return metric(after, name, step=step) - metric(before, name, step=step)

    tx, claims = (delta("quan_claim_transactions_total", "stock"),
                  delta("quan_claim_transaction_claims_total", "stock"))
    check(claims == len(users), "stock step: %d claims written, %d sent" % (claims, len(users)))
    check(tx <= len(users) / 4, "stock step: %d transactions for %d claims" % (tx, claims))
    print("      stock step: %d claims in %d transactions" % (claims, tx))
    tx, claims = (delta("quan_claim_transactions_total", "coupon"),
                  delta("quan_claim_transaction_claims_total", "coupon"))
    check(claims == len(other), "coupon step: %d claims, %d users elsewhere" % (claims, len(other)))
    check(tx < claims, "coupon step: %d transactions for %d claims" % (tx, claims))
    print("      coupon step: %d claims in %d transactions" % (claims, tx))
    # and the claims that came in the same loop turn took one claim.lua call
    calls = metric(after, "quan_claim_gate_calls_total") - metric(
        before, "quan_claim_gate_calls_total")
    gated = metric(after, "quan_claim_gate_claims_total") - metric(
        before, "quan_claim_gate_claims_total")
    check(gated >= len(users) and calls < gated, "claim.lua: %d claims in %d calls" % (
        gated, calls))
    print("      claim.lua: %d claims in %d calls" % (gated, calls))
    # The refused claim's stock came back in both stores; the taken coupon is not Quan's own.
    check(check_consistent(shop, tpl, rest, len(users), 1) == len(rest) and
          db_stock(shop, tpl) == 1, "every other claim a coupon, stock 1 left")


def test_claim_message_delivered_twice():
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=5, limit=1)
    st, r = redeem(user, shop, tpl, mq=True, request_id="twice")
    check(st == 202, "accepted: %s %s" % (st, r))
    deadline = time.time() + 20
    while result(user, "twice")["status"] == "PENDING" and time.time() < deadline:
        time.sleep(0.1)
    ds, table = user_coupon_table(user)
    cid, cnt, rt = sql(ds, "SELECT id, receive_count, (extract(epoch from receive_time) * 1000)"
                           "::bigint FROM %s WHERE user_id = %d AND request_id = 'twice'"
                       % (table, user))[0]
    data = json.dumps({"kind": "claim", "userId": str(user), "requestId": "twice",
                       "couponTemplateId": str(tpl), "shopNumber": str(shop), "source": 0,
                       "receiveCount": int(cnt), "userCouponId": cid, "receiveTime": int(rt),
                       "validEndTime": int(rt) + 86400000})
    key = "%d:twice:%d" % (user, int(rt))  # the guard's: one attempt of the claim

    def publish_consumed(copies):
        """Publishes copies of the claim (each confirmed, so in the queue) and waits until the
        queue holds nothing, ready or unacked: every copy has been consumed and acked."""
        subprocess.run([TOOL, "publish", key, data, str(copies)], check=True, timeout=20)
        check(wait_for(lambda: queued_messages() == 0, 30), "copies consumed")

    # Once past the guard (guard key gone, as after its TTL), once into the guard.
    redis("DEL", "quan:guard:{redeem}:" + key)
    publish_consumed(1)
    publish_consumed(1)
    check(db_coupons([user], tpl)[user] == [(int(cid), 1, 0)], "one coupon")
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "stock taken once")
    check(result(user, "twice")["status"] == "SUCCESS", "still SUCCESS")
    # three copies at once, past the guard again: most likely in one batch
    redis("DEL", "quan:guard:{redeem}:" + key)
    publish_consumed(3)
    check(db_coupons([user], tpl)[user] == [(int(cid), 1, 0)], "still one coupon")
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "stock still taken once")


def raw_claim(user, shop, tpl, rid, rt=None):
    """(attempt key, data) of a claim published straight to the queue, as /redeem-mq would
    (its reservation is not in Redis: only the database side is checked)."""
    rt = rt or int(time.time() * 1000)
    data = json.dumps({"kind": "claim", "userId": str(user), "requestId": rid,
                       "couponTemplateId": str(tpl), "shopNumber": str(shop), "source": 0,
                       "receiveCount": 1, "userCouponId": str(new_id()), "receiveTime": rt,
                       "validEndTime": rt + 86400000})
    return "%d:%s:%d" % (user, rid, rt), data


def publish_pack(claims, copies=1):
    """One message holding claims [(key, data)] as a pack, published copies times (each
    confirmed, so in the queue)."""
    subprocess.run([TOOL, "publish-pack", str(copies)] + [x for c in claims for x in c],
                   check=True, timeout=20)


def pack_guard(claims):
    """The consume guard's key of a pack (claimq_pack_key): SHA1 of its claims' attempt keys,
    each with its NUL, in order."""
    return "quan:guard:{redeem}:pack:" + hashlib.sha1(
        b"".join(k.encode() + b"\0" for k, _ in claims)).hexdigest()


def consumed(outcome, svc=None):
    return metric(metrics_text(svc), "quan_mq_consumed_total", queue="engine.redeem",
                  outcome=outcome)


def check_once_each(shop, tpl, users, stock0, timeout=15):
    """Each user holds exactly one coupon of tpl (in its wallet too), and the database stock
    went down by one each."""
    wait_coupons(users, tpl, len(users), timeout)
    coupons = db_coupons(users, tpl)
    check(all(len(coupons[u]) == 1 for u in users), "one coupon each: %r" % coupons)
    check(db_stock(shop, tpl) == stock0 - len(users), "stock %d, %d coupons"
          % (db_stock(shop, tpl), len(users)))
    check(all(wallet(u, tpl) == [coupons[u][0][0]] for u in users), "wallets")
    return coupons


def test_pack_delivered_again_is_skipped_whole():
    shop, users = new_shop(), new_users(3)
    tpl = create(shop, stock=10, limit=1)
    claims = [raw_claim(u, shop, tpl, "pk%d" % u) for u in users]
    guard = pack_guard(claims)
    publish_pack(claims)
    check_once_each(shop, tpl, users, 10)
    check(wait_for(lambda: redis("GET", guard) == "1", 5), "the pack's guard key CONSUMED")
    check(all(redis("EXISTS", "quan:guard:{redeem}:" + k) == "0" for k, _ in claims),
          "no guard key per claim")
    # The same message twice more (as the broker redelivers it): acked, skipped whole.
    skip0 = consumed("skip")
    publish_pack(claims, 2)
    check(wait_for(lambda: queued_messages() == 0, 30), "acked")
    check(wait_for(lambda: consumed("skip") >= skip0 + 2 * len(claims), 5),
          "skipped: %s -> %s" % (skip0, consumed("skip")))
    check_once_each(shop, tpl, users, 10)
    # Its guard key gone (as after its TTL): the database keys write nothing twice.
    redis("DEL", guard)
    publish_pack(claims)
    check(wait_for(lambda: queued_messages() == 0, 30), "acked")
    check(wait_for(lambda: redis("GET", guard) == "1", 5), "CONSUMED again")
    check_once_each(shop, tpl, users, 10)


def test_pack_sharing_a_claim_with_a_consumed_pack_runs():
    shop, (a, b, c) = new_shop(), new_users(3)
    tpl = create(shop, stock=10, limit=1)
    ca, cb, cc = (raw_claim(u, shop, tpl, "sh%d" % u) for u in (a, b, c))
    publish_pack([ca, cb])
    check_once_each(shop, tpl, [a, b], 10)
    check(wait_for(lambda: redis("GET", pack_guard([ca, cb])) == "1", 5), "pack A CONSUMED")
    # Pack B holds A's first claim (as a publish repeated after an unconfirmed one would) and a
    # new one: not skipped for A's sake; the shared claim is not doubled.
    publish_pack([ca, cc])
    check_once_each(shop, tpl, [a, b, c], 10)
    check(wait_for(lambda: redis("GET", pack_guard([ca, cc])) == "1", 5), "pack B CONSUMED")


def test_pack_with_a_later_attempt_comes_back_whole():
    """User u's request "la": its first attempt was given up (its ledger row says so) and
    retried; the retry travels in a pack with another user's claim, queued behind the first
    attempt's message. In one batch the later attempt goes back, and its pack with it, the
    guard key deleted: on its return the retry takes the claim over. Marked CONSUMED instead,
    the pack would be skipped on its return and the retry lost."""
    global en
    shop, (u, x) = new_shop(), new_users(2)
    tpl = create(shop, stock=10, limit=1)
    ds, _ = template_table(shop)
    t1 = int(time.time() * 1000)
    sql(ds, "INSERT INTO t_claim_ledger (user_id, request_id, coupon_template_id, void_resv_ms) "
            "VALUES (%d, 'la', %d, %d)" % (u, tpl, t1))
    first, retry = raw_claim(u, shop, tpl, "la", t1), raw_claim(u, shop, tpl, "la", t1 + 1000)
    other = raw_claim(x, shop, tpl, "lo%d" % x)
    en.stop()  # both queued before one consumer starts: one batch
    try:
        subprocess.run([TOOL, "publish", first[0], first[1], "1"], check=True, timeout=20)
        publish_pack([other, retry])
    finally:
        en = Service("engine", {"QUAN_CLAIM_BATCH": "64", "QUAN_CLAIM_CONSUMERS": "1"}
                     ).wait_ready()
    coupons = check_once_each(shop, tpl, [u, x], 10)
    check(coupons[u][0][0] == int(json.loads(retry[1])["userCouponId"]), "the retry's coupon")
    check(consumed("retry") >= 1, "the pack went back: %s" % consumed("retry"))
    check(wait_for(lambda: queued_messages() == 0, 30), "acked")
    check(redis("GET", pack_guard([other, retry])) == "1", "CONSUMED once written whole")
    check(result(u, "la")["status"] == "SUCCESS", "the retry's result")
    en.stop()
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()


def dead_letters(dlq, key, timeout=10):
    """`quan-dlq list engine.redeem`, one line per dead message, listed again every 0.2 s until
    a line holds key or timeout seconds have passed; the last listing."""
    deadline = time.time() + timeout
    while True:
        lines = subprocess.run([dlq, "list", "engine.redeem", "1000"], capture_output=True,
                               text=True, timeout=20).stdout.splitlines()
        if any(key in x for x in lines) or time.time() >= deadline:
            return lines
        time.sleep(0.2)


def test_malformed_claim_is_dead_lettered_and_replayable():
    dlq = os.path.join(BIN, "quan-dlq")
    key = "malformed-%x" % random.getrandbits(32)
    subprocess.run([TOOL, "publish", key, json.dumps({"kind": "claim", "userId": "1"}), "1"],
                   check=True, timeout=20)
    lines = dead_letters(dlq, key)
    mine = [x for x in lines if key in x]
    check(len(mine) == 1 and "reason=malformed" in mine[0], "dead-lettered once: %r" % lines)
    # The engine sends the replayed claim straight back (still malformed): replay moves the
    # messages dead when it starts, exactly those, and returns instead of chasing them.
    r = subprocess.run([dlq, "replay", "engine.redeem"], capture_output=True, text=True,
                       timeout=20)
    check(r.returncode == 0 and r.stdout.strip() == "%d replayed" % len(lines),
          "replay of %d: %r %r" % (len(lines), r.stdout, r.stderr))
    lines = dead_letters(dlq, key)
    check(len([x for x in lines if key in x]) == 1, "dead again, once: %r" % lines)
    r = subprocess.run([dlq, "list"], capture_output=True, text=True, timeout=20)
    check(r.returncode == 2 and "usage" in r.stderr, "usage: %r" % r.stderr)


def test_consumer_killed_mid_batch_and_restarted():
    global en
    shop, users = new_shop(), new_users(150)
    tpl = create(shop, stock=200, limit=1)
    ds, table = template_table(shop)
    # Hold the template row: the consumer's batch blocks on its stock UPDATE, mid-batch.
    locker = subprocess.Popen(["psql", os.environ["QUAN_DS%d_DSN" % ds], "-qAtX", "-c",
                               "BEGIN; SELECT 1 FROM %s WHERE id = %d FOR UPDATE; "
                               "SELECT pg_sleep(8); COMMIT;" % (table, tpl)],
                              stdout=subprocess.DEVNULL)
    deadline = time.time() + 5
    while time.time() < deadline and not sql(ds, "SELECT 1 FROM pg_locks l JOIN pg_class c ON "
                                                 "c.oid = l.relation WHERE c.relname = '%s' AND "
                                                 "l.mode = 'RowShareLock'" % table):
        time.sleep(0.05)
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda u: redeem(u, shop, tpl, mq=True, request_id="k%d" % u),
                                users))
    check(all(a[0] == 202 for a in answers), [a for a in answers if a[0] != 202][:3])
    time.sleep(0.5)
    en.proc.kill()  # kill -9 while the batch waits for the row
    en.proc.wait()
    locker.wait(timeout=30)
    check(sum(len(v) for v in db_coupons(users, tpl).values()) == 0, "nothing committed yet")
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()
    wait_coupons(users, tpl, len(users))
    check(check_consistent(shop, tpl, users, 200, 1) == len(users), "all 150, once each")
    check(all(result(u, "k%d" % u)["status"] == "SUCCESS" for u in users[:10]), "results")


def queued_messages():
    """Messages in quan.engine.redeem, ready and unacked (delivered, not yet acked) alike."""
    counts = queue_messages()
    check("quan.engine.redeem" in counts, "no quan.engine.redeem queue: %r" % counts)
    return counts["quan.engine.redeem"]


def test_accepting_replica_packs_claims_and_another_drains_them():
    global en
    en.stop()  # nobody consumes while the accepting replica runs
    acc = Service("engine", {"QUAN_CLAIM_CONSUMERS": "0"}).wait_ready()
    try:
        shop, users = new_shop(), new_users(400)
        tpl = create(shop, stock=1000, limit=1)
        # Ids: the client's own ("p<user>"), none (the engine makes one naming the template),
        # the client's own naming this template, and naming another one.
        other = tpl + 1 if random.random() < 0.5 else tpl - 1
        kinds = ["p%d", None, "s%%d.%d" % tpl, "o%%d.%d" % other]

        def claim(i):
            u, kind = users[i], kinds[i % 4]
            return redeem(u, shop, tpl, mq=True, request_id=kind and kind % u, svc=acc)
        with ThreadPoolExecutor(max_workers=64) as pool:
            answers = list(pool.map(claim, range(len(users))))
        check(all(a[0] == 202 for a in answers), [a for a in answers if a[0] != 202][:3])
        rids = [a[1]["data"]["requestId"] for a in answers]
        made = re.compile(r"^g[0-9]+\.%d$" % tpl)
        check(all(made.match(rids[i]) for i in range(1, len(users), 4)),
              "the engine's ids name the template: %s" % rids[1:8:4])
        time.sleep(1)
        check(sum(len(v) for v in db_coupons(users, tpl).values()) == 0, "nothing written")
        for i in range(8):
            u = users[i]
            check(result(u, rids[i], svc=acc)["status"] == "PENDING", "pending: %s" % rids[i])
            marked = redis("EXISTS", "quan:claim:{%d}:%s" % (u, rids[i])) == "1"
            check(marked == (i % 4 in (0, 3)), "a pending marker only for an id not naming "
                  "the template: %s %s" % (rids[i], marked))
            st, _, r = request("GET", acc.url + ENGINE + "/user-coupon/redeem-result?requestId="
                               + rids[i], None, hdr(new_users(1)[0]))
            check(st == 404, "another user never sees it: %s %s" % (st, r))
        # A quorum queue's count reaches list_queues a few seconds late (its metrics are
        # published periodically; a classic queue's at once): wait for it to show.
        deadline = time.time() + 15
        msgs = queued_messages()
        while msgs == 0 and time.time() < deadline:
            time.sleep(0.5)
            msgs = queued_messages()
        print("  %d claims queued in %d messages" % (len(users), msgs))
        check(0 < msgs < len(users), "concurrent claims travel in packs: %d messages" % msgs)
    finally:
        acc.stop()
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()
    wait_coupons(users, tpl, len(users))
    check(check_consistent(shop, tpl, users, 1000, 1) == len(users), "all drained, once each")
    check(all(result(users[i], rids[i])["status"] == "SUCCESS" for i in range(20)), "results")
    check(wait_for(lambda: queued_messages() == 0, 15), "queue empty")  # (a quorum count lags)
    check(all(redis("EXISTS", "quan:claim:{%d}:%s" % (users[i], rids[i])) == "0"
              for i in range(20)), "no longer marked pending")


def test_sync_claim_interrupted_between_the_two_commits():
    """Template and coupon in different databases; the coupon's table is locked so the claim
    waits in its second transaction; kill -9. The check event committed with the stock then
    completes user a's claim (reservation held) and gives user b's stock back (its reservation
    returned in Redis first, as a request that failed would have)."""
    global en
    shop = new_shop()
    tds, _ = template_table(shop)
    users, table = [], None
    while len(users) < 2:  # two users of one coupon table in the other database
        u = random.randint(10**10, 9 * 10**13)
        ds, t = user_coupon_table(u)
        if ds != tds and table in (None, t):
            table = t
            users.append(u)
    a, b = users
    tpl = create(shop, stock=10, limit=1)
    en.stop()
    en = Service("engine", {"QUAN_CLAIM_WALLET_CHECK_MS": "3000"}).wait_ready()
    locker = subprocess.Popen(["psql", os.environ["QUAN_DS%d_DSN" % (1 - tds)], "-qAtX", "-c",
                               "BEGIN; LOCK TABLE %s IN EXCLUSIVE MODE; SELECT pg_sleep(6); "
                               "COMMIT;" % table], stdout=subprocess.DEVNULL)
    deadline = time.time() + 5
    while time.time() < deadline and not sql(1 - tds, "SELECT 1 FROM pg_locks l JOIN pg_class c "
                                                      "ON c.oid = l.relation WHERE c.relname = "
                                                      "'%s' AND l.mode = 'ExclusiveLock'" % table):
        time.sleep(0.05)
    def claim(u):
        try:
            redeem(u, shop, tpl, request_id="x%d" % u)
        except OSError:
            pass  # the engine is killed under it

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    for t in threads:
        t.start()
    deadline = time.time() + 5
    while time.time() < deadline and len(sql(tds, "SELECT 1 FROM t_claim_ledger WHERE "
                                                  "coupon_template_id = %d" % tpl)) < 2:
        time.sleep(0.05)
    en.proc.kill()  # between the stock's commit and the coupon's
    en.proc.wait()
    locker.wait(timeout=30)
    for t in threads:
        t.join(timeout=30)
    check(db_stock(shop, tpl) == 8 and redis_stock(tpl) == 8, "both stocks taken")
    check(sum(len(v) for v in db_coupons(users, tpl).values()) == 0, "no coupon yet")
    # b's request "failed" and gave its reservation back (claim_undo.lua): marker gone.
    redis("HINCRBY", "quan:tpl:{%d}" % tpl, "stock", 1)
    redis("HINCRBY", "quan:tpl:{%d}:users" % tpl, b, -1)
    redis("HDEL", "quan:tpl:{%d}:users" % tpl, "%d:x%d" % (b, b))
    en = Service("engine", {"QUAN_CLAIM_WALLET_CHECK_MS": "3000"}).wait_ready()
    deadline = time.time() + 30
    while time.time() < deadline:
        if (len(db_coupons([a], tpl)[a]) == 1 and
                not sql(tds, "SELECT 1 FROM t_claim_ledger WHERE user_id = %d" % b)):
            break
        time.sleep(0.3)
    time.sleep(0.5)
    check(check_consistent(shop, tpl, users, 10, 1) == 1, "a's claim completed, b's undone")
    check(db_coupons([b], tpl)[b] == [] and db_stock(shop, tpl) == 9, "b's stock given back")
    cid = db_coupons([a], tpl)[a][0][0]
    check(wallet(a, tpl) == [cid], "a's wallet")
    st, r = redeem(a, shop, tpl, request_id="x%d" % a)
    check(st == 200 and int(r["data"]["userCouponId"]) == cid, "a's retry: %s %s" % (st, r))
    en.stop()
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()


def main():
    global ma, en
    ma = Service("merchant-admin").wait_ready()
    en = Service("engine", {"QUAN_CLAIM_BATCH": "64"}).wait_ready()
    try:
        statistics_baseline()
        run([test_query_hit_other_shop_and_unknown,
             test_query_thousand_cold_queries_read_the_database_once,
             test_query_absent_template_null_marker,
             test_query_unreadable_hash_reads_the_database,
             test_query_kept_copy_follows_every_change,
             test_sync_claim_success_list_and_refusals,
             test_claim_window_and_ended,
             test_sold_out_refusals_answered_from_the_kept_copy,
             test_request_id_makes_claims_idempotent,
             test_forced_database_failure_gives_the_reservation_back,
             test_refused_publish_gives_back_and_leaves_no_pending_result,
             test_pending_marker_that_outlived_its_claim_is_removed,
             test_concurrent_sync_limit_1,
             test_concurrent_sync_limit_2,
             test_concurrent_mq_limit_1,
             test_concurrent_mq_limit_2,
             test_claim_message_delivered_twice,
             test_pack_delivered_again_is_skipped_whole,
             test_pack_sharing_a_claim_with_a_consumed_pack_runs,
             test_pack_with_a_later_attempt_comes_back_whole,
             test_malformed_claim_is_dead_lettered_and_replayable,
             test_consumer_killed_mid_batch_and_restarted,
             test_accepting_replica_packs_claims_and_another_drains_them,
             # Its 400 checks come due 30 s later: after the suites that count queued messages.
             test_concurrent_sync_claims_share_transactions,
             test_sync_claim_interrupted_between_the_two_commits, test_statistics_equal_the_rows])
    finally:
        en.stop()
        ma.stop()


if __name__ == "__main__":
    main()
