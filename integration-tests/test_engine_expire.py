"""User-coupon expiry (engine expire.c): coupons past their valid_end_time become EXPIRED in the
database and leave the wallet within the sweep interval, whoever wrote them; others are left
alone; a second sweep changes nothing; the coupon's history shows the expiry once, by the
sweeper. A replica can leave the sweep and the expiry queue to the others."""

import os
import random
import subprocess
import time

from engine_db import (new_id, queue_messages, rabbitmqctl, redis, redis_pipe, sql,
                       user_coupon_table)
from quan import BIN, Service, check, request, run, wait_for
from stats_truth import statistics_baseline, test_statistics_equal_the_rows

INTERVAL_MS = 300
SWEEPER = None


def sweeper():
    """One engine sweeping every INTERVAL_MS, shared by the tests that need it."""
    global SWEEPER
    if SWEEPER is None:
        SWEEPER = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": str(INTERVAL_MS)}).wait_ready()
    return SWEEPER


def insert_coupons(rows):
    """rows: (user, tpl, end_offset_s, status, receive_count); one psql per database and one
    redis-cli in all. Returns the new ids in order."""
    stmts, zadds, ids = {0: [], 1: []}, [], []
    for user, tpl, end_offset_s, status, receive_count in rows:
        ds, table = user_coupon_table(user)
        cid = new_id()
        ids.append(cid)
        stmts[ds].append(
            "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, 1, %d, "
            "now() - interval '2 days', now() + make_interval(secs => %f), %d)"
            % (table, cid, user, tpl, receive_count, end_offset_s, status))
        zadds.append(["ZADD", "quan:wallet:{%d}" % user, int(time.time() * 1000),
                      "%d_%d" % (tpl, cid)])
    for ds in (0, 1):
        if stmts[ds]:
            sql(ds, ";\n".join(stmts[ds]))
    redis_pipe(zadds)
    return ids


def insert_coupon(user, tpl, end_offset_s, status=0, receive_count=1):
    ds, table = user_coupon_table(user)
    cid = new_id()
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, 1, %d, "
            "now() - interval '2 days', now() + make_interval(secs => %f), %d)"
        % (table, cid, user, tpl, receive_count, end_offset_s, status))
    redis("ZADD", "quan:wallet:{%d}" % user, int(time.time() * 1000), "%d_%d" % (tpl, cid))
    return cid


def status_of(user, cid):
    ds, table = user_coupon_table(user)
    return int(sql(ds, "SELECT status FROM %s WHERE id = %d" % (table, cid))[0][0])


def statuses(pairs):
    """{coupon id: status} for (user, coupon id) pairs, one query per table."""
    by_table = {}
    for u, cid in pairs:
        by_table.setdefault(user_coupon_table(u), []).append(cid)
    out = {}
    for (ds, table), ids in by_table.items():
        for cid, st in sql(ds, "SELECT id, status FROM %s WHERE id IN (%s)"
                           % (table, ",".join(map(str, ids)))):
            out[int(cid)] = int(st)
    return out


def wallet(user):
    return set(redis("ZRANGE", "quan:wallet:{%d}" % user, 0, -1).split())


def test_expired_coupons_leave_db_and_wallet():
    # users spread over both databases and several tables
    users = [random.randrange(1 << 40, 1 << 50) for _ in range(12)]
    tpl = new_id()
    past, future, used = {}, {}, {}
    rows = []
    for u in users:
        rows += [(u, tpl, -60, 0, 1), (u, tpl, 3600, 0, 2), (u, tpl, -60, 2, 3)]
    ids = insert_coupons(rows)
    for i, u in enumerate(users):
        past[u], future[u], used[u] = ids[3 * i:3 * i + 3]
    check(len({user_coupon_table(u)[0] for u in users}) == 2, "test users in one database only")
    svc = sweeper()
    pairs = [(u, past[u]) for u in users]
    ok = wait_for(lambda: set(statuses(pairs).values()) == {3}, 10)
    check(ok, "not all past coupons expired: %s" % statuses(pairs))
    st = statuses([(u, future[u]) for u in users] + [(u, used[u]) for u in users])
    for u in users:
        w = wallet(u)
        check("%d_%d" % (tpl, past[u]) not in w, "expired coupon still in wallet %d" % u)
        check("%d_%d" % (tpl, future[u]) in w, "valid coupon left the wallet %d" % u)
        check(st[future[u]] == 0, "valid coupon changed")
        check(st[used[u]] == 2, "used coupon changed")
    _, _, text = request("GET", svc.url + "/metrics")
    check(b"quan_coupons_expired_total" in text, "metric missing")


