#!/usr/bin/env bash
# The local servers as `make up` runs them keep what they acknowledged through a kill -9 and archive
# their WAL for a point-in-time restore (the restore itself: the chaos suite's restore drill):
# infra.sh's default settings (PostgreSQL fsync, synchronous commit, full pages; Redis' append-
# only file) are read back, a committed row and a Redis write older than a second survive a
# kill -9 of their server and a start of the same directory, and the fast mode the test suites
# use is what it says. Runs its own servers (the suite's own are fast).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"

tmp=$(mktemp -d /tmp/quan-durable.XXXXXX)
chmod 0755 "$tmp"
dirs=()
cleanup() {
    local d
    for d in "${dirs[@]}"; do "$root/deploy/local/infra.sh" stop "$d" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT
unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT

# start DIR [VAR=v ...]: infra.sh start DIR with these settings; 0 when it started.
start() {
    local d=$1
    shift
    env -u QUAN_INFRA_DURABILITY -u QUAN_INFRA_REDIS_PORT -u QUAN_INFRA_PG_PORT -u QUAN_INFRA_AMQP_PORT \
        "$@" "$root/deploy/local/infra.sh" start "$d" >>"$tmp/infra.log" 2>&1
}
pid_of() { awk -v n="$2" '$1 == n {p = $2} END {print p}' "$1/pids"; } # last line wins
pg_show() { psql -qAtX "$QUAN_DS0_DSN" -c "SHOW $1"; }

# ---------------------------------------------------------------- the default: durable

d=$tmp/durable
dirs+=("$d")
if start "$d"; then ok "infra.sh starts with its default settings"; else
    bad "infra.sh starts with its default settings"
    tail -20 "$tmp/infra.log"
    finish
    exit
fi
# shellcheck disable=SC1090
. "$d/env"
rc() { redis-cli -p "$QUAN_REDIS_PORT" "$@"; }
check "PostgreSQL: fsync on" test "$(pg_show fsync)" = on
check "PostgreSQL: synchronous_commit on" test "$(pg_show synchronous_commit)" = on
check "PostgreSQL: full_page_writes on" test "$(pg_show full_page_writes)" = on
check "PostgreSQL: max_wal_size 4GB (few checkpoints under bulk writes)" test "$(pg_show max_wal_size)" = 4GB
check "Redis: appendonly yes" test "$(rc CONFIG GET appendonly | tail -n 1)" = yes
check "PostgreSQL: archive_mode on" test "$(pg_show archive_mode)" = on
check "PostgreSQL: archive_timeout 1min (the RPO of a lost disk)" test "$(pg_show archive_timeout)" = 1min
# A switched segment reaches the archive (backup.sh's point-in-time restore reads it there).
seg=$(psql -qAtX "$QUAN_DS0_DSN" -c "SELECT pg_walfile_name(pg_switch_wal())")
for _ in $(seq 1 50); do
    [ -f "$d/pg/archive/wal/$seg" ] && break
    sleep 0.1
done
check "PostgreSQL: a switched WAL segment is in DIR/pg/archive/wal" test -f "$d/pg/archive/wal/$seg"
check "Redis: appendfsync everysec" test "$(rc CONFIG GET appendfsync | tail -n 1)" = everysec

psql -qAtX "$QUAN_DS0_DSN" -c "CREATE TABLE durable_probe (v text); INSERT INTO durable_probe
    VALUES ('committed')" >/dev/null
rc SET quan:durable:probe kept >/dev/null
sleep 1.5 # everysec: what is older than a second is on disk
pg_pid=$(pid_of "$d" postgres)
redis_pid=$(pid_of "$d" redis)
kill -9 "$pg_pid" "$redis_pid" 2>/dev/null
for _ in $(seq 1 50); do
    kill -0 "$pg_pid" 2>/dev/null || kill -0 "$redis_pid" 2>/dev/null || break
    sleep 0.1
done
if start "$d"; then ok "the same directory starts again after kill -9 of PostgreSQL and Redis"; else
    bad "the same directory starts again after kill -9 of PostgreSQL and Redis"
    tail -20 "$tmp/infra.log"
fi
check "PostgreSQL kept the committed row" \
    test "$(psql -qAtX "$QUAN_DS0_DSN" -c 'SELECT v FROM durable_probe' 2>&1)" = committed
check "Redis kept the write from its append-only file" \
    test "$(rc GET quan:durable:probe)" = kept

# ---------------------------------------------------------------- the test suites' mode

f=$tmp/fast
dirs+=("$f")
if start "$f" QUAN_INFRA_DURABILITY=fast; then
    # shellcheck disable=SC1090
    . "$f/env"
    check "fast: PostgreSQL fsync off" test "$(pg_show fsync)" = off
    check "fast: PostgreSQL archives nothing" test "$(pg_show archive_mode)" = off
    check "fast: Redis appendonly no" \
        test "$(redis-cli -p "$QUAN_REDIS_PORT" CONFIG GET appendonly | tail -n 1)" = no
else
    bad "infra.sh starts with QUAN_INFRA_DURABILITY=fast"
    tail -20 "$tmp/infra.log"
fi
check "a durability that is not one is refused" \
    bash -c "! QUAN_INFRA_DURABILITY=maybe '$root/deploy/local/infra.sh' start '$tmp/never' 2>/dev/null"
check "an archive timeout that is not whole seconds is refused, naming the variable" \
    bash -c "QUAN_INFRA_PG_ARCHIVE_TIMEOUT=1m '$root/deploy/local/infra.sh' start '$tmp/never' 2>&1 |
        grep -q 'QUAN_INFRA_PG_ARCHIVE_TIMEOUT must be' && test ! -e '$tmp/never'"
check "backup.sh restore refuses a time it cannot read, naming it" \
    bash -c "'$root/deploy/local/backup.sh' restore '$d' 'not a time' 2>&1 | grep -q \"TIME: 'not a time'\""
check "backup.sh restore refuses while PostgreSQL runs, touching nothing" \
    bash -c "! '$root/deploy/local/backup.sh' restore '$d' 2>/dev/null && test -f '$d/pg/data/PG_VERSION'"

finish
