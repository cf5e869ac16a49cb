#!/usr/bin/env bash
# The checks that need a GPU, in two halves, because the GPU machine may have no Rust:
#
#   scripts/gpu-check.sh build   here: builds the CUDA tests, the `ferroce` binary and the
#                                Python wheel with the `cuda` feature into .gpu-check/ (ignored
#                                by git)
#   scripts/gpu-check.sh run     on the GPU machine: runs them with FERROCE_REQUIRE_GPU=1, so a
#                                missing GPU fails instead of skipping, then streams 4K frames
#                                into CUDA memory with `stream recv --cuda 0` and checks them
#   scripts/gpu-check.sh         both, on a machine with Rust and a GPU
#
# With the device tool: build here, then run `scripts/gpu-check.sh run` there with `.gpu-check`
# carried. Logs go to $OUT when it is set (the device tool brings them back), else to
# .gpu-check/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"
dir=.gpu-check

build() {
    rm -rf "$dir" && mkdir -p "$dir"
    # The test executables cargo builds, by target name: the library's unit tests (the `cuda`
    # module's among them) and tests/cuda.rs.
    cargo test --release --locked --features cuda -p ferroce --lib --test cuda --no-run \
        --message-format=json |
        python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/test-" + m["target"]["name"])
' "$dir"
    cargo build --release --locked --features cuda -p ferroce-cli
    cp target/release/ferroce "$dir/ferroce"
    strip "$dir"/* 2>/dev/null || true
    # The Python package with the cuda feature, as a wheel (its tests travel with the working
    # tree and run where they are, since some read files beside them). maturin comes from
    # scripts/test-python.sh's environment.
    local venv=target/pyenv
    [ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet 'maturin>=1.9.4,<2'; }
    "$venv/bin/maturin" build --release --features cuda -m crates/ferroce-py/Cargo.toml \
        -o "$dir/wheels" --quiet
    ls -la "$dir" "$dir/wheels"
}

run() {
    [ -x "$dir/ferroce" ] || { echo "gpu-check: no $dir/ferroce; run 'scripts/gpu-check.sh build' first" >&2; exit 1; }
    local logs=${OUT:-$dir/logs}
    mkdir -p "$logs"
    export FERROCE_REQUIRE_GPU=1
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$logs/gpu.txt"
    # Every check runs; the status says whether any failed.
    local failed=0
    echo "== the cuda module's tests"
    "$dir/test-ferroce" --nocapture cuda:: 2>&1 | tee "$logs/unit.log" || failed=1
    echo "== tests/cuda.rs"
    "$dir/test-cuda" --nocapture --test-threads 1 2>&1 | tee "$logs/cuda.log" || failed=1
    echo "== 120 4K RAW12 frames into CUDA memory, as fast as the device side sends"
    local frames=120
    "$dir/ferroce" stream send --local 127.0.0.1 --control-port 8192 --fps 0 --frames "$frames" \
        > "$logs/send.log" 2>&1 &
    local sender=$!
    sleep 0.5
    local rc=0
    "$dir/ferroce" stream recv --local 127.0.0.1 --device 127.0.0.1 --mtu 9000 --pages 8 \
        --queue 4 --frames "$frames" --idle 10 --json --cuda 0 > "$logs/recv.jsonl" 2> "$logs/recv.log" || rc=$?
    # A sender never programmed (the receiver refused to start) would wait forever.
    kill "$sender" 2>/dev/null || true
    wait "$sender" 2>/dev/null || true
    cat "$logs/recv.log"
    python3 - "$logs/recv.jsonl" "$frames" "$rc" <<'EOF' || failed=1
import json, sys
want, rc = int(sys.argv[2]), int(sys.argv[3])
assert rc == 0, f"stream recv exited {rc} (its log is above)"
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
head, summary = lines[0], lines[-1]
print("device memory:", head.get("device_memory"))
print("summary:", json.dumps(summary))
assert head.get("device_memory", {}).get("device") == "CUDA device 0", head
assert summary["content_errors"] == 0, summary
# Frames the queue dropped are counted, not lost: every frame arrived or was dropped.
assert summary["frames"] + summary["dropped"] >= want, summary
print("gpu-check: frames into CUDA memory: ok")
EOF
    echo "== the Python package's GPU tests (frames in CUDA memory through CuPy and DLPack)"
    if python3 -c 'import pytest, numpy' 2>/dev/null; then
        rm -rf "$dir/py" && python3 -m pip install --quiet --no-deps --no-index --target "$dir/py" "$dir"/wheels/*.whl
        # CuPy is what the GPU cases read frames with; FERROCE_REQUIRE_GPU=1 (set above) makes
        # its absence a failure rather than a skip.
        PYTHONPATH="$dir/py" FERROCE_GPU=1 python3 -m pytest -q -rs -p no:cacheprovider -m gpu \
            crates/ferroce-py/tests 2>&1 | tee "$logs/python.log" || failed=1
    else
        echo "gpu-check: SKIPPED the Python GPU tests: no pytest or numpy on this machine" | tee "$logs/python.log"
    fi
    if [ "$failed" -ne 0 ]; then
        echo "gpu-check: FAILED (logs in $logs)" >&2
        exit 1
    fi
    echo "gpu-check: every check passed"
}

case "${1:-all}" in
    build) build ;;
    run) run ;;
    all) build && run ;;
    *) echo "usage: scripts/gpu-check.sh [build|run]" >&2; exit 2 ;;
esac
