#!/usr/bin/env bash
# `make up [TOPOLOGY=single|cluster|sentinel]`, once the Makefile has installed what is missing and
# built: start the stores under .run/ on fixed loopback ports (so DSNs stay the same between
# runs), apply the migrations, start the services and the gateway in the background and wait
# until every /readyz answers. Running it twice is fine: what already runs is left alone, and
# what died (a service killed, the gateway stopped) is started again.
#
#   up.sh [single]   one Redis, one PostgreSQL, one RabbitMQ (.run/infra); each binary once,
#                    on its own port (10010 merchant-admin, 10020 engine, 10030 settlement,
#                    10040 distribution); the gateway on 10000 (deploy/local/gateway.sh,
#                    .run/gateway) in front of them, serving the merchant console at /console/;
#                    pids in .run/pids/, logs in .run/logs/
#   up.sh cluster    the deployment Quan is written for (.run/cluster/): a Redis Cluster of
#                    three masters with a replica each on 7379-7384, ds_0 and ds_1 on two
#                    PostgreSQL servers (15433, 15434), a RabbitMQ cluster of three nodes (AMQP
#                    16673-16675) whose queues are quorum queues; two replicas of every binary,
#                    on its port and 100 above (10110, 10120, 10130, 10140); the gateway on
#                    10000 (.run/cluster/gateway) in front of them
#   up.sh sentinel   as single (.run/sentinel/), but Redis under Sentinel: a master and its
#                    replica on 16390-16391 and three sentinels on 16392-16394, which the
#                    services ask where the master is (QUAN_REDIS_SENTINELS,
#                    QUAN_REDIS_MASTER_NAME=quan); PostgreSQL on 15435, RabbitMQ on 16676
#
#   QUAN_UP_PORT     (default 10000) moves the gateway and the services together: the gateway
#                    on it, merchant-admin, engine, settlement and distribution 10, 20, 30 and
#                    40 above it (second replicas 100 above those), e.g. beside another clone's
#                    stack. While they run, up.sh again keeps their port (.run/up-port,
#                    .run/cluster/up-port) and refuses another one. The stores' ports are
#                    QUAN_INFRA_*_PORT (deploy/local/README.md).
#
# The topologies use different store ports, but the same service and gateway ports: one runs
# at a time (the others are refused). `make down` stops whichever is up (.run/topologies records
# them).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/svc.sh
. deploy/local/svc.sh

topology=${1:-single}
case $topology in
single | cluster | sentinel) ;;
*)
    echo "up.sh: TOPOLOGY must be single, cluster or sentinel, not '$topology'" >&2
    exit 2
    ;;
esac

run="$root/.run"
mkdir -p "$run/files"
chmod 0755 "$run"
[ -x build/bin/quan-engine ] || { echo "up.sh: nothing is built; run make up" >&2; exit 1; }

# Where each topology keeps its state: the single one where it always did.
base_of() { if [ "$1" = single ]; then echo "$run"; else echo "$run/$1"; fi; }

