#!/usr/bin/env bash
# `make down`: stops exactly what `make up` started, by the pids it recorded (a pid is
# signalled only if it still runs a quan binary), then the local infrastructure.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
run="$root/.run"

for pidfile in "$run"/pids/*.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    svc=$(basename "$pidfile" .pid)
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "quan-$svc"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 150); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped quan-$svc (pid $pid)"
    fi
    rm -f "$pidfile"
done

if [ -d "$run/infra" ]; then
    "$root/deploy/local/infra.sh" stop "$run/infra"
fi
