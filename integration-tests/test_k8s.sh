#!/usr/bin/env bash
# The Kubernetes manifests of deploy/k8s as `kubectl kustomize` renders them (without kubectl:
# the files its kustomization lists and the ConfigMaps it makes of files, with their names as
# kustomize hashes them; a kustomization that holds more is refused), from a copy of the
# checkout as a fresh clone has it (nothing git ignores: no node_modules), where every other
# kustomization of deploy/ must render too; and their NetworkPolicies evaluated the way a
# cluster applies them:
#   - every binary of services/ has a Deployment, its HTTP port the container port named http;
#   - every Deployment's pods are selected by the default-deny ingress policy;
#   - only the gateway's pods (app.kubernetes.io/name: quan-gateway, Quan's namespace) and
#     Prometheus' (app.kubernetes.io/name: prometheus, namespace monitoring) appear in a rule
#     reaching a service's HTTP port; the gateway reaches the services that serve /api/ routes
#     and not the others (quan-distribution), Prometheus reaches every one; an unlabelled pod,
#     the other services' pods, a gateway or a Prometheus in the wrong namespace do not;
#   - the cluster's settings: QUAN_REDIS_CLUSTER_NODES (host:port list) and QUAN_MQ_QUEUE_TYPE
#     in quan-config, QUAN_AMQP_URL a list of amqp:// URLs, ds_0 and ds_1 on two endpoints;
#   - egress: every service reaches DNS and the ports of its stores (from quan-config and
#     quan-secrets: every Redis Cluster node, every RabbitMQ URL; RabbitMQ for those that use
#     it); the ones that download task files or send
#     notifications reach any host on any port; one whose egress is restricted (settlement)
#     reaches nothing else;
#   - the gateway (quan-gateway): its pods are the ones quan-api-from-gateway lets in, clients
#     reach its port http and nothing else of it, it reaches DNS and the three APIs and nothing
#     else (no store, no distribution, no outside host); its ConfigMap holds deploy/gateway's
#     nginx.conf and quan_auth.js byte for byte and the k8s/ upstreams, listen, limits and
#     metrics files (limits.conf: deploy/local/gateway.sh's defaults, test_gateway.py checks),
#     mounted where its command reads them; its upstreams are the Services' names and ports, its
#     listen port its container port http, its /metrics its container port metrics, which
#     Prometheus reaches and clients do not; the token key is a file of quan-secrets that nginx passes
#     its workers the path of (QUAN_GATEWAY_JWT_SECRET_FILE); and nginx -t accepts
#     that configuration (the Service names, which resolve only in a cluster, put to 127.0.0.1);
#     the console's files (deploy/console/, its ConfigMap quan-console) are mounted where
#     k8s/console.conf points nginx, and its Chart.js (/console/vendor/chart.umd.js) is served
#     from where deploy/Dockerfile's gateway target copies the pinned one, which no volume hides;
#   - autoscaling: every HPA targets an existing Deployment, one per Deployment; the engine's
#     replicas behind the gateway (the Deployments its upstreams' Services select) have
#     QUAN_CLAIM_CONSUMERS=0, no expiry sweeper or coupon archiver and the expiry and reminder queues left to the
#     others (QUAN_EXPIRE_INTERVAL_MS=0, QUAN_ARCHIVE_INTERVAL_MS=0, QUAN_MQ_SKIP_QUEUES), which some engine Deployment
#     consumes, and scale on CPU; the claim writers (quan-engine-writer, selected
#     by no such Service, not reachable by the gateway) have 1..16 and, like quan-distribution,
#     scale on an External metric of the queue their consumers take (from the descriptors),
#     per replica, with a long scale-down window; distribution's target is QUAN_DIST_WORKERS
#     (integration-tests/test_k8s_autoscaling.sh checks the metrics against RabbitMQ);
#   - secrets: no Deployment or Job puts a Secret's value into an environment variable; each
#     reads the quan-secrets keys its binary reads (the DSNs, the RabbitMQ URLs where it uses
#     RabbitMQ, the exchange-code key where it makes or checks codes, the gateway's token key)
#     from files of a read-only quan-secrets volume that QUAN_<key>_FILE names, the volume
#     holding no other key, its files readable by neither others nor for writing, their group
#     the pod's fsGroup;
#   - the checker itself fails on broken copies of the manifests.
# Needs no servers. The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
py=/usr/bin/python3
k8s=$root/deploy/k8s

tmp=$(mktemp -d /tmp/test_k8s.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/check.py" <<'PY'
"""usage: check.py ROOT RENDERED [--break NAME]; prints "ok"/"FAIL" lines (and details).
RENDERED: the manifests as one YAML stream. --break NAME: first spoil them as break_copy says."""
import copy
import glob
import ipaddress
import os
import re
import sys

import yaml

root, rendered = sys.argv[1], sys.argv[2]
spoil = sys.argv[sys.argv.index("--break") + 1] if "--break" in sys.argv else None
failures = 0


def check(name, cond, details=()):
    global failures
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        failures += 1
        for d in details:
            print("       " + d)


with open(rendered, encoding="utf-8") as f:
    docs = [d for d in yaml.safe_load_all(f) if d]

# ---------------------------------------------------------------- the NetworkPolicy model

# The peers the base lets in: the gateway's pods in Quan's namespace, Prometheus' in monitoring.
GATEWAY = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "quan-gateway"}}}
SCRAPER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
           "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}

# Quan's namespace: the kustomization's, else any name (the manifests carry none).
quan_ns = next((d["metadata"]["namespace"] for d in docs if d["metadata"].get("namespace")), "quan")


def ns_labels(ns):
    return {"kubernetes.io/metadata.name": ns}


def selects(sel, labels):
    """A LabelSelector: an empty one ({} or null) selects everything."""
    sel = sel or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


class Pod:
    def __init__(self, ns, labels, ports=None, name=None):
        self.ns, self.labels = ns, labels
        self.ports = ports or {}  # port name -> (number, protocol)
        self.name = name or f"a pod {labels or 'without labels'} in namespace {ns}"


class Address:
    def __init__(self, ip):
        self.ip, self.name = ipaddress.ip_address(ip), f"address {ip}"


def peer_matches(peer, policy_ns, who):
    if "ipBlock" in peer:
        if isinstance(who, Pod):
            return True  # pod and node addresses may fall in any block: count it as a match
        b = peer["ipBlock"]
        return (who.ip in ipaddress.ip_network(b["cidr"])
                and not any(who.ip in ipaddress.ip_network(x) for x in b.get("except") or []))
    if not isinstance(who, Pod):
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], ns_labels(who.ns)):
            return False
    elif who.ns != policy_ns:
        return False
    return selects(peer.get("podSelector"), who.labels)


def port_matches(entries, target_pod, port, proto):
    """A rule's ports (none: every port), against port/proto of target_pod."""
    if not entries:
        return True
    for e in entries:
        if e.get("protocol", "TCP") != proto:
            continue
        p = e.get("port")
        if p is None:
            return True
        if isinstance(p, str):
            if target_pod is not None and target_pod.ports.get(p) == (port, proto):
                return True
            continue
        if p <= port <= e.get("endPort", p):
            return True
    return False


def types(spec):
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def applying(pod, kind):
    return [d for d in docs if d["kind"] == "NetworkPolicy"
            and d["metadata"].get("namespace", quan_ns) == pod.ns
            and kind in types(d["spec"]) and selects(d["spec"].get("podSelector"), pod.labels)]


