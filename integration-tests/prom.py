"""A private Prometheus for the integration tests (Debian's package `prometheus`): started on a
free loopback port with its data in a directory of the caller's, scraping the targets given and
evaluating the rule files given, and stopped at exit whatever happens.

    import prom
    p = prom.start(workdir, {"quan-engine": ["127.0.0.1:10020"]},
                   rule_files=["deploy/prometheus/rules/quan-alerts.yml"])
    p.wait_ready()
    p.query('up{job="quan-engine"}')   # [{"metric": {...}, "value": [ts, "1"]}, ...]
    p.alerts()                         # [{"labels": {...}, "state": "firing", ...}, ...]
    p.stop()

Only the standard library: the configuration is written as JSON, which is YAML too.
QUAN_PROMETHEUS names another binary."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BINARY = os.environ.get("QUAN_PROMETHEUS", "/usr/bin/prometheus")

# Servers a caller never stopped are stopped at exit: they would outlive the suite.
_running = []


sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "deploy", "local"))
from ports import free_port as _free_port  # noqa: E402
from quan import stop_process  # noqa: E402


class PromError(Exception):
    """Prometheus did not start, or its API answered an error."""


class Prom:
    """One running Prometheus: url (http://127.0.0.1:PORT), workdir, config_path, log_path."""

    def __init__(self, workdir, port, proc, config_path, log_path):
        self.workdir = workdir
        self.port = port
        self.url = "http://127.0.0.1:%d" % port
        self.proc = proc
        self.config_path = config_path
        self.log_path = log_path

    def _get(self, path, params=None, timeout=5):
        url = self.url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _api(self, path, params=None):
        status, body = self._get(path, params)
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise PromError("%s: HTTP %d, not JSON: %r" % (path, status, body[:200])) from e
        if status != 200 or doc.get("status") != "success":
            raise PromError("%s: HTTP %d: %s" % (path, status, doc.get("error", doc)))
        return doc["data"]

    def wait_ready(self, timeout=30):
        """Waits until /-/ready answers 200 (the TSDB opened, rules loaded); raises PromError
        with the log's tail when the process exits or the time is up."""
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise PromError("prometheus exited with %s:\n%s" % (self.proc.returncode,
                                                                      self.tail()))
            try:
                if self._get("/-/ready", timeout=1)[0] == 200:
                    return self
            except OSError:
                pass
            if time.time() >= deadline:
                raise PromError("prometheus not ready in %ss:\n%s" % (timeout, self.tail()))
            time.sleep(0.1)

    def query(self, expr):
        """An instant query now: the result list of /api/v1/query (for a vector, dicts with
        "metric" and "value": [timestamp, "string value"]); a scalar or string comes back as a
        one-element list of {"value": ...}."""
        data = self._api("/api/v1/query", {"query": expr})
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def alerts(self):
        """The alerts of /api/v1/alerts: dicts with "labels", "annotations", "state" (pending or
        firing), "activeAt" and "value". Resolved alerts are not listed."""
        return self._api("/api/v1/alerts")["alerts"]

    def rules(self):
        """The rule groups of /api/v1/rules (for checking what was loaded)."""
        return self._api("/api/v1/rules")["groups"]

    def targets(self):
        """The active targets of /api/v1/targets (their "health", "lastError", ...)."""
        return self._api("/api/v1/targets")["activeTargets"]

    def tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        """SIGTERM, then SIGKILL after 10 s; the data directory is left for inspection."""
        stop_process(self.proc, 10)
        if self in _running:
            _running.remove(self)


def config(targets, rule_files=(), scrape_interval="1s", evaluation_interval="1s"):
    """The configuration as a dict: one scrape job per entry of targets, {job: ["host:port"]}."""
    return {
        "global": {"scrape_interval": scrape_interval,
                   "evaluation_interval": evaluation_interval,
                   # A scrape may not outlast its interval.
                   "scrape_timeout": scrape_interval},
        "rule_files": [os.path.abspath(f) for f in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(addrs)}]}
                           for job, addrs in targets.items()],
    }


def start(workdir, targets, rule_files=(), scrape_interval="1s", evaluation_interval="1s"):
    """Starts Prometheus with its configuration and data under workdir (created if missing) on a
    free loopback port; returns a Prom (call wait_ready before querying). Raises PromError when
    the binary is missing."""
    if not os.path.exists(BINARY) and not shutil.which(BINARY):
        raise PromError("%s not found (apt-get install prometheus)" % BINARY)
    os.makedirs(workdir, exist_ok=True)
    cfg_path = os.path.join(workdir, "prometheus.yml")
    with open(cfg_path, "w") as f:
        json.dump(config(targets, rule_files, scrape_interval, evaluation_interval), f, indent=1)
    log_path = os.path.join(workdir, "prometheus.log")
    port = _free_port()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [BINARY, "--config.file=" + cfg_path,
             "--storage.tsdb.path=" + os.path.join(workdir, "data"),
             "--web.listen-address=127.0.0.1:%d" % port,
             # Short retention: a test's server holds minutes of samples at most.
             "--storage.tsdb.retention.time=1d"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    p = Prom(workdir, port, proc, cfg_path, log_path)
    _running.append(p)
    return p


@atexit.register
def _stop_all():
    for p in list(_running):
        p.stop()
