#!/usr/bin/env bash
# infra.sh — run private Redis, PostgreSQL 15 and RabbitMQ instances for Quan on
# 127.0.0.1, with all state under one directory, so tests and `make up` never touch
# the system services and several copies can run side by side.
#
#   infra.sh start  DIR   start whatever is not already running; write DIR/env, DIR/pids
#   infra.sh stop   DIR   stop exactly the processes recorded in DIR/pids
#   infra.sh status DIR   print each service and whether it is alive (exit 3 if not all)
#
# Ports: QUAN_INFRA_REDIS_PORT / QUAN_INFRA_PG_PORT / QUAN_INFRA_AMQP_PORT fix them;
# otherwise the ports of the previous run in DIR are reused when free, else free
# loopback ports are picked.  QUAN_INFRA_TIMEOUT (default 60 s) bounds each wait.
#
# Topology: QUAN_INFRA_TOPOLOGY=single (the default: one of each, as above) or cluster, the
# deployment Quan is written for: a Redis Cluster of three masters with a replica each
# (deploy/local/rcluster.sh), ds_0 and ds_1 on two PostgreSQL servers, and a RabbitMQ cluster
# of three nodes. DIR keeps the topology it was first started with (DIR/topology), which stop
# and status follow. Cluster ports: QUAN_INFRA_RCLUSTER_PORT (the first of six consecutive),
# QUAN_INFRA_PG0_PORT, QUAN_INFRA_PG1_PORT, QUAN_INFRA_AMQP1_PORT..QUAN_INFRA_AMQP3_PORT fix
# them, else as above. QUAN_INFRA_STANDALONE_REDIS=1 adds a lone Redis beside the cluster
# (QUAN_INFRA_STANDALONE_REDIS_PORT), for clients that cannot speak Redis Cluster.
# QUAN_INFRA_TOPOLOGY=sentinel: the single topology with Redis under Sentinel instead of one
# server (deploy/local/rsentinel.sh: a master, its replica and three sentinels on five
# consecutive ports from QUAN_INFRA_REDIS_PORT; DIR/env names the sentinels and the master's
# name, QUAN_REDIS_SENTINELS and QUAN_REDIS_MASTER_NAME, and QUAN_REDIS_PORT is the first
# master's port only: after a failover ask rsentinel.sh master).
#
# TLS: QUAN_INFRA_TLS=1 (single topology) makes a private CA and the servers' certificates
# (deploy/local/tls.sh, in DIR/tls) and encrypts every link: PostgreSQL with ssl = on and
# hostssl lines only (a connection without TLS is refused), RabbitMQ with a TLS listener only,
# Redis with its TLS port only (port 0) and a stunnel client tunnel in front of it that
# verifies the server's certificate, for clients without TLS (hiredis 0.14). DIR/env then
# gives verify-full DSNs, amqps:// URLs and the tunnel as QUAN_REDIS_PORT. DIR keeps the mode
# it was first started with (DIR/tls-mode).
#
# Durability: by default what a server acknowledged survives its crash (PostgreSQL fsync,
# synchronous commit and full pages; Redis' append-only file, fsynced every second, see
# docs/operations.md). QUAN_INFRA_DURABILITY=fast turns all of that off, for test suites
# whose servers live for one run; QUAN_INFRA_REDIS_APPENDFSYNC=always|everysec|no overrides
# Redis' fsync policy. Durable PostgreSQL also archives its WAL into DIR/pg/archive/wal (a
# segment at least every QUAN_INFRA_PG_ARCHIVE_TIMEOUT seconds, default 60) for backup.sh's
# point-in-time restore.
set -euo pipefail

PG_BIN=/usr/lib/postgresql/15/bin      # the Debian build, not /usr/local/bin/pg_ctl
RABBIT_BIN=/usr/lib/rabbitmq/bin       # direct scripts; /usr/sbin wrappers switch user
TIMEOUT=${QUAN_INFRA_TIMEOUT:-60}
DURABILITY=${QUAN_INFRA_DURABILITY:-durable}
case $DURABILITY in
durable | fast) ;;
*)
    echo "infra.sh: QUAN_INFRA_DURABILITY must be durable or fast, not '$DURABILITY'" >&2
    exit 2
    ;;
esac
# Seconds after which a WAL segment is archived even when not full (durable mode): the most
# committed work a restore after the loss of the data directory can lose.
ARCHIVE_TIMEOUT=${QUAN_INFRA_PG_ARCHIVE_TIMEOUT:-60}
if ! [[ $ARCHIVE_TIMEOUT =~ ^[0-9]+$ ]] || [ "$ARCHIVE_TIMEOUT" -lt 1 ] || [ "$ARCHIVE_TIMEOUT" -gt 3600 ]; then
    echo "infra.sh: QUAN_INFRA_PG_ARCHIVE_TIMEOUT must be whole seconds from 1 to 3600, not '$ARCHIVE_TIMEOUT'" >&2
    exit 2
fi
APPENDFSYNC=${QUAN_INFRA_REDIS_APPENDFSYNC:-everysec}
case $APPENDFSYNC in
always | everysec | no) ;;
*)
    echo "infra.sh: QUAN_INFRA_REDIS_APPENDFSYNC must be always, everysec or no" >&2
    exit 2
    ;;
esac
# Unset: the topology DIR already holds, or single for a new DIR.
TOPOLOGY_ASKED=${QUAN_INFRA_TOPOLOGY:-}
case $TOPOLOGY_ASKED in
"" | single | cluster | sentinel) ;;
*)
    echo "infra.sh: QUAN_INFRA_TOPOLOGY must be single, cluster or sentinel, not '$TOPOLOGY_ASKED'" >&2
    exit 2
    ;;
esac
TLS_ASKED=${QUAN_INFRA_TLS:-}
case $TLS_ASKED in
"" | 0 | 1) ;;
*)
    echo "infra.sh: QUAN_INFRA_TLS must be 0 or 1, not '$TLS_ASKED'" >&2
    exit 2
    ;;
esac
TLS=0
TLS_SH=$(cd "$(dirname "$0")" && pwd)/tls.sh
STOP_GRACE=15                          # seconds between SIGTERM and SIGKILL
# Debian's interpreter directly: a pyenv shim first in PATH costs ~0.5 s a call.
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=$(command -v python3 || echo python3)
SERVICES="redis postgres epmd rabbitmq stunnel"
# The cluster topology's processes in DIR/pids (the Redis Cluster's are rcluster.sh's, in
# DIR/rcluster/pids; "redis" is the optional standalone one).
CLUSTER_SERVICES="postgres0 postgres1 epmd rabbitmq1 rabbitmq2 rabbitmq3 redis"
RCLUSTER=$(cd "$(dirname "$0")" && pwd)/rcluster.sh
# The sentinel topology's Redis: rsentinel.sh's five processes, in DIR/rsentinel/pids.
RSENTINEL=$(cd "$(dirname "$0")" && pwd)/rsentinel.sh
SENTINEL=0

log() { printf 'infra: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    echo "usage: $0 start|stop|status DIR" >&2
    exit 2
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# ---------------------------------------------------------------- processes

# shellcheck source=deploy/local/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# "pid starttime" of PID and all its descendants.  erl_child_setup,
# inet_gethost and postgres backends call setsid themselves, so a process
# group would not hold them; the parent/child tree does.
proc_tree() {
    local p t
    for p in $(ps -e -ww -o pid=,ppid= | awk -v root="$1" '
        { kids[$2] = kids[$2] " " $1 }
        END { q[1] = root; h = 1; t = 1
              while (h <= t) { p = q[h++]; print p
                               c = split(kids[p], a, " ")
                               for (i = 1; i <= c; i++) q[++t] = a[i] } }'); do
        t=$(pid_starttime "$p") && echo "$p $t"
    done
}

# True if "pid starttime" still names a live (non-zombie) process.
same_alive() { pid_alive "$1" && [ "$(pid_starttime "$1")" = "$2" ]; }

# Command line of PID with NULs turned into spaces, plus a final space so a
# pattern can end with one: ":6379 " must not match ":63790".
pid_cmdline() {
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true
    echo " "
}

# True if PID is alive and is the process we started for service $1, so a
# recycled pid can never make us signal someone else's process.
is_ours() {
    local name=$1 pid=${2:-} cmd env
    pid_alive "$pid" || return 1
    cmd=$(pid_cmdline "$pid")
    case $name in
        redis)    [[ $cmd == *"redis-server 127.0.0.1:$P_REDIS "* ]] ;;
        stunnel)  [[ $cmd == *"stunnel $DIR/stunnel/stunnel.conf "* ]] ;;
        postgres) [[ $cmd == *"/postgres -D $PGD/data "* ]] ;;
        postgres0 | postgres1)
            [[ $cmd == *"/postgres -D $(pg_dir_of "pg${name#postgres}")/data "* ]] ;;
        epmd)     [[ $cmd == *"epmd -port $P_EPMD "* ]] ;;
        rabbitmq | rabbitmq1 | rabbitmq2 | rabbitmq3)
            [[ $cmd == *rabbitmq-server* ]] || return 1
            # The wrapper's environment names our directory (readable as root or owner).
            env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
            [ -z "$env" ] || [[ $env == *"RABBITMQ_PID_FILE=$DIR/rabbit${name#rabbitmq}/pid"* ]]
            ;;
        *) return 1 ;;
    esac
}

