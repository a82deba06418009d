"""The chaos suite: the platform's three promises under one fault at a time, tried as an operator
would. A flash sale runs (CHAOS_STOCK coupons, CHAOS_USERS users, CHAOS_CLIENTS client threads
on keep-alive connections that retry refused connections, 503s and 429s with backoff and the
SAME requestId), and after CHAOS_FAULT_AT answers one process is killed with SIGKILL (or Redis
comes back empty), then started again. Once everything settled (CHAOS_SETTLE_S at most), the
promises are checked through the API, the databases and Redis:

  never more coupons than stock     Redis stock = DB stock; coupons = initial - DB stock
  never more than the limit a user  DB coupons per user <= limit; Redis counters = coupons
  never a "yes" that is lost        every 200 userCouponId and every SUCCESS result is a row;
                                    every 202 settles; no user locked out by a lost claim

The restore drill (s_restore) kills everything instead, restores the databases to a point in
time from a base backup and runs quan-recover, then checks the same promises against the
restored state and lists what the restore lost.

Run by integration-tests/chaos/run.sh, which starts durable servers (as `make up` does) and
exports their addresses and QUAN_CHAOS_INFRA_DIR. CHAOS_SCENARIOS (comma list) picks scenarios;
the default is every scenario. One "ok"/"FAIL" line per check; the last
line is "N passed, N failed". Standard library only."""

import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import tplbuckets  # noqa: E402
from engine_db import Resp, sentinel_master, sql, template_table  # noqa: E402
from quan import (BIN, GATEWAY_ROUTES, ROOT, TMP, free_port, start_gateway,  # noqa: E402
                  stop_gateway, stop_process, token_for)
from stats_truth import stats_mismatches  # noqa: E402

INFRA = os.environ["QUAN_CHAOS_INFRA_DIR"]
INFRA_SH = os.path.join(ROOT, "deploy", "local", "infra.sh")
LOGS = os.path.join(TMP, "logs")
FILES = os.path.join(TMP, "files")
PIDS = os.path.join(TMP, "services.pids")  # run.sh stops what is left of these
TOPOLOGY = os.environ.get("QUAN_TOPOLOGY", "single")
REPLICAS = 2 if TOPOLOGY == "cluster" else 1


def env_int(name, default):
    return int(os.environ.get(name, default))


STOCK = env_int("CHAOS_STOCK", 1500)
USERS = env_int("CHAOS_USERS", 3000)
CLIENTS = env_int("CHAOS_CLIENTS", 32)
FAULT_AT = env_int("CHAOS_FAULT_AT", 750)
SETTLE_S = env_int("CHAOS_SETTLE_S", 120)
DOWN_S = float(os.environ.get("CHAOS_DOWN_S", "1"))  # the victim is down this long
DIST_ROWS = env_int("CHAOS_DIST_ROWS", 40000)
LIMIT = 1
RETRY_S = 60  # a client retries refused connections and 503s this long
BUSY_S = 10   # and "still in progress" (429) this long, then gives up
SECOND_EVERY = 5  # every 5th user who got a coupon tries again (a new requestId): B000101
# Every BARE_EVERY-th user's client is like most API clients: no requestId (the contract makes
# it optional), and broken connections, 429 and 503 retried for BARE_RETRY_S, then it gives up.
BARE_EVERY = 2
BARE_RETRY_S = 10
# Claims whose outcome was in doubt when the fault ended are settled within DOUBT_TARGET_S; the
# check allows DOUBT_MAX_S on a loaded machine and reports the figure either way.
DOUBT_TARGET_S = 5.0
DOUBT_MAX_S = float(os.environ.get("CHAOS_DOUBT_MAX_S", "8"))
# Where Redis lost claim state (restarted empty, a replica promoted), nothing is settled before
# the engines' rebuild, which first waits out every claim in flight (QUAN_REGEN_SETTLE_MS).
REBUILD_S = 11.0

DEFAULT = ["engine-sync", "engine-mq", "rabbitmq-mq", "postgres-sync", "postgres-mq",
           "distribution", "merchant-admin", "redis-empty-mq", "restore", "engine-mq-buckets",
           "redis-empty-mq-buckets", "engine-mq-relayout"]
# The cluster topology's faults: one part of it fails while the rest carries on. (The whole
# engine killed, distribution and merchant-admin as above; the single-server faults do not
# apply: there each store is several servers.)
CLUSTER_DEFAULT = ["engine-replica-sync", "engine-replica-mq", "redis-failover-sync",
                   "redis-failover-mq", "redis-reshard-sync", "redis-reshard-mq",
                   "rabbitmq-node-mq", "postgres-server-sync", "postgres-server-mq",
                   "engine-mq", "distribution", "merchant-admin", "engine-replica-mq-buckets",
                   "redis-failover-mq-buckets", "engine-replica-mq-relayout"]
# The sentinel topology's fault: the Redis master killed, a replica promoted by the sentinels.
SENTINEL_DEFAULT = ["redis-sentinel-sync", "redis-sentinel-mq"]

EN = "/api/engine"
MA = "/api/merchant-admin"

# ---------------------------------------------------------------- checks

_passed = 0
_failed = 0
_scenario = "setup"
_failures = []  # (scenario, what, detail): recapped before the last line


def check(cond, what, detail=""):
    """One invariant: an "ok" or "FAIL" line naming the scenario; detail (why) when it failed."""
    global _passed, _failed
    if cond:
        _passed += 1
        print("ok   %s: %s" % (_scenario, what), flush=True)
    else:
        _failed += 1
        _failures.append((_scenario, what, detail))
        print("FAIL %s: %s" % (_scenario, what), flush=True)
        if detail:
            print("     %s" % detail, flush=True)
    return bool(cond)


def note(text):
    print("     %s" % text, flush=True)


def sample(xs, n=5):
    xs = list(xs)
    return "%d, e.g. %s" % (len(xs), xs[:n])


# ---------------------------------------------------------------- the services

class Replica:
    """One quan-<name> process on a fixed port: killed and started again on the same port, its
    log appended to (a line marks each start)."""

    def __init__(self, name, env, index):
        self.name = name
        self.port = free_port()
        self.env = env
        self.proc = None
        suffix = ".%d" % index if REPLICAS > 1 else ""
        self.log_path = os.path.join(LOGS, name + suffix + ".log")

    def start(self):
        e = dict(os.environ)
        e.update({"QUAN_HTTP_PORT": str(self.port), "QUAN_HTTP_BIND": "127.0.0.1",
                  "QUAN_LUA_DIR": os.path.join(ROOT, "lua-scripts")})
        e.update(self.env)
        with open(self.log_path, "ab") as log:
            log.write(b'{"chaos":"started at %s"}\n' % time.strftime("%H:%M:%S").encode())
            log.flush()
            self.proc = subprocess.Popen([os.path.join(BIN, "quan-" + self.name)], env=e,
                                         stdout=log, stderr=subprocess.STDOUT)
        with open(PIDS, "a") as f:
            f.write("%s %d\n" % (self.name, self.proc.pid))
        return self

    def ready(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/readyz")
                ok = c.getresponse().status == 200
                c.close()
                if ok:
                    return True
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.1)
        return False

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc is not None:
            stop_process(self.proc, 30)

    def mark(self):
        """Where the log ends now: problems() reads from here."""
        try:
            self.log_mark = os.path.getsize(self.log_path)
        except OSError:
            self.log_mark = 0

    def problems(self, out):
        """Adds to out {(level, msg): count} the warn and error lines written since mark()."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(getattr(self, "log_mark", 0))
                for raw in f:
                    if b'"level":"warn"' not in raw and b'"level":"error"' not in raw:
                        continue
                    try:
                        d = json.loads(raw)
                    except ValueError:
                        continue
                    # One kind per message whatever its numbers (ports, ids, delays).
                    k = (d.get("level"), re.sub(r"[0-9]+", "N", d.get("msg", ""))[:160])
                    out[k] = out.get(k, 0) + 1
        except OSError:
            pass

    def tail(self, pattern):
        try:
            with open(self.log_path, "rb") as f:
                return [ln.decode(errors="replace").rstrip() for ln in f
                        if pattern.encode() in ln]
        except OSError:
            return []


class Svc:
    """A service: one replica, or in the cluster topology REPLICAS of them and, for the services
    a client calls, a gateway in front (port is where a client connects: the gateway's, or the
    one replica's). Killing "the service" kills every replica; kill_service(name, one=True) one
    of them."""

    def __init__(self, name, env):
        self.name = name
        self.replicas = [Replica(name, env, i) for i in range(REPLICAS)]
        self.gateway = None
        if REPLICAS > 1 and name in GATEWAY_ROUTES:
            self.gateway = start_gateway(name, [r.port for r in self.replicas])
        self.port = self.gateway["port"] if self.gateway else self.replicas[0].port

    def start(self):
        for r in self.replicas:
            if not r.alive():
                r.start()
        return self

    def ready(self, timeout=60):
        return all([r.ready(timeout) for r in self.replicas])

    def alive(self):
        return all(r.alive() for r in self.replicas)

    def exits(self):
        return ",".join(str(r.proc.returncode) for r in self.replicas if not r.alive())

    def kill9(self):
        for r in self.replicas:
            r.kill9()

    def stop(self):
        for r in self.replicas:
            r.stop()
        if self.gateway:
            stop_gateway(self.gateway)
            self.gateway = None

    def mark(self):
        for r in self.replicas:
            r.mark()

    def problems(self):
        """{(level, msg): count} of the warn and error lines written since mark()."""
        out = {}
        for r in self.replicas:
            r.problems(out)
        return out

    def tail(self, pattern, n=8):
        """The last n lines of the logs holding pattern (a plain substring)."""
        return sum((r.tail(pattern) for r in self.replicas), [])[-n:]


SVC = {}
FIGURES = {}  # scenario -> what a user was told, per sale (printed at the end)


def start_services():
    os.makedirs(LOGS, exist_ok=True)
    os.makedirs(FILES, exist_ok=True)
    files = {"QUAN_FILE_ROOT": FILES}
    SVC["merchant-admin"] = Svc("merchant-admin", files)
    SVC["engine"] = Svc("engine", {})
    SVC["settlement"] = Svc("settlement", {})
    SVC["distribution"] = Svc("distribution", files)
    for s in SVC.values():
        s.start()
    for s in SVC.values():
        if not s.ready():
            last = []
            for r in s.replicas:
                with open(r.log_path, errors="replace") as f:
                    last += f.readlines()[-12:]
            raise AssertionError("quan-%s did not start (exit %s); see %s; its last lines:\n%s"
                                 % (s.name, s.exits(), LOGS, "".join(last)))


def ensure_services():
    """Before a scenario: every service runs and is ready (one that died is started again, and
    the scenario that killed it has reported it)."""
    for s in SVC.values():
        if not s.alive():
            note("quan-%s was not running (exit %s); started again" % (s.name, s.exits()))
            s.start()
        s.ready()


# ---------------------------------------------------------------- the servers

def infra_pid(name):
    pid = None
    with open(os.path.join(INFRA, "pids")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0] == name:
                pid = int(parts[1])
    return pid


def pid_alive(pid):
    """Exists and is not a zombie (this machine's PID 1 does not always reap)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def proc_tree(pid):
    """pid and all its descendants."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def kill_server(name):
    """kill -9 of a server infra.sh started and of every process it had (PostgreSQL's backends,
    RabbitMQ's Erlang VM): what a crash of the machine's process leaves."""
    pid = infra_pid(name)
    if pid is None or not pid_alive(pid):
        raise AssertionError("%s is not running" % name)
    tree = proc_tree(pid)
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Gone, not only dead: PostgreSQL refuses to start while the old postmaster's pid exists,
    # and a zombie's does until PID 1 reaps it (here, a second or two later).
    deadline = time.time() + 30
    while any(os.path.exists("/proc/%d" % p) for p in tree) and time.time() < deadline:
        time.sleep(0.05)


def start_servers():
    """infra.sh start: whatever is not running comes back, on the same ports (the environment
    names them) and with make up's durable settings."""
    env = dict(os.environ)
    env.pop("QUAN_INFRA_DURABILITY", None)
    for attempt in range(3):
        out = subprocess.run([INFRA_SH, "start", INFRA], env=env, capture_output=True,
                             text=True, timeout=180)
        if out.returncode == 0:
            return
        time.sleep(2)
    raise AssertionError("infra.sh start failed 3 times:\n%s" % out.stderr[-2000:])


# ---------------------------------------------------------------- HTTP

class Conn:
    """A keep-alive HTTP/1.1 connection to one service (its port survives restarts), opened
    again after any error."""

    def __init__(self, svc, timeout=20):
        self.svc = svc
        self.timeout = timeout
        self.c = None

    def close(self):
        if self.c:
            self.c.close()
            self.c = None

    def call(self, method, path, body=None, headers=None):
        """(status, parsed JSON or None); OSError or HTTPException when nothing was answered."""
        if self.c is None:
            self.c = http.client.HTTPConnection("127.0.0.1", self.svc.port, timeout=self.timeout)
        h = dict(headers or {})
        if self.svc.gateway:  # as the API gateway's clients: a token, not identity headers
            token = token_for(h)
            if token:
                h = {k: v for k, v in h.items() if not k.lower().startswith("x-")}
                h["Authorization"] = "Bearer " + token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        try:
            self.c.request(method, path, body=data, headers=h)
            r = self.c.getresponse()
            raw = r.read()
            if r.will_close:
                self.close()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, None


def code_of(js):
    return js.get("code") if isinstance(js, dict) else None


def backoff(attempt):
    time.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)) * random.uniform(0.5, 1.0))


