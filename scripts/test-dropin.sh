#!/usr/bin/env bash
# The drop-in libibverbs.so.1 (crates/ferroce-ibverbs) under Debian 12's own, unmodified
# binaries, found through LD_LIBRARY_PATH only (issue 23, stage 0):
#   1. it exports the names, at the versions, that Debian's libibverbs.so.1 exports;
#   2. ibv_devices lists ferroce0 and ibv_devinfo -v describes it: PORT_ACTIVE, Ethernet, the
#      RoCE v2 GID ::ffff:127.0.0.N of FERROCE_ADDR, loopback's active MTU (4096);
#   3. an unusable FERROCE_ADDR, or one another program holds, makes ibv_open_device fail and
#      say why;
#   4. perftest's and rdma-core's programs load with LD_BIND_NOW=1 (every symbol they, libmlx5,
#      libefa and librdmacm import resolves) and print their usage;
#   5. a C program built against rdma-core's own headers and library (so verbs.h's inline
#      functions run as in any program) finds what it expects, errors included
#      (crates/ferroce-ibverbs/tests/c/stage0.c);
#   6. the other ways in: a stand-in for NCCL's loader finds every verb it needs by
#      dlopen(NCCL_IBVERBS_LIB) and dlvsym at IBVERBS_1.1 (crates/ferroce-ibverbs/tests/c/
#      nccl_load.c); a program that carries its own libibverbs.so.1 (DT_RPATH) is not reached
#      by LD_LIBRARY_PATH, and is by LD_PRELOAD;
#   7. stage 1, the data path: a C program (crates/ferroce-ibverbs/tests/c/stage1.c) posts
#      and polls through verbs.h's inline functions, bad input included (past a queue's
#      depth, a wrong lkey, an unknown rkey); and ibv_rc_pingpong (also -e, completion channels),
#      ibv_uc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong, and perftest's ib_write_bw,
#      ib_send_bw, ib_read_bw, ib_atomic_bw, ib_write_lat, ib_send_lat and ib_read_lat run
#      both sides on the drop-in and print their results (and ib_send_bw/lat over UD,
#      ib_write_bw over UC, ib_send_bw -e); ibv_rc_pingpong on the drop-in
#      talks to ferroce's own `ferroce pingpong`, in both roles.
# Every process gets its own 127.0.0.N; nothing leaves loopback. The pingpongs' servers listen
# for their TCP exchange on all addresses, so each pair has its own port too.
#
# ibv_devices/ibv_devinfo (ibverbs-utils), ib_write_bw (perftest) and verbs.h
# (libibverbs-dev) come from scripts/bootstrap.sh. Without them the script skips, unless
# FERROCE_REQUIRE_IBVERBS_UTILS or CI is set (scripts/test.sh sets the first), when it fails.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

fail() {
    echo "test-dropin: FAIL: $*" >&2
    exit 1
}

missing=()
for tool in ibv_devices ibv_devinfo ibv_rc_pingpong ib_write_bw nm cc; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
echo '#include <infiniband/verbs.h>' | cc -E - >/dev/null 2>&1 || missing+=("infiniband/verbs.h")
if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${FERROCE_REQUIRE_IBVERBS_UTILS:-}${CI:-}" ]; then
        fail "missing ${missing[*]} (scripts/bootstrap.sh installs ibverbs-utils, perftest, libibverbs-dev and binutils)"
    fi
    echo "test-dropin: SKIP: missing ${missing[*]} (scripts/bootstrap.sh installs them)"
    exit 0
fi

lib="$(scripts/build-dropin.sh)"
dir="$(dirname "$lib")"
echo "== built $lib"

# on, expect, versions, installed
# shellcheck source=scripts/dropin-lib.sh
. scripts/dropin-lib.sh