service_alive() { is_ours "$1" "$(recorded_pid "$1")"; }

# Append "name pid" to DIR/pids; a single short write, so parallel starters
# appending at once do not interleave.
record_pid() { echo "$1 $2" >>"$DIR/pids"; }

# Poll until "$@" succeeds.  Returns 1 on timeout, 2 if PID (when given) died.
wait_for() {
    local timeout=$1 pid=$2 deadline
    shift 2
    deadline=$(($(date +%s) + timeout))
    while :; do
        if "$@" >/dev/null 2>&1; then return 0; fi
        if [ -n "$pid" ] && ! pid_alive "$pid"; then return 2; fi
        if [ "$(date +%s)" -ge "$deadline" ]; then return 1; fi
        sleep 0.2
    done
}

# Print the end of each log file given, for a failed start.
show_logs() {
    local f
    for f in "$@"; do
        [ -f "$f" ] || continue
        log "---- last lines of $f"
        tail -n 40 "$f" >&2 || true
    done
}

# ---------------------------------------------------------------- ports

# python3 is the simplest portable way to test-bind loopback ports.
#   ports free P...        exit 0 iff every P can be bound on 127.0.0.1 now
#   ports pick N [EXCL...]  print N distinct free ports, none of EXCL
#   ports run N [EXCL...]   print B such that B..B+N-1 and B+10000..B+10000+N-1 are free
#                           (a Redis Cluster: its nodes, and their bus ports 10000 above)
# Picks come from 20000-32000: below the kernel's ephemeral range (so outgoing
# connections don't grab them before our daemons bind), and low enough that
# RabbitMQ's CLI ports (dist port + 10000) stay valid; a run from 20000-21990, so that its
# bus ports stay below the ephemeral range too.  All picked sockets are
# held open until the end so the N ports are distinct.
ports() {
    "$PYTHON" - "$@" <<'PY'
import random, socket, sys

def try_bind(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the servers do: a port held only by TIME_WAIT leftovers counts as free,
    # one with a listener does not.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None

mode, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
if mode == "free":
    held = [try_bind(p) for p in args]
    sys.exit(0 if all(held) else 1)
n, excl = args[0], set(args[1:])
held, out = [], []
if mode == "run":
    for _ in range(2000):
        b = random.randint(20000, 21990 - n)
        want = [b + i for i in range(n)] + [b + 10000 + i for i in range(n)]
        if excl.intersection(want):
            continue
        got = [try_bind(p) for p in want]
        if all(got):
            print(b)
            sys.exit(0)
        for g in got:
            if g:
                g.close()
    sys.exit("no free run of loopback ports found")
for _ in range(5000):
    if len(out) == n:
        break
    p = random.randint(20000, 32000)
    if p in excl or p in out:
        continue
    s = try_bind(p)
    if s:
        held.append(s)
        out.append(p)
if len(out) < n:
    sys.exit("no free loopback ports found")
print(" ".join(map(str, out)))
PY
}

# Previous run's ports, so a restart keeps the same DSNs when possible.
load_ports() {
    P_REDIS="" P_PG="" P_AMQP="" P_DIST="" P_EPMD="" P_RPROM="" P_RTUN=""
    if [ -f "$DIR/ports" ]; then
        # shellcheck source=/dev/null
        . "$DIR/ports"
    fi
}

# keep_or_pick_port VAR PREV WANT WHAT, for choose_ports and choose_cluster_ports: the fixed
# port WANT (named WHAT in errors) when given, which must be free; else PREV when free; else VAR
# is emptied and added to the caller's need, for pick_needed_ports. Ports kept join taken.
keep_or_pick_port() {
    local target=$1 prev=$2 want=$3 what=$4
    if [ -n "$want" ]; then
        [[ $want =~ ^[0-9]+$ ]] || die "$what=$want is not a port"
        ports free "$want" || die "fixed port $want ($what) is already in use on 127.0.0.1"
        printf -v "$target" '%s' "$want"
        taken+=("$want")
    elif [ -n "$prev" ] && ports free "$prev"; then
        taken+=("$prev")
    else
        printf -v "$target" '%s' ""
        need+=("$target")
    fi
}

# Free ports, none of taken, for every variable named in need.
pick_needed_ports() {
    [ "${#need[@]}" -gt 0 ] || return 0
    local picked target
    picked=$(ports pick "${#need[@]}" "${taken[@]}") || die "could not find free ports"
    read -r -a picked <<<"$picked"
    for target in "${need[@]}"; do
        printf -v "$target" '%s' "${picked[0]}"
        picked=("${picked[@]:1}")
    done
}

# Decide the five ports.  A running service keeps its port; a fixed port from
# the environment must be free; otherwise reuse the previous port if free, or
# pick a new one.
choose_ports() {
    local up_redis=$1 up_pg=$2 up_epmd=$3 up_rabbit=$4 up_stunnel=${5:-0}
    local var svc want prev need=() taken=()
    for svc in REDIS PG AMQP DIST EPMD RPROM; do
        var=P_$svc
        prev=${!var}
        case $svc in
            REDIS) [ "$up_redis" = 1 ] && { taken+=("$prev"); continue; } ;;
            PG)    [ "$up_pg" = 1 ] && { taken+=("$prev"); continue; } ;;
            AMQP | DIST) [ "$up_rabbit" = 1 ] && { taken+=("$prev"); continue; } ;;
            # (a node started before it had an exporter gets one at its next start)
            RPROM) [ "$up_rabbit" = 1 ] && [ -n "$prev" ] && { taken+=("$prev"); continue; } ;;
            EPMD)  [ "$up_epmd" = 1 ] && { taken+=("$prev"); continue; } ;;
        esac
        if [ "$svc" = REDIS ] && [ "$SENTINEL" = 1 ]; then
            choose_sentinel_port "$prev"
            continue
        fi
        want=""
        case $svc in
            REDIS) want=${QUAN_INFRA_REDIS_PORT:-} ;;
            PG)    want=${QUAN_INFRA_PG_PORT:-} ;;
            AMQP)  want=${QUAN_INFRA_AMQP_PORT:-} ;;
        esac
        keep_or_pick_port "$var" "$prev" "$want" "QUAN_INFRA_${svc}_PORT"
    done
    # The tunnel's local port (TLS): kept while the tunnel runs, else as above.
    if [ "$TLS" = 1 ]; then
        if [ "$up_stunnel" = 1 ]; then
            taken+=("$P_RTUN")
        else
            keep_or_pick_port P_RTUN "$P_RTUN" "" "the Redis tunnel's port"
        fi
    else
        P_RTUN=""
    fi
    pick_needed_ports
    # Fixed ports from the environment could still coincide with each other.
    local all="$P_REDIS $P_PG $P_AMQP $P_DIST $P_EPMD $P_RPROM $P_RTUN"
    [ "$(tr -s ' ' '\n' <<<"$all" | grep -c .)" -eq "$(tr -s ' ' '\n' <<<"$all" | grep . | sort -u | wc -l)" ] ||
        die "ports collide: $all"
}

# The sentinel topology's five consecutive ports from P_REDIS: the set's own once formed (its
# sentinels know each other and the servers by port), else QUAN_INFRA_REDIS_PORT, else the
# previous run's, else a free run. They join taken.
choose_sentinel_port() {
    local prev=$1 want=${QUAN_INFRA_REDIS_PORT:-} formed=""
    [ -f "$DIR/rsentinel/port" ] && formed=$(cat "$DIR/rsentinel/port")
    if [ -n "$want" ] && ! [[ $want =~ ^[0-9]+$ ]]; then die "QUAN_INFRA_REDIS_PORT=$want is not a port"; fi
    if [ -n "$formed" ]; then
        [ -z "$want" ] || [ "$want" = "$formed" ] ||
            die "QUAN_INFRA_REDIS_PORT=$want: $DIR holds a Sentinel set formed on $formed"
        P_REDIS=$formed
    elif [ -n "$want" ]; then
        P_REDIS=$want
    elif [ -n "$prev" ] && ports free $(seq "$prev" $((prev + 4))); then
        P_REDIS=$prev
    else
        P_REDIS=$(ports run 5 "${taken[@]}") || die "could not find five free consecutive ports"
    fi
    # A formed set's live members hold some of its ports (rsentinel.sh start brings back the
    # others); a new one needs all five.
    # shellcheck disable=SC2046 # seq: the ports, one word each
    [ -n "$formed" ] || ports free $(seq "$P_REDIS" $((P_REDIS + 4))) ||
        die "ports $P_REDIS-$((P_REDIS + 4)) (the Sentinel set's) are in use on 127.0.0.1"
    # shellcheck disable=SC2207 # seq: the ports, one word each
    taken+=($(seq "$P_REDIS" $((P_REDIS + 4))))
}

