#!/usr/bin/env bash
# newcomer.sh — the README's commands as a newcomer meets them: a bare Debian 12 (a container of
# debian:bookworm-slim, the base `make image` makes, on this machine's apt mirror), as root,
# nothing installed but git and make (the README says to install those two), a clone under
# /root of this repository's committed HEAD. In it: `make up` (installs every package, builds,
# starts the stores, the four services and the gateway) and warns of nothing, each /readyz and
# the gateway's console answer 200, a token minted as `make up` says opens a user's wallet
# through the gateway; `make up` again starts nothing; `make down`, then no process of the stack
# runs. With NEWCOMER_TEST=1 also `make test` (twenty minutes or more: every package built and
# every suite run on the bare system; QUAN_TEST_FILTER passes through).
#
#   integration-tests/newcomer.sh            about three minutes (most of it apt and the build)
#
# Needs podman and the debian:bookworm-slim image (`make image` makes it once). The container
# shares the host's network (loopback ports as `make up` picks them: QUAN_UP_PORT and the
# QUAN_INFRA_*_PORT settings pass through). Not part of make test or CI: CI's machine keeps what
# earlier runs installed, which is why this exists. Last line "N passed, N failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2

podman=(podman --runtime runc --cgroup-manager cgroupfs)
image=localhost/debian:bookworm-slim
command -v podman >/dev/null || { echo "newcomer.sh: needs podman (deploy/local/deps.sh --image)" >&2; exit 2; }
"${podman[@]}" image exists "$image" || { echo "newcomer.sh: no $image: run make image once" >&2; exit 2; }

out=$(mktemp -d /tmp/quan-newcomer.XXXXXX)
name=quan-newcomer-$$
rc=1
# shellcheck disable=SC2317 # run by the trap
cleanup() {
    "${podman[@]}" rm -f "$name" >/dev/null 2>&1
    if [ "$rc" -ne 0 ]; then
        echo "newcomer.sh: the run's logs (apt, make up, make test, make down) are in $out" >&2
    else
        rm -rf "$out"
    fi
}
trap cleanup EXIT
# What runs inside, as a newcomer types it; each check prints "ok: ..." or "FAIL: ...".
cat >"$out/inside.sh" <<'EOF'
#!/bin/bash
set -u
ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/out/apt.log 2>&1 && apt-get install -y -q git make >>/out/apt.log 2>&1 ||
    { fail "apt-get install git make"; tail -5 /out/apt.log; exit 1; }
git clone -q /src /root/quan || { fail "git clone"; exit 1; }
cd /root/quan || exit 1
t0=$SECONDS
if make up >/out/up.log 2>&1; then ok "make up ($((SECONDS - t0)) s)"; else fail "make up"; tail -30 /out/up.log; exit 1; fi
port=${QUAN_UP_PORT:-10000}
for p in $((port + 10)) $((port + 20)) $((port + 30)) $((port + 40)); do
    c=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/readyz")
    [ "$c" = 200 ] && ok "readyz :$p" || fail "readyz :$p answered $c"
done
c=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/console/")
[ "$c" = 200 ] && ok "gateway console" || fail "gateway console answered $c"
w=$(grep -E '^(deps|infra|gateway|up\.sh): .*warning' /out/up.log | head -3)
[ -z "$w" ] && ok "make up warned of nothing" || fail "make up warned: $w"
# The token as make up's message says to make one, then its "Try:" request through the gateway:
# the user's wallet, 200 only when the gateway took the token and the engine answered.
tok=$(grep -E '^  build/bin/quan-token .*--user 42$' /out/up.log | head -n 1)
if [ -n "$tok" ] && token=$(eval "$tok" 2>/dev/null) && [ -n "$token" ]; then
    c=$(curl -s -o /out/list.json -w '%{http_code}' -H "Authorization: Bearer $token" \
        "http://127.0.0.1:$port/api/engine/user-coupon/list")
    [ "$c" = 200 ] && grep -q '"success":true' /out/list.json &&
        ok "a user's wallet through the gateway with make up's token" ||
        fail "wallet through the gateway: $c $(cat /out/list.json)"
else
    fail "no token from make up's message ($tok)"
fi
if make up >/out/up2.log 2>&1 && ! grep -q 'started' /out/up2.log; then
    ok "make up again starts nothing"
else
    grep -q 'started' /out/up2.log && fail "make up again started: $(grep started /out/up2.log | head -3)" ||
        fail "make up again"
fi
if [ "${NEWCOMER_TEST:-0}" = 1 ]; then
    t0=$SECONDS
    make test >/out/test.log 2>&1
    last=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' /out/test.log | tail -n 1)
    case $last in "0 failed"* | *" 0 failed") ok "make test: $last ($((SECONDS - t0)) s)" ;;
        *) fail "make test: ${last:-no summary line}"; grep -E '^failed suites' /out/test.log ;; esac
fi
make down >/out/down.log 2>&1 && ok "make down" || { fail "make down"; tail -10 /out/down.log; }
left=$(pgrep -af 'postgres|redis-server|beam.smp|quan-(engine|merchant-admin|settlement|distribution)|nginx' | grep -v pgrep)
[ -z "$left" ] && ok "nothing runs after make down" || fail "still running after make down: $left"
EOF
chmod +x "$out/inside.sh"

nofile=$(ulimit -Hn)
# This machine reaches the npm registry (the console's Chart.js) through whatever its own CA
# bundle trusts; the newcomer's machine is this one, so the container is given that bundle.
env_args=(-e NODE_EXTRA_CA_CERTS=/etc/ssl/host-ca.crt -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro)
for v in QUAN_UP_PORT QUAN_INFRA_REDIS_PORT QUAN_INFRA_PG_PORT QUAN_INFRA_AMQP_PORT NEWCOMER_TEST \
    QUAN_TEST_FILTER; do
    [ -z "${!v:-}" ] || env_args+=(-e "$v=${!v}")
done
echo "== newcomer: a bare $image, git and make only, a clone of $(git rev-parse --short HEAD) under /root"
"${podman[@]}" run --rm --name "$name" --network host --ulimit "nofile=$nofile:$nofile" \
    --ulimit nproc=4096:4096 "${env_args[@]}" -v "$root:/src:ro" -v "$out:/out" "$image" \
    /out/inside.sh | tee "$out/result"
passed=$(grep -c '^ok: ' "$out/result")
failed=$(grep -c '^FAIL: ' "$out/result")
[ "$passed" -gt 0 ] || failed=$((failed + 1)) # the container did not get as far as one check
echo "$passed passed, $failed failed"
[ "$failed" -ne 0 ] || rc=0
exit "$rc"
