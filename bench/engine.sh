#!/usr/bin/env bash
# Engine benchmarks, standalone like bench/run.sh: its own PostgreSQL/Redis/RabbitMQ
# in a temporary directory, one quan-engine, the templates it needs written directly into
# PostgreSQL and Redis, then, each in this one run beside the bare /livez rate:
#   refusals   POST /redeem on a sold-out template (409 B000100)   target >= 0.60 x /livez
#   claims     POST /redeem accepted (200), one new user per request: Redis, then the coupon's
#              transactions in PostgreSQL (fsync on; concurrent claims of the template share
#              them), all before the answer; run last, since each leaves a check due 30 s later
#                                                      target >= 0.25 x accepted redeem-mq
#   query      GET /coupon-template/query, cache hits              target >= 0.65 x /livez
#   redeem-mq  accepted MQ claims (202), one new user per request, on a replica that only
#              accepts (QUAN_CLAIM_CONSUMERS=0: like the raw publish, nothing consumes on these
#              two cores)                          its ratio to the raw publish: a figure
#   mq+drain   the same while this engine also writes the claims into PostgreSQL
#   curve      redeem-mq on that replica with 256 and 1,024 connections (accepted/s, p99)
#   raw        quan-bench-claims publish-rate: publish-with-confirms, 256 pipelined confirms;
#              and with 64 (BENCH_CONNECTIONS) in flight, the claims' own concurrency: a claim's
#              202 waits for its confirm, so 64 clients keep at most 64 claims in flight;
#              and packs of as many claims, as long, as the accepting replica's publisher made,
#              one in flight as it sends them: the broker's own CPU per claim at that size
#   drain      a backlog of MQ claims written into PostgreSQL: the backlog is what the engine
#              itself published under /redeem-mq load (claims packed as they came) while no
#              replica consumed (QUAN_CLAIM_CONSUMERS=0, 2 x BENCH_SECONDS of load, so that
#              start-up weighs little); then one engine writes it
#                                                                  target >= 20000 coupons/s
#   copy       the baseline: a PostgreSQL COPY of as many user coupons as the drain wrote into
#              the same sharded tables (bench/lib.sh bench_copy_coupons, as bench/distribution.sh);
#              the drain's multiple of it: a figure
#   one-tx     the same coupons one transaction each (quan-bench-claims pg-one-tx), and the
#              drain's multiple of it                              target >= 7x
#   drain-1    for comparison, a backlog of one claim per message (quan-bench-claims backlog):
#              the broker's own cost per message dominates (consume-rate: its ceiling)
#   exchange   POST /exchange, a new user and a new code each, on one template (the codes written
#              directly into t_exchange_code), against accepted /redeem on another: the same
#              claim with a code row to mark; no goal yet, printed with the CPU each used
# and the CPU seconds each program used during the refusals, the accepted MQ claims, the drain
# and the COPY, with how busy the whole machine was meanwhile; each write path's CPU per item by
# program ("cost:" lines), and the goal that carries to a deployment as it is: Redis' CPU per
# /redeem-mq claim over its life, accepted and drained (<= 20 us: one master carries a sale).
#   BENCH_SECONDS=10 BENCH_CONNECTIONS=64 BENCH_BACKLOG1=50000 bench/engine.sh
# For a look inside the drain: BENCH_DRAIN_ENV="QUAN_LOG_LEVEL=debug" (settings of the draining
# engine only; debug logs each batch's steps into $dir/engine.log, kept as BENCH_KEEP_LOG),
# BENCH_PERF=/tmp/drain.perf (perf record -a -g during the drain).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${BENCH_SECONDS:-10}
conns=${BENCH_CONNECTIONS:-64}
backlog1=${BENCH_BACKLOG1:-50000}
onetx=${BENCH_ONE_TX:-3000}

