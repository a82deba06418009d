#!/usr/bin/env bash
# The build, the images and the local stack as a newcomer meets them, checked on a machine that
# is never bare (CI's keeps what it installed once):
#   - `make up`, `make test`, `make bench`, `make soak`, `make fuzz` and `make chaos` install
#     the packages
#     before compiling anything;
#   - a second `make` does nothing, and a touched service source rebuilds that service only;
#   - deploy/Dockerfile's build stage installs the -dev package of every library the Makefile
#     links, its runtime stage the package of every shared library the binaries load, and
#     deploy/local/deps.sh the same -dev packages; the services do not load libxlsxwriter; the
#     images hold every migration file (migrations/ whole);
#   - every image deploy/k8s names is one the Dockerfile documents and has a stage for;
#   - as root, the local stack runs from a directory user postgres cannot enter (a clone under
#     a 0700 home such as /root), `infra.sh stop` stops exactly that PostgreSQL, and a new
#     directory at the same path (a fresh clone there, or .run removed) starts with empty
#     databases.
# The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"

# This runs under `make test`: the parent's jobserver is not ours.
unset MAKEFLAGS MFLAGS MAKELEVEL
tmp=$(mktemp -d /tmp/test_build.XXXXXX)
infra_dirs=()
cleanup() {
    local d
    for d in "${infra_dirs[@]}"; do "$root/deploy/local/infra.sh" stop "$d" >/dev/null 2>&1; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# A copy of the checkout as a clone would have it (tracked and new files, nothing ignored).
src=$tmp/src
mkdir -p "$src"
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - 2>/dev/null) |
    tar -xf - -C "$src"

# ---------------------------------------------------------------- install before compile

# first_line PATTERN FILE: number of the first line matching PATTERN, or 999999.
first_line() { grep -n -m1 -E "$1" "$2" | cut -d: -f1 | grep . || echo 999999; }
for target in up test bench soak fuzz chaos; do
    make -C "$src" --no-print-directory -n "$target" >"$tmp/dry-$target" 2>&1
    deps=$(first_line 'deploy/local/deps\.sh' "$tmp/dry-$target")
    cc=$(first_line '^(ccache )?(cc|gcc|clang|c99) ' "$tmp/dry-$target")
    check "make $target installs the packages (line $deps) before the first compiler call (line $cc)" \
        test "$deps" -lt "$cc" -a "$cc" -ne 999999
done

# ---------------------------------------------------------------- incremental builds

if make -C "$src" -s -j2 all >"$tmp/build1" 2>&1; then
    ok "a fresh copy builds"
else
    bad "a fresh copy builds"
    tail -20 "$tmp/build1"
fi
make -C "$src" all >"$tmp/build2" 2>&1
check "a second make does nothing" \
    bash -c "grep -q 'Nothing to be done' '$tmp/build2' && ! grep -qE '^(ccache )?(cc|gcc|ar) ' '$tmp/build2'"
svc_src=services/settlement/coupon_query.c
touch "$src/$svc_src"
make -C "$src" all >"$tmp/build3" 2>&1
compiles=$(grep -cE '^(ccache )?(cc|gcc) .* -c ' "$tmp/build3")
links=$(grep -E '^(cc|gcc) ' "$tmp/build3" | grep -v ' -c ' | grep -oE -- '-o [^ ]+' | tr '\n' ' ')
check "touching $svc_src recompiles it alone ($compiles compile)" test "$compiles" -eq 1
check "and relinks quan-settlement alone (${links:-none})" test "$links" = "-o build/bin/quan-settlement "

# ---------------------------------------------------------------- packages

