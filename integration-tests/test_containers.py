"""The images of deploy/Dockerfile run as containers, configured as deploy/k8s configures them.

`make image` (deploy/image.sh) builds them first (incremental: the bases and the layer cache are
kept), then, against this run's PostgreSQL, Redis and RabbitMQ:
  - the migration Job's command (deploy/k8s/config.yaml) runs from its image;
  - each Deployment's container starts (podman, host network, all at once) with the environment
    of quan-config and its own env, and the keys of quan-secrets its volume holds as files
    where it mounts them (read-only, root:fsGroup, the volume's mode; the user gets fsGroup as
    a supplementary group, as the kubelet gives it), only the endpoints overridden (free HTTP
    ports on 127.0.0.1, this run's stores, a RabbitMQ virtual host of its own so that the
    manifests' quorum queues meet no classic queue of another suite), in a variable or in its
    secret file; as the user its securityContext names, with a read-only root filesystem and
    nothing writable but the emptyDirs it mounts (tmpfs), and becomes ready (/readyz; the
    gateway: its port);
  - the README's walk-through through the gateway container, with tokens from the image's
    quan-token: a template created, queried, claimed, priced against an order, a request
    without a token refused (counted in the gateway's /metrics, on k8s/metrics.conf's port,
    with the token's cache hits), then a spreadsheet task pushed to users 1001-1003 with its
    failure report;
  - the console's Chart.js comes from the gateway's image: /console/vendor/chart.umd.js is the
    version deploy/console/package-lock.json pins, byte for byte what npm ci installed;
  - `podman stop -t <terminationGracePeriodSeconds>`: each drains and exits 0 in time.
The gateway's ConfigMap files are deploy/gateway's own; its listen.conf and upstreams.conf
(deploy/gateway/k8s/) get this run's ports, the Services' names resolving to 127.0.0.1. The
console's ConfigMap (quan-console) is deploy/console's files where its items put them.
The task's spreadsheet is in a read-only volume at QUAN_FILE_ROOT's default.

SKIPPED (0 passed, 0 failed) where podman or mmdebstrap is missing or podman cannot run a
container; QUAN_TEST_CONTAINERS=0 skips it too. Prints the seconds of the build and of the rest.
"""

import io
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quan import ROOT, TMP, check, free_port, request, run, wait_for  # noqa: E402

PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
SHOP = "1810714735922956666"
RUN_ID = "quan-it-%d" % os.getpid()
VHOST = RUN_ID
FILE_ROOT = "/var/lib/quan/files"  # QUAN_FILE_ROOT's default (common/outbound/fetch.h)
# ulimits must be given (podman's defaults are refused by some hosts) and at most this process's
# hard limits (a container may not raise them).
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
_NPROC = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)  # threads: a few dozen
ULIMITS = ["--ulimit", "nofile=%d:%d" % (_NOFILE, _NOFILE),
           "--ulimit", "nproc=%d:%d" % (_NPROC, _NPROC)]

timings = {}
state = {}


def skip(reason):
    print("SKIPPED: %s" % reason)
    print("0 passed, 0 failed")
    sys.exit(0)


