#!/usr/bin/env bash
# UCX and Open MPI on the drop-in libibverbs against their own TCP transports on loopback, the
# same minutes, alternating (issue 23's measurements):
#   - ucx_perftest put bandwidth (zero-copy, 64 KiB) and active-message latency (8 bytes)
#     over rc_verbs on ferroce0:1, beside the same tests over UCX's tcp transport on lo;
#   - an MPI ping-pong of 1 MiB (crates/ferroce-ibverbs/tests/mpi/pingpong.c, two ranks) over
#     UCX's rc_verbs on ferroce0, beside Open MPI's own TCP transport (pml ob1, btl tcp on lo).
# Prints each run's result line. Needs what scripts/test-ucx.sh needs.
# Usage: scripts/bench-ucx.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
lib="$(scripts/build-dropin.sh)"
dir="$(dirname "$lib")"
out_dir="$(dirname "$dir")/bench-ucx"
mkdir -p "$out_dir"
mpicc -O2 crates/ferroce-ibverbs/tests/mpi/pingpong.c -o "$out_dir/pingpong"
port=18900

# uct TRANSPORT DEVICE TEST [OPTION...]: one ucx_perftest pair; prints the client's Final line
# (iterations; 50%, average, overall latency or overhead in us; MB/s average, overall; msg/s).
uct() {
    local tl=$1 dev=$2 test=$3
    shift 3
    port=$((port + 1))
    LD_LIBRARY_PATH="$dir" FERROCE_ADDR=127.0.6.41 timeout 60 ucx_perftest -d "$dev" -x "$tl" -p "$port" \
        >/dev/null 2>&1 &
    local server=$!
    sleep 0.7
    LD_LIBRARY_PATH="$dir" FERROCE_ADDR=127.0.6.42 timeout 60 ucx_perftest 127.0.0.1 -p "$port" -d "$dev" \
        -x "$tl" -t "$test" "$@" | awk '/^Final:/ { $1 = ""; print; exit }'
    wait $server
}

mpi() {
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$@" \
        sh -c 'FERROCE_ADDR=127.0.6.$((50 + OMPI_COMM_WORLD_LOCAL_RANK)) exec "$0" 1048576 200' \
        "$out_dir/pingpong" | awk '/us per round trip/ { sub(/^pingpong: /, ""); print }'
}
over_ferroce=(--mca pml ucx --mca btl self --mca opal_common_ucx_devices any -x LD_LIBRARY_PATH="$dir"
    -x UCX_NET_DEVICES=ferroce0:1 -x UCX_TLS=rc_verbs,ud_verbs,self)
over_tcp=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)

for round in $(seq "$rounds"); do
    echo "round $round ucx put_bw 64 KiB rc_verbs/ferroce0:1: $(uct rc_verbs ferroce0:1 put_bw -D zcopy -s 65536 -n 5000)"
    echo "round $round ucx put_bw 64 KiB tcp/lo:              $(uct tcp lo put_bw -D zcopy -s 65536 -n 5000)"
    echo "round $round ucx am_lat 8 B rc_verbs/ferroce0:1:    $(uct rc_verbs ferroce0:1 am_lat -n 20000)"
    echo "round $round ucx am_lat 8 B tcp/lo:                 $(uct tcp lo am_lat -n 20000)"
    echo "round $round mpi 1 MiB over ferroce (pml ucx):      $(mpi "${over_ferroce[@]}")"
    echo "round $round mpi 1 MiB over tcp (pml ob1):          $(mpi "${over_tcp[@]}")"
done
