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
# Durability: by default what a server acknowledged survives its crash (PostgreSQL fsync,
# synchronous commit and full pages; Redis' append-only file, fsynced every second, see
# docs/operations.md). QUAN_INFRA_DURABILITY=fast turns all of that off, for test suites
# whose servers live for one run; QUAN_INFRA_REDIS_APPENDFSYNC=always|everysec|no overrides
# Redis' fsync policy.
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
APPENDFSYNC=${QUAN_INFRA_REDIS_APPENDFSYNC:-everysec}
case $APPENDFSYNC in
always | everysec | no) ;;
*)
    echo "infra.sh: QUAN_INFRA_REDIS_APPENDFSYNC must be always, everysec or no" >&2
    exit 2
    ;;
esac
STOP_GRACE=15                          # seconds between SIGTERM and SIGKILL
# Debian's interpreter directly: a pyenv shim first in PATH costs ~0.5 s a call.
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON=$(command -v python3 || echo python3)
SERVICES="redis postgres epmd rabbitmq"

log() { printf 'infra: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    echo "usage: $0 start|stop|status DIR" >&2
    exit 2
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# ---------------------------------------------------------------- processes

# True if PID exists and is not a zombie.  PID 1 here does not always reap
# orphans, so kill -0 alone would report dead daemons as alive (and it fails
# with EPERM on other users' processes, which /proc does not).
pid_alive() {
    local pid=${1:-} st
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}

# Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat);
# with the pid it identifies a process even if the pid number is recycled.
pid_starttime() {
    local st f
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    read -r -a f <<<"$st"
    echo "${f[19]}"
}

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

# Recorded pid of service $1 from DIR/pids (last line wins), or nothing.
recorded_pid() {
    [ -f "$DIR/pids" ] || return 0
    awk -v n="$1" '$1 == n { p = $2 } END { if (p != "") print p }' "$DIR/pids"
}

# True if PID is alive and is the process we started for service $1, so a
# recycled pid can never make us signal someone else's process.
is_ours() {
    local name=$1 pid=${2:-} cmd env
    pid_alive "$pid" || return 1
    cmd=$(pid_cmdline "$pid")
    case $name in
        redis)    [[ $cmd == *"redis-server 127.0.0.1:$P_REDIS "* ]] ;;
        postgres) [[ $cmd == *"/postgres -D $PGD/data "* ]] ;;
        epmd)     [[ $cmd == *"epmd -port $P_EPMD "* ]] ;;
        rabbitmq)
            [[ $cmd == *rabbitmq-server* ]] || return 1
            # The wrapper's environment names our directory (readable as root or owner).
            env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null || true)
            [ -z "$env" ] || [[ $env == *"RABBITMQ_PID_FILE=$DIR/rabbit/pid"* ]]
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
# Picks come from 20000-32000: below the kernel's ephemeral range (so outgoing
# connections don't grab them before our daemons bind), and low enough that
# RabbitMQ's CLI ports (dist port + 10000) stay valid.  All picked sockets are
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
    P_REDIS="" P_PG="" P_AMQP="" P_DIST="" P_EPMD=""
    if [ -f "$DIR/ports" ]; then
        # shellcheck source=/dev/null
        . "$DIR/ports"
    fi
}

