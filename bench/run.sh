#!/usr/bin/env bash
# `make bench`: benchmarks, apart from the tests. Starts its own PostgreSQL/Redis/RabbitMQ in a
# temporary directory and one quan-engine, then measures with wrk, in the same run:
#   ceiling  GET /livez             answered by the event loop alone (the HTTP ceiling)
#   redis    GET /debug/redis-ping  one asynchronous Redis round trip per request
#   raw      redis-benchmark PING   Redis' own ceiling on this machine
# and prints each rate and the ratios; then the sheet reader, the engine, the hot path against
# a bare libevent server, distribution, the claim script on one Redis and one template's sale
# over stock buckets on the cluster (bench/sheet.sh, engine.sh, hotpath.sh, distribution.sh,
# capacity.sh, buckets.sh, archive.sh); last, the table of every goal and the
# CPU per item of each write path, by program. Results are in docs/benchmarks.md.
#   BENCH_SECONDS=10 BENCH_CONNECTIONS=64 bench/run.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${BENCH_SECONDS:-10}
conns=${BENCH_CONNECTIONS:-64}

# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-bench
# Every script below records its goals here; the table closes the run.
export BENCH_GOALS="$dir/goals.tsv" BENCH_COSTS="$dir/costs.tsv"
: >"$BENCH_GOALS"
: >"$BENCH_COSTS"
bench_start_engine QUAN_DEBUG_ROUTES=true

# rate URL: requests per second from wrk (one thread: the other core serves).
rate() {
    wrk -t1 -c"$conns" -d"${seconds}s" --latency "$1" >"$dir/wrk.out" 2>&1
    grep -q 'Non-2xx' "$dir/wrk.out" && { cat "$dir/wrk.out" >&2; echo "non-2xx answers" >&2; exit 1; }
    awk '/Requests\/sec/ {print $2}' "$dir/wrk.out"
}
p99() { awk '$1 == "99%" {print $2}' "$dir/wrk.out"; }

wrk -t1 -c"$conns" -d2s "$base/livez" >/dev/null 2>&1 # warm-up
livez=$(rate "$base/livez")
livez_p99=$(p99)
redis=$(rate "$base/debug/redis-ping")
redis_p99=$(p99)
raw=$(redis-benchmark -p "$QUAN_REDIS_PORT" -c "$conns" -n 200000 -q -t ping_inline 2>/dev/null |
    awk '{for (i = 1; i <= NF; i++) if ($i == "requests") print $(i - 1)}' | tail -n 1)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$engine_pid/status")

printf '%-44s %12s %10s\n' "benchmark (${seconds}s, $conns connections)" "req/s" "p99"
printf '%-44s %12.0f %10s\n' "GET /livez (HTTP ceiling)" "$livez" "$livez_p99"
printf '%-44s %12.0f %10s\n' "GET /debug/redis-ping (async Redis)" "$redis" "$redis_p99"
printf '%-44s %12.0f\n' "redis-benchmark PING_INLINE (Redis ceiling)" "$raw"
bench_goal "async Redis round trip, /debug/redis-ping" "$redis" /s "GET /livez" "$livez" ">=" 0.65
awk -v a="$redis" -v b="$raw" 'BEGIN {printf "ratio redis-ping / raw Redis: %.2f\n", a / b}'
echo "engine RSS after the run: ${rss} kB"

# The spreadsheet reader: counting the rows of a 1,000,000-row sheet against decompression alone.
echo
bench/sheet.sh
# The engine's claim and query paths and the MQ drain: it starts its own servers, so this run's
# are stopped first (bench_init does not pass their fixed ports on).
if [ -x bench/engine.sh ]; then
    echo
    bench_stop_engine
    deploy/local/infra.sh stop "$dir" >/dev/null 2>&1 || true
    bench/engine.sh
fi
# The hot path with `make up`'s settings against a bare evhttp server (its own servers too).
echo
bench/hotpath.sh
# Distribution: a million-row task end to end against COPY (its own servers too).
echo
bench/distribution.sh
# What one Redis master carries of one template's sale: the claim script alone (its own servers).
echo
bench/capacity.sh
# One template's sale on the three-master cluster, its stock in one bucket and in three.
echo
bench/buckets.sh
# The hot paths with ten dead coupons per live one, before and after the archive moves them.
echo
bench/archive.sh

bench_goals_table "$BENCH_GOALS"
# The CPU each program spent per item of each write path: what carries to a deployment, where
# the ratios above compare programs sharing two cores with one that had them alone.
if [ -s "$BENCH_COSTS" ]; then
    printf '\n%s\n' "CPU microseconds per item of each write path, by program (this run)"
    awk -F'\t' '{ printf "  %-44s %s\n", $1, $2 }' "$BENCH_COSTS"
fi
