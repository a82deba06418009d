#!/usr/bin/env bash
# Runs every test suite against freshly started servers (a temporary directory, free ports)
# and stops them afterwards, whatever the outcome. Each suite prints "N passed, N failed" as
# its last line; this script sums them and prints the total alone on its last line.
#
#   integration-tests/run.sh               unit tests + integration tests
#   integration-tests/run.sh --unit-only   unit tests only
#   QUAN_TEST_ASAN=1 ...                   also run the unit tests built with ASan/LSan
#                                          (build-asan/, from `make SAN=asan tests`) and,
#                                          when build-asan/bin has the services (`make
#                                          SAN=asan all`), the service suites against those
#                                          binaries: any sanitizer report in a log fails
#   QUAN_TEST_ASAN_INSTEAD=1 ...           with QUAN_TEST_ASAN=1: what the sanitized build
#                                          runs (the unit tests, the service suites it
#                                          lists) is not run on the plain build as well
#                                          (CI: its cluster run has the plain build)
#   QUAN_TEST_FUZZ=1 ...                   also run the fuzz targets (build-fuzz/fuzz, from
#                                          `make fuzz`) for FUZZ_SECONDS (60) each, as one
#                                          suite, "fuzz" (integration-tests/fuzz.sh)
#   QUAN_TEST_CHAOS=1 ...                  also run the chaos suite (integration-tests/chaos/
#                                          run.sh: its own durable servers, processes killed
#                                          mid-sale; about seven minutes) as one suite, "chaos"
#   QUAN_TEST_INFRA_DIR=dir ...            the servers in dir (started there already, or
#                                          being started) rather than a new directory
#   QUAN_TEST_FILTER=regex ...             run only the suites whose name matches
#   QUAN_TEST_SKIP=regex ...               and not those whose name matches this
#   QUAN_TOPOLOGY=cluster ...              the servers as a cluster (infra.sh's
#                                          QUAN_INFRA_TOPOLOGY=cluster), and every service of
#                                          the Python suites two replicas behind a gateway
#                                          (integration-tests/quan.py); the integration suites
#                                          that depend on the topology only (make test
#                                          TOPOLOGY=cluster)
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
build=${QUAN_BUILD:-build}
mode=all
[ "${1:-}" = "--unit-only" ] && mode=unit
filter=${QUAN_TEST_FILTER:-.}
skip=${QUAN_TEST_SKIP:-}

passed=0
failed=0
failed_suites=()

# QUAN_TEST_INFRA_DIR: a directory whose servers another process started, or is starting, for
# this run (CI starts the cluster run's while the single run works); infra.sh start waits for
# that start and finds them running. Stopped and removed at the end like a directory of our own.
if [ -n "${QUAN_TEST_INFRA_DIR:-}" ]; then
    dir=$QUAN_TEST_INFRA_DIR
    mkdir -p "$dir"
else
    dir=$(mktemp -d /tmp/quan-test.XXXXXX)