# Decide the five ports.  A running service keeps its port; a fixed port from
# the environment must be free; otherwise reuse the previous port if free, or
# pick a new one.
choose_ports() {
    local up_redis=$1 up_pg=$2 up_epmd=$3 up_rabbit=$4
    local var svc want prev need=() taken=() new
    for svc in REDIS PG AMQP DIST EPMD; do
        var=P_$svc
        prev=${!var}
        case $svc in
            REDIS) [ "$up_redis" = 1 ] && { taken+=("$prev"); continue; } ;;
            PG)    [ "$up_pg" = 1 ] && { taken+=("$prev"); continue; } ;;
            AMQP | DIST) [ "$up_rabbit" = 1 ] && { taken+=("$prev"); continue; } ;;
            EPMD)  [ "$up_epmd" = 1 ] && { taken+=("$prev"); continue; } ;;
        esac
        want=""
        case $svc in
            REDIS) want=${QUAN_INFRA_REDIS_PORT:-} ;;
            PG)    want=${QUAN_INFRA_PG_PORT:-} ;;
            AMQP)  want=${QUAN_INFRA_AMQP_PORT:-} ;;
        esac
        if [ -n "$want" ]; then
            [[ $want =~ ^[0-9]+$ ]] || die "QUAN_INFRA_${svc}_PORT=$want is not a port"
            ports free "$want" || die "fixed port $want for $svc is already in use on 127.0.0.1"
            printf -v "$var" '%s' "$want"
            taken+=("$want")
        elif [ -n "$prev" ] && ports free "$prev"; then
            taken+=("$prev")
        else
            printf -v "$var" '%s' ""
            need+=("$var")
        fi
    done
    if [ "${#need[@]}" -gt 0 ]; then
        new=$(ports pick "${#need[@]}" "${taken[@]}") || die "could not find free ports"
        read -r -a new <<<"$new"
        for var in "${need[@]}"; do
            printf -v "$var" '%s' "${new[0]}"
            new=("${new[@]:1}")
        done
    fi
    # Fixed ports from the environment could still coincide with each other.
    local all="$P_REDIS $P_PG $P_AMQP $P_DIST $P_EPMD"
    [ "$(tr ' ' '\n' <<<"$all" | sort -u | wc -l)" -eq 5 ] || die "ports collide: $all"
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
EOF
    {
        echo "# Written by deploy/local/infra.sh; source it: . $(printf '%q' "$DIR/env")"
        printf 'export QUAN_INFRA_DIR=%q\n' "$DIR"
        echo "export QUAN_INFRA_REDIS_PORT=$P_REDIS"
        echo "export QUAN_INFRA_PG_PORT=$P_PG"
        echo "export QUAN_INFRA_AMQP_PORT=$P_AMQP"
        echo "export QUAN_DS0_DSN=postgresql://quan@127.0.0.1:$P_PG/ds_0"
        echo "export QUAN_DS1_DSN=postgresql://quan@127.0.0.1:$P_PG/ds_1"
        echo "export QUAN_REDIS_HOST=127.0.0.1"
        echo "export QUAN_REDIS_PORT=$P_REDIS"
        echo "export QUAN_AMQP_URL=amqp://guest:guest@127.0.0.1:$P_AMQP/"
        printf 'export QUAN_INFRA_RABBITMQCTL=%q\n' "$DIR/rabbit/rabbitmqctl"
        echo "export PGHOST=127.0.0.1"
        echo "export PGPORT=$P_PG"
        echo "export PGUSER=quan"
    } >"$DIR/env"
}

# ---------------------------------------------------------------- redis

start_redis() {
    local d=$DIR/redis pid rc=0
    mkdir -p "$d"
    # Durable: the append-only file (with an RDB preamble, so a restart loads fast); no
    # snapshots besides. Fast: nothing is persisted.
    local persist="appendonly no"
    if [ "$DURABILITY" = durable ]; then
        persist="appendonly yes
appendfsync $APPENDFSYNC
aof-use-rdb-preamble yes"
    fi
    cat >"$d/redis.conf" <<EOF
bind 127.0.0.1
port $P_REDIS
protected-mode yes
dir "$d"
daemonize no
$persist
save ""
logfile "$d/redis.log"
EOF
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

redis_ping() { [ "$(redis-cli -h 127.0.0.1 -p "$P_REDIS" ping 2>/dev/null)" = PONG ]; }

# ---------------------------------------------------------------- postgres

# PostgreSQL refuses to run as root, so as root its tools run as `postgres`.
pg_run() {
    if is_root; then
        (cd "$PGD" && runuser -u postgres -- "$@")
    else
        (cd "$PGD" && "$@")
    fi
}

# Where PostgreSQL's files are: DIR/pg, or where that symbolic link points when DIR lies
# where the postgres user cannot go (see pg_prepare_root).
pg_locate() {
    PGD=$DIR/pg
    if [ -L "$DIR/pg" ]; then PGD=$(readlink -f "$DIR/pg"); fi
}

# Somewhere user postgres can reach, keyed to DIR so that two clones never share it.
pg_outside_dir() {
    echo "/var/lib/postgresql/quan-$(printf '%s' "$DIR" | sha1sum | cut -c1-16)"
}

# As root: make sure the postgres user exists and can reach the data directory.  PostgreSQL
# runs as postgres, which cannot enter a clone under a 0700 home such as /root: then its files
# live in /var/lib/postgresql/quan-<hash of DIR> and DIR/pg is a symbolic link to them, so
# stop, status and the next start find exactly that server again.
pg_prepare_root() {
    id -u postgres >/dev/null 2>&1 ||
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin postgres
    chmod 0755 "$DIR"        # mktemp -d makes 0700 dirs that postgres cannot enter
    [ -L "$DIR/pg" ] || mkdir -p "$DIR/pg"
    pg_locate
    chown postgres: "$PGD"
    runuser -u postgres -- test -x "$PGD" -a -w "$PGD" && return 0
    [ ! -L "$DIR/pg" ] || die "user postgres cannot write $PGD"
    # A data directory here could not have been used by postgres: keep it for the user.
    [ ! -e "$DIR/pg/data" ] || die "user postgres cannot reach $DIR/pg/data (move it, or chmod o+x the path)"
    local outside
    outside=$(pg_outside_dir)
    mkdir -p "$outside"
    chown postgres: "$outside"
    chmod 0700 "$outside"
    rm -rf "$DIR/pg"
    ln -s "$outside" "$DIR/pg"
    pg_locate
    log "postgres cannot enter $DIR: its files are in $PGD ($DIR/pg links there)"
}

start_pg() {
    local d=$PGD sock pid
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
port = $P_PG
unix_socket_directories = '$sock'
$(if [ "$DURABILITY" = fast ]; then
        printf 'fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n'
    else
        # Durable, and sized for bulk writes: fewer checkpoints mean fewer full-page images
        # in the WAL (a distribution task writes millions of rows).
        printf 'max_wal_size = 4GB\ncheckpoint_timeout = 15min\n'
    fi)
max_connections = 200
shared_buffers = 64MB
EOF
    if is_root; then chown postgres: "$d/data/quan.conf"; fi
    if ! pg_run "$PG_BIN/pg_ctl" start -D "$d/data" -l "$d/postgres.log" -w -t "$TIMEOUT" \
        >>"$d/pg_ctl.log" 2>&1; then
        pid=$(head -n 1 "$d/data/postmaster.pid" 2>/dev/null || true)
        [ -z "$pid" ] || record_pid postgres "$pid"
        log "postgres did not start on port $P_PG"
        show_logs "$d/pg_ctl.log" "$d/postgres.log"
        return 1
    fi
    pid=$(head -n 1 "$d/data/postmaster.pid")
    record_pid postgres "$pid"
    wait_for "$TIMEOUT" "$pid" "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$P_PG" || {
        log "pg_isready never succeeded on port $P_PG"
        show_logs "$d/postgres.log"
        return 1
    }
    # Role and databases, created only if absent so restarts are no-ops; one
    # psql run (\gexec executes each generated statement on its own, as
    # CREATE DATABASE requires).
    pg_run "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$P_PG" -U postgres \
        -d postgres >>"$d/pg_ctl.log" 2>&1 <<'SQL' || {
SELECT 'CREATE ROLE quan LOGIN SUPERUSER'
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'quan') \gexec
SELECT format('CREATE DATABASE %I OWNER quan', db) FROM unnest(ARRAY['ds_0', 'ds_1']) AS db
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = db) \gexec
SQL
        log "creating role quan / databases ds_0, ds_1 failed"
        show_logs "$d/pg_ctl.log"
        return 1
    }
    log "postgres up on 127.0.0.1:$P_PG (pid $pid, ${SECONDS}s)"
}

