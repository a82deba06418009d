#!/usr/bin/env bash
# image.sh — `make image`: every image deploy/k8s names, built with podman from deploy/Dockerfile,
# without a container registry. Prints each image's size.
#
#   deploy/image.sh              install what is missing (deploy/local/deps.sh --image: the
#                                tools, and the console's Chart.js that the gateway's image
#                                holds), make the base images that are missing, build every
#                                image
#   deploy/image.sh --list       only print the images deploy/k8s names (repository:tag target)
#
# Either fails (exit 1, the reason on stderr) when deploy/k8s does not render or names no
# image; the build also when an image it names was not built.
#
# The bases come from Debian's packages (mmdebstrap, the mirror this machine's apt uses):
#   debian:bookworm-slim               the build stage's base (the name the Dockerfile uses):
#                                      minbase, documentation left out as in Debian's own slim
#   quan/base-runtime:<hash>           the runtime stage's (RUNTIME_BASE): Debian's essential
#   quan/base-gateway:<hash>           packages and the Dockerfile's RUNTIME_PACKAGES (and, for
#                                      the gateway, GATEWAY_PACKAGES); no apt, no documentation,
#                                      manual pages, locales or iconv modules
# <hash> is of the package lists and of this script's settings: a changed list is a new base.
# The build stage is the same for every target, so it compiles once (podman's layer cache);
# a changed source compiles again and rebuilds only the layers after the COPY.
#
# Environment: QUAN_IMAGE_PODMAN (default "podman --runtime runc --cgroup-manager cgroupfs":
# the OCI runtime and cgroup manager that work without systemd).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dockerfile=deploy/Dockerfile
read -r -a podman <<<"${QUAN_IMAGE_PODMAN:-podman --runtime runc --cgroup-manager cgroupfs}"

