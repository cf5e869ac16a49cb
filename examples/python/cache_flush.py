"""The registered-buffer cache: two contexts bound to each other over loopback; one flushes
buffers, the other receives them, and buffers go back to the cache still registered.

    python examples/python/cache_flush.py

Runs on 127.0.1.97 and 127.0.1.98 (out-of-band TCP port 19698).
"""

import threading

from ferroce import cache


def main() -> None:
    box = []
    listener = threading.Thread(
        target=lambda: box.append(cache.Context.connect(cache.ContextConfig("127.0.1.98", "127.0.1.98:19698", True)))
    )
    listener.start()
    sender = cache.Context.connect(cache.ContextConfig("127.0.1.97", "127.0.1.98:19698", False))
    listener.join()
    receiver = box[0]
    for n in range(20):
        with sender.write_memory(64 * 1024) as buf:
            buf.write(bytes([n % 256]) * len(buf))
            sender.flush(buf)
        with receiver.receive(timeout=5.0) as got:
            assert got.to_bytes() == bytes([n % 256]) * len(got)
    stats = sender.stats()
    print(f"20 buffers flushed and received; {stats['registrations']} registrations, "
          f"{stats['hits']} cache hits")


if __name__ == "__main__":
    main()
