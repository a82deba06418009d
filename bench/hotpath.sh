#!/usr/bin/env bash
# The hot path against a bare libevent server, in one run. Starts its own PostgreSQL/Redis/
# RabbitMQ (bench/lib.sh), quan-engine and quan-settlement with the settings `make up` gives
# them (default log level: an access-log line per request, appended to a log file), and
# quan-bench-bare (tools/bench-bare: evhttp, one thread, a fixed JSON envelope: the baseline).
# The templates and coupons they read are written directly into PostgreSQL and Redis. Then,
# in BENCH_ROUNDS rounds (3), each target between two runs of the baseline (bare, livez, bare,
# query, bare, ...), each run after a 2 s warm-up, wrk -t1 (the other core serves) for
# BENCH_SECONDS; a ratio is a target's rate against the mean of the baseline runs just before
# and after it, and the table gives each target's median round. Beside each rate, the server's
# CPU time per request (utime + stime of its process, all threads, over the run) and that ratio
# too: the same comparison, untouched by what else takes the server's core:
#   bare          quan-bench-bare                                       the baseline (x 1)
#   livez         engine GET /livez                                     target >= 0.90 x bare
#   query         engine GET /coupon-template/query, cache hits         target >= 0.65 x bare
#   refusal       engine POST /user-coupon/redeem, sold out (409)       target >= 0.60 x bare
#   bare-large    quan-bench-bare sending a body as long as coupon-query's  (what the bytes cost)
#   coupon-query  settlement POST /coupon-query, one user's 200 coupons target >= 0.60 x bare
# with p50/p99 from wrk --latency; then, open loop (quan-bench-paced: latency from each request's
# intended time, BENCH_PACED_SECONDS), query and refusal at half their maximum rate, each between
# two runs of the bare server paced alike, target p99 <= 1.5 x the mean of those two bare p99s
# (the tail the machine itself adds moves both; the two bare runs against each other show how
# much; printed with how long each server's loop thread waited for a core, the engine's
# loop-lag p99 in those runs, and the bare server's p99 at half its own maximum, as loaded as
# the targets). Fails when an answer has another status than the one expected
# (200; 409 for the refusal: counted by the engine's /metrics) or coupon-query does not list 200
# coupons.
#   BENCH_SECONDS=10 BENCH_ROUNDS=3 BENCH_CONNECTIONS=64 BENCH_PACED_SECONDS=10 bench/hotpath.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${BENCH_SECONDS:-10}
conns=${BENCH_CONNECTIONS:-64}
paced_seconds=${BENCH_PACED_SECONDS:-10}
rounds=${BENCH_ROUNDS:-3}

for b in quan-bench-bare quan-bench-paced quan-engine quan-settlement; do
    [ -x "${QUAN_BUILD:-build}/bin/$b" ] || { echo "build first (make): $b is missing" >&2; exit 1; }
done
# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-bench-hotpath
bench_make_up=1 # bench_start_engine: the default log level

# ---- data, written directly (DB rows + cache hashes) ----
shop=1810714735922956666
t_sold=900000000000000001
t_hit=900000000000000002
bench_template $t_sold $shop 0
bench_template $t_hit $shop 100

# One user holding 200 unused coupons: 10 of each of 20 templates of five kinds, so that the
# answer has both lists and every rule is computed. For the order below (100, goods G1 60 and
# G2 40) the threshold-500 ones are not available (40 coupons), the other 160 are.
user=1810518709471555585
t_cq0=910000000000000000
for i in $(seq 0 19); do
    case $((i % 5)) in
    0) bench_template $((t_cq0 + i)) $shop 1000 0 1 "" '{"maximumDiscountAmount":5,"validityPeriod":48}' 10 ;;
    1) bench_template $((t_cq0 + i)) $shop 1000 1 1 "" '{"termsOfUse":50,"maximumDiscountAmount":10,"validityPeriod":48}' 10 ;;
    2) bench_template $((t_cq0 + i)) $shop 1000 1 1 "" '{"termsOfUse":500,"maximumDiscountAmount":50,"validityPeriod":48}' 10 ;;
    3) bench_template $((t_cq0 + i)) $shop 1000 2 1 "" '{"termsOfUse":0,"discountRate":0.8,"maximumDiscountAmount":30,"validityPeriod":48}' 10 ;;
    4) bench_template $((t_cq0 + i)) $shop 1000 0 0 G2 '{"maximumDiscountAmount":3,"validityPeriod":48}' 10 ;;
    esac
