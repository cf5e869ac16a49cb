"""Receive sensor frames without copying them: a software bridge (ferroce's Sender) writes
frames over RoCEv2 on loopback into a Receiver's ring, and NumPy reads each one in place.

    python examples/python/receive_frames.py [--frames N]

Runs on 127.0.1.91 (the receiver's NIC) and 127.0.1.92 (the bridge); no privileges needed.
"""

import argparse
import threading

import numpy as np

import ferroce
from ferroce import frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=10)
    parser.add_argument("--frame-size", type=int, default=1 << 20)
    args = parser.parse_args()

    ready = threading.Event()
    with ferroce.Nic("127.0.1.91") as nic, frames.Receiver() as rx:
        rx.start(nic, frames.ReceiverConfig(args.frame_size, pages=4, peer_ip="127.0.1.92"))
        # The callback runs on the receiver's own thread, once per frame.
        rx.set_frame_ready(ready.set)
        rx.run_monitor()

        bridge = frames.Sender("127.0.1.92", frames.Target.for_receiver(rx))
        bridge.set_window(256, rx)  # loopback has no link to pace it
        whole = 0
        for n in range(args.frames):
            data = frames.Pattern.Counter.fill(n, args.frame_size)
            bridge.send_frame(data)
            frame = rx.next_frame(timeout=5.0)
            if frame is None:
                raise SystemExit(f"frame {n} did not arrive: {rx.failure()}")
            pixels = np.asarray(frame)  # the ring page itself, no copy
            same = pixels.tobytes() == data and frame.still_valid()
            whole += same and frame.complete
            print(
                f"frame {frame.info.frame_number}: page {frame.page}, {len(frame)} bytes at "
                f"{frame.addr:#x}, {frame.info.packets_received} packets, "
                f"lost {frame.info.packets_lost}, checksum {int(pixels.sum())}, "
                f"{'byte-exact' if same else 'MISMATCH'}"
            )
        counters = rx.counters()
        print(f"{whole}/{args.frames} frames whole; receiver counted {counters.frames} frames, "
              f"{counters.packets} packets, {counters.packets_lost} lost")
        if whole != args.frames or not ready.is_set():
            raise SystemExit(1)


if __name__ == "__main__":
    main()
