#!/usr/bin/env bash
# Every test of the project: formatting, lints, Rust unit/property/integration
# tests, the C API test program, and a build (plus a short run) of every fuzz
# target. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all -- --check
# The fuzz targets are a workspace of their own: same rules.
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy --manifest-path fuzz/Cargo.toml --all-targets --locked -- -D warnings

# Tests that need what this machine lacks append "test: reason" here and
# are counted in the summary, never passed silently.
export WD_SKIP_LOG="$PWD/target/test-skips.log"
mkdir -p target
: > "$WD_SKIP_LOG"

echo "== cargo test"
cargo test --workspace --locked

echo "== C API tests (include/wd.h; wd_crypto.h linked on its own)"
cargo build --release --locked -p wd-capi -p wd-crypto-capi -p wd-comp-capi -p wd-embedded
out=target/c-test
mkdir -p "$out"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_wd.c \
    -Ltarget/release -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_wd"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_nvme.c \
    -Ltarget/release -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_nvme"
# Each library exports only what its header declares (libwd.so: plus its
# private wd__* hooks, docs/c-abi.md).
check_exports() { # library header...
    local lib=$1; shift
    local exported undocumented
    exported=$(nm -D --defined-only "target/release/$lib" | awk '{print $3}' | grep -v '^WD_' | grep -v '^wd__' | sort)
    undocumented=$(for s in $exported; do grep -q "\b$s(" "$@" || echo "$s"; done)
    if [ -n "$undocumented" ]; then echo "$lib exports symbols not in $*: $undocumented"; exit 1; fi
}
check_exports libwd.so include/wd.h include/wd_nvme.h
check_exports libwd_crypto.so include/wd_crypto.h
check_exports libwd_comp.so include/wd_comp.h
# The client library carries neither the host nor libcrypto.
if ldd target/release/libwd.so | grep -q libcrypto; then
    echo "libwd.so links libcrypto:"; ldd target/release/libwd.so; exit 1
fi
if cargo tree --locked -p wrapdrive -e normal --prefix none | grep -qE '^(wd-host|wd-device|wd-sec|wd-evp|openssl-sys) '; then
    echo "the wrapdrive crate depends on the host, a device or libcrypto:"
    cargo tree --locked -p wrapdrive -e normal; exit 1
fi
"$out/test_wd"
# Arrays whose range wraps around the address space.
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_wd_ranges.c \
    -Ltarget/release -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_wd_ranges"
env -u WD_HOST "$out/test_wd_ranges"
# The NVMe calls, on an in-process host with an nvme device.
env -u WD_HOST "$out/test_nvme"
# Across host restarts: a `wd serve` killed with requests in flight.
cargo build --release --locked -p wd-cli
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_reconnect.c \
    -Ltarget/release -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_reconnect"
WD_BIN="$PWD/target/release/wd" "$out/test_reconnect"
# The crypto library on its own: -lwd_crypto -lwd, errors through wd_last_error.
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_crypto_link.c \
    -Ltarget/release -lwd_crypto -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_crypto_link"
WD_HOST=embedded "$out/test_crypto_link"
# Pointer ranges that wrap, and the routing memo's order.
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_crypto_abi.c \
    -Ltarget/release -lwd_crypto -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_crypto_abi"
"$out/test_crypto_abi"
# Without libwd_embedded.so, an in-process host is refused clearly.
mkdir -p "$out/no-embedded"
cp target/release/libwd.so "$out/no-embedded/"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_wd.c \
    -L"$out/no-embedded" -lwd -Wl,-rpath,"$PWD/$out/no-embedded" -o "$out/no-embedded/test_wd"
if env -u WD_HOST -u LD_LIBRARY_PATH "$out/no-embedded/test_wd" >/dev/null 2>"$out/no-embedded/err"; then
    echo "an in-process host started without libwd_embedded.so"; exit 1
fi
grep -q "libwd_embedded.so" "$out/no-embedded/err" || { echo "no clear error without libwd_embedded.so:"; cat "$out/no-embedded/err"; exit 1; }
# A failed switch to an in-process host leaves the host the process had.
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_embedded_fallback.c \
    -L"$out/no-embedded" -lwd -ldl -Wl,-rpath,"$PWD/$out/no-embedded" -o "$out/no-embedded/test_embedded_fallback"
env -u WD_HOST -u LD_LIBRARY_PATH WD_EMBEDDED_LIB="$PWD/target/release/libwd_embedded.so" \
    "$out/no-embedded/test_embedded_fallback"

echo "== install + pkg-config"
prefix=$PWD/target/install-test
./scripts/install.sh "$prefix" >/dev/null
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -D_GNU_SOURCE -Wall -Werror tests/c/test_wd.c \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs wd) \
    -Wl,-rpath,"$prefix/lib" -o "$out/test_wd_pc"
"$out/test_wd_pc" >/dev/null
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -D_GNU_SOURCE -Wall -Werror tests/c/test_crypto_link.c \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs wd_crypto) \
    -Wl,-rpath,"$prefix/lib" -o "$out/test_crypto_link_pc"
WD_HOST=embedded "$out/test_crypto_link_pc" >/dev/null

echo "== OpenSSL provider"
./scripts/test-provider.sh

echo "== drop-in zlib (libwdz.so) and unmodified programs through it"
./scripts/test-wdz.sh

echo "== chaos and soak (wd chaos: random SIGKILLs of clients and of the host, leak checks)"
cargo build --release --locked -p wd-cli
./target/release/wd chaos --rounds 40 --clients 4 --host-kill-every 5
./target/release/wd chaos --soak "${WD_SOAK:-2m}" --interval 15 --clients 5
./target/release/wd chaos --soak 30s --interval 10 --clients 5 --host-restart-every 1

echo "== fuzz targets"
# 10 s of each target; without nightly or cargo-fuzz (exit 77) still
# compile every target (with the fuzzing cfg) so a broken target cannot land.
fuzz_rc=0
./scripts/fuzz.sh --time 10 || fuzz_rc=$?
if [ "$fuzz_rc" -eq 77 ]; then
    (cd fuzz && RUSTFLAGS="--cfg fuzzing" cargo build --bins)
elif [ "$fuzz_rc" -ne 0 ]; then
    echo "fuzzing found something (exit $fuzz_rc)"; exit 1
fi
echo "== sanitizers and checkers"
./scripts/check-sanitizers.sh | tee "$WD_SKIP_LOG.san"
sed -n 's/^  skipped: \(.*\)/check-sanitizers: \1/p' "$WD_SKIP_LOG.san" >> "$WD_SKIP_LOG"
skips=$(sort -u "$WD_SKIP_LOG" | grep -c . || true)
echo "== skipped tests: $skips"
if [ "$skips" -gt 0 ]; then
    sort -u "$WD_SKIP_LOG" | sed 's/^[^:]*: //' | sort | uniq -c | sed 's/^/   /'
    sort -u "$WD_SKIP_LOG" | sed 's/^/   - /'
fi
echo "== all tests passed"
