#!/usr/bin/env bash
# tls.sh — a private certificate authority and the certificates signed by it, for the stores'
# TLS listeners and their clients on this host (deploy/local/infra.sh with QUAN_INFRA_TLS=1, the
# TLS suite). Files already there are kept, so a restart keeps the certificates clients trust.
#
#   tls.sh DIR   writes, in DIR:
#     ca.crt, ca.key              the authority every server certificate is signed by
#     server.crt, server.key      the stores' certificate: CN localhost, SAN DNS:localhost and
#                                 IP:127.0.0.1 (a client checking the name finds either)
#     client.crt, client.key      a client certificate (CN quan) for servers that ask for one
#     wrong-ca.crt, wrong-ca.key  an unrelated authority: what a client configured with the
#                                 wrong CA trusts (it must refuse the servers)
# Keys are 0600; certificates 0644. QUAN_TLS_DAYS (default 825) bounds their validity.
set -euo pipefail

[ $# -eq 1 ] || {
    echo "usage: $0 DIR" >&2
    exit 2
}
DIR=$1
DAYS=${QUAN_TLS_DAYS:-825}
[[ $DAYS =~ ^[1-9][0-9]*$ ]] || {
    echo "tls.sh: QUAN_TLS_DAYS must be a positive number of days, not '$DAYS'" >&2
    exit 2
}
command -v openssl >/dev/null || {
    echo "tls.sh: openssl is required (deploy/local/deps.sh)" >&2
    exit 1
}
mkdir -p "$DIR"
cd "$DIR"
umask 077

# ca NAME CN: a self-signed authority NAME.crt / NAME.key.
ca() {
    [ -s "$1.crt" ] && [ -s "$1.key" ] && return 0
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$DAYS" -keyout "$1.key" \
        -out "$1.crt" -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# leaf NAME CN USAGE [SAN]: NAME.crt / NAME.key signed by ca.
leaf() {
    local name=$1 cn=$2 usage=$3 san=${4:-} ext
    [ -s "$name.crt" ] && [ -s "$name.key" ] && return 0
    ext=$(mktemp "$name.ext.XXXXXX")
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$usage"
        [ -z "$san" ] || echo "subjectAltName=$san"
    } >"$ext"
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$name.key" -out "$name.csr" \
        -subj "/CN=$cn" 2>/dev/null
    openssl x509 -req -sha256 -days "$DAYS" -in "$name.csr" -CA ca.crt -CAkey ca.key \
        -CAcreateserial -extfile "$ext" -out "$name.crt" 2>/dev/null
    rm -f "$name.csr" "$ext"
}

ca ca "Quan local CA"
ca wrong-ca "Quan unrelated CA"
leaf server localhost serverAuth "DNS:localhost,IP:127.0.0.1"
leaf client quan clientAuth
chmod 0600 ./*.key
chmod 0644 ./*.crt
openssl verify -CAfile ca.crt server.crt client.crt >/dev/null
