#!/usr/bin/env bash
# Early resends on a quiet and on a loaded machine (issue 26, item 6): `ferroce perf write-lat
# -s 8 -n ITERS --stats` both ways, counting what each side's requester resent early
# (`early_resends`), what it found needless (`early_needless`), what it put off because the peer
# had not read its socket (`early_put_off`; builds before it print 0) and the duplicates and
# stale answers the peers saw, beside its latency and sockperf's (UDP ping-pong, both ends
# busy-polling) in the same minutes. "Loaded" is two CPU-bound shell loops, one per core of a
# two-core machine, standing in for a cargo build: reproducible where a build is not.
#
#   scripts/bench-resends.sh [ITERS] [ROUNDS]      defaults 50000 and 3
#   FERROCE_BASE=/path/to/older/ferroce scripts/bench-resends.sh   adds that build's rows
#   LOADS=loaded scripts/bench-resends.sh          only one of the two (default: quiet loaded)
#
# Needs sockperf (apt-get install sockperf) and a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
iters="${1:-50000}"
rounds="${2:-3}"
command -v sockperf >/dev/null || { echo "bench-resends: sockperf is missing (apt-get install sockperf)" >&2; exit 1; }
cargo build --release -q -p ferroce-cli
new="$PWD/target/release/ferroce"
builds=("new:$new")
[[ -n "${FERROCE_BASE:-}" ]] && builds+=("base:$FERROCE_BASE")

work="$(mktemp -d "${TMPDIR:-/tmp}/ferroce-resends.XXXXXX")"
hogs=()
stop_hogs() {
    for pid in "${hogs[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${hogs[@]}"; do wait "$pid" 2>/dev/null || true; done
    hogs=()
}
trap 'stop_hogs; rm -rf "$work"' EXIT

counter() { grep -o "$1 [0-9]*" "$2" | head -1 | awk '{print $2}'; }
counter0() { local v; v="$(counter "$1" "$2")"; echo "${v:-0}"; }

# One write-lat pair; prints: p50 p99 early needless put-off dups stale (both sides summed).
write_lat() {
    local bin="$1" tag="$2"
    "$bin" perf write-lat --local 127.0.7.40 -s 8 -n "$iters" --stats >"$work/$tag.srv" 2>&1 &
    local server=$!
    sleep 0.5
    "$bin" perf write-lat --local 127.0.7.41 -s 8 -n "$iters" --stats 127.0.7.40 >"$work/$tag.cli" 2>&1
    wait "$server"
    local line e=0 n=0 o=0 d=0 s=0
    line="$(awk '$1 == 8 && NF >= 9 {print $5, $8}' "$work/$tag.cli")"
    for side in cli srv; do
        e=$((e + $(counter early_resends "$work/$tag.$side")))
        n=$((n + $(counter early_needless "$work/$tag.$side")))
        o=$((o + $(counter0 early_put_off "$work/$tag.$side")))
        d=$((d + $(counter duplicate_request "$work/$tag.$side")))
        s=$((s + $(counter stale_response "$work/$tag.$side")))
    done
    echo "$line $e $n $o $d $s"
}

# sockperf's p50 and p99 (half round trips, µs) over 5 s.
sockperf_lat() {
    sockperf server -i 127.0.7.42 -p 11112 --nonblocked >/dev/null 2>&1 &
    local server=$!
    sleep 0.5
    local out
    out="$(sockperf ping-pong -i 127.0.7.42 -p 11112 -m 16 -t 5 --nonblocked 2>&1)"
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    echo "$(echo "$out" | awk '/percentile 50.000/ {print $NF}') $(echo "$out" | awk '/percentile 99.000/ {print $NF}')"
}

echo "| load | build | round | write-lat p50 / p99 µs | sockperf p50 / p99 µs | p99 ratio | early resends | found needless | put off | duplicates | stale answers |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for load in ${LOADS:-quiet loaded}; do
    if [[ $load == loaded ]]; then
        for _ in 1 2; do
            sh -c 'while :; do :; done' &
            hogs+=($!)
        done
    fi
    for round in $(seq 1 "$rounds"); do
        for build in "${builds[@]}"; do
            name="${build%%:*}"
            read -r p50 p99 e n o d s <<<"$(write_lat "${build#*:}" "$load-$name-$round")"
            read -r u50 u99 <<<"$(sockperf_lat)"
            ratio="$(awk -v a="$p99" -v b="$u99" 'BEGIN {printf "%.1f", a / b}')"
            echo "| $load | $name | $round | $p50 / $p99 | $u50 / $u99 | $ratio | $e | $n | $o | $d | $s |"
        done
    done
    stop_hogs
done