# A running service keeps its port even if the environment now asks for another.
warn_fixed_ports() {
    local pair
    for pair in "REDIS:$P_REDIS" "PG:$P_PG" "AMQP:$P_AMQP"; do
        local var=QUAN_INFRA_${pair%%:*}_PORT
        if [ -n "${!var:-}" ] && [ "${!var}" != "${pair#*:}" ]; then
            log "warning: $var=${!var} ignored: already running on port ${pair#*:} in $DIR"
        fi
    done
}

# DIR/ports is for this script; DIR/env is what services and tests source.
write_env() {
    cat >"$DIR/ports" <<EOF
P_REDIS=$P_REDIS
P_PG=$P_PG
P_AMQP=$P_AMQP
P_DIST=$P_DIST
P_EPMD=$P_EPMD
P_RPROM=$P_RPROM
P_RTUN=$P_RTUN
EOF
    local host=127.0.0.1 pgq="" amqp_scheme=amqp amqpq="" redis_port=$P_REDIS ca
    if [ "$TLS" = 1 ]; then
        # The certificate's DNS name: rabbitmq-c checks DNS names only; libpq checks either.
        host=localhost
        # The CA's path %-escaped for a URI's query (a clone's path may hold blanks or '&').
        ca=$("$PYTHON" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' \
            "$DIR/tls/ca.crt")
        pgq="?sslmode=verify-full&sslrootcert=$ca"
        amqp_scheme=amqps
        amqpq="?cacertfile=$ca"
        redis_port=$P_RTUN
    fi
    {
        echo "# Written by deploy/local/infra.sh; source it: . $(printf '%q' "$DIR/env")"
        printf 'export QUAN_INFRA_DIR=%q\n' "$DIR"
        echo "export QUAN_INFRA_REDIS_PORT=$P_REDIS"
        echo "export QUAN_INFRA_PG_PORT=$P_PG"
        echo "export QUAN_INFRA_AMQP_PORT=$P_AMQP"
        printf 'export QUAN_DS0_DSN=%q\n' "postgresql://quan@$host:$P_PG/ds_0$pgq"
        printf 'export QUAN_DS1_DSN=%q\n' "postgresql://quan@$host:$P_PG/ds_1$pgq"
        echo "export QUAN_REDIS_HOST=127.0.0.1"
        echo "export QUAN_REDIS_PORT=$redis_port"
        if [ "$SENTINEL" = 1 ]; then
            echo "# Redis Sentinel: a master and its replica on $P_REDIS-$((P_REDIS + 1)), three sentinels"
            echo "# on $((P_REDIS + 2))-$((P_REDIS + 4)); QUAN_REDIS_PORT is the first master only (the"
            echo "# master now: \$QUAN_INFRA_RSENTINEL master \$QUAN_INFRA_RSENTINEL_DIR)"
            echo "export QUAN_REDIS_SENTINELS=127.0.0.1:$((P_REDIS + 2)),127.0.0.1:$((P_REDIS + 3)),127.0.0.1:$((P_REDIS + 4))"
            echo "export QUAN_REDIS_MASTER_NAME=quan"
            echo "export QUAN_INFRA_REDIS_NODE_PORTS=\"$P_REDIS $((P_REDIS + 1))\""
            printf 'export QUAN_INFRA_RSENTINEL_DIR=%q\n' "$DIR/rsentinel"
            printf 'export QUAN_INFRA_RSENTINEL=%q\n' "$RSENTINEL"
        fi
        printf 'export QUAN_AMQP_URL=%q\n' "$amqp_scheme://guest:guest@$host:$P_AMQP/$amqpq"
        if [ "$TLS" = 1 ]; then
            echo "# TLS: every server's certificate is signed by the CA of QUAN_INFRA_TLS_DIR; Redis"
            echo "# speaks TLS only on QUAN_INFRA_REDIS_TLS_PORT, QUAN_REDIS_PORT is the stunnel tunnel"
            printf 'export QUAN_INFRA_TLS_DIR=%q\n' "$DIR/tls"
            echo "export QUAN_INFRA_REDIS_TLS_PORT=$P_REDIS"
            echo "export QUAN_INFRA_REDIS_TUNNEL_PORT=$P_RTUN"
            echo "export PGSSLMODE=verify-full"
            printf 'export PGSSLROOTCERT=%q\n' "$DIR/tls/ca.crt"
        fi
        printf 'export QUAN_INFRA_RABBITMQCTL=%q\n' "$DIR/rabbit/rabbitmqctl"
        echo "# RabbitMQ's Prometheus exporter (per queue: /metrics/detailed?family=queue_coarse_metrics)"
        echo "export QUAN_INFRA_RABBIT_PROM_PORT=$P_RPROM"
        echo "export QUAN_INFRA_RABBIT_PROM_PORTS=$P_RPROM"
        echo "export PGHOST=127.0.0.1"
        echo "export PGPORT=$P_PG"
        echo "export PGUSER=quan"
    } >"$DIR/env"
}

# ---------------------------------------------------------------- redis

start_redis() {
    local d=$DIR/redis pid rc=0
    mkdir -p "$d"
    if [ "$TLS" = 1 ]; then
        # TLS only: no plaintext port; clients need not present a certificate (the tunnel
        # verifies the server, the password authenticates the client where one is set).
        write_redis_conf "$d" 0 "$DURABILITY" "$APPENDFSYNC" "tls-port $P_REDIS
tls-cert-file \"$DIR/tls/server.crt\"
tls-key-file \"$DIR/tls/server.key\"
tls-ca-cert-file \"$DIR/tls/ca.crt\"
tls-auth-clients no"
    else
        write_redis_conf "$d" "$P_REDIS" "$DURABILITY" "$APPENDFSYNC"
    fi
    # setsid: own session, so a Ctrl-C in the caller's terminal doesn't reach it.
    setsid redis-server "$d/redis.conf" </dev/null >>"$d/redis.log" 2>&1 &
    pid=$!
    record_pid redis "$pid"
    wait_for "$TIMEOUT" "$pid" redis_ping || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "redis did not answer PING on port $P_REDIS ($([ "$rc" = 2 ] && echo exited || echo timeout))"
        show_logs "$d/redis.log"
        return 1
    fi
    log "redis    up on 127.0.0.1:$P_REDIS (pid $pid, ${SECONDS}s)"
}

redis_ping() {
    local tls=()
    [ "$TLS" = 0 ] || tls=(--tls --cacert "$DIR/tls/ca.crt" --sni localhost)
    [ "$(redis-cli -h 127.0.0.1 -p "$P_REDIS" "${tls[@]}" ping 2>/dev/null)" = PONG ]
}

# ---------------------------------------------------------------- stunnel (TLS)

# The client side of Redis' TLS: plaintext on 127.0.0.1:P_RTUN, TLS to Redis with its
# certificate checked against the CA (verifyChain) and for the name localhost (checkHost). In a
# pod the same tunnel is a sidecar (deploy/k8s/README.md).
start_stunnel() {
    local d=$DIR/stunnel pid rc=0
    mkdir -p "$d"
    write_stunnel_conf "$d/stunnel.conf" "127.0.0.1:$P_RTUN" "127.0.0.1:$P_REDIS" \
        "$DIR/tls/ca.crt" localhost
    setsid stunnel "$d/stunnel.conf" </dev/null >>"$d/stunnel.log" 2>&1 &
    pid=$!
    record_pid stunnel "$pid"
    wait_for "$TIMEOUT" "$pid" tunnel_ping || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "stunnel did not carry PING to Redis through port $P_RTUN ($([ "$rc" = 2 ] && echo exited || echo timeout))"
        show_logs "$d/stunnel.log"
        return 1
    fi
    log "stunnel  up on 127.0.0.1:$P_RTUN -> TLS 127.0.0.1:$P_REDIS (pid $pid, ${SECONDS}s)"
}

tunnel_ping() { [ "$(redis-cli -h 127.0.0.1 -p "$P_RTUN" ping 2>/dev/null)" = PONG ]; }

stop_stunnel() {
    local pid
    pid=$(recorded_pid stunnel)
    if is_ours stunnel "$pid"; then terminate stunnel "$pid"; fi
}

# Redis then its tunnel, each unless it runs ($1, $2: 1 when it does), for start_bg.
start_redis_tls() {
    if [ "$1" = 0 ]; then start_redis || return 1; fi
    if [ "$2" = 0 ]; then start_stunnel; fi
}

# The sentinel topology's Redis: rsentinel.sh starts what of its set is not running.
start_rsentinel() {
    mkdir -p "$DIR/rsentinel"
    QUAN_INFRA_DURABILITY=$DURABILITY QUAN_INFRA_REDIS_APPENDFSYNC=$APPENDFSYNC \
        QUAN_RSENTINEL_NAME=quan "$RSENTINEL" start "$DIR/rsentinel" "$P_REDIS" || return 1
    log "redis    up: master quan, a replica and three sentinels on 127.0.0.1:$P_REDIS-$((P_REDIS + 4)) (${SECONDS}s)"
}

# Every process of the sentinel topology's set alive.
rsentinel_alive() { [ -f "$DIR/rsentinel/port" ] && "$RSENTINEL" status "$DIR/rsentinel" >/dev/null 2>&1; }

# The store "redis" of the single and sentinel topologies.
redis_alive() {
    if [ "$SENTINEL" = 1 ]; then rsentinel_alive; else service_alive redis; fi
}

# ---------------------------------------------------------------- postgres

# PostgreSQL refuses to run as root, so as root its tools run as `postgres`.
pg_run() {
    if is_root; then
        (cd "$PGD" && runuser -u postgres -- "$@")
    else
        (cd "$PGD" && "$@")
    fi
}

# Where the files of PostgreSQL server NAME are (pg: the single topology's; pg0, pg1: the
# cluster's): DIR/NAME, or where that symbolic link points when DIR lies where the postgres
# user cannot go (see pg_prepare_root).
pg_dir_of() {
    local n=${1:-pg}
    if [ -L "$DIR/$n" ]; then readlink -f "$DIR/$n"; else echo "$DIR/$n"; fi
}
pg_locate() { PGD=$(pg_dir_of pg); }

# Somewhere user postgres can reach, keyed to DIR (and the server's name) so that two clones
# never share it.
pg_outside_dir() {
    local key=$DIR
    [ "${1:-pg}" = pg ] || key=$DIR/$1
    echo "/var/lib/postgresql/quan-$(printf '%s' "$key" | sha1sum | cut -c1-16)"
}

# As root: make sure the postgres user exists and can reach the data directory.  PostgreSQL
# runs as postgres, which cannot enter a clone under a 0700 home such as /root: then its files
# live in /var/lib/postgresql/quan-<hash of DIR> and DIR/pg is a symbolic link to them, so
# stop, status and the next start find exactly that server again.
pg_prepare_root() {
    local n=${1:-pg}
    id -u postgres >/dev/null 2>&1 ||
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin postgres
    chmod 0755 "$DIR"        # mktemp -d makes 0700 dirs that postgres cannot enter
    [ -L "$DIR/$n" ] || mkdir -p "$DIR/$n"
    PGD=$(pg_dir_of "$n")
    chown postgres: "$PGD"
    runuser -u postgres -- test -x "$PGD" -a -w "$PGD" && return 0
    [ ! -L "$DIR/$n" ] || die "user postgres cannot write $PGD"
    # A data directory here could not have been used by postgres: keep it for the user.
    [ ! -e "$DIR/$n/data" ] || die "user postgres cannot reach $DIR/$n/data (move it, or chmod o+x the path)"
    local outside
    outside=$(pg_outside_dir "$n")
    # The link is new, so DIR is new: a fresh clone at the path of one removed, or a .run
    # removed to start afresh. What an earlier DIR at this path left there is nobody's now,
    # and must not come back as this one's data (a server it left running is stopped first).
    if [ -e "$outside" ]; then
        [ ! -f "$outside/data/postmaster.pid" ] ||
            runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$outside/data" -m fast -w stop >/dev/null 2>&1 ||
            true
        rm -rf "$outside"
        log "removed $outside: the PostgreSQL files of an earlier $DIR, which is gone"
    fi
    mkdir -p "$outside"
    chown postgres: "$outside"
    chmod 0700 "$outside"
    rm -rf "${DIR:?}/$n"
    ln -s "$outside" "$DIR/$n"
    PGD=$(pg_dir_of "$n")
    log "postgres cannot enter $DIR: its files are in $PGD ($DIR/$n links there)"
}

start_pg() { start_pg_server pg postgres "$P_PG" "ds_0 ds_1"; }

# pg_tls D: the server of D with TLS on and only hostssl lines, so a connection without TLS is
# refused ("no pg_hba.conf entry ... no encryption"). The key must belong to the server's user.
pg_tls() {
    local d=$1
    mkdir -p "$d/tls"
    cp "$DIR/tls/server.crt" "$DIR/tls/server.key" "$DIR/tls/ca.crt" "$d/tls/"
    chmod 0600 "$d/tls/server.key"
    cat >"$d/tls/pg_hba.conf" <<EOF
# Written by deploy/local/infra.sh (QUAN_INFRA_TLS=1): TLS or nothing.
local     all all                trust
hostssl   all all 127.0.0.1/32   trust
EOF
    cat >>"$d/data/quan.conf" <<EOF
ssl = on
ssl_cert_file = '$d/tls/server.crt'
ssl_key_file = '$d/tls/server.key'
ssl_ca_file = '$d/tls/ca.crt'
ssl_min_protocol_version = 'TLSv1.2'
hba_file = '$d/tls/pg_hba.conf'
EOF
    if is_root; then chown -R postgres: "$d/tls"; fi
}

# start_pg_server NAME LABEL PORT DATABASES: the server whose files are DIR/NAME (pg_dir_of),
# recorded in DIR/pids as LABEL, with role quan owning each of DATABASES.
start_pg_server() {
    local n=$1 label=$2 port=$3 dbs=$4 d sock pid
    PGD=$(pg_dir_of "$n")
    d=$PGD
    mkdir -p "$d"
    if [ ! -f "$d/data/PG_VERSION" ]; then
        rm -rf "$d/data"
        # --no-sync: durability is irrelevant for dev/test data.
        pg_run "$PG_BIN/initdb" -D "$d/data" -U postgres -A trust -E UTF8 --locale=C \
            --no-sync >"$d/initdb.log" 2>&1 || {
            log "initdb failed"
            show_logs "$d/initdb.log"
            return 1
        }
        echo "include_if_exists = 'quan.conf'" >>"$d/data/postgresql.conf"
    fi
    # A Unix socket path is limited to 107 bytes; TCP is what we use anyway.
    sock=$d
    [ "${#sock}" -le 90 ] || sock=""
    # Rewritten on every start: the port may change between runs.
    cat >"$d/data/quan.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sock'
$(if [ "$DURABILITY" = fast ]; then
        printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n'
    else
        # Durable, and sized for bulk writes: fewer checkpoints mean fewer full-page images
        # in the WAL (a distribution task writes millions of rows).
        printf 'max_wal_size = 4GB\ncheckpoint_timeout = 15min\n'
        # Every WAL segment copied to the archive (backup.sh restores from it to a point in
        # time); a segment is cut after ARCHIVE_TIMEOUT even when not full: the RPO.
        printf 'wal_level = replica\narchive_mode = on\narchive_timeout = %s\n' "$ARCHIVE_TIMEOUT"
        printf "archive_command = 'test ! -f %s/%%f && cp %%p %s/%%f.part && mv %s/%%f.part %s/%%f'\n" \
            "$d/archive/wal" "$d/archive/wal" "$d/archive/wal" "$d/archive/wal"
    fi)
max_connections = 200
shared_buffers = 64MB
EOF
    if [ "$DURABILITY" = durable ]; then
        mkdir -p "$d/archive/wal" "$d/archive/base"
        if is_root; then chown postgres: "$d/archive" "$d/archive/wal" "$d/archive/base"; fi
    fi
    if [ "$TLS" = 1 ]; then pg_tls "$d"; fi
    if is_root; then chown postgres: "$d/data/quan.conf"; fi
    if ! pg_run "$PG_BIN/pg_ctl" start -D "$d/data" -l "$d/postgres.log" -w -t "$TIMEOUT" \
        >>"$d/pg_ctl.log" 2>&1; then
        pid=$(head -n 1 "$d/data/postmaster.pid" 2>/dev/null || true)
        [ -z "$pid" ] || record_pid "$label" "$pid"
        log "$label did not start on port $port"
        show_logs "$d/pg_ctl.log" "$d/postgres.log"
        return 1
    fi
    pid=$(head -n 1 "$d/data/postmaster.pid")
    record_pid "$label" "$pid"
    wait_for "$TIMEOUT" "$pid" "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" || {
        log "pg_isready never succeeded on port $port"
        show_logs "$d/postgres.log"
        return 1
    }
    # Role and databases, created only if absent so restarts are no-ops; one
    # psql run (\gexec executes each generated statement on its own, as
    # CREATE DATABASE requires).
    pg_run "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres \
        -d postgres -v dbs="{${dbs// /,}}" >>"$d/pg_ctl.log" 2>&1 <<'SQL' || {
SELECT 'CREATE ROLE quan LOGIN SUPERUSER'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'quan') \gexec
SELECT format('CREATE DATABASE %I OWNER quan', db) FROM unnest(:'dbs'::text[]) AS db
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = db) \gexec
SQL
        log "creating role quan / databases ${dbs// /, } failed"
        show_logs "$d/pg_ctl.log"
        return 1
    }
    log "$label up on 127.0.0.1:$port (pid $pid, ${dbs// /, }, ${SECONDS}s)"
}