def ingress_allowed(src, dst, port, proto="TCP"):
    pols = applying(dst, "Ingress")
    if not pols:
        return True  # not isolated
    for p in pols:
        for r in p["spec"].get("ingress") or []:
            if (not r.get("from") or any(peer_matches(x, dst.ns, src) for x in r["from"])) \
                    and port_matches(r.get("ports"), dst, port, proto):
                return True
    return False


def egress_allowed(src, dst, port, proto="TCP"):
    pols = applying(src, "Egress")
    if not pols:
        return True
    for p in pols:
        for r in p["spec"].get("egress") or []:
            if (not r.get("to") or any(peer_matches(x, src.ns, dst) for x in r["to"])) \
                    and port_matches(r.get("ports"), dst if isinstance(dst, Pod) else None,
                                     port, proto):
                return True
    return False


gateway = Pod(quan_ns, {"app.kubernetes.io/name": "quan-gateway"}, name="the gateway")

# ---------------------------------------------------------------- broken copies


def named(kind, name):
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def policies_with(pred):
    return [d for d in docs if d["kind"] == "NetworkPolicy" and pred(d["spec"])]


def lets_gateway_in(spec):
    return any(peer_matches(x, quan_ns, gateway) for r in spec.get("ingress") or []
               for x in r.get("from") or [])


def break_copy(name):
    """Each spoils the manifests in a way one of the checks must see."""
    if name == "unlabelled-copy":
        # A second engine Deployment (say, claim writers) whose pods lack part-of: quan.
        d = copy.deepcopy(named("Deployment", "quan-engine"))
        d["metadata"]["name"] = "quan-engine-writers"
        labels = {"app.kubernetes.io/name": "quan-engine-writers"}
        d["spec"]["selector"]["matchLabels"] = dict(labels)
        d["spec"]["template"]["metadata"]["labels"] = labels
        docs.append(d)
    elif name == "open-peer":
        # Anyone from any namespace beside the gateway.
        for p in policies_with(lets_gateway_in):
            for r in p["spec"]["ingress"]:
                r["from"].append({"namespaceSelector": {}})
    elif name == "all-ports":
        # A rule without ports: every port of the pods, from the gateway.
        for p in policies_with(lets_gateway_in):
            p["spec"]["podSelector"] = {"matchLabels": {"app.kubernetes.io/part-of": "quan"}}
            for r in p["spec"]["ingress"]:
                r.pop("ports", None)
    elif name == "no-default-deny":
        for p in policies_with(lambda s: "Ingress" in types(s) and not s.get("ingress")):
            docs.remove(p)
    elif name == "egress-everywhere":
        # settlement's egress policy applied to every Quan pod.
        for p in policies_with(lambda s: "Egress" in types(s)):
            p["spec"]["podSelector"] = {"matchLabels": {"app.kubernetes.io/part-of": "quan"}}
    elif name == "egress-open":
        for p in policies_with(lambda s: "Egress" in types(s)):
            docs.remove(p)
    elif name == "gateway-relabelled":
        # The gateway's pods under another name: the API policy no longer lets them in.
        d = named("Deployment", "quan-gateway")
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "edge"
    elif name == "gateway-egress-open":
        docs.remove(named("NetworkPolicy", "quan-gateway-egress"))
    elif name == "gateway-stale-config":
        cm = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].startswith("quan-gateway-config"))
        cm["data"]["quan_auth.js"] += "// edited in the cluster\n"
    elif name == "console-unmounted":
        # The console's volume mounted elsewhere than console.conf's alias.
        spec = named("Deployment", "quan-gateway")["spec"]["template"]["spec"]
        for m in spec["containers"][0]["volumeMounts"]:
            if m["name"] == "console":
                m["mountPath"] = "/srv/console"
    elif name == "console-chart-elsewhere":
        # Chart.js looked for in the ConfigMap's directory, which does not hold it.
        cm = next(d for d in docs if d["kind"] == "ConfigMap"
                  and d["metadata"]["name"].startswith("quan-gateway-config"))
        cm["data"]["console.conf"] = cm["data"]["console.conf"].replace(
            "/usr/share/quan-console/", "/etc/quan-console/")
    elif name == "console-chart-hidden":
        # A volume over the image's directory of Chart.js.
        spec = named("Deployment", "quan-gateway")["spec"]["template"]["spec"]
        spec["volumes"].append({"name": "vendor", "emptyDir": {}})
        spec["containers"][0]["volumeMounts"].append({"name": "vendor",
                                                      "mountPath": "/usr/share/quan-console"})
    elif name == "cluster-config":
        # A queue type the binaries refuse, a node without its port, ds_1 beside ds_0.
        c = named("ConfigMap", "quan-config")["data"]
        c["QUAN_MQ_QUEUE_TYPE"] = "mirrored"
        c["QUAN_REDIS_CLUSTER_NODES"] = "redis-0.redis,redis-1.redis:6379"
        s = named("Secret", "quan-secrets")["stringData"]
        s["QUAN_DS1_DSN"] = s["QUAN_DS0_DSN"].replace("ds_0", "ds_1")
    elif name == "redis-cluster-port":
        # The Redis Cluster's nodes on a port settlement's egress does not open.
        c = named("ConfigMap", "quan-config")["data"]
        c["QUAN_REDIS_CLUSTER_NODES"] = "redis-0.redis:7000,redis-1.redis:7000"
    elif name == "hpa-dangling":
        # An HPA whose Deployment is not in the base (renamed, say).
        named("HorizontalPodAutoscaler", "quan-engine-writer")["spec"]["scaleTargetRef"]["name"] = \
            "quan-engine-writers"
    elif name == "writer-behind-gateway":
        # The engine's Service selecting every engine pod, the writers too.
        named("Service", "quan-engine")["spec"]["selector"] = {
            "app.kubernetes.io/part-of": "quan", "app.kubernetes.io/component": "engine-writer"}
    elif name == "engine-consumers":
        # The replicas behind the gateway write claims too, and the writers none.
        for dep, value in (("quan-engine", "2"), ("quan-engine-writer", "0")):
            for e in named("Deployment", dep)["spec"]["template"]["spec"]["containers"][0]["env"]:
                if e["name"] == "QUAN_CLAIM_CONSUMERS":
                    e["value"] = value
    elif name == "background-nowhere":
        # The writers leave the expiry and reminder queues too: nobody consumes them.
        named("Deployment", "quan-engine-writer")["spec"]["template"]["spec"]["containers"][0][
            "env"].append({"name": "QUAN_MQ_SKIP_QUEUES",
                           "value": "engine.coupon-expire,engine.remind"})
    elif name == "background-in-serving":
        # The serving replicas sweep expired coupons again and consume the reminders.
        for e in named("Deployment", "quan-engine")["spec"]["template"]["spec"]["containers"][0][
                "env"]:
            if e["name"] == "QUAN_EXPIRE_INTERVAL_MS":
                e["value"] = "20000"
            if e["name"] == "QUAN_MQ_SKIP_QUEUES":
                e["value"] = "engine.coupon-expire"
    elif name == "writer-on-cpu":
        hpa = named("HorizontalPodAutoscaler", "quan-engine-writer")["spec"]
        hpa["metrics"] = copy.deepcopy(named("HorizontalPodAutoscaler", "quan-engine")["spec"]["metrics"])
        hpa.pop("behavior")
    elif name == "wrong-queue":
        # Another queue's backlog, and a target that is not the tasks a replica runs.
        named("HorizontalPodAutoscaler", "quan-engine-writer")["spec"]["metrics"][0]["external"][
            "metric"]["selector"]["matchLabels"]["queue"] = "quan.engine.remind"
        named("HorizontalPodAutoscaler", "quan-distribution")["spec"]["metrics"][0]["external"][
            "target"]["averageValue"] = "10"
    elif name == "secret-in-env":
        # quan-secrets as variables again, beside the files.
        named("Deployment", "quan-settlement")["spec"]["template"]["spec"]["containers"][0][
            "envFrom"].append({"secretRef": {"name": "quan-secrets"}})
    elif name == "gateway-key-in-env":
        # The gateway's key as it once was given: a variable from the Secret.
        ctr = named("Deployment", "quan-gateway")["spec"]["template"]["spec"]["containers"][0]
        ctr["env"] = [{"name": "QUAN_GATEWAY_JWT_SECRET", "valueFrom": {"secretKeyRef": {
            "name": "quan-secrets", "key": "QUAN_GATEWAY_JWT_SECRET"}}}]
    elif name == "job-secret-in-env":
        named("Job", "quan-migrate")["spec"]["template"]["spec"]["containers"][0]["envFrom"] = [
            {"secretRef": {"name": "quan-secrets"}}]
    elif name == "secret-elsewhere":
        # A _FILE variable naming a path no secret volume holds.
        for e in named("Deployment", "quan-engine")["spec"]["template"]["spec"]["containers"][0][
                "env"]:
            if e["name"] == "QUAN_CODE_SECRET_FILE":
                e["value"] = "/etc/quan/QUAN_CODE_SECRET"
    elif name == "secret-readable":
        for v in named("Deployment", "quan-distribution")["spec"]["template"]["spec"]["volumes"]:
            if "secret" in v:
                v["secret"]["defaultMode"] = 0o644
    elif name == "secret-extra-key":
        # settlement makes no exchange codes: their key is not its to hold.
        for v in named("Deployment", "quan-settlement")["spec"]["template"]["spec"]["volumes"]:
            if "secret" in v:
                v["secret"]["items"].append({"key": "QUAN_CODE_SECRET", "path": "QUAN_CODE_SECRET"})
    else:
        sys.exit(f"unknown --break {name}")


