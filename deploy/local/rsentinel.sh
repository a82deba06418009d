#!/usr/bin/env bash
# rsentinel.sh — a Redis master, one replica and three sentinels watching them, on 127.0.0.1,
# all its state under one directory (one subdirectory per process: its config, data and log).
#
#   rsentinel.sh start   DIR PORT  the master on PORT, its replica on PORT+1, the sentinels on
#                                  PORT+2..PORT+4 (what already runs is left alone: after a
#                                  kill, start brings the process back as a member of the set as
#                                  it is now, whichever node is master); waits until the three
#                                  sentinels agree on a master that has a replica in sync
#   rsentinel.sh stop    DIR       stop exactly the processes recorded in DIR/pids (exit 1 if
#                                  one outlived SIGKILL)
#   rsentinel.sh status  DIR       each process: alive or dead, pid, port, role (exit 3 if any
#                                  died)
#   rsentinel.sh sentinels DIR     "127.0.0.1:P+2,127.0.0.1:P+3,127.0.0.1:P+4"
#                                  (QUAN_REDIS_SENTINELS)
#   rsentinel.sh name    DIR       the master's name the sentinels know (QUAN_REDIS_MASTER_NAME)
#   rsentinel.sh master  DIR       the port of the master the sentinels name now
#   rsentinel.sh kill    DIR PORT [SIGNAL]
#                                  for fault tests: SIGNAL (default KILL) to the process of
#                                  PORT, waits until it is gone; only one recorded in DIR/pids
#
# QUAN_INFRA_DURABILITY=durable|fast and QUAN_INFRA_REDIS_APPENDFSYNC as infra.sh: durable
# servers keep an append-only file, fsynced every second. QUAN_RSENTINEL_NAME (default quan)
# names the master. A master is down for the sentinels after 1 s without an answer
# (down-after-milliseconds), and two of the three must agree (the quorum), so a killed master's
# replica is promoted within a few seconds. The configuration files are written once: the
# servers and the sentinels rewrite them as the set changes (who is master, which sentinels
# and replicas are known), and a restarted process must come back with that, not with the
# first master.
set -euo pipefail

TIMEOUT=${QUAN_INFRA_TIMEOUT:-60}
DURABILITY=${QUAN_INFRA_DURABILITY:-durable}
APPENDFSYNC=${QUAN_INFRA_REDIS_APPENDFSYNC:-everysec}
NAME=${QUAN_RSENTINEL_NAME:-quan}
DOWN_AFTER_MS=${QUAN_RSENTINEL_DOWN_AFTER_MS:-1000}
SERVERS=2
PROCS=5

log() { printf 'rsentinel: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    echo "usage: $0 start DIR PORT | stop DIR | status DIR | sentinels DIR | name DIR |" \
        "master DIR | kill DIR PORT [SIGNAL]" >&2
    exit 2
}

# shellcheck source=deploy/local/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# PID runs the redis-server or redis-sentinel of port P (a recycled pid never makes us signal
# another process).
is_ours() {
    pid_alive "$2" || return 1
    [[ "$(tr '\0' ' ' <"/proc/$2/cmdline" 2>/dev/null) " == redis-*" 127.0.0.1:$1 "* ]]
}

base_port() {
    [ -f "$DIR/port" ] || die "$DIR has no sentinel set (start it first)"
    cat "$DIR/port"
}

start_server() { # PORT: the master (BASE) or the replica
    local p=$1 d=$DIR/$1 extra=""
    mkdir -p "$d"
    if [ ! -f "$d/redis.conf" ]; then
        [ "$p" = "$BASE" ] || extra="replicaof 127.0.0.1 $BASE"
        write_redis_conf "$d" "$p" "$DURABILITY" "$APPENDFSYNC" "$extra"
    fi
    setsid redis-server "$d/redis.conf" </dev/null >>"$d/redis.log" 2>&1 &
    echo "$p $!" >>"$DIR/pids"
}

start_sentinel() { # PORT
    local p=$1 d=$DIR/$1
    mkdir -p "$d"
    if [ ! -f "$d/sentinel.conf" ]; then
        cat >"$d/sentinel.conf" <<EOF
bind 127.0.0.1
port $p
protected-mode no
daemonize no
dir "$d"
logfile "$d/sentinel.log"
sentinel monitor $NAME 127.0.0.1 $BASE 2
sentinel down-after-milliseconds $NAME $DOWN_AFTER_MS
sentinel failover-timeout $NAME 10000
sentinel parallel-syncs $NAME 1
EOF
    fi
    setsid redis-sentinel "$d/sentinel.conf" </dev/null >>"$d/sentinel.out" 2>&1 &
    echo "$p $!" >>"$DIR/pids"
}