[ -x build/bin/quan-bench-claims ] || { echo "build first (make)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-bench-engine
start_engine() { bench_start_engine "$@"; }
stop_engine() { bench_stop_engine; }

# ---- data: one shop, five templates, written directly (DB row + cache hash) ----
shop=1810714735922956666
read -r tds ttable < <(bench_shard t_coupon_template 16 "$shop")
dsn_var="QUAN_DS${tds}_DSN"
tpl() { bench_template "$1" "$shop" "$2"; } # id stock
t_sold=900000000000000001
t_hit=900000000000000002
t_mq=900000000000000003
t_drain=900000000000000004
t_base=900000000000000005
t_drain1=900000000000000006
t_copy=900000000000000007 # no template row: COPY checks none
t_sync=900000000000000008
t_exch=900000000000000009
tpl $t_sold 0
tpl $t_hit 100
tpl $t_mq 20000000
tpl $t_drain 20000000
tpl $t_base 20000000
tpl $t_drain1 20000000
tpl $t_sync 20000000
tpl $t_exch 20000000

cat >"$dir/refuse.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"source":0,"shopNumber":"$shop","couponTemplateId":"$t_sold"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-User-Id"] = "42"
LUA
# mq_lua FILE TEMPLATE USER0: one new user per request
mq_lua() {
    cat >"$1" <<LUA
local n = 0
wrk.method = "POST"
wrk.body = '{"source":0,"shopNumber":"$shop","couponTemplateId":"$2"}'
wrk.headers["Content-Type"] = "application/json"
request = function()
    n = n + 1
    wrk.headers["X-User-Id"] = tostring($3 + n)
    return wrk.format()
end
LUA
}
mq_lua "$dir/mq.lua" $t_mq 5000000000
mq_lua "$dir/backlog.lua" $t_drain 6000000000
mq_lua "$dir/sync.lua" $t_sync 7000000000

# run NAME URL [SCRIPT]: rate in $dir/NAME.rate, p99 in $dir/NAME.p99 (bench/lib.sh).
run() { bench_wrk "$@"; }
# run_cpu NAME URL [SCRIPT]: run, with the CPU each program used meanwhile in $dir/cpu.NAME.{0,1}
run_cpu() {
    bench_cpu_by_name >"$dir/cpu.$1.0"
    run "$@"
    bench_cpu_by_name >"$dir/cpu.$1.1"
}
answers() { awk '/requests in/ {print $1}' "$dir/$1.out"; } # NAME: how many answers wrk got

start_engine
wrk -t1 -c"$conns" -d2s "$base/livez" >/dev/null 2>&1 # warm-up
run livez "$base/livez"
run_cpu refuse "$base/api/engine/user-coupon/redeem" "$dir/refuse.lua"
cat >"$dir/get.lua" <<'LUA'
wrk.headers["X-User-Id"] = "42"
LUA
run query "$base/api/engine/coupon-template/query?shopNumber=$shop&couponTemplateId=$t_hit" \
    "$dir/get.lua"
run mq "$base/api/engine/user-coupon/redeem-mq" "$dir/mq.lua"
raw=$(build/bin/quan-bench-claims publish-rate "$seconds" 256)
raw_conns=$(build/bin/quan-bench-claims publish-rate "$seconds" "$conns")
refuse_ok=$(awk '/requests in/ {print $1}' "$dir/refuse.out")