done
read -r uds utable < <(bench_shard t_user_coupon 32 "$user")
udsn="QUAN_DS${uds}_DSN"
c0=920000000000000000
recv_ms=$(($(date +%s) * 1000 - 3600000))
psql "${!udsn}" -qAtX -v ON_ERROR_STOP=1 -c "INSERT INTO $utable (id, user_id, coupon_template_id,
    shop_number, receive_time, receive_count, valid_start_time, valid_end_time, status)
    SELECT $c0 + i, $user, $t_cq0 + i % 20, $shop, to_timestamp($recv_ms / 1000.0), i / 20 + 1,
    to_timestamp($recv_ms / 1000.0), now() + interval '1 day' + i * interval '1 minute', 0
    FROM generate_series(0, 199) i" >/dev/null
# Their wallet members, as the engine's claim writes them.
wallet=()
for i in $(seq 0 199); do wallet+=("$recv_ms" "$((t_cq0 + i % 20))_$((c0 + i))"); done
redis-cli -p "$QUAN_REDIS_PORT" ZADD "quan:wallet:{$user}" "${wallet[@]}" >/dev/null

# ---- servers ----
bare_port=$(bench_free_port)
"${QUAN_BUILD:-build}/bin/quan-bench-bare" "$bare_port" >>"$dir/bare.log" 2>&1 &
bare_pid=$!
bench_pids+=("$bare_pid")
# shellcheck disable=SC2119 # no extra settings
bench_start_engine
st_port=$(bench_free_port)
bench_start_service settlement "$st_port"
bare="http://127.0.0.1:$bare_port/"
query="$base/api/engine/coupon-template/query?shopNumber=$shop&couponTemplateId=$t_hit"
redeem="$base/api/engine/user-coupon/redeem"
redeem_body="{\"source\":0,\"shopNumber\":\"$shop\",\"couponTemplateId\":\"$t_sold\"}"
cq="http://127.0.0.1:$st_port/api/settlement/coupon-query"
cq_body="{\"orderAmount\":\"100\",\"shopNumber\":\"$shop\",\"goodsList\":[{\"goodsNumber\":\"G1\",\"goodsAmount\":\"60\"},{\"goodsNumber\":\"G2\",\"goodsAmount\":\"40\"}]}"
cat >"$dir/get.lua" <<'LUA'
wrk.headers["X-User-Id"] = "42"
LUA
post_lua() { # FILE BODY USER: a wrk script posting BODY as USER
    cat >"$1" <<LUA
wrk.method = "POST"
wrk.body = [[$2]]
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-User-Id"] = "$3"
LUA
}
post_lua "$dir/refuse.lua" "$redeem_body" 42
post_lua "$dir/cq.lua" "$cq_body" "$user"