fi
chmod 0755 "$dir"
cleanup() {
    deploy/local/infra.sh stop "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

topology=${QUAN_TOPOLOGY:-single}
if [ "$topology" = cluster ]; then
    # QUAN_TOPOLOGY is what the suites' harness reads; the infra.sh topology goes to this run's
    # own servers only (the deploy scripts' suites start the topology they test).
    export QUAN_TOPOLOGY=cluster
    # The unit tests start no server and do not depend on the topology: the single run has
    # them, and leaving them out keeps the (slower) cluster run to what it adds.
    [ "$mode" = unit ] && {
        echo "--unit-only with QUAN_TOPOLOGY=cluster: nothing to run"
        echo "0 passed, 0 failed"
        exit 0
    }
    unit_suites=0
else
    unit_suites=1
fi

# These servers live for one run: no fsync, no Redis persistence (make up's are durable).
export QUAN_INFRA_DURABILITY=${QUAN_INFRA_DURABILITY:-fast}
echo "== starting PostgreSQL, Redis and RabbitMQ in $dir"
if ! QUAN_INFRA_TOPOLOGY=$topology deploy/local/infra.sh start "$dir" >"$dir/infra.log" 2>&1; then
    cat "$dir/infra.log"
    echo "infrastructure did not start"
    echo "0 passed, 1 failed"
    exit 1
fi
# shellcheck source=integration-tests/testenv.sh
. "$root/integration-tests/testenv.sh"
test_env "$root" "$build" "$dir" "$dir" warn

# run_suite NAME TIMEOUT_S CMD...: runs one suite, adds its counts to the totals.
run_suite() {
    local name=$1 limit=$2
    shift 2
    [[ "$name" =~ $filter ]] || return 0
    if [ -n "$skip" ] && [[ "$name" =~ $skip ]]; then return 0; fi
    local log="$dir/suite-${name//\//_}.log"
    local start=$SECONDS
    echo "== $name"
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    local summary
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    if [ -n "$summary" ]; then
        local p f
        p=${summary%% passed*}
        f=${summary#*passed, }
        f=${f%% failed*}
        passed=$((passed + p))
        failed=$((failed + f))
        # A suite that crashed or timed out after its summary still counts as a failure.
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
            failed=$((failed + 1))
            f=1
        fi
    else
        failed=$((failed + 1))
        f=1
        summary="no summary line (exit $rc)"
    fi
    if [ "$f" -ne 0 ] || [ "${QUAN_TEST_VERBOSE:-0}" = 1 ]; then
        sed 's/^/    /' "$log" | tail -n 80
    else
        # A suite that cannot run here says why ("SKIPPED: reason") and counts nothing.
        grep -E '^SKIPPED' "$log" | sed 's/^/    /'
    fi
    if [ "$f" -ne 0 ]; then
        failed_suites+=("$name")
    fi
    echo "   $summary ($((SECONDS - start)) s)"
}

# QUAN_TEST_ASAN_INSTEAD=1: the sanitized build takes the place of the plain one for what it
# runs, once each is there (Makefile: make test builds both first).
asan_instead=0
if [ "${QUAN_TEST_ASAN:-0}" = 1 ] && [ "${QUAN_TEST_ASAN_INSTEAD:-0}" = 1 ] &&
    [ -x build-asan/bin/quan-engine ] && [ -d build-asan/tests ]; then
    asan_instead=1
fi

for t in "$build"/tests/test_* "$build"/tests/*__test_*; do
    [ "$unit_suites" = 1 ] || break
    [ "$asan_instead" = 1 ] && break
    [ -x "$t" ] || continue
    run_suite "unit/$(basename "$t")" 300 "$t"
done

if [ "${QUAN_TEST_ASAN:-0}" = 1 ]; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    for t in build-asan/tests/test_* build-asan/tests/*__test_*; do
        [ -x "$t" ] || continue
        run_suite "asan/$(basename "$t")" 600 "$t"
    done
    unset ASAN_OPTIONS UBSAN_OPTIONS
fi

# On the cluster topology only what depends on the topology runs again: the .sh suites start
# whatever they test themselves (or need no server), test_dependency_restarts and test_tls start
# single servers of their own, the alert's end-to-end run and the dashboards' queries do not depend on
# the topology, the containers are configured as the manifests say against either
# topology's stores, and the service shell's checks are about one process (its configuration,
# signals, secrets, memory); the single run has them.
single_only='\.sh$|test_dependency_restarts\.py$|test_tls\.py$|test_prometheus_alerts\.py$|test_dashboards\.py$|test_containers\.py$|test_service_shell\.py$'
# The suites the services run under ASan (below); QUAN_TEST_ASAN_INSTEAD=1 runs them there only.
asan_services="engine_claims|engine_relayout|engine_doubt|engine_exchange|engine_payment|engine_reservations|engine_redis_loss|settlement|merchant_templates|merchant_codes|distribution"
if [ "$mode" = all ]; then
    for t in integration-tests/test_*.sh integration-tests/test_*.py; do
        [ -f "$t" ] || continue
        if [ "$topology" = cluster ] && [[ "$t" =~ $single_only ]]; then
            continue
        fi
        if [ "$asan_instead" = 1 ] && [[ "$t" =~ $asan_services ]]; then
            continue
        fi
        case "$t" in
        *.py) run_suite "it/$(basename "$t")" 600 /usr/bin/python3 "$t" ;;
        *) run_suite "it/$(basename "$t")" 600 bash "$t" ;;
        esac
    done
fi

# The services themselves under ASan/LSan/UBSan: the suites that drive them hardest, against
# the sanitized binaries; every service log is then searched for a sanitizer report (a leak
# at exit after SIGTERM, a bad access, undefined behaviour), one check per log.
if [ "${QUAN_TEST_ASAN:-0}" = 1 ] && [ "$mode" = all ] && [ -x build-asan/bin/quan-engine ]; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    mkdir -p "$dir/asan-services"
    ran=0
    for t in integration-tests/test_*.py; do
        [[ "$t" =~ $asan_services ]] || continue
        [[ "asan-services/$(basename "$t")" =~ $filter ]] && ran=1
        QUAN_BIN_DIR="$root/build-asan/bin" QUAN_TEST_TMP="$dir/asan-services" \
            run_suite "asan-services/$(basename "$t")" 900 /usr/bin/python3 "$t"
    done
    unset ASAN_OPTIONS UBSAN_OPTIONS
    # The logs of whatever ran are checked, whatever the filter.
    [ "$ran" = 1 ] && filter=. run_suite "asan-services/reports" 60 bash \
        integration-tests/asan_reports.sh "$dir/asan-services"
fi

# The chaos suite starts its own servers with make up's durable settings (these are fast), kills
# processes and servers under load and checks the promises after; minutes, so it runs late. Its
# time limit is above the worst case of its scenarios (each bounded by its settle time).
if [ "${QUAN_TEST_CHAOS:-0}" = 1 ] && [ "$mode" = all ]; then
    chaos_name=chaos
    [ "$topology" = single ] || chaos_name="chaos-$topology"
    run_suite "$chaos_name" 1800 bash integration-tests/chaos/run.sh
fi

# The fuzz targets under ASan and UBSan, each for a bounded time; no servers needed, but they
# run last so that their minutes delay no other suite's verdict. The suite's time limit is above
# the sum of fuzz.sh's own bound per target (FUZZ_SECONDS, one slow input, a minute).
if [ "${QUAN_TEST_FUZZ:-0}" = 1 ]; then
    n_fuzz=$(find fuzz -maxdepth 1 -name 'fuzz_*.c' | wc -l)
    run_suite "fuzz" $((n_fuzz * (${FUZZ_SECONDS:-60} + ${FUZZ_TIMEOUT:-25} + 70) + 60)) \
        bash integration-tests/fuzz.sh
fi

if [ ${#failed_suites[@]} -gt 0 ]; then
    echo "failed suites: ${failed_suites[*]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
