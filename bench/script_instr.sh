#!/usr/bin/env bash
# bench/script_instr.sh — what a claim's script costs inside Redis, counted in instructions
# (valgrind's callgrind), not seconds: the same count on a busy machine as on a quiet one, so
# the parts of the cost can be told apart where timings drown in noise. One Redis (no
# append-only file) under callgrind; for each command, the instructions redis-server executes
# per request beyond a PING's (the request's reading and the reply), over N requests of
# redis-benchmark on one connection:
#   EVALSHA return 1            a script's own cost with claim.lua's 3 keys and 6 arguments
#   two HMGETs                  the script above plus claim.lua's two reads: a redis.call's cost
#   the five commands           a script making only the commands a successful claim needs
#                               (two HMGETs, HINCRBY, ZADD, HSET): the floor of a claim that is
#                               one script
#   claim.lua                   one claim a call, as bench/capacity.sh measures it
#   claim.lua, 12 a call        12 claims in one call, as the engine gathers a loop turn's (about
#                               twelve under load); per claim (BENCH_INSTR_BATCH=N: N a call)
# BENCH_INSTR_CLAIM=FILE measures a variant of claim.lua in its place; BENCH_INSTR_ONLY_CLAIM=1
# measures only claim.lua's two lines. Not part of make bench (valgrind runs Redis about 50 times slower: a few minutes in all).
#   bench/script_instr.sh [N]   (default 3000 requests each)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-3000}
port=${BENCH_INSTR_PORT:-16499}
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
    echo "script_instr.sh: needs valgrind (apt-get install valgrind)" >&2
    exit 1
fi
dir=$(mktemp -d /tmp/quan-instr.XXXXXX)
vpid=
stop() {
    [ -n "$vpid" ] && kill "$vpid" 2>/dev/null && wait "$vpid" 2>/dev/null
    rm -rf "$dir"
}
trap stop EXIT

valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" redis-server --port "$port" \
    --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
vpid=$!
for _ in $(seq 200); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
now=$(($(date +%s) * 1000))
redis-cli -p "$port" HSET 'quan:tpl:{1}' stock 1000000000 status 0 \
    validStartTime $((now - 3600000)) validEndTime $((now + 86400000)) shopNumber 77 \
    limitPerPerson 1 validityHours 24 >/dev/null

# The instructions redis-server ran since the counters were last zeroed; zeroes them.
instr() {
    callgrind_control -d "$vpid" >/dev/null 2>&1
    local f
    # the newest dump (callgrind numbers them)
    f=$(find "$dir" -name 'cg.out*' -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2)
    awk '/^(summary|totals):/ {print $2; exit}' "$f"
    callgrind_control -z "$vpid" >/dev/null 2>&1
}
load() { # load REQUESTS CMD...: redis-benchmark, one connection, a random number per __rand_int__
    redis-benchmark -p "$port" -c 1 -n "$1" -P 1 -r 1000000000 -q "${@:2}" >/dev/null 2>&1
}
sha_of() { redis-cli -p "$port" SCRIPT LOAD "$1"; }
keys=(3 'quan:tpl:{1}' 'quan:tpl:{1}:users' 'quan:tpl:{1}:resv' bench:1/run '')
claim_args=("$now" 77 __rand_int__ __rand_int__:b)

load 1000 PING
instr >/dev/null
load "$n" PING
ping=$(instr)
# per ARGS...: instructions per request beyond a PING's (the last argument: claims a call)
measure() {
    local label=$1 per=$2
    shift 2
    load 300 "$@" # warm
    instr >/dev/null
    load "$n" "$@"
    local total
    total=$(instr)
    printf '%-28s %8d instructions a claim\n' "$label" $(((total - ping) / n / per))
}
ret1=$(sha_of 'return 1')
reads=$(sha_of "redis.call('HMGET', KEYS[2], ARGV[5], ARGV[6], ARGV[5] .. '#')
redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime', 'shopNumber', 'limitPerPerson', 'validityHours', 'buckets')
return 1")
five=$(sha_of "local f = redis.call('HMGET', KEYS[1], 'stock', 'status', 'validStartTime', 'validEndTime', 'shopNumber', 'limitPerPerson', 'validityHours', 'buckets')
redis.call('HMGET', KEYS[2], ARGV[5], ARGV[6], ARGV[5] .. '#')
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[6])
redis.call('HSET', KEYS[2], ARGV[5], '1', ARGV[6], '1:' .. ARGV[3] .. ':x', ARGV[5] .. '#', ',b')
return {0, 1, 24, f[4]}")
claim=$(sha_of "$(cat "${BENCH_INSTR_CLAIM:-$root/lua-scripts/claim.lua}")")
batch=()
per_call=${BENCH_INSTR_BATCH:-12}
for _ in $(seq "$per_call"); do batch+=("${claim_args[@]}"); done

[ "${BENCH_INSTR_ONLY_CLAIM:-0}" = 1 ] || {
echo "instructions inside redis-server per request, beyond a PING's ($((ping / n)) a PING; $n requests each)"
measure "EVALSHA return 1" 1 EVALSHA "$ret1" "${keys[@]}" "${claim_args[@]}"
measure "two HMGETs" 1 EVALSHA "$reads" "${keys[@]}" "${claim_args[@]}"
measure "the five commands" 1 EVALSHA "$five" "${keys[@]}" "${claim_args[@]}"
}
measure "claim.lua" 1 EVALSHA "$claim" "${keys[@]}" "${claim_args[@]}"
measure "claim.lua, $per_call a call" "$per_call" EVALSHA "$claim" "${keys[@]}" "${batch[@]}"
