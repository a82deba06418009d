#!/usr/bin/env bash
# Engine benchmarks, standalone like bench/run.sh: its own PostgreSQL/Redis/RabbitMQ
# in a temporary directory, one quan-engine, the templates it needs written directly into
# PostgreSQL and Redis, then, each in this one run beside the bare /livez rate:
#   refusals   POST /redeem on a sold-out template (409 B000100)   target >= 0.60 x /livez
#   query      GET /coupon-template/query, cache hits              target >= 0.65 x /livez
#   redeem-mq  accepted MQ claims (202), one new user per request, on a replica that only
#              accepts (QUAN_CLAIM_CONSUMERS=0: like the raw publish, nothing consumes on these
#              two cores)                                          target >= 0.5 x raw publish
#   mq+drain   the same while this engine also writes the claims into PostgreSQL
#   raw        quan-bench-claims publish-rate: publish-with-confirms, 256 pipelined confirms
#   drain      a backlog of MQ claims written into PostgreSQL: the backlog is what the engine
#              itself published under /redeem-mq load (claims packed as they came) while no
#              replica consumed (QUAN_CLAIM_CONSUMERS=0, 2 x BENCH_SECONDS of load, so that
#              start-up weighs little); then one engine writes it
#                                                                  target >= 20000 coupons/s
#   one-tx     the same coupons one transaction each (quan-bench-claims pg-one-tx), and the
#              drain's multiple of it                              target >= 7x
#   drain-1    for comparison, a backlog of one claim per message (quan-bench-claims backlog):
#              the broker's own cost per message dominates (consume-rate: its ceiling)
#   BENCH_SECONDS=10 BENCH_CONNECTIONS=64 BENCH_BACKLOG1=50000 bench/engine.sh
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
tpl $t_sold 0
tpl $t_hit 100
tpl $t_mq 20000000
tpl $t_drain 20000000
tpl $t_base 20000000
tpl $t_drain1 20000000

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

# run NAME URL [SCRIPT]: rate in $dir/NAME.rate, p99 in $dir/NAME.p99 (bench/lib.sh).
run() { bench_wrk "$@"; }

start_engine
wrk -t1 -c"$conns" -d2s "$base/livez" >/dev/null 2>&1 # warm-up
run livez "$base/livez"
run refuse "$base/api/engine/user-coupon/redeem" "$dir/refuse.lua"
cat >"$dir/get.lua" <<'LUA'
wrk.headers["X-User-Id"] = "42"
LUA
run query "$base/api/engine/coupon-template/query?shopNumber=$shop&couponTemplateId=$t_hit" \
    "$dir/get.lua"
run mq "$base/api/engine/user-coupon/redeem-mq" "$dir/mq.lua"
raw=$(build/bin/quan-bench-claims publish-rate "$seconds" 256)
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
# drain NAME TEMPLATE CLAIMS: an engine starts on the backlog; $dir/NAME.rate gets CLAIMS
# divided by the seconds until CLAIMS more coupons of TEMPLATE are in the database.
drain() {
    local name=$1 s0 t0 t1
    s0=$(stock_of "$2")
    t0=$(date +%s.%N) # the engine's start-up counts
    start_engine
    t1=$(build/bin/quan-bench-claims wait-stock "$2" $shop $((s0 - $3)) 300)
    sleep 1
    stop_engine
    awk -v n="$3" -v a="$t1" -v b="$t0" 'BEGIN {printf "%.0f", n / (a - b)}' >"$dir/$name.rate"
}
for _ in $(seq 1 600); do [ "$(queued)" = 0 ] && break; sleep 0.1; done # the mq run's claims
stop_engine
start_engine QUAN_CLAIM_CONSUMERS=0
seconds=$((seconds * 2)) run backlog "$base/api/engine/user-coupon/redeem-mq" "$dir/backlog.lua"
stop_engine
backlog=$((20000000 - $(redis-cli -p "$QUAN_REDIS_PORT" HGET "quan:tpl:{$t_drain}" stock)))
backlog_msgs=$(queued)
drain main $t_drain "$backlog"
drain_rate=$(cat "$dir/main.rate")
coupons=$(coupons_of $t_drain)

build/bin/quan-bench-claims backlog $t_drain1 $shop 7000000000 "$backlog1" >/dev/null
drain one $t_drain1 "$backlog1"
drain1_rate=$(cat "$dir/one.rate")
build/bin/quan-bench-claims backlog $t_drain1 $shop 7500000000 "$backlog1" >/dev/null
consume_raw=$(build/bin/quan-bench-claims consume-rate quan.engine.redeem "$backlog1" 1000)
onetx_rate=$(build/bin/quan-bench-claims pg-one-tx $t_base $shop 8000000000 "$onetx")

livez=$(cat "$dir/livez.rate")
printf '%-52s %12s %10s\n' "engine benchmark (${seconds}s, $conns connections)" "per second" "p99"
printf '%-52s %12.0f %10s\n' "GET /livez (HTTP ceiling)" "$livez" "$(cat "$dir/livez.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem refused, sold out (409)" "$(cat "$dir/refuse.rate")" "$(cat "$dir/refuse.p99")"
printf '%-52s %12.0f %10s\n' "GET /coupon-template/query (cache hit)" "$(cat "$dir/query.rate")" "$(cat "$dir/query.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem-mq accepted (202), accepting replica" "$(cat "$dir/backlog.rate")" "$(cat "$dir/backlog.p99")"
printf '%-52s %12.0f %10s\n' "POST /redeem-mq accepted (202), also draining" "$(cat "$dir/mq.rate")" "$(cat "$dir/mq.p99")"
printf '%-52s %12.0f\n' "raw publish with confirms (256 pipelined)" "$raw"
printf '%-52s %12.0f   (%d claims in %d messages, %d coupons in the DB)\n' \
    "MQ claims drained into PostgreSQL" "$drain_rate" "$backlog" "$backlog_msgs" "$coupons"
printf '%-52s %12.0f\n' "one transaction per coupon" "$onetx_rate"
printf '%-52s %12.0f   (%d claims)\n' "drain of one claim per message" "$drain1_rate" "$backlog1"
printf '%-52s %12.0f\n' "broker ceiling: consume + ack, nothing else" "$consume_raw"
awk -v a="$(cat "$dir/refuse.rate")" -v b="$livez" 'BEGIN {printf "ratio refusals / livez: %.2f (target >= 0.60)\n", a / b}'
awk -v a="$(cat "$dir/query.rate")" -v b="$livez" 'BEGIN {printf "ratio query hits / livez: %.2f (target >= 0.65)\n", a / b}'
awk -v a="$(cat "$dir/backlog.rate")" -v b="$raw" 'BEGIN {printf "ratio redeem-mq / raw publish: %.2f (target >= 0.5)\n", a / b}'
awk -v a="$drain_rate" -v b="$onetx_rate" 'BEGIN {printf "ratio drain / one-tx: %.1f (target >= 7; drain target >= 20000/s)\n", a / b}'
for n in query mq backlog; do
    [ "$(cat "$dir/$n.non2xx")" = 0 ] || echo "WARNING: $n had $(cat "$dir/$n.non2xx") non-2xx answers"
done
echo "sold-out refusals answered: $refuse_ok"
