"""Reservations nobody finishes (engine resv.c): claim.lua reserves in Redis before the database
is written, so a process killed in between leaves a stock unit and the user's count behind.
Against real servers: an engine killed with claims blocked in their stock transaction (the
template table locked), a new engine with the default settings gives every reservation back
once the killed process's lease ran out (seconds) and the users claim again with the same
requestId, or at once with a retry of
the same requestId once the first request cannot be alive any more (also an MQ claim killed
while the broker held its confirm back, its pending marker set); an MQ claim whose engine
died before the broker's confirm was recorded is given up in the database first, so the message
delivered afterwards writes nothing (no coupon, no second give-back, FAILED at /redeem-result)
and does not stop the message of a retry with the same requestId from being written, nor
gives the retry's reservation back when both come again (sent back by a consumer that started
while a restore was pending);
a reservation whose claim did reach the database is only removed, never given back."""

import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import test_engine_claims as tec
from engine_db import rabbitmqctl, redis, sql, template_table
from quan import Service, check, run, wait_for
from test_engine_claims import (check_consistent, create, db_coupons, db_stock, new_shop,
                                new_users, redeem, redis_stock, result)

FAST = {"QUAN_RESV_ABANDON_MS": "1000", "QUAN_RESV_SWEEP_MS": "200"}


def counter(tpl, user):
    return int(redis("HGET", "quan:tpl:{%d}:users" % tpl, user) or 0)


def open_reservations(tpl):
    return int(redis("ZCARD", "quan:tpl:{%d}:resv" % tpl))


def reservation_time(tpl, user, rid):
    """The time claim.lua recorded in the claim's marker ("<count>:<ms>")."""
    return int(redis("HGET", "quan:tpl:{%d}:users" % tpl, "%d:%s" % (user, rid)).split(":")[1])


def kill_mid_claim(shop, tpl, users, stock):
    """Claims of users (requestId "k<user>") reserved in Redis and blocked in their stock
    transaction (the template table locked for 4 s), then the engine killed with -9; returns
    when the lock is gone (the transactions died with their connections)."""
    tds, ttable = template_table(shop)
    locker = subprocess.Popen(["psql", os.environ["QUAN_DS%d_DSN" % tds], "-qAtX", "-c",
                               "BEGIN; LOCK TABLE %s IN EXCLUSIVE MODE; SELECT pg_sleep(4); "
                               "COMMIT;" % ttable], stdout=subprocess.DEVNULL)
    check(wait_for(lambda: sql(tds, "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = "
                                    "l.relation WHERE c.relname = '%s' AND l.mode = "
                                    "'ExclusiveLock' AND l.granted" % ttable), 5), "table locked")

    def claim(u):
        try:
            redeem(u, shop, tpl, request_id="k%d" % u)
        except OSError:
            pass  # the engine is killed under it

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    for t in threads:
        t.start()
    left = stock - len(users)
    check(wait_for(lambda: redis_stock(tpl) == left, 10), "reserved: %s" % redis_stock(tpl))
    time.sleep(0.3)  # each one waits on the lock in its stock transaction
    tec.en.proc.kill()
    tec.en.proc.wait()
    killed = time.time()
    locker.wait(timeout=30)
    for t in threads:
        t.join(timeout=30)
    check(db_stock(shop, tpl) == stock and redis_stock(tpl) == left,
          "left behind: DB %s, Redis %s" % (db_stock(shop, tpl), redis_stock(tpl)))
    check(all(counter(tpl, u) == 1 for u in users), "each user's count taken")
    return killed


