#!/usr/bin/env python3
"""Golden vectors for the CM codec: connection management between two kernel rxe guests.

    cm_captures.py [--out DIR] [--only REGEX] [--list] [--keep]

Boots the interop lab's two guests (interop/lab.py), runs librdmacm's and perftest's own tools
between them, rxe on both ends (ferroce takes no part), and captures on the bridge. Each
capture keeps only the CM MADs: UD SEND_ONLY packets to QP 1 whose UDP payload is a BTH, a
DETH, 256 bytes of MAD and the ICRC. The files go to testdata/cm/NAME.pcap (or --out), and
only once every exchange asked for has produced the messages it must; until then they stay
in this run's own folder under /var/tmp/ferroce-interop, apart from the suite's `last`.

Python 3 standard library only. Needs root and QEMU, as the lab does. The tests that read the
files are crates/ferroce/tests/cm_captures.rs; testdata/cm/README.md says how they were taken.
"""

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as labmod  # noqa: E402
from lab import GUEST_ADDRS, Lab, LabError, log  # noqa: E402

SERVER, CLIENT = "vm1", "vm2"
SADDR = GUEST_ADDRS[SERVER]
# Only UD SEND_ONLY (BTH opcode 0x64) to destination QP 1 reaches the file.
BPF = "udp dst port 4791 and udp[8] = 0x64 and (udp[12:4] & 0xffffff) = 1"
ROCE_PORT = 4791
UD_SEND_ONLY = 0x64
MAD_LEN = 256
# BTH 12 + DETH 8 + MAD 256 + ICRC 4
CM_UDP_PAYLOAD = 12 + 8 + MAD_LEN + 4
ATTRS = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ",
         0x16: "DREP", 0x17: "SIDR_REQ", 0x18: "SIDR_REP", 0x19: "LAP", 0x1A: "APR"}


class Exchange:
    """One capture: an optional server on vm1 (waited for until its rdma_cm id listens on
    `port`), a client on vm2 with the exit status it must end with, and the CM messages the
    capture must hold (each at least as many times as listed)."""

    def __init__(self, name, server, port, client, client_rc, expect, about):
        self.name, self.server, self.port = name, server, port
        self.client, self.client_rc = client, client_rc
        self.expect, self.about = expect, about


EXCHANGES = [
    Exchange("rping", f"rping -s -a {SADDR} -C 1", 7174,
             f"rping -c -a {SADDR} -C 1 -v", 0,
             {"REQ": 1, "REP": 1, "RTU": 1, "DREQ": 1, "DREP": 1},
             "one RC connection on port 7174 (PS_TCP), one ping, disconnect"),
    Exchange("ucmatose", f"ucmatose -b {SADDR} -c 2", 7471,
             f"ucmatose -s {SADDR} -c 2", 0,
             {"REQ": 2, "REP": 2, "RTU": 2, "DREQ": 2, "DREP": 2},
             "two RC connections on port 7471, SENDs both ways, the server disconnecting"),
    Exchange("udaddy", f"udaddy -b {SADDR}", 7174,
             f"udaddy -s {SADDR}", 0,
             {"SIDR_REQ": 1, "SIDR_REP": 1},
             "SIDR on port 7174 (PS_UDP), then datagrams both ways"),
    Exchange("ib_send_bw-rc", "ib_send_bw -R -d rxe0 -F -n 5", 18515,
             f"ib_send_bw -R -d rxe0 -F -n 5 {SADDR}", 0,
             {"REQ": 1, "REP": 1, "RTU": 1},
             "perftest over rdma_cm (-R), RC, port 18515"),
    Exchange("rping-rej8", None, None,
             f"rping -c -a {SADDR} -p 9999 -C 1", 255,
             {"REQ": 1, "REJ": 1},
             "a REQ for port 9999, where nobody listens: REJ reason 8"),
    Exchange("ib_send_bw-ud", "ib_send_bw -R -c UD -d rxe0 -F -n 5", 18515,
             f"ib_send_bw -R -c UD -d rxe0 -F -n 5 {SADDR}", 0,
             {"SIDR_REQ": 1, "SIDR_REP": 1},
             "perftest over rdma_cm (-R), UD: SIDR on port 18515 (PS_UDP)"),
    Exchange("udaddy-unreachable", None, None,
             f"udaddy -s {SADDR}", 1,
             {"SIDR_REQ": 1, "SIDR_REP": 1},
             "a SIDR_REQ for port 7174 where nobody listens: SIDR_REP status 1"),
]


# ---------------------------------------------------------------------------------------------
# pcap, as tcpdump writes it (classic format, Ethernet)


