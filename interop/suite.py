#!/usr/bin/env python3
"""ferroce against Linux kernel Soft-RoCE (rdma_rxe), rdma-core and perftest in QEMU guests.

    suite.py test  [--only REGEX] [--list]     interop: guest tools <-> ferroce on the host
    suite.py bench [--only REGEX] [--reps N]   side by side: rxe <-> rxe and ferroce <-> ferroce
    suite.py responder [--reps N]             a guest's responder, rxe's and ferroce's, answering
                                               between two guests; prints the BENCHMARKS table
    suite.py floor [--reps N] [--offloads]     write latency and bandwidth, rxe <-> rxe and
                                               ferroce <-> ferroce beside plain UDP between the
                                               same guests (what any user-space RoCE could reach)

Python 3 standard library only; the lab itself is interop/lab.py. Needs root, QEMU and the
ferroce release binary (FERROCE_BIN, default target/release/ferroce). interop/run.sh is the
entry CI uses. Everything a run leaves (logs, captures, results.json) is under
/var/tmp/ferroce-interop/last.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as labmod  # noqa: E402
from lab import HOST_ADDR, GUEST_ADDRS, Lab, LabError, log  # noqa: E402

PORT = 18515
# rping's default rdma_cm port
RPING_PORT = 7174
GUEST_BIN = "/usr/local/bin/ferroce"  # copied from the share at boot (guest-init.sh)
MIB = 1 << 20

# perftest tool, ferroce perf subcommand, kind
PERF_TESTS = [
    ("ib_write_bw", "write-bw", "bw"),
    ("ib_read_bw", "read-bw", "bw"),
    ("ib_send_bw", "send-bw", "bw"),
    ("ib_atomic_bw", "atomic-bw", "bw"),
    ("ib_write_lat", "write-lat", "lat"),
    ("ib_read_lat", "read-lat", "lat"),
    ("ib_send_lat", "send-lat", "lat"),
]


def env_int(name, default):
    return int(os.environ.get(name, default))


# Iteration counts, small under TCG (the suite's time budget); FERROCE_INTEROP_SCALE multiplies.
SCALE = float(os.environ.get("FERROCE_INTEROP_SCALE", "1"))


def iters(n):
    return max(5, int(n * SCALE))


class Endpoint:
    """One side of a run: where it runs (host or a guest) and what: rxe's tools ("rxe"),
    ferroce's soft NIC ("ferroce"), ferroce as a verbs user of the guest's rxe0 ("verbs"), or
    rdma-core's stock tools on the host with ferroce's drop-in libibverbs.so.1 ("dropin",
    device ferroce0, its one GID at index 0)."""

    def __init__(self, lab, where, impl, events=False):
        self.lab, self.where, self.impl = lab, where, impl
        self.events = events
        self.addr = HOST_ADDR if where == "host" else GUEST_ADDRS[where]
        if where == "host":
            assert impl in ("ferroce", "dropin"), "the host kernel has no rxe"
            self.bin = os.path.join(lab.export, "ferroce")
            # the stock tools, finding the drop-in first on the library path
            self.stock = (f"env LD_LIBRARY_PATH={lab.dropin_dir} FERROCE_ADDR={self.addr} "
                          if impl == "dropin" else None)
        else:
            self.bin = GUEST_BIN

    def label(self):
        return f"{self.impl}@{self.where}"

    def pingpong(self, size, mtu, n, server=None):
        if self.impl == "rxe":
            cmd = f"ibv_rc_pingpong -d rxe0 -g 1 -s {size} -m {mtu} -n {n} -c"
        elif self.impl == "dropin":
            cmd = f"{self.stock}ibv_rc_pingpong -d ferroce0 -g 0 -s {size} -m {mtu} -n {n} -c"
        elif self.impl == "verbs":
            cmd = f"{self.bin} pingpong -d rxe0 -g 1 -s {size} -m {mtu} -n {n} -c"
        else:
            cmd = f"{self.bin} pingpong --local {self.addr} -g 1 -s {size} -m {mtu} -n {n} -c"
        if self.events:
            cmd += " -e"
        return cmd + (f" {server}" if server else "")

    def ud_pingpong(self, size, n, server=None):
        if self.impl == "rxe":
            cmd = f"ibv_ud_pingpong -d rxe0 -g 1 -s {size} -n {n}"
        elif self.impl == "dropin":
            cmd = f"{self.stock}ibv_ud_pingpong -d ferroce0 -g 0 -s {size} -n {n}"
        else:
            cmd = f"{self.bin} ud-pingpong --local {self.addr} -g 1 -s {size} -n {n}"
        return cmd + (f" {server}" if server else "")

    def srq_pingpong(self, qps, size, n, server=None):
        flags = f"-g 1 -q {qps} -s {size} -n {n}"
        if self.impl == "rxe":
            cmd = f"ibv_srq_pingpong -d rxe0 {flags}"
        else:
            cmd = f"{self.bin} srq-pingpong --local {self.addr} {flags}"
        return cmd + (f" {server}" if server else "")

    def rping(self, size, count, server=None, port=None):
        """rping's server (`-s -a` its own address) or client (`-c -a` the server's); the
        client pings `count` times and validates every ping."""
        port = port or RPING_PORT
        if self.impl == "rxe":
            tool = "rping"
        elif self.impl == "dropin":
            tool = f"{self.stock}rping"
        else:
            tool = f"{self.bin} rping"
        if server is None:
            return f"{tool} -s -a {self.addr} -p {port} -S {size} -v"
        source = "" if self.impl in ("rxe", "dropin") else f" -I {self.addr}"
        return f"{tool} -c -a {server}{source} -p {port} -S {size} -C {count} -v -V"

    def cmatose(self, tool, flags, server=None):
        """ucmatose or udaddy: the server binds its address (`-b`), the client names the
        server (`-s`) and, for ferroce, its own (`-b`)."""
        if self.impl == "rxe":
            cmd = tool
        elif self.impl == "dropin":
            cmd = f"{self.stock}{tool}"
        else:
            cmd = f"{self.bin} {tool}"
        if server is None:
            return f"{cmd} -b {self.addr} {flags}"
        source = "" if self.impl in ("rxe", "dropin") else f" -b {self.addr}"
        return f"{cmd} -s {server}{source} {flags}"

    def perf(self, tool, sub, flags, server=None):
        if self.impl == "rxe":
            cmd = f"{tool} -d rxe0 -x 1 -F {flags}"
        elif self.impl == "verbs":
            cmd = f"{self.bin} perf {sub} -d rxe0 -x 1 -F {flags}"
        else:
            cmd = f"{self.bin} perf {sub} --local {self.addr} -x 1 -F {flags}"
        return cmd + (f" {server}" if server else "")


class Running:
    """A command started on the host (in the namespace) or in a guest."""

    def __init__(self, lab, where, cmd, limit, logpath):
        self.lab, self.where, self.cmd, self.limit = lab, where, cmd, limit
        self.logpath = logpath
        self.rc, self.out = None, ""
        if where == "host":
            self.proc = lab.spawn(["timeout", "-s", "KILL", str(int(limit)), "sh", "-c", cmd],
                                  f"host: {cmd}", log=logpath)
            self.job = None
        else:
            self.proc = None
            self.job = lab.guest(where).start(cmd, limit, cmd)

    def wait(self, timeout):
        if self.proc is not None:
            try:
                self.rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.lab.stop(self.proc)
                self.rc = None
            with open(self.logpath, errors="replace") as f:
                self.out = f.read()
            self.lab.procs = [(q, w) for q, w in self.lab.procs if q is not self.proc]
        else:
            self.rc = self.job.wait(timeout)
            self.out = self.job.out if self.rc is not None else self.job.output()
            with open(self.logpath, "w") as f:
                f.write(self.out)
        return self.rc

    def kill(self):
        if self.proc is not None:
            self.lab.stop(self.proc)
        elif self.job is not None:
            self.job.kill()

    def wait_cm_listen(self, port, timeout):
        """An rdma_cm listener is up: in a guest, `rdma res show cm_id` lists it; on the host,
        ferroce's soft NIC holds UDP 4791 (its listener follows within milliseconds)."""
        if self.where == "host":
            deadline = time.time() + timeout
            while time.time() < deadline:
                p = subprocess.run(["ip", "netns", "exec", self.lab.ns, "ss", "-Hlun", "sport = :4791"],
                                   text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                if p.stdout.strip():
                    time.sleep(0.3)
                    return True
                if self.proc.poll() is not None:
                    return False
                time.sleep(0.05)
            return False
        script = (f"i=0; while [ $i -lt {int(timeout * 10)} ]; do "
                  f"rdma res show cm_id 2>/dev/null | grep LISTEN | grep -q ':{port}' && exit 0; "
                  "usleep 100000; i=$((i+1)); done; exit 1")
        rc, _ = self.lab.guest(self.where).sh(script, limit=timeout + 5, check=False)
        return rc == 0

    def wait_listen(self, port, timeout):
        if self.where == "host":
            return self.lab.wait_host_listen(port, timeout, self.proc)
        rc, _ = self.lab.guest(self.where).sh(f"wait-listen {port} {int(timeout * 10)}", limit=timeout + 5,
                                               check=False)
        return rc == 0


def parse_metrics(kind, out):
    """Figures from ibv_rc_pingpong's / perftest's output (ferroce prints the same)."""
    m = {}
    if kind == "pingpong":
        r = re.search(r"(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec", out)
        if r:
            m["mbit_s"] = float(r.group(3))
        r = re.search(r"(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter", out)
        if r:
            m["usec_iter"] = float(r.group(3))
    elif kind == "rping":
        pings = re.findall(r"^ping data: rdma-ping-\d+", out, re.M)
        if pings:
            m["pings"] = len(pings)
    elif kind == "cm":
        if re.search(r"^data transfers complete$", out, re.M) and re.search(r"^return status 0$", out, re.M):
            m["complete"] = True
    elif kind == "bw":
        for line in out.splitlines():
            f = line.split()
            if len(f) == 5 and f[0].isdigit() and f[1].isdigit():
                m.update(bytes=int(f[0]), iters=int(f[1]), bw_peak=float(f[2]), bw_avg=float(f[3]),
                         mpps=float(f[4]))
    elif kind == "lat":
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 7 and f[0].isdigit() and f[1].isdigit():
                try:
                    m.update(bytes=int(f[0]), iters=int(f[1]), t_min=float(f[2]), t_max=float(f[3]),
                             t_typical=float(f[4]), t_avg=float(f[5]))
                except ValueError:
                    pass
    return m


def rping_teardown_race(kind, server, out, rc, client_cmd):
    """Whether a guest's stock rping server failed only in rdma-core's teardown race, fixed
    upstream in 2025 (linux-rdma/rdma-core#1622) after Debian 12's rdma-core: its CM thread
    calls rdma_get_cm_event once more after the last event, on a channel the main thread has
    destroyed, and the process exits 255 though the test passed. Only when that error is all
    it said beside the peer's disconnect and a ping for every one the client sent (its stderr
    comes before its buffered stdout)."""
    if kind != "rping" or server.impl != "rxe" or rc != 255:
        return False
    want = int(re.search(r"-C (\d+)", client_cmd).group(1))
    lines = [line for line in out.splitlines() if line.strip()]
    pings = [line for line in lines if line.startswith("server ping data: rdma-ping-")]
    rest = {line for line in lines if line not in pings}
    return len(pings) == want and rest == {
        "server DISCONNECT EVENT...", "wait for RDMA_READ_ADV state 10",
        "rdma_get_cm_event: Bad file descriptor"}


def check_capture(lab, pcap, expect_loss):
    """Every packet decodes with ferroce decode, every ICRC ok, tshark finds nothing malformed.
    Returns (problems, facts)."""
    problems, facts = [], {}
    binary = os.path.join(lab.export, "ferroce")
    p = subprocess.run([binary, "decode", "--json", pcap], text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    summary = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode != 0:
        problems.append(f"ferroce decode exit {p.returncode}: {summary}")
    packets = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    bad = [x for x in packets if x.get("icrc") != "ok" or "error" in x]
    if bad:
        problems.append(f"{len(bad)} packets with a bad ICRC or a parse error, first: {bad[0]}")
    if not packets:
        problems.append("no RoCE packet in the capture")
    seen, retrans, naks = set(), 0, 0
    for x in packets:
        key = (x.get("src"), x.get("dest_qp"), x.get("psn"), x.get("opcode"))
        if key in seen:
            retrans += 1
        seen.add(key)
        syn = (x.get("aeth") or {}).get("syndrome")
        if syn is not None and (syn & 0x60) in (0x20, 0x60):
            naks += 1
    facts.update(packets=len(packets), resent=retrans, naks=naks)
    t = subprocess.run(["nice", "-n", str(labmod.NICE), "tshark", "-n", "-r", pcap, "-d", "udp.port==4791,infiniband",
                        # RPC-over-RDMA's heuristic claims SEND payloads and calls them malformed
                        "--disable-protocol", "rpcordma",
                        "-Y", "_ws.malformed || _ws.expert.severity == error", "-T", "fields",
                        "-e", "frame.number", "-e", "frame.protocols"],
                       text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if t.returncode != 0:
        problems.append(f"tshark exit {t.returncode}: {t.stderr.strip()[:300]}")
    else:
        real, payload = [], []
        for line in t.stdout.splitlines():
            number, _, protos = line.partition("\t")
            layers = protos.split(":")
            # Wireshark's InfiniBand dissector hands a payload whose first two bytes look like an
            # EtherType to that protocol's dissector (perftest's buffers turn up as CRTP, …);
            # that layer's complaint is about application bytes, not the RoCE packet.
            if "infiniband" in layers and layers[-1] != "infiniband":
                payload.append(number)
            else:
                real.append(number)
        if real:
            problems.append(f"tshark: {len(real)} malformed or erroneous frames: {' '.join(real[:10])}")
        facts["payload_heuristics"] = len(payload)
    if expect_loss and retrans == 0 and naks == 0:
        problems.append("loss run without a single retransmission or NAK in the capture")
    return problems, facts


def run_pair(lab, name, kind, server, client, server_cmd, client_cmd, limit, outdir,
             loss=0, capture=True):
    """Runs a server and a client, each with its own time limit, and checks both, and the
    capture. Returns a result dict."""
    t0 = time.time()
    res = {"name": name, "kind": kind, "server": server.label(), "client": client.label(),
           "server_cmd": server_cmd, "client_cmd": client_cmd, "loss": loss, "ok": False}
    problems = []
    pcap = os.path.join(outdir, name + ".pcap")
    dump = None
    srv = cli = None
    try:
        if capture:
            dump = lab.spawn(["tcpdump", "-i", labmod.BRIDGE, "-n", "-s", "0", "-U", "--immediate-mode", "-w", pcap,
                              "udp port 4791 or tcp port %d" % PORT],
                             f"tcpdump {name}", log=os.path.join(outdir, name + ".tcpdump.log"))
            deadline = time.time() + 15
            while time.time() < deadline:
                with open(os.path.join(outdir, name + ".tcpdump.log"), errors="replace") as f:
                    if "listening on" in f.read():
                        break
                if dump.poll() is not None:
                    raise LabError("tcpdump exited")
                time.sleep(0.05)
            else:
                raise LabError("tcpdump did not start")
        if loss:
            # bandwidth tests close with a TCP handshake after the last completion: every RoCE
            # packet may go; the others lose no bare ACK (see Lab.set_loss). perftest's rdma_cm
            # mode (-R) exchanges over an RC connection instead, and a lost ACK of the server's
            # last SEND there has its kernel QP resend only after the REQ's local ACK timeout
            # (0x13, 2.1 s, as the kernel's own REQ carries), while perftest's client stops
            # reconnecting after ten tries 100 ms apart: the run fails in perftest, whoever
            # plays either side. Its data phase has no bare ACK to spare (READ responses
            # acknowledge), so it keeps every loss.
            # rdma_cm tests: a guest client's last DREQ is not retried once it exits (see
            # Lab.set_loss)
            lab.set_loss(loss, acks=(kind == "bw" and " -R" not in server_cmd),
                         dreqs_in=(kind not in ("rping", "cm")))
        srv = Running(lab, server.where, server_cmd, limit, os.path.join(outdir, name + ".server.log"))
        if kind in ("rping", "cm"):
            cm_port = 7471 if "ucmatose" in name else RPING_PORT
            if not srv.wait_cm_listen(cm_port, 30):
                srv.wait(5)
                raise LabError(f"the server never listened on rdma_cm port {cm_port}:\n{srv.out.strip()[-800:]}")
        elif " -R" in server_cmd:
            # perftest's rdma_cm mode: no TCP listener, an rdma_cm one on the same port
            if not srv.wait_cm_listen(PORT, 30):
                srv.wait(5)
                raise LabError(f"the server never listened on rdma_cm port {PORT}:\n{srv.out.strip()[-800:]}")
        elif not srv.wait_listen(PORT, 30):
            srv.wait(5)
            raise LabError(f"the server never listened on TCP {PORT}:\n{srv.out.strip()[-800:]}")
        cli = Running(lab, client.where, client_cmd, limit, os.path.join(outdir, name + ".client.log"))
        crc = cli.wait(limit + 10)
        src = srv.wait(15 if crc is not None else 5)
        if loss:
            res["dropped"] = sum(lab.loss_counters())
            lab.clear_loss()
        if crc is None:
            problems.append(f"client timed out after {limit} s")
        elif crc != 0:
            problems.append(f"client exit {crc}")
        if src is None:
            problems.append("server did not finish (killed)")
        elif src != 0 and rping_teardown_race(kind, server, srv.out, src, client_cmd):
            res["note"] = "the guest's rping exited 255 in its teardown race (rdma-core #1622)"
            log(f"{name}: {res['note']}, after every ping validated")
        elif src != 0:
            problems.append(f"server exit {src}")
        res["metrics"] = parse_metrics(kind, cli.out)
        res["server_metrics"] = parse_metrics(kind, srv.out)
        if not res["metrics"] and crc == 0:
            problems.append("no result line in the client's output")
        if kind == "pingpong" and crc == 0 and src == 0 and not res["server_metrics"]:
            problems.append("no result line in the server's output")
        if kind == "cm" and crc == 0 and src == 0 and not res["server_metrics"]:
            problems.append("the server did not complete its data transfers")
        if kind == "rping" and crc == 0:
            want = int(re.search(r"-C (\d+)", client_cmd).group(1))
            got = res["metrics"].get("pings", 0)
            if got != want:
                problems.append(f"the client printed {got} validated pings of {want}")
        if loss and not res.get("dropped"):
            problems.append("the loss rules dropped nothing")
    except LabError as e:
        problems.append(str(e))
    finally:
        for r in (cli, srv):
            if r is not None and r.rc is None:
                r.kill()
        lab.clear_loss()
        if dump is not None:
            time.sleep(0.2)
            lab.stop(dump)
    if capture and os.path.exists(pcap):
        p2, facts = check_capture(lab, pcap, loss > 0)
        res["capture"] = facts
        problems += p2
    elif capture:
        problems.append("no capture file")
    res["seconds"] = round(time.time() - t0, 1)
    res["problems"] = problems
    res["ok"] = not problems
    status = "PASS" if res["ok"] else "FAIL"
    fig = fmt_metrics(kind, res.get("metrics", {}))
    cap = res.get("capture", {})
    extra = f" pkts={cap.get('packets')} resent={cap.get('resent')} naks={cap.get('naks')}" if cap else ""
    if loss:
        extra += f" dropped={res.get('dropped', 0)}"
    log(f"{status} {name} ({res['seconds']} s) {fig}{extra}")
    for pr in problems:
        for line in pr.splitlines()[:12]:
            log(f"     {line}")
    if not res["ok"]:
        res["diagnostics"], lines = diagnostics(lab, outdir, name)
        for line in lines:
            log(f"     {line}")
        for tag, r in (("server", srv), ("client", cli)):
            if r is not None:
                tail = "\n".join(r.out.strip().splitlines()[-6:])
                log(f"     {tag} `{r.cmd}` said:\n{tail}")
    return res


def diagnostics(lab, outdir, name):
    """After a failure, one job per guest. Into NAME.diag: rxe's counters and the links' drop
    counters. Returned for the log, a line or so per guest: whether it answers a ping to every
    other address of the bridge, what listens on TCP in it, and its kernel's last words, so
    that a run that failed for the lab's sake (a guest that stopped answering, a link that went
    down) says so in CI's log, where only the log's tail is kept. Returns (path, lines)."""
    parts, lines = [], []
    addrs = [labmod.HOST_ADDR] + [labmod.GUEST_ADDRS[n] for n in lab.guests]
    for g in lab.guests.values():
        others = [a for a in addrs if a != labmod.GUEST_ADDRS[g.name]]
        pings = "; ".join(f"ping -c 1 -W 2 {a} >/dev/null 2>&1 && echo -n '{a} ok ' || echo -n '{a} LOST '"
                          for a in others)
        rc, out = g.sh(f"{pings}; echo; ss -Htln | awk '{{print $4}}' | tr '\\n' ' '; echo; "
                       "dmesg | tail -n 3; echo ==; "
                       "rdma statistic show link rxe0/1; ip -s link show eth0; "
                       "cat /proc/net/softnet_stat; nstat -az 2>/dev/null | grep -i -E 'udp|drop' ",
                       limit=30, check=False)
        parts.append(f"== {g.name}\n{out}")
        if rc is None:
            lines.append(f"{g.name}: no answer to a job in 30 s")
            continue
        got = out.split("\n==\n", 1)[0].strip().splitlines()
        lines.append(f"{g.name}: ping {got[0] if got else '?'}; listening: {got[1] if len(got) > 1 else ''}")
        lines += [f"{g.name} dmesg: {line}" for line in got[2:]]
    p = lab.nsexec(["sh", "-c", "ip -s link; nft list ruleset"], check=False)
    parts.append(f"== host namespace\n{p.stdout}")
    path = os.path.join(outdir, name + ".diag")
    with open(path, "w") as f:
        f.write("\n".join(parts))
    return path, lines


def fmt_metrics(kind, m):
    if kind == "pingpong" and m:
        return f"{m.get('mbit_s', 0):.2f} Mbit/s {m.get('usec_iter', 0):.1f} us/iter"
    if kind == "bw" and m:
        return f"{m['bw_avg']:.2f} MB/s {m['mpps']:.6f} Mpps"
    if kind == "lat" and m:
        return f"typical {m['t_typical']:.2f} us avg {m['t_avg']:.2f} us"
    if kind == "rping" and m:
        return f"{m['pings']} pings validated"
    if kind == "cm" and m:
        return "data transfers complete"
    return "(no figures)"


# ---------------------------------------------------------------------------------------------
# The interop tests


def pingpong_iters(size):
    return {1: iters(100), 4096: iters(50)}.get(size, iters(3))


def perf_flags(kind, sub):
    if sub.startswith("atomic"):
        return f"-n {iters(200)}"
    if kind == "bw":
        return f"-s 65536 -n {iters(40)}"
    return f"-n {iters(200)}"


def interop_plan(lab):
    """(name, kind, server, client, server_cmd, client_cmd, limit, loss, mtu)."""
    host = Endpoint(lab, "host", "ferroce")
    vm = Endpoint(lab, "vm1", "rxe")
    plan = []
    for mtu in (1024, 4096):
        for size in (1, 4096, MIB):
            n = pingpong_iters(size)
            limit = 60 if size == MIB else 40
            for server, client in ((vm, host), (host, vm)):
                role = "ferroce-client" if client is host else "ferroce-server"
                name = f"pingpong-{size}B-mtu{mtu}-{role}"
                plan.append((name, "pingpong", server, client, server.pingpong(size, mtu, n),
                             client.pingpong(size, mtu, n, server.addr), limit, 0, mtu))
    for i, (tool, sub, kind) in enumerate(PERF_TESTS):
        flags = perf_flags(kind, sub)
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"{tool}-{role}", kind, server, client, server.perf(tool, sub, flags),
                         client.perf(tool, sub, flags, server.addr), 60, 0, 1024))
    # one run of each under loss, both directions for the ping-pong, alternating for perftest
    loss = env_int("FERROCE_INTEROP_LOSS", 3)
    for server, client in ((vm, host), (host, vm)):
        role = "ferroce-client" if client is host else "ferroce-server"
        n = iters(60)
        plan.append((f"loss-pingpong-4096B-{role}", "pingpong", server, client,
                     server.pingpong(4096, 1024, n), client.pingpong(4096, 1024, n, server.addr), 90, loss,
                     1024))
    for i, (tool, sub, kind) in enumerate(PERF_TESTS):
        server, client = ((vm, host), (host, vm))[i % 2]
        role = "ferroce-client" if client is host else "ferroce-server"
        flags = perf_flags(kind, sub)
        plan.append((f"loss-{tool}-{role}", kind, server, client, server.perf(tool, sub, flags),
                     client.perf(tool, sub, flags, server.addr), 90, loss, 1024))
    # UD (no CM): datagrams up to the 1024-byte MTU of the guests' 1500-byte link, each with
    # the 40-byte header rxe writes; no loss run, since UD does not resend and the tool would
    # wait for a lost datagram for ever
    for size in (64, 1024):
        n = pingpong_iters(size)
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"ud-pingpong-{size}B-{role}", "pingpong", server, client,
                         server.ud_pingpong(size, n), client.ud_pingpong(size, n, server.addr),
                         40, 0, 1024))
    # SRQ: four RC QPs over one shared receive queue on each side, clean and under loss (an
    # RNR or a resend must find the QP's receive in the shared pool)
    for name, drop in (("srq-pingpong-4qp", 0), ("loss-srq-pingpong-4qp", loss)):
        n = iters(400 if not drop else 100)
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"{name}-{role}", "pingpong", server, client,
                         server.srq_pingpong(4, 4096, n), client.srq_pingpong(4, 4096, n, server.addr),
                         90 if drop else 40, drop, 1024))
    # perftest's UD and SRQ modes of its SEND tests: -c UD sends each message as one datagram
    # (here the guests' 1024-byte MTU) with Q_Key 0x11111111 to the QPN of the key line, each
    # receive taking the 40-byte GRH first; --use-srq -q 2 puts the receiver's two RC QPs on one
    # shared receive queue. No loss runs: UD does not resend, and perftest's server would wait
    # for a lost datagram for a minute or two.
    for name, tool, sub, kind, flags in (
            ("ib_send_bw-ud", "ib_send_bw", "send-bw", "bw", f"-c UD -s 1024 -n {iters(100)}"),
            ("ib_send_lat-ud", "ib_send_lat", "send-lat", "lat", f"-c UD -s 1024 -n {iters(200)}"),
            ("ib_send_bw-srq-2qp", "ib_send_bw", "send-bw", "bw", f"--use-srq -q 2 -s 65536 -n {iters(40)}")):
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"{name}-{role}", kind, server, client, server.perf(tool, sub, flags),
                         client.perf(tool, sub, flags, server.addr), 60, 0, 1024))
    # perftest's rdma_cm mode (-R): the exchange over an RC connection rdma_cm makes on port
    # 18515, one SEND per step; the test's QPs connected by the CM on the same port (RC: REQ,
    # REP, RTU with out_reads as responder resources for READ; UD: SIDR and rdma_cm's Q_Key,
    # the latency client's first datagram telling the server its QPN); perftest's client
    # retries while its server is not listening again (REJ 8, SIDR status 1). READ once more
    # under loss, CM MADs included. No loss run for UD, which does not resend.
    for name, tool, sub, kind, flags, drop in (
            ("ib_send_bw-R", "ib_send_bw", "send-bw", "bw", f"-R -s 65536 -n {iters(40)}", 0),
            ("ib_write_bw-R", "ib_write_bw", "write-bw", "bw", f"-R -s 65536 -n {iters(40)}", 0),
            ("ib_read_bw-R", "ib_read_bw", "read-bw", "bw", f"-R -s 65536 -n {iters(40)}", 0),
            ("loss-ib_read_bw-R", "ib_read_bw", "read-bw", "bw", f"-R -s 65536 -n {iters(40)}", loss),
            ("ib_send_bw-R-ud", "ib_send_bw", "send-bw", "bw", f"-R -c UD -s 1024 -n {iters(100)}", 0),
            ("ib_send_lat-R-ud", "ib_send_lat", "send-lat", "lat", f"-R -c UD -s 1024 -n {iters(200)}", 0)):
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"{name}-{role}", kind, server, client, server.perf(tool, sub, flags),
                         client.perf(tool, sub, flags, server.addr), 90 if drop else 60, drop, 1024))
    # rdma_cm: rping, both roles, at 64 B and 4 KiB, and under loss; the client validates
    # every ping (-V), which the server READs from it and WRITEs back
    for size, drop in ((64, 0), (4096, 0), (64, loss)):
        # 50 pings under loss too: at 3 % a run of 20 (about 250 packets) passes untouched
        # about once in 2,000 runs, and a loss run that lost nothing proves nothing
        count = iters(50)
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            name = f"{'loss-' if drop else ''}rping-{size}B-{role}"
            plan.append((name, "rping", server, client, server.rping(size, count),
                         client.rping(size, count, server.addr), 90 if drop else 60, drop, 1024))
    # ucmatose: four RC connections, SENDs both ways, the server disconnecting them; clean
    # and under loss. The loss run sends 40 messages a connection rather than 10: with 10 (about
    # 160 packets) a 3 % loss drops nothing about once a hundred runs, and CI once drew that.
    # udaddy: SIDR, then datagrams both ways (no loss run: UD does not resend)
    for name, drop, flags in (("ucmatose-4conn", 0, "-c 4"), ("loss-ucmatose-4conn", loss, "-c 4 -C 40")):
        for server, client in ((vm, host), (host, vm)):
            role = "ferroce-client" if client is host else "ferroce-server"
            plan.append((f"{name}-{role}", "cm", server, client,
                         server.cmatose("ucmatose", flags),
                         client.cmatose("ucmatose", flags, server.addr), 120 if drop else 60, drop, 1024))
    for server, client in ((vm, host), (host, vm)):
        role = "ferroce-client" if client is host else "ferroce-server"
        plan.append((f"udaddy-{role}", "cm", server, client, server.cmatose("udaddy", "-S 512"),
                     client.cmatose("udaddy", "-S 512", server.addr), 60, 0, 1024))
    # rdma-core's own ibv_rc_pingpong and ibv_ud_pingpong on the host, unmodified, on the
    # drop-in libibverbs.so.1 (device ferroce0), against the same tools on the guest's rxe0
    if lab.dropin_dir:
        stock = Endpoint(lab, "host", "dropin")
        for server, client in ((vm, stock), (stock, vm)):
            role = "dropin-client" if client is stock else "dropin-server"
            for size in (1, 4096):
                n = pingpong_iters(size)
                plan.append((f"dropin-pingpong-{size}B-{role}", "pingpong", server, client,
                             server.pingpong(size, 1024, n), client.pingpong(size, 1024, n, server.addr),
                             40, 0, 1024))
            n = pingpong_iters(1024)
            plan.append((f"dropin-ud-pingpong-1024B-{role}", "pingpong", server, client,
                         server.ud_pingpong(1024, n), client.ud_pingpong(1024, n, server.addr), 40, 0, 1024))
            # librdmacm's own rping and ucmatose on the drop-in librdmacm.so.1 (the same file),
            # against the guest kernel's rdma_cm
            count = iters(50)
            plan.append((f"dropin-rping-64B-{role}", "rping", server, client, server.rping(64, count),
                         client.rping(64, count, server.addr), 60, 0, 1024))
            plan.append((f"dropin-ucmatose-4conn-{role}", "cm", server, client,
                         server.cmatose("ucmatose", "-c 4"),
                         client.cmatose("ucmatose", "-c 4", server.addr), 60, 0, 1024))
    # a READ longer than the requester's largest window: ferroce asks for 1 MiB as eight READ
    # requests of 128 response packets, which rxe must serve within max_rd_atomic, with and
    # without loss
    flags = f"-s {MIB} -n {iters(8)}"
    for name, drop in (("ib_read_bw-1MiB-ferroce-client", 0),
                       ("loss-ib_read_bw-1MiB-ferroce-client", loss)):
        plan.append((name, "bw", vm, host, vm.perf("ib_read_bw", "read-bw", flags),
                     host.perf("ib_read_bw", "read-bw", flags, vm.addr), 90, drop, 1024))
    return plan + verbs_plan(lab, loss)


