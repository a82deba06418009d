#!/usr/bin/env bash
# The queue-backlog autoscaling of deploy/k8s against a real RabbitMQ exporter:
#   - deploy/k8s/autoscaling renders (kubectl kustomize) and its ConfigMap's config.yaml is
#     adapter-config.yaml byte for byte;
#   - every External metric an HPA of deploy/k8s names is produced by one of the adapter's
#     externalRules (name.matches/as), not namespaced (RabbitMQ's series carry no namespace of
#     Quan's), its seriesQuery requiring the labels the HPA selects on;
#   - each such rule's query, evaluated on what RabbitMQ's own exporter (rabbitmq_prometheus, the
#     plugin of Debian's rabbitmq-server) serves at /metrics/detailed?family=queue_coarse_metrics
#     for the real queue (declared as the services declare it, with the base's queue type),
#     gives one value per queue, and the right one: claims published to quan.engine.redeem
#     read back as ready messages;
#   - the checker itself fails on broken copies of the rules and HPAs (the plain /metrics name,
#     which carries no queue label; a label the series lack; a queue nobody declares; a metric
#     no rule produces).
# RabbitMQ: the node of integration-tests/run.sh when there is one (a vhost of its own, so the
# other suites' queues are untouched), else a private one started with deploy/local/infra.sh;
# infra.sh starts every node with the plugin on a loopback port of its own. About 10 s on the
# run's node (the exporter's 5 s statistics interval is most of it), 20 s with a private one.
# The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
py=/usr/bin/python3
k8s=$root/deploy/k8s
bin=${QUAN_BIN_DIR:-$root/${QUAN_BUILD:-build}/bin}
vhost=quan-autoscaling-test