def read_pcap(path):
    """(global header bytes, byte order, [(record header, frame bytes)])."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        raise LabError(f"{path}: not a pcap file ({len(data)} bytes)")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        order = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        order = ">"
    else:
        raise LabError(f"{path}: not a classic pcap file (magic {magic.hex()})")
    linktype = struct.unpack(order + "I", data[20:24])[0]
    if linktype != 1:
        raise LabError(f"{path}: link type {linktype}, expected Ethernet (1)")
    records, at = [], 24
    while at + 16 <= len(data):
        head = data[at:at + 16]
        caplen = struct.unpack(order + "IIII", head)[2]
        frame = data[at + 16:at + 16 + caplen]
        if len(frame) < caplen:
            break  # the last record cut short by tcpdump's end: not a whole frame
        records.append((head, frame))
        at += 16 + caplen
    return data[:24], order, records


def cm_mad(frame):
    """The 256-byte MAD of a CM packet in an Ethernet frame, or None for any other frame."""
    if len(frame) < 14 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 17:
        return None
    ihl = (ip[0] & 0x0F) * 4
    total = struct.unpack(">H", ip[2:4])[0]
    udp = ip[ihl:total]
    if len(udp) < 8:
        return None
    dport, ulen = struct.unpack(">HH", udp[2:6])
    payload = udp[8:ulen]
    if dport != ROCE_PORT or len(payload) != CM_UDP_PAYLOAD:
        return None
    dest_qp = struct.unpack(">I", payload[4:8])[0] & 0xFFFFFF
    if payload[0] != UD_SEND_ONLY or dest_qp != 1:
        return None
    mad = payload[20:20 + MAD_LEN]
    # MAD base version 1, class 0x07 (CM)
    if mad[0] != 1 or mad[1] != 0x07:
        return None
    return mad


def keep_cm(src, dest):
    """Writes to `dest` the CM MAD frames of `src`; returns their attribute names in order."""
    header, order, records = read_pcap(src)
    kept, names = [], []
    for head, frame in records:
        mad = cm_mad(frame)
        if mad is None:
            continue
        kept.append(head + frame)
        attr = struct.unpack(">H", mad[16:18])[0]
        names.append(ATTRS.get(attr, f"0x{attr:04x}"))
    with open(dest, "wb") as f:
        f.write(header)
        for rec in kept:
            f.write(rec)
    return names


# ---------------------------------------------------------------------------------------------
# Running the tools


def wait_cm_listen(guest, port, timeout):
    """Until the guest's kernel lists an rdma_cm id listening on `port`."""
    script = (f"i=0; while [ $i -lt {int(timeout * 10)} ]; do "
              f"rdma res show cm_id 2>/dev/null | grep LISTEN | grep -qE ':{port}( |$)' && exit 0; "
              "usleep 100000; i=$((i+1)); done; exit 1")
    rc, _ = guest.sh(script, limit=timeout + 5, check=False)
    return rc == 0


def start_tcpdump(lab, pcap, logpath):
    dump = lab.spawn(["tcpdump", "-i", labmod.BRIDGE, "-n", "-s", "0", "-U", "--immediate-mode",
                      "-w", pcap, BPF], "tcpdump " + os.path.basename(pcap), log=logpath)
    deadline = time.time() + 15
    while time.time() < deadline:
        with open(logpath, errors="replace") as f:
            if "listening on" in f.read():
                return dump
        if dump.poll() is not None:
            raise LabError(f"tcpdump exited:\n{open(logpath, errors='replace').read().strip()}")
        time.sleep(0.05)
    lab.stop(dump)
    raise LabError("tcpdump did not start")


