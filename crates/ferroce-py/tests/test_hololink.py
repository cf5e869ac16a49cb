"""The Hololink-shaped receivers (ferroce.hololink): upstream's constructor arguments, method
names and ``(ok, metadata)`` tuples, over the real engine on 127.0.1.78-79."""

import socket
import threading

import numpy as np
import pytest

import ferroce
from ferroce import frames, hololink
from conftest import ip

pytestmark = pytest.mark.timeout(60)

FRAME = 6000
PAGE = 6144 + 128


def test_a_linux_receiver_on_the_callers_socket_speaks_upstreams_shapes():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((ip(78), 0))
    port = sock.getsockname()[1]
    rx = hololink.LinuxReceiver(
        0, 0, PAGE, 2, sock, 0, queue_size=2, cu_frame_size=FRAME, peer_ip=ip(79)
    )
    sock.close()  # the NIC has its own duplicate of the socket
    with pytest.raises(ferroce.NotStarted):
        rx.get_next_frame(10)
    rx.start()
    assert rx.local_port() == port
    assert (rx.frame_size(), rx.page_size(), rx.pages()) == (FRAME, PAGE, 2)
    announced = []
    rx.set_frame_ready(lambda: announced.append(1))
    monitor = threading.Thread(target=rx.blocking_monitor)
    monitor.start()
    try:
        target = frames.Target.for_receiver(rx.receiver)
        tx = frames.Sender(ip(79), target)
        for n in range(3):
            data = frames.Pattern.Counter.fill(n, FRAME)
            tx.send_frame(data)
            ok, md = rx.get_next_frame(5000)
            assert ok
            assert md["frame_number"] == n and md["received_frame_number"] == n + 1
            assert md["bytes_written"] == FRAME and md["dropped"] == 0
            assert md["frame_memory"] == rx.external_frame_memory() + (n % 2) * PAGE
            assert md["metadata_memory"] == md["frame_memory"] + 6016  # the frame rounded up to 128
            assert md["rx_write_requests"] >= n + 1 and md["packets_dropped"] == 0
            assert md["complete"] and md["frame_packets_lost"] == 0
            view = np.asarray(rx.frame())
            assert view.ctypes.data == md["frame_memory"]
            assert view.tobytes() == data
        assert rx.get_next_frame(20) == (False, {})
        assert not rx.frames_ready() and not rx.receive_path_failed()
    finally:
        rx.close()
        monitor.join(timeout=10)
    assert not monitor.is_alive()
    assert len(announced) >= 3


def test_a_roce_receiver_names_a_device_it_cannot_open():
    rx = hololink.RoceReceiver("mlx5_77", 1, 0, 0, FRAME, PAGE, 2, PAGE - 128, ip(79))
    with pytest.raises(ferroce.NotStarted):
        rx.get_qp_number()
    with pytest.raises(ferroce.FerroceError, match="mlx5_77|libibverbs|RDMA"):
        rx.start()
    with pytest.raises(ValueError, match="get_next_frame first"):
        rx.frame()
