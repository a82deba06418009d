"""The Grafana dashboards of deploy/grafana/dashboards read as test data: every panel's PromQL
(targets[].expr) with the template variables replaced by values that match everything, the
metric and label names an expression uses, and the metrics the C sources declare (each module's
X-macro list in its header, common/core/metrics.h).

    for e in dashboards.exprs():
        e.file, e.uid, e.panel, e.ref_id, e.expr    # e.expr is ready for /api/v1/query

Only the standard library."""

import collections
import glob
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "deploy", "grafana", "dashboards")
# Where the metrics lists are: every header of the library and of the services.
METRICS_HEADERS = [os.path.join(ROOT, "common", "*", "*.h"),
                   os.path.join(ROOT, "services", "*", "*.h")]

# Grafana's built-in variables, as a query over the last minutes would see them. Durations of
# a minute hold several samples at any scrape interval up to 15 s.
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "5m", "__range_s": "300",
            "__range_ms": "300000", "__interval_ms": "60000"}
# A dashboard variable may be multi-valued: it stands only in a regex matcher, as the value
# matching every label value.
MATCH_ALL = ".+"
# $name, ${name}, ${name:format}, [[name]]
VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
REGEX_MATCHER = re.compile(r'=~\s*"([^"\\]*(?:\\.[^"\\]*)*)"')

Expr = collections.namedtuple("Expr", "file uid panel ref_id expr raw")


def files():
    return sorted(glob.glob(os.path.join(DIR, "*.json")))


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def panels(dash):
    """Every panel, the panels of collapsed rows included, rows themselves excluded."""
    out = []
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def rows(dash):
    return [p for p in dash.get("panels", []) if p.get("type") == "row"]


def variables(dash):
    return {v["name"]: v for v in dash.get("templating", {}).get("list", [])}


def substitute(expr):
    """expr with every variable replaced: built-ins by durations, dashboard variables by .+ .
    A dashboard variable outside a =~ matcher is refused (ValueError): with several values
    selected, Grafana writes a regex there, which only =~ reads as one."""
    def in_matcher(m):
        return VAR.sub(lambda v: BUILTINS.get(_name(v), MATCH_ALL), m.group(0))

    out = REGEX_MATCHER.sub(in_matcher, expr)
    left = [_name(v) for v in VAR.finditer(out) if _name(v) not in BUILTINS]
    if left:
        raise ValueError("variables outside a =~ matcher: %s in %s" % (", ".join(left), expr))
    return VAR.sub(lambda v: BUILTINS[_name(v)], out)


def _name(m):
    return m.group(1) or m.group(2) or m.group(3)


def exprs(paths=None):
    """Yields an Expr for every target of every panel of every dashboard."""
    for path in paths or files():
        dash = load(path)
        for p in panels(dash):
            for t in p.get("targets", []):
                if "expr" in t:
                    yield Expr(os.path.basename(path), dash.get("uid"), p.get("title"),
                               t.get("refId"), substitute(t["expr"]), t["expr"])


def variable_queries(dash):
    """(name, metric selector, label) of every label_values(selector, label) variable query."""
    out = []
    for v in variables(dash).values():
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else q or v.get("definition", "")
        m = re.match(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", q)
        out.append((v["name"], m.group(1) if m else None, m.group(2) if m else q))
    return out


def metrics_declared(patterns=None):
    """[(header, name, type, [labels])] of every entry X(name, TYPE, help, "labels") of the
    metrics lists (metrics.h), in the order of the headers and of their lists."""
    out = []
    for path in sorted(p for pat in (patterns or METRICS_HEADERS) for p in glob.glob(pat)):
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)  # the examples of comments
        for m in re.finditer(r'X\((\w+),\s*(COUNTER|GAUGE|HISTOGRAM),(.*?)"([a-z_,]*)"\)\s*\\?\n',
                             text, re.S):
            out.append((os.path.relpath(path, ROOT), m.group(1), m.group(2),
                        [x for x in m.group(4).split(",") if x]))
    return out


def metrics_list(patterns=None):
    """{name: (type, [labels])} of every metric the lists declare."""
    return {name: (kind, labels) for _, name, kind, labels in metrics_declared(patterns)}


KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan", "atan2"}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"')


def _strip_strings(expr):
    return re.sub(r'"([^"\\]*(?:\\.[^"\\]*)*)"', '""', expr)


def metric_names(expr):
    """The metric names an expression reads (a histogram's _bucket, _sum, _count as written)."""
    e = _strip_strings(expr)
    e = re.sub(r"\[[^\]]*\]", "", e)          # range and subquery durations
    e = re.sub(r"\{[^}]*\}", " ", e)          # matchers
    e = GROUPING.sub(" ", e)                  # label lists
    names = []
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():]
        start = m.start()
        if start > 0 and (e[start - 1].isdigit() or e[start - 1] == "."):
            continue                          # the exponent or unit of a number
        if rest.lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue                          # a function or an operator
        names.append(word)
    return names


def matcher_labels(expr):
    """(metric name or None, label) of every label matcher of every selector."""
    out = []
    for m in SELECTOR.finditer(_strip_strings_keep(expr)):
        for lm in MATCHER.finditer(m.group(2)):
            out.append((m.group(1), lm.group(1)))
    return out


def _strip_strings_keep(expr):
    """The expression with the contents of strings blanked but their quotes kept, so that a
    brace or a comma inside a regex does not end a selector."""
    return re.sub(r'"([^"\\]*(?:\\.[^"\\]*)*)"', lambda m: '"' + "x" * len(m.group(1)) + '"',
                  expr)


def grouping_labels(expr):
    """Labels named in by, without, on, ignoring, group_left and group_right."""
    out = []
    for m in GROUPING.finditer(_strip_strings(expr)):
        out += [x.strip() for x in m.group(2).split(",") if x.strip()]
    return out
