# shellcheck shell=bash
# bench/goals.sh — sourced by the benchmark scripts: each records its ratios against their
# goals, and `make bench` (bench/run.sh) prints them together as one table at the end.
#   bench_goal LABEL VALUE UNIT BASELINE_LABEL BASELINE OP GOAL
#       VALUE / BASELINE against GOAL (OP: >= or <=), appended to the file named by
#       $BENCH_GOALS; without it (a script run alone) the line is only printed
#   bench_goals_table FILE
#       the table of every recorded goal, then "goals: N of M met"
# Speed is never asserted: a missed goal is reported, and the run goes on.

bench_goal() {
    local label=$1 value=$2 unit=$3 blabel=$4 base=$5 op=$6 goal=$7 line
    line=$(awk -v l="$label" -v v="$value" -v u="$unit" -v bl="$blabel" -v b="$base" \
        -v op="$op" -v g="$goal" 'BEGIN {
            r = b > 0 ? v / b : 0
            if (v + 0 >= 100) v = sprintf("%.0f", v)
            ok = (op == ">=") ? (r >= g) : (r <= g)
            printf "%s\t%s %s\t%s %s %s\t%.2f\t%s %s\t%s", l, v, u, bl, b, u, r, op, g,
                ok ? "met" : "MISSED"
        }')
    printf 'goal: %s\n' "$line" | tr '\t' ' '
    [ -z "${BENCH_GOALS:-}" ] || printf '%s\n' "$line" >>"$BENCH_GOALS"
}

bench_goals_table() {
    [ -s "$1" ] || return 0
    printf '\n%s\n' "every goal of this run (each ratio against a baseline measured in the same run)"
    awk -F'\t' '
        BEGIN { printf "%-46s %16s  %-38s %6s %8s  %s\n", "path", "this run", "baseline", "ratio", "goal", "" }
        { printf "%-46s %16s  %-38s %6s %8s  %s\n", $1, $2, $3, $4, $5, $6; n++; met += $6 == "met" }
        END { printf "goals: %d of %d met\n", met, n }' "$1"
}
