#!/usr/bin/env bash
# Sanitizers and checkers:
#  - AddressSanitizer + UndefinedBehaviorSanitizer builds of the C API tests
#    (tests/c/test_wd.c, test_nvme.c, test_comp.c), leaks checked, on
#    in-process hosts (test_comp on the CPU path);
#  - valgrind (memcheck, definite leaks are errors) on the same C clients
#    talking to a host in another process (`wd serve`), so only the client
#    runs under valgrind;
#  - Miri on the pure-logic crates (NVMe formats, ring layout, IOMMU tables,
#    wire codec) when a nightly toolchain with Miri is installed.
# What the machine lacks is reported as skipped, with the reason, and
# counted. Usage: ./scripts/check-sanitizers.sh [--no-miri]
set -euo pipefail
cd "$(dirname "$0")/.."
miri=1
[ "${1:-}" = "--no-miri" ] && miri=0
skipped=()
ran=0
cargo build --release --locked -p wd-capi -p wd-comp-capi -p wd-embedded -p wd-cli
out=target/sanitizers
mkdir -p "$out"
build() { # name source extra-flags...
    local name=$1 src=$2; shift 2
    cc -std=c11 -D_GNU_SOURCE -g -Wall -Wextra -Werror -Iinclude "$@" "$src" \
        -Ltarget/release -lwd_comp -lwd -Wl,-rpath,"$PWD/target/release" -o "$out/$name"
}

echo "== ASan + UBSan: C API tests"
for t in test_wd test_nvme test_comp; do
    build "$t-asan" "tests/c/$t.c" -fsanitize=address,undefined -fno-omit-frame-pointer \
        -fno-sanitize-recover=undefined
    env -u WD_HOST WD_COMP_HOST=/nonexistent ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$out/$t-asan"
    ran=$((ran + 1))
done

echo "== valgrind: C clients of a host in another process"
if command -v valgrind >/dev/null; then
    dir=$(mktemp -d)
    trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
    target/release/wd serve --socket "$dir/wd.sock" --device dummy --device sec --device zip \
        --device "nvme:ns=$dir/store.img:0:16M,ns=$dir/store.img:16M:16M" 2>"$dir/serve.log" &
    for _ in $(seq 100); do [ -S "$dir/wd.sock" ] && break; sleep 0.05; done
    for t in test_wd test_nvme test_comp; do
        build "$t" "tests/c/$t.c"
        WD_HOST="$dir/wd.sock" valgrind -q --error-exitcode=9 --leak-check=full \
            --errors-for-leak-kinds=definite "$out/$t"
        ran=$((ran + 1))
    done
    kill %1 && wait %1 2>/dev/null || true
else
    skipped+=("valgrind: not installed (Debian package valgrind)")
fi

echo "== Miri: pure-logic crates"
if [ $miri -eq 0 ]; then
    skipped+=("miri: --no-miri")
elif cargo +nightly miri --version >/dev/null 2>&1; then
    # Few property cases (Miri interprets every instruction); real time and
    # the file system are allowed (tests use Instant and temp dirs).
    PROPTEST_CASES=4 MIRIFLAGS=-Zmiri-disable-isolation \
        cargo +nightly miri test -p wd-nvme-msg -p wd-ring -p wd-iommu -p wd-proto -p wd-route -p wd-zip-msg --lib
    ran=$((ran + 1))
else
    skipped+=("miri: no nightly toolchain with the miri component (rustup component add --toolchain nightly miri rust-src)")
fi

echo "sanitizers: $ran checks passed, ${#skipped[@]} skipped"
for s in "${skipped[@]}"; do echo "  skipped: $s"; done
