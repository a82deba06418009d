#!/usr/bin/env bash
# bench/buckets.sh — one flash sale on one template, on the three-master Redis Cluster of the
# cluster topology (deploy/local/rcluster.sh, `make up`'s durable settings: append-only file,
# fsync every second), with its stock in one bucket and then in three (common/coupon/bucket.h).
# The sale runs at the Redis layer (tools/bench-buckets: the claim script at each user's home
# bucket, transfers and the sold-out verdict when a home is dry), demand twice the stock, and
# must sell every unit exactly (the tool exits 1 otherwise). For each master, between the
# sale's start and end: its share of the claim scripts it ran, the commands it ran, and its CPU
# (user + system, INFO cpu) per accepted claim of the whole sale; then each sale's accepted
# claims a second and the ratio N = 3 against N = 1. On two cores the masters share the cores, so
# the proof of scale is the share and the per-master CPU, not the total rate. Goal: with N = 3
# every master runs a third of the scripts, within ±15 %.
#   BENCH_BUCKET_STOCK=30000 BENCH_BUCKET_THREADS=8 bench/buckets.sh     (about a minute)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stock=${BENCH_BUCKET_STOCK:-30000}
threads=${BENCH_BUCKET_THREADS:-8}
port=${BENCH_BUCKET_PORT:-17200}
# shellcheck source=bench/goals.sh
. bench/goals.sh

make -s -j2 build/bin/quan-bench-buckets >/dev/null
dir=$(mktemp -d /tmp/quan-bench-buckets.XXXXXX)
stop() {
    deploy/local/rcluster.sh stop "$dir/rc" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT
deploy/local/rcluster.sh start "$dir/rc" "$port" >/dev/null
nodes=$(deploy/local/rcluster.sh nodes "$dir/rc")
mapfile -t masters < <(deploy/local/rcluster.sh masters "$dir/rc")

# snapshot FILE: per master "PORT SCRIPTS COMMANDS CPU_SECONDS"
snapshot() {
    local p
    for p in "${masters[@]}"; do
        redis-cli -p "$p" INFO all | tr -d '\r' | awk -v p="$p" -F'[:=,]' '
            $1 == "cmdstat_evalsha" || $1 == "cmdstat_eval" { scripts += $3 }
            $1 ~ /^cmdstat_/ { commands += $3 }
            $1 == "used_cpu_user" || $1 == "used_cpu_sys" { cpu += $2 }
            END { printf "%s %d %d %.6f\n", p, scripts, commands, cpu }'
    done >"$1"
}

declare -A rate
for n in 1 3; do
    snapshot "$dir/before"
    out=$(QUAN_REDIS_CLUSTER_NODES=$nodes build/bin/quan-bench-buckets sale $((9000 + n)) "$n" \
        "$stock" $((2 * stock)) "$threads")
    snapshot "$dir/after"
    read -r _ accepted _ refused _ doubts _ secs <<<"$out"
    rate[$n]=$(awk -v a="$accepted" -v s="$secs" 'BEGIN { printf "%.0f", a / s }')
    echo "N=$n: $accepted accepted, $refused refused, $doubts in doubt on the way, ${secs} s, ${rate[$n]} accepted claims/s"
    join "$dir/before" "$dir/after" | awk -v a="$accepted" '
        { s[NR] = $5 - $2; c[NR] = $6 - $3; u[NR] = $7 - $4; p[NR] = $1; total += s[NR] }
        END {
            for (i = 1; i <= NR; i++)
                printf "  master %s: %5.1f %% of the claim scripts, %d commands, %.1f us CPU per accepted claim\n",
                    p[i], (total > 0 ? 100 * s[i] / total : 0), c[i], (a > 0 ? 1e6 * u[i] / a : 0)
        }' | tee "$dir/masters.$n"
done

# The evenness with three buckets: the share farthest from a third, against a third.
worst=$(awk '{ gsub("%", ""); d = $3 - 100 / 3; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.1f", w }' "$dir/masters.3")
bench_goal_cost "N=3: the farthest master's share from a third" "$worst" "points" "<=" 5
bench_figure "a sale's accepted claims/s, N=3" "${rate[3]}" "/s" "N=1" "${rate[1]}" \
    "the masters share two cores here"
