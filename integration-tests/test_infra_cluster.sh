#!/usr/bin/env bash
# deploy/local/infra.sh's cluster topology (QUAN_INFRA_TOPOLOGY=cluster) in a directory of its
# own on free ports: the Redis Cluster (every node ok, three masters with a replica each, a
# master's failover and its return), ds_0 and ds_1 on two PostgreSQL servers (and quan-migrate
# across them), three RabbitMQ nodes in one cluster with a quorum queue on each, status and
# DIR/env; then stop, and nothing of it left running. Runs its own servers (about a minute and
# a half, most of it RabbitMQ's three boots).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
infra=$root/deploy/local/infra.sh
bin=${QUAN_BIN_DIR:-$root/build/bin}

tmp=$(mktemp -d /tmp/quan-cluster.XXXXXX)
chmod 0755 "$tmp"
d=$tmp/infra
cleanup() {
    "$infra" stop "$d" >/dev/null 2>&1
    "$infra" stop "$tmp/other" >/dev/null 2>&1
    rm -rf "$tmp"
}
trap cleanup EXIT
# The suite's own servers' variables would be taken as fixed ports: free ones here.
for v in $(env | sed -n 's/^\(QUAN_INFRA_[A-Z0-9_]*\)=.*/\1/p'); do
    [ "$v" = QUAN_INFRA_DURABILITY ] || unset "$v"
done
export QUAN_INFRA_DURABILITY=${QUAN_INFRA_DURABILITY:-fast}

start=$SECONDS
if QUAN_INFRA_TOPOLOGY=cluster "$infra" start "$d" >"$tmp/start.log" 2>&1; then
    ok "infra.sh starts the cluster topology ($((SECONDS - start)) s)"
else
    bad "infra.sh starts the cluster topology"
    tail -40 "$tmp/start.log"
    finish
    exit
fi
# shellcheck disable=SC1091
. "$d/env"
check "the directory records its topology" test "$(cat "$d/topology")" = cluster
"$infra" status "$d" >"$tmp/status" 2>&1
status_rc=$?
check "status: every process alive (exit 0)" test "$status_rc" -eq 0
check "status: six Redis nodes, two PostgreSQL servers, epmd, three RabbitMQ nodes" \
    test "$(grep -cE '^(redis[0-5]|postgres[01]|epmd|rabbitmq[123]) +alive ' "$tmp/status")" -eq 12
[ "$status_rc" -eq 0 ] || sed 's/^/     /' "$tmp/status"

# ---------------------------------------------------------------- Redis Cluster

read -r -a rports <<<"$QUAN_INFRA_REDIS_NODE_PORTS"
rc() { redis-cli -h 127.0.0.1 -p "$@"; }
roles() {
    local p
    for p in "${rports[@]}"; do rc "$p" role 2>/dev/null | head -n 1; done | sort | uniq -c |
        awk '{printf "%s%s=%s", sep, $2, $1; sep = " "}'
}
all_ok() {
    local p
    for p in "${rports[@]}"; do
        rc "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
}
check "Redis: six nodes in QUAN_REDIS_CLUSTER_NODES" \
    test "$(tr ',' '\n' <<<"$QUAN_REDIS_CLUSTER_NODES" | grep -c '^127\.0\.0\.1:[0-9]*$')" -eq 6
check "Redis: every node says cluster_state:ok" all_ok
check "Redis: three masters and three replicas ($(roles))" test "$(roles)" = "master=3 slave=3"
check "Redis: every slot served" \
    test "$(rc "$QUAN_REDIS_PORT" cluster info | tr -d '\r' | sed -n 's/^cluster_slots_ok://p')" = 16384
# Keys of three tags land on different masters; read back through any node.
for k in '{a}x' '{b}x' '{c}x'; do rc "$QUAN_REDIS_PORT" -c set "quan:test:$k" "v$k" >/dev/null; done
check "Redis: keys written through one node read back through another" \
    test "$(rc "${rports[5]}" -c get 'quan:test:{b}x')" = 'v{b}x'

