#!/usr/bin/env bash
# The alerting of deploy/prometheus, checked without a running service:
#   - promtool check config (prometheus.yml), check rules and test rules (every alert's unit
#     tests, deploy/prometheus/tests/);
#   - every alert of the rules file has a severity label, a for:, the annotations summary,
#     description and runbook, and a unit test that expects it to fire;
#   - every metric a rule reads is declared in a metrics list of the C sources (each module's, in
#     its header: integration-tests/dashboards.py reads them), a series Prometheus makes itself
#     (up), or one this suite saw on RabbitMQ's own exporter (the rabbitmq_prometheus plugin of
#     the broker integration-tests/run.sh started: QUAN_INFRA_RABBIT_PROM_PORT);
#   - deploy/k8s/monitoring/prometheusrule.yaml holds exactly the rules file's groups
#     (deploy/prometheus/sync-k8s.sh --check), and the checker fails on a broken copy.
# A few seconds. The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
cd "$root" || exit 2
prom=deploy/prometheus
rules=$prom/rules/quan-alerts.yml

if ! command -v promtool >/dev/null; then
    bad "promtool is installed (apt-get install prometheus; deploy/local/deps.sh)"
    finish
    exit 1
fi
check "promtool check config $prom/prometheus.yml" promtool check config "$prom/prometheus.yml"
check "promtool check rules $rules" promtool check rules "$rules"
check "promtool test rules $prom/tests/quan-alerts.test.yml" \
    bash -c "cd $prom/tests && promtool test rules quan-alerts.test.yml"
check "prometheusrule.yaml holds the rules file's groups" $prom/sync-k8s.sh --check

tmp=$(mktemp -d /tmp/test_prometheus.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The exporter's series names, when the run's broker has it.
: >"$tmp/exporter"
if [ -n "${QUAN_INFRA_RABBIT_PROM_PORT:-}" ]; then
    for path in metrics "metrics/detailed?family=queue_coarse_metrics"; do
        curl -fsS "http://127.0.0.1:$QUAN_INFRA_RABBIT_PROM_PORT/$path" |
            sed -n 's/^# TYPE \([a-zA-Z_:][a-zA-Z0-9_:]*\) .*/\1/p' >>"$tmp/exporter" || true
    done
fi

cat >"$tmp/check.py" <<'PY'
"""usage: check.py RULES TESTS EXPORTER_NAMES K8S_RULE; prints ok/FAIL lines."""
import os
import re
import sys

import yaml

sys.path.insert(0, os.path.join(os.getcwd(), "integration-tests"))
import dashboards  # noqa: E402  (the metrics lists of the C sources)

rules_path, tests_path, exporter_path, k8s_path = sys.argv[1:5]


def out(ok, what):
    print(("ok   " if ok else "FAIL ") + what)


doc = yaml.safe_load(open(rules_path))
alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
out(len(alerts) >= 14, "the rules file has its alerts (%d)" % len(alerts))
for r in alerts:
    a = r["alert"]
    ann = r.get("annotations", {})
    good = (r.get("labels", {}).get("severity") in ("critical", "warning") and "for" in r
            and all(len(ann.get(k, "")) > 20 for k in ("summary", "description"))
            and len(ann.get("runbook", "").split(". ")) >= 2)
    out(good, "%s: severity, for:, summary, description and a runbook of sentences" % a)

tests = yaml.safe_load(open(tests_path))
fired = set()
for t in tests["tests"]:
    for c in t.get("alert_rule_test", []):
        if c.get("exp_alerts"):
            fired.add(c["alertname"])
for r in alerts:
    out(r["alert"] in fired, "%s: a unit test expects it to fire" % r["alert"])

# Metric names a rule reads: identifiers left once strings, label matchers, grouping clauses
# and function calls are taken out.
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "bool", "offset", "sum", "min", "max", "avg", "count", "group",
            "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}


def metric_names(expr):
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or m.group(0) in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


declared = dashboards.metrics_list()
listed = set(declared)
# a histogram's series: its buckets, sum and count
listed |= {n + sfx for n, (t, _) in declared.items() if t == "HISTOGRAM"
           for sfx in ("_bucket", "_sum", "_count")}
exporter = set(open(exporter_path).read().split())
BUILTIN = {"up"}


def unknown(names):
    return sorted(n for n in names if n not in listed and n not in BUILTIN and n not in exporter)


out(metric_names('sum by (job) (rate(a_total{x="y"}[5m])) / on () b > 0 unless c')
    == {"a_total", "b", "c"}, "the metric-name reader reads names")
out(unknown({"quan_not_a_metric"}) == ["quan_not_a_metric"],
    "a name in no metrics list is refused")
out(unknown({"quan_build_info", "quan_http_requests_total", "quan_claims_total",
             "quan_dist_tasks_running"}) == [],
    "the lists of metrics.h, of the library's modules and of the services' are read")
out(unknown({"quan_loop_lag_seconds_bucket", "quan_claims_total_bucket"})
    == ["quan_claims_total_bucket"], "a histogram's buckets are known, a counter has none")
if not exporter:
    print("     no exporter seen: QUAN_INFRA_RABBIT_PROM_PORT unset or not answering")
for r in alerts:
    bad = unknown(metric_names(r["expr"]))
    out(not bad, "%s reads only known metrics%s" % (r["alert"], " (unknown: %s)" % bad if bad else ""))

k8s = yaml.safe_load(open(k8s_path))
out(k8s.get("kind") == "PrometheusRule" and k8s["spec"]["groups"] == doc["groups"],
    "the PrometheusRule's groups equal the rules file's")
PY

py=/usr/bin/python3
$py "$tmp/check.py" "$rules" $prom/tests/quan-alerts.test.yml \
    "$tmp/exporter" deploy/k8s/monitoring/prometheusrule.yaml >"$tmp/out" 2>&1
echo "exit $?" >>"$tmp/out"
tally "$tmp/out"

# The checker fails on a PrometheusRule that lost a rule.
$py - deploy/k8s/monitoring/prometheusrule.yaml "$tmp/broken.yaml" <<'PY'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["spec"]["groups"][0]["rules"].pop()
yaml.safe_dump(d, open(sys.argv[2], "w"))
PY
$py "$tmp/check.py" "$rules" $prom/tests/quan-alerts.test.yml \
    "$tmp/exporter" "$tmp/broken.yaml" >"$tmp/out2" 2>&1
check "the checker refuses a PrometheusRule that differs" \
    grep -q "^FAIL the PrometheusRule's groups equal" "$tmp/out2"
finish
