"""Redis loses its state (engine regen.c, reconcile.c, tools/reconcile): the test's Redis is
restarted empty while 30 accepted MQ claims wait in the queue with nobody consuming them. Until
the claim state is rebuilt every claim answers 503 and /readyz is 503; the rebuild waits for the
queue to drain (a consumer started later writes the 30), then takes the stock and the counters
from the databases, so the next wave is accepted exactly as far as stock remains: 20 of 30, each
of which then succeeds, never an acceptance that fails. The wallet list is right throughout
(it reads the database). quan-reconcile finds a corrupted stock and counters, changes nothing
with --dry-run, repairs them without, and finds nothing afterwards."""

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import test_engine_claims as tec
from engine_db import redis
from quan import BIN, ROOT, Service, check, request, run, wait_for
from test_engine_claims import (ENGINE, MA, check_consistent, create, db_stock, hdr, new_shop,
                                new_users, redeem, redis_stock, result)
import tplbuckets

QUICK = {"QUAN_REGEN_SETTLE_MS": "1500"}  # no synchronous claim here outlives 1.5 s
RECONCILE = os.path.join(BIN, "quan-reconcile")


def ready(svc):
    try:
        return request("GET", svc.url + "/readyz", timeout=2)[0] == 200
    except OSError:
        return False


def regen_events(*svcs):
    """(time, message, step) of every rebuild line the engines logged, in time order."""
    out = []
    for svc in svcs:
        with open(svc.log_path, errors="replace") as f:
            for line in f:
                if '"regen: ' not in line:
                    continue
                e = json.loads(line)
                out.append((e["ts"], e["msg"], e.get("step", "")))
    return sorted(out)


def restart_redis_empty(tpl):
    """The test servers keep nothing on disk: stopped without saving, started empty (the
    services write their own keys at once; tpl's stock is gone). On the cluster topology every
    node at once: each keeps its cluster configuration (nodes.conf), so the cluster comes back
    as it was, with no data."""
    ports = (os.environ.get("QUAN_INFRA_REDIS_NODE_PORTS", "").split() or
             [os.environ["QUAN_REDIS_PORT"]])
    for port in ports:
        subprocess.run(["redis-cli", "-p", port, "SHUTDOWN", "NOSAVE"], capture_output=True,
                       timeout=10)
    out = subprocess.run([os.path.join(ROOT, "deploy/local/infra.sh"), "start",
                          os.environ["QUAN_INFRA_DIR"]], capture_output=True, text=True,
                         timeout=120)
    check(out.returncode == 0, "redis restarted: %s" % out.stdout[-500:])
    check(redis_stock(tpl) is None, "the stock is gone with the rest")


