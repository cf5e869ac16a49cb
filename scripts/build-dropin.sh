#!/usr/bin/env bash
# Builds ferroce's drop-in libibverbs (crates/ferroce-ibverbs) in release and leaves it as
# target/release/libibverbs.so.1 and target/release/librdmacm.so.1 (links to cargo's
# libferroce_ibverbs.so, so they follow every rebuild), then prints the first path. Run existing verbs programs on it with
#
#   LD_LIBRARY_PATH=target/release FERROCE_ADDR=127.0.0.2 ibv_devinfo -v
#
# CARGO_TARGET_DIR moves target/ as it does for cargo; extra arguments go to cargo build.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
target="${CARGO_TARGET_DIR:-$root/target}"

cargo build --release --locked -p ferroce-ibverbs "$@" >&2
ln -sf libferroce_ibverbs.so "$target/release/libibverbs.so.1"
# The same file is the drop-in librdmacm.so.1 (its RDMACM_* nodes): a program that needs both
# names maps it once, so librdmacm's ids hold the drop-in libibverbs's own objects.
ln -sf libferroce_ibverbs.so "$target/release/librdmacm.so.1"
echo "$target/release/libibverbs.so.1"