# ---- drain: a backlog the engine publishes while nobody consumes, then one engine writes it ----
stock_of() { psql "${!dsn_var}" -qAtX -c "SELECT stock FROM $ttable WHERE id = $1"; }
queued() { $QUAN_INFRA_RABBITMQCTL list_queues name messages | awk '$1 == "quan.engine.redeem" {print $2}'; }
coupons_of() {
    local n=0 c ds dsn q
    for ds in 0 1; do
        dsn="QUAN_DS${ds}_DSN"
        q=$(for i in $(seq $((ds * 16)) $((ds * 16 + 15))); do
            printf 'SELECT count(*) FROM t_user_coupon_%d WHERE coupon_template_id = %s UNION ALL ' "$i" "$1"
        done)
        c=$(psql "${!dsn}" -qAtX -c "SELECT sum(count) FROM (${q% UNION ALL }) x(count)")
        n=$((n + c))
    done
    echo "$n"
}
# drain NAME TEMPLATE CLAIMS [VAR=v ...]: an engine (with these extra settings) starts on the
# backlog; $dir/NAME.rate gets CLAIMS divided by the seconds until CLAIMS more coupons of
# TEMPLATE are in the database; $dir/cpu.NAME.{0,1} the CPU by program before and after.
drain() {
    local name=$1 tpl=$2 n=$3 s0 t0 t1 perf=
    shift 3
    s0=$(stock_of "$tpl")
    redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
    bench_cpu_by_name >"$dir/cpu.$name.0"
    t0=$(date +%s.%N) # the engine's start-up counts
    start_engine "$@"
    if [ "$name" = main ] && [ -n "${BENCH_PERF:-}" ]; then
        perf record -a -g -F 499 -o "$BENCH_PERF" -- sleep "${BENCH_PERF_SECONDS:-8}" >/dev/null 2>&1 &
        perf=$!
    fi
    t1=$(build/bin/quan-bench-claims wait-stock "$tpl" $shop $((s0 - n)) 300)
    bench_cpu_by_name >"$dir/cpu.$name.1"
    redis-cli -p "$QUAN_REDIS_PORT" INFO commandstats >"$dir/redis.$name"
    bench_redis_rewrites >"$dir/rewrites.$name"
    [ -z "$perf" ] || wait "$perf" || true
    sleep 1
    stop_engine
    awk -v n="$n" -v a="$t1" -v b="$t0" 'BEGIN {printf "%.0f", n / (a - b)}' >"$dir/$name.rate"
}
for _ in $(seq 1 600); do [ "$(queued)" = 0 ] && break; sleep 0.1; done # the mq run's claims
stop_engine
start_engine QUAN_CLAIM_CONSUMERS=0
redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
curl -fsS "$base/metrics" >"$dir/metrics.backlog.0"
seconds=$((seconds * 2)) run_cpu backlog "$base/api/engine/user-coupon/redeem-mq" "$dir/backlog.lua"
curl -fsS "$base/metrics" >"$dir/metrics.backlog.1"
redis-cli -p "$QUAN_REDIS_PORT" INFO commandstats >"$dir/redis.backlog"
# The packs that run made, as the broker holds them: claims, messages and their bytes.
pack_claims=$((20000000 - $(redis-cli -p "$QUAN_REDIS_PORT" HGET "quan:tpl:{$t_drain}" stock)))
read -r pack_msgs pack_bytes < <($QUAN_INFRA_RABBITMQCTL list_queues name messages message_bytes |
    awk '$1 == "quan.engine.redeem" {print $2, $3}') || { pack_msgs=0; pack_bytes=0; }
# The curve: the same replica with more clients at once (their claims join the backlog).
mq_lua "$dir/curve256.lua" $t_drain 6500000000
mq_lua "$dir/curve1024.lua" $t_drain 6800000000
conns=256 run curve256 "$base/api/engine/user-coupon/redeem-mq" "$dir/curve256.lua"
conns=1024 run curve1024 "$base/api/engine/user-coupon/redeem-mq" "$dir/curve1024.lua"
stop_engine
# The broker alone on packs of that size and length, one in flight: what the accepting run's
# publisher sends (it waits for a pack's confirm while the next one gathers).
pack_size=$(awk -v c="$pack_claims" -v m="$pack_msgs" 'BEGIN {printf "%d", m ? c / m + 0.5 : 1}')
claim_bytes=$(awk -v b="$pack_bytes" -v c="$pack_claims" 'BEGIN {printf "%d", c ? b / c : 0}')
bench_cpu_by_name >"$dir/cpu.packs.0"
packs_rate=$(build/bin/quan-bench-claims publish-rate "$seconds" 1 "$pack_size" "$claim_bytes")
bench_cpu_by_name >"$dir/cpu.packs.1"
packs_claims=$(awk -v r="$packs_rate" -v s="$seconds" -v k="$pack_size" 'BEGIN {printf "%d", r * s * k}')
backlog=$((20000000 - $(redis-cli -p "$QUAN_REDIS_PORT" HGET "quan:tpl:{$t_drain}" stock)))
backlog_msgs=$(queued)
# shellcheck disable=SC2086 # BENCH_DRAIN_ENV: words, VAR=v each
drain main $t_drain "$backlog" ${BENCH_DRAIN_ENV:-}
drain_rate=$(cat "$dir/main.rate")
coupons=$(coupons_of $t_drain)
[ -z "${BENCH_KEEP_LOG:-}" ] || cp "$dir/engine.log" "$BENCH_KEEP_LOG"
# The baseline, in the state the drain left (its coupons in the tables; emptied afterwards).
bench_cpu_by_name >"$dir/cpu.copy.0"
copy_rate=$(bench_copy_coupons "$backlog" $t_copy $shop)
bench_cpu_by_name >"$dir/cpu.copy.1"

