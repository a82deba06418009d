"""The four service shells: configuration, probes, /metrics, memory, and the SIGTERM drain.
In the cluster topology too: one process each (replicas=1), since these are about a process."""

import json
import os
import signal
import socket
import subprocess
import threading
import time
from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

from quan import BIN, ROOT, SERVICES, Service, check, free_port, request, run, wait_for


def test_help_lists_every_variable():
    for name in SERVICES:
        out = subprocess.run([os.path.join(BIN, "quan-" + name), "--help"], capture_output=True,
                             text=True, timeout=10)
        check(out.returncode == 0, "%s --help exit %d" % (name, out.returncode))
        for var in ("QUAN_HTTP_PORT", "QUAN_DS0_DSN", "QUAN_REDIS_HOST", "QUAN_REDIS_SENTINELS",
                    "QUAN_REDIS_MASTER_NAME", "QUAN_AMQP_URL",
                    "QUAN_MQ_QUEUE_TYPE", "QUAN_LOG_LEVEL", "QUAN_SHUTDOWN_TIMEOUT_S"):
            check(var in out.stdout, "%s --help lacks %s" % (name, var))


def test_bad_config_stops_with_the_variable_named():
    env = dict(os.environ, QUAN_HTTP_PORT="99999")
    out = subprocess.run([os.path.join(BIN, "quan-engine")], env=env, capture_output=True,
                         text=True, timeout=10)
    check(out.returncode == 2, "exit %d" % out.returncode)
    check("QUAN_HTTP_PORT" in out.stderr, out.stderr)

    env = dict(os.environ)
    env.pop("QUAN_DS0_DSN", None)
    out = subprocess.run([os.path.join(BIN, "quan-merchant-admin")], env=env,
                         capture_output=True, text=True, timeout=10)
    check(out.returncode == 2 and "QUAN_DS0_DSN" in out.stderr, out.stderr)

    # A list of RabbitMQ URLs is checked whole at start: the bad one is named by its place,
    # never shown (it holds a password).
    for urls, why in (("amqp://u:Pw-4711@127.0.0.1:1/,,amqp://u:Pw-4711@127.0.0.1:2/",
                       "URL 2 of 3 is empty"),
                      ("amqp://u:Pw-4711@127.0.0.1:1/,http://u:Pw-4711@127.0.0.1:2/",
                       "URL 2 of 2 is not amqp[s]://"),
                      # an amqps URL's CA file that cannot be read: the parameter and the path
                      ("amqps://u:Pw-4711@127.0.0.1:1/?cacertfile=/nonexistent/ca.crt",
                       "URL 1 of 1: cacertfile /nonexistent/ca.crt: No such file or directory")):
        out = subprocess.run([os.path.join(BIN, "quan-distribution")],
                             env=dict(os.environ, QUAN_AMQP_URL=urls), capture_output=True,
                             text=True, timeout=10)
        check(out.returncode == 2 and "QUAN_AMQP_URL: " + why in out.stderr, out.stderr)
        check("Pw-4711" not in out.stdout + out.stderr, "the password is printed: " + out.stderr)
    out = subprocess.run([os.path.join(BIN, "quan-engine")],
                         env=dict(os.environ, QUAN_MQ_QUEUE_TYPE="mirrored"), capture_output=True,
                         text=True, timeout=10)
    check(out.returncode == 2 and "QUAN_MQ_QUEUE_TYPE" in out.stderr and "quorum" in out.stderr,
          out.stderr)