# ---------------------------------------------------------------- rabbitmq

# Everything rabbitmq-server and rabbitmqctl need to find our node and nothing
# of the system's (/etc/rabbitmq, /var/lib/rabbitmq, the shared epmd on 4369).
write_rabbit_env() { write_rabbit_env_at "$DIR/rabbit" "quan-$P_AMQP@localhost" "$P_AMQP" "$P_DIST"; }

# write_rabbit_env_at R NODE AMQP DIST: the node whose files are in R (its HOME too).
write_rabbit_env_at() {
    local r=$1 node=$2 amqp=$3 dist=$4
    {
        printf 'export HOME=%q\n' "$r"
        echo "export RABBITMQ_NODENAME=$node"
        echo "export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1"
        echo "export RABBITMQ_NODE_PORT=$amqp"
        echo "export RABBITMQ_DIST_PORT=$dist"
        echo "export ERL_EPMD_PORT=$P_EPMD"
        echo "export ERL_EPMD_ADDRESS=127.0.0.1"
        # Erlang distribution listens on all interfaces unless told otherwise,
        # for the node and for rabbitmqctl alike. The broker shares its cores with the services,
        # Redis and PostgreSQL: its schedulers must not spin while waiting for work (+sbwt),
        # which took CPU from the engine on this 2-core machine (QUAN_INFRA_RABBIT_ERL_EXTRA
        # replaces these flags).
        echo "export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1} ${QUAN_INFRA_RABBIT_ERL_EXTRA-+sbwt none +sbwtdcpu none +sbwtdio none}'"
        echo "export RABBITMQ_CTL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}'"
        printf 'export RABBITMQ_MNESIA_BASE=%q\n' "$r/mnesia"
        printf 'export RABBITMQ_LOG_BASE=%q\n' "$r/log"
        printf 'export RABBITMQ_SCHEMA_DIR=%q\n' "$r/schema"
        printf 'export RABBITMQ_GENERATED_CONFIG_DIR=%q\n' "$r/config"
        printf 'export RABBITMQ_PID_FILE=%q\n' "$r/pid"
        printf 'export RABBITMQ_CONFIG_FILE=%q\n' "$r/rabbitmq.conf"
        printf 'export RABBITMQ_ADVANCED_CONFIG_FILE=%q\n' "$r/advanced.config"
        printf 'export RABBITMQ_ENABLED_PLUGINS_FILE=%q\n' "$r/enabled_plugins"
        # Keep /etc/rabbitmq/rabbitmq-env.conf from overriding any of the above.
        printf 'export RABBITMQ_CONF_ENV_FILE=%q\n' "$r/rabbitmq-env.conf"
    } >"$r/env"
    # A rabbitmqctl that talks to this node: R/rabbitmqctl status
    cat >"$r/rabbitmqctl" <<EOF
#!/usr/bin/env bash
. $(printf '%q' "$r/env")
exec $RABBIT_BIN/rabbitmqctl -n "\$RABBITMQ_NODENAME" "\$@"
EOF
    chmod 0755 "$r/rabbitmqctl"
}

