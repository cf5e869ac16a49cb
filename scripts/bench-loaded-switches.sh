#!/usr/bin/env bash
# What takes the CPU from a busy-polling ping-pong on a loaded host (issue 26's tail latency):
# `ferroce perf write-lat -s 8 -n ITERS` and sockperf's busy-polled UDP ping-pong, each beside
# two CPU-bound shell loops (one per core of a two-core machine, standing in for a build), the
# whole machine recorded with `perf record -a -e sched:sched_switch`. Per round trip, for the
# client's polling thread: how often it lost its core to its own NIC's progress thread and to
# anything else (the server, the loops), and how often it then stayed off its core for 100 us
# or more, each such absence a round trip that waits; and how often the client's progress
# thread went to sleep (each sleep follows a wake-up). Beside the median and 99th percentile.
# Needs: perf (linux-perf), sockperf, a release build (cargo build --release -p ferroce-cli).
# Usage: [FERROCE_BIN=path] [HOGS=n] scripts/bench-loaded-switches.sh [ITERS] [ROUNDS]
#        defaults: the release build, 2 loops (0 for a quiet host), 50000 round trips, 2 rounds
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
for _ in $(seq "${HOGS:-2}"); do
    sh -c 'while :; do :; done' &
    hogs+=($!)
done
sleep 0.5

# While client PID runs, under perf: its threads, "TID NAME" lines, into $work/tasks.
record_while() {
    : > "$work/tasks"
    perf record -q -a -o "$work/sched.data" -e sched:sched_switch -- sh -c '
        while kill -0 "$1" 2>/dev/null; do
            for t in /proc/"$1"/task/*; do echo "${t##*/} $(cat "$t/comm" 2>/dev/null)"; done >> "$2"
            sleep 0.05
        done' sh "$1" "$work/tasks"
}

# The switches of client process PID (its main thread is its polling thread), per round trip:
# count PID ROUND-TRIPS.
count() {
    # Its progress thread is named "ferroce ADDRESS".
    local progress
    progress=$(awk 'NF >= 3 && $2 == "ferroce" { print $1 }' "$work/tasks" | sort -u | tr '\n' ' ')
    perf script -i "$work/sched.data" -F time,trace 2>/dev/null | awk -v pid="$1" -v n="$2" -v progress="$progress" '
        BEGIN { split(progress, p, " "); for (i in p) own[p[i]] = 1 }
        match($0, /prev_comm=.* prev_pid=/) {
            t = $1; sub(/:$/, "", t)
            split(substr($0, RSTART), f, / prev_pid=| prev_prio=| prev_state=| ==> next_comm=| next_pid=| next_prio=/)
            from = f[2]; state = f[4]; to = f[6]
            if ((from in own) && state == "S") sleeps++
            if (from == pid && state ~ /^R/) { lost[to]++; off = t }
            if (to == pid && off != "") { if (t - off >= 0.0001) long++; off = "" }
        }
        END {
            for (t in lost) if (t in own) mine += lost[t]; else other += lost[t]
            printf "lost to own progress thread %.4f, to others %.4f, for 100 us or more %.4f, progress thread sleeps %.4f", mine / n, other / n, long / n, sleeps / n
        }'
}

for round in $(seq "$rounds"); do
    "$bin" perf write-lat --local 127.0.7.44 -s 8 -n "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 0.3
    "$bin" perf write-lat --local 127.0.7.45 -s 8 -n "$iters" 127.0.7.44 > "$work/out" 2>&1 &
    client=$!
    record_while "$client"
    wait "$client" || true
    wait "$server" || true
    echo "round $round ferroce write-lat: $(awk '$1 == 8 && NF >= 8 { printf "p50 %s p99 %s us", $5, $8; exit }' "$work/out"); per round trip: $(count "$client" "$iters")"

    sockperf server --nonblocked -i 127.0.7.46 -p 11113 > /dev/null 2>&1 &
    server=$!
    sleep 0.3
    sockperf ping-pong --nonblocked -i 127.0.7.46 -p 11113 -m 16 -t 1 > "$work/out" 2>&1 &
    client=$!
    record_while "$client"
    wait "$client" || true
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    n=$(sed -n 's/.*Total Run.*ReceivedMessages=\([0-9]*\).*/\1/p' "$work/out")
    echo "round $round sockperf ping-pong: $(awk '/percentile 50.000/ { a = $NF } /percentile 99.000/ { b = $NF } END { printf "p50 %s p99 %s us", a, b }' "$work/out"); per round trip: $(count "$client" "${n:-1}")"
done
