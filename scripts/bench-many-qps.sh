#!/usr/bin/env bash
# One queue pair against a thousand (issue 16): `ferroce perf write-bw` with 4 KiB WRITEs,
# -q 1 and -q 1000 in interleaved rounds, each pair of processes on loopback addresses of its
# own; then the in-process fairness run (examples/many_qps), the instructions a busy QP's
# WRITEs cost beside 10,000 idle ones (examples/idle_qps under callgrind), and what an idle QP
# and a region take (examples/idle_cost). BENCHMARKS.md has the figures.
# Needs: valgrind for the instruction counts (skipped with a note without it).
# Usage: scripts/bench-many-qps.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release -q -p ferroce-cli
cargo build --release -q -p ferroce --example many_qps --example idle_cost
cargo build --release -q -p ferroce-proto --example idle_qps
bin=target/release/ferroce

# The client's BW average (MB/s) of one perf run: server on .1, client on .2 of 127.0.0.x.
perf_bw() {
    local q=$1 n=$2 port=$3
    "$bin" perf write-bw -s 4096 -n "$n" -q "$q" --local 127.0.0.150 -p "$port" >/dev/null 2>&1 &
    local server=$!
    sleep 0.5
    "$bin" perf write-bw -s 4096 -n "$n" -q "$q" --local 127.0.0.151 -p "$port" 127.0.0.150 \
        | awk '$1 == 4096 { print $4 }'
    wait "$server"
}

echo "round  -q 1 MB/s  -q 1000 MB/s  ratio"
port=19460
for r in $(seq 1 "$rounds"); do
    one=$(perf_bw 1 100000 $port); port=$((port + 1))
    many=$(perf_bw 1000 100 $port); port=$((port + 1))
    awk -v r="$r" -v a="$one" -v b="$many" 'BEGIN { printf "%5d  %9.0f  %12.0f  %5.2f\n", r, a, b, b / a }'
done

echo
for n in 1 1000 1 1000; do target/release/examples/many_qps "$n" 3 232; done

echo
if command -v valgrind >/dev/null; then
    for idle in 0 10000; do
        ir=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
            --toggle-collect='idle_qps::transfer' target/release/examples/idle_qps "$idle" 2>&1 \
            | awk '/Collected/ { print $4 }')
        echo "idle_qps $idle idle QPs: $ir instructions for 12,800 WRITEs"
    done
else
    echo "valgrind is missing: no instruction counts (apt-get install valgrind)"
fi

echo
target/release/examples/idle_cost 10000 234
