#!/usr/bin/env bash
# The C ABI outside cargo test: builds the release library (libferroce_capi.a and .so), then
# compiles the C and C++ examples (and tests/c/verbs_test.c, the verbs and rdma_cm calls)
# against crates/ferroce-capi/include/ferroce.h the way a C or C++ project would (static; the shared library is tried as installed, below)
# and runs each on loopback. `cargo test -p ferroce-capi` covers the same ground against the
# debug library, plus the C test with its panic hook; this script checks the release
# artifacts a user links. Last, it installs the library into a temporary prefix with
# scripts/install-capi.sh and builds the C example as a project would from that install
# (`pkg-config --cflags --libs ferroce`), then runs it without LD_LIBRARY_PATH: the SONAME,
# its symlink and the .pc's rpath must be enough.
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

echo "== C verbs and rdma_cm calls (tests/c/verbs_test.c), static"
"$cc" -std=c11 "${warn[@]}" -I crates/ferroce-capi/include crates/ferroce-capi/tests/c/verbs_test.c \
    "$lib/libferroce_capi.a" "${libs[@]}" -o "$out/verbs_test"
timeout 120 "$out/verbs_test"

echo "== C++ example (RoceReceiverInterfaceV2 shape), static"
"$cxx" -std=c++17 "${warn[@]}" -I crates/ferroce-capi/include examples/cpp/hololink_receiver.cpp \
    "$lib/libferroce_capi.a" "${libs[@]}" -o "$out/hololink_receiver"
timeout 120 "$out/hololink_receiver"

echo "== installed: SONAME, pkg-config, run without LD_LIBRARY_PATH"
soname="$(readelf -d "$lib/libferroce_capi.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
if [[ "$soname" != libferroce_capi.so.* ]]; then
    echo "test-c: libferroce_capi.so has no SONAME (got '$soname')" >&2
    exit 1
fi
prefix="$(mktemp -d "${TMPDIR:-/tmp}/ferroce-prefix.XXXXXX")"
trap 'rm -rf "$prefix"' EXIT
scripts/install-capi.sh "$prefix" >/dev/null
for f in include/ferroce.h lib/libferroce_capi.a "lib/$soname" lib/libferroce_capi.so \
    lib/pkgconfig/ferroce.pc; do
    [[ -e "$prefix/$f" ]] || { echo "test-c: the install lacks $f" >&2; exit 1; }
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ "$(pkg-config --modversion ferroce)" == "$(sed -n 's/^#define FERROCE_VERSION "\(.*\)"$/\1/p' crates/ferroce-capi/include/ferroce.h)" ]]
# shellcheck disable=SC2046 # pkg-config's flags are words
"$cc" -std=c11 "${warn[@]}" examples/c/receive_frames.c $(pkg-config --cflags --libs ferroce) \
    -o "$out/receive_frames_installed"
if ! readelf -d "$out/receive_frames_installed" | grep -q "NEEDED.*\[$soname\]"; then
    echo "test-c: the program does not record $soname" >&2
    exit 1
fi
env -u LD_LIBRARY_PATH timeout 120 "$out/receive_frames_installed" --frames 50
# The static library from the same install, with the .pc's private libs.
"$cc" -std=c11 "${warn[@]}" examples/c/receive_frames.c $(pkg-config --cflags ferroce) \
    "$prefix/lib/libferroce_capi.a" $(pkg-config --libs-only-l --static ferroce | sed 's/-lferroce_capi//') \
    -o "$out/receive_frames_installed_static"
timeout 120 "$out/receive_frames_installed_static" --frames 20

echo "test-c: all passed"
