#!/usr/bin/env bash
# 4K frames through one or more ferroce builds, alternating, the same minutes: per round and
# build, `stream send` asked for FPS paces FRAMES frames of 4K RAW12 (12,441,600 bytes, 4
# pages, queue 2) to `stream recv`, which checks every frame's CRC (RECV_FLAGS=--no-check
# leaves the check out). Prints what the receiver delivered (fps, frames dropped, its CPU
# seconds) and what the sender managed (fps, and its CPU seconds where /usr/bin/time is there).
# Addresses 127.0.0.30 (receiver) and 127.0.0.31 (device), as scripts/bench-frames.sh.
# Usage: scripts/bench-frames-ab.sh ROUNDS FPS FRAMES BINARY [BINARY...]
set -euo pipefail
rounds=$1 fps=$2 frames=$3
shift 3
time_cmd=()
[ -x /usr/bin/time ] && time_cmd=(/usr/bin/time -f "sender CPU %U+%S s")
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for round in $(seq "$rounds"); do
    for bin in "$@"; do
        "${time_cmd[@]}" "$bin" stream send --local 127.0.0.31 --fps "$fps" --frames "$frames" \
            > /dev/null 2> "$log" &
        sender=$!
        sleep 0.3
        summary=$("$bin" stream recv --local 127.0.0.30 --device 127.0.0.31 --mtu 9000 \
            --frame-size 12441600 --pages 4 --queue 2 --frames "$frames" --idle 3 --json \
            ${RECV_FLAGS:-} | tail -1)
        wait $sender
        recv=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(f\"{d['fps']} fps, {d['dropped']} dropped, receiver CPU {d['cpu_seconds']} s\")" "$summary")
        sent=$(grep -o '([0-9.]* fps' "$log" | tr -d '(' || true)
        cpu=$(grep -o 'sender CPU .*' "$log" || true)
        echo "round $round $bin: $recv; sender $sent${cpu:+, $cpu}"
    done
done
