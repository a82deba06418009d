# shellcheck shell=bash
# Sourced by the shell suites (integration-tests/test_*.sh): the counters, one line per check,
# and the closing line integration-tests/run.sh sums.
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
check() { # check NAME CMD...: passes if CMD succeeds
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}
# tally FILE: counts the "ok   ..." and "FAIL ..." lines a checker program wrote to FILE as this
# suite's own, and shows its other lines (details) indented.
tally() {
    local line
    while IFS= read -r line; do
        case $line in
        "ok   "*) ok "${line#ok   }" ;;
        "FAIL "*) bad "${line#FAIL }" ;;
        *) echo "     $line" ;;
        esac
    done <"$1"
}
# rejects NAME TEXT FILE: a checker run on a copy spoilt on purpose (NAME) wrote to FILE a FAIL
# line starting with TEXT: the checker can fail, and fails on what it should.
rejects() {
    if awk -v t="FAIL $2" 'index($0, t) == 1 { found = 1 } END { exit !found }' "$3"; then
        ok "the checker rejects the copy '$1' ($2)"
    else
        bad "the checker rejects the copy '$1' ($2)"
        sed 's/^/     /' "$3"
    fi
}
# The last line, "N passed, N failed"; the suite's exit status (1 when anything failed).
finish() {
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
}
