#!/usr/bin/env bash
# Install the C libraries (libwd.so, libwd_crypto.so, libwd_comp.so,
# libwd_embedded.so, and the drop-in zlib libwdz.so), include/*.h, the `wd`
# command, the pkg-config files (wd.pc, wd_crypto.pc, wd_comp.pc) and the
# systemd units (wrapdrive.socket, .service) under PREFIX (default
# /usr/local):  ./scripts/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cargo build --release --locked -p wd-capi -p wd-crypto-capi -p wd-comp-capi -p wd-embedded -p wd-cli
./scripts/build-wdz.sh >/dev/null
install -d "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin"
# libwd_embedded.so goes beside libwd.so: that is where libwd.so looks for
# it when a program asks for an in-process host (docs/c-abi.md).
for lib in libwd.so libwd_crypto.so libwd_comp.so libwdz.so libwd_embedded.so; do
    install -m 0755 "target/release/$lib" "$prefix/lib/$lib"
done
install -m 0644 include/*.h "$prefix/include/"
install -m 0755 target/release/wd "$prefix/bin/wd"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/wd-capi/wd.pc.in \
    > "$prefix/lib/pkgconfig/wd.pc"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/wd-crypto-capi/wd_crypto.pc.in \
    > "$prefix/lib/pkgconfig/wd_crypto.pc"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/wd-comp-capi/wd_comp.pc.in \
    > "$prefix/lib/pkgconfig/wd_comp.pc"
# Units point at this prefix's `wd`; enable with
# `systemctl link $prefix/lib/systemd/system/wrapdrive.{socket,service}`.
install -d "$prefix/lib/systemd/system"
install -m 0644 packaging/systemd/wrapdrive.socket "$prefix/lib/systemd/system/"
sed -e "s|/usr/local/bin/wd|$prefix/bin/wd|" packaging/systemd/wrapdrive.service \
    > "$prefix/lib/systemd/system/wrapdrive.service"
echo "installed WrapDrive $version under $prefix"
