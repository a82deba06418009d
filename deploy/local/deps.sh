#!/usr/bin/env bash
# deps.sh — install the Debian packages Quan needs to build, test and run locally.
# Installs only what is missing, so it is cheap and safe to run any number of times.
#
#   deps.sh          what make up, make test and make bench need, and Chart.js for the
#                    merchant console (npm ci --prefix deploy/console)
#   deps.sh --test   the same, and what only the test suites need: Chromium, its driver and
#                    Selenium for the console's browser test, ccache (make test)
#   deps.sh --fuzz   the same, and clang with its sanitizer and libFuzzer runtimes (make fuzz,
#                    QUAN_TEST_FUZZ=1 make test); --test and --fuzz may be given together
#   deps.sh --image  only what deploy/image.sh needs (make image): podman and buildah, runc
#                    (the OCI runtime that works without systemd), mmdebstrap for the base
#                    images, and npm with the console's Chart.js, which the gateway's image
#                    holds (here a failed npm ci is an error)
set -euo pipefail

opt_test=0
opt_fuzz=0
opt_image=0
for arg in "$@"; do
    case $arg in
    --test) opt_test=1 ;;
    --fuzz) opt_fuzz=1 ;;
    --image) opt_image=1 ;;
    *)
        echo "usage: $0 [--test] [--fuzz] | --image" >&2
        exit 2
        ;;
    esac
done

# Everything the C services, their tests and deploy/local/infra.sh rely on (redis-sentinel for
# its sentinel topology, deploy/local/rsentinel.sh); nginx and its njs and Lua modules (the Lua
# one on the nginx development kit, libnginx-mod-http-ndk, which it depends on) for the API
# gateway (deploy/local/gateway.sh); prometheus (with promtool) for make observe and the tests
# of the alert rules and dashboards (deploy/prometheus/, deploy/grafana/).
# In Debian 12 the package nginx is the server itself (nginx-light and the others add modules to
# it) and provides nginx-abi-1.22.1-7, the ABI libnginx-mod-http-js 0.7.9 and
# libnginx-mod-http-lua 0.10.23 are built for.
# openssl, ca-certificates and stunnel4 for the encrypted links (deploy/local/tls.sh makes the
# certificates, stunnel carries Redis' TLS for hiredis; infra.sh's QUAN_INFRA_TLS=1).
PACKAGES="build-essential pkg-config libevent-dev libhiredis-dev libpq-dev libcjson-dev \
librabbitmq-dev libcurl4-openssl-dev uuid-dev redis-server redis-sentinel postgresql-15 rabbitmq-server \
libzip-dev zlib1g-dev libexpat1-dev libxlsxwriter-dev libssl-dev libjwt-dev unzip python3 python3-prometheus-client python3-openpyxl \
python3-yaml \
curl wrk valgrind procps iproute2 \
nginx libnginx-mod-http-js libnginx-mod-http-ndk libnginx-mod-http-lua prometheus \
openssl ca-certificates stunnel4"

# The console's browser test (integration-tests/console_browser.py, which test_up.sh runs against
# up.sh's stack) only: headless Chromium driven by Selenium through chromedriver, about 130 MB to
# download and 450 MB on disk, which a newcomer's make up need not pay (the suite says SKIPPED without them); a small CJK font
# (1.6 MB) so that its screenshots show the Chinese labels.
# ccache (1 MB): make test compiles the tree up to three times (plain, sanitized, fuzz), and a
# fresh clone of sources compiled before takes the objects from its cache.
if [ "$opt_test" = 1 ]; then
    PACKAGES="$PACKAGES chromium chromium-driver python3-selenium fonts-wqy-microhei ccache"
fi
# The fuzz targets only: about 25 MB to download and 150 MB on disk, which a newcomer's make up
# need not pay. The runtimes are a recommendation of clang, which --no-install-recommends skips.
if [ "$opt_fuzz" = 1 ]; then
    PACKAGES="$PACKAGES clang libclang-rt-dev"