# AMQP-level readiness: the broker answers the protocol header with a
# Connection.Start method frame (type 1, channel 0).
amqp_ready() {
    # Cheap refusal check first; the handshake only once something listens.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null || return 1
    "$PYTHON" - "$1" "$([ "$TLS" = 0 ] || echo "$DIR/tls/ca.crt")" <<'PY'
import socket, ssl, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
if sys.argv[2]:  # the TLS listener, its certificate checked as clients do
    s = ssl.create_default_context(cafile=sys.argv[2]).wrap_socket(s, server_hostname="localhost")
s.sendall(b"AMQP\x00\x00\x09\x01")
f = s.recv(7)
sys.exit(0 if len(f) == 7 and f[0] == 1 and f[1:3] == b"\x00\x00" else 1)
PY
}

epmd_ready() { epmd -port "$P_EPMD" -names; }

# rabbit_files R AMQP PROM [EXTRA_CONF]: the directories and configuration of the node in R (its
# env and rabbitmqctl come from write_rabbit_env*); PROM is its Prometheus exporter's port.
rabbit_files() {
    local r=$1 amqp=$2 prom=$3 extra=${4:-}
    mkdir -p "$r/mnesia" "$r/log" "$r/schema" "$r/config"
    # Private cookie in our HOME, readable only by us as Erlang demands.
    if [ ! -f "$r/.erlang.cookie" ]; then
        od -An -N20 -tx1 /dev/urandom | tr -d ' \n' | tr 'a-f' 'A-F' >"$r/.erlang.cookie"
        chmod 0400 "$r/.erlang.cookie"
    fi
    # No management plugin (a slower boot); the Prometheus exporter only, for the queue alerts
    # of deploy/prometheus (queue depths per queue).
    echo "[rabbitmq_prometheus]." >"$r/enabled_plugins"
    : >"$r/rabbitmq-env.conf"
    cat >"$r/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$amqp
prometheus.tcp.ip = 127.0.0.1
prometheus.tcp.port = $prom
log.console = false
log.file.level = info
$extra
EOF
    rm -f "$r/pid"
}

# Our own epmd, started before the nodes so that a node doesn't spawn a daemonized one we
# could not track; foreground + setsid gives us its exact pid. R: a node's files (env, log).
start_epmd() {
    local r=$1 pid
    (
        # shellcheck source=/dev/null
        . "$r/env"
        exec setsid epmd -port "$P_EPMD" -address 127.0.0.1
    ) </dev/null >>"$r/log/epmd.log" 2>&1 &
    pid=$!
    record_pid epmd "$pid"
    wait_for 10 "$pid" epmd_ready || {
        log "epmd did not start on port $P_EPMD"
        show_logs "$r/log/epmd.log"
        return 1
    }
}

# launch_rabbit R LABEL NODE AMQP: runs the node of R, recorded as LABEL, until it accepts AMQP.
launch_rabbit() {
    local r=$1 label=$2 node=$3 amqp=$4 pid rc=0
    # setsid: detached from the caller's terminal and session.  stop finds
    # beam.smp, erl_child_setup and inet_gethost as the wrapper's descendants.
    (
        # shellcheck source=/dev/null
        . "$r/env"
        exec setsid "$RABBIT_BIN/rabbitmq-server"
    ) </dev/null >>"$r/log/console.log" 2>&1 &
    pid=$!
    record_pid "$label" "$pid"
    wait_for "$TIMEOUT" "$pid" amqp_ready "$amqp" || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "$label did not accept AMQP on port $amqp ($([ "$rc" = 2 ] && echo exited || echo timeout))"
        show_logs "$r/log/console.log" "$r/log/$node.log"
        return 1
    fi
    log "$label up on 127.0.0.1:$amqp (pid $pid, node $node, ${SECONDS}s)"
}

start_rabbit() {
    local r=$DIR/rabbit epmd_up=$1 extra=""
    if [ "$TLS" = 1 ]; then
        # The TLS listener only; a client certificate signed by the CA is verified, a client
        # without one is let in (it logs in with its password).
        extra="listeners.tcp = none
listeners.ssl.default = 127.0.0.1:$P_AMQP
ssl_options.cacertfile = $DIR/tls/ca.crt
ssl_options.certfile = $DIR/tls/server.crt
ssl_options.keyfile = $DIR/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2"
    fi
    rabbit_files "$r" "$P_AMQP" "$P_RPROM" "$extra"
    write_rabbit_env
    if [ "$epmd_up" != 1 ]; then start_epmd "$r" || return 1; fi
    launch_rabbit "$r" rabbitmq "quan-$P_AMQP@localhost" "$P_AMQP"
}

# ---------------------------------------------------------------- commands

# One start or stop at a time per DIR (e.g. parallel make targets).  The lock
# fd must not leak into the daemons, or it would stay held after we exit.
lock_dir() {
    exec 9>>"$DIR/.lock"
    flock -w 180 9 || die "another infra.sh holds $DIR/.lock"
}

# The servers start in parallel. start_bg NAME CMD...: CMD in the background (without the lock
# fd), as the starter of NAME. wait_started MESSAGE: waits for every starter, then logs MESSAGE,
# or which failed to start (and returns 1).
STARTERS=()
STARTER_NAMES=()
start_bg() {
    local name=$1
    shift
    "$@" 9>&- &
    STARTERS+=("$!")
    STARTER_NAMES+=("$name")
}
wait_started() {
    local i failed=()
    for i in "${!STARTERS[@]}"; do
        wait "${STARTERS[$i]}" || failed+=("${STARTER_NAMES[$i]}")
    done
    if [ "${#failed[@]}" -gt 0 ]; then
        log "failed to start: ${failed[*]}; clean up with: $0 stop $DIR"
        return 1
    fi
    log "$1"
}

