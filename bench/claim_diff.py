#!/usr/bin/env python3
# bench/claim_diff.py — a variant of claim.lua against a reference copy, on random calls: the
# answers and every key afterwards must be the same. For changes to the script that must not
# change what it does (cost work, bench/script_instr.sh). Starts its own redis-server on PORT
# (no persistence); each trial writes a random template hash, users hash (counts, markers, open
# lists, some malformed or long), record set and expiries, then makes one to three calls of one
# to twelve claims (repeated users and request ids, bad arguments, other shops, other buckets,
# with and without the record set) with each script from the same state.
#   git show HEAD~1:lua-scripts/claim.lua >/tmp/old.lua
#   bench/claim_diff.py /tmp/old.lua lua-scripts/claim.lua [TRIALS] [PORT]
import collections, random, shutil, socket, subprocess, sys, tempfile, time

old_path, new_path = sys.argv[1], sys.argv[2]
trials = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
port = int(sys.argv[4]) if len(sys.argv) > 4 else 16512
tmp = tempfile.mkdtemp(prefix="quan-claimdiff.")
server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
                           "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        sock = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.05)
else:
    server.kill()
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit("claim_diff.py: redis-server did not start")
f = sock.makefile("rb")


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read():
    line = f.readline()[:-2]
    t, rest = line[:1], line[1:]
    if t == b"+":
        return rest.decode()
    if t == b"-":
        return ("ERR", rest.decode())
    if t == b":":
        return int(rest)
    if t == b"$":
        n = int(rest)
        if n < 0:
            return None
        d = f.read(n + 2)[:-2]
        return d.decode()
    if t == b"*":
        n = int(rest)
        if n < 0:
            return None
        return [read() for _ in range(n)]
    raise ValueError(line)


def cmd(*args):
    sock.sendall(enc(*args))
    return read()


old_sha = cmd("SCRIPT", "LOAD", open(old_path).read())
new_sha = cmd("SCRIPT", "LOAD", open(new_path).read())
T, U, R = "quan:tpl:{1}", "quan:tpl:{1}:users", "quan:tpl:{1}:resv"
NOW = 1800000000000


def state():
    out = {}
    for k in sorted(cmd("KEYS", "*")):
        t = cmd("TYPE", k)
        if t == "hash":
            h = cmd("HGETALL", k)
            v = sorted(zip(h[0::2], h[1::2]))
        elif t == "zset":
            v = cmd("ZRANGE", k, 0, -1, "WITHSCORES")
        else:
            v = t
        out[k] = (t, v, cmd("PEXPIRETIME", k))
    return out


def setup(rnd):
    cmd("FLUSHDB")
    end = NOW + rnd.choice([-5000, 1000, 1800000, 1800000, 7200000, 86400000, 86400000])
    fields = ["stock", rnd.choice([0, 0, 1, 2, 3, 5, 100]), "status", rnd.choice([0, 0, 0, 0, 0, 1]),
              "validStartTime", NOW + rnd.choice([-100000, -100000, -100000, -100000, 50]),
              "validEndTime", end, "shopNumber", 77]
    r = rnd.random()
    if r < 0.7:
        fields += ["limitPerPerson", rnd.choice([1, 1, 2, 3, 100]), "validityHours", 24]
    elif r < 0.85:
        fields += ["receiveRule", '{"limitPerPerson": %d}' % rnd.choice([1, 2]),
                   "consumeRule", '{"validityPeriod": 48}']
    if rnd.random() < 0.1:
        fields += ["buckets", rnd.choice(["1", "2", "01"])]
    if rnd.random() < 0.05:
        pass  # no template at all
    else:
        if rnd.random() < 0.1:
            fields = fields[:4]  # partial
        cmd("HSET", T, *fields)
    users = ["1", "2", "3", "4"]
    for u in users:
        if rnd.random() < 0.4:
            cmd("HSET", U, u, rnd.choice([0, 1, 2, 3]))
        if rnd.random() < 0.3:
            ids = rnd.sample(["r1", "r2", "r3", "x9"], rnd.randint(1, 3))
            lst = "".join("," + i for i in ids) if rnd.random() < 0.9 else "junk"
            if rnd.random() < 0.05:
                lst = "," + ",".join("q%03d" % k for k in range(70))
            cmd("HSET", U, u + "#", lst)
            for i in ids:
                if rnd.random() < 0.6:
                    cmd("ZADD", R, NOW - rnd.randint(1, 100000), u + ":" + i)
        for rid in ["r1", "r2"]:
            if rnd.random() < 0.15:
                cmd("HSET", U, u + ":" + rid, rnd.choice(["1:%d:o/1" % (NOW - 5), "2", "1:%d" % NOW]))
    if rnd.random() < 0.3:
        cmd("ZADD", R, NOW - 7, "9:zz")
    for k in (U, R):
        if rnd.random() < 0.5 and cmd("EXISTS", k):
            cmd("PEXPIREAT", k, end + rnd.choice([-10000000, 0, 5000000, 200000000]))


def one_call(rnd):
    n = rnd.choice([1, 1, 1, 2, 3, 5, 8, 12])
    args = [rnd.choice(["", "o/1"]), rnd.choice(["", "", "", "", "1", "1", "1", "2", "1.0"])]
    for _ in range(n):
        u = rnd.choice(["1", "1", "2", "3", "4"])
        if rnd.random() < 0.02:
            u = rnd.choice(["1:x", "", "a"])
        now = str(NOW + rnd.choice([0, 0, 0, 1, 2]))
        if rnd.random() < 0.02:
            now = "x"
        member = "" if rnd.random() < 0.15 else u + ":" + rnd.choice(["r1", "r2", "r3", "r4"])
        args += [now, rnd.choice(["", "0", "77", "77", "78"]), u, member]
    keys = [T, U, R] if rnd.random() < 0.85 else [T, U]
    return keys, args


hist = collections.Counter()
bad = 0
for trial in range(trials):
    draw = random.randrange(1 << 30)
    answers, states = [], []
    for sha in (old_sha, new_sha):
        rnd = random.Random(draw)
        setup(rnd)
        got = []
        for _ in range(rnd.choice([1, 2, 3])):
            keys, args = one_call(rnd)
            got.append(cmd("EVALSHA", sha, len(keys), *keys, *args))
        answers.append(got)
        if sha == new_sha:
            for g in got:
                for a in (g if isinstance(g, list) and g and isinstance(g[0], list) else [g]):
                    hist[str(a[0]) if isinstance(a, list) else str(a)[:40]] += 1
        states.append(state())
    if answers[0] != answers[1] or states[0] != states[1]:
        bad += 1
        if bad <= 3:
            print("DIFF draw", draw)
            print(" old", answers[0], states[0])
            print(" new", answers[1], states[1])
print("%d trials, %d differ" % (trials, bad))
print("answers by code:", sorted(hist.items(), key=lambda x: -x[1]))
server.terminate()
server.wait()
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if bad else 0)