def verbs_plan(lab, loss):
    """ferroce as a verbs user of rxe0 in vm1 (the same binary, `-d rxe0`): against the soft
    NIC on the host, then against rdma-core's and perftest's tools in vm2, both roles each."""
    host = Endpoint(lab, "host", "ferroce")
    verbs = Endpoint(lab, "vm1", "verbs")
    verbs_e = Endpoint(lab, "vm1", "verbs", events=True)
    rxe2 = Endpoint(lab, "vm2", "rxe")
    plan = []

    def pair(name, kind, server, client, make, limit, drop, mtu):
        plan.append((name, kind, server, client, make(server, None), make(client, server.addr),
                     limit, drop, mtu))

    def roles(a, b):
        # (server, client, the role ferroce-verbs plays)
        return ((a, b, "verbs-server"), (b, a, "verbs-client"))

    for mtu, size in ((1024, 1), (1024, 4096), (1024, MIB), (4096, 4096), (4096, MIB)):
        n = pingpong_iters(size)
        for server, client, role in roles(verbs, host):
            pair(f"verbs-pingpong-{size}B-mtu{mtu}-{role}", "pingpong", server, client,
                 lambda e, srv, size=size, mtu=mtu, n=n: e.pingpong(size, mtu, n, srv),
                 60 if size == MIB else 40, 0, mtu)
    for server, client, role in roles(verbs_e, host):
        pair(f"verbs-pingpong-events-4096B-{role}", "pingpong", server, client,
             lambda e, srv: e.pingpong(4096, 1024, pingpong_iters(4096), srv), 40, 0, 1024)
    for tool, sub, kind in PERF_TESTS:
        flags = perf_flags(kind, sub)
        for server, client, role in roles(verbs, host):
            pair(f"verbs-{sub}-{role}", kind, server, client,
                 lambda e, srv, tool=tool, sub=sub, flags=flags: e.perf(tool, sub, flags, srv),
                 60, 0, 1024)
    for server, client, role in roles(verbs, host):
        n = iters(60)
        pair(f"loss-verbs-pingpong-4096B-{role}", "pingpong", server, client,
             lambda e, srv, n=n: e.pingpong(4096, 1024, n, srv), 90, loss, 1024)
    for tool, sub, kind in PERF_TESTS:
        flags = perf_flags(kind, sub)
        for server, client, role in roles(verbs, host):
            pair(f"loss-verbs-{sub}-{role}", kind, server, client,
                 lambda e, srv, tool=tool, sub=sub, flags=flags: e.perf(tool, sub, flags, srv),
                 90, loss, 1024)
    # the session face (Catalyst's `TransportSession`) over the verbs backend, against the soft NIC
    n = iters(200)
    for server, client, role in roles(verbs, host):
        dev = lambda e: "-d rxe0" if e is verbs else f"--local {HOST_ADDR}"
        plan.append((f"verbs-session-lat-{role}", "lat", server, client,
                     f"{server.bin} perf session-lat {dev(server)} -n {n}",
                     f"{client.bin} perf session-lat {dev(client)} -n {n} {server.addr}",
                     60, 0, 1024))
    # against rxe's own tools in the other guest: a backend bug shows here without the
    # soft engine on the other end
    for server, client, role in roles(verbs, rxe2):
        pair(f"verbs-vs-rxe-pingpong-4096B-{role}", "pingpong", server, client,
             lambda e, srv: e.pingpong(4096, 1024, pingpong_iters(4096), srv), 40, 0, 1024)
    for tool, sub, kind in PERF_TESTS:
        flags = perf_flags(kind, sub)
        for server, client, role in roles(verbs, rxe2):
            pair(f"verbs-vs-{tool}-{role}", kind, server, client,
                 lambda e, srv, tool=tool, sub=sub, flags=flags: e.perf(tool, sub, flags, srv),
                 60, 0, 1024)
    return plan