# ---------------------------------------------------------------- rabbitmq

# Everything rabbitmq-server and rabbitmqctl need to find our node and nothing
# of the system's (/etc/rabbitmq, /var/lib/rabbitmq, the shared epmd on 4369).
write_rabbit_env() {
    local r=$DIR/rabbit
    {
        printf 'export HOME=%q\n' "$r"
        echo "export RABBITMQ_NODENAME=quan-$P_AMQP@localhost"
        echo "export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1"
        echo "export RABBITMQ_NODE_PORT=$P_AMQP"
        echo "export RABBITMQ_DIST_PORT=$P_DIST"
        echo "export ERL_EPMD_PORT=$P_EPMD"
        echo "export ERL_EPMD_ADDRESS=127.0.0.1"
        # Erlang distribution listens on all interfaces unless told otherwise,
        # for the node and for rabbitmqctl alike.
        echo "export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS='-kernel inet_dist_use_interface {127,0,0,1}'"
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
    # A rabbitmqctl that talks to this node: DIR/rabbit/rabbitmqctl status
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
    "$PYTHON" - "$1" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"AMQP\x00\x00\x09\x01")
f = s.recv(7)
sys.exit(0 if len(f) == 7 and f[0] == 1 and f[1:3] == b"\x00\x00" else 1)
PY
}

epmd_ready() { epmd -port "$P_EPMD" -names; }

