# shellcheck shell=bash
# bench/lib.sh — sourced by the benchmark scripts: their own PostgreSQL/Redis/RabbitMQ in a
# temporary directory, migrated, and one quan-engine on a free port. Sets dir, port, base and
# engine_pid; removes everything on exit.
#   bench_init NAME                 servers in /tmp/NAME.XXXXXX
#   bench_start_engine [VAR=v ...]  an engine with these extra settings; waits for /readyz. Its
#                                   log level is warn, unless the caller set bench_make_up=1:
#                                   then the default (info, an access-log line per request), as
#                                   `make up` runs it
#   bench_stop_engine
#   bench_start_service NAME PORT [VAR=v ...]   quan-NAME on PORT, default log level, stdout
#                                   appended to $dir/NAME.log (as `make up`); waits for /readyz;
#                                   its pid in bench_pid_NAME (dashes as underscores), stopped
#                                   on exit
#   bench_shard TABLE N VALUE       "DS TABLE_i": VALUE's shard of the N-way TABLE (common/pg/shard.c)
#   bench_template ID SHOP STOCK [TYPE TARGET GOODS CONSUME_RULE LIMIT]
#                                   a template written directly: its row in its shard of
#                                   PostgreSQL and its cache hash in Redis, open from an hour ago
#                                   for 30 days (by default: 5 off the whole shop, one a user)
#   bench_wrk NAME URL [SCRIPT]     wrk, one thread (the other core serves), $conns connections
#                                   for $seconds s: $dir/NAME.out and, read from it,
#                                   $dir/NAME.{rate,p50,p99,non2xx}
#   bench_copy_coupons N TEMPLATE SHOP
#                                   the PostgreSQL COPY baseline: quan-bench-dist copy, N user
#                                   coupons routed by the sharding rule and COPYed into the
#                                   sharded tables (both databases in parallel); prints rows/s,
#                                   then empties the t_user_coupon tables again and checkpoints
#   bench_cpu_by_name               CPU seconds used so far by each program of this run (its
#                                   servers, engines and tools; utime + stime; for PostgreSQL
#                                   also the backends that exited, and for Redis its append-only
#                                   file rewrites that ended (a forked child each), both counted
#                                   in the parent's cutime + cstime): lines "NAME SECONDS";
#                                   then "@wall SECONDS" (the clock), "@idle SECONDS" (the
#                                   machine's idle time, all cores, /proc/stat) and what this
#                                   shell's children used once they ended (wrk, the tools), before
#                                   and after the snapshot ("@kids_before", "@kids_after")
#   bench_cpu_delta FILE0 FILE1 [N] what each program used between two bench_cpu_by_name
#                                   snapshots, largest first (at least 0.1 s; "wrk+tools": the
#                                   load generators and tools that ended meanwhile); with N also
#                                   microseconds per item (N items: claims, rows); then how busy
#                                   the whole machine was meanwhile (every process, ours or not)
#   bench_cpu_of FILE0 FILE1 NAME   CPU seconds program NAME used between the two snapshots
#   bench_costs PATH FILE0 FILE1 N  the CPU microseconds each program spent per item of a write
#                                   path (N items between the snapshots), on one line: printed
#                                   ("cost: ...") and recorded in $BENCH_COSTS for run.sh's table
#   bench_redis_rewrites            how many times Redis rewrote its append-only file since its
#                                   counters were last reset (CONFIG RESETSTAT)
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
    # shellcheck disable=SC2034 # read by the scripts that source this file
    base="http://127.0.0.1:$port"
}