# A master killed: its replica takes over, and start brings the node back as a replica.
victim=$("$QUAN_INFRA_RCLUSTER" masters "$QUAN_INFRA_RCLUSTER_DIR" | head -n 1)
if [ -n "$victim" ] && "$QUAN_INFRA_RCLUSTER" kill "$QUAN_INFRA_RCLUSTER_DIR" "$victim" 2>/dev/null; then
    took=""
    for i in $(seq 1 100); do
        masters=$("$QUAN_INFRA_RCLUSTER" masters "$QUAN_INFRA_RCLUSTER_DIR" 2>/dev/null)
        if [ "$(wc -l <<<"$masters")" -eq 3 ] && ! grep -qx "$victim" <<<"$masters" &&
            rc "${rports[5]}" -c get 'quan:test:{a}x' 2>/dev/null | grep -q .; then
            took=$((i / 5))
            break
        fi
        sleep 0.2
    done
    check "Redis: a killed master's replica takes over (${took:-no takeover in 20} s)" test -n "$took"
    "$infra" start "$d" >>"$tmp/start.log" 2>&1
    check "Redis: start brings the killed node back; three masters, three replicas again" \
        test "$(roles)" = "master=3 slave=3"
else
    bad "Redis: rcluster.sh kills a master ($victim)"
fi

# ---------------------------------------------------------------- PostgreSQL

pg() { psql -qAtX "$@" 2>&1; }
check "PostgreSQL: two servers, two ports" test "$QUAN_INFRA_PG0_PORT" != "$QUAN_INFRA_PG1_PORT"
id0=$(pg "$QUAN_DS0_DSN" -c 'SELECT system_identifier FROM pg_control_system()')
id1=$(pg "$QUAN_DS1_DSN" -c 'SELECT system_identifier FROM pg_control_system()')
check "PostgreSQL: ds_0 and ds_1 are on different servers ($id0, $id1)" \
    test -n "$id0" -a -n "$id1" -a "$id0" != "$id1"
check "PostgreSQL: each server holds its database alone" \
    test "$(pg -h 127.0.0.1 -p "$QUAN_INFRA_PG0_PORT" -U quan -d postgres -c \
        "SELECT string_agg(datname, ',') FROM pg_database WHERE datname LIKE 'ds_%'")/$(pg -h \
        127.0.0.1 -p "$QUAN_INFRA_PG1_PORT" -U quan -d postgres -c \
        "SELECT string_agg(datname, ',') FROM pg_database WHERE datname LIKE 'ds_%'")" = ds_0/ds_1
check "PostgreSQL: QUAN_INFRA_PG0_DATA and QUAN_INFRA_PG1_DATA are the servers' data directories" \
    test "$(pg "$QUAN_DS0_DSN" -c 'SHOW data_directory')/$(pg "$QUAN_DS1_DSN" -c \
        'SHOW data_directory')" = "$(readlink -f "$QUAN_INFRA_PG0_DATA")/$(readlink -f "$QUAN_INFRA_PG1_DATA")"
if [ -x "$bin/quan-migrate" ]; then
    check "quan-migrate applies ds_0 and ds_1 on their two servers" \
        env QUAN_MIGRATIONS_DIR="$root/migrations" QUAN_LOG_LEVEL=warn "$bin/quan-migrate"
    check "quan-migrate --status: nothing pending on either" \
        env QUAN_MIGRATIONS_DIR="$root/migrations" QUAN_LOG_LEVEL=warn "$bin/quan-migrate" --status
else
    bad "quan-migrate is built ($bin)"
fi

# ---------------------------------------------------------------- RabbitMQ

nodes_of() { # NODE_CTL: the running nodes that node sees, sorted, space-separated
    "$1" -q cluster_status --formatter json 2>/dev/null |
        /usr/bin/python3 -c 'import json,sys; print(" ".join(sorted(json.load(sys.stdin)["running_nodes"])))'
}
want_nodes="quan1@localhost quan2@localhost quan3@localhost"
check "RabbitMQ: node 1 sees three running nodes ($(nodes_of "$QUAN_INFRA_RABBITMQCTL1"))" \
    test "$(nodes_of "$QUAN_INFRA_RABBITMQCTL1")" = "$want_nodes"
check "RabbitMQ: node 3 sees the same cluster" \
    test "$(nodes_of "$QUAN_INFRA_RABBITMQCTL3")" = "$want_nodes"
check "RabbitMQ: QUAN_AMQP_URL lists the three nodes' AMQP ports" \
    test "$QUAN_AMQP_URL" = "amqp://guest:guest@127.0.0.1:$QUAN_INFRA_AMQP1_PORT/,amqp://guest:guest@127.0.0.1:$QUAN_INFRA_AMQP2_PORT/,amqp://guest:guest@127.0.0.1:$QUAN_INFRA_AMQP3_PORT/"
