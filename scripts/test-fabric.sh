#!/usr/bin/env bash
# libfabric's own fi_pingpong (Debian 12: libfabric-bin 1.17), unmodified, over the verbs
# provider's MSG endpoints (`-p verbs -e msg`: RC QPs set up through librdmacm) on the drop-in
# libibverbs.so.1 + librdmacm.so.1 (issue 24), between two processes:
#   1. the default run (64 B .. 1 MiB, 10 iterations each);
#   2. every size (-S all) with every byte checked (-c).
# Each side must exit 0 and print the same table, every size with #ack equal to #sent, and
# the server's network namespace must have received at least the payload's bytes.
#
# Why network namespaces and not loopback: libfabric 1.17's verbs provider builds its list of
# addresses for FI_EP_MSG from getifaddrs() and skips every IFF_LOOPBACK interface
# (prov/verbs/src/verbs_info.c, vrb_getifaddrs), FI_VERBS_IFACE=lo included; with no such
# address the device is "skipped for FI_EP_MSG". So each process gets its own namespace with
# one veth end named ib0 holding one IPv4 address (its FERROCE_ADDR), IPv6 off (no fe80::).
# Nothing leaves the two namespaces this script makes; both are deleted on exit.
#
# What libfabric needs of librdmacm here, as rdma-core and the kernel give it: rdma_bind_addr
# of 127.0.0.1 (its "localhost" probe) taken as the wildcard, id->verbs left NULL;
# rdma_getaddrinfo(NULL, NULL, hints) answering with the hints' addresses; rdma_migrate_id
# turning an id made without a channel asynchronous (its connect waits for ROUTE_RESOLVED on
# the event queue's channel).
#
# Needs root (ip netns), iproute2 and fi_pingpong. Skips (exit 0) without them unless
# FERROCE_REQUIRE_FABRIC or CI is set.
#
# Environment:
#   FERROCE_DROPIN_DIR  folder holding the drop-in libibverbs.so.1/librdmacm.so.1 (default:
#                       what scripts/build-dropin.sh prints, when run inside the repository)
#   FABRIC_ITERS        iterations of the -S all run (default 20)
#   FABRIC_TIMEOUT      seconds each fi_pingpong may run (default 60; both runs take seconds)
#   FI_LOG_LEVEL        passed through (warn by default; debug to diagnose)
set -euo pipefail

fail() {
    echo "test-fabric: FAIL: $*" >&2
    exit 1
}
skip() {
    if [ -n "${FERROCE_REQUIRE_FABRIC:-}${CI:-}" ]; then
        fail "$*"
    fi
    echo "test-fabric: SKIP: $*"
    exit 0
}

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "needs iproute2 (ip)"
command -v fi_pingpong >/dev/null || skip "needs fi_pingpong (apt-get install libfabric-bin)"

if [ -n "${FERROCE_DROPIN_DIR:-}" ]; then
    dir="$FERROCE_DROPIN_DIR"
else
    root="$(cd "$(dirname "$0")/.." && pwd)"
    [ -x "$root/scripts/build-dropin.sh" ] || fail "set FERROCE_DROPIN_DIR (no scripts/build-dropin.sh beside this script)"
    lib="$("$root/scripts/build-dropin.sh")"
    dir="$(dirname "$lib")"
fi
[ -e "$dir/libibverbs.so.1" ] && [ -e "$dir/librdmacm.so.1" ] ||
    fail "$dir lacks libibverbs.so.1 or librdmacm.so.1"

tmo="${FABRIC_TIMEOUT:-60}"
srv_ns="ffab-srv-$$"
cli_ns="ffab-cli-$$"
srv_ip=10.47.0.1
cli_ip=10.47.0.2
work="$(mktemp -d /tmp/test-fabric.XXXXXX)"
pids=()

cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    ip netns del "$srv_ns" 2>/dev/null || true
    ip netns del "$cli_ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- two namespaces joined by a veth pair, each end named ib0 --------------------------------
ip netns add "$srv_ns" 2>"$work/netns.err" ||
    skip "cannot create a network namespace here: $(cat "$work/netns.err")"
ip netns add "$cli_ns"
for ns in "$srv_ns" "$cli_ns"; do
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" link set lo up
done
ip link add ib0 netns "$srv_ns" type veth peer name ib0 netns "$cli_ns"
ip -n "$srv_ns" addr add "$srv_ip/24" dev ib0
ip -n "$cli_ns" addr add "$cli_ip/24" dev ib0
ip -n "$srv_ns" link set ib0 up
ip -n "$cli_ns" link set ib0 up
# the veth carrier takes a moment
for _ in $(seq 50); do
    ip netns exec "$cli_ns" ip route get "$srv_ip" >/dev/null 2>&1 &&
        ip -n "$srv_ns" -br link show ib0 | grep -q ' UP ' &&
        ip -n "$cli_ns" -br link show ib0 | grep -q ' UP ' && break
    sleep 0.1
