#!/usr/bin/env bash
# Measures the frame receiver (ferroce stream recv) on loopback, beside a plain UDP receive
# loop moving the same bytes (crates/ferroce-cli/examples/udp_sink.rs), in one run:
#  1. the highest rate of 4K RAW12 frames (12,441,600 bytes, 4096-byte packets) with no frame
#     dropped and no packet lost, with and without the CRC check of every frame (read where it landed);
#  2. receive-side CPU seconds per GB at 30 fps, ferroce against the UDP loop.
# Addresses 127.0.0.30-127.0.0.32. Usage: scripts/bench-frames.sh [frames-per-run]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-150}
frame=12441600
page=$(( (frame + 127) / 128 * 128 + 128 ))
cargo build --release -q -p ferroce-cli --bin ferroce --example udp_sink
f=./target/release/ferroce
sink=./target/release/examples/udp_sink

# One ferroce run at $1 fps ($2: extra recv flags); prints the receiver's summary object.
run() {
    local fps=$1; shift
    $f stream send --local 127.0.0.31 --fps "$fps" --frames "$n" > /dev/null 2>&1 &
    local sender=$!
    sleep 0.3
    $f stream recv --local 127.0.0.30 --device 127.0.0.31 --mtu 9000 --frame-size $frame \
        --pages 4 --queue 2 --frames "$n" --idle 3 --json "$@" | tail -1
    wait $sender
}
field() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d$2)" "$1"; }

echo "## Highest frame rate with nothing dropped ($n frames of $frame bytes per run)"
for mode in --no-check ""; do
    best=0
    for fps in 60 80 100 120 140 160; do
        s=$(run $fps $mode)
        frames=$(field "$s" "['frames']"); dropped=$(field "$s" "['dropped']")
        lost=$(field "$s" "['packets_lost']"); got=$(field "$s" "['fps']")
        echo "recv ${mode:-(CRC check)} at $fps fps: $frames frames, $dropped dropped, $lost packets lost, measured $got fps, $(field "$s" "['gbps']") Gb/s"
        if [ "$frames" = "$n" ] && [ "$dropped" = 0 ] && [ "$lost" = 0 ]; then best=$fps; else break; fi
    done
    echo "=> highest clean rate ${mode:-(CRC check)}: $best fps"
done

echo "## Receive-side CPU per GB at 30 fps"
s=$(run 30 --no-check)
bytes=$(( n * frame ))
fcpu=$(field "$s" "['cpu_seconds']")
echo "ferroce stream recv --no-check: $fcpu CPU s for $bytes bytes"
$sink 127.0.0.32:4791 $(( 4 * page )) 2 > /tmp/ferroce-sink.json &
sinkpid=$!
sleep 0.3
$f stream send --local 127.0.0.31 --to 127.0.0.32 --qp 1 --rkey 1 --address 0 \
    --frame-size $frame --pages 4 --mtu 9000 --fps 30 --frames "$n" > /dev/null 2>&1
wait $sinkpid
u=$(cat /tmp/ferroce-sink.json)
ucpu=$(field "$u" "['cpu_seconds']"); ubytes=$(field "$u" "['bytes']")
echo "udp_sink: $ucpu CPU s for $ubytes bytes"
python3 - "$fcpu" "$bytes" "$ucpu" "$ubytes" <<'PY'
import sys
fc, fb, uc, ub = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
f = fc / (fb / 1e9); u = uc / (ub / 1e9)
print(f"ferroce: {f:.3f} CPU s/GB; UDP loop: {u:.3f} CPU s/GB; ratio {f / u:.2f}x")
PY