def test_redis_sentinel_settings_checked_at_start():
    """QUAN_REDIS_SENTINELS and QUAN_REDIS_MASTER_NAME: both or neither, never with
    QUAN_REDIS_CLUSTER_NODES, a list of host:port and a plain name; else exit 2 naming them."""
    for extra, want in (
            ({"QUAN_REDIS_SENTINELS": "127.0.0.1:26379", "QUAN_REDIS_MASTER_NAME": ""},
             "QUAN_REDIS_MASTER_NAME: empty while QUAN_REDIS_SENTINELS is set"),
            ({"QUAN_REDIS_SENTINELS": "", "QUAN_REDIS_MASTER_NAME": "quan"},
             "QUAN_REDIS_SENTINELS: empty while QUAN_REDIS_MASTER_NAME is set"),
            ({"QUAN_REDIS_SENTINELS": "127.0.0.1:26379", "QUAN_REDIS_MASTER_NAME": "quan",
              "QUAN_REDIS_CLUSTER_NODES": "127.0.0.1:7000"},
             "not with QUAN_REDIS_CLUSTER_NODES"),
            ({"QUAN_REDIS_SENTINELS": "127.0.0.1:26379,127.0.0.1:99999",
              "QUAN_REDIS_MASTER_NAME": "quan"},
             'QUAN_REDIS_SENTINELS: "127.0.0.1:99999" is not host:port'),
            ({"QUAN_REDIS_SENTINELS": "127.0.0.1:26379", "QUAN_REDIS_MASTER_NAME": "qu an"},
             'QUAN_REDIS_MASTER_NAME: "qu an" is not a master\'s name')):
        env = dict(os.environ, QUAN_REDIS_CLUSTER_NODES="")
        env.update(extra)
        for name in SERVICES:
            out = subprocess.run([os.path.join(BIN, "quan-" + name)], env=env,
                                 capture_output=True, text=True, timeout=10)
            check(out.returncode == 2 and want in out.stderr,
                  "quan-%s with %s: exit %d: %s" % (name, extra, out.returncode, out.stderr))


# Recognisable values for every secret setting; none may ever be printed.
SECRETS = {"pg": "Pg-Secret-4711", "redis": "Redis-Secret-4711", "code": "Code-Secret-4711-abcdef",
           "smtp": "Smtp-Secret-4711", "amqp": "Amqp-Secret-4711"}


def _with_password(url, user, password):
    """url (scheme://host...) with user:password@ put in front of the host."""
    scheme, rest = url.split("://", 1)
    return "%s://%s:%s@%s" % (scheme, user, password, rest.split("@", 1)[-1])


def _secret_file(name, text, newline="\n"):
    """text in a new 0600 file under the suite's directory, as a mounted Secret holds it (with
    a trailing newline); its path."""
    path = os.path.join(os.environ.get("QUAN_TEST_TMP", "/tmp"),
                        "secret-%d-%s" % (os.getpid(), name))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="") as f:
        f.write(text + newline)
    return path


def _as_files(env):
    """env with each secret set in it given as a file instead (NAME empty, NAME_FILE its path),
    the way the Kubernetes manifests give them; and {NAME: path}."""
    out, paths = dict(env), {}
    for i, name in enumerate(("QUAN_DS0_DSN", "QUAN_DS1_DSN", "QUAN_REDIS_PASSWORD",
                              "QUAN_CODE_SECRET", "QUAN_SMTP_URL", "QUAN_AMQP_URL")):
        if env.get(name):
            # every other one ends in CR LF: one line end is dropped, whichever it is
            paths[name] = _secret_file(name, env[name], "\r\n" if i % 2 else "\n")
            out[name] = ""
            out[name + "_FILE"] = paths[name]
    return out, paths


def _secret_env(redis_port, amqp_user, reachable=True):
    pg_port = os.environ["QUAN_INFRA_PG_PORT"] if reachable else str(free_port())
    # ds_1 has a server of its own in the cluster topology.
    pg1_port = os.environ.get("QUAN_INFRA_PG1_PORT", pg_port) if reachable else pg_port
    amqp_port = os.environ["QUAN_INFRA_AMQP_PORT"] if reachable else str(free_port())
    return {
        # The local server trusts loopback, so a password in the DSN is sent and ignored.
        "QUAN_DS0_DSN": "postgresql://quan:%s@127.0.0.1:%s/ds_0" % (SECRETS["pg"], pg_port),
        "QUAN_DS1_DSN": "postgresql://quan:%s@127.0.0.1:%s/ds_1" % (SECRETS["pg"], pg1_port),
        "QUAN_REDIS_PORT": str(redis_port),
        # This suite's own lone Redis, whatever the topology (empty: not a cluster).
        "QUAN_REDIS_CLUSTER_NODES": "",
        "QUAN_REDIS_PASSWORD": SECRETS["redis"],
        "QUAN_CODE_SECRET": SECRETS["code"],
        "QUAN_SMTP_URL": "smtp://mailer:%s@127.0.0.1:1" % SECRETS["smtp"],
        # A list whose first node is down: what is logged of the one skipped shows no password.
        "QUAN_AMQP_URL": ",".join("amqp://%s:%s@127.0.0.1:%s/" % (amqp_user, SECRETS["amqp"], p)
                                  for p in (free_port(), amqp_port)),
        "QUAN_LOG_LEVEL": "debug",
    }


