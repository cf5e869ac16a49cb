"""The frames face: byte-exact, zero-copy frames; the callback from the Rust thread; the
GIL free during waits; loss reported per frame; a failed receive path and its restart."""

import os
import signal
import sys
import threading

import numpy as np
import pytest

import ferroce
from ferroce import frames
from conftest import PyDevice, ip

pytestmark = pytest.mark.timeout(60)


def started(host, peer, frame_size=10_000, pages=3, **kw):
    nic = ferroce.Nic(ip(host))
    rx = frames.Receiver()
    rx.start(nic, frames.ReceiverConfig(frame_size, pages, ip(peer), **kw))
    return nic, rx


def test_frames_arrive_byte_exact_and_zero_copy():
    nic, rx = started(1, 2, queue_size=3)
    with nic, rx:
        rx.run_monitor()
        tx = frames.Sender(ip(2), frames.Target.for_receiver(rx, payload=1408))
        ring = rx.external_frame_memory()
        for n in range(6):
            data = frames.Pattern.Counter.fill(n, 10_000)
            sent = tx.send_frame(data)
            frame = rx.next_frame(timeout=5.0)
            assert frame is not None, f"frame {n} did not arrive"
            assert frame.complete and frame.info.is_complete()
            assert frame.info.packets_lost == 0
            assert frame.info.metadata.frame_number == n
            assert frame.page == sent.page == n % 3
            assert len(frame) == 10_000

            view = np.asarray(frame)
            assert view.dtype == np.uint8 and view.shape == (10_000,)
            assert view.tobytes() == data
            # Zero copy: the array's memory is the ring page itself.
            assert view.ctypes.data == frame.addr == ring + frame.page * rx.page_size()
            assert not view.flags.writeable

            dl = np.from_dlpack(frame)
            assert dl.ctypes.data == frame.addr
            assert np.shares_memory(dl, view)
            assert dl.tobytes() == data
            assert frame.__dlpack_device__() == (1, 0)
            assert frame.device == "cpu"

            assert frame.still_valid()
            out = np.zeros(10_000, np.uint8)
            frame.copy_into(out)
            assert out.tobytes() == data
            buf = bytearray(10_000)
            frame.copy_into(buf)
            assert bytes(buf) == data
            assert frame.to_bytes() == data
            assert rx.read_frame(frame.info) == data
        counters = rx.counters()
        assert counters.frames == 6 and counters.packets_lost == 0


def test_a_view_kept_past_the_ring_wrap_says_it_is_stale():
    nic, rx = started(3, 4, frame_size=4096, pages=2, queue_size=2)
    with nic, rx:
        rx.run_monitor()
        tx = frames.Sender(ip(4), frames.Target.for_receiver(rx))
        tx.send_frame(frames.Pattern.Counter.fill(0, 4096))
        first = rx.next_frame(5.0)
        assert first.still_valid()
        # Two more frames: the ring (2 pages) wraps onto the first frame's page.
        for n in (1, 2):
            tx.send_frame(frames.Pattern.Counter.fill(n, 4096))
            assert rx.next_frame(5.0) is not None
        assert not first.still_valid()
        with pytest.raises(ferroce.FrameOverwritten, match="overtaken"):
            first.copy_into(bytearray(4096))
        # The memory itself stays mapped: reading the stale view is safe, just not the frame.
        assert np.asarray(first).tobytes() == frames.Pattern.Counter.fill(2, 4096)


def test_the_callback_runs_on_the_rust_thread_and_survives_exceptions(monkeypatch):
    nic, rx = started(5, 6, frame_size=2000, pages=4, queue_size=4)
    seen = []
    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(u))

    def ready():
        seen.append((threading.get_ident(), threading.current_thread().name))
        if len(seen) == 1:
            raise ValueError("the application's callback broke")

    with nic, rx:
        rx.set_frame_ready(ready)
        rx.run_monitor()
        tx = frames.Sender(ip(6), frames.Target.for_receiver(rx, payload=1024))
        for n in range(3):
            tx.send_frame(frames.Pattern.Counter.fill(n, 2000))
            assert rx.next_frame(5.0) is not None, "the receiver kept running"
        # The callback runs just after a frame is queued: wait (bounded) for the third call.
        deadline = threading.Event()
        for _ in range(500):
            if len(seen) >= 3:
                break
            deadline.wait(0.01)
        assert len(seen) == 3
        assert not rx.receive_path_failed()
    main = threading.get_ident()
    assert all(ident != main for ident, _ in seen)
    # Not a thread Python started: the interpreter sees it as a foreign ("dummy") thread.
    assert all(name.startswith("Dummy") for _, name in seen), seen
    assert len(raised) == 1
    assert isinstance(raised[0].exc_value, ValueError)
    assert "callback broke" in str(raised[0].exc_value)


