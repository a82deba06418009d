#!/usr/bin/env bash
# rcluster.sh — a Redis Cluster of three masters, each with one replica, on 127.0.0.1, all its
# state under one directory (one subdirectory per node: its config, nodes.conf, data and log).
#
#   rcluster.sh start   DIR PORT  start the six nodes on PORT..PORT+5 (what already runs is left
#                                 alone: after a kill, start brings the node back), form the
#                                 cluster the first time, wait until every node says
#                                 cluster_state:ok and every master has its replica
#   rcluster.sh stop    DIR       stop exactly the nodes recorded in DIR/pids (exit 1 if one
#                                 outlived SIGKILL)
#   rcluster.sh status  DIR       each node: alive or dead, pid, port, role (exit 3 if any died)
#   rcluster.sh nodes   DIR       "127.0.0.1:P,127.0.0.1:P+1,..." (QUAN_REDIS_CLUSTER_NODES)
#   rcluster.sh masters DIR       the ports of the masters serving slots now, one a line
#   rcluster.sh kill    DIR PORT [SIGNAL]
#                                 for fault tests: SIGNAL (default KILL) to the node of PORT,
#                                 waits until it is gone; only a node recorded in DIR/pids
#
# Each node binds PORT+i and its cluster bus port PORT+10000+i on 127.0.0.1.
#
# QUAN_INFRA_DURABILITY=durable|fast and QUAN_INFRA_REDIS_APPENDFSYNC as infra.sh: durable
# nodes keep an append-only file, fsynced every second. Nodes time out after 2 s
# (cluster-node-timeout), so a killed master's replica takes over within a few seconds.
# Each node also listens on its port + 10000 (the cluster bus): choose PORT so that those stay
# below the kernel's ephemeral range (32768 up), or an outgoing connection may take one first.
set -euo pipefail

TIMEOUT=${QUAN_INFRA_TIMEOUT:-60}
DURABILITY=${QUAN_INFRA_DURABILITY:-durable}
APPENDFSYNC=${QUAN_INFRA_REDIS_APPENDFSYNC:-everysec}
NODE_TIMEOUT_MS=${QUAN_RCLUSTER_NODE_TIMEOUT_MS:-2000}
NODES=6

log() { printf 'rcluster: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    echo "usage: $0 start DIR PORT | stop DIR | status DIR | nodes DIR | masters DIR |" \
        "kill DIR PORT [SIGNAL]" >&2
    exit 2
}

# shellcheck source=deploy/local/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# PID runs the redis-server of port P (a recycled pid never makes us signal another process).
is_ours() {
    pid_alive "$2" || return 1
    [[ "$(tr '\0' ' ' <"/proc/$2/cmdline" 2>/dev/null) " == *"redis-server 127.0.0.1:$1 "* ]]
}

base_port() {
    [ -f "$DIR/port" ] || die "$DIR has no cluster (start it first)"
    cat "$DIR/port"
}

start_node() { # PORT
    local p=$1 d=$DIR/$1
    mkdir -p "$d"
    write_redis_conf "$d" "$p" "$DURABILITY" "$APPENDFSYNC" "cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout $NODE_TIMEOUT_MS
cluster-require-full-coverage yes
cluster-allow-reads-when-down no"
    setsid redis-server "$d/redis.conf" </dev/null >>"$d/redis.log" 2>&1 &
    echo "$p $!" >>"$DIR/pids"
}

# Every node sees the cluster ok, and three masters each have a replica.
cluster_ok() {
    local p i masters
    for i in $(seq 0 $((NODES - 1))); do
        p=$((BASE + i))
        cli "$p" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
    masters=$(cli "$BASE" cluster nodes 2>/dev/null | awk '$3 ~ /master/ && $3 !~ /fail/' | wc -l)
    [ "$masters" -eq 3 ] || return 1
    [ "$(cli "$BASE" cluster nodes 2>/dev/null | awk '$3 ~ /slave/ && $3 !~ /fail/' | wc -l)" -eq 3 ]
}

cmd_start() {
    local want=${1:-} i p pid started=0 addrs=()
    [[ $want =~ ^[0-9]+$ ]] || usage
    lock_base_port "$want" "a cluster"
    for i in $(seq 0 $((NODES - 1))); do
        p=$((BASE + i))
        addrs+=("127.0.0.1:$p")
        pid=$(recorded_pid "$p")
        is_ours "$p" "$pid" && continue
        start_node "$p" 9>&-
        started=1
    done
    for i in $(seq 0 $((NODES - 1))); do
        p=$((BASE + i))
        wait_until "$TIMEOUT" pings "$p" || die "node $p does not answer (see $DIR/$p/redis.log)"
    done
    if [ ! -f "$DIR/formed" ]; then
        # A node that was formed before keeps its nodes.conf; a new set is formed once.
        cli "$BASE" --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
            >"$DIR/create.log" 2>&1 || {
            cat "$DIR/create.log" >&2
            die "redis-cli --cluster create failed"
        }
        touch "$DIR/formed"
    fi
    wait_until "$TIMEOUT" cluster_ok || {
        cli "$BASE" cluster nodes >&2 || true
        die "the cluster did not become ok within ${TIMEOUT}s"
    }
    [ "$started" = 0 ] && log "already running in $DIR" ||
        log "up: 3 masters + 3 replicas on 127.0.0.1:$BASE-$((BASE + NODES - 1))"
}

cmd_stop() { stop_recorded "nodes"; }

cmd_status() {
    local i p pid all=0 role
    BASE=$(base_port)
    for i in $(seq 0 $((NODES - 1))); do
        p=$((BASE + i))
        pid=$(recorded_pid "$p")
        if is_ours "$p" "$pid"; then
            role=$(cli "$p" role 2>/dev/null | head -n 1)
            printf '%-9s %-6s pid=%-8s port=%s role=%s\n' "redis$i" alive "$pid" "$p" "${role:-?}"
        else
            printf '%-9s %-6s pid=%-8s port=%s\n' "redis$i" dead "${pid:--}" "$p"
            all=3
        fi
    done
    return "$all"
}

# Masters that hold slots, as any live node sees them.
cmd_masters() {
    local i p out
    BASE=$(base_port)
    for i in $(seq 0 $((NODES - 1))); do
        p=$((BASE + i))
        if out=$(cli "$p" cluster nodes 2>/dev/null) && [ -n "$out" ]; then
            awk '$3 ~ /master/ && $3 !~ /fail/ && NF > 8 { split($2, a, "[:@]"); print a[2] }' \
                <<<"$out" | sort -n
            return 0
        fi
    done
    die "no node answers"
}

cmd_kill() { kill_recorded "${1:-}" "${2:-KILL}" "$NODES" "node"; }

cmd_nodes() {
    local i out=""
    BASE=$(base_port)
    for i in $(seq 0 $((NODES - 1))); do out+="${out:+,}127.0.0.1:$((BASE + i))"; done
    echo "$out"
}

[ $# -ge 2 ] || usage
DIR=$2
case $1 in
start) cmd_start "${3:-}" ;;
stop) cmd_stop ;;
status) cmd_status ;;
nodes) cmd_nodes ;;
masters) cmd_masters ;;
kill) cmd_kill "${3:-}" "${4:-}" ;;
*) usage ;;
esac
