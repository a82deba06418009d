"""Exchange-code redemption (engine exchange.c): keyed check before any lookup, one winner per
code under real concurrency, used codes 409 B000104, per-user limit, stock, window and status
honoured without burning the code, Redis stock = database stock afterwards; a redemption whose
process dies between ds_0's commit and ds_1's is settled by its check event (completed while its
reservation holds, else the stock and the code given back)."""

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from engine_db import (db_coupons, insert_template, make_code, metric, new_id, redis, redis_pipe,
                       sql, template_table, user_coupon_table)
from quan import Service, check, request, run
from stats_truth import statistics_baseline, test_statistics_equal_the_rows

ENGINE = None


def engine():
    global ENGINE
    if ENGINE is None:
        ENGINE = Service("engine").wait_ready()
    return ENGINE


def template(stock=100, limit=1, start_in_s=-60, end_in_s=86400, status=0):
    """A template in the database and in the cache (as merchant-admin writes both)."""
    shop = random.randrange(1 << 30, 1 << 40)
    tpl = new_id()
    now = int(time.time() * 1000)
    start, end = now + start_in_s * 1000, now + end_in_s * 1000
    insert_template(shop, tpl, start, end, stock=stock, limit=limit, status=status,
                    name="exchange %d" % tpl)
    key = "quan:tpl:{%d}" % tpl
    redis_pipe([["HSET", key, "id", tpl, "shopNumber", shop, "name", "exchange %d" % tpl,
                 "source", 0, "target", 1, "goods", "", "type", 0, "validStartTime", start,
                 "validEndTime", end, "stock", stock,
                 "receiveRule", '{"limitPerPerson":%d}' % limit,
                 "consumeRule", '{"validityPeriod":48}', "status", status],
                ["PEXPIREAT", key, end]])
    return shop, tpl


def codes(shop, tpl, n, valid=True):
    out = []
    for _ in range(n):
        c = make_code(random.getrandbits(30))
        if not valid:  # change one character: the keyed check fails (but for 2^-20)
            c = c[:9] + ("2" if c[9] != "2" else "3")
        out.append(c)
    batch = new_id()
    sql(0, "INSERT INTO t_exchange_code (id, batch_id, coupon_template_id, shop_number, code) "
           "VALUES " + ",".join("(%d, %d, %d, %d, '%s')" % (new_id() + i, batch, tpl, shop, c)
                                for i, c in enumerate(out)))
    return out


def exchange(user, code):
    return request("POST", engine().url + "/api/engine/user-coupon/exchange", {"code": code},
                   {"X-User-Id": str(user)})


def user():
    return random.randrange(1 << 40, 1 << 52)


def code_row(code):
    """(status, user, user coupon) of one code."""
    return code_rows([code])[code]


def stocks(shop, tpl):
    ds, table = template_table(shop)
    db = int(sql(ds, "SELECT stock FROM %s WHERE id = %d" % (table, tpl))[0][0])
    return int(redis("HGET", "quan:tpl:{%d}" % tpl, "stock")), db


def coupons_of(u, tpl):
    ds, table = user_coupon_table(u)
    return sql(ds, "SELECT id, request_id, status FROM %s WHERE user_id = %d AND "
                   "coupon_template_id = %d" % (table, u, tpl))


def code_rows(cs):
    """{code: code_row(code)} for many codes in one query."""
    rows = sql(0, "SELECT code, status, coalesce(user_id, 0), coalesce(user_coupon_id, 0) FROM "
                  "t_exchange_code WHERE code IN (%s)" % ",".join("'%s'" % c for c in cs))
    return {r[0]: tuple(int(x) for x in r[1:]) for r in rows}


def metrics_text():
    return request("GET", engine().url + "/metrics")[2].decode()


# ---------------------------------------------------------------- tests

def test_redeem_then_used():
    shop, tpl = template(stock=10, limit=5)
    c1, c2 = codes(shop, tpl, 2)
    u, other = user(), user()
    st, _, b = exchange(u, c1.lower())  # people type codes: case does not matter
    check(st == 200 and b["success"], "redeem: %s %s" % (st, b))
    ucid = int(b["data"]["userCouponId"])
    check(code_row(c1) == (2, u, ucid), "code row %s" % (code_row(c1),))
    rows = coupons_of(u, tpl)
    check(rows == [[str(ucid), "excode:" + c1, "0"]], "coupon rows %s" % rows)
    check(redis("ZSCORE", "quan:wallet:{%d}" % u, "%d_%d" % (tpl, ucid)) != "",
          "not in the wallet")
    check(stocks(shop, tpl) == (9, 9), "stock %s" % (stocks(shop, tpl),))
    for who in (u, other):
        st, _, b = exchange(who, c1)
        check(st == 409 and b["code"] == "B000104", "used code: %s %s" % (st, b))
    check(stocks(shop, tpl) == (9, 9), "stock after refusals %s" % (stocks(shop, tpl),))
    st, _, b = exchange(u, c2)
    check(st == 200, "second code: %s %s" % (st, b))
    check(len(coupons_of(u, tpl)) == 2 and stocks(shop, tpl) == (8, 8), "second coupon")