echo "== exported symbols against Debian's libibverbs.so.1"
real="$(installed libibverbs.so.1)"
# The RDMACM_* nodes are librdmacm's (the same file is the drop-in librdmacm.so.1):
# scripts/test-rdmacm.sh compares them with Debian's librdmacm.so.1.
ours="$(versions "$lib" | grep -v '@RDMACM_')"
echo "ours: $(wc -l <<<"$ours") symbols"
sed -E 's/.*@@?//' <<<"$ours" | sort -V | uniq -c | sed 's/^/    /'
if [ -n "$real" ] && grep -q ' IBVERBS_PRIVATE_34$' < <(nm -D "$real"); then
    theirs="$(versions "$real")"
    echo "$real (rdma-core, IBVERBS_PRIVATE_34): $(wc -l <<<"$theirs") symbols"
    if ! diff <(echo "$theirs") <(echo "$ours"); then
        fail "the drop-in's symbols differ from $real's (< theirs, > ours)"
    fi
    echo "identical names and versions"
else
    echo "no rdma-core v34-ABI libibverbs.so.1 to compare with (${real:-none found}); skipped"
fi

echo "== ibv_devices"
out="$(on 127.0.0.61 ibv_devices)"
printf '%s\n' "$out"
expect ibv_devices "$out" "ferroce0"
# The node GUID: 02:66:65:72 then the address (127.0.0.61 = 7f00003d).
expect ibv_devices "$out" "026665727f00003d"

echo "== ibv_devinfo -l"
out="$(on 127.0.0.62 ibv_devinfo -l)"
expect "ibv_devinfo -l" "$out" "1 HCA found:"
expect "ibv_devinfo -l" "$out" "ferroce0"

echo "== ibv_devinfo -v"
out="$(on 127.0.0.63 ibv_devinfo -v)"
printf '%s\n' "$out" | grep -E 'hca_id|transport|node_guid|vendor|phys_port_cnt|max_qp_wr|max_cqe|port:|state|mtu|link_layer|gid_tbl_len|GID'
expect "ibv_devinfo -v" "$out" "hca_id:	ferroce0"
expect "ibv_devinfo -v" "$out" "state:			PORT_ACTIVE (4)"
expect "ibv_devinfo -v" "$out" "link_layer:		Ethernet"
# Loopback's 65536-byte MTU gives 4096, as rxe derives it (ferroce::Nic::active_mtu).
expect "ibv_devinfo -v" "$out" "active_mtu:		4096 (5)"
expect "ibv_devinfo -v" "$out" "gid_tbl_len:		1"
expect "ibv_devinfo -v" "$out" "GID[  0]:		::ffff:127.0.0.63, RoCE v2"

echo "== ibv_devinfo with an unusable FERROCE_ADDR"
if out="$(on not-an-address ibv_devinfo 2>&1)"; then
    fail "ibv_devinfo opened the device with FERROCE_ADDR=not-an-address"
fi
expect "bad FERROCE_ADDR" "$out" 'FERROCE_ADDR="not-an-address" is not an IPv4 or IPv6 address'
# 127.0.0.0/8 is all local, 192.0.2.0/24 (TEST-NET-1) is no one's: binding it fails.
if out="$(on 192.0.2.1 ibv_devinfo 2>&1)"; then
    fail "ibv_devinfo opened the device on 192.0.2.1"
fi
expect "foreign FERROCE_ADDR" "$out" "192.0.2.1:4791 is not an address of this host"

# Another program holding 127.0.0.66:4791: a clear refusal naming the address.
out="$(python3 - "$dir" <<'PY'
import os, socket, subprocess, sys
held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
held.bind(("127.0.0.66", 4791))
env = dict(os.environ, LD_LIBRARY_PATH=sys.argv[1], FERROCE_ADDR="127.0.0.66")
r = subprocess.run(["ibv_devinfo"], env=env, capture_output=True, text=True)
print(f"exit {r.returncode}\n{r.stdout}{r.stderr}")
PY
)"
expect "address in use" "$out" "127.0.0.66:4791 is already in use"
expect "address in use" "$out" "Failed to open device"

echo "== stock programs load on the drop-in with LD_BIND_NOW=1"
programs=(ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat
    ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong ibv_devinfo ibv_devices)
