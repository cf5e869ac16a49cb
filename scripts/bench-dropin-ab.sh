#!/usr/bin/env bash
# A/B of two builds of the drop-in libibverbs.so.1 and of ferroce's own perf, alternating in
# the same minutes (issue 23's two targets): perftest's ib_write_lat and ib_write_bw on the
# drop-in against `ferroce perf write-lat` and `write-bw`, 8 B and 64 KiB. Each DIR holds a
# `ferroce` binary and a `libibverbs.so.1` (copy them out of target/release after
# `cargo build --release -p ferroce-cli` and `scripts/build-dropin.sh`, or out of a worktree
# of the old commit). Prints one line per build and round: typical, average and p99 µs of
# each latency test, MB/s of each bandwidth test. Each bandwidth run moves 1.3 GB: shorter
# ones (5000 WRITEs) were mostly start-up, and varied by a quarter from run to run.
# Usage: scripts/bench-dropin-ab.sh OLD-DIR NEW-DIR [rounds]     (addresses 127.0.7.50-53)
set -euo pipefail
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
rounds=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$(dirname "$0")/.."
fail() {
    echo "bench-dropin-ab: $*" >&2
    exit 1
}
# on ADDR CMD...: CMD on the drop-in in $dir, set per build below.
# shellcheck source=scripts/dropin-lib.sh
. scripts/dropin-lib.sh

# pair NAME SERVER-COMMAND... -- CLIENT-COMMAND...: the server in the background, then the
# client; the client's output in $out/NAME.
pair() {
    local name=$1; shift
    local server=()
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    "${server[@]}" > /dev/null 2>&1 &
    local pid=$!
    sleep 0.5
    "$@" > "$out/$name" 2>&1 || true
    wait $pid || true
}
# The result line of SIZE in perftest's table: typical/average/p99 (latency) or average MB/s.
lat() { awk -v s="$2" '$1 == s && NF >= 8 { printf "%s/%s/%s", $5, $6, $8; exit }' "$out/$1"; }
bw() { awk -v s="$2" '$1 == s && NF >= 4 { print $4; exit }' "$out/$1"; }

for round in $(seq "$rounds"); do
    for which in old new; do
        dir=$old
        [ $which = new ] && dir=$new
        pair dl on 127.0.7.50 ib_write_lat -d ferroce0 -x 0 -s 8 -n 20000 -- \
            on 127.0.7.51 ib_write_lat -d ferroce0 -x 0 -s 8 -n 20000 127.0.7.50
        pair pl "$dir/ferroce" perf write-lat --local 127.0.7.52 -s 8 -n 20000 -- \
            "$dir/ferroce" perf write-lat --local 127.0.7.53 -s 8 -n 20000 127.0.7.52
        pair db on 127.0.7.50 ib_write_bw -d ferroce0 -x 0 -s 65536 -n 20000 -- \
            on 127.0.7.51 ib_write_bw -d ferroce0 -x 0 -s 65536 -n 20000 127.0.7.50
        pair pb "$dir/ferroce" perf write-bw --local 127.0.7.52 -s 65536 -n 20000 -- \
            "$dir/ferroce" perf write-bw --local 127.0.7.53 -s 65536 -n 20000 127.0.7.52
        echo "round $round $which: write-lat typ/avg/p99 µs drop-in $(lat dl 8) perf $(lat pl 8)" \
            "| write-bw 64 KiB MB/s drop-in $(bw db 65536) perf $(bw pb 65536)"
    done
done
