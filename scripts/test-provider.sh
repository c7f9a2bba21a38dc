#!/usr/bin/env bash
# The OpenSSL provider, tested with unmodified `openssl` and a C program
# against OpenSSL's default provider: every path (offloaded, default
# threshold, no host, in-process host), async jobs, fork, threads, and a
# host killed in the middle of a stream.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(./scripts/build-provider.sh)
cargo build --release --locked -p wd-cli >&2
out=target/provider
cc -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude tests/c/test_provider.c \
    -Ltarget/release -lwd_crypto -lwd -lcrypto -ldl -lpthread -Wl,-rpath,"$PWD/target/release" -o "$out/test_provider"
cc -std=c11 -O1 -g -Wall -Wextra -Werror -Iinclude tests/c/test_provider_edges.c \
    -Ltarget/release -lwd_crypto -lwd -lcrypto -ldl -lpthread -Wl,-rpath,"$PWD/target/release" -o "$out/test_provider_edges"

tmp=$(mktemp -d)
hosts=()
cleanup() {
    for p in "${hosts[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
start_host() { # socket -> pid in $host_pid
    target/release/wd serve --socket "$1" --device sec:engines=1 2>/dev/null &
    host_pid=$!
    hosts+=("$host_pid")
    for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
    echo "host did not start"; exit 1
}

start_host "$tmp/wd.sock"
export WD_HOST=$tmp/wd.sock
P=(-provider-path "$dir" -provider wd -provider default -propquery provider=wd)

echo "-- C differential tests (offloaded, default threshold, no host, in-process host; a provider loaded again)"
WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 "$out/test_provider" "$dir"
"$out/test_provider" "$dir"
WD_HOST=$tmp/none.sock "$out/test_provider" "$dir"
WD_HOST=embedded WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 "$out/test_provider" "$dir"
"$out/test_provider" "$dir" reload

echo "-- the provider at its edges (async jobs beyond the slots and beside synchronous requests, GCM tags, copies, errors)"
WD_HOST=embedded WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 "$out/test_provider_edges" "$dir"
"$out/test_provider_edges" "$dir"
echo "-- async jobs whose host dies"
start_host "$tmp/dying.sock"
WD_HOST=$tmp/dying.sock WD_TEST_KILL_PID=$host_pid WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 \
    "$out/test_provider_edges" "$dir" async_jobs_survive_host_death

echo "-- a setting that does not parse refuses the load, naming it"
for bad in "WD_PROVIDER_POLICY=ofload:policy 'ofload'" "WD_PROVIDER_THRESHOLD=-1:threshold '-1'" \
    "WD_PROVIDER_THRESHOLD=4k:threshold '4k'" "WD_PROVIDER_FALLBACK=maybe:fallback 'maybe'" \
    "WD_PROVIDER_FALLBACK=0$(printf '%*s' 70 '')x:fallback '0 " \
    "WD_PROVIDER_THRESHOLD=$(printf '0%.0s' $(seq 70))65536:threshold '000"; do
    if env "${bad%%:*}" openssl list -provider-path "$dir" -provider wd -providers > "$tmp/out" 2>&1; then
        echo "the provider loaded with ${bad%%:*}"; exit 1
    fi
    grep -q "${bad#*:}" "$tmp/out" || { echo "no message naming ${bad%%:*}:"; cat "$tmp/out"; exit 1; }
done

# Through a configuration file, OpenSSL leaves a refused provider out
# without a word: the provider says it on stderr.
sed 's/^threshold = 256/threshold = abc/' provider/openssl-wd.cnf > "$tmp/bad.cnf"
OPENSSL_CONF=$tmp/bad.cnf OPENSSL_MODULES=$dir openssl list -providers > "$tmp/out" 2>&1 || true
grep -q "wd provider: threshold 'abc'" "$tmp/out" ||
    { echo "a configuration file's bad threshold left no message:"; cat "$tmp/out"; exit 1; }

echo "-- openssl enc / dgst round trips against the default provider"
for size in 0 1 15 16 17 1000 65537 300001; do
    head -c "$size" /dev/urandom > "$tmp/in"
    for c in aes-128-cbc aes-192-cbc aes-256-cbc aes-128-ecb aes-256-ctr; do
        bits=${c#aes-}; bits=${bits%%-*}
        key=$(head -c $((bits / 8)) /dev/urandom | od -An -tx1 | tr -d ' \n')
        iv=()
        [ "${c##*-}" = ecb ] || iv=(-iv "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')")
        openssl enc -$c -K "$key" "${iv[@]}" -in "$tmp/in" -out "$tmp/ref"
        WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 \
            openssl enc "${P[@]}" -$c -K "$key" "${iv[@]}" -in "$tmp/in" -out "$tmp/wd"
        cmp "$tmp/ref" "$tmp/wd"
        WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 \
            openssl enc "${P[@]}" -d -$c -K "$key" "${iv[@]}" -in "$tmp/wd" -out "$tmp/back"
        cmp "$tmp/in" "$tmp/back"
    done
    for d in sha1 sha224 sha256 sha384 sha512; do
        a=$(openssl dgst -$d -r "$tmp/in" | cut -d' ' -f1)
        b=$(WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 openssl dgst "${P[@]}" -$d -r "$tmp/in" | cut -d' ' -f1)
        [ "$a" = "$b" ] || { echo "dgst $d differs at size $size"; exit 1; }
    done
done
echo "enc/dgst: every cipher and digest matches the default provider"

echo "-- no host, fallback off: a clear failure, not a silent CPU result"
if WD_HOST=$tmp/none.sock WD_PROVIDER_FALLBACK=0 WD_PROVIDER_THRESHOLD=0 \
    openssl enc "${P[@]}" -aes-128-cbc -K 000102030405060708090a0b0c0d0e0f \
    -iv 000102030405060708090a0b0c0d0e0f -in "$tmp/in" -out "$tmp/wd" 2>/dev/null; then
    echo "encryption without a host succeeded although the fallback is off"; exit 1
fi
# Default threshold and policy, one request above the threshold: the
# router's first sample would have run it on the CPU, before any device
# was tried.
head -c 4096 /dev/urandom > "$tmp/one"
if WD_HOST=$tmp/none.sock WD_PROVIDER_FALLBACK=0 \
    openssl enc "${P[@]}" -aes-128-cbc -nopad -K 000102030405060708090a0b0c0d0e0f \
    -iv 000102030405060708090a0b0c0d0e0f -in "$tmp/one" -out "$tmp/wd" 2>/dev/null; then
    echo "one request without a host succeeded although the fallback is off"; exit 1
fi
if WD_HOST=$tmp/none.sock WD_PROVIDER_FALLBACK=0 openssl dgst "${P[@]}" -sha256 "$tmp/one" \
    > /dev/null 2> "$tmp/dgst.err"; then
    echo "a digest without a host succeeded although the fallback is off"; exit 1
fi
# ... and says why (it said only "Read error in FILE": nothing was on
# OpenSSL's error queue).
grep -q "WrapDrive" "$tmp/dgst.err" || {
    echo "a refused digest gave no reason:"; cat "$tmp/dgst.err"; exit 1; }
# Blanks around a value are dropped and case is ignored, as the library
# does with WD_CRYPTO_FALLBACK: " On " loads and computes on the CPU,
# " Off " loads and refuses.
a=$(WD_HOST=$tmp/none.sock WD_PROVIDER_FALLBACK=" On " openssl dgst "${P[@]}" -sha256 -r "$tmp/one" \
    | cut -d' ' -f1)
[ "$a" = "$(openssl dgst -sha256 -r "$tmp/one" | cut -d' ' -f1)" ] \
    || { echo "WD_PROVIDER_FALLBACK=' On ' did not load, or computed wrong"; exit 1; }
for off in " Off " "off$(printf '%*s' 100 '')"; do
    if WD_HOST=$tmp/none.sock WD_PROVIDER_FALLBACK="$off" openssl dgst "${P[@]}" -sha256 "$tmp/one" \
        > "$tmp/out" 2>&1; then
        echo "a digest without a host succeeded although the fallback is off ('$off')"; exit 1
    fi
    if grep -q "fallback '" "$tmp/out"; then
        echo "WD_PROVIDER_FALLBACK='$off' was refused:"; cat "$tmp/out"; exit 1
    fi
done

echo "-- openssl.cnf activation"
cp provider/openssl-wd.cnf "$tmp/openssl.cnf"
OPENSSL_CONF=$tmp/openssl.cnf OPENSSL_MODULES=$dir openssl list -cipher-algorithms -provider wd 2>/dev/null \
    | grep -q "AES-128-CBC.*@ wd" || { echo "openssl.cnf did not activate the provider"; exit 1; }
a=$(OPENSSL_CONF=$tmp/openssl.cnf OPENSSL_MODULES=$dir openssl dgst -sha256 -r "$tmp/in" | cut -d' ' -f1)
[ "$a" = "$(openssl dgst -sha256 -r "$tmp/in" | cut -d' ' -f1)" ]

echo "-- python's hashlib through openssl.cnf: digests that stream on the device, copied on every digest()"
if command -v python3 > /dev/null; then
    head -c 3000000 /dev/urandom > "$tmp/big"
    want=$(openssl dgst -sha256 -r "$tmp/big" | cut -d' ' -f1)
    for policy in offload auto; do
        got=$(OPENSSL_CONF=$tmp/openssl.cnf OPENSSL_MODULES=$dir WD_PROVIDER_POLICY=$policy python3 -c '
import hashlib, sys
d = open(sys.argv[1], "rb").read()
h = None
for n in (65536, 100000, len(d)):
    for _ in range(10):
        h = hashlib.sha256(d[:n])
        h.copy().update(b"x")
        a = h.hexdigest()
        assert a == h.hexdigest(), "a second digest() differs"
print(a)' "$tmp/big") || { echo "python hashlib through the provider failed (policy $policy)"; exit 1; }
        [ "$got" = "$want" ] || { echo "python hashlib: $got, want $want (policy $policy)"; exit 1; }
    done
else
    echo "  skipped: python's hashlib (no python3)"
    [ -n "${WD_SKIP_LOG:-}" ] && echo "test-provider: python's hashlib (no python3)" >> "$WD_SKIP_LOG"
fi

echo "-- TLS through the provider (openssl.cnf), s_server and s_client"
./scripts/test-tls.sh "$dir"

echo "-- openssl speed with async jobs, looped: every paused job gets its wake-up"
# Job counts, sizes and policies vary, so jobs pause on the device, finish
# inline while others wait, and share one wait descriptor; a lost wake-up
# hangs openssl, which the timeout turns into a failure.
for i in $(seq 1 20); do
    jobs=$(( (i % 4) * 8 + 1 )); size=$(( i % 3 == 0 ? 16 : (i % 3 == 1 ? 1024 : 8192) ))
    policy=$([ $((i % 2)) = 0 ] && echo offload || echo auto)
    if ! WD_PROVIDER_POLICY=$policy timeout 30 openssl speed "${P[@]}" -elapsed -seconds 1 \
        -bytes "$size" -async_jobs "$jobs" -evp aes-128-cbc 2>/dev/null | grep -q "^AES-128-CBC"; then
        echo "openssl speed -async_jobs $jobs -bytes $size (policy $policy) hung or failed (run $i)"; exit 1
    fi
done

# More jobs than the thread's staging holds (long messages, or more jobs
# than slots): jobs computed here yield to the others and must be woken.
for spec in "2097152 33 offload" "3145728 17 auto" "65536 80 offload" "1048576 80 offload"; do
    set -- $spec
    if ! WD_PROVIDER_POLICY=$3 timeout 30 openssl speed "${P[@]}" -elapsed -seconds 1 \
        -bytes "$1" -async_jobs "$2" -evp aes-128-cbc 2>/dev/null | grep -q "^AES-128-CBC"; then
        echo "openssl speed -async_jobs $2 -bytes $1 (policy $3) hung or failed"; exit 1
    fi
done

echo "-- host killed in the middle of a stream"
start_host "$tmp/wd2.sock"
WD_HOST=$tmp/wd2.sock WD_TEST_KILL_PID=$host_pid WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 \
    "$out/test_provider" "$dir"
wait "$host_pid" 2>/dev/null || true
echo "provider: all tests passed"