# A service of topology $1 alive (one its pid files name), or its gateway.
front_up() {
    local b f
    b=$(base_of "$1")
    for f in "$b"/pids/*.pid; do
        [ -f "$f" ] && svc_ours "$f" >/dev/null && return 0
    done
    [ -d "$b/gateway" ] && bash deploy/local/gateway.sh status "$b/gateway" >/dev/null 2>&1
}

# Anything of topology $1 alive: a service, its gateway, or a store of its infra.sh.
topology_up() {
    local b
    b=$(base_of "$1")
    front_up "$1" && return 0
    [ -d "$b/infra" ] && deploy/local/infra.sh status "$b/infra" 2>/dev/null | grep -q ' alive ' &&
        return 0
    return 1
}

for other in single cluster sentinel; do
    [ "$other" != "$topology" ] || continue
    if topology_up "$other"; then
        echo "up.sh: the $other topology is up (same service and gateway ports); make down first" >&2
        exit 1
    fi
done

base=$(base_of "$topology")
mkdir -p "$base/logs" "$base/pids"

# The services' and the gateway's ports. While some of them run, the port they were started on
# (base/up-port) stays: up.sh again without QUAN_UP_PORT keeps it, with another one it refuses
# (it would look for them where they are not).
running_port=""
if [ -s "$base/up-port" ] && front_up "$topology"; then
    running_port=$(cat "$base/up-port")
fi
up_port=${QUAN_UP_PORT:-${running_port:-10000}}
if [ -n "$running_port" ] && [ "$up_port" != "$running_port" ]; then
    echo "up.sh: the $topology topology runs with QUAN_UP_PORT=$running_port, not $up_port; make down first to move it" >&2
    exit 1
fi
# The highest port is the second distribution replica's, 140 above it.
if ! [[ $up_port =~ ^[1-9][0-9]{3,4}$ ]] || [ "$up_port" -gt $((65535 - 140)) ]; then
    echo "up.sh: QUAN_UP_PORT must be a port from 1000 to $((65535 - 140)), not '$up_port'" >&2
    exit 2
fi
echo "$up_port" >"$base/up-port"
# What is up, for make down (one line per topology).
grep -qx "$topology" "$run/topologies" 2>/dev/null || echo "$topology" >>"$run/topologies"

infra="$base/infra"
if [ "$topology" = single ]; then
    export QUAN_INFRA_REDIS_PORT=${QUAN_INFRA_REDIS_PORT:-16379}
    export QUAN_INFRA_PG_PORT=${QUAN_INFRA_PG_PORT:-15432}
    export QUAN_INFRA_AMQP_PORT=${QUAN_INFRA_AMQP_PORT:-16672}
elif [ "$topology" = sentinel ]; then
    export QUAN_INFRA_REDIS_PORT=${QUAN_INFRA_REDIS_PORT:-16390}
    export QUAN_INFRA_PG_PORT=${QUAN_INFRA_PG_PORT:-15435}
    export QUAN_INFRA_AMQP_PORT=${QUAN_INFRA_AMQP_PORT:-16676}
else
    export QUAN_INFRA_RCLUSTER_PORT=${QUAN_INFRA_RCLUSTER_PORT:-7379}
    export QUAN_INFRA_PG0_PORT=${QUAN_INFRA_PG0_PORT:-15433}
    export QUAN_INFRA_PG1_PORT=${QUAN_INFRA_PG1_PORT:-15434}
    export QUAN_INFRA_AMQP1_PORT=${QUAN_INFRA_AMQP1_PORT:-16673}
    export QUAN_INFRA_AMQP2_PORT=${QUAN_INFRA_AMQP2_PORT:-16674}
    export QUAN_INFRA_AMQP3_PORT=${QUAN_INFRA_AMQP3_PORT:-16675}
fi
if ! QUAN_INFRA_TOPOLOGY=$topology deploy/local/infra.sh start "$infra"; then
    deploy/local/infra.sh stop "$infra" || true # a half-started set is worse than none
    exit 1
fi
# shellcheck disable=SC1091
. "$infra/env"
export QUAN_LUA_DIR="$root/lua-scripts"
export QUAN_MIGRATIONS_DIR="$root/migrations"
# The exchange-code HMAC key merchant-admin and engine share, made once and kept in .run/.
if [ ! -s "$run/code-secret" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$run/code-secret")
fi
QUAN_CODE_SECRET=$(cat "$run/code-secret")
export QUAN_CODE_SECRET
# This stack is local and loopback-only, so spreadsheets come from this clone: paths under
# .run/files/, and http URLs of local servers (refused by default, where the network is real).
export QUAN_FILE_ROOT="$run/files"
export QUAN_FILE_ALLOW_INTERNAL=true
# The sheet of the README's walk-through (left alone once it exists): three users, an id that
# is not one (row 5) and a user twice (row 6).
if [ ! -e "$run/files/users.csv" ]; then
    printf 'userId\n1001\n1002\n1003\nabc\n1002\n' >"$run/files/users.csv"
fi

build/bin/quan-migrate

# The services: NAME PORT PIDFILE-NAME, each replica on its own port.
declare -A ports=([merchant-admin]=$((up_port + 10)) [engine]=$((up_port + 20))
    [settlement]=$((up_port + 30)) [distribution]=$((up_port + 40)))
replicas=(1)
[ "$topology" != cluster ] || replicas=(1 2)
procs=()
for svc in merchant-admin engine settlement distribution; do
    for r in "${replicas[@]}"; do
        if [ "$topology" != cluster ]; then
            procs+=("$svc ${ports[$svc]} $svc")
        else
            procs+=("$svc $((ports[$svc] + (r - 1) * 100)) $svc-$r")
        fi
    done
done

for p in "${procs[@]}"; do
    read -r svc port name <<<"$p"
    pidfile="$base/pids/$name.pid"
    if pid=$(svc_ours "$pidfile"); then
        echo "quan-$name already running (pid $pid)"
        continue
    fi
    QUAN_HTTP_PORT=$port setsid "build/bin/quan-$svc" >>"$base/logs/$name.log" 2>&1 </dev/null &
    svc_record "$pidfile" $!
done

for p in "${procs[@]}"; do
    read -r svc port name <<<"$p"
    url="http://127.0.0.1:$port/readyz"
    ready=0
    for _ in $(seq 1 150); do
        if curl -fsS -o /dev/null "$url" 2>/dev/null; then
            ready=1
            break
        fi
        svc_running "$base/pids/$name.pid" || break
        sleep 0.2
    done
    if [ "$ready" != 1 ]; then
        echo "quan-$name is not ready ($url); last log lines:" >&2
        tail -n 20 "$base/logs/$name.log" >&2
        exit 1
    fi
done

# The gateway in front of the replicas of the three services with an API (distribution has
# none). Already running for this directory: left alone, with the upstreams and key it started
# with.
replicas_of() {
    local r list=""
    for r in "${replicas[@]}"; do list+="${list:+,}127.0.0.1:$((ports[$1] + (r - 1) * 100))"; done
    echo "$list"
}
gw=$base/gateway
if ! QUAN_GATEWAY_PORT=$up_port QUAN_GATEWAY_ENGINE=$(replicas_of engine) \
    QUAN_GATEWAY_MERCHANT_ADMIN=$(replicas_of merchant-admin) \
    QUAN_GATEWAY_SETTLEMENT=$(replicas_of settlement) bash deploy/local/gateway.sh start "$gw"; then
    echo "up.sh: the gateway did not start (deploy/local/gateway.sh start $gw; logs in $gw/logs/)" >&2
    exit 1
fi

# The closing message. Paths are relative to the clone, where make up runs.
gw_rel=${gw#"$root"/}
gw_url="http://127.0.0.1:$up_port"
if [ -n "${QUAN_GATEWAY_JWT_SECRET:-}" ]; then
    token="build/bin/quan-token" # it reads the key from the environment too
    key="\$QUAN_GATEWAY_JWT_SECRET"
else
    token="build/bin/quan-token --secret-file $gw_rel/jwt-secret"
    key="$gw_rel/jwt-secret"
fi
ma=${ports[merchant-admin]}
en=${ports[engine]}
st=${ports[settlement]}
di=${ports[distribution]}
more_try=""
# QUAN_INFRA_TLS=1 (infra.sh): the services reach Redis through a stunnel tunnel, RabbitMQ by amqps.
redis_tls=""
[ -z "${QUAN_INFRA_TLS_DIR:-}" ] ||
    redis_tls="  (a stunnel tunnel to Redis' TLS port ${QUAN_INFRA_REDIS_TLS_PORT:-})"
amqp_shown=${QUAN_AMQP_URL:-}
amqp_shown=${amqp_shown/:guest@/:***@}
if [ "$topology" != cluster ]; then
    if [ "$topology" = single ]; then
        title="Quan is up. Logs: .run/logs/"
        stores="  Redis           127.0.0.1:$QUAN_REDIS_PORT$redis_tls
  RabbitMQ        $amqp_shown"
    else
        more_try=$'\n  . .run/sentinel/infra/env && $QUAN_INFRA_RSENTINEL status $QUAN_INFRA_RSENTINEL_DIR'
        title="Quan is up, sentinel topology. Logs: .run/sentinel/logs/"
        stores="  Redis Sentinel  master \"$QUAN_REDIS_MASTER_NAME\" and a replica on 127.0.0.1:$QUAN_INFRA_REDIS_PORT-$((QUAN_INFRA_REDIS_PORT + 1)),
                  sentinels (services: QUAN_REDIS_SENTINELS=$QUAN_REDIS_SENTINELS)
  RabbitMQ        amqp://guest:***@127.0.0.1:$QUAN_INFRA_AMQP_PORT/
  Status          deploy/local/infra.sh status .run/sentinel/infra"
    fi
    cat <<MSG

$title   Stop everything: make down
  gateway         $gw_url/api/{merchant-admin,engine,settlement}/  (a token, below)
  console         $gw_url/console/  (paste a shop's token)
  merchant-admin  http://127.0.0.1:$ma/api/merchant-admin/
  engine          http://127.0.0.1:$en/api/engine/
  settlement      http://127.0.0.1:$st/api/settlement/
  distribution    http://127.0.0.1:$di/
  PostgreSQL      $QUAN_DS0_DSN  $QUAN_DS1_DSN
$stores
MSG
else
    redis_line="services: QUAN_REDIS_CLUSTER_NODES=$QUAN_REDIS_CLUSTER_NODES"
    more_try=$'\n  . .run/cluster/infra/env && $QUAN_INFRA_RABBITMQCTL cluster_status'
    cat <<MSG

Quan is up, cluster topology. Logs: .run/cluster/logs/   Stop everything: make down
  gateway         $gw_url/api/{merchant-admin,engine,settlement}/  (a token, below)
  console         $gw_url/console/  (paste a shop's token)
  merchant-admin  http://127.0.0.1:$ma/  http://127.0.0.1:$((ma + 100))/
  engine          http://127.0.0.1:$en/  http://127.0.0.1:$((en + 100))/
  settlement      http://127.0.0.1:$st/  http://127.0.0.1:$((st + 100))/
  distribution    http://127.0.0.1:$di/  http://127.0.0.1:$((di + 100))/
  PostgreSQL      ds_0 $QUAN_DS0_DSN
                  ds_1 $QUAN_DS1_DSN
  Redis Cluster   127.0.0.1:$QUAN_INFRA_RCLUSTER_PORT-$((QUAN_INFRA_RCLUSTER_PORT + 5)), three masters and three replicas
                  ($redis_line)
  RabbitMQ        three nodes, AMQP 127.0.0.1:$QUAN_INFRA_AMQP1_PORT, :$QUAN_INFRA_AMQP2_PORT, :$QUAN_INFRA_AMQP3_PORT (quorum queues)
  Status          deploy/local/infra.sh status .run/cluster/infra
MSG
fi
cat <<MSG

  Spreadsheets    $run/files/  (fileAddress: a path there, or a local http URL)

Tokens for the gateway (its key: $key): a merchant's, for the console, and a user's:
  $token --user 1 --shop 1810714735922956666 --name alice
  $token --user 42

Try:
  curl -s http://127.0.0.1:$en/readyz$more_try
  T=\$($token --user 42)
  curl -s -H "Authorization: Bearer \$T" $gw_url/api/engine/user-coupon/list
  # Prometheus with Quan's alert rules over this stack: make observe (make down stops it)
  # push template TID's coupons to the users listed in .run/files/users.csv (README.md):
  curl -s -H X-User-Id:1 -H X-Shop-Number:1810714735922956666 -H Content-Type:application/json \\
    http://127.0.0.1:$ma/api/merchant-admin/coupon-task/create -d '{"taskName":"t1",
    "fileAddress":"users.csv","notifyType":"0","couponTemplateId":"TID","sendType":0}'
MSG