# ---- each answer checked once before it is measured ----
fail() { echo "hotpath: $*" >&2; exit 1; }
for _ in $(seq 1 100); do curl -fsS -o /dev/null "$bare" 2>/dev/null && break; sleep 0.05; done
out=$(curl -sS -H X-User-Id:42 "$query")
[[ $out == *"\"id\":\"$t_hit\""* ]] || fail "query: $out"
out=$(curl -sS -w ' %{http_code}' -H X-User-Id:42 -H Content-Type:application/json -d "$redeem_body" "$redeem")
[[ $out == *B000100*" 409" ]] || fail "refusal: not a 409 B000100: $out"
curl -sS -H "X-User-Id: $user" -H Content-Type:application/json -d "$cq_body" "$cq" >"$dir/cq.json"
counts=$(/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["data"]
print(len(d["availableCouponList"]), len(d["notAvailableCouponList"]))' "$dir/cq.json") ||
    fail "coupon-query: $(head -c 300 "$dir/cq.json")"
read -r n_avail n_notav <<<"$counts"
[ $((n_avail + n_notav)) = 200 ] || fail "coupon-query lists $n_avail + $n_notav coupons, not 200"
# A second bare server whose body is as long as coupon-query's answer: sending those bytes
# through the kernel is part of the answer's cost that no server avoids.
cq_bytes=$(stat -c %s "$dir/cq.json")
large_port=$(bench_free_port)
"${QUAN_BUILD:-build}/bin/quan-bench-bare" "$large_port" "$cq_bytes" >>"$dir/bare-large.log" 2>&1 &
large_pid=$!
bench_pids+=("$large_pid")
large="http://127.0.0.1:$large_port/"
for _ in $(seq 1 100); do curl -fsS -o /dev/null "$large" 2>/dev/null && break; sleep 0.05; done
[ "$(curl -fsS "$large" | wc -c)" = "$cq_bytes" ] || fail "bare-large does not send $cq_bytes bytes"

# ---- maximum rates, wrk ----
# BENCH_ROUNDS rounds, each the baseline and then every target: a ratio compares a target with
# the baseline of its own round, seconds apart, so that the machine's drift (a VM's neighbours,
# another build) moves both; the table gives each ratio's median over the rounds, and the
# rates, p50 and p99 of the round whose ratio is that median.
cpu_ticks() { awk '{print $14 + $15, $15}' "/proc/$1/stat"; } # PID: CPU ticks, of them the kernel's
# PID NAME URL [SCRIPT]: a 2 s warm-up, then bench_wrk; NAME.cpu: µs of PID per request, NAME.sys:
# of them in the kernel (for a long answer mostly the copy of its bytes into the socket)
measure() {
    local pid=$1 t0 t1 s0 s1
    shift
    seconds=2 bench_wrk warmup "$2" "${3:-}"
    read -r t0 s0 < <(cpu_ticks "$pid")
    bench_wrk "$@"
    read -r t1 s1 < <(cpu_ticks "$pid")
    awk -v t="$((t1 - t0))" -v s="$((s1 - s0))" -v hz="$(getconf CLK_TCK)" -v f="$dir/$1" \
        '/requests in/ { printf "%.2f\n", t * 1e6 / hz / $1 >(f ".cpu")
                         printf "%.2f\n", s * 1e6 / hz / $1 >(f ".sys") }' "$dir/$1.out"
}
names="bare livez query refusal large cq"
targets=( # NAME PID URL SCRIPT
    "livez $engine_pid $base/livez -"
    "query $engine_pid $query $dir/get.lua"
    "refusal $engine_pid $redeem $dir/refuse.lua"
    "large $large_pid $large -"
    "cq $bench_pid_settlement $cq $dir/cq.lua")
for r in $(seq 1 "$rounds"); do
    measure "$bare_pid" "bare.$r.0" "$bare"
    k=0
    for t in "${targets[@]}"; do
        read -r n pid url script <<<"$t"
        [ "$script" = - ] && script=
        measure "$pid" "$n.$r" "$url" "$script"
        k=$((k + 1))
        measure "$bare_pid" "bare.$r.$k" "$bare"
        # against the baseline on either side: the machine's drift moves both
        awk -v a="$(cat "$dir/$n.$r.rate")" -v b0="$(cat "$dir/bare.$r.$((k - 1)).rate")" \
            -v b1="$(cat "$dir/bare.$r.$k.rate")" 'BEGIN {printf "%.4f\n", 2 * a / (b0 + b1)}' \
            >"$dir/$n.$r.ratio"
        awk -v a="$(cat "$dir/$n.$r.cpu")" -v b0="$(cat "$dir/bare.$r.$((k - 1)).cpu")" \
            -v b1="$(cat "$dir/bare.$r.$k.cpu")" 'BEGIN {printf "%.4f\n", (b0 + b1) / 2 / a}' \
            >"$dir/$n.$r.cpuratio"
    done
    # The round's baseline: its median run.
    m=$(for i in $(seq 0 $k); do echo "$(cat "$dir/bare.$r.$i.rate") $i"; done |
        bench_median | cut -d' ' -f2)
    for f in rate p50 p99 non2xx out cpu sys; do cp "$dir/bare.$r.$m.$f" "$dir/bare.$r.$f"; done
