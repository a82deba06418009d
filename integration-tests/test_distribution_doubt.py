"""A distribution chunk whose transaction outcome is unknown to its run (distribution chunk.c,
taskrun.c), against real servers. quan-distribution reaches both databases through a proxy
(pgcut.py) that loses a COMMIT's answer on demand: the COMMIT reaches the server and the answer
is lost (the transaction committed), or the COMMIT itself is lost (it rolled back). For each of a
chunk's three transactions (its coupons in both databases, the template's stock, its checkpoint
in ds_0) and both ways, the run retries the step and finds out what happened from the chunk's
markers and checkpoint row: the task ends (status 3) with exact counts, nothing issued twice or
lost (every listed user holds one coupon of the task, by request id `dist/<task>:<row>`), the
stock taken once (database and Redis alike), each user's Redis counter 1, one checkpoint per
chunk and one notification event per chunk that issued, the failure report exact; and the one run that started does
it all, within a few seconds: a checkpoint that committed although its answer was lost is the
run's own, not another run's, so the run goes on instead of stopping and leaving the task to
wait for its lease (QUAN_DIST_LEASE_MS) to run out."""

import os
import random
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_distribution as td  # noqa: E402
from engine_db import redis, sql, template_table, user_coupon_table  # noqa: E402
from pgcut import PgCut  # noqa: E402
from quan import TMP, Service, check, run  # noqa: E402
from test_distribution import (create_task, dist_logs, make_tpl, model, new_shop,  # noqa: E402
                               new_users, verify, wait_end, write_csv)
from test_engine_doubt import CUT, Locked, dsn_port, proxied_env  # noqa: E402

CHUNK = 200
USERS = 2000
STOCK = 2500  # above the users: the stock left tells whether a chunk's was taken twice
LEASE_MS = 30000
WITHIN_S = 15  # a run that goes on ends this soon; one left to its lease takes LEASE_MS more
CUT_CHUNK = 4  # the chunk whose transaction is cut: chunks before and after it commit as usual


def bound(*values):
    """values as consecutive text parameters of a Bind message (each after its length): a
    needle naming exactly these parameters of one statement, e.g. a chunk's marker (task,
    chunk, step) or its checkpoint row (task, chunk, first row)."""
    return "".join(struct.pack("!i", len(str(v))).decode() + str(v) for v in values)


def sheet(name):
    """USERS distinct new users in random order, each on ds_0 or ds_1, a few of them listed
    twice, and a few malformed ids, written to a CSV: (rows, the users, its path)."""
    users = new_users(USERS)
    random.shuffle(users)
    rows = [(str(u), None, None) for u in users]
    for k in range(10):
        rows.insert(random.randrange(len(rows)), (str(random.choice(users)), None, None))
        rows.insert(random.randrange(len(rows)), ("bad%d" % k, None, None))
    cut = rows[CUT_CHUNK * CHUNK:(CUT_CHUNK + 1) * CHUNK]
    check({user_coupon_table(int(r[0]))[0] for r in cut if r[0].isdigit()} == {0, 1},
          "the cut chunk has users in both databases")
    return rows, users, write_csv(name, rows)


def redis_counters_bad(tpl, users):
    """Users whose claim count of tpl in Redis (claim.lua's and dist_chunk.lua's: the field
    "<user>" of the template's users hash) is not 1."""
    # Picked inside Redis: an HMGET's absent fields print as empty lines, which the output's
    # strip would drop at either end, and the rest would no longer line up with the users.
    bad = redis("EVAL", "local out = {} for _, u in ipairs(ARGV) do "
                "if redis.call('HGET', KEYS[1], u) ~= '1' then out[#out + 1] = u end end "
                "return out", 1, "quan:tpl:{%d}:users" % tpl, *users)
    return bad.split()


