"""Direct database and Redis access for the integration tests (engine: expiry, reminders,
exchange codes; merchant-admin: tasks, code batches): psql and redis-cli against the servers
named in the environment, the reference's shard rule, template rows, and exchange codes made
like common/coupon/excode.c; the RabbitMQ queues' lengths. Standard library only."""

import hashlib
import hmac
import os
import random
import socket
import subprocess
import time

DSN = [os.environ["QUAN_DS0_DSN"], os.environ["QUAN_DS1_DSN"]]
REDIS = ["redis-cli", "-h", os.environ.get("QUAN_REDIS_HOST", "127.0.0.1"), "-p",
         os.environ["QUAN_REDIS_PORT"]]
# On a Redis Cluster (QUAN_REDIS_CLUSTER_NODES set by infra.sh) redis-cli follows MOVED and ASK
# redirections with -c; the commands below act on the keyspace of the one node they reach, so
# they run on every master and their answers are merged.
CLUSTER = bool(os.environ.get("QUAN_REDIS_CLUSTER_NODES"))
if CLUSTER:
    REDIS = REDIS + ["-c"]
# In a Sentinel deployment (QUAN_REDIS_SENTINELS set by infra.sh's sentinel topology) the
# master moves with a failover: QUAN_REDIS_PORT is only the first one, so every command goes to
# the master the sentinels name at the time (sentinel_master).
SENTINEL = bool(os.environ.get("QUAN_REDIS_SENTINELS"))
# (CLIENT is not: a client id names a connection of one node, QUAN_REDIS_PORT's.)
NODE_WIDE = {"KEYS", "FLUSHALL", "FLUSHDB", "DBSIZE", "SCAN", "INFO", "CONFIG", "SCRIPT", "ACL"}
SECRET = os.environ.get("QUAN_CODE_SECRET", "test-secret-0123456789abcdef")
ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"


