# shellcheck shell=bash
# proc.sh — process helpers the local scripts share (sourced, not run): infra.sh, rcluster.sh,
# rsentinel.sh, gateway.sh and svc.sh record their daemons and check them through /proc;
# infra.sh and rcluster.sh write their redis-servers' configuration the same way, and infra.sh and
# the TLS suite their stunnel tunnels'; rcluster.sh and rsentinel.sh talk to their servers and
# wait for them with cli, pings and wait_until.

# True if PID exists and is not a zombie. PID 1 here does not always reap orphans, so kill -0
# alone would report dead daemons as alive (and it fails with EPERM on other users'
# processes, which /proc does not).
pid_alive() {
    local pid=${1:-} st
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}

# Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it
# names one process, even once the number is used again.
pid_starttime() {
    local st f
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    read -r -a f <<<"$st"
    echo "${f[19]}"
}

# write_stunnel_conf FILE ACCEPT CONNECT CAFILE HOST: a foreground stunnel client accepting
# plaintext on ACCEPT (host:port) and carrying it over TLS to CONNECT, whose certificate must
# chain to CAFILE (verifyChain) and name HOST (checkHost, also sent as SNI). A peer failing
# either check is disconnected: the client sees its connection closed, never the server.
write_stunnel_conf() {
    local conf=$1 accept=$2 connect=$3 ca=$4 host=$5
    cat >"$conf" <<EOF
foreground = yes
pid =
debug = notice
[redis]
client = yes
accept = $accept
connect = $connect
CAfile = $ca
verifyChain = yes
checkHost = $host
sni = $host
sslVersionMin = TLSv1.2
EOF
}

# write_redis_conf DIR PORT DURABILITY APPENDFSYNC [LINES]: DIR/redis.conf for a redis-server
# on 127.0.0.1:PORT in the foreground, its data and redis.log in DIR, LINES (e.g. the cluster
# settings) after the common ones. DURABILITY durable: the append-only file (with an RDB
# preamble, so a restart loads fast), fsynced as APPENDFSYNC says; no snapshots besides. Any
# other (fast): nothing is persisted.
write_redis_conf() {
    local d=$1 port=$2 durability=$3 appendfsync=$4 lines=${5:-} rest="appendonly no"
    if [ "$durability" = durable ]; then
        rest="appendonly yes
appendfsync $appendfsync
aof-use-rdb-preamble yes"
    fi
    [ -z "$lines" ] || rest=$lines$'\n'$rest
    cat >"$d/redis.conf" <<EOF
bind 127.0.0.1
port $port
protected-mode yes
dir "$d"
daemonize no
$rest
save ""
logfile "$d/redis.log"
EOF
}

# The daemons recorded in DIR/pids as "NAME PID" (infra.sh: a service's name; rcluster.sh and
# rsentinel.sh: a port), checked with the caller's is_ours NAME PID (the recorded pid still runs
# that daemon); stop_recorded also uses the caller's log and die.

# recorded_pid NAME: the pid last recorded for NAME, or nothing.
recorded_pid() {
    [ -f "$DIR/pids" ] || return 0
    awk -v p="$1" '$1 == p { x = $2 } END { if (x != "") print x }' "$DIR/pids"
}

# stop_recorded NOUN (rcluster.sh, rsentinel.sh): SIGTERM to every recorded daemon still ours, 15 s for them to exit, then
# SIGKILL to those left and a bounded wait (SIGKILL is not instant either); dies naming the
# ports of any still running, else forgets DIR/pids. NOUN names them in the messages.
stop_recorded() {
    local noun=$1 p pid e left=()
    [ -d "$DIR" ] || return 0
    [ -f "$DIR/pids" ] || return 0
    while read -r p pid; do
        is_ours "$p" "$pid" || continue
        kill -TERM "$pid" 2>/dev/null || true
        left+=("$p:$pid")
    done <"$DIR/pids"
    for _ in $(seq 1 75); do
        local alive=0
        for e in "${left[@]}"; do
            is_ours "${e%%:*}" "${e#*:}" && alive=1
        done
        [ "$alive" = 0 ] && break
        sleep 0.2
    done
    local killed=0
    for e in "${left[@]}"; do
        if is_ours "${e%%:*}" "${e#*:}"; then
            kill -KILL "${e#*:}" 2>/dev/null || true
            killed=1
        fi
    done
    local still=""
    for _ in $(seq 1 25); do
        still=""
        for e in "${left[@]}"; do
            is_ours "${e%%:*}" "${e#*:}" && still+=" ${e%%:*}"
        done
        [ -z "$still" ] && break
        sleep 0.2
    done
    [ "$killed" = 0 ] || log "$noun outlived SIGTERM by 15 s; sent SIGKILL"
    [ -z "$still" ] || die "$noun still running on ports:$still"
    rm -f "$DIR/pids"
    [ "${#left[@]}" = 0 ] || log "stopped ${#left[@]} $noun"
}

# kill_recorded PORT SIGNAL COUNT NOUN (rcluster.sh, rsentinel.sh: their `kill`, for fault
# tests): SIGNAL to the recorded daemon of PORT, one of the COUNT ports from the caller's
# base_port, and a wait of up to 15 s until it is gone. Dies (the caller's usage, die) on a port
# not its own, a daemon not running, or one that outlives the wait.
kill_recorded() {
    local p=$1 sig=$2 count=$3 noun=$4 pid base
    [[ $p =~ ^[0-9]+$ ]] || usage
    base=$(base_port)
    if [ "$p" -lt "$base" ] || [ "$p" -ge $((base + count)) ]; then
        die "port $p is not a $noun of $DIR"
    fi
    pid=$(recorded_pid "$p")
    is_ours "$p" "$pid" || die "no $noun of $DIR runs on port $p"
    kill -"$sig" "$pid" || die "kill -$sig $pid failed"
    local deadline=$(($(date +%s) + 15))
    while is_ours "$p" "$pid"; do
        [ "$(date +%s)" -lt "$deadline" ] || die "$noun $p (pid $pid) is still there 15 s after SIG$sig"
        sleep 0.1
    done
    log "$noun $p (pid $pid) got SIG$sig and is gone"
}

# redis-cli to the server of PORT on loopback.
cli() { # PORT ARGS...
    local p=$1
    shift
    redis-cli -h 127.0.0.1 -p "$p" "$@"
}

# True if the server of PORT answers PONG.
pings() { [ "$(cli "$1" ping 2>/dev/null)" = PONG ]; }

# Runs CMD every 0.2 s until it succeeds (true) or SECONDS have passed (false).
wait_until() { # SECONDS CMD...
    local deadline=$(($(date +%s) + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

# Start's first step in DIR for servers from port WANT on: DIR made absolute, its lock taken
# (fd 9, held until the script exits: a second start waits), a DIR already holding servers of
# another port refused (die, WHAT naming them), the port recorded in DIR/port and BASE.
lock_base_port() { # WANT WHAT
    local want=$1 what=$2
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd -P)
    exec 9>>"$DIR/.lock"
    flock -w 120 9 || die "another $(basename "$0") holds $DIR/.lock"
    if [ -f "$DIR/port" ] && [ "$(cat "$DIR/port")" != "$want" ]; then
        die "$DIR holds $what on port $(cat "$DIR/port"), not $want"
    fi
    echo "$want" >"$DIR/port"
    # shellcheck disable=SC2034 # the caller's
    BASE=$want
}