def doubt(step, after):
    """A task whose chunk CUT_CHUNK loses the COMMIT of step ("coupons": both databases'
    coupon transactions; "stock": the template's stock; "checkpoint") after it reached the
    server (after) or on its way; then everything a finished task must show."""
    shop = new_shop()
    tpl = make_tpl(shop, STOCK)
    rows, users, path = sheet("doubt-%s-%d.csv" % (step, after))
    tds, ttable = template_table(shop)
    first = CUT_CHUNK * CHUNK
    # The template's table locked: the run cannot take chunk 0's stock, so it is held before
    # the cut chunk until the cut is armed (the needle names the task, known once it exists).
    lock = Locked(tds, ttable)
    try:
        t0 = time.time()
        task_id, _ = create_task(shop, tpl, path)
        if step == "coupons":
            needle, cuts = bound(task_id, CUT_CHUNK, "coupons"), (0, 1)
        elif step == "stock":
            needle, cuts = bound(task_id, CUT_CHUNK, "stock"), (tds,)
        else:
            needle, cuts = bound(task_id, CUT_CHUNK, first), (0,)
        before = [CUT[ds].cuts for ds in (0, 1)]
        for ds in cuts:
            CUT[ds].arm(needle, after=after)
    finally:
        lock.release()
    for ds in cuts:
        check(CUT[ds].wait_cut(30), "the COMMIT of chunk %d's %s in ds_%d was cut"
              % (CUT_CHUNK, step, ds))
    check([CUT[ds].cuts - before[ds] for ds in (0, 1)] == [int(ds in cuts) for ds in (0, 1)],
          "one COMMIT cut in each of %s" % (cuts,))
    t = wait_end(shop, task_id)
    took = time.time() - t0
    print("  %s, COMMIT %s: ended %.1f s after its creation" % (
        step, "answer lost" if after else "lost on its way", took))
    expected = model(rows, STOCK)
    t, cs = verify(shop, tpl, task_id, rows, expected, STOCK)
    check(t["successNum"] == USERS and t["successNum"] + t["failNum"] == len(rows),
          "every user issued, every row counted once: %s" % t)
    check(sorted(c[0] for c in cs) == sorted(users), "every listed user holds one coupon")
    bad = redis_counters_bad(tpl, users)
    check(not bad, "Redis counters not 1: %d, e.g. %s" % (len(bad), bad[:3]))
    nchunks = (len(rows) + CHUNK - 1) // CHUNK
    got = sql(0, "SELECT count(*), sum(row_count), sum(issued), count(DISTINCT execution_id) "
                 "FROM t_coupon_task_chunk WHERE task_id = %s" % task_id)[0]
    check(got[:3] == [str(nchunks), str(len(rows)), str(USERS)],
          "one checkpoint per chunk: %s" % got)
    events = sql(0, "SELECT count(*) FROM t_outbox WHERE msg_key LIKE 'task.notify:%s:%%'"
                    % task_id)[0][0]
    issuing = len({(e[0] - 2) // CHUNK for e in expected if e[2] is None})
    check(events == str(issuing), "one notification event per chunk that issued: %s of %d"
          % (events, issuing))
    check(took < WITHIN_S, "the run went on: ended %.1f s after its creation (lease %d s)"
          % (took, LEASE_MS // 1000))
    started, resumed = dist_logs("run started", task_id), dist_logs("run resumed", task_id)
    check(started == 1 and resumed == 0 and got[3] == "1",
          "one run did it all: %d started, %d resumed, checkpoints by %s" % (
              started, resumed, got[3]))


def test_coupons_commit_answer_lost():
    doubt("coupons", True)


def test_coupons_commit_lost_on_its_way():
    doubt("coupons", False)


def test_stock_commit_answer_lost():
    doubt("stock", True)


def test_stock_commit_lost_on_its_way():
    doubt("stock", False)


def test_checkpoint_commit_answer_lost():
    doubt("checkpoint", True)


def test_checkpoint_commit_lost_on_its_way():
    doubt("checkpoint", False)


def main():
    td.root = tempfile.mkdtemp(prefix="quan-dist-doubt-", dir=TMP)
    CUT[0] = PgCut(dsn_port(os.environ["QUAN_DS0_DSN"]))
    CUT[1] = PgCut(dsn_port(os.environ["QUAN_DS1_DSN"]))
    env = {"QUAN_FILE_ROOT": td.root, "QUAN_DIST_CHUNK_ROWS": str(CHUNK),
           "QUAN_DIST_LEASE_MS": str(LEASE_MS),
           "QUAN_DIST_SWEEP_MS": "5000",  # a run that stopped is resumed soon after its lease
           "QUAN_LOG_LEVEL": "info"}  # the runs' start lines are counted
    try:
        td.ma = Service("merchant-admin", env).wait_ready()
        td.dist.append(Service("distribution", dict(env, **proxied_env()), replicas=1)
                       .wait_ready())
        run([test_coupons_commit_answer_lost, test_coupons_commit_lost_on_its_way,
             test_stock_commit_answer_lost, test_stock_commit_lost_on_its_way,
             test_checkpoint_commit_answer_lost, test_checkpoint_commit_lost_on_its_way])
    finally:
        for s in [td.ma] + td.dist:
            if s:
                s.stop()
        for c in CUT:
            if c:
                c.stop()
        shutil.rmtree(td.root, ignore_errors=True)


if __name__ == "__main__":
    main()
