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
#
# Then the same sale through the engine (BENCH_BUCKET_ENGINE=0 leaves it out): one quan-engine
# on the same cluster (its PostgreSQL and RabbitMQ from bench/lib.sh, `make up`'s settings),
# /redeem-mq with a new user per request from wrk until the template is sold out, and the
# claims drained into PostgreSQL, for a template of one bucket and one of three, made as the
# merchant API makes them (the row; the engine writes the buckets' hashes on the first claim).
# Per master over the whole life of the sale's claims (accepted and drained): its share of the
# commands, its CPU per sold coupon; and the sale's sold coupons a second, N = 3 against N = 1.
#   BENCH_BUCKET_STOCK=30000 BENCH_BUCKET_THREADS=8 bench/buckets.sh     (about two minutes)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stock=${BENCH_BUCKET_STOCK:-30000}
threads=${BENCH_BUCKET_THREADS:-8}
port=${BENCH_BUCKET_PORT:-17200}
# shellcheck source=bench/goals.sh
. bench/goals.sh

make -s -j2 build/bin/quan-bench-buckets >/dev/null
rc_dir=$(mktemp -d /tmp/quan-bench-rcluster.XXXXXX)
stop_cluster() {
    deploy/local/rcluster.sh stop "$rc_dir/rc" >/dev/null 2>&1 || true
    rm -rf "$rc_dir"
}
trap stop_cluster EXIT
deploy/local/rcluster.sh start "$rc_dir/rc" "$port" >/dev/null
nodes=$(deploy/local/rcluster.sh nodes "$rc_dir/rc")
mapfile -t masters < <(deploy/local/rcluster.sh masters "$rc_dir/rc")
dir=$rc_dir

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

[ "${BENCH_BUCKET_ENGINE:-1}" = 1 ] || exit 0

# ---- the same sale through the engine
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_init quan-bench-buckets-engine
trap 'bench_cleanup; stop_cluster' EXIT
bench_make_up=1
bench_start_engine QUAN_REDIS_CLUSTER_NODES="$nodes"
shop=7001
conns=${BENCH_CONNECTIONS:-64}

# sale N: a template of N buckets sold to new users until none is left, then drained.
sale_through_engine() {
    local n=$1 id=$((9200 + $1)) ds table dsn now_ms t0 t_sold t1 sold
    read -r ds table < <(bench_shard t_coupon_template 16 "$shop")
    dsn="QUAN_DS${ds}_DSN"
    now_ms=$(($(date +%s) * 1000))
    psql "${!dsn}" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO $table (id, name, shop_number, source,
        target, type, valid_start_time, valid_end_time, stock, receive_rule, consume_rule,
        stock_buckets) VALUES ($id, 'bench', $shop, 0, 1, 0, to_timestamp($now_ms / 1000.0 - 3600),
        to_timestamp($now_ms / 1000.0 + 30 * 86400), $stock, '{\"limitPerPerson\":1}',
        '{\"maximumDiscountAmount\":5,\"validityPeriod\":48}', $n)" >/dev/null
    cat >"$dir/sale$n.lua" <<LUA
local n = 0
wrk.method = "POST"
wrk.body = '{"source":0,"shopNumber":"$shop","couponTemplateId":"$id"}'
wrk.headers["Content-Type"] = "application/json"
request = function()
    n = n + 1
    wrk.headers["X-User-Id"] = tostring($((n * 100000000)) + n)
    return wrk.format()
end
LUA
    snapshot "$dir/e.before"
    t0=$(date +%s.%N)
    # wrk until the template answers sold out: demand at least twice the stock
    wrk -t1 -c"$conns" -d"$((2 * stock / 4000 + 5))s" -s "$dir/sale$n.lua" \
        "$base/api/engine/user-coupon/redeem-mq" >"$dir/wrk$n.out" 2>&1 &
    local wrk_pid=$!
    t_sold=
    while kill -0 "$wrk_pid" 2>/dev/null; do
        if [ -z "$t_sold" ] && curl -fsS -H "X-User-Id: 1" -o "$dir/q$n" "$base/api/engine/coupon-template/query?shopNumber=$shop&couponTemplateId=$id" 2>/dev/null &&
            grep -q '"stock":0[,}]' "$dir/q$n"; then
            t_sold=$(date +%s.%N)
        fi
        sleep 0.1
    done
    wait "$wrk_pid" || true
    # the drain: every sold coupon in PostgreSQL, so the template's row holds no stock
    local left=$stock
    for _ in $(seq 1 600); do
        left=$(psql "${!dsn}" -qAtX -c "SELECT stock FROM $table WHERE id = $id" 2>/dev/null || echo "$stock")
        [ "$left" = 0 ] && break
        sleep 0.2
    done
    t1=$(date +%s.%N)
    snapshot "$dir/e.after"
    sold=$((stock - left))
    erate[$n]=$(awk -v a="$sold" -v t0="$t0" -v t="${t_sold:-$t1}" 'BEGIN { printf "%.0f", a / (t - t0) }')
    echo "engine, N=$n: $sold sold, sold out after $(awk -v t0="$t0" -v t="${t_sold:-$t1}" 'BEGIN { printf "%.1f", t - t0 }') s (${erate[$n]} sold/s), drained after $(awk -v t0="$t0" -v t="$t1" 'BEGIN { printf "%.1f", t - t0 }') s"
    join "$dir/e.before" "$dir/e.after" | awk -v a="$sold" '
        { c[NR] = $6 - $3; u[NR] = $7 - $4; p[NR] = $1; total += c[NR]; cpu += u[NR] }
        END {
            for (i = 1; i <= NR; i++)
                printf "  master %s: %5.1f %% of the commands, %.1f us CPU per sold coupon\n",
                    p[i], (total > 0 ? 100 * c[i] / total : 0), (a > 0 ? 1e6 * u[i] / a : 0)
            printf "  all masters: %.1f us CPU per sold coupon (accepted and drained)\n", (a > 0 ? 1e6 * cpu / a : 0)
        }' | tee "$dir/emasters.$n"
}
declare -A erate
sale_through_engine 1
sale_through_engine 3
eworst=$(awk '/master [0-9]/ { gsub("%", ""); d = $3 - 100 / 3; if (d < 0) d = -d; if (d > w) w = d } END { printf "%.1f", w }' "$dir/emasters.3")
bench_goal_cost "engine, N=3: the farthest master's share of the commands from a third" "$eworst" "points" "<=" 5
bench_figure "engine: a sale's sold coupons/s, N=3" "${erate[3]}" "/s" "N=1" "${erate[1]}" \
    "the masters share two cores here"