bench_start_engine() {
    local level=(QUAN_LOG_LEVEL=warn)
    [ "${bench_make_up:-0}" != 1 ] || level=()
    bench_start_service engine "$port" "${level[@]}" "$@"
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

bench_shard() {
    /usr/bin/python3 - "$@" <<'PY'
import sys
table, n, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) & 0xFFFFFFFFFFFFFFFF
h = (v ^ (v >> 32)) & 0xFFFFFFFF
h = h - (1 << 32) if h >= 1 << 31 else h
i = 0 if abs(h) == 1 << 31 else abs(h) % n
print(i // (n // 2), "%s_%d" % (table, i))
PY
}

bench_template() {
    local id=$1 shop=$2 stock=$3 type=${4:-0} target=${5:-1} goods=${6:-}
    local cr=${7:-'{"maximumDiscountAmount":5,"validityPeriod":48}'}
    local rr="{\"limitPerPerson\":${8:-1},\"usageInstructions\":\"bench\"}"
    local ds table dsn now_ms start_ms end_ms
    read -r ds table < <(bench_shard t_coupon_template 16 "$shop")
    dsn="QUAN_DS${ds}_DSN"
    now_ms=$(($(date +%s) * 1000))
    start_ms=$((now_ms - 3600000))
    end_ms=$((now_ms + 30 * 86400000))
    psql "${!dsn}" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO $table (id, name, shop_number, source,
        target, goods, type, valid_start_time, valid_end_time, stock, receive_rule, consume_rule)
        VALUES ($id, 'bench', $shop, 0, $target, NULLIF('$goods', ''), $type,
        to_timestamp($start_ms / 1000.0), to_timestamp($end_ms / 1000.0), $stock, '$rr',
        '$cr')" >/dev/null
    # as the services write it (template.h): the rule numbers beside the rules
    local hours
    hours=$(sed -n 's/.*"validityPeriod":\([0-9]*\).*/\1/p' <<<"$cr")
    redis-cli -p "$QUAN_REDIS_PORT" HSET "quan:tpl:{$id}" id "$id" shopNumber "$shop" name bench \
        source 0 target "$target" goods "$goods" type "$type" validStartTime "$start_ms" \
        validEndTime "$end_ms" stock "$stock" receiveRule "$rr" consumeRule "$cr" status 0 \
        limitPerPerson "${8:-1}" validityHours "${hours:-24}" >/dev/null
    redis-cli -p "$QUAN_REDIS_PORT" PEXPIREAT "quan:tpl:{$id}" "$end_ms" >/dev/null
}

bench_wrk() {
    local name=$1 url=$2 script=${3:-} bad
    wrk -t1 -c"$conns" -d"${seconds}s" --latency ${script:+-s "$script"} "$url" >"$dir/$name.out" 2>&1
    awk '/Requests\/sec/ {print $2}' "$dir/$name.out" >"$dir/$name.rate"
    awk '$1 == "50%" {print $2}' "$dir/$name.out" >"$dir/$name.p50"
    awk '$1 == "99%" {print $2}' "$dir/$name.out" >"$dir/$name.p99"
    bad=$(awk '/Non-2xx/ {print $NF}' "$dir/$name.out")
    echo "${bad:-0}" >"$dir/$name.non2xx"
}

bench_copy_coupons() {
    local rate ds dsn_var
    rate=$("${QUAN_BUILD:-build}/bin/quan-bench-dist" copy "$1" "$2" "$3")
    for ds in 0 1; do
        dsn_var="QUAN_DS${ds}_DSN"
        psql -qAt "${!dsn_var}" -c "SELECT 'TRUNCATE ' || string_agg(tablename, ', ') FROM pg_tables
            WHERE tablename LIKE 't_user_coupon\_%' AND tablename NOT LIKE '%log%'" |
            psql -q "${!dsn_var}" >/dev/null
        psql -q "${!dsn_var}" -c CHECKPOINT >/dev/null
    done
    echo "$rate"
}

# The CPU this shell's ended children used (wrk, the tools; the builtin, run in this shell: in a
# pipeline or $(...) it would answer for a subshell), as "@NAME SECONDS".
bench_children_cpu() {
    times >"$dir/cpu.times"
    awk -v name="$1" 'NR == 2 {s = 0; for (i = 1; i <= 2; i++) {split($i, a, /[ms]/); s += a[1] * 60 + a[2]}
        printf "@%s %.2f\n", name, s}' "$dir/cpu.times"
}

