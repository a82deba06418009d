#!/usr/bin/env bash
# `make observe`: Debian's Prometheus as a private process of this clone, scraping the stack
# `make up` started (the single topology's ports, moved with QUAN_UP_PORT) with
# deploy/prometheus/ (its alert rules included), on a free loopback port; data, configuration,
# log and pid under .run/prometheus/.
# No system service is used. Running it again while it runs just prints its URL.
#
#   observe.sh         start (or find) it and print its URL
#   observe.sh stop    stop it (make down does)
# QUAN_PROMETHEUS_PORT fixes the port (default: the previous one if free, else a free one).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/proc.sh
. deploy/local/proc.sh
dir="$root/.run/prometheus"
bin=/usr/bin/prometheus

# The pid of our Prometheus when it still runs (a pid reused by another process is not ours).
ours() {
    local pid
    read -r pid 2>/dev/null <"$dir/pid" || return 1
    pid_alive "$pid" || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qx -- "--storage.tsdb.path=$dir/data" ||
        return 1
    echo "$pid"
}

if [ "${1:-}" = stop ]; then
    if pid=$(ours); then
        kill "$pid"
        for _ in $(seq 1 100); do pid_alive "$pid" || break; sleep 0.1; done
        pid_alive "$pid" && kill -9 "$pid"
        echo "observe: Prometheus stopped"
    fi
    rm -f "$dir/pid"
    exit 0
fi

[ -x "$bin" ] || { echo "observe.sh: $bin missing (make deps installs it)" >&2; exit 1; }
mkdir -p "$dir/data"
if pid=$(ours); then
    echo "Prometheus is already running (pid $pid): http://127.0.0.1:$(cat "$dir/port")/"
    exit 0
fi

# The configuration: deploy/prometheus/prometheus.yml, its rules by absolute path, and RabbitMQ's
# exporter when make up's broker has one (its port is in .run/infra/env).
rprom=""
if [ -f .run/infra/env ]; then
    rprom=$(sed -n 's/^export QUAN_INFRA_RABBIT_PROM_PORT=\([0-9]*\)$/\1/p' .run/infra/env)
fi
# The services' ports: make up's, moved with it when it ran with QUAN_UP_PORT (.run/up-port).
up_port=$(cat .run/up-port 2>/dev/null || echo 10000)
[[ $up_port =~ ^[0-9]+$ ]] || up_port=10000
{
    sed -e "s#^  - rules/#  - $root/deploy/prometheus/rules/#" \
        -e "s#127.0.0.1:10010\"#127.0.0.1:$((up_port + 10))\"#" \
        -e "s#127.0.0.1:10020\"#127.0.0.1:$((up_port + 20))\"#" \
        -e "s#127.0.0.1:10030\"#127.0.0.1:$((up_port + 30))\"#" \
        -e "s#127.0.0.1:10040\"#127.0.0.1:$((up_port + 40))\"#" \
        -e "s#127.0.0.1:10001\"#127.0.0.1:$((up_port + 1))\"#" deploy/prometheus/prometheus.yml
    if [ -n "$rprom" ]; then
        cat <<EOF2
  - job_name: rabbitmq
    metrics_path: /metrics/detailed
    params:
      family: [queue_coarse_metrics]
    static_configs:
      - targets: ["127.0.0.1:$rprom"]
EOF2
    fi
} >"$dir/prometheus.yml"
promtool check config "$dir/prometheus.yml" >/dev/null

port=${QUAN_PROMETHEUS_PORT:-}
if [ -z "$port" ]; then
    port=$(cat "$dir/port" 2>/dev/null || true)
    # A high free port: the previous one when it is still free.
    if [ -z "$port" ] || ! /usr/bin/python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',int(sys.argv[1])))" "$port" 2>/dev/null; then
        port=$(/usr/bin/python3 "$root/deploy/local/ports.py")
    fi
fi
echo "$port" >"$dir/port"
setsid "$bin" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
    --web.listen-address="127.0.0.1:$port" --storage.tsdb.retention.time=7d \
    >>"$dir/prometheus.log" 2>&1 </dev/null &
echo $! >"$dir/pid"
for _ in $(seq 1 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$port/-/ready" 2>/dev/null && break
    pid_alive "$(cat "$dir/pid")" || { tail -n 20 "$dir/prometheus.log" >&2; exit 1; }
    sleep 0.2
done
also=""
[ -z "$rprom" ] || also=" and the RabbitMQ exporter on 127.0.0.1:$rprom"
cat <<MSG
Prometheus: http://127.0.0.1:$port/  (alerts: http://127.0.0.1:$port/alerts; data and log in .run/prometheus/)
  scraping 127.0.0.1:$((up_port + 10))/$((up_port + 20))/$((up_port + 30))/$((up_port + 40)), the gateway's 127.0.0.1:$((up_port + 1))$also
  rules: deploy/prometheus/rules/quan-alerts.yml   stop it: make down (or deploy/local/observe.sh stop)
MSG
