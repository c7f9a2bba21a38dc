#!/bin/sh
# Build libwdz.so (the drop-in zlib, zlib/wdz.c) next to libwd_comp.so in
# target/release. Needs a C compiler and zlib's header (zlib1g-dev).
set -eu
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p wd-comp-capi
# Small fixed-size clears and copies (a stream's record) as unrolled
# stores, not `rep stos`, whose start-up cost was 7 of the 131 ns a
# 16-byte stream took through the shim (init, inflate, end in a C loop;
# stock zlib 117 ns); where the compiler knows the option (gcc on x86).
tune=""
if cc -mstringop-strategy=unrolled_loop -Werror -x c -c -o /dev/null /dev/null 2>/dev/null; then
    tune="-mstringop-strategy=unrolled_loop"
fi
cc -std=gnu11 -O2 -g -fPIC $tune -shared -Wall -Wextra -Werror -Iinclude zlib/wdz.c \
    -Wl,--version-script=zlib/libwdz.map -Wl,-soname,libwdz.so \
    -Ltarget/release -lwd_comp -lz -ldl -lpthread -Wl,-rpath,'$ORIGIN' \
    -o target/release/libwdz.so
echo "target/release/libwdz.so"