done
# The median round of each target (its files copied to NAME.*); the baseline's own: its rate's.
median_round() { # NAME: the round whose ratio (rate, for bare) is the median
    local ext=ratio
    [ "$1" = bare ] && ext=rate
    for r in $(seq 1 "$rounds"); do echo "$(cat "$dir/$1.$r.$ext") $r"; done |
        bench_median | cut -d' ' -f2
}
for n in $names; do
    m=$(median_round "$n")
    for f in rate p50 p99 non2xx out ratio cpu sys cpuratio; do
        [ -f "$dir/$n.$m.$f" ] && cp "$dir/$n.$m.$f" "$dir/$n.$f"
    done
    echo "$m" >"$dir/$n.round"
done

# ---- half the maximum, open loop ----
# In BENCH_ROUNDS rounds: query and refusal at half their maximum, each between two runs of the
# bare server paced at the same rate (bare.q0, query, bare.q1, bare.r0, refusal, bare.r1). A
# target's p99 is set against the mean of the two bare runs around it, and each figure is the
# round whose ratio is the median, like the rates above. The two bare runs of a pair are the same
# server under the same load: how far apart their p99s are is what the machine alone does to a
# 10 s p99 (the client, the infrastructure's own threads and the scheduler share two cores), and
# it is printed beside the goal.
# Beside each tail, what the machine and the loop did meanwhile: how long the server's loop
# thread waited for a core (its run-queue time, /proc/PID/schedstat: runnable, not running),
# per second of the run; and for the engine, its loop lag (quan_loop_lag_seconds: how late a
# timer due every 20 ms ran), as the p99 of the run's observations (a bucket's upper bound).
runq_ns() { awk '{print $2}' "/proc/$1/schedstat"; } # PID: its main thread's wait so far
lag_buckets() { # "LE COUNT" lines of the engine's loop-lag histogram
    curl -fsS "$base/metrics" | awk '/^quan_loop_lag_seconds_bucket/ {
        match($0, /le="[^"]*"/); print substr($0, RSTART + 4, RLENGTH - 5), $NF }'
}
lag_p99() { # BEFORE AFTER: the p99 in ms of the observations between two lag_buckets
    awk 'NR == FNR { b[$1] = $2; next } { d[++n] = $2 - b[$1]; le[n] = $1 }
        END { for (i = 1; i <= n; i++) if (d[i] >= 0.99 * d[n]) {
            printf le[i] == "+Inf" ? ">10000\n" : "%g\n", le[i] * 1000; exit } }' "$1" "$2"
}
paced() { # NAME RATE_OF ROUND PID [quan-bench-paced options] URL: at half RATE_OF's wrk rate
    local name=$1 of=$2 r=$3 pid=$4 rate q0 q1
    shift 4
    rate=$(awk '{printf "%d", $1 / 2}' "$dir/$of.rate")
    [ "$pid" = "$bare_pid" ] || lag_buckets >"$dir/$name.$r.lag0"
    q0=$(runq_ns "$pid")
    "${QUAN_BUILD:-build}/bin/quan-bench-paced" "${@:1:$#-1}" "${@: -1}" "$rate" "$paced_seconds" \
        "$conns" "X-User-Id: 42" "Content-Type: application/json" >"$dir/$name.$r.paced"
    q1=$(runq_ns "$pid")
    awk -v d="$((q1 - q0))" -v s="$paced_seconds" 'BEGIN {printf "%.2f\n", d / 1e6 / s}' \
        >"$dir/$name.$r.runq"
    [ "$pid" = "$bare_pid" ] && return
    lag_buckets >"$dir/$name.$r.lag1"
    lag_p99 "$dir/$name.$r.lag0" "$dir/$name.$r.lag1" >"$dir/$name.$r.lag"
}
pv() { sed -n "s/.*$2=\([^ ]*\).*/\1/p" "$dir/$1.paced"; } # NAME[.ROUND] KEY: a paced figure
p99_of() { pv "$1" p99_ms; }                                    # NAME.ROUND
for r in $(seq 1 "$rounds"); do
    paced bare.q0 query "$r" "$bare_pid" "$bare"
    paced query query "$r" "$engine_pid" "$query"
    paced bare.q1 query "$r" "$bare_pid" "$bare"
    paced bare.h bare "$r" "$bare_pid" "$bare" # at half its own maximum: as loaded as the targets
    paced bare.r0 refusal "$r" "$bare_pid" "$bare"
    paced refusal refusal "$r" "$engine_pid" -m POST -b "$redeem_body" -x 409 "$redeem"
    paced bare.r1 refusal "$r" "$bare_pid" "$bare"
    for t in q r; do # the pair's mean (the target's baseline) and its larger p99 over the smaller
        awk -v a="$(p99_of "bare.${t}0.$r")" -v b="$(p99_of "bare.${t}1.$r")" 'BEGIN {
            printf "%.3f %.2f\n", (a + b) / 2, (a > b ? a : b) / (a < b ? a : b) }' \
            >"$dir/bare.$t.$r.pair"
    done
    awk -v q="$(p99_of "query.$r")" -v r="$(p99_of "refusal.$r")" '{ v[NR] = $1 }
        END { printf "%.4f\n", q / v[1] > "'"$dir/query.$r.p99ratio"'"
              printf "%.4f\n", r / v[2] > "'"$dir/refusal.$r.p99ratio"'" }' \
        "$dir/bare.q.$r.pair" "$dir/bare.r.$r.pair"