def api(svc, method, path, body=None, headers=None, budget=RETRY_S):
    """Setup and inspection calls: retried while refused, reset or 503/429, up to budget
    seconds; (status, JSON) of the last answer, or (0, None)."""
    c = Conn(SVC[svc])
    deadline = time.time() + budget
    attempt = 0
    try:
        while True:
            try:
                st, js = c.call(method, path, body, headers)
                # a GET is safe to repeat after the gateway's 502/504 too
                if st not in (429, 503) and not (method == "GET" and st in (502, 504)):
                    return st, js
            except (OSError, http.client.HTTPException):
                st, js = 0, None
            if time.time() > deadline:
                return st, js
            backoff(attempt)
            attempt += 1
    finally:
        c.close()


def user_hdr(user):
    return {"X-User-Id": str(user)}


def shop_hdr(shop):
    return {"X-User-Id": "1", "X-Shop-Number": str(shop)}


def new_shop():
    return random.randint(10 ** 15, 10 ** 17)


def new_users(n):
    base = random.randint(10 ** 10, 9 * 10 ** 13)
    step = random.choice([7919, 7927, 7933])
    return [base + i * step for i in range(n)]


def template_body(stock, name, buckets=1):
    fmt = "%Y-%m-%d %H:%M:%S"
    body = {"name": name, "source": 0, "target": 1, "type": 0,
            "validStartTime": time.strftime(fmt, time.localtime(time.time() - 2 * 86400)),
            "validEndTime": time.strftime(fmt, time.localtime(time.time() + 30 * 86400)),
            "stock": stock, "receiveRule": {"limitPerPerson": LIMIT},
            "consumeRule": {"termsOfUse": 0, "maximumDiscountAmount": 5, "validityPeriod": 48}}
    if buckets > 1:
        body["stockBuckets"] = buckets
    return body


TPL_BUCKETS = {}  # template -> its stock buckets (absent: 1)


def create_template(shop, stock, name="chaos", buckets=1):
    st, js = api("merchant-admin", "POST", MA + "/coupon-template/create",
                 template_body(stock, "%s %x" % (name, random.getrandbits(32)), buckets),
                 shop_hdr(shop))
    if st != 200:
        raise AssertionError("template create: %s %s" % (st, js))
    tpl = int(js["data"]["id"])
    TPL_BUCKETS[tpl] = buckets
    return tpl


def write_sheet(users, name):
    path = os.path.join(FILES, name)
    with open(path, "w") as f:
        f.write("userId\n")
        f.writelines("%d\n" % u for u in users)
    return path


def find_task(shop, task_id):
    st, js = api("merchant-admin", "GET", MA + "/coupon-task/find?taskId=%s" % task_id, None,
                 shop_hdr(shop), budget=10)
    return js["data"] if st == 200 else None


# ---------------------------------------------------------------- the stores

def redis_cmds(cmds):
    """Pipelined (one redis-cli per key would take minutes)."""
    r = Resp()
    try:
        return r.pipeline(cmds)
    finally:
        r.close()


def tpl_buckets(tpl):
    """[(hash, users, resv)] of the template's stock buckets (one for most templates)."""
    n = TPL_BUCKETS.get(tpl, 1)
    return [tplbuckets.keys(tpl, b, n) for b in range(n)]


def redis_stock(tpl):
    """The template's stock in Redis: every bucket's, and the units on their way from one bucket
    to another (a donor's "xo:<transfer>" = "k:home:time"); None while a bucket is missing."""
    bks = tpl_buckets(tpl)
    if len(bks) == 1:
        v = redis_cmds([["HGET", bks[0][0], "stock"]])[0]
        return int(v) if v is not None else None
    total = 0
    for h in redis_cmds([["HGETALL", k[0]] for k in bks]):
        if isinstance(h, str):
            raise AssertionError(h)
        f = dict(zip(h[0::2], h[1::2])) if h else {}
        if "stock" not in f:
            return None
        total += int(f["stock"]) + sum(int(v.split(":")[0]) for k, v in f.items()
                                       if k.startswith("xo:"))
    return total


def redis_counters(tpl, users):
    """Each user's count, in the users hash of the user's home bucket."""
    bks = tpl_buckets(tpl)
    vals = redis_cmds([["HGET", bks[tplbuckets.home(u, len(bks))][1], str(u)] for u in users])
    return {u: int(v or 0) for u, v in zip(users, vals)}


def db_stock(shop, tpl):
    ds, table = template_table(shop)
    rows = sql(ds, "SELECT stock FROM %s WHERE id = %d" % (table, tpl))
    return int(rows[0][0]) if rows else None


def db_coupons(where):
    """Every user coupon matching where (SQL over t_user_coupon_N), both databases:
    [(user, coupon id, request id, template)]."""
    out = []
    for ds in (0, 1):
        q = " UNION ALL ".join(
            "SELECT user_id, id, coalesce(request_id, ''), coupon_template_id FROM "
            "t_user_coupon_%d WHERE %s" % (t, where) for t in range(16 * ds, 16 * ds + 16))
        out += [(int(u), int(i), r, int(t)) for u, i, r, t in sql(ds, q)]
    return out


def stock_state(shop, tpl, stock0):
    """(Redis stock, DB stock, coupons in the DB), or None while a store does not answer."""
    try:
        return (redis_stock(tpl), db_stock(shop, tpl),
                len(db_coupons("coupon_template_id = %d" % tpl)))
    except (AssertionError, OSError):
        return None


def stock_holds(state, stock0):
    return state is not None and state[0] == state[1] and state[2] == stock0 - state[1]


def wait_stock(shop, tpl, stock0, deadline, since):
    """Polls until Redis stock = DB stock and coupons = stock taken, or the deadline; the last
    state and the seconds from since (the end of the load) to it."""
    state = stock_state(shop, tpl, stock0)
    while not stock_holds(state, stock0) and time.time() < deadline:
        time.sleep(1)
        state = stock_state(shop, tpl, stock0)
    return state, time.time() - since


def check_stock(shop, tpl, stock0, state, waited, what=""):
    if state is None:
        return check(False, "the stores answer after the fault%s" % what)
    rs, ds, n = state
    check(rs == ds, "Redis stock = DB stock%s" % what,
          "Redis %s, DB %s, %.0f s after the load ended" % (rs, ds, waited))
    check(n == stock0 - ds, "coupons in the DB = initial stock - DB stock%s" % what,
          "%d coupons, stock %d -> %s" % (n, stock0, ds))
    check(n <= stock0 and ds >= 0 and (rs is None or rs >= 0),
          "never more coupons than stock%s" % what,
          "%d coupons of %d, DB stock %s, Redis stock %s" % (n, stock0, ds, rs))


# ---------------------------------------------------------------- the flash sale