for p in "${programs[@]}"; do
    command -v "$p" >/dev/null || continue
    # A program that also needs librdmacm.so.1 finds the drop-in's file under that name first
    # (the same file), and ldd then lists libibverbs.so.1 no more: it is the object loaded.
    resolved="$(LD_LIBRARY_PATH="$dir" ldd "$(command -v "$p")" |
        awk '($1 == "libibverbs.so.1" || $1 == "librdmacm.so.1") && !found { print $3; found = 1 }')"
    [ "$resolved" -ef "$lib" ] || fail "$p: ldd resolves libibverbs.so.1 to '$resolved', not $lib"
    # -h: perftest prints its usage and exits 1; the pingpongs and ibv_devinfo refuse the
    # option and print their usage. What must not happen is the loader failing first.
    rc=0
    out="$(LD_BIND_NOW=1 on 127.0.0.64 timeout 20 "$p" -h 2>&1)" || rc=$?
    if [ "$rc" -eq 127 ] || grep -qiE 'symbol lookup error|undefined symbol|version .* not found|no version information' <<<"$out"; then
        printf '%s\n' "$out" >&2
        fail "$p does not load on the drop-in (exit $rc)"
    fi
    # ibv_devices takes no options: it lists the devices whatever it is given.
    grep -qiE 'usage|options|ferroce0' <<<"$out" || {
        printf '%s\n' "$out" >&2
        fail "$p printed neither its usage nor the device (exit $rc)"
    }
    echo "    $p: loads (exit $rc)"
done

echo "== a C program built against rdma-core's headers, run on the drop-in"
out_dir="$(dirname "$dir")/test-dropin"
mkdir -p "$out_dir"
cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/c/stage0.c -libverbs -lmlx5 \
    -o "$out_dir/stage0"
on 127.0.0.65 timeout 60 "$out_dir/stage0"
cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/c/stage1.c -libverbs \
    -o "$out_dir/stage1"
on 127.0.0.81 timeout 60 "$out_dir/stage1"

echo "== the other ways in: NCCL_IBVERBS_LIB, and LD_PRELOAD for a program with its own copy"
# NCCL's loader: dlopen(NCCL_IBVERBS_LIB), dlvsym(…, "IBVERBS_1.1"); no LD_LIBRARY_PATH.
cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/c/nccl_load.c -ldl \
    -o "$out_dir/nccl_load"
env -u LD_LIBRARY_PATH NCCL_IBVERBS_LIB="$lib" FERROCE_ADDR=127.0.0.67 timeout 60 "$out_dir/nccl_load"
# A program that carries rdma-core's libibverbs.so.1 in a directory of its own, named by
# DT_RPATH (which the loader searches before LD_LIBRARY_PATH), as vendored and conda
# installs do: LD_LIBRARY_PATH does not reach it, LD_PRELOAD does.
[ -n "$real" ] || fail "no rdma-core libibverbs.so.1 to carry (scripts/bootstrap.sh installs libibverbs1)"
mkdir -p "$out_dir/private"
cp -L "$real" "$out_dir/private/libibverbs.so.1"
cc -std=gnu11 -Wall -Wextra -Werror -O2 crates/ferroce-ibverbs/tests/c/stage0.c \
    -libverbs -lmlx5 -Wl,--disable-new-dtags,-rpath,'$ORIGIN/private' -o "$out_dir/carries_its_own"
carried="$(LD_LIBRARY_PATH="$dir" ldd "$out_dir/carries_its_own" | awk '$1 == "libibverbs.so.1" { print $3 }')"
[ "$carried" -ef "$out_dir/private/libibverbs.so.1" ] ||
    fail "the program with DT_RPATH found libibverbs.so.1 at '$carried', not its own copy"
if out="$(on 127.0.0.65 timeout 60 "$out_dir/carries_its_own" 2>&1)"; then
    fail "LD_LIBRARY_PATH reached a program that carries its own libibverbs.so.1"
fi
echo "    LD_LIBRARY_PATH: its own copy answers, without ferroce0: $(tail -1 <<<"$out")"
# stage0 expects the address it is given in scripts/test-dropin.sh above.
env -u LD_LIBRARY_PATH LD_PRELOAD="$lib" FERROCE_ADDR=127.0.0.65 timeout 60 "$out_dir/carries_its_own"
echo "    LD_PRELOAD: the drop-in answers, and stage0 passes"