def test_redis_restarted_empty_claims_wait_for_the_rebuild():
    tec.en.stop()
    acc = Service("engine", dict(QUICK, QUAN_CLAIM_CONSUMERS="0")).wait_ready(60)
    consumer = None
    try:
        shop = new_shop()
        first, second = new_users(30), new_users(30)
        tpl = create(shop, stock=50, limit=1)
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda u: redeem(u, shop, tpl, mq=True, request_id="a%d" % u,
                                                     svc=acc), first))
        check(all(st == 202 for st, _ in answers), "30 accepted: %s" % answers[:2])
        check(redis_stock(tpl) == 20 and db_stock(shop, tpl) == 50, "queued, not written")

        restart_redis_empty(tpl)
        statuses = []
        deadline = time.time() + 4
        while time.time() < deadline:
            statuses.append(redeem(second[0], shop, tpl, mq=True, request_id="early", svc=acc)[0])
            time.sleep(0.2)
        check(set(statuses) == {503}, "claims wait for the rebuild: %s" % sorted(set(statuses)))
        check(not ready(acc), "/readyz 503 meanwhile")
        st, _, r = request("GET", acc.url + ENGINE + "/user-coupon/list", None, hdr(first[0]))
        check(st == 200, "the wallet list answers: %s" % st)

        consumer = Service("engine", dict(QUICK, QUAN_CLAIM_BATCH="64")).wait_ready(120)
        check(wait_for(lambda: ready(acc), 60), "the accepting replica is ready again")
        check(all(result(u, "a%d" % u, svc=consumer)["status"] == "SUCCESS" for u in first),
              "the 30 queued claims succeeded")
        check(redis_stock(tpl) == 20 and db_stock(shop, tpl) == 20,
              "rebuilt: Redis %s, DB %s" % (redis_stock(tpl), db_stock(shop, tpl)))
        check(all(int(redis("HGET", "quan:tpl:{%d}:users" % tpl, u) or 0) == 1
                  for u in first[:10]), "counters rebuilt")
        st, _, r = request("GET", acc.url + ENGINE + "/user-coupon/list", None, hdr(first[0]))
        check(st == 200 and len(r["data"]) == 1, "wallet right after the loss: %s" % r)

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda u: redeem(u, shop, tpl, mq=True, request_id="b%d" % u,
                                                     svc=acc), second))
        accepted = [u for u, (st, _) in zip(second, answers) if st == 202]
        check(len(accepted) == 20, "accepted exactly the stock left: %d" % len(accepted))
        # The others: sold out, or told to retry while accepted claims are still queued (their
        # stock is not settled until they are written).
        check(all(st in (202, 409, 429) for st, _ in answers),
              [a for a in answers if a[0] not in (202, 409, 429)][:2])
        check(wait_for(lambda: all(result(u, "b%d" % u, svc=consumer)["status"] == "SUCCESS"
                                   for u in accepted), 30), "every acceptance succeeded")
        late = [redeem(u, shop, tpl, mq=True, request_id="c%d" % u, svc=acc)
                for u in second if u not in accepted]
        check(all(st == 409 and r["code"] == "B000100" for st, r in late),
              "then sold out for good: %s" % late[:2])
        st, r = redeem(first[0], shop, tpl, svc=acc)
        check(st == 409 and r["code"] in ("B000100", "B000101"), "no second coupon: %s" % r)
        check(check_consistent(shop, tpl, first + second, 50, 1) == 50, "50 coupons, stock 0")
        # The consumer looked for a rebuild to do every second while the other one ran: one
        # rebuild finished, none started after it (nobody closes the templates again), and none
        # ran beside another one (the lock held throughout). An attempt that failed on the way
        # (a timeout on this loaded machine) is tried again, and says at which step.
        events = regen_events(acc, consumer)
        done = [ts for ts, msg, _ in events if msg.startswith("regen: Redis claim state rebuilt")]
        started = [ts for ts, msg, _ in events if msg.startswith("regen: rebuilding")]
        lost = [step for _, _, step in events if "lock was lost" in step]
        why = "\n".join("%s %s %s" % e for e in events)
        check(len(done) == 1 and started and max(started) < done[0] and not lost,
              "one rebuild finished, none after it, the lock held: %s" % why)
    finally:
        acc.stop()
        if consumer:
            consumer.stop()
        tec.en = Service("engine").wait_ready(120)


