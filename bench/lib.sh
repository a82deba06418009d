# shellcheck shell=bash
# bench/lib.sh — sourced by the benchmark scripts: their own PostgreSQL/Redis/RabbitMQ in a
# temporary directory, migrated, and one quan-engine on a free port. Sets dir, port, base and
# engine_pid; removes everything on exit.
#   bench_init NAME                 servers in /tmp/NAME.XXXXXX
#   bench_start_engine [VAR=v ...]  an engine with these extra settings; waits for /readyz
#   bench_stop_engine
#   bench_start_service NAME PORT [VAR=v ...]   quan-NAME on PORT, default log level; waits for
#                                   /readyz; its pid in bench_pid_NAME (dashes as underscores),
#                                   stopped on exit
# The caller sets root (the repository) and runs from it. The binaries are those of
# ${QUAN_BUILD:-build}/bin (QUAN_BUILD=build-asan: the sanitized build of `make SAN=asan all`).
# shellcheck disable=SC2154

bench_init() {
    command -v wrk >/dev/null || { echo "wrk is missing: deploy/local/deps.sh installs it" >&2; exit 1; }
    dir=$(mktemp -d "/tmp/$1.XXXXXX")
    chmod 0755 "$dir"
    engine_pid=
    bench_pids=()
    trap bench_cleanup EXIT
    # Fixed ports of an outer run (its env file) must not leak into this one.
    unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT
    deploy/local/infra.sh start "$dir" >"$dir/infra.log" 2>&1 || { cat "$dir/infra.log"; exit 1; }
    # shellcheck disable=SC1091
    . "$dir/env"
    "${QUAN_BUILD:-build}/bin/quan-migrate" >/dev/null
    export QUAN_CODE_SECRET=bench-secret-0123456789abcdef
    port=$(bench_free_port)
    base="http://127.0.0.1:$port"
}

bench_start_engine() {
    bench_start_service engine "$port" QUAN_LOG_LEVEL=warn "$@"
    engine_pid=$bench_pid_engine
}

bench_stop_engine() {
    if [ -n "$engine_pid" ]; then
        kill -TERM "$engine_pid" 2>/dev/null || true
        wait "$engine_pid" 2>/dev/null || true
        engine_pid=
    fi
}

bench_start_service() {
    local name=$1 svc_port=$2 pid
    shift 2
    env QUAN_HTTP_PORT="$svc_port" QUAN_HTTP_BIND=127.0.0.1 QUAN_LUA_DIR="$root/lua-scripts" \
        "$@" "${QUAN_BUILD:-build}/bin/quan-$name" >>"$dir/$name.log" 2>&1 &
    pid=$!
    bench_pids+=("$pid")
    printf -v "bench_pid_${name//-/_}" '%s' "$pid"
    # An engine on a Redis it has not seen yet rebuilds the claim state first (about 13 s).
    for _ in $(seq 1 1200); do
        curl -fsS -o /dev/null "http://127.0.0.1:$svc_port/readyz" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "quan-$name not ready" >&2
    cat "$dir/$name.log" >&2
    exit 1
}

bench_free_port() {
    /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

bench_cleanup() {
    bench_stop_engine
    local pid
    for pid in "${bench_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    deploy/local/infra.sh stop "$dir" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
