"""Small harness for Quan's integration tests: starts real service binaries on free ports
against the servers integration-tests/run.sh started (their addresses are in the environment),
sends real HTTP requests, and prints "N passed, N failed" at the end.

QUAN_TOPOLOGY=cluster (integration-tests/run.sh started a Redis Cluster, two PostgreSQL servers
and a RabbitMQ cluster): a Service is two replicas of the binary and, for the services with an
API, a gateway of its own in front of them; request() sends /api/ calls through that gateway
with a token made from the identity headers and sums /metrics over the replicas, so that the
suites run unchanged against both topologies.

Only the standard library (and python3-prometheus-client where a test parses /metrics)."""

import atexit
import base64
import contextlib
import hashlib
import hmac
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("QUAN_BIN_DIR", os.path.join(ROOT, "build", "bin"))
TMP = os.environ.get("QUAN_TEST_TMP", "/tmp")
SERVICES = ["merchant-admin", "engine", "settlement", "distribution"]
TOPOLOGY = os.environ.get("QUAN_TOPOLOGY", "single")
GATEWAY_SH = os.path.join(ROOT, "deploy", "local", "gateway.sh")
# The key of the per-Service gateways' tokens: fixed, since nothing outside a run trusts it.
GATEWAY_JWT_SECRET = "quan-integration-tests-jwt-key-0123456789"
# The services behind the gateway (quan-distribution has no API).
GATEWAY_ROUTES = {"engine": "QUAN_GATEWAY_ENGINE", "merchant-admin": "QUAN_GATEWAY_MERCHANT_ADMIN",
                  "settlement": "QUAN_GATEWAY_SETTLEMENT"}
# The gateway's rate limits (deploy/local/gateway.sh), off in the per-Service gateways unless
# the environment sets them: a suite's clients are one process on one address, often one user
# at full speed (a thousand queries of one user at once), which is what the limits refuse. The
# limits, and a flash sale under their defaults, are test_gateway.py's.
GATEWAY_LIMITS = ("QUAN_GATEWAY_RATE_USER", "QUAN_GATEWAY_RATE_MERCHANT", "QUAN_GATEWAY_RATE_ADDR",
                  "QUAN_GATEWAY_RATE_CONSOLE", "QUAN_GATEWAY_CONN_ADDR")
# Replica 0's base URL -> its cluster Service, for request().
_CLUSTER = {}


sys.path.insert(0, os.path.join(ROOT, "deploy", "local"))
from ports import free_port  # noqa: E402,F401  (a listener's port, never an ephemeral one)


class _Replicas:
    """The Popen objects of a Service's replicas seen as one process, for the tests that use
    s.proc: pid is replica 0's, poll() is None while any replica lives, signals go to all."""

    def __init__(self, procs):
        self.procs = procs

    @property
    def pid(self):
        return self.procs[0].pid

    @property
    def returncode(self):
        return self.poll()

    def poll(self):
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        return codes[-1]

    def send_signal(self, sig):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.time() + timeout
        for p in self.procs:
            p.wait(timeout=None if deadline is None else max(0, deadline - time.time()))
        return self.procs[-1].returncode