def test_engine_killed_mid_claim_gives_the_reservations_back():
    """kill -9 with 12 claims reserved in Redis and blocked before their stock's commit; a new
    engine with the default settings gives all 12 back (stock, counts, markers) in seconds,
    records them FAILED, and the same requestIds then claim normally."""
    shop, users = new_shop(), new_users(12)
    tds, _ = template_table(shop)
    tpl = create(shop, stock=20, limit=1)
    killed = kill_mid_claim(shop, tpl, users, 20)
    tec.en = Service("engine").wait_ready()  # QUAN_RESV_* at their defaults, another port
    check(wait_for(lambda: redis_stock(tpl) == 20, 70), "given back: %s" % redis_stock(tpl))
    took = time.time() - killed
    print("  12 reservations given back %.1f s after the kill" % took)
    # The killed process's lease (3 s) runs out, and the next sweep (every second) settles
    # them; the new engine's start is in that time too.
    check(took < 8, "within the lease and a sweep of the kill: %.1f s" % took)
    check(db_stock(shop, tpl) == 20, "the database never took them")
    check(all(counter(tpl, u) == 0 for u in users), "counts given back")
    check(open_reservations(tpl) == 0, "no reservation left open")
    check(not [f for f in redis("HKEYS", "quan:tpl:{%d}:users" % tpl).split("\n") if ":" in f],
          "markers gone")
    failed = sql(0, "SELECT count(*) FROM t_claim_result WHERE coupon_template_id = %d AND "
                    "status = 2 AND reason LIKE '%%interrupted%%'" % tpl)[0][0]
    check(int(failed) == 12, "recorded FAILED: %s" % failed)
    void = sql(tds, "SELECT count(*) FROM t_claim_ledger WHERE coupon_template_id = %d AND "
                    "void_resv_ms IS NOT NULL" % tpl)[0][0]
    check(int(void) == 12, "given up in the database: %s" % void)
    # Nobody is locked out: the same requestIds claim now (a new attempt takes the row over).
    answers = [redeem(u, shop, tpl, request_id="k%d" % u) for u in users]
    check(all(st == 200 for st, _ in answers), [a for a in answers if a[0] != 200][:3])
    check(check_consistent(shop, tpl, users, 20, 1) == 12, "12 coupons, stock 8 everywhere")
    check(open_reservations(tpl) == 0, "completed claims leave no record")


def test_retry_takes_over_an_orphaned_claim():
    """The same kill; then, once the first requests cannot be alive any more (the request
    timeout, 1 s here; the sweeper far off), retries with the same requestIds settle them at
    once: the orphaned attempt is given up in the database and back in Redis, and the retry
    claims anew, synchronously (200) or through the queue (202, then SUCCESS)."""
    shop, users = new_shop(), new_users(4)
    tpl = create(shop, stock=10, limit=1)
    kill_mid_claim(shop, tpl, users, 10)
    tec.en = Service("engine", {"QUAN_HTTP_REQUEST_TIMEOUT_MS": "1000",
                                "QUAN_RESV_ABANDON_MS": "600000"}).wait_ready()
    time.sleep(1.2)
    sync = [redeem(u, shop, tpl, request_id="k%d" % u) for u in users[:2]]
    check(all(st == 200 for st, _ in sync), "sync retries claim: %s" % sync)
    mq = [redeem(u, shop, tpl, mq=True, request_id="k%d" % u) for u in users[2:]]
    check(all(st == 202 for st, _ in mq), "MQ retries accepted: %s" % mq)
    check(wait_for(lambda: all(result(u, "k%d" % u)["status"] == "SUCCESS" for u in users[2:]),
                   20), "and succeed")
    check(check_consistent(shop, tpl, users, 10, 1) == 4, "4 coupons, stock 6 everywhere")
    again = redeem(users[0], shop, tpl, request_id="k%d" % users[0])
    check(again[0] == 200 and again[1]["data"]["userCouponId"] == sync[0][1]["data"]["userCouponId"],
          "a further retry answers the same coupon: %s" % (again,))
    tec.en.stop()
    tec.en = Service("engine").wait_ready()


