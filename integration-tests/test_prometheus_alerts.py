"""The service-down alert end to end: a real Prometheus (integration-tests/prom.py) scrapes the
four services this suite starts, with deploy/prometheus/rules/quan-alerts.yml unchanged (its
for: as written; scrapes and evaluations every second). The engine is killed with SIGKILL:
QuanTargetDown must be firing for it within its for: plus one scrape interval plus slack, and
only for it; started again on the same port, the alert resolves. About a minute."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prom  # noqa: E402
import quan  # noqa: E402
from quan import Service, check, wait_for  # noqa: E402

RULES = os.path.join(quan.ROOT, "deploy", "prometheus", "rules", "quan-alerts.yml")
INTERVAL = 1.0
SLACK = 5.0
state = {}


def rule_for(name):
    """The for: of alert name in the rules file, in seconds (from Prometheus' own view)."""
    for g in state["prom"].rules():
        for r in g["rules"]:
            if r.get("name") == name:
                return float(r["duration"])
    raise AssertionError("no rule %s loaded" % name)


def engine_alerts(state_name=None):
    return [a for a in state["prom"].alerts()
            if a["labels"].get("alertname") == "QuanTargetDown"
            and (state_name is None or a["state"] == state_name)]


def test_setup():
    svcs = {n: Service(n) for n in quan.SERVICES}
    for s in svcs.values():
        s.wait_ready()
    state["svcs"] = svcs
    targets = {"quan-" + n: ["127.0.0.1:%d" % p for p in s.ports] for n, s in svcs.items()}
    p = prom.start(os.path.join(quan.TMP, "prom-alerts-%d" % os.getpid()), targets,
                   rule_files=[RULES], scrape_interval="1s", evaluation_interval="1s")
    state["prom"] = p
    p.wait_ready()
    check(wait_for(lambda: len(p.query("up == 1")) == sum(len(s.ports) for s in svcs.values()),
                   15), "every service scraped: %s" % p.targets())
    check(len(p.rules()) >= 5, "the rule groups are loaded")
    check(wait_for(lambda: len(p.query("quan_ready == 1")) >= 4, 15),
          "quan_ready is 1 on every service: %s" % p.query("quan_ready"))
    check(engine_alerts() == [], "no QuanTargetDown while all are up")


def test_engine_killed_fires():
    p, eng = state["prom"], state["svcs"]["engine"]
    hold = rule_for("QuanTargetDown")
    check(hold <= 60, "QuanTargetDown's for: is at most 1m (%ss)" % hold)
    killed = time.time()
    eng.proc.send_signal(signal.SIGKILL)
    eng.proc.wait()
    limit = hold + INTERVAL + SLACK
    fired = wait_for(lambda: engine_alerts("firing"), limit)
    took = time.time() - killed
    check(fired, "QuanTargetDown firing within %.0fs of the SIGKILL: %s" % (limit, p.alerts()))
    alerts = engine_alerts("firing")
    check(len(alerts) == 1 and alerts[0]["labels"]["job"] == "quan-engine"
          and alerts[0]["labels"]["severity"] == "critical",
          "only the engine's target is down: %s" % alerts)
    check(took >= hold, "not before its for: (%.1fs < %ss)" % (took, hold))
    check(alerts[0]["annotations"].get("runbook"), "the alert carries its runbook")
    print("     firing %.1fs after the SIGKILL (for: %ss)" % (took, hold))


def test_engine_restarted_resolves():
    p, old = state["prom"], state["svcs"]["engine"]
    old.stop()
    eng = Service("engine", port=old.port).wait_ready()
    state["svcs"]["engine"] = eng
    check(wait_for(lambda: engine_alerts() == [], 10 + SLACK),
          "QuanTargetDown resolved once the engine is back: %s" % p.alerts())
    check(p.query('up{job="quan-engine"} == 1'), "the engine is scraped again")


def test_teardown():
    state["prom"].stop()
    for s in state["svcs"].values():
        s.stop()


if __name__ == "__main__":
    quan.run([test_setup, test_engine_killed_fires, test_engine_restarted_resolves,
              test_teardown])