tmp=$(mktemp -d /tmp/test_k8s_autoscaling.XXXXXX)
own_infra=
cleanup() {
    [ -z "$own_infra" ] || "$root/deploy/local/infra.sh" stop "$own_infra" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT

if ! "$py" -c 'import yaml' 2>/dev/null; then
    bad "python3-yaml is installed"
    finish
    exit 1
fi

# ---------------------------------------------------------------- the manifests

if command -v kubectl >/dev/null; then
    check "kubectl kustomize deploy/k8s renders" kubectl kustomize "$k8s" -o "$tmp/base.yaml"
    if kubectl kustomize "$k8s/autoscaling" -o "$tmp/autoscaling.yaml" 2>"$tmp/kustomize.err"; then
        ok "kubectl kustomize deploy/k8s/autoscaling renders"
    else
        bad "kubectl kustomize deploy/k8s/autoscaling renders"
        sed 's/^/     /' "$tmp/kustomize.err"
    fi
    # shellcheck disable=SC2016 # Python, not the shell
    check "deploy/k8s/autoscaling: its ConfigMap's config.yaml is adapter-config.yaml" "$py" -c '
import sys, yaml
cms = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "ConfigMap"]
sys.exit(not (len(cms) == 1 and cms[0]["data"].get("config.yaml") == open(sys.argv[2]).read()))
' "$tmp/autoscaling.yaml" "$k8s/autoscaling/adapter-config.yaml"
else
    # Without kubectl: the HPAs from the files themselves (test_k8s.sh checks the rendering).
    # Each file a document stream of its own: one that does not end with a separator would run
    # into the next file's first document.
    echo "no kubectl: reading deploy/k8s/*.yaml"
    for f in "$k8s"/*.yaml; do
        echo "---"
        cat "$f"
    done >"$tmp/base.yaml"
fi

# ---------------------------------------------------------------- RabbitMQ with its exporter

# The run's node (integration-tests/run.sh exports its env), or a private one; infra.sh starts
# every node with its exporter on a port of its own (QUAN_INFRA_RABBIT_PROM_PORT).
if [ -n "${QUAN_INFRA_DIR:-}" ] && [ -f "$QUAN_INFRA_DIR/rabbit/env" ]; then
    node_dir=$QUAN_INFRA_DIR/rabbit
    amqp_port=$QUAN_INFRA_AMQP_PORT
    prom_port=${QUAN_INFRA_RABBIT_PROM_PORT:-}
    echo "RabbitMQ: the run's node, vhost $vhost"
else
    own_infra=$tmp/infra
    start=$SECONDS
    if ! QUAN_INFRA_DURABILITY=fast QUAN_INFRA_TOPOLOGY=single \
        "$root/deploy/local/infra.sh" start "$own_infra" >"$tmp/infra.log" 2>&1; then
        sed 's/^/     /' "$tmp/infra.log"
        bad "a private RabbitMQ starts (deploy/local/infra.sh)"
        finish
        exit 1
    fi
    node_dir=$own_infra/rabbit
    # shellcheck disable=SC1091 # written by infra.sh
    amqp_port=$(. "$own_infra/env" && echo "$QUAN_INFRA_AMQP_PORT")
    # shellcheck disable=SC1091 # written by infra.sh
    prom_port=$(. "$own_infra/env" && echo "${QUAN_INFRA_RABBIT_PROM_PORT:-}")
    echo "RabbitMQ: a private node ($((SECONDS - start)) s to start)"
fi
ctl=$node_dir/rabbitmqctl
if [ -n "$prom_port" ] && curl -fsS -o /dev/null "http://127.0.0.1:$prom_port/metrics"; then
    ok "RabbitMQ's exporter answers on 127.0.0.1:$prom_port"
else
    bad "RabbitMQ's exporter answers (QUAN_INFRA_RABBIT_PROM_PORT=${prom_port:-unset})"
    finish
    exit 1
fi

# The queues the HPAs name, declared as a service declares them (quan-bench-claims
# declare-queues: the queue, its .retry and .dead, bound to the consumer's event), in the base's
# queue type; then claims published to the claim queue so that its ready count is not 0.
published=3
"$ctl" -q add_vhost "$vhost" >/dev/null 2>&1
"$ctl" -q set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null 2>&1
export QUAN_AMQP_URL="amqp://guest:guest@127.0.0.1:$amqp_port/$vhost"
QUAN_MQ_QUEUE_TYPE=$("$py" -c '
import sys, yaml
print(next(d["data"]["QUAN_MQ_QUEUE_TYPE"] for d in yaml.safe_load_all(open(sys.argv[1]))
           if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "quan-config"))
' "$tmp/base.yaml")
export QUAN_MQ_QUEUE_TYPE
declare_ok=1
for pair in engine.redeem:EVENT_COUPON_REDEEM distribution.task-execute:EVENT_TASK_EXECUTE; do
    event=$(sed -n "s/^#define ${pair#*:} *\"\([^\"]*\)\".*/\1/p" "$root/common/core/events.h")
    "$bin/quan-bench-claims" declare-queues "${pair%%:*}" "$event" >>"$tmp/declare.log" 2>&1 ||
        declare_ok=0
done
"$bin/quan-bench-claims" publish autoscaling-test '{"kind":"probe"}' "$published" \
    >>"$tmp/declare.log" 2>&1 || declare_ok=0
if [ "$declare_ok" = 1 ]; then
    ok "the queues declared ($QUAN_MQ_QUEUE_TYPE) and $published claims published (vhost $vhost)"
else
    sed 's/^/     /' "$tmp/declare.log"
    bad "the queues declared and claims published ($bin/quan-bench-claims)"
fi

# The exporter refreshes queue counts every collect_statistics_interval (5 s), later on a
# loaded machine: wait (30 s at most) until both queues are there and the claims counted.
scrape() { curl -sf --max-time 5 "http://127.0.0.1:$prom_port$1"; }
detailed="/metrics/detailed?family=queue_coarse_metrics"
start=$SECONDS
for _ in $(seq 1 120); do
    scrape "$detailed" >"$tmp/detailed.prom" 2>/dev/null &&
        grep -q "^rabbitmq_detailed_queue_messages_ready{vhost=\"$vhost\",queue=\"quan.engine.redeem\"} $published\$" \
            "$tmp/detailed.prom" &&
        grep -q "^rabbitmq_detailed_queue_messages{vhost=\"$vhost\",queue=\"quan.distribution.task-execute\"} " \
            "$tmp/detailed.prom" && break
    sleep 0.25