if spoil:
    break_copy(spoil)

# ---------------------------------------------------------------- the Deployments

deployments = [d for d in docs if d["kind"] == "Deployment"]
binaries = sorted(os.path.basename(p.rstrip("/"))
                  for p in glob.glob(os.path.join(root, "services/*/")))
names = sorted(d["metadata"]["name"] for d in deployments)
check(f"every binary of services/ has a Deployment ({len(binaries)})",
      all(f"quan-{b}" in names for b in binaries),
      [f"no Deployment quan-{b}" for b in binaries if f"quan-{b}" not in names])


def source(binary):
    text = ""
    for p in glob.glob(os.path.join(root, "services", binary, "*.c")):
        with open(p, encoding="utf-8") as f:
            text += f.read()
    return text


def is_gateway(d):
    return d["metadata"]["name"] == "quan-gateway"


pods = {}
for d in deployments:
    name = d["metadata"]["name"]
    tmpl = d["spec"]["template"]
    ports = {}
    for c in tmpl["spec"]["containers"]:
        for p in c.get("ports") or []:
            if "name" in p:
                ports[p["name"]] = (p["containerPort"], p.get("protocol", "TCP"))
    pods[name] = Pod(d["metadata"].get("namespace", quan_ns), tmpl["metadata"].get("labels") or {},
                     ports, name)
    check(f"{name}: its HTTP port is the container port named http",
          "http" in ports, [f"container ports: {ports}"])

# What each Deployment's binary (its command, /usr/local/bin/quan-<binary>) does, read from
# the binary's source.
traits = {}
for d in deployments:
    name = d["metadata"]["name"]
    if is_gateway(d):
        traits[name] = {"api": False, "mq": False, "fetch": False, "notify": False,
                        "gateway": True, "binary": None}
        continue
    cmd = (d["spec"]["template"]["spec"]["containers"][0].get("command") or [name])[0]
    binary = os.path.basename(cmd)[len("quan-"):]
    src = source(binary)
    traits[name] = {
        "gateway": False,
        "binary": binary,
        # The Deployment named after its binary serves the binary's API; a further one of the
        # same binary (quan-engine-writer) does background work and the gateway must not reach it.
        "api": '"/api/' in src and name == f"quan-{binary}",
        "mq": "SERVICE_USE_MQ" in src,
        "fetch": "fetch_resolve" in src,
        "notify": "notify_send" in src,
    }

# ---------------------------------------------------------------- ingress

deny = [p for p in docs if p["kind"] == "NetworkPolicy" and "Ingress" in types(p["spec"])
        and not p["spec"].get("ingress")]
for name, pod in sorted(pods.items()):
    hits = [p["metadata"]["name"] for p in deny
            if selects(p["spec"].get("podSelector"), pod.labels)]
    check(f"{name}: selected by a default-deny ingress policy ({', '.join(hits) or 'none'})", hits,
          [f"its pod labels: {pod.labels}"])

# Every rule that reaches a service's HTTP port names the gateway or the scraper, nobody else.
for name, pod in sorted(pods.items()):
    if "http" not in pod.ports or traits[name]["gateway"]:
        continue
    port, proto = pod.ports["http"]
    strangers = []
    for p in applying(pod, "Ingress"):
        for i, r in enumerate(p["spec"].get("ingress") or []):
            if not port_matches(r.get("ports"), pod, port, proto):
                continue
            peers = r.get("from") or [{"(no from)": "everyone"}]
            strangers += [f"{p['metadata']['name']} rule {i}: {x}" for x in peers
                          if x not in (GATEWAY, SCRAPER)]
    check(f"{name}: only the gateway and Prometheus are named for port {port}", not strangers,
          strangers)

prometheus = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, name="Prometheus")
refused = [
    Pod(quan_ns, {}),
    Pod(quan_ns, {"app.kubernetes.io/part-of": "quan"}),
    Pod("elsewhere", {"app.kubernetes.io/name": "quan-gateway"},
        name="a gateway in another namespace"),
    Pod(quan_ns, {"app.kubernetes.io/name": "prometheus"}, name="a Prometheus in Quan's namespace"),
    Pod("monitoring", {"app.kubernetes.io/name": "grafana"}),
    Address("203.0.113.9"),
]
gateways = {n: o for n, o in pods.items() if traits[n]["gateway"]}
for name, pod in sorted(pods.items()):
    if "http" not in pod.ports or traits[name]["gateway"]:
        continue
    port, _ = pod.ports["http"]
    for gname, gpod in sorted(gateways.items()):
        if traits[name]["api"]:
            check(f"{name}: {gname}'s pods reach its API (port {port})",
                  ingress_allowed(gpod, pod, port), [f"their labels: {gpod.labels}"])
    if traits[name]["api"]:
        check(f"{name}: the gateway reaches its API (port {port})",
              ingress_allowed(gateway, pod, port))
    else:
        check(f"{name}: has no API, the gateway does not reach it (port {port})",
              not ingress_allowed(gateway, pod, port))
    check(f"{name}: Prometheus reaches /metrics (port {port})",
          ingress_allowed(prometheus, pod, port))
    others = [o for n, o in pods.items() if n != name
              and not (traits[n]["gateway"] and traits[name]["api"])]
    let_in = [w.name for w in refused + others if ingress_allowed(w, pod, port)]
    check(f"{name}: nobody else reaches port {port} (other services, other pods, other "
          "namespaces, outside addresses)", not let_in, [f"let in: {w}" for w in let_in])
    other = [p for p in (22, 5432, 8080, 9090) if p != port and ingress_allowed(gateway, pod, p)]
    check(f"{name}: the gateway reaches no other port", not other, [f"port {p}" for p in other])

# The gateway itself: the way in, on its port http only.
clients = [Address("203.0.113.30"), Pod("ingress", {"app": "controller"}, name="a pod of another namespace"),
           Pod(quan_ns, {}, name="a pod of Quan's namespace")]
