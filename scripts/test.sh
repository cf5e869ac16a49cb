#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, docs, then every test of the
# workspace. TESTING.md explains how the suite is organised.
set -euo pipefail
cd "$(dirname "$0")/.."
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"

# tshark and iproute2 are installed by scripts/bootstrap.sh: the tshark comparison fails rather
# than skips, and so does the namespace test when run as root (as CI is).
export FERROCE_REQUIRE_TSHARK=1
# So are ibverbs-utils and perftest: the drop-in libibverbs test fails rather than skips.
export FERROCE_REQUIRE_IBVERBS_UTILS=1
# And UCX, Open MPI and UCX's device node: the UCX and MPI test fails rather than skips.
export FERROCE_REQUIRE_UCX=1
if [ "$(id -u)" -eq 0 ]; then
    export FERROCE_REQUIRE_NETNS=1
fi

# Each section says what it took, and the run ends with the list, so that a slow CI run shows
# where its minutes went.
timings=()
section_name=""
section_start=$SECONDS
section() {
    [ -n "$section_name" ] && timings+=("$(printf '%5d s  %s' $((SECONDS - section_start)) "$section_name")")
    section_name="$1"
    section_start=$SECONDS
    [ -n "$1" ] && echo "== $1"
    return 0
}
report_timings() {
    section ""
    echo "== time per section (total $SECONDS s)"
    printf '%s\n' "${timings[@]}"
}
trap report_timings EXIT

section "cargo fmt --check"
cargo fmt --all -- --check
section "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
section "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
section "cargo test: build"
cargo test --workspace --locked --no-run
section "cargo test: run"
cargo test --workspace --locked
# The `cuda` feature loads the CUDA driver at run time, so it builds anywhere: lint it, and run
# its tests, which on a host without a GPU check the refusals and say they skipped the GPU part
# (scripts/gpu-check.sh runs them where there is one).
section "cargo clippy and test --features cuda"
cargo clippy -p ferroce -p ferroce-cli -p ferroce-capi -p ferroce-py --all-targets --features cuda --locked -- -D warnings
cargo test -p ferroce --features cuda --locked --lib --test cuda -- --nocapture
# The bindings as their users build them: the C library in release with the C and C++
# examples linked against it, and the Python package built by maturin into a virtual
# environment, with pytest and the Python examples (crates/ferroce-*/README.md).
section "the C ABI: release library and examples (scripts/test-c.sh)"
scripts/test-c.sh
section "the Python package: pip install and pytest (scripts/test-python.sh)"
scripts/test-python.sh
section "the drop-in libibverbs.so.1 under Debian's ibv_devices, ibv_devinfo, perftest (scripts/test-dropin.sh)"
scripts/test-dropin.sh
section "the drop-in librdmacm.so.1 under Debian's rping and ucmatose (scripts/test-rdmacm.sh)"
scripts/test-rdmacm.sh
section "libfabric's fi_pingpong on the drop-ins, two network namespaces (scripts/test-fabric.sh)"
scripts/test-fabric.sh
section "UCX and Open MPI on the drop-in libibverbs.so.1 (scripts/test-ucx.sh)"
scripts/test-ucx.sh
# Every shell snippet of the READMEs, as written (the servers, pairs and drop-in blocks on
# their own loopback addresses; the hardware-only lines must fail saying what is missing).
section "every sh block of the READMEs runs as written (scripts/test-readme.sh)"
scripts/test-readme.sh
section "interop (kernel rxe, rdma-core and perftest in QEMU guests; interop/README.md)"
interop/run.sh