def test_next_frame_leaves_the_gil_to_other_threads():
    nic, rx = started(7, 8)
    with nic, rx:
        rx.run_monitor()
        count = 0
        stop = threading.Event()

        def spin():
            nonlocal count
            while not stop.is_set():
                count += 1

        t = threading.Thread(target=spin)
        t.start()
        before = count
        assert rx.next_frame(timeout=0.5) is None
        during = count - before
        stop.set()
        t.join()
        assert during > 0, "a Python thread made no progress while next_frame waited"


def test_close_from_another_thread_ends_blocking_monitor():
    nic, rx = started(9, 10)
    with nic:
        result = []
        t = threading.Thread(target=lambda: result.append(rx.blocking_monitor()))
        t.start()
        closer = threading.Timer(0.3, rx.close)
        closer.start()
        t.join(timeout=10)
        assert not t.is_alive()
        assert result == [None]


def test_ctrl_c_interrupts_a_wait():
    nic, rx = started(11, 12)
    with nic, rx:
        rx.run_monitor()
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            rx.next_frame(timeout=None)
        timer.join()


def test_loss_is_reported_per_frame():
    nic, rx = started(13, 14, frame_size=40_000, pages=4, queue_size=4)
    with nic, rx:
        rx.run_monitor()
        tx = frames.Sender(ip(14), frames.Target.for_receiver(rx, payload=1024))
        tx.set_faults("loss=0.1,seed=7")
        got = []
        for n in range(30):
            data = frames.Pattern.Counter.fill(n, 40_000)
            tx.send_frame(data)
            tx.flush()
            frame = rx.next_frame(timeout=0.5)
            if frame is not None:
                got.append((frame, data, frame.to_bytes()))
        assert got, "no frame survived 10 % loss"
        lossy = [f for f, _, _ in got if f.info.packets_lost > 0]
        assert lossy, "10 % loss over 30 frames of 40 packets lost nothing"
        for f in lossy:
            assert not f.complete and not f.info.is_complete()
        for f, data, copy in got:
            if f.info.packets_lost == 0 and f.complete:
                assert copy == data
        assert rx.counters().packets_lost >= sum(f.info.packets_lost for f in lossy)


def test_a_failed_receive_path_restarts():
    nic = ferroce.Nic(ip(15))
    with nic:
        rx = frames.Receiver()
        ring = 3 * frames.ReceiverConfig(3000, 3, ip(16)).page_size
        broken = PyDevice(ring, fail_after=2)  # one frame: its data and its metadata
        rx.start(nic, frames.ReceiverConfig(3000, 3, ip(16), device_memory=broken))
        rx.run_monitor()
        tx = frames.Sender(ip(16), frames.Target.for_receiver(rx, payload=1024))
        tx.send_frame(frames.Pattern.Counter.fill(0, 3000))
        first = rx.next_frame(5.0)
        assert first is not None and first.device == "device"
        with pytest.raises(ferroce.NotSupported):
            np.asarray(first)
        assert first.to_bytes() == frames.Pattern.Counter.fill(0, 3000)

        tx.send_frame(frames.Pattern.Counter.fill(1, 3000))
        for _ in range(500):
            if rx.receive_path_failed():
                break
            threading.Event().wait(0.01)
        assert rx.receive_path_failed()
        assert "unplugged" in rx.failure()
        assert rx.frames_ready()
        assert rx.next_frame(5.0) is None

        working = PyDevice(ring)
        rx.start(nic, frames.ReceiverConfig(3000, 3, ip(16), device_memory=working))
        assert not rx.receive_path_failed()
        rx.run_monitor()
        tx.retarget(frames.Target.for_receiver(rx, payload=1024))
        data = frames.Pattern.Counter.fill(2, 3000)
        tx.send_frame(data)
        frame = rx.next_frame(5.0)
        assert frame is not None and frame.to_bytes() == data
        assert working.buf[frame.page * rx.page_size():][:3000] == data
        rx.close()


