#!/usr/bin/env bash
# `make up` as a user meets it: deploy/local/up.sh in a copy of the tree (the binaries of this
# build copied in), run from a clean environment with every port moved off the defaults
# (QUAN_UP_PORT, QUAN_INFRA_*_PORT), so it never meets a developer's own `make up`:
#   - the stores, the four services and the gateway start: every /readyz 200, the merchant
#     console through the gateway, a closing message naming the gateway, the console and how to
#     make a token; no process of it listens on a default port;
#   - a merchant's token made with quan-token (as the message says) creates a template through
#     the gateway and reads it back, a user's token reads it through the engine; no token: 401;
#   - the merchant console driven in headless Chromium through this gateway
#     (integration-tests/console_browser.py: log in, a template, a task's progress bar and its
#     failure report, statistics, exchange codes, a coupon's history, no browser console error);
#   - after kill -9 of the engine, up.sh again starts the engine alone: every other process
#     keeps its pid, and the gateway reaches the new engine;
#   - down.sh leaves no process of the copy running, frees every port it listened on and
#     removes the console's copy outside the tree (as root, /var/lib/quan-gateway);
#   - then, briefly, up.sh sentinel (make up TOPOLOGY=sentinel): Redis as a master, its replica
#     and three sentinels, the services told only where the sentinels are; the README's walk
#     (a template created, queried, a coupon claimed, the coupons fitting an order) straight to
#     the services; down.sh sentinel leaving no process and no port of it.
# The copy lives in a 0700 temporary directory, as a clone under /root does: as root, user
# postgres and nginx's workers (user nobody) cannot enter it, so the stores' and the console's
# files go where they can (deploy/local/README.md, "Running as root"). About 60 s.
# The last line is "N passed, N failed".
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=integration-tests/testlib.sh
. "$root/integration-tests/testlib.sh"
py=/usr/bin/python3
SHOP=1810714735922956666

bin=${QUAN_BIN_DIR:-$root/${QUAN_BUILD:-build}/bin}
if ! [ -x "$bin/quan-engine" ] || ! [ -x "$bin/quan-token" ]; then
    bad "the binaries are built ($bin)"
    finish
    exit
fi

tmp=$(mktemp -d /tmp/test_up.XXXXXX)
src=$tmp/quan
run=$src/.run

# ---------------------------------------------------------------- processes of the copy

# starttime PID: field 22 of /proc/PID/stat (with the pid, one process), nothing when gone.
starttime() {
    local st f
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    read -r -a f <<<"$st"
    [ "${f[0]}" != Z ] || return 1 # a zombie is gone (PID 1 need not reap it)
    echo "${f[19]}"
}
# alive PID START: that very process still runs; gone PID START: it does not.
alive() { [ "$(starttime "$1")" = "$2" ]; }
gone() { ! alive "$@"; }

# The places whose processes are the copy's: the tree, and where its PostgreSQL keeps its files
# when user postgres cannot enter the tree.
places() {
    echo "$tmp"
    local pgd i
    for i in "$run/infra/pg" "$run/sentinel/infra/pg"; do
        pgd=$(readlink -f "$i" 2>/dev/null) && [ "${pgd#"$tmp"}" = "$pgd" ] && echo "$pgd"
    done
    return 0
}

