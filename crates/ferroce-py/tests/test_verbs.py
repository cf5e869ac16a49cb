"""RC WRITE, READ and SEND between two soft NICs; regions and what they accept."""

import mmap
import os

import numpy as np
import pytest

import ferroce
from conftest import ip

pytestmark = pytest.mark.timeout(60)


def pair(a, b):
    na, nb = ferroce.Nic(ip(a)), ferroce.Nic(ip(b))
    ca, cb = ferroce.Cq(na), ferroce.Cq(nb)
    qa = ferroce.Qp(na, ferroce.QpType.Rc, ca, ca)
    qb = ferroce.Qp(nb, ferroce.QpType.Rc, cb, cb)
    # The endpoints travel as bytes, as they would over any out-of-band channel.
    qa.connect(ferroce.QpEndpoint.from_bytes(bytes(qb.endpoint())))
    qb.connect(ferroce.QpEndpoint.from_bytes(bytes(qa.endpoint())))
    assert qa.state() == "Rts" and qb.state() == "Rts"
    return na, nb, ca, cb, qa, qb


def test_write_read_and_send_between_two_nics():
    na, nb, ca, cb, qa, qb = pair(21, 22)
    with na, nb:
        payload = np.arange(4096, dtype=np.uint8)
        src = ferroce.Region(na, payload)
        dst = ferroce.Region(nb, 8192, ferroce.RegionAccess.Remote)

        qa.post_send(ferroce.SendWr(1, ferroce.SendOp.write(dst.remote(100)), src.local()))
        c = ca.wait(timeout=5.0)
        assert c is not None and c.ok and c.status == "Success"
        assert c.opcode == "RdmaWrite" and c.wr_id == 1 and c.byte_len == 4096
        assert dst.read(100, 4096) == payload.tobytes()
        # The destination seen in place: no copy.
        view = np.asarray(dst)
        assert np.array_equal(view[100:4196], payload)

        # READ into the caller's own array, registered in place.
        landing = np.zeros(4096, dtype=np.uint8)
        back = ferroce.Region(na, landing)
        qa.post_send(ferroce.SendWr(2, ferroce.SendOp.read(dst.remote(100)), back.local()))
        c = ca.wait(timeout=5.0)
        assert c.ok and c.opcode == "RdmaRead"
        assert np.array_equal(landing, payload)

        inbox = ferroce.Region(nb, 256)
        qb.post_recv(ferroce.RecvWr(9, inbox.local(0, 256)))
        qa.post_send(ferroce.SendWr(3, ferroce.SendOp.send_with_imm(0xABCD), b"a small message"))
        assert ca.wait(timeout=5.0).ok
        got = cb.wait(timeout=5.0)
        assert got.ok and got.opcode == "Recv" and got.wr_id == 9
        assert got.imm == 0xABCD and got.byte_len == 15
        assert inbox.read(0, 15) == b"a small message"

        qa.post_send_list(
            [ferroce.SendWr(10 + i, ferroce.SendOp.write(dst.remote(i * 8)), b"%08d" % i) for i in range(4)]
        )
        done = sorted(ca.wait(timeout=5.0).wr_id for _ in range(4))
        assert done == [10, 11, 12, 13]
        assert dst.read(0, 32) == b"00000000000000010000000200000003"


def test_atomics_and_a_polled_write():
    na, nb, ca, cb, qa, qb = pair(23, 24)
    with na, nb:
        target = ferroce.Region(nb, 8)
        target.write((41).to_bytes(8, "little"))
        old = ferroce.Region(na, 8)
        qa.post_send(ferroce.SendWr(1, ferroce.SendOp.fetch_add(target.remote(), 1), old.local()))
        assert ca.wait(5.0).ok
        assert int.from_bytes(old.read(), "little") == 41
        assert int.from_bytes(target.read(), "little") == 42
        # Polling drives the engine on this thread.
        qa.post_send(ferroce.SendWr(2, ferroce.SendOp.write(target.remote()), b"12345678"))
        c = None
        for _ in range(100_000):
            c = ca.poll()
            if c is not None:
                break
        assert c is not None and c.ok
        assert ca.poll_into(8) == []


def test_region_accepts_arrays_bytes_dlpack_and_addresses():
    nic = ferroce.Nic(ip(25))
    with nic:
        arr = np.arange(1000, dtype=np.uint32)
        assert ferroce.Region(nic, arr).read() == arr.tobytes()
        assert ferroce.Region(nic, bytearray(b"abc")).read() == b"abc"
        assert ferroce.Region(nic, memoryview(b"xyz")).read() == b"xyz"

        class DlpackOnly:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        assert ferroce.Region(nic, DlpackOnly(arr)).read() == arr.tobytes()
        assert ferroce.Region(nic, (arr.ctypes.data, arr.nbytes)).read() == arr.tobytes()
        # A writable array is registered in place: the region is the array's memory, both
        # ways, and keeps the array alive after the caller lets go of it.
        r = ferroce.Region(nic, arr)
        assert r.local(0, 4).addr == arr.ctypes.data
        arr[0] = 7
        assert r.read(0, 4) == (7).to_bytes(4, "little")
        r.write((9).to_bytes(4, "little"), 4)
        assert arr[1] == 9
        assert np.shares_memory(np.asarray(r), arr)
        with pytest.raises(ValueError):
            arr.resize(2000)  # NumPy refuses: the region refers to it
        # So is (address, length), as Mooncake's register_memory takes it.
        by_address = ferroce.Region(nic, (arr.ctypes.data + 8, 16))
        by_address.write(b"\xff" * 4)
        assert arr[2] == 0xFFFF_FFFF
        with pytest.raises(ferroce.InvalidArgument, match="not mapped"):
            ferroce.Region(nic, (8, 4096))
        # copy=True, a read-only array and bytes-likes are copies: they do not alias.
        copied = ferroce.Region(nic, arr, copy=True)
        arr[3] = 5
        assert copied.read(12, 4) == (3).to_bytes(4, "little")
        frozen = np.arange(4, dtype=np.uint8)
        frozen.flags.writeable = False
        assert not np.shares_memory(np.asarray(ferroce.Region(nic, frozen)), frozen)
        # Pinned memory is never handed out.
        pinned = ferroce.Region(nic, 64, pinned=True)
        with pytest.raises(ferroce.NotSupported, match="not viewable"):
            np.asarray(pinned)
        assert pinned.read() == bytes(64)


def test_region_from_a_memfd_is_the_callers_memory():
    nic = ferroce.Nic(ip(26))
    with nic:
        fd = os.memfd_create("ferroce-test")
        os.ftruncate(fd, 4096)
        m = mmap.mmap(fd, 4096)
        region = ferroce.Region.from_dmabuf(nic, fd, 0, 4096)
        os.close(fd)
        region.write(b"through the NIC", 10)
        assert m[10:25] == b"through the NIC"
        assert region.deregister() is None
        m.close()
