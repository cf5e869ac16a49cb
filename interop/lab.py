#!/usr/bin/env python3
"""The interop lab: QEMU guests running Debian 12's kernel with Soft-RoCE (rdma_rxe), on a bridge
inside a network namespace of their own, with the host side of the bridge free for ferroce.

Python 3 standard library only. What it does (see interop/README.md):

- installs the host packages it needs with apt-get when they are missing;
- builds once, and caches under /var/tmp/ferroce-interop, a guest: Debian's kernel package
  unpacked (not installed), its bzImage decompressed to an ELF vmlinux for QEMU's PVH entry, and
  an initramfs with busybox-static, the host's own rdma-core/perftest/iproute2/tcpdump binaries
  and their libraries, the rxe provider, and the modules closure of virtio-net, 9p, rdma_rxe and
  ib_uverbs; rebuilt when an input changes (the stamp below);
- boots guests (KVM where it works, TCG otherwise) on a bridge in a namespace it creates, one
  tap per guest; the host side of the bridge gets an address for ferroce;
- runs commands in a guest through a job queue on a 9p share and brings back stdout and the
  exit status; the project's binaries are exported to the guests read-only at /ferroce;
- tears everything down (its qemu and helper processes by PID, the namespace deleted), on
  failure and on Ctrl-C or SIGTERM too.

Run as a program: `lab.py packages` (install what the host lacks), `lab.py build` (build the guest), `lab.py shell` (boot two guests and run
commands typed as `vm1: CMD`, `vm2: CMD` or `host: CMD`), `lab.py selftest`.
"""

import glob
import hashlib
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CACHE = os.environ.get("FERROCE_INTEROP_CACHE", "/var/tmp/ferroce-interop")
# Bump when the guest's layout changes in a way the inputs below do not show.
GUEST_LAYOUT_VERSION = "3"
NICE = int(os.environ.get("FERROCE_INTEROP_NICE", "19"))

HOST_PACKAGES = [
    "qemu-system-x86", "busybox-static", "rdma-core", "ibverbs-utils", "ibverbs-providers",
    "perftest", "rdmacm-utils", "iproute2", "tcpdump", "tshark", "socat", "nftables", "cpio",
    "kmod", "zstd", "xz-utils", "ethtool",
]
# Host binaries copied into the guest, with their libraries (found with ldd).
GUEST_BINARIES = [
    "ibv_devinfo", "ibv_devices", "ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong",
    "ibv_srq_pingpong",
    "ib_write_bw", "ib_write_lat", "ib_read_bw", "ib_read_lat", "ib_send_bw", "ib_send_lat",
    "ib_atomic_bw", "ib_atomic_lat", "rping", "ucmatose", "udaddy",
    "ip", "rdma", "ss", "tc", "tcpdump", "socat", "ethtool", "bash",
]
# Libraries a binary may load later (the ferroce binary comes from the 9p export).
GUEST_EXTRA_LIBS = ["libgcc_s.so.1", "libm.so.6", "libc.so.6", "libpthread.so.0", "libdl.so.2",
                    "librt.so.1"]
GUEST_MODULES = ["virtio_pci", "virtio_net", "9pnet_virtio", "9p", "crc32_generic",
                 "crc32-pclmul", "rdma_rxe", "ib_uverbs", "sch_netem", "rdma_ucm"]
STAMP_PACKAGES = ["rdma-core", "ibverbs-utils", "ibverbs-providers", "libibverbs1", "perftest",
                  "rdmacm-utils", "iproute2", "busybox-static", "tcpdump", "socat", "ethtool",
                  "libc6"]

BRIDGE = "br0"
SUBNET = "10.77.0"
HOST_ADDR = SUBNET + ".1"
GUEST_ADDRS = {"vm1": SUBNET + ".11", "vm2": SUBNET + ".12"}


class LabError(Exception):
    """A step of the lab failed; the message says which."""


