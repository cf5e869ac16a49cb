"""Every error raised with its Rust message; teardown in any order, garbage collection
included, never crashes."""

import gc
import threading

import numpy as np
import pytest

import ferroce
from ferroce import frames, session
from conftest import ip

pytestmark = pytest.mark.timeout(60)


def test_errors_carry_their_class_kind_and_message():
    nic = ferroce.Nic(ip(60))
    with nic:
        with pytest.raises(ferroce.AddressInUse, match="already in use") as e:
            ferroce.Nic(ip(60))
        assert e.value.kind == "NicError::AddressInUse"
        assert isinstance(e.value, ferroce.FerroceError)

        rx = frames.Receiver()
        with pytest.raises(ferroce.NotStarted, match="has not been started"):
            rx.next_frame(0.1)
        with pytest.raises(ferroce.NotStarted):
            rx.run_monitor()
        with pytest.raises(ferroce.InvalidArgument, match="page_size") as e:
            rx.start(nic, frames.ReceiverConfig(1000, 2, ip(61), page_size=1000))
        assert isinstance(e.value, ValueError)
        assert e.value.kind == "StartError::Invalid"
        with pytest.raises(ferroce.InvalidArgument, match="queue_size"):
            rx.start(nic, frames.ReceiverConfig(1000, 2, ip(61), queue_size=5))
        with pytest.raises(ferroce.InvalidArgument, match="not an IPv4 or IPv6 address"):
            rx.start(nic, frames.ReceiverConfig(1000, 2, "not-an-address"))
        with pytest.raises(ferroce.NotSupported, match="cuda feature"):
            rx.start(nic, frames.ReceiverConfig(1000, 2, ip(61), device="cuda:0"))

        r = ferroce.Region(nic, 64)
        with pytest.raises(ferroce.InvalidArgument, match="outside the region of 64 bytes"):
            r.read(60, 10)
        with pytest.raises(ferroce.InvalidArgument, match="at least one byte"):
            ferroce.Region(nic, 0)
        with pytest.raises(ferroce.InvalidArgument, match="cannot read"):
            ferroce.Region(nic, (8, 16))  # not mapped: an error, not a crash
        with pytest.raises(ferroce.InvalidArgument, match="cannot take the bytes"):
            ferroce.Region(nic, object())
        with pytest.raises(ferroce.InvalidArgument, match="Local"):
            ferroce.Region(nic, 64, ferroce.RegionAccess.Local).remote()
        with pytest.raises(BufferError):
            r.__dlpack__(copy=True)

        cq = ferroce.Cq(nic)
        qp = ferroce.Qp(nic, ferroce.QpType.Rc, cq, cq)
        with pytest.raises(ferroce.PostError, match="state Init"):
            qp.post_send(ferroce.SendWr(1, ferroce.SendOp.send(), b"x"))
        with pytest.raises(ferroce.InvalidArgument, match="mtu 1000"):
            qp.connect(qp.endpoint(), mtu=1000)
        with pytest.raises(ferroce.InvalidArgument, match="timeout -1"):
            cq.wait(timeout=-1)
        with pytest.raises(ferroce.InvalidArgument, match="probability"):
            ferroce.Faults("loss=2")
        with pytest.raises(ferroce.InvalidArgument, match="exceeds the target's frame size"):
            t = frames.Target(ip(60), 1, 1, 0, 4096, 2, 1000, payload=1024)
            frames.Sender(ip(62), t).send_frame(b"x" * 1001)
        with pytest.raises(ferroce.InvalidArgument, match="payload"):
            frames.Sender(ip(62), frames.Target(ip(60), 1, 1, 0, 4096, 2, 1000, payload=100))

    with pytest.raises(ferroce.Closed, match="closed"):
        ferroce.Cq(nic)
    with pytest.raises(ferroce.OutOfOrder, match="alloc_memory needs connect first"):
        session.Coprocessor().alloc_memory(64)
    with pytest.raises(ferroce.Timeout, match="timed out") as e:
        session.Controller().connect(session.ConnectInfo(ip(63), ip(64) + ":19663", timeout=0.3))
    assert isinstance(e.value, TimeoutError)
    assert e.value.kind == "SessionError::Timeout"


def test_teardown_in_any_order_never_crashes():
    nic = ferroce.Nic(ip(70))
    rx = frames.Receiver()
    rx.start(nic, frames.ReceiverConfig(4096, 2, ip(71)))
    rx.set_frame_ready(lambda: None)
    rx.run_monitor()
    tx = frames.Sender(ip(71), frames.Target.for_receiver(rx))
    tx.send_frame(frames.Pattern.Counter.fill(0, 4096))
    frame = rx.next_frame(5.0)
    view = np.asarray(frame)
    capsule_array = np.from_dlpack(frame)
    region = ferroce.Region(nic, 128)
    region_view = np.asarray(region)
    cq = ferroce.Cq(nic)
    qp = ferroce.Qp(nic, ferroce.QpType.Rc, cq, cq)

    # The NIC first, then everything made on it, in no particular order.
    nic.close()
    assert nic.closed
    del rx  # the monitor is running: the receiver closes and lets it end
    gc.collect()
    assert view.tobytes() == frames.Pattern.Counter.fill(0, 4096)
    del frame
    gc.collect()
    assert capsule_array.tobytes() == frames.Pattern.Counter.fill(0, 4096)
    assert region.deregister() == bytes(128)
    region_view[0] = 1  # still mapped after deregister: the region object keeps it
    del qp, cq, region
    gc.collect()
    with pytest.raises(ferroce.Closed):
        nic.addr()


def test_a_dropped_receiver_in_a_callback_free_run_and_a_gc_cycle():
    nic = ferroce.Nic(ip(72))
    rx = frames.Receiver()
    rx.start(nic, frames.ReceiverConfig(1000, 2, ip(73)))
    # A cycle through the callback: only the garbage collector can free it.
    rx.set_frame_ready(lambda: rx.frames_ready())
    rx.run_monitor()
    del rx
    gc.collect()
    nic.close()


def test_sessions_dropped_without_stop_while_serving():
    desc = session.ChannelDesc(2, 64, 64)
    box = []

    def coprocessor():
        c = session.Coprocessor()
        c.connect(session.ConnectInfo(ip(75), ip(75) + ":19675"))
        m = c.alloc_memory(desc.region_bytes())
        c.establish_channel(desc, m, c.exchange_keys(m))
        c.set_coprocessor_fn(lambda r: r)
        c.start()
        box.append(c)

    t = threading.Thread(target=coprocessor)
    t.start()
    ctl = session.Controller()
    ctl.connect(session.ConnectInfo(ip(74), ip(75) + ":19675"))
    m = ctl.alloc_memory(desc.region_bytes())
    ctl.establish_channel(desc, m, ctl.exchange_keys(m))
    ctl.start()
    t.join()
    ctl.submit(b"ping")
    assert ctl.collect(5.0)[1] == b"ping"
    # Dropped, not stopped: the engine thread is joined without the GIL.
    box.clear()
    gc.collect()
    del ctl
    gc.collect()


def test_with_blocks_close_everything():
    with ferroce.Nic(ip(76)) as nic, frames.Receiver() as rx:
        rx.start(nic, frames.ReceiverConfig(1000, 2, ip(77)))
        rx.run_monitor()
        with ferroce.Region(nic, 64) as r:
            r.write(b"x")
        with pytest.raises(ferroce.Closed):
            r.read()
    assert nic.closed
