#!/usr/bin/env bash
# Distribution end to end against PostgreSQL COPY, in the same run. Starts its own
# PostgreSQL/Redis/RabbitMQ (bench/lib.sh), quan-merchant-admin and one quan-distribution with
# the settings `make up` gives them, and a sheet of N rows (quan-sheet-gen: all valid, distinct
# users). Then:
#   copy   quan-bench-dist copy N: the same N user coupons routed by the sharding rule and
#          COPYed straight into the sharded tables (both databases in parallel): the baseline;
#          the tables are emptied again afterwards
#   task   a template of stock N, coupon-task/create for the sheet, polled with coupon-task/find
#          until it succeeds: rows/s from the post to the end
# and prints both rates, their ratio (a figure: no goal), the peak RSS of
# quan-distribution (target <= 64 MB) and where its time went (quan_dist_step_duration_seconds).
#   BENCH_DIST_ROWS=1000000 bench/distribution.sh
# For a look inside: BENCH_PERF=/tmp/dist.perf (perf record -a during the task),
# BENCH_DIST_ENV="QUAN_DIST_CHUNK_ROWS=10000" (settings other than make up's).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rows=${BENCH_DIST_ROWS:-1000000}
shop=1810714735922956666
hdr=(-H X-User-Id:1 -H "X-Shop-Number:$shop" -H Content-Type:application/json)

# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-bench-dist
files="$dir/files"
mkdir -p "$files"
chmod 0755 "$files"
build/bin/quan-sheet-gen "$files/users.xlsx" "$rows" >/dev/null

ma_port=$(bench_free_port)
dist_port=$(bench_free_port)
bench_start_service merchant-admin "$ma_port" QUAN_FILE_ROOT="$files"
# shellcheck disable=SC2086 # BENCH_DIST_ENV: NAME=VALUE words, split on purpose
bench_start_service distribution "$dist_port" QUAN_FILE_ROOT="$files" ${BENCH_DIST_ENV:-}
ma="http://127.0.0.1:$ma_port/api/merchant-admin"

# ---- the baseline: COPY of the same rows, then the tables emptied again
bench_cpu_by_name >"$dir/cpu.copy0"
copy_rate=$(bench_copy_coupons "$rows" 1 "$shop")
bench_cpu_by_name >"$dir/cpu.copy1"

# ---- the task
start=$(date -u -d '-1 day' '+%Y-%m-%d %H:%M:%S')
end=$(date -u -d '+30 days' '+%Y-%m-%d %H:%M:%S')
tpl=$(curl -fsS "${hdr[@]}" "$ma/coupon-template/create" -d "{\"name\":\"bench\",\"source\":0,
  \"target\":1,\"type\":0,\"validStartTime\":\"$start\",\"validEndTime\":\"$end\",\"stock\":$rows,
  \"receiveRule\":{\"limitPerPerson\":1},\"consumeRule\":{\"termsOfUse\":0,
  \"maximumDiscountAmount\":5,\"validityPeriod\":48}}" | jq -r .data.id)
[[ $tpl =~ ^[0-9]+$ ]] || { echo "template create failed: $tpl" >&2; exit 1; }
redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
bench_cpu_by_name >"$dir/cpu.before"
t0=$(date +%s%N)
task=$(curl -fsS "${hdr[@]}" "$ma/coupon-task/create" -d "{\"taskName\":\"bench\",
  \"fileAddress\":\"users.xlsx\",\"notifyType\":\"0\",\"couponTemplateId\":\"$tpl\",\"sendType\":0}" |
    jq -r .data.id)
[[ $task =~ ^[0-9]+$ ]] || { echo "task create failed: $task" >&2; exit 1; }
if [ -n "${BENCH_PERF:-}" ]; then # a profile of the whole machine during the task (perf.data)
    perf record -a -g -F 499 -o "$BENCH_PERF" -- sleep "${BENCH_PERF_SECONDS:-8}" >/dev/null 2>&1 &
fi
# Polled with curl alone, every 0.25 s: a jq per poll would take a tenth of this machine's CPU.
status=1
while [ "$status" = 1 ] || [ "$status" = 0 ]; do
    sleep 0.25
    found=$(curl -fsS "${hdr[@]}" "$ma/coupon-task/find?taskId=$task")
    [[ $found =~ \"status\":([0-9]+) ]] && status=${BASH_REMATCH[1]}
done
t1=$(date +%s%N)
success=$(jq -r .data.successNum <<<"$found")
if [ "$status" != 3 ] || [ "$success" != "$rows" ]; then
    echo "task ended with status $status, $success issued of $rows: $found" >&2
    tail -n 20 "$dir/distribution.log" >&2
    exit 1
fi
bench_cpu_by_name >"$dir/cpu.after"
rewrites=$(bench_redis_rewrites)
# shellcheck disable=SC2154 # set by bench_start_service (printf -v)
peak_kb=$(awk '/VmHWM/ {print $2}' "/proc/$bench_pid_distribution/status")
metrics=$(curl -fsS "http://127.0.0.1:$dist_port/metrics")

secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", (b - a) / 1e9}')
task_rate=$(awk -v n="$rows" -v s="$secs" 'BEGIN {printf "%.0f", n / s}')
printf '%-56s %12s\n' "distribution ($rows rows, xlsx, make up settings)" "rows/s"
printf '%-56s %12.0f\n' "PostgreSQL COPY of the same user coupons (baseline)" "$copy_rate"
printf '%-56s %12.0f   (%s s post to succeeded)\n' "task: coupon-task/create to status 3" \
    "$task_rate" "$secs"
printf 'quan-distribution peak RSS: %d kB\n' "$peak_kb"
# Six programs sharing two cores against PostgreSQL alone: a figure (docs/benchmarks.md counts
# what a row costs each program); the costs per row are what carries to a deployment.
bench_figure "distribution, $rows rows, post to succeeded" "$task_rate" rows/s \
    "PostgreSQL COPY of the same coupons" "$copy_rate"
bench_costs "distribution, a row of the sheet" "$dir/cpu.before" "$dir/cpu.after" "$rows"
bench_goal "quan-distribution peak RSS" "$peak_kb" kB "its limit" 65536 "<=" 1.0
echo "where the time went (seconds summed over chunks; three stages overlap: read + reserve, write, wallets + commit):"
awk -v total="$secs" '/^quan_dist_step_duration_seconds_sum/ {
    match($0, /step="[a-z]+"/); step = substr($0, RSTART + 6, RLENGTH - 7)
    printf "  %-8s %7.2f s  (%3.0f %% of the run)\n", step, $2, 100 * $2 / total }' <<<"$metrics"
echo "CPU seconds during the COPY, by program:"
bench_cpu_delta "$dir/cpu.copy0" "$dir/cpu.copy1"
echo "CPU seconds during the task, by program (this machine: $(nproc) cores x $secs s):"
bench_cpu_delta "$dir/cpu.before" "$dir/cpu.after"
echo "  (Redis rewrote its append-only file $rewrites times meanwhile: a forked copy of its data each, in redis-server's CPU above)"