def test_two_users_race_one_code():
    shop, tpl = template(stock=100, limit=1)
    for code in codes(shop, tpl, 4):
        users = [user() for _ in range(6)]
        results = [None] * len(users)
        gate = threading.Barrier(len(users))

        def go(i):
            gate.wait()
            results[i] = exchange(users[i], code)
        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(users))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wins = [i for i, r in enumerate(results) if r[0] == 200]
        check(len(wins) == 1, "winners: %s" % [(r[0], r[2]) for r in results])
        for i, r in enumerate(results):
            if i not in wins:
                check(r[0] == 409 and r[2]["code"] == "B000104", "loser: %s %s" % (r[0], r[2]))
                check(coupons_of(users[i], tpl) == [], "loser got a coupon")
        w = users[wins[0]]
        check(code_row(code)[:2] == (2, w), "code row %s" % (code_row(code),))
        check(len(coupons_of(w, tpl)) == 1, "winner coupons")
    check(stocks(shop, tpl) == (96, 96), "stock %s" % (stocks(shop, tpl),))


def test_concurrent_redemptions_share_transactions():
    """Redemptions of one template arriving together share their transactions (each inside its
    own savepoint): fewer transactions than redemptions, and each still gets its own answer.
    Among them one code sent by two users at once (exactly one wins, the other is refused alone
    while its transaction's other redemptions go through), one code already redeemed behind the
    engine's back, and one user whose receive-count slot a coupon written behind the engine's
    back holds (refused by the database alone: its code usable again, its stock given back);
    every other redemption succeeds with the coupon its answer names, and Redis' stock equals
    the database's."""
    shop, tpl = template(stock=1000, limit=1)
    n = 240
    cs = codes(shop, tpl, n)
    users = [user() for _ in range(n + 1)]
    sql(0, "UPDATE t_exchange_code SET status = 2, user_id = 1 WHERE code = '%s'" % cs[0])
    slot = users[2]
    ds, table = user_coupon_table(slot)
    sql(ds, "INSERT INTO %s (id, user_id, coupon_template_id, shop_number, receive_count, "
            "valid_start_time, valid_end_time, status) VALUES (%d, %d, %d, %d, 1, now(), "
            "now() + interval '1 day', 2)" % (table, new_id(), slot, tpl, shop))
    pairs = list(zip(users, cs)) + [(users[n], cs[1])]  # cs[1] twice, by two users
    before = metrics_text()
    with ThreadPoolExecutor(max_workers=64) as pool:
        answers = list(pool.map(lambda p: exchange(*p), pairs))
    after = metrics_text()
    st, _, b = answers[0]
    check(st == 409 and b["code"] == "B000104", "the used code: %s %s" % (st, b))
    race = [answers[1], answers[n]]
    check(sorted(a[0] for a in race) == [200, 409] and
          [a[2]["code"] for a in race if a[0] == 409] == ["B000104"],
          "one code, two users: %s" % [(a[0], a[2]) for a in race])
    st, _, b = answers[2]
    check(st == 409 and b["code"] == "B000101", "the taken slot: %s %s" % (st, b))
    check(code_row(cs[2]) == (1, 0, 0), "the taken slot's code: %s" % (code_row(cs[2]),))
    checks = {u: int(sql(0, "SELECT count(*) FROM t_outbox WHERE msg_key LIKE 'check:%d:%%'"
                            % u)[0][0]) for u in (slot, users[3])}
    check(checks == {slot: 0, users[3]: 1}, "checks left in the outbox: %s" % checks)
    bad = [(pairs[i], a[0], a[2]) for i, a in enumerate(answers[3:n], 3) if a[0] != 200]
    check(not bad, "%d redemptions not 200: %s" % (len(bad), bad[:3]))
    won = [i for i, a in enumerate(answers) if a[0] == 200]
    held = {u: [c[0] for c in coupons] for u, coupons in db_coupons(users, tpl).items()}
    rows = code_rows(cs)
    for i in won:
        u, c = pairs[i]
        ucid = int(answers[i][2]["data"]["userCouponId"])
        check(held[u] == [ucid], "user %d: coupons %s, answer %d" % (u, held[u], ucid))
        check(rows.get(c) == (2, u, ucid), "code %s: row %s" % (c, rows.get(c)))
    lost = users[1] if answers[1][0] != 200 else users[n]
    check(held[lost] == [], "the refused user got a coupon")
    check(stocks(shop, tpl) == (1000 - len(won), 1000 - len(won)),
          "stocks %s after %d redemptions" % (stocks(shop, tpl), len(won)))

    def delta(name):
        return metric(after, name, step="exchange") - metric(before, name, step="exchange")

    tx = delta("quan_claim_transactions_total")
    written = delta("quan_claim_transaction_claims_total")
    check(n - 1 <= written <= n, "%d redemptions reached the database, %d sent" % (written, n + 1))
    check(tx * 2 <= written, "%d transactions for %d redemptions" % (tx, written))
    print("      %d redemptions in %d transactions" % (written, tx))


