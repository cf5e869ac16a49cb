#!/usr/bin/env bash
# Installs the C library under a prefix, as `make install` would: builds it in release, then
#
#   PREFIX/include/ferroce.h
#   LIBDIR/libferroce_capi.so.X.Y.Z   the shared library (SONAME libferroce_capi.so.ABI)
#   LIBDIR/libferroce_capi.so.ABI     -> .so.X.Y.Z, the name programs record and load
#   LIBDIR/libferroce_capi.so         -> .so.ABI, for -lferroce_capi at link time
#   LIBDIR/libferroce_capi.a          the static library
#   LIBDIR/pkgconfig/ferroce.pc       for `pkg-config --cflags --libs ferroce`
#
# ABI is 0.MINOR before 1.0 and MAJOR after (crates/ferroce-capi/build.rs sets the SONAME).
#
#   scripts/install-capi.sh PREFIX [LIBDIR]       LIBDIR defaults to PREFIX/lib
#
# `ferroce.pc` adds `-Wl,-rpath,LIBDIR` to Libs, so a program built with it loads the library
# from LIBDIR without LD_LIBRARY_PATH or ldconfig (crates/ferroce-capi/README.md says why).
# DESTDIR stages the files for packaging: they are copied under DESTDIR, and the .pc names
# the final PREFIX.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 PREFIX [LIBDIR]" >&2
    exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="$(realpath -m "$1")"
libdir="$(realpath -m "${2:-$prefix/lib}")"
includedir="$prefix/include"
dest="${DESTDIR:-}"
target="${CARGO_TARGET_DIR:-$root/target}"

(cd "$root" && cargo build --release -p ferroce-capi)
built="$target/release"

version="$(sed -n 's/^#define FERROCE_VERSION "\(.*\)"$/\1/p' "$root/crates/ferroce-capi/include/ferroce.h")"
major="${version%%.*}"
minor="${version#*.}"
minor="${minor%%.*}"
if [[ "$major" == 0 ]]; then abi="0.$minor"; else abi="$major"; fi
soname="libferroce_capi.so.$abi"
# The SONAME the library carries must be the link name made here.
if command -v readelf >/dev/null; then
    if ! readelf -d "$built/libferroce_capi.so" | grep -q "Library soname: \[$soname\]"; then
        echo "install-capi: $built/libferroce_capi.so does not carry SONAME $soname" >&2
        exit 1
    fi
fi

install -d "$dest$includedir" "$dest$libdir/pkgconfig"
install -m 644 "$root/crates/ferroce-capi/include/ferroce.h" "$dest$includedir/ferroce.h"
install -m 755 "$built/libferroce_capi.so" "$dest$libdir/libferroce_capi.so.$version"
ln -sfn "libferroce_capi.so.$version" "$dest$libdir/$soname"
ln -sfn "$soname" "$dest$libdir/libferroce_capi.so"
install -m 644 "$built/libferroce_capi.a" "$dest$libdir/libferroce_capi.a"

# The native libraries the static library needs (`cargo rustc -- --print native-static-libs`
# on Linux); a shared link needs none of them.
cat >"$dest$libdir/pkgconfig/ferroce.pc" <<PC
prefix=$prefix
exec_prefix=\${prefix}
libdir=$libdir
includedir=\${prefix}/include

Name: ferroce
Description: RoCEv2 in Rust: a soft RDMA NIC, sensor frames, sessions and a buffer cache (C ABI)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lferroce_capi
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
PC

echo "install-capi: ferroce $version in $prefix (libraries in $libdir, SONAME $soname)"
