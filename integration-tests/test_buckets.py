"""Stock buckets (common/coupon/bucket.h) on the suite's own Redis, one server or the
three-master cluster: tools/bench-buckets runs a sale at the Redis layer, the claim script at
each user's home bucket, transfers and the sold-out verdict when a home is dry, and exits 1
unless the sale sold exactly its stock (counts, units left or on their way, the limit).
On the cluster the three buckets lie on three masters, so every transfer crosses masters."""

import os
import subprocess
import time

from quan import BIN, check, run

TOOL = os.path.join(BIN, "quan-bench-buckets")


def sale(mode, tpl, n, stock, users, threads, skew=None, env=None):
    args = [TOOL, mode, str(tpl), str(n), str(stock), str(users), str(threads)]
    if skew is not None:
        args.append(str(skew))
    out = subprocess.run(args, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **(env or {})))
    return out.returncode, out.stdout + out.stderr


def fields(out):
    """accepted, refused, doubts of the tool's line."""
    w = out.split()
    return int(w[w.index("accepted") + 1]), int(w[w.index("refused") + 1]), \
        int(w[w.index("doubts") + 1])


def tpl_id(n):
    return int(time.time() * 1000) % 100000000 * 10 + n  # fresh keys each run


def test_one_bucket_sells_exactly():
    rc, out = sale("sale", tpl_id(1), 1, 600, 1200, 4)
    check(rc == 0, "exact sale: %s" % out)
    check(fields(out)[:2] == (600, 600), "600 sold, 600 told no: %s" % out)


def test_three_buckets_with_most_users_in_one_sell_to_the_last_unit():
    # 80 % of the users share bucket 0, which holds a third of the stock: it empties first and
    # pulls the rest from the others; nobody hears "sold out" while a unit is anywhere
    rc, out = sale("sale", tpl_id(2), 3, 900, 1800, 6, skew=80)
    check(rc == 0, "exact sale: %s" % out)
    check(fields(out)[:2] == (900, 900), "900 sold, 900 told no: %s" % out)


def test_killed_in_a_transfer_the_next_process_finishes_it():
    tpl = tpl_id(3)
    rc, out = sale("sale", tpl, 3, 600, 1200, 4, skew=90,
                   env={"QUAN_BENCH_BUCKETS_DIE_AFTER_GIVE": "1"})
    check(rc == -9 and "dying" in out, "died in the middle of a transfer: %s %s" % (rc, out))
    # the same users again: those with a coupon are refused by the limit, the units the dead
    # process had on their way are found and finished (after a transfer's life, meanwhile "in
    # doubt", never "sold out"), and the sale ends exact
    rc, out = sale("resume", tpl, 3, 600, 1200, 4, skew=90)
    check(rc == 0, "exact after the crash: %s" % out)
    check(fields(out)[2] > 0, "in doubt while the dead transfer was young: %s" % out)


def test_the_suites_layout_is_the_services():
    """tplbuckets.py (the suites' reading of a bucketed template) against bucket.c itself."""
    import tplbuckets
    tool = os.path.join(BIN, "quan-buckets")
    for tpl, n in ((123, 1), (123, 3), (987654321012345678, 7), (5, 64)):
        out = subprocess.run([tool, "keys", str(tpl), str(n)], capture_output=True, text=True,
                             check=True).stdout.split("\n")
        want = [tuple(line.split()[1:]) for line in out if line]
        got = [tplbuckets.keys(tpl, b, n) for b in range(n)]
        check(got == want, "bucket keys of %d/%d: %s against %s" % (tpl, n, got[:3], want[:3]))
    users = [1, 2, 3, 7919, 10 ** 12 + 17, 2 ** 62 + 5]
    for n in (1, 2, 3, 64):
        out = subprocess.run([tool, "home", str(n)] + [str(u) for u in users],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        want = {int(a): int(b) for a, b in (line.split() for line in out if line)}
        got = {u: tplbuckets.home(u, n) for u in users}
        check(got == want, "home buckets among %d: %s against %s" % (n, got, want))


if __name__ == "__main__":
    run([test_one_bucket_sells_exactly,
         test_three_buckets_with_most_users_in_one_sell_to_the_last_unit,
         test_killed_in_a_transfer_the_next_process_finishes_it,
         test_the_suites_layout_is_the_services])
