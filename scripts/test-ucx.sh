#!/usr/bin/env bash
# UCX and Open MPI, Debian 12's own unmodified binaries, on the drop-in libibverbs.so.1
# (crates/ferroce-ibverbs), found through LD_LIBRARY_PATH only (issue 23):
#   1. `ucx_info -d` lists the device ferroce0:1 with the rc_verbs and ud_verbs transports;
#   2. ucx_perftest runs over each by name (`-d ferroce0:1 -x rc_verbs`), so nothing can
#      fall back to TCP: put bandwidth (zero-copy, 64 KiB) and active-message latency over
#      rc_verbs, active-message latency and bandwidth over ud_verbs;
#   3. Open MPI 4.1 over UCX (`--mca pml ucx`, UCX_TLS without shared memory or TCP): two
#      ranks, each on its own address, ping-pong 1 MiB with every byte checked both ways
#      (crates/ferroce-ibverbs/tests/mpi/pingpong.c) and allreduce; UCX's own log must show
#      the ranks' endpoints on rc_verbs/ferroce0:1;
#   4. a UCP client and server connected by socket address through UCX's rdmacm connection
#      manager on the drop-in librdmacm.so.1 (ids without a QP: CONNECT_RESPONSE and
#      rdma_establish), 1 MiB each way over rc_verbs with every byte checked
#      (crates/ferroce-ibverbs/tests/ucx/ucp_cm.c; UCX's headers from libucx-dev).
# Every process has its own 127.0.6.N; nothing leaves loopback (ucx_perftest's and mpirun's
# own TCP exchanges included).
#
# UCX lists a verbs device only if /dev/infiniband/<dev_name> is a character device it may
# read and write (uct_ib_device_is_accessible); it never opens it. The drop-in's dev_name
# is ferroce_verbs0, and scripts/bootstrap.sh makes /dev/infiniband/ferroce_verbs0 a link
# to /dev/null when run as root (README.md, "Run an existing RDMA program on ferroce").
# ucx-utils, openmpi-bin and libopenmpi-dev come from scripts/bootstrap.sh too. Without any
# of these the script skips and says why, unless FERROCE_REQUIRE_UCX or CI is set
# (scripts/test.sh sets the first), when it fails.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

fail() {
    echo "test-ucx: FAIL: $*" >&2
    exit 1
}

node=/dev/infiniband/ferroce_verbs0
missing=()
for tool in ucx_info ucx_perftest mpirun mpicc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
pkg-config --exists ucx 2>/dev/null || missing+=("UCX's headers (libucx-dev)")
[ -c "$node" ] && [ -r "$node" ] && [ -w "$node" ] || missing+=("$node (a character device UCX may read and write)")
if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${FERROCE_REQUIRE_UCX:-}${CI:-}" ]; then
        fail "missing ${missing[*]} (scripts/bootstrap.sh installs ucx-utils, libucx-dev, openmpi-bin and libopenmpi-dev, and links $node to /dev/null)"
    fi
    echo "test-ucx: SKIP: missing ${missing[*]} (scripts/bootstrap.sh provides them, as root)"
    exit 0
fi

lib="$(scripts/build-dropin.sh)"
dir="$(dirname "$lib")"
out_dir="$(dirname "$dir")/test-ucx"
mkdir -p "$out_dir"
echo "== built $lib"

# on (this script's expect takes a regular expression, so it keeps its own)
# shellcheck source=scripts/dropin-lib.sh
. scripts/dropin-lib.sh

expect() {
    local what="$1" text="$2" pattern="$3"
    grep -qE -- "$pattern" <<<"$text" || {
        printf '%s\n' "$text" >&2
        fail "$what: no line matching '$pattern'"
    }
}

echo "== ucx_info -d"
info="$(on 127.0.6.1 timeout 60 ucx_info -d)"
# The ferroce0 memory domain, and the transports listed under it.
ours="$(awk '/^# Memory domain:/ { on = ($4 == "ferroce0") } on' <<<"$info")"
printf '%s\n' "$ours" | grep -E 'Memory domain|Component|Transport|Device|bandwidth|latency|put_zcopy|am_short|atomic_fadd' |
    sed 's/^/    /'
