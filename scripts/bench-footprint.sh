#!/usr/bin/env bash
# Whether a busy-polled ping-pong's user code slows the kernel's part of each turn, without
# ferroce (scripts/footprint-floor.c): ferroce's turn exchange (a WRITE and its ACK in one GSO
# send) with a block of user code between each receive and send, growing in code (a chain of calls
# to distinct generated functions, about 40 bytes of code a call) and in data (KiB of buffer
# touched a line at a time). Each line: the half round trip, the block's time in place and warm, and the
# kernel's share (the half round trip less one block). Sizes alternate within a round, so the
# host's drift hits all.
# Needs: a C compiler.
# Usage: scripts/bench-footprint.sh [turns-per-run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
turns=${1:-100000}
rounds=${2:-2}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# 2048 functions that differ in their constants, so that none folds into another, and a chain
# that calls the first N of them in turn.
awk 'BEGIN {
    srand(1)
    for (i = 0; i < 2048; i++) {
        a = int(rand() * 2^30) * 2 + 1; b = int(rand() * 2^30); s = 1 + int(rand() * 30)
        printf "__attribute__((noinline)) static unsigned fp_%d(unsigned x) ", i
        printf "{ x ^= x >> %d; x *= %uu; return x + %uu; }\n", s, a, b
    }
    print "unsigned fp_chain(int calls, unsigned x) {"
    for (i = 0; i < 2048; i++) printf "    if (calls > %d) x = fp_%d(x); else return x;\n", i, i
    print "    return x;\n}"
}' > "$dir/functions.c"
cc -O2 -Wall -o "$dir/footprint-floor" scripts/footprint-floor.c "$dir/functions.c"
for round in $(seq "$rounds"); do
    echo "## round $round"
    for calls in 0 128 512 2048; do
        "$dir/footprint-floor" "$calls" 0 "$turns"
    done
    for kib in 64 256 1024; do
        "$dir/footprint-floor" 0 "$kib" "$turns"
    done
done