build/bin/quan-bench-claims backlog $t_drain1 $shop 7000000000 "$backlog1" >/dev/null
drain one $t_drain1 "$backlog1"
drain1_rate=$(cat "$dir/one.rate")
build/bin/quan-bench-claims backlog $t_drain1 $shop 7500000000 "$backlog1" >/dev/null
consume_raw=$(build/bin/quan-bench-claims consume-rate quan.engine.redeem "$backlog1" 1000)
onetx_rate=$(build/bin/quan-bench-claims pg-one-tx $t_base $shop 8000000000 "$onetx")
# Last: each accepted /redeem leaves a check due 30 s later (QUAN_CLAIM_WALLET_CHECK_MS), which
# would land in the MQ runs' queue and the drain's backlog.
start_engine
run_cpu sync "$base/api/engine/user-coupon/redeem" "$dir/sync.lua"
# Exchange codes: valid ones under the engine's QUAN_CODE_SECRET (the tests' make_code, the
# same derivation as excode.c), more than a run can redeem, each to a new user.
PYTHONPATH=integration-tests /usr/bin/python3 - "${BENCH_CODES:-60000}" >"$dir/codes" <<'PY'
import random, sys
from engine_db import make_code
codes = set()
while len(codes) < int(sys.argv[1]):
    codes.add(make_code(random.getrandbits(30)))