def stop_process(proc, grace_s):
    """SIGTERM, then SIGKILL when proc has not exited within grace_s; waits for it either way.
    Returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


class Service:
    """One quan-<name> process (or the binary at the path given); stopped (SIGKILL if needed) by
    stop() or at exit. In the cluster topology, replicas (default 2) processes writing to one
    log, and for engine, merchant-admin and settlement a gateway in front of them; port and url
    stay replica 0's own address."""

    def __init__(self, name, env=None, port=None, binary=None, replicas=None):
        self.name = name
        self.port = port or free_port()
        self.log_path = os.path.join(TMP, "%s-%d.log" % (name, self.port))
        self.url = "http://127.0.0.1:%d" % self.port
        self.gateway = None
        if replicas is None:
            replicas = 2 if TOPOLOGY == "cluster" else 1
        self.ports = [self.port] + [free_port() for _ in range(replicas - 1)]
        self.urls = ["http://127.0.0.1:%d" % p for p in self.ports]
        # Appended to when there are replicas: each has its own descriptor of the one file.
        self.log = open(self.log_path, "ab" if replicas > 1 else "wb")
        procs = []
        for p in self.ports:
            e = dict(os.environ)
            e.update({"QUAN_HTTP_PORT": str(p), "QUAN_HTTP_BIND": "127.0.0.1",
                      "QUAN_LUA_DIR": os.path.join(ROOT, "lua-scripts"),
                      "QUAN_LOG_LEVEL": os.environ.get("QUAN_LOG_LEVEL", "info"),
                      "QUAN_CODE_SECRET": os.environ.get("QUAN_CODE_SECRET",
                                                         "test-secret-0123456789abcdef")})
            e.update(env or {})
            procs.append(subprocess.Popen([binary or os.path.join(BIN, "quan-" + name)], env=e,
                                          stdout=self.log, stderr=subprocess.STDOUT))
        self.proc = procs[0] if replicas == 1 else _Replicas(procs)
        _services.append(self)
        if replicas > 1:
            if name in GATEWAY_ROUTES:
                self._start_gateway()
            _CLUSTER[self.url] = self

    def _start_gateway(self):
        try:
            self.gateway = start_gateway(self.name, self.ports)
        except AssertionError:
            self.proc.kill()
            raise

    def _stop_gateway(self):
        if self.gateway:
            stop_gateway(self.gateway)
            self.gateway = None
        _CLUSTER.pop(self.url, None)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        for url in self.urls:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError("%s exited with %s:\n%s" % (
                        self.name, self.proc.returncode, self.tail()))
                try:
                    if _http("GET", url + "/readyz", timeout=1)[0] == 200:
                        break
                except OSError:
                    pass
                if time.time() >= deadline:
                    raise AssertionError("%s not ready in %ss:\n%s" % (self.name, timeout,
                                                                       self.tail()))
                time.sleep(0.1)
        return self

    def tail(self, n=30):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return b"".join(f.readlines()[-n:]).decode(errors="replace")

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return -1

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        stop_process(self.proc, 30)
        self._stop_gateway()
        self.log.close()
        if self in _services:
            _services.remove(self)


# Services a suite never stopped (a failure before its finally, a helper that forgot) are killed
# at exit: they would outlive the suite and its servers, retrying forever.
_services = []


@atexit.register
def _kill_services():
    for svc in list(_services):
        if svc.proc.poll() is None:
            svc.proc.kill()
            svc.proc.wait()
        svc._stop_gateway()


# SIGTERM (run.sh's time limit, a stopped CI run) ends the suite through its exit handlers, so
# the services above are killed with it instead of outliving it.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


# Gateways still running at exit (a suite that never stopped its Services) are stopped then:
# nginx runs detached and would outlive the suite.
_gateways = []


