#!/usr/bin/env bash
# The drop-in librdmacm.so.1 (issue 24: the same file as the drop-in libibverbs.so.1,
# crates/ferroce-ibverbs) under Debian 12's own, unmodified rdma_cm programs, found through
# LD_LIBRARY_PATH only:
#   1. it exports the names, at the versions, that Debian's librdmacm.so.1 exports, and a
#      program that needs both libraries maps the one file once;
#   2. rping, ucmatose, udaddy, rdma_server and rdma_client load with LD_BIND_NOW=1;
#   3. rping -C 50 -v -V runs both sides on it: every ping's data, as rping writes it, on
#      both sides, both end on their own with status 0, the server on DISCONNECTED;
#   4. ucmatose -c 4: four connections, messages both ways, disconnects, status 0 both sides;
#   5. udaddy -c 4: UD ids resolved by SIDR, datagrams both ways, status 0 both sides;
#   6. rdma_server/rdma_client (synchronous ids: rdma_create_ep, rdma_get_request, and
#      rdma_verbs.h's inline helpers on the ids' PD and CQs) exchange their messages;
#   7. perftest's ib_send_bw -R and ib_write_lat -R (rdma_cm for the connection and for the
#      exchange of the test's parameters) measure, both sides;
#   8. libfabric's fi_info -p verbs lists ferroce0 (rdma_get_devices);
#   9. a C program built on rdma-core's <rdma/rdma_cma.h> (crates/ferroce-ibverbs/tests/c/
#      rdmacm.c): private data both ways, a REJ with the consumer's reason (28) and bytes, a
#      port nobody listens on (REJ 8), a non-blocking channel fd, the id's PD and CQs; ids
#      without a QP (CONNECT_RESPONSE, rdma_init_qp_attr for INIT/RTR/RTS, rdma_establish);
#      a listener closed with a request pending (REJ 28, then 8);
#  10. rping to a port nobody listens on (a soft NIC is there): RDMA_CM_EVENT_REJECTED with
#      status 8 (invalid service ID), as the kernel's rdma_cm reports it.
# Every process gets its own 127.0.11.N (FERROCE_ADDR); nothing leaves loopback.
#
# rping, ucmatose, udaddy, rdma_server and rdma_client come from rdmacm-utils, ib_send_bw and
# ib_write_lat from perftest (scripts/bootstrap.sh). Without rdmacm-utils the script skips,
# unless FERROCE_REQUIRE_IBVERBS_UTILS or CI is set, when it fails.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

fail() {
    echo "test-rdmacm: FAIL: $*" >&2
    exit 1
}

missing=()
for tool in rping ucmatose udaddy rdma_server rdma_client nm python3; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${FERROCE_REQUIRE_IBVERBS_UTILS:-}${CI:-}" ]; then
        fail "missing ${missing[*]} (scripts/bootstrap.sh installs rdmacm-utils, binutils and python3)"
    fi
    echo "test-rdmacm: SKIP: missing ${missing[*]} (scripts/bootstrap.sh installs them)"
    exit 0
fi

lib="$(scripts/build-dropin.sh)"
dir="$(dirname "$lib")"
[ -e "$dir/librdmacm.so.1" ] || fail "build-dropin.sh left no $dir/librdmacm.so.1"
echo "== built $dir/librdmacm.so.1 -> $(readlink "$dir/librdmacm.so.1")"

out_dir="$(mktemp -d)"
pids=()
cleanup() {
    # Only the processes this script started (their `timeout` wrappers pass the signal on).
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    rm -rf "$out_dir"
}
trap cleanup EXIT

# on, on_bg, expect, versions, installed
# shellcheck source=scripts/dropin-lib.sh
. scripts/dropin-lib.sh

echo "== exported symbols against Debian's librdmacm.so.1"
ours="$(versions "$dir/librdmacm.so.1" | grep '@RDMACM_')"
echo "ours: $(wc -l <<<"$ours") RDMACM symbols"
real="$(installed librdmacm.so.1)"
if [ -n "$real" ]; then
    theirs="$(versions "$real")"
    if ! diff <(echo "$theirs") <(echo "$ours"); then
        fail "the drop-in's RDMACM symbols differ from $real's (< theirs, > ours)"
    fi
    echo "identical to $real"
else
    echo "no librdmacm.so.1 to compare with; skipped"
fi