# Run a server and its client on their own addresses, both bounded in time: run_pair WHAT
# SRV_ADDR CLI_ADDR SRV_CMD CLI_CMD PATTERN... where SRV_CMD and CLI_CMD name arrays (the
# client gets the server's address last). Prints both outputs and fails unless both exit 0
# and print every pattern (a fixed string both print; or, prefixed client:, an extended regex
# the client prints).
run_pair() {
    local what="$1" srv_addr="$2" cli_addr="$3"
    local -n srv_cmd="$4" cli_cmd="$5"
    shift 5
    local patterns=("$@")
    local srv_out="$out_dir/$what.server" cli_out="$out_dir/$what.client" srv_rc=0 cli_rc=0
    on "$srv_addr" timeout 30 "${srv_cmd[@]}" >"$srv_out" 2>&1 &
    local srv_pid=$!
    # The server listens on its TCP port once its device is open: give it a moment, then
    # retry the client while the port is not yet open.
    local tries=0
    while :; do
        cli_rc=0
        on "$cli_addr" timeout 30 "${cli_cmd[@]}" "$srv_addr" >"$cli_out" 2>&1 || cli_rc=$?
        tries=$((tries + 1))
        if [ "$cli_rc" -eq 0 ] || [ "$tries" -ge 10 ] || ! grep -qF "Couldn't connect to $srv_addr" "$cli_out"; then
            break
        fi
        sleep 0.3
    done
    wait "$srv_pid" || srv_rc=$?
    # The results, and the first two address lines (srq_pingpong prints 16 pairs).
    echo "  -- $what server (exit $srv_rc):"
    awk '!/address:/ || n++ < 2' "$srv_out" | sed 's/^/     /'
    echo "  -- $what client (exit $cli_rc):"
    awk '!/address:/ || n++ < 2' "$cli_out" | sed 's/^/     /'
    [ "$srv_rc" -eq 0 ] && [ "$cli_rc" -eq 0 ] || fail "$what: server exit $srv_rc, client exit $cli_rc"
    local p
    for p in "${patterns[@]}"; do
        case "$p" in
        client:*)
            grep -qE -- "${p#client:}" "$cli_out" || fail "$what client: no line matching '${p#client:}'"
            ;;
        *)
            expect "$what server" "$(cat "$srv_out")" "$p"
            expect "$what client" "$(cat "$cli_out")" "$p"
            ;;
        esac
    done
}

# pair WHAT SRV_ADDR CLI_ADDR CMD... -- PATTERN...: the same stock program on both sides.
pair() {
    local what="$1" srv_addr="$2" cli_addr="$3"
    shift 3
    local cmd=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        cmd+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    run_pair "$what" "$srv_addr" "$cli_addr" cmd cmd "$@"
}

echo "== rdma-core's pingpongs, both sides on the drop-in (stage 1)"
pair rc_pingpong 127.0.0.71 127.0.0.72 ibv_rc_pingpong -d ferroce0 -g 0 -p 18671 -- "8192000 bytes in" "1000 iters in"
pair rc_pingpong_events 127.0.0.73 127.0.0.74 ibv_rc_pingpong -d ferroce0 -g 0 -e -p 18673 -- "8192000 bytes in" "1000 iters in"
pair uc_pingpong 127.0.0.75 127.0.0.76 ibv_uc_pingpong -d ferroce0 -g 0 -p 18675 -- "8192000 bytes in" "1000 iters in"
pair ud_pingpong 127.0.0.77 127.0.0.78 ibv_ud_pingpong -d ferroce0 -g 0 -p 18677 -- "2048000 bytes in" "1000 iters in"
pair srq_pingpong 127.0.0.79 127.0.0.80 ibv_srq_pingpong -d ferroce0 -g 0 -p 18679 -- "8192000 bytes in" "1000 iters in"

echo "== ibv_rc_pingpong on the drop-in against ferroce's own pingpong, both roles"
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"
# The workspace, as scripts/build-dropin.sh builds it (one package alone relinks the binary).
cargo build --release --locked --workspace >&2
# ferroce's pingpong runs its own soft NIC (on --local); it must not find the drop-in.
ferroce_pp=(env -u LD_LIBRARY_PATH "$dir/ferroce" pingpong -d ferroce0 -p 18697)
stock=(ibv_rc_pingpong -d ferroce0 -g 0 -p 18697)
ferroce_srv=("${ferroce_pp[@]}" --local 127.0.0.96)
ferroce_cli=("${ferroce_pp[@]}" --local 127.0.0.99)
run_pair rc_pingpong_vs_ferroce_server 127.0.0.96 127.0.0.97 ferroce_srv stock "8192000 bytes in" "1000 iters in"
run_pair rc_pingpong_vs_ferroce_client 127.0.0.98 127.0.0.99 stock ferroce_cli "8192000 bytes in" "1000 iters in"

