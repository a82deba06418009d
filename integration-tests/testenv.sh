# shellcheck shell=bash
# Sourced (not run) by the scripts that start servers for the suites, integration-tests/run.sh and
# integration-tests/chaos/run.sh: once deploy/local/infra.sh has started the servers, the
# environment the services and the suites read, and the migrations applied.

# test_env ROOT BUILD INFRA_DIR TMP LOG_LEVEL: sources INFRA_DIR/env (the servers' addresses);
# exports this tree's Lua scripts, migrations and binaries (ROOT/BUILD/bin), QUAN_TEST_TMP=TMP,
# QUAN_LOG_LEVEL (LOG_LEVEL unless already set) and a fresh exchange-code key; then runs
# BUILD/bin/quan-migrate (relative to the current directory, ROOT), its output in TMP/migrate.log.
# If the migrations fail it prints that log and "0 passed, 1 failed", and exits 1.
test_env() {
    local root=$1 build=$2 infra=$3 tmp=$4 log_level=$5
    # shellcheck disable=SC1091
    . "$infra/env"
    export QUAN_LUA_DIR="$root/lua-scripts"
    export QUAN_MIGRATIONS_DIR="$root/migrations"
    export QUAN_BIN_DIR="$root/$build/bin"
    export QUAN_TEST_TMP="$tmp"
    export QUAN_LOG_LEVEL=${QUAN_LOG_LEVEL:-$log_level}
    # The exchange-code HMAC key merchant-admin and engine share (a fresh one per run).
    QUAN_CODE_SECRET=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d " \n")
    export QUAN_CODE_SECRET

    if ! "$build/bin/quan-migrate" >"$tmp/migrate.log" 2>&1; then
        cat "$tmp/migrate.log"
        echo "migrations failed"
        echo "0 passed, 1 failed"
        exit 1
    fi
}
