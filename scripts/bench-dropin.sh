#!/usr/bin/env bash
# The drop-in libibverbs against ferroce's own tools, the same minutes, alternating: perftest's
# ib_write_bw -s 65536 and ib_write_lat -s 8 on the drop-in (Debian's stock binaries,
# LD_LIBRARY_PATH only) beside `ferroce perf write-bw -s 65536` and `ferroce perf write-lat
# -s 8`, server on 127.0.0.95 and client on 127.0.0.96. Prints each run's result line.
# Needs: perftest, scripts/build-dropin.sh and a release `ferroce` (cargo build --release
# -p ferroce-cli). Usage: scripts/bench-dropin.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
lib=$PWD/target/release
ferroce=$PWD/target/release/ferroce
[ -e "$lib/libibverbs.so.1" ] || { echo "bench-dropin: run scripts/build-dropin.sh first" >&2; exit 1; }
[ -x "$ferroce" ] || { echo "bench-dropin: build target/release/ferroce first" >&2; exit 1; }
perftest() {
    local tool=$1; shift
    FERROCE_ADDR=127.0.0.95 LD_LIBRARY_PATH=$lib timeout 60 "$tool" -d ferroce0 -x 0 -p 18600 "$@" \
        > /dev/null 2>&1 &
    local server=$!
    sleep 0.7
    FERROCE_ADDR=127.0.0.96 LD_LIBRARY_PATH=$lib timeout 60 "$tool" -d ferroce0 -x 0 -p 18600 "$@" \
        127.0.0.95 | awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }'
    wait $server
}
own() {
    local test=$1; shift
    timeout 60 "$ferroce" perf "$test" --local 127.0.0.95 "$@" > /dev/null 2>&1 &
    local server=$!
    sleep 0.5
    timeout 60 "$ferroce" perf "$test" --local 127.0.0.96 "$@" 127.0.0.95 \
        | awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }'
    wait $server
}
for round in $(seq "$rounds"); do
    echo "round $round drop-in ib_write_bw -s 65536 -n 5000: $(perftest ib_write_bw -s 65536 -n 5000)"
    echo "round $round ferroce perf write-bw -s 65536 -n 5000: $(own write-bw -s 65536 -n 5000)"
    echo "round $round drop-in ib_write_lat -s 8 -n 20000: $(perftest ib_write_lat -s 8 -n 20000)"
    echo "round $round ferroce perf write-lat -s 8 -n 20000: $(own write-lat -s 8 -n 20000)"
done
