"""Small harness for Quan's integration tests: starts real service binaries on free ports
against the servers integration-tests/run.sh started (their addresses are in the environment),
sends real HTTP requests, and prints "N passed, N failed" at the end.

Only the standard library (and python3-prometheus-client where a test parses /metrics)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("QUAN_BIN_DIR", os.path.join(ROOT, "build", "bin"))
TMP = os.environ.get("QUAN_TEST_TMP", "/tmp")
SERVICES = ["merchant-admin", "engine", "settlement", "distribution"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """One quan-<name> process (or the binary at the path given); stopped (SIGKILL if needed) by
    stop() or at exit."""

    def __init__(self, name, env=None, port=None, binary=None):
        self.name = name
        self.port = port or free_port()
        self.log_path = os.path.join(TMP, "%s-%d.log" % (name, self.port))
        e = dict(os.environ)
        e.update({"QUAN_HTTP_PORT": str(self.port), "QUAN_HTTP_BIND": "127.0.0.1",
                  "QUAN_LUA_DIR": os.path.join(ROOT, "lua-scripts"),
                  "QUAN_LOG_LEVEL": os.environ.get("QUAN_LOG_LEVEL", "info"),
                  "QUAN_CODE_SECRET": os.environ.get("QUAN_CODE_SECRET",
                                                     "test-secret-0123456789abcdef")})
        e.update(env or {})
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary or os.path.join(BIN, "quan-" + name)], env=e,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.url = "http://127.0.0.1:%d" % self.port

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("%s exited with %s:\n%s" % (self.name, self.proc.returncode,
                                                                  self.tail()))
            try:
                if request("GET", self.url + "/readyz", timeout=1)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("%s not ready in %ss:\n%s" % (self.name, timeout, self.tail()))

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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(30) is None:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def request(method, url, body=None, headers=None, timeout=10):
    """Returns (status, headers, parsed JSON or raw bytes)."""
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


def run(tests):
    """Runs each test function; a test passes if it raises nothing."""
    global _passed, _failed
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
    print("%d passed, %d failed" % (_passed, _failed), flush=True)
    sys.exit(1 if _failed else 0)