def sh(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def podman(*args, timeout=120):
    return sh(PODMAN + list(args), timeout=timeout)


def preflight():
    if os.environ.get("QUAN_TEST_CONTAINERS", "1") == "0":
        skip("QUAN_TEST_CONTAINERS=0")
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            skip("%s is not installed (deploy/local/deps.sh --image installs it)" % tool)
    r = podman("info", timeout=60)
    if r.returncode != 0:
        skip("podman info failed: %s" % r.stderr.strip()[-300:])


# ---------------------------------------------------------------- the manifests

def manifests():
    docs = []
    for name in sorted(os.listdir(os.path.join(ROOT, "deploy", "k8s"))):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            with open(os.path.join(ROOT, "deploy", "k8s", name), encoding="utf-8") as f:
                docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def load():
    docs = manifests()
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = by[("ConfigMap", "quan-config")]["data"]
    secrets = by[("Secret", "quan-secrets")]["stringData"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    job = by[("Job", "quan-migrate")]
    return config, secrets, deployments, job


def container_env(c, config, secrets):
    """The environment a container of the manifests gets: envFrom, then env (which wins)."""
    env = {}
    for src in c.get("envFrom", []):
        if "configMapRef" in src:
            env.update(config)
        elif "secretRef" in src:
            env.update(secrets)
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[e["name"]] = secrets[e["valueFrom"]["secretKeyRef"]["key"]]
    return env


def with_endpoints(env, values, port=None):
    """This run's endpoints into env, or into values (the secret files' contents) for a variable
    the container reads from its file (NAME_FILE: setting NAME too would be refused)."""
    for k, v in endpoints(port).items():
        if k + "_FILE" in env:
            values[k] = v
        else:
            env[k] = v


def secret_mounts(name, spec, c, values):
    """podman arguments for the container's quan-secrets volumes: each a directory of the keys
    its items name (values: their contents), root-owned, of the pod's fsGroup, in the volume's
    mode, mounted read-only; and the fsGroup as a supplementary group of the user."""
    args = []
    group = (spec.get("securityContext") or {}).get("fsGroup")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        sec = volumes[m["name"]].get("secret")
        if not sec:
            continue
        check(sec["secretName"] == "quan-secrets", "a Secret this suite does not know: %s" % sec)
        d = os.path.join(state["dir"], "secrets-%s-%s" % (name, m["name"]))
        os.makedirs(d, mode=0o755)
        os.chmod(d, 0o755)
        items = sec.get("items") or [{"key": k, "path": k} for k in values]
        for it in items:
            path = os.path.join(d, it["path"])
            with open(path, "w", encoding="utf-8") as f:
                f.write(values[it["key"]])
            os.chown(path, 0, group if group is not None else 0)
            os.chmod(path, it.get("mode", sec.get("defaultMode", 0o644)))
        args += ["-v", "%s:%s:ro" % (d, m["mountPath"])]
    if group is not None:
        args += ["--group-add", str(group)]
    return args


def endpoints(port=None):
    """This run's stores (and the container's HTTP port): the only values overridden."""
    e = {"QUAN_DS0_DSN": os.environ["QUAN_DS0_DSN"], "QUAN_DS1_DSN": os.environ["QUAN_DS1_DSN"],
         "QUAN_REDIS_HOST": os.environ.get("QUAN_REDIS_HOST", "127.0.0.1"),
         "QUAN_REDIS_PORT": os.environ["QUAN_REDIS_PORT"],
         "QUAN_REDIS_CLUSTER_NODES": os.environ.get("QUAN_REDIS_CLUSTER_NODES", ""),
         "QUAN_AMQP_URL": os.environ["QUAN_AMQP_URL"].rstrip("/") + "/" + VHOST}
    if port:
        e.update({"QUAN_HTTP_PORT": str(port), "QUAN_HTTP_BIND": "127.0.0.1"})
    return e


def env_file(name, env):
    """Variables (secrets among them) in a 0600 file, not on podman's command line."""
    path = os.path.join(state["dir"], name + ".env")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        for k, v in sorted(env.items()):
            check("\n" not in v, "%s has a newline" % k)
            f.write("%s=%s\n" % (k, v))
    return path


def rabbitmqctl(*args):
    return sh([os.environ["QUAN_INFRA_RABBITMQCTL"]] + list(args), timeout=60)


# ---------------------------------------------------------------- tests

def test_images_build():
    """deploy/image.sh: the images deploy/k8s and deploy/k8s-tls name, built or found up to
    date; none over 100 MB but the Redis tunnel (150 MB)."""
    t0 = time.time()
    # The virtual host meanwhile (rabbitmqctl starts an Erlang VM: seconds).
    vh = threading.Thread(target=lambda: state.update(vhost=(
        rabbitmqctl("add_vhost", VHOST), rabbitmqctl("set_permissions", "-p", VHOST, "guest",
                                                     ".*", ".*", ".*"))))
    vh.start()
    r = sh(["bash", os.path.join(ROOT, "deploy", "image.sh")], timeout=1200, cwd=ROOT)
    vh.join()
    timings["build"] = time.time() - t0
    print(r.stdout.strip())
    check(r.returncode == 0, "image.sh: %s" % (r.stdout + r.stderr)[-3000:])
    for res in state["vhost"]:
        check(res.returncode == 0, "rabbitmqctl: %s" % res.stdout + res.stderr)
    listed = sh(["bash", os.path.join(ROOT, "deploy", "image.sh"), "--list"], cwd=ROOT)
    images = [line.split()[0] for line in listed.stdout.splitlines()]
    check(len(images) == 6, "images: %s" % images)  # five of deploy/k8s, deploy/k8s-tls's tunnel
    for image in images:
        r = podman("image", "inspect", "-f", "{{.Size}}", image)
        check(r.returncode == 0, "%s: %s" % (image, r.stderr))
        size = int(r.stdout.strip())
        # The tunnel is Debian's stunnel4, which brings perl and systemd's libraries: a limit of
        # its own, so that the services' stays what it was.
        limit = 150 if "redis-tunnel" in image else 100
        check(size <= limit * 1e6, "%s: %.1f MB, more than %d MB" % (image, size / 1e6, limit))


def test_migration_job():
    """The Job's command from its image, as the Job's container: safe on migrated databases."""
    _, secrets, _, job = state["manifests"]
    spec = job["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = container_env(c, {}, secrets)
    values = dict(secrets)
    with_endpoints(env, values)
    env.pop("QUAN_AMQP_URL", None)
    user = (spec.get("securityContext") or {}).get("runAsUser")
    r = podman("run", "--rm", "--pull=never", "--network", "host", "--read-only",
               "--read-only-tmpfs=false", *ULIMITS, "--env-file", env_file("migrate", env),
               *(["--user", str(user)] if user is not None else []),
               *secret_mounts("quan-migrate", spec, c, values), c["image"], *c["command"],
               timeout=120)
    check(r.returncode == 0, "quan-migrate: %s %s" % (r.returncode, r.stdout + r.stderr))
    check("error" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr)


def gateway_config(ports):
    """deploy/gateway's files as the ConfigMap holds them; the listen port and the Services'
    ports are this run's."""
    d = os.path.join(state["dir"], "gateway-config")
    os.makedirs(d)
    g = os.path.join(ROOT, "deploy", "gateway")
    for f in ("nginx.conf", "quan_auth.js"):
        shutil.copy(os.path.join(g, f), d)
    shutil.copy(os.path.join(g, "k8s", "console.conf"), d)
    shutil.copy(os.path.join(g, "k8s", "limits.conf"), d)
    with open(os.path.join(g, "k8s", "upstreams.conf"), encoding="utf-8") as f:
        up = f.read()
    for svc, (port, k8s_port) in ports.items():
        want = "quan-%s:%d" % (svc, k8s_port)
        check(want in up, "upstreams.conf names %s" % want)
        up = up.replace(want, "quan-%s:%d" % (svc, port))
    with open(os.path.join(d, "upstreams.conf"), "w", encoding="utf-8") as f:
        f.write(up)
    with open(os.path.join(g, "k8s", "listen.conf"), encoding="utf-8") as f:
        listen = f.read()
    check("listen 10000;" in listen, listen)
    with open(os.path.join(d, "listen.conf"), "w", encoding="utf-8") as f:
        f.write(listen.replace("listen 10000;", "listen 127.0.0.1:%d;" % state["gw_port"]))
    with open(os.path.join(g, "k8s", "metrics.conf"), encoding="utf-8") as f:
        metrics = f.read()
    check("listen 10001;" in metrics, metrics)
    with open(os.path.join(d, "metrics.conf"), "w", encoding="utf-8") as f:
        f.write(metrics.replace("listen 10001;", "listen 127.0.0.1:%d;" % state["gw_metrics_port"]))
    os.chmod(d, 0o755)
    return d


def config_map_dir(volume):
    """A ConfigMap volume other than the gateway's configuration, as a directory to mount: the
    files of the kustomization that generates it (deploy/console/: quan-console), each key where
    the volume's items put it."""
    name = volume["configMap"]["name"]
    check(name == "quan-console", "a ConfigMap this suite does not know: %s" % name)
    src = os.path.join(ROOT, "deploy", "console")
    with open(os.path.join(src, "kustomization.yaml"), encoding="utf-8") as f:
        gen = yaml.safe_load(f)["configMapGenerator"][0]
    files = {}
    for item in gen["files"]:
        key, _, path = item.partition("=") if "=" in item else (item, "", item)
        files[key] = os.path.join(src, path)
    d = os.path.join(state["dir"], name)
    items = volume["configMap"].get("items") or [{"key": k, "path": k} for k in files]
    for it in items:
        dst = os.path.join(d, it["path"])
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(files[it["key"]], dst)
    for base, dirs, names in os.walk(d):
        os.chmod(base, 0o755)
        for n in names:
            os.chmod(os.path.join(base, n), 0o644)
    return d


def run_args(dep, config, secrets):
    """podman run's arguments for a Deployment: its user, read-only root, emptyDirs as tmpfs,
    its command; the environment as the manifests give it but for the endpoints."""
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    name = dep["metadata"]["name"]  # quan-engine-writer's container is named quan-engine too
    k8s_port = c["ports"][0]["containerPort"]
    port = state["gw_port"] if name == "quan-gateway" else free_port()
    env = container_env(c, config, secrets)
    values = dict(secrets)
    if name != "quan-gateway":
        with_endpoints(env, values, port)
    user = spec["securityContext"]["runAsUser"]
    args = ["run", "-d", "--pull=never", "--name", "%s-%s" % (RUN_ID, name), "--network", "host",
            "--user", str(user), "--security-opt", "no-new-privileges", *ULIMITS,
            "--env-file", env_file(name, env), *secret_mounts(name, spec, c, values)]
    if c["securityContext"].get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        if "emptyDir" in v:
            args += ["--tmpfs", "%s:rw,mode=1777" % m["mountPath"]]
        elif "configMap" in v and v["configMap"]["name"] == "quan-gateway-config":
            args += ["-v", "%s:%s:ro" % (state["gateway_dir"], m["mountPath"])]
        elif "configMap" in v:
            args += ["-v", "%s:%s:ro" % (config_map_dir(v), m["mountPath"])]
    if name in ("quan-merchant-admin", "quan-distribution"):
        args += ["-v", "%s:%s:ro" % (state["files"], FILE_ROOT)]
    if name == "quan-gateway":
        for svc in state["ports"]:
            args += ["--add-host", "quan-%s:127.0.0.1" % svc]
    args += [c["image"], *c["command"]]
    return name, port, k8s_port, args


def test_containers_start_and_become_ready():
    config, secrets, deployments, _ = state["manifests"]
    t0 = time.time()
    state["gw_port"] = free_port()
    state["gw_metrics_port"] = free_port()
    svc_deps = [d for d in deployments if d["metadata"]["name"] != "quan-gateway"]
    gw = [d for d in deployments if d["metadata"]["name"] == "quan-gateway"]
    names = sorted(d["metadata"]["name"] for d in deployments)
    check(names == ["quan-distribution", "quan-engine", "quan-engine-writer", "quan-gateway",
                    "quan-merchant-admin", "quan-settlement"], "Deployments: %s" % names)
    started = {}
    for d in svc_deps:
        name, port, k8s_port, args = run_args(d, config, secrets)
        started[name] = (port, k8s_port, args, d)
    # The gateway's upstreams: the Services it routes to (not distribution, not the writers).
    state["ports"] = {n[len("quan-"):]: (p, kp) for n, (p, kp, _, _) in started.items()
                      if n not in ("quan-distribution", "quan-engine-writer")}
    state["gateway_dir"] = gateway_config(state["ports"])
    name, port, k8s_port, args = run_args(gw[0], config, secrets)
    started[name] = (port, k8s_port, args, gw[0])
    state["containers"] = started

    results = {}

    def start(name):
        results[name] = podman(*started[name][2])

    threads = [threading.Thread(target=start, args=(n,)) for n in started]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, r in results.items():
        check(r.returncode == 0, "%s: podman run: %s" % (name, r.stderr))

    def ready(name):
        port = started[name][0]
        if name == "quan-gateway":
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        try:
            return request("GET", "http://127.0.0.1:%d/readyz" % port, timeout=2)[0] == 200
        except OSError:
            return False

    for name in started:
        ok = wait_for(lambda: ready(name), 60)
        check(ok, "%s not ready: %s" % (name, logs(name)[-2000:]))
        print("   %s ready after %.1f s" % (name, time.time() - t0))


def logs(name):
    r = podman("logs", "%s-%s" % (RUN_ID, name))
    return r.stdout + r.stderr


def test_non_root_and_read_only():
    for name in state["containers"]:
        cname = "%s-%s" % (RUN_ID, name)
        pid = podman("inspect", "-f", "{{.State.Pid}}", cname).stdout.strip()
        check(pid.isdigit() and pid != "0", "%s pid %s" % (name, pid))
        pids = [pid]
        with open("/proc/%s/task/%s/children" % (pid, pid), encoding="utf-8") as f:
            pids += f.read().split()
        check(len(pids) >= 2, "%s: tini has no child" % name)
        for p in pids:
            with open("/proc/%s/status" % p, encoding="utf-8") as f:
                uids = [line.split()[1:] for line in f if line.startswith("Uid:")][0]
            check(set(uids) == {"10001"}, "%s pid %s runs as %s" % (name, p, uids))
        r = podman("exec", cname, "/bin/sh", "-c", "echo x >/probe")
        check(r.returncode != 0 and "Read-only file system" in r.stderr,
              "%s: root filesystem writable: %s %s" % (name, r.returncode, r.stderr))


def api(method, path, token, body=None):
    h = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    return request(method, "http://127.0.0.1:%d%s" % (state["gw_port"], path), body, h)


def token(*args):
    r = podman("exec", "%s-quan-gateway" % RUN_ID, "/usr/local/bin/quan-token", *args)
    check(r.returncode == 0, "quan-token: %s" % r.stderr)
    return r.stdout.strip()


def test_readme_walk_through_via_gateway():
    m = token("--user", "1", "--shop", SHOP)
    u = token("--user", "42")
    st, _, r = api("POST", "/api/merchant-admin/coupon-template/create", m, {
        "name": "10 off 100", "source": 0, "target": 1, "type": 1,
        "validStartTime": "2026-01-01 00:00:00", "validEndTime": "2027-12-31 23:59:59",
        "stock": 100, "receiveRule": {"limitPerPerson": 1},
        "consumeRule": {"termsOfUse": 100, "maximumDiscountAmount": 10, "validityPeriod": 48}})
    check(st == 200 and r["success"], "create: %s %s" % (st, r))
    tid = r["data"]["id"]
    st, _, r = api("GET", "/api/engine/coupon-template/query?shopNumber=%s&couponTemplateId=%s"
                   % (SHOP, tid), u)
    check(st == 200 and r["success"] and str(r["data"]["id"]) == str(tid), "query: %s %s"
          % (st, r))
    st, _, r = api("POST", "/api/engine/user-coupon/redeem", u,
                   {"shopNumber": SHOP, "couponTemplateId": str(tid)})
    check(st == 200 and r["success"], "redeem: %s %s" % (st, r))
    st, _, r = api("POST", "/api/settlement/coupon-query", u,
                   {"orderAmount": 150, "shopNumber": SHOP})
    check(st == 200 and r["success"], "coupon-query: %s %s" % (st, r))
    mine = [c for c in r["data"]["availableCouponList"]
            if str(c.get("couponTemplateId")) == str(tid)]
    check(len(mine) == 1 and float(mine[0]["couponAmount"]) == 10, "fits: %s" % r["data"])
    st, _, r = request("GET", "http://127.0.0.1:%d/api/engine/user-coupon/list" % state["gw_port"],
                       None, {"X-User-Id": "42"})
    check(st == 401, "no token: %s %s" % (st, r))
    # The gateway's /metrics (its image's Lua module, k8s/metrics.conf's port): that 401 and
    # the token's cache hits are counted (after each answer: a moment later; the user's three
    # calls make one hit or two: a token is cached after its answer is sent, so a call right
    # behind it may verify it again).
    seen = {}

    def counted():
        st, _, body = request("GET", "http://127.0.0.1:%d/metrics" % state["gw_metrics_port"])
        text = body.decode() if isinstance(body, bytes) else str(body)
        series = dict(line.rsplit(" ", 1) for line in text.splitlines()
                      if line and not line.startswith("#"))
        seen.update(status=st, text=text)
        return st == 200 and float(series.get("quan_gateway_unauthorized_total", 0)) >= 1 and \
            float(series.get('quan_gateway_token_cache_total{result="hit"}', 0)) >= 1

    check(wait_for(counted, 5), "the gateway's /metrics: %s" % seen)
    # The merchant console's page, from its ConfigMap, without a token.
    st, _, body = request("GET", "http://127.0.0.1:%d/console/" % state["gw_port"])
    check(st == 200 and isinstance(body, bytes) and b"<!doctype html>" in body[:400],
          "/console/: %s %r" % (st, body[:200]))

    # The spreadsheet task (users 1001-1003, "abc" and 1002 again) and its failure report.
    st, _, r = api("POST", "/api/merchant-admin/coupon-task/create", m, {
        "taskName": "walk", "fileAddress": "users.csv", "notifyType": "0",
        "couponTemplateId": str(tid), "sendType": 0})
    check(st == 200 and r["success"], "task: %s %s" % (st, r))
    task = r["data"]["id"]
    found = {}

    def done():
        _, _, r = api("GET", "/api/merchant-admin/coupon-task/find?taskId=%s" % task, m)
        found.update(r.get("data") or {})
        return found.get("status") in (3, 4, 5)

    check(wait_for(done, 30), "task not finished: %s" % found)
    want = {"status": 3, "sendNum": 5, "successNum": 3, "failNum": 2, "processedRows": 5,
            "failReason": None}
    check(all(found.get(k) == v for k, v in want.items()), "task: %s" % found)
    st, _, raw = api("GET", "/api/merchant-admin/coupon-task/fail-report?taskId=%s" % task, m)
    check(st == 200, "fail report: %s %s" % (st, raw))
    import openpyxl
    rows = list(openpyxl.load_workbook(io.BytesIO(raw)).active.iter_rows(values_only=True))
    check([tuple(str(x) for x in row) for row in rows[1:]] ==
          [("5", "abc", "invalid user id"), ("6", "1002", "duplicate in file")], rows)
    st, _, r = api("GET", "/api/engine/user-coupon/list", token("--user", "1001"))
    check(st == 200 and [str(c["couponTemplateId"]) for c in r["data"]] == [str(tid)],
          "1001's wallet: %s %s" % (st, r))


def test_console_chart_from_image():
    """Chart.js is in the gateway's image, not in the console's ConfigMap: the mounted directory
    holds none, and what the gateway serves is the pinned version, as npm ci installed it."""
    mounted = os.path.join(state["dir"], "quan-console")
    check(os.path.isfile(os.path.join(mounted, "index.html")), "no ConfigMap dir %s" % mounted)
    check(not os.path.exists(os.path.join(mounted, "vendor", "chart.umd.js")),
          "the ConfigMap holds Chart.js")
    console = os.path.join(ROOT, "deploy", "console")
    with open(os.path.join(console, "package-lock.json"), encoding="utf-8") as f:
        pinned = json.load(f)["packages"]["node_modules/chart.js"]["version"]
    with open(os.path.join(console, "node_modules", "chart.js", "dist", "chart.umd.js"), "rb") as f:
        installed = f.read()
    st, h, body = request("GET", "http://127.0.0.1:%d/console/vendor/chart.umd.js"
                          % state["gw_port"])
    check(st == 200 and isinstance(body, bytes), "chart.umd.js: %s %r" % (st, body[:200]))
    check(body.startswith(b"/*!\n * Chart.js v%s\n" % pinned.encode()),
          "not Chart.js %s: %r" % (pinned, body[:100]))
    check(body == installed, "chart.umd.js: %d bytes served, %d installed"
          % (len(body), len(installed)))
    check((h.get("Content-Type") or "").startswith("text/javascript"), "type: %s"
          % h.get("Content-Type"))
    print("   /console/vendor/chart.umd.js: Chart.js %s, %d bytes, from the image"
          % (pinned, len(body)))


def test_sigterm_drains_and_exits_0_in_time():
    """podman stop -t <terminationGracePeriodSeconds>, all at once: the image's stop signal
    (SIGTERM; the gateway's SIGQUIT) through tini, a drain, exit code 0 well within it."""
    out = {}

    def stop(name):
        grace = state["containers"][name][3]["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]
        t0 = time.time()
        r = podman("stop", "-t", str(grace), "%s-%s" % (RUN_ID, name), timeout=grace + 30)
        out[name] = (r, time.time() - t0, grace)

    threads = [threading.Thread(target=stop, args=(n,)) for n in state["containers"]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, (r, took, grace) in sorted(out.items()):
        check(r.returncode == 0, "%s: podman stop: %s" % (name, r.stderr))
        code = podman("inspect", "-f", "{{.State.ExitCode}}", "%s-%s" % (RUN_ID, name))
        check(code.stdout.strip() == "0", "%s: exit code %s: %s" % (name, code.stdout,
                                                                    logs(name)[-1500:]))
        # A kill at the end of the grace period would look like this too: well within it.
        check(took < grace - 5, "%s: stopped in %.1f s of %d" % (name, took, grace))
        if name != "quan-gateway":
            check("drained; exiting" in logs(name), "%s: %s" % (name, logs(name)[-1500:]))
        print("   %s stopped in %.1f s" % (name, took))


def cleanup():
    for name in state.get("containers", {}):
        podman("rm", "-f", "%s-%s" % (RUN_ID, name))
    if "vhost" in state:
        rabbitmqctl("delete_vhost", VHOST)
    if "dir" in state:
        shutil.rmtree(state["dir"], ignore_errors=True)


def main():
    preflight()
    t0 = time.time()
    state["dir"] = tempfile.mkdtemp(prefix="containers.", dir=TMP)
    os.chmod(state["dir"], 0o755)
    state["files"] = os.path.join(state["dir"], "files")
    os.makedirs(state["files"])
    with open(os.path.join(state["files"], "users.csv"), "w", encoding="utf-8") as f:
        f.write("userId\n1001\n1002\n1003\nabc\n1002\n")  # as make up writes it (README)
    state["manifests"] = load()

    def teardown():
        cleanup()
        total = time.time() - t0
        build = timings.get("build", 0)
        print("timing: build %.0f s, the rest %.0f s, all %.0f s" % (build, total - build, total))

    run([test_images_build, test_migration_job, test_containers_start_and_become_ready,
         test_non_root_and_read_only, test_readme_walk_through_via_gateway,
         test_console_chart_from_image, test_sigterm_drains_and_exits_0_in_time], teardown)


if __name__ == "__main__":
    main()