done
echo "the exporter counted the queues after $((SECONDS - start)) s"
scrape /metrics >"$tmp/plain.prom" 2>/dev/null
check "the exporter serves $detailed and /metrics" test -s "$tmp/detailed.prom" -a -s "$tmp/plain.prom"

# ---------------------------------------------------------------- the rules against it

cat >"$tmp/check.py" <<'PY'
"""usage: check.py BASE RULES DETAILED PLAIN VHOST PUBLISHED [--break NAME]: the HPAs' External
metrics of BASE (rendered manifests) against the adapter rules (RULES) and the exporter's two
scrapes; prints "ok"/"FAIL" lines."""
import re
import sys

import yaml

base, rules_file, detailed, plain, vhost, published = sys.argv[1:7]
published = float(published)
spoil = sys.argv[sys.argv.index("--break") + 1] if "--break" in sys.argv else None


def check(name, cond, details=()):
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        for d in details:
            print("       " + d)


docs = [d for d in yaml.safe_load_all(open(base, encoding="utf-8")) if d]
with open(rules_file, encoding="utf-8") as f:
    rules = (yaml.safe_load(f) or {}).get("externalRules") or []

# What the HPAs ask the external metrics API for: (HPA, metric name, selector labels).
wanted = []
for h in docs:
    if h["kind"] != "HorizontalPodAutoscaler":
        continue
    for m in h["spec"].get("metrics") or []:
        if m["type"] == "External":
            e = m["external"]["metric"]
            wanted.append((h["metadata"]["name"], e["name"],
                           dict((e.get("selector") or {}).get("matchLabels") or {})))

if spoil == "plain-metric":
    # The name of the plain /metrics, where every queue is summed into one unlabelled series.
    rules[0]["seriesQuery"] = rules[0]["seriesQuery"].replace("rabbitmq_detailed_", "rabbitmq_")
    rules[0]["name"]["matches"] = rules[0]["name"]["matches"].replace("rabbitmq_detailed_",
                                                                      "rabbitmq_")
elif spoil == "wrong-label":
    for _, _, sel in wanted:
        sel["queue_name"] = sel.pop("queue")
elif spoil == "wrong-queue":
    wanted = [(h, n, {**s, "queue": s["queue"].replace(".", "-")}) for h, n, s in wanted]
elif spoil == "no-rule":
    rules.pop()
elif spoil == "sum-nodes":
    # Two nodes reporting the same queue (a stale leader): a sum would count it twice.
    for r in rules:
        r["metricsQuery"] = r["metricsQuery"].replace("max by", "sum by")
elif spoil:
    sys.exit(f"unknown --break {spoil}")

check(f"the HPAs name External metrics ({len(wanted)})", len(wanted) >= 2,
      [f"{w}" for w in wanted])


def parse_series_query(q):
    """'name{l!="",m="v"}' -> (name, {label: (op, value)})."""
    m = re.fullmatch(r'\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*', q)
    if not m:
        return None, {}
    labels = {}
    for lm in re.finditer(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"', m.group(2) or ""):
        labels[lm.group(1)] = (lm.group(2), lm.group(3))
    return m.group(1), labels


def exposed_name(rule, series):
    n = rule.get("name") or {}
    m = re.search(n.get("matches") or "^(.*)$", series)
    if not m:
        return None
    return re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))) or "", n.get("as") or "$0")


def read_samples(path):
    out = []
    for line in open(path, encoding="utf-8"):
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)', line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


# The scrape of the endpoint the rules are written for, restricted to this test's vhost (the
# run's node may hold other vhosts' queues of the same names).
samples = [s for s in read_samples(detailed) if s[1].get("vhost", vhost) == vhost]
plain_samples = read_samples(plain)