for name, pod in sorted(gateways.items()):
    port, _ = pod.ports.get("http", (None, None))
    check(f"{name}: its port is the container port named http", port is not None)
    if port is None:
        continue
    shut = [c.name for c in clients if not ingress_allowed(c, pod, port)]
    check(f"{name}: clients reach its port {port}", not shut, [f"refused: {c}" for c in shut])
    mport, _ = pod.ports.get("metrics", (None, None))
    extra = [f"{c.name} on {p}" for c in clients for p in (22, 8080, 9090, mport)
             if p and p != port and ingress_allowed(c, pod, p)]
    check(f"{name}: nothing else of it is reachable (its metrics port {mport} included)",
          not extra, extra)
    check(f"{name}: Prometheus reaches its /metrics (port {mport})",
          mport is not None and ingress_allowed(prometheus, pod, mport))

# ---------------------------------------------------------------- egress

config = next((d.get("data") or {} for d in docs
               if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "quan-config"), {})
secret = next((d.get("stringData") or {} for d in docs
               if d["kind"] == "Secret" and d["metadata"]["name"] == "quan-secrets"), {})


def url_port(url, default):
    m = re.match(r"[a-z]+://(?:[^@/]*@)?[^:/]+:(\d+)", url or "")
    return int(m.group(1)) if m else default


def listed(text):
    return [x.strip() for x in (text or "").split(",") if x.strip()]


# The cluster's settings: the Redis Cluster's nodes, the queue type, the RabbitMQ nodes' URLs
# and a PostgreSQL endpoint per database.
cluster_nodes = listed(config.get("QUAN_REDIS_CLUSTER_NODES"))
check("quan-config: QUAN_REDIS_CLUSTER_NODES lists the Redis Cluster's nodes as host:port",
      cluster_nodes and all(re.fullmatch(r"[A-Za-z0-9.-]+:\d+", n) for n in cluster_nodes),
      [f"QUAN_REDIS_CLUSTER_NODES: {config.get('QUAN_REDIS_CLUSTER_NODES')!r}"])
check("quan-config: QUAN_MQ_QUEUE_TYPE is classic or quorum",
      config.get("QUAN_MQ_QUEUE_TYPE") in ("classic", "quorum"),
      [f"QUAN_MQ_QUEUE_TYPE: {config.get('QUAN_MQ_QUEUE_TYPE')!r}"])
amqp_urls = listed(secret.get("QUAN_AMQP_URL"))
check(f"quan-secrets: QUAN_AMQP_URL is a list of amqp:// URLs ({len(amqp_urls)})",
      amqp_urls and all(re.fullmatch(r"amqp://[^:@/]+:[^@/]+@[A-Za-z0-9.-]+:\d+/", u)
                        for u in amqp_urls), [f"QUAN_AMQP_URL has {len(amqp_urls)} entries"])
endpoints = {k: re.sub(r"^[a-z]+://(?:[^@/]*@)?([^/]+)/.*$", r"\1", v) for k, v in secret.items()
             if k.endswith("_DSN")}
check("quan-secrets: ds_0 and ds_1 on two PostgreSQL endpoints",
      len(set(endpoints.values())) == 2, [f"{k}: {v}" for k, v in sorted(endpoints.items())])

stores = {"PostgreSQL": sorted({url_port(v, 5432) for k, v in secret.items()
                               if k.endswith("_DSN")}),
          "Redis": sorted({int(config.get("QUAN_REDIS_PORT", 6379))}
                          | {int(n.rsplit(":", 1)[1]) for n in cluster_nodes if ":" in n}),
          "RabbitMQ": sorted({url_port(u, 5672) for u in amqp_urls} or {5672})}
dns_pod = Pod("kube-system", {"k8s-app": "kube-dns"}, name="kube-dns")
outside = Address("203.0.113.20")  # a merchant's file host, a webhook, a mail relay
inside = Pod("tools", {"app": "smtp-relay"}, name="a relay in another namespace")
quan_peer = Pod(quan_ns, {"app.kubernetes.io/name": "quan-engine",
                          "app.kubernetes.io/part-of": "quan"})

for name, pod in sorted(pods.items()):
    t = traits[name]
    missing = [f"DNS {proto} to {w.name}" for w in (dns_pod, Address("169.254.20.10"))
               for proto in ("UDP", "TCP") if not egress_allowed(pod, w, 53, proto)]
    if t["gateway"]:
        apis = {n: o for n, o in pods.items() if traits[n]["api"]}
        missing += [f"{n} port {o.ports['http'][0]}" for n, o in sorted(apis.items())
                    if not egress_allowed(pod, o, o.ports["http"][0])]
        check(f"{name}: reaches DNS and the services with an API ({len(apis)})", not missing,
              missing)
        open_ = [f"{n} port {o.ports['http'][0]}" for n, o in sorted(pods.items())
                 if "http" in o.ports and not traits[n]["api"] and n != name
                 and egress_allowed(pod, o, o.ports["http"][0])]
        open_ += [f"port {p} at {w.name}" for ports in stores.values() for p in ports
                  for w in (outside, inside) if egress_allowed(pod, w, p)]
        open_ += [f"port {p} at {outside.name}" for p in (80, 443) if egress_allowed(pod, outside, p)]
        check(f"{name}: reaches nothing else (no store, no other service, no outside host)",
              not open_, open_)
        continue
    for store, ports in stores.items():
        if store == "RabbitMQ" and not t["mq"]:
            continue
        missing += [f"{store} port {p} at {w.name}" for p in ports for w in (outside, inside)
                    if not egress_allowed(pod, w, p)]
    check(f"{name}: reaches DNS and its stores", not missing, missing)
    if t["fetch"] or t["notify"]:
        what = " and ".join(x for x, y in (("task files", t["fetch"]),
                                           ("notifications", t["notify"])) if y)
        shut = [f"port {p} at {w.name}" for p in (80, 443, 8080, 8443, 25, 465, 587, 2525)
                for w in (outside, inside) if not egress_allowed(pod, w, p)]
        check(f"{name}: reaches any host on any port ({what})", not shut, shut)
    else:  # nothing but its stores: its egress is restricted to them
        open_ = [f"port {p} at {w.name}" for p in (80, 443, 5672, 10020)
                 for w in (outside, quan_peer) if not (t["mq"] and p == 5672)
                 if egress_allowed(pod, w, p)]
        check(f"{name}: its egress is restricted to DNS and its stores", not open_, open_)

# ---------------------------------------------------------------- secrets as files

jobs = [d for d in docs if d["kind"] == "Job"]


def secrets_read(d):
    """The quan-secrets keys the workload's binary reads, from its sources."""
    name = d["metadata"]["name"]
    if d["kind"] == "Job":
        return {"QUAN_DS0_DSN", "QUAN_DS1_DSN"}  # quan-migrate
    if traits[name]["gateway"]:
        return {"QUAN_GATEWAY_JWT_SECRET"}
    keys = {"QUAN_DS0_DSN", "QUAN_DS1_DSN"}  # service_config_vars: every binary
    if traits[name]["mq"]:
        keys.add("QUAN_AMQP_URL")
    if "EXCODE_CONFIG_VAR" in source(traits[name]["binary"]):
        keys.add("QUAN_CODE_SECRET")
    return keys


