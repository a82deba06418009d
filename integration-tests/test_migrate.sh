#!/usr/bin/env bash
# quan-migrate against scratch databases of its own (mig_*_PID on the server of QUAN_DS0_DSN;
# ds_0 and ds_1 are never touched): fresh apply, idempotent rerun, two concurrent runs, the
# shard layout of each database, the unique keys, checksum refusal, rollback of a failing file.
# Needs QUAN_DS0_DSN / QUAN_DS1_DSN (source an infra env, or run via integration-tests/run.sh).
# The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
bin=${QUAN_BIN_DIR:-$root/${QUAN_BUILD:-build}/bin}/quan-migrate
migrations=$root/migrations
export QUAN_LOG_LEVEL=info # the checks read the "applying" lines


if [ -z "${QUAN_DS0_DSN:-}" ] || [ ! -x "$bin" ]; then
    echo "  QUAN_DS0_DSN unset or $bin missing (build it; run through integration-tests/run.sh)"
    echo "0 passed, 1 failed"
    exit 1
fi

# A DSN for database $1 on the same server as QUAN_DS0_DSN (libpq lets a URI query
# parameter override the path's database; a key=value DSN takes a later dbname=).
dsn_for() {
    case $QUAN_DS0_DSN in
    postgres://* | postgresql://*)
        if [[ $QUAN_DS0_DSN == *\?* ]]; then echo "$QUAN_DS0_DSN&dbname=$1"; else echo "$QUAN_DS0_DSN?dbname=$1"; fi ;;
    *) echo "$QUAN_DS0_DSN dbname=$1" ;;
    esac
}
ADMIN=$(dsn_for postgres)
q() { psql -X -q -At -v ON_ERROR_STOP=1 "$@" 2>&1; } # q DSN -c SQL
tmp=$(mktemp -d /tmp/test_migrate.XXXXXX)
dbs=()
cleanup() {
    local d
    for d in "${dbs[@]}"; do q "$ADMIN" -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT

newdb() { # newdb NAME: (re)create a scratch database, print its DSN
    q "$ADMIN" -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null
    q "$ADMIN" -c "CREATE DATABASE $1" >/dev/null || return 1
    dbs+=("$1")
}

A=mig_a_$$ B=mig_b_$$ C=mig_c_$$ D=mig_d_$$
if ! { newdb "$A" && newdb "$B" && newdb "$C" && newdb "$D"; }; then
    echo "  cannot create scratch databases on $ADMIN"
    echo "0 passed, 1 failed"
    exit 1
fi
DA=$(dsn_for "$A") DB=$(dsn_for "$B") DC=$(dsn_for "$C") DD=$(dsn_for "$D")

migrate() { # migrate DS0 DS1 LOG [ARGS...]
    local d0=$1 d1=$2 log=$3
    shift 3
    QUAN_DS0_DSN=$d0 QUAN_DS1_DSN=$d1 QUAN_MIGRATIONS_DIR=$migrations "$bin" "$@" >"$log" 2>&1
}

# ------------------------------------------------------------------ fresh, then again
check "help exits 0" bash -c "'$bin' --help >/dev/null"
check "bad option exits 2" bash -c "'$bin' --nope >/dev/null 2>&1; [ \$? -eq 2 ]"

migrate "$DA" "$DB" "$tmp/first.log"
rc=$?
check "first run exits 0" [ "$rc" -eq 0 ]
[ "$rc" -eq 0 ] || sed 's/^/    /' "$tmp/first.log"
files0=("$migrations"/ds_0/*.sql)
files1=("$migrations"/ds_1/*.sql)
nfiles0=${#files0[@]}
nfiles1=${#files1[@]}
check "every ds_0 file recorded" [ "$(q "$DA" -c 'SELECT count(*) FROM schema_migrations')" = "$nfiles0" ]
check "every ds_1 file recorded" [ "$(q "$DB" -c 'SELECT count(*) FROM schema_migrations')" = "$nfiles1" ]
before=$(q "$DA" -c 'SELECT string_agg(version || applied_at, ",") FROM schema_migrations')

migrate "$DA" "$DB" "$tmp/second.log"
check "second run exits 0" [ $? -eq 0 ]
check "second run applies nothing" bash -c "! grep -q 'applying' '$tmp/second.log'"
check "second run leaves the records alone" \
    [ "$(q "$DA" -c 'SELECT string_agg(version || applied_at, ",") FROM schema_migrations')" = "$before" ]
migrate "$DA" "$DB" "$tmp/status.log" --status
check "--status says up to date (exit 0)" [ $? -eq 0 ]

# ------------------------------------------------------------------ layout
# tables DSN PREFIX FROM TO: how many of PREFIX_FROM..PREFIX_TO exist
tables() {
    q "$1" -c "SELECT count(*) FROM generate_series($3, $4) i
               WHERE to_regclass('public.$2_' || i) IS NOT NULL"
}
check "ds_0 has t_coupon_template_0..7" [ "$(tables "$DA" t_coupon_template 0 7)" = 8 ]
check "ds_0 lacks t_coupon_template_8..15" [ "$(tables "$DA" t_coupon_template 8 15)" = 0 ]
check "ds_1 has t_coupon_template_8..15" [ "$(tables "$DB" t_coupon_template 8 15)" = 8 ]
check "ds_1 lacks t_coupon_template_0..7" [ "$(tables "$DB" t_coupon_template 0 7)" = 0 ]
check "template logs split 0..7 / 8..15" \
    [ "$(tables "$DA" t_coupon_template_log 0 7)$(tables "$DA" t_coupon_template_log 8 15)$(tables "$DB" t_coupon_template_log 8 15)$(tables "$DB" t_coupon_template_log 0 7)" = 8080 ]
check "ds_0 has t_user_coupon_0..15 only" \
    [ "$(tables "$DA" t_user_coupon 0 15)/$(tables "$DA" t_user_coupon 16 31)" = 16/0 ]
check "ds_1 has t_user_coupon_16..31 only" \
    [ "$(tables "$DB" t_user_coupon 16 31)/$(tables "$DB" t_user_coupon 0 15)" = 16/0 ]
check "settlements split 0..7 / 8..15" \
    [ "$(tables "$DA" t_coupon_settlement 0 7)$(tables "$DA" t_coupon_settlement 8 15)$(tables "$DB" t_coupon_settlement 8 15)$(tables "$DB" t_coupon_settlement 0 7)" = 8080 ]
unsharded="t_coupon_task t_coupon_task_fail t_coupon_template_remind t_claim_result t_exchange_code_batch t_exchange_code"
present() { # present DSN TABLES...: count of tables that exist
    local dsn=$1 n=0 t
    shift
    for t in "$@"; do [ "$(q "$dsn" -c "SELECT to_regclass('public.$t') IS NOT NULL")" = t ] && n=$((n + 1)); done
    echo "$n"
}
# shellcheck disable=SC2086
check "unsharded tables in ds_0 only" [ "$(present "$DA" $unsharded)/$(present "$DB" $unsharded)" = 6/0 ]
check "outbox in both databases" [ "$(present "$DA" t_outbox)$(present "$DB" t_outbox)" = 11 ]
check "outbox due index is partial on status = 0" \
    bash -c "psql -X -At '$DB' -c \"SELECT indexdef FROM pg_indexes WHERE indexname = 't_outbox_due_idx'\" | grep -q 'WHERE (status = 0)'"

# The two databases' shards are defined alike: columns and index definitions.
shape() { # shape DSN TABLE: columns and indexes, with the table name normalised
    q "$1" -c "SELECT string_agg(column_name || ' ' || data_type || ' ' || is_nullable || ' ' ||
                                 coalesce(column_default, ''), ',' ORDER BY ordinal_position)
               FROM information_schema.columns WHERE table_name = '$2'"
    q "$1" -c "SELECT string_agg(replace(indexdef, '$2', 'T'), ',' ORDER BY indexdef)
               FROM pg_indexes WHERE tablename = '$2'"
    q "$1" -c "SELECT string_agg(pg_get_constraintdef(oid), ',' ORDER BY pg_get_constraintdef(oid))
               FROM pg_constraint WHERE conrelid = 'public.$2'::regclass"
}
same_shape() { [ -n "$(shape "$1" "$2")" ] && [ "$(shape "$1" "$2")" = "$(shape "$3" "$4")" ]; }
check "template shards alike in ds_0 and ds_1" same_shape "$DA" t_coupon_template_0 "$DB" t_coupon_template_15
check "template log shards alike" same_shape "$DA" t_coupon_template_log_7 "$DB" t_coupon_template_log_8
check "user coupon shards alike" same_shape "$DA" t_user_coupon_0 "$DB" t_user_coupon_31
check "settlement shards alike" same_shape "$DA" t_coupon_settlement_3 "$DB" t_coupon_settlement_12
check "outboxes alike" same_shape "$DA" t_outbox "$DB" t_outbox

# ------------------------------------------------------------------ constraints
uc="INSERT INTO t_user_coupon_20 (id, user_id, coupon_template_id, receive_count, valid_start_time, valid_end_time, request_id)"
check "user coupon insert" bash -c "psql -X -q -v ON_ERROR_STOP=1 '$DB' -c \"$uc VALUES (1, 7, 9, 1, now(), now() + interval '1 day', 'r1')\""
out=$(q "$DB" -c "$uc VALUES (2, 7, 9, 1, now(), now() + interval '1 day', NULL)")
check "duplicate (user, template, receive_count) rejected" grep -q 'duplicate key.*user_tpl_count_key' <<<"$out"
out=$(q "$DB" -c "$uc VALUES (3, 7, 9, 2, now(), now() + interval '1 day', 'r1')")
check "duplicate (user, request_id) rejected" grep -q 'duplicate key.*request_key' <<<"$out"
check "NULL request ids do not collide" bash -c "psql -X -q -v ON_ERROR_STOP=1 '$DB' -c \"$uc VALUES (4, 7, 9, 2, now(), now() + interval '1 day', NULL), (5, 7, 9, 3, now(), now() + interval '1 day', NULL)\""
out=$(q "$DB" -c "$uc VALUES (6, 7, 9, 0, now(), now() + interval '1 day', NULL)")
check "receive_count starts at 1" grep -q 'violates check constraint' <<<"$out"

st="INSERT INTO t_coupon_settlement_2 (id, order_id, user_id, coupon_id, status)"
check "settlement lock" bash -c "psql -X -q -v ON_ERROR_STOP=1 '$DA' -c \"$st VALUES (1, 100, 7, 55, 0)\""
out=$(q "$DA" -c "$st VALUES (2, 101, 7, 55, 0)")
check "second locked settlement for a coupon rejected" grep -q 'duplicate key.*active_coupon_key' <<<"$out"
out=$(q "$DA" -c "$st VALUES (3, 101, 7, 55, 2)")
check "paid settlement beside a locked one rejected" grep -q 'duplicate key' <<<"$out"
check "after cancel, the coupon can be locked again" bash -c "psql -X -q -v ON_ERROR_STOP=1 '$DA' -c \"UPDATE t_coupon_settlement_2 SET status = 1 WHERE id = 1; $st VALUES (4, 102, 7, 55, 0)\""
check "refunded and cancelled rows may repeat" bash -c "psql -X -q -v ON_ERROR_STOP=1 '$DA' -c \"$st VALUES (5, 103, 7, 55, 3), (6, 104, 7, 55, 3), (7, 105, 7, 55, 1)\""
out=$(q "$DA" -c "INSERT INTO t_exchange_code (id, batch_id, coupon_template_id, shop_number, code) VALUES (1, 1, 1, 1, 'ABCDEFGH'), (2, 1, 1, 1, 'ABCDEFGH')")
check "exchange codes are unique" grep -q 'duplicate key' <<<"$out"

# ------------------------------------------------------------------ two at once
migrate "$DC" "$DD" "$tmp/c1.log" &
p1=$!
migrate "$DC" "$DD" "$tmp/c2.log" &
p2=$!
wait $p1
r1=$?
wait $p2
r2=$?
check "concurrent runs both exit 0" [ "$r1$r2" = 00 ]
[ "$r1$r2" = 00 ] || sed 's/^/    /' "$tmp/c1.log" "$tmp/c2.log"
check "concurrent runs recorded each file once" \
    [ "$(q "$DC" -c 'SELECT count(*) FROM schema_migrations')/$(q "$DD" -c 'SELECT count(*) FROM schema_migrations')" = "$nfiles0/$nfiles1" ]
check "each file applied by exactly one of them" \
    [ "$(cat "$tmp/c1.log" "$tmp/c2.log" | grep -c '"msg":"ds_0: applying')" = "$nfiles0" ]
check "concurrent result has the full schema" [ "$(tables "$DD" t_user_coupon 16 31)" = 16 ]

# ------------------------------------------------------------------ changed, new and failing files
cp -r "$migrations" "$tmp/m"
copied=("$tmp/m/ds_0"/*.sql) # sorted: the first was surely applied by the first run
first0=${copied[0]}
echo "-- an edit after the fact" >>"$first0"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" >"$tmp/changed.log" 2>&1
rc=$?
check "changed applied file refused with exit 3" [ "$rc" -eq 3 ]
check "refusal names the file" grep -q "$(basename "$first0").*changed after it was applied" "$tmp/changed.log"
check "refusal says how to accept a reviewed change" grep -q -- "--repair $(basename "$first0" .sql)" "$tmp/changed.log"
# Reviewed changes (comments) are accepted with --repair: their new checksums are recorded,
# and the next plain run finds everything consistent.
second0=${copied[1]}
echo "-- another edit after the fact" >>"$second0"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --repair "$(basename "$first0" .sql),$(basename "$second0" .sql)" >"$tmp/repair.log" 2>&1
check "--repair A,B records both changed files' checksums (exit 0)" [ "$?" -eq 0 ]
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" >"$tmp/repaired.log" 2>&1
check "after --repair a plain run is up to date" [ "$?" -eq 0 ]
cp "$migrations/ds_0/$(basename "$first0")" "$first0"
cp "$migrations/ds_0/$(basename "$second0")" "$second0"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --repair 9999_other >"$tmp/repair-other.log" 2>&1
check "--repair of another file does not accept this one (exit 3)" [ "$?" -eq 3 ]
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --repair "$(basename "$first0" .sql),$(basename "$second0" .sql)" >/dev/null 2>&1

cat >"$tmp/m/ds_0/9001_extra.sql" <<'EOF'
CREATE TABLE mig_test_extra (id bigint PRIMARY KEY);
EOF
cat >"$tmp/m/ds_0/9002_broken.sql" <<'EOF'
CREATE TABLE mig_test_broken (id bigint PRIMARY KEY);
SELECT 1 / 0;
EOF
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --only ds_0 >"$tmp/broken.log" 2>&1
rc=$?
check "failing file exits 1" [ "$rc" -eq 1 ]
check "files before it were applied" [ "$(present "$DA" mig_test_extra)" = 1 ]
check "the failing file left nothing" [ "$(present "$DA" mig_test_broken)" = 0 ]
check "the failing file is not recorded" \
    [ "$(q "$DA" -c "SELECT count(*) FROM schema_migrations WHERE version LIKE '9002%'")" = 0 ]
check "the error names the file" grep -q '9002_broken.sql failed.*division by zero' "$tmp/broken.log"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --status --only ds_0 >"$tmp/pending.log" 2>&1
check "--status exits 4 with a pending file" [ $? -eq 4 ]
rm "$tmp/m/ds_0/9002_broken.sql"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --only ds_0 >"$tmp/fixed.log" 2>&1
check "without it, up to date" [ $? -eq 0 ]

echo "-- bad name" >"$tmp/m/ds_0/extra.sql"
QUAN_DS0_DSN=$DA "$bin" --dir "$tmp/m" --only ds_0 >"$tmp/badname.log" 2>&1
check "badly named file refused" [ $? -eq 1 ]
rm "$tmp/m/ds_0/extra.sql"

# A DSN pointing at the other database's data is refused, not "migrated".
QUAN_DS1_DSN=$DA "$bin" --only ds_1 --dir "$migrations" >"$tmp/swapped.log" 2>&1
rc=$?
check "ds_1 migrations refused on a ds_0 database" [ "$rc" -ne 0 ]
check "and nothing of ds_1 was created there" [ "$(tables "$DA" t_coupon_template 8 15)" = 0 ]

QUAN_DS0_DSN="postgresql://quan@127.0.0.1:1/none" "$bin" --only ds_0 >"$tmp/down.log" 2>&1
check "unreachable server exits 1" [ $? -eq 1 ]

# ------------------------------------------------------------------ what both databases run
# A line "\ir ../both/F" stands for the text of migrations/both/F, and the migration's checksum
# is that of its text with F in place.
included=$(sed -n 's|^\\ir \.\./both/||p' "$migrations"/ds_[01]/*.sql | sort -u)
check "ds_0 and ds_1 include what they share from both/" test -n "$included"
check "every file of both/ is included, every included file is there" \
    [ "$(cd "$migrations/both" && printf '%s\n' *.sql | sort)" = "$included" ]

sha() { sha256sum | cut -d' ' -f1; }
recorded() { q "$1" -c "SELECT checksum FROM schema_migrations WHERE version = '$2'"; }
echo 'CREATE TABLE mig_test_both (id bigint PRIMARY KEY);' >"$tmp/m/both/9003_both.sql"
printf -- '-- ds_0 alone says this\n\\ir ../both/9003_both.sql\n' >"$tmp/m/ds_0/9003_both.sql"
printf '\\ir ../both/9003_both.sql\n' >"$tmp/m/ds_1/9003_both.sql"
QUAN_DS0_DSN=$DA QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" >"$tmp/both.log" 2>&1
rc=$?
check "files including both/9003_both.sql apply (exit 0)" [ "$rc" -eq 0 ]
[ "$rc" -eq 0 ] || sed 's/^/    /' "$tmp/both.log"
check "and it ran in both databases" [ "$(present "$DA" mig_test_both)$(present "$DB" mig_test_both)" = 11 ]
check "the checksum recorded is of the text with the included file in place" \
    [ "$(recorded "$DA" 9003_both)/$(recorded "$DB" 9003_both)" = \
    "$( (echo '-- ds_0 alone says this' && cat "$tmp/m/both/9003_both.sql") | sha)/$(sha <"$tmp/m/both/9003_both.sql")" ]
echo "-- an edit after the fact" >>"$tmp/m/both/9003_both.sql"
QUAN_DS1_DSN=$DB "$bin" --dir "$tmp/m" --only ds_1 >"$tmp/both-changed.log" 2>&1
check "an applied included file changed: refused with exit 3" [ $? -eq 3 ]
check "the refusal names the included file" \
    grep -q '9003_both.sql (with ../both/9003_both.sql) was changed after it was applied' "$tmp/both-changed.log"
rm "$tmp/m/both/9003_both.sql"
QUAN_DS0_DSN=$DA "$bin" --dir "$tmp/m" --only ds_0 >"$tmp/both-missing.log" 2>&1
check "a missing included file: exit 1" [ $? -eq 1 ]
check "the error names it" grep -q 'cannot read .*/both/9003_both.sql, included by' "$tmp/both-missing.log"
printf '\\ir 9004_more.sql\n' >"$tmp/m/both/9003_both.sql"
QUAN_DS0_DSN=$DA "$bin" --dir "$tmp/m" --only ds_0 >"$tmp/both-nested.log" 2>&1
check "an included file that includes another: exit 1" [ $? -eq 1 ]
check "the error says so" grep -q 'includes a file itself' "$tmp/both-nested.log"

finish