def cmd_test(args):
    binary = ferroce_binary()
    t0 = time.time()
    results = []
    # vm2 holds rxe's tools for the verbs backend's runs against them
    with Lab(guests=("vm1", "vm2"), binary=binary) as lab:
        outdir = os.path.join(lab.rundir, "runs")
        os.makedirs(outdir)
        plan = [p for p in interop_plan(lab) if re.search(args.only or "", p[0])]
        if args.list:
            for p in plan:
                print(p[0])
            for c in CM_CHECKS + VERBS_CHECKS:
                print(c.__name__.replace("_", "-"))
            return 0
        checks = [c for c in CM_CHECKS + VERBS_CHECKS
                  if re.search(args.only or "", c.__name__.replace("_", "-"))]
        if args.list:
            for c in checks:
                print(c.__name__.replace("_", "-"))
        mtu_now = None
        try:
            for (name, kind, server, client, scmd, ccmd, limit, loss, mtu) in plan:
                want = 1500 if mtu == 1024 else 9000
                if want != mtu_now:
                    lab.set_mtu(want)
                    mtu_now = want
                results.append(run_pair(lab, name, kind, server, client, scmd, ccmd, limit, outdir,
                                        loss=loss))
            if checks and mtu_now != 1500:
                lab.set_mtu(1500)
            for check in checks:
                results.append(run_check(lab, check, outdir))
        except KeyboardInterrupt:
            # run.sh's limit: say how far the suite got and where its time went, since a CI
            # log keeps only its tail.
            interrupted(results, len(plan) + len(checks), t0)
            write_results(lab.rundir, results, t0, lab.accel, "test")
            raise
        write_results(lab.rundir, results, t0, lab.accel, "test")
    return summarize(results, t0)