for d in sorted(deployments + jobs, key=lambda x: x["metadata"]["name"]):
    name = d["metadata"]["name"]
    spec = d["spec"]["template"]["spec"]
    ctrs = (spec.get("initContainers") or []) + spec["containers"]
    as_env = [f"{c['name']}: envFrom {e['secretRef'].get('name')}" for c in ctrs
              for e in c.get("envFrom") or [] if "secretRef" in e]
    as_env += [f"{c['name']}: {e['name']} from {e['valueFrom']['secretKeyRef'].get('name')}"
               for c in ctrs for e in c.get("env") or []
               if "secretKeyRef" in (e.get("valueFrom") or {})]
    check(f"{name}: no Secret's value in an environment variable (quan-secrets as files)",
          not as_env, as_env)

    ctr = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in ctr.get("env") or []}
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = {m["mountPath"].rstrip("/"): m for m in ctr.get("volumeMounts") or []}
    for key in sorted(secrets_read(d)):
        path = env.get(key + "_FILE") or ""
        mount = os.path.dirname(path)
        m = mounts.get(mount) or {}
        sec = (vols.get(m.get("name")) or {}).get("secret") or {}
        items = sec.get("items")
        projected = ({i["path"]: i["key"] for i in items} if items is not None
                     else {k: k for k in secret})
        problem = (f"{key}_FILE is not set" if not path
                   else f"no volume is mounted at {mount}" if not m
                   else f"the volume at {mount} is not quan-secrets"
                   if sec.get("secretName") != "quan-secrets"
                   else f"{mount} is not mounted read-only" if not m.get("readOnly")
                   else f"{os.path.basename(path)} is not key {key}"
                   if projected.get(os.path.basename(path)) != key
                   else f"quan-secrets has no {key}" if key not in secret else None)
        check(f"{name}: {key} is the file {path or '(none)'} of quan-secrets, mounted read-only",
              problem is None, [problem] if problem else [])
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    for v in vols.values():
        sec = v.get("secret") or {}
        if sec.get("secretName") != "quan-secrets":
            continue
        items = sec.get("items")
        held = {i["key"] for i in items} if items is not None else set(secret)
        extra = sorted(held - secrets_read(d))
        check(f"{name}: its quan-secrets volume holds the keys it reads and no other", not extra,
              [f"also {extra}"])
        modes = [sec.get("defaultMode", 0o644)] + [i["mode"] for i in items or [] if "mode" in i]
        check(f"{name}: the secret files are not writable, nor readable by others, their group "
              f"the pod's (modes {', '.join(oct(x) for x in modes)}, fsGroup {fs_group})",
              fs_group is not None and all(x & 0o227 == 0 for x in modes))

# ---------------------------------------------------------------- engine tiers and autoscaling


def env_of(d):
    return {e["name"]: e.get("value") for c in d["spec"]["template"]["spec"]["containers"]
            for e in c.get("env") or []}


def consumer_queues(binary, path=None):
    """quan.<name> of every consumer declared in a module descriptor of the binary (or of one
    file of it): {"<name>", (const char *const[]){EVENT_..., NULL}, handler}."""
    text = ""
    for p in [path] if path else glob.glob(os.path.join(root, "services", binary, "*.c")):
        with open(p, encoding="utf-8") as f:
            text += f.read()
    return {"quan." + q for q in re.findall(r'\{\s*"([a-z0-9.-]+)",\s*\(const char \*const\[\]\)',
                                             text)}


all_services = [d for d in docs if d["kind"] == "Service"]
hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
by_name = {d["metadata"]["name"]: d for d in deployments}
for h in hpas:
    ref = h["spec"]["scaleTargetRef"]
    check(f"HPA {h['metadata']['name']}: targets an existing Deployment ({ref['name']})",
          ref.get("apiVersion") == "apps/v1" and ref.get("kind") == "Deployment"
          and ref.get("name") in by_name, [f"scaleTargetRef: {ref}"])
    lo, hi = h["spec"].get("minReplicas", 1), h["spec"]["maxReplicas"]
    check(f"HPA {h['metadata']['name']}: 1 <= minReplicas ({lo}) <= maxReplicas ({hi})",
          1 <= lo <= hi)
scaled = {h["spec"]["scaleTargetRef"]["name"]: h for h in hpas}
for name in sorted(by_name):
    check(f"{name}: one HPA scales it",
          sum(h["spec"]["scaleTargetRef"]["name"] == name for h in hpas) == 1)

# The Services the gateway reaches: those its upstreams name (deploy/gateway/k8s/upstreams.conf).
with open(os.path.join(root, "deploy/gateway/k8s/upstreams.conf"), encoding="utf-8") as f:
    upstream_hosts = set(re.findall(r"server\s+([a-z0-9.-]+):[0-9]+", f.read()))
reached = [sv for sv in all_services if sv["metadata"]["name"] in upstream_hosts]
engines = {n: d for n, d in by_name.items() if traits[n]["binary"] == "engine"}
serving = {n for n in engines
           if any(selects({"matchLabels": sv["spec"].get("selector") or {}}, pods[n].labels)
                  for sv in reached)}
writers = {n for n in engines if n not in serving}
check(f"the gateway's Services select the request-serving engine ({', '.join(sorted(serving))})",
      serving == {"quan-engine"}, [f"engine Deployments: {sorted(engines)}"])
check(f"the gateway's Services select no engine writer ({', '.join(sorted(writers)) or 'none'})",
      "quan-engine-writer" in writers and not writers & serving)
for n in sorted(serving):
    v = env_of(engines[n]).get("QUAN_CLAIM_CONSUMERS")
    check(f"{n}: serves requests only (QUAN_CLAIM_CONSUMERS=0, is {v})", v == "0")
for n in sorted(writers):
    v = env_of(engines[n]).get("QUAN_CLAIM_CONSUMERS")
    check(f"{n}: writes the MQ claims (QUAN_CLAIM_CONSUMERS 1..16, is {v})",
          v is not None and v.isdigit() and 1 <= int(v) <= 16)
    check(f"{n}: the gateway does not reach it (port 10020)",
          not ingress_allowed(gateway, pods[n], pods[n].ports.get("http", (10020,))[0]))
# The engine's background work (the expiry sweeper, the queues its modules consume through the
# service) runs in the writers and not in the replicas that serve requests; every such queue is
# consumed by some engine Deployment.
background = sorted(q[len("quan."):] for f in ("expire.c", "remind.c")
                    for q in consumer_queues("engine", os.path.join(root, "services/engine", f)))
def skipped(dep):
    return set(filter(None, (env_of(dep).get("QUAN_MQ_SKIP_QUEUES") or "").split(",")))
def sweeps(dep):
    return env_of(dep).get("QUAN_EXPIRE_INTERVAL_MS") != "0"
def archives(dep):
    return env_of(dep).get("QUAN_ARCHIVE_INTERVAL_MS") != "0"
for n in sorted(serving):
    missing = [q for q in background if q not in skipped(engines[n])]
    check(f"{n}: leaves the expiry and reminder queues to the writers (QUAN_MQ_SKIP_QUEUES)",
          not missing, [f"consumed here: {missing}"])
    check(f"{n}: runs no expiry sweeper (QUAN_EXPIRE_INTERVAL_MS=0)", not sweeps(engines[n]))
    check(f"{n}: runs no coupon archiver (QUAN_ARCHIVE_INTERVAL_MS=0)", not archives(engines[n]))
for q in background:
    check(f"the queue quan.{q} is consumed by an engine Deployment",
          any(q not in skipped(d) for d in engines.values()))
check("an engine Deployment sweeps expired coupons", any(sweeps(d) for d in engines.values()))
check("an engine Deployment archives dead coupons", any(archives(d) for d in engines.values()))

# Request-serving tiers scale on CPU; queue workers (no API served) on their queue, with a
# scale-down window that outlasts a sale's tail.
claimq_queue = consumer_queues("engine", os.path.join(root, "services/engine/claimq.c"))
taskrun_queue = consumer_queues("distribution",
                                os.path.join(root, "services/distribution/taskrun.c"))
