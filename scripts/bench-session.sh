#!/usr/bin/env bash
# Measures the request/reply session (Catalyst's `TransportSession`) beside a UDP and a TCP
# ping-pong, in one run on this machine, and prints the table BENCHMARKS.md keeps: `ferroce perf
# session-lat` (controller against an echoing coprocessor) against sockperf ping-pong over UDP and
# over TCP, at 64 B and 4 KiB. Every figure is half a round trip, as perftest and sockperf report
# it. Everything runs on loopback, server 127.0.0.62, client 127.0.0.63.
# Then, because this host changes pace every few minutes, ROUNDS rounds (default 5) of a
# busy-polled sockperf run, a 64 B session run and another sockperf run, and the median of the
# rounds' ratios, each session run against the mean of the two sockperf runs around it.
# Needs: sockperf (apt-get install sockperf).
# Usage: [ROUNDS=n] scripts/bench-session.sh [iterations] [seconds-per-sockperf-run] [mtu]
# Without an MTU, the NIC's active MTU (4096 on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-20000}
secs=${2:-5}
mtu=${3:-}
rounds=${ROUNDS:-5}
mtu_flag=${mtu:+-m $mtu}
cargo build --release -q -p ferroce-cli
ferroce=./target/release/ferroce
command -v sockperf >/dev/null || { echo "bench: sockperf is missing (apt-get install sockperf)" >&2; exit 1; }

# One session-lat run: server in the background, client in front; prints the client's table.
session() {
    local size=$1
    $ferroce perf session-lat --local 127.0.0.62 -p 19539 -s "$size" $mtu_flag > /dev/null 2>&1 &
    local server=$!
    $ferroce perf session-lat --local 127.0.0.63 -p 19539 -s "$size" -n "$iters" $mtu_flag 127.0.0.62
    wait $server
}
# One sockperf ping-pong: prints "median p99 p99.9" (half round trips, µs).
sockperf_pp() {
    local size=$1; shift
    sockperf server -i 127.0.0.62 -p 11119 "$@" > /dev/null 2>&1 &
    local server=$!
    sleep 0.5
    local out
    out=$(sockperf ping-pong -i 127.0.0.62 -p 11119 -m "$size" -t "$secs" "$@" 2>&1)
    kill $server 2>/dev/null || true
    wait $server 2>/dev/null || true
    echo "$out" | awk '/percentile 50.000/ {m=$NF} /percentile 99.000/ {p=$NF} /percentile 99.900/ {q=$NF} END {print m, p, q}'
}

declare -A ses udp busy tcp rtt
for size in 64 4096; do
    out=$(session $size)
    echo "$out" | tail -4
    # t_typical, 99%, 99.9% columns of the result line.
    ses[$size]=$(echo "$out" | awk -v s=$size '$1 == s { print $5, $8, $9; exit }')
    rtt[$size]=$(echo "$out" | awk '/last_rtt_ns/ {print $3, $NF}')
    udp[$size]=$(sockperf_pp $size)
    # Both ends busy-polling, as ferroce's tools do.
    busy[$size]=$(sockperf_pp $size --nonblocked)
    tcp[$size]=$(sockperf_pp $size --tcp)
    echo "size $size: session ${ses[$size]} | UDP ${udp[$size]} | UDP busy-polled ${busy[$size]} | TCP ${tcp[$size]} | last_rtt_ns ${rtt[$size]}"
done

echo
echo "| size | measure (µs, half round trip) | session | UDP ping-pong | UDP, busy-polled | TCP ping-pong | session / UDP | session / busy-polled UDP |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
for size in 64 4096; do
    read -r s50 s99 s999 <<< "${ses[$size]}"
    read -r u50 u99 u999 <<< "${udp[$size]}"
    read -r b50 b99 b999 <<< "${busy[$size]}"
    read -r t50 t99 t999 <<< "${tcp[$size]}"
    for row in "median $s50 $u50 $b50 $t50" "p99 $s99 $u99 $b99 $t99" "p99.9 $s999 $u999 $b999 $t999"; do
        read -r name s u b t <<< "$row"
        echo "| $size B | $name | $s | $u | $b | $t | $(python3 -c "print('%.2f' % ($s / $u))") | $(python3 -c "print('%.2f' % ($s / $b))") |"
    done
done

echo
ratios=""
for round in $(seq "$rounds"); do
    read -r before _ <<< "$(sockperf_pp 64 --nonblocked)"
    read -r s50 _ <<< "$(session 64 | awk '$1 == 64 { print $5; exit }')"
    read -r after _ <<< "$(sockperf_pp 64 --nonblocked)"
    ratio=$(python3 -c "print('%.2f' % ($s50 / (($before + $after) / 2)))")
    echo "round $round: busy-polled UDP $before, session $s50, busy-polled UDP $after: ${ratio}x"
    ratios="$ratios $ratio"
done
echo "64 B session median / busy-polled UDP median, paired, median of $rounds rounds:" \
    "$(python3 -c "import statistics, sys; print('%.2f' % statistics.median(map(float, sys.argv[1:])))" $ratios)x"
