#!/usr/bin/env bash
# Expiry sweeper benchmark: N user coupons already past their end (default 1,000,000, spread
# over the 32 t_user_coupon tables, 100 per user, each also a wallet member), then one
# quan-engine; measures the time until every row is EXPIRED and every wallet is empty.
#
#   bench/expire.sh                 starts its own PostgreSQL/Redis/RabbitMQ (like bench/run.sh)
#   BENCH_ENV=/path/env bench/expire.sh
#                                   uses running servers instead: creates two scratch databases
#                                   quan_expire_bench_{0,1} on that PostgreSQL (dropped at the
#                                   end) and wallet keys in a private id range of that Redis
#   BENCH_ROWS=1000000 BENCH_BATCH=1000 ...
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rows=${BENCH_ROWS:-1000000}
batch=${BENCH_BATCH:-1000}
per_user=100
dir=$(mktemp -d /tmp/quan-expire-bench.XXXXXX)
chmod 0755 "$dir"
engine_pid=
own_infra=1
scratch=
cleanup() {
    [ -n "$engine_pid" ] && kill -TERM "$engine_pid" 2>/dev/null && wait "$engine_pid" 2>/dev/null
    if [ -n "$scratch" ]; then
        for i in 0 1; do
            psql "$admin_dsn" -qAtX -c "DROP DATABASE IF EXISTS quan_expire_bench_$i" || true
        done
    fi
    [ "$own_infra" = 1 ] && { deploy/local/infra.sh stop "$dir" >/dev/null 2>&1 || true; }
    rm -rf "$dir"
}
trap cleanup EXIT

if [ -n "${BENCH_ENV:-}" ]; then
    own_infra=0
    # shellcheck disable=SC1090
    . "$BENCH_ENV"
    admin_dsn=$QUAN_DS0_DSN
    scratch=1
    for i in 0 1; do
        psql "$admin_dsn" -qAtX -c "DROP DATABASE IF EXISTS quan_expire_bench_$i" \
            -c "CREATE DATABASE quan_expire_bench_$i" >/dev/null
    done
    QUAN_DS0_DSN=${admin_dsn%/*}/quan_expire_bench_0
    QUAN_DS1_DSN=${admin_dsn%/*}/quan_expire_bench_1
    export QUAN_DS0_DSN QUAN_DS1_DSN
else
    deploy/local/infra.sh start "$dir" >"$dir/infra.log" 2>&1 || { cat "$dir/infra.log"; exit 1; }
    # shellcheck disable=SC1091
    . "$dir/env"
fi
QUAN_MIGRATIONS_DIR="$root/migrations" build/bin/quan-migrate >/dev/null
export QUAN_CODE_SECRET=bench-secret-0123456789abcdef

# Users 9e15 + k; row g of table t: id = 9e15 + g, user = 9e15 + g / per_user.
base=9000000000000000
per_table=$(((rows + 31) / 32))
echo "inserting $rows expired coupons ($per_table per table) ..."
t0=$(date +%s.%N)
for t in $(seq 0 31); do
    ds=$((t / 16))
    dsn=$QUAN_DS0_DSN
    [ "$ds" = 1 ] && dsn=$QUAN_DS1_DSN
    lo=$((t * per_table))
    hi=$((lo + per_table - 1))
    [ "$hi" -ge "$rows" ] && hi=$((rows - 1))
    psql "$dsn" -qAtX -c "INSERT INTO t_user_coupon_$t (id, user_id, coupon_template_id,
        receive_count, valid_start_time, valid_end_time, status)
        SELECT $base + g, $base + g / $per_user, 1, g + 1, now() - interval '2 days',
               now() - interval '1 hour', 0 FROM generate_series($lo, $hi) g" &
    [ $((t % 2)) = 1 ] && wait
done
wait
/usr/bin/python3 - "$rows" "$base" "$per_user" <<'EOF' | redis-cli -h "$QUAN_REDIS_HOST" -p "$QUAN_REDIS_PORT" --pipe >/dev/null
import sys
rows, base, per_user = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
w = sys.stdout.write
for g in range(rows):
    key = "quan:wallet:{%d}" % (base + g // per_user)
    member = "1_%d" % (base + g)
    w("*4\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n" % (len(key), key, len(member), member))
EOF
t1=$(date +%s.%N)
echo "inserted in $(echo "$t1 - $t0" | bc) s; wallet keys: $(redis-cli -h "$QUAN_REDIS_HOST" -p "$QUAN_REDIS_PORT" --scan --pattern 'quan:wallet:{90000*' | wc -l)"

port=$(/usr/bin/python3 "$root/deploy/local/ports.py")
start=$(date +%s.%N)
QUAN_HTTP_PORT=$port QUAN_HTTP_BIND=127.0.0.1 QUAN_LOG_LEVEL=warn QUAN_EXPIRE_INTERVAL_MS=100 \
    QUAN_EXPIRE_BATCH=$batch QUAN_LUA_DIR="$root/lua-scripts" build/bin/quan-engine \
    >"$dir/engine.log" 2>&1 &
engine_pid=$!
count_left() {
    local n=0 c q
    for ds in 0 1; do
        dsn=$QUAN_DS0_DSN
        [ "$ds" = 1 ] && dsn=$QUAN_DS1_DSN
        q="SELECT 0"
        for t in $(seq $((ds * 16)) $((ds * 16 + 15))); do
            q="$q + (SELECT count(*) FROM t_user_coupon_$t WHERE status = 0)"
        done
        c=$(psql "$dsn" -qAtX -c "$q")
        n=$((n + c))
    done
    echo "$n"
}
while :; do
    sleep 0.5
    left=$(count_left)
    now=$(date +%s.%N)
    echo "  $(printf '%.1f' "$(echo "$now - $start" | bc)") s: $left left"
    [ "$left" = 0 ] && break
done
end=$(date +%s.%N)
keys=$(redis-cli -h "$QUAN_REDIS_HOST" -p "$QUAN_REDIS_PORT" --scan --pattern 'quan:wallet:{90000*' | wc -l)
secs=$(echo "$end - $start" | bc)
echo "expired $rows coupons in $(printf '%.1f' "$secs") s (batch $batch, $(echo "$rows / $secs" | bc) rows/s; includes engine start and 0.5 s polling); wallet keys left: $keys"
