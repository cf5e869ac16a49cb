"""What crossing into Python costs: the same loops timed in Python and in Rust, in one run.

    python crates/ferroce-py/bench/bench.py [--frames N] [--writes N]

Install the package built for release first (``pip install ./crates/ferroce-py`` or
``maturin develop --release -m crates/ferroce-py/Cargo.toml``); the Rust loops run from
``cargo run --release -p ferroce-py --example loops``. Loops:

- frames: ``N`` 4 KiB frames already queued in a receiver; per frame, ``rx.next_frame()`` and
  ``numpy.asarray(frame)`` (Rust: ``next_frame`` and ``frame_view``);
- ready: ``rx.frames_ready()`` on a receiver with nothing queued, a call that takes one lock:
  the bare cost of a call into the module;
- write: an RC queue pair between two soft NICs on loopback; per WRITE, post 64 bytes and
  poll until its completion (Rust: the same with ``Qp::post_send`` and ``Cq::poll``).

Addresses 127.0.1.111 to 127.0.1.120.
"""

import argparse
import pathlib
import subprocess
import time

import numpy as np

import ferroce
from ferroce import frames

ROOT = pathlib.Path(__file__).resolve().parents[3]


def python_frames(n: int) -> float:
    with ferroce.Nic("127.0.1.111") as nic, frames.Receiver() as rx:
        rx.start(nic, frames.ReceiverConfig(4096, n, "127.0.1.112", queue_size=n))
        rx.run_monitor()
        tx = frames.Sender("127.0.1.112", frames.Target.for_receiver(rx))
        for i in range(n):
            tx.send_frame(frames.Pattern.Counter.fill(i, 4096))
            deadline = time.monotonic() + 5
            while rx.counters().frames <= i and time.monotonic() < deadline:
                pass
        start = time.perf_counter_ns()
        total = 0
        for _ in range(n):
            frame = rx.next_frame(5.0)
            view = np.asarray(frame)
            total += view.ctypes.data
        elapsed = time.perf_counter_ns() - start
        assert total
        return elapsed / n


def python_write(n: int) -> float:
    with ferroce.Nic("127.0.1.113") as a, ferroce.Nic("127.0.1.114") as b:
        ca, cb = ferroce.Cq(a), ferroce.Cq(b)
        qa = ferroce.Qp(a, ferroce.QpType.Rc, ca, ca)
        qb = ferroce.Qp(b, ferroce.QpType.Rc, cb, cb)
        qa.connect(qb.endpoint())
        qb.connect(qa.endpoint())
        src = ferroce.Region(a, bytes([7]) * 64, ferroce.RegionAccess.Local, pinned=True)
        dst = ferroce.Region(b, 64, pinned=True)
        wr = ferroce.SendWr(1, ferroce.SendOp.write(dst.remote()), src.local(0, 64))
        post, poll = qa.post_send, ca.poll

        def once():
            post(wr)
            c = poll()
            while c is None:
                c = poll()
            assert c.ok

        for _ in range(100):
            once()
        start = time.perf_counter_ns()
        for _ in range(n):
            once()
        return (time.perf_counter_ns() - start) / n


def python_ready(n: int) -> float:
    with ferroce.Nic("127.0.1.119") as nic, frames.Receiver() as rx:
        rx.start(nic, frames.ReceiverConfig(4096, 2, "127.0.1.120"))
        ready = rx.frames_ready
        start = time.perf_counter_ns()
        for _ in range(n):
            ready()
        return (time.perf_counter_ns() - start) / n


def rust(loop: str, n: int, a: str, b: str) -> float:
    out = subprocess.run(
        ["cargo", "run", "--quiet", "--release", "-p", "ferroce-py", "--example", "loops", "--", loop, str(n), a, b],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=20000)
    parser.add_argument("--calls", type=int, default=1000000)
    args = parser.parse_args()
    rows = [
        ("frames_ready(), a bare call", python_ready(args.calls), rust("ready", args.calls, "127.0.1.119", "127.0.1.120")),
        ("next_frame + asarray, per 4 KiB frame", python_frames(args.frames), rust("frames", args.frames, "127.0.1.115", "127.0.1.116")),
        ("post + poll of a 64-byte RC WRITE", python_write(args.writes), rust("write", args.writes, "127.0.1.117", "127.0.1.118")),
    ]
    print(f"{'loop':44} {'Python ns':>10} {'Rust ns':>10} {'Python - Rust':>14}")
    for name, py, rs in rows:
        print(f"{name:44} {py:10.0f} {rs:10.0f} {py - rs:14.0f}")


if __name__ == "__main__":
    main()
