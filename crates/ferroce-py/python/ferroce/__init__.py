"""ferroce: RoCEv2 in Rust, from Python.

The NIC and verbs objects live here; the faces live in submodules:
:mod:`ferroce.frames` (sensor frames, zero-copy), :mod:`ferroce.cache` (a registered-buffer
cache bound to one remote host) and :mod:`ferroce.session` (controller and coprocessor).

Every wait releases the GIL and wakes at least every 100 ms to let Ctrl-C through. Errors are
:class:`FerroceError` subclasses carrying the Rust error's message, with ``kind`` naming the
Rust error and ``errno`` the OS error number where there is one.
"""

from ._ferroce import (
    AddressInUse,
    AddressNotAvailable,
    CacheError,
    Closed,
    Completion,
    CoprocessorFailed,
    Cq,
    DeviceError,
    Faults,
    FerroceError,
    FrameOverwritten,
    InvalidArgument,
    ModifyError,
    Nic,
    NotStarted,
    NotSupported,
    OutOfOrder,
    PeerGone,
    PostError,
    Qp,
    QpEndpoint,
    QpType,
    ReceivePathFailed,
    RecvWr,
    Region,
    RegionAccess,
    RegionError,
    RemoteAddr,
    SendOp,
    SendWr,
    SessionError,
    Sge,
    Timeout,
    TransportError,
    WriteOrder,
    __version__,
)

from . import cache, frames, session  # noqa: E402  (the faces, by module)

__all__ = [
    "AddressInUse",
    "AddressNotAvailable",
    "CacheError",
    "Closed",
    "Completion",
    "CoprocessorFailed",
    "Cq",
    "DeviceError",
    "Faults",
    "FerroceError",
    "FrameOverwritten",
    "InvalidArgument",
    "ModifyError",
    "Nic",
    "NotStarted",
    "NotSupported",
    "OutOfOrder",
    "PeerGone",
    "PostError",
    "Qp",
    "QpEndpoint",
    "QpType",
    "ReceivePathFailed",
    "RecvWr",
    "Region",
    "RegionAccess",
    "RegionError",
    "RemoteAddr",
    "SendOp",
    "SendWr",
    "SessionError",
    "Sge",
    "Timeout",
    "TransportError",
    "WriteOrder",
    "__version__",
    "cache",
    "frames",
    "session",
]