echo "== one file, mapped once, for both names"
maps="$(LD_DEBUG=files on 127.0.11.1 rping -h 2>&1 || true)"
if grep -q "file=libibverbs.so.1 .*generating link map" <<<"$maps"; then
    printf '%s\n' "$maps" | grep 'file=' >&2
    fail "libibverbs.so.1 was mapped a second time: the two names must share one copy"
fi
expect "LD_DEBUG=files" "$maps" "file=librdmacm.so.1 [0];  generating link map"
echo "librdmacm.so.1 and libibverbs.so.1 share one mapping"

echo "== the programs load with LD_BIND_NOW=1"
for p in rping ucmatose udaddy rdma_server rdma_client; do
    rc=0
    text="$(LD_BIND_NOW=1 on 127.0.11.2 timeout 20 "$p" -h 2>&1)" || rc=$?
    if [ "$rc" -eq 127 ] || grep -qiE 'symbol lookup error|undefined symbol|version .* not found' <<<"$text"; then
        printf '%s\n' "$text" >&2
        fail "$p does not load on the drop-in"
    fi
    echo "$p: loads (usage, rc $rc)"
done

# Waits (up to 10 s) until a soft NIC holds UDP port 4791 on ADDR, then a moment more for the
# program to listen behind it.
wait_for_nic() {
    local addr="$1"
    for _ in $(seq 100); do
        if ss -Hunl "src $addr:4791" 2>/dev/null | grep -q .; then
            sleep 0.3
            return
        fi
        sleep 0.1
    done
    sleep 1
}

# run_pair NAME SERVER_ADDR CLIENT_ADDR "SERVER CMD..." "CLIENT CMD..." : both sides, each
# its own address, the client started once the server listens; leaves their outputs in
# $out_dir/NAME.{server,client} (standard output; standard error beside it in .err, since
# the two interleave mid-line when they share a file) and their codes in srv_rc/cli_rc.
run_pair() {
    local name="$1" srv_addr="$2" cli_addr="$3" srv_cmd="$4" cli_cmd="$5"
    local srv_pid try
    # The NIC's socket shows when the server's process is up, not when it has reached
    # rdma_listen: a client that comes first is refused (REJ 8, as the kernel refuses it).
    # perftest's -R has a second such window of its own: after the first connection and a
    # handshake over it, its server makes a new listening id for the test's QPs while its
    # client connects them at once. On a busy host either race is lost now and then; a
    # server refused its client's second connection waits for one that never comes, and a
    # new client's first connection, taken as that second one, hung both. So a refusal
    # starts both again (three times at most), as an operator would.
    for try in 1 2 3 4; do
        # shellcheck disable=SC2086 # the commands are word lists
        on_bg "$srv_addr" timeout 60 $srv_cmd >"$out_dir/$name.server" 2>"$out_dir/$name.server.err" &
        srv_pid=$!
        pids+=("$srv_pid")
        wait_for_nic "$srv_addr"
        cli_rc=0
        # shellcheck disable=SC2086
        LD_BIND_NOW=1 on "$cli_addr" timeout 60 $cli_cmd >"$out_dir/$name.client" 2>"$out_dir/$name.client.err" || cli_rc=$?
        if [ "$cli_rc" -eq 0 ] || [ "$try" -eq 4 ] ||
            ! grep -qE 'REJECTED[;,] error:? 8' "$out_dir/$name.client" "$out_dir/$name.client.err"; then
            break
        fi
        echo "-- $name: the client was refused (REJ 8: a server not listening yet); both again"
        kill "$srv_pid" 2>/dev/null || true
        wait "$srv_pid" 2>/dev/null || true
        sleep 1
    done
    srv_rc=0
    wait "$srv_pid" || srv_rc=$?
    echo "-- $name client (rc $cli_rc):"
    tail -n 4 "$out_dir/$name.client" "$out_dir/$name.client.err"
    echo "-- $name server (rc $srv_rc):"
    tail -n 4 "$out_dir/$name.server" "$out_dir/$name.server.err"
}

# The lines `rping -v` prints for COUNT pings (rping.c: "rdma-ping-%d: ", then letters from
# 'A' + ping, cycling 'A'..'z', up to its 64-byte buffer's last byte).
rping_lines() {
    python3 - "$1" "$2" <<'EOF'
import sys
prefix, count = sys.argv[1], int(sys.argv[2])
start = 65
for ping in range(count):
    text = "rdma-ping-%d: " % ping
    c = start
    while len(text) < 63:
        text += chr(c)
        c = 65 if c + 1 > 122 else c + 1
    start = 65 if start + 1 > 122 else start + 1
    print(prefix + text)
EOF
}

