#!/usr/bin/env bash
# A fresh responder's first answer on loopback (issue 26, item 3): `ferroce perf read-lat -s 64
# -n 300` between 127.0.7.30 (server) and 127.0.7.31, captured on lo with tcpdump; for each
# request, the time until the server's next packet. Prints the first request's answer time
# beside the median, per run. The QEMU guests' version of this is
# `python3 interop/suite.py responder`.
#
#   scripts/bench-first-answer.sh [RUNS] [BINARY]     defaults 3 and target/release/ferroce
#
# Needs root (tcpdump on lo), tcpdump and tshark.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
bin="${2:-$PWD/target/release/ferroce}"
[[ $# -ge 2 ]] || cargo build --release -q -p ferroce-cli
work="$(mktemp -d "${TMPDIR:-/tmp}/ferroce-first.XXXXXX")"
trap 'rm -rf "$work"' EXIT

for run in $(seq "$runs"); do
    tcpdump -Z root -i lo -n -s 200 -U -w "$work/cap.pcap" 'udp port 4791 and host 127.0.7.30' \
        >"$work/tcpdump.log" 2>&1 &
    dump=$!
    for _ in $(seq 50); do grep -q listening "$work/tcpdump.log" && break; sleep 0.1; done
    "$bin" perf read-lat --local 127.0.7.30 -s 64 -n 300 >"$work/server.log" 2>&1 &
    server=$!
    sleep 0.5
    "$bin" perf read-lat --local 127.0.7.31 -s 64 -n 300 127.0.7.30 >"$work/client.log" 2>&1
    wait "$server"
    sleep 0.3
    kill "$dump"
    wait "$dump" 2>/dev/null || true
    tshark -r "$work/cap.pcap" -T fields -e frame.time_epoch -e ip.src 2>/dev/null |
        python3 -c '
import statistics, sys
times, waiting = [], None
for line in sys.stdin:
    t, src = line.split()
    if src != "127.0.7.30":
        waiting = float(t) if waiting is None else waiting
    elif waiting is not None:
        times.append((float(t) - waiting) * 1e6)
        waiting = None
if not times:
    sys.exit("no answers captured")
print(f"run '"$run"': first answer {times[0]:.0f} us, median {statistics.median(times):.1f} us, "
      f"{len(times)} answers")
'
done
