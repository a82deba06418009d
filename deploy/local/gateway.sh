#!/usr/bin/env bash
# gateway.sh — run the API gateway (nginx + njs, deploy/gateway/) on this machine, all of its
# files under one directory, in front of local replicas of the three services with an API.
#
#   gateway.sh start  DIR   write the configuration into DIR, check it (nginx -t), start nginx
#                           in the background and wait until it listens; already running for
#                           DIR: does nothing and succeeds (stop first to change the upstreams
#                           or the limits)
#   gateway.sh stop   DIR   stop exactly the nginx recorded in DIR/gateway.pid (graceful, then
#                           SIGKILL after 15 s); safe to repeat, and on a missing DIR
#   gateway.sh status DIR   "gateway alive pid PID port PORT" (exit 0) or "gateway dead" (exit 3)
#   gateway.sh limits       print the limits.conf start would write (below); the defaults' is
#                           deploy/gateway/k8s/limits.conf
#
# Environment (start):
#   QUAN_GATEWAY_PORT             port it listens on (default 10000)
#   QUAN_GATEWAY_BIND             address it listens on (default 127.0.0.1)
#   QUAN_GATEWAY_METRICS_PORT     port of its /metrics for Prometheus, on the same address
#                                 (default QUAN_GATEWAY_PORT + 1)
#   QUAN_GATEWAY_ENGINE           the engine replicas, host:port[,host:port...]
#                                 (default 127.0.0.1:10020)
#   QUAN_GATEWAY_MERCHANT_ADMIN   the merchant-admin replicas (default 127.0.0.1:10010)
#   QUAN_GATEWAY_SETTLEMENT       the settlement replicas (default 127.0.0.1:10030)
#   QUAN_GATEWAY_JWT_SECRET       the HS256 key of the tokens (at least 16 characters); unset:
#                                 the key in DIR/jwt-secret, made once (64 hex digits, 0600)
#   QUAN_GATEWAY_JWT_SECRET_FILE  or the path of a file holding the key (one trailing newline
#                                 dropped), read by nginx's workers as in Kubernetes: the key
#                                 stays out of nginx's environment (as root the workers run as
#                                 nobody, who must be able to read it); not with the above
# Mint a token for it: QUAN_GATEWAY_JWT_SECRET=... build/bin/quan-token --user 42, or
# build/bin/quan-token --secret-file DIR/jwt-secret --user 42.
#
# DIR then holds nginx.conf and quan_auth.js (copies of deploy/gateway/), upstreams.conf,
# listen.conf and metrics.conf (written from the variables above), port ("BIND PORT"),
# metrics-port, jwt-secret, gateway.pid
# ("pid starttime" of the nginx master), logs/access.log (JSON lines), logs/error.log,
# logs/nginx.out (its stdout and stderr) and nginx's empty temporary directories. nginx runs with -p DIR, so it never
# touches /etc/nginx or /var/lib/nginx, as root or not (as root its workers run as nobody and
# need no file of DIR to proxy).
#
# The merchant console (deploy/console/, served at /console/): its files are copied into
# DIR/console, Chart.js (deploy/console/node_modules, `npm ci --prefix deploy/console`, which
# deploy/local/deps.sh runs) into DIR/console/vendor, and console.conf points nginx there. The
# workers read those files: as root, when user nobody cannot read DIR (a clone under /root, a
# 0700 temporary directory), the copy is made in /var/lib/quan-gateway/console-<hash of DIR>
# instead, and stop removes it.
#
# Rate limits (start, limits): each "off", or a rate and a burst in nginx's words, "5r/s burst=10"
# (or r/m); what each counts and why the defaults are what they are: limits_conf below, and the
# limits.conf it writes into DIR. Over a limit the gateway answers 429 A000429 with Retry-After,
# and the access log's limitReq or limitConn says REJECTED.
#   QUAN_GATEWAY_RATE_USER        per user on /api/engine/ and /api/settlement/ ("5r/s burst=10")
#   QUAN_GATEWAY_RATE_MERCHANT    per user on /api/merchant-admin/ ("20r/s burst=40")
#   QUAN_GATEWAY_RATE_ADDR        per client address on every /api/ route, refused tokens
#                                 included ("200r/s burst=400")
#   QUAN_GATEWAY_RATE_CONSOLE     per client address on /console/ ("20r/s burst=40")
#   QUAN_GATEWAY_CONN_ADDR        requests in flight per client address, or off (256)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
src=$root/deploy/gateway
NGINX=${QUAN_GATEWAY_NGINX:-/usr/sbin/nginx}
JS_MODULE=/usr/lib/nginx/modules/ngx_http_js_module.so
LUA_MODULE=/usr/lib/nginx/modules/ngx_http_lua_module.so
START_WAIT=10 # seconds until it must listen
STOP_GRACE=15 # seconds between SIGQUIT (graceful) and SIGKILL