def log(msg):
    print(f"[interop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(argv, check=True, timeout=120, capture=True, what=None, **kw):
    """Runs a short command; raises LabError naming it when it fails."""
    try:
        p = subprocess.run(argv, timeout=timeout, text=True,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.STDOUT if capture else None, **kw)
    except subprocess.TimeoutExpired:
        raise LabError(f"{what or ' '.join(argv)}: timed out after {timeout} s")
    except FileNotFoundError as e:
        raise LabError(f"{what or ' '.join(argv)}: {e}")
    if check and p.returncode != 0:
        out = (p.stdout or "").strip()
        raise LabError(f"{what or ' '.join(argv)}: exit {p.returncode}" + (f"\n{out}" if out else ""))
    return p


# ---------------------------------------------------------------------------------------------
# Host packages


def missing_packages():
    missing = []
    for pkg in HOST_PACKAGES:
        p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if "install ok installed" not in p.stdout:
            missing.append(pkg)
    return missing


def ensure_host_packages():
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"host packages missing and not root to install them: {' '.join(missing)}")
    log(f"installing host packages: {' '.join(missing)}")
    run(["apt-get", "update", "-qq"], timeout=600, what="apt-get update")
    subprocess.run(["debconf-set-selections"], input="wireshark-common wireshark-common/install-setuid boolean false\n",
                   text=True, check=False)
    run(["nice", "-n", str(NICE), "apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing,
        timeout=900, what="apt-get install " + " ".join(missing),
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


# ---------------------------------------------------------------------------------------------
# The guest image


def kernel_package():
    """The kernel package linux-image-amd64 depends on today (or the one cached, offline)."""
    p = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    m = re.search(r"Depends: (linux-image-[0-9][^\s]*-amd64)", p.stdout)
    if m:
        return m.group(1)
    cached = sorted(glob.glob(os.path.join(CACHE, "dl", "linux-image-*-amd64_*.deb")))
    if cached:
        return os.path.basename(cached[-1]).split("_")[0]
    raise LabError("cannot tell which kernel linux-image-amd64 depends on (apt-cache depends)")


def package_versions(names):
    out = {}
    for name in names:
        p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out[name] = p.stdout.strip()
    return out


def guest_stamp(kpkg, kdeb):
    h = hashlib.sha256()
    h.update(GUEST_LAYOUT_VERSION.encode())
    h.update(kpkg.encode())
    h.update(os.path.basename(kdeb).encode())
    h.update(json.dumps(package_versions(STAMP_PACKAGES), sort_keys=True).encode())
    h.update(json.dumps([GUEST_BINARIES, GUEST_EXTRA_LIBS, GUEST_MODULES]).encode())
    for f in sorted(glob.glob(os.path.join(HERE, "guest-init.sh")) + glob.glob(os.path.join(HERE, "guest-bin", "*"))):
        with open(f, "rb") as fh:
            h.update(f.encode() + fh.read())
    with open(__file__, "rb") as fh:
        # The builder itself: only the part that shapes the image.
        src = fh.read()
        start, end = src.find(b"\n# The guest image"), src.find(b"\n# The network and the guests")
        h.update(src[start:end])
    return h.hexdigest()[:16]


def download_kernel(kpkg):
    dl = os.path.join(CACHE, "dl")
    os.makedirs(dl, exist_ok=True)
    debs = glob.glob(os.path.join(dl, kpkg + "_*.deb"))
    if not debs:
        log(f"downloading {kpkg}")
        p = run(["apt-get", "download", kpkg], cwd=dl, timeout=600, check=False)
        if p.returncode != 0:
            # stale package lists name a version the mirror no longer has
            run(["apt-get", "update", "-qq"], timeout=600, what="apt-get update")
            run(["apt-get", "download", kpkg], cwd=dl, timeout=600, what=f"apt-get download {kpkg}")
        debs = glob.glob(os.path.join(dl, kpkg + "_*.deb"))
        if not debs:
            raise LabError(f"apt-get download {kpkg} left no .deb in {dl}")
    return sorted(debs)[-1]


def extract_vmlinux(bzimage, out):
    """Decompresses a bzImage's payload to the ELF vmlinux (PVH boot, no in-guest decompression)."""
    with open(bzimage, "rb") as f:
        data = f.read()
    attempts = []
    for magic, kind in ((b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x1f\x8b\x08", "gzip")):
        pos = data.find(magic)
        while pos != -1:
            try:
                if kind == "xz":
                    elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[pos:])
                elif kind == "gzip":
                    elf = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[pos:])
                else:
                    elf = subprocess.run(["zstd", "-dc"], input=data[pos:], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL).stdout
                if elf[:4] == b"\x7fELF":
                    with open(out, "wb") as f:
                        f.write(elf)
                    return
            except Exception as e:  # noqa: BLE001 - not this one: try the next magic
                attempts.append(f"{kind}@{pos}: {e}")
            pos = data.find(magic, pos + 1)
    raise LabError(f"no ELF kernel inside {bzimage} ({'; '.join(attempts[:3]) or 'no known compression'})")


def ldd_libs(path):
    p = subprocess.run(["ldd", path], text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    libs = []
    for line in p.stdout.splitlines():
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            libs.append(m.group(1))
    return libs


def copy_into(root, path):
    """Copies a host file to the same path under root, following symlinks of the last element
    but keeping the name; the real file's directory is created too."""
    dest = root + path
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if not os.path.exists(dest):
        shutil.copy2(os.path.realpath(path), dest)


def module_closure(moddir, kver, wanted):
    """Modules to load, dependencies first, from the kernel's modules.dep (made by depmod)."""
    deps = {}
    with open(os.path.join(moddir, "lib", "modules", kver, "modules.dep")) as f:
        for line in f:
            mod, _, rest = line.partition(":")
            deps[mod.strip()] = rest.split()
    by_name = {}
    for mod in deps:
        name = os.path.basename(mod).split(".ko")[0]
        by_name[name] = mod
        by_name[name.replace("-", "_")] = mod
    order = []

    def visit(mod):
        if mod in order:
            return
        for d in deps.get(mod, []):
            visit(d)
        order.append(mod)

    for name in wanted:
        mod = by_name.get(name) or by_name.get(name.replace("-", "_"))
        if mod is None:
            builtin = os.path.join(moddir, "lib", "modules", kver, "modules.builtin")
            with open(builtin) as f:
                if any(os.path.basename(l.strip()).split(".ko")[0] in (name, name.replace("-", "_")) for l in f):
                    continue
            raise LabError(f"kernel {kver} has no module {name}")
        visit(mod)
    return order


def build_guest(force=False):
    """Returns (vmlinux, initramfs), building them into the cache when their inputs changed."""
    ensure_host_packages()
    kpkg = kernel_package()
    kdeb = download_kernel(kpkg)
    stamp = guest_stamp(kpkg, kdeb)
    gdir = os.path.join(CACHE, "guest-" + stamp)
    vmlinux, initrd = os.path.join(gdir, "vmlinux"), os.path.join(gdir, "initramfs.cpio")
    if not force and os.path.exists(os.path.join(gdir, "done")):
        return vmlinux, initrd
    log(f"building the guest ({kpkg}, stamp {stamp}) in {gdir}")
    t0 = time.time()
    shutil.rmtree(gdir, ignore_errors=True)
    os.makedirs(gdir)
    work = tempfile.mkdtemp(prefix="guest-build-", dir=CACHE)
    try:
        kx = os.path.join(work, "kernel")
        run(["nice", "-n", str(NICE), "dpkg-deb", "-x", kdeb, kx], timeout=600, what="dpkg-deb -x " + kdeb)
        kver = os.listdir(os.path.join(kx, "lib", "modules"))[0]
        extract_vmlinux(glob.glob(os.path.join(kx, "boot", "vmlinuz-*"))[0], vmlinux)
        run(["depmod", "-b", kx, kver], what="depmod on the unpacked kernel")
        mods = module_closure(kx, kver, GUEST_MODULES)

        root = os.path.join(work, "root")
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "etc", "proc", "sys", "dev",
                  "tmp", "run", "jobs", "ferroce", "root", "var/run", "lib/modules"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        # busybox and its applets in /bin (host binaries, in /usr/bin and /usr/sbin, come first in PATH)
        shutil.copy2("/bin/busybox", os.path.join(root, "bin", "busybox"))
        applets = subprocess.run(["/bin/busybox", "--list"], text=True, stdout=subprocess.PIPE).stdout.split()
        for a in applets:
            link = os.path.join(root, "bin", a)
            if not os.path.lexists(link):
                os.symlink("busybox", link)
        libs = set()
        for name in GUEST_BINARIES:
            b = shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
            if b is None:
                raise LabError(f"host binary {name} missing (is its package installed?)")
            copy_into(root, b)
            libs.update(ldd_libs(b))
        # the rxe provider, its driver file, and what it links
        for f in glob.glob("/etc/libibverbs.d/rxe.driver"):
            copy_into(root, f)
        provider = glob.glob("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so")
        if not provider:
            raise LabError("the rxe provider librxe-rdmav*.so is missing (ibverbs-providers)")
        for f in provider:
            copy_into(root, f)
            libs.update(ldd_libs(f))
        for name in GUEST_EXTRA_LIBS:
            for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"):
                if os.path.exists(os.path.join(d, name)):
                    libs.add(os.path.join(d, name))
                    break
        for lib in sorted(libs):
            copy_into(root, lib)
        # modules and depmod
        for m in mods:
            src = os.path.join(kx, "lib", "modules", kver, m)
            dest = os.path.join(root, "lib", "modules", kver, m)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(src, dest)
        for f in ("modules.order", "modules.builtin", "modules.builtin.modinfo"):
            shutil.copy2(os.path.join(kx, "lib", "modules", kver, f), os.path.join(root, "lib", "modules", kver, f))
        run(["depmod", "-b", root, kver], what="depmod in the initramfs")
        with open(os.path.join(root, "etc", "interop-modules"), "w") as f:
            f.write("\n".join(mods) + "\n")
        shutil.copy2(os.path.join(HERE, "guest-init.sh"), os.path.join(root, "init"))
        os.chmod(os.path.join(root, "init"), 0o755)
        for f in glob.glob(os.path.join(HERE, "guest-bin", "*")):
            shutil.copy2(f, os.path.join(root, "usr", "local", "bin", os.path.basename(f)))
            os.chmod(os.path.join(root, "usr", "local", "bin", os.path.basename(f)), 0o755)
        with open(os.path.join(root, "etc", "passwd"), "w") as f:
            f.write("root:x:0:0:root:/root:/bin/sh\ntcpdump:x:0:0::/:/bin/sh\n")
        with open(os.path.join(root, "etc", "group"), "w") as f:
            f.write("root:x:0:\n")
        with open(os.path.join(root, "etc", "hosts"), "w") as f:
            f.write(f"127.0.0.1 localhost\n{HOST_ADDR} host\n" + "".join(f"{a} {n}\n" for n, a in GUEST_ADDRS.items()))
        # the newc archive (uncompressed: nothing to decompress under TCG)
        files = subprocess.run(["find", "."], cwd=root, text=True, stdout=subprocess.PIPE).stdout
        with open(initrd, "wb") as out:
            p = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet", "-R", "0:0"], cwd=root,
                               input=files.encode(), stdout=out, stderr=subprocess.PIPE)
        if p.returncode != 0:
            raise LabError(f"cpio: {p.stderr.decode(errors='replace')}")
        with open(os.path.join(gdir, "info.json"), "w") as f:
            json.dump({"kernel_package": kpkg, "kernel": kver, "deb": os.path.basename(kdeb),
                       "modules": mods, "packages": package_versions(STAMP_PACKAGES)}, f, indent=1)
        open(os.path.join(gdir, "done"), "w").close()
    except BaseException:
        shutil.rmtree(gdir, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # older guests go
    for old in glob.glob(os.path.join(CACHE, "guest-*")):
        if old != gdir and os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)
    log(f"guest built in {time.time() - t0:.0f} s: vmlinux {os.path.getsize(vmlinux) >> 20} MiB, "
        f"initramfs {os.path.getsize(initrd) >> 20} MiB")
    return vmlinux, initrd


# ---------------------------------------------------------------------------------------------
# The network and the guests


def kvm_usable():
    """KVM only when /dev/kvm opens and is not a PVM hypervisor (which runs only PVM kernels)."""
    if os.environ.get("FERROCE_INTEROP_ACCEL") in ("tcg", "kvm"):
        return os.environ["FERROCE_INTEROP_ACCEL"] == "kvm"
    if os.path.exists("/sys/module/kvm_pvm"):
        return False
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError:
        return False
    return True


class Job:
    """A command running in a guest."""

    def __init__(self, guest, jid, what, limit):
        self.guest, self.id, self.what, self.limit = guest, jid, what, limit
        self.started = time.time()
        self.rc = None
        self.out = ""

    def path(self, ext):
        return os.path.join(self.guest.jobs, f"{self.id}.{ext}")

    def done(self):
        if self.rc is not None:
            return True
        if os.path.exists(self.path("rc")):
            with open(self.path("rc")) as f:
                self.rc = int(f.read().strip() or "255")
            self.out = self.output()
            return True
        return False

    def output(self):
        try:
            with open(self.path("out"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait(self, timeout=None):
        """Waits for the exit status; on timeout kills the job and returns None."""
        deadline = time.time() + (timeout if timeout is not None else self.limit + 15)
        while time.time() < deadline:
            if self.done():
                return self.rc
            self.guest.check_alive()
            time.sleep(0.05)
        self.kill()
        self.out = self.output()
        return None

    def kill(self):
        """Kills the job's session in the guest (its processes only)."""
        if self.done():
            return
        try:
            with open(self.path("pid")) as f:
                pid = int(f.read().strip())
        except (FileNotFoundError, ValueError):
            return
        self.guest.start(f"kill -9 -{pid} 2>/dev/null; true", 10, "kill").wait(15)


class Guest:
    def __init__(self, lab, name, index):
        self.lab, self.name, self.index = lab, name, index
        self.addr = GUEST_ADDRS[name]
        self.dir = os.path.join(lab.rundir, name)
        self.jobs = os.path.join(self.dir, "jobs")
        self.console = os.path.join(self.dir, "console.log")
        self.tap = f"tap{index}"
        self.mac = f"52:54:00:77:00:{GUEST_ADDRS[name].split('.')[-1]}"
        self.proc = None
        self.next_job = 0

    def argv(self, vmlinux, initrd, accel, mtu):
        # Offloads off, so that a capture on the bridge holds each packet's bytes as sent;
        # with `offloads`, QEMU's defaults, as a user's VM has them (checksums left to the
        # host, so the guest kernel takes UDP GSO sends; the bench's choice, not the tests').
        # (Mergeable receive buffers stay on: without them and without guest TSO, Linux 6.1's
        # virtio-net posts 1518-byte buffers and drops every jumbo frame.)
        offload_off = "" if self.lab.offloads else "," + ",".join(f"{k}=off" for k in (
            "csum", "gso", "guest_csum", "guest_tso4", "guest_tso6", "guest_ecn", "guest_ufo",
            "host_tso4", "host_tso6", "host_ecn", "host_ufo"))
        cpu = ["-cpu", "host"] if accel == "kvm" else ["-cpu", "max"]
        return [
            "qemu-system-x86_64", "-name", f"ferroce-interop-{self.name}",
            "-machine", f"pc,accel={accel}", *cpu, "-smp", "1", "-m", "512",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{self.console}", "-monitor", "none",
            "-kernel", vmlinux, "-initrd", initrd,
            "-append", (f"console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off "
                        f"fi.name={self.name} fi.ip={self.addr}/24 fi.mtu={mtu}"),
            "-netdev", f"tap,id=n0,ifname={self.tap},script=no,downscript=no,vhost=off",
            "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}{offload_off}",
            "-virtfs", f"local,path={self.jobs},mount_tag=jobs,security_model=none",
            "-virtfs", f"local,path={self.lab.export},mount_tag=ferroce,security_model=none,readonly=on",
        ]

    def boot(self, vmlinux, initrd, accel, mtu):
        os.makedirs(self.jobs, exist_ok=True)
        self.proc = self.lab.spawn(self.argv(vmlinux, initrd, accel, mtu), f"qemu {self.name}",
                                   log=os.path.join(self.dir, "qemu.log"))

    def wait_ready(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(os.path.join(self.jobs, "ready")):
                return True
            if os.path.exists(os.path.join(self.jobs, "failed")):
                with open(os.path.join(self.jobs, "failed")) as f:
                    raise LabError(f"{self.name}: guest init failed: {f.read().strip()}\n{self.console_tail()}")
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        return False

    def console_tail(self, n=25):
        try:
            with open(self.console, errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        try:
            with open(os.path.join(self.dir, "qemu.log"), errors="replace") as f:
                lines += ["qemu: " + l for l in f.read().splitlines()]
        except FileNotFoundError:
            pass
        return f"--- last lines of {self.name}'s console ---\n" + "\n".join(lines[-n:])

    def check_alive(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise LabError(f"{self.name}: qemu exited (status {self.proc.returncode})\n{self.console_tail()}")

    def start(self, script, limit, what=None):
        """Starts a shell script in the guest, killed there after `limit` seconds."""
        self.check_alive()
        self.next_job += 1
        jid = f"{self.next_job:05d}"
        body = f"exec timeout -s KILL {int(limit)} sh -c {shlex.quote(script)}\n"
        tmp = os.path.join(self.jobs, f"{jid}.tmp")
        with open(tmp, "w") as f:
            f.write(body)
        os.rename(tmp, os.path.join(self.jobs, f"{jid}.job"))
        return Job(self, jid, what or script, limit)

    def sh(self, script, limit=30, check=True):
        """Runs a script in the guest and returns (exit status, output)."""
        job = self.start(script, limit)
        rc = job.wait(limit + 15)
        if check and rc != 0:
            raise LabError(f"{self.name}: `{script}` failed (exit {rc}):\n{job.out.strip()}")
        return rc, job.out


class Lab:
    """The namespace, the bridge, the guests and every process started for them."""

    def __init__(self, guests=("vm1", "vm2"), mtu=1500, binary=None, rundir=None, offloads=False):
        self.ns = f"ferroce-ix-{os.getpid()}"
        self.rundir = rundir or os.path.join(CACHE, "last")
        self.export = os.path.join(self.rundir, "export")
        self.guest_names = guests
        self.mtu = mtu
        self.binary = binary
        self.offloads = offloads
        # ferroce's drop-in libibverbs.so.1 (scripts/build-dropin.sh), when the run.sh that
        # started us built it: a snapshot of it goes here, for the host's stock tools
        self.dropin = os.environ.get("FERROCE_DROPIN") or None
        self.dropin_dir = os.path.join(self.rundir, "dropin") if self.dropin else None
        self.procs = []  # (Popen, what): everything we started, killed by PID at teardown
        self.guests = {}
        self.ns_made = False
        self.accel = None
        self.nft_tables = set()

    # -- processes

    def spawn(self, argv, what, log=None, netns=True, stdout=None):
        """Starts a process (in the namespace unless netns=False) in its own session."""
        full = (["ip", "netns", "exec", self.ns] if netns else []) + argv
        if NICE:
            full = ["nice", "-n", str(NICE)] + full
        out = open(log, "w") if log else (stdout or subprocess.DEVNULL)
        try:
            p = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT if log or stdout else subprocess.DEVNULL,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if log:
                out.close()
        self.procs.append((p, what))
        return p

    def stop(self, p, sig=signal.SIGTERM, grace=5.0):
        """Ends one process we started (and its session), by PID."""
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        self.procs = [(q, w) for q, w in self.procs if q is not p]

    def nsexec(self, argv, **kw):
        return run(["ip", "netns", "exec", self.ns] + argv, **kw)

    # -- set up and tear down

    def __enter__(self):
        self.install_signal_handlers()
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def install_signal_handlers(self):
        def handler(signum, _frame):
            raise KeyboardInterrupt(f"signal {signum}")
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, handler)

    def up(self):
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, taps, qemu)")
        cleanup_stale()
        vmlinux, initrd = build_guest()
        shutil.rmtree(self.rundir, ignore_errors=True)
        os.makedirs(self.export)
        with open(os.path.join(self.rundir, "owner.pid"), "w") as f:
            f.write(f"{os.getpid()}\n")
        if self.binary:
            # a snapshot of the binary: a concurrent cargo build cannot change it under the guests
            shutil.copy2(self.binary, os.path.join(self.export, "ferroce"))
        if self.dropin:
            os.makedirs(self.dropin_dir)
            shutil.copy2(self.dropin, os.path.join(self.dropin_dir, "libibverbs.so.1"))
            # librdmacm.so.1 is the same file (crates/ferroce-ibverbs): a link, so that a
            # program needing both maps it once and the two share their objects
            os.symlink("libibverbs.so.1", os.path.join(self.dropin_dir, "librdmacm.so.1"))
        log(f"namespace {self.ns}: bridge {BRIDGE} {HOST_ADDR}/24, guests {', '.join(self.guest_names)}")
        run(["ip", "netns", "add", self.ns], what="ip netns add")
        self.ns_made = True
        ns = ["ip", "-n", self.ns]
        run(ns + ["link", "set", "lo", "up"])
        run(ns + ["link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0"],
            what="create the bridge")
        run(ns + ["addr", "add", f"{HOST_ADDR}/24", "dev", BRIDGE])
        for i, name in enumerate(self.guest_names):
            g = Guest(self, name, i)
            self.guests[name] = g
            run(ns + ["tuntap", "add", g.tap, "mode", "tap"], what=f"create {g.tap}")
            run(ns + ["link", "set", g.tap, "mtu", "9000", "master", BRIDGE, "up"])
        run(ns + ["link", "set", BRIDGE, "mtu", "9000", "up"])
        # offloads off on the host side, so captures hold the bytes on the wire
        for dev in [] if self.offloads else [BRIDGE] + [g.tap for g in self.guests.values()]:
            self.nsexec(["ethtool", "-K", dev, "tx", "off", "rx", "off", "tso", "off", "gso", "off",
                         "gro", "off"], check=False)
        self.accel = "kvm" if kvm_usable() else "tcg"
        limit = float(os.environ.get("FERROCE_INTEROP_BOOT_LIMIT", "180"))
        if self.accel == "kvm" and not self.boot_all(vmlinux, initrd, min(limit, 60)):
            # a KVM that opens but cannot run this kernel (a PVM host not recognised, say)
            log("the guests did not come up under KVM: falling back to TCG")
            for g in self.guests.values():
                if g.proc is not None:
                    self.stop(g.proc, signal.SIGKILL)
                for f in glob.glob(os.path.join(g.jobs, "*")):
                    os.unlink(f)
            self.accel = "tcg"
        if self.accel == "tcg" and not self.boot_all(vmlinux, initrd, limit):
            g = next(g for g in self.guests.values() if not os.path.exists(os.path.join(g.jobs, "ready")))
            raise LabError(f"{g.name} did not come up in {limit:.0f} s\n{g.console_tail()}")

    def boot_all(self, vmlinux, initrd, limit):
        t0 = time.time()
        for g in self.guests.values():
            g.boot(vmlinux, initrd, self.accel, self.mtu)
        for g in self.guests.values():
            if not g.wait_ready(max(1.0, limit - (time.time() - t0))):
                return False
        log(f"guests up in {time.time() - t0:.1f} s ({self.accel}); rxe0 active in each")
        return True

    def down(self):
        # a second Ctrl-C must not cut the teardown short
        for s_ in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s_, signal.SIG_IGN)
        for table in list(self.nft_tables):
            self.nft(f"delete table {table}", check=False)
        for g in self.guests.values():
            if g.proc is not None and g.proc.poll() is None:
                try:
                    open(os.path.join(g.jobs, "poweroff"), "w").close()
                except OSError:
                    pass
        deadline = time.time() + 3
        while time.time() < deadline and any(g.proc is not None and g.proc.poll() is None for g in self.guests.values()):
            time.sleep(0.1)
        for p, _what in list(reversed(self.procs)):
            self.stop(p, grace=3)
        if self.ns_made:
            r = run(["ip", "netns", "del", self.ns], check=False)
            if r.returncode != 0:
                log(f"could not delete namespace {self.ns}: {r.stdout.strip()}")
            self.ns_made = False

    # -- helpers for tests

    def guest(self, name):
        return self.guests[name]

    def nft(self, rules, check=True):
        p = subprocess.run(["ip", "netns", "exec", self.ns, "nft", "-f", "-"], input=rules, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if check and p.returncode != 0:
            raise LabError(f"nft: {p.stdout.strip()}\n{rules}")
        return p

    def set_loss(self, percent, acks=True, dreqs_in=True):
        """Drops `percent` % of RoCE packets at random in both directions: those to the host on
        the inet input hook, those to or between guests on the bridge family's forward and output
        hooks (a drop on the inet output hook would make the sender's sendto fail instead).
        With acks=False, bare ACKs (BTH opcode 0x11, the UDP payload's first byte) pass: a
        tool without a closing handshake (ibv_rc_pingpong, ib_*_lat) destroys its QP after its
        last completion, and a lost final ACK would leave the peer retrying into the void.
        With dreqs_in=False, a CM DREQ to the host passes (a UD SEND, opcode 0x64, whose MAD
        attribute, 36 bytes into the UDP payload, is 0x0015): a guest's rping client destroys
        its id right after rdma_disconnect, which cancels the kernel CM's retries of its DREQ,
        so a lost one leaves the host's server waiting for a disconnect that never comes. The
        host's DREQs to guests stay lossy, so ferroce's own retries are still tried."""
        self.clear_loss()
        match = "udp dport 4791" + ("" if acks else " @th,64,8 != 0x11")
        rule = f"{match} numgen random mod 100 < {int(percent)} counter drop"
        keep = "" if dreqs_in else "udp dport 4791 @th,64,8 == 0x64 @th,352,16 == 0x0015 accept; "
        self.nft(f"""
table inet ferroce_loss {{
  chain drop_in {{ type filter hook input priority 0; {keep}{rule}; }}
}}
table bridge ferroce_loss {{
  chain drop_fwd {{ type filter hook forward priority 0; {rule}; }}
  chain drop_out {{ type filter hook output priority 0; {rule}; }}
}}
""")
        self.nft_tables.update({"inet ferroce_loss", "bridge ferroce_loss"})

    def loss_counters(self):
        p = self.nft("list ruleset", check=False)
        return [int(x) for x in re.findall(r"counter packets (\d+)", p.stdout)]

    def clear_loss(self):
        for table in ("inet ferroce_loss", "bridge ferroce_loss"):
            if table in self.nft_tables:
                self.nft(f"delete table {table}", check=False)
                self.nft_tables.discard(table)

    def set_mtu(self, mtu, rxe=True):
        """Sets every guest's eth0 MTU (1500: rxe's active MTU 1024; 9000: 4096), and the
        bridge's and taps' to match: ferroce on the host takes its path MTU from the bridge, and
        a REQ's MTU is final for the passive side, so a bridge left at 9000 towards guests at
        1500 would have ferroce claim 4096 and its peer send packets the guests cannot take;
        and guests at 9000 behind taps left at 1500 lose every frame over 1500 bytes. With
        `rxe`, waits until rxe0 in each guest reports the matching active MTU."""
        want = {1500: "1024", 9000: "4096"}.get(mtu)
        ns = ["ip", "netns", "exec", self.ns, "ip", "link", "set"]
        for g in self.guests.values():
            g.sh(f"ip link set eth0 mtu {mtu}")
            subprocess.run(ns + [g.tap, "mtu", str(mtu)], check=True)
        subprocess.run(ns + [BRIDGE, "mtu", str(mtu)], check=True)
        if want and rxe:
            for g in self.guests.values():
                if not self.wait_guest_mtu(g, want):
                    raise LabError(f"{g.name}: rxe0's active MTU did not become {want}")
        self.mtu = mtu

    def wait_guest_mtu(self, g, want):
        for _ in range(50):
            rc, out = g.sh("ibv_devinfo -d rxe0 | grep active_mtu", check=False)
            if f"{want} (" in out:
                return True
            time.sleep(0.1)
        return False

    def wait_host_listen(self, port, timeout, proc=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = subprocess.run(["ip", "netns", "exec", self.ns, "ss", "-Hltn", f"sport = :{port}"],
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            if p.stdout.strip():
                return True
            if proc is not None and proc.poll() is not None:
                return False
            time.sleep(0.05)
        return False


def cleanup_stale():
    """Removes what an earlier run of ours left behind if it died without tearing down: its
    qemu processes (by the PIDs recorded, checked against their command line) and its namespace."""
    owner = os.path.join(CACHE, "last", "owner.pid")
    alive = set()
    if os.path.exists(owner):
        with open(owner) as f:
            pid = int(f.read().strip() or 0)
        if pid and os.path.exists(f"/proc/{pid}"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"python" in f.read():
                        raise LabError(f"another interop run (PID {pid}) is using {os.path.dirname(owner)}")
            except FileNotFoundError:
                pass
    for proc in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(proc, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        # QEMU, tcpdump and ferroce (and their timeout/sh wrappers) name files under the run's
        # folder on their command lines: nothing else does
        mark = os.path.join(CACHE, "last").encode() + b"/"
        if cmd and os.path.basename(cmd[0]) in (b"qemu-system-x86_64", b"tcpdump", b"timeout", b"sh",
                                                b"ferroce") and any(mark in a for a in cmd):
            pid = int(proc.split("/")[2])
            if pid == os.getpid():
                continue
            log(f"killing PID {pid} ({os.path.basename(cmd[0]).decode()}) left by an earlier run")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    p = subprocess.run(["ip", "netns", "list"], text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    for line in p.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(r"ferroce-ix-(\d+)", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            log(f"deleting namespace {name} left by an earlier run")
            subprocess.run(["ip", "netns", "del", name], check=False)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else "help"
    try:
        if cmd == "packages":
            ensure_host_packages()
        elif cmd == "build":
            vm, rd = build_guest(force="--force" in argv)
            print(vm)
            print(rd)
        elif cmd == "shell":
            binary = os.path.join(REPO, "target", "release", "ferroce")
            with Lab(binary=binary if os.path.exists(binary) else None) as lab:
                print("type `vm1: CMD`, `vm2: CMD` or `host: CMD` (in the namespace); EOF ends")
                for line in sys.stdin:
                    where, _, cmd_ = line.partition(":")
                    where = where.strip()
                    if where == "host":
                        p = lab.nsexec(["sh", "-c", cmd_], check=False, timeout=300)
                        print(p.stdout, end="")
                        print(f"[exit {p.returncode}]")
                    elif where in lab.guests:
                        rc, out = lab.guest(where).sh(cmd_, limit=300, check=False)
                        print(out, end="")
                        print(f"[exit {rc}]")
                    else:
                        print("?")
        elif cmd == "selftest":
            with Lab() as lab:
                for g in lab.guests.values():
                    rc, out = g.sh("cat /jobs/ready; ibv_devinfo -d rxe0 | grep -E 'state|active_mtu'")
                    print(out)
                rc, out = lab.guest("vm2").sh(f"ping -c 2 -W 2 {HOST_ADDR}")
                print(out)
        else:
            print(__doc__)
            return 2
    except LabError as e:
        print(f"interop: FAILED: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        print(f"interop: interrupted ({e}); everything torn down", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