done
for n in query refusal; do # NAME.*: the round whose p99 ratio is the median
    t=${n:0:1}
    m=$(for r in $(seq 1 "$rounds"); do echo "$(cat "$dir/$n.$r.p99ratio") $r"; done |
        bench_median | cut -d' ' -f2)
    for f in paced runq lag p99ratio; do cp "$dir/$n.$m.$f" "$dir/$n.$f"; done
    cut -d' ' -f1 "$dir/bare.$t.$m.pair" >"$dir/bare.$t.p99"
    cat "$dir/bare.${t}0.$m.runq" "$dir/bare.${t}1.$m.runq" |
        awk '{ s += $1 } END { printf "%.2f\n", s / NR }' >"$dir/bare.$t.runq"
done
# The bare server as loaded as the targets (half its own maximum, a higher rate than theirs): how
# much of a target's tail is only its load, a server's p99 on this machine growing with it (the
# backlog a stall leaves takes longer to clear). Its median p99, and each target's median ratio.
for r in $(seq 1 "$rounds"); do p99_of "bare.h.$r"; done | bench_median >"$dir/bare.h.p99"
for n in query refusal; do
    for r in $(seq 1 "$rounds"); do
        awk -v a="$(p99_of "$n.$r")" -v b="$(p99_of "bare.h.$r")" 'BEGIN {printf "%.2f\n", a / b}'
    done | bench_median >"$dir/$n.hratio"
done
# The machine's own spread: over every pair of bare runs, the median and the largest ratio.
cat "$dir"/bare.[qr].[0-9]*.pair | awk '{ print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { printf "%.2f %.2f\n", v[int((NR + 1) / 2)], v[NR] }' \
        >"$dir/bare.spread"

