#!/usr/bin/env bash
# Every test of the project: formatting, lints, Rust unit/property/integration
# tests, the C API test program, and a build (plus a short run) of every fuzz
# target. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== rustfmt"
cargo fmt --all -- --check

echo "== clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# Tests that need what this machine lacks append "test: reason" here and
# are counted in the summary, never passed silently.
export WD_SKIP_LOG="$PWD/target/test-skips.log"
mkdir -p target
: > "$WD_SKIP_LOG"

echo "== cargo test"
cargo test --workspace --locked

echo "== C API test (include/wd.h only)"
cargo build --release --locked -p wd-capi
out=target/c-test
mkdir -p "$out"
cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Iinclude tests/c/test_wd.c \
    -Ltarget/release -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/test_wd"
# Only the documented symbols are exported.
exported=$(nm -D --defined-only target/release/libwd.so | awk '{print $3}' | grep -v '^WD_0' | sort)
undocumented=$(for s in $exported; do grep -q "\b$s(" include/wd.h include/wd_crypto.h || echo "$s"; done)
if [ -n "$undocumented" ]; then echo "libwd.so exports symbols not in wd.h: $undocumented"; exit 1; fi
"$out/test_wd"

echo "== install + pkg-config"
prefix=$PWD/target/install-test
./scripts/install.sh "$prefix" >/dev/null
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" cc -std=c11 -D_GNU_SOURCE -Wall -Werror tests/c/test_wd.c \
    $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs wd) \
    -Wl,-rpath,"$prefix/lib" -o "$out/test_wd_pc"
"$out/test_wd_pc" >/dev/null

echo "== OpenSSL provider"
./scripts/test-provider.sh

echo "== fuzz targets"
if cargo +nightly --version >/dev/null 2>&1 && cargo fuzz --help >/dev/null 2>&1; then
    (cd fuzz && for t in $(cargo +nightly fuzz list); do
        cargo +nightly fuzz build "$t"
        cargo +nightly fuzz run "$t" -- -max_total_time=10 -rss_limit_mb=2048
    done)
else
    # No nightly or cargo-fuzz here: still compile every target (with the
    # fuzzing cfg) so a broken target cannot land.
    (cd fuzz && RUSTFLAGS="--cfg fuzzing" cargo build --bins)
fi
skips=$(sort -u "$WD_SKIP_LOG" | grep -c . || true)
echo "== skipped tests: $skips"
if [ "$skips" -gt 0 ]; then
    sort -u "$WD_SKIP_LOG" | sed 's/^[^:]*: //' | sort | uniq -c | sed 's/^/   /'
    sort -u "$WD_SKIP_LOG" | sed 's/^/   - /'
fi
echo "== all tests passed"