def test_secrets_are_never_logged():
    """Every secret set to a recognisable value, in every binary, with every dependency
    reachable (the secrets are used) and then unreachable (errors are logged): no value appears
    in a log line or in --help."""
    tmp = os.environ.get("QUAN_TEST_TMP", "/tmp")
    redis_port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                              "--requirepass", SECRETS["redis"], "--save", "", "--appendonly",
                              "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    ctl = os.environ["QUAN_INFRA_RABBITMQCTL"]
    user = "secret-test-%d" % os.getpid()
    try:
        subprocess.run([ctl, "add_user", user, SECRETS["amqp"]], check=True,
                       capture_output=True, timeout=60)
        subprocess.run([ctl, "set_permissions", "-p", "/", user, ".*", ".*", ".*"], check=True,
                       capture_output=True, timeout=60)
        texts = []
        env = _secret_env(redis_port, user)
        for name in SERVICES:
            help_out = subprocess.run([os.path.join(BIN, "quan-" + name), "--help"],
                                      env=dict(os.environ, **env), capture_output=True,
                                      text=True, timeout=10)
            texts.append(("%s --help" % name, help_out.stdout + help_out.stderr))

        def run_all(e):
            """The four at once, each in its own process and log: (name, log) of each."""
            svcs = [Service(name, e, replicas=1) for name in SERVICES]
            for s in svcs:
                s.wait_ready()
            for s in svcs:
                s.stop()
            return [(name, open(s.log_path).read()) for name, s in zip(SERVICES, svcs)]
        for name, log in run_all(env):
            check('"var":"QUAN_DS0_DSN","value":"(set)"' in log,
                  "%s: config line for the DSN missing" % name)
            texts.append((name, log))
        # The same secrets as files (QUAN_..._FILE), the variables empty: every binary ready
        # (the databases, the password-protected Redis and the RabbitMQ user reached with what
        # the files hold), its config lines naming the files, no value printed.
        files_env, paths = _as_files(env)
        for name, log in run_all(files_env):
            for var in ("QUAN_DS0_DSN", "QUAN_DS1_DSN", "QUAN_REDIS_PASSWORD", "QUAN_AMQP_URL"):
                check('"var":"%s","value":"(set)","file":"%s"' % (var, paths[var]) in log,
                      "%s: no config line naming %s's file" % (name, var))
            texts.append(("%s from files" % name, log))
        # Nothing reachable: connection errors are logged, with no secret in them.
        svcs = [Service(name, _secret_env(free_port(), user, reachable=False), replicas=1)
                for name in SERVICES]
        time.sleep(2)
        for s in svcs:
            s.stop()
        for name, s in zip(SERVICES, svcs):
            log = open(s.log_path).read()
            check("error" in log or "warn" in log, "%s: no error logged while unreachable" % name)
            texts.append(("%s unreachable" % name, log))
        for what, text in texts:
            for key, value in SECRETS.items():
                check(value not in text, "%s: the %s secret is printed" % (what, key))
    finally:
        redis.terminate()
        redis.wait()
        subprocess.run([ctl, "delete_user", user], capture_output=True, timeout=60)