def test_mq_retry_takes_over_a_claim_killed_before_its_confirm():
    """An MQ claim's publish waits for a confirm the broker holds back (its memory alarm blocks
    every publishing connection), its pending marker already set; the engine is killed -9 then,
    and once the alarm ends and the broker has closed the dead connection, the queue is purged,
    so the message is never delivered. Once the first request cannot be alive any more, a retry
    with the same requestId takes the orphaned attempt over: the marker alone does not make it
    "queued". 202, then SUCCESS, one coupon."""
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=5, limit=1)
    rid = "blocked"

    def claim():
        try:
            redeem(user, shop, tpl, mq=True, request_id=rid)
        except OSError:
            pass  # the engine is killed under it

    def publisher_listed():
        return re.search(r"publisher:(quan-)?engine\b",
                         rabbitmqctl("list_connections", "-q", "client_properties"))

    # A tiny watermark raises the memory alarm; 0.4 is the default.
    rabbitmqctl("set_vm_memory_high_watermark", "0.000001")
    try:
        t = threading.Thread(target=claim)
        t.start()
        check(wait_for(lambda: redis("EXISTS", "quan:claim:{%d}:%s" % (user, rid)) == "1", 5),
              "marked pending while the publish waits")
        time.sleep(0.2)
        check(redis_stock(tpl) == 4 and counter(tpl, user) == 1, "reserved")
        score = redis("ZSCORE", "quan:tpl:{%d}:resv" % tpl, "%d:%s" % (user, rid))
        check(score and float(score) < 1e15, "its record not marked queued: %s" % score)
        check(publisher_listed(), "the engine's publisher connection is listed")
        tec.en.proc.kill()
        tec.en.proc.wait()
        t.join(timeout=30)
        rabbitmqctl("set_vm_memory_high_watermark", "0.4")
        # The broker reads what the killed publisher sent, then closes its connection: after
        # that the message is in the queue or nowhere. Nothing consumes it (the engine is
        # gone); a second purge a moment later catches one that was still on its way.
        check(wait_for(lambda: not publisher_listed(), 30),
              "the killed engine's publisher connection closed")
        rabbitmqctl("purge_queue", "quan.engine.redeem")
        time.sleep(1)
        rabbitmqctl("purge_queue", "quan.engine.redeem")
    finally:
        rabbitmqctl("set_vm_memory_high_watermark", "0.4")
    # No sweep while the test runs (the new process's lease makes the killed one's records
    # orphans for it): the retry alone settles the attempt.
    tec.en = Service("engine", {"QUAN_HTTP_REQUEST_TIMEOUT_MS": "1000",
                                "QUAN_RESV_ABANDON_MS": "600000",
                                "QUAN_RESV_SWEEP_MS": "3600000"}).wait_ready()
    time.sleep(1.2)
    check(redis_stock(tpl) == 4 and redis("EXISTS", "quan:claim:{%d}:%s" % (user, rid)) == "1",
          "still reserved and marked pending")
    st, r = redeem(user, shop, tpl, mq=True, request_id=rid)
    check(st == 202, "the retry accepted: %s %s" % (st, r))
    check(wait_for(lambda: result(user, rid)["status"] == "SUCCESS", 20),
          "and written: %s" % result(user, rid))
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "one coupon, stock 4 everywhere")
    tec.en.stop()
    tec.en = Service("engine").wait_ready()