def start_gateway(name, ports):
    """gateway.sh start in a fresh directory under TMP: the replicas on ports behind every
    route (the other services' routes are never called through it); {"dir", "port", "url"}."""
    d = tempfile.mkdtemp(prefix="gateway-%s-%d." % (name, ports[0]), dir=TMP)
    port = free_port()
    upstream = ",".join("127.0.0.1:%d" % p for p in ports)
    env = dict(os.environ, QUAN_GATEWAY_PORT=str(port),
               QUAN_GATEWAY_METRICS_PORT=str(free_port()),
               QUAN_GATEWAY_JWT_SECRET=GATEWAY_JWT_SECRET)
    for var in GATEWAY_ROUTES.values():
        env[var] = upstream
    for var in GATEWAY_LIMITS:
        env.setdefault(var, "off")
    r = subprocess.run(["bash", GATEWAY_SH, "start", d], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("gateway.sh start: %s %s" % (r.returncode, r.stderr))
    _gateways.append(d)
    return {"dir": d, "port": port, "url": "http://127.0.0.1:%d" % port}


def stop_gateway(gw):
    subprocess.run(["bash", GATEWAY_SH, "stop", gw["dir"]], capture_output=True, timeout=60)
    if gw["dir"] in _gateways:
        _gateways.remove(gw["dir"])


@atexit.register
def _stop_gateways():
    for d in list(_gateways):
        stop_gateway({"dir": d})


_pinned = set()


@contextlib.contextmanager
def pinned(svc):
    """Within it, every request to svc (its /metrics too) goes straight to replica 0, as in the
    single topology: for the tests of what one process keeps in memory."""
    _pinned.add(svc.url)
    try:
        yield svc
    finally:
        _pinned.discard(svc.url)


def request(method, url, body=None, headers=None, timeout=10):
    """Returns (status, headers, parsed JSON or raw bytes). For a cluster Service's url: /api/
    through its gateway as the user the identity headers name, /metrics summed over the
    replicas, anything else from replica 0."""
    parts = urllib.parse.urlsplit(url)
    svc = _CLUSTER.get("%s://%s" % (parts.scheme, parts.netloc))
    if svc is None or svc.url in _pinned:
        return _http(method, url, body, headers, timeout)
    path = url[len(svc.url):]
    if parts.path == "/metrics" and method == "GET":
        return _summed_metrics(svc, path, headers, timeout)
    if parts.path.startswith("/api/") and svc.gateway:
        token = token_for(headers or {})
        if token is not None:
            hdrs = dict(headers or {})
            hdrs["Authorization"] = "Bearer " + token
            return _http(method, svc.gateway["url"] + path, body, hdrs, timeout)
    # No identity, or one no token can carry: the service's own answer is what is tested.
    return _http(method, url, body, headers, timeout)


_ID = re.compile(r"^[1-9][0-9]{0,18}$")


def _valid_id(v):
    """A claim the gateway takes for sub or shop (deploy/gateway/quan_auth.js positiveId)."""
    return isinstance(v, str) and bool(_ID.match(v)) and int(v) <= (1 << 63) - 1


def token_for(headers):
    """An HS256 token for the identity headers (any case), or None when there are none or one
    of them is a value the gateway would never pass on."""
    ident = {}
    for k, v in headers.items():
        if k.lower() in ("x-user-id", "x-shop-number", "x-username"):
            ident[k.lower()] = str(v)
    if not ident:
        return None
    claims = {"sub": ident.get("x-user-id", "1"), "exp": int(time.time()) + 3600}
    if not _valid_id(claims["sub"]):
        return None
    if "x-shop-number" in ident:
        if not _valid_id(ident["x-shop-number"]):
            return None
        claims["shop"] = ident["x-shop-number"]
    if "x-username" in ident:
        name = ident["x-username"]
        if not 1 <= len(name) <= 64 or re.search("[\x00-\x1f\x7f-\x9f]", name):
            return None
        claims["name"] = name
    return mint_token(claims)


def _b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def mint_token(claims, key=GATEWAY_JWT_SECRET):
    """An HS256 JWT of claims (what build/bin/quan-token makes)."""
    h = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    p = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    sig = hmac.new(key.encode(), ("%s.%s" % (h, p)).encode(), hashlib.sha256).digest()
    return "%s.%s.%s" % (h, p, _b64url(sig))


def _fmt_sample(x):
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "+Inf" if x > 0 else "-Inf"
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(x)


def _summed_metrics(svc, path, headers, timeout):
    """/metrics of every replica, the samples of one name and labels added up (comments from
    the first page that has them); replica 0's status and headers."""
    first = None
    order, sums, seen_comments = [], {}, set()
    for base in svc.urls:
        status, rh, body = _http("GET", base + path, None, headers, timeout)
        if first is None:
            first = (status, rh)
        if status != 200:
            return status, rh, body
        text = body.decode() if isinstance(body, bytes) else json.dumps(body)
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                if line not in seen_comments:
                    seen_comments.add(line)
                    order.append(line)
                continue
            series, _, value = line.rpartition(" ")
            if series not in sums:
                order.append(series)
                sums[series] = 0.0
            sums[series] += float(value)
    out = "".join((k if k.startswith("#") else "%s %s" % (k, _fmt_sample(sums[k]))) + "\n"
                  for k in order)
    return first[0], first[1], out.encode()


def _http(method, url, body=None, headers=None, timeout=10):
    """One HTTP request as given: (status, headers, parsed JSON or raw bytes)."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status, rh = r.read(), r.status, r.headers
    except urllib.error.HTTPError as e:
        raw, status, rh = e.read(), e.code, e.headers
    try:
        return status, rh, json.loads(raw)
    except ValueError:
        return status, rh, raw


def wait_for(cond, timeout):
    """Polls cond every 0.1 s until it is true or timeout seconds have passed; its last value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def parallel(fn, args):
    """fn(a) for each a in args, each on its own thread, all started at once; their results in
    the order of args."""
    out = [None] * len(args)

    def one(i):
        out[i] = fn(args[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


_passed = 0
_failed = 0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run(tests, teardown=None):
    """Runs each test function; a test passes if it raises nothing. teardown, when given, runs
    after the tests whatever happens, before the summary line."""
    global _passed, _failed
    try:
        for t in tests:
            start = time.time()
            try:
                t()
                _passed += 1
                print("ok   %s (%.1fs)" % (t.__name__, time.time() - start), flush=True)
            except Exception:  # noqa: BLE001 - every failure is reported and counted
                _failed += 1
                print("FAIL %s" % t.__name__, flush=True)
                traceback.print_exc(file=sys.stdout)
    finally:
        if teardown:
            teardown()
    print("%d passed, %d failed" % (_passed, _failed), flush=True)
    sys.exit(1 if _failed else 0)


# ---------------------------------------------------------------- a private stack of servers

INFRA_SH = os.path.join(ROOT, "deploy", "local", "infra.sh")


def infra_sh(d, cmd, settings):
    """deploy/local/infra.sh CMD D with settings (QUAN_INFRA_*) added, on ports of its own
    choosing (the environment's are the run's shared servers'); its stderr."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("QUAN_INFRA_REDIS_PORT", "QUAN_INFRA_PG_PORT", "QUAN_INFRA_AMQP_PORT")}
    env.update(settings)
    out = subprocess.run([INFRA_SH, cmd, d], env=env, capture_output=True, text=True, timeout=200)
    check(out.returncode == 0, "infra.sh %s: exit %d\n%s" % (cmd, out.returncode, out.stderr))
    return out.stderr


def infra_env(d):
    """D/env, which infra.sh writes, as a dict (its values are shell-quoted)."""
    env = {}
    with open(os.path.join(d, "env")) as f:
        for line in f:
            if line.startswith("export "):
                k, _, v = line[len("export "):].rstrip("\n").partition("=")
                env[k] = shlex.split(v)[0] if v else ""
    return env


def private_stack(d, settings):
    """Servers of this suite's own in D (infra.sh start with settings), this process's
    environment moved from the run's shared servers to them (the services, quan-migrate and the
    tools read it; nothing of the shared servers, on the cluster topology its Redis Cluster nodes
    and second database server, may stay beside them), and the migrations applied. Returns D's
    environment."""
    outer = infra_env(os.environ["QUAN_INFRA_DIR"])
    infra_sh(d, "start", settings)
    for k in outer:
        os.environ.pop(k, None)
    env = infra_env(d)
    os.environ.update(env)
    os.environ.setdefault("QUAN_MIGRATIONS_DIR", os.path.join(ROOT, "migrations"))
    m = subprocess.run([os.path.join(BIN, "quan-migrate")], capture_output=True, text=True,
                       timeout=120)
    check(m.returncode == 0, "quan-migrate: %s" % m.stderr[-2000:])
    return env
