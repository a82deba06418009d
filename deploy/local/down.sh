#!/usr/bin/env bash
# `make down [TOPOLOGY=single|cluster|sentinel]`: stops exactly what `make up` started: the topology's
# gateway first (no request is sent to a service that is going), then the services by the pids
# it recorded (a pid is signalled only while it still runs the quan binary it was started as,
# since the time recorded), then the topology's stores.
# Without a topology: every one .run/topologies says is up (all, if that record is missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/svc.sh
. deploy/local/svc.sh
run="$root/.run"

if [ $# -gt 0 ] && [ -n "$1" ]; then
    case $1 in
    single | cluster | sentinel) topologies=("$1") ;;
    *)
        echo "down.sh: TOPOLOGY must be single, cluster or sentinel, not '$1'" >&2
        exit 2
        ;;
    esac
elif [ -f "$run/topologies" ]; then
    mapfile -t topologies <"$run/topologies"
else
    topologies=(single cluster sentinel)
fi

rc=0
# make observe's Prometheus, whatever the topology.
bash deploy/local/observe.sh stop || rc=1
for topology in "${topologies[@]}"; do
    case $topology in
    single) base=$run ;;
    cluster) base=$run/cluster ;;
    sentinel) base=$run/sentinel ;;
    *) continue ;;
    esac
    if [ -d "$base/gateway" ]; then
        bash deploy/local/gateway.sh stop "$base/gateway" || rc=1
    fi
    # All of a topology's services drain at once (each up to its shutdown timeout).
    jobs=()
    for pidfile in "$base"/pids/*.pid; do
        [ -f "$pidfile" ] || continue
        svc_stop "$pidfile" &
        jobs+=($!)
    done
    for j in "${jobs[@]}"; do wait "$j" || rc=1; done
    if [ -d "$base/infra" ]; then
        deploy/local/infra.sh stop "$base/infra" || rc=1
    fi
    if [ "$rc" = 0 ] && [ -f "$run/topologies" ]; then
        grep -vx "$topology" "$run/topologies" >"$run/topologies.new" || true
        mv "$run/topologies.new" "$run/topologies"
        [ -s "$run/topologies" ] || rm -f "$run/topologies"
    fi
done
exit "$rc"
