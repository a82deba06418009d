#!/usr/bin/env bash
# `make soak`: a leak test. Starts its own PostgreSQL/Redis/RabbitMQ in a temporary directory
# (bench/lib.sh: infra.sh's defaults, durable, as `make up`) and the four services with `make up`'s
# settings, then puts a steady, moderate mixed load through the public API for SOAK_SECONDS
# (bench/soak_load.py: templates, claims sync and MQ, claim results, wallets, payment lock /
# commit / refund, reminders, exchange codes, a distribution task every 30 s, settlement
# queries; about 270 requests/s) while it records every SOAK_INTERVAL seconds, for each service,
# its resident memory (VmRSS), open file descriptors, established TCP connections and threads.
# Prints the request outcomes and a table per service: the value at the end of the warm-up
# (SOAK_WARMUP s, default 120), at the end, the lowest and highest after warm-up, and a verdict:
#   flat   RSS at the end <= RSS after warm-up x 1.10 + 2 MB, and the lowest fds, connections
#          and threads of the last minute <= the highest of the warm-up (a leak raises the
#          floor; a task or a reconnect in flight at the last sample does not count)
#   grows  otherwise
# Then each service gets SIGTERM and must exit 0, without a sanitizer report in its log
# (QUAN_BUILD=build-asan runs the binaries of `make SAN=asan all`: LeakSanitizer reports at that
# exit; their RSS is not judged). Exits non-zero if a service died or did not exit 0, if more than
# SOAK_MAX_5XX_PERMILLE (default 1) per mille of the requests got a 5xx or no answer, if a
# distribution task failed, or if anything grows.
# The samples (samples.csv: time_s,service,rss_kb,fds,conns,threads), the outcomes and the end of
# each service's log stay in SOAK_OUT (default: a new /tmp/quan-soak-results.XXXXXX).
#   SOAK_SECONDS=600 SOAK_INTERVAL=10 bench/soak.sh   (SOAK_SCALE=2: twice the request rates)
# Results: docs/benchmarks.md, "Soak".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${SOAK_SECONDS:-600}
interval=${SOAK_INTERVAL:-10}
warmup=${SOAK_WARMUP:-120}
max_bad=${SOAK_MAX_5XX_PERMILLE:-1}
scale=${SOAK_SCALE:-1}
for v in seconds interval warmup max_bad; do
    if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
        echo "soak: $v must be a positive integer" >&2
        exit 2
    fi
done
if [ "$warmup" -gt $((seconds / 2)) ]; then # a short run: half of it is warm-up
    warmup=$((seconds / 2))
fi
services=(merchant-admin engine settlement distribution)

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} # read by sanitized builds only
out=${SOAK_OUT:-$(mktemp -d /tmp/quan-soak-results.XXXXXX)}
mkdir -p "$out"
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_init quan-soak
sampler_pid=
load_pid=
# On any exit: the sampler and the load generator stopped, the end of each log kept, then
# bench/lib.sh's cleanup (services, servers, the temporary directory).
# shellcheck disable=SC2317 # run by the trap
soak_cleanup() {
    local pid svc
    for pid in $sampler_pid $load_pid; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    for svc in "${services[@]}"; do
        if [ -f "$dir/$svc.log" ]; then tail -n 200 "$dir/$svc.log" >"$out/$svc.log.tail"; fi
    done
    bench_cleanup
}
trap soak_cleanup EXIT

# make up's environment (deploy/local/up.sh): spreadsheets from a local directory.
files="$dir/files"
mkdir -p "$files"
chmod 0755 "$files"
declare -A ports
for svc in "${services[@]}"; do
    ports[$svc]=$(bench_free_port)
    bench_start_service "$svc" "${ports[$svc]}" QUAN_FILE_ROOT="$files" QUAN_FILE_ALLOW_INTERNAL=true
done
# shellcheck disable=SC2154 # set by bench_start_service
declare -A pids=([merchant-admin]=$bench_pid_merchant_admin [engine]=$bench_pid_engine
    [settlement]=$bench_pid_settlement [distribution]=$bench_pid_distribution)