fi
# The images are built and run without a registry or a Docker engine: about 60 MB to download.
if [ "$opt_image" = 1 ]; then
    PACKAGES="podman buildah runc mmdebstrap"
fi

missing=()
for pkg in $PACKAGES; do
    # dpkg-query prints "install ok installed" only for fully installed packages;
    # a removed-but-configured or half-installed package counts as missing.
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    if [ "$status" != "install ok installed" ]; then
        missing+=("$pkg")
    fi
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps: all required packages are installed"
else
    if [ "$(id -u)" -ne 0 ]; then
        echo "deps: missing packages: ${missing[*]}" >&2
        echo "deps: run as root: apt-get update && apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi

    echo "deps: installing: ${missing[*]}"
    # Packages such as postgresql-15 and rabbitmq-server ask no questions, but be sure
    # nothing waits for a terminal.
    export DEBIAN_FRONTEND=noninteractive
    # Debian's nginx starts a system nginx on port 80 (its default site) when it is installed,
    # and enables it at boot. Quan runs its own (gateway.sh, on its own port and prefix) and
    # wants none: while apt-get runs, a policy-rc.d that denies every start (exit 101) keeps
    # the packages installed now from starting their system services, unless the machine has a
    # policy-rc.d of its own (containers often do), which is left as it is.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\n# deploy/local/deps.sh, while it installs packages\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        made_policy=1
        trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
    fi
    # The package index is refreshed once, and only because something must be installed.
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
    if [ "$made_policy" = 1 ]; then
        rm -f "$policy"
        made_policy=0
    fi
    # Not at boot either, where systemd runs (only if nginx came with this install).
    if [[ " ${missing[*]} " == *" nginx "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable nginx.service >/dev/null 2>&1 || true
    fi
    # Nor Debian's system Prometheus (port 9090): the tests start their own.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable prometheus.service >/dev/null 2>&1 || true
    fi
    # Nor Debian's system sentinel (port 26379): rsentinel.sh starts sentinels of its own.
    if [[ " ${missing[*]} " == *" redis-sentinel "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable redis-sentinel.service >/dev/null 2>&1 || true
    fi
    echo "deps: done"
fi

# npm, for the OpenAPI linters of integration-tests/test_openapi.sh (it installs them itself,
# npm ci --prefix integration-tests/openapi, from that directory's lock) and Chart.js below
# (make image too: the image build runs no npm of its own). Only when there is no npm
# at all: a Node.js from elsewhere (e.g. nodesource, which bundles npm) is left alone, and
# Debian's nodejs package comes without npm.
if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "deps: npm is missing; run as root: apt-get install -y --no-install-recommends nodejs npm" >&2
        exit 1
    fi
    echo "deps: installing: nodejs npm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y --no-install-recommends nodejs npm
    echo "deps: done (npm)"
fi

# Chart.js for the merchant console (deploy/console/package-lock.json pins it; the gateway serves
# it). Only when what is installed is not what the lock names: npm ci starts from nothing. A
# failure (no network) is told, not fatal, locally: only the console's chart needs it. For
# make image it is fatal: the gateway's image cannot be built without it.
console_dir=$(cd "$(dirname "$0")/../console" && pwd)
if ! cmp -s "$console_dir/package-lock.json" "$console_dir/node_modules/.quan-lock" 2>/dev/null ||
    [ ! -f "$console_dir/node_modules/chart.js/dist/chart.umd.js" ]; then
    echo "deps: npm ci --prefix deploy/console (Chart.js for the merchant console)"
    if timeout 300 npm ci --prefix "$console_dir" --no-audit --no-fund --ignore-scripts; then
        cp "$console_dir/package-lock.json" "$console_dir/node_modules/.quan-lock"
    elif [ "$opt_image" = 1 ]; then
        echo "deps: npm ci --prefix deploy/console failed: the gateway's image needs its Chart.js" >&2
        exit 1
    else
        echo "deps: warning: npm ci --prefix deploy/console failed: the console will have no chart" >&2
    fi
fi
