#!/usr/bin/env bash
# What each stretch of a write-lat turn (or a session's) costs in time on the client's polling
# thread (issue 26, item 1: name each microsecond of a round trip before cutting it). ferroce
# is built with the `turn-steps` feature (crates/ferroce/src/steps.rs), which marks, with a
# clock read each, where a receive took datagrams, each packet was handled and built, a poll
# returned a completion, the tool saw its peer's bytes, the post began and queued its request,
# and the send call was entered and left. `perf write-lat -s 8` runs ROUNDS times between
# 127.0.0.2 and 127.0.0.3 (with MODE `session`, `perf session-lat -s 64`, Catalyst's session,
# as bench-session.sh runs it); for each run the client's turns (from the receive that takes
# the peer's answer to the next) that follow the run's most common sequence of marks give a
# median per stretch.
#
# Each stretch includes one mark's clock read (about 30 ns here), so the stretches add up to
# more than an unmarked turn; the send call's stretch is the kernel's (on loopback the sender's
# call carries the datagram through the receiving socket's queue). After each round the same
# turn without RDMA runs for comparison (scripts/recv-floor.c: `gso` sends write-lat's WRITE
# and ACK as one GSO send and receives as ferroce does, `sock` as sockperf --nonblocked), each
# with its answer call timed. bench-turn-instructions.sh counts the path's instructions.
# Needs: python3, a C compiler and liburing (apt-get install liburing-dev).
# Usage: scripts/bench-turn-steps.sh [ITERATIONS] [ROUNDS] [write-lat|session]
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-50000}
rounds=${2:-3}
mode=${3:-write-lat}
# The tool and its arguments, the same for both sides (the session's on a port of its own).
case $mode in
    write-lat) tool=(perf write-lat) size=8 ;;
    session) tool=(perf session-lat -p 19541) size=64 ;;
    *) echo "usage: $0 [ITERATIONS] [ROUNDS] [write-lat|session]" >&2; exit 2 ;;
esac
CARGO_TARGET_DIR=target/turn-steps cargo build -q --release -p ferroce-cli --features turn-steps
bin=target/turn-steps/release/ferroce
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O2 -Wall -o "$work/recv-floor" scripts/recv-floor.c -luring

for round in $(seq "$rounds"); do
    "$bin" "${tool[@]}" --local 127.0.0.2 -s "$size" -n "$iters" > /dev/null 2>&1 &
    server=$!
    sleep 0.3
    FERROCE_TURN_STEPS="$work/client.$round" "$bin" "${tool[@]}" --local 127.0.0.3 \
        -s "$size" -n "$iters" 127.0.0.2 > "$work/out.$round"
    wait "$server"
    awk -v s="$size" '$1 == s { print "round '"$round"': '"$mode"' typical " $5 " us"; exit }' \
        "$work/out.$round"
    for floor in gso sock; do
        timeout 120 "$work/recv-floor" pingpong "$floor" "$iters"
    done
done

python3 - "$work" "$rounds" <<'EOF'
import collections
import statistics
import sys

work, rounds = sys.argv[1], int(sys.argv[2])
per_round = []
for r in range(1, rounds + 1):
    marks = [(s, int(t)) for s, t in (line.split() for line in open(f"{work}/client.{r}"))]
    marks = marks[len(marks) // 10:]  # the first tenth: start-up and the first turns
    # A turn: from a receive that took datagrams to the next. Its critical path is its marks
    # up to the end of the post that answers; the looks after it are the wait for the peer.
    turns, cur = [], None
    for step, at in marks:
        if step == "received":
            if cur:
                turns.append(cur)
            cur = []
        if cur is not None:
            cur.append((step, at))
    paths = []
    for k, turn in enumerate(turns[:-1]):
        path = []
        for step, at in turn:
            path.append((step, at))
            if step == "returned":
                break
        if path[-1][0] != "returned":
            continue
        waited = turns[k + 1][0][1] - path[-1][1]
        looks = sum(1 for s, _ in turn[len(path):] if s == "look")
        paths.append((tuple(s for s, _ in path), path, waited, looks))
    common, count = collections.Counter(p[0] for p in paths).most_common(1)[0]
    chosen = [p for p in paths if p[0] == common]
    stretches = [
        statistics.median(p[1][i + 1][1] - p[1][i][1] for p in chosen)
        for i in range(len(common) - 1)
    ]
    waited = statistics.median(p[2] for p in chosen)
    looks = statistics.median(p[3] for p in chosen)
    per_round.append((common, stretches, waited, looks, count / len(paths)))

common = per_round[0][0]
same = [r for r in per_round if r[0] == common]
print(f"\nmarks of the most common turn ({len(same)} of {rounds} rounds agree; turns that "
      f"follow it: {', '.join(f'{r[4]:.0%}' for r in per_round)})")
print("| from | to | median ns, each round |")
print("|---|---|---|")
for i in range(len(common) - 1):
    cells = ", ".join(f"{r[1][i]:,.0f}" for r in same)
    print(f"| {common[i]} | {common[i + 1]} | {cells} |")
path = [sum(r[1]) for r in same]
send = [r[1][common.index("sending")] for r in same] if "sending" in common else []
print(f"| received | returned (the turn's own path) | {', '.join(f'{x:,.0f}' for x in path)} |")
if send:
    own = [p - s for p, s in zip(path, send)]
    print(f"| | of which the send call | {', '.join(f'{x:,.0f}' for x in send)} |")
    print(f"| | of which ferroce and the program (tool or face) | {', '.join(f'{x:,.0f}' for x in own)} |")
print(f"| returned | next received (the peer's turn and the wire) | "
      f"{', '.join(f'{r[2]:,.0f}' for r in same)} |")
print(f"\nlooks at the socket while waiting, median a turn: "
      f"{', '.join(f'{r[3]:.0f}' for r in same)}")
EOF
