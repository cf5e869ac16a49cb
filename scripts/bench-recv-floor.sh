#!/usr/bin/env bash
# The floors under a busy-polled receive on this host, without ferroce (scripts/recv-floor.c):
# what one look at an empty socket costs by system call, what a write-lat turn's GSO send and
# its receive cost by each pair of calls (on one thread), and a UDP ping-pong's half round
# trip when each end waits by recvfrom (sockperf's way), by recvmmsg (ferroce's until the
# data path's twenty-seventh step), by recvmsg with address and control buffer (ferroce's
# since), or on an io_uring completion queue in memory, with and without the interrupt that
# brings the kernel's task work to a spinning thread. Modes alternate, so the host's drift
# hits all.
# Needs: a C compiler and liburing (apt-get install liburing-dev).
# Usage: scripts/bench-recv-floor.sh [round-trips-per-run] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30000}
rounds=${2:-3}
[ -e /usr/include/liburing.h ] || { echo "bench: liburing is missing (apt-get install liburing-dev)" >&2; exit 1; }
bin=$(mktemp)
trap 'rm -f "$bin"' EXIT
cc -O2 -Wall -o "$bin" scripts/recv-floor.c -luring
"$bin" empty 200000
"$bin" turn 200000
for round in $(seq "$rounds"); do
    echo "## round $round"
    for mode in sock mmsg msg uring uring-coop uring-defer; do
        timeout 120 "$bin" pingpong $mode "$n"
    done
done