def test_secret_files():
    """A service started with its secrets in files (QUAN_..._FILE) serves; NAME and NAME_FILE
    both set, a file that is not there, one over 64 KiB or an empty one for a required secret
    stop it with exit code 2, naming the variables and the file, never the value."""
    env, paths = _as_files({"QUAN_DS0_DSN": os.environ["QUAN_DS0_DSN"],
                            "QUAN_DS1_DSN": os.environ["QUAN_DS1_DSN"],
                            "QUAN_AMQP_URL": os.environ["QUAN_AMQP_URL"],
                            "QUAN_CODE_SECRET": "File-Secret-4711-0123456789"})
    env["QUAN_LOG_LEVEL"] = "info"  # the config lines
    s = Service("engine", env, replicas=1).wait_ready()
    try:
        status, _, body = request("GET", s.url + "/api/engine/user-coupon/list", None,
                                  {"X-User-Id": "4711"})
        check(status == 200 and body["success"], "wallet: %s %s" % (status, body))
    finally:
        s.stop()
    log = open(s.log_path).read()
    check('"var":"QUAN_CODE_SECRET","value":"(set)","file":"%s"' % paths["QUAN_CODE_SECRET"]
          in log, "no config line naming the code secret's file")
    check("File-Secret-4711" not in log, "the code secret is printed")

    dsn = _with_password(os.environ["QUAN_DS0_DSN"], "quan", "File-Secret-4711")
    good = _secret_file("dsn", dsn)
    missing = good + ".none"
    big = _secret_file("big", "x" * (64 * 1024 + 1), "")
    empty = _secret_file("empty", "", "")
    for extra, want in (
            ({"QUAN_DS0_DSN": _with_password(dsn, "quan", "Env-Secret-4711"),
              "QUAN_DS0_DSN_FILE": good},
             "QUAN_DS0_DSN and QUAN_DS0_DSN_FILE are both set"),
            ({"QUAN_DS0_DSN": "", "QUAN_DS0_DSN_FILE": missing},
             "QUAN_DS0_DSN_FILE: cannot read %s: No such file or directory" % missing),
            ({"QUAN_DS0_DSN": "", "QUAN_DS0_DSN_FILE": big},
             "QUAN_DS0_DSN_FILE: %s holds more than 65536 bytes (64 KiB)" % big),
            ({"QUAN_CODE_SECRET": "", "QUAN_CODE_SECRET_FILE": empty},
             "QUAN_CODE_SECRET (from QUAN_CODE_SECRET_FILE): required, but %s is empty" % empty)):
        out = subprocess.run([os.path.join(BIN, "quan-engine")], env=dict(os.environ, **extra),
                             capture_output=True, text=True, timeout=10)
        check(out.returncode == 2 and want in out.stderr,
              "%s: exit %d: %s" % (want, out.returncode, out.stderr))
        check("Secret-4711" not in out.stdout + out.stderr, "a secret is printed: " + out.stderr)
    for path in list(paths.values()) + [good, big, empty]:
        os.unlink(path)


# A metric each binary's modules name in their descriptors (listed before any update), and one
# of another binary's it must not list.
OWN_METRICS = {"engine": ("quan_claims_total", "quan_dist_tasks_total"),
               "merchant-admin": ("quan_stats_rolled_total", "quan_claims_total"),
               "settlement": ("quan_rcopy_lookups_total", "quan_mq_published_total"),
               "distribution": ("quan_dist_tasks_total", "quan_rcopy_lookups_total")}


def test_all_four_ready_and_metrics_parse():
    procs = [Service(n, replicas=1) for n in SERVICES]
    try:
        for s in procs:
            s.wait_ready()
        for s in procs:
            status, _, body = request("GET", s.url + "/livez")
            check(status == 200, "%s /livez %d" % (s.name, status))
            status, headers, body = request("GET", s.url + "/metrics")
            check(status == 200, "%s /metrics %d" % (s.name, status))
            check(headers["Content-Type"].startswith("text/plain; version=0.0.4"),
                  headers["Content-Type"])
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            check("quan_http_requests" in families, "no request counter in " + s.name)
            check("quan_build_info" in families, "no build info in " + s.name)
            samples = [x for x in families["quan_http_requests"].samples
                       if x.labels.get("route") == "/livez"]
            check(samples and samples[0].value >= 1, "livez not counted")
            types = [line.split()[2] for line in body.decode().splitlines()
                     if line.startswith("# TYPE ")]
            check(len(types) == len(set(types)), "%s lists a metric twice" % s.name)
            own, other = OWN_METRICS[s.name]
            check(own in types and other not in types,
                  "%s lists %s: %s, %s: %s" % (s.name, own, own in types, other, other in types))
    finally:
        for s in procs:
            s.stop()


