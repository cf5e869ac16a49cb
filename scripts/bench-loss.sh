#!/usr/bin/env bash
# What losses cost (issue 26, items 6 and 7): `ferroce perf` pairs with both ends injecting
# the same faults on every packet they send (--fault, default loss=0.02,reorder=0.02,dup=0.01),
# ping-pongs of multi-packet messages, a READ ping-pong, two checked streams and the session
# (Catalyst's, the polling mode: every reply's bytes checked). For each run:
# the client's wall time from its start to both ends' exit, and from its --stats the sequence
# NAKs it received, its retries (a retry beyond the NAKs is an ACK timeout), its early resends
# and those it found needless. Every stream run checks every byte (--check).
#
#   scripts/bench-loss.sh [ROUNDS]                 default 3
#   FERROCE_BASE=/path/to/older/ferroce scripts/bench-loss.sh   alternates with that build
#   FAULT=loss=0.05 scripts/bench-loss.sh          other faults
#
# Server on 127.0.0.2, client on 127.0.0.3; nothing leaves loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
fault="${FAULT:-loss=0.02,reorder=0.02,dup=0.01}"
cargo build --release -q -p ferroce-cli
builds=("new:$PWD/target/release/ferroce")
[[ -n "${FERROCE_BASE:-}" ]] && builds=("base:$FERROCE_BASE" "${builds[@]}")
work="$(mktemp -d "${TMPDIR:-/tmp}/ferroce-loss.XXXXXX")"
trap 'rm -rf "$work"' EXIT

tests=(
    "write-lat -s 4096 --mtu 1024 -n 2000"
    "send-lat -s 4096 --mtu 1024 -n 2000"
    "write-lat -s 16384 --mtu 1024 -n 1000"
    "read-lat -s 64 -n 2000"
    "write-bw -s 65536 -n 2000 --check"
    "send-bw -s 16384 --mtu 1024 -n 4000 --check"
    "session-lat -s 64 -n 2000"
    "session-lat -s 4096 --mtu 1024 -n 2000"
)

counter() { grep -o "$1 [0-9]*" "$2" | awk '{print $2}'; }

echo "faults: $fault"
echo "| build | test | round | seconds | seq NAKs | retries | early resends | needless |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for round in $(seq "$rounds"); do
    for build in "${builds[@]}"; do
        name="${build%%:*}" bin="${build#*:}"
        for t in "${tests[@]}"; do
            # A build from before a test took --fault has no row for it.
            if ! "$bin" perf ${t%% *} --help | grep -q -- --fault; then
                printf '| %s | %s | %d | (no --fault) | | | | |\n' "$name" "$t" "$round"
                continue
            fi
            # shellcheck disable=SC2086
            "$bin" perf $t --local 127.0.0.2 --fault "$fault" --stats >"$work/server" 2>&1 &
            server=$!
            sleep 0.3
            start=$(date +%s.%N)
            rc=0
            # shellcheck disable=SC2086
            "$bin" perf $t --local 127.0.0.3 --fault "$fault" --stats 127.0.0.2 >"$work/client" 2>&1 || rc=$?
            wait "$server" || rc=$?
            end=$(date +%s.%N)
            [ "$rc" -eq 0 ] || { cat "$work/server" "$work/client" >&2; echo "bench-loss: $t failed" >&2; exit 1; }
            c="$work/client"
            printf '| %s | %s | %d | %.2f | %s | %s | %s | %s |\n' "$name" "$t" "$round" \
                "$(echo "$end - $start" | bc)" "$(counter rcvd_seq_err "$c")" \
                "$(counter completer_retry_err "$c")" "$(counter early_resends "$c")" \
                "$(counter early_needless "$c")"
        done
    done
done
