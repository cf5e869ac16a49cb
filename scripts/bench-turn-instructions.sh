#!/usr/bin/env bash
# How many instructions a write-lat round trip runs on the client's polling thread (issue 26,
# item 1), by callgrind: (a run of 12,000 round trips - a run of 2,000) / 10,000, the server
# running natively beside it.
#
# Under valgrind the client runs some 50 times slower, and the soft NIC's driver decides by the
# clock: with its own timing, an ACK held for the next reply (20 us) goes out alone, the dry
# poll's mark (10 us) lapses, and the profile is of a path the native client does not take (two
# sends a round trip instead of one GSO send of two packets). So each REV is built, in a
# scratch worktree, with the driver's timing constants multiplied by 50 (POLLER_WATCH_MAX 2 ms
# -> 100 ms), and the engine's LATE_DEPARTURE where it has one; the script checks the
# client's counters for one GSO send a round trip. The count still moves with how often the
# client polls an empty socket while it waits (runs of one build spread by 2-3 %), so each
# build runs ROUNDS times, builds alternating, and the
# median is what to compare. The parts that do the turn's work do not wait, and move less: per
# round trip, inclusive, the application's post (`Qp::post_send`: the WRITE built, sealed and
# sent with the held ACK), the two packets received (`Engine::handle_received`), and every
# packet built (`Engine::poll_transmit`), from the last round's runs.
#
# The server runs natively and unscaled, built from the working tree, the same for every REV:
# the scaled server, taking the valgrind client's round trips (0.1 ms) for its own pace too,
# napped up to 0.8 s once its polls stopped at the run's end, with the ACK of the client's last
# WRITE held, and the client ran out of retries waiting (or, given more, spun all that time
# under callgrind, a thousand instructions or more a round trip that differed run to run).
# Needs: valgrind. Usage: scripts/bench-turn-instructions.sh [ROUNDS] REV...  (REV: a commit,
# or WT for the working tree as it is)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift
[ $# -gt 0 ] || { echo "usage: $0 [ROUNDS] REV..." >&2; exit 2; }
root=$(pwd)
work=$(mktemp -d)
trees=()
stop() {
    for t in "${trees[@]}"; do git -C "$root" worktree remove --force "$t" 2>/dev/null || true; done
    rm -rf "$work"
}
trap stop EXIT

scale='s/^(const (POLLER_GRACE|LEAVES_AFTER|ANSWERS_WITHIN|LINGER_MAX|PROGRESS_SLICE|ACK_WITHIN|DRY_FOR|ACK_HOLD): Duration = Duration::from_micros)\(([0-9]+)\);/\1(\3 * 50);/; s/^(const POLLER_WATCH_MAX: Duration = Duration::from_millis)\(2\);/\1(100);/'
driver=crates/ferroce/src/backend/soft/driver.rs
late='s/^(pub const LATE_DEPARTURE: Duration = Duration::from_nanos)\(([0-9_]+)\);/\1(\2 * 50);/'
engine=crates/ferroce-proto/src/engine/mod.rs
i=0
bins=()
for rev in "$@"; do
    i=$((i + 1))
    tree="$work/tree$i"
    if [ "$rev" = WT ]; then
        mkdir -p "$tree"
        git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$tree"
    else
        git worktree add -q --detach "$tree" "$rev"
        trees+=("$tree")
    fi
    sed -i -E "$scale" "$tree/$driver"
    [ "$(grep -c ' \* 50);' "$tree/$driver")" -eq 8 ] || { echo "$rev: driver constants not found" >&2; exit 1; }
    # The engine's one clock-driven choice on this path (from 943ccdd on): whether a request
    # left late enough to re-arm its timers from its departure.
    sed -i -E "$late" "$tree/$engine"
    echo "building $rev (timing x50)..." >&2
    (cd "$tree" && CARGO_TARGET_DIR="$root/target/turn-instructions" \
        cargo build -q --release -p ferroce-cli)
    cp "$root/target/turn-instructions/release/ferroce" "$work/ferroce$i"
    bins+=("$work/ferroce$i")
done

# One run of N round trips with the client under callgrind; prints its main thread's total.
run() {
    local bin=$1 n=$2
    local out="$work/cg.$n"
    "$server_bin" perf write-lat --local 127.0.0.2 -s 8 -n "$n" > /dev/null 2>&1 &
    local server=$!
    sleep 0.5
    if ! valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" \
        "$bin" perf write-lat --local 127.0.0.3 -s 8 -n "$n" --stats 127.0.0.2 > "$work/client.$n" 2>&1; then
        echo "the client under callgrind failed:" >&2
        grep -v '^==' "$work/client.$n" | tail -3 >&2
        kill "$server" 2>/dev/null || true
        return 1
    fi
    wait "$server"
    local gso
    gso=$(grep -o 'udp_gso_sends [0-9]*' "$work/client.$n" | awk '{print $2}')
    if [ "${gso:-0}" -lt $((n * 9 / 10)) ]; then
        echo "warning: $gso GSO sends in $n round trips: not the native path" >&2
    fi
    callgrind_annotate --inclusive=yes "$out-01" 2>/dev/null > "$work/annotated.$n"
    awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}' "$work/annotated.$n"
    rm -f "$out"*
}

# Per round trip, from the last pair of runs: the inclusive count of function NAME.
part() {
    local a b
    a=$(awk -v f="$1 [" 'index($0, f) {gsub(",", "", $1); print $1; exit}' "$work/annotated.2000")
    b=$(awk -v f="$1 [" 'index($0, f) {gsub(",", "", $1); print $1; exit}' "$work/annotated.12000")
    echo $(( (${b:-0} - ${a:-0}) / 10000 ))
}

echo "building the server (working tree, native timing)..." >&2
cargo build -q --release -p ferroce-cli
server_bin="$root/target/release/ferroce"

declare -A per parts
for r in $(seq "$rounds"); do
    line="round $r:"
    for j in "${!bins[@]}"; do
        a=$(run "${bins[$j]}" 2000) || exit 1
        b=$(run "${bins[$j]}" 12000) || exit 1
        v=$(( (b - a) / 10000 ))
        per[$j]="${per[$j]:-} $v"
        line="$line ${*:$((j + 1)):1}=$v"
        parts[$j]="post $(part ferroce::qp::Qp::post_send), receive $(part ferroce_proto::engine::Engine::handle_received), build $(part ferroce_proto::engine::Engine::poll_transmit)"
    done
    echo "$line"
done
for j in "${!bins[@]}"; do
    med=$(echo "${per[$j]}" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')
    echo "${*:$((j + 1)):1}: median $med instructions a round trip (runs:${per[$j]}); ${parts[$j]}"
done
