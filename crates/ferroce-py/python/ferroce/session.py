"""The request/reply session (Catalyst's ``TransportSession``).

Both roles walk the same lifecycle, in this order (a call out of order raises
:class:`ferroce.OutOfOrder` naming the missing step):

1. ``connect(ConnectInfo(nic, oob))``: the controller dials ``oob``, the coprocessor listens;
2. ``alloc_memory(desc.region_bytes())``: a registered region;
3. ``exchange_keys(region)``: the peer's region (:class:`PeerRef`);
4. ``establish_channel(desc, region, peer)``;
5. on the coprocessor, ``set_coprocessor_fn(function)``, where ``function(request: bytes)``
   returns the reply (bytes-like); it runs on the engine's thread;
6. ``start()``, then ``submit``/``collect`` as often as needed, then ``stop()``.
"""

from ._ferroce import (
    ChannelDesc,
    Collected,
    ConnectInfo,
    Controller,
    Coprocessor,
    MemRegion,
    PeerRef,
)

__all__ = [
    "ChannelDesc",
    "Collected",
    "ConnectInfo",
    "Controller",
    "Coprocessor",
    "MemRegion",
    "PeerRef",
]