bench_cpu_by_name() {
    local tck
    # The load generators exit before the second snapshot, into this shell's children times;
    # the snapshot's own processes are left out (taken before and after them).
    bench_children_cpu kids_before
    tck=$(getconf CLK_TCK)
    # Only this run's processes (other benchmarks may share the machine): the servers in
    # $dir/pids, this shell (the engine, the tools) and all they started.
    { awk '{print "root", $2}' "$dir/pids" 2>/dev/null; echo "root $$"
        for f in /proc/[0-9]*/stat; do cat "$f" 2>/dev/null || true; echo; done; } |
        awk -v tck="$tck" '$1 == "root" {root[$2] = 1; next}
            NF {name = $2; sub(/^\(/, "", name); sub(/\)$/, "", name); sub(/:.*/, "", name)
                pid = $1; parent[pid] = $4; comm[pid] = name; t[pid] = ($14 + $15) / tck
                if (name == "postgres" || name == "redis-server") t[pid] += ($16 + $17) / tck}
            END {for (p in t) {q = p
                    for (k = 0; k < 64 && q > 1 && !(q in root); k++) q = parent[q]
                    if (q in root) cpu[comm[p]] += t[p]}
                for (n in cpu) printf "%s %.2f\n", n, cpu[n]}'
    awk -v tck="$tck" '$1 == "cpu" {printf "@idle %.2f\n", ($5 + $6) / tck}' /proc/stat
    echo "@wall $(date +%s.%N)"
    bench_children_cpu kids_after
}

bench_cpu_delta() {
    awk -v n="${3:-0}" 'NR == FNR {before[$1] = $2; next}
        $1 == "@kids_before" {$1 = "wrk+tools"; before[$1] = before["@kids_after"]}
        {d = $2 - before[$1]
        if ($1 ~ /^@/ || d < 0.1) next
        if (n > 0) printf "  %-16s %7.2f s  %6.1f us each\n", $1, d, d * 1e6 / n
        else printf "  %-16s %7.2f s\n", $1, d}' "$1" "$2" | sort -k2 -nr
    # The machine: a share well under 100 % busy means the run waited on something other than
    # CPU (a round trip, a lock, an fsync); near 100 %, the cores were the limit.
    awk -v cores="$(nproc)" 'NR == FNR {before[$1] = $2; next} $1 == "@wall" {w = $2 - before[$1]}
        $1 == "@idle" {i = $2 - before[$1]} END {if (w > 0) printf "  %-16s %7.2f s  busy %.0f %% of %d cores\n",
            "the machine", w, 100 * (1 - i / (w * cores)), cores}' "$1" "$2"
}

bench_cpu_of() {
    awk -v name="$3" 'NR == FNR { if ($1 == name) b = $2; next }
        $1 == name { a = $2 } END { printf "%.3f", a - b }' "$1" "$2"
}

bench_costs() {
    local line
    line=$(awk -v n="$4" -v path="$1" 'NR == FNR {before[$1] = $2; next}
        $1 !~ /^@/ && $2 - before[$1] >= 0.05 { printf "%s\t%s %.1f\n", $2 - before[$1], $1, ($2 - before[$1]) * 1e6 / n }' \
        "$2" "$3" | sort -g -r | cut -f2 | paste -s -d, | sed 's/,/, /g')
    printf 'cost: %s: %s (CPU us per item)\n' "$1" "$line"
    [ -z "${BENCH_COSTS:-}" ] || printf '%s\t%s\n' "$1" "$line" >>"$BENCH_COSTS"
}

bench_redis_rewrites() {
    redis-cli -p "$QUAN_REDIS_PORT" INFO persistence | tr -d '\r' | awk -F: '$1 == "aof_rewrites" {print $2}'
}

# Lines "NUMBER [WORDS...]" on stdin: the line whose number is the median (the lower one of an
# even count), so that a caller can carry what the number belongs to (a round) beside it.
bench_median() {
    sort -g | awk '{ v[NR] = $0 } END { print v[int((NR + 1) / 2)] }'
}

bench_free_port() {
    /usr/bin/python3 "$root/deploy/local/ports.py"
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
