#!/usr/bin/env bash
# `make up`, once the Makefile has installed what is missing and built: start
# PostgreSQL/Redis/RabbitMQ under .run/ (fixed loopback ports, so DSNs stay the same between
# runs), apply the migrations, start the four services in the background (logs in .run/logs/)
# and wait until every /readyz answers. Running it twice is fine: what already runs is left
# alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

run="$root/.run"
mkdir -p "$run/logs" "$run/pids" "$run/files"
chmod 0755 "$run"
[ -x build/bin/quan-engine ] || { echo "up.sh: nothing is built; run make up" >&2; exit 1; }

export QUAN_INFRA_REDIS_PORT=${QUAN_INFRA_REDIS_PORT:-16379}
export QUAN_INFRA_PG_PORT=${QUAN_INFRA_PG_PORT:-15432}
export QUAN_INFRA_AMQP_PORT=${QUAN_INFRA_AMQP_PORT:-16672}
if ! deploy/local/infra.sh start "$run/infra"; then
    deploy/local/infra.sh stop "$run/infra" || true # a half-started set is worse than none
    exit 1
fi
# shellcheck disable=SC1091
. "$run/infra/env"
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

declare -A ports=([merchant-admin]=10010 [engine]=10020 [settlement]=10030 [distribution]=10040)
for svc in merchant-admin engine settlement distribution; do
    pidfile="$run/pids/$svc.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "quan-$svc already running (pid $(cat "$pidfile"))"
        continue
    fi
    QUAN_HTTP_PORT=${ports[$svc]} setsid "build/bin/quan-$svc" >>"$run/logs/$svc.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
done

for svc in merchant-admin engine settlement distribution; do
    url="http://127.0.0.1:${ports[$svc]}/readyz"
    ready=0
    for _ in $(seq 1 150); do
        if curl -fsS -o /dev/null "$url" 2>/dev/null; then
            ready=1
            break
        fi
        if ! kill -0 "$(cat "$run/pids/$svc.pid")" 2>/dev/null; then
            break
        fi
        sleep 0.2
    done
    if [ "$ready" != 1 ]; then
        echo "quan-$svc is not ready ($url); last log lines:" >&2
        tail -n 20 "$run/logs/$svc.log" >&2
        exit 1
    fi
done

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
cat <<'MSG'
  # push template TID's coupons to the users listed in .run/files/users.csv (README.md):
  curl -s -H X-User-Id:1 -H X-Shop-Number:1810714735922956666 -H Content-Type:application/json \
    http://127.0.0.1:10010/api/merchant-admin/coupon-task/create -d '{"taskName":"t1",
    "fileAddress":"users.csv","notifyType":"0","couponTemplateId":"TID","sendType":0}'
MSG
