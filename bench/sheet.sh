#!/usr/bin/env bash
# Spreadsheet row count against plain decompression, in the same run (no servers needed).
# Generates a 1,000,000-row distribution sheet (libxlsxwriter, constant-memory mode), then
# times, best of 3 each:
#   unzip    unzip -p FILE xl/worksheets/sheet1.xml > /dev/null   (decompression alone)
#   count    quan-sheet-count FILE   (sheet_count_data_rows: what task creation pays)
# and prints both and the ratio (target <= 0.6); then, once, for information, the full read
# (sheet_next_row over every cell) with its peak memory.
#   BENCH_SHEET_ROWS=1000000 bench/sheet.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rows=${BENCH_SHEET_ROWS:-1000000}
build=${QUAN_BUILD:-build}
gen="$build/bin/quan-sheet-gen"
count="$build/bin/quan-sheet-count"
command -v unzip >/dev/null || { echo "unzip is missing (apt-get install unzip)" >&2; exit 1; }
if [ ! -x "$gen" ] || [ ! -x "$count" ]; then
    make -j2 "$gen" "$count" >/dev/null
fi

dir=$(mktemp -d /tmp/quan-bench-sheet.XXXXXX)
trap 'rm -rf "$dir"' EXIT
file="$dir/users.xlsx"
"$gen" "$file" "$rows"

# best_of CMD...: the fastest of 3 runs, in seconds.
best_of() {
    local best='' t0 t1 s
    for _ in 1 2 3; do
        t0=$(date +%s%N)
        "$@"
        t1=$(date +%s%N)
        s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b - a) / 1e9}')
        if [ -z "$best" ] || awk -v a="$s" -v b="$best" 'BEGIN {exit !(a < b)}'; then
            best=$s
        fi
    done
    echo "$best"
}
unzip_only() { unzip -p "$file" xl/worksheets/sheet1.xml >/dev/null; }
count_only() { "$count" "$file" >"$dir/count.out"; }

got=$("$count" "$file")
[ "$got" = "$rows" ] || { echo "sheet count: expected $rows data rows, got $got" >&2; exit 1; }
xml_bytes=$(unzip -l "$file" xl/worksheets/sheet1.xml | awk 'NR == 4 {print $1}')
t_unzip=$(best_of unzip_only)
t_count=$(best_of count_only)

printf 'sheet: %d data rows, %s bytes of sheet XML, %s bytes on disk\n' "$rows" "$xml_bytes" \
    "$(stat -c %s "$file")"
printf '%-52s %8s s\n' "unzip -p sheet1.xml > /dev/null (decompression)" "$t_unzip"
printf '%-52s %8s s\n' "quan-sheet-count (sheet_count_data_rows)" "$t_count"
# shellcheck source=bench/goals.sh
. bench/goals.sh
bench_goal "counting a $rows-row sheet" "$t_count" s "unzip -p of its XML" "$t_unzip" "<=" 0.6
if [ -x /usr/bin/time ]; then
    /usr/bin/time -f '%e %M' -o "$dir/iter.time" "$count" "$file" --iterate >/dev/null
    read -r t_iter rss_iter <"$dir/iter.time"
    /usr/bin/time -f '%M' -o "$dir/count.time" "$count" "$file" >/dev/null
    printf '%-52s %8s s (peak RSS %s kB; count: %s kB)\n' "full read, every cell (sheet_next_row, one run)" \
        "$t_iter" "$rss_iter" "$(cat "$dir/count.time")"
fi