def test_idle_services_stay_under_16_mb():
    procs = [Service(n, replicas=1) for n in SERVICES]
    try:
        for s in procs:
            s.wait_ready()
        time.sleep(1)
        for s in procs:
            rss = s.rss_kb()
            print("    %s RSS %d kB" % (s.name, rss))
            check(0 < rss < 16 * 1024, "%s RSS %d kB" % (s.name, rss))
    finally:
        for s in procs:
            s.stop()


def lag_counts(s):
    """quan_loop_lag_seconds of s: (observations, those above 0.25 s)."""
    status, _, body = request("GET", s.url + "/metrics")
    check(status == 200, "/metrics %d" % status)
    buckets = {}
    for f in text_string_to_metric_families(body.decode()):
        if f.name == "quan_loop_lag_seconds":
            buckets = {x.labels["le"]: x.value for x in f.samples
                       if x.name == "quan_loop_lag_seconds_bucket"}
    check("+Inf" in buckets and "0.25" in buckets, "no loop-lag histogram: %s" % buckets)
    return buckets["+Inf"], buckets["+Inf"] - buckets["0.25"]


def test_loop_lag_shows_a_stalled_loop():
    """The loop-lag probe runs every 20 ms; a process stopped for 0.4 s (what a machine that
    gives it no core looks like to it) shows one observation above 0.25 s, and not before."""
    s = Service("settlement", replicas=1).wait_ready()
    try:
        n0, late0 = lag_counts(s)
        time.sleep(0.5)
        n1, late1 = lag_counts(s)
        check(n1 - n0 >= 10, "the probe ran %d times in 0.5 s" % (n1 - n0))
        check(late1 == late0, "late by over 0.25 s while nothing held it: %d" % (late1 - late0))
        s.signal(signal.SIGSTOP)
        time.sleep(0.4)
        s.signal(signal.SIGCONT)
        time.sleep(0.1)
        n2, late2 = lag_counts(s)
        check(late2 - late1 == 1, "the stop seen %d times (%d observations)" % (late2 - late1,
                                                                               n2 - n1))
    finally:
        s.stop()