def evaluate(query, samples):
    """The adapter's metricsQuery after templating, of the one form the rules use:
    AGG by (LABELS) (NAME{MATCHERS}) -> {group: value}; None for any other form."""
    m = re.fullmatch(r'\s*(sum|max|min|avg)\s+by\s*\(([^)]*)\)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)'
                     r'\s*\{(.*)\}\s*\)\s*', query)
    if not m:
        return None
    agg, by = m.group(1), [x.strip() for x in m.group(2).split(",") if x.strip()]
    _, matchers = parse_series_query(m.group(3) + "{" + m.group(4) + "}")
    groups = {}
    for name, labels, value in samples:
        if name != m.group(3):
            continue
        okay = True
        for k, (op, v) in matchers.items():
            have = labels.get(k, "")
            okay &= {"=": have == v, "!=": have != v, "=~": re.fullmatch(v, have) is not None,
                     "!~": re.fullmatch(v, have) is None}[op]
        if okay:
            groups.setdefault(tuple(labels.get(b, "") for b in by), []).append(value)
    f = {"sum": sum, "max": max, "min": min, "avg": lambda v: sum(v) / len(v)}[agg]
    return {k: f(v) for k, v in groups.items()}


for hpa, metric, selector in wanted:
    found = []
    for r in rules:
        series, labels = parse_series_query(r.get("seriesQuery", ""))
        if series and exposed_name(r, series) == metric:
            found.append((r, series, labels))
    check(f"{hpa}: an adapter rule produces {metric}", len(found) == 1,
          [f"rules producing it: {len(found)}"])
    if len(found) != 1:
        continue
    r, series, labels = found[0]
    check(f"{hpa}: the rule is not namespaced (RabbitMQ's series carry no namespace of Quan's)",
          (r.get("resources") or {}).get("namespaced") is False)
    check(f"{hpa}: the rule's series carry the labels the HPA selects on ({', '.join(selector)})",
          selector and all(labels.get(k) in (("!=", ""), ("=~", ".+")) for k in selector),
          [f"seriesQuery: {r.get('seriesQuery')}"])
    # What the exporter serves: the rule's series with that label value, on the endpoint named.
    have = [s for s in samples if s[0] == series
            and all(s[1].get(k) == v for k, v in selector.items())]
    check(f"{hpa}: RabbitMQ's exporter serves {series}{{{', '.join(f'{k}={v!r}' for k, v in selector.items())}}} "
          "at /metrics/detailed?family=queue_coarse_metrics", len(have) == 1,
          [f"series {series} served there: {sum(s[0] == series for s in samples)}",
           f"on /metrics: {[s for s in plain_samples if s[0] == series][:3]}"])
    matchers = ",".join(f'{k}="{v}"' for k, v in selector.items())
    query = r.get("metricsQuery", "").replace("<<.Series>>", series) \
        .replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", ",".join(selector))
    # A second node reporting the same queue, as a cluster's may: the value must not change.
    doubled = samples + [(n, {**l, "instance": "another-node"}, v) for n, l, v in samples]
    got, got2 = evaluate(query, samples), evaluate(query, doubled)
    # Nothing consumes here: the claim queue holds the claims published, ready; the others none.
    want = published if selector.get("queue") == "quan.engine.redeem" else 0.0
    check(f"{hpa}: the rule's query gives one value per queue, {want:g} here, however many nodes "
          f"report it ({query})", got is not None and list(got.values()) == [want] and got == got2,
          [f"one node: {got}", f"two nodes: {got2}"])
PY

"$py" "$tmp/check.py" "$tmp/base.yaml" "$k8s/autoscaling/adapter-config.yaml" \
    "$tmp/detailed.prom" "$tmp/plain.prom" "$vhost" "$published" >"$tmp/check.out" 2>&1
rc=$?
tally "$tmp/check.out"
[ "$rc" -eq 0 ] || bad "checker exited $rc"

# The checker must be able to fail: each broken copy, and a check that must see it.
broken() {
    "$py" "$tmp/check.py" "$tmp/base.yaml" "$k8s/autoscaling/adapter-config.yaml" \
        "$tmp/detailed.prom" "$tmp/plain.prom" "$vhost" "$published" --break "$1" \
        >"$tmp/broken-$1.out" 2>&1
    rejects "$1" "$2" "$tmp/broken-$1.out"
}
broken plain-metric 'quan-engine-writer: RabbitMQ'"'"'s exporter serves'
broken wrong-label 'quan-engine-writer: the rule'"'"'s series carry the labels'
broken wrong-queue 'quan-distribution: RabbitMQ'"'"'s exporter serves'
broken no-rule 'quan-distribution: an adapter rule produces'
broken sum-nodes 'quan-engine-writer: the rule'"'"'s query gives one value per queue'

finish