def test_forged_code_refused_without_db():
    shop, tpl = template(stock=10)
    forged = codes(shop, tpl, 3, valid=False)  # stored as unused rows, but fail the check
    before = metrics_text()
    u = user()
    for c in forged + ["ABCDEFGHJK", "SHORT", "0000000000", "ééééééééééé"]:
        st, _, b = exchange(u, c)
        check(st == 404 and b["code"] == "A000404", "forged %s: %s %s" % (c, st, b))
    after = metrics_text()
    f0 = metric(before, "quan_exchange_total", outcome="forged")
    f1 = metric(after, "quan_exchange_total", outcome="forged")
    check(f1 - f0 == 7, "forged counted %s -> %s" % (f0, f1))
    for outcome in ("not_found", "used", "success", "error"):
        check(metric(before, "quan_exchange_total", outcome=outcome)
              == metric(after, "quan_exchange_total", outcome=outcome),
              "a forged code reached the %s path" % outcome)
    for c in forged:
        check(code_row(c) == (1, 0, 0), "forged code touched: %s" % (code_row(c),))
    check(stocks(shop, tpl) == (10, 10), "stock moved")
    # a genuine code that was never stored: passes the check, then 404
    st, _, b = exchange(u, make_code(random.getrandbits(30)))
    check(st == 404 and b["code"] == "A000404", "unknown code: %s %s" % (st, b))
    st, _, b = exchange(u, None)
    check(st == 400 and b["message"].startswith("code"), "missing code: %s %s" % (st, b))
    st, _, b = request("POST", engine().url + "/api/engine/user-coupon/exchange", {"code": "x"})
    check(st == 401, "no identity: %s" % st)


def test_limit_and_stock_honoured_without_burning_codes():
    shop, tpl = template(stock=10, limit=1)
    a, b_code = codes(shop, tpl, 2)
    u = user()
    st, _, b = exchange(u, a)
    check(st == 200, "first: %s %s" % (st, b))
    st, _, b = exchange(u, b_code)
    check(st == 409 and b["code"] == "B000101", "limit: %s %s" % (st, b))
    check(code_row(b_code) == (1, 0, 0), "a refused code is not burned")
    check(stocks(shop, tpl) == (9, 9), "stock %s" % (stocks(shop, tpl),))
    st, _, b = exchange(user(), b_code)  # still redeemable by someone else
    check(st == 200, "other user: %s %s" % (st, b))

    shop, tpl = template(stock=1, limit=1)
    c, d = codes(shop, tpl, 2)
    st, _, b = exchange(user(), c)
    check(st == 200, "last unit: %s %s" % (st, b))
    st, _, b = exchange(user(), d)
    check(st == 409 and b["code"] == "B000100", "sold out: %s %s" % (st, b))
    check(code_row(d) == (1, 0, 0), "sold-out code burned")
    check(stocks(shop, tpl) == (0, 0), "stock %s" % (stocks(shop, tpl),))


def test_window_status_and_busy_user():
    shop, tpl = template(start_in_s=3600)
    (c,) = codes(shop, tpl, 1)
    st, _, b = exchange(user(), c)
    check(st == 409 and b["code"] == "B000102", "not started: %s %s" % (st, b))
    shop, tpl = template(status=1)
    (c,) = codes(shop, tpl, 1)
    st, _, b = exchange(user(), c)
    check(st == 409 and b["code"] == "B000103", "ended: %s %s" % (st, b))
    check(code_row(c) == (1, 0, 0), "code burned")
    # another redemption of the same user in flight (its lock held): 429, nothing done
    shop, tpl = template()
    (c,) = codes(shop, tpl, 1)
    u = user()
    redis("SET", "quan:lock:exchange:{%d}" % u, "someone-else", "PX", 5000)
    st, _, b = exchange(u, c)
    check(st == 429 and b["code"] == "A000429", "busy: %s %s" % (st, b))
    redis("DEL", "quan:lock:exchange:{%d}" % u)
    st, _, b = exchange(u, c)
    check(st == 200, "after the lock: %s %s" % (st, b))


