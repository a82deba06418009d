#!/usr/bin/env bash
# bench/capacity.sh — what one Redis master carries of a flash sale on ONE template. Every key a
# claim touches carries the template's hash tag, so one template is one Redis Cluster slot and
# one master's single thread, however many masters there are: the ceiling of a hot template.
# Measured with redis-benchmark against the benchmark's own Redis (`make up`'s durable settings:
# append-only file, fsync every second), in the same run:
#   PING                     the server's ceiling for a command that does nothing
#   claim.lua, successful    a claim of a random user on a template with stock to spare (the
#                            script's whole write path: stock, the user's count and the request
#                            marker (two fields of the template's users hash), the reservation
#                            record)
#   claim.lua, sold out      the refusal (reads the hash, writes nothing)
#   claim.lua, 12 a call     twelve successful claims in one call, the shape the engine sends
#                            (a loop turn's claims of one template bucket): a figure per claim
# each at 64 connections, without pipelining (as the engines send: one script per claim, many
# claims in flight per connection are what hiredis pipelines anyway) and with 16 pipelined (the
# server's own limit). Prints each rate and its ratio to PING, and the microseconds a successful
# script spends inside Redis (INFO commandstats: the script and every command it calls; goal
# <= 8 us, a figure that carries to any deployment). Used by docs/capacity.md; part of make bench.
#   BENCH_REQUESTS=400000 bench/capacity.sh   (BENCH_CLAIM_LUA=FILE: a variant of claim.lua, for an
#   A/B in one sitting)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
requests=${BENCH_REQUESTS:-400000}
conns=${BENCH_CONNECTIONS:-64}

# shellcheck source=bench/lib.sh
. bench/lib.sh
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_init quan-capacity

shop=7001
hot=910001  # stock to spare: every claim succeeds
gone=910002 # stock 0: every claim is refused
bench_template "$hot" "$shop" 1000000000
bench_template "$gone" "$shop" 0
sha=$(redis-cli -p "$QUAN_REDIS_PORT" SCRIPT LOAD "$(cat "${BENCH_CLAIM_LUA:-lua-scripts/claim.lua}")")
now=$(($(date +%s) * 1000))

# rate PIPELINE CMD...: requests per second redis-benchmark reports for CMD.
rate() {
    local pipe=$1
    shift
    redis-benchmark -p "$QUAN_REDIS_PORT" -c "$conns" -n "$requests" -P "$pipe" -r 1000000000 -q \
        "$@" 2>/dev/null | tr '\r' '\n' |
        awk '{for (i = 1; i <= NF; i++) if ($i == "requests") v = $(i - 1)} END {print v}'
}

# One claim: a random user and request id each time (redis-benchmark fills __rand_int__).
# claim.lua's layout: KEYS tpl hash, users hash, resv; ARGV owner, buckets (1: "" would vanish in
# the word splitting below, and every call would be an argument error), then now, shop, user id,
# member "<user>:<reqId>". redis-benchmark fills each __rand_int__ with its own random
# number, so the user id and the member's user part are two different random users: the count
# field is one user's and the marker (and reservation) another's. For a benchmark that is the
# same work as long as each claim is a new user with a new marker (a collision of either is
# rare at -r 1000000000), which is what is measured: a first claim that writes both fields.
claim() { # claim TEMPLATE [CLAIMS]: one call of CLAIMS claims (default 1)
    local t=$1 k
    printf '%s ' EVALSHA "$sha" 3 "quan:tpl:{$t}" "quan:tpl:{$t}:users" "quan:tpl:{$t}:resv" \
        "bench:1/run" 1
    for ((k = 0; k < ${2:-1}; k++)); do printf '%s ' "$now" "$shop" __rand_int__ __rand_int__:b; done
    echo
}

# A check that the commands do what is measured: one claim each, its answer's first element.
# shellcheck disable=SC2046 # claim's words are the command's arguments
ok=$(redis-cli -p "$QUAN_REDIS_PORT" $(claim "$hot" | sed 's/__rand_int__/1/g') | head -n 1)
# shellcheck disable=SC2046
refused=$(redis-cli -p "$QUAN_REDIS_PORT" $(claim "$gone" | sed 's/__rand_int__/1/g') | head -n 1)
if [ "$ok" != 0 ] || [ "$refused" != 1 ]; then
    echo "claim.lua answered $ok (want 0, success) and $refused (want 1, sold out)" >&2
    exit 1
fi

printf '%-46s %12s %12s\n' "one Redis ($requests requests, $conns conns)" "no pipeline" "16 pipelined"
declare -A r
# script_us: the mean microseconds inside Redis of the EVALSHA calls since the last CONFIG
# RESETSTAT (the script's own work and the commands it called).
script_us() {
    redis-cli -p "$QUAN_REDIS_PORT" INFO commandstats | tr -d '\r' |
        awk -F'[:=,]' '$1 == "cmdstat_evalsha" {print $7}'
}
# shellcheck disable=SC2046 # claim's words are the command's arguments
for pipe in 1 16; do
    r[ping$pipe]=$(rate "$pipe" PING)
    redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
    r[ok$pipe]=$(rate "$pipe" $(claim "$hot"))
    r[okus$pipe]=$(script_us)
    redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
    r[sold$pipe]=$(rate "$pipe" $(claim "$gone"))
    r[soldus$pipe]=$(script_us)
done
# The engine's shape: 12 claims a call, 16 calls pipelined; the microseconds per claim.
redis-cli -p "$QUAN_REDIS_PORT" CONFIG RESETSTAT >/dev/null
# shellcheck disable=SC2046
r[ok12]=$(requests=$((requests / 12)) rate 16 $(claim "$hot" 12))
r[okus12]=$(awk -v v="$(script_us)" 'BEGIN {printf "%.2f", v / 12}')
printf '%-46s %12.0f %12.0f\n' "PING (the server's ceiling)" "${r[ping1]}" "${r[ping16]}"
printf '%-46s %12.0f %12.0f\n' "claim.lua, successful (one hot template)" "${r[ok1]}" "${r[ok16]}"
printf '%-46s %12.0f %12.0f\n' "claim.lua, sold out" "${r[sold1]}" "${r[sold16]}"
awk -v a="${r[ok16]}" -v b="${r[ping16]}" -v c="${r[sold16]}" \
    'BEGIN {printf "ratios to PING, pipelined: successful %.2f, sold out %.2f\n", a / b, c / b}'
printf '%-46s %12.2f %12.2f\n' "  us inside Redis per successful claim" "${r[okus1]}" "${r[okus16]}"
printf '%-46s %12.2f %12.2f\n' "  us inside Redis per sold-out refusal" "${r[soldus1]}" "${r[soldus16]}"
printf '%-46s %12s %12.0f\n' "claim.lua, 12 successful a call (claims/s)" - "$(awk -v v="${r[ok12]}" 'BEGIN {print v * 12}')"
printf '%-46s %12s %12.2f\n' "  us inside Redis per claim, 12 a call" - "${r[okus12]}"
bench_goal_cost "claim.lua, successful: inside Redis per claim" "${r[okus16]}" us "<=" 8
bench_figure "claim.lua, 12 a call: inside Redis per claim" "${r[okus12]}" us \
    "one claim a call" "${r[okus16]}" "(the engine's shape; the goal is one a call)"
taken=$(redis-cli -p "$QUAN_REDIS_PORT" HGET "quan:tpl:{$hot}" stock)
echo "coupons taken from the hot template: $((1000000000 - taken))"
