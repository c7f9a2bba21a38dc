#!/usr/bin/env bash
# Build the OpenSSL provider (target/provider/wd.so) against
# target/release/libwd_crypto.so and libwd.so (libwd_embedded.so beside them
# for WD_HOST=embedded). Linked -z nodelete: OpenSSL closes the module at
# its last teardown, while another thread's exit destructor may still be
# running in it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p wd-capi -p wd-crypto-capi -p wd-embedded >&2
mkdir -p target/provider
cc -std=c11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -Iinclude provider/wd_provider.c \
    -Ltarget/release -lwd_crypto -lwd -lcrypto -Wl,-rpath,"$PWD/target/release" -Wl,-z,nodelete \
    -o target/provider/wd.so
echo target/provider
