#!/usr/bin/env bash
# The chaos suite (integration-tests/chaos/chaos.py): a flash sale (or a distribution task, or
# merchants creating templates and tasks) while one process is killed with SIGKILL and started
# again, then the platform's promises checked through the API, the databases and Redis. Starts
# its own PostgreSQL, Redis and RabbitMQ in a temporary directory with the DURABLE settings
# `make up` uses (never QUAN_INFRA_DURABILITY=fast: a crash test on servers that forget what
# they acknowledged proves nothing), applies the migrations, and runs chaos.py, which starts the
# four services from build/bin and kills and restarts them (and the servers) itself.
#
#   integration-tests/chaos/run.sh                          the default scenarios (make chaos)
#   CHAOS_SCENARIOS=engine-sync integration-tests/chaos/run.sh     one scenario
#   CHAOS_SCENARIOS=redis-empty-mq ...                      Redis restarted empty: expected to
#                                                           fail until the Redis-loss rebuild
#   CHAOS_KEEP=1 ...                                        keep the directory (logs, data)
#   QUAN_TOPOLOGY=cluster ...                               the cluster topology (make chaos
#                                                           TOPOLOGY=cluster): every service
#                                                           twice behind gateways, and the
#                                                           faults of a cluster's parts
#   QUAN_TOPOLOGY=sentinel ...                              Redis under Sentinel (make chaos
#                                                           TOPOLOGY=sentinel): the master
#                                                           killed, a replica promoted
#
# Other knobs (chaos.py): CHAOS_STOCK (1500), CHAOS_USERS (3000), CHAOS_CLIENTS (32),
# CHAOS_FAULT_AT (750 answers), CHAOS_SETTLE_S (120), CHAOS_DOWN_S (1), CHAOS_DIST_ROWS (40000).
# The last line is "N passed, N failed"; a failed run keeps the services' logs and prints where.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${QUAN_BUILD:-build}
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=python3

dir=$(mktemp -d /tmp/quan-chaos.XXXXXX)
chmod 0755 "$dir"
rc=1
# stop_services: SIGTERM (then SIGKILL) to each service pid chaos.py recorded that still runs a
# quan binary; chaos.py stops them itself unless it was killed.
stop_services() {
    local name pid
    [ -f "$dir/services.pids" ] || return 0
    while read -r name pid; do
        if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q "quan-$name"; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 1 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done <"$dir/services.pids"
}
cleanup() {
    set +e
    stop_services
    for gw in "$dir"/gateway-*; do # chaos.py's gateways (nginx runs detached)
        [ -d "$gw" ] && bash deploy/local/gateway.sh stop "$gw" >/dev/null 2>&1
    done
    deploy/local/infra.sh stop "$dir/infra" >/dev/null 2>&1
    if [ "${CHAOS_KEEP:-0}" = 1 ]; then
        echo "chaos: kept $dir" >&2
    else
        if [ "$rc" -ne 0 ] && [ -d "$dir/logs" ]; then
            keep=$(mktemp -d /tmp/quan-chaos-logs.XXXXXX)
            cp -r "$dir/logs/." "$keep/"
            # the servers' own logs (RabbitMQ's, PostgreSQL's, Redis') and what chaos.py printed
            mkdir -p "$keep/infra"
            (cd "$dir/infra" && find . -name '*.log' -size -64M \
                -exec cp --parents -t "$keep/infra" {} + 2>/dev/null)
            [ -f "$dir/chaos.out" ] && cp "$dir/chaos.out" "$keep/"
            echo "chaos: the services' logs are in $keep" >&2
        fi
        rm -rf "$dir"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# Whatever an outer run exported (integration-tests/run.sh: fast servers, their ports) must not
# reach these servers.
unset QUAN_INFRA_DURABILITY QUAN_INFRA_REDIS_APPENDFSYNC
unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT QUAN_INFRA_RCLUSTER_PORT
unset QUAN_INFRA_PG0_PORT QUAN_INFRA_PG1_PORT QUAN_INFRA_AMQP1_PORT QUAN_INFRA_AMQP2_PORT
unset QUAN_INFRA_AMQP3_PORT QUAN_INFRA_TOPOLOGY
topology=${QUAN_TOPOLOGY:-single}
export QUAN_TOPOLOGY=$topology
echo "== chaos: starting durable PostgreSQL, Redis and RabbitMQ ($topology) in $dir/infra"
if ! QUAN_INFRA_TOPOLOGY=$topology deploy/local/infra.sh start "$dir/infra" >"$dir/infra.log" 2>&1; then
    cat "$dir/infra.log"
    echo "infrastructure did not start"
    echo "0 passed, 1 failed"
    exit 1
fi
export QUAN_CHAOS_INFRA_DIR="$dir/infra"
# shellcheck source=integration-tests/testenv.sh
. "$root/integration-tests/testenv.sh"
test_env "$root" "$build" "$dir/infra" "$dir" info

# rc stays 1 if a signal ends us first: the logs are kept.
if "$PYTHON" integration-tests/chaos/chaos.py | tee "$dir/chaos.out"; then rc=0; else rc=$?; fi
[ "$rc" -eq 0 ]