# ---- answers by status, from the services' own counters (wrk tells only 2xx or not) ----
# statuses URL ROUTE: "STATUS COUNT" lines of ROUTE
statuses() {
    curl -fsS "$1/metrics" | awk -v r="route=\"$2\"" '
        /^quan_http_requests_total\{/ && index($0, r) {
            match($0, /status="[0-9]+"/); print substr($0, RSTART + 8, RLENGTH - 9), $NF }'
}
check_statuses() { # URL ROUTE STATUS: fails if ROUTE answered anything else
    local other
    other=$(statuses "$1" "$2" | awk -v s="$3" '$1 != s')
    [ -z "$other" ] || fail "$2 answered other statuses than $3: $(echo "$other" | tr '\n' ' ')"
}
check_statuses "$base" /api/engine/user-coupon/redeem 409
check_statuses "$base" /api/engine/coupon-template/query 200
check_statuses "$base" /livez 200
check_statuses "http://127.0.0.1:$st_port" /api/settlement/coupon-query 200
for r in $(seq 1 "$rounds"); do
    for f in "$dir/bare.$r".[0-9].non2xx "$dir/livez.$r.non2xx" "$dir/query.$r.non2xx" \
        "$dir/large.$r.non2xx" "$dir/cq.$r.non2xx"; do
        [ "$(cat "$f")" = 0 ] || fail "$(basename "$f" .non2xx): $(cat "$f") non-2xx answers"
    done
    refused=$(awk '/requests in/ {print $1}' "$dir/refusal.$r.out")
    [ "$(cat "$dir/refusal.$r.non2xx")" = "$refused" ] ||
        fail "refusal, round $r: $(cat "$dir/refusal.$r.non2xx") of $refused answers were refusals"
done
refused=$(awk '/requests in/ {print $1}' "$dir/refusal.out")
for f in "$dir"/bare.*.paced "$dir"/query.*.paced "$dir"/refusal.*.paced; do
    grep -q ' non2xx=0$' "$f" || fail "$(basename "$f"): $(cat "$f")"
done

# ---- the table ----
ms() { # wrk's 850.00us / 1.20ms / 1.02s, in ms
    awk '{ v = $1 + 0; if ($1 ~ /us$/) v /= 1000; else if ($1 ~ /[0-9]s$/) v *= 1000
           printf "%.2fms", v }' "$1"
}
row() { # NAME LABEL [NOTE]: the median round's figures, the ratio against its own baseline
    local x=1 cx=1 each="" r
    [ "$1" = bare ] || x=$(cat "$dir/$1.ratio")
    [ "$1" = bare ] || cx=$(cat "$dir/$1.cpuratio")
    for r in $(seq 1 "$rounds"); do
        [ "$1" = bare ] && each+=" $(printf '%.0f' "$(cat "$dir/bare.$r.rate")")" ||
            each+=" $(printf '%.2f' "$(cat "$dir/$1.$r.ratio")")"
    done
    printf '%-44s %8.0f %8.2f %8s %8s %8.1f %6.2f %7.1f  rounds:%s%s\n' "$2" "$(cat "$dir/$1.rate")" \
        "$x" "$(ms "$dir/$1.p50")" "$(ms "$dir/$1.p99")" "$(cat "$dir/$1.cpu")" "$cx" \
        "$(cat "$dir/$1.sys")" "$each" "${3:+  $3}"
}
ratio() { awk -v a="$(cat "$dir/$1.ratio")" 'BEGIN {printf "%.2f", a}'; }
verdict() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN {
    ok = op == ">=" ? v >= t : v <= t; printf "%s %s %s %s", v, ok ? "ok" : "MISSED:", op, t }'; }
printf '%-44s %8s %8s %8s %8s %8s %6s %7s\n' \
    "hot path ($rounds rounds of ${seconds}s, $conns conns)" \
    "req/s" "x bare" "p50" "p99" "cpu µs" "x bare" "kernel"
row bare "bare evhttp, fixed JSON"
row livez "GET /livez"
row query "GET /coupon-template/query (cache hit)"
row refusal "POST /redeem sold out (409)" "($refused answers, all 409)"
row large "bare evhttp, a $cq_bytes-byte body"
row cq "settlement coupon-query, 200 coupons" "($n_avail available, $n_notav not)"
printf 'paced at half max (%s rounds of %ss, open loop; the round whose p99 ratio is the median):\n' \
    "$rounds" "$paced_seconds"
printf '    query %s/s p50/p99 %s/%s ms, bare around it p99 %s ms; refusal %s/s p50/p99 %s/%s ms, bare %s ms\n' \
    "$(pv query rate_achieved)" "$(pv query p50_ms)" "$(pv query p99_ms)" "$(cat "$dir/bare.q.p99")" \
    "$(pv refusal rate_achieved)" "$(pv refusal p50_ms)" "$(pv refusal p99_ms)" "$(cat "$dir/bare.r.p99")"
read -r spread_median spread_max <"$dir/bare.spread"
printf '    the bare server against itself (the larger p99 of a pair over the smaller): median %s, largest %s\n' \
    "$spread_median" "$spread_max"