# ds_1's commit waits until the test says so, then fails (as if the process had died there).
SLOW_COMMIT = """CREATE TABLE IF NOT EXISTS quan_test_commit_gate (x int);
CREATE OR REPLACE FUNCTION quan_test_slow_commit() RETURNS trigger AS $$
BEGIN
    FOR i IN 1..200 LOOP
        EXIT WHEN EXISTS (SELECT 1 FROM quan_test_commit_gate);
        PERFORM pg_sleep(0.1);
    END LOOP;
    RAISE EXCEPTION 'test: this commit fails';
END $$ LANGUAGE plpgsql;"""


def test_interrupted_between_the_two_commits():
    """Template in ds_0, coupons in ds_1; a deferred trigger makes ds_1's COMMIT slow, so ds_0
    (the code, the stock, the check event) has committed when the engine is killed."""
    global ENGINE
    while True:
        shop, tpl = template(stock=10, limit=1)
        if template_table(shop)[0] == 0:
            break
    users = []
    while len(users) < 2:
        u = user()
        if user_coupon_table(u)[0] == 1:
            users.append(u)
    a, b = users
    ca, cb = codes(shop, tpl, 2)
    tables = sorted({user_coupon_table(u)[1] for u in users})
    sql(1, SLOW_COMMIT + "".join(
        "CREATE CONSTRAINT TRIGGER quan_test_slow AFTER INSERT ON %s DEFERRABLE INITIALLY "
        "DEFERRED FOR EACH ROW EXECUTE FUNCTION quan_test_slow_commit();" % t for t in tables))
    try:
        if ENGINE:
            ENGINE.stop()
        ENGINE = Service("engine", {"QUAN_CLAIM_WALLET_CHECK_MS": "3000"}).wait_ready()

        def redeem(u, c):
            try:
                exchange(u, c)
            except OSError:
                pass  # the engine is killed under it

        threads = [threading.Thread(target=redeem, args=x) for x in ((a, ca), (b, cb))]
        for t in threads:
            t.start()
        deadline = time.time() + 5
        while time.time() < deadline and (code_row(ca)[0], code_row(cb)[0]) != (2, 2):
            time.sleep(0.05)
        ENGINE.proc.kill()  # ds_0 committed, ds_1 in its slow commit
        ENGINE.proc.wait()
        ENGINE = None
        sql(1, "INSERT INTO quan_test_commit_gate VALUES (1)")  # ds_1's commit fails now
        for t in threads:
            t.join(timeout=30)
    finally:
        sql(1, "".join("DROP TRIGGER IF EXISTS quan_test_slow ON %s;" % t for t in tables) +
            "DROP TABLE IF EXISTS quan_test_commit_gate;")
    check(code_row(ca)[0] == 2 and code_row(cb)[0] == 2, "codes used in ds_0")
    check(coupons_of(a, tpl) == [] and coupons_of(b, tpl) == [], "no coupons in ds_1")
    check(stocks(shop, tpl) == (8, 8), "stocks taken %s" % (stocks(shop, tpl),))
    # b's request "failed" and gave its reservation back (claim_undo.lua): marker gone.
    redis("HINCRBY", "quan:tpl:{%d}" % tpl, "stock", 1)
    redis("HINCRBY", "quan:tpl:{%d}:users" % tpl, b, -1)
    redis("HDEL", "quan:tpl:{%d}:users" % tpl, "%d:excode:%s" % (b, cb))
    ENGINE = Service("engine", {"QUAN_CLAIM_WALLET_CHECK_MS": "3000"}).wait_ready()
    deadline = time.time() + 30
    while time.time() < deadline and (not coupons_of(a, tpl) or code_row(cb)[0] != 1):
        time.sleep(0.3)
    rows = coupons_of(a, tpl)
    check(len(rows) == 1 and code_row(ca) == (2, a, int(rows[0][0])),
          "a's redemption completed: %s %s" % (rows, code_row(ca)))
    check(redis("ZSCORE", "quan:wallet:{%d}" % a, "%d_%s" % (tpl, rows[0][0])) != "",
          "a's wallet")
    check(code_row(cb) == (1, 0, 0) and coupons_of(b, tpl) == [], "b's code usable again")
    check(stocks(shop, tpl) == (9, 9), "stocks %s" % (stocks(shop, tpl),))
    redis("DEL", "quan:lock:exchange:{%d}" % b)  # the killed engine's lock: its lease, shortened
    st, _, body = exchange(b, cb)
    check(st == 200, "b redeems it again: %s %s" % (st, body))


if __name__ == "__main__":
    try:
        statistics_baseline()
        run([test_redeem_then_used, test_two_users_race_one_code,
             test_concurrent_redemptions_share_transactions, test_forged_code_refused_without_db,
             test_limit_and_stock_honoured_without_burning_codes,
             test_window_status_and_busy_user,
             test_interrupted_between_the_two_commits, test_statistics_equal_the_rows])
    finally:
        if ENGINE:
            ENGINE.stop()