check "RabbitMQ: QUAN_MQ_QUEUE_TYPE=quorum" test "$QUAN_MQ_QUEUE_TYPE" = quorum
if [ -x "$bin/quan-bench-claims" ]; then
    q=topo$$
    if QUAN_LOG_LEVEL=error "$bin/quan-bench-claims" declare-queues "$q" "topo.$q" >"$tmp/declare.log" 2>&1; then
        ok "RabbitMQ: a consumer's queues declared through the URL list"
        "$QUAN_INFRA_RABBITMQCTL2" -q list_queues name type members --formatter json >"$tmp/queues.json" 2>&1
        check "RabbitMQ: quan.$q, .retry and .dead are quorum queues with a member on each node" \
            /usr/bin/python3 -c '
import json, sys
qs = {x["name"]: x for x in json.load(open(sys.argv[1]))}
want = sorted(sys.argv[3].split())
sys.exit(not all(n in qs and qs[n]["type"] == "quorum" and sorted(qs[n]["members"]) == want
                 for n in ("quan." + sys.argv[2] + s for s in ("", ".retry", ".dead"))))' \
            "$tmp/queues.json" "$q" "$want_nodes"
        QUAN_LOG_LEVEL=error "$bin/quan-bench-claims" delete-queues "$q" >/dev/null 2>&1
    else
        bad "RabbitMQ: a consumer's queues declared through the URL list"
        sed 's/^/     /' "$tmp/declare.log"
    fi
else
    bad "quan-bench-claims is built ($bin)"
fi

# ---------------------------------------------------------------- the directory's rules

t0=$SECONDS
check "a second start finds everything running and does nothing" \
    bash -c "'$infra' start '$d' 2>&1 | grep -q 'already running'"
check "... at once ($((SECONDS - t0)) s)" test $((SECONDS - t0)) -le 10
check "the single topology is refused in a cluster directory" \
    bash -c "! QUAN_INFRA_TOPOLOGY=single '$infra' start '$d' 2>&1 | grep -q 'ready'"
# (the environment sourced above fixes every port: only ds_0's server's here)
check "a fixed port in use is refused before anything starts" \
    bash -c "! env -u QUAN_INFRA_RCLUSTER_PORT -u QUAN_INFRA_PG1_PORT -u QUAN_INFRA_AMQP1_PORT \
        -u QUAN_INFRA_AMQP2_PORT -u QUAN_INFRA_AMQP3_PORT QUAN_INFRA_TOPOLOGY=cluster \
        '$infra' start '$tmp/other' >'$tmp/other.log' 2>&1 &&
        grep -q 'QUAN_INFRA_PG0_PORT' '$tmp/other.log' && [ ! -e '$tmp/other/pg0/data' ]"

# ---------------------------------------------------------------- stop: nothing left

pids=$(awk '{print $2}' "$d/pids" "$d/rcluster/pids" 2>/dev/null | sort -u)
trees=""
for p in $pids; do
    trees+=" $(ps -e -o pid=,ppid= | awk -v r="$p" '$2 == r || $1 == r {print $1}' | tr '\n' ' ')"
done
if "$infra" stop "$d" >"$tmp/stop.log" 2>&1; then ok "infra.sh stop"; else
    bad "infra.sh stop"
    tail -20 "$tmp/stop.log"
fi
alive=""
for p in $pids $trees; do
    if [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then alive+=" $p"; fi
done
check "every process start recorded (and its children) is gone${alive:+: left$alive}" test -z "$alive"
left=$(ps -e -ww -o pid=,args= | grep -F -e "$d" -e "$(readlink -f "$QUAN_INFRA_PG0_DATA")" | grep -v grep)
check "no process names the directory" test -z "$left"
[ -z "$left" ] || echo "$left" | sed 's/^/     /'
busy=""
for p in "${rports[@]}" "$QUAN_INFRA_PG0_PORT" "$QUAN_INFRA_PG1_PORT" "$QUAN_INFRA_AMQP1_PORT" \
    "$QUAN_INFRA_AMQP2_PORT" "$QUAN_INFRA_AMQP3_PORT"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && busy+=" $p"
done
check "no port of it answers${busy:+ (answering:$busy)}" test -z "$busy"
"$infra" status "$d" >/dev/null 2>&1
check "status says dead (exit 3)" test $? -eq 3

finish