echo "== rping -C 50 -v -V, both sides on the drop-in"
run_pair rping 127.0.11.10 127.0.11.11 \
    "rping -s -a 127.0.11.10 -p 7174 -C 50 -v -V" \
    "rping -c -a 127.0.11.10 -p 7174 -C 50 -v -V"
[ "$cli_rc" -eq 0 ] || fail "rping client exited $cli_rc: $(cat "$out_dir"/rping.client*)"
[ "$srv_rc" -eq 0 ] || fail "rping server exited $srv_rc: $(cat "$out_dir"/rping.server*)"
for side in client server; do
    prefix="ping data: "
    [ "$side" = server ] && prefix="server ping data: "
    if ! diff <(rping_lines "$prefix" 50) <(grep -F "ping data: " "$out_dir/rping.$side"); then
        fail "rping $side: its ping data differ from the 50 rping sends (< expected, > seen)"
    fi
done
# The client prints its DISCONNECT line from rping's CM thread, which races the client's own
# exit once rdma_disconnect has returned (the event waits for the server's DREP): on a busy
# host the process may end first, with the kernel's rdma_cm as with ours. The server's line
# comes before it can exit, so it is required.
expect "rping server" "$(cat "$out_dir/rping.server.err")" "server DISCONNECT EVENT..."
echo "rping: 50 pings, every one's data as sent, on both sides; the server disconnected"

echo "== ucmatose -c 4, both sides on the drop-in"
run_pair ucmatose 127.0.11.12 127.0.11.13 \
    "ucmatose -b 127.0.11.12 -p 7175 -c 4" \
    "ucmatose -s 127.0.11.12 -p 7175 -c 4"
[ "$cli_rc" -eq 0 ] || fail "ucmatose client exited $cli_rc: $(cat "$out_dir"/ucmatose.client*)"
[ "$srv_rc" -eq 0 ] || fail "ucmatose server exited $srv_rc: $(cat "$out_dir"/ucmatose.server*)"
for side in client server; do
    text="$(cat "$out_dir/ucmatose.$side" "$out_dir/ucmatose.$side.err")"
    expect "ucmatose $side" "$text" "data transfers complete"
    expect "ucmatose $side" "$text" "test complete"
    expect "ucmatose $side" "$text" "return status 0"
done
echo "ucmatose: 4 connections, data both ways, status 0 on both sides"

echo "== udaddy -c 4 (UD ids, SIDR), both sides on the drop-in"
# udaddy's -p is the port space, not the port: both use rdma_cm port 7174.
run_pair udaddy 127.0.11.16 127.0.11.17 \
    "udaddy -b 127.0.11.16 -c 4" \
    "udaddy -s 127.0.11.16 -c 4"
[ "$cli_rc" -eq 0 ] || fail "udaddy client exited $cli_rc: $(cat "$out_dir"/udaddy.client*)"
[ "$srv_rc" -eq 0 ] || fail "udaddy server exited $srv_rc: $(cat "$out_dir"/udaddy.server*)"
for side in client server; do
    text="$(cat "$out_dir/udaddy.$side" "$out_dir/udaddy.$side.err")"
    expect "udaddy $side" "$text" "data transfers complete"
    expect "udaddy $side" "$text" "return status 0"
done
echo "udaddy: 4 UD peers resolved by SIDR, datagrams both ways, status 0 on both sides"

echo "== rdma_server / rdma_client (the synchronous API: rdma_create_ep, rdma_get_request)"
run_pair rdma_server 127.0.11.18 127.0.11.19 \
    "rdma_server -s 127.0.11.18 -p 7471" \
    "rdma_client -s 127.0.11.18 -p 7471"
[ "$cli_rc" -eq 0 ] || fail "rdma_client exited $cli_rc: $(cat "$out_dir"/rdma_server.client*)"
[ "$srv_rc" -eq 0 ] || fail "rdma_server exited $srv_rc: $(cat "$out_dir"/rdma_server.server*)"
expect "rdma_client" "$(cat "$out_dir/rdma_server.client")" "rdma_client: end 0"
expect "rdma_server" "$(cat "$out_dir/rdma_server.server")" "rdma_server: end 0"
echo "rdma_server/rdma_client: a message each way, inline, both end 0"