def stalled_log_reader(flush_ms):
    """stdout a pipe nobody reads (a stuck log shipper): the loop keeps answering while its access
    lines fill the pipe, the lines that find no room are counted as dropped, the lines that went
    out are whole, and once the reader reads again, lines flow again."""
    port = free_port()
    env = dict(os.environ, QUAN_HTTP_PORT=str(port), QUAN_HTTP_BIND="127.0.0.1",
               QUAN_LUA_DIR=os.path.join(ROOT, "lua-scripts"), QUAN_LOG_LEVEL="info",
               QUAN_CODE_SECRET="test-secret-0123456789abcdef", QUAN_LOG_FLUSH_MS=str(flush_ms))
    proc = subprocess.Popen([os.path.join(BIN, "quan-settlement")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        def up():
            try:
                return request("GET", url + "/livez", timeout=1)[0] == 200
            except OSError:
                return False
        check(wait_for(up, 20), "settlement did not start")
        # some 2 000 access lines of about 250 bytes: eight times a pipe's 64 KiB and the
        # loop's own 64 KiB buffer
        started = time.time()
        for i in range(2000):
            with urlopen(url + "/livez", timeout=2) as r:
                check(r.status == 200, "livez %d: %d" % (i, r.status))
        took = time.time() - started
        check(took < 30, "2000 probes took %.1f s" % took)
        status, _, body = request("GET", url + "/metrics")
        dropped = [x.value for f in text_string_to_metric_families(body.decode())
                   if f.name == "quan_log_lines_dropped" for x in f.samples
                   if x.name == "quan_log_lines_dropped_total"]
        check(dropped and dropped[0] > 0, "no line counted as dropped: %s" % dropped)
        # the reader comes back: what went out is whole lines, and new lines arrive
        os.set_blocking(proc.stdout.fileno(), False)
        got = b""
        deadline = time.time() + 10
        marker = "/back-again"
        while time.time() < deadline and marker.encode() not in got:
            chunk = proc.stdout.read() or b""
            got += chunk
            if not chunk:
                request("GET", url + marker, timeout=2)
                time.sleep(0.2)
        check(marker.encode() in got, "no line after the reader came back")
        lines = got.decode().splitlines()
        for line in lines[:-1]:
            json.loads(line)  # whole: each parses
        check(len(lines) > 100, "%d lines went out" % len(lines))
        check(proc.poll() is None, "settlement exited")
    finally:
        proc.kill()
        proc.wait()


def test_a_log_reader_that_stops_reading_never_stalls_the_loop():
    stalled_log_reader(100)  # the default: many lines a write


def test_nor_with_each_line_written_at_once():
    stalled_log_reader(0)  # QUAN_LOG_FLUSH_MS=0: each line at once, still never waited for


def test_unknown_path_404_wrong_method_405_and_request_id():
    s = Service("engine", replicas=1).wait_ready()
    try:
        status, headers, body = request("GET", s.url + "/nope", headers={"X-Request-Id": "abc-1"})
        check(status == 404 and body["code"] == "A000404", str(body))
        check(headers["X-Request-Id"] == "abc-1" and body["requestId"] == "abc-1", str(body))
        status, _, body = request("POST", s.url + "/livez")
        check(status == 405, "status %d" % status)
    finally:
        s.stop()


def test_sigterm_drains_in_flight_and_refuses_new():
    s = Service("engine", {"QUAN_DEBUG_ROUTES": "true", "QUAN_LOG_LEVEL": "info"},
                replicas=1).wait_ready()
    result = {}

    def slow():
        result["r"] = request("GET", s.url + "/debug/sleep?ms=1500", timeout=10)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    started = time.time()
    s.signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = False
    try:
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
    except OSError:
        refused = True
    check(refused, "new connection accepted while draining")
    rc = s.wait_exit(30)
    t.join(10)
    check(rc == 0, "exit code %s" % rc)
    check(time.time() - started < 30, "drain took too long")
    status, _, body = result.get("r", (None, None, None))
    check(status == 200 and body["data"] == "slept", "in-flight request: %s %s" % (status, body))
    check("drained; exiting" in s.tail(), s.tail())
    s.stop()


def test_readyz_503_while_draining():
    s = Service("settlement", {"QUAN_DEBUG_ROUTES": "true"}, replicas=1).wait_ready()
    # Keep-alive connection opened before SIGTERM still gets answers while draining.
    conn = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    t = threading.Thread(target=lambda: request("GET", s.url + "/debug/sleep?ms=1000"))
    t.start()
    time.sleep(0.2)
    s.signal(signal.SIGTERM)
    time.sleep(0.2)
    conn.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = conn.recv(4096).decode(errors="replace")
    conn.close()
    t.join(10)
    check(reply.startswith("HTTP/1.1 503"), reply[:80])
    check(s.wait_exit(30) == 0, "exit code")
    s.stop()


def test_second_sigterm_exits_at_once():
    s = Service("settlement", {"QUAN_DEBUG_ROUTES": "true"}, replicas=1).wait_ready()
    def hold():
        try:
            request("GET", s.url + "/debug/sleep?ms=20000", timeout=30)
        except OSError:
            pass  # the process is killed under it: expected

    t = threading.Thread(target=hold)
    t.daemon = True
    t.start()
    time.sleep(0.3)
    s.signal(signal.SIGTERM)
    time.sleep(0.3)
    check(s.proc.poll() is None, "exited before the in-flight request finished")
    started = time.time()
    s.signal(signal.SIGTERM)
    rc = s.wait_exit(5)
    check(rc is not None and time.time() - started < 2, "second SIGTERM did not exit at once")
    s.stop()


if __name__ == "__main__":
    run([test_help_lists_every_variable,
         test_bad_config_stops_with_the_variable_named,
         test_redis_sentinel_settings_checked_at_start,
         test_secrets_are_never_logged,
         test_secret_files,
         test_all_four_ready_and_metrics_parse,
         test_idle_services_stay_under_16_mb,
         test_loop_lag_shows_a_stalled_loop,
         test_a_log_reader_that_stops_reading_never_stalls_the_loop,
         test_nor_with_each_line_written_at_once,
         test_unknown_path_404_wrong_method_405_and_request_id,
         test_sigterm_drains_in_flight_and_refuses_new,
         test_readyz_503_while_draining,
         test_second_sigterm_exits_at_once])
