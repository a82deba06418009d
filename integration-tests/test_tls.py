"""Every link to a store encrypted and verified against a CA. deploy/local/infra.sh with
QUAN_INFRA_TLS=1, in a directory of this suite's own, makes a CA and the servers' certificates
(deploy/local/tls.sh) and starts PostgreSQL with ssl = on and hostssl lines only, RabbitMQ with a
TLS listener only, Redis with its TLS port only and a stunnel client tunnel in front of it. The
four services run on verify-full DSNs, amqps:// URLs and the tunnel: a short walk (a template
created, looked up, claimed directly and through RabbitMQ, the wallet) succeeds, and every
connection they hold is encrypted (pg_stat_ssl, RabbitMQ's connection list), also after the
servers cut every session (the pools and MQ threads connect again the same way). Then for each
store a plaintext client and a client trusting the wrong CA are refused: PostgreSQL's server says
"no encryption", libpq "certificate verify failed" in the service's log; RabbitMQ answers no AMQP
on its port to plaintext, and a service's log names cacertfile (or the host name check); Redis
answers nothing in plaintext, and a tunnel trusting the wrong CA keeps the engine from starting,
or makes a running one not ready until a right tunnel is back. Last, deploy/k8s-tls: its
stunnel.conf carries PING to this Redis, and its manifests mount every CA file they name."""

import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time

from quan import (BIN, ROOT, SERVICES, TMP, Service, check, infra_sh, private_stack, request,
                  run, wait_for)

PROC_SH = os.path.join(ROOT, "deploy", "local", "proc.sh")
MA = "/api/merchant-admin/"
EN = "/api/engine/"

DIR = None    # the infrastructure's directory
ENV = {}      # its env file
svc = {}      # name -> Service
shop = 0


TLS_STACK = {"QUAN_INFRA_TLS": "1", "QUAN_INFRA_DURABILITY": "fast"}


def tls(name):
    return os.path.join(ENV["QUAN_INFRA_TLS_DIR"], name)