expect "ucx_info -d" "$ours" '^#      Transport: rc_verbs$'
expect "ucx_info -d" "$ours" '^#      Transport: ud_verbs$'
expect "ucx_info -d" "$ours" '^#         Device: ferroce0:1$'

# perf TRANSPORT SERVER CLIENT PORT TEST [OPTION...]: one ucx_perftest pair over TRANSPORT on
# ferroce0:1; prints the client's result line and fails unless both exit 0.
perf() {
    local tl="$1" srv="$2" cli="$3" port="$4" test="$5"
    shift 5
    local what="$tl-$test" srv_rc=0 cli_rc=0 tries=0
    on "$srv" timeout 60 ucx_perftest -d ferroce0:1 -x "$tl" -p "$port" >"$out_dir/$what.server" 2>&1 &
    local srv_pid=$!
    # The server accepts its TCP exchange once its interface is open: retry until then.
    while :; do
        cli_rc=0
        on "$cli" timeout 60 ucx_perftest 127.0.0.1 -p "$port" -d ferroce0:1 -x "$tl" -t "$test" "$@" \
            >"$out_dir/$what.client" 2>&1 || cli_rc=$?
        tries=$((tries + 1))
        if [ "$cli_rc" -eq 0 ] || [ "$tries" -ge 10 ] || ! grep -q "connect.*refused\|Connection refused" "$out_dir/$what.client"; then
            break
        fi
        sleep 0.3
    done
    wait "$srv_pid" || srv_rc=$?
    local result
    result="$(grep '^Final:' "$out_dir/$what.client" || true)"
    if [ "$srv_rc" -ne 0 ] || [ "$cli_rc" -ne 0 ] || [ -z "$result" ]; then
        sed 's/^/    server: /' "$out_dir/$what.server" >&2
        sed 's/^/    client: /' "$out_dir/$what.client" >&2
        fail "ucx_perftest -x $tl -t $test: server exit $srv_rc, client exit $cli_rc"
    fi
    printf '    %-22s %s\n' "$tl $test" "$result"
}

echo "== ucx_perftest over each transport by name (columns: iterations, then 50%, average and overall latency in us, MB/s, msg/s)"
perf rc_verbs 127.0.6.2 127.0.6.3 18801 put_bw -D zcopy -s 65536 -n 2000
perf rc_verbs 127.0.6.2 127.0.6.3 18802 am_lat -n 5000
perf ud_verbs 127.0.6.2 127.0.6.3 18803 am_lat -n 5000
perf ud_verbs 127.0.6.2 127.0.6.3 18804 am_bw -D bcopy -s 2048 -n 5000

echo "== Open MPI over UCX: two ranks, each its own address, no shared memory or TCP"
mpicc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/mpi/pingpong.c -o "$out_dir/pingpong"
mpi_ucx=(
    # Open MPI as root needs saying so; two ranks on a two-core runner need oversubscribing.
    --allow-run-as-root --oversubscribe -np 2
    # UCX's PML, and nothing of Open MPI's own byte transfer layers.
    --mca pml ucx --mca btl self
    # pml/ucx enables itself only on devices whose driver name matches mlx* unless told.
    --mca opal_common_ucx_devices any
    -x LD_LIBRARY_PATH="$dir" -x UCX_NET_DEVICES=ferroce0:1 -x UCX_TLS=rc_verbs,ud_verbs,self
    -x UCX_LOG_LEVEL=info
)
# Each rank its own address, from its rank on this host.
rc=0
out="$(timeout 120 mpirun "${mpi_ucx[@]}" \
    sh -c 'FERROCE_ADDR=127.0.6.$((10 + OMPI_COMM_WORLD_LOCAL_RANK)) exec "$0" "$@"' \
    "$out_dir/pingpong" 1048576 20 2>&1)" || rc=$?
printf '%s\n' "$out" | grep -E '^pingpong|^allreduce|ep_cfg' | sed 's/^/    /'
[ "$rc" -eq 0 ] || {
    printf '%s\n' "$out" >&2
    fail "mpirun over UCX on ferroce0 exited $rc"
}
expect "mpirun" "$out" '^pingpong: 10 round trips of 1048576 bytes, every byte checked both ways$'
expect "mpirun" "$out" '^pingpong: 20 round trips of 1048576 bytes: [0-9.]+ us per round trip'
expect "mpirun" "$out" '^allreduce: 2 ranks summed to 3$'
# Rank to rank over rc_verbs on ferroce0 (ep_cfg[0] is each rank's endpoint to itself).
expect "mpirun" "$out" 'ep_cfg\[1\]: tag\(rc_verbs/ferroce0:1\)'
if grep -E 'ep_cfg\[[0-9]+\]' <<<"$out" | grep -qE 'tcp|posix|sysv|cma'; then
    fail "an MPI endpoint used a transport other than ferroce0 and self"