echo "== perftest with rdma_cm (-R): ib_send_bw and ib_write_lat, both sides on the drop-in"
if command -v ib_send_bw >/dev/null && command -v ib_write_lat >/dev/null; then
    n=30
    for tool in ib_send_bw ib_write_lat; do
        n=$((n + 2))
        run_pair "$tool" "127.0.11.$n" "127.0.11.$((n + 1))" \
            "$tool -d ferroce0 -x 0 -R -n 200" \
            "$tool -d ferroce0 -x 0 -R -n 200 127.0.11.$n"
        [ "$cli_rc" -eq 0 ] || fail "$tool -R client exited $cli_rc: $(cat "$out_dir/$tool".client*)"
        [ "$srv_rc" -eq 0 ] || fail "$tool -R server exited $srv_rc: $(cat "$out_dir/$tool".server*)"
        for side in client server; do
            text="$(cat "$out_dir/$tool.$side")"
            expect "$tool -R $side" "$text" "Data ex. method : rdma_cm"
            # The result line: the message size, then the 200 iterations.
            grep -qE '^ *[0-9]+ +200 ' <<<"$text" || {
                printf '%s\n' "$text" >&2
                fail "$tool -R $side: no result line"
            }
        done
    done
    echo "perftest -R: ib_send_bw and ib_write_lat connected by rdma_cm and measured"
else
    echo "perftest not installed; skipped"
fi

echo "== libfabric's verbs provider finds ferroce0 (rdma_get_devices)"
if command -v fi_info >/dev/null; then
    text="$(on 127.0.11.36 timeout 30 fi_info -p verbs 2>&1)" || fail "fi_info -p verbs failed: $text"
    expect "fi_info -p verbs" "$text" "domain: ferroce0"
    echo "fi_info -p verbs: ferroce0 listed"
else
    echo "libfabric-bin not installed; skipped"
fi

echo "== a C program on rdma_cma.h: private data, REJ reasons, a non-blocking channel, ids without a QP"
if echo '#include <rdma/rdma_cma.h>' | cc -E - >/dev/null 2>&1; then
    cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/c/rdmacm.c \
        -lrdmacm -libverbs -o "$out_dir/rdmacm"
    run_pair rdmacm_c 127.0.11.37 127.0.11.38 \
        "$out_dir/rdmacm server 127.0.11.37 7480" \
        "$out_dir/rdmacm client 127.0.11.37 7480"
    [ "$cli_rc" -eq 0 ] || fail "rdmacm.c client exited $cli_rc: $(cat "$out_dir"/rdmacm_c.client*)"
    [ "$srv_rc" -eq 0 ] || fail "rdmacm.c server exited $srv_rc: $(cat "$out_dir"/rdmacm_c.server*)"
    expect "rdmacm.c" "$(cat "$out_dir/rdmacm_c.client")" "rdmacm client: ok"
    expect "rdmacm.c" "$(cat "$out_dir/rdmacm_c.server")" "rdmacm server: ok"
elif [ -n "${FERROCE_REQUIRE_IBVERBS_UTILS:-}${CI:-}" ]; then
    fail "no <rdma/rdma_cma.h> (scripts/bootstrap.sh installs librdmacm-dev)"
else
    echo "no <rdma/rdma_cma.h>; skipped (scripts/bootstrap.sh installs librdmacm-dev)"
fi

echo "== rping to a port nobody listens on: REJECTED, status 8"
on_bg 127.0.11.14 timeout 60 rping -s -a 127.0.11.14 -p 7176 -C 1 >"$out_dir/idle.server" 2>&1 &
idle_pid=$!
pids+=("$idle_pid")
wait_for_nic 127.0.11.14
rc=0
text="$(on 127.0.11.15 timeout 30 rping -c -a 127.0.11.14 -p 7177 -C 1 2>&1)" || rc=$?
kill "$idle_pid" 2>/dev/null || true
wait "$idle_pid" 2>/dev/null || true
printf '%s\n' "$text"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "rping to nobody exited $rc (expected a failure, not a hang)"
expect "rping to nobody" "$text" "cma event RDMA_CM_EVENT_REJECTED, error 8"
echo "rping to nobody: rejected, status 8"

echo "test-rdmacm: OK"
