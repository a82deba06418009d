#!/usr/bin/env bash
# bench/gateway_instr.sh — what the API gateway costs per proxied request against what the engine
# behind it costs for the same request, side by side in one run: the template query (a cache hit
# in the engine) sent straight to the engine, then through the gateway (deploy/local/gateway.sh's
# configuration, every rate limit on, with rates no client of this run reaches, so each limit is
# looked up and none refuses). Two figures:
#   instructions  valgrind's callgrind, nginx (one process: master_process off) and quan-engine
#                 each under it, counters zeroed, wrk for LOAD_SECONDS s, counters dumped: the same
#                 count on a busy machine as on a quiet one. The engine's timers (leases, sweeps)
#                 run during the load too: their instructions over an idle stretch as long as the
#                 load are measured and taken away first
#   CPU seconds   the same processes natively (nginx with its two workers) for SECONDS s of wrk:
#                 utime + stime from /proc per request; noisy on a shared machine. Then both at
#                 the same paced rate, the goal line: the gateway at most twice the engine
# and, for the gateway, the same with a new token on every request (each verified afresh: the
# cost of a token the gateway has not seen yet; GW_INSTR_TOKENS of them, 80 000, more than a
# run sends).
#   bench/gateway_instr.sh              about seven minutes (valgrind runs the servers ~50x slower)
#   GW_INSTR_SECONDS=8 (native runs), GW_INSTR_LOAD_SECONDS=30 (each run under callgrind);
#   GW_INSTR_ROUNDS=3 (paced pairs); GW_INSTR_CALLGRIND=0 stops after the native runs (2 min);
#   GW_INSTR_PROFILE=DIR keeps each run's callgrind files there (callgrind_annotate reads them)
# Not part of make bench. Needs valgrind and wrk (deploy/local/deps.sh installs both).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
for tool in valgrind callgrind_control wrk; do
    command -v "$tool" >/dev/null || { echo "gateway_instr.sh: needs $tool" >&2; exit 1; }
done
seconds=${GW_INSTR_SECONDS:-8}
load_seconds=${GW_INSTR_LOAD_SECONDS:-30}
conns=8
shop=1810714735922956666
tpl=900000000000000001
uid=42

bench_init quan-gw-instr
gw=$dir/gateway
gwport=$(bench_free_port)
vpids=()
gw_cleanup() {
    local p
    for p in "${vpids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    deploy/local/gateway.sh stop "$gw" >/dev/null 2>&1 || true
    bench_cleanup
}
trap gw_cleanup EXIT

bench_template "$tpl" "$shop" 1000000
q="/api/engine/coupon-template/query?shopNumber=$shop&couponTemplateId=$tpl"
# every limit on, none reached by this run
limits=(QUAN_GATEWAY_RATE_USER='100000r/s burst=100000' QUAN_GATEWAY_RATE_ADDR='100000r/s burst=100000'
    QUAN_GATEWAY_RATE_MERCHANT='100000r/s burst=100000' QUAN_GATEWAY_CONN_ADDR=4096)
gw_env=("${limits[@]}" QUAN_GATEWAY_PORT="$gwport" QUAN_GATEWAY_ENGINE="127.0.0.1:$port")

# The token of user $uid, and a wrk script sending a new token each request (minted beforehand).
secret='gw-instr-secret-0123456789abcdef'
token=$(QUAN_GATEWAY_JWT_SECRET=$secret build/bin/quan-token --user "$uid")
# As quan-token makes them (header, then sub and exp), HMAC-SHA256 under the same key; more
# than a run sends, so that each is new to the gateway.
ntok=${GW_INSTR_TOKENS:-80000}
/usr/bin/python3 - "$secret" "$ntok" >"$dir/tokens" <<'PY'
import base64, hashlib, hmac, json, sys, time
key, n = sys.argv[1].encode(), int(sys.argv[2])
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
exp = int(time.time()) + 3600
for i in range(n):
    body = b64(json.dumps({"sub": str(1000 + i), "exp": exp}, separators=(",", ":")).encode())
    sig = hmac.new(key, ("%s.%s" % (head, body)).encode(), hashlib.sha256).digest()
    print("%s.%s.%s" % (head, body, b64(sig)))