def sql(ds, text):
    """Runs text on database ds; returns the rows as lists of strings."""
    out = subprocess.run(["psql", DSN[ds], "-v", "ON_ERROR_STOP=1", "-qAtX", "-F", "\t", "-c",
                          text], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError("psql: %s\n%s" % (out.stderr, text))
    return [line.split("\t") for line in out.stdout.splitlines() if line]


def psql(dsn, text):
    """Runs text on the database at dsn (a libpq URI); psql's unaligned output, stripped."""
    out = subprocess.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-At", "-c", text],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError("psql failed: %s\n%s" % (text, out.stderr))
    return out.stdout.strip()


def _redis_cli(base, args):
    out = subprocess.run(base + [str(a) for a in args], capture_output=True, text=True,
                         timeout=10)
    if out.returncode != 0:
        raise AssertionError("redis-cli: %s" % out.stderr)
    return out.stdout.strip()


def redis_masters():
    """The ports of the cluster's masters that serve slots now (CLUSTER NODES of any node)."""
    ports = []
    for line in _redis_cli(REDIS, ["CLUSTER", "NODES"]).splitlines():
        f = line.split()
        if len(f) > 8 and "master" in f[2].split(",") and "fail" not in f[2]:
            ports.append(f[1].split("@")[0].rsplit(":", 1)[1])
    return ports


def redis_node(port, *args):
    """One command on the node at port, redirections not followed."""
    base = ["redis-cli", "-h", os.environ.get("QUAN_REDIS_HOST", "127.0.0.1"), "-p", str(port)]
    return _redis_cli(base, args)


def sentinel_master():
    """(host, port) of the master the sentinels of QUAN_REDIS_SENTINELS name now, asked in turn;
    OSError when none answers with an address."""
    name = os.environ.get("QUAN_REDIS_MASTER_NAME", "quan")
    for hp in os.environ["QUAN_REDIS_SENTINELS"].split(","):
        host, _, port = hp.strip().rpartition(":")
        try:
            c = _RespConn(host, int(port), timeout=2)
        except OSError:
            continue
        try:
            r = c.pipeline([["SENTINEL", "get-master-addr-by-name", name]])[0]
        except (OSError, AssertionError):
            r = None
        finally:
            c.sock.close()
        if isinstance(r, list) and len(r) == 2:
            return r[0], int(r[1])
    raise OSError("no sentinel of %s names master %s" % (os.environ["QUAN_REDIS_SENTINELS"], name))


def redis(*args):
    if SENTINEL:
        host, port = sentinel_master()
        return _redis_cli(["redis-cli", "-h", host, "-p", str(port)], args)
    if not CLUSTER or str(args[0]).upper() not in NODE_WIDE:
        return _redis_cli(REDIS, args)
    outs = [redis_node(p, *args) for p in redis_masters()]
    cmd = str(args[0]).upper()
    if cmd == "DBSIZE":
        return str(sum(int(o or 0) for o in outs))
    if len(set(outs)) == 1:  # OK, a script's sha, a setting: the same from every master
        return outs[0]
    return "\n".join(o for o in outs if o)


def kill_redis_clients(flag):
    """Kills every connection whose CLIENT LIST flags hold flag ("t": a tracked reader, "P": an
    invalidation subscriber), on every master in the cluster; how many. A service process has
    one such connection per master."""
    killed = 0
    ports = (redis_masters() if CLUSTER else
             [sentinel_master()[1]] if SENTINEL else [os.environ["QUAN_REDIS_PORT"]])
    for port in ports:
        for line in redis_node(port, "CLIENT", "LIST").splitlines():
            f = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
            if flag in f.get("flags", ""):
                killed += int(redis_node(port, "CLIENT", "KILL", "ID", f["id"]) or 0)
    return killed


def redis_masters_count():
    return len(redis_masters()) if CLUSTER else 1


def _cli_quote(arg):
    """arg as one redis-cli argument on its standard input: quoted, its \\ and " escaped."""
    return '"%s"' % str(arg).replace("\\", "\\\\").replace('"', '\\"')


def redis_pipe(commands):
    """Runs many commands (lists of arguments, sent as they are) through one redis-cli;
    returns its output."""
    if CLUSTER:
        # redis-cli -c follows redirections per command only when given them one at a time.
        return "".join(redis(*c) + "\n" for c in commands)
    text = "".join(" ".join(_cli_quote(a) for a in c) + "\n" for c in commands)
    out = subprocess.run(REDIS, input=text, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise AssertionError("redis-cli: %s" % out.stderr)
    return out.stdout


def rabbitmqctl(*args):
    """rabbitmqctl of the test servers (QUAN_INFRA_RABBITMQCTL); its stdout."""
    return subprocess.run([os.environ["QUAN_INFRA_RABBITMQCTL"]] + list(args), capture_output=True,
                          text=True, timeout=60, check=True).stdout


def queue_messages():
    """{queue name: messages in it, ready and unacked alike} from rabbitmqctl list_queues. A
    classic queue's count is current; a quorum queue's (the cluster topology) is the one its
    node last published, up to collect_statistics_interval (5 s) old."""
    out = rabbitmqctl("list_queues", "-q", "name", "messages")
    return {f[0]: int(f[1]) for f in (line.split() for line in out.splitlines())
            if len(f) == 2 and f[1].isdigit()}


def shard_index(v, n):
    """common/pg/shard.c: abs((int32)(v ^ (v >>> 32))) % n, INT_MIN staying INT_MIN."""
    u = v & 0xFFFFFFFFFFFFFFFF
    h = (u ^ (u >> 32)) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    t = abs(h)
    if t == 1 << 31:
        return 0
    return t % n


def user_coupon_table(user_id):
    idx = shard_index(user_id, 32)
    return idx // 16, "t_user_coupon_%d" % idx


def db_coupons(users, tpl):
    """{user: [(id, receive_count, status)]} of template tpl: one psql per database."""
    by_table = {}
    for u in users:
        by_table.setdefault(user_coupon_table(u), []).append(u)
    out = {u: [] for u in users}
    for ds in (0, 1):
        parts = ["SELECT user_id, id, receive_count, status FROM %s WHERE coupon_template_id = %d "
                 "AND user_id IN (%s)" % (table, tpl, ",".join(map(str, us)))
                 for (d, table), us in by_table.items() if d == ds]
        if not parts:
            continue
        for uid, cid, cnt, st in sql(ds, " UNION ALL ".join(parts)):
            out[int(uid)].append((int(cid), int(cnt), int(st)))
    return out


def template_table(shop):
    idx = shard_index(shop, 16)
    return idx // 8, "t_coupon_template_%d" % idx


def new_shop():
    """A random shop number, so that suites running together never share a shop."""
    return random.randint(10 ** 15, 10 ** 17)


def make_merchant_template(shop, name, status=0, ended=False):
    """A template row of shop for the merchant-admin suites, valid for 30 more days (or ended an
    hour ago); returns its id."""
    tid = random.randint(10 ** 15, 10 ** 17)
    ds, table = template_table(shop)
    end = "now() - interval '1 hour'" if ended else "now() + interval '30 days'"
    psql(DSN[ds], "INSERT INTO %s (id, name, shop_number, source, target, type, valid_start_time,"
         " valid_end_time, stock, receive_rule, consume_rule, status) VALUES (%d, '%s',"
         " %d, 0, 1, 0, now() - interval '2 days', %s, 100, '{\"limitPerPerson\":1}',"
         " '{\"termsOfUse\":0,\"maximumDiscountAmount\":5,\"validityPeriod\":24}', %d)"
         % (table, tid, name, shop, end, status))
    return tid


_last_id = 0


def new_id():
    """A unique positive int64 for test rows: time in ms, pid and a counter, strictly increasing
    within a process (random low bits collided when many ids were made in one millisecond)."""
    global _last_id
    candidate = int(time.time() * 1000) << 20 | (os.getpid() & 0x3FF) << 10
    _last_id = max(_last_id + 1, candidate)
    return _last_id


def make_code(r):
    """common/coupon/excode.c: 30 random bits, then the first 20 bits of
    HMAC-SHA256(secret, "quan.excode.v1" || r as 4 big-endian bytes); 5 bits a character,
    most significant first."""
    r &= (1 << 30) - 1
    mac = hmac.new(SECRET.encode(), b"quan.excode.v1" + r.to_bytes(4, "big"),
                   hashlib.sha256).digest()
    check = int.from_bytes(mac[:3], "big") >> 4
    v = r << 20 | check
    return "".join(ALPHABET[(v >> (5 * (9 - i))) & 31] for i in range(10))


def insert_template(shop, tpl_id, start_ms, end_ms, stock=100, limit=1, status=0,
                    name="test template"):
    ds, table = template_table(shop)
    sql(ds, "INSERT INTO %s (id, name, shop_number, source, target, goods, type, "
            "valid_start_time, valid_end_time, stock, receive_rule, consume_rule, status) "
            "VALUES (%d, '%s', %d, 0, 1, NULL, 0, to_timestamp(%f), to_timestamp(%f), %d, "
            "'{\"limitPerPerson\": %d, \"usageInstructions\": \"t\"}', "
            "'{\"termsOfUse\": 0, \"maximumDiscountAmount\": 10, "
            "\"explanationOfUnmetConditions\": \"x\", \"validityPeriod\": 48}', %d)"
        % (table, tpl_id, name, shop, start_ms / 1000.0, end_ms / 1000.0, stock, limit, status))
    return ds, table


def metric(text, name, **labels):
    """Value of one series of a Prometheus text page (0 when absent)."""
    want = ",".join('%s="%s"' % kv for kv in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if series == name and not want:
            return float(value)
        if series.startswith(name + "{"):
            got = ",".join(sorted(series[len(name) + 1:-1].split(",")))
            if got == want:
                return float(value)
    return 0.0


class RespError(str):
    """An error reply (a str, so that a test may compare it)."""


class Resp:
    """A minimal pipelining RESP client (the standard library only; redis-cli per key is too
    slow for hundreds of keys). On a Redis Cluster a MOVED or ASK reply sends that command
    again to the node it names, and KEYS runs on every master."""

    def __init__(self, port=None):
        self.host = os.environ.get("QUAN_REDIS_HOST", "127.0.0.1")
        if SENTINEL and port is None:
            self.host, self.port = sentinel_master()
        else:
            self.port = int(port or os.environ["QUAN_REDIS_PORT"])
        self.conns = {}

    def close(self):
        for c in self.conns.values():
            c.sock.close()
        self.conns = {}

    def _conn(self, addr):
        if addr not in self.conns:
            self.conns[addr] = _RespConn(*addr)
        return self.conns[addr]

    def __call__(self, *args):
        if CLUSTER and str(args[0]).upper() == "KEYS":
            out = []
            for p in redis_masters():
                out += self._conn((self.host, int(p))).pipeline([list(args)])[0] or []
            return out
        return self.pipeline([list(args)])[0]

    def _seed(self):
        """The first node, or in a cluster whose first node is down (a fault test killed it)
        the next that answers."""
        nodes = [(self.host, self.port)]
        if CLUSTER:
            for hp in os.environ["QUAN_REDIS_CLUSTER_NODES"].split(","):
                host, _, port = hp.strip().rpartition(":")
                nodes.append((host, int(port)))
        for i, addr in enumerate(nodes):
            try:
                return self._conn(addr)
            except OSError:
                if i == len(nodes) - 1:
                    raise

    def pipeline(self, cmds):
        replies = self._seed().pipeline(cmds)
        for _ in range(5):  # a slot moving while we ask moves at most a few times
            again = {}
            for i, r in enumerate(replies):
                if isinstance(r, RespError) and r.split(" ", 1)[0] in ("MOVED", "ASK"):
                    host, _, port = r.split()[2].rpartition(":")
                    again.setdefault((host, int(port), r.startswith("ASK")), []).append(i)
            if not again:
                break
            for (host, port, ask), idx in again.items():
                conn = self._conn((host, port))
                if ask:  # ASK: the next command only, after ASKING
                    for i in idx:
                        replies[i] = conn.pipeline([["ASKING"], cmds[i]])[1]
                else:
                    for i, r in zip(idx, conn.pipeline([cmds[i] for i in idx])):
                        replies[i] = r
        return replies


class _RespConn:
    def __init__(self, host, port, timeout=10):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""

    def pipeline(self, cmds):
        """A thousand commands at a time: each batch written at once (joined, not added up:
        adding bytes copies them all each time), then its replies read."""
        replies = []
        for i in range(0, len(cmds), 1000):
            part = cmds[i:i + 1000]
            out = []
            for c in part:
                out.append(b"*%d\r\n" % len(c))
                for a in c:
                    a = a if isinstance(a, bytes) else str(a).encode()
                    out.append(b"$%d\r\n%s\r\n" % (len(a), a))
            self.sock.sendall(b"".join(out))
            replies += [self.read() for _ in part]
        return replies

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("redis: connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read(self):
        line = self.line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RespError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise AssertionError("redis: connection closed")
                self.buf += chunk
            v, self.buf = self.buf[:n], self.buf[n + 2:]
            return v.decode(errors="replace")
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise AssertionError("bad RESP: %r" % line)