# perftest's result rows: size, iterations, then numbers (BW peak, average… or t_min, t_max…).
row='client:^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+ +[0-9]+\.[0-9]+'
echo "== perftest 4.5, both sides on the drop-in (stage 1)"
pair ib_write_bw 127.0.0.82 127.0.0.83 ib_write_bw -d ferroce0 -x 0 -p 18681 -- "BW average[MB/sec]" "$row"
pair ib_send_bw 127.0.0.84 127.0.0.85 ib_send_bw -d ferroce0 -x 0 -p 18683 -- "BW average[MB/sec]" "$row"
pair ib_read_bw 127.0.0.86 127.0.0.87 ib_read_bw -d ferroce0 -x 0 -p 18685 -- "BW average[MB/sec]" "$row"
pair ib_atomic_bw 127.0.0.88 127.0.0.89 ib_atomic_bw -d ferroce0 -x 0 -p 18687 -- "BW average[MB/sec]" "$row"
pair ib_write_lat 127.0.0.90 127.0.0.91 ib_write_lat -d ferroce0 -x 0 -p 18689 -- "t_avg[usec]" "$row"
pair ib_send_lat 127.0.0.92 127.0.0.93 ib_send_lat -d ferroce0 -x 0 -p 18691 -- "t_avg[usec]" "$row"
# ib_read_lat's server only answers READs: the client alone prints the table.
pair ib_read_lat 127.0.0.94 127.0.0.95 ib_read_lat -d ferroce0 -x 0 -p 18693 -- "RDMA_Read Latency Test" \
    "client:t_avg\[usec\]" "$row"

# The other transports and a completion channel (addresses reused: the pairs run one by one).
pair ib_send_bw_ud 127.0.0.82 127.0.0.83 ib_send_bw -c UD -d ferroce0 -x 0 -p 18701 -- "BW average[MB/sec]" "$row"
pair ib_send_lat_ud 127.0.0.84 127.0.0.85 ib_send_lat -c UD -d ferroce0 -x 0 -p 18703 -- "t_avg[usec]" "$row"
pair ib_write_bw_uc 127.0.0.86 127.0.0.87 ib_write_bw -c UC -d ferroce0 -x 0 -p 18705 -- "BW average[MB/sec]" "$row"
pair ib_send_bw_events 127.0.0.88 127.0.0.89 ib_send_bw -e -d ferroce0 -x 0 -p 18707 -- "BW average[MB/sec]" "$row"