print("\n".join(codes))
PY
awk -v t=$t_exch -v s=$shop '{printf "9%017d\t1\t%s\t%s\t%s\n", NR, t, s, $1}' "$dir/codes" |
    psql "$QUAN_DS0_DSN" -qX -v ON_ERROR_STOP=1 \
        -c "\\copy t_exchange_code (id, batch_id, coupon_template_id, shop_number, code) FROM STDIN"
{
    echo "local codes = {"
    sed 's/.*/"&",/' "$dir/codes"
    cat <<'LUA'
}
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
    n = n + 1
    wrk.headers["X-User-Id"] = tostring(8500000000 + n)
    return wrk.format(nil, nil, nil, '{"code":"' .. codes[(n - 1) % #codes + 1] .. '"}')
end
LUA
} >"$dir/exchange.lua"
run_cpu exchange "$base/api/engine/user-coupon/exchange" "$dir/exchange.lua"
stop_engine

livez=$(cat "$dir/livez.rate")
printf '%-52s %12s %10s\n' "engine benchmark (${seconds}s, $conns connections)" "per second" "p99"
printf '%-52s %12.0f %10s\n' "GET /livez (HTTP ceiling)" "$livez" "$(cat "$dir/livez.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem refused, sold out (409)" "$(cat "$dir/refuse.rate")" "$(cat "$dir/refuse.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem accepted (200), a new user each" "$(cat "$dir/sync.rate")" "$(cat "$dir/sync.p99")"
[ "$(cat "$dir/sync.non2xx")" = 0 ] || echo "  of which not 200: $(cat "$dir/sync.non2xx")"
printf '%-52s %12.0f %10s\n' "POST /exchange, a new user and code each" "$(cat "$dir/exchange.rate")" "$(cat "$dir/exchange.p99")"
[ "$(cat "$dir/exchange.non2xx")" = 0 ] || echo "  of which not 200: $(cat "$dir/exchange.non2xx")"
printf '%-52s %12.0f %10s\n' "GET /coupon-template/query (cache hit)" "$(cat "$dir/query.rate")" "$(cat "$dir/query.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem-mq accepted (202), accepting replica" "$(cat "$dir/backlog.rate")" "$(cat "$dir/backlog.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem-mq accepted (202), also draining" "$(cat "$dir/mq.rate")" "$(cat "$dir/mq.p99")"
printf '%-52s %12.0f %10s\n' "  the same, 256 connections" "$(cat "$dir/curve256.rate")" "$(cat "$dir/curve256.p99")"
printf '%-52s %12.0f %10s\n' "  the same, 1024 connections" "$(cat "$dir/curve1024.rate")" "$(cat "$dir/curve1024.p99")"
printf '%-52s %12.0f\n' "raw publish with confirms (256 pipelined)" "$raw"
printf '%-52s %12.0f\n' "raw publish with confirms ($conns pipelined)" "$raw_conns"
printf '%-52s %12.0f   (claims/s: packs of %d claims of %d bytes, as the accepting run made)\n' \
    "raw publish with confirms, 1 pack in flight" "$(awk -v r="$packs_rate" -v k="$pack_size" 'BEGIN {print r * k}')" \
    "$pack_size" "$claim_bytes"
printf '%-52s %12.0f   (%d claims in %d messages, %d coupons in the DB)\n' \
    "MQ claims drained into PostgreSQL" "$drain_rate" "$backlog" "$backlog_msgs" "$coupons"
printf '%-52s %12.0f\n' "PostgreSQL COPY of the same coupons" "$copy_rate"
printf '%-52s %12.0f\n' "one transaction per coupon" "$onetx_rate"
printf '%-52s %12.0f   (%d claims)\n' "drain of one claim per message" "$drain1_rate" "$backlog1"
printf '%-52s %12.0f\n' "broker ceiling: consume + ack, nothing else" "$consume_raw"
awk -v a="$(cat "$dir/refuse.rate")" -v b="$livez" 'BEGIN {printf "ratio refusals / livez: %.2f (target >= 0.60)\n", a / b}'
awk -v a="$(cat "$dir/query.rate")" -v b="$livez" 'BEGIN {printf "ratio query hits / livez: %.2f (target >= 0.65)\n", a / b}'
awk -v a="$drain_rate" -v b="$onetx_rate" 'BEGIN {printf "ratio drain / one-tx: %.1f (target >= 7; drain target >= 20000/s)\n", a / b}'
# Both paths take the same two cores: the CPU each answer costs, summed over the programs,
# bounds their rates' ratio (wrk's own share shows only in how busy the machine was).
echo "CPU seconds during the sold-out refusals, by program ($(answers refuse) answers):"
bench_cpu_delta "$dir/cpu.refuse.0" "$dir/cpu.refuse.1" "$(answers refuse)"
echo "CPU seconds during accepted /redeem-mq on the accepting replica, by program ($(answers backlog) claims):"
bench_cpu_delta "$dir/cpu.backlog.0" "$dir/cpu.backlog.1" "$(answers backlog)"
echo "CPU seconds during the raw publish of those packs, one in flight ($packs_claims claims in $((packs_claims / pack_size)) packs):"
bench_cpu_delta "$dir/cpu.packs.0" "$dir/cpu.packs.1" "$packs_claims"
redis_per() { # FILE N: INFO commandstats per item, the costliest first (a script's time
    # includes the commands it calls, which are also listed on their own: no total)
    tr -d '\r' <"$1" | awk -F'[:=,]' -v n="$2" '/^cmdstat_/ {
        sub("cmdstat_", "", $1)
        if ($5 / n >= 0.005) printf "  %-12s %6.2f calls %7.2f us\n", $1, $3 / n, $5 / n }' |
        sort -k4 -n -r
}
echo "Redis during accepted /redeem-mq, per claim (INFO commandstats: calls and microseconds inside Redis):"
redis_per "$dir/redis.backlog" "$(answers backlog)"
# hist_ms NAME METRIC [LABELS]: the mean in ms of a histogram's observations during the run NAME
# (LABELS as /metrics writes them, braces included).
hist_ms() {
    awk -v c="$2_count${3:-} " -v s="$2_sum${3:-} " '
        index($0, c) == 1 { n += (FNR == NR ? -1 : 1) * $NF } # the first file (before) subtracted
        index($0, s) == 1 { t += (FNR == NR ? -1 : 1) * $NF }
        END { printf "%.2f", (n > 0 ? t * 1000 / n : 0) }' "$dir/metrics.$1.0" "$dir/metrics.$1.1"
}
# A 202 waits for its claim's turn in Redis and then for its pack's confirm; with a fixed number
# of clients the rate is their number over the time a claim takes (Little's law), so these
# times, not the CPU, set the rate while the machine has cores to spare.
printf 'Where an accepted claim'"'"'s time goes (means, accepting replica, %d connections): %.2f ms a claim\n' \
    "$conns" "$(awk -v c="$conns" -v r="$(cat "$dir/backlog.rate")" 'BEGIN {print c * 1000 / r}')"
printf '  in the engine from the request read to its 202: %s ms (quan_http_request_duration_seconds),\n' \
    "$(hist_ms backlog quan_http_request_duration_seconds '{route="/api/engine/user-coupon/redeem-mq",status="202"}')"
printf '  of it from the hand-off to the broker'"'"'s confirm: %s ms (quan_mq_publish_duration_seconds: the pack in flight, then its own)\n' \
    "$(hist_ms backlog quan_mq_publish_duration_seconds)"
echo "CPU seconds during the drain, by program ($backlog claims, $(nproc) cores):"
bench_cpu_delta "$dir/cpu.main.0" "$dir/cpu.main.1" "$backlog"
echo "  (Redis rewrote its append-only file $(cat "$dir/rewrites.main") times meanwhile: a forked copy of its data each, in redis-server's CPU above)"
echo "Redis during the drain, per claim (INFO commandstats: calls and microseconds inside Redis):"
redis_per "$dir/redis.main" "$backlog"
echo "CPU seconds during the COPY, by program ($backlog rows):"
bench_cpu_delta "$dir/cpu.copy.0" "$dir/cpu.copy.1" "$backlog"
# A redemption is a claim that also marks its code row (one statement each, inside transactions
# shared like /redeem's, exchange.c): no goal yet, the ratio shows how far it trails.
awk -v a="$(cat "$dir/exchange.rate")" -v b="$(cat "$dir/sync.rate")" \
    'BEGIN {printf "ratio exchange / accepted /redeem: %.2f (no goal)\n", a / b}'
echo "CPU seconds during accepted /redeem, by program ($(answers sync) claims):"
bench_cpu_delta "$dir/cpu.sync.0" "$dir/cpu.sync.1" "$(answers sync)"
echo "CPU seconds during /exchange, by program ($(answers exchange) redemptions):"
bench_cpu_delta "$dir/cpu.exchange.0" "$dir/cpu.exchange.1" "$(answers exchange)"
# A pipeline of programs sharing two cores against one program that had them alone: figures, no
# goals (docs/benchmarks.md counts what each item costs and what two cores can give). What
# carries to a deployment is the CPU each program spends per item, below, and Redis' is a goal:
# one master's thread carries a whole template's sale.
bench_figure "MQ claims drained into PostgreSQL" "$drain_rate" /s \
    "PostgreSQL COPY of the same coupons" "$copy_rate"
bench_figure "accepted /redeem-mq, 64 connections" "$(cat "$dir/backlog.rate")" /s \
    "sold-out refusals" "$(cat "$dir/refuse.rate")"
bench_goal "accepted /redeem (200), 64 connections" "$(cat "$dir/sync.rate")" /s \
    "accepted /redeem-mq, 64 connections" "$(cat "$dir/backlog.rate")" ">=" 0.25
bench_figure "accepted /redeem-mq, 64 connections" "$(cat "$dir/backlog.rate")" /s \
    "raw confirmed publish, 256 pipelined" "$raw"
bench_costs "accepted /redeem-mq (accepting replica)" "$dir/cpu.backlog.0" "$dir/cpu.backlog.1" "$(answers backlog)"
bench_costs "MQ claims drained into PostgreSQL" "$dir/cpu.main.0" "$dir/cpu.main.1" "$backlog"
bench_costs "accepted /redeem (200)" "$dir/cpu.sync.0" "$dir/cpu.sync.1" "$(answers sync)"
bench_costs "/exchange" "$dir/cpu.exchange.0" "$dir/cpu.exchange.1" "$(answers exchange)"
# Redis over a claim's whole life: accepted (claim script, markers, reservation records) and
# drained (the records ended, the wallet entry): redis-server's user + system CPU in each run,
# its append-only file's rewrites (forked children) included, per claim.
redis_life=$(awk -v a="$(bench_cpu_of "$dir/cpu.backlog.0" "$dir/cpu.backlog.1" redis-server)" \
    -v na="$(answers backlog)" -v d="$(bench_cpu_of "$dir/cpu.main.0" "$dir/cpu.main.1" redis-server)" \
    -v nd="$backlog" 'BEGIN { printf "%.1f", a * 1e6 / na + d * 1e6 / nd }')
bench_goal_cost "Redis CPU per /redeem-mq claim, accept + drain" "$redis_life" us "<=" 20
for n in query mq backlog curve256 curve1024; do
    [ "$(cat "$dir/$n.non2xx")" = 0 ] || echo "WARNING: $n had $(cat "$dir/$n.non2xx") non-2xx answers"
done
echo "sold-out refusals answered: $refuse_ok"