# ---------------------------------------------------------------------------------------------
# The verbs backend's own checks in the guest: its device tests, a frame stream, failure and
# the memlock limit


def run_check(lab, check, outdir):
    """Runs one check function, which returns a list of problems (empty: passed)."""
    name = check.__name__.replace("_", "-")
    t0 = time.time()
    try:
        problems = check(lab, outdir)
    except LabError as e:
        problems = [str(e)]
    res = {"name": name, "kind": "check", "ok": not problems, "problems": problems,
           "seconds": round(time.time() - t0, 1)}
    log(f"{'PASS' if res['ok'] else 'FAIL'} {name} ({res['seconds']} s)")
    for pr in problems:
        for line in pr.splitlines()[:20]:
            log(f"     {line}")
    return res


def guest_run(lab, where, cmd, limit, outdir, tag):
    """A command in a guest; returns (rc, output) and keeps the output in runs/TAG.log."""
    job = Running(lab, where, cmd, limit, os.path.join(outdir, tag + ".log"))
    rc = job.wait(limit + 10)
    return rc, job.out


def verbs_device_tests(lab, outdir):
    """tests/verbs_device.rs, built for the host, run in vm1 against rxe0."""
    binary = os.environ.get("FERROCE_DEVICE_TESTS")
    if not binary or not os.path.exists(binary):
        return [f"no device-test binary (FERROCE_DEVICE_TESTS={binary!r}); interop/run.sh builds it"]
    shutil.copy2(binary, os.path.join(lab.export, "verbs_device"))
    rc, out = guest_run(lab, "vm1", "FERROCE_TEST_DEVICE=rxe0 /ferroce/verbs_device --test-threads=1 --nocapture 2>&1",
                        240, outdir, "verbs-device-tests")
    problems = []
    if rc != 0:
        problems.append(f"exit {rc}:\n" + "\n".join(out.strip().splitlines()[-25:]))
    if "SKIPPED" in out:
        problems.append("a device test skipped itself")
    m = re.search(r"test result: ok\. (\d+) passed", out)
    if not m or int(m.group(1)) == 0:
        problems.append("no passing tests reported")
    return problems