def reconcile(*args):
    out = subprocess.run([RECONCILE] + list(args), capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout + out.stderr


def test_reconcile_tool_compares_and_repairs():
    shop, users = new_shop(), new_users(3)
    tpl = create(shop, stock=10, limit=2)
    for u in users[:2]:
        check(redeem(u, shop, tpl)[0] == 200, "claimed")
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=8 db_stock=8" in out and "counters_wrong=0" in out,
          "consistent: %s %s" % (rc, out))
    redis("HSET", "quan:tpl:{%d}" % tpl, "stock", 999)
    redis("HSET", "quan:tpl:{%d}:users" % tpl, users[0], 5)    # holds 1
    redis("HSET", "quan:tpl:{%d}:users" % tpl, users[2], 2)    # holds none
    redis("HDEL", "quan:tpl:{%d}:users" % tpl, users[1])       # holds 1
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 1 and "redis_stock=999 db_stock=8" in out and "counters_wrong=3" in out,
          "differences found: %s %s" % (rc, out))
    check(redis_stock(tpl) == 999, "dry run writes nothing")
    rc, out = reconcile("--template", str(tpl))
    check(rc == 0 and "repaired" in out, "repaired: %s %s" % (rc, out))
    check(redis_stock(tpl) == 8, "stock repaired: %s" % redis_stock(tpl))
    check([int(redis("HGET", "quan:tpl:{%d}:users" % tpl, u) or 0) for u in users] == [1, 1, 0],
          "counters repaired")
    # Every claimable template (other suites' too, some left inconsistent on purpose): repaired,
    # then nothing differs.
    rc, out = reconcile("--all")
    check(rc == 0, "all repaired: %s %s" % (rc, out[-300:]))
    rc, out = reconcile("--dry-run", "--all")
    check(rc == 0 and " 0 differ" in out, "nothing differs anywhere: %s" % out[-300:])
    check(redeem(users[2], shop, tpl)[0] == 200, "claims work after the repair")
    check(check_consistent(shop, tpl, users, 10, 2) == 3, "consistent")
    rc, out = reconcile("--template", "99")
    check(rc == 1 and "no template" in out, "unknown template: %s %s" % (rc, out))
    rc, out = reconcile("--all", "--template", "5")
    check(rc == 2, "usage error: %s" % rc)


def create_buckets(shop, stock, n):
    b = {"name": "buckets-%d" % time.time_ns(), "source": 0, "target": 1, "type": 0,
         "validStartTime": "2025-01-01 00:00:00", "validEndTime": "2035-01-01 00:00:00",
         "stock": stock, "receiveRule": {"limitPerPerson": 2, "usageInstructions": "t"},
         "consumeRule": {"maximumDiscountAmount": 5, "validityPeriod": 48}, "stockBuckets": n}
    st, _, r = request("POST", tec.ma.url + MA + "create", b,
                       {"X-User-Id": "1", "X-Shop-Number": str(shop)})
    check(st == 200, "create: %s %s" % (st, r))
    return int(r["data"]["id"])


def bucket(tpl, b, n=3):
    out = redis("HGETALL", tplbuckets.keys(tpl, b, n)[0])
    lines = out.split("\n") if out else []
    return dict(zip(lines[0::2], lines[1::2]))


def shown_stock(shop, tpl):
    """The stock the engine's template query shows."""
    st, _, r = request("GET", tec.en.url + ENGINE + "/coupon-template/query?shopNumber=%d&"
                       "couponTemplateId=%d" % (shop, tpl), None, hdr(1))
    check(st == 200, "query: %s %s" % (st, r))
    return r["data"]["stock"]


def user_at_home(users, home, n=3):
    return next(u for u in users if tplbuckets.home(u, n) == home)