cmd_start() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd -P)
    pg_locate
    lock_dir
    command -v "$PYTHON" >/dev/null || die "python3 is required (deploy/local/deps.sh)"
    claim_topology
    if [ "$TOPOLOGY_WANTED" = cluster ]; then
        cmd_start_cluster
        return
    fi
    [ "$TOPOLOGY_WANTED" != sentinel ] || SENTINEL=1
    load_ports
    claim_tls
    [ "$TLS" = 0 ] || [ "$SENTINEL" = 0 ] ||
        die "QUAN_INFRA_TLS=1 is for the single topology, not sentinel"

    local up_redis=0 up_pg=0 up_epmd=0 up_rabbit=0 up_stunnel=$((1 - TLS))
    redis_alive && up_redis=1
    service_alive postgres && up_pg=1
    service_alive epmd && up_epmd=1
    service_alive rabbitmq && up_rabbit=1
    [ "$TLS" = 0 ] || ! service_alive stunnel || up_stunnel=1
    if [ "$up_redis$up_pg$up_epmd$up_rabbit$up_stunnel" = 11111 ]; then
        warn_fixed_ports
        log "already running in $DIR (. $DIR/env)"
        return 0
    fi
    # A node whose epmd vanished can't be managed by rabbitmqctl: restart both.
    if [ "$up_rabbit" = 1 ] && [ "$up_epmd" = 0 ]; then
        log "rabbitmq is running without its epmd; restarting it"
        terminate rabbitmq "$(recorded_pid rabbitmq)"
        up_rabbit=0
    fi
    if [ "$up_rabbit" = 0 ]; then stop_orphan_beam; fi

    # Keep only the entries of services still alive; starters append the rest.
    local keep="" svc pid
    for svc in $SERVICES; do
        pid=$(recorded_pid "$svc")
        if is_ours "$svc" "$pid"; then keep+="$svc $pid"$'\n'; fi
    done
    printf '%s' "$keep" >"$DIR/pids"

    choose_ports "$up_redis" "$up_pg" "$up_epmd" "$up_rabbit" "$up_stunnel"
    warn_fixed_ports
    write_env
    if [ "$TLS" = 1 ]; then "$TLS_SH" "$DIR/tls" || die "could not make the certificates in $DIR/tls"; fi

    if [ "$up_pg" = 0 ] && is_root; then pg_prepare_root; fi

    # The three start in parallel; RabbitMQ is the slow one (Redis with its tunnel under TLS).
    if [ "$up_redis" = 0 ] && [ "$SENTINEL" = 1 ]; then
        start_bg redis start_rsentinel
    elif [ "$TLS" = 1 ]; then
        if [ "$up_redis$up_stunnel" != 11 ]; then
            start_bg redis start_redis_tls "$up_redis" "$up_stunnel"
        fi
    elif [ "$up_redis" = 0 ]; then
        start_bg redis start_redis
    fi
    if [ "$up_pg" = 0 ]; then start_bg postgres start_pg; fi
    if [ "$up_rabbit" = 0 ]; then start_bg rabbitmq start_rabbit "$up_epmd"; fi
    wait_started "ready; environment in $DIR/env"
}

# SIGTERM to PID, wait up to STOP_GRACE seconds for it and every descendant
# it had (snapshotted first: they are re-parented once it dies), then SIGKILL
# whichever of exactly those processes is left.
terminate() {
    local name=$1 pid=$2 tree p t left deadline
    tree=$(proc_tree "$pid")
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(($(date +%s) + STOP_GRACE))
    while :; do
        left=""
        while read -r p t; do
            [ -n "$p" ] || continue
            if same_alive "$p" "$t"; then left+=" $p"; fi
        done <<<"$tree"
        if [ -z "$left" ] || [ "$(date +%s)" -ge "$deadline" ]; then break; fi
        sleep 0.2
    done
    if [ -n "$left" ]; then
        log "$name: pids$left outlived SIGTERM by ${STOP_GRACE}s; sending SIGKILL"
        while read -r p t; do
            if [ -n "$p" ] && same_alive "$p" "$t"; then kill -KILL "$p" 2>/dev/null || true; fi
        done <<<"$tree"
    fi
    log "$name stopped (pid $pid)"
}

stop_redis() {
    local pid
    if [ "$SENTINEL" = 1 ]; then
        "$RSENTINEL" stop "$DIR/rsentinel"
        return
    fi
    pid=$(recorded_pid redis)
    if is_ours redis "$pid"; then terminate redis "$pid"; fi
}

stop_pg() { stop_pg_server pg postgres; }

# stop_pg_server NAME LABEL: the server of DIR/NAME, recorded as LABEL.
stop_pg_server() {
    local n=$1 label=$2 pid
    PGD=$(pg_dir_of "$n")
    pid=$(recorded_pid "$label")
    is_ours "$label" "$pid" || return 0
    # Fast shutdown: roll back sessions, no waiting for clients.
    if pg_run "$PG_BIN/pg_ctl" stop -D "$PGD/data" -m fast -w -t "$STOP_GRACE" \
        >>"$PGD/pg_ctl.log" 2>&1; then
        log "$label stopped (pid $pid)"
    else
        terminate "$label" "$pid"
    fi
}

# If the wrapper died on its own, beam.smp lives on, re-parented, holding the
# ports; its command line names our private HOME, which no other node shares.
# R: the node's files (default DIR/rabbit, the single topology's).
stop_orphan_beam() {
    local m r=${1:-$DIR/rabbit}
    for m in $(ps -e -ww -o pid=,args= | M="-home $r " \
        awk '/beam/ && index($0, ENVIRON["M"]) { print $1 }'); do
        terminate rabbitmq-beam "$m"
    done
}

stop_rabbit() {
    local pid
    pid=$(recorded_pid rabbitmq)
    if is_ours rabbitmq "$pid"; then
        terminate rabbitmq "$pid"
    fi
    stop_orphan_beam
    pid=$(recorded_pid epmd)
    if is_ours epmd "$pid"; then terminate epmd "$pid"; fi
}

cmd_stop() {
    if [ ! -d "$DIR" ]; then
        log "$DIR does not exist; nothing to stop"
        return 0
    fi
    DIR=$(cd "$DIR" && pwd -P)
    pg_locate
    lock_dir
    if [ "$(dir_topology)" = cluster ]; then
        cmd_stop_cluster
        return
    fi
    [ "$(dir_topology)" != sentinel ] || SENTINEL=1
    load_ports
    local jobs=() j
    stop_redis & jobs+=($!)
    stop_stunnel & jobs+=($!)
    stop_pg & jobs+=($!)
    stop_rabbit & jobs+=($!)
    for j in "${jobs[@]}"; do wait "$j" || true; done
    local svc left=""
    for svc in $SERVICES; do
        if [ "$svc" = redis ] && [ "$SENTINEL" = 1 ]; then
            "$RSENTINEL" status "$DIR/rsentinel" 2>/dev/null | grep -q ' alive ' && left+=" redis"
        elif service_alive "$svc"; then left+=" $svc"; fi
    done
    [ -z "$left" ] || die "still running:$left"
    rm -f "$DIR/pids"
}

cmd_status() {
    if [ ! -d "$DIR" ]; then
        log "$DIR does not exist"
        return 3
    fi
    DIR=$(cd "$DIR" && pwd -P)
    pg_locate
    if [ "$(dir_topology)" = cluster ]; then
        cmd_status_cluster
        return
    fi
    [ "$(dir_topology)" != sentinel ] || SENTINEL=1
    load_ports
    local svc pid port state all=0
    for svc in $SERVICES; do
        if [ "$svc" = redis ] && [ "$SENTINEL" = 1 ]; then
            "$RSENTINEL" status "$DIR/rsentinel" 2>/dev/null || all=3
            continue
        fi
        pid=$(recorded_pid "$svc")
        case $svc in
            redis) port=$P_REDIS ;; postgres) port=$P_PG ;;
            epmd) port=$P_EPMD ;; rabbitmq) port=$P_AMQP ;;
            stunnel) # only in the TLS mode
                [ -n "$P_RTUN" ] || continue
                port=$P_RTUN ;;
        esac
        if is_ours "$svc" "$pid"; then state=alive; else state=dead; all=3; fi
        printf '%-9s %-6s pid=%-8s port=%s\n' "$svc" "$state" "${pid:--}" "${port:--}"
    done
    return "$all"
}

# ---------------------------------------------------------------- the cluster topology

# DIR keeps the topology it was first started with: ports, pids and data of one mean nothing
# to the other. A directory from before topologies existed holds the single one.
dir_topology() {
    if [ -f "$DIR/topology" ]; then
        cat "$DIR/topology"
    elif [ -f "$DIR/ports" ]; then
        echo single
    else
        echo none
    fi
}

# The single topology's TLS mode, kept by DIR (DIR/tls-mode) like its topology: its servers'
# configuration and the clients' settings depend on it.
claim_tls() {
    local have=""
    [ ! -f "$DIR/tls-mode" ] || have=$(cat "$DIR/tls-mode")
    TLS=${TLS_ASKED:-${have:-0}}
    if [ -n "$have" ] && [ "$have" != "$TLS" ]; then
        die "$DIR was started with QUAN_INFRA_TLS=$have, not $TLS (stop it with $0 stop $DIR and use another directory)"
    fi
    echo "$TLS" >"$DIR/tls-mode"
}

claim_topology() {
    local have
    have=$(dir_topology)
    TOPOLOGY_WANTED=${TOPOLOGY_ASKED:-$have}
    [ "$TOPOLOGY_WANTED" != none ] || TOPOLOGY_WANTED=single
    if [ "$have" != none ] && [ "$have" != "$TOPOLOGY_WANTED" ]; then
        die "$DIR holds the $have topology, not $TOPOLOGY_WANTED (stop it with $0 stop $DIR and use another directory)"
    fi
    echo "$TOPOLOGY_WANTED" >"$DIR/topology"
}