def test_late_message_of_a_given_up_claim_writes_nothing():
    """An accepting replica queues a claim, and its record is left open (as when the engine
    dies before the confirm arrives). The sweeper gives it up and back; the message consumed
    afterwards finds the attempt given up: no coupon, no stock taken, nothing given back twice,
    FAILED for /redeem-result."""
    tec.en.stop()
    acc = Service("engine", dict(FAST, QUAN_CLAIM_CONSUMERS="0")).wait_ready()
    try:
        shop, user = new_shop(), new_users(1)[0]
        tpl = create(shop, stock=5, limit=1)
        st, r = redeem(user, shop, tpl, mq=True, request_id="late", svc=acc)
        check(st == 202, "accepted: %s %s" % (st, r))
        check(redis_stock(tpl) == 4, "reserved")
        score = redis("ZSCORE", "quan:tpl:{%d}:resv" % tpl, "%d:late" % user)
        check(score and float(score) >= 1e15, "its record marked queued: %s" % score)
        ms = reservation_time(tpl, user, "late")
        redis("ZADD", "quan:tpl:{%d}:resv" % tpl, ms, "%d:late" % user)
        check(wait_for(lambda: redis_stock(tpl) == 5, 10), "given back: %s" % redis_stock(tpl))
        check(counter(tpl, user) == 0 and open_reservations(tpl) == 0, "count back, record gone")
    finally:
        acc.stop()
        tec.en = Service("engine", dict(FAST, QUAN_CLAIM_BATCH="64")).wait_ready()
    check(wait_for(lambda: result(user, "late")["status"] != "PENDING", 20), "consumed")
    res = result(user, "late")
    check(res["status"] == "FAILED" and "interrupted" in res["reason"], res)
    check(db_coupons([user], tpl)[user] == [], "no coupon")
    check(db_stock(shop, tpl) == 5 and redis_stock(tpl) == 5, "stock 5 in both")
    st, r = redeem(user, shop, tpl, mq=True, request_id="again")
    check(st == 202, "claims again: %s %s" % (st, r))
    check(wait_for(lambda: result(user, "again")["status"] == "SUCCESS", 20), "succeeds")
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "one coupon, stock 4 everywhere")
    check(open_reservations(tpl) == 0, "the consumer ended the queued record")


def late_message_beside_its_retry(batch, sent_back=False):
    """An accepting replica queues a claim whose record is left open; the sweeper gives it up
    and back; the client's retry with the same requestId is accepted and queued as well. Then a
    consumer takes both messages (batch 1: the given-up one first, alone; 64: both in one
    batch): the late one writes nothing, and must not keep the retry from being written.
    sent_back: the consumer starts while a restore is pending and sends its batches back, so
    both arrive redelivered: the late one must not give the retry's reservation back."""
    tec.en.stop()
    acc = Service("engine", dict(FAST, QUAN_CLAIM_CONSUMERS="0")).wait_ready()
    rid = "retry%s%s" % (batch, "b" if sent_back else "")
    try:
        shop, user = new_shop(), new_users(1)[0]
        tpl = create(shop, stock=5, limit=1)
        check(redeem(user, shop, tpl, mq=True, request_id=rid, svc=acc)[0] == 202, "accepted")
        ms = reservation_time(tpl, user, rid)
        redis("ZADD", "quan:tpl:{%d}:resv" % tpl, ms, "%d:%s" % (user, rid))
        check(wait_for(lambda: redis_stock(tpl) == 5, 10), "given back: %s" % redis_stock(tpl))
        st, r = redeem(user, shop, tpl, mq=True, request_id=rid, svc=acc)
        check(st == 202 and redis_stock(tpl) == 4, "the retry is accepted: %s %s" % (st, r))
        check(reservation_time(tpl, user, rid) != ms, "a new attempt")
    finally:
        acc.stop()
        env = dict(FAST, QUAN_CLAIM_BATCH=str(batch))
        if sent_back:
            send_back_once(dict(env, QUAN_CLAIM_CONSUMERS="1"))
        tec.en = Service("engine", env).wait_ready()
    check(wait_for(lambda: result(user, rid)["status"] == "SUCCESS", 20),
          "the retry succeeds: %s" % result(user, rid))
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "one coupon, stock 4 everywhere")
    check(counter(tpl, user) == 1 and open_reservations(tpl) == 0, "count 1, no record left")


def send_back_once(env):
    """An engine started with env while ds_0 says a restore waits for quan-recover: its claim
    consumer sends the queued batches back (they come again marked redelivered); stopped once it
    did, and the mark taken off."""
    sql(0, "UPDATE quan_restore SET recovered_epoch = recovered_epoch + 1 WHERE id = 1")
    svc = Service("engine", env)
    try:
        check(wait_for(lambda: b"the batch goes back" in open(svc.log_path, "rb").read(), 15),
              "the consumer sent its batch back")
    finally:
        svc.stop()
        sql(0, "UPDATE quan_restore SET recovered_epoch = recovered_epoch - 1 WHERE id = 1")