PY
cat >"$dir/fresh.lua" <<EOF
local toks = {}
for l in io.lines("$dir/tokens") do toks[#toks + 1] = l end
local i = 0
request = function()
    i = i % #toks + 1
    return wrk.format("GET", "$q", {["Authorization"] = "Bearer " .. toks[i]})
end
EOF

wait_http() { # URL: until it answers
    for _ in $(seq 1 2400); do
        curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "gateway_instr.sh: $1 does not answer" >&2
    exit 1
}
nginx_args() { echo -p "$gw/" -c "$gw/nginx.conf" -e "$gw/logs/error.log"; }
# The gateway's configuration as gateway.sh writes it (started and stopped once).
env "${gw_env[@]}" QUAN_GATEWAY_JWT_SECRET=$secret deploy/local/gateway.sh start "$gw" >/dev/null 2>&1
deploy/local/gateway.sh stop "$gw" >/dev/null 2>&1

cpu_of() { # PID...: "utime stime" in clock ticks
    local p u=0 s=0 f
    for p in "$@"; do
        read -r -a f <"/proc/$p/stat"
        u=$((u + f[13]))
        s=$((s + f[14]))
    done
    echo "$u $s"
}
wrk_count() { # FILE: requests wrk sent (fails on any non-2xx)
    if grep -q 'Non-2xx' "$1"; then
        echo "gateway_instr.sh: non-2xx answers:" >&2
        cat "$1" >&2
        exit 1
    fi
    awk '/requests in/ {print $1}' "$1"
}
hz=$(getconf CLK_TCK)

# ---------------------------------------------------------------- native: CPU seconds
echo "== CPU per request (native, wrk -t1 -c$conns ${seconds}s; user+system; noisy on a shared machine)"
# shellcheck disable=SC2119 # no extra settings
bench_start_engine
env "${gw_env[@]}" QUAN_GATEWAY_JWT_SECRET=$secret deploy/local/gateway.sh start "$gw" >/dev/null 2>&1
gwpids=$(pgrep -d' ' -s "$(awk '{print $1}' "$gw/gateway.pid")" nginx)
# shellcheck disable=SC2086 # $gwpids: a list of pids, split on purpose
native() { # LABEL URL [wrk args...]: CPU per request, user + system (the kernel's part)
    local label=$1 url=$2 e0 g0 e1 g1 n
    shift 2
    wrk -t1 -c"$conns" -d2s "$@" "$url" >/dev/null 2>&1 # warm
    e0=$(cpu_of "$engine_pid"); g0=$(cpu_of $gwpids)
    wrk -t1 -c"$conns" -d"${seconds}s" "$@" "$url" >"$dir/native.out" 2>&1
    e1=$(cpu_of "$engine_pid"); g1=$(cpu_of $gwpids)
    n=$(wrk_count "$dir/native.out")
    awk -v l="$label" -v n="$n" -v s="$seconds" -v e0="$e0" -v e1="$e1" -v g0="$g0" -v g1="$g1" \
        -v hz="$hz" 'BEGIN {
            split(e0, a); split(e1, b); eu = b[1] - a[1]; es = b[2] - a[2]
            split(g0, a); split(g1, b); gu = b[1] - a[1]; gs = b[2] - a[2]
            f = 1e6 / hz / n
            printf "%-34s %6.0f req/s  engine %5.1f (%4.1f+%4.1f) us/req  gateway %5.1f (%4.1f+%4.1f) us/req\n",
                l, n / s, (eu + es) * f, eu * f, es * f, (gu + gs) * f, gu * f, gs * f }'
}
native "straight to the engine" "http://127.0.0.1:$port$q" -H "X-User-Id: $uid"
native "through the gateway" "http://127.0.0.1:$gwport$q" -H "Authorization: Bearer $token"
gw_rate=$(awk -v n="$(wrk_count "$dir/native.out")" -v s="$seconds" 'BEGIN { printf "%d", n / s }')
native "through the gateway, new tokens" "http://127.0.0.1:$gwport$q" -s "$dir/fresh.lua"

