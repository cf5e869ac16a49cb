#!/usr/bin/env bash
# Counts the UDP datagrams the kernel is handed per 4 KiB of RDMA WRITE payload, with and
# without GSO: `ferroce perf write-bw` between 127.0.0.2 and 127.0.0.3 inside a private network
# namespace, so that /proc/net/snmp's Udp OutDatagrams counts only ferroce's sends (one per
# plain datagram, one per GSO send). Both sides' sends are counted, ACKs included.
# Needs root (ip netns). Usage: scripts/bench-datagrams.sh [message-size] [iterations]
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1048576}
iters=${2:-300}
cargo build --release -q -p ferroce-cli
f=$PWD/target/release/ferroce
ns=ferroce-dgrams-$$
ip netns add $ns
trap 'ip netns del $ns' EXIT
ip -n $ns link set lo up
out_datagrams() { ip netns exec $ns awk '/^Udp: [0-9]/ {print $5}' /proc/net/snmp; }
for mode in "" --no-gso; do
    before=$(out_datagrams)
    ip netns exec $ns $f perf write-bw --local 127.0.0.2 -s $size -n $iters $mode > /dev/null &
    server=$!
    sleep 0.5
    ip netns exec $ns $f perf write-bw --local 127.0.0.3 -s $size -n $iters $mode 127.0.0.2 > /dev/null
    wait $server
    after=$(out_datagrams)
    python3 -c "
d = $after - $before; units = $size * $iters / 4096
print(f'write-bw -s $size -n $iters ${mode:-(GSO on)}: {d} datagrams for {units:.0f} x 4 KiB = {d / units:.3f} per 4 KiB')"
done
