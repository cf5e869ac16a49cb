"""Hololink-shaped receivers on ferroce.

Holoscan Sensor Bridge code drives its raw receivers through ``hololink.operators``:
``RoceReceiver(ibv_name, ibv_port, cu_buffer, …)`` and ``LinuxReceiver(cu_buffer, …, socket,
…)``, each with ``start``, ``blocking_monitor``, ``get_next_frame(timeout_ms)`` returning
``(ok, metadata)``, ``set_frame_ready``, ``get_qp_number``, ``get_rkey``, ``frames_ready`` and
``close``. The classes here take the same arguments and answer in the same shapes, on the soft
NIC or a verbs device, so such code can move to ferroce by changing its import.

- ``cu_buffer`` may be 0 (frames stay in ferroce's host ring: ``metadata["frame_memory"]`` is a
  host address, and :meth:`RoceReceiver.frame` hands the frame to NumPy without a copy), or a
  ``CUdeviceptr`` of ``cu_buffer_size`` bytes (needs ferroce built with the ``cuda`` feature),
  which must stay allocated while the receiver runs.
- ``ibv_name`` is ``"ferroce0"`` for the soft NIC on the local address that routes to
  ``peer_ip``, or a verbs device's name.

This module is ``ferroce.hololink``; ferroce never installs a top-level ``hololink``.
"""

from __future__ import annotations

import socket as _socket
from typing import Any, Callable, Optional

from . import Nic
from .frames import Frame, FrameInfo, Receiver, ReceiverConfig

__all__ = ["LinuxReceiver", "RoceReceiver"]


class _CudaBuffer:
    """A caller's ``cu_buffer`` as an object the receiver borrows device memory from."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (size,),
            "typestr": "|u1",
            "data": (pointer, False),
            "strides": None,
        }


def _config(
    cu_buffer: int,
    cu_buffer_size: int,
    cu_frame_size: int,
    cu_page_size: int,
    pages: int,
    metadata_offset: Optional[int],
    peer_ip: str,
    queue_size: int,
) -> ReceiverConfig:
    config = ReceiverConfig(
        cu_frame_size,
        pages,
        peer_ip,
        page_size=cu_page_size or None,
        metadata_offset=metadata_offset or None,
        queue_size=queue_size,
    )
    if cu_buffer:
        config.device_memory = _CudaBuffer(cu_buffer, cu_buffer_size)
    return config


class _Base:
    """What both receivers share: the run, frames and Hololink's accessors."""

    _rx: Receiver
    _last: Optional[FrameInfo]

    @property
    def receiver(self) -> Receiver:
        """The ferroce receiver underneath, for what upstream's classes lack (counters,
        checked copies, the device side's target)."""
        return self._rx

    def blocking_monitor(self) -> None:
        """Runs the receive path on this thread until :meth:`close`."""
        self._rx.blocking_monitor()

    def run(self) -> None:
        """The same as :meth:`blocking_monitor`, under the name HSB's Linux receiver uses."""
        self._rx.blocking_monitor()

    def close(self) -> None:
        """Ends the run; :meth:`blocking_monitor` returns."""
        self._rx.close()

    def get_next_frame(self, timeout_ms: int, cuda_stream: int = 0) -> tuple[bool, dict[str, Any]]:
        """Waits up to ``timeout_ms`` for a frame: ``(True, metadata)``, or ``(False, {})``
        when none came. ``cuda_stream`` is accepted for the upstream signature; frames are
        whole in memory before they are handed out, so there is nothing to order on it."""
        del cuda_stream
        frame = self._rx.next_frame(timeout=timeout_ms / 1000.0)
        if frame is None:
            self._last = None
            return False, {}
        self._last = frame.info
        return True, self._metadata(frame)

    def frame(self) -> Frame:
        """The last frame :meth:`get_next_frame` took, as a zero-copy view
        (``numpy.asarray`` or ``cupy.asarray`` take it)."""
        if self._last is None:
            raise ValueError("no frame taken yet: call get_next_frame first")
        return self._rx.frame_view(self._last)

    def frames_ready(self) -> bool:
        return self._rx.frames_ready()

    def set_frame_ready(self, callback: Optional[Callable[[], Any]]) -> None:
        """Calls ``callback`` on the monitor thread whenever a frame completes."""
        self._rx.set_frame_ready(callback)

    def receive_path_failed(self) -> bool:
        return self._rx.receive_path_failed()

    def get_qp_number(self) -> int:
        return self._rx.qp_number()

    def get_rkey(self) -> int:
        return self._rx.rkey()

    def external_frame_memory(self) -> int:
        return self._rx.external_frame_memory()

    def frame_size(self) -> int:
        return self._rx.frame_size()

    def page_size(self) -> int:
        return self._rx.page_size()

    def pages(self) -> int:
        return self._rx.pages()

    def _metadata(self, frame: Frame) -> dict[str, Any]:
        info, md = frame.info, frame.info.metadata
        counters = self._rx.counters()
        seconds = int(info.received)
        frame_memory = frame.addr
        return {
            "frame_memory": frame_memory,
            "metadata_memory": frame_memory + self._rx.metadata_offset(),
            "received_frame_number": info.received_frame_number,
            "frame_number": info.frame_number,
            "imm_data": info.imm,
            "received_s": seconds,
            "received_ns": int((info.received - seconds) * 1e9),
            "rx_write_requests": counters.packets,
            "dropped": info.dropped,
            "frame_packets_received": info.packets_received,
            "frame_bytes_received": info.bytes_received,
            "packets_dropped": counters.packets_lost,
            "crc": md.crc,
            "psn": md.psn,
            "bytes_written": md.bytes_written,
            "timestamp_s": md.timestamp_s,
            "timestamp_ns": md.timestamp_ns,
            "metadata_s": md.metadata_s,
            "metadata_ns": md.metadata_ns,
            "flags": md.flags,
            "frame_packets_lost": info.packets_lost,
            "complete": frame.complete,
            "page": frame.page,
        }


