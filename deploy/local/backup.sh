#!/usr/bin/env bash
# backup.sh — base backups and point-in-time restore of the PostgreSQL servers infra.sh runs in
# durable mode (the default, `make up`'s), with PostgreSQL's own tools: pg_basebackup, and the
# WAL archive infra.sh's archive_command fills (DIR/pg/archive/wal; DIR/pg0 and DIR/pg1 in the
# cluster topology, one archive per server).
#
#   backup.sh backup  DIR          a base backup of every server of DIR (running), into
#                                  <server>/archive/base/<UTC stamp>/ (data/ and its end time)
#   backup.sh list    DIR          the base backups and the archived WAL's time span
#   backup.sh restore DIR [TIME]   every server of DIR (stopped) back to TIME (date(1) text,
#                                  e.g. '2026-12-07 14:30:05.250 UTC'), or to the end of the WAL
#                                  it has when TIME is absent; then infra.sh starts DIR and the
#                                  databases are marked restored (quan_restore): engines refuse
#                                  claims until quan-recover has run
#
# RPO: what a restore can bring back ends with the last archived segment, cut at least every
# QUAN_INFRA_PG_ARCHIVE_TIMEOUT seconds (default 60); when the data directory is not lost, its
# unarchived WAL (pg_wal) is replayed too. The data directory being replaced is kept, renamed
# data.before-restore-<stamp>, never deleted.
set -euo pipefail

PG_BIN=/usr/lib/postgresql/15/bin
HERE=$(cd "$(dirname "$0")" && pwd)
TIMEOUT=${QUAN_RESTORE_TIMEOUT:-600}

log() { printf 'backup: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
usage() {
    echo "usage: $0 backup|list DIR | restore DIR [TIME]" >&2
    exit 2
}
is_root() { [ "$(id -u)" -eq 0 ]; }

# PostgreSQL's tools run as postgres when we are root (it refuses root).
as_pg() {
    if is_root; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The servers of DIR: "NAME PORTVAR" lines (pg, or pg0 and pg1 in the cluster topology).
servers() {
    case $(cat "$DIR/topology" 2>/dev/null || echo single) in
    cluster) printf 'pg0 QUAN_INFRA_PG0_PORT\npg1 QUAN_INFRA_PG1_PORT\n' ;;
    *) printf 'pg QUAN_INFRA_PG_PORT\n' ;;
    esac
}
pg_dir() { if [ -L "$DIR/$1" ]; then readlink -f "$DIR/$1"; else echo "$DIR/$1"; fi; }
# shellcheck disable=SC1091 # DIR/env is infra.sh's, written at start
port_of() { (. "$DIR/env" && printf '%s' "${!1:-}"); }
running() { as_pg "$PG_BIN/pg_ctl" status -D "$1/data" >/dev/null 2>&1; }
now_ms() { date +%s%3N; }

cmd_backup() {
    local stamp name var d port dest t0
    stamp=$(date -u +%Y%m%dT%H%M%S%3NZ)
    while read -r name var; do
        d=$(pg_dir "$name")
        port=$(port_of "$var")
        if [ -z "$port" ] || ! running "$d"; then
            die "$name of $DIR is not running (start it: make up, or infra.sh start $DIR)"
        fi
        [ -d "$d/archive/wal" ] ||
            die "$name of $DIR does not archive its WAL (QUAN_INFRA_DURABILITY=fast): no point-in-time restore is possible"
        dest=$d/archive/base/$stamp
        as_pg mkdir -p "$dest.part"
        t0=$(now_ms)
        # Fast checkpoint: the backup starts now rather than at the next scheduled checkpoint.
        # The WAL it needs travels with it (-X stream): the copy is usable on its own.
        if ! as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$port" -U postgres -D "$dest.part/data" \
            -X stream --checkpoint=fast -c fast >"$d/basebackup.log" 2>&1; then
            as_pg rm -rf "$dest.part"
            cat "$d/basebackup.log" >&2
            die "pg_basebackup of $name failed"
        fi
        # The segment holding the backup's end goes to the archive now, not in archive_timeout.
        as_pg "$PG_BIN/psql" -qAtX -h 127.0.0.1 -p "$port" -U postgres -d postgres \
            -c 'SELECT pg_switch_wal()' >/dev/null
        now_ms | as_pg tee "$dest.part/end_ms" >/dev/null
        as_pg mv "$dest.part" "$dest"
        log "$name: base backup $dest ($(du -sh "$dest" | cut -f1), $(($(now_ms) - t0)) ms)"
    done < <(servers)
    echo "$stamp"
}

