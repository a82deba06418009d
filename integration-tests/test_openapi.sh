#!/usr/bin/env bash
# Lints docs/openapi.yaml, the machine-readable HTTP contract (docs/api.md is its overview):
#   (a) structural checks in Python (python3-yaml): the document parses as OpenAPI 3.0.3, every
#       $ref resolves, every operation has an operationId (unique), a summary, responses,
#       security, the request-id/traceparent headers; every endpoint of the contract is there
#       with its method and server; the error codes and conventions are declared; every route
#       the C services register (http_route/nodup_route with a literal "/api/..." path) is
#       documented with the same method; the endpoint tables of docs/api.md list exactly the
#       operations of the file; and the errors of common/core/errcode.h are exactly those of docs/api.md's
#       status table and of the ErrorCode enum. The checker must also reject a broken copy.
#   (b) `redocly lint` (@redocly/cli), recommended rules, no errors and no warnings; it must
#       also reject a broken copy.
#   (c) `spectral lint` (@stoplight/spectral-cli) with integration-tests/openapi/spectral.yaml
#       (Spectral's OpenAPI ruleset, spectral:oas), no errors and no warnings but the ones that
#       file names; it must also reject a broken copy.
#   Both linters are pinned in integration-tests/openapi/package-lock.json and installed there
#   with `npm ci` when what is installed is not what the lock names. No npm or no network: FAIL.
# Needs no servers. The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
spec=$root/docs/openapi.yaml
lintdir=$root/integration-tests/openapi
py=/usr/bin/python3


