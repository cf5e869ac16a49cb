#!/usr/bin/env bash
# What takes the CPU from a busy-polling ping-pong on a loaded host (issue 26's tail latency):
# `ferroce perf write-lat -s 8 -n ITERS` and sockperf's busy-polled UDP ping-pong, each beside
# two CPU-bound shell loops (one per core of a two-core machine, standing in for a build), the
# client recorded with `perf record -e sched:sched_switch`. Per round trip: how often the
# client's polling thread lost its core to its own NIC's progress thread and to anything else
# (a loop's time slice, mostly), how often it then stayed off its core for 100 us or more, and
# how often the progress thread went to sleep (each sleep follows a wake-up); beside the median
# and 99th percentile. Each lost core is a round trip
# that waits for the thread to be scheduled again, a time slice when another task took it.
# Needs: perf (linux-perf), sockperf, a release build (cargo build --release -p ferroce-cli).
# Usage: [FERROCE_BIN=path] scripts/bench-loaded-switches.sh [ITERS] [ROUNDS]   defaults 50000, 2
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-50000}
rounds=${2:-2}
bin=${FERROCE_BIN:-target/release/ferroce}
work=$(mktemp -d)
hogs=()
stop() {
    for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap stop EXIT
for _ in 1 2; do
    sh -c 'while :; do :; done' &
    hogs+=($!)
done
sleep 0.5

# The recorded client's switches, per round trip: count ROUND-TRIPS.
count() {
    perf script -i "$work/sched.data" -F pid,tid,time,trace 2>/dev/null | awk -v n="$1" '
        match($0, /prev_comm=.* prev_pid=/) {
            pid = $1; sub(/\/.*/, "", pid)
            t = $2; sub(/:$/, "", t)
            split(substr($0, RSTART), f, / prev_pid=| prev_prio=| prev_state=| ==> next_comm=| next_pid=| next_prio=/)
            comm = substr(f[1], 11); from = f[2]; state = f[4]; to = f[6]
            if (comm ~ /^ferroce 127/) progress[from] = 1
            if (state == "S" && comm ~ /^ferroce 127/) sleeps++
            if (from == pid && state ~ /^R/) { lost[to]++; off = t }
            if (to == pid && off != "") { if (t - off >= 0.0001) long++; off = "" }
        }
        END {
            for (t in lost) if (t in progress) own += lost[t]; else other += lost[t]
            printf "lost to own progress thread %.4f, to others %.4f, for 100 us or more %.4f, progress thread sleeps %.4f", own / n, other / n, long / n, sleeps / n
        }'
}

for round in $(seq "$rounds"); do
    "$bin" perf write-lat --local 127.0.7.44 -s 8 -n "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 0.3
    out=$(perf record -q -o "$work/sched.data" -e sched:sched_switch -- \
        "$bin" perf write-lat --local 127.0.7.45 -s 8 -n "$iters" 127.0.7.44 2>&1)
    wait "$server" || true
    echo "round $round ferroce write-lat: $(awk '$1 == 8 && NF >= 8 { printf "p50 %s p99 %s us", $5, $8; exit }' <<<"$out"); per round trip: $(count "$iters")"

    sockperf server --nonblocked -i 127.0.7.46 -p 11113 > /dev/null 2>&1 &
    server=$!
    sleep 0.3
    out=$(perf record -q -o "$work/sched.data" -e sched:sched_switch -- \
        sockperf ping-pong --nonblocked -i 127.0.7.46 -p 11113 -m 16 -t 1 2>&1)
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    n=$(sed -n 's/.*Total \([0-9]*\) observations.*/\1/p' <<<"$out")
    echo "round $round sockperf ping-pong: $(awk '/percentile 50.000/ { a = $NF } /percentile 99.000/ { b = $NF } END { printf "p50 %s p99 %s us", a, b }' <<<"$out"); per round trip: $(count "${n:-1}")"
done