# tree_procs: "PID STARTTIME" of every process of the copy: those its scripts recorded, those
# running in it (working directory) or naming it (command line), and every descendant of those.
tree_procs() {
    local p cwd cmd pl found=() pid ppid
    mapfile -t pl < <(places)
    mapfile -t found < <(recorded | awk '$2 ~ /^[0-9]+$/ {print $2}')
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        if [ "$p" = $$ ] || [ "$p" = "$BASHPID" ]; then continue; fi
        cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || cwd=
        cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || cmd=
        for d in "${pl[@]}"; do
            if [[ $cwd == "$d" || $cwd == "$d"/* || $cmd == *"$d"/* ]]; then
                found+=("$p")
                break
            fi
        done
    done
    # Descendants: workers, Erlang's helpers.
    declare -A seen=()
    for p in "${found[@]}"; do seen[$p]=1; done
    local grew=1
    while [ "$grew" = 1 ]; do
        grew=0
        while read -r pid ppid; do
            if [ -n "${seen[$ppid]:-}" ] && [ -z "${seen[$pid]:-}" ]; then
                seen[$pid]=1
                grew=1
            fi
        done < <(ps -e -o pid=,ppid=)
    done
    for p in "${!seen[@]}"; do
        local t
        t=$(starttime "$p") && echo "$p $t"
    done
}

# listening_ports PIDS...: the TCP ports those processes listen on.
listening_ports() {
    local re
    re=$(printf '|%s' "$@")
    ss -Hltnp 2>/dev/null | grep -E "pid=(${re#|})," | awk '{print $4}' | sed 's/.*://' | sort -un
}
port_busy() { ss -Hltn 2>/dev/null | awk '{print $4}' | grep -qE ":$1\$"; }
port_free() { ! port_busy "$1"; }

# pid_of FILE: the first field of a pid file.
pid_of() { awk 'NR == 1 {print $1}' "$1" 2>/dev/null; }
# The pids up.sh and the scripts it runs recorded: "NAME PID", one a line.
recorded() {
    local f
    for f in "$run"/pids/*.pid; do
        [ -f "$f" ] && echo "$(basename "$f" .pid) $(pid_of "$f")"
    done
    [ -f "$run/gateway/gateway.pid" ] && echo "gateway $(pid_of "$run/gateway/gateway.pid")"
    [ -f "$run/infra/pids" ] && awk '{print "infra-" $1, $2}' "$run/infra/pids"
}

# up / down: the scripts as a user runs them from a shell of their own: nothing of this suite's
# environment (run.sh's servers' addresses), the ports chosen below.
up_env() {
    env -i PATH="$PATH" HOME="${HOME:-/root}" LANG=C.UTF-8 QUAN_UP_PORT="$base" \
        QUAN_INFRA_REDIS_PORT=$((base + 4)) QUAN_INFRA_PG_PORT=$((base + 2)) \
        QUAN_INFRA_AMQP_PORT=$((base + 3)) QUAN_INFRA_DURABILITY=fast "$@"
}
up() { (cd / && up_env bash "$src/deploy/local/up.sh") >"$1" 2>&1; }
down() { (cd / && up_env bash "$src/deploy/local/down.sh") >"$1" 2>&1; }

cleanup() {
    local p t pl pgd
    if [ -d "$run" ]; then
        down "$tmp/down-cleanup.log" || true
        # Whatever down.sh left (it failed above): started by this suite, in its copy. Again
        # until none is left: a parent killed after its children may have started new ones
        # (nginx's master replaces a dead worker).
        for _ in 1 2 3 4 5; do
            tree_procs >"$tmp/left"
            [ -s "$tmp/left" ] || break
            while read -r p t; do
                if alive "$p" "$t"; then kill -KILL "$p" 2>/dev/null; fi
            done <"$tmp/left"
            sleep 0.2
        done
        for pl in "$run/infra/pg" "$run/sentinel/infra/pg"; do
            pgd=$(readlink -f "$pl" 2>/dev/null)
            case $pgd in /var/lib/postgresql/quan-*) rm -rf "$pgd" ;; esac
        done
        [ -z "${console_dir:-}" ] || case $console_dir in
        /var/lib/quan-gateway/console-*) rm -rf "$console_dir" ;;
        esac
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# ---------------------------------------------------------------- the copy and its ports

# A copy of the checkout as a clone has it (tracked and new files, nothing ignored), with this
# build's binaries and the console's Chart.js (deps.sh installs it; git ignores it).
mkdir -p "$src/build"
(cd "$root" && git ls-files -z -co --exclude-standard | xargs -0 tar -cf - 2>/dev/null) |
    tar -xf - -C "$src"
cp -a "$bin" "$src/build/bin"
chart=deploy/console/node_modules/chart.js/dist/chart.umd.js
[ ! -d "$root/deploy/console/node_modules" ] ||
    cp -r "$root/deploy/console/node_modules" "$src/deploy/console/"
check "a copy of the tree with the binaries ($src)" test -x "$src/build/bin/quan-engine" -a \
    -x "$src/deploy/local/up.sh"

# The base port: 11000-14900, where neither make up's own ports lie (10000-10140, the stores'
# 15432-16675, 7379-7384 and 17379-17384) nor the ports infra.sh picks (20000-32000). The
# gateway on it and its /metrics 1 above (gateway.sh's default), the services 10-40 above,
# PostgreSQL, AMQP and Redis 2-4 above.
base=
for _ in $(seq 1 40); do
    b=$((11000 + RANDOM % 40 * 100))
    busy=0
    for p in $b $((b + 1)) $((b + 2)) $((b + 3)) $((b + 4)) $((b + 10)) $((b + 20)) $((b + 30)) $((b + 40)) \
        $((b + 50)) $((b + 51)) $((b + 52)) $((b + 53)) $((b + 54)); do
        if port_busy "$p"; then busy=1; fi
    done
    if [ "$busy" = 0 ]; then
        base=$b
        break
    fi
done
if [ -z "$base" ]; then
    bad "free ports for the copy's stack (11000-14940)"
    finish
    exit
fi
gw=http://127.0.0.1:$base
echo "     the copy's gateway on $base, services on $((base + 10))-$((base + 40))"

# ---------------------------------------------------------------- up

t0=$SECONDS
if up "$tmp/up1.log"; then
    ok "up.sh starts the stack ($((SECONDS - t0)) s)"
else
    bad "up.sh starts the stack ($((SECONDS - t0)) s)"
    tail -n 30 "$tmp/up1.log" | sed 's/^/     /'
    finish
    exit
fi

code() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@"; }
status() { tail -n 1 <<<"$1"; }
body() { sed '$d' <<<"$1"; }
for s in merchant-admin:10 engine:20 settlement:30 distribution:40; do
    c=$(code "http://127.0.0.1:$((base + ${s#*:}))/readyz")
    check "${s%:*} /readyz on $((base + ${s#*:})): $c" test "$c" = 200
done

# is_page ANSWER: 200 with the console's page.
is_page() { [ "$(status "$1")" = 200 ] && grep -qF "<title>Quan merchant console</title>" <<<"$1"; }
page=$(curl -s --max-time 10 -w '\n%{http_code}' "$gw/console/")
check "GET /console/ through the gateway: $(status "$page") with the page" is_page "$page"
c=$(code "$gw/console/console.js")
check "GET /console/console.js through the gateway: $c" test "$c" = 200
if [ -f "$src/$chart" ]; then
    c=$(code "$gw/console/vendor/chart.umd.js")
    check "GET /console/vendor/chart.umd.js (Chart.js) through the gateway: $c" test "$c" = 200
else
    echo "     no $chart in this tree (npm ci --prefix deploy/console): the chart is not checked"
fi

msg=$tmp/up1.log
check "the closing message names the gateway ($gw/api/...)" grep -qF "$gw/api/" "$msg"
check "the closing message names the console ($gw/console/)" grep -qF "$gw/console/" "$msg"
check "the closing message says how to make a token (build/bin/quan-token --secret-file .run/gateway/jwt-secret)" \
    grep -qF "build/bin/quan-token --secret-file .run/gateway/jwt-secret --user" "$msg"

# Every process of the copy, and the ports they listen on: none of make up's defaults.
tree_procs >"$tmp/procs1"
mapfile -t pids1 < <(awk '{print $1}' "$tmp/procs1")
recorded >"$tmp/recorded1"
missing=$(while read -r n p; do grep -q "^$p " "$tmp/procs1" || echo "$n:$p"; done <"$tmp/recorded1")
check "every process the scripts recorded runs ($(wc -l <"$tmp/recorded1"); the copy's: $(wc -l <"$tmp/procs1"))${missing:+; not: $missing}" \
    test -z "$missing" -a -s "$tmp/recorded1"
for n in merchant-admin engine settlement distribution gateway infra-redis infra-postgres infra-rabbitmq; do
    check "recorded: $n" grep -q "^$n [0-9]" "$tmp/recorded1"
done
listening_ports "${pids1[@]}" >"$tmp/ports1"
# make up's own: the gateway and services (and second replicas), the stores of both topologies.
defaults='^(100[0-4]0|101[0-4]0|16379|1639[0-4]|1543[2345]|1667[2-6]|7379|738[0-4]|17379|1738[0-4])$'
off_defaults() { [ -s "$1" ] && ! grep -qE "$defaults" "$1"; }
check "they listen on $(wc -l <"$tmp/ports1") ports ($(tr '\n' ' ' <"$tmp/ports1")), none of make up's defaults" \
    off_defaults "$tmp/ports1"
for p in "$base" $((base + 10)) $((base + 20)) $((base + 30)) $((base + 40)); do
    check "port $p is one of theirs" grep -qx "$p" "$tmp/ports1"
done

# ---------------------------------------------------------------- through the gateway

token() { "$src/build/bin/quan-token" --secret-file "$run/gateway/jwt-secret" "$@"; }
mtok=$(token --user 1 --shop "$SHOP" --name alice)
utok=$(token --user 42)
check "quan-token makes tokens with the gateway's key" test -n "$mtok" -a -n "$utok"
# call METHOD PATH TOKEN [BODY]: the answer's body, then its status on a line of its own.
call() {
    local args=(-s --max-time 10 -X "$1" -H Content-Type:application/json -w '\n%{http_code}')
    [ -z "$3" ] || args+=(-H "Authorization: Bearer $3")
    [ -z "${4:-}" ] || args+=(-d "$4")
    curl "${args[@]}" "$gw$2"
}
# field JSON PATH...: a field of the answer's envelope (data.id: field "$r" data id).
field() {
    $py -c 'import json,sys
v = json.loads(sys.argv[1])
for k in sys.argv[2:]:
    v = v[k]
print(v)' "$@" 2>/dev/null
}

name="up-$RANDOM$RANDOM"
tpl='{"name":"'$name'","source":0,"target":1,"type":1,"validStartTime":"2026-01-01 00:00:00",
  "validEndTime":"2035-12-31 23:59:59","stock":100,"receiveRule":{"limitPerPerson":1},
  "consumeRule":{"termsOfUse":100,"maximumDiscountAmount":10,"validityPeriod":48}}'
r=$(call POST /api/merchant-admin/coupon-template/create "$mtok" "$tpl")
id=$(field "$(body "$r")" data id)
check "a merchant's token creates a template through the gateway: $(status "$r") id ${id:-none}" \
    test "$(status "$r")" = 200 -a -n "$id"
r=$(call GET "/api/merchant-admin/coupon-template/find?couponTemplateId=$id" "$mtok")
check "and reads it back through the gateway: $(status "$r") $(field "$(body "$r")" data name)" \
    test "$(status "$r")" = 200 -a "$(field "$(body "$r")" data id)" = "$id" \
    -a "$(field "$(body "$r")" data name)" = "$name"
q="/api/engine/coupon-template/query?shopNumber=$SHOP&couponTemplateId=$id"
r=$(call GET "$q" "$utok")
check "a user's token reads it through the gateway from the engine: $(status "$r")" \
    test "$(status "$r")" = 200 -a "$(field "$(body "$r")" data id)" = "$id"
r=$(call GET /api/engine/user-coupon/list "")
check "no token: 401 ($(status "$r"))" test "$(status "$r")" = 401
r=$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' -H X-User-Id:1 -H "X-Shop-Number:$SHOP" \
    -H Content-Type:application/json -d "$tpl" "$gw/api/merchant-admin/coupon-template/create")
check "identity headers without a token: 401 ($r)" test "$r" = 401

# ---------------------------------------------------------------- the console in a browser

# The merchant console on this stack as a merchant meets it after make up: headless Chromium
# through this gateway, with a shop token from its key file (integration-tests/console_browser.py:
# its checks, its screenshots in QUAN_CONSOLE_SCREENSHOTS or this suite's temporary directory).
shots=${QUAN_CONSOLE_SCREENSHOTS:-$tmp/screenshots}
mkdir -p "$shots"
t0=$SECONDS
QUAN_CONSOLE_STACK=$src QUAN_UP_PORT=$base QUAN_CONSOLE_SCREENSHOTS=$shots \
    QUAN_BIN_DIR="$src/build/bin" timeout 600 $py "$root/integration-tests/console_browser.py" \
    >"$tmp/console.log" 2>&1
rc=$?
sed 's/^/     /' "$tmp/console.log" | grep -vE '^ +ok ' | tail -n 40
if grep -q '^SKIPPED' "$tmp/console.log"; then
    echo "     the console's browser test: $(grep '^SKIPPED' "$tmp/console.log")"
else
    read -r cp cf < <(awk '/^[0-9]+ passed, [0-9]+ failed$/ {p = $1; f = $3} END {print p + 0, f + 0}' \
        "$tmp/console.log")
    check "the console in headless Chromium against this stack: $cp passed, $cf failed, exit $rc ($((SECONDS - t0)) s)" \
        test "$rc" = 0 -a "$cf" = 0 -a "$cp" -gt 0
fi

# ---------------------------------------------------------------- kill -9 of the engine, up again

engine1=$(pid_of "$run/pids/engine.pid")
start1=$(starttime "$engine1")
kill -KILL "$engine1" 2>/dev/null
for _ in $(seq 1 50); do
    alive "$engine1" "$start1" || break
    sleep 0.1
done
check "kill -9 of the engine (pid $engine1)" gone "$engine1" "$start1"
c=$(code "http://127.0.0.1:$((base + 20))/readyz")
check "the engine does not answer ($c)" test "$c" = 000

t0=$SECONDS
if up "$tmp/up2.log"; then
    ok "up.sh again ($((SECONDS - t0)) s)"
else
    bad "up.sh again ($((SECONDS - t0)) s)"
    tail -n 30 "$tmp/up2.log" | sed 's/^/     /'
fi
engine2=$(pid_of "$run/pids/engine.pid")
check "it started the engine again (pid ${engine2:-none}, was $engine1)" \
    test -n "$engine2" -a "$engine2" != "$engine1"
c=$(code "http://127.0.0.1:$((base + 20))/readyz")
check "the new engine's /readyz: $c" test "$c" = 200
# Another QUAN_UP_PORT while it runs: refused, nothing touched (the pids are checked below).
moved=$((base + 100))
(cd / && up_env env QUAN_UP_PORT=$moved bash "$src/deploy/local/up.sh") >"$tmp/up3.log" 2>&1
rc=$?
check "up.sh with QUAN_UP_PORT=$moved while it runs on $base: refused (exit $rc)" \
    test "$rc" -ne 0 -a -n "$(grep "runs with QUAN_UP_PORT=$base" "$tmp/up3.log")"
check "and it started nothing on $moved" port_free "$moved"
recorded >"$tmp/recorded2"
# kept PID NOW START: recorded as before, and still that process.
kept() { [ "$1" = "$2" ] && alive "$1" "$3"; }
while read -r n p; do
    [ "$n" = engine ] && continue
    t=$(awk -v p="$p" '$1 == p {print $2}' "$tmp/procs1")
    now=$(awk -v n="$n" '$1 == n {print $2}' "$tmp/recorded2")
    check "$n keeps its pid ($p${now:+, recorded $now})" kept "$p" "$now" "$t"
done <"$tmp/recorded1"
r=$(call GET "$q" "$utok")
check "the gateway reaches the new engine: $(status "$r")" \
    test "$(status "$r")" = 200 -a "$(field "$(body "$r")" data id)" = "$id"

# ---------------------------------------------------------------- down

# The console's copy outside the tree, when the gateway made one (root, a 0700 tree).
console_dir=$(sed -n 's/^alias "\(.*\)\/";$/\1/p' "$run/gateway/console.conf" 2>/dev/null)
tree_procs >"$tmp/procs2"
mapfile -t pids2 < <(awk '{print $1}' "$tmp/procs2")
listening_ports "${pids2[@]}" >"$tmp/ports2"
sort -u "$tmp/ports1" "$tmp/ports2" >"$tmp/ports"
for p in $((base + 2)) $((base + 3)) $((base + 4)); do echo "$p"; done >>"$tmp/ports"
t0=$SECONDS
if down "$tmp/down.log"; then
    ok "down.sh ($((SECONDS - t0)) s)"
else
    bad "down.sh ($((SECONDS - t0)) s)"
    tail -n 30 "$tmp/down.log" | sed 's/^/     /'
fi
left=$(sort -u "$tmp/procs1" "$tmp/procs2" | while read -r p t; do
    alive "$p" "$t" && echo "$p($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-60))"
done)
check "no process of the copy runs ($(sort -u "$tmp/procs1" "$tmp/procs2" | wc -l) before)${left:+; left: $left}" \
    test -z "$left"
left=$(tree_procs | awk '{print $1}' | tr '\n' ' ')
check "nothing runs in or names the copy${left:+; left: $left}" test -z "$left"
busy=$(sort -un "$tmp/ports" | while read -r p; do port_busy "$p" && echo "$p"; done | tr '\n' ' ')
check "every port is free ($(sort -un "$tmp/ports" | wc -l))${busy:+; busy: $busy}" test -z "$busy"
if [ -n "$console_dir" ] && [ "${console_dir#"$src"/}" = "$console_dir" ]; then
    check "the console's copy outside the tree is gone ($console_dir)" test ! -e "$console_dir"
fi
gw_status=$(bash "$src/deploy/local/gateway.sh" status "$run/gateway" 2>&1)
check "gateway.sh status after down.sh: $gw_status" test "$gw_status" = "gateway dead"

# ---------------------------------------------------------------- the sentinel topology

# make up TOPOLOGY=sentinel, briefly: its Redis on five ports of its own (base+50..base+54: the
# master, its replica, three sentinels), PostgreSQL and RabbitMQ as above.
sup_env() { up_env env QUAN_INFRA_REDIS_PORT=$((base + 50)) "$@"; }
srun=$run/sentinel
t0=$SECONDS
if (cd / && sup_env bash "$src/deploy/local/up.sh" sentinel) >"$tmp/sup.log" 2>&1; then
    ok "up.sh sentinel starts the stack ($((SECONDS - t0)) s)"
else
    bad "up.sh sentinel starts the stack ($((SECONDS - t0)) s)"
    tail -n 30 "$tmp/sup.log" | sed 's/^/     /'
fi
check "its closing message names the sentinels (QUAN_REDIS_SENTINELS=127.0.0.1:$((base + 52)),...)" \
    grep -qF "QUAN_REDIS_SENTINELS=127.0.0.1:$((base + 52)),127.0.0.1:$((base + 53)),127.0.0.1:$((base + 54))" \
    "$tmp/sup.log"
sstatus=$(bash "$src/deploy/local/infra.sh" status "$srun/infra" 2>&1)
check "infra.sh status: a master and a replica, three sentinels, PostgreSQL and RabbitMQ alive" \
    test "$(grep -c ' alive ' <<<"$sstatus")" = 8 -a \
    -n "$(grep -E "^redis0 +alive .*port=$((base + 50)) role=master" <<<"$sstatus")" -a \
    -n "$(grep -E "^redis1 +alive .*port=$((base + 51)) role=slave" <<<"$sstatus")"
for svc in merchant-admin engine settlement distribution; do
    check "quan-$svc found the master through the sentinels (its log)" \
        grep -qF "the sentinels name 127.0.0.1:$((base + 50)) as master" "$srun/logs/$svc.log"
done
# The README's walk, straight to the services with the identity headers set by hand.
M=(-H X-User-Id:1 -H "X-Shop-Number:$SHOP" -H Content-Type:application/json)
U=(-H X-User-Id:42 -H Content-Type:application/json)
r=$(curl -s --max-time 10 -w '\n%{http_code}' "${M[@]}" -d "$tpl" \
    "http://127.0.0.1:$((base + 10))/api/merchant-admin/coupon-template/create")
sid=$(field "$(body "$r")" data id)
check "a template created: $(status "$r") id ${sid:-none}" test "$(status "$r")" = 200 -a -n "$sid"
r=$(curl -s --max-time 10 -w '\n%{http_code}' "${U[@]}" \
    "http://127.0.0.1:$((base + 20))/api/engine/coupon-template/query?shopNumber=$SHOP&couponTemplateId=$sid")
check "the engine answers its query: $(status "$r")" \
    test "$(status "$r")" = 200 -a "$(field "$(body "$r")" data id)" = "$sid"
r=$(curl -s --max-time 10 -w '\n%{http_code}' "${U[@]}" \
    -d "{\"shopNumber\":\"$SHOP\",\"couponTemplateId\":\"$sid\"}" \
    "http://127.0.0.1:$((base + 20))/api/engine/user-coupon/redeem")
check "user 42 claims a coupon: $(status "$r") $(body "$r" | cut -c1-120)" \
    test "$(status "$r")" = 200 -a "$(field "$(body "$r")" success)" = True
fits=0
for _ in $(seq 1 50); do
    r=$(curl -s --max-time 10 -w '\n%{http_code}' "${U[@]}" \
        -d '{"orderAmount":150,"shopNumber":"'"$SHOP"'"}' \
        "http://127.0.0.1:$((base + 30))/api/settlement/coupon-query")
    if [ "$(status "$r")" = 200 ] && grep -qF "$sid" <<<"$(body "$r")"; then
        fits=1
        break
    fi
    sleep 0.2
done
check "settlement lists it among the coupons fitting a 150-yuan order" test "$fits" = 1
tree_procs >"$tmp/sprocs"
t0=$SECONDS
if (cd / && sup_env bash "$src/deploy/local/down.sh" sentinel) >"$tmp/sdown.log" 2>&1; then
    ok "down.sh sentinel ($((SECONDS - t0)) s)"
else
    bad "down.sh sentinel ($((SECONDS - t0)) s)"
    tail -n 30 "$tmp/sdown.log" | sed 's/^/     /'
fi
left=$(while read -r p t; do
    alive "$p" "$t" && echo "$p($(tr '\0' ' ' <"/proc/$p/cmdline" | cut -c1-60))"
done <"$tmp/sprocs")
check "no process of the sentinel stack runs ($(wc -l <"$tmp/sprocs") before)${left:+; left: $left}" \
    test -z "$left" -a -s "$tmp/sprocs"
busy=$(for p in $base $((base + 1)) $((base + 2)) $((base + 3)) $((base + 4)) $((base + 10)) \
    $((base + 20)) $((base + 30)) $((base + 40)) $((base + 50)) $((base + 51)) $((base + 52)) \
    $((base + 53)) $((base + 54)); do
    port_busy "$p" && echo "$p"
done | tr '\n' ' ')
check "its ports are free${busy:+; busy: $busy}" test -z "$busy"

finish