def run_exchange(lab, ex, workdir, limit=60):
    """Runs one exchange under capture; returns (problems, the CM messages kept, outputs)."""
    problems, outputs = [], {}
    raw = os.path.join(workdir, ex.name + ".raw.pcap")
    kept = os.path.join(workdir, ex.name + ".pcap")
    srv = None
    dump = start_tcpdump(lab, raw, os.path.join(workdir, ex.name + ".tcpdump.log"))
    try:
        if ex.server:
            srv = lab.guest(SERVER).start(ex.server, limit, ex.server)
            if not wait_cm_listen(lab.guest(SERVER), ex.port, 30):
                srv.wait(5)
                raise LabError(f"the server never listened on rdma_cm port {ex.port}:\n"
                               f"{srv.output().strip()[-800:]}")
        cli = lab.guest(CLIENT).start(ex.client, limit, ex.client)
        crc = cli.wait(limit + 10)
        outputs["client"] = cli.out
        if crc is None:
            problems.append(f"client timed out after {limit} s")
        elif crc != ex.client_rc:
            problems.append(f"client exit {crc}, expected {ex.client_rc}")
        if srv is not None:
            src = srv.wait(20)
            outputs["server"] = srv.out
            if src is None:
                problems.append("server did not finish (killed)")
            elif src != 0:
                problems.append(f"server exit {src}")
        # the last DREP may still be on its way when both tools have exited
        time.sleep(1.0)
    except LabError as e:
        problems.append(str(e))
    finally:
        if srv is not None and srv.rc is None:
            srv.kill()
        time.sleep(0.2)
        lab.stop(dump)
    names = keep_cm(raw, kept) if os.path.exists(raw) else []
    for attr, n in ex.expect.items():
        if names.count(attr) < n:
            problems.append(f"{names.count(attr)} {attr} in the capture, expected at least {n}")
    for tag, text in outputs.items():
        with open(os.path.join(workdir, f"{ex.name}.{tag}.log"), "w") as f:
            f.write(text)
    return problems, names, outputs


def lab_facts(lab):
    """What the README records: the guest kernel and the host packages the tools come from."""
    _, kernel = lab.guest(SERVER).sh("uname -r")
    return {
        "guest_kernel": kernel.strip(),
        "packages": labmod.package_versions(["rdmacm-utils", "perftest", "ibverbs-providers",
                                             "librdmacm1"]),
        "accel": lab.accel,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(labmod.REPO, "testdata", "cm"),
                    help="where the captures go once all are taken (default testdata/cm)")
    ap.add_argument("--only", default="", help="take only the captures whose name matches")
    ap.add_argument("--list", action="store_true", help="list the captures and exit")
    ap.add_argument("--keep", action="store_true",
                    help="keep this run's folder (logs, tcpdump's own files) after success")
    args = ap.parse_args()
    chosen = [ex for ex in EXCHANGES if re.search(args.only, ex.name)]
    if args.list:
        for ex in chosen:
            print(f"{ex.name:20} {ex.about}")
        return 0
    if not chosen:
        print(f"no capture matches {args.only!r}", file=sys.stderr)
        return 2
    # A folder of this run's own: the suite's `last` may be in use by another run, which
    # replaces it when it starts. For the same reason the lab's clean-up of a dead earlier run
    # (which works on `last`, and refuses to start while a live run owns it) is not ours to do:
    # a concurrent suite run is expected, and its processes and namespace are its own.
    rundir = os.path.join(labmod.CACHE, f"cm-captures-{os.getpid()}")
    labmod.cleanup_stale = lambda: None
    workdir = os.path.join(rundir, "captures")
    results, facts = {}, {}
    try:
        with Lab(guests=(SERVER, CLIENT), rundir=rundir) as lab:
            os.makedirs(workdir)
            facts = lab_facts(lab)
            log(f"guest kernel {facts['guest_kernel']}; {facts['packages']}")
            for ex in chosen:
                t0 = time.time()
                problems, names, outputs = run_exchange(lab, ex, workdir)
                results[ex.name] = {"messages": names, "problems": problems,
                                    "server": ex.server, "client": ex.client}
                log(f"{'PASS' if not problems else 'FAIL'} {ex.name} ({time.time() - t0:.1f} s): "
                    f"{' '.join(names) or 'no CM message'}")
                for p in problems:
                    for line in p.splitlines()[:12]:
                        log(f"     {line}")
                if problems:
                    for tag, text in outputs.items():
                        tail = "\n".join(text.strip().splitlines()[-6:])
                        log(f"     {tag} said:\n{tail}")
    except LabError as e:
        print(f"interop: FAILED: {e}", file=sys.stderr)
        print(f"interop: this run's files are in {rundir}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"interop: interrupted ({e}); everything torn down", file=sys.stderr)
        return 130
    with open(os.path.join(rundir, "cm_captures.json"), "w") as f:
        json.dump({"facts": facts, "results": results}, f, indent=1)
    failed = [n for n, r in results.items() if r["problems"]]
    if failed:
        log(f"not copied to {args.out}: {', '.join(failed)} failed; files in {rundir}")
        return 1
    os.makedirs(args.out, exist_ok=True)
    for ex in chosen:
        shutil.copyfile(os.path.join(workdir, ex.name + ".pcap"),
                        os.path.join(args.out, ex.name + ".pcap"))
    log(f"{len(chosen)} captures written to {args.out} (guest kernel {facts['guest_kernel']}, "
        f"{facts['date']})")
    if args.keep:
        log(f"this run's files: {rundir}")
    else:
        shutil.rmtree(rundir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
