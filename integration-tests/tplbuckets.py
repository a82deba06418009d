"""A template's stock buckets as common/coupon/bucket.c lays them out, for the suites'
assertions: the keys of bucket b of n, a user's home bucket, a bucket's first share."""

M64 = (1 << 64) - 1
SLOTS = 16384


def crc16(data):
    """Redis Cluster's CRC16 (XMODEM), as common/redis/rslot.c."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def _slice(tag, n):
    return (crc16(tag.encode()) % SLOTS) * n // SLOTS


def tag(tpl_id, b, n):
    """bucket_tag: bucket 0 is the template's own; b >= 1 "<T>.<b>.<k>", k the first number
    that puts the tag in the b-th n-th of the slot space counted from bucket 0's."""
    base = str(tpl_id)
    if b <= 0 or n <= 1:
        return base
    want = (_slice(base, n) + b) % n
    for k in range(1 << 20):
        t = "%s.%d.%d" % (base, b, k)
        if _slice(t, n) == want:
            return t
    raise AssertionError("no tag for bucket %d of %d" % (b, n))


def keys(tpl_id, b, n):
    """(hash, users, resv) of bucket b of n: claim.lua's KEYS[1..3]."""
    if b <= 0 or n <= 1:
        h = "quan:tpl:{%s}" % tpl_id
    else:
        h = "quan:bkt:{%s}" % tag(tpl_id, b, n)
    return h, h + ":users", h + ":resv"


def mix64(x):
    """common's hash_mix64 (splitmix64's finaliser)."""
    x = (x + 0x9e3779b97f4a7c15) & M64
    x = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & M64
    x = ((x ^ (x >> 27)) * 0x94d049bb133111eb) & M64
    return x ^ (x >> 31)


def home(user, n):
    """bucket_home: the bucket of a user's count, markers and reservations."""
    return 0 if n <= 1 else mix64(int(user) & M64) % n


def share(stock, b, n):
    """bucket_share: stock // n, one more for the first stock % n buckets."""
    return stock if n <= 1 else stock // n + (1 if b < stock % n else 0)