fmt_ms() { date -u -d "@$(($1 / 1000)).$(printf '%03d' $(($1 % 1000)))" '+%Y-%m-%d %H:%M:%S.%3N UTC'; }

cmd_list() {
    local name var d b n first last
    while read -r name var; do
        d=$(pg_dir "$name")
        echo "$name ($d/archive):"
        for b in "$d"/archive/base/*/end_ms; do
            [ -f "$b" ] || continue
            echo "  base $(basename "$(dirname "$b")") ends $(fmt_ms "$(cat "$b")")"
        done
        n=$(find "$d/archive/wal" -maxdepth 1 -type f ! -name '*.part' 2>/dev/null | wc -l)
        if [ "$n" -gt 0 ]; then
            first=$(find "$d/archive/wal" -maxdepth 1 -type f ! -name '*.part' -printf '%T@\n' | sort -n | head -n 1)
            last=$(find "$d/archive/wal" -maxdepth 1 -type f ! -name '*.part' -printf '%T@\n' | sort -n | tail -n 1)
            echo "  wal  $n files archived $(date -u -d "@$first" '+%F %T UTC') .. $(date -u -d "@$last" '+%F %T UTC')"
        else
            echo "  wal  none archived"
        fi
    done < <(servers)
}

# The newest base backup of server dir $1 that ended at or before $2 (ms; empty: the newest).
pick_base() {
    local d=$1 want=$2 best="" best_end=0 b e
    for b in "$d"/archive/base/*/end_ms; do
        [ -f "$b" ] || continue
        e=$(cat "$b")
        if { [ -z "$want" ] || [ "$e" -le "$want" ]; } && [ "$e" -gt "$best_end" ]; then
            best=$(dirname "$b")
            best_end=$e
        fi
    done
    echo "$best"
}