def psql(dsn, sql):
    """(exit code, output, error) of psql on dsn, with no PG* variable of the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    out = subprocess.run(["psql", "-X", "-At", "-d", dsn, "-c", sql], env=env,
                         capture_output=True, text=True, timeout=30)
    return out.returncode, out.stdout.strip(), out.stderr.strip()


def dsn(db, query):
    return "postgresql://quan@localhost:%s/%s?%s" % (ENV["QUAN_INFRA_PG_PORT"], db, query)


def rabbitmqctl(*args):
    out = subprocess.run([ENV["QUAN_INFRA_RABBITMQCTL"], *args], capture_output=True, text=True,
                         timeout=60)
    check(out.returncode == 0, "rabbitmqctl %s: %s" % (args, out.stderr))
    return out.stdout


def log_has(s, text, timeout):
    return wait_for(lambda: text in s.tail(400), timeout)


def refused(s, text, timeout=20):
    """s says text in its log, then either exits with an error at start (a store it cannot
    reach at start is fatal to some services) or stays up answering 503 on /readyz."""
    check(log_has(s, text, timeout), "%s: no log line with %r:\n%s" % (s.name, text, s.tail()))
    deadline = time.time() + 1.5
    while time.time() < deadline:
        if s.proc.poll() is not None:
            check(s.proc.returncode != 0, "%s exited 0:\n%s" % (s.name, s.tail()))
            return
        try:
            st, _, _ = request("GET", s.url + "/readyz", timeout=2)
            check(st != 200, "%s is ready with a link that must be refused" % s.name)
        except OSError:
            pass
        time.sleep(0.3)


def merchant():
    return {"X-User-Id": "1", "X-Shop-Number": str(shop)}


def fmt_time(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


# ---------------------------------------------------------------- through TLS

def test_walk_over_tls():
    """A template created, looked up, claimed (directly and through RabbitMQ), the wallet."""
    walk()


def walk(retry_s=0):
    """The walk; with retry_s, a step answered 503 (retryable: a connection being opened again
    after the servers cut them) is tried again for up to that long."""
    deadline = time.time() + retry_s

    def call(method, url, body, hdr):
        while True:
            st, h, r = request(method, url, body, hdr)
            if st != 503 or time.time() >= deadline:
                return st, h, r
            time.sleep(0.3)

    body = {"name": "tls-%x" % random.getrandbits(32), "source": 0, "target": 1, "type": 0,
            "validStartTime": fmt_time(time.time() - 86400),
            "validEndTime": fmt_time(time.time() + 30 * 86400), "stock": 10,
            "receiveRule": {"limitPerPerson": 1},
            "consumeRule": {"termsOfUse": 0, "maximumDiscountAmount": 5, "validityPeriod": 48}}
    st, _, r = call("POST", svc["merchant-admin"].url + MA + "coupon-template/create", body,
                    merchant())
    check(st == 200, "create: %s %s" % (st, r))
    tpl = r["data"]["id"]
    st, _, r = call("GET", svc["engine"].url + EN + "coupon-template/query?shopNumber=%d"
                       "&couponTemplateId=%s" % (shop, tpl), None, {"X-User-Id": "7"})
    check(st == 200 and str(r["data"]["id"]) == str(tpl), "query: %s %s" % (st, r))
    claim = {"source": 0, "shopNumber": str(shop), "couponTemplateId": str(tpl)}
    user = random.randint(10 ** 12, 9 * 10 ** 15)
    st, _, r = call("POST", svc["engine"].url + EN + "user-coupon/redeem", claim,
                       {"X-User-Id": str(user)})
    check(st == 200, "redeem: %s %s" % (st, r))
    # through RabbitMQ: the engine publishes the claim and its consumer settles it
    mq_user = user + 1
    st, _, r = call("POST", svc["engine"].url + EN + "user-coupon/redeem-mq", claim,
                       {"X-User-Id": str(mq_user)})
    check(st == 202, "redeem-mq: %s %s" % (st, r))
    rid = r["data"]["requestId"]
    seen = {}

    def settled():
        s, _, rr = request("GET", svc["engine"].url + EN + "user-coupon/redeem-result?requestId="
                           + rid, None, {"X-User-Id": str(mq_user)})
        seen["r"] = (s, rr)
        return s == 200 and rr["data"]["status"] == "SUCCESS"
    check(wait_for(settled, 20), "redeem-mq never settled: %s" % (seen,))
    for u in (user, mq_user):
        st, _, r = call("GET", svc["engine"].url + EN + "user-coupon/list", None,
                           {"X-User-Id": str(u)})
        check(st == 200 and [c["couponTemplateId"] for c in r["data"]] == [str(tpl)],
              "wallet of %d: %s %s" % (u, st, r))


def test_reconnects_keep_tls():
    """Every service session cut by the servers (pg_terminate_backend, RabbitMQ closing every
    connection): the pools and the MQ threads connect again with the same DSNs and URLs, the
    walk succeeds again and every new connection is TLS too."""
    def pids(db):
        rc, out, err = psql(ENV["QUAN_DS0_DSN" if db == "ds_0" else "QUAN_DS1_DSN"],
                            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'quan-%'")
        check(rc == 0, err)
        return set(out.split())
    before = {db: pids(db) for db in ("ds_0", "ds_1")}
    for db in ("ds_0", "ds_1"):
        rc, _, err = psql(ENV["QUAN_DS0_DSN" if db == "ds_0" else "QUAN_DS1_DSN"],
                          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                          "WHERE application_name LIKE 'quan-%'")
        check(rc == 0, err)
    rabbitmqctl("close_all_connections", "test_tls: reconnect")
    walk(retry_s=30)
    check(wait_for(lambda: all(pids(db) - before[db] for db in before), 10),
          "no new sessions after the cut: %s" % before)
    test_every_connection_encrypted()


def test_tools_over_tls():
    """The operators' tools take the same settings: quan-dlq lists a dead-letter queue over
    amqps, psql reads through the verify-full DSN and redis-cli through the tunnel."""
    out = subprocess.run([os.path.join(BIN, "quan-dlq"), "list", "engine.redeem"],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, "quan-dlq over amqps: %d %s %s" % (out.returncode, out.stdout,
                                                                 out.stderr))
    rc, got, err = psql(ENV["QUAN_DS1_DSN"], "SELECT count(*) FROM schema_migrations")
    check(rc == 0 and int(got) > 0, "psql over TLS: %d %s %s" % (rc, got, err))
    r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", ENV["QUAN_REDIS_PORT"], "PING"],
                       capture_output=True, text=True, timeout=15)
    check(r.stdout.strip() == "PONG", "redis-cli through the tunnel: %r" % r.stdout)


def test_every_connection_encrypted():
    """The services' PostgreSQL sessions are TLS (pg_stat_ssl), so are their RabbitMQ
    connections; Redis has no plaintext port at all (port 0), so its clients came through the
    tunnel."""
    for db in ("ds_0", "ds_1"):
        rc, out, err = psql(ENV["QUAN_DS0_DSN" if db == "ds_0" else "QUAN_DS1_DSN"],
                            "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN "
                            "pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'quan-%'")
        check(rc == 0, "pg_stat_ssl on %s: %s" % (db, err))
        rows = [line.split("|") for line in out.splitlines()]
        check(len(rows) >= 4, "%s: too few service sessions: %s" % (db, rows))
        check(all(ssl_on == "t" for _, ssl_on in rows),
              "%s: a session without TLS: %s" % (db, rows))
    conns = [line.split("\t") for line in
             rabbitmqctl("list_connections", "-q", "--no-table-headers", "name",
                         "ssl").splitlines() if line.strip()]
    check(len(conns) >= 3, "too few connections on RabbitMQ: %s" % conns)
    check(all(c[-1] == "true" for c in conns), "a RabbitMQ connection without TLS: %s" % conns)
    conf = open(os.path.join(DIR, "redis", "redis.conf")).read()
    check("\nport 0\n" in conf and "tls-port %s" % ENV["QUAN_INFRA_REDIS_TLS_PORT"] in conf,
          "redis.conf is not TLS only:\n%s" % conf)
    check(ENV["QUAN_REDIS_PORT"] == ENV["QUAN_INFRA_REDIS_TUNNEL_PORT"],
          "the services do not go through the tunnel: %s" % ENV["QUAN_REDIS_PORT"])


# ---------------------------------------------------------------- PostgreSQL refusals

def test_postgres_refusals():
    ca = tls("ca.crt")
    rc, out, err = psql(dsn("ds_0", "sslmode=verify-full&sslrootcert=" + ca),
                        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    check(rc == 0 and out == "t", "verify-full: %d %s %s" % (rc, out, err))
    # a client certificate through the DSN: the server sees who it is
    rc, out, err = psql(dsn("ds_0", "sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s" % (
        ca, tls("client.crt"), tls("client.key"))),
        "SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    check(rc == 0 and out == "/CN=quan", "client certificate: %d %s %s" % (rc, out, err))
    rc, out, err = psql(dsn("ds_0", "sslmode=disable"), "SELECT 1")
    check(rc != 0 and "no encryption" in err, "sslmode=disable: %d %s %s" % (rc, out, err))
    rc, out, err = psql(dsn("ds_0", "sslmode=verify-full&sslrootcert=" + tls("wrong-ca.crt")),
                        "SELECT 1")
    check(rc != 0 and "certificate verify failed" in err, "wrong CA: %d %s %s" % (rc, out, err))
    # a service whose DSN trusts the wrong CA: refused by libpq, said in its log, never ready
    s = Service("settlement", {"QUAN_DS0_DSN": dsn("ds_0", "sslmode=verify-full&sslrootcert="
                                                   + tls("wrong-ca.crt"))})
    try:
        refused(s, "SSL error: certificate verify failed")
    finally:
        s.stop()
    # and one whose DSN asks for no TLS: the server refuses it
    s = Service("settlement", {"QUAN_DS1_DSN": dsn("ds_1", "sslmode=disable")})
    try:
        refused(s, "no encryption")
    finally:
        s.stop()


# ---------------------------------------------------------------- RabbitMQ refusals

def amqp_plain_answer(port):
    """What the port answers to a plaintext AMQP 0-9-1 header: b'' when it closes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            return s.recv(7)
        except (ConnectionResetError, socket.timeout):
            return b""
    finally:
        s.close()


