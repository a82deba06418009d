#!/usr/bin/env bash
# `make up [TOPOLOGY=single|cluster]`, once the Makefile has installed what is missing and
# built: start the stores under .run/ on fixed loopback ports (so DSNs stay the same between
# runs), apply the migrations, start the services in the background and wait until every
# /readyz answers. Running it twice is fine: what already runs is left alone.
#
#   up.sh [single]   one Redis, one PostgreSQL, one RabbitMQ (.run/infra); each binary once,
#                    on its own port (10010 merchant-admin, 10020 engine, 10030 settlement,
#                    10040 distribution); pids in .run/pids/, logs in .run/logs/
#   up.sh cluster    the deployment Quan is written for (.run/cluster/): a Redis Cluster of
#                    three masters with a replica each on 7379-7384, ds_0 and ds_1 on two
#                    PostgreSQL servers (15433, 15434), a RabbitMQ cluster of three nodes (AMQP
#                    16673-16675) whose queues are quorum queues; two replicas of every binary,
#                    on its port and 100 above (10110, 10120, 10130, 10140); the gateway on
#                    10000 (deploy/local/gateway.sh) in front of them
#
# The two use different store ports, but the same service ports: one runs at a time (the other
# is refused). `make down` stops whichever is up (.run/topologies records them).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# shellcheck source=deploy/local/svc.sh
. deploy/local/svc.sh

topology=${1:-single}
case $topology in
single | cluster) ;;
*)
    echo "up.sh: TOPOLOGY must be single or cluster, not '$topology'" >&2
    exit 2
    ;;
esac

run="$root/.run"
mkdir -p "$run/files"
chmod 0755 "$run"
[ -x build/bin/quan-engine ] || { echo "up.sh: nothing is built; run make up" >&2; exit 1; }

# Where each topology keeps its state: the single one where it always did.
base_of() { if [ "$1" = cluster ]; then echo "$run/cluster"; else echo "$run"; fi; }

# Anything of topology $1 alive: a service its pid files name, or a store of its infra.sh.
topology_up() {
    local b f
    b=$(base_of "$1")
    for f in "$b"/pids/*.pid; do
        [ -f "$f" ] && svc_ours "$f" >/dev/null && return 0
    done
    [ -d "$b/infra" ] && deploy/local/infra.sh status "$b/infra" 2>/dev/null | grep -q ' alive ' &&
        return 0
    return 1
}

other=cluster
[ "$topology" = single ] || other=single
if topology_up "$other"; then
    echo "up.sh: the $other topology is up (its services use the same ports); make down first" >&2
    exit 1
fi

base=$(base_of "$topology")
mkdir -p "$base/logs" "$base/pids"
# What is up, for make down (one line per topology).
grep -qx "$topology" "$run/topologies" 2>/dev/null || echo "$topology" >>"$run/topologies"

infra="$base/infra"
if [ "$topology" = single ]; then
    export QUAN_INFRA_REDIS_PORT=${QUAN_INFRA_REDIS_PORT:-16379}
    export QUAN_INFRA_PG_PORT=${QUAN_INFRA_PG_PORT:-15432}
    export QUAN_INFRA_AMQP_PORT=${QUAN_INFRA_AMQP_PORT:-16672}
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
declare -A ports=([merchant-admin]=10010 [engine]=10020 [settlement]=10030 [distribution]=10040)
replicas=(1)
[ "$topology" = single ] || replicas=(1 2)
procs=()
for svc in merchant-admin engine settlement distribution; do
    for r in "${replicas[@]}"; do
        if [ "$topology" = single ]; then
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

gateway=""
if [ "$topology" = cluster ]; then
    if [ -f deploy/local/gateway.sh ]; then
        list() { echo "127.0.0.1:$1,127.0.0.1:$(($1 + 100))"; }
        if ! QUAN_GATEWAY_PORT=${QUAN_GATEWAY_PORT:-10000} QUAN_GATEWAY_ENGINE=$(list 10020) \
            QUAN_GATEWAY_MERCHANT_ADMIN=$(list 10010) QUAN_GATEWAY_SETTLEMENT=$(list 10030) \
            bash deploy/local/gateway.sh start "$base/gateway"; then
            echo "up.sh: the gateway did not start (deploy/local/gateway.sh start $base/gateway)" >&2
            exit 1
        fi
        gateway="http://127.0.0.1:${QUAN_GATEWAY_PORT:-10000}/ (JWT key: \$QUAN_GATEWAY_JWT_SECRET or $base/gateway/jwt-secret; tokens: build/bin/quan-token)"
    else
        echo "up.sh: no deploy/local/gateway.sh in this tree: the services run without the gateway" >&2
        gateway="not started (no deploy/local/gateway.sh); call the replicas directly"
    fi
fi

if [ "$topology" = single ]; then
    cat <<MSG

Quan is up. Logs: .run/logs/   Stop everything: make down
  merchant-admin  http://127.0.0.1:10010/api/merchant-admin/
  engine          http://127.0.0.1:10020/api/engine/
  settlement      http://127.0.0.1:10030/api/settlement/
  distribution    http://127.0.0.1:10040/
  PostgreSQL      $QUAN_DS0_DSN  $QUAN_DS1_DSN
  Redis           127.0.0.1:$QUAN_REDIS_PORT
  RabbitMQ        amqp://guest:***@127.0.0.1:$QUAN_INFRA_AMQP_PORT/

  Spreadsheets    $run/files/  (fileAddress: a path there, or a local http URL)

Try:
  curl -s http://127.0.0.1:10020/readyz
  curl -s http://127.0.0.1:10010/metrics | head
MSG
else
    redis_line="services: QUAN_REDIS_CLUSTER_NODES=$QUAN_REDIS_CLUSTER_NODES"
    cat <<MSG

Quan is up, cluster topology. Logs: .run/cluster/logs/   Stop everything: make down
  gateway         $gateway
  merchant-admin  http://127.0.0.1:10010/  http://127.0.0.1:10110/
  engine          http://127.0.0.1:10020/  http://127.0.0.1:10120/
  settlement      http://127.0.0.1:10030/  http://127.0.0.1:10130/
  distribution    http://127.0.0.1:10040/  http://127.0.0.1:10140/
  PostgreSQL      ds_0 $QUAN_DS0_DSN
                  ds_1 $QUAN_DS1_DSN
  Redis Cluster   127.0.0.1:$QUAN_INFRA_RCLUSTER_PORT-$((QUAN_INFRA_RCLUSTER_PORT + 5)), three masters and three replicas
                  ($redis_line)
  RabbitMQ        three nodes, AMQP 127.0.0.1:$QUAN_INFRA_AMQP1_PORT, :$QUAN_INFRA_AMQP2_PORT, :$QUAN_INFRA_AMQP3_PORT (quorum queues)
  Status          deploy/local/infra.sh status .run/cluster/infra

  Spreadsheets    $run/files/  (fileAddress: a path there, or a local http URL)

Try:
  curl -s http://127.0.0.1:10120/readyz
  . .run/cluster/infra/env && \$QUAN_INFRA_RABBITMQCTL cluster_status
MSG
fi
cat <<'MSG'
  # Prometheus with Quan's alert rules over this stack: make observe (make down stops it)
  # push template TID's coupons to the users listed in .run/files/users.csv (README.md):
  curl -s -H X-User-Id:1 -H X-Shop-Number:1810714735922956666 -H Content-Type:application/json \
    http://127.0.0.1:10010/api/merchant-admin/coupon-task/create -d '{"taskName":"t1",
    "fileAddress":"users.csv","notifyType":"0","couponTemplateId":"TID","sendType":0}'
MSG