def test_late_message_then_its_retry():
    late_message_beside_its_retry(1)


def test_late_message_and_its_retry_in_one_batch():
    late_message_beside_its_retry(64)


def test_late_message_and_its_retry_sent_back():
    late_message_beside_its_retry(64, sent_back=True)


def test_concurrent_mq_claims_are_all_marked_queued():
    """Many MQ claims at once on three templates: a confirm answers a pack of them together, and
    their records are marked queued in one command per template. Every accepted claim's record
    must be marked (none left looking unqueued, which a retry would treat as possibly lost);
    then the consumers write every one."""
    tec.en.stop()
    acc = Service("engine", {"QUAN_CLAIM_CONSUMERS": "0"}).wait_ready()
    shop, users = new_shop(), new_users(60)
    tpls = [create(shop, stock=100, limit=1) for _ in range(3)]
    claims = [(u, tpls[i % 3]) for i, u in enumerate(users)]
    try:
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(lambda c: redeem(c[0], shop, c[1], mq=True,
                                                     request_id="q%d" % c[0], svc=acc), claims))
        check(all(st == 202 for st, _ in answers), "all accepted: %s" % sorted(
            set(st for st, _ in answers)))
        for tpl in tpls:
            scores = redis("ZRANGE", "quan:tpl:{%d}:resv" % tpl, 0, -1, "WITHSCORES").split()
            members = sum(1 for u, t in claims if t == tpl)
            check(len(scores) == 2 * members, "template %d: %d records of %d claims" % (
                tpl, len(scores) // 2, members))
            unmarked = [scores[i] for i in range(0, len(scores), 2) if float(scores[i + 1]) < 1e15]
            check(not unmarked, "template %d: records not marked queued: %s" % (tpl, unmarked))
    finally:
        acc.stop()
        tec.en = Service("engine", FAST).wait_ready()  # as the tests before left it
    check(wait_for(lambda: all(result(u, "q%d" % u)["status"] == "SUCCESS" for u, _ in claims),
                   30), "every claim written")
    for tpl in tpls:
        mine = [u for u, t in claims if t == tpl]
        check(check_consistent(shop, tpl, mine, 100, 1) == len(mine), "one coupon each")
        check(open_reservations(tpl) == 0, "no record left")


def test_reservation_that_reached_the_database_is_only_removed():
    """A claim committed, then its process died before removing the record: the sweeper finds
    the stock taken in the database and removes the record, giving nothing back."""
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=5, limit=1)
    st, r = redeem(user, shop, tpl, request_id="done")
    check(st == 200, "claimed: %s %s" % (st, r))
    ms = reservation_time(tpl, user, "done")
    redis("ZADD", "quan:tpl:{%d}:resv" % tpl, ms, "%d:done" % user)
    check(wait_for(lambda: open_reservations(tpl) == 0, 10), "record removed")
    time.sleep(0.5)
    check(redis_stock(tpl) == 4 and counter(tpl, user) == 1, "nothing given back")
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "one coupon, stock 4 everywhere")