def test_rabbitmq_refusals():
    port = int(ENV["QUAN_INFRA_AMQP_PORT"])
    # the TLS listener speaks AMQP once the certificate checks out
    ctx = ssl.create_default_context(cafile=tls("ca.crt"))
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                         server_hostname="localhost") as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        f = s.recv(7)
        check(len(f) == 7 and f[0] == 1, "no Connection.Start over TLS: %r" % f)
    # plaintext: no Connection.Start (the TLS listener closes on a non-TLS hello), and the node
    # has no other AMQP listener than the TLS one
    got = amqp_plain_answer(port)
    check(not (len(got) == 7 and got[0] == 1), "plaintext AMQP answered: %r" % got)
    listeners = rabbitmqctl("eval", "rabbit_networking:active_listeners().")
    check("amqp/ssl" in listeners and "protocol = amqp," not in listeners,
          "RabbitMQ listeners: %s" % listeners)
    # a trusted chain is not enough: the wrong CA
    wrong = ssl.create_default_context(cafile=tls("wrong-ca.crt"))
    try:
        wrong.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5),
                          server_hostname="localhost").close()
        check(False, "a client trusting the wrong CA completed the handshake")
    except ssl.SSLCertVerificationError:
        pass
    url = ENV["QUAN_AMQP_URL"]
    base = url.split("?")[0]
    cases = [
        # amqp:// to the TLS port: the broker closes on the plaintext protocol header
        (base.replace("amqps://", "amqp://", 1), "cannot connect to declare queues: login: "),
        (base + "?cacertfile=" + tls("wrong-ca.crt"), "not signed by an authority of cacertfile"),
        (base.replace("@localhost:", "@127.0.0.1:") + "?cacertfile=" + tls("ca.crt"),
         "not a DNS name of the broker's certificate"),
    ]
    for u, text in cases:
        s = Service("merchant-admin", {"QUAN_AMQP_URL": u})
        try:
            refused(s, text)
            check("guest:guest" not in s.tail(400), "the password in the log:\n%s" % s.tail())
        finally:
            s.stop()
    # a file the URL names that cannot be read: the service refuses to start, naming the setting
    p = subprocess.run([os.path.join(BIN, "quan-merchant-admin")],
                       env=dict(os.environ, QUAN_AMQP_URL=base + "?cacertfile=/nonexistent.crt"),
                       capture_output=True, text=True, timeout=30)
    out = p.stdout + p.stderr
    check(p.returncode == 2 and "QUAN_AMQP_URL" in out and "cacertfile /nonexistent.crt" in out
          and "guest:guest" not in out, "unreadable cacertfile: %d %s" % (p.returncode, out))