want_queue = {"quan-engine-writer": claimq_queue, "quan-distribution": taskrun_queue}
for name, d in sorted(by_name.items()):
    h = scaled.get(name)
    if h is None:
        continue
    metrics = h["spec"].get("metrics") or []
    kinds = sorted({m["type"] for m in metrics})
    if traits[name]["api"] or traits[name]["gateway"]:
        check(f"{name}: serves requests, its HPA scales on CPU",
              kinds == ["Resource"] and all(m["resource"]["name"] == "cpu" for m in metrics),
              [f"metrics: {metrics}"])
        continue
    ext = [m["external"] for m in metrics if m["type"] == "External"]
    check(f"{name}: works from a queue, its HPA scales on an External metric only",
          kinds == ["External"], [f"metrics: {metrics}"])
    queues = {(e["metric"].get("selector") or {}).get("matchLabels", {}).get("queue") for e in ext}
    ours = want_queue.get(name) or consumer_queues(traits[name]["binary"])
    check(f"{name}: the metric's queue is the one its consumers take ({', '.join(sorted(ours))})",
          ext and queues <= ours, [f"queues named: {sorted(map(str, queues))}"])
    check(f"{name}: the target is a value per replica (AverageValue)",
          ext and all(e["target"]["type"] == "AverageValue" and float(e["target"]["averageValue"]) > 0
                      for e in ext), [f"targets: {[e['target'] for e in ext]}"])
    down = ((h["spec"].get("behavior") or {}).get("scaleDown") or {})
    check(f"{name}: scale-down waits out a sale's tail (stabilizationWindowSeconds >= 300)",
          down.get("stabilizationWindowSeconds", 0) >= 300, [f"scaleDown: {down}"])
# A distribution replica runs QUAN_DIST_WORKERS tasks; one message per task waiting or running.
dist_hpa = scaled.get("quan-distribution")
if dist_hpa and "quan-distribution" in by_name:
    workers = env_of(by_name["quan-distribution"]).get("QUAN_DIST_WORKERS")
    targets = [m["external"]["target"].get("averageValue") for m in dist_hpa["spec"]["metrics"]
               if m["type"] == "External"]
    check(f"quan-distribution: the target per replica is QUAN_DIST_WORKERS ({workers})",
          workers is not None and targets == [workers], [f"targets: {targets}"])

# ---------------------------------------------------------------- the gateway's configuration

CHART_SRC = "deploy/console/node_modules/chart.js/dist/chart.umd.js"


