#!/usr/bin/env bash
# TLS through the provider, as a user configures it (openssl.cnf with
# `default_properties = ?provider=wd`), with unmodified s_server and
# s_client: TLS 1.2 (AES-GCM and AES-CBC suites) and TLS 1.3, the provider
# on the server, on the client and on both, data checked end to end (the
# server echoes each line reversed). Usage: test-tls.sh PROVIDER_DIR
# (a host at $WD_HOST; one case runs with no host at all).
set -euo pipefail
dir=$1
tmp=$(mktemp -d)
srv=
cleanup() {
    [ -n "$srv" ] && { kill "$srv" 2>/dev/null || true; wait "$srv" 2>/dev/null || true; }
    rm -rf "$tmp"
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$tmp/key.pem" \
    -out "$tmp/cert.pem" -days 2 -nodes -subj /CN=wd-tls-test 2>/dev/null
cp provider/openssl-wd.cnf "$tmp/wd.cnf"
: > "$tmp/plain.cnf"  # no provider configured: OpenSSL's defaults

reverse() { echo "$1" | awk '{ s = ""; for (i = length($0); i > 0; i--) s = s substr($0, i, 1); print s }'; }

# case NAME VERSION CIPHER SERVER_CONF CLIENT_CONF
case_() {
    local name=$1 ver=$2 cipher=$3 sconf=$4 cconf=$5 sock=$tmp/s.sock
    local sel=(-cipher "$cipher")
    [ "$ver" = -tls1_3 ] && sel=(-ciphersuites "$cipher")
    rm -f "$sock"
    OPENSSL_CONF=$sconf OPENSSL_MODULES=$dir openssl s_server -unix "$sock" -cert "$tmp/cert.pem" \
        -key "$tmp/key.pem" "$ver" "${sel[@]}" -rev -quiet -naccept 1 >"$tmp/srv.log" 2>&1 &
    srv=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    local line
    line=$(head -c 3000 /dev/urandom | od -An -tx1 | tr -d ' \n')
    local got
    got=$( { echo "$line"; sleep 0.5; } | OPENSSL_CONF=$cconf OPENSSL_MODULES=$dir \
        timeout 10 openssl s_client -unix "$sock" "$ver" "${sel[@]}" -quiet 2>"$tmp/cli.log" | head -1 || true)
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    srv=
    if [ "$got" != "$(reverse "$line")" ]; then
        echo "TLS FAILED: $name ($ver $cipher)"
        echo "-- server:"; cat "$tmp/srv.log"; echo "-- client:"; cat "$tmp/cli.log"
        exit 1
    fi
}

n=0
for suite in "-tls1_2 ECDHE-ECDSA-AES128-GCM-SHA256" "-tls1_2 ECDHE-ECDSA-AES256-GCM-SHA384" \
    "-tls1_2 ECDHE-ECDSA-AES128-SHA256" "-tls1_2 ECDHE-ECDSA-AES256-SHA" \
    "-tls1_3 TLS_AES_128_GCM_SHA256" "-tls1_3 TLS_AES_256_GCM_SHA384"; do
    set -- $suite
    case_ "provider on the server" "$1" "$2" "$tmp/wd.cnf" "$tmp/plain.cnf"
    case_ "provider on the client" "$1" "$2" "$tmp/plain.cnf" "$tmp/wd.cnf"
    case_ "provider on both sides" "$1" "$2" "$tmp/wd.cnf" "$tmp/wd.cnf"
    n=$((n + 3))
done
WD_HOST=$tmp/no-host.sock case_ "provider on both sides, no host" -tls1_2 \
    ECDHE-ECDSA-AES128-GCM-SHA256 "$tmp/wd.cnf" "$tmp/wd.cnf"
echo "TLS: $((n + 1)) cases (TLS 1.2 GCM and CBC, TLS 1.3; provider on server, client, both; no host), data checked end to end"
