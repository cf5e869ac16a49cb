#!/usr/bin/env bash
# The interop suite, as CI runs it: ferroce against Linux kernel Soft-RoCE (rdma_rxe), rdma-core's
# ibv_rc_pingpong and perftest in QEMU guests (interop/README.md). It skips, saying why, where
# the lab cannot run (not root, no /dev/net/tun, no network namespaces, no QEMU and no way to
# install it); FERROCE_REQUIRE_INTEROP=1 turns a skip into a failure. Otherwise any failure
# fails. Usage: interop/run.sh [test|bench] [suite.py options]   (default: test)
set -euo pipefail
cd "$(dirname "$0")/.."
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"

skip() {
    echo "interop: SKIPPED: $*"
    if [ "${FERROCE_REQUIRE_INTEROP:-0}" = 1 ]; then
        echo "interop: FERROCE_REQUIRE_INTEROP=1, so a skip is a failure" >&2
        exit 1
    fi
    exit 0
}

[ "${FERROCE_INTEROP:-1}" != 0 ] || skip "FERROCE_INTEROP=0"
[ "$(uname -m)" = x86_64 ] || skip "the guest is Debian's amd64 kernel; this is $(uname -m)"
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, taps, nftables)"
[ -c /dev/net/tun ] || skip "no /dev/net/tun for the guests' taps"
command -v python3 >/dev/null || skip "no python3"
command -v dpkg-query >/dev/null && command -v apt-get >/dev/null ||
    skip "needs Debian's packages (kernel, rdma-core, perftest) and apt-get"
probe="ferroce-ix-probe-$$"
if ! ip netns add "$probe" 2>/dev/null; then
    skip "cannot create a network namespace (ip netns add failed)"
fi
ip netns del "$probe"
if ! command -v qemu-system-x86_64 >/dev/null; then
    echo "interop: installing the host packages (QEMU, rdma-core, perftest, …)"
    python3 interop/lab.py packages ||
        skip "qemu-system-x86_64 is missing and could not be installed"
fi

mode=${1:-test}
[ $# -gt 0 ] && shift
echo "interop: building the ferroce release binary"
# The workspace's default members, as the other scripts build them: one package alone would relink the binary.
nice -n 19 cargo build --release --locked
export FERROCE_BIN="${CARGO_TARGET_DIR:-target}/release/ferroce"
FERROCE_BIN=$(realpath "$FERROCE_BIN")
# The drop-in libibverbs.so.1, which the host's stock ibv_rc_pingpong and ibv_ud_pingpong load
# against the guests' rxe (the dropin-* runs).
echo "interop: building the drop-in libibverbs.so.1"
FERROCE_DROPIN=$(realpath "$(nice -n 19 scripts/build-dropin.sh)")
export FERROCE_DROPIN
if [ "$mode" = test ]; then
    # The verbs backend's device tests (crates/ferroce/tests/verbs_device.rs) run in a guest
    # against rxe0; cargo prints where it put the test binary.
    echo "interop: building the verbs device tests"
    FERROCE_DEVICE_TESTS=$(nice -n 19 cargo test --release --locked -p ferroce --test verbs_device \
        --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "verbs_device":
        print(m["executable"])')
    export FERROCE_DEVICE_TESTS
fi

# The suite gives every run its own limit; this one bounds the whole (the TERM makes it tear
# down its guests and namespace before it exits). It guards against a hang, not a slow host:
# the 153 runs took 378 s here on 2026-12-08, and CI's machine, whose emulated guests run
# slower, had finished 136 of them when the former limit of 900 s stopped it that day.
limit=${FERROCE_INTEROP_LIMIT:-1200}
[ "$mode" = bench ] && limit=${FERROCE_INTEROP_LIMIT:-3600}
start=$(date +%s)
status=0
timeout -s TERM -k 30 "$limit" python3 interop/suite.py "$mode" "$@" || status=$?
echo "interop: $mode finished in $(($(date +%s) - start)) s with status $status"
[ "$status" -ne 124 ] || echo "interop: FAILED: the suite ran past its limit of $limit s" >&2
exit "$status"