def stream_to_guest(lab, outdir, tag, frames, loss=0, during=None):
    """`stream send` on the host (the bridge's device) programmed by `stream recv -d rxe0` in
    vm1; returns (recv rc, recv output, send output)."""
    host_bin = os.path.join(lab.export, "ferroce")
    send_log = os.path.join(outdir, tag + ".send.log")
    sender = lab.spawn(["timeout", "-s", "KILL", "200", host_bin, "stream", "send", "--local",
                        HOST_ADDR, "--fps", "10"], f"host: stream send ({tag})", log=send_log)
    try:
        deadline = time.time() + 20
        while True:
            with open(send_log, errors="replace") as f:
                if "waiting to be programmed" in f.read():
                    break
            if sender.poll() is not None or time.time() > deadline:
                raise LabError("stream send never served its control port")
            time.sleep(0.05)
        if loss:
            lab.set_loss(loss, acks=True)
        cmd = (f"{GUEST_BIN} stream recv -d rxe0 --device {HOST_ADDR} --frame-size 65536 "
               f"--frames {frames} --json")
        job = Running(lab, "vm1", cmd, 150, os.path.join(outdir, tag + ".recv.log"))
        if during:
            during(lab)
        rc = job.wait(160)
        if rc is None:
            job.kill()
        return rc, job.out
    finally:
        lab.clear_loss()
        lab.stop(sender)


def arrived(summary):
    """Frames that arrived, checked or dropped: what `stream recv --frames N` counts to N."""
    return summary["frames"] + summary.get("dropped", 0)