# The port of the master sentinel S names ("" when it does not answer).
sentinel_master() {
    cli "$1" sentinel get-master-addr-by-name "$NAME" 2>/dev/null | sed -n 2p
}

# The value of FIELD in what sentinel S says of the master.
sentinel_field() { # S FIELD
    cli "$1" sentinel master "$NAME" 2>/dev/null | awk -v f="$2" 'prev == f { print; exit } { prev = $0 }'
}

# The three sentinels name the same master, it says master and has a replica online, and
# every sentinel knows the other two and the replica (so that a failover can start at once).
set_ok() {
    local m s i
    m=$(sentinel_master $((BASE + SERVERS)))
    [ -n "$m" ] || return 1
    for i in $(seq "$SERVERS" $((PROCS - 1))); do
        s=$((BASE + i))
        [ "$(sentinel_master "$s")" = "$m" ] || return 1
        [ "$(sentinel_field "$s" num-other-sentinels)" = 2 ] || return 1
        # a sentinel that has not seen the replica yet would refuse a failover (NOGOODSLAVE)
        [ "$(sentinel_field "$s" num-slaves)" -ge 1 ] 2>/dev/null || return 1
    done
    [ "$(cli "$m" role 2>/dev/null | head -n 1)" = master ] || return 1
    cli "$m" info replication 2>/dev/null | grep -q '^slave0:.*state=online'
}

cmd_start() {
    local want=${1:-} i p pid started=0
    [[ $want =~ ^[0-9]+$ ]] || usage
    command -v redis-sentinel >/dev/null || die "redis-sentinel is not installed (deploy/local/deps.sh)"
    lock_base_port "$want" "a sentinel set"
    for i in $(seq 0 $((PROCS - 1))); do
        p=$((BASE + i))
        pid=$(recorded_pid "$p")
        is_ours "$p" "$pid" && continue
        if [ "$i" -lt "$SERVERS" ]; then
            start_server "$p" 9>&-
        else
            start_sentinel "$p" 9>&-
        fi
        started=1
    done
    for i in $(seq 0 $((PROCS - 1))); do
        p=$((BASE + i))
        wait_until "$TIMEOUT" pings "$p" || die "process $p does not answer (see $DIR/$p)"
    done
    wait_until "$TIMEOUT" set_ok || {
        cli $((BASE + SERVERS)) sentinel master "$NAME" >&2 || true
        die "the sentinels did not agree on a master with a replica within ${TIMEOUT}s"
    }
    [ "$started" = 0 ] && log "already running in $DIR" ||
        log "up: master $NAME on 127.0.0.1:$(sentinel_master $((BASE + SERVERS))), servers" \
            "on $BASE-$((BASE + 1)), sentinels on $((BASE + 2))-$((BASE + 4))"
}

cmd_stop() { stop_recorded "processes"; }

cmd_status() {
    local i p pid all=0 role what
    BASE=$(base_port)
    for i in $(seq 0 $((PROCS - 1))); do
        p=$((BASE + i))
        pid=$(recorded_pid "$p")
        what=redis$i
        [ "$i" -lt "$SERVERS" ] || what=sentinel$((i - SERVERS))
        if is_ours "$p" "$pid"; then
            role=$(cli "$p" role 2>/dev/null | head -n 1)
            printf '%-9s %-6s pid=%-8s port=%s role=%s\n' "$what" alive "$pid" "$p" "${role:-?}"
        else
            printf '%-9s %-6s pid=%-8s port=%s\n' "$what" dead "${pid:--}" "$p"
            all=3
        fi
    done
    return "$all"
}

cmd_master() {
    local i m
    BASE=$(base_port)
    for i in $(seq "$SERVERS" $((PROCS - 1))); do
        m=$(sentinel_master $((BASE + i)))
        [ -z "$m" ] || {
            echo "$m"
            return 0
        }
    done
    die "no sentinel answers"
}

cmd_kill() { kill_recorded "${1:-}" "${2:-KILL}" "$PROCS" "process"; }

cmd_sentinels() {
    local i out=""
    BASE=$(base_port)
    for i in $(seq "$SERVERS" $((PROCS - 1))); do out+="${out:+,}127.0.0.1:$((BASE + i))"; done
    echo "$out"
}

[ $# -ge 2 ] || usage
DIR=$2
case $1 in
start) cmd_start "${3:-}" ;;
stop) cmd_stop ;;
status) cmd_status ;;
sentinels) cmd_sentinels ;;
name) echo "$NAME" ;;
master) cmd_master ;;
kill) cmd_kill "${3:-}" "${4:-}" ;;
*) usage ;;
esac
