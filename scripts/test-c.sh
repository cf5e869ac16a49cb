#!/usr/bin/env bash
# The C ABI outside cargo test: builds the release library (libferroce_capi.a and .so), then
# compiles the C and C++ examples against crates/ferroce-capi/include/ferroce.h the way a
# C or C++ project would (static, and the C example once more against the shared library)
# and runs each on loopback. `cargo test -p ferroce-capi` covers the same ground against the
# debug library, plus the C test with its panic hook; this script checks the release
# artifacts a user links.
#
#   scripts/test-c.sh            CC and CXX choose the compilers (cc, c++)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cc="${CC:-cc}"
cxx="${CXX:-c++}"
target="${CARGO_TARGET_DIR:-$root/target}"
out="$target/test-c"
mkdir -p "$out"
libs=(-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc)
warn=(-Wall -Wextra -Werror -O2 -pthread)

cargo build --release -p ferroce-capi
lib="$target/release"

echo "== C example, static"
"$cc" -std=c11 "${warn[@]}" -I crates/ferroce-capi/include examples/c/receive_frames.c \
    "$lib/libferroce_capi.a" "${libs[@]}" -o "$out/receive_frames"
timeout 120 "$out/receive_frames" --frames 50

echo "== C example, shared"
"$cc" -std=c11 "${warn[@]}" -I crates/ferroce-capi/include examples/c/receive_frames.c \
    -L "$lib" -lferroce_capi -o "$out/receive_frames_shared"
LD_LIBRARY_PATH="$lib" timeout 120 "$out/receive_frames_shared" --frames 50

echo "== C++ example (RoceReceiverInterfaceV2 shape), static"
"$cxx" -std=c++17 "${warn[@]}" -I crates/ferroce-capi/include examples/cpp/hololink_receiver.cpp \
    "$lib/libferroce_capi.a" "${libs[@]}" -o "$out/hololink_receiver"
timeout 120 "$out/hololink_receiver"

echo "test-c: all passed"
