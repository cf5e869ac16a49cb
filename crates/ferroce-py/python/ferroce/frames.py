"""Sensor frames (Hololink's ``RoceReceiverInterfaceV2``).

A :class:`Receiver` takes frames into a ring of pages; :meth:`Receiver.next_frame` hands each
out as a :class:`Frame`, a zero-copy view of its page: ``numpy.asarray(frame)`` and
``numpy.from_dlpack(frame)`` read a host frame where it landed, ``cupy.asarray(frame)`` a CUDA
one. The page is the device's again once the ring wraps to it: :meth:`Frame.still_valid` says
whether the bytes are still the frame's, and :meth:`Frame.copy_into` is the checked copy.

:class:`Sender` is the device side (a software bridge); :class:`DataChannel` programs a device's
data channel over its control port, and :class:`DeviceRegisters` is a stand-in device for it.
"""

from ._ferroce import (
    DataChannel,
    DeviceRegisters,
    Frame,
    FrameCounters,
    FrameInfo,
    FrameSent,
    Metadata,
    Pattern,
    Receiver,
    ReceiverConfig,
    RoceChannel,
    Sender,
    Target,
)

#: The UDP port a bridge sends its data from.
BRIDGE_DATA_PORT = 12288
#: The metadata block's size, written after each frame.
METADATA_SIZE = 128
#: The UDP port of a bridge's control protocol.
CONTROL_PORT = 8192

__all__ = [
    "BRIDGE_DATA_PORT",
    "CONTROL_PORT",
    "DataChannel",
    "DeviceRegisters",
    "Frame",
    "FrameCounters",
    "FrameInfo",
    "FrameSent",
    "METADATA_SIZE",
    "Metadata",
    "Pattern",
    "Receiver",
    "ReceiverConfig",
    "RoceChannel",
    "Sender",
    "Target",
]