# $1's value: a variable named by the caller (P_AMQP2 and the like).
val() { printf '%s' "${!1}"; }

# The cluster's ports: the Redis Cluster's first (six consecutive), a PostgreSQL server per
# database, three RabbitMQ nodes (AMQP and Erlang distribution) with one epmd, and the
# standalone Redis when there is one.
CLUSTER_PORTS="PG0 PG1 AMQP1 AMQP2 AMQP3 DIST1 DIST2 DIST3 EPMD REDIS RPROM1 RPROM2 RPROM3"
load_cluster_ports() {
    P_RCLUSTER="" P_REDIS="" P_EPMD=""
    local v
    for v in $CLUSTER_PORTS; do printf -v "P_$v" '%s' ""; done
    if [ -f "$DIR/ports" ]; then
        # shellcheck source=/dev/null
        . "$DIR/ports"
    fi
}

# The six ports of the Redis Cluster from base $1 and their bus ports.
rcluster_ports() {
    local i
    for i in 0 1 2 3 4 5; do echo "$(($1 + i)) $(($1 + 10000 + i))"; done | tr '\n' ' '
}

# A running service keeps its port; a fixed port from the environment must be free;
# otherwise the previous port if free, or a new one. UP_<name> says what runs.
choose_cluster_ports() {
    local name var env want prev up need=() taken=() all
    # The Redis Cluster's nodes know each other by port: once formed, its ports are its own.
    local formed=""
    [ -f "$DIR/rcluster/port" ] && formed=$(cat "$DIR/rcluster/port")
    want=${QUAN_INFRA_RCLUSTER_PORT:-}
    if [ -n "$want" ] && ! [[ $want =~ ^[0-9]+$ ]]; then die "QUAN_INFRA_RCLUSTER_PORT=$want is not a port"; fi
    # shellcheck disable=SC2046 # rcluster_ports: the ports, one word each
    if [ -n "$formed" ]; then
        [ -z "$want" ] || [ "$want" = "$formed" ] ||
            die "QUAN_INFRA_RCLUSTER_PORT=$want: $DIR holds a Redis Cluster formed on $formed"
        P_RCLUSTER=$formed
    elif [ -n "$want" ]; then
        ports free $(rcluster_ports "$want") ||
            die "QUAN_INFRA_RCLUSTER_PORT=$want: ports $want-$((want + 5)) or their bus ports $((want + 10000))-$((want + 10005)) are in use on 127.0.0.1"
        P_RCLUSTER=$want
    elif [ -n "$P_RCLUSTER" ] && ports free $(rcluster_ports "$P_RCLUSTER"); then
        :
    else
        P_RCLUSTER=""
    fi
    # shellcheck disable=SC2207
    [ -z "$P_RCLUSTER" ] || taken+=($(rcluster_ports "$P_RCLUSTER"))
    for name in $CLUSTER_PORTS; do
        var=P_$name
        if [ "$name" = REDIS ] && [ "$WANT_REDIS" = 0 ] && [ "$UP_REDIS" = 0 ]; then
            P_REDIS="" # no standalone Redis this time
            continue
        fi
        prev=$(val "$var")
        case $name in
            DIST?) up=$(val "UP_R${name#DIST}") ;;
            AMQP?) up=$(val "UP_R${name#AMQP}") ;;
            # (a node started before it had an exporter gets one at its next start)
            RPROM?) up=$(val "UP_R${name#RPROM}"); [ -n "$prev" ] || up=0 ;;
            *) up=$(val "UP_$name") ;;
        esac
        if [ "$up" = 1 ]; then taken+=("$prev"); continue; fi
        case $name in
            PG0 | PG1 | AMQP1 | AMQP2 | AMQP3) env=QUAN_INFRA_${name}_PORT ;;
            REDIS) env=QUAN_INFRA_STANDALONE_REDIS_PORT ;;
            *) env="" ;;
        esac
        want=""
        [ -z "$env" ] || want=${!env:-}
        keep_or_pick_port "$var" "$prev" "$want" "$env"
    done
    if [ -z "$P_RCLUSTER" ]; then
        P_RCLUSTER=$(ports run 6 "${taken[@]}") || die "could not find six free consecutive ports"
        # shellcheck disable=SC2207
        taken+=($(rcluster_ports "$P_RCLUSTER"))
    fi
    pick_needed_ports
    all="$(rcluster_ports "$P_RCLUSTER")"
    for name in $CLUSTER_PORTS; do all+=" $(val "P_$name")"; done
    # shellcheck disable=SC2086
    all=$(echo $all)
    [ "$(tr ' ' '\n' <<<"$all" | sort | uniq -d | wc -l)" -eq 0 ] || die "ports collide: $all"
}

# The first Redis node (a master when the cluster is formed), every node, in the forms the
# environment gives them.
rcluster_node_list() {
    local i out=""
    for i in 0 1 2 3 4 5; do out+="${out:+$1}127.0.0.1:$((P_RCLUSTER + i))"; done
    echo "$out"
}

write_cluster_env() {
    local v n urls=""
    {
        echo "P_RCLUSTER=$P_RCLUSTER"
        for v in $CLUSTER_PORTS; do echo "P_$v=$(val "P_$v")"; done
    } >"$DIR/ports"
    for n in 1 2 3; do urls+="${urls:+,}amqp://guest:guest@127.0.0.1:$(val "P_AMQP$n")/"; done
    {
        echo "# Written by deploy/local/infra.sh (topology cluster); source it: . $(printf '%q' "$DIR/env")"
        printf 'export QUAN_INFRA_DIR=%q\n' "$DIR"
        echo "# Redis Cluster: three masters and three replicas; rcluster.sh manages the nodes"
        echo "export QUAN_INFRA_RCLUSTER_PORT=$P_RCLUSTER"
        printf 'export QUAN_INFRA_RCLUSTER_DIR=%q\n' "$DIR/rcluster"
        printf 'export QUAN_INFRA_RCLUSTER=%q\n' "$RCLUSTER"
        echo "export QUAN_INFRA_REDIS_NODE_PORTS=\"$(seq -s ' ' "$P_RCLUSTER" $((P_RCLUSTER + 5)))\""
        echo "export QUAN_REDIS_CLUSTER_NODES=$(rcluster_node_list ,)"
        echo "# one node, for tools that speak to one server (redis-cli -c follows the cluster)"
        echo "export QUAN_REDIS_HOST=127.0.0.1"
        echo "export QUAN_REDIS_PORT=$P_RCLUSTER"
        if [ -n "$P_REDIS" ]; then
            echo "# the standalone Redis beside the cluster (QUAN_INFRA_STANDALONE_REDIS=1)"
            echo "export QUAN_INFRA_STANDALONE_REDIS_PORT=$P_REDIS"
        fi
        echo "# PostgreSQL: ds_0 and ds_1 on a server each"
        for n in 0 1; do
            echo "export QUAN_INFRA_PG${n}_PORT=$(val "P_PG$n")"
            printf 'export QUAN_INFRA_PG%s_DATA=%q\n' "$n" "$(pg_dir_of "pg$n")/data"
            echo "export QUAN_DS${n}_DSN=postgresql://quan@127.0.0.1:$(val "P_PG$n")/ds_$n"
        done
        echo "export QUAN_INFRA_PG_PORT=$P_PG0"
        echo "export PGHOST=127.0.0.1"
        echo "export PGPORT=$P_PG0"
        echo "export PGUSER=quan"
        echo "# RabbitMQ: three nodes of one cluster; quorum queues are replicated over them"
        for n in 1 2 3; do
            echo "export QUAN_INFRA_AMQP${n}_PORT=$(val "P_AMQP$n")"
            printf 'export QUAN_INFRA_RABBITMQCTL%s=%q\n' "$n" "$DIR/rabbit$n/rabbitmqctl"
        done
        echo "export QUAN_INFRA_RABBITMQ_NODES=\"quan1@localhost quan2@localhost quan3@localhost\""
        echo "export QUAN_INFRA_AMQP_PORT=$P_AMQP1"
        printf 'export QUAN_INFRA_RABBITMQCTL=%q\n' "$DIR/rabbit1/rabbitmqctl"
        echo "# RabbitMQ's Prometheus exporters, one a node (per queue: /metrics/detailed?family=queue_coarse_metrics)"
        echo "export QUAN_INFRA_RABBIT_PROM_PORT=$P_RPROM1"
        echo "export QUAN_INFRA_RABBIT_PROM_PORTS=\"$P_RPROM1 $P_RPROM2 $P_RPROM3\""
        echo "export QUAN_AMQP_URL=$urls"
        echo "export QUAN_MQ_QUEUE_TYPE=quorum"
    } >"$DIR/env"
}

