"""Where a template's stock buckets live (common/coupon/bucket.h), asked of quan-buckets, the
tool built from the functions the services route by: tests never compute the layout again.

    keys(tpl, n)       [(hash, users, resv)] of buckets 0 .. n-1
    homes(n, users)    {user: home bucket}
    skewed(n, count, share, base)
                       count user ids from base up, share (0..1) of them with their home in
                       bucket 0, the rest elsewhere: an uneven sale
"""
import os
import subprocess

from quan import BIN

TOOL = os.path.join(BIN, "quan-buckets")
_keys = {}


def keys(tpl, n):
    if n <= 1:
        t = "quan:tpl:{%d}" % tpl
        return [(t, t + ":users", t + ":resv")]
    if (tpl, n) not in _keys:
        out = subprocess.run([TOOL, "keys", str(tpl), str(n)], check=True, capture_output=True,
                             text=True).stdout
        _keys[(tpl, n)] = [tuple(line.split()[1:4]) for line in out.splitlines()]
    return _keys[(tpl, n)]


def homes(n, users):
    users = list(users)
    if n <= 1:
        return {u: 0 for u in users}
    out = {}
    for i in range(0, len(users), 2000):
        res = subprocess.run([TOOL, "home", str(n)] + [str(u) for u in users[i:i + 2000]],
                             check=True, capture_output=True, text=True).stdout
        for line in res.splitlines():
            u, b = line.split()
            out[int(u)] = int(b)
    return out


def skewed(n, count, share, base, step=7919):
    """Walks ids base, base + step, ... keeping round(count * share) homed in bucket 0 and the
    rest homed elsewhere."""
    want0 = int(round(count * share))
    zero, other = [], []
    u = base
    while len(zero) < want0 or len(other) < count - want0:
        batch = [u + i * step for i in range(4000)]
        u += 4000 * step
        for x, b in homes(n, batch).items():
            if b == 0 and len(zero) < want0:
                zero.append(x)
            elif b != 0 and len(other) < count - want0:
                other.append(x)
    users = zero + other
    users.sort()
    return users
