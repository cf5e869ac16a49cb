#!/usr/bin/env bash
# The checks that need a GPU, for a machine with an NVIDIA driver: builds with the `cuda`
# feature and runs every CUDA test with FERROCE_REQUIRE_GPU=1, so a missing GPU fails instead
# of skipping. Prints the driver's view first, and the frame stream into CUDA memory last.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
export FERROCE_REQUIRE_GPU=1

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== ferroce's CUDA tests"
cargo test -p ferroce --features cuda --lib --test cuda -- --nocapture
echo "== stream recv --cuda 0"
cargo test -p ferroce-cli --features cuda --test stream -- --nocapture frames_delivered_into_cuda_memory
