"""A request/reply session whose coprocessor function is Python: the controller offloads
requests over RDMA WRITE-with-immediate, the coprocessor's engine thread calls the function,
and the reply comes back the same way.

    python examples/python/session_roundtrip.py [--requests N]

Runs on 127.0.1.95 (controller) and 127.0.1.96 (coprocessor, out-of-band TCP port 19696).
"""

import argparse
import hashlib
import statistics
import threading

import ferroce
from ferroce import session

DESC = session.ChannelDesc(slots=8, request_bytes=4096, reply_bytes=64)


def digest(request: bytes) -> bytes:
    """The coprocessor function: runs on the engine's thread, once per request."""
    return hashlib.sha256(request).digest()


def coprocessor(ready: list) -> None:
    c = session.Coprocessor()
    c.connect(session.ConnectInfo("127.0.1.96", "127.0.1.96:19696"))
    region = c.alloc_memory(DESC.region_bytes())
    peer = c.exchange_keys(region)
    c.establish_channel(DESC, region, peer)
    c.set_coprocessor_fn(digest)
    c.start()
    ready.append(c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()

    ready: list = []
    server = threading.Thread(target=coprocessor, args=(ready,))
    server.start()
    with session.Controller() as ctl:
        ctl.connect(session.ConnectInfo("127.0.1.95", "127.0.1.96:19696"))
        region = ctl.alloc_memory(DESC.region_bytes())
        peer = ctl.exchange_keys(region)
        ctl.establish_channel(DESC, region, peer)
        ctl.start()
        server.join()
        with ready[0]:
            rtts = []
            for n in range(args.requests):
                request = b"frame %d " % n * 64
                ctl.submit(request)
                _, reply = ctl.collect(timeout=5.0)
                assert reply == digest(request), f"request {n}: wrong reply"
                rtts.append(ctl.last_rtt_ns())
    print(f"{args.requests} round trips, replies checked; RTT median "
          f"{statistics.median(rtts) / 1000:.1f} us, max {max(rtts) / 1000:.1f} us")


if __name__ == "__main__":
    main()