# ---------------------------------------------------------------- Redis refusals

class Tunnel:
    """A stunnel client tunnel of this suite (proc.sh's write_stunnel_conf): 127.0.0.1:port in
    plaintext to Redis' TLS port, trusting the CA file ca."""

    def __init__(self, name, port, ca):
        self.dir = os.path.join(DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = port
        conf = os.path.join(self.dir, "stunnel.conf")
        subprocess.run(["bash", "-c", '. "$1"; write_stunnel_conf "$2" "127.0.0.1:$3" '
                        '"127.0.0.1:$4" "$5" localhost', "-", PROC_SH, conf, str(port),
                        ENV["QUAN_INFRA_REDIS_TLS_PORT"], ca], check=True, timeout=10)
        self.log_path = os.path.join(self.dir, "stunnel.log")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(["stunnel", conf], stdout=self.log, stderr=subprocess.STDOUT)
        check(wait_for(lambda: subprocess.run(["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/%d"
                                               % port], capture_output=True).returncode == 0, 10),
              "the tunnel %s does not listen" % name)

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


def test_redis_refusals():
    from ports import free_port
    tls_port = ENV["QUAN_INFRA_REDIS_TLS_PORT"]
    plain = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", tls_port, "PING"],
                           capture_output=True, text=True, timeout=15)
    check("PONG" not in plain.stdout, "plaintext PING answered on the TLS port: %r" % plain.stdout)
    ok = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", tls_port, "--tls", "--cacert",
                         tls("ca.crt"), "--sni", "localhost", "PING"],
                        capture_output=True, text=True, timeout=15)
    check(ok.stdout.strip() == "PONG", "TLS PING: %r %r" % (ok.stdout, ok.stderr))
    # an engine starting behind a tunnel that trusts the wrong CA never sees Redis
    tun = Tunnel("tunnel-wrong", free_port(), tls("wrong-ca.crt"))
    s = None
    try:
        s = Service("engine", {"QUAN_REDIS_PORT": str(tun.port)})
        refused(s, "Connection reset by peer")
        # (the handshake, and its log line, follow the connect the engine's reconnect makes)
        check(wait_for(lambda: "certificate verify failed" in tun.text(), 15),
              "stunnel's log:\n%s" % tun.text()[-2000:])
    finally:
        if s:
            s.stop()
        tun.stop()
    # a running engine whose tunnel is replaced by one trusting the wrong CA (a CA rotated on
    # one side only): it stays up, not ready, until a right tunnel is back
    port = free_port()
    tun = Tunnel("tunnel-right", port, tls("ca.crt"))
    s = None
    try:
        s = Service("engine", {"QUAN_REDIS_PORT": str(port)}).wait_ready()
        tun.stop()
        tun = Tunnel("tunnel-rotated", port, tls("wrong-ca.crt"))

        def not_ready_now():
            try:
                return request("GET", s.url + "/readyz", timeout=2)[0] == 503
            except OSError:
                return False
        check(wait_for(not_ready_now, 15), "the engine stays ready without Redis:\n%s" % s.tail())
        check(s.proc.poll() is None, "the engine exited:\n%s" % s.tail())
        # (the handshake, and its log line, follow the connect the engine's reconnect makes)
        check(wait_for(lambda: "certificate verify failed" in tun.text(), 15),
              "stunnel's log:\n%s" % tun.text()[-2000:])
        tun.stop()
        tun = Tunnel("tunnel-right", port, tls("ca.crt"))
        s.wait_ready(30)
    finally:
        if s:
            s.stop()
        tun.stop()