def test_queued_record_left_by_its_consumer_is_ended():
    """An MQ claim written by its consumer while Redis refuses the record's ZREM (an ACL takes
    the command away): the record stays, marked queued, and would keep the template "sold out
    in doubt" and its user "limit in doubt" for ever, since nobody but the consumer ends a
    queued record. Once it is older than QUAN_RESV_ABANDON_MS (1 s here) the sweep looks its
    ledger row up, finds the stock taken, and ends the record; nothing is given back."""
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=1, limit=1)
    redis("ACL", "SETUSER", "default", "-zrem")
    try:
        st, r = redeem(user, shop, tpl, mq=True, request_id="zq")
        check(st == 202, "accepted: %s %s" % (st, r))
        check(wait_for(lambda: result(user, "zq")["status"] == "SUCCESS", 20), "written")
        scores = redis("ZRANGE", "quan:tpl:{%d}:resv" % tpl, 0, -1, "WITHSCORES").split()
        check(len(scores) == 2 and float(scores[1]) >= 1e15,
              "the record stays, marked queued: %s" % scores)
    finally:
        redis("ACL", "SETUSER", "default", "+zrem")
    check(wait_for(lambda: open_reservations(tpl) == 0, 10), "the record ended by the sweep")
    st, r = redeem(new_users(1)[0], shop, tpl, request_id="zq2")
    check(st == 409 and r.get("code") == "B000100", "sold out, a final no now: %s %s" % (st, r))
    check(redis_stock(tpl) == 0 and counter(tpl, user) == 1, "nothing given back")
    check(check_consistent(shop, tpl, [user], 1, 1) == 1, "one coupon, stock 0 everywhere")


def test_queued_claim_refused_whose_give_back_was_lost_is_given_back():
    """An MQ claim its consumer refuses (the database's stock is gone: a unit Redis still had)
    is recorded FAILED and given back in Redis after the commit; while Redis refuses ZREM (an
    ACL) that give-back fails, and its queued record, the stock and the user's count stay. Once
    the record is older than QUAN_RESV_ABANDON_MS (1 s here) the sweep finds the attempt FAILED
    and gives it back again: once."""
    shop, user = new_shop(), new_users(1)[0]
    tds, table = template_table(shop)
    tpl = create(shop, stock=5, limit=1)
    sql(tds, "UPDATE %s SET stock = 0 WHERE id = %d" % (table, tpl))
    redis("ACL", "SETUSER", "default", "-zrem")
    try:
        st, r = redeem(user, shop, tpl, mq=True, request_id="zr")
        check(st == 202, "accepted: %s %s" % (st, r))
        check(wait_for(lambda: result(user, "zr")["status"] == "FAILED", 20), "refused")
        time.sleep(1.5)  # past the abandon age: the sweep looks, and its give-back fails too
        check(redis_stock(tpl) == 4 and counter(tpl, user) == 1 and open_reservations(tpl) == 1,
              "not given back while ZREM is refused: stock %s" % redis_stock(tpl))
    finally:
        redis("ACL", "SETUSER", "default", "+zrem")
    check(wait_for(lambda: open_reservations(tpl) == 0, 10), "given back by the sweep")
    time.sleep(0.5)
    check(redis_stock(tpl) == 5 and counter(tpl, user) == 0, "given back once: stock %s, count %d"
          % (redis_stock(tpl), counter(tpl, user)))
    check(result(user, "zr")["status"] == "FAILED", "still FAILED, reason kept")
    check(not db_coupons([user], tpl).get(user), "no coupon")


def test_a_record_whose_end_failed_is_ended_again():
    """A claim commits while Redis refuses its record's ZREM (an ACL takes the command away): the
    record stays open, holding the user and the stock "in doubt". Once Redis takes ZREM again,
    the engine that made the claim ends the record itself within a second or two, not the
    sweep's QUAN_RESV_ABANDON_MS (30 s by default) later."""
    tec.en.stop()
    tec.en = Service("engine").wait_ready()  # QUAN_RESV_* at their defaults
    shop, user = new_shop(), new_users(1)[0]
    tpl = create(shop, stock=5, limit=1)
    redis("ACL", "SETUSER", "default", "-zrem")
    try:
        st, r = redeem(user, shop, tpl, request_id="z")
        check(st == 200, "claimed: %s %s" % (st, r))
        time.sleep(1.0)  # four of the engine's tries, refused
        check(open_reservations(tpl) == 1, "the record stays open while ZREM is refused: %d"
              % open_reservations(tpl))
    finally:
        redis("ACL", "SETUSER", "default", "+zrem")
    back = time.time()
    check(wait_for(lambda: open_reservations(tpl) == 0, 20), "record ended")
    took = time.time() - back
    print("  the record ended %.1f s after Redis took ZREM again" % took)
    check(took < 3, "ended by its owner, not by the sweep's abandon age: %.1f s" % took)
    check(redis_stock(tpl) == 4 and counter(tpl, user) == 1, "nothing given back")
    check(check_consistent(shop, tpl, [user], 5, 1) == 1, "one coupon, stock 4 everywhere")