def test_reconcile_and_rebuild_three_buckets():
    """A template of three stock buckets, its claims simulated in Redis (a transfer on its way,
    a counter, a reservation): quan-reconcile sums the buckets and the units on their way,
    finds every bucket's differences, repairs them all; the rebuild after Redis lost everything
    writes all three from the databases."""
    shop = new_shop()
    users = new_users(40)
    tpl = create_buckets(shop, 30, 3)
    keys = [tplbuckets.keys(tpl, b, 3) for b in range(3)]
    check([int(bucket(tpl, b).get("stock", -1)) for b in range(3)] == [10, 10, 10],
          "three shares: %s" % [bucket(tpl, b) for b in range(3)])
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=30 db_stock=30" in out, "consistent: %s %s" % (rc, out))
    # a transfer of 4 from bucket 1 to bucket 0, given, not taken yet: on its way
    old = int(time.time() * 1000) - 60000
    redis("HINCRBY", keys[1][0], "stock", -4)
    redis("HINCRBY", keys[1][0], "xo", 1)
    redis("HSET", keys[1][0], "xo:t1", "4:0:%d" % old)
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=30 " in out, "counted on its way: %s %s" % (rc, out))
    check(shown_stock(shop, tpl) == 30, "shown with the units on their way")
    # ... taken at home, not settled: counted once
    redis("HINCRBY", keys[0][0], "stock", 4)
    redis("HSET", keys[0][0], "xi:t1", old)
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=30 " in out, "taken, counted once: %s %s" % (rc, out))
    check(shown_stock(shop, tpl) == 30, "shown once")
    # a second transfer on its way, a wrong bucket, a stray counter at a home bucket, and a
    # queued claim's reservation at its user's home (in flight: neither in the database)
    redis("HINCRBY", keys[2][0], "stock", -3)
    redis("HINCRBY", keys[2][0], "xo", 1)
    redis("HSET", keys[2][0], "xo:t2", "3:1:%d" % old)
    redis("HSET", keys[2][0], "stock", 99)
    wrong = user_at_home(users, 2)
    redis("HSET", keys[2][1], wrong, 2)
    queued = user_at_home(users, 1)
    redis("ZADD", keys[1][2], 1000000000000000 + old, "%d:q1" % queued)
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    # 14 + 6 + 99 + 3 on their way; the database: 30 less the claim in flight
    check(rc == 1 and "redis_stock=122 db_stock=30" in out and "inflight=1" in out
          and "counters_wrong=2" in out, "differences found: %s %s" % (rc, out))
    check(shown_stock(shop, tpl) == 122, "shown: the sum over the buckets")
    rc, out = reconcile("--template", str(tpl))
    check(rc == 0 and "repaired" in out, "repaired: %s %s" % (rc, out))
    hs = [bucket(tpl, b) for b in range(3)]
    check([int(h["stock"]) for h in hs] == [10, 10, 9], "every bucket its share of 29: %s" % hs)
    check(all(h["buckets"] == "3" and h["status"] == "0" and "rebuilding" not in h for h in hs),
          "every bucket whole and open: %s" % hs)
    check(hs[2]["xo"] == "0" and "xo:t2" not in hs[2] and hs[1].get("xi:t2"),
          "the transfer on its way ended, taken at its home: %s %s" % (hs[2], hs[1]))
    check(redis("HGET", keys[2][1], wrong) == "", "stray counter removed")
    check(int(redis("HGET", keys[1][1], queued)) == 1, "the claim in flight counted at home")
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=29 db_stock=30" in out, "nothing differs: %s %s" % (rc, out))

    # Redis loses everything: the rebuild writes all three buckets from the databases (the
    # reservation that never reached them is given up: the whole stock is back)
    tec.en.stop()
    tec.en = Service("engine", QUICK).wait_ready(60)
    restart_redis_empty(tpl)
    check(wait_for(lambda: ready(tec.en), 90), "rebuilt and ready")
    hs = [bucket(tpl, b) for b in range(3)]
    check(all(h.get("buckets") == "3" and "rebuilding" not in h for h in hs),
          "every bucket rebuilt: %s" % hs)
    check(sum(int(h["stock"]) for h in hs) == db_stock(shop, tpl) == 30,
          "shares sum to the database's stock: %s" % [h.get("stock") for h in hs])
    check([int(h["stock"]) for h in hs] == [10, 10, 10], "shares: %s" % hs)
    rc, out = reconcile("--dry-run", "--template", str(tpl))
    check(rc == 0 and "redis_stock=30 db_stock=30" in out, "consistent: %s %s" % (rc, out))


def main():
    tec.ma = Service("merchant-admin").wait_ready()
    tec.en = Service("engine").wait_ready(120)
    try:
        run([test_reconcile_tool_compares_and_repairs,
             test_reconcile_and_rebuild_three_buckets,
             test_redis_restarted_empty_claims_wait_for_the_rebuild])
    finally:
        tec.en.stop()
        tec.ma.stop()


if __name__ == "__main__":
    main()
