#!/usr/bin/env bash
# Keeps docs/layout.md true to the tree, and the repository standing on its own:
#   - every common/ module (common/<subsystem>/*.c, and header-only *.h), every module of each
#     services/<binary>/ (*.c, *.h), every tools/<name>/, every lua-scripts/*.lua and every
#     fuzz target or header of fuzz/ is listed in its section of docs/layout.md, and every entry
#     listed there exists;
#   - common/'s folders keep their floors: a module includes only modules of its own folder or of
#     the folders below it, as docs/layout.md states them (nothing includes upwards, no cycles);
#   - every path docs/layout.md names (`dir/file` in backquotes, and its links) exists;
#   - no tracked file points outside the repository (the design folder beside the clone) or
#     cites the outside documents
#     Quan was designed from: numbered defects ("D16", "fixes D38"), their "inventory", the
#     "seed" documents, their section signs, API.md / ARCHITECTURE.md (the fuzz corpora,
#     fuzz/corpus/, are inputs, not prose: a "D12" in a found input cites nothing).
#   - the checker itself fails on a broken copy of docs/layout.md.
# Needs no servers. The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
py=/usr/bin/python3


tmp=$(mktemp -d /tmp/test_layout.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

cat >"$tmp/check.py" <<'PY'
"""usage: check.py ROOT LAYOUT [--layout-only]; prints "ok"/"FAIL" lines (and details)."""
import glob
import os
import re
import subprocess
import sys

root, layout = sys.argv[1], sys.argv[2]
layout_only = "--layout-only" in sys.argv[3:]
SELF = "integration-tests/test_layout.sh"  # holds the patterns it looks for


def check(name, cond, details=()):
    print(("ok   " if cond else "FAIL ") + name)
    if not cond:
        for d in details:
            print("       " + d)


def names(pattern, strip):
    return {os.path.basename(p)[: -len(strip)] if strip else os.path.basename(p.rstrip("/"))
            for p in glob.glob(os.path.join(root, pattern))}


with open(layout, encoding="utf-8") as f:
    text = f.read()

# ---- the entries of each section: "| `name` | ..." rows under a known heading
sections = {}
current = None
for line in text.splitlines():
    if line.startswith("#"):
        h = line.lstrip("#").strip()
        m = re.match(r"(services|common)/([a-z0-9_-]+)/", h)
        if m:
            current = m.group(1) + "/" + m.group(2)
        elif h.startswith("tools/"):
            current = "tools"
        elif h.startswith("lua-scripts/"):
            current = "lua-scripts"
        elif h.startswith("fuzz/"):
            current = "fuzz"
        else:
            current = None
        if current:
            sections.setdefault(current, set())
        continue
    m = re.match(r"^\| `([^`]+)`", line)
    if current and m:
        sections[current].add(m.group(1))

# What the tree holds, and where an entry of each section must exist.
want = {
    "tools": ({n for n in names("tools/*/", "") if os.path.isdir(os.path.join(root, "tools", n))},
              lambda n: [f"tools/{n}/"]),
    "lua-scripts": ({os.path.basename(p) for p in glob.glob(os.path.join(root, "lua-scripts/*.lua"))},
                    lambda n: [f"lua-scripts/{n}"]),
    "fuzz": (names("fuzz/*.c", ".c") | names("fuzz/*.h", ".h"),
             lambda n: [f"fuzz/{n}.c", f"fuzz/{n}.h"]),
}
for top in ("services", "common"):
    for d in sorted(glob.glob(os.path.join(root, top, "*/"))):
        b = os.path.basename(d.rstrip("/"))
        if b == "tests":
            continue
        want[f"{top}/{b}"] = (names(f"{top}/{b}/*.c", ".c") | names(f"{top}/{b}/*.h", ".h"),
                              lambda n, t=top, b=b: [f"{t}/{b}/{n}.c", f"{t}/{b}/{n}.h"])

for sec in sorted(want):
    have, where = want[sec]
    listed = sections.get(sec, set())
    missing = sorted(have - listed)
    check(f"docs/layout.md lists everything in {sec}/ ({len(have)})", sec in sections and not missing,
          ([f"no section for {sec}/"] if sec not in sections else [])
          + [f"not listed: {sec}/{n}" for n in missing])
    stale = sorted(n for n in listed if not any(os.path.exists(os.path.join(root, p))
                                                for p in where(n)))
    check(f"every {sec}/ entry of docs/layout.md exists ({len(listed)})", not stale,
          [f"listed, not in the tree: {' or '.join(where(n))}" for n in stale])

# ---- common/'s floors: "The floors, each using only those below it: `a`; then `b`, `c`; ..."
# Folders named in one step of that sentence share a floor and may not include each other.
floor_text = re.search(r"The floors, each using only those below it:(.*?)\n\n", text, re.S)
floors = {}
if floor_text:
    for i, step in enumerate(floor_text.group(1).split(";")):
        for d in re.findall(r"`([a-z]+)`", step):
            floors.setdefault(d, i)
where_mod = {}
for f in glob.glob(os.path.join(root, "common/*/*.[ch]")):
    d = f.split(os.sep)[-2]
    if d != "tests":
        where_mod[os.path.basename(f)] = d
dirs = sorted(set(where_mod.values()))
check(f"docs/layout.md gives every common/ folder a floor ({len(dirs)})",
      floor_text is not None and all(d in floors for d in dirs),
      [f"no floor for common/{d}/" for d in dirs if d not in floors])
upward = []
for f in sorted(glob.glob(os.path.join(root, "common/*/*.[ch]"))):
    d = f.split(os.sep)[-2]
    if d == "tests" or d not in floors:
        continue
    with open(f, encoding="utf-8") as fh:
        for inc in re.findall(r'#include "([^"]+)"', fh.read()):
            t = where_mod.get(inc)
            if t and t != d and floors.get(t, 99) >= floors[d]:
                upward.append(f"{os.path.relpath(f, root)} includes {inc} (common/{t}/, "
                              f"not below common/{d}/)")
check("common/ modules include only their own folder or the floors below it", not upward, upward)

# ---- every path it names: `a/b` tokens (placeholders and build output aside) and links
paths = set()
for tok in re.findall(r"`([^`\n]+)`", text):
    if "/" not in tok or tok.startswith(("/", "http")) or re.search(r"[<>*{}\s…]", tok):
        continue
    if tok.split("/")[0] in ("build", "build-asan", "build-fuzz", ".run", "DIR"):
        continue
    paths.add(tok)
for link in re.findall(r"\]\(([^)#\s]+)", text):
    if not re.match(r"[a-z]+:", link):
        paths.add(os.path.normpath(os.path.join("docs", link)))
absent = sorted(p for p in paths if not os.path.exists(os.path.join(root, p)))
check(f"every path docs/layout.md names exists ({len(paths)})", not absent,
      [f"no such file: {p}" for p in absent])

if layout_only:
    sys.exit(0)

# ---- no references outside the repository
try:
    files = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
except (OSError, subprocess.CalledProcessError):
    files = [os.path.relpath(os.path.join(d, f), root)
             for d, dirs, fs in os.walk(root)
             if not re.search(r"/(\.git|build[^/]*|node_modules|\.run)(/|$)", d) for f in fs]
files = [f for f in files if f and f != SELF and os.path.isfile(os.path.join(root, f))]

# Spelled in two parts so that this file does not match itself.
OUTSIDE = re.compile(r"\.\./" + r"shared|" + r"shared/(design|reference|seeds)/")
CITES = [
    re.compile(r"\bD[0-9]{1,2}\b"),                        # D16, D1-D4, D46/D51
    re.compile(r"inventory", re.I),
    re.compile(r"\bseeds?\b", re.I),                       # "seed 000", not "seeded"
    re.compile(r"§"),
    re.compile(r"\bAPI\.md\b|\bARCHITECTURE(\.md| rules?\b)"),
]
CELL = re.compile(r"([\"'])[A-Z]{1,3}[0-9]{1,7}\1")       # "D2": a spreadsheet cell, no cite

outside, cites = [], []
for f in sorted(files):
    try:
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (UnicodeDecodeError, OSError):
        continue  # binary
    for i, line in enumerate(lines, 1):
        if OUTSIDE.search(line):
            outside.append(f"{f}:{i}: {line.strip()[:110]}")
        bare = CELL.sub("", line)
        if not f.startswith("fuzz/corpus/") and any(p.search(bare) for p in CITES):
            cites.append(f"{f}:{i}: {line.strip()[:110]}")


def by_file(hits):
    out = sorted({h.split(":", 1)[0] for h in hits})
    return ([f"files ({len(out)}): " + " ".join(out)] if out else []) + hits


check(f"no tracked file points outside the repository ({len(files)} files)", not outside,
      by_file(outside))
check("no tracked file cites a numbered defect or the outside design documents",
      not cites, by_file(cites))
PY

if [ ! -f "$root/docs/layout.md" ]; then
    bad "docs/layout.md exists"
elif ! "$py" -c 'import re' 2>/dev/null; then
    bad "python3 runs"
else
    "$py" "$tmp/check.py" "$root" "$root/docs/layout.md" >"$tmp/check.out" 2>&1
    rc=$?
    tally "$tmp/check.out"
    [ "$rc" -eq 0 ] || bad "checker exited $rc"

    # The checker must be able to fail: a copy of the page without the `ids` row and the
    # claim.lua row, naming a file that does not exist, and with http on pg's floor.
    # shellcheck disable=SC2016 # the backquotes are Markdown, not expansions
    sed -e '/^| `ids` |/d' -e '/^| `claim\.lua` |/d' \
        -e 's|`common/redis/keys.h`|`common/no_such_file.h`|' \
        -e 's|^`pg` (its outbox publishes on `mq`);|`pg` (its outbox publishes on `mq`), `http`;|' \
        "$root/docs/layout.md" >"$tmp/broken.md"
    "$py" "$tmp/check.py" "$root" "$tmp/broken.md" --layout-only >"$tmp/broken.out" 2>&1
    if grep -q '^       not listed: common/redis/ids$' "$tmp/broken.out" &&
        grep -q '^       not listed: lua-scripts/claim.lua$' "$tmp/broken.out" &&
        grep -q '^       no such file: common/no_such_file.h$' "$tmp/broken.out" &&
        grep -q '^       common/http/reqjob.h includes pgpool.h' "$tmp/broken.out"; then
        ok "the checker rejects a broken copy of docs/layout.md"
    else
        bad "the checker rejects a broken copy of docs/layout.md"
        sed 's/^/     /' "$tmp/broken.out"
    fi
fi

finish
