# shellcheck shell=bash
# bench/goals.sh — sourced by the benchmark scripts: each records its goals and figures, and
# `make bench` (bench/run.sh) prints them together as one table at the end.
#   bench_goal LABEL VALUE UNIT BASELINE_LABEL BASELINE OP GOAL
#       VALUE / BASELINE against GOAL (OP: >= or <=), appended to the file named by
#       $BENCH_GOALS; without it (a script run alone) the line is only printed
#   bench_goal_cost LABEL VALUE UNIT OP LIMIT
#       a cost that carries to a deployment as it is (CPU microseconds of one program per
#       item): VALUE against LIMIT itself, no baseline
#   bench_figure LABEL VALUE UNIT BASELINE_LABEL BASELINE [WHY]
#       a ratio printed and tabled beside the goals but not judged (WHY says why it is no goal)
#   bench_goals_table FILE
#       the table of every recorded line, then "goals: N of M met"
# Speed is never asserted: a missed goal is reported, and the run goes on.

# bench_line LABEL VALUE UNIT BASELINE_LABEL BASELINE RATIO OP GOAL VERDICT: prints one
# "goal:"/"figure:" line and records it as a tab-separated row.
bench_line() {
    local kind=goal line
    [ "$9" != figure ] || kind=figure
    line=$(printf '%s\t%s %s\t%s\t%s\t%s %s\t%s' "$1" "$2" "$3" "$4${5:+ $5}" "$6" "$7" "$8" "$9")
    printf '%s: %s\n' "$kind" "$line" | tr '\t' ' '
    [ -z "${BENCH_GOALS:-}" ] || printf '%s\n' "$line" >>"$BENCH_GOALS"
}

# bench_fmt VALUE: a number as the table shows it (no decimals from 100 on).
bench_fmt() {
    awk -v v="$1" 'BEGIN { if (v + 0 >= 100) printf "%.0f", v; else printf "%s", v }'
}

bench_goal() {
    local label=$1 value=$2 unit=$3 blabel=$4 base=$5 op=$6 goal=$7 ratio verdict
    ratio=$(awk -v v="$value" -v b="$base" 'BEGIN { printf "%.2f", (b > 0 ? v / b : 0) }')
    verdict=$(awk -v r="$ratio" -v op="$op" -v g="$goal" \
        'BEGIN { ok = (op == ">=") ? (r >= g) : (r <= g); print ok ? "met" : "MISSED" }')
    bench_line "$label" "$(bench_fmt "$value")" "$unit" "$blabel" "$(bench_fmt "$base") $unit" \
        "$ratio" "$op" "$goal" "$verdict"
}

bench_goal_cost() {
    local label=$1 value=$2 unit=$3 op=$4 limit=$5 verdict
    verdict=$(awk -v v="$value" -v op="$op" -v g="$limit" \
        'BEGIN { ok = (op == ">=") ? (v >= g) : (v <= g); print ok ? "met" : "MISSED" }')
    bench_line "$label" "$(awk -v v="$value" 'BEGIN { printf "%.1f", v }')" "$unit" \
        "(a cost, no baseline)" "" "-" "$op" "$limit $unit" "$verdict"
}

bench_figure() {
    local label=$1 value=$2 unit=$3 blabel=$4 base=$5 why=${6:-} ratio
    ratio=$(awk -v v="$value" -v b="$base" 'BEGIN { printf "%.2f", (b > 0 ? v / b : 0) }')
    bench_line "$label" "$(bench_fmt "$value")" "$unit" "$blabel" "$(bench_fmt "$base") $unit" \
        "$ratio" "" "${why:-(no goal)}" figure
}

bench_goals_table() {
    [ -s "$1" ] || return 0
    printf '\n%s\n' "every goal and figure of this run (ratios against a baseline measured in the same run)"
    awk -F'\t' '
        BEGIN { printf "%-50s %16s  %-40s %6s %10s  %s\n", "path", "this run", "baseline", "ratio", "goal", "" }
        { printf "%-50s %16s  %-40s %6s %10s  %s\n", $1, $2, $3, $4, $5, $6
          if ($6 != "figure") { n++; met += $6 == "met" } }
        END { printf "goals: %d of %d met\n", met, n }' "$1"
}
