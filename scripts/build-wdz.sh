#!/bin/sh
# Build libwdz.so (the drop-in zlib, zlib/wdz.c) next to libwd_comp.so in
# target/release. Needs a C compiler and zlib's header (zlib1g-dev).
set -eu
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p wd-comp-capi
cc -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -Iinclude zlib/wdz.c \
    -Wl,--version-script=zlib/libwdz.map -Wl,-soname,libwdz.so \
    -Ltarget/release -lwd_comp -lz -ldl -lpthread -Wl,-rpath,'$ORIGIN' \
    -o target/release/libwdz.so
echo "target/release/libwdz.so"