# The runs above each go as fast as they can, so the engine alone answers at three times the
# gateway's rate and reads several requests a wakeup where the gateway reads one: CPU per
# request falls as the rate rises, and the two are not compared at the same load. Here both get
# the same requests a second (quan-bench-paced, open loop, 8 connections): 70 % of the rate the
# gateway reached above, which both keep up with. Rounds alternate, straight then through, and
# each side's median is taken (the machine is shared: a round can be slowed by anything).
rate=$(( gw_rate * 7 / 10 ))
rounds=${GW_INSTR_ROUNDS:-3}
echo "== CPU per request at the same rate ($rate requests/s paced, ${seconds}s, $rounds rounds)"
# shellcheck disable=SC2086 # $gwpids: a list of pids, split on purpose
paced() { # URL HEADER: "engine-us gateway-us" per request of one run
    local url=$1 hdr=$2 e0 g0 e1 g1 out n
    build/bin/quan-bench-paced "$url" "$rate" 1 "$conns" "$hdr" >/dev/null # warm
    e0=$(cpu_of "$engine_pid"); g0=$(cpu_of $gwpids)
    out=$(build/bin/quan-bench-paced "$url" "$rate" "$seconds" "$conns" "$hdr")
    e1=$(cpu_of "$engine_pid"); g1=$(cpu_of $gwpids)
    case $out in *" errors=0 non2xx=0"*) ;; *) echo "gateway_instr.sh: paced run failed: $out" >&2; exit 1 ;; esac
    n=$(echo "$out" | sed -n 's/^rate_achieved=\([0-9]*\).*/\1/p')
    awk -v n="$((n * seconds))" -v e0="$e0" -v e1="$e1" -v g0="$g0" -v g1="$g1" -v hz="$hz" 'BEGIN {
        split(e0, a); split(e1, b); e = b[1] - a[1] + b[2] - a[2]
        split(g0, a); split(g1, b); g = b[1] - a[1] + b[2] - a[2]
        printf "%.1f %.1f\n", e * 1e6 / hz / n, g * 1e6 / hz / n }'
}
: >"$dir/paced.straight"; : >"$dir/paced.gateway"
for r in $(seq 1 "$rounds"); do
    read -r e _ < <(paced "http://127.0.0.1:$port$q" "X-User-Id: $uid")
    read -r eg g < <(paced "http://127.0.0.1:$gwport$q" "Authorization: Bearer $token")
    echo "$e" >>"$dir/paced.straight"; echo "$g" >>"$dir/paced.gateway"
    printf 'round %d: engine straight %5.1f us/req; through the gateway: engine %5.1f, gateway %5.1f us/req\n' \
        "$r" "$e" "$eg" "$g"
done
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
bench_goal "gateway CPU per cached-token query, same rate" "$(median "$dir/paced.gateway")" us/req \
    "engine straight" "$(median "$dir/paced.straight")" "<=" 2
deploy/local/gateway.sh stop "$gw" >/dev/null 2>&1
bench_stop_engine
[ "${GW_INSTR_CALLGRIND:-1}" = 1 ] || exit 0

# ---------------------------------------------------------------- callgrind: instructions
echo "== instructions per request (callgrind, wrk -t1 -c$conns ${load_seconds}s each)"
env QUAN_HTTP_PORT="$port" QUAN_HTTP_BIND=127.0.0.1 QUAN_LUA_DIR="$root/lua-scripts" \
    QUAN_LOG_LEVEL=warn valgrind --tool=callgrind --callgrind-out-file="$dir/engine.cg" \
    build/bin/quan-engine >"$dir/engine-vg.log" 2>&1 &
