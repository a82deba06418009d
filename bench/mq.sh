#!/usr/bin/env bash
# RabbitMQ's queue types on this machine, standalone like bench/run.sh: one RabbitMQ node (the
# single topology of deploy/local/infra.sh) and a three-node cluster (its cluster topology), each
# in a temporary directory; on each, quan-bench-claims queue-rate with classic and with quorum
# queues (QUAN_MQ_QUEUE_TYPE), declared as the services declare theirs:
#   publish    confirmed publishes of claim-sized envelopes, at most WINDOW unconfirmed (256:
#              the pipelining of the services' publisher and outbox relays)
#   publish-1  the same one at a time (each waits for its confirm): the latency a lone publish
#              pays, as 1 / rate
#   consume    those messages received and acked, one multiple ack per 1000 (the claim
#              consumer's batches)
# The cluster's connections go to node 1, where the queues are declared, so a quorum queue's
# leader is local and its two followers are the other nodes. Classic and quorum alternate, each
# BENCH_MQ_ROUNDS times (5); the median is printed, with the range of the rounds.
#   BENCH_MQ_N=20000 BENCH_MQ_N1=2000 BENCH_MQ_ROUNDS=5 bench/mq.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
n=${BENCH_MQ_N:-20000}
n1=${BENCH_MQ_N1:-2000}
rounds=${BENCH_MQ_ROUNDS:-5}
bin=${QUAN_BUILD:-build}/bin
[ -x "$bin/quan-bench-claims" ] || { echo "build first (make)" >&2; exit 1; }

dir=$(mktemp -d /tmp/quan-bench-mq.XXXXXX)
chmod 0755 "$dir"
cleanup() {
    deploy/local/infra.sh stop "$dir/single" >/dev/null 2>&1 || true
    deploy/local/infra.sh stop "$dir/cluster" >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT
# Fixed ports of an outer run (its env file) must not leak into these.
for v in $(env | sed -n 's/^\(QUAN_INFRA_[A-Z0-9_]*_PORT\)=.*/\1/p'); do unset "$v"; done
unset QUAN_INFRA_TOPOLOGY QUAN_INFRA_STANDALONE_REDIS
export QUAN_INFRA_DURABILITY=fast # PostgreSQL and Redis are not measured; RabbitMQ is durable

start() { # TOPOLOGY
    echo "== starting the $1 topology" >&2
    QUAN_INFRA_TOPOLOGY=$1 deploy/local/infra.sh start "$dir/$1" >"$dir/$1.log" 2>&1 ||
        { cat "$dir/$1.log" >&2; exit 1; }
}
start single
start cluster
# shellcheck disable=SC2034,SC1091 # read through ${!url} below; env is written at run time
url_single=$(. "$dir/single/env" && echo "$QUAN_AMQP_URL")
# shellcheck disable=SC2034,SC1091
url_cluster=$(. "$dir/cluster/env" && echo "${QUAN_AMQP_URL%%,*}") # node 1 only

# rate URL TYPE N WINDOW: "PUBLISHED/s CONSUMED/s"
rate() {
    QUAN_AMQP_URL=$1 QUAN_MQ_QUEUE_TYPE=$2 QUAN_LOG_LEVEL=error \
        "$bin/quan-bench-claims" queue-rate "$3" "$4" 1000
}
# The median of the numbers on stdin, and their range: "MEDIAN MIN-MAX".
median() {
    tr ' ' '\n' | grep . | sort -n |
        awk '{a[NR] = $1} END {printf "%s %s-%s\n", a[int((NR + 1) / 2)], a[1], a[NR]}'
}

# A shared machine's other load moves single rounds a lot: each figure is the median of the
# rounds, with their range beside it.
row() { printf '%-8s %-8s %8s %-13s %8s %-13s %8s %-11s %s\n' "$@"; }
row broker queues publish/s "(range)" consume/s "(range)" one/s "(range)" "one's latency ms"
for where in single cluster; do
    url=url_$where
    declare -A pub=() con=() one=()
    for r in $(seq 1 "$rounds"); do
        for t in classic quorum; do
            read -r p c <<<"$(rate "${!url}" "$t" "$n" 256)"
            read -r p1 _ <<<"$(rate "${!url}" "$t" "$n1" 1)"
            pub[$t]+="$p " con[$t]+="$c " one[$t]+="$p1 "
            echo "   $where $t round $r: publish $p/s, consume $c/s, one at a time $p1/s" >&2
        done
    done
    for t in classic quorum; do
        read -r p pr <<<"$(median <<<"${pub[$t]}")"
        read -r c cr <<<"$(median <<<"${con[$t]}")"
        read -r p1 p1r <<<"$(median <<<"${one[$t]}")"
        row "$where" "$t" "$p" "($pr)" "$c" "($cr)" "$p1" "($p1r)" \
            "$(awk -v r="$p1" 'BEGIN {printf "%.2f", 1000 / r}')"
    done
    unset pub con one
done