log() { printf 'gateway: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    echo "usage: $0 start|stop|status DIR, or $0 limits" >&2
    exit 2
}

# ---------------------------------------------------------------- processes

# shellcheck source=deploy/local/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# The recorded master, if it is still that process and still ours: "pid" on stdout.
recorded_master() {
    local dir=$1 pid start cmd
    [ -f "$dir/gateway.pid" ] || return 1
    read -r pid start <"$dir/gateway.pid" || return 1
    pid_alive "$pid" || return 1
    [ "$(pid_starttime "$pid")" = "$start" ] || return 1
    # nginx names its master "nginx: master process <its command line>".
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    case $cmd in
    *"nginx: master process"*"$dir/nginx.conf"*) echo "$pid" ;;
    *) return 1 ;;
    esac
}

# True when something accepts connections on HOST:PORT.
listening() {
    local host=$1 port=$2
    [ "$host" = 0.0.0.0 ] && host=127.0.0.1
    (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null
}

# ---------------------------------------------------------------- configuration

# upstream NAME LIST: an upstream block of the replicas in LIST (host:port, comma-separated).
# Checked strictly: what goes into nginx's configuration is host names, IPv4 addresses and
# ports, nothing that could end a directive.
upstream() {
    local name=$1 list=$2 var=$3 hp host port hps
    printf 'upstream %s {\n' "$name"
    IFS=, read -r -a hps <<<"$list"
    [ "${#hps[@]}" -gt 0 ] || die "$var is empty"
    for hp in "${hps[@]}"; do
        host=${hp%:*}
        port=${hp##*:}
        if [ "$host" = "$hp" ] || ! [[ $host =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] ||
            ! [[ $port =~ ^[0-9]{1,5}$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
            echo "gateway: error: $var: '$hp' is not host:port" >&2
            return 1
        fi
        # The defaults: after a failed connection a replica is left out for 10 s.
        printf '    server %s:%s max_fails=1 fail_timeout=10s;\n' "$host" "$port"
    done
    # Idle connections kept per worker: as many as the requests a worker has in flight at a
    # peak, or every request beyond them opens a connection and closes it after the answer
    # (a connect per request, and under load TIME_WAIT sockets until the local ports run out).
    # Closed after 30 s, before the services' own idle timeout (QUAN_HTTP_IDLE_TIMEOUT_S, 60 s)
    # closes them under a request: a POST sent on a connection the service is closing would
    # fail after it was sent, and is not retried.
    printf '    keepalive 256;\n    keepalive_timeout 30s;\n}\n'
}

# ---------------------------------------------------------------- rate limits

# req_limit NAME VAR DEFAULT KEY SIZE WHAT: a limit_req zone and its limit_req line, from VAR
# ("off", or "<n>r/s burst=<b>", r/m too). Checked strictly, as the upstreams are: nothing else
# goes into nginx's configuration.
req_limit() {
    local name=$1 var=$2 key=$4 size=$5 what=$6 v
    v=${!var:-$3}
    printf '\n# %s\n# %s=%s\n' "$what" "$var" "$v"
    [ "$v" = off ] && return 0
    if ! [[ $v =~ ^([1-9][0-9]{0,5})r/([sm])\ burst=([0-9]{1,6})$ ]]; then
        echo "gateway: error: $var must be off or a rate and a burst, as '5r/s burst=10'" \
            "(r/s or r/m), not '$v'" >&2
        return 1
    fi
    printf 'limit_req_zone %s zone=%s:%s rate=%sr/%s;\n' "$key" "$name" "$size" \
        "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    printf 'limit_req zone=%s burst=%s nodelay;\n' "$name" "${BASH_REMATCH[3]}"
}

# limits_conf: the limits.conf of the environment's QUAN_GATEWAY_RATE_* and
# QUAN_GATEWAY_CONN_ADDR (nginx.conf includes it at the http level; its maps make the keys).
# shellcheck disable=SC2016 # the $ names are nginx's variables, not the shell's
limits_conf() {
    local conn=${QUAN_GATEWAY_CONN_ADDR:-256}
    cat <<'EOF'
# The gateway's rate limits (nginx's limit_req and limit_conn), included by nginx.conf at the
# http level, which makes the keys ($quan_limit_*: empty where a zone does not apply) and
# answers a refusal: 429 A000429 with Retry-After: 1, in the services' envelope; the access
# log's limitReq or limitConn says REJECTED. Written by deploy/local/gateway.sh from
# QUAN_GATEWAY_RATE_USER, _MERCHANT, _ADDR, _CONSOLE and QUAN_GATEWAY_CONN_ADDR (its header);
# deploy/gateway/k8s/limits.conf is `gateway.sh limits` of the defaults, for Kubernetes.
#
# A request within a limit's burst goes through at once (nodelay), one over it is refused: a
# client that waits does so better on its side than in a gateway connection. The zones belong
# to one nginx (its workers share them): with several gateway replicas a client gets up to this
# much from each replica its connections reach.
#
# The defaults, for a flash sale. A shopper's client loads the page (a few requests at once),
# claims, polls /redeem-result a few times a second until the claim settles, and asks again
# after each 429 or 503 (Retry-After: 1); a script that claims as fast as it can is what the
# per-user limit holds back.
#   user      5r/s burst=10: a page's requests at once, then a poll every 200 ms
#   merchant  20r/s burst=40: the console asks for a tab's figures every 2 s, up to 13
#             requests a round, in a few tabs at once
#   address   200r/s burst=400: many shoppers behind one NAT (an office, a campus, a mobile
#             carrier's): 400 clicking in the same instant, 200 a second after; one machine
#             with many tokens gets no more. Refused tokens count here too.
#   console   20r/s burst=40 per address: the page is four small files, revalidated on each
#             load; its API calls are the merchant's
#   conn      256 requests in flight per address: an eighth of what one gateway holds (two
#             workers of 2048 connections, two connections a proxied request), so that one
#             address cannot hold the gateway while the services are slow
# Zone sizes: a state takes 128 bytes, so 1m holds about 8000 users or addresses; when a zone
# is full the least recently seen state goes (that client starts afresh).
#
# Behind a proxy that does not keep the client's address (an ingress controller, a load
# balancer that NATs), every request has the proxy's address and the address limits hold all
# clients together. Then add here, with the proxy's addresses:
#   set_real_ip_from 10.0.0.0/8;
#   real_ip_header X-Forwarded-For;
#   real_ip_recursive on;
# (the address becomes the one the proxy saw), or turn the address limits off.
# "limit_req_dry_run on;" here tries the limits out: nothing is refused, the access log says
# REJECTED_DRY_RUN where a limit would have.
EOF
    req_limit quan_addr QUAN_GATEWAY_RATE_ADDR '200r/s burst=400' '$quan_limit_addr' 8m \
        'per client address, every /api/ route (first: what it refuses is not verified)' || return 1
    req_limit quan_user QUAN_GATEWAY_RATE_USER '5r/s burst=10' '$quan_limit_user' 16m \
        'per user, /api/engine/ and /api/settlement/' || return 1
    req_limit quan_merchant QUAN_GATEWAY_RATE_MERCHANT '20r/s burst=40' '$quan_limit_merchant' \
        4m 'per user, /api/merchant-admin/' || return 1
    req_limit quan_console QUAN_GATEWAY_RATE_CONSOLE '20r/s burst=40' '$quan_limit_console' \
        2m 'per client address, /console/' || return 1
    printf '\n# requests in flight per client address, /api/ and /console/\n# %s=%s\n' \
        QUAN_GATEWAY_CONN_ADDR "$conn"
    [ "$conn" = off ] && return 0
    if ! [[ $conn =~ ^[1-9][0-9]{0,4}$ ]]; then
        echo "gateway: error: QUAN_GATEWAY_CONN_ADDR must be off or a number of requests" \
            "(1 to 99999), not '$conn'" >&2
        return 1
    fi
    printf 'limit_conn_zone $binary_remote_addr zone=quan_conn:4m;\nlimit_conn quan_conn %s;\n' \
        "$conn"
}

write_config() {
    local dir=$1 port bind mport
    port=${QUAN_GATEWAY_PORT:-10000}
    bind=${QUAN_GATEWAY_BIND:-127.0.0.1}
    if ! [[ $port =~ ^[0-9]{1,5}$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
        die "QUAN_GATEWAY_PORT must be a port number, not '$port'"
    fi
    [[ $bind =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] ||
        die "QUAN_GATEWAY_BIND must be an IPv4 address, not '$bind'"
    mport=${QUAN_GATEWAY_METRICS_PORT:-$((port + 1))}
    if ! [[ $mport =~ ^[0-9]{1,5}$ ]] || [ "$mport" -lt 1 ] || [ "$mport" -gt 65535 ] ||
        [ "$mport" = "$port" ]; then
        die "QUAN_GATEWAY_METRICS_PORT must be a port number other than QUAN_GATEWAY_PORT, not '$mport'"
    fi

    mkdir -p "$dir/logs"
    cp "$src/nginx.conf" "$src/quan_auth.js" "$dir/"
    {
        echo "# Written by deploy/local/gateway.sh: the local replicas."
        upstream quan_engine "${QUAN_GATEWAY_ENGINE:-127.0.0.1:10020}" QUAN_GATEWAY_ENGINE
        upstream quan_merchant_admin "${QUAN_GATEWAY_MERCHANT_ADMIN:-127.0.0.1:10010}" \
            QUAN_GATEWAY_MERCHANT_ADMIN
        upstream quan_settlement "${QUAN_GATEWAY_SETTLEMENT:-127.0.0.1:10030}" \
            QUAN_GATEWAY_SETTLEMENT
    } >"$dir/upstreams.conf.new" || exit 1
    mv "$dir/upstreams.conf.new" "$dir/upstreams.conf"
    limits_conf >"$dir/limits.conf.new" || exit 1
    mv "$dir/limits.conf.new" "$dir/limits.conf"
    # The access log in one write per 64 KiB or per 100 ms, not one per request (as the
    # services' own access logs, QUAN_LOG_FLUSH_MS).
    printf '# Written by deploy/local/gateway.sh.\nlisten %s:%s;\n%s\n' "$bind" "$port" \
        'access_log logs/access.log quan buffer=64k flush=100ms;' >"$dir/listen.conf"
    printf '# Written by deploy/local/gateway.sh: the port of /metrics.\nlisten %s:%s;\n' \
        "$bind" "$mport" >"$dir/metrics.conf"
    echo "$bind $port" >"$dir/port"
    echo "$mport" >"$dir/metrics-port"
    write_console "$dir"
}

# The directory of DIR's console files outside DIR, for workers that cannot enter DIR.
console_outside() {
    echo "/var/lib/quan-gateway/console-$(printf '%s' "$1" | sha1sum | cut -c1-16)"
}

# The console's files where the workers can read them, and console.conf naming that place.
write_console() {
    local dir=$1 csrc=$root/deploy/console files chart
    rm -rf "$dir/console.new"
    mkdir -p "$dir/console.new/vendor"
    cp "$csrc/index.html" "$csrc/console.js" "$csrc/console.css" "$dir/console.new/"
    chart=$csrc/node_modules/chart.js/dist/chart.umd.js
    if [ -f "$chart" ]; then
        cp "$chart" "$dir/console.new/vendor/"
    else
        log "warning: $chart is missing (npm ci --prefix deploy/console, or deploy/local/deps.sh): the console has no chart"
    fi
    chmod -R a+rX "$dir/console.new"
    rm -rf "$dir/console"
    mv "$dir/console.new" "$dir/console"
    files=$dir/console
    if [ "$(id -u)" -eq 0 ] && ! runuser -u nobody -- test -r "$files/index.html" 2>/dev/null; then
        files=$(console_outside "$dir")
        rm -rf "$files"
        mkdir -p "$(dirname "$files")"
        chmod 0755 "$(dirname "$files")"
        cp -R "$dir/console" "$files"
        chmod -R a+rX "$files"
    fi
    # Inside double quotes in nginx's configuration: nothing that ends them or is a variable.
    case $files in
    *'"'* | *\\* | *'$'* | *$'\n'*) die "the console's directory $files cannot be named in nginx.conf" ;;
    esac
    printf '# Written by deploy/local/gateway.sh: where the console files are.\nalias "%s/";\n' \
        "$files" >"$dir/console.conf"
}

# The key, exported for nginx: the environment's, else DIR/jwt-secret (made once); or the path
# of a file holding it (QUAN_GATEWAY_JWT_SECRET_FILE), which quan_auth.js reads.
load_secret() {
    local dir=$1
    if [ -n "${QUAN_GATEWAY_JWT_SECRET_FILE:-}" ]; then
        load_secret_file
        return
    fi
    unset QUAN_GATEWAY_JWT_SECRET_FILE
    if [ -z "${QUAN_GATEWAY_JWT_SECRET:-}" ]; then
        if [ ! -s "$dir/jwt-secret" ]; then
            (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/jwt-secret")
        fi
        QUAN_GATEWAY_JWT_SECRET=$(cat "$dir/jwt-secret")
    fi
    [ "${#QUAN_GATEWAY_JWT_SECRET}" -ge 16 ] ||
        die "QUAN_GATEWAY_JWT_SECRET (or $dir/jwt-secret) must hold at least 16 characters"
    export QUAN_GATEWAY_JWT_SECRET
}

# QUAN_GATEWAY_JWT_SECRET_FILE, checked as quan_auth.js will read it (else every request would
# be a 500): alone, readable by the workers, at most 64 KiB, 16 characters or more.
load_secret_file() {
    local file=$QUAN_GATEWAY_JWT_SECRET_FILE var=QUAN_GATEWAY_JWT_SECRET_FILE size key
    [ -z "${QUAN_GATEWAY_JWT_SECRET:-}" ] ||
        die "QUAN_GATEWAY_JWT_SECRET and $var are both set: give the key one way only"
    # The workers do not run in this directory.
    case $file in
    /*) ;;
    *) file=$PWD/$file ;;
    esac
    if ! [ -f "$file" ] || ! [ -r "$file" ]; then
        die "$var: cannot read $file"
    fi
    if [ "$(id -u)" -eq 0 ] && ! runuser -u nobody -- test -r "$file" 2>/dev/null; then
        die "$var: $file is not readable by user nobody, whom nginx's workers run as"
    fi
    size=$(stat -c %s "$file")
    [ "$size" -le 65536 ] || die "$var: $file holds more than 65536 bytes (64 KiB)"
    # $(...) drops every trailing newline, quan_auth.js one: a bound on the length is all this is.
    key=$(cat "$file")
    [ "${#key}" -ge 16 ] || die "$var: $file holds fewer than 16 characters"
    unset QUAN_GATEWAY_JWT_SECRET
    export QUAN_GATEWAY_JWT_SECRET_FILE=$file
}

# ---------------------------------------------------------------- commands

cmd_start() {
    local dir=$1 pid bind port i started
    if pid=$(recorded_master "$dir"); then
        log "already running (pid $pid)"
        return 0
    fi
    [ -x "$NGINX" ] || die "$NGINX is missing: run deploy/local/deps.sh"
    [ -f "$JS_MODULE" ] || die "$JS_MODULE is missing: run deploy/local/deps.sh"
    [ -f "$LUA_MODULE" ] || die "$LUA_MODULE is missing: run deploy/local/deps.sh"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # A start that fails from here on leaves no copy of the console outside DIR.
    # shellcheck disable=SC2064 # the path now, while $dir is set
    trap "rm -rf '$(console_outside "$dir")'" EXIT
    write_config "$dir"
    load_secret "$dir"
    read -r bind port <"$dir/port"

    local args=(-p "$dir/" -c "$dir/nginx.conf" -e "$dir/logs/error.log")
    if ! "$NGINX" -t -q "${args[@]}" >"$dir/logs/nginx-t.out" 2>&1; then
        cat "$dir/logs/nginx-t.out" >&2
        die "the configuration in $dir does not pass nginx -t"
    fi
    if listening "$bind" "$port"; then
        die "port $port on $bind is taken already"
    fi
    rm -f "$dir/nginx.pid"
    # Its own session: a signal to the caller's process group (Ctrl-C) does not reach it, and
    # stop can signal its workers with it.
    setsid "$NGINX" "${args[@]}" -g 'daemon off;' </dev/null >>"$dir/logs/nginx.out" 2>&1 &
    started=$!

    # nginx writes its pid file once its sockets are bound: that pid, still a master for DIR,
    # and a connection accepted mean it serves. (setsid runs nginx in its own process where it
    # can, so the pid is usually $started; recording the pid file's is right either way.)
    for ((i = 0; i < START_WAIT * 10; i++)); do
        if [ -s "$dir/nginx.pid" ]; then
            read -r pid <"$dir/nginx.pid" || pid=
            if pid_alive "$pid"; then
                echo "$pid $(pid_starttime "$pid")" >"$dir/gateway.pid"
                if recorded_master "$dir" >/dev/null && listening "$bind" "$port"; then
                    log "listening on $bind:$port (pid $pid, logs in $dir/logs)"
                    trap - EXIT
                    return 0
                fi
            fi
        elif ! pid_alive "$started"; then
            tail -n 20 "$dir/logs/error.log" "$dir/logs/nginx.out" >&2 2>/dev/null || true
            die "nginx exited before it listened"
        fi
        sleep 0.1
    done
    tail -n 20 "$dir/logs/error.log" >&2 2>/dev/null || true
    cmd_stop "$dir"
    kill -KILL "$started" 2>/dev/null || true
    die "nginx did not listen on $bind:$port within ${START_WAIT}s"
}

cmd_stop() {
    local dir=$1 pid i
    [ -d "$dir" ] || return 0
    dir=$(cd "$dir" && pwd)
    if ! pid=$(recorded_master "$dir"); then
        rm -f "$dir/gateway.pid"
        rm -rf "$(console_outside "$dir")"
        return 0
    fi
    # SIGQUIT: finish the requests in hand, then exit (the workers with it).
    kill -QUIT "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_GRACE * 10; i++)); do
        pid_alive "$pid" || break
        sleep 0.1
    done
    if pid_alive "$pid"; then
        log "pid $pid still runs after ${STOP_GRACE}s: SIGKILL to its process group"
        # setsid made it the leader of a group of its own: the master and its workers.
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$dir/gateway.pid"
    rm -rf "$(console_outside "$dir")"
    log "stopped (pid $pid)"
}

cmd_status() {
    local dir=$1 pid bind port
    if [ -d "$dir" ] && dir=$(cd "$dir" && pwd) && pid=$(recorded_master "$dir"); then
        read -r bind port <"$dir/port"
        echo "gateway alive pid $pid port $port"
        return 0
    fi
    echo "gateway dead"
    return 3
}

if [ "${1:-}" = limits ] && [ $# -eq 1 ]; then
    limits_conf
    exit
fi
[ $# -eq 2 ] || usage
case $1 in
start) cmd_start "$2" ;;
stop) cmd_stop "$2" ;;
status) cmd_status "$2" ;;
*) usage ;;
esac