# Under loss, reordering and duplication, injected by the drop-in on every packet it sends
# (FERROCE_FAULT, as ferroce's --fault): each program must complete, and FERROCE_STATS prints
# each side's counters when it closes, which must show the losses recovered. A post held
# behind a full queue (ib_write_bw -s 64) and a completion channel (ib_send_bw -e) meet the
# losses too. One client also writes a capture (FERROCE_PCAP), read back below. perftest ends
# each test with an exchange over TCP after every request is answered; rdma-core's pingpongs
# exit after their last completion, and under loss the peer may then wait for an ACK that
# was lost, on any RDMA stack (run by hand, they pass most times: README.md).
echo "== perftest under FERROCE_FAULT, with FERROCE_STATS and FERROCE_PCAP"
faults=(env FERROCE_FAULT=loss=0.02,reorder=0.02,dup=0.01 FERROCE_STATS=1)
recovered='client:(rcvd_seq_err|early_resends) [1-9]'
stats='ferroce-ibverbs: link ferroce0/1 sent_pkts'
capture="$out_dir/faults_send_bw.pcap"
send_srv=("${faults[@]}" ib_send_bw -d ferroce0 -x 0 -p 18711 -m 1024 -s 4096 -n 2000)
send_cli=("${faults[@]}" FERROCE_PCAP="$capture" "${send_srv[@]:${#faults[@]}}")
run_pair faults_send_bw 127.0.0.71 127.0.0.72 send_srv send_cli "$row" "$stats" "$recovered"
pair faults_write_bw_64 127.0.0.73 127.0.0.74 "${faults[@]}" ib_write_bw -d ferroce0 -x 0 -p 18713 -s 64 -n 20000 -- "$row" "$stats" "$recovered"
pair faults_send_bw_events 127.0.0.75 127.0.0.76 "${faults[@]}" ib_send_bw -e -d ferroce0 -x 0 -p 18715 -s 64 -n 10000 -- "$row" "$stats" "$recovered"
pair faults_read_bw 127.0.0.77 127.0.0.78 "${faults[@]}" ib_read_bw -d ferroce0 -x 0 -p 18717 -s 4096 -n 2000 -- "$row" "$stats" "$recovered"
pair faults_atomic_bw 127.0.0.79 127.0.0.80 "${faults[@]}" ib_atomic_bw -d ferroce0 -x 0 -p 18719 -n 5000 -- "$row" "$stats" "$recovered"
pair faults_write_lat 127.0.0.82 127.0.0.83 "${faults[@]}" ib_write_lat -d ferroce0 -x 0 -p 18721 -s 8 -n 2000 -- "$row" "$stats"
pair faults_read_lat 127.0.0.84 127.0.0.85 "${faults[@]}" ib_read_lat -d ferroce0 -x 0 -p 18723 -s 64 -n 2000 -- "client:t_avg\[usec\]" "$row"

# The capture, read by `ferroce decode` (each packet parsed and its ICRC checked, as Wireshark
# would): every frame RoCE v2, every one of the client's 8,000 SEND packets (2,000 messages of
# 4 KiB at MTU 1024) among them, some sent twice (go-back-N and early resends).
decoded="$out_dir/faults_send_bw.decoded"
env -u LD_LIBRARY_PATH "$dir/ferroce" decode --json "$capture" >"$decoded" 2>"$decoded.summary" ||
    fail "ferroce decode found a packet of the capture that does not parse or has a bad ICRC: $(cat "$decoded.summary")"
python3 - "$decoded" "$decoded.summary" 127.0.0.72 <<'PY' || fail "the capture FERROCE_PCAP wrote is not what was sent"
import json, re, sys
summary = open(sys.argv[2]).read()
frames, roce = map(int, re.search(r"(\d+) frames, (\d+) RoCE packets", summary).groups())
sends = [p for p in map(json.loads, open(sys.argv[1]))
         if p["src"] == sys.argv[3] and p["opcode_name"].startswith("RC_SEND")]
psns = {p["psn"] for p in sends}
print(f"    capture: {frames} frames, {roce} RoCE v2, {len(psns)} SEND PSNs, {len(sends) - len(psns)} sent again")
assert frames > 0 and roce == frames, "frames that are not RoCE v2"
assert len(psns) >= 8000, "not every SEND packet of the run"
assert len(sends) > len(psns), "no resend under 2 % loss"
PY

echo "== an unusable FERROCE_FAULT, FERROCE_STATS or FERROCE_PCAP"
if out="$(on 127.0.0.84 env FERROCE_FAULT=loss=2 ibv_devinfo 2>&1)"; then
    fail "ibv_devinfo opened the device with FERROCE_FAULT=loss=2"
fi
expect "bad FERROCE_FAULT" "$out" "FERROCE_FAULT: bad fault specification"
expect "bad FERROCE_FAULT" "$out" "loss=2 is not a probability in 0..1"
if out="$(on 127.0.0.84 env FERROCE_STATS=yes ibv_devinfo 2>&1)"; then
    fail "ibv_devinfo opened the device with FERROCE_STATS=yes"
fi
expect "bad FERROCE_STATS" "$out" 'FERROCE_STATS: "yes" is neither 1'
if out="$(on 127.0.0.84 env FERROCE_PCAP="$out_dir/no-such-dir/x.pcap" ibv_devinfo 2>&1)"; then
    fail "ibv_devinfo opened the device with a capture it cannot create"
fi
expect "unwritable FERROCE_PCAP" "$out" "cannot write the capture $out_dir/no-such-dir/x.pcap: No such file or directory"

echo "test-dropin: all passed"