# sample T: one CSV line per service; "dead" in every column of a service that is gone.
sample() {
    local t=$1 svc pid rss threads fds conns
    # Established TCP connections by pid, from one ss call (-p names each socket's process).
    ss -Htnp state established 2>/dev/null |
        grep -o 'pid=[0-9]*' | sort | uniq -c | awk '{sub("pid=", "", $2); print $2, $1}' >"$out/.ss"
    for svc in "${services[@]}"; do
        pid=${pids[$svc]}
        if ! [ -r "/proc/$pid/status" ] || grep -q '^State:.*Z' "/proc/$pid/status"; then
            echo "$t,$svc,dead,dead,dead,dead"
            continue
        fi
        rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
        threads=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status")
        fds=$(find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        conns=$(awk -v p="$pid" '$1 == p {print $2}' "$out/.ss")
        echo "$t,$svc,$rss,$fds,${conns:-0},$threads"
    done
}
sampler() {
    local t0 i=0 next now
    t0=$(date +%s%N)
    echo "time_s,service,rss_kb,fds,conns,threads"
    while [ $((i * interval)) -le "$seconds" ]; do
        next=$((t0 + i * interval * 1000000000))
        now=$(date +%s%N)
        [ "$now" -lt "$next" ] && sleep "$(awk -v d=$((next - now)) 'BEGIN {printf "%.3f", d / 1e9}')"
        sample $((i * interval))
        i=$((i + 1))
    done
}

echo "soak: ${seconds}s of mixed load, a sample every ${interval}s, warm-up ${warmup}s; results in $out"
sampler >"$out/samples.csv" &
sampler_pid=$!
# A second more of load than of sampling, so that the last sample is taken under load.
/usr/bin/python3 bench/soak_load.py --ma "http://127.0.0.1:${ports[merchant-admin]}" \
    --engine "http://127.0.0.1:${ports[engine]}" --settlement "http://127.0.0.1:${ports[settlement]}" \
    --files "$files" --seconds $((seconds + 1)) --scale "$scale" --out "$out/requests.txt" \
    >"$out/load.txt" 2>&1 &
load_pid=$!
load_rc=0
wait "$load_pid" || load_rc=$?
load_pid=
if [ "$load_rc" != 0 ]; then
    cat "$out/load.txt"
    echo "FAIL: the load generator exited with $load_rc"
    exit 1
fi
wait "$sampler_pid" || true
sampler_pid=
rm -f "$out/.ss"
cat "$out/load.txt"
echo

failed=0
# Each service stopped as an operator would (SIGTERM): it must drain and exit 0, and a sanitized
# build (QUAN_BUILD=build-asan) writes its LeakSanitizer report into its log at that exit.
for svc in "${services[@]}"; do
    kill -TERM "${pids[$svc]}" 2>/dev/null || true
    rc=0
    wait "${pids[$svc]}" || rc=$?
    [ "$rc" = 0 ] || { echo "FAIL: quan-$svc exited with $rc on SIGTERM"; failed=1; }
    if grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$dir/$svc.log"; then
        echo "FAIL: sanitizer report in quan-$svc's log:"
        grep -E -A30 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$dir/$svc.log" |
            head -60 | tee -a "$out/sanitizer.txt"
        failed=1
    fi
done
# ---- the table: per service and measure, warm-up / end / min / max after warm-up / verdict
# A sanitized build keeps freed memory in quarantine: its RSS is not judged.
judge_rss=1
[[ ${QUAN_BUILD:-build} == *san* ]] && judge_rss=0
awk -F, -v warm="$warmup" -v end="$seconds" -v tail_s=60 -v judge_rss="$judge_rss" '
NR == 1 { next }
$3 == "dead" { dead[$2] = 1; next }
{
    svc = $2; t = $1; order[svc] = 1
    for (m = 3; m <= 6; m++) {
        k = svc SUBSEP m; v = $m + 0
        if (t <= warm) { if (!(k in wmax) || v > wmax[k]) wmax[k] = v; atwarm[k] = v }
        if (t >= warm) {
            if (!(k in lo) || v < lo[k]) lo[k] = v
            if (!(k in hi) || v > hi[k]) hi[k] = v
        }
        if (t >= end - tail_s) { if (!(k in floor) || v < floor[k]) floor[k] = v }
        last[k] = v
    }
    lastt[svc] = t
}
END {
    name[3] = "rss_kb"; name[4] = "fds"; name[5] = "conns"; name[6] = "threads"
    printf "%-15s %-8s %10s %10s %10s %10s  %s\n", "service", "measure", "warm-up", "end", "min", "max", "verdict"
    n = split("merchant-admin engine settlement distribution", svcs, " ")
    for (i = 1; i <= n; i++) {
        svc = svcs[i]
        if (svc in dead || lastt[svc] < end) { printf "%-15s died\n", svc; bad = 1; continue }
        for (m = 3; m <= 6; m++) {
            k = svc SUBSEP m
            if (m == 3) ok = last[k] <= atwarm[k] * 1.10 + 2048
            else ok = floor[k] <= wmax[k]
            verdict = ok ? "flat" : "GROWS"
            if (m == 3 && !judge_rss) verdict = "(sanitized build)"
            else if (!ok) bad = 1
            printf "%-15s %-8s %10d %10d %10d %10d  %s\n", svc, name[m], atwarm[k], last[k], lo[k],
                hi[k], verdict
        }
    }
    exit bad
}' "$out/samples.csv" | tee "$out/summary.txt" || failed=1
echo "(warm-up: the sample at ${warmup}s; min/max: from then on; rss flat: end <= warm-up x 1.10 + 2048 kB;"
echo " fds/conns/threads flat: the lowest of the last 60 s <= the highest up to the warm-up)"

# ---- request outcomes
read -r answered bad < <(awk '$1 != "tasks" {ok += $2 + $3; bad += $4 + $5} END {print ok + bad, bad}' \
    "$out/requests.txt")
read -r _ tasks_ok tasks_failed < <(grep '^tasks ' "$out/requests.txt")
if [ "$answered" -eq 0 ]; then
    echo "FAIL: no requests were made"
    failed=1
elif [ $((bad * 1000)) -gt $((answered * max_bad)) ]; then
    echo "FAIL: $bad of $answered requests got a 5xx or no answer (more than $max_bad per mille)"
    failed=1
fi
[ "$tasks_failed" = 0 ] || { echo "FAIL: $tasks_failed distribution tasks did not succeed"; failed=1; }
[ "$tasks_ok" -gt 0 ] || { echo "FAIL: no distribution task succeeded"; failed=1; }
if [ "$failed" = 0 ]; then
    echo "soak: PASS ($answered requests, $bad 5xx or unanswered, $tasks_ok distribution tasks; every service flat and exited 0)"
else
    echo "soak: FAIL (samples and logs in $out)"
fi
exit "$failed"