def dockerfile_copies(target):
    """{source: destination} of the COPY lines (not --from) of deploy/Dockerfile's stage
    target."""
    with open(os.path.join(root, "deploy/Dockerfile"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    stage, copies = None, {}
    for line in text.splitlines():
        w = line.split()
        if not w or w[0].startswith("#"):
            continue
        if w[0].upper() == "FROM":
            stage = w[-1] if len(w) >= 4 and w[-2].upper() == "AS" else None
        elif w[0].upper() == "COPY" and stage == target and not any(
                x.startswith("--from") for x in w):
            args = [x for x in w[1:] if not x.startswith("--")]
            copies.update({src: args[-1] for src in args[:-1]})
    return copies


gw = next((d for d in deployments if is_gateway(d)), None)
check("there is the gateway's Deployment (quan-gateway)", gw is not None)
if gw:
    spec = gw["spec"]["template"]["spec"]
    ctr = spec["containers"][0]
    cmd = ctr.get("command") or []
    conf = cmd[cmd.index("-c") + 1] if "-c" in cmd[:-1] else ""
    mounts = {m["mountPath"].rstrip("/"): m["name"] for m in ctr.get("volumeMounts") or []}
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    cm_name = ((vols.get(mounts.get(os.path.dirname(conf))) or {}).get("configMap") or {}).get("name")
    cm = next((d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name),
              None)
    check(f"quan-gateway: nginx -c {conf or '(none)'} is in a ConfigMap it mounts ({cm_name})",
          cm is not None, [f"command: {cmd}", f"mounts: {mounts}"])
    data = (cm or {}).get("data") or {}
    sources = {"nginx.conf": "deploy/gateway/nginx.conf",
               "quan_auth.js": "deploy/gateway/quan_auth.js",
               "upstreams.conf": "deploy/gateway/k8s/upstreams.conf",
               "listen.conf": "deploy/gateway/k8s/listen.conf",
               "limits.conf": "deploy/gateway/k8s/limits.conf",
               "metrics.conf": "deploy/gateway/k8s/metrics.conf"}
    for key, path in sources.items():
        with open(os.path.join(root, path), encoding="utf-8") as f:
            same = data.get(key) == f.read()
        check(f"quan-gateway: its {key} is {path}, byte for byte", same)

    # The console: console.conf's alias (for /console/ itself, outside its nested locations)
    # is a ConfigMap volume it mounts, which serves deploy/console's own files.
    cconf = re.sub(r"#.*", "", data.get("console.conf", ""))
    m = re.search(r'^\s*alias\s+"?([^";\s]+)"?\s*;',
                  re.sub(r"location\b[^{]*\{[^}]*\}", "", cconf), re.M)
    alias = m.group(1).rstrip("/") if m else None
    cvol = vols.get(mounts.get(alias)) if alias else None
    ccm_name = ((cvol or {}).get("configMap") or {}).get("name")
    ccm = next((d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ccm_name),
               None)
    check(f"quan-gateway: console.conf's alias ({alias}) is a ConfigMap it mounts ({ccm_name})",
          ccm is not None, [f"mounts: {mounts}"])
    if ccm:
        items = ({i["key"]: i["path"] for i in cvol["configMap"].get("items") or []}
                 or {k: k for k in ccm.get("data") or {}})
        served = {path: (ccm.get("data") or {}).get(key) for key, path in items.items()}
        for path, src in (("index.html", "deploy/console/index.html"),
                          ("console.js", "deploy/console/console.js"),
                          ("console.css", "deploy/console/console.css")):
            with open(os.path.join(root, src), encoding="utf-8") as f:
                check(f"quan-gateway: /console/{path} is {src}, byte for byte",
                      served.get(path) == f.read())

    # Chart.js, as the page asks for it (vendor/chart.umd.js): the image's copy of the pinned
    # one (deploy/Dockerfile, target gateway), so that the manifests render without
    # node_modules. Where nginx reads it: the alias of console.conf's location for it, else the
    # file under the console's alias.
    m = re.search(r'location\s+=\s*/console/vendor/chart\.umd\.js\s*\{[^}]*?\balias\s+'
                  r'"?([^";\s]+)"?\s*;', cconf)
    chart_at = m.group(1) if m else (alias + "/vendor/chart.umd.js" if alias else None)
    baked = dockerfile_copies("gateway").get(CHART_SRC)
    check(f"quan-gateway: /console/vendor/chart.umd.js comes from its image ({chart_at}, where "
          f"deploy/Dockerfile's gateway target copies {CHART_SRC})",
          chart_at is not None and chart_at == baked, [f"the image's copy: {baked}"])
    hiding = [mp for mp in mounts if chart_at and chart_at.startswith(mp + "/")]
    check("quan-gateway: no volume hides the image's Chart.js", not hiding,
          [f"mounted at {mp}" for mp in hiding])

    # The key's file (checked above, "secrets as files") reaches quan_auth.js: nginx keeps the
    # variable naming it in its workers' environment, and the script reads that variable.
    env = {e["name"]: e for e in ctr.get("env") or []}
    check("quan-gateway: its workers get QUAN_GATEWAY_JWT_SECRET_FILE, which quan_auth.js reads",
          "QUAN_GATEWAY_JWT_SECRET_FILE" in env and
          re.search(r"^env\s+QUAN_GATEWAY_JWT_SECRET_FILE\s*;", data.get("nginx.conf", ""), re.M)
          and "process.env.QUAN_GATEWAY_JWT_SECRET_FILE" in data.get("quan_auth.js", ""),
          [f"env: {sorted(env)}"])

    m = re.search(r"^\s*listen\s+(?:[0-9.]+:)?([0-9]+)\s*;", data.get("listen.conf", ""), re.M)
    port = pods[gw["metadata"]["name"]].ports.get("http", (None,))[0]
    check(f"quan-gateway: it listens on its container port http ({port})",
          m is not None and int(m.group(1)) == port)
    m = re.search(r"^\s*listen\s+(?:[0-9.]+:)?([0-9]+)\s*;", data.get("metrics.conf", ""), re.M)
    mport = pods[gw["metadata"]["name"]].ports.get("metrics", (None,))[0]
    check(f"quan-gateway: its /metrics listens on its container port metrics ({mport})",
          m is not None and mport is not None and int(m.group(1)) == mport)

    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    upstreams = dict(re.findall(r"^\s*upstream\s+([a-z_]+)\s*\{([^}]*)\}",
                                data.get("upstreams.conf", ""), re.M))
    proxied = set(re.findall(r"proxy_pass\s+http://([a-z_]+)\s*;", data.get("nginx.conf", "")))
    check(f"quan-gateway: every upstream it proxies to is defined ({', '.join(sorted(proxied))})",
          proxied and proxied <= set(upstreams), [f"defined: {sorted(upstreams)}"])
    for up, body in sorted(upstreams.items()):
        wrong = []
        for host, p in re.findall(r"server\s+([a-z0-9.-]+):([0-9]+)", body):
            svc = services.get(host)
            target = [o for n, o in pods.items()
                      if svc and selects({"matchLabels": svc["spec"].get("selector") or {}},
                                         o.labels)]
            sp = next((x for x in (svc or {}).get("spec", {}).get("ports", [])
                       if x["port"] == int(p)), None)
            if not svc or not sp or not target:
                wrong.append(f"{host}:{p}: no Service with that port selecting a Deployment")
            elif not all(traits[o.name]["api"] for o in target):
                wrong.append(f"{host}:{p}: not a service with an API")
            elif not all(o.ports.get(sp.get("targetPort")) == (sp["port"], "TCP")
                         or sp.get("targetPort") == sp["port"] for o in target):
                wrong.append(f"{host}:{p}: the Service's targetPort is not the pods' port")
        check(f"quan-gateway: upstream {up} names a Service of an API and its port", body and
              not wrong, wrong)

    gsvc = services.get("quan-gateway")
    check("quan-gateway: its Service selects its pods on port http (and metrics for /metrics)",
          gsvc is not None and
          selects({"matchLabels": gsvc["spec"].get("selector") or {}},
                  pods[gw["metadata"]["name"]].labels) and
          all(x.get("targetPort") == x.get("name") and x.get("name") in ("http", "metrics")
              for x in gsvc["spec"]["ports"]) and
          any(x.get("name") == "http" for x in gsvc["spec"]["ports"]))

    # nginx itself on that configuration, where it is installed (deploy/local/deps.sh).
    if not spoil and data and os.path.exists("/usr/sbin/nginx"):
        import subprocess
        import tempfile
        with tempfile.TemporaryDirectory() as tmpd:
            for key, text in data.items():
                for host in services:  # resolved only in a cluster
                    text = re.sub(rf"\bserver\s+{re.escape(host)}:", "server 127.0.0.1:", text)
                with open(os.path.join(tmpd, key), "w", encoding="utf-8") as f:
                    f.write(text)
            r = subprocess.run(["/usr/sbin/nginx", "-t", "-q", "-p", tmpd + "/", "-c",
                                os.path.join(tmpd, "nginx.conf"), "-e", "stderr"],
                               capture_output=True, text=True)
            check("quan-gateway: nginx -t accepts its configuration", r.returncode == 0,
                  r.stderr.splitlines())

sys.exit(1 if failures else 0)
PY

# The manifests as one stream: kubectl kustomize, or the listed files in order.
cat >"$tmp/render.py" <<'PY'
"""usage: render.py DIR: the resources of DIR/kustomization.yaml, concatenated, a directory
resource rendered the same way; a configMapGenerator of files made into its ConfigMap, named
with kustomize's content hash, and the Deployments' references to it renamed. Refuses (exit 3)
a kustomization that holds anything else: only kustomize renders that. A file it names that is
not there: exit 1, as kustomize fails."""
import hashlib
import json
import os
import sys

import yaml


def config_map_hash(cm):
    """kustomize's name suffix (api/hasher): sha256 of Go's JSON of kind, name and data (keys
    sorted, <, >, & escaped), its first ten hex digits with 0, 1, 3, a, e replaced. The name it
    hashes is empty (it looks "metadata/name" up as one field, which no ConfigMap has): the
    data alone decides."""
    text = json.dumps({"kind": "ConfigMap", "name": "", "data": cm["data"]},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for c, e in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                 ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(c, e)
    h = hashlib.sha256(text.encode()).hexdigest()[:10]
    return h.translate(str.maketrans("013ae", "ghkmt"))


def refuse(why):
    print(why, file=sys.stderr)
    sys.exit(3)


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")


def render(d):
    k = yaml.safe_load(read(os.path.join(d, "kustomization.yaml")))
    extra = sorted(set(k) - {"apiVersion", "kind", "resources", "configMapGenerator"})
    if extra:
        refuse(f"{d}/kustomization.yaml has {', '.join(extra)}: only kubectl kustomize renders it")
    docs, renamed = [], {}
    for r in k.get("resources") or []:
        path = os.path.join(d, r)
        if os.path.isdir(path):
            sub, sub_renamed = render(path)
            docs += sub
            renamed.update(sub_renamed)
        else:
            docs += [x for x in yaml.safe_load_all(read(path)) if x]
    for g in k.get("configMapGenerator") or []:
        if set(g) - {"name", "files", "options"} or set(g.get("options") or {}) - {"labels"}:
            refuse(f"{d}: a configMapGenerator with more than name, files and labels")
        data = {}
        for item in g["files"]:
            key, _, path = item.partition("=") if "=" in item else (os.path.basename(item), "", item)
            data[key] = read(os.path.join(d, path))
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": g["name"]},
              "data": data}
        labels = (g.get("options") or {}).get("labels")
        if labels:
            cm["metadata"]["labels"] = dict(labels)
        renamed[g["name"]] = g["name"] + "-" + config_map_hash(cm)
        cm["metadata"]["name"] = renamed[g["name"]]
        docs.append(cm)
    return docs, renamed


docs, renamed = render(sys.argv[1])
# Where a Deployment names a ConfigMap: volumes, envFrom, env.
for doc in docs:
    if doc["kind"] != "Deployment":
        continue
    spec = doc["spec"]["template"]["spec"]
    for v in spec.get("volumes") or []:
        if "configMap" in v:
            v["configMap"]["name"] = renamed.get(v["configMap"]["name"], v["configMap"]["name"])
    for c in spec.get("containers") or []:
        for e in c.get("envFrom") or []:
            if "configMapRef" in e:
                e["configMapRef"]["name"] = renamed.get(e["configMapRef"]["name"],
                                                        e["configMapRef"]["name"])
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                ref["name"] = renamed.get(ref["name"], ref["name"])
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
PY

if ! "$py" -c 'import yaml' 2>/dev/null; then
    bad "python3-yaml is installed"
    finish
    exit 1
fi

# The manifests as a fresh clone has them: a copy of the checkout's tracked and new files,
# nothing git ignores (node_modules, build output), so that what renders here renders for
# `kubectl apply -k` on a clone that ran no npm, no make.
clone=$tmp/clone
mkdir -p "$clone"
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - 2>/dev/null) |
    tar -xf - -C "$clone"
if [ ! -f "$clone/deploy/k8s/kustomization.yaml" ] ||
    [ -e "$clone/deploy/console/node_modules" ]; then
    bad "a copy of the checkout as a clone has it (git ls-files), without node_modules"
    finish
    exit 1
fi
k8s=$clone/deploy/k8s

"$py" "$tmp/render.py" "$k8s" >"$tmp/plain.yaml" 2>"$tmp/render.err"
plain_rc=$? # 3: a kustomization it does not read
if command -v kubectl >/dev/null; then
    # Every kustomization of deploy/, the base and what an operator applies beside it.
    base_rendered=0
    for d in $(cd "$clone" && find deploy -name kustomization.yaml -printf '%h\n' | sort); do
        if kubectl kustomize "$clone/$d" >"$tmp/kustomize.out" 2>"$tmp/kustomize.err"; then
            ok "kubectl kustomize $d renders in a clone (no node_modules)"
            if [ "$d" = deploy/k8s ]; then
                cp "$tmp/kustomize.out" "$tmp/rendered.yaml" && base_rendered=1
            fi
        else
            bad "kubectl kustomize $d renders in a clone (no node_modules)"
            sed 's/^/     /' "$tmp/kustomize.err"
        fi
    done
    # The stand-in for machines without kubectl must say the same, or refuse.
    if [ "$plain_rc" -eq 3 ]; then
        echo "render.py does not read deploy/k8s/kustomization.yaml: $(cat "$tmp/render.err")"
    elif [ "$plain_rc" -ne 0 ]; then
        bad "the files kustomization.yaml lists render in a clone (no node_modules)"
        sed 's/^/     /' "$tmp/render.err"
    else
        # shellcheck disable=SC2016 # Python, not the shell
        check "the files kustomization.yaml lists hold what kubectl kustomize renders" \
            "$py" -c '
import sys, yaml
key = lambda d: (d["kind"], d["metadata"]["name"])
a, b = (sorted((x for x in yaml.safe_load_all(open(p)) if x), key=key) for p in sys.argv[1:])
sys.exit(a != b)' "$tmp/plain.yaml" "$tmp/rendered.yaml"
    fi
    # Nothing else to check without the base.
    if [ "$base_rendered" = 0 ]; then
        finish
        exit 1
    fi
else
    echo "no kubectl: reading the files kustomization.yaml lists"
    if [ "$plain_rc" -eq 0 ]; then
        ok "deploy/k8s renders in a clone (no node_modules) from the files its kustomization lists"
    else
        bad "deploy/k8s renders in a clone (no node_modules) from the files its kustomization lists"
        sed 's/^/     /' "$tmp/render.err"
    fi
    if [ "$plain_rc" -ne 0 ]; then
        finish
        exit 1
    fi
    cp "$tmp/plain.yaml" "$tmp/rendered.yaml"
fi

check "deploy/k8s renders NetworkPolicies" grep -q '^kind: NetworkPolicy$' "$tmp/rendered.yaml"
"$py" "$tmp/check.py" "$clone" "$tmp/rendered.yaml" >"$tmp/check.out" 2>&1
rc=$?
tally "$tmp/check.out"
[ "$rc" -eq 0 ] || grep -q '^FAIL ' "$tmp/check.out" || bad "checker exited $rc"

# The checker must be able to fail: each broken copy, and a check that must see it.
# broken NAME TEXT: the copy spoilt by --break NAME yields a FAIL line that starts with TEXT.
broken() {
    "$py" "$tmp/check.py" "$clone" "$tmp/rendered.yaml" --break "$1" >"$tmp/broken-$1.out" 2>&1
    rejects "$1" "$2" "$tmp/broken-$1.out"
}
broken unlabelled-copy 'quan-engine-writers: selected by a default-deny ingress policy (none)'
broken unlabelled-copy 'quan-engine-writers: nobody else reaches port 10020'
broken no-default-deny 'quan-settlement: selected by a default-deny ingress policy (none)'
broken open-peer 'quan-engine: only the gateway and Prometheus are named for port 10020'
broken open-peer 'quan-merchant-admin: nobody else reaches port 10010'
broken all-ports 'quan-distribution: has no API, the gateway does not reach it'
broken all-ports 'quan-settlement: the gateway reaches no other port'
broken egress-everywhere \
    'quan-distribution: reaches any host on any port (task files and notifications)'
broken egress-everywhere 'quan-merchant-admin: reaches DNS and its stores'
broken egress-open 'quan-settlement: its egress is restricted'
broken gateway-relabelled "quan-engine: quan-gateway's pods reach its API"
broken gateway-egress-open 'quan-gateway: reaches nothing else'
broken gateway-stale-config 'quan-gateway: its quan_auth.js is deploy/gateway/quan_auth.js'
broken console-unmounted "quan-gateway: console.conf's alias (/etc/quan-console) is a ConfigMap it mounts"
broken console-chart-elsewhere 'quan-gateway: /console/vendor/chart.umd.js comes from its image'
broken console-chart-hidden "quan-gateway: no volume hides the image's Chart.js"
broken cluster-config 'quan-config: QUAN_MQ_QUEUE_TYPE is classic or quorum'
broken cluster-config 'quan-config: QUAN_REDIS_CLUSTER_NODES lists'
broken cluster-config 'quan-secrets: ds_0 and ds_1 on two PostgreSQL endpoints'
broken redis-cluster-port 'quan-settlement: reaches DNS and its stores'
broken hpa-dangling 'HPA quan-engine-writer: targets an existing Deployment'
broken hpa-dangling 'quan-engine-writer: one HPA scales it'
broken writer-behind-gateway 'the gateway'"'"'s Services select no engine writer'
broken engine-consumers 'quan-engine: serves requests only'
broken engine-consumers 'quan-engine-writer: writes the MQ claims'
broken writer-on-cpu 'quan-engine-writer: works from a queue, its HPA scales on an External metric only'
broken background-nowhere 'the queue quan.engine.coupon-expire is consumed by an engine Deployment'
broken background-nowhere 'the queue quan.engine.remind is consumed by an engine Deployment'
broken background-in-serving 'quan-engine: runs no expiry sweeper'
broken background-in-serving 'quan-engine: leaves the expiry and reminder queues to the writers'
broken writer-on-cpu 'quan-engine-writer: scale-down waits out'
broken wrong-queue 'quan-engine-writer: the metric'"'"'s queue is the one its consumers take'
broken wrong-queue 'quan-distribution: the target per replica is QUAN_DIST_WORKERS'
broken secret-in-env "quan-settlement: no Secret's value in an environment variable"
broken gateway-key-in-env "quan-gateway: no Secret's value in an environment variable"
broken gateway-key-in-env 'quan-gateway: QUAN_GATEWAY_JWT_SECRET is the file (none)'
broken job-secret-in-env "quan-migrate: no Secret's value in an environment variable"
broken secret-elsewhere 'quan-engine: QUAN_CODE_SECRET is the file /etc/quan/QUAN_CODE_SECRET'
broken secret-readable 'quan-distribution: the secret files are not writable, nor readable by others'
broken secret-extra-key 'quan-settlement: its quan-secrets volume holds the keys it reads and no other'

finish