def test_k8s_tunnel_conf():
    """deploy/k8s-tls's stunnel.conf, its addresses and CA put to this run's (the rest as
    shipped), run as an unprivileged user as the sidecar is: PING through it reaches Redis."""
    with open(os.path.join(ROOT, "deploy", "k8s-tls", "stunnel.conf")) as f:
        shipped = f.read()
    from ports import free_port
    port = free_port()
    put = {"accept": "127.0.0.1:%d" % port,
           "connect": "127.0.0.1:%s" % ENV["QUAN_INFRA_REDIS_TLS_PORT"],
           "CAfile": tls("ca.crt"), "checkHost": "localhost", "sni": "localhost"}
    lines, done = [], set()
    for line in shipped.splitlines():
        key = line.split("=")[0].strip()
        if key in put and not line.startswith(";"):
            line = "%s = %s" % (key, put[key])
            done.add(key)
        lines.append(line)
    check(done == set(put), "stunnel.conf lacks %s" % (set(put) - done))
    conf = os.path.join(DIR, "k8s-stunnel.conf")
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(conf, 0o644)
    cmd = ["stunnel", conf]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "nobody", "--"] + cmd
    log = open(os.path.join(DIR, "k8s-stunnel.log"), "wb")
    tun = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        def pong():
            r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "PING"],
                               capture_output=True, text=True, timeout=10)
            return r.stdout.strip() == "PONG"
        check(wait_for(pong, 10), "no PONG through the shipped tunnel:\n%s"
              % open(os.path.join(DIR, "k8s-stunnel.log"), errors="replace").read()[-2000:])
    finally:
        tun.terminate()
        tun.wait(10)
        log.close()