# images: "repository:tag target" for every image of deploy/k8s and deploy/k8s-tls (kustomize's
# rendering when kubectl is there, else the manifests' files), the target its name after
# quan/quan-. Returns 1, saying why, when there is no list: an empty one would build nothing and
# look like success.
images() {
    local rendered list k
    if command -v kubectl >/dev/null 2>&1; then
        for k in deploy/k8s deploy/k8s-tls; do
            if ! rendered+=$(kubectl kustomize "$k")$'\n'; then
                echo "image: kubectl kustomize $k failed: no list of the images to build" >&2
                return 1
            fi
        done
    elif ! rendered=$(cat deploy/k8s/*.yaml deploy/k8s-tls/*.yaml); then
        echo "image: cannot read deploy/k8s/*.yaml: no list of the images to build" >&2
        return 1
    fi
    list=$(awk '$1 == "image:" {print $2}' <<<"$rendered" | sort -u)
    if [ -z "$list" ]; then
        echo "image: deploy/k8s names no image" >&2
        return 1
    fi
    local image repo
    for image in $list; do
        repo=${image%:*}
        echo "$image ${repo#quan/quan-}"
    done
}

# The list first: manifests that do not render stop the build before its minutes of bases.
if ! image_list=$(images); then
    exit 1
fi
if [ "${1:-}" = --list ]; then
    echo "$image_list"
    exit 0
fi

deploy/local/deps.sh --image

# arg_value NAME: the default of the Dockerfile's ARG NAME="..." (continuation lines joined).
arg_value() {
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$dockerfile" |
        sed -n "s/^ARG $1=\"\\(.*\\)\"\$/\\1/p" | tr -s ' \t' ' ' | sed 's/^ //; s/ $//'
}
runtime_pkgs=$(arg_value RUNTIME_PACKAGES)
gateway_pkgs=$(arg_value GATEWAY_PACKAGES)
tunnel_pkgs=$(arg_value TUNNEL_PACKAGES)
if [ -z "$runtime_pkgs" ] || [ -z "$gateway_pkgs" ] || [ -z "$tunnel_pkgs" ]; then
    echo "image: $dockerfile has no RUNTIME_PACKAGES, GATEWAY_PACKAGES or TUNNEL_PACKAGES" >&2
    exit 1
fi

# The Debian mirror this machine's apt uses (deb822 .sources or one-line sources.list), so that
# mmdebstrap reaches whatever apt-get here reaches; the security archive likewise.
apt_uris() {
    {
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '$1 == "URIs:" {for (i = 2; i <= NF; i++) print $i}'
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i !~ /^\[/) {print $i; break}}'
    } | sed 's:/*$::'
}
mirror=$(apt_uris | grep -E '/debian$' | head -1 || true)
security=$(apt_uris | grep -E '/debian-security$' | head -1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
security=${security:-${mirror}-security}
suite=bookworm
sources=("deb $mirror $suite main" "deb $mirror $suite-updates main"
    "deb $security $suite-security main")

# What an image needs no copy of; as Debian's slim images do, plus the iconv modules (nothing
# of Quan converts character sets) for the runtime bases. Kept in the base's dpkg
# configuration, so a package installed later leaves them out too.
slim_opts=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
    --dpkgopt='path-exclude=/usr/share/linda/*' --dpkgopt='path-exclude=/usr/share/groff/*')
runtime_opts=("${slim_opts[@]}" --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*'
    --dpkgopt='path-exclude=/usr/share/bug/*')
settings_rev=1 # bump when the options above change: the bases' tags change with it
hash_of() { printf '%s\n' "$settings_rev" "$suite" "${runtime_opts[*]}" "$@" | sha256sum | cut -c1-12; }
runtime_base=localhost/quan/base-runtime:$(hash_of "$runtime_pkgs")
gateway_base=localhost/quan/base-gateway:$(hash_of "$runtime_pkgs" "$gateway_pkgs")
tunnel_base=localhost/quan/base-tunnel:$(hash_of "$tunnel_pkgs")

work=$(mktemp -d /tmp/quan-image.XXXXXX)
trap 'rm -rf "$work"' EXIT

# make_base NAME VARIANT OPTS_ARRAY PACKAGES: mmdebstrap a tarball and import it as NAME, with
# the environment a Dockerfile expects of a Debian base.
make_base() {
    local name=$1 variant=$2 opts=$3 pkgs=$4 log
    local -n o=$opts
    log=$work/$(echo "$name" | tr '/:' '__').log
    local inc=()
    [ -z "$pkgs" ] || inc=(--include="$(tr ' ' ',' <<<"$pkgs")")
    # merged-usr: /usr merged by the hook, not by installing usrmerge (which pulls in perl).
    if ! mmdebstrap --variant="$variant" --format=tar --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        "${o[@]}" "${inc[@]}" "$suite" "$log.tar" "${sources[@]}" >"$log" 2>&1; then
        tail -20 "$log" >&2
        echo "image: mmdebstrap of $name failed" >&2
        return 1
    fi
    "${podman[@]}" import -q \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/sh"]' "$log.tar" "$name" >/dev/null
    rm -f "$log.tar"
    echo "image: base $name made ($("${podman[@]}" image inspect -f '{{.Size}}' "$name" |
        awk '{printf "%.1f MB", $1 / 1e6}'))"
}

start=$SECONDS
pids=()
have() { "${podman[@]}" image exists "$1"; }
# The bases at once: mostly downloads and dpkg, each waiting on its own.
if ! have debian:bookworm-slim; then
    echo "image: making debian:bookworm-slim from $mirror"
    make_base localhost/debian:bookworm-slim minbase slim_opts "" & pids+=($!)
fi
if ! have "$runtime_base"; then
    echo "image: making $runtime_base"
    make_base "$runtime_base" essential runtime_opts "$runtime_pkgs" & pids+=($!)
fi
if ! have "$gateway_base"; then
    echo "image: making $gateway_base"
    make_base "$gateway_base" essential runtime_opts "$runtime_pkgs $gateway_pkgs" & pids+=($!)
fi
if ! have "$tunnel_base"; then
    echo "image: making $tunnel_base"
    make_base "$tunnel_base" essential runtime_opts "$tunnel_pkgs" & pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
base_s=$((SECONDS - start))

# One build per image; all but the first find the build stage in the layer cache.
mapfile -t list <<<"$image_list"
for line in "${list[@]}"; do
    read -r image target <<<"$line"
    base=$runtime_base
    [ "$target" = gateway ] && base=$gateway_base
    [ "$target" = redis-tunnel ] && base=$tunnel_base
    t0=$SECONDS
    log=$work/build-$target.log
    if ! "${podman[@]}" build --isolation chroot --pull=never --layers \
        --ignorefile deploy/Dockerfile.dockerignore -f "$dockerfile" --target "$target" \
        --build-arg RUNTIME_BASE="$base" --build-arg TUNNEL_BASE="$base" --iidfile "$work/iid-$target" -t "$image" . \
        >"$log" 2>&1; then
        tail -40 "$log" >&2
        echo "image: $image did not build" >&2
        exit 1
    fi
    echo "image: $image built ($((SECONDS - t0)) s)"
done

# Each name the manifests use is the image just built for it, not one left from before.
for line in "${list[@]}"; do
    read -r image target <<<"$line"
    built=$(sed 's/^sha256://' "$work/iid-$target" 2>/dev/null || true)
    named=$("${podman[@]}" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)
    if [ -z "$built" ] || [ "$named" != "$built" ]; then
        echo "image: $image (target $target) was not built:" \
            "it is ${named:-no image}, the build made ${built:-nothing}" >&2
        exit 1
    fi
done

echo "image: bases ${base_s} s, all $((SECONDS - start)) s"
for line in "${list[@]}"; do
    read -r image _ <<<"$line"
    "${podman[@]}" image inspect -f '{{.Size}}' "$image" |
        awk -v i="$image" '{printf "%-34s %6.1f MB\n", i, $1 / 1e6}'
done