class RoceReceiver(_Base):
    """HSB's ``RoceReceiver``: a receiver on the device called ``ibv_name``."""

    def __init__(
        self,
        ibv_name: str,
        ibv_port: int,
        cu_buffer: int,
        cu_buffer_size: int,
        cu_frame_size: int,
        cu_page_size: int,
        pages: int,
        metadata_offset: int,
        peer_ip: str,
        queue_size: int = 1,
    ) -> None:
        self._rx = Receiver()
        self._last = None
        self._name, self._port = ibv_name, ibv_port
        self._config = _config(
            cu_buffer,
            cu_buffer_size,
            cu_frame_size,
            cu_page_size,
            pages,
            metadata_offset,
            peer_ip,
            queue_size,
        )
        self.nic: Optional[Nic] = None

    def start(self) -> None:
        """Brings the receiver up (Hololink's ``start``); again after a failed receive path."""
        self.nic = self._rx.start_named(self._name, self._port, self._config)


class LinuxReceiver(_Base):
    """HSB's ``LinuxReceiver``: a receiver on a UDP socket the caller bound (its data
    channel's ``configure_socket``), which ferroce's soft NIC takes over."""

    def __init__(
        self,
        cu_buffer: int,
        cu_buffer_size: int,
        cu_page_size: int,
        pages: int,
        socket: _socket.socket,
        received_address_offset: int,
        queue_size: int = 1,
        *,
        cu_frame_size: Optional[int] = None,
        peer_ip: str,
    ) -> None:
        del received_address_offset  # ferroce's pages carry their metadata where HSB puts it
        self._rx = Receiver()
        self._last = None
        frame_size = cu_frame_size or cu_page_size - 128
        self._config = _config(
            cu_buffer, cu_buffer_size, frame_size, cu_page_size, pages, None, peer_ip, queue_size
        )
        self.nic = Nic.from_udp_socket(socket)

    def start(self) -> None:
        """Brings the receiver up on the caller's socket."""
        self._rx.start(self.nic, self._config)

    def local_port(self) -> int:
        """The UDP port the device sends to (the socket's)."""
        return self._rx.local_addr()[1]