def test_the_data_channel_programs_a_stand_in_device():
    nic, rx = started(17, 18, frame_size=5000, pages=2)
    with nic, rx:
        device = frames.DeviceRegisters.serve(ip(18) + ":8192")
        channel = frames.DataChannel(ip(18))
        channel.configure_roce(frames.RoceChannel.for_receiver(rx, payload=1408))
        target = device.wait_programmed(timeout=5.0)
        assert target is not None
        assert target.qp == rx.qp_number() and target.rkey == rx.rkey()
        assert target.address == rx.external_frame_memory()
        rx.run_monitor()
        tx = frames.Sender(ip(18), target)
        data = frames.Pattern.Counter.fill(0, 5000)
        tx.send_frame(data)
        assert rx.next_frame(5.0).to_bytes() == data


def cupy():
    """CuPy, which the GPU cases read frames with: skipped where it is missing, except where
    `FERROCE_REQUIRE_GPU=1` (scripts/gpu-check.sh) makes its absence a failure."""
    if os.environ.get("FERROCE_REQUIRE_GPU") == "1":
        import cupy as cp

        return cp
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_cuda_frames_export_cuda_interfaces():
    cp = cupy()
    nic, rx = started(19, 20, frame_size=8192, pages=2, device="cuda:0")
    with nic, rx:
        rx.run_monitor()
        tx = frames.Sender(ip(20), frames.Target.for_receiver(rx))
        data = frames.Pattern.Counter.fill(0, 8192)
        tx.send_frame(data)
        frame = rx.next_frame(5.0)
        assert frame.device == "cuda:0"
        assert frame.__dlpack_device__() == (2, 0)
        arr = cp.asarray(frame)
        assert arr.data.ptr == frame.addr
        assert cp.asnumpy(arr).tobytes() == data
        assert cp.asnumpy(cp.from_dlpack(frame)).tobytes() == data


class FakeCudaArray:
    """Looks like a CuPy array to the receiver: a writable `__cuda_array_interface__`."""

    def __init__(self, nbytes):
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (0x7F00_0000_0000, False),
            "strides": None,
        }


def test_a_cuda_array_as_device_memory_needs_the_cuda_feature_or_a_gpu():
    nic = ferroce.Nic(ip(27))
    rx = frames.Receiver()
    with nic, rx:
        config = frames.ReceiverConfig(4096, 2, ip(28), device_memory=FakeCudaArray(1 << 16))
        # Without the feature the refusal says how to get it; with it, on a host without a
        # GPU, the driver's absence is named. Either way nothing is started.
        with pytest.raises((ferroce.NotSupported, ferroce.DeviceError), match="cuda|CUDA"):
            rx.start(nic, config)
        with pytest.raises(ferroce.NotStarted):
            rx.qp_number()


@pytest.mark.gpu
def test_frames_land_in_a_callers_cupy_array():
    cp = cupy()
    nic = ferroce.Nic(ip(29))
    rx = frames.Receiver()
    with nic, rx:
        config = frames.ReceiverConfig(8192, 2, ip(30))
        ring = cp.zeros(config.page_size * 2, dtype=cp.uint8)
        config.device_memory = ring
        rx.start(nic, config)
        rx.run_monitor()
        tx = frames.Sender(ip(30), frames.Target.for_receiver(rx))
        data = frames.Pattern.Counter.fill(0, 8192)
        tx.send_frame(data)
        frame = rx.next_frame(5.0)
        assert frame is not None and frame.device == "cuda:0"
        assert frame.addr == ring.data.ptr
        assert cp.asnumpy(ring[:8192]).tobytes() == data