for r in $(seq 1 "$rounds"); do
    printf '    round %s, p99 ms: bare %s, query %s, bare %s; bare %s, refusal %s, bare %s; bare at half its max %s\n' \
        "$r" "$(p99_of "bare.q0.$r")" "$(p99_of "query.$r")" "$(p99_of "bare.q1.$r")" \
        "$(p99_of "bare.r0.$r")" "$(p99_of "refusal.$r")" "$(p99_of "bare.r1.$r")" "$(p99_of "bare.h.$r")"
done
printf '    the bare server at half its own max (%s/s, as loaded as the targets at theirs): p99 %s ms;\n' \
    "$(pv bare.h.1 rate_achieved)" "$(cat "$dir/bare.h.p99")"
printf '      query and refusal against it (median of rounds): %s / %s\n' \
    "$(cat "$dir/query.hratio")" "$(cat "$dir/refusal.hratio")"
printf '    in those runs, waiting for a core (ms a second): bare %s / %s, engine %s / %s; the engine loop'"'"'s\n' \
    "$(cat "$dir/bare.q.runq")" "$(cat "$dir/bare.r.runq")" "$(cat "$dir/query.runq")" "$(cat "$dir/refusal.runq")"
printf '    lag p99 (quan_loop_lag_seconds, 20 ms timer): query <= %s ms, refusal <= %s ms\n' \
    "$(cat "$dir/query.lag")" "$(cat "$dir/refusal.lag")"
for f in "$dir"/bare.*.paced "$dir"/query.*.paced "$dir"/refusal.*.paced; do
    e=$(pv "$(basename "$f" .paced)" errors)
    [ "$e" = 0 ] || echo "WARNING: paced $(basename "$f" .paced): $e requests unanswered (errors)"
done
for f in "$dir"/*.[0-9].out "$dir"/*.[0-9].[0-9].out; do
    if grep -q 'Socket errors' "$f"; then
        echo "WARNING: $(basename "$f" .out): $(grep 'Socket errors' "$f" | sed 's/^ *//')"
    fi
done
echo "targets: query >= 0.65 ($(verdict "$(ratio query)" 0.65 '>=')), refusal >= 0.60 ($(verdict \
    "$(ratio refusal)" 0.60 '>=')), livez >= 0.90 ($(verdict "$(ratio livez)" 0.90 '>=')),"
echo "         coupon-query >= 0.60 ($(verdict "$(ratio cq)" 0.60 '>=')); against bare sending as many bytes: \
$(awk -v a="$(cat "$dir/cq.rate")" -v b="$(cat "$dir/large.rate")" 'BEGIN {printf "%.2f", a / b}')
         (the kernel's part of an answer: coupon-query $(cat "$dir/cq.sys") µs, of its $(cat "$dir/cq.cpu");\
 bare sending as many bytes $(cat "$dir/large.sys") µs, of its $(cat "$dir/large.cpu")),"
# The paced tails against the bare runs around them.
echo "         paced p99 <= 1.5 x bare's (query $(verdict "$(awk -v x="$(cat "$dir/query.p99ratio")" \
    'BEGIN {printf "%.2f", x}')" 1.5 '<='), refusal $(verdict "$(awk -v x="$(cat "$dir/refusal.p99ratio")" \
    'BEGIN {printf "%.2f", x}')" 1.5 '<='); the bare server against itself: $spread_median, at most $spread_max)"
# Against the bare runs on either side of it in its own round, as the table's ratio: the bare
# server of another round may have had a faster or slower machine.
cq_bare=$(awk -v a="$(cat "$dir/cq.rate")" -v x="$(cat "$dir/cq.ratio")" 'BEGIN {printf "%.0f", a / x}')
bench_goal "settlement coupon-query, 200 coupons" "$(cat "$dir/cq.rate")" /s \
    "bare evhttp, its round" "$cq_bare" ">=" 0.6
# Each beside what the same measurement gives the bare server against itself in this run.
bench_goal "paced p99 at half load, query" "$(pv query p99_ms)" ms \
    "bare around it (bare/bare ${spread_median}x)" "$(cat "$dir/bare.q.p99")" "<=" 1.5
bench_goal "paced p99 at half load, refusal" "$(pv refusal p99_ms)" ms \
    "bare around it (bare/bare ${spread_median}x)" "$(cat "$dir/bare.r.p99")" "<=" 1.5
