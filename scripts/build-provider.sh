#!/usr/bin/env bash
# Build the OpenSSL provider (target/provider/wd.so) against target/release/libwd.so.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p wd-capi >&2
mkdir -p target/provider
cc -std=c11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -Iinclude provider/wd_provider.c \
    -Ltarget/release -lwd -lcrypto -Wl,-rpath,"$PWD/target/release" -o target/provider/wd.so
echo target/provider