cmd_restore() {
    local time_text=${1:-} target_ms="" target_pg="" name var d base stamp old n
    if [ -n "$time_text" ]; then
        local secs
        secs=$(date -d "$time_text" +%s.%N 2>/dev/null) ||
            die "TIME: '$time_text' is not a time date(1) reads (e.g. '2026-12-07 14:30:05 UTC')"
        target_ms=$(date -d "$time_text" +%s%3N)
        target_pg=$(date -u -d "@$secs" '+%Y-%m-%d %H:%M:%S.%6N+00')
        [ "$target_ms" -le "$(now_ms)" ] || die "TIME: '$time_text' is in the future"
    fi
    [ -f "$DIR/env" ] || die "$DIR holds no infra.sh servers (no $DIR/env)"
    # Every server is checked before any is touched: nothing is restored half.
    while read -r name var; do
        d=$(pg_dir "$name")
        ! running "$d" || die "$name of $DIR is running: stop the stack first (make down)"
        base=$(pick_base "$d" "$target_ms")
        [ -n "$base" ] || die "$name: no base backup in $d/archive/base ended${time_text:+ before TIME ($time_text)} (make backup)"
    done < <(servers)
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
    while read -r name var; do
        d=$(pg_dir "$name")
        base=$(pick_base "$d" "$target_ms")
        old=""
        if [ -d "$d/data" ]; then
            old=$d/data.before-restore-$stamp
            as_pg mv "$d/data" "$old"
        fi
        as_pg cp -a "$base/data" "$d/data"
        # WAL the old directory wrote but had not archived yet: replayed too, as far as TIME.
        if [ -n "$old" ] && [ -d "$old/pg_wal" ]; then
            n=0
            for f in "$old"/pg_wal/[0-9A-F]*; do
                [[ $(basename "$f") =~ ^[0-9A-F]{24}$ ]] || continue
                [ -e "$d/data/pg_wal/$(basename "$f")" ] && continue
                as_pg cp "$f" "$d/data/pg_wal/"
                n=$((n + 1))
            done
            log "$name: $n unarchived WAL segments of the old data directory kept for the replay"
        fi
        rm -f "$d/data/postmaster.pid"
        {
            echo "restore_command = 'cp $d/archive/wal/%f %p'"
            if [ -n "$target_pg" ]; then
                echo "recovery_target_time = '$target_pg'"
                echo "recovery_target_inclusive = on"
            fi
            echo "recovery_target_action = 'promote'"
        } | as_pg tee "$d/data/quan-recovery.conf" >/dev/null
        grep -q "quan-recovery.conf" "$d/data/postgresql.conf" ||
            echo "include_if_exists = 'quan-recovery.conf'" | as_pg tee -a "$d/data/postgresql.conf" >/dev/null
        as_pg touch "$d/data/recovery.signal"
        log "$name: from base $(basename "$base")${old:+ (the old data directory is $old)}"
    done < <(servers)

    "$HERE/infra.sh" start "$DIR" || die "infra.sh start $DIR failed (see the server logs in $DIR)"
    local deadline=$(($(date +%s) + TIMEOUT)) port rec
    while read -r name var; do
        d=$(pg_dir "$name")
        port=$(port_of "$var")
        while :; do
            rec=$(as_pg "$PG_BIN/psql" -qAtX -h 127.0.0.1 -p "$port" -U postgres -d postgres \
                -c 'SELECT pg_is_in_recovery()' 2>/dev/null || echo down)
            [ "$rec" = f ] && break
            if [ "$rec" = down ] && ! running "$d"; then
                tail -n 15 "$d/postgres.log" >&2
                die "$name stopped during the replay (a TIME past the archived WAL?)"
            fi
            [ "$(date +%s)" -lt "$deadline" ] || die "$name still replaying after ${TIMEOUT}s (QUAN_RESTORE_TIMEOUT)"
            sleep 0.5
        done
        as_pg rm -f "$d/data/quan-recovery.conf"
        log "$name: recovered and promoted ($(grep -o 'last completed transaction was at log time [^"]*' "$d/postgres.log" | tail -n 1 || true))"
    done < <(servers)
    # Redis, the queues and the engines describe a future these databases no longer hold:
    # marked, so engines refuse claims until quan-recover has made them agree again.
    local db dsn
    for db in 0 1; do
        # shellcheck disable=SC1091
        dsn=$(. "$DIR/env" && v=QUAN_DS${db}_DSN && printf '%s' "${!v}")
        psql -qAtX "$dsn" -v ON_ERROR_STOP=1 -c "UPDATE quan_restore SET epoch = epoch + 1,
            restored_at = now()" >/dev/null 2>&1 ||
            log "ds_$db: no quan_restore table (not migrated yet?): nothing marked"
    done
    log "restored${time_text:+ to $time_text}; next: make recover (then make up)"
}

[ $# -ge 2 ] || usage
cmd=$1
DIR=$2
[ -d "$DIR" ] || die "$DIR does not exist"
DIR=$(cd "$DIR" && pwd -P)
case $cmd in
backup) [ $# -eq 2 ] || usage && cmd_backup ;;
list) [ $# -eq 2 ] || usage && cmd_list ;;
restore) [ $# -le 3 ] || usage && cmd_restore "${3:-}" ;;
*) usage ;;
esac