start_rabbit() {
    local r=$DIR/rabbit pid rc=0 epmd_up=$1
    mkdir -p "$r/mnesia" "$r/log" "$r/schema" "$r/config"
    # Private cookie in our HOME, readable only by us as Erlang demands.
    if [ ! -f "$r/.erlang.cookie" ]; then
        od -An -N20 -tx1 /dev/urandom | tr -d ' \n' | tr 'a-f' 'A-F' >"$r/.erlang.cookie"
        chmod 0400 "$r/.erlang.cookie"
    fi
    echo "[]." >"$r/enabled_plugins"       # no management plugin: faster boot
    : >"$r/rabbitmq-env.conf"
    cat >"$r/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$P_AMQP
log.console = false
log.file.level = info
EOF
    write_rabbit_env
    rm -f "$r/pid"

    # Our own epmd, started before the node so the node doesn't spawn a daemonized
    # one we could not track; foreground + setsid gives us its exact pid.
    if [ "$epmd_up" != 1 ]; then
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
    fi

    # setsid: detached from the caller's terminal and session.  stop finds
    # beam.smp, erl_child_setup and inet_gethost as the wrapper's descendants.
    (
        # shellcheck source=/dev/null
        . "$r/env"
        exec setsid "$RABBIT_BIN/rabbitmq-server"
    ) </dev/null >>"$r/log/console.log" 2>&1 &
    pid=$!
    record_pid rabbitmq "$pid"
    wait_for "$TIMEOUT" "$pid" amqp_ready "$P_AMQP" || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "rabbitmq did not accept AMQP on port $P_AMQP ($([ "$rc" = 2 ] && echo exited || echo timeout))"
        show_logs "$r/log/console.log" "$r/log/quan-$P_AMQP@localhost.log"
        return 1
    fi
    log "rabbitmq up on 127.0.0.1:$P_AMQP (pid $pid, node quan-$P_AMQP@localhost, ${SECONDS}s)"
}

# ---------------------------------------------------------------- commands

# One start or stop at a time per DIR (e.g. parallel make targets).  The lock
# fd must not leak into the daemons, or it would stay held after we exit.
lock_dir() {
    exec 9>>"$DIR/.lock"
    flock -w 180 9 || die "another infra.sh holds $DIR/.lock"
}

cmd_start() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd -P)
    pg_locate
    lock_dir
    command -v "$PYTHON" >/dev/null || die "python3 is required (deploy/local/deps.sh)"
    load_ports

    local up_redis=0 up_pg=0 up_epmd=0 up_rabbit=0
    service_alive redis && up_redis=1
    service_alive postgres && up_pg=1
    service_alive epmd && up_epmd=1
    service_alive rabbitmq && up_rabbit=1
    if [ "$up_redis$up_pg$up_epmd$up_rabbit" = 1111 ]; then
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

    choose_ports "$up_redis" "$up_pg" "$up_epmd" "$up_rabbit"
    warn_fixed_ports
    write_env

    if [ "$up_pg" = 0 ] && is_root; then pg_prepare_root; fi

    # The three start in parallel; RabbitMQ is the slow one.
    local jobs=() names=() i failed=()
    if [ "$up_redis" = 0 ]; then start_redis 9>&- & jobs+=($!); names+=(redis); fi
    if [ "$up_pg" = 0 ]; then start_pg 9>&- & jobs+=($!); names+=(postgres); fi
    if [ "$up_rabbit" = 0 ]; then start_rabbit "$up_epmd" 9>&- & jobs+=($!); names+=(rabbitmq); fi
    for i in "${!jobs[@]}"; do
        wait "${jobs[$i]}" || failed+=("${names[$i]}")
    done
    if [ "${#failed[@]}" -gt 0 ]; then
        log "failed to start: ${failed[*]}; clean up with: $0 stop $DIR"
        return 1
    fi
    log "ready; environment in $DIR/env"
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
    pid=$(recorded_pid redis)
    if is_ours redis "$pid"; then terminate redis "$pid"; fi
}

stop_pg() {
    local pid
    pid=$(recorded_pid postgres)
    is_ours postgres "$pid" || return 0
    # Fast shutdown: roll back sessions, no waiting for clients.
    if pg_run "$PG_BIN/pg_ctl" stop -D "$PGD/data" -m fast -w -t "$STOP_GRACE" \
        >>"$PGD/pg_ctl.log" 2>&1; then
        log "postgres stopped (pid $pid)"
    else
        terminate postgres "$pid"
    fi
}

# If the wrapper died on its own, beam.smp lives on, re-parented, holding the
# ports; its command line names our private HOME, which no other node shares.
stop_orphan_beam() {
    local m
    for m in $(ps -e -ww -o pid=,args= | M="-home $DIR/rabbit " \
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
    load_ports
    local jobs=() j
    stop_redis & jobs+=($!)
    stop_pg & jobs+=($!)
    stop_rabbit & jobs+=($!)
    for j in "${jobs[@]}"; do wait "$j" || true; done
    local svc left=""
    for svc in $SERVICES; do
        if service_alive "$svc"; then left+=" $svc"; fi
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
    load_ports
    local svc pid port state all=0
    for svc in $SERVICES; do
        pid=$(recorded_pid "$svc")
        case $svc in
            redis) port=$P_REDIS ;; postgres) port=$P_PG ;;
            epmd) port=$P_EPMD ;; rabbitmq) port=$P_AMQP ;;
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