class Sale:
    """A flash sale: every user claims once on CLIENTS threads, and every SECOND_EVERY-th user
    who got a coupon once more, which the limit must refuse. Two kinds of client:

      with a requestId (c<tag>-<user>-<n>), as a careful client: a refused or broken connection,
      a 503 or a 429 is retried with the same requestId, with backoff, up to RETRY_S (BUSY_S for
      "still in progress"), then it gives up;
      bare (every BARE_EVERY-th user): no requestId, as most API clients: a broken connection, a
      429, a 502/503/504 is retried (a new claim each time, as far as the engine knows) for
      BARE_RETRY_S, then it gives up. Its claims are keyed b<tag>-<user>-<n> here.

    outcomes: key -> (user, kind, coupon id, code, request id, in doubt), kind "coupon" (200),
    "accepted" (202), "refused" (409/404), "gave-up", "error" (other); the request id is the
    client's, or for a bare 202 the one the engine answered; in doubt: some attempt ended
    without a definitive answer (a broken connection, a 502/503/504), so the claim may have
    made a coupon the client was not told of."""

    def __init__(self, tag, shop, tpl, users, mq):
        self.tag, self.shop, self.tpl, self.users, self.mq = tag, shop, tpl, users, mq
        self.bare = set(users[1::BARE_EVERY])
        self.outcomes = {}
        self.answers = 0  # HTTP answers received, retries included: the fault's clock
        self.retries = 0
        self.lock = threading.Lock()
        self.next = 0
        self.abort = False  # the fault could not start the victim again: stop retrying
        self.threads = []
        self.t0 = self.t1 = None
        self.figures = {}  # what users were told, once checked (check_sale)

    def rid(self, user, n):
        return "c%s-%d-%d" % (self.tag, user, n)

    def key(self, user, n):
        return ("b%s-%d-%d" if user in self.bare else "c%s-%d-%d") % (self.tag, user, n)

    def claim(self, conn, user, rid, mq=None):
        """One claim (rid None: a bare client's) until a definitive answer or the client gives
        up; the outcome tuple described above."""
        mq = self.mq if mq is None else mq
        bare = rid is None
        path = EN + ("/user-coupon/redeem-mq" if mq else "/user-coupon/redeem")
        body = {"source": 0, "shopNumber": str(self.shop), "couponTemplateId": str(self.tpl)}
        if not bare:
            body["requestId"] = rid
        start = time.time()
        busy_since = None
        attempt = 0
        last = None
        doubt = False
        while True:
            try:
                st, js = conn.call("POST", path, body, user_hdr(user))
            except ConnectionRefusedError as e:  # nothing was sent
                st, js, last = 0, None, type(e).__name__
            except (OSError, http.client.HTTPException) as e:
                st, js, last = 0, None, type(e).__name__
                doubt = True
            else:
                with self.lock:
                    self.answers += 1
                code = code_of(js)
                last = "%s %s" % (st, code)
                if st == 200:
                    return user, "coupon", int(js["data"]["userCouponId"]), code, rid, doubt
                if st == 202:
                    return user, "accepted", None, code, js["data"]["requestId"], doubt
                if st in (404, 409):
                    return user, "refused", None, code, rid, doubt
                # 502/504: the gateway's replica died or stalled with the claim in flight; the
                # same requestId makes the retry safe.
                if st not in (429, 502, 503, 504):
                    msg = js.get("message") if isinstance(js, dict) else None
                    return user, "error", None, "%s (%s)" % (last, msg), rid, doubt
                if st != 429:
                    doubt = True
            now = time.time()
            if st == 429:
                busy_since = busy_since or now
            else:
                busy_since = None
            if bare:
                over = now - start > BARE_RETRY_S
            else:
                over = now - start > RETRY_S or (busy_since and now - busy_since > BUSY_S)
            if over or self.abort:
                return user, "gave-up", None, last, rid, doubt
            with self.lock:
                self.retries += 1
            backoff(attempt)
            attempt += 1

    def worker(self):
        conn = Conn(SVC["engine"])
        while True:
            with self.lock:
                if self.next >= len(self.users):
                    break
                user = self.users[self.next]
                self.next += 1
            bare = user in self.bare
            out = self.claim(conn, user, None if bare else self.rid(user, 1))
            with self.lock:
                self.outcomes[self.key(user, 1)] = out
            if out[1] in ("coupon", "accepted") and user % SECOND_EVERY == 0:
                out2 = self.claim(conn, user, None if bare else self.rid(user, 2))
                with self.lock:
                    self.outcomes[self.key(user, 2)] = out2
        conn.close()

    def start(self):
        self.t0 = time.time()
        self.threads = [threading.Thread(target=self.worker, daemon=True)
                        for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def join(self):
        for t in self.threads:
            t.join()
        self.t1 = time.time()

    def wait_answers(self, n):
        while self.answers < n and any(t.is_alive() for t in self.threads):
            time.sleep(0.01)

    def kinds(self, bare=None):
        """{kind: count} over the outcomes (bare: only those of bare clients, or of the
        others)."""
        out = {}
        for key, o in self.outcomes.items():
            if bare is not None and key.startswith("b") != bare:
                continue
            k = o[1] if o[1] != "refused" else "refused %s" % o[3]
            out[k] = out.get(k, 0) + 1
        return out


def pmap(fn, items, threads=16):
    """fn(item) for each item on a few threads, each with its own engine connection; results
    in the order of items."""
    items = list(items)
    out = [None] * len(items)
    lock = threading.Lock()
    pos = [0]

    def work():
        conn = Conn(SVC["engine"])
        while True:
            with lock:
                i = pos[0]
                pos[0] += 1
            if i >= len(items):
                break
            out[i] = fn(conn, items[i])
        conn.close()

    ts = [threading.Thread(target=work, daemon=True)
          for _ in range(min(threads, max(1, len(items))))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def read_result(conn, user, rid):
    """The claim's result: ("SUCCESS", coupon id) / ("FAILED", reason) / ("PENDING", None) /
    ("404", None) / ("unanswered", what)."""
    try:
        st, js = conn.call("GET", EN + "/user-coupon/redeem-result?requestId=" + rid, None,
                           user_hdr(user))
    except (OSError, http.client.HTTPException) as e:
        return "unanswered", type(e).__name__
    if st == 404:
        return "404", None
    if st != 200:
        return "unanswered", "%s %s" % (st, code_of(js))
    d = js["data"]
    if d["status"] == "SUCCESS":
        return "SUCCESS", int(d["userCouponId"])
    return d["status"], d.get("reason")


def settle_results(sale, deadline):
    """Polls the result of every accepted MQ claim (by the request id it was accepted under)
    until all are SUCCESS or FAILED, or the deadline: {outcome key: last result}."""
    results = {}
    todo = [(key, o[0], o[4]) for key, o in sale.outcomes.items() if o[1] == "accepted"]
    while todo:
        got = pmap(lambda c, t: read_result(c, t[1], t[2]), todo)
        for t, r in zip(todo, got):
            results[t[0]] = r
        todo = [t for t, r in zip(todo, got) if r[0] not in ("SUCCESS", "FAILED")]
        if not todo or time.time() > deadline:
            break
        time.sleep(1)
    return results


def check_sale(sale, results, state, waited, watch=None):
    """The promises for one sale, once settled (state: wait_stock's; watch: the DoubtWatch of
    the fault's end, if any)."""
    tpl, shop, users = sale.tpl, sale.shop, sale.users
    note("sale %s: %d users (%d bare), %.1f s, %d retries" % (
        "mq" if sale.mq else "sync", len(users), len(sale.bare), sale.t1 - sale.t0,
        sale.retries))
    for bare in (False, True):
        note("  %s: %s" % ("bare clients" if bare else "clients with a requestId", ", ".join(
            "%s %d" % kv for kv in sorted(sale.kinds(bare).items()))))
    if sale.mq:
        unsettled = {k: r for k, r in results.items() if r[0] not in ("SUCCESS", "FAILED")}
        check(not unsettled, "every accepted (202) claim settled, SUCCESS or FAILED",
              "unsettled: %s" % sample(sorted((k, r[0]) for k, r in unsettled.items())))
    coupons = db_coupons("coupon_template_id = %d" % tpl)
    by_id = {c[1]: c for c in coupons}
    said_yes = {k: o[2] for k, o in sale.outcomes.items() if o[1] == "coupon"}
    if sale.mq:
        said_yes.update({k: r[1] for k, r in results.items() if r[0] == "SUCCESS"})
    # A bare client never learns a synchronous coupon's request id: its coupon must be the
    # user's; every other one must carry the request id it was claimed with.
    lost = sorted(k for k, cid in said_yes.items()
                  if cid not in by_id or by_id[cid][0] != sale.outcomes[k][0]
                  or (sale.outcomes[k][4] and by_id[cid][2] != sale.outcomes[k][4]))
    check(not lost, "every coupon answered yes (200 userCouponId%s) is in the DB" % (
        ", 202 read SUCCESS" if sale.mq else ""), "lost: %s" % sample(lost))
    check_stock(shop, tpl, STOCK, state, waited)
    # The template's statistics (kept by the databases' triggers with each coupon) equal its
    # rows, whatever was killed meanwhile.
    m = stats_mismatches([tpl])
    check(not m, "the template's statistics equal its coupon rows", "; ".join(m))
    held = {}
    for c in coupons:
        held[c[0]] = held.get(c[0], 0) + 1
    over = sorted(u for u, n in held.items() if n > LIMIT)
    check(not over, "no user holds more than the limit (%d) in the DB" % LIMIT,
          "over: %s" % sample(over))
    try:
        counters = redis_counters(tpl, users)
    except (AssertionError, OSError) as e:
        counters = None
        check(False, "Redis answers", str(e))
    if counters is not None:
        below = sorted(u for u in users if counters[u] < held.get(u, 0))
        check(not below, "no Redis counter below the user's coupons (the limit holds)",
              "user: counter/coupons %s" % sample(["%d: %d/%d" % (u, counters[u], held[u])
                                                   for u in below]))
        locked = sorted(u for u in users if counters[u] > held.get(u, 0))
        check(not locked, "no user locked out: Redis counter <= coupons held",
              "user: counter/coupons %s" % sample(["%d: %d/%d" % (u, counters[u],
                                                                  held.get(u, 0))
                                                   for u in locked]))
    # A coupon nobody was told about is fine (the answer was lost); one whose claim was told
    # "no" (refused, FAILED) or that no client asked for is not. A bare client's coupon carries
    # a request id the engine made: it belongs to the user's claims, which must not all have
    # been answered no.
    def not_no(k, o):
        return (o[1] in ("coupon", "gave-up", "error") or o[5]
                or (o[1] == "accepted" and results.get(k, ("",))[0] != "FAILED"))
    by_rid = {o[4]: (k, o) for k, o in sale.outcomes.items() if o[4]}
    bare_maybe = {o[0] for k, o in sale.outcomes.items() if k.startswith("b") and not_no(k, o)}
    phantom = []
    for c in coupons:
        if c[2] in by_rid:
            if not not_no(*by_rid[c[2]]):
                phantom.append("%s (%s)" % (c[2], by_rid[c[2]][1][1:4:2]))
        elif not (c[0] in sale.bare and c[0] in bare_maybe):
            phantom.append("%s (user %d: %s)" % (c[2], c[0], "no such claim"
                                                 if c[0] not in sale.bare else "all answered no"))
    check(not phantom, "every coupon in the DB belongs to a claim not answered no",
          "coupons of claims answered no: %s" % sample(sorted(phantom)))

    # A "no" is final to every client: it must be a settled fact.
    limit_told = {o[0] for o in sale.outcomes.values()
                  if o[1] == "refused" and o[3] == "B000101"}
    false_limit = sorted(u for u in limit_told if held.get(u, 0) == 0)
    check(not false_limit, "no user answered B000101 (limit reached) holds no coupon at the end",
          "%s" % sample(["%d (%s)" % (u, "bare" if u in sale.bare else "requestId")
                         for u in false_limit]))
    sold_out_told = sum(1 for o in sale.outcomes.values()
                        if o[1] == "refused" and o[3] == "B000100")
    unsold = state[1] if state is not None else None
    check(sold_out_told == 0 or unsold == 0,
          "nobody answered B000100 (sold out) while stock was left at the end (zero under-sell)",
          "%d answered sold out, %s of %d stock unsold" % (sold_out_told, unsold, STOCK))
    sale.figures = {"false_limit": len(false_limit), "unsold": unsold,
                    "sold_out_told": sold_out_told}
    if watch is not None:
        watch.report()
        sale.figures["doubt_s"] = watch.settled

    # During the fault a client sees only answers it can retry with the same requestId.
    errors = sorted((k, o[3]) for k, o in sale.outcomes.items() if o[1] == "error")
    check(not errors, "only retryable errors during the fault (refused or broken connections, "
          "429, 502, 503, 504)", "other answers: %s" % sample(errors))

    # What a client sees afterwards (these claim again, so they come after the counts above).
    # A bare client that gave up has no request id to ask with.
    gave_up = sorted((o[0], k) for k, o in sale.outcomes.items()
                     if o[1] == "gave-up" and not k.startswith("b"))
    if gave_up:
        again = pmap(lambda c, ur: retry_later(c, sale, ur[0], ur[1]), gave_up)
        open_ = [(rid, a) for (u, rid), a in zip(gave_up, again) if not a[0]]
        check(not open_, "every claim the client gave up on has an answer now (same requestId)",
              "still without one: %s" % sample(["%s: %s" % (rid, a[1]) for rid, a in open_]))
    probe_locked_out(sale)


class DoubtWatch:
    """How long the claims in doubt when the fault ended took to settle: the template's
    reservations open at that moment (quan:tpl:{T}:resv: claims reserved in Redis whose coupon
    or give-back has not happened, MQ claims queued and not yet written) are read, then polled
    every 100 ms until none of them is left. settled: seconds from the fault's end, or None if
    they were not all settled within CHAOS_SETTLE_S."""

    def __init__(self, tpl, rebuild=False):
        self.keys = [k[2] for k in tpl_buckets(tpl)]  # every bucket's
        self.open = None
        self.settled = None
        self.thread = None
        self.rebuild = rebuild  # Redis lost claim state: the rebuild's wait comes first

    def members(self):
        out = set()
        for key, r in zip(self.keys, redis_cmds([["ZRANGE", k, 0, -1] for k in self.keys])):
            if isinstance(r, str):  # an error reply
                raise AssertionError(r)
            out.update((key, m) for m in r or [])
        return out

    def start(self):
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        t_end = time.time()
        deadline = t_end + SETTLE_S
        first = None
        while first is None and time.time() < deadline:
            try:
                first = self.members()
            except (AssertionError, OSError):
                time.sleep(0.1)
        if first is None:
            return
        self.open = len(first)
        while time.time() < deadline:
            try:
                if not first & self.members():
                    self.settled = time.time() - t_end
                    return
            except (AssertionError, OSError):
                pass
            time.sleep(0.1)

    def report(self):
        if self.thread:
            self.thread.join()
        if self.open is None:
            check(False, "the claims in doubt at the fault's end could be read (Redis)")
            return
        fig = "%.1f s" % self.settled if self.settled is not None else "not within %d s" % (
            SETTLE_S)
        extra = REBUILD_S if self.rebuild else 0.0
        note("claims in doubt at the fault's end: %d, all settled %s after it (target %.0f s%s)"
             % (self.open, fig, DOUBT_TARGET_S + extra,
                ", after the rebuild's wait of %.0f s" % extra if extra else ""))
        check(self.settled is not None and self.settled <= DOUBT_MAX_S + extra,
              "the claims in doubt at the fault's end settled within %.0f s (target %.0f s%s)" % (
                  DOUBT_MAX_S + extra, DOUBT_TARGET_S + extra,
                  ", the rebuild's wait included" if extra else ""),
              "%d open at the fault's end, settled %s" % (self.open, fig))


def retry_later(conn, sale, user, rid):
    """(definitive, what) for a claim the client gave up on, asked again with its requestId."""
    out = sale.claim(conn, user, rid)
    if out[1] in ("coupon", "refused"):
        return True, out[1]
    if out[1] == "accepted":
        deadline = time.time() + 15
        r = read_result(conn, user, rid)
        while r[0] not in ("SUCCESS", "FAILED") and time.time() < deadline:
            time.sleep(0.5)
            r = read_result(conn, user, rid)
        return r[0] in ("SUCCESS", "FAILED"), "202, then %s" % r[0]
    return False, "%s (%s)" % (out[1], out[3])


def probe_locked_out(sale):
    """Every user holding no coupon claims again with a new requestId once the merchant added
    as much stock as there are such users: nobody may be refused with B000101. (Who holds one
    is read again: the retries of given-up claims just before may have made coupons.)"""
    held = set(c[0] for c in db_coupons("coupon_template_id = %d" % sale.tpl))
    empty = [u for u in sale.users if u not in held]
    if not empty:
        return
    st, js = api("merchant-admin", "POST", MA + "/coupon-template/increase-number",
                 {"couponTemplateId": str(sale.tpl), "number": len(empty)}, shop_hdr(sale.shop))
    if not check(st == 200, "the merchant adds stock after the sale", "%s %s" % (st, js)):
        return
    outs = pmap(lambda c, u: sale.claim(c, u, sale.rid(u, 9), mq=False), empty, CLIENTS)
    refused = sorted(o[0] for o in outs if o[1] == "refused" and o[3] == "B000101")
    kinds = {}
    for o in outs:
        k = o[1] if o[1] != "refused" else "refused %s" % o[3]
        kinds[k] = kinds.get(k, 0) + 1
    check(not refused, "no user without a coupon is refused 'limit reached' (new requestId, "
          "stock added)", "refused B000101: %s; all answers %s" % (sample(refused), kinds))


# ---------------------------------------------------------------- faults

class Fault:
    """One fault (action: kill, then start again), run on its own thread once a sale has n
    answers, or by the scenario itself; when it came and how long the victim took to be back."""

    def __init__(self, name, action):
        self.name = name
        self.action = action
        self.error = None
        self.at = None
        self.answers = None
        self.back_after = None
        self.thread = None
        self.on_end = None  # called once the victim is back

    def run(self):
        try:
            self.at = time.time()
            self.action()
            self.back_after = time.time() - self.at
            if self.on_end:
                self.on_end()
        except Exception as e:  # noqa: BLE001 - reported as a check by the scenario
            self.error = "%s: %s" % (type(e).__name__, e)

    def after_answers(self, sale, n):
        def go():
            sale.wait_answers(n)
            self.answers = sale.answers
            self.run()
            if self.error:
                sale.abort = True
        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def join(self):
        if self.thread:
            self.thread.join()

    def report(self, t0):
        ok = check(self.error is None and self.at is not None,
                   "%s, then started again" % self.name, self.error or "the fault never ran")
        if ok:
            note("fault at +%.1f s (%d answers); back after %.1f s" % (
                self.at - t0, self.answers or 0, self.back_after))
        return ok


def kill_service(name, one=False):
    """kill -9 of quan-<name> (one: of its first replica only, the gateway sending the rest to
    the other); DOWN_S later the same binary, environment and port again."""
    def action():
        s = SVC[name]
        if one:
            s.replicas[0].kill9()
        else:
            s.kill9()
        time.sleep(DOWN_S)
        s.start()
        if not s.ready():
            raise AssertionError("quan-%s not ready after the restart" % name)
    return action


def relayout_then_kill(buckets, one=False):
    """The sale's template changed to buckets stock buckets by the merchant (202: the change is
    under way), then, while the engines' re-layout closes the old buckets and waits for the claims
    in flight on them, kill -9 of quan-engine (one: of one replica); DOWN_S later started again.
    Whoever comes next finishes the re-layout, and the sale goes on on the new number."""
    kill = kill_service("engine", one)

    def action():
        tpl = HOT["tpl"]
        st, js = api("merchant-admin", "POST", MA + "/coupon-template/change-buckets",
                     {"couponTemplateId": str(tpl), "stockBuckets": buckets},
                     shop_hdr(HOT["shop"]))
        if st != 202:
            raise AssertionError("change-buckets: %s %s" % (st, js))
        TPL_BUCKETS[tpl] = buckets  # the checks read the new layout's keys
        time.sleep(1.5)  # a re-layout tick (1 s) has closed the buckets and waits
        kill()
    return action


def check_relayout_over(shop, tpl):
    """The change of buckets is over: the row no longer names one under way, and the template's
    own hash (written last by the re-layout) says the new number."""
    st, js = api("merchant-admin", "GET", MA + "/coupon-template/find?couponTemplateId=%d" % tpl,
                 None, shop_hdr(shop))
    data = (js or {}).get("data") or {}
    n = TPL_BUCKETS[tpl]
    check(st == 200 and data.get("stockBuckets") == n and
          "stockBucketsChangingFrom" not in data,
          "the change to %d stock buckets is over in the database" % n, "%s %s" % (st, data))
    got = redis_cmds([["HGET", tpl_buckets(tpl)[0][0], "buckets"]])[0]
    check(got == str(n), "the re-layout wrote the template's hash on %d buckets" % n,
          "buckets field: %r" % got)


def kill_infra(name, empty=False):
    """kill -9 of a server (empty: Redis' files removed too); DOWN_S later infra.sh start."""
    def action():
        kill_server(name)
        if empty:  # what a Redis that lost its disk (or a failover to an empty replica) is
            d = os.path.join(INFRA)
            shutil.rmtree(os.path.join(d, "appendonlydir"), ignore_errors=True)
            for f in ("appendonly.aof", "dump.rdb"):
                if os.path.exists(os.path.join(d, f)):
                    os.unlink(os.path.join(d, f))
        time.sleep(DOWN_S)
        start_servers()
    return action


# ---------------------------------------------------------------- the cluster's faults

RCLUSTER_SH = os.path.join(ROOT, "deploy", "local", "rcluster.sh")
HOT = {}  # the template the running sale claims from (its hash tag decides the slot)


def hot_slot():
    return int(redis_cmds([["CLUSTER", "KEYSLOT", "quan:tpl:{%d}" % HOT["tpl"]]])[0])


def slot_master(slot):
    """(port, node id) of the master serving slot now, from CLUSTER SLOTS of a node that
    answers."""
    for start, end, master, *_ in redis_cmds([["CLUSTER", "SLOTS"]])[0]:
        if start <= slot <= end:
            return int(master[1]), master[2]
    raise AssertionError("no master serves slot %d" % slot)


def node(port, *cmd):
    r = Resp(port)
    try:
        return r.pipeline([list(cmd)])[0]
    finally:
        r.close()


def redis_master_failover():
    """kill -9 of the Redis master serving the sale's slot; its replica is promoted (the
    cluster's own failover, cluster-node-timeout 2 s); DOWN_S after the promotion the killed
    node starts again and rejoins as the new master's replica."""
    def action():
        slot = hot_slot()
        port, _ = slot_master(slot)
        out = subprocess.run([RCLUSTER_SH, "kill", os.environ["QUAN_INFRA_RCLUSTER_DIR"],
                              str(port)], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError("rcluster.sh kill: %s" % out.stderr[-500:])
        deadline = time.time() + 30
        while True:
            try:
                now = slot_master(slot)[0]
            except (AssertionError, OSError):
                now = port
            if now != port:
                break
            if time.time() > deadline:
                raise AssertionError("slot %d not served by another master in 30 s" % slot)
            time.sleep(0.2)
        note("slot %d: master %d killed, its replica %d promoted" % (slot, port, now))
        time.sleep(DOWN_S)
        start_servers()
    return action


def redis_move_slot():
    """The sale's slot moved to another master while claims run, as `redis-cli --cluster
    reshard` moves each slot (IMPORTING on the target, MIGRATING on the source, MIGRATE of its
    keys, SETSLOT NODE everywhere), but only that slot and a few keys at a time, so that the
    claims meet it half-moved: ASK redirections and TRYAGAIN for scripts whose keys are split."""
    def action():
        slot = hot_slot()
        src, src_id = slot_master(slot)
        masters = {}
        for start, end, master, *_ in redis_cmds([["CLUSTER", "SLOTS"]])[0]:
            masters[int(master[1])] = master[2]
        dst = sorted(p for p in masters if p != src)[0]
        dst_id = masters[dst]
        for port, cmd in ((dst, ["IMPORTING", src_id]), (src, ["MIGRATING", dst_id])):
            r = node(port, "CLUSTER", "SETSLOT", slot, *cmd)
            if r != "OK":
                raise AssertionError("SETSLOT %s on %d: %s" % (cmd[0], port, r))
        moved = 0
        while True:
            keys = node(src, "CLUSTER", "GETKEYSINSLOT", slot, 20)
            if not keys:
                break
            r = node(src, "MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
            if r not in ("OK", "NOKEY"):
                raise AssertionError("MIGRATE: %s" % r)
            moved += len(keys)
            time.sleep(0.02)
        for port in masters:
            r = node(port, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            if r != "OK":
                raise AssertionError("SETSLOT NODE on %d: %s" % (port, r))
        note("slot %d moved from %d to %d, %d keys" % (slot, src, dst, moved))
    return action


RSENTINEL_SH = os.path.join(ROOT, "deploy", "local", "rsentinel.sh")


def sentinel_failover():
    """kill -9 of the Redis master under Sentinel; the sentinels agree it is down (1 s without
    an answer, two of three) and promote its replica, which the services follow; DOWN_S after
    the promotion the killed server starts again (infra.sh start) and the sentinels make it the
    new master's replica. Replication is asynchronous: the promoted replica may lack the
    master's last writes, which the engines' rebuild from the databases makes good."""
    def action():
        _, port = sentinel_master()
        HOT["old_master"] = port
        out = subprocess.run([RSENTINEL_SH, "kill", os.environ["QUAN_INFRA_RSENTINEL_DIR"],
                              str(port)], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise AssertionError("rsentinel.sh kill: %s" % out.stderr[-500:])
        t0 = time.time()
        deadline = t0 + 30
        while True:
            try:
                now = sentinel_master()[1]
            except OSError:
                now = port
            if now != port:
                break
            if time.time() > deadline:
                raise AssertionError("the sentinels named no new master within 30 s")
            time.sleep(0.1)
        note("master %d killed; the sentinels promoted %d after %.1f s" % (
            port, now, time.time() - t0))
        time.sleep(DOWN_S)
        start_servers()
    return action


def check_rebuilt_on_new_master(old_port):
    """After a failover under Sentinel: the engines took the promoted replica for a Redis that
    may have lost writes (its run id is not the one quan:gen names) and rebuilt the claim state
    from the databases on it; quan:gen now names the new master's run id."""
    told = {msg for (_, msg) in SVC["engine"].problems()}
    check(any("rebuilding the Redis claim state" in m for m in told) and
          any("Redis claim state rebuilt" in m for m in told),
          "the engine rebuilt the claim state from the databases after the failover",
          "its warn lines: %s" % sorted(told)[:12])
    try:
        host, port = sentinel_master()
        r = Resp(port)
        try:
            info, gen = r.pipeline([["INFO", "server"], ["GET", "quan:gen"]])
        finally:
            r.close()
        run = re.search(r"run_id:([0-9a-f]{40})", info).group(1)
    except (OSError, AssertionError, AttributeError) as e:
        return check(False, "quan:gen names the new master's run id", "%s" % e)
    check(port != old_port and (gen or "").startswith(run + ":"),
          "quan:gen names the new master's run id (the generation rebuilt there)",
          "master %s:%d (was %d), run id %s, quan:gen %r" % (host, port, old_port, run, gen))


def check_services():
    """Every service still runs (a dependency's crash must not take one down) and is ready."""
    dead = [n for n, s in SVC.items() if not s.alive()]
    check(not dead, "all four services still run after the fault",
          "exited: %s" % ", ".join("quan-%s (%s)" % (n, SVC[n].exits()) for n in dead))
    unready = [n for n, s in SVC.items() if s.alive() and not s.ready(30)]
    check(not unready, "all four services ready again (/readyz)", "not ready: %s" % unready)


# ---------------------------------------------------------------- scenarios

# The faults after which Redis no longer holds the claim state it acknowledged.
REDIS_LOSS = ("redis-empty-mq", "redis-failover-sync", "redis-failover-mq",
              "redis-sentinel-sync", "redis-sentinel-mq", "redis-empty-mq-buckets",
              "redis-failover-mq-buckets")


def claims_scenario(tag, mq, fault_name, action, buckets=1, skew=None):
    """A sale of STOCK to USERS (twice the stock) with the fault; on a template of buckets stock
    buckets, skew (0..1) of the users with their home in one bucket (uneven: that bucket's
    users need stock moved to it, under the fault)."""
    began = time.time()
    shop = new_shop()
    users = new_users(USERS)
    if skew is not None:
        users = tplbuckets.skewed(buckets, USERS, skew, users[0])
    HOT["shop"] = shop
    tpl = HOT["tpl"] = create_template(shop, STOCK, "sale " + tag, buckets)
    sale = Sale(tag, shop, tpl, users, mq)
    fault = Fault(fault_name, action)
    watch = DoubtWatch(tpl, rebuild=_scenario in REDIS_LOSS)
    fault.on_end = watch.start
    sale.start()
    fault.after_answers(sale, FAULT_AT)
    sale.join()
    fault.join()
    fault.report(sale.t0)
    deadline = time.time() + SETTLE_S
    results = settle_results(sale, deadline) if mq else {}
    state, waited = wait_stock(shop, tpl, STOCK, deadline, sale.t1)
    note("settled in %.0f s" % (time.time() - sale.t1))
    check_services()
    check_sale(sale, results, state, waited, watch if watch.thread else None)
    if _scenario.endswith("-relayout"):
        check_relayout_over(shop, tpl)
    if _scenario.startswith("redis-sentinel-") and "old_master" in HOT:
        check_rebuilt_on_new_master(HOT.pop("old_master"))
    check_told_once_a_second(time.time() - began)
    FIGURES[_scenario] = sale.figures


# Failures that repeat while a store is down (per shared transaction, drain batch, sweep round,
# connection and backoff step) and are told at most once a second per process and limit: (the
# services (None: every one), a part of the message ("^": its start), how many limits a process
# has for it).
REPEATED_FAILURES = (
    (("engine",), "transaction failed; nothing of it was written", 1),
    (("engine",), "claimq: batch transaction failed", 2),   # one per database
    (("engine",), "resv: cannot settle", 3),                 # reservations per database; exchanges
    (None, "^ds_N: connect failed", 2),                       # one per database name
)


def check_told_once_a_second(secs):
    """A restarted process starts its limits anew: a second's slack each side."""
    for names, part, limits in REPEATED_FAILURES:
        told = allowed = 0
        for name in names or list(SVC):
            svc = SVC.get(name)
            if not svc:
                continue
            told += sum(n for (_, msg), n in svc.problems().items()
                        if (msg.startswith(part[1:]) if part[0] == "^" else part in msg))
            allowed += limits * (secs + 2) * len(svc.replicas)
        check(told <= allowed, "told at most once a second: " + part,
              "%d lines in %.0f s (at most %.0f)" % (told, secs, allowed))


def log_summary():
    """What the services complained about during the scenario (warn and error lines, the most
    frequent first), for whoever reads a failure."""
    for s in SVC.values():
        probs = sorted(s.problems().items(), key=lambda kv: -kv[1])
        for (level, msg), n in probs[:3]:
            note("quan-%s %s x%d: %s" % (s.name, level, n, msg))
        if len(probs) > 3:
            note("quan-%s: %d other kinds of warn/error lines" % (s.name, len(probs) - 3))


def create_task(shop, tpl, path):
    body = {"taskName": "chaos %x" % random.getrandbits(32), "fileAddress": path,
            "notifyType": "0", "couponTemplateId": str(tpl), "sendType": 0}
    st, js = api("merchant-admin", "POST", MA + "/coupon-task/create", body, shop_hdr(shop))
    if st != 200:
        raise AssertionError("task create: %s %s" % (st, js))
    return int(js["data"]["id"])


def wait_task(shop, task_id, deadline):
    t = find_task(shop, task_id)
    while (t is None or t["status"] in (0, 1)) and time.time() < deadline:
        time.sleep(0.5)
        t = find_task(shop, task_id)
    return t


def check_task(task_id, users, t, what=""):
    """A finished task of a sheet of distinct new users (stock enough for all)."""
    rows = len(users)
    check(t is not None and t["status"] == 3, "the task succeeded (status 3)%s" % what,
          "task %s: %s" % (task_id, t and {k: t.get(k) for k in (
              "status", "processedRows", "successNum", "failNum", "failReason")}))
    if t is None:
        return
    check(t["successNum"] + t["failNum"] == rows and t["sendNum"] == rows,
          "successNum + failNum = rows%s" % what, "%s + %s of %d rows (sendNum %s)" % (
              t["successNum"], t["failNum"], rows, t["sendNum"]))
    cs = db_coupons("request_id LIKE 'dist/%d:%%'" % task_id)
    per = {}
    for c in cs:
        per[c[0]] = per.get(c[0], 0) + 1
    want = set(users)
    bad = sorted(u for u in want if per.get(u, 0) != 1) + sorted(set(per) - want)
    check(not bad and len(cs) == t["successNum"],
          "each listed user holds exactly one coupon of the task%s" % what,
          "%d coupons, successNum %s; users with other than one: %s" % (
              len(cs), t["successNum"], sample(["%d: %d" % (u, per.get(u, 0)) for u in bad])))


def s_distribution():
    """kill -9 of quan-distribution while it runs a task of DIST_ROWS rows (a sale of sync
    claims runs beside it on another template); it is started again."""
    tag = "ds%x" % random.getrandbits(20)
    shop = new_shop()
    users = new_users(USERS)
    tpl = create_template(shop, STOCK, "sale " + tag)
    dtpl = create_template(shop, DIST_ROWS, "push " + tag)
    dusers = new_users(DIST_ROWS)
    path = write_sheet(dusers, "%s.csv" % tag)
    sale = Sale(tag, shop, tpl, users, False)
    killed_at = {}

    def action():
        task_id = killed_at["task"] = create_task(shop, dtpl, path)
        deadline = time.time() + 60
        while time.time() < deadline:
            t = find_task(shop, task_id)
            if t and t["status"] != 1:
                raise AssertionError("the task ended before the kill: %s" % t)
            if t and t["processedRows"] > 0:
                killed_at["rows"] = t["processedRows"]
                break
            time.sleep(0.02)
        else:
            raise AssertionError("no progress in 60 s")
        kill_service("distribution")()

    fault = Fault("kill -9 quan-distribution mid-task", action)
    sale.start()
    fault.after_answers(sale, FAULT_AT // 2)
    sale.join()
    fault.join()
    if fault.report(sale.t0):
        note("killed after %d of %d rows" % (killed_at["rows"], DIST_ROWS))
    deadline = time.time() + SETTLE_S
    task_id = killed_at.get("task")
    t = wait_task(shop, task_id, deadline) if task_id else None
    if t:
        note("task ended %.0f s after the sale" % (time.time() - sale.t1))
    dstate, dwaited = wait_stock(shop, dtpl, DIST_ROWS, deadline, sale.t1)
    state, waited = wait_stock(shop, tpl, STOCK, deadline, sale.t1)
    check_services()
    if task_id:
        check_task(task_id, dusers, t)
        check_stock(shop, dtpl, DIST_ROWS, dstate, dwaited, " (task's template)")
        try:
            counters = redis_counters(dtpl, dusers)
            bad = [u for u in dusers if counters[u] != 1]
            check(not bad, "the listed users' Redis counters are 1",
                  "%s" % sample(["%d: %d" % (u, counters[u]) for u in bad]))
        except (AssertionError, OSError) as e:
            check(False, "Redis answers", str(e))
    check_sale(sale, {}, state, waited)
    FIGURES[_scenario] = sale.figures
    for line in SVC["distribution"].tail("resumed", 2):
        note("quan-distribution: %s" % line[:240])


def s_merchant_admin():
    """kill -9 of quan-merchant-admin while merchants create templates (8 threads) and tasks
    (4 threads: a template, then a task of a 300-row sheet on it); it is started again. A
    create whose connection broke is not retried (it has no idempotency key): its outcome is
    unknown, and whatever it left must be whole."""
    tag = "ma%x" % random.getrandbits(20)
    shop = new_shop()
    lock = threading.Lock()
    made = {"tpl_ok": [], "tpl_unknown": 0, "task_ok": [], "task_unknown": 0, "answers": 0,
            "sheets": {}, "abort": False}
    per_thread_tpl, per_thread_task, task_rows = 40, 6, 300
    total = 8 * per_thread_tpl + 4 * per_thread_task * 2

    def create(conn, path, body):
        """("ok", id) / ("unknown", why) / ("no", answer): refused connections and 503s are
        retried (nothing was done), anything else is not."""
        start = time.time()
        attempt = 0
        while True:
            try:
                st, js = conn.call("POST", MA + path, body, shop_hdr(shop))
            except ConnectionRefusedError:
                st, js = 0, None
            except (OSError, http.client.HTTPException) as e:
                return "unknown", type(e).__name__
            else:
                with lock:
                    made["answers"] += 1
                if st == 200:
                    return "ok", int(js["data"]["id"])
                if st == 429 and code_of(js) == "A000409":
                    return "unknown", "duplicate submit"
                if st in (502, 504):  # the gateway's replica died with it in flight
                    return "unknown", "%s from the gateway" % st
                if st not in (429, 503):
                    return "no", "%s %s" % (st, code_of(js))
            if time.time() - start > RETRY_S or made["abort"]:
                return "unknown", "gave up"
            backoff(attempt)
            attempt += 1

    def templates():
        conn = Conn(SVC["merchant-admin"])
        for _ in range(per_thread_tpl):
            r = create(conn, "/coupon-template/create",
                       template_body(100, "tpl %s %x" % (tag, random.getrandbits(32))))
            with lock:
                if r[0] == "ok":
                    made["tpl_ok"].append(r[1])
                else:
                    made["tpl_unknown"] += 1
        conn.close()

    def tasks():
        conn = Conn(SVC["merchant-admin"])
        for _ in range(per_thread_task):
            r = create(conn, "/coupon-template/create",
                       template_body(task_rows, "task tpl %s %x" % (tag, random.getrandbits(32))))
            if r[0] != "ok":
                with lock:
                    made["tpl_unknown"] += 1
                continue
            with lock:
                made["tpl_ok"].append(r[1])
            users = new_users(task_rows)
            path = write_sheet(users, "%s-%x.csv" % (tag, random.getrandbits(32)))
            with lock:
                made["sheets"][path] = users
            body = {"taskName": "chaos %x" % random.getrandbits(32), "fileAddress": path,
                    "notifyType": "0", "couponTemplateId": str(r[1]), "sendType": 0}
            t = create(conn, "/coupon-task/create", body)
            with lock:
                if t[0] == "ok":
                    made["task_ok"].append(t[1])
                else:
                    made["task_unknown"] += 1
        conn.close()

    # On the cluster topology one replica: the gateway sends the rest to the other.
    one = REPLICAS > 1
    fault = Fault("kill -9 %squan-merchant-admin" % ("one replica of " if one else ""),
                  kill_service("merchant-admin", one=one))
    t0 = time.time()
    threads = [threading.Thread(target=templates, daemon=True) for _ in range(8)]
    threads += [threading.Thread(target=tasks, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()

    def trigger():
        while made["answers"] < total // 4 and any(t.is_alive() for t in threads):
            time.sleep(0.01)
        fault.answers = made["answers"]
        fault.run()
        made["abort"] = fault.error is not None
    ft = threading.Thread(target=trigger, daemon=True)
    ft.start()
    for t in threads:
        t.join()
    ft.join()
    fault.report(t0)
    note("creates: %d templates answered 200, %d tasks answered 200, %d template and %d task "
         "creates without an answer, in %.1f s" % (len(made["tpl_ok"]), len(made["task_ok"]),
                                                   made["tpl_unknown"], made["task_unknown"],
                                                   time.time() - t0))
    deadline = time.time() + SETTLE_S
    ds, table = template_table(shop)
    tasks_db = {}

    def tasks_ended():
        rows = sql(0, "SELECT id, coupon_template_id, file_address, status FROM t_coupon_task "
                      "WHERE shop_number = %d" % shop)
        tasks_db.clear()
        tasks_db.update({int(i): (int(t), f, int(s)) for i, t, f, s in rows})
        return all(s not in (0, 1) for _, _, s in tasks_db.values())
    while not tasks_ended() and time.time() < deadline:
        time.sleep(1)
    check_services()
    tpls_db = {int(i): (n, int(s)) for i, n, s in sql(
        ds, "SELECT id, name, stock FROM %s WHERE shop_number = %d" % (table, shop))}
    ids = sorted(tpls_db)
    missing = sorted(set(made["tpl_ok"]) - set(tpls_db))
    check(not missing, "every template answered 200 is in the DB", "missing: %s" % sample(missing))
    note("templates in the DB: %d (%d answered 200)" % (len(ids), len(made["tpl_ok"])))
    absent = [tid for tid, b in zip(ids, bloom_has(ids)) if b is not True]
    check(not absent, "every template in the DB is in the bloom filter", "absent: %s" % sample(
        absent))
    q = pmap(lambda c, tid: api_query(c, shop, tid), ids)
    unseen = ["%d: %s" % (tid, st) for tid, st in zip(ids, q) if st != 200]
    check(not unseen, "the engine finds every template in the DB (query 200)",
          "%d of %d answer otherwise: %s" % (len(unseen), len(ids), sample(unseen)))
    missing = sorted(set(made["task_ok"]) - set(tasks_db))
    check(not missing, "every task answered 200 is in the DB", "missing: %s" % sample(missing))
    note("tasks in the DB: %d (%d answered 200)" % (len(tasks_db), len(made["task_ok"])))
    bad_tasks = []
    for task_id, (tpl, path, _) in sorted(tasks_db.items()):
        t = find_task(shop, task_id)
        users = made["sheets"].get(path, [])
        cs = db_coupons("request_id LIKE 'dist/%d:%%'" % task_id)
        per = {}
        for c in cs:
            per[c[0]] = per.get(c[0], 0) + 1
        if (t is None or t["status"] != 3 or t["successNum"] + t["failNum"] != len(users)
                or sorted(per) != sorted(users) or any(n != 1 for n in per.values())):
            bad_tasks.append("%d: %s, %d coupons" % (task_id, t and {
                k: t.get(k) for k in ("status", "processedRows", "successNum", "failNum",
                                      "failReason")}, len(cs)))
    check(not bad_tasks, "every task in the DB succeeded, successNum + failNum = rows, each "
          "listed user holds one coupon", "%s" % sample(bad_tasks, 3))
    # Stock: templates of the template threads start with 100, those of the task threads with
    # task_rows (their names say which).
    coupons = {}
    for c in db_coupons("coupon_template_id IN (%s)" % ",".join(map(str, ids)) if ids else
                        "false"):
        coupons[c[3]] = coupons.get(c[3], 0) + 1
    rstock = redis_cmds([["HGET", "quan:tpl:{%d}" % tid, "stock"] for tid in ids])
    bad_cache, bad_stock = [], []
    for tid, rs in zip(ids, rstock):
        name, stock = tpls_db[tid]
        stock0 = 100 if name.startswith("tpl ") else task_rows
        if rs is not None and int(rs) != stock:
            bad_cache.append("%d: Redis %s, DB %d" % (tid, rs, stock))
        if coupons.get(tid, 0) != stock0 - stock:
            bad_stock.append("%d: %d coupons, stock %d -> %d" % (tid, coupons.get(tid, 0),
                                                                 stock0, stock))
    check(not bad_cache, "every cached template: Redis stock = DB stock", sample(bad_cache, 3))
    check(not bad_stock, "every template: coupons in the DB = initial stock - DB stock",
          sample(bad_stock, 3))


def bloom_has(ids):
    """Whether each id is in the template bloom filter, computed as common/redis/bloom.c does
    (splitmix64 double hashing; m and k from the filter's header); None without a filter."""
    key = "quan:bloom:tpl"
    header = redis_cmds([["GETRANGE", key, 0, 31]])[0] or ""
    parts = dict(p.split("=") for p in header.split()[1:] if "=" in p)
    if not header.startswith("QBLOOM1") or "m" not in parts or "k" not in parts:
        return [None] * len(ids)
    m, k = int(parts["m"], 16), int(parts["k"])
    mask = (1 << 64) - 1

    def mix(x):
        x = (x + 0x9E3779B97F4A7C15) & mask
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)
    cmds = []
    for tid in ids:
        h1 = mix(tid & mask)
        h2 = mix(h1) | 1
        cmds += [["GETBIT", key, 256 + ((h1 + i * h2) & mask) % m] for i in range(k)]
    bits = redis_cmds(cmds)
    return [all(bits[i * k:(i + 1) * k]) for i in range(len(ids))]


def api_query(conn, shop, tid):
    deadline = time.time() + 10
    while True:
        try:
            st, js = conn.call("GET", EN + "/coupon-template/query?shopNumber=%d&couponTemplateId"
                                          "=%d" % (shop, tid), None, user_hdr(1))
        except (OSError, http.client.HTTPException):
            st = 0
        if st not in (0, 429, 503) or time.time() > deadline:
            return st
        time.sleep(0.2)


BUCKETED = {"buckets": 3, "skew": 0.8}

# The sale scenarios: name -> (request-id tag, MQ claims, the fault, its action[, the sale's
# template and users: BUCKETED]). The first
# eight are the single topology's, the rest the cluster topology's parts.
CLAIM_SCENARIOS = {
    "engine-sync": ("es", False, "kill -9 quan-engine", lambda: kill_service("engine")),
    "engine-mq": ("em", True, "kill -9 quan-engine", lambda: kill_service("engine")),
    "rabbitmq-mq": ("rm", True, "kill -9 RabbitMQ", lambda: kill_infra("rabbitmq")),
    "postgres-sync": ("ps", False, "kill -9 PostgreSQL", lambda: kill_infra("postgres")),
    "postgres-mq": ("pm", True, "kill -9 PostgreSQL", lambda: kill_infra("postgres")),
    "redis-empty-mq": ("re", True, "Redis killed and started EMPTY",
                       lambda: kill_infra("redis", empty=True)),
    "engine-replica-sync": ("ers", False, "kill -9 one quan-engine replica",
                            lambda: kill_service("engine", one=True)),
    "engine-replica-mq": ("erm", True, "kill -9 one quan-engine replica",
                          lambda: kill_service("engine", one=True)),
    "redis-failover-sync": ("rfs", False, "kill -9 of the sale's Redis master, its replica "
                            "promoted", redis_master_failover),
    "redis-failover-mq": ("rfm", True, "kill -9 of the sale's Redis master, its replica "
                          "promoted", redis_master_failover),
    "redis-reshard-sync": ("rrs", False, "the sale's slot moved to another master",
                           redis_move_slot),
    "redis-reshard-mq": ("rrm", True, "the sale's slot moved to another master",
                         redis_move_slot),
    "rabbitmq-node-mq": ("rnm", True, "kill -9 one RabbitMQ node",
                         lambda: kill_infra("rabbitmq1")),
    "postgres-server-sync": ("pss", False, "kill -9 ds_1's PostgreSQL server",
                             lambda: kill_infra("postgres1")),
    "postgres-server-mq": ("psm", True, "kill -9 ds_0's PostgreSQL server",
                           lambda: kill_infra("postgres0")),
    "redis-sentinel-sync": ("rss", False, "kill -9 of the Redis master, a replica promoted by "
                            "the sentinels", sentinel_failover),
    "redis-sentinel-mq": ("rsm", True, "kill -9 of the Redis master, a replica promoted by "
                          "the sentinels", sentinel_failover),
    # A sale on three stock buckets with 80 % of the users at home in bucket 0, so that bucket
    # runs dry early and stock moves to it from the others all through the fault.
    "engine-mq-buckets": ("emb", True, "kill -9 quan-engine (3 buckets, uneven)",
                          lambda: kill_service("engine"), BUCKETED),
    "redis-empty-mq-buckets": ("reb", True, "Redis killed and started EMPTY (3 buckets, uneven)",
                               lambda: kill_infra("redis", empty=True), BUCKETED),
    "engine-replica-mq-buckets": ("ermb", True, "kill -9 one quan-engine replica (3 buckets, "
                                  "uneven)", lambda: kill_service("engine", one=True), BUCKETED),
    "redis-failover-mq-buckets": ("rfmb", True, "kill -9 of bucket 0's Redis master, its replica "
                                  "promoted (3 buckets, uneven)", redis_master_failover, BUCKETED),
    # The merchant changes the sale's buckets from three to two while it runs, and the engine
    # (one replica of it) is killed while its re-layout waits for the claims in flight.
    "engine-mq-relayout": ("eml", True, "3 buckets changed to 2 mid-sale, then kill -9 "
                           "quan-engine (uneven)", lambda: relayout_then_kill(2), BUCKETED),
    "engine-replica-mq-relayout": ("ermr", True, "3 buckets changed to 2 mid-sale, then kill -9 "
                                   "one quan-engine replica (uneven)",
                                   lambda: relayout_then_kill(2, one=True), BUCKETED),
}


# ---------------------------------------------------------------- the restore drill

BACKUP_SH = os.path.join(ROOT, "deploy", "local", "backup.sh")
RESTORE_STOCK = 150
RESTORE_MARGIN_S = 0.6  # no acknowledged operation lies this close to the restore point
# CHAOS_RESTORE_SKIP_RECOVER=1: the drill's checks run on the restored state without
# quan-recover, to see them fail (by hand; never in CI).
SKIP_RECOVER = os.environ.get("CHAOS_RESTORE_SKIP_RECOVER") == "1"
# The status a coupon has after each acknowledged operation.
AFTER = {"claim": 0, "lock": 1, "pay": 2, "refund": 0, "accept": None}


def restore_tool(*args, timeout=180):
    """A tool of build/bin (quan-recover, quan-bloom-rebuild) against the suite's stores."""
    e = dict(os.environ)
    e["QUAN_LUA_DIR"] = os.path.join(ROOT, "lua-scripts")
    return subprocess.run([os.path.join(BIN, args[0])] + list(args[1:]), env=e,
                          capture_output=True, text=True, timeout=timeout)


def coupon_rows(tpl):
    """{coupon id: (user, status)} of the template, both databases."""
    out = {}
    for ds in (0, 1):
        q = " UNION ALL ".join(
            "SELECT id, user_id, status FROM t_user_coupon_%d WHERE coupon_template_id = %d"
            % (t, tpl) for t in range(16 * ds, 16 * ds + 16))
        for cid, user, st in sql(ds, q):
            out[int(cid)] = (int(user), int(st))
    return out


class Ops:
    """The drill's client: every operation the platform acknowledged, with the time of its
    answer: [(time, op, user, coupon id)]."""

    def __init__(self, shop, tpl, tag):
        self.shop, self.tpl, self.tag = shop, tpl, tag
        self.acked = []
        self.lock = threading.Lock()

    def _call(self, conn, path, body, user):
        st, js = conn.call("POST", EN + path, body, user_hdr(user))
        if st != 200 or not js.get("success"):
            raise AssertionError("%s of user %d: %s %s" % (path, user, st, js))
        return js

    def _ack(self, op, user, cid):
        with self.lock:
            self.acked.append((time.time(), op, user, cid))

    def flow(self, conn, user, plan):
        """A claim; then for plan "pay" lock and pay, for "refund" lock, pay and refund."""
        body = {"source": 0, "shopNumber": str(self.shop), "couponTemplateId": str(self.tpl),
                "requestId": "%s-%d" % (self.tag, user)}
        cid = int(self._call(conn, "/user-coupon/redeem", body, user)["data"]["userCouponId"])
        self._ack("claim", user, cid)
        if not plan:
            return
        order = random.getrandbits(62)
        pay = {"couponId": str(cid), "orderId": str(order)}
        self._call(conn, "/user-coupon/create-payment-record",
                   dict(pay, orderAmount="20", payableAmount="15", shopNumber=str(self.shop)),
                   user)
        self._ack("lock", user, cid)
        self._call(conn, "/user-coupon/process-payment", pay, user)
        self._ack("pay", user, cid)
        if plan == "refund":
            self._call(conn, "/user-coupon/process-refund", pay, user)
            self._ack("refund", user, cid)

    def run(self, users):
        plans = [None, None, "pay", "refund"]
        pmap(lambda c, iu: self.flow(c, iu[1], plans[iu[0] % len(plans)]),
             list(enumerate(users)), threads=4)


def restore_state(shop, tpl, users):
    """What the invariants compare: Redis' stock and counters, the rows, the statistics."""
    rows = coupon_rows(tpl)
    held = {}
    for user, _ in rows.values():
        held[user] = held.get(user, 0) + 1
    return {"redis_stock": redis_stock(tpl), "db_stock": db_stock(shop, tpl), "rows": rows,
            "held": held, "counters": redis_counters(tpl, users),
            "stats": stats_mismatches([tpl])}


def restore_invariants(shop, tpl, users, stock0, what):
    """The chaos suite's promises on the restored state; the list of what does not hold."""
    st = restore_state(shop, tpl, users)
    bad = []
    n = len(st["rows"])
    if st["redis_stock"] != st["db_stock"]:
        bad.append("Redis stock %s != DB stock %s" % (st["redis_stock"], st["db_stock"]))
    if st["db_stock"] is None or n != stock0 - st["db_stock"] or n > stock0:
        bad.append("%d coupons for stock %d -> %s" % (n, stock0, st["db_stock"]))
    over = sorted(u for u, k in st["held"].items() if k > LIMIT)
    if over:
        bad.append("users over the limit: %s" % sample(over))
    wrong = sorted(u for u in users if st["counters"][u] != st["held"].get(u, 0))
    if wrong:
        bad.append("Redis counter != coupons held: %s" % sample(
            ["%d: %d/%d" % (u, st["counters"][u], st["held"].get(u, 0)) for u in wrong]))
    if st["stats"]:
        bad.append("statistics: %s" % "; ".join(st["stats"]))
    # Wallets: what the API lists = the rows = Redis' wallet entries.
    sample_users = users[::5]
    lists = pmap(lambda c, u: c.call("GET", EN + "/user-coupon/list", None, user_hdr(u)),
                 sample_users)
    zsets = redis_cmds([["ZRANGE", "quan:wallet:{%d}" % u, "0", "-1"] for u in sample_users])
    for u, (code, js), z in zip(sample_users, lists, zsets):
        mine = {cid for cid, (user, _) in st["rows"].items() if user == u}
        listed = ({int(c["userCouponId"]) for c in js["data"]
                   if int(c["couponTemplateId"]) == tpl}
                  if code == 200 and js and js.get("data") is not None else None)
        if listed != mine:
            bad.append("user %d: wallet lists %s, the rows %s (HTTP %s)" % (
                u, listed, sorted(mine), code))
        gone = [m for m in (z or []) if m.startswith("%d_" % tpl)
                and int(m.split("_")[1]) not in mine]
        if gone:
            bad.append("user %d: Redis wallet holds coupons the rows do not: %s" % (u, gone))
    note("%s: Redis stock %s, DB stock %s, %d coupons" % (what, st["redis_stock"],
                                                          st["db_stock"], n))
    return bad, st


def s_restore():
    """The restore drill: a sale with payments and refunds and a distribution task; a base
    backup taken while claims run; more claims, payments, refunds and a task; every process
    and server killed; the databases restored to a point between; quan-recover. Then the
    promises against the restored state, the README's walk, and what was lost, listed."""
    tag = "rs%x" % random.getrandbits(20)
    shop = new_shop()
    tpl = create_template(shop, RESTORE_STOCK, "restore " + tag)
    users = new_users(115)
    ops = Ops(shop, tpl, tag)
    a, b1, b2 = users[:30], users[30:60], users[60:90]
    dist1, dist2, queued = users[90:100], users[100:110], users[110:115]

    ops.run(a)
    t1 = create_task(shop, tpl, write_sheet(dist1, "%s-1.csv" % tag))
    task1 = wait_task(shop, t1, time.time() + 60)
    check(task1 is not None and task1["status"] == 3, "the first task succeeded", str(task1))

    # The base backup while claims, payments and refunds go on.
    worker = threading.Thread(target=ops.run, args=(b1,), daemon=True)
    worker.start()
    out = subprocess.run([BACKUP_SH, "backup", INFRA], capture_output=True, text=True,
                         timeout=120)
    worker.join()
    check(out.returncode == 0, "make backup's backup.sh took a base backup during the sale",
          out.stderr[-800:])
    time.sleep(RESTORE_MARGIN_S)
    point = time.time()
    time.sleep(RESTORE_MARGIN_S)
    ops.run(b2)
    t2 = create_task(shop, tpl, write_sheet(dist2, "%s-2.csv" % tag))
    task2 = wait_task(shop, t2, time.time() + 60)
    check(task2 is not None and task2["status"] == 3, "the second task succeeded", str(task2))
    # Claims accepted by /redeem-mq (202) and still queued when everything dies: the engine's
    # claim writers are off for them.
    engine = SVC["engine"]
    engine.kill9()
    for r in engine.replicas:
        r.env = dict(r.env, QUAN_CLAIM_CONSUMERS="0")
    engine.start()
    engine.ready()
    accepted = {}
    for u in queued:
        st, js = api("engine", "POST", EN + "/user-coupon/redeem-mq", {
            "source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl),
            "requestId": "%s-%d" % (tag, u)}, user_hdr(u))
        if st == 202:
            accepted[u] = js["data"]["requestId"]
            ops._ack("accept", u, 0)
    check(len(accepted) == len(queued), "%d /redeem-mq claims accepted (202) and queued" %
          len(queued), "accepted: %s" % accepted)
    for r in engine.replicas:
        r.env = {k: v for k, v in r.env.items() if k != "QUAN_CLAIM_CONSUMERS"}
    before = restore_state(shop, tpl, users)
    note("before the disaster: Redis stock %s, DB stock %s, %d coupons" % (
        before["redis_stock"], before["db_stock"], len(before["rows"])))

    # Everything killed, as a machine dies.
    for s in SVC.values():
        s.kill9()
    for name in ("redis", "postgres", "rabbitmq"):
        kill_server(name)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(point)) + (
        ".%03d UTC" % int((point % 1) * 1000))
    t0 = time.time()
    out = subprocess.run([BACKUP_SH, "restore", INFRA, when], capture_output=True, text=True,
                         timeout=300)
    check(out.returncode == 0, "backup.sh restore to %s" % when, out.stderr[-1500:])
    note("restored in %.1f s" % (time.time() - t0))
    if out.returncode != 0:
        start_servers()

    # The services start on the restored databases; the engines refuse claims until
    # quan-recover has run, and the stores still describe the lost future.
    for s in SVC.values():
        s.start()
    for name in ("merchant-admin", "settlement", "distribution"):
        SVC[name].ready()
    chk = restore_tool("quan-recover", "--check")
    check(chk.returncode == 1, "quan-recover --check: the restore waits for it",
          chk.stdout + chk.stderr)
    conn = Conn(SVC["engine"])
    deadline = time.time() + 30
    while True:
        try:
            code, js = conn.call("POST", EN + "/user-coupon/redeem", {
                "source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl),
                "requestId": "%s-probe" % tag}, user_hdr(users[-1] + 1))
        except (OSError, http.client.HTTPException):
            code, js = 0, None
        if code or time.time() > deadline:
            break
        time.sleep(0.2)
    conn.close()
    check(code == 503, "before quan-recover the engine refuses claims (503)", "%s %s" % (code, js))
    stale, _ = restore_invariants(shop, tpl, users, RESTORE_STOCK, "before quan-recover")
    check(stale, "before quan-recover the invariant check reports the inconsistency",
          "the restored state already held every promise")
    for line in stale:
        note("  inconsistent: %s" % line)

    if SKIP_RECOVER:
        note("CHAOS_RESTORE_SKIP_RECOVER=1: quan-recover not run")
    else:
        t0 = time.time()
        rec = restore_tool("quan-recover", "--settle-ms", "1500")
        check(rec.returncode == 0, "quan-recover", rec.stdout + rec.stderr)
        for line in rec.stdout.splitlines():
            note("  quan-recover: %s" % line)
        # Sorted by quan-recover, or by the claim consumer (a claim it held while the restore
        # was pending carries an earlier restore epoch): in the dead-letter queue either way.
        deadline = time.time() + 20
        while True:
            dlq = restore_tool("quan-dlq", "list", "engine.redeem", "100")
            dead = {rid for rid in accepted.values()
                    if any(rid in ln and "reason=restored:" in ln
                           for ln in dlq.stdout.splitlines())}
            if dead == set(accepted.values()) or time.time() > deadline:
                break
            time.sleep(0.5)
        check(dead == set(accepted.values()),
              "the queued claims are in quan.engine.redeem.dead with the reason 'restored'",
              "dead-lettered %s of %s:\n%s" % (sorted(dead), sorted(accepted.values()),
                                               dlq.stdout[-800:]))
        told = pmap(lambda c, ur: read_result(c, ur[0], ur[1]), list(accepted.items()))
        check(all(r[0] == "404" for r in told),
              "/redeem-result no longer knows a dead-lettered claim: its client claims again",
              "answers: %s" % told)
        bloom = restore_tool("quan-bloom-rebuild")
        check(bloom.returncode == 0, "quan-bloom-rebuild", bloom.stderr[-600:])
        note("recovered in %.1f s" % (time.time() - t0))
        check(SVC["engine"].ready(30), "the engine is ready once quan-recover ran")

    bad, after = restore_invariants(shop, tpl, users, RESTORE_STOCK, "restored")
    check(not bad, "the promises hold on the restored state (stock, limit, counters, wallets, "
          "statistics)", "; ".join(bad)[:1500])

    # What was lost: each acknowledged operation against the rows the restore kept. Before the
    # point every one must be there; after it, none can be.
    rows = after["rows"]
    state = {}
    lost_before, kept_after, lost = [], [], []
    for t, op, user, cid in sorted(ops.acked):
        want = AFTER[op]
        if t < point:
            state[cid] = want
            continue
        if op == "accept":  # a queued claim: it must have made no coupon
            there = after["held"].get(user, 0) > 0
        else:
            there = cid in rows
        (kept_after if there else lost).append((t, op, user, cid))
    for cid, want in state.items():
        if cid not in rows or rows[cid][1] != want:
            lost_before.append((cid, want, rows.get(cid)))
    dist_kept = [u for u in dist1 if after["held"].get(u, 0) != 1]
    dist_lost = [u for u in dist2 if after["held"].get(u, 0) != 0]
    check(not lost_before and not dist_kept,
          "every operation acknowledged before the restore point is in the databases",
          "missing or in another state: %s; first task's users without their coupon: %s" % (
              sample(lost_before), sample(dist_kept)))
    check(not kept_after and not dist_lost,
          "no operation acknowledged after the restore point survived it",
          "%s; second task's users with a coupon: %s" % (sample(kept_after),
                                                          sample(dist_lost)))
    note("lost by the restore to %s (acknowledged after it): %d operations, and task %d's %d "
         "coupons" % (when, len(lost), t2, len(dist2)))
    for t, op, user, cid in lost:
        note("  lost: %s.%03d %-6s user %d %s" % (
            time.strftime("%H:%M:%S", time.gmtime(t)), int((t % 1) * 1000), op, user,
            "coupon %d" % cid if cid else "request %s (dead-lettered)" % accepted.get(user)))

    # The README's walk: a template, a claim, the wallet.
    if not SKIP_RECOVER:
        wshop = new_shop()
        wtpl = create_template(wshop, 10, "walk " + tag)
        u = users[-1] + 7
        st, js = api("engine", "POST", EN + "/user-coupon/redeem", {
            "source": 0, "shopNumber": str(wshop), "couponTemplateId": str(wtpl)}, user_hdr(u))
        cid = int(js["data"]["userCouponId"]) if st == 200 else None
        check(st == 200, "the README's walk: a claim after the recovery", "%s %s" % (st, js))
        st, js = api("engine", "GET", EN + "/user-coupon/list", None, user_hdr(u))
        check(st == 200 and any(int(c["userCouponId"]) == cid for c in js["data"]),
              "the README's walk: the coupon is in the wallet", "%s %s" % (st, js))
        # a user whose claim the restore removed claims again
        if lost:
            u2 = next(x[2] for x in lost if x[1] == "claim")
            st, js = api("engine", "POST", EN + "/user-coupon/redeem", {
                "source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl),
                "requestId": "%s-again" % tag}, user_hdr(u2))
            check(st == 200, "a user whose claim was lost claims again", "%s %s" % (st, js))


def sale_scenario(tag, mq, fault_name, make_action, kw=None):
    return lambda: claims_scenario("%s%x" % (tag, random.getrandbits(20)), mq, fault_name,
                                   make_action(), **(kw or {}))


SCENARIOS = {name: sale_scenario(*v) for name, v in CLAIM_SCENARIOS.items()}
SCENARIOS.update({"distribution": s_distribution, "merchant-admin": s_merchant_admin,
                  "restore": s_restore})


def durable_settings():
    """The servers run as make up runs them: a test of crash recovery on servers that do not
    keep what they acknowledged would prove nothing."""
    fsync = sql(0, "SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
                   "current_setting('full_page_writes')")[0]
    aof = redis_cmds([["CONFIG", "GET", "appendonly"], ["CONFIG", "GET", "appendfsync"]])
    check(fsync == ["on", "on", "on"] and aof[0][1] == "yes" and aof[1][1] in ("everysec",
                                                                                "always"),
          "the servers are durable (fsync, synchronous_commit, full_page_writes, appendonly)",
          "PostgreSQL %s, Redis %s" % (fsync, aof))


def main():
    global _scenario
    names = (os.environ.get("CHAOS_SCENARIOS", "").replace(",", " ").split() or
             (CLUSTER_DEFAULT if TOPOLOGY == "cluster" else
              SENTINEL_DEFAULT if TOPOLOGY == "sentinel" else DEFAULT))
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print("unknown scenarios %s; known: %s" % (unknown, ", ".join(SCENARIOS)))
        print("0 passed, 1 failed")
        sys.exit(1)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    try:
        start_services()
        durable_settings()
        for name in names:
            _scenario = name
            start = time.time()
            print("== %s" % name, flush=True)
            ensure_services()
            for s in SVC.values():
                s.mark()
            try:
                SCENARIOS[name]()
            except Exception as e:  # noqa: BLE001 - a scenario that broke is one failed check
                check(False, "the scenario ran to its end", "%s: %s" % (type(e).__name__, e))
            log_summary()
            note("%s: %.0f s" % (name, time.time() - start))
    finally:
        for s in SVC.values():
            s.stop()
        if FIGURES:
            print("== what the users were told (per sale)", flush=True)
            print("%-22s %14s %8s %14s %22s" % ("scenario", "B000101 w/o", "unsold",
                                                 "B000100 told", "doubt settled after"))
            for sc, f in FIGURES.items():
                d = f.get("doubt_s", "-")
                print("%-22s %14s %8s %14s %22s" % (
                    sc, f.get("false_limit"), f.get("unsold"), f.get("sold_out_told"),
                    "%.1f s" % d if isinstance(d, float) else ("not settled" if d is None
                                                                 else d)), flush=True)
        # Whoever reads only the end of a long run (CI) still sees what failed, and why.
        if _failures:
            print("== failed checks", flush=True)
            for sc, what, detail in _failures:
                print("FAIL %s: %s%s" % (sc, what, ("\n     " + detail[:600]) if detail else ""),
                      flush=True)
        print("%d passed, %d failed" % (_passed, _failed + (1 if sys.exc_info()[0] else 0)),
              flush=True)
    sys.exit(1 if _failed else 0)


if __name__ == "__main__":
    main()