def test_a_give_back_that_failed_is_sent_again():
    """A /redeem-mq claim the broker refuses (a policy lets the queue hold one message) is given
    back at once (claim_undo.lua): while Redis refuses ZREM (an ACL), the give-back's script
    fails, and the stock, the user's count and the claim's record stay. Once Redis takes ZREM
    again, the engine sends the give-back again itself within a second or two, not the sweep's
    QUAN_RESV_ABANDON_MS (30 s by default) later; given back once."""
    tec.en.stop()
    acc = Service("engine", {"QUAN_CLAIM_CONSUMERS": "0"}).wait_ready()  # defaults otherwise
    shop = new_shop()
    tpl = create(shop, stock=100, limit=1)
    tec.redeem_queue_full(True)
    try:
        filled, user = [], None
        for u in new_users(10):
            if user is None and filled:
                redis("ACL", "SETUSER", "default", "-zrem")
            st, r = redeem(u, shop, tpl, mq=True, request_id="gb-%d" % u, svc=acc)
            if st != 202:
                user = u
                break
            filled.append(u)
            redis("ACL", "SETUSER", "default", "+zrem")
        check(user is not None and filled, "a claim refused after one accepted: %s" % filled)
        check(st == 503, "refused: a retryable 503: %s %s" % (st, r))
        time.sleep(1.0)  # four of the engine's tries, refused
        check(counter(tpl, user) == 1 and open_reservations(tpl) == len(filled) + 1,
              "not given back while ZREM is refused: count %d, records %d" % (
                  counter(tpl, user), open_reservations(tpl)))
        redis("ACL", "SETUSER", "default", "+zrem")
        back = time.time()
        check(wait_for(lambda: counter(tpl, user) == 0, 20), "given back")
        took = time.time() - back
        print("  given back %.1f s after Redis took ZREM again" % took)
        check(took < 3, "by its engine, not by the sweep's abandon age: %.1f s" % took)
        check(redis_stock(tpl) == 100 - len(filled), "stock back once: %s, %d accepted" % (
            redis_stock(tpl), len(filled)))
        check(open_reservations(tpl) == len(filled), "its record gone, the accepted ones' kept")
    finally:
        redis("ACL", "SETUSER", "default", "+zrem")
        tec.redeem_queue_full(False)
        acc.stop()
        tec.en = Service("engine").wait_ready()
    for u in filled:
        check(wait_for(lambda: result(u, "gb-%d" % u)["status"] == "SUCCESS", 20),
              result(u, "gb-%d" % u))
    check(check_consistent(shop, tpl, filled, 100, 1) == len(filled), "one coupon each")


def main():
    tec.ma = Service("merchant-admin").wait_ready()
    tec.en = Service("engine").wait_ready()
    try:
        run([test_engine_killed_mid_claim_gives_the_reservations_back,
             test_retry_takes_over_an_orphaned_claim,
             test_mq_retry_takes_over_a_claim_killed_before_its_confirm,
             test_late_message_of_a_given_up_claim_writes_nothing,
             test_late_message_then_its_retry,
             test_late_message_and_its_retry_in_one_batch,
             test_late_message_and_its_retry_sent_back,
             test_concurrent_mq_claims_are_all_marked_queued,
             test_reservation_that_reached_the_database_is_only_removed,
             test_queued_record_left_by_its_consumer_is_ended,
             test_queued_claim_refused_whose_give_back_was_lost_is_given_back,
             test_a_record_whose_end_failed_is_ended_again,
             test_a_give_back_that_failed_is_sent_again])
    finally:
        tec.en.stop()
        tec.ma.stop()


if __name__ == "__main__":
    main()