# print_var NAME: a variable of the Makefile.
# shellcheck disable=SC2016 # $($*) is make's, not the shell's
print_var() { make -C "$src" -s --no-print-directory -f Makefile -f <(echo 'print-%: ; @echo $($*)') "print-$1"; }
# stage NAME: the Dockerfile stage NAME's text, FROM line to the next FROM.
stage() { awk -v s="$1" 'toupper($1) == "FROM" { on = ($NF == s) } on' "$src/deploy/Dockerfile"; }
stage build >"$tmp/stage-build"
stage runtime >"$tmp/stage-runtime"
# Package names are whole words: libzip4 must not pass for libzip.
has_pkg() { grep -qE "(^|[[:space:]])$1([[:space:]]|\$)" "$2"; }
# owner FILE: the Debian package that installed FILE (merged /usr: try both spellings).
owner() {
    local f alt
    f=$(readlink -f "$1")
    alt=${f/#\/usr\/lib\//\/lib\/}
    [ "$alt" = "$f" ] && alt=${f/#\/lib\//\/usr\/lib\/}
    { dpkg -S "$f" 2>/dev/null || dpkg -S "$alt" 2>/dev/null || dpkg -S "$1" 2>/dev/null; } |
        head -1 | cut -d: -f1
}

pkgs=$(print_var PKGS)
check "the Makefile names the libraries it links (PKGS: $pkgs)" test -n "$pkgs"
for pc in $pkgs; do
    dev=$(owner "$(pkg-config --variable=pcfiledir "$pc")/$pc.pc")
    if [ -z "$dev" ]; then
        bad "$pc.pc belongs to a Debian package"
        continue
    fi
    check "Dockerfile build stage installs $dev (for $pc)" has_pkg "$dev" "$tmp/stage-build"
    check "deps.sh installs $dev (for $pc)" has_pkg "$dev" "$src/deploy/local/deps.sh"
done

needed=$(for b in "$src"/build/bin/quan-*; do
    readelf -d "$b" | awk -F'[][]' '/NEEDED/ {print $2}'
done | sort -u)
check "the binaries load shared libraries" test -n "$needed"
for so in $needed; do
    path=$(ldconfig -p | awk -v s="$so" '$1 == s && /x86-64|x86_64|64bit/ {print $NF; exit}')
    [ -n "$path" ] || path=$(ldconfig -p | awk -v s="$so" '$1 == s {print $NF; exit}')
    pkg=$(owner "$path")
    case $pkg in
    libc6 | "") [ -n "$pkg" ] || bad "$so belongs to a Debian package"; continue ;; # base image
    esac
    check "Dockerfile runtime stage installs $pkg (for $so)" has_pkg "$pkg" "$tmp/stage-runtime"
done

# The migrations include migrations/both/ (tools/migrate): the image holds the whole directory.
check "the runtime stage copies migrations/ whole (both/ with ds_0/ and ds_1/)" \
    grep -qE '^COPY --from=build /src/migrations/ ' "$tmp/stage-runtime"

# libxlsxwriter is linked only into what writes workbooks (quan-sheet-gen, unit tests).
for svc in $(print_var SERVICES); do
    check "quan-$svc does not load libxlsxwriter" \
        bash -c "readelf -d '$src/build/bin/quan-$svc' >'$tmp/needed-$svc' && ! grep -q 'NEEDED.*libxlsxwriter' '$tmp/needed-$svc'"
done

# ---------------------------------------------------------------- images

if command -v kubectl >/dev/null; then
    images=$(kubectl kustomize "$src/deploy/k8s" | awk '$1 == "image:" {print $2}' | sort -u)
else
    images=$(cat "$src"/deploy/k8s/*.yaml | awk '$1 == "image:" {print $2}' | sort -u)
fi
check "deploy/k8s names images" test -n "$images"
for image in $images; do
    repo=${image%:*}
    target=${repo#quan/quan-}
    check "$image: the Dockerfile documents its build (--target $target -t $repo)" \
        grep -qE -- "--target +$target +-t +$repo( |\$)" "$src/deploy/Dockerfile"
    check "$image: the Dockerfile has its stage ($target)" \
        grep -qiE "^FROM +runtime +AS +$target\$" "$src/deploy/Dockerfile"
done

# ---------------------------------------------------------------- a clone under a 0700 home

if [ "$(id -u)" -eq 0 ]; then
    home=$tmp/home # as /root: 0700, user postgres cannot enter
    mkdir -p "$home/clone"
    chmod 0700 "$home"
    dir=$home/clone/.run/infra
    infra_dirs+=("$dir")
    if (unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT
        "$root/deploy/local/infra.sh" start "$dir") >"$tmp/infra1" 2>&1; then
        ok "infra.sh starts from a directory postgres cannot enter"
    else
        bad "infra.sh starts from a directory postgres cannot enter"
        tail -20 "$tmp/infra1"
    fi
    pgd=$(readlink -f "$dir/pg")
    check "its PostgreSQL files live where postgres can go ($pgd)" \
        runuser -u postgres -- test -w "$pgd/data"
    # shellcheck disable=SC1091
    # shellcheck disable=SC1091
    pg_dsn=$(. "$dir/env" && echo "$QUAN_DS0_DSN")
    check "its PostgreSQL answers" psql -X -q "$pg_dsn" -c 'CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)'
    pg_pid=$(awk '$1 == "postgres" {print $2}' "$dir/pids" | tail -1)
    "$root/deploy/local/infra.sh" stop "$dir" >"$tmp/infra2" 2>&1
    # Gone, or a zombie nobody reaped yet (PID 1 in a container need not reap).
    gone() { ! grep -qE '^[0-9]+ \(.*\) [^Z]' "/proc/${1:-0}/stat" 2>/dev/null; }
    check "infra.sh stop stops that PostgreSQL (pid $pg_pid)" gone "$pg_pid"
    (unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT
        "$root/deploy/local/infra.sh" start "$dir") >"$tmp/infra3" 2>&1
    pg_dsn=$(. "$dir/env" && echo "$QUAN_DS0_DSN")
    check "started again, it finds its data" test "$(psql -X -At "$pg_dsn" -c 'SELECT v FROM kept' 2>&1)" = 7
    # A new clone at the same path (or .run removed to start afresh) starts from nothing.
    "$root/deploy/local/infra.sh" stop "$dir" >/dev/null 2>&1
    rm -rf "$home/clone/.run"
    (unset QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT
        "$root/deploy/local/infra.sh" start "$dir") >"$tmp/infra4" 2>&1
    pg_dsn=$(. "$dir/env" && echo "$QUAN_DS0_DSN")
    check "a new directory at the same path starts with empty databases" \
        test "$(psql -X -At "$pg_dsn" -c "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'" 2>&1)" = 0
    "$root/deploy/local/infra.sh" stop "$dir" >/dev/null 2>&1
    case $pgd in /var/lib/postgresql/quan-*) rm -rf "$pgd" ;; esac
else
    echo "skip the 0700-home case: it needs root (user postgres runs the server)"
fi

finish
