#!/usr/bin/env bash
# asan_reports.sh DIR: one check per service log in DIR (written by services built with
# ASan/LSan/UBSan): it fails when the log holds a sanitizer report. Prints "N passed, N failed".
set -uo pipefail
ok=0
bad=0
for f in "$1"/*.log; do
    [ -f "$f" ] || continue
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f"; then
        echo "sanitizer report in $(basename "$f"):"
        grep -E -A30 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$f" | head -60
        bad=$((bad + 1))
    else
        ok=$((ok + 1))
    fi
done
[ $((ok + bad)) -gt 0 ] || { echo "no service logs in $1"; bad=1; }
echo "$ok passed, $bad failed"
[ "$bad" -eq 0 ]
