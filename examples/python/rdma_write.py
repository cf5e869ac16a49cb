"""RDMA WRITE, READ and SEND between two soft NICs on loopback, the verbs way: regions,
completion queues and an RC queue pair on each side, endpoints exchanged as bytes.

    python examples/python/rdma_write.py

Runs on 127.0.1.93 and 127.0.1.94; no privileges needed.
"""

import numpy as np

import ferroce


def main() -> None:
    with ferroce.Nic("127.0.1.93") as a, ferroce.Nic("127.0.1.94") as b:
        cq_a, cq_b = ferroce.Cq(a), ferroce.Cq(b)
        qp_a = ferroce.Qp(a, ferroce.QpType.Rc, cq_a, cq_a)
        qp_b = ferroce.Qp(b, ferroce.QpType.Rc, cq_b, cq_b)
        # What each side would send the other over TCP, as bytes.
        qp_a.connect(ferroce.QpEndpoint.from_bytes(bytes(qp_b.endpoint())))
        qp_b.connect(ferroce.QpEndpoint.from_bytes(bytes(qp_a.endpoint())))

        tensor = np.linspace(0, 1, 1024, dtype=np.float32)
        src = ferroce.Region(a, tensor)  # registers a copy of the array's bytes
        dst = ferroce.Region(b, tensor.nbytes)  # zeroed, viewable in place

        qp_a.post_send(ferroce.SendWr(1, ferroce.SendOp.write(dst.remote()), src.local()))
        done = cq_a.wait(timeout=5.0)
        print("WRITE:", done)
        landed = np.asarray(dst).view(np.float32)  # the remote region, no copy
        assert np.array_equal(landed, tensor), "the WRITE did not land"

        back = ferroce.Region(a, 16)
        qp_a.post_send(ferroce.SendWr(2, ferroce.SendOp.read(dst.remote(0)), back.local()))
        print("READ: ", cq_a.wait(timeout=5.0))
        assert back.read() == tensor[:4].tobytes()

        inbox = ferroce.Region(b, 64)
        qp_b.post_recv(ferroce.RecvWr(7, inbox.local()))
        qp_a.post_send(ferroce.SendWr(3, ferroce.SendOp.send_with_imm(42), b"hello from a"))
        cq_a.wait(timeout=5.0)
        got = cq_b.wait(timeout=5.0)
        print("SEND: ", got, inbox.read(0, got.byte_len))
        assert got.imm == 42 and inbox.read(0, got.byte_len) == b"hello from a"
        print("NIC a counters:", {k: v for k, v in a.counters().items() if v})


if __name__ == "__main__":
    main()
