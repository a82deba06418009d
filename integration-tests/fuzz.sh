#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ (built by `make fuzz` into build-fuzz/fuzz/), each for a bounded
# time from its corpus fuzz/corpus/<name>/, under ASan and UBSan. A target passes when libFuzzer
# reaches the end of its time: a crash, a sanitizer report (UBSan included), a leak, an input
# that runs longer than FUZZ_TIMEOUT, or more memory than -rss_limit_mb fails it.
#
#   integration-tests/fuzz.sh [NAME...]   every target, or those named (jsonin, http, ...)
#   FUZZ_SECONDS=60                        time per target (-max_total_time)
#   FUZZ_TIMEOUT=25                        longest run of one input, in seconds
#   FUZZ_JOBS=<cores>                      targets run at once (each is one process on one
#                                          core; their lines print in order afterwards)
#   QUAN_FUZZ_BUILD=build-fuzz             where the targets are
#
# What the fuzzer finds stays out of the repository: new inputs and crash artifacts go to a
# temporary directory, removed afterwards unless a target failed (its path is then printed,
# with the failing input in hex). `QUAN_TEST_FUZZ=1 make test` (CI) runs this as one suite.
# One line per target, e.g. "ok   fuzz_jsonin: 61 s, 1262154 runs, 20691 exec/s, peak RSS 180
# MB"; the last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
cd "$root" || exit 1

seconds=${FUZZ_SECONDS:-60}
per_input=${FUZZ_TIMEOUT:-25}
build=${QUAN_FUZZ_BUILD:-build-fuzz}

if [ $# -gt 0 ]; then
    names=("$@")
else
    names=()
    for src in fuzz/fuzz_*.c; do
        n=${src#fuzz/fuzz_}
        names+=("${n%.c}")
    done
fi

tmp=$(mktemp -d /tmp/quan-fuzz.XXXXXX)
# The spreadsheet targets rewrite a scratch file for every input: in memory when there is a
# tmpfs (a third faster than a disk).
scratch=$(mktemp -d /dev/shm/quan-fuzz.XXXXXX 2>/dev/null || mktemp -d "$tmp/scratch.XXXXXX")
keep=0
cleanup() {
    rm -rf "$scratch"
    if [ "$keep" = 1 ]; then
        echo "     the failing inputs and logs are kept in $tmp"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT

# UBSan stops at the first report (the objects are built with -fno-sanitize-recover too).
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=detect_leaks=1
# Where the spreadsheet targets make their scratch file (removed even after a crash).
export TMPDIR=$scratch

# fuzz_one NAME: runs one target; leaves its verdict line ("ok ..." or "bad ...") in
# $tmp/NAME/verdict and what explains a failure in $tmp/NAME/detail.
fuzz_one() {
    local name=$1 bin corpus dict log rc runs rate took rss a
    local out=$tmp/$name
    bin=$build/fuzz/fuzz_$name
    corpus=fuzz/corpus/$name
    mkdir -p "$out/new" "$out/artifacts"
    if [ ! -x "$bin" ]; then
        echo "bad fuzz_$name: $bin is not built (make fuzz)" >"$out/verdict"
        return
    fi
    if [ ! -d "$corpus" ]; then
        echo "bad fuzz_$name: no corpus in $corpus" >"$out/verdict"
        return
    fi
    # A dictionary when the target has one: tokens its parser compares out of libFuzzer's sight.
    dict=()
    [ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
    log=$out/log
    # The first directory is where libFuzzer writes what it finds; the corpus is read only.
    timeout --kill-after=10 $((seconds + per_input + 60)) \
        "$bin" -max_total_time="$seconds" -timeout="$per_input" -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$out/artifacts/" "${dict[@]}" \
        "$out/new" "$corpus" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ] &&
        ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|^SUMMARY: ' \
            "$log"; then
        echo "ok fuzz_$name: ${took:-?} s, ${runs:-?} runs, ${rate:-?} exec/s, peak RSS ${rss:-?} MB" \
            >"$out/verdict"
        return
    fi
    echo "bad fuzz_$name: exit $rc after ${runs:-?} runs" >"$out/verdict"
    {
        grep -E -A 30 'ERROR: |runtime error:|property failed|==[0-9]+==' "$log" | head -n 60 |
            sed 's/^/     /'
        for a in "$out/artifacts"/*; do
            [ -f "$a" ] || continue
            echo "     input $a:"
            od -A d -c "$a" | head -n 20 | sed 's/^/       /'
        done
    } >"$out/detail"
}

jobs_max=${FUZZ_JOBS:-$(nproc)}
for name in "${names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    fuzz_one "$name" &
done
wait

for name in "${names[@]}"; do
    read -r verdict line <"$tmp/$name/verdict" || { verdict=bad line="fuzz_$name: no verdict"; }
    if [ "$verdict" = ok ]; then
        ok "$line"
    else
        keep=1
        bad "$line"
        [ -f "$tmp/$name/detail" ] && cat "$tmp/$name/detail"
    fi
done

finish