evg=$!
vpids+=("$evg")
# shellcheck disable=SC2046
env QUAN_GATEWAY_JWT_SECRET=$secret valgrind --tool=callgrind --callgrind-out-file="$dir/gw.cg" \
    /usr/sbin/nginx $(nginx_args) -g 'daemon off; master_process off;' >"$dir/gw-vg.log" 2>&1 &
gvg=$!
vpids+=("$gvg")
wait_http "http://127.0.0.1:$port/readyz"
wait_http "http://127.0.0.1:$gwport/console/"

instr() { # PID FILE-PREFIX: instructions since the counters were zeroed; zeroes them
    local f
    callgrind_control -d "$1" >/dev/null 2>&1
    sleep 0.5
    f=$(find "$dir" -name "$2*" -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2)
    awk '/^(summary|totals):/ {print $2; exit}' "$f"
    callgrind_control -z "$1" >/dev/null 2>&1
}
# the instructions a process runs per second with nothing to do (the engine's timers)
wrk -t1 -c"$conns" -d5s "http://127.0.0.1:$gwport$q" -H "Authorization: Bearer $token" >/dev/null 2>&1
instr "$evg" engine.cg >/dev/null
instr "$gvg" gw.cg >/dev/null
t0=$(date +%s.%N)
sleep "$load_seconds"
idle_e=$(instr "$evg" engine.cg)
idle_g=$(instr "$gvg" gw.cg)
idle_s=$(echo "$(date +%s.%N) - $t0" | bc)
measure() { # LABEL URL [wrk args...]: per request, the idle rate taken away
    local label=$1 url=$2 t0 e g s n
    shift 2
    instr "$evg" engine.cg >/dev/null
    instr "$gvg" gw.cg >/dev/null
    t0=$(date +%s.%N)
    wrk -t1 -c"$conns" -d"${load_seconds}s" "$@" "$url" >"$dir/cg.out" 2>&1
    e=$(instr "$evg" engine.cg)
    g=$(instr "$gvg" gw.cg)
    s=$(echo "$(date +%s.%N) - $t0" | bc)
    n=$(wrk_count "$dir/cg.out")
    if [ -n "${GW_INSTR_PROFILE:-}" ]; then
        mkdir -p "$GW_INSTR_PROFILE"
        for f in engine.cg gw.cg; do
            cp "$(find "$dir" -name "$f*" -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2)" \
                "$GW_INSTR_PROFILE/${label// /-}.$f"
        done
    fi
    # the engine's figure of the first run (straight to it) is what the others are held to
    awk -v l="$label" -v n="$n" -v e="$e" -v g="$g" -v s="$s" -v ie="$idle_e" -v ig="$idle_g" \
        -v is="$idle_s" -v ref="$dir/engine_ref" 'BEGIN {
            pe = (e - ie * s / is) / n; pg = (g - ig * s / is) / n
            if ((getline r < ref) <= 0) { r = pe; print pe > ref }
            printf "%-34s %6d requests  engine %7.0f  gateway %7.0f instructions/req", l, n, pe, pg
            if (pg > 1000) printf "  (gateway/engine straight %.2f)", pg / r
            printf "\n" }'
}
measure "straight to the engine" "http://127.0.0.1:$port$q" -H "X-User-Id: $uid"
measure "through the gateway" "http://127.0.0.1:$gwport$q" -H "Authorization: Bearer $token"
measure "through the gateway, new tokens" "http://127.0.0.1:$gwport$q" -s "$dir/fresh.lua"
echo "(idle: engine $(echo "$idle_e / $idle_s" | bc) and gateway $(echo "$idle_g / $idle_s" | bc) instructions/s, taken away)"