tmp=$(mktemp -d /tmp/test_openapi.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# ---------------------------------------------------------------- (a) structure, in Python
cat >"$tmp/check.py" <<'PY'
"""Structural checks of an OpenAPI document; prints "ok"/"FAIL" lines, exits 1 on a failure.
usage: check.py SPEC [SRC_ROOT]  (SRC_ROOT: scan services/*/*.c for registered routes)"""
import glob
import re
import sys

import yaml

METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
MA, EN, ST = "/api/merchant-admin", "/api/engine", "/api/settlement"
# Every endpoint of the contract (docs/api.md): (method, path) -> server port.
EXPECTED = {
    ("post", MA + "/coupon-template/create"): 10010,
    ("get", MA + "/coupon-template/page"): 10010,
    ("get", MA + "/coupon-template/find"): 10010,
    ("post", MA + "/coupon-template/increase-number"): 10010,
    ("post", MA + "/coupon-template/terminate"): 10010,
    ("get", MA + "/coupon-template/log"): 10010,
    ("get", MA + "/coupon/history"): 10010,
    ("post", MA + "/coupon-task/create"): 10010,
    ("get", MA + "/coupon-task/page"): 10010,
    ("get", MA + "/coupon-task/find"): 10010,
    ("post", MA + "/coupon-task/cancel"): 10010,
    ("get", MA + "/coupon-task/fail-report"): 10010,
    ("post", MA + "/coupon-template/exchange-code/create"): 10010,
    ("get", MA + "/coupon-template/exchange-code/find"): 10010,
    ("get", MA + "/coupon-template/exchange-code/export"): 10010,
    ("get", EN + "/coupon-template/query"): 10020,
    ("post", EN + "/coupon-template/query"): 10020,
    ("post", EN + "/user-coupon/redeem"): 10020,
    ("post", EN + "/user-coupon/redeem-mq"): 10020,
    ("get", EN + "/user-coupon/redeem-result"): 10020,
    ("get", EN + "/user-coupon/list"): 10020,
    ("get", EN + "/user-coupon/history"): 10020,
    ("post", EN + "/user-coupon/create-payment-record"): 10020,
    ("post", EN + "/user-coupon/process-payment"): 10020,
    ("post", EN + "/user-coupon/process-refund"): 10020,
    ("post", EN + "/user-coupon/cancel-payment"): 10020,
    ("post", EN + "/user-coupon/exchange"): 10020,
    ("post", EN + "/coupon-template-remind/create"): 10020,
    ("get", EN + "/coupon-template-remind/list"): 10020,
    ("post", EN + "/coupon-template-remind/cancel"): 10020,
    ("post", ST + "/coupon-query"): 10030,
    ("get", "/livez"): None,
    ("get", "/readyz"): None,
    ("get", "/metrics"): None,
}
# Marked (Quan) in docs/api.md: their descriptions must say so.
QUAN = {
    MA + "/coupon-template/log", MA + "/coupon-task/cancel", MA + "/coupon-task/fail-report",
    MA + "/coupon-template/exchange-code/create", MA + "/coupon-template/exchange-code/find",
    MA + "/coupon-template/exchange-code/export",
    EN + "/user-coupon/redeem-result", EN + "/user-coupon/list", EN + "/user-coupon/cancel-payment",
    EN + "/user-coupon/exchange", MA + "/coupon-template/create", MA + "/coupon-task/create",
    EN + "/user-coupon/redeem", EN + "/user-coupon/redeem-mq", EN + "/user-coupon/history",
    MA + "/coupon/history",
}
CODES = ["A000001", "A000401", "A000404", "A000405", "A000409", "A000429", "B000001",
         "B000100", "B000101", "B000102", "B000103", "B000104", "C000001"]
STATUS_CODE = {"400": "A000001", "401": "A000401", "404": "A000404", "405": "A000405",
               "413": "A000001", "429": "A000429", "500": "B000001", "503": "C000001"}
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"

failures = 0


def check(name, cond, detail=""):
    global failures
    if cond:
        print("ok   " + name)
    else:
        failures += 1
        print("FAIL " + name + (": " + detail if detail else ""))


def walk(node, path=""):
    """Yields (json-pointer, value) of every node."""
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, path + "/" + str(k).replace("~", "~0").replace("/", "~1"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, path + "/" + str(i))


def resolve(doc, ref):
    if not ref.startswith("#/"):
        return None
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def deref(doc, node, depth=0):
    while isinstance(node, dict) and "$ref" in node and depth < 20:
        node = resolve(doc, node["$ref"])
        depth += 1
    return node


def schema_mentions(doc, schema, target, seen=None):
    """True if schema is, or composes (allOf), the component schema named target."""
    seen = seen or set()
    if not isinstance(schema, dict):
        return False
    ref = schema.get("$ref")
    if ref:
        if ref == "#/components/schemas/" + target:
            return True
        if ref in seen:
            return False
        seen.add(ref)
        return schema_mentions(doc, resolve(doc, ref), target, seen)
    return any(schema_mentions(doc, s, target, seen) for s in schema.get("allOf", []))


def main():
    spec = sys.argv[1]
    src = sys.argv[2] if len(sys.argv) > 2 else None
    try:
        with open(spec, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except Exception as e:  # a YAML error ends the checks here
        check("the YAML parses", False, str(e).splitlines()[0])
        return 1
    check("the YAML parses", isinstance(doc, dict))
    if not isinstance(doc, dict):
        return 1
    check("openapi is 3.0.3", doc.get("openapi") == "3.0.3", repr(doc.get("openapi")))
    info = doc.get("info") or {}
    check("info has title and version", bool(info.get("title")) and bool(info.get("version")))

    refs = [(p, v["$ref"]) for p, v in walk(doc) if isinstance(v, dict) and "$ref" in v]
    dangling = [f"{p}: {r}" for p, r in refs if resolve(doc, r) is None]
    check(f"every $ref resolves ({len(refs)} refs)", refs and not dangling, "; ".join(dangling[:5]))

    servers = {s.get("url", ""): s for s in doc.get("servers") or []}

    def server_ports(servers_list):
        ports = set()
        for s in servers_list or []:
            url = s.get("url", "")
            for var, v in (s.get("variables") or {}).items():
                url = url.replace("{" + var + "}", str(v.get("default", "")))
            m = re.match(r"^https?://[^/:]+:(\d+)$", url)
            if m:
                ports.add(int(m.group(1)))
        return ports

    check("servers for ports 10010, 10020, 10030",
          {10010, 10020, 10030} <= server_ports(doc.get("servers")), str(list(servers)))

    paths = doc.get("paths") or {}
    ops = {}
    problems = {k: [] for k in ("responses", "operationId", "summary", "security", "2xx",
                                "headers", "envelope", "errors", "quan", "server", "tags")}
    op_ids = []
    tags = {t.get("name") for t in doc.get("tags") or []}
    schemes = (doc.get("components") or {}).get("securitySchemes") or {}
    for path, item in paths.items():
        item = deref(doc, item) or {}
        path_params = item.get("parameters") or []
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            key = (method, path)
            ops[key] = op
            where = f"{method.upper()} {path}"
            responses = op.get("responses") or {}
            if not responses:
                problems["responses"].append(where)
            if not op.get("operationId"):
                problems["operationId"].append(where)
            else:
                op_ids.append(op["operationId"])
            if not op.get("summary"):
                problems["summary"].append(where)
            if not op.get("tags") or any(t not in tags for t in op["tags"]):
                problems["tags"].append(where)
            sec = op.get("security", doc.get("security"))
            if sec is None or any(n not in schemes for req in sec for n in req):
                problems["security"].append(where)
            elif path.startswith(MA) and not any({"userId", "shopNumber"} <= set(r) for r in sec):
                problems["security"].append(where + " (needs X-User-Id + X-Shop-Number)")
            elif path.startswith(("/api/engine", ST)) and not any("userId" in r for r in sec):
                problems["security"].append(where + " (needs X-User-Id)")
            params = [deref(doc, p) or {} for p in path_params + (op.get("parameters") or [])]
            hdrs = {p.get("name", "").lower() for p in params if p.get("in") == "header"}
            if not {"x-request-id", "traceparent"} <= hdrs:
                problems["headers"].append(where + " (request)")
            if not any(str(c).startswith("2") for c in responses):
                problems["2xx"].append(where)
            for code, resp in responses.items():
                resp = deref(doc, resp) or {}
                rh = {h.lower() for h in (resp.get("headers") or {})}
                if not {"x-request-id", "traceparent"} <= rh:
                    problems["headers"].append(f"{where} {code} (response)")
                for mt, media in (resp.get("content") or {}).items():
                    if mt == "application/json" and not (
                            schema_mentions(doc, media.get("schema"), "Envelope")
                            or schema_mentions(doc, media.get("schema"), "ErrorEnvelope")):
                        problems["envelope"].append(f"{where} {code}")
                want = STATUS_CODE.get(str(code))
                if want:
                    body = ((resp.get("content") or {}).get("application/json") or {})
                    ex = body.get("example") or {}
                    if not schema_mentions(doc, body.get("schema"), "ErrorEnvelope") or \
                            ex.get("code") != want:
                        problems["errors"].append(f"{where} {code} (want {want})")
            text = " ".join(str(op.get(k, "")) for k in ("summary", "description"))
            if path in QUAN and "(Quan" not in text:
                problems["quan"].append(where)
            want_port = EXPECTED.get(key)
            if want_port and server_ports(op.get("servers") or item.get("servers")) != {want_port}:
                problems["server"].append(f"{where} (want port {want_port})")

    check("every operation has responses", not problems["responses"], str(problems["responses"]))
    check("every operation has an operationId", not problems["operationId"],
          str(problems["operationId"]))
    dup = sorted({i for i in op_ids if op_ids.count(i) > 1})
    check("operationIds are unique", not dup, str(dup))
    check("every operation has a summary", not problems["summary"], str(problems["summary"]))
    check("every operation has declared tags", not problems["tags"], str(problems["tags"]))
    check("every operation has security (identity headers) or security: []",
          not problems["security"], str(problems["security"]))
    check("X-Request-Id and traceparent: accepted by every operation, echoed by every response",
          not problems["headers"], str(problems["headers"][:5]))
    check("every operation has a 2xx response", not problems["2xx"], str(problems["2xx"]))
    check("JSON responses are envelopes", not problems["envelope"], str(problems["envelope"][:5]))
    check("error responses are error envelopes with the status's code",
          not problems["errors"], str(problems["errors"][:5]))
    check("(Quan) additions are marked in their descriptions", not problems["quan"],
          str(problems["quan"]))
    check("API paths name their service's server", not problems["server"], str(problems["server"]))

    missing = sorted(f"{m.upper()} {p}" for m, p in EXPECTED if (m, p) not in ops)
    check(f"every endpoint of the contract is documented ({len(EXPECTED)})", not missing,
          str(missing))

    comps = doc.get("components") or {}
    schemas = comps.get("schemas") or {}
    env = deref(doc, schemas.get("Envelope")) or {}
    check("Envelope has code, message, data, requestId, success",
          set(env.get("required") or []) == {"code", "message", "data", "requestId", "success"})
    enum = (deref(doc, schemas.get("ErrorCode")) or {}).get("enum") or []
    check("every error code is declared", set(CODES) <= set(enum), str(set(CODES) - set(enum)))
    check("ids are strings ^[0-9]{1,19}$",
          (schemas.get("Id") or {}).get("type") == "string"
          and (schemas.get("Id") or {}).get("pattern") == "^[0-9]{1,19}$")
    id_in = {s.get("type") for s in (deref(doc, x) for x in
                                     (schemas.get("IdInput") or {}).get("oneOf") or [])}
    check("id inputs accept a string or an integer", id_in == {"string", "integer"}, str(id_in))
    check("identity schemes X-User-Id and X-Shop-Number",
          {(s.get("in"), s.get("name")) for s in (comps.get("securitySchemes") or {}).values()}
          >= {("header", "X-User-Id"), ("header", "X-Shop-Number")})
    uname = [p for p in (comps.get("parameters") or {}).values()
             if p.get("in") == "header" and p.get("name") == "X-Username"]
    check("X-Username is an optional header", bool(uname) and not uname[0].get("required"))
    xlsx = [f"{m.upper()} {p}" for (m, p), op in ops.items()
            if any(XLSX in ((deref(doc, r) or {}).get("content") or {})
                   for c, r in (op.get("responses") or {}).items() if str(c) == "200")]
    check("xlsx downloads: fail-report and exchange-code export",
          {f"GET {MA}/coupon-task/fail-report",
           f"GET {MA}/coupon-template/exchange-code/export"} <= set(xlsx), str(xlsx))
    metrics = ((ops.get(("get", "/metrics")) or {}).get("responses") or {}).get("200") or {}
    check("/metrics is text/plain; version=0.0.4",
          "text/plain; version=0.0.4" in ((deref(doc, metrics) or {}).get("content") or {}))
    rules = [((schemas.get(n) or {}).get("oneOf") or []) for n in ("ReceiveRuleInput",
                                                                     "ConsumeRuleInput")]
    check("rules accept an object or a JSON string",
          all({(deref(doc, s) or {}).get("type") for s in r} == {"object", "string"}
              for r in rules))

    if src:
        # Routes are registered as http_route(srv, HTTP_GET, "/api/...", ...) or through
        # nodup_route; the path is a literal, possibly on the next line.
        code_routes = set()
        for f in sorted(glob.glob(src + "/services/*/*.c")):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for m in re.finditer(r'HTTP_(GET|POST|PUT|DELETE|PATCH)\s*,\s*"(/[^"]*)"', text):
                code_routes.add((m.group(1).lower(), m.group(2)))
        undocumented = sorted(f"{m.upper()} {p}" for m, p in code_routes if (m, p) not in ops)
        check(f"every route the services register is documented ({len(code_routes)} found)",
              not undocumented, str(undocumented))

        # docs/api.md: a "## " heading naming `/api/...` sets the path prefix of the table rows
        # under it ("| GET `/path` | ..."); other headings reset it.
        listed, prefix = set(), ""
        try:
            with open(src + "/docs/api.md", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("## "):
                        m = re.search(r"`(/api/[^`]*)`", line)
                        prefix = m.group(1) if m else ""
                        continue
                    m = re.match(r"^\| (GET|POST|PUT|DELETE|PATCH) `(/[^`]*)`", line)
                    if m:
                        listed.add((m.group(1).lower(), prefix + m.group(2)))
        except OSError as e:
            check("docs/api.md is readable", False, str(e))
        # The errors: common/core/errcode.h lists what the services answer, once; the status table of
        # docs/api.md ("| 409 | `B000100` ... |") names exactly its (status, code) pairs, and
        # the ErrorCode enum of this file exactly its codes.
        pairs, documented = set(), set()
        try:
            with open(src + "/common/core/errcode.h", encoding="utf-8") as fh:
                for m in re.finditer(r'X\(\s*ERRCODE_\w+\s*,\s*(\d{3})\s*,\s*"(\w+)"', fh.read()):
                    pairs.add((int(m.group(1)), m.group(2)))
            with open(src + "/docs/api.md", encoding="utf-8") as fh:
                for line in fh:
                    m = re.match(r"^\| (\d{3}) \| (.*?) \|", line)
                    if m and int(m.group(1)) >= 400:
                        documented |= {(int(m.group(1)), c)
                                       for c in re.findall(r"`([ABC]0\d{5})`", m.group(2))}
        except OSError as e:
            check("common/core/errcode.h and docs/api.md are readable", False, str(e))
        check(f"docs/api.md's status table = common/core/errcode.h ({len(pairs)} status and code pairs)",
              pairs and pairs == documented,
              f"only in errcode.h: {sorted(pairs - documented)}; "
              f"only in docs/api.md: {sorted(documented - pairs)}")
        codes = {c for _, c in pairs}
        check("the ErrorCode enum = common/core/errcode.h's codes", set(enum) - {"0"} == codes,
              f"enum {sorted(enum)}, errcode.h {sorted(codes)}")

        only_api = sorted(f"{m.upper()} {p}" for m, p in listed - set(ops))
        only_spec = sorted(f"{m.upper()} {p}" for m, p in set(ops) - listed)
        check(f"docs/api.md lists exactly the operations of openapi.yaml ({len(listed)} listed)",
              listed and not only_api and not only_spec,
              f"only in docs/api.md: {only_api}; only in openapi.yaml: {only_spec}")
    return 1 if failures else 0


sys.exit(main())
PY

if [ ! -f "$spec" ]; then
    bad "docs/openapi.yaml exists"
elif "$py" -c 'import yaml' 2>"$tmp/yaml.err"; then
    "$py" "$tmp/check.py" "$spec" "$root" >"$tmp/check.out" 2>&1
    rc=$?
    tally "$tmp/check.out"
    [ "$rc" -eq 0 ] || grep -q '^FAIL ' "$tmp/check.out" || bad "checker exited $rc"
    # The checker must be able to fail: a copy with a dangling $ref, a lost operationId and a
    # missing endpoint.
    sed -e 's|#/components/schemas/TemplatePage|#/components/schemas/NoSuchSchema|' \
        -e '0,/operationId: merchantPageCouponTasks/{/operationId: merchantPageCouponTasks/d}' \
        -e 's|^  /api/engine/user-coupon/exchange:|  /api/engine/user-coupon/exchange-typo:|' \
        "$spec" >"$tmp/broken.yaml"
    "$py" "$tmp/check.py" "$tmp/broken.yaml" >"$tmp/broken.out" 2>&1
    if grep -q '^FAIL every \$ref resolves' "$tmp/broken.out" &&
        grep -q '^FAIL every operation has an operationId' "$tmp/broken.out" &&
        grep -q '^FAIL every endpoint of the contract is documented' "$tmp/broken.out"; then
        ok "the structural checker rejects a broken copy"
    else
        bad "the structural checker rejects a broken copy"
        sed 's/^/     /' "$tmp/broken.out" | grep FAIL
    fi
else
    bad "python3 has yaml (apt package python3-yaml): $(head -n 1 "$tmp/yaml.err")"
fi

# ---------------------------------------------------------------- the linters, pinned
redocly=$lintdir/node_modules/.bin/redocly
spectral=$lintdir/node_modules/.bin/spectral
# Redocly would otherwise send usage data and look for updates on every run.
export REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true NO_UPDATE_NOTIFIER=1
# node_modules/.quan-lock: the lock the last `npm ci` installed (npm ci starts from nothing, so
# it runs only when that is not the committed lock).
if ! cmp -s "$lintdir/package-lock.json" "$lintdir/node_modules/.quan-lock" 2>/dev/null ||
    [ ! -x "$redocly" ] || [ ! -x "$spectral" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        bad "npm is installed (deploy/local/deps.sh installs nodejs and npm)"
    # --ignore-scripts: the linters need no install scripts (only core-js's banner has one).
    elif timeout 300 npm ci --prefix "$lintdir" --no-audit --no-fund --ignore-scripts \
        >"$tmp/npm.log" 2>&1; then
        cp "$lintdir/package-lock.json" "$lintdir/node_modules/.quan-lock"
        ok "npm ci installed the pinned @redocly/cli and @stoplight/spectral-cli"
    else
        bad "npm ci --prefix integration-tests/openapi (network? registry?)"
        tail -n 20 "$tmp/npm.log" | sed 's/^/     /'
    fi
fi
# pinned PACKAGE BIN: BIN --version says the version package.json pins for PACKAGE.
pinned() {
    local want have
    want=$(sed -n "s|.*\"$1\": *\"\([^\"]*\)\".*|\1|p" "$lintdir/package.json")
    have=$("$2" --version 2>/dev/null | tail -n 1)
    if [ -n "$want" ] && [ "$have" = "$want" ]; then
        ok "$1 is the pinned version ($have)"
    else
        bad "$1 is the pinned version (want '$want', have '$have'; rm -rf integration-tests/openapi/node_modules)"
    fi
}

# lint_rejects LINTER EXIT OUT PATTERN...: LINTER, run on a broken copy, exited EXIT (not 0)
# and its output OUT has every PATTERN (grep's).
lint_rejects() {
    local name=$1 rc=$2 out=$3 p missing=0
    shift 3
    for p in "$@"; do grep -q -- "$p" "$out" || missing=1; done
    if [ "$rc" -ne 0 ] && [ "$missing" -eq 0 ]; then
        ok "$name rejects a broken copy"
    else
        bad "$name rejects a broken copy (exit $rc)"
        sed 's/^/     /' "$out" | tail -n 30
    fi
}

# ---------------------------------------------------------------- (b) redocly lint
if [ -x "$redocly" ]; then
    pinned @redocly/cli "$redocly"
    (cd "$lintdir" && "$redocly" lint --config redocly.yaml --format=stylish "$spec") \
        >"$tmp/lint.out" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && ! grep -qiE 'warning|error' "$tmp/lint.out" &&
        grep -q 'valid' "$tmp/lint.out"; then
        ok "redocly lint: no errors, no warnings"
    else
        bad "redocly lint: no errors, no warnings (exit $rc)"
        sed 's/^/     /' "$tmp/lint.out" | tail -n 60
    fi
    # The linter must be able to fail: an example that contradicts its schema and a dangling
    # $ref.
    sed -e 's|#/components/schemas/TaskPage|#/components/schemas/NoSuchSchema|' \
        -e "s|example: {couponTemplateId: '1810966706881941507', number: 100}|example: {couponTemplateId: '1810966706881941507', number: many}|" \
        "$spec" >"$tmp/broken.yaml"
    (cd "$lintdir" && "$redocly" lint --config redocly.yaml --format=stylish "$tmp/broken.yaml") \
        >"$tmp/lint-broken.out" 2>&1
    lint_rejects "redocly lint" $? "$tmp/lint-broken.out" no-unresolved-refs \
        no-invalid-media-type-examples
fi

# ---------------------------------------------------------------- (c) spectral lint
# The warnings integration-tests/openapi/spectral.yaml explains, by rule.
spectral_accepted="info-contact"
# spectral_lint FILE OUT: text format, one result per line ("file:line:col severity rule
# message"); the exit status is 1 when there are errors.
spectral_lint() {
    "$spectral" lint --ruleset "$lintdir/spectral.yaml" --fail-severity error --format text \
        "$1" >"$2" 2>&1
}
if [ -x "$spectral" ]; then
    pinned @stoplight/spectral-cli "$spectral"
    spectral_lint "$spec" "$tmp/spectral.out"
    rc=$?
    if [ "$rc" -eq 0 ] && ! grep -q ' error ' "$tmp/spectral.out"; then
        ok "spectral lint (spectral:oas): no errors"
    else
        bad "spectral lint (spectral:oas): no errors (exit $rc)"
        sed 's/^/     /' "$tmp/spectral.out" | tail -n 60
    fi
    grep ' warning ' "$tmp/spectral.out" |
        grep -vE " warning ($(tr ' ' '|' <<<"$spectral_accepted")) " >"$tmp/spectral-warnings"
    if [ ! -s "$tmp/spectral-warnings" ]; then
        ok "spectral lint: no warnings but $spectral_accepted"
    else
        bad "spectral lint: no warnings but $spectral_accepted"
        sed 's/^/     /' "$tmp/spectral-warnings" | tail -n 60
    fi
    # It must be able to fail: a $ref with a sibling (OpenAPI 3.0 ignores it) and an
    # operationId used twice.
    sed -e "0,/^          \$ref: '#\/components\/schemas\/RequestId'\$/s//&\n          description: A sibling of the reference./" \
        -e 's/operationId: engineListReminds$/operationId: engineCreateRemind/' \
        "$spec" >"$tmp/broken.yaml"
    spectral_lint "$tmp/broken.yaml" "$tmp/spectral-broken.out"
    # shellcheck disable=SC2016 # $ref is the rule's name, not an expansion
    lint_rejects "spectral lint" $? "$tmp/spectral-broken.out" ' error no-\$ref-siblings ' \
        ' error operation-operationId-unique '
fi

finish
