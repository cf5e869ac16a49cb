#!/usr/bin/env bash
# A/B of two ferroce builds on loopback, alternating, the same minutes: write-bw at 4 KiB,
# 64 KiB and 1 MiB, the 64-byte message rate, and 8-byte write-lat and send-lat, each run as
# server on 127.0.0.2 and client on 127.0.0.3. Prints each run's result line.
# Usage: scripts/bench-ab.sh OLD-BINARY NEW-BINARY [rounds]
# (build the old one with: git worktree add /tmp/old COMMIT && cd /tmp/old &&
#  CARGO_TARGET_DIR=/tmp/old-target cargo build --release -p ferroce-cli)
set -euo pipefail
old=$1
new=$2
rounds=${3:-2}
run() {
    local bin=$1 size=$3
    "$bin" perf "$2" --local 127.0.0.2 "${@:3}" > /dev/null 2>&1 &
    local server=$!
    sleep 0.5
    "$bin" perf "$2" --local 127.0.0.3 "${@:3}" 127.0.0.2 | awk -v s="${4}" '$1 == s { print; exit }'
    wait $server
}
for round in $(seq "$rounds"); do
    for args in "write-bw -s 4096 -n 30000" "write-bw -s 65536 -n 3000" \
        "write-bw -s 1048576 -n 300" "write-bw -s 64 -n 200000" \
        "write-lat -s 8 -n 20000" "send-lat -s 8 -n 20000"; do
        read -r test flag size rest <<< "$args"
        for which in old new; do
            bin=$old
            [ $which = new ] && bin=$new
            echo "round $round $which $args: $(run "$bin" "$test" "$flag" "$size" $rest)"
        done
    done
done
