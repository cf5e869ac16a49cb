#!/usr/bin/env bash
# Measures the soft NIC beside the alternatives, in one run on this machine, and prints the
# table BENCHMARKS.md keeps: ferroce perf against iperf3 (TCP), sockperf (UDP ping-pong) and
# ucx_perftest over TCP. Everything runs on loopback addresses 127.0.0.2 (server) and
# 127.0.0.3 (client). Needs: iperf3 sockperf ucx-utils (apt-get install iperf3 sockperf
# ucx-utils). Usage: scripts/bench-softnic.sh [seconds-per-alternative]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
cargo build --release -q -p ferroce-cli
ferroce=./target/release/ferroce
for tool in iperf3 sockperf ucx_perftest; do
    command -v $tool >/dev/null || { echo "bench: $tool is missing (apt-get install iperf3 sockperf ucx-utils)" >&2; exit 1; }
done

# One ferroce perf run: server in the background, client in front; prints the client's output.
perf() {
    local test=$1; shift
    $ferroce perf "$test" --local 127.0.0.2 "$@" > /dev/null 2>&1 &
    local server=$!
    sleep 0.5
    $ferroce perf "$test" --local 127.0.0.3 "$@" 127.0.0.2
    wait $server
}
# The result line of a perftest table: the first line that starts with the size.
result() { awk -v s="$1" '$1 == s { print; exit }'; }

echo "## ferroce perf (soft NIC, polling on the caller's thread)"
declare -A bw
for size in 4096 65536 1048576; do
    n=$(( size >= 1048576 ? 300 : (size >= 65536 ? 3000 : 30000) ))
    line=$(perf write-bw -s $size -n $n | result $size)
    bw[$size]=$(echo "$line" | awk '{print $4}')
    echo "write-bw $size B: $line"
done
line=$(perf write-bw -s 64 -n 200000 | result 64)
rate64=$(echo "$line" | awk '{print $5}')
echo "write-bw 64 B: $line"
wl=$(perf write-lat -s 8 -n 20000 | result 8); echo "write-lat 8 B: $wl"
sl=$(perf send-lat -s 8 -n 20000 | result 8); echo "send-lat 8 B: $sl"

echo "## iperf3 (TCP, one stream, ${secs} s)"
iperf3 -s -B 127.0.0.2 -p 5201 -1 > /dev/null 2>&1 &
sleep 0.5
tcp=$(iperf3 -c 127.0.0.2 -B 127.0.0.3 -p 5201 -t "$secs" -J | python3 -c "import json,sys; print('%.1f' % (json.load(sys.stdin)['end']['sum_received']['bits_per_second'] / 8e6))")
wait
echo "TCP: $tcp MB/s"

echo "## sockperf ping-pong (UDP, 16 B, ${secs} s; half round trip; both ends busy-polling, as ferroce's tools do)"
sockperf server -i 127.0.0.2 -p 11111 --nonblocked > /dev/null 2>&1 &
sp_server=$!
sleep 0.5
sp=$(sockperf ping-pong -i 127.0.0.2 -p 11111 -m 16 -t "$secs" --nonblocked 2>&1)
kill $sp_server 2>/dev/null || true
wait $sp_server 2>/dev/null || true
udp50=$(echo "$sp" | awk '/percentile 50.000/ {print $NF}')
udp99=$(echo "$sp" | awk '/percentile 99.000/ {print $NF}')
echo "UDP ping-pong: median $udp50 us, p99 $udp99 us"

echo "## ucx_perftest ucp_put_bw over TCP (64 B)"
UCX_TLS=tcp,self UCX_NET_DEVICES=lo ucx_perftest -p 13337 > /dev/null 2>&1 &
sleep 1
ucx=$(UCX_TLS=tcp,self UCX_NET_DEVICES=lo ucx_perftest 127.0.0.2 -p 13337 -t ucp_put_bw -s 64 -n 500000 2>&1 | awk '/^Final:/ {print $NF}')
wait
echo "UCX 64 B put: $ucx msg/s"

echo
echo "| measure | ferroce | alternative | ratio |"
echo "|---|---:|---:|---:|"
for size in 4096 65536 1048576; do
    echo "| write bandwidth, $size B (MB/s) vs TCP | ${bw[$size]} | $tcp | $(python3 -c "print('%.2f' % (${bw[$size]} / $tcp))") |"
done
wl50=$(echo "$wl" | awk '{print $5}'); wl99=$(echo "$wl" | awk '{print $8}')
sl50=$(echo "$sl" | awk '{print $5}'); sl99=$(echo "$sl" | awk '{print $8}')
echo "| 8 B write latency, median (us) vs busy-polled UDP half round trip | $wl50 | $udp50 | $(python3 -c "print('%.2f' % ($wl50 / $udp50))") |"
echo "| 8 B write latency, p99 (us) | $wl99 | $udp99 | $(python3 -c "print('%.2f' % ($wl99 / $udp99))") |"
echo "| 8 B send latency, median (us) | $sl50 | $udp50 | $(python3 -c "print('%.2f' % ($sl50 / $udp50))") |"
echo "| 8 B send latency, p99 (us) | $sl99 | $udp99 | $(python3 -c "print('%.2f' % ($sl99 / $udp99))") |"
echo "| 64 B message rate (M/s) vs UCX put over TCP | $rate64 | $(python3 -c "print('%.3f' % ($ucx / 1e6))") | $(python3 -c "print('%.2f' % ($rate64 * 1e6 / $ucx))") |"