done

# Runs CMD... in namespace NS on the drop-in with FERROCE_ADDR=ADDR: in_ns NS ADDR CMD...
in_ns() {
    local ns="$1" addr="$2"
    shift 2
    ip netns exec "$ns" env LD_LIBRARY_PATH="$dir" FERROCE_ADDR="$addr" \
        FI_LOG_LEVEL="${FI_LOG_LEVEL:-warn}" "$@"
}

rx_bytes() {
    ip netns exec "$1" cat /sys/class/net/ib0/statistics/rx_bytes
}

# The data lines of a fi_pingpong table: "size sent ack" each.
table() {
    awk '/^bytes +#sent +#ack/ { t = 1; next } t && NF >= 3 && $3 ~ /^=/ { print $1, $2, substr($3, 2) }' "$1"
}

# One pair: run NAME ITERS EXPECTED_SIZES(or "") MIN_RX_BYTES fi_pingpong-options...
run() {
    local name="$1" iters="$2" sizes="$3" min_rx="$4"
    shift 4
    local srv_out="$work/$name.server" cli_out="$work/$name.client"
    local rx0 srv_pid srv_rc=0 cli_rc=0
    rx0="$(rx_bytes "$srv_ns")"
    echo "== $name: fi_pingpong -p verbs -e msg $*"
    in_ns "$srv_ns" "$srv_ip" timeout "$tmo" fi_pingpong -p verbs -e msg "$@" >"$srv_out" 2>&1 &
    srv_pid=$!
    pids+=("$srv_pid")
    # fi_pingpong's server listens on its TCP control port (47592) before anything else
    for _ in $(seq 100); do
        ip netns exec "$srv_ns" ss -Hltn 'sport = :47592' | grep -q . && break
        kill -0 "$srv_pid" 2>/dev/null || break
        sleep 0.1
    done
    in_ns "$cli_ns" "$cli_ip" timeout "$tmo" fi_pingpong -p verbs -e msg "$@" "$srv_ip" >"$cli_out" 2>&1 || cli_rc=$?
    if [ "$cli_rc" != 0 ]; then
        # a failed client leaves the server waiting on its control socket: 5 s, then end it
        for _ in $(seq 50); do
            kill -0 "$srv_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$srv_pid" 2>/dev/null || true
    fi
    wait "$srv_pid" || srv_rc=$?
    pids=("${pids[@]/$srv_pid/}")

    if [ "$srv_rc" != 0 ] || [ "$cli_rc" != 0 ]; then
        echo "--- server (exit $srv_rc)" >&2
        tail -n 30 "$srv_out" >&2
        echo "--- client (exit $cli_rc)" >&2
        tail -n 30 "$cli_out" >&2
        [ "$srv_rc" = 124 ] || [ "$cli_rc" = 124 ] && echo "(124: timed out)" >&2
        fail "$name: server exit $srv_rc, client exit $cli_rc (rerun with FI_LOG_LEVEL=debug)"
    fi
    local st ct
    st="$(table "$srv_out")"
    ct="$(table "$cli_out")"
    [ -n "$st" ] || { cat "$srv_out" >&2; fail "$name: the server printed no table"; }
    [ "$st" = "$ct" ] || {
        diff <(echo "$st") <(echo "$ct") >&2 || true
        fail "$name: the server's and the client's tables differ"
    }
    awk -v n="$iters" '$2 != n || $3 != n { bad = 1; print "  bad line: " $0 > "/dev/stderr" } END { exit bad }' <<<"$st" ||
        fail "$name: not every size sent and acknowledged $iters times"
    if [ -n "$sizes" ]; then
        local got
        got="$(awk '{ printf "%s%s", sep, $1; sep = " " }' <<<"$st")"
        [ "$got" = "$sizes" ] || fail "$name: sizes '$got', expected '$sizes'"
    fi
    local rx=$(($(rx_bytes "$srv_ns") - rx0))
    [ "$rx" -ge "$min_rx" ] || fail "$name: the server's ib0 received $rx bytes, expected at least $min_rx"
    grep -v '^libfabric:' "$cli_out" || true
    echo "   ok: $(wc -l <<<"$st") sizes, each $iters/$iters acknowledged, server ib0 received $rx bytes"
}

# 1. the default run: 64 256 1k 4k 64k 1m, 10 iterations (10 MiB of 1 MiB messages alone)
run default 10 "64 256 1k 4k 64k 1m" $((10 * 1048576))
# 2. every size with data checks
iters="${FABRIC_ITERS:-20}"
run all-checked "$iters" "" $((iters * 1048576)) -S all -I "$iters" -c

echo "test-fabric: PASS"