# rabbit_join N: node N joins quan1's cluster, once (DIR/rabbitN/joined remembers it).
rabbit_join() {
    local n=$1 r=$DIR/rabbit$1 ctl=$DIR/rabbit$1/rabbitmqctl rc=0
    [ ! -f "$r/joined" ] || return 0
    # A join that went through before its mark was written is no error: join_cluster says the
    # node is a member already and succeeds.
    {
        timeout "$TIMEOUT" "$ctl" stop_app &&
            timeout "$TIMEOUT" "$ctl" join_cluster quan1@localhost &&
            timeout "$TIMEOUT" "$ctl" start_app
    } >>"$r/log/join.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "rabbitmq$n could not join quan1@localhost (exit $rc)"
        show_logs "$r/log/join.log" "$r/log/quan$n@localhost.log"
        return 1
    fi
    wait_for "$TIMEOUT" "" amqp_ready "$(val "P_AMQP$n")" || {
        log "rabbitmq$n does not accept AMQP again after joining"
        show_logs "$r/log/quan$n@localhost.log"
        return 1
    }
    touch "$r/joined"
    log "rabbitmq$n joined quan1@localhost (${SECONDS}s)"
}

# The three nodes: those not running start together (a node that was in the cluster waits for
# its peers' tables, so one at a time could wait for each other), then nodes 2 and 3 join node
# 1 the first time, one after the other.
start_rabbit_cluster() {
    local n r r1=$DIR/rabbit1 jobs=() down=0 j
    # Nodes of a cluster share one Erlang cookie: node 1's, readable only by us.
    mkdir -p "$r1"
    if [ ! -f "$r1/.erlang.cookie" ]; then
        od -An -N20 -tx1 /dev/urandom | tr -d ' \n' | tr 'a-f' 'A-F' >"$r1/.erlang.cookie"
        chmod 0400 "$r1/.erlang.cookie"
    fi
    for n in 1 2 3; do
        [ "$(val "UP_R$n")" = 1 ] && continue
        r=$DIR/rabbit$n
        if [ "$n" != 1 ] && ! cmp -s "$r1/.erlang.cookie" "$r/.erlang.cookie" 2>/dev/null; then
            mkdir -p "$r"
            rm -f "$r/.erlang.cookie"
            cp "$r1/.erlang.cookie" "$r/.erlang.cookie"
            chmod 0400 "$r/.erlang.cookie"
        fi
        # pause_minority: of three nodes, one cut off from the other two stops serving rather
        # than accept what the majority never sees.
        rabbit_files "$r" "$(val "P_AMQP$n")" "$(val "P_RPROM$n")" \
            "cluster_partition_handling = pause_minority"
        write_rabbit_env_at "$r" "quan$n@localhost" "$(val "P_AMQP$n")" "$(val "P_DIST$n")"
    done
    if [ "$UP_EPMD" != 1 ]; then start_epmd "$DIR/rabbit1" || return 1; fi
    for n in 1 2 3; do
        [ "$(val "UP_R$n")" = 1 ] && continue
        launch_rabbit "$DIR/rabbit$n" "rabbitmq$n" "quan$n@localhost" "$(val "P_AMQP$n")" &
        jobs+=($!)
    done
    for j in "${jobs[@]}"; do wait "$j" || down=1; done
    [ "$down" = 0 ] || return 1
    rabbit_join 2 && rabbit_join 3
}

rcluster_alive() { "$RCLUSTER" status "$DIR/rcluster" >/dev/null 2>&1; }

cmd_start_cluster() {
    [ "${TLS_ASKED:-0}" = 0 ] || die "QUAN_INFRA_TLS=1 is for the single topology"
    load_cluster_ports
    WANT_REDIS=0
    [ "${QUAN_INFRA_STANDALONE_REDIS:-0}" != 1 ] || WANT_REDIS=1
    UP_RC=0 UP_PG0=0 UP_PG1=0 UP_EPMD=0 UP_R1=0 UP_R2=0 UP_R3=0 UP_REDIS=0
    rcluster_alive && UP_RC=1
    service_alive postgres0 && UP_PG0=1
    service_alive postgres1 && UP_PG1=1
    service_alive epmd && UP_EPMD=1
    service_alive rabbitmq1 && UP_R1=1
    service_alive rabbitmq2 && UP_R2=1
    service_alive rabbitmq3 && UP_R3=1
    service_alive redis && UP_REDIS=1
    if [ "$UP_RC$UP_PG0$UP_PG1$UP_EPMD$UP_R1$UP_R2$UP_R3" = 1111111 ] &&
        { [ "$WANT_REDIS" = 0 ] || [ "$UP_REDIS" = 1 ]; }; then
        log "already running in $DIR (. $DIR/env)"
        return 0
    fi
    local n
    # Nodes whose epmd vanished can't be managed by rabbitmqctl: restart them with it.
    for n in 1 2 3; do
        if [ "$(val "UP_R$n")" = 1 ] && [ "$UP_EPMD" = 0 ]; then
            log "rabbitmq$n is running without its epmd; restarting it"
            terminate "rabbitmq$n" "$(recorded_pid "rabbitmq$n")"
            printf -v "UP_R$n" '%s' 0
        fi
        if [ "$(val "UP_R$n")" = 0 ]; then stop_orphan_beam "$DIR/rabbit$n"; fi
    done

    local keep="" svc pid
    for svc in $CLUSTER_SERVICES; do
        pid=$(recorded_pid "$svc")
        if is_ours "$svc" "$pid"; then keep+="$svc $pid"$'\n'; fi
    done
    printf '%s' "$keep" >"$DIR/pids"

    choose_cluster_ports
    if is_root; then
        [ "$UP_PG0" = 1 ] || pg_prepare_root pg0
        [ "$UP_PG1" = 1 ] || pg_prepare_root pg1
    fi
    write_cluster_env

    if [ "$UP_RC" = 0 ]; then start_bg rcluster "$RCLUSTER" start "$DIR/rcluster" "$P_RCLUSTER"; fi
    if [ "$UP_PG0" = 0 ]; then start_bg postgres0 start_pg_server pg0 postgres0 "$P_PG0" ds_0; fi
    if [ "$UP_PG1" = 0 ]; then start_bg postgres1 start_pg_server pg1 postgres1 "$P_PG1" ds_1; fi
    if [ "$UP_EPMD$UP_R1$UP_R2$UP_R3" != 1111 ]; then start_bg rabbitmq start_rabbit_cluster; fi
    if [ "$WANT_REDIS" = 1 ] && [ "$UP_REDIS" = 0 ]; then start_bg redis start_redis; fi
    wait_started "ready (cluster); environment in $DIR/env"
}

stop_rabbit_cluster() {
    local n pid jobs=() j
    for n in 1 2 3; do
        (
            pid=$(recorded_pid "rabbitmq$n")
            if is_ours "rabbitmq$n" "$pid"; then terminate "rabbitmq$n" "$pid"; fi
            stop_orphan_beam "$DIR/rabbit$n"
        ) &
        jobs+=($!)
    done
    for j in "${jobs[@]}"; do wait "$j" || true; done
    pid=$(recorded_pid epmd)
    if is_ours epmd "$pid"; then terminate epmd "$pid"; fi
}

cmd_stop_cluster() {
    load_cluster_ports
    local jobs=() j rc_ok=0 rc_job
    "$RCLUSTER" stop "$DIR/rcluster" & rc_job=$!
    stop_pg_server pg0 postgres0 & jobs+=($!)
    stop_pg_server pg1 postgres1 & jobs+=($!)
    stop_rabbit_cluster & jobs+=($!)
    stop_redis & jobs+=($!)
    wait "$rc_job" && rc_ok=1
    for j in "${jobs[@]}"; do wait "$j" || true; done
    local svc left=""
    [ "$rc_ok" = 1 ] || left+=" redis-cluster"
    for svc in $CLUSTER_SERVICES; do
        if service_alive "$svc"; then left+=" $svc"; fi
    done
    [ -z "$left" ] || die "still running:$left"
    rm -f "$DIR/pids"
}

cmd_status_cluster() {
    load_cluster_ports
    local svc pid port state all=0 n
    echo "topology  cluster"
    if [ -f "$DIR/rcluster/port" ]; then
        "$RCLUSTER" status "$DIR/rcluster" || all=3
    else
        printf '%-9s %-6s pid=%-8s port=%s\n' redis-cluster dead - "${P_RCLUSTER:--}"
        all=3
    fi
    for svc in $CLUSTER_SERVICES; do
        pid=$(recorded_pid "$svc")
        case $svc in
            postgres?) port=$(val "P_PG${svc#postgres}") ;;
            rabbitmq?) port=$(val "P_AMQP${svc#rabbitmq}") ;;
            epmd) port=$P_EPMD ;;
            redis) # the standalone one, only where there is one
                [ -n "$P_REDIS" ] || continue
                port=$P_REDIS ;;
        esac
        if is_ours "$svc" "$pid"; then state=alive; else state=dead; all=3; fi
        printf '%-9s %-6s pid=%-8s port=%s\n' "$svc" "$state" "${pid:--}" "${port:--}"
    done
    return "$all"
}

[ $# -eq 2 ] || usage
DIR=$2
[ -n "$DIR" ] || usage
case $1 in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) usage ;;
esac