def summary_of(out):
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{") and '"content_errors"' in line:
            return json.loads(line)
    return None


def verbs_frames_stream(lab, outdir):
    """A UC frame stream into rxe0: 40 frames of 64 KiB, each checked by its CRC."""
    rc, out = stream_to_guest(lab, outdir, "verbs-frames-stream", 40)
    s = summary_of(out)
    problems = []
    if rc != 0:
        problems.append(f"stream recv exit {rc}: " + out.strip()[-600:])
    if not s:
        return problems + ["no summary"]
    if arrived(s) < 40 or s["content_errors"] != 0:
        problems.append(f"frames {s['frames']} (dropped {s.get('dropped', 0)}), "
                        f"content errors {s['content_errors']}")
    return problems


def verbs_frames_loss(lab, outdir):
    """The same under 3 % loss: rxe's UC drops what is lost, and a frame that lost packets
    must show it (its CRC), never pass as whole."""
    rc, out = stream_to_guest(lab, outdir, "verbs-frames-loss", 20, loss=3)
    s = summary_of(out)
    if not s:
        return [f"no summary (exit {rc}): " + out.strip()[-600:]]
    problems = []
    if s["frames"] == 0:
        problems.append("no frame arrived")
    if s["content_errors"] == 0:
        problems.append("3 % loss and not one frame with a bad CRC: loss went unseen")
    return problems


def verbs_frames_address_deleted(lab, outdir):
    """The guest's address deleted mid-stream: the receive path fails (GID_CHANGE), and once
    the address is back a fresh start (new QPN, device reprogrammed) receives again."""
    def blip(lab):
        time.sleep(6)
        lab.guest("vm1").sh("ip addr del 10.77.0.11/24 dev eth0", limit=20)
        time.sleep(3)
        lab.guest("vm1").sh("ip addr add 10.77.0.11/24 dev eth0", limit=20)
    rc, out = stream_to_guest(lab, outdir, "verbs-frames-address-deleted", 80, during=blip)
    s = summary_of(out)
    problems = []
    if not s:
        return [f"no summary (exit {rc}): " + out.strip()[-600:]]
    if s.get("restarts", 0) < 1:
        problems.append("the receive path never failed and restarted: " + out.strip()[-400:])
    if arrived(s) < 80:
        problems.append(f"only {arrived(s)} frames arrived ({s['frames']} checked) "
                        "after the restart")
    if rc != 0:
        problems.append(f"stream recv exit {rc}")
    return problems


def verbs_memlock(lab, outdir):
    """As a user without CAP_IPC_LOCK and `ulimit -l 64`, registering a frame ring is refused
    with the limit named; as root it is taken."""
    g = lab.guest("vm1")
    g.sh("grep -q '^nobody:' /etc/passwd || echo 'nobody:x:65534:65534::/:/bin/sh' >> /etc/passwd")
    rc, out = guest_run(lab, "vm1", f"ulimit -l 64; su -s /bin/sh nobody -c '{GUEST_BIN} stream recv "
                        f"-d rxe0 --peer {HOST_ADDR} --frames 1 --idle 1' 2>&1", 30, outdir,
                        "verbs-memlock")
    problems = []
    if rc == 0:
        problems.append("registration as nobody with a 64 KiB limit succeeded")
    if "RLIMIT_MEMLOCK is 65536 bytes" not in out or "ulimit -l" not in out:
        problems.append("the refusal does not name the limit and the fix: " + out.strip()[-400:])
    rc, out = guest_run(lab, "vm1", f"ulimit -l 64; {GUEST_BIN} stream recv -d rxe0 --peer {HOST_ADDR} "
                        "--frames 1 --idle 1 2>&1", 30, outdir, "verbs-memlock-root")
    if "RLIMIT_MEMLOCK" in out:
        problems.append("root (CAP_IPC_LOCK) was refused: " + out.strip()[-300:])
    return problems


def soft_gro_no_nak(lab, outdir):
    """ferroce in vm2 (rxe unloaded there) receiving 64 KiB WRITEs from ferroce on the host,
    no loss: the host sends GSO trains, the guest's kernel coalesces them by GRO, and not one
    packet may draw a sequence NAK or a retry (issue 26: a train handed over before its FIRST
    did). The build before the fix passed this too, at 4, 16 and 64 KiB: the reordering the
    issue observed did not recur here, and `a_train_handed_over_before_its_first_is_acked_
    without_a_nak` (crates/ferroce-proto/tests/engine.rs) holds the receiver to it instead.

    A packet that reordering cost would show on the guest as `out_of_seq_request` (the
    responder NAKs the first packet ahead of sequence) and on the host as `rcvd_seq_err`;
    both must stay 0. A resend after an ACK timeout with neither is the emulated guest
    stalling past the timeout (seen once in a full run: one timeout, no NAK, no request out
    of sequence), so `completer_retry_err` is logged, not failed."""
    host = Endpoint(lab, "host", "ferroce")
    guest = Endpoint(lab, "vm2", "ferroce")
    flags = f"-s 65536 -n {iters(300)}"
    scmd = guest.perf("ib_write_bw", "write-bw", flags) + " --stats"
    ccmd = host.perf("ib_write_bw", "write-bw", flags, guest.addr) + " --stats"
    lab.guests["vm2"].sh("rxe-down")
    try:
        r = run_pair(lab, "soft-gro-no-nak", "bw", guest, host, scmd, ccmd, 90, outdir)
    finally:
        lab.guests["vm2"].sh("rxe-up")
    problems = list(r.get("problems", [])) if not r["ok"] else []

    def counters(side):
        with open(os.path.join(outdir, f"soft-gro-no-nak.{side}.log"), errors="replace") as f:
            text = f.read()
        return {k: int(v) for k, v in re.findall(r"\b([a-z_]+) (\d+)\b", text)}

    srv, cli = counters("server"), counters("client")
    for side, c, names in (("guest", srv, ("out_of_seq_request",)),
                           ("host", cli, ("rcvd_seq_err",))):
        for n in names:
            if c.get(n, -1) != 0:
                problems.append(f"{side} {n} = {c.get(n)} (want 0)")
    if srv.get("udp_gro_segments", 0) == 0:
        problems.append("the guest received no GRO trains: the run did not test what it is for")
    log(f"soft-gro-no-nak: guest held_ahead {srv.get('held_ahead')}, "
        f"GRO segments {srv.get('udp_gro_segments')}, "
        f"host resends after a timeout {cli.get('completer_retry_err')}")
    return problems


VERBS_CHECKS = [verbs_device_tests, verbs_frames_stream, verbs_frames_loss,
                verbs_frames_address_deleted, verbs_memlock, soft_gro_no_nak]


# ---------------------------------------------------------------------------------------------
# Connection management's refusals, each way


def rej8_problems(rc, out):
    """rping on a REJ 8: its words, and the -1 it exits with (255)."""
    problems = []
    if rc != 255:
        problems.append(f"exit {rc}, not rping's 255")
    if "cma event RDMA_CM_EVENT_REJECTED, error 8" not in out:
        problems.append("no 'cma event RDMA_CM_EVENT_REJECTED, error 8':\n" + out.strip()[-600:])
    return problems


def rping_rej8_ferroce_client(lab, outdir):
    """ferroce's rping to a guest port nobody listens on: the guest kernel's REJ 8."""
    host = Endpoint(lab, "host", "ferroce")
    cmd = f"{host.bin} rping -c -a {GUEST_ADDRS['vm1']} -I {HOST_ADDR} -p 9999 -C 1"
    job = Running(lab, "host", cmd, 60, os.path.join(outdir, "rping-rej8-ferroce-client.log"))
    return rej8_problems(job.wait(70), job.out)


def rping_rej8_ferroce_server(lab, outdir):
    """The guest's rping to a port nobody listens on at ferroce's NIC: ferroce's REJ 8."""
    host = Endpoint(lab, "host", "ferroce")
    other = Running(lab, "host", f"{host.bin} rping -s -a {HOST_ADDR} -p 9998", 60,
                    os.path.join(outdir, "rping-rej8-ferroce-server.host.log"))
    try:
        if not other.wait_cm_listen(9998, 20):
            return ["ferroce's NIC did not come up on the host"]
        rc, out = guest_run(lab, "vm1", f"rping -c -a {HOST_ADDR} -p 9999 -C 1", 60, outdir,
                            "rping-rej8-ferroce-server")
        return rej8_problems(rc, out)
    finally:
        other.kill()


CM_CHECKS = [rping_rej8_ferroce_client, rping_rej8_ferroce_server]


def write_results(rundir, results, t0, accel, mode):
    """results.json in the run's folder, and a copy in CACHE/results/ that the next run keeps."""
    doc = {"mode": mode, "seconds": round(time.time() - t0, 1), "accel": accel,
           "when": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}
    with open(os.path.join(rundir, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    keep = os.path.join(labmod.CACHE, "results")
    os.makedirs(keep, exist_ok=True)
    with open(os.path.join(keep, f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}.json"), "w") as f:
        json.dump(doc, f, indent=1)


def interrupted(results, planned, t0):
    """Logs how far a stopped suite got: the runs finished of those planned, the failed ones,
    and the five slowest."""
    failed = [r["name"] for r in results if not r["ok"]]
    slowest = sorted(results, key=lambda r: -r["seconds"])[:5]
    log(f"interrupted after {len(results)} of {planned} runs in {time.time() - t0:.0f} s "
        f"(the runs themselves {sum(r['seconds'] for r in results):.0f} s); "
        f"failed: {', '.join(failed) or 'none'}")
    log("slowest: " + ", ".join(f"{r['name']} {r['seconds']} s" for r in slowest))


def summarize(results, t0):
    failed = [r for r in results if not r["ok"]]
    log(f"{len(results) - len(failed)} of {len(results)} passed in {time.time() - t0:.0f} s; "
        f"logs and captures in {labmod.CACHE}/last/runs")
    for r in failed:
        log(f"FAILED {r['name']}: {r['problems'][0].splitlines()[0] if r['problems'] else ''}")
    return 1 if failed else 0


def ferroce_binary():
    b = os.environ.get("FERROCE_BIN", os.path.join(labmod.REPO, "target", "release", "ferroce"))
    if not os.path.exists(b):
        raise LabError(f"no ferroce binary at {b}: cargo build --release -p ferroce-cli")
    return b


# ---------------------------------------------------------------------------------------------
# Side by side: rxe <-> rxe and ferroce <-> ferroce between the same two guests


def bench_plan(lab, impl):
    s = Endpoint(lab, "vm1", impl)
    c = Endpoint(lab, "vm2", impl)
    plan = []
    for mtu in (1024, 4096):
        for size, n in ((1, iters(1000)), (4096, iters(500)), (MIB, iters(20))):
            plan.append((f"pingpong-{size}B-mtu{mtu}", "pingpong", s, c, s.pingpong(size, mtu, n),
                         c.pingpong(size, mtu, n, s.addr), 300, 0, mtu))
    for mtu in (1024, 4096):
        for tool, sub, kind in PERF_TESTS:
            if mtu == 4096 and kind != "bw" and tool != "ib_write_lat":
                continue
            if sub.startswith("atomic"):
                flags = f"-n {iters(2000)}"
            elif kind == "bw":
                flags = f"-s 65536 -n {iters(400)}"
            else:
                flags = f"-n {iters(1000)}"
            if impl == "ferroce" and mtu == 4096:
                flags += " -m 4096"
            plan.append((f"{tool}-mtu{mtu}", kind, s, c, s.perf(tool, sub, flags),
                         c.perf(tool, sub, flags, s.addr), 300, 0, mtu))
    return plan


def cmd_bench(args):
    """Each test runs rxe <-> rxe and ferroce <-> ferroce back to back (rxe unloaded for
    ferroce, which needs UDP port 4791), the order alternating between repetitions, so that a
    change in the host's load hits both alike."""
    binary = ferroce_binary()
    t0 = time.time()
    # --against verbs: ferroce's verbs backend on rxe0 against perftest on the same rxe0, so
    # the ratio is the backend's own cost
    other = args.against
    results = {"rxe": [], other: []}
    with Lab(guests=("vm1", "vm2"), binary=binary, offloads=args.offloads) as lab:
        outdir = os.path.join(lab.rundir, "runs")
        os.makedirs(outdir)
        prepare = Guests(lab).prepare
        plans = {impl: [p for p in bench_plan(lab, impl) if re.search(args.only or "", p[0])]
                 for impl in ("rxe", other)}
        for rep in range(args.reps):
            order = ("rxe", other) if rep % 2 == 0 else (other, "rxe")
            for i in range(len(plans["rxe"])):
                for impl in order:
                    (name, kind, server, client, scmd, ccmd, limit, loss, mtu) = plans[impl][i]
                    prepare(impl, mtu)
                    if args.time:
                        # busybox's time: the tool's own CPU time beside its run time.
                        scmd, ccmd = f"time {scmd}", f"time {ccmd}"
                    run_name = f"bench-{impl}-{name}-r{rep}"
                    r = run_pair(lab, run_name, kind, server, client, scmd, ccmd,
                                 limit, outdir, capture=args.capture)
                    r["test"], r["impl"], r["mtu"], r["rep"] = name, impl, mtu, rep
                    if args.time:
                        add_times(r, outdir, run_name)
                    results[impl].append(r)
        write_results(lab.rundir, results["rxe"] + results[other], t0, lab.accel, "bench")
        table = bench_table(results, args)
        for path in (os.path.join(lab.rundir, "bench.md"),
                     os.path.join(labmod.CACHE, "results", f"bench-{time.strftime('%Y%m%d-%H%M%S')}.md")):
            with open(path, "w") as f:
                f.write(table)
        print(table)
    failed = [r for rs in results.values() for r in rs if not r["ok"]]
    log(f"bench: {args.reps} repetitions in {time.time() - t0:.0f} s, {len(failed)} failed runs")
    return 1 if failed else 0


class Guests:
    """What the two guests are set up for: rxe loaded or not, and the link MTU a RoCE path
    MTU needs (1500 for 1024, 9000 for 4096)."""

    def __init__(self, lab):
        self.lab, self.rxe, self.mtu = lab, True, 1500

    def prepare(self, impl, mtu):
        want = 1500 if mtu == 1024 else 9000
        needs_rxe = impl in ("rxe", "verbs")
        if needs_rxe != self.rxe:
            for g in self.lab.guests.values():
                g.sh("rxe-up" if needs_rxe else "rxe-down")
            self.rxe = needs_rxe
            self.mtu = None
        if self.mtu != want:
            set_mtu_plain(self.lab, want, impl)
            self.mtu = want


# The UDP floor's runs: test, kind, MTU, how udp_pair's server waits, its client's arguments,
# iterations. A 2-byte WRITE is a 36-byte datagram (BTH 12, RETH 16, payload and pad 4, ICRC
# 4), sent with the ACK of the peer's last one, as the soft NIC sends a turn; a 2-byte READ's
# request is 32 bytes, and its server sleeps between requests, as ib_read_lat's passive one
# does (its response is 24 bytes: the echo is the floor's one simplification); a 64 KiB
# WRITE's middle packets carry the path MTU's payload and 16 bytes (BTH, ICRC).
FLOOR_ROWS = [
    ("ib_write_lat-mtu1024", "lat", 1024, "", "pingpong {c} {s} 36 {n} roce", 1000),
    ("ib_read_lat-mtu1024", "lat", 1024, "block", "pingpong {c} {s} 32 {n}", 1000),
    ("ib_write_bw-mtu1024", "bw", 1024, "", "stream {c} {s} 65536 1040 {n} {w}", 400),
    ("ib_write_bw-mtu4096", "bw", 4096, "", "stream {c} {s} 65536 4112 {n} {w}", 400),
]
UDP_PAIR = "/tmp/udp_pair"


def run_udp_pair(lab, name, kind, server_args, client_args, outdir, timed, limit=120):
    """udp_pair's server in vm1 and its client in vm2 (under busybox's time when `timed`);
    returns a result as run_pair does, with perftest's metric names (t_typical and t_avg, or
    bw_avg)."""
    prefix = "time " if timed else ""
    srv = Running(lab, "vm1", f"{prefix}{UDP_PAIR} serve {GUEST_ADDRS['vm1']}:47920 {server_args}", limit,
                  os.path.join(outdir, name + ".server.log"))
    cli = Running(lab, "vm2", f"{prefix}{UDP_PAIR} {client_args}", limit,
                  os.path.join(outdir, name + ".client.log"))
    crc = cli.wait(limit + 10)
    src = srv.wait(15)
    m = {}
    # perftest halves the round trip of its ping-pongs (write, send), not of a READ's
    whole = re.search(r"round trip typical ([\d.]+) us, average ([\d.]+) us", cli.out)
    r = whole if "read_lat" in name else re.search(r"t_typical ([\d.]+) us, t_avg ([\d.]+) us", cli.out)
    if r:
        m.update(t_typical=float(r.group(1)), t_avg=float(r.group(2)))
    r = re.search(r"([\d.]+) MB/sec", cli.out)
    if r:
        m["bw_avg"] = float(r.group(1))
    ok = crc == 0 and src == 0 and bool(m)
    log(f"{'PASS' if ok else 'FAIL'} {name}: {cli.out.strip()}")
    return {"name": name, "kind": kind, "ok": ok, "metrics": m}


def cmd_floor(args):
    """Item 5's rows beside their floor: rxe <-> rxe, ferroce <-> ferroce and udp_pair (plain
    UDP with GSO and GRO, nothing of RDMA: crates/ferroce/examples/udp_pair.rs) between the same
    two guests, the order turning each repetition. Where the floor itself is under 1.5 times
    rxe's bandwidth (or over 1.2 times its latency), no user-space engine over UDP sockets
    reaches item 5's goal in these guests."""
    binary = ferroce_binary()
    pair = os.environ.get("FERROCE_UDP_PAIR",
                          os.path.join(labmod.REPO, "target", "release", "examples", "udp_pair"))
    if not os.path.exists(pair):
        raise LabError(f"no udp_pair at {pair}: cargo build --release -p ferroce --example udp_pair")
    t0 = time.time()
    results = []
    with Lab(guests=("vm1", "vm2"), binary=binary, offloads=args.offloads) as lab:
        outdir = os.path.join(lab.rundir, "runs")
        os.makedirs(outdir)
        shutil.copy2(pair, os.path.join(lab.export, "udp_pair"))
        for g in lab.guests.values():
            # run from the guest's memory, not paged in over 9p
            g.sh(f"cp /ferroce/udp_pair {UDP_PAIR}")
        guests = Guests(lab)
        perf = {impl: {p[0]: p for p in bench_plan(lab, impl)} for impl in ("rxe", "ferroce")}
        for rep in range(args.reps):
            order = ("rxe", "ferroce", "udp") if rep % 2 == 0 else ("udp", "ferroce", "rxe")
            for test, kind, mtu, udp_server, udp_args, n in FLOOR_ROWS:
                if not re.search(args.only or "", test):
                    continue
                for impl in (i for i in order if i in args.impls.split(",")):
                    name = f"floor-{impl}-{test}-r{rep}"
                    guests.prepare(impl, mtu)
                    if impl == "udp":
                        cargs = udp_args.format(c=f"{GUEST_ADDRS['vm2']}:47921",
                                                s=f"{GUEST_ADDRS['vm1']}:47920", n=iters(n),
                                                w=args.window)
                        r = run_udp_pair(lab, name, kind, udp_server, cargs, outdir, args.time)
                    else:
                        (_, _, server, client, scmd, ccmd, limit, _, _) = perf[impl][test]
                        if args.time:
                            scmd, ccmd = f"time {scmd}", f"time {ccmd}"
                        r = run_pair(lab, name, kind, server, client, scmd, ccmd, limit, outdir,
                                     capture=False)
                    r.update(test=test, impl=impl, mtu=mtu, rep=rep)
                    if args.time:
                        add_times(r, outdir, name)
                    results.append(r)
        write_results(lab.rundir, results, t0, lab.accel, "floor")
    print(floor_table(results, args.reps))
    failed = [r for r in results if not r["ok"]]
    log(f"floor: {args.reps} repetitions in {time.time() - t0:.0f} s, {len(failed)} failed runs")
    return 1 if failed else 0


def floor_table(results, reps):
    """Medians over the repetitions, and the ratios item 5 judges, for ferroce and for the
    floor."""
    def med(impl, test, key):
        vals = [r["metrics"][key] for r in results
                if r["impl"] == impl and r["test"] == test and r["ok"] and key in r["metrics"]
                and math.isfinite(r["metrics"][key])]  # as in bench_table
        return statistics.median(vals) if vals else None

    def ratio(a, b):
        return b / a if a and b else None

    lines = ["| test | measure | rxe ↔ rxe | ferroce ↔ ferroce | UDP floor | ferroce / rxe "
             "| floor / rxe | ferroce / floor | goal (ferroce / rxe) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for test, kind, _, _, _, _ in FLOOR_ROWS:
        if kind == "lat":
            measures = [("t_typical", "typical µs", "≤ 1.2"), ("t_avg", "average µs", "≤ 1.2")]
        else:
            measures = [("bw_avg", "MB/s", "≥ 1.5")]
        for key, unit, goal in measures:
            rxe, fer, udp = (med(i, test, key) for i in ("rxe", "ferroce", "udp"))
            lines.append(f"| {test} | {unit} | {fmt(rxe)} | {fmt(fer)} | {fmt(udp)} "
                         f"| {fmt(ratio(rxe, fer), 2)} | {fmt(ratio(rxe, udp), 2)} "
                         f"| {fmt(ratio(udp, fer), 2)} | {goal} |")
    lines.append("")
    lines.append(f"Medians of {reps} repetition(s).")
    return "\n".join(lines) + "\n"


def add_times(r, outdir, name):
    """Each side's CPU time from its log (the tool ran under busybox's time) into result
    `r`, and logged."""
    for side in ("server", "client"):
        with open(os.path.join(outdir, f"{name}.{side}.log"), errors="replace") as f:
            r[f"{side}_time"] = guest_times(f.read())
    log(f"{name}: server {r['server_time']}, client {r['client_time']}")


def guest_times(out):
    """busybox time's `real`, `user` and `sys` lines, in seconds."""
    times = {}
    for m in re.finditer(r"^(real|user|sys)\s+(?:(\d+)m\s*)?([\d.]+)s", out, re.M):
        times[m.group(1)] = int(m.group(2) or 0) * 60 + float(m.group(3))
    return times


def set_mtu_plain(lab, mtu, impl):
    # The taps and the bridge follow too: with rxe unloaded, guests at 9000 behind taps left
    # at 1500 by an rxe run lost every 4 KiB frame, and ferroce's MTU 4096 run after an rxe
    # run at 1024 ended in "transport retry counter exceeded".
    lab.set_mtu(mtu, rxe=impl == "rxe")


def bench_table(results, args):
    """Median over the repetitions; ratio ferroce / rxe. Against the soft NIC the goals are
    the data path's in the guests (at least 1.5 times rxe's bandwidth, at most 1.2 times its
    latency); against the verbs backend on the same rxe0, within 5 % of perftest."""
    other = getattr(args, "against", "ferroce")
    if other == "verbs":
        more, less = ("≥ 0.95", lambda x: x >= 0.95), ("≤ 1.05", lambda x: x <= 1.05)
        heading = "ferroce -d rxe0 ↔ same"
    else:
        more, less = ("≥ 1.5", lambda x: x >= 1.5), ("≤ 1.2", lambda x: x <= 1.2)
        heading = "ferroce ↔ ferroce"
    def med(impl, test, key):
        # perftest under emulation now and then prints `inf` (its clock's rate measured as
        # 0): no measurement, not an infinitely slow run whose ratio would read as met.
        vals = [r["metrics"].get(key) for r in results[impl] if r["test"] == test and r["ok"]
                and r["metrics"].get(key) is not None and math.isfinite(r["metrics"][key])]
        return statistics.median(vals) if vals else None

    rows = []
    tests = []
    for r in results["rxe"] + results[other]:
        if (r["test"], r["kind"]) not in tests:
            tests.append((r["test"], r["kind"]))
    lines = [f"| test | measure | rxe ↔ rxe | {heading} | ferroce / rxe | goal |",
             "|---|---|---:|---:|---:|---|"]
    reps = max([r.get("rep", 0) for rs in results.values() for r in rs] + [0]) + 1
    for test, kind in tests:
        if kind == "pingpong":
            measures = [("usec_iter", "µs/iter", *less)]
            if not test.startswith("pingpong-1B"):
                measures.insert(0, ("mbit_s", "Mbit/s", *more))
        elif kind == "bw" and test.startswith("ib_atomic"):
            measures = [("mpps", "Mpps", *more)]
        elif kind == "bw":
            measures = [("bw_avg", "MB/s", *more)]
        else:
            measures = [("t_typical", "typical µs", *less),
                        ("t_avg", "average µs", *less)]
        for key, unit, goal, ok in measures:
            a, b = med("rxe", test, key), med(other, test, key)
            ratio = (b / a) if a and b else None
            verdict = ("met" if ok(ratio) else "missed") if ratio is not None else "—"
            lines.append(f"| {test} | {unit} | {fmt(a)} | {fmt(b)} | {fmt(ratio, 2)} | {goal}: {verdict} |")
            rows.append((test, key, a, b, ratio))
    lines.append("")
    lines.append(f"Medians of {reps} repetition(s); ratio = ferroce / rxe.")
    return "\n".join(lines) + "\n"


def fmt(x, digits=None):
    if x is None:
        return "—"
    if digits is not None:
        return f"{x:.{digits}f}"
    if x < 0.1:
        return f"{x:.6f}"
    return f"{x:.2f}" if x < 1000 else f"{x:.0f}"


def answer_times(pcap, responder):
    """For each RoCE request the host sent to `responder`, the time until the responder's first
    packet after it (µs), from a capture on the bridge."""
    out = subprocess.run(["tshark", "-r", pcap, "-Y", "udp.dstport == 4791", "-T", "fields",
                          "-e", "frame.time_epoch", "-e", "ip.src"],
                         capture_output=True, text=True, check=True).stdout
    times, waiting = [], None
    for line in out.splitlines():
        t, src = line.split("\t")
        if src != responder:
            if waiting is None:
                waiting = float(t)
        elif waiting is not None:
            times.append((float(t) - waiting) * 1e6)
            waiting = None
    return times


def cmd_responder(args):
    """The responder side of the tools in a guest, kernel rxe's against ferroce's, each facing
    ferroce on the host: the time from a request on the bridge to the guest's first packet
    after it, for the run's first request (a fresh QP's first answer) and as a median. In read-lat and write-bw the guest application waits in a TCP handshake
    the whole time, so the NIC alone answers (rxe in softirq, ferroce's progress thread); in
    pingpong the application answers each SEND with its own."""
    binary = ferroce_binary()
    t0 = time.time()
    results, rows = [], []
    with Lab(guests=("vm1",), binary=binary) as lab:
        outdir = os.path.join(lab.rundir, "runs")
        os.makedirs(outdir)
        host = Endpoint(lab, "host", "ferroce")
        g = lab.guest("vm1")
        rxe_up = True
        # --warm: a first round that the table leaves out (rep -1)
        for rep in range(-1 if args.warm else 0, args.reps):
            for impl in ("rxe", "ferroce"):
                if (impl == "rxe") != rxe_up:
                    g.sh("rxe-up" if impl == "rxe" else "rxe-down")
                    rxe_up = impl == "rxe"
                server = Endpoint(lab, "vm1", impl)
                n = iters(args.iters)
                plans = [
                    ("read-lat", "lat", server.perf("ib_read_lat", "read-lat", f"-s 64 -n {n}"),
                     host.perf("ib_read_lat", "read-lat", f"-s 64 -n {n}", server.addr)),
                    ("write-bw", "bw", server.perf("ib_write_bw", "write-bw", f"-s 4096 -n {n}"),
                     host.perf("ib_write_bw", "write-bw", f"-s 4096 -n {n}", server.addr)),
                    ("pingpong", "pingpong", server.pingpong(64, 1024, n),
                     host.pingpong(64, 1024, n, server.addr)),
                ]
                for test, kind, scmd, ccmd in plans:
                    name = f"responder-{impl}-{test}-r{rep}"
                    res = run_pair(lab, name, kind, server, host, scmd, ccmd, 300, outdir)
                    results.append(res)
                    times = answer_times(os.path.join(outdir, name + ".pcap"), server.addr)
                    med = statistics.median(times) if times else float("nan")
                    p90 = statistics.quantiles(times, n=10)[-1] if len(times) > 10 else float("nan")
                    first = times[0] if times else float("nan")
                    if rep >= 0:
                        rows.append((test, impl, rep, len(times), first, med, p90))
                    log(f"{name}: {len(times)} answers, first {first:.0f} µs, "
                        f"median {med:.0f} µs, p90 {p90:.0f} µs")
        write_results(lab.rundir, results, t0, lab.accel, "responder")
    print("| test | responder in the guest | answers | first µs | median µs | p90 µs |")
    print("|---|---|---:|---:|---:|---:|")
    for test, impl, rep, n, first, med, p90 in sorted(rows):
        print(f"| {test} | {impl} (rep {rep}) | {n} | {first:.0f} | {med:.0f} | {p90:.0f} |")
    return 0 if all(r["ok"] for r in results) else 1


def cmd_unreachable(args):
    """A connect to an address where no RDMA stack answers, kernel against drop-in, at once:
    the guest kernel's rping (rdma_cm on rxe) to the host's address, where nothing holds UDP
    4791, and the host's stock rping on the drop-in librdmacm to a loopback address of the
    lab's namespace where nothing does either. Each REQ goes unanswered through its retries;
    both must end with RDMA_CM_EVENT_UNREACHABLE, and the times are printed side by side
    (about 100 s each: not a CI check)."""
    binary = ferroce_binary()
    with Lab(guests=("vm1",), binary=binary) as lab:
        if not lab.dropin_dir:
            raise LabError("no drop-in library (scripts/build-dropin.sh)")
        outdir = os.path.join(lab.rundir, "runs")
        os.makedirs(outdir)
        limit = 240
        t0 = time.time()
        kernel = Running(lab, "vm1", f"rping -c -a {HOST_ADDR} -p 9997 -C 1", limit,
                         os.path.join(outdir, "unreachable-kernel.log"))
        dropin = Running(lab, "host",
                         f"env LD_LIBRARY_PATH={lab.dropin_dir} FERROCE_ADDR=127.0.0.1 "
                         f"rping -c -a 127.0.0.2 -p 9997 -C 1", limit,
                         os.path.join(outdir, "unreachable-dropin.log"))
        jobs = {"kernel rdma_cm (guest, rxe)": kernel, "drop-in librdmacm (host)": dropin}
        # Each one's own end: whichever is still running is looked at twice a second.
        times = {}
        while len(times) < len(jobs) and time.time() - t0 < limit + 10:
            if "kernel rdma_cm (guest, rxe)" not in times and kernel.job.done():
                times["kernel rdma_cm (guest, rxe)"] = time.time() - t0
            if "drop-in librdmacm (host)" not in times and dropin.proc.poll() is not None:
                times["drop-in librdmacm (host)"] = time.time() - t0
            time.sleep(0.5)
        for name, job in jobs.items():
            rc = job.wait(limit + 10)
            times.setdefault(name, float("nan"))
            words = re.findall(r"cma event (\S+), error (-?\d+)", job.out)
            log(f"{name}: exit {rc} after {times[name]:.1f} s: {words or job.out.strip()[-300:]}")
    print("| connect to an address where nothing answers | event | seconds |")
    print("|---|---|---:|")
    for name, secs in times.items():
        print(f"| {name} | UNREACHABLE | {secs:.1f} |")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("test")
    t.add_argument("--only", help="run only the tests whose name matches this regex")
    t.add_argument("--list", action="store_true")
    b = sub.add_parser("bench")
    b.add_argument("--only")
    b.add_argument("--reps", type=int, default=1)
    b.add_argument("--capture", action="store_true", help="capture and check every run (slower)")
    b.add_argument("--against", choices=("ferroce", "verbs"), default="ferroce",
                   help="ferroce's soft NIC in place of rxe (rxe unloaded), or ferroce's verbs "
                        "backend on the same rxe0 as perftest")
    b.add_argument("--time", action="store_true",
                   help="run each tool under time, and log its CPU time beside its run time")
    b.add_argument("--offloads", action="store_true",
                   help="boot the guests with virtio-net's offloads at QEMU's defaults, as a "
                        "user's VM has them (checksums and UDP GSO), not off for captures")
    r = sub.add_parser("responder")
    r.add_argument("--reps", type=int, default=1)
    r.add_argument("--iters", type=int, default=300)
    r.add_argument("--warm", action="store_true",
                   help="run each test once first and leave it out of the table: the first "
                        "runs in a freshly booted guest pay once-only costs, for either stack "
                        "(rxe's first read-lat answer 12 ms, ferroce's first write-bw 16-17 ms)")
    sub.add_parser("unreachable")
    f = sub.add_parser("floor")
    f.add_argument("--reps", type=int, default=1)
    f.add_argument("--only", help="run only the rows whose test matches this regex")
    f.add_argument("--time", action="store_true",
                   help="run each tool under time, and log its CPU time beside its run time")
    f.add_argument("--impls", default="rxe,ferroce,udp", help="which of rxe, ferroce, udp to run")
    f.add_argument("--window", type=int, default=8,
                   help="udp_pair's 64 KiB messages in flight (default 8: at perftest's 128 the "
                        "sending guest overran the receiving one, which lost a third of them)")
    f.add_argument("--offloads", action="store_true",
                   help="boot the guests with virtio-net's offloads at QEMU's defaults")
    args = ap.parse_args()
    try:
        commands = {"test": cmd_test, "bench": cmd_bench, "responder": cmd_responder,
                    "unreachable": cmd_unreachable, "floor": cmd_floor}
        return commands[args.cmd](args)
    except LabError as e:
        print(f"interop: FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"interop: interrupted ({e}); everything torn down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
