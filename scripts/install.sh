#!/usr/bin/env bash
# Install libwd.so, include/wd.h, the `wd` command and a pkg-config file
# under PREFIX (default /usr/local):  ./scripts/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cargo build --release --locked -p wd-capi -p wd-cli
install -d "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin"
install -m 0755 target/release/libwd.so "$prefix/lib/libwd.so"
install -m 0644 include/*.h "$prefix/include/"
install -m 0755 target/release/wd "$prefix/bin/wd"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/wd-capi/wd.pc.in \
    > "$prefix/lib/pkgconfig/wd.pc"
echo "installed WrapDrive $version under $prefix"