fi

echo "== UCP client/server by socket address through UCX's rdmacm connection manager"
# crates/ferroce-ibverbs/tests/ucx/ucp_cm.c: the client connects by address, 1 MiB goes each
# way over rc_verbs (every byte checked), the client closes with a flush. Only rc_verbs and
# only the rdmacm CM, so nothing falls back to TCP; UCX's log must say so on both sides.
# shellcheck disable=SC2046 # pkg-config's words are meant to split
cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/ucx/ucp_cm.c \
    $(pkg-config --cflags --libs ucx) -o "$out_dir/ucp_cm"
ucx_cm=(UCX_TLS=rc_verbs UCX_NET_DEVICES=ferroce0:1 UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_LOG_LEVEL=debug)
on 127.0.6.20 env "${ucx_cm[@]}" timeout 60 "$out_dir/ucp_cm" server 127.0.6.20 13350 \
    >"$out_dir/ucp_cm.server" 2>&1 &
srv_pid=$!
for _ in $(seq 150); do
    grep -q "^ucp_cm server: listening" "$out_dir/ucp_cm.server" && break
    kill -0 "$srv_pid" 2>/dev/null || break
    sleep 0.1
done
cli_rc=0
on 127.0.6.21 env "${ucx_cm[@]}" timeout 60 "$out_dir/ucp_cm" client 127.0.6.20 13350 \
    >"$out_dir/ucp_cm.client" 2>&1 || cli_rc=$?
srv_rc=0
wait "$srv_pid" || srv_rc=$?
server_log="$(cat "$out_dir/ucp_cm.server")"
client_log="$(cat "$out_dir/ucp_cm.client")"
grep -h "^ucp_cm " "$out_dir/ucp_cm.server" "$out_dir/ucp_cm.client" | sed 's/^/    /'
[ "$srv_rc" -eq 0 ] && [ "$cli_rc" -eq 0 ] || {
    tail -n 30 "$out_dir/ucp_cm.server" "$out_dir/ucp_cm.client" >&2
    fail "ucp_cm: server exit $srv_rc, client exit $cli_rc"
}
expect "ucp_cm server" "$server_log" '^ucp_cm server: ok$'
expect "ucp_cm client" "$client_log" '^ucp_cm client: ok$'
for side in server client; do
    log="$(cat "$out_dir/ucp_cm.$side")"
    expect "ucp_cm $side" "$log" 'rdmacm_cm\.c:[0-9]+ +UCX +DEBUG created rdmacm_cm '
    expect "ucp_cm $side" "$log" "rdmacm_cm_ep\.c:[0-9]+ +UCX +DEBUG \[cep .* $side Success\] created an endpoint on rdmacm"
    expect "ucp_cm $side" "$log" 'ep_cfg\[[0-9]+\]: tag\(rc_verbs/ferroce0:1\)'
    if grep -qE 'tcp_sockcm|tcp_ep\.c|tcp_listener|/tcp/' <<<"$log"; then
        fail "ucp_cm $side: UCX used TCP"
    fi
done
# The client's address as it sees it (rdma_get_local_addr) and as the server does
# (rdma_get_peer_addr): the REQ's rdma_cm header carries the id's bound port, as the kernel's.
cli_local="$(sed -nE 's/^ucp_cm client: endpoint local ([0-9.]+:[0-9]+) remote .*/\1/p' <<<"$client_log")"
srv_peer="$(sed -nE 's/^ucp_cm server: connection request from ([0-9.]+:[0-9]+)$/\1/p' <<<"$server_log")"
[ -n "$cli_local" ] && [ "$cli_local" = "$srv_peer" ] ||
    fail "ucp_cm: the client is $cli_local to itself but $srv_peer to the server"

echo "test-ucx: all passed"