def test_k8s_overlay():
    """deploy/k8s-tls as kubectl kustomize renders it: every Deployment that uses Redis has the
    tunnel as a native sidecar, with the shipped stunnel.conf and the CA where that file says;
    the services reach Redis at the tunnel; every DSN is verify-full and every AMQP URL amqps,
    naming a CA file that each container reading them (and the migration Job) mounts."""
    import json
    import urllib.parse
    import yaml
    if not shutil.which("kubectl"):
        print("kubectl missing: the overlay is not rendered here")
        return
    out = subprocess.run(["kubectl", "kustomize", os.path.join(ROOT, "deploy", "k8s-tls")],
                         capture_output=True, text=True, timeout=120)
    check(out.returncode == 0, "kubectl kustomize deploy/k8s-tls: %s" % out.stderr)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    cfg = kind[("ConfigMap", "quan-config")]["data"]
    check((cfg.get("QUAN_REDIS_CLUSTER_NODES"), cfg["QUAN_REDIS_HOST"], cfg["QUAN_REDIS_PORT"])
          == ("", "127.0.0.1", "6379"), "quan-config: %s" % cfg)
    sec = kind[("Secret", "quan-secrets")]["stringData"]
    ca_files = set()
    for k in ("QUAN_DS0_DSN", "QUAN_DS1_DSN"):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(sec[k]).query)
        check(q.get("sslmode") == ["verify-full"] and q.get("sslrootcert"), "%s: %s" % (k, sec[k]))
        ca_files.add(q["sslrootcert"][0])
    for u in sec["QUAN_AMQP_URL"].split(","):
        sp = urllib.parse.urlsplit(u)
        q = urllib.parse.parse_qs(sp.query)
        check(sp.scheme == "amqps" and q.get("cacertfile"), "QUAN_AMQP_URL: %s" % u)
        ca_files.add(q["cacertfile"][0])
    with open(os.path.join(ROOT, "deploy", "k8s-tls", "stunnel.conf")) as f:
        shipped = f.read()
    stunnel_ca = [line.split("=", 1)[1].strip() for line in shipped.splitlines()
                  if line.split("=")[0].strip() == "CAfile"]
    check(len(stunnel_ca) == 1, "stunnel.conf names no CAfile")

    def mounted(ctr, vols, path):
        """The volume of ctr holding path, or None."""
        for m in ctr.get("volumeMounts") or []:
            if path.startswith(m["mountPath"].rstrip("/") + "/"):
                return vols.get(m["name"])
        return None
    users = [d for d in docs
             if d["kind"] == "Deployment" and d["metadata"]["name"] != "quan-gateway"]
    check(len(users) == 5, "Deployments: %s" % [d["metadata"]["name"] for d in users])
    for d in users + [kind[("Job", "quan-migrate")]]:
        name = d["metadata"]["name"]
        spec = d["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        main_ctr = spec["containers"][0]
        for f in ca_files:
            v = mounted(main_ctr, vols, f)
            check(v and v.get("secret", {}).get("secretName") == "quan-store-tls",
                  "%s: %s is not in a mounted quan-store-tls: %s" % (name, f, json.dumps(vols)))
        if d["kind"] == "Job":
            continue
        side = [c for c in spec.get("initContainers") or [] if c["name"] == "redis-tunnel"]
        check(len(side) == 1 and side[0].get("restartPolicy") == "Always",
              "%s: no native sidecar redis-tunnel" % name)
        t = side[0]
        conf = t["command"][-1]
        cm = mounted(t, vols, conf)
        check(cm and "configMap" in cm, "%s: %s is not a mounted ConfigMap" % (name, conf))
        data = kind[("ConfigMap", cm["configMap"]["name"])]["data"]
        check(data.get(os.path.basename(conf)) == shipped,
              "%s: not the shipped stunnel.conf" % name)
        ca = mounted(t, vols, stunnel_ca[0])
        check(ca and ca.get("secret", {}).get("secretName") == "quan-store-tls",
              "%s: the tunnel's CAfile is not mounted" % name)
        check(t["startupProbe"]["tcpSocket"]["port"] == 6379, "%s: startupProbe" % name)


def main():
    global DIR, ENV, shop
    DIR = tempfile.mkdtemp(prefix="tls-", dir=TMP)
    os.chmod(DIR, 0o755)  # PostgreSQL runs as user postgres when we are root
    shop = random.randint(10 ** 12, 9 * 10 ** 12)
    try:
        ENV = private_stack(DIR, TLS_STACK)
        for name in SERVICES:
            svc[name] = Service(name, {"QUAN_LOG_LEVEL": "info"})
        for s in svc.values():
            s.wait_ready()
        run([test_walk_over_tls, test_every_connection_encrypted, test_tools_over_tls,
             test_reconnects_keep_tls,
             test_postgres_refusals,
             test_rabbitmq_refusals, test_redis_refusals, test_k8s_tunnel_conf,
             test_k8s_overlay])
    finally:
        for s in svc.values():
            s.stop()
        try:
            infra_sh(DIR, "stop", TLS_STACK)
        finally:
            shutil.rmtree(DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
