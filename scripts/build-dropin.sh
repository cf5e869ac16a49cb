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
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"
target="${CARGO_TARGET_DIR:-$root/target}"

# The workspace's default members, as `cargo build --release` and `cargo run --release` build
# them (all but the Python module: Cargo.toml says why): a release build of one package
# resolves its dependencies differently (with LTO, ferroce is left as bitcode alone where no
# library of the workspace needs its object code), so building ferroce-ibverbs alone and then
# the workspace relinked the drop-in each time (16 s), and the README's blocks and CI's scripts
# switch between the two. The first build takes longer.
cargo build --release --locked "$@" >&2
ln -sf libferroce_ibverbs.so "$target/release/libibverbs.so.1"
# The same file is the drop-in librdmacm.so.1 (its RDMACM_* nodes): a program that needs both
# names maps it once, so librdmacm's ids hold the drop-in libibverbs's own objects.
ln -sf libferroce_ibverbs.so "$target/release/librdmacm.so.1"
echo "$target/release/libibverbs.so.1"