def test_coupon_expiring_while_running_and_idempotent():
    sweeper()
    u = random.randrange(1 << 40, 1 << 50)
    tpl = new_id()
    t0 = time.time()
    cid = insert_coupon(u, tpl, 4)  # ends 4 s from now
    t1 = time.time()
    check(status_of(u, cid) == 0 and "%d_%d" % (tpl, cid) in wallet(u),
          "expired before its end")
    check(wait_for(lambda: status_of(u, cid) == 3, 15), "not expired after its end")
    check(time.time() >= t0 + 4 - 0.3, "expired before its end")
    check(time.time() - (t1 + 4) < 5, "expiry too slow")
    check("%d_%d" % (tpl, cid) not in wallet(u), "still in the wallet")
    # Later sweeps leave an expired row alone (status 3 is never selected again).
    ds, table = user_coupon_table(u)
    before = sql(ds, "SELECT update_time FROM %s WHERE id = %d" % (table, cid))
    time.sleep(3 * INTERVAL_MS / 1000.0)
    after = sql(ds, "SELECT update_time FROM %s WHERE id = %d" % (table, cid))
    check(before == after, "expired row updated again")
    # Its history: issued, then expired once, by the sweeper, for no order.
    st, _, r = request("GET", SWEEPER.url + "/api/engine/user-coupon/history?couponId=%d" % cid,
                       None, {"X-User-Id": str(u)})
    check(st == 200, "history: %s %s" % (st, r))
    ev = r["data"]["events"]
    check(r["data"]["status"] == "expired" and [e["event"] for e in ev] == ["issued", "expired"],
          "history %s" % r["data"])
    check({k: ev[1][k] for k in ("from", "to", "ref", "actor", "discountAmount")}
          == {"from": "unused", "to": "expired", "ref": None, "actor": "expiry",
              "discountAmount": 0}, "expiry event %s" % ev[1])


def test_coupon_expire_event_expires_one_coupon():
    """The engine.coupon-expire consumer (compatibility with producers of coupon.expire): with
    the sweeper practically off, an event expires its due coupon; one not due yet is left."""
    svc = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": "3600000"}).wait_ready()
    try:
        u = random.randrange(1 << 40, 1 << 50)
        tpl = new_id()
        due, early = insert_coupons([(u, tpl, -5, 0, 1), (u, tpl, 3600, 0, 2)])
        for cid in (due, early):
            expire_event(u, cid, tpl)
        check(wait_for(lambda: status_of(u, due) == 3, 10), "event did not expire the coupon")
        check(wait_for(lambda: "%d_%d" % (tpl, due) not in wallet(u), 3), "still in the wallet")
        time.sleep(1)
        check(status_of(u, early) == 0 and "%d_%d" % (tpl, early) in wallet(u),
              "a coupon not yet due was expired by its event")
    finally:
        svc.stop()


def consumers_of(queue):
    """The consumers RabbitMQ counts on queue (-1: no such queue)."""
    for f in (line.split() for line in rabbitmqctl("list_queues", "-q", "name", "consumers")
              .splitlines()):
        if len(f) == 2 and f[0] == queue and f[1].isdigit():
            return int(f[1])
    return -1


def expire_event(user, cid, tpl):
    sql(0, "INSERT INTO t_outbox (topic, msg_key, payload) VALUES ('coupon.expire', "
           "'expire-test:%d', '{\"userId\": \"%d\", \"userCouponId\": \"%d\", "
           "\"couponTemplateId\": \"%d\"}')" % (cid, user, cid, tpl))


def test_serving_replica_leaves_expiry_to_others():
    """deploy/k8s's request-serving engines (QUAN_EXPIRE_INTERVAL_MS=0, QUAN_MQ_SKIP_QUEUES):
    ready, they declare the expiry and reminder queues and consume neither, and sweep nothing, so
    a due coupon and its coupon.expire event wait for a replica that does (the writers), which
    then expires it from that event. A bad list stops the engine with the variable named.
    Runs before any other engine of this file consumes the queue."""
    serving = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": "0",
                                 "QUAN_MQ_SKIP_QUEUES": "engine.coupon-expire,engine.remind"})
    writer = None
    try:
        serving.wait_ready()
        check(wait_for(lambda: consumers_of("quan.engine.payment-timeout") >= 1, 10),
              "its other queues are not consumed")
        for q in ("quan.engine.coupon-expire", "quan.engine.remind"):
            check(wait_for(lambda: consumers_of(q) == 0, 10),
                  "%s: %d consumers" % (q, consumers_of(q)))
        u = random.randrange(1 << 40, 1 << 50)
        tpl = new_id()
        due, = insert_coupons([(u, tpl, -5, 0, 1)])
        expire_event(u, due, tpl)
        check(wait_for(lambda: queue_messages().get("quan.engine.coupon-expire", 0) >= 1, 10),
              "the event never reached its queue")
        time.sleep(1.5)
        check(status_of(u, due) == 0, "expired by a replica that leaves expiry to others")
        writer = Service("engine", {"QUAN_EXPIRE_INTERVAL_MS": "3600000"}).wait_ready()
        check(wait_for(lambda: status_of(u, due) == 3, 10), "the writer did not expire it")
        check(wait_for(lambda: consumers_of("quan.engine.remind") >= 1, 10),
              "the writer does not consume the reminders")
    finally:
        serving.stop()
        if writer:
            writer.stop()
    env = dict(os.environ, QUAN_CODE_SECRET="test-secret-0123456789abcdef")
    for value, why in (("engine.redeem", "consumed by its module itself"),
                       ("engine.remind,nope", "nope is not a queue of this binary"),
                       ("engine.remind,", "an empty name")):
        out = subprocess.run([os.path.join(BIN, "quan-engine")], capture_output=True, text=True,
                             env=dict(env, QUAN_MQ_SKIP_QUEUES=value), timeout=10)
        check(out.returncode == 2 and "QUAN_MQ_SKIP_QUEUES: " in out.stderr
              and why in out.stderr, "%r: exit %d, %s" % (value, out.returncode, out.stderr))


if __name__ == "__main__":
    try:
        statistics_baseline()
        run([test_serving_replica_leaves_expiry_to_others, test_expired_coupons_leave_db_and_wallet,
             test_coupon_expiring_while_running_and_idempotent,
             test_coupon_expire_event_expires_one_coupon, test_statistics_equal_the_rows])
    finally:
        if SWEEPER:
            SWEEPER.stop()
