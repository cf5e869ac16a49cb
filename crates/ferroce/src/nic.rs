//! The NIC: where regions, completion queues and queue pairs live.
//!
//! A NIC has one of two backends, chosen when it is opened and invisible afterwards:
//! - the soft NIC ([`Nic::open`]) binds a UDP socket (port 4791 unless configured) on a local
//!   IPv4 or IPv6 address and starts the engine's progress thread; no privileges and no
//!   kernel module are needed. Dropping the last handle, or [`Nic::close`], stops it.
//! - a verbs device ([`Nic::open_device`] with any name but `ferroce0`): a kernel RDMA device
//!   (a RoCE NIC, or kernel Soft-RoCE) through rdma-core's libibverbs, loaded at run time.
//!
//! [`Nic::caps`] says what the backend offers; the faces and tools ask it, never the name.
//! This file only documents, checks arguments and delegates to the backend
//! (`crate::backend::Nic`); the opening calls are in `crate::open`, which also attaches the
//! connection manager.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::BorrowedFd;

use ferroce_proto::qp::Mtu;
use ferroce_proto::Counters;

pub use crate::attr::{active_mtu_on, NicCaps, NicConfig};
use crate::backend;
pub use crate::error::NicError;
pub use crate::udp::tap::{Faults, FaultsError};
pub use crate::udp::GsoStatus;

/// A RoCEv2 NIC: the soft backend over a UDP socket, or a verbs device. Cheap to clone;
/// every clone is the same NIC.
#[derive(Clone)]
pub struct Nic {
    pub(crate) backend: backend::Nic,
}

impl Nic {
    /// Whether `other` is a handle of this same NIC.
    pub(crate) fn same(&self, other: &Self) -> bool {
        self.backend.same(&other.backend)
    }

    /// The device's name: `ferroce0` for the soft NIC.
    #[must_use]
    pub fn device_name(&self) -> &str {
        self.backend.device_name()
    }

    /// The GID index in use: 0 on the soft NIC, which has one address.
    #[must_use]
    pub fn gid_index(&self) -> u32 {
        self.backend.gid_index()
    }

    /// What the backend offers.
    #[must_use]
    pub fn caps(&self) -> NicCaps {
        self.backend.caps()
    }

    /// The local address and port: the soft NIC's socket, or a verbs device's GID address
    /// on port 4791.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.backend.addr()
    }

    /// The path MTU this NIC's link carries (`ibv_query_port`'s `active_mtu`), derived as
    /// rxe derives it from its network device: [`Mtu::for_link`] of the MTU of the interface
    /// that holds the NIC's address (1500 → 1024; 9000 and loopback → 4096). 1024 when
    /// that interface cannot be found or read. The socket sets don't-fragment, as rxe does,
    /// so a larger path MTU than this would not get its packets out.
    /// On a verbs device, the port's `active_mtu` as `ibv_query_port` gives it.
    #[must_use]
    pub fn active_mtu(&self) -> Mtu {
        self.backend.active_mtu()
    }

    /// A snapshot of the soft engine's counters (rxe's names where rxe has them). A verbs
    /// device counts in hardware, not per packet here (`caps().per_packet_counters` is
    /// false): all zeros; [`Nic::statistics_line`] reads the device's own.
    #[must_use]
    pub fn counters(&self) -> Counters {
        self.backend.counters()
    }

    /// The next asynchronous event of the soft NIC (`ibv_get_async_event`): an SRQ below its
    /// armed limit, or a QP on an SRQ that has taken its last receive. `None` when none is
    /// waiting, and on a verbs device, whose events ferroce handles itself ([`Nic::failure`],
    /// [`crate::Qp::failure`], [`crate::Cq::failure`]).
    #[must_use]
    pub fn poll_event(&self) -> Option<ferroce_proto::qp::AsyncEvent> {
        self.backend.poll_event()
    }

    /// The async-event descriptor (`ibv_context.async_fd`, non-blocking), for `poll(2)`, epoll
    /// or tokio's `AsyncFd`: readable while an event waits for [`Nic::poll_event`], which
    /// clears it with the last one. On a verbs device it turns readable when ferroce's event
    /// thread has handled an event (a QP, CQ, port or device failure, a GID change): look at
    /// the `failure`s and [`Nic::address_gone`], then call [`Nic::poll_event`] to clear it.
    #[must_use]
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.backend.async_fd()
    }

    /// The region of this NIC registered with local key `lkey`, for raw scatter entries that
    /// carry only an address, a length and a key (`struct ibv_sge`): its address range,
    /// rights and keys. `None` when no live region of this NIC has that key. Checking the
    /// entry's range against it is the caller's; posting it unchecked is safe too, since the
    /// NIC checks every entry and fails a wrong one with a local protection error.
    #[must_use]
    pub fn region_of_lkey(&self, lkey: u32) -> Option<ferroce_proto::memory::RegionInfo> {
        self.backend.region_of_lkey(lkey)
    }

    /// What the soft NIC's engine holds now: queue pairs (QP 1 included), CQs, SRQs,
    /// regions, armed timers and unpolled completions, for checking that what was set up was
    /// torn down. `None` on a verbs device.
    #[must_use]
    pub fn census(&self) -> Option<ferroce_proto::Census> {
        self.backend.census()
    }

    /// The counters as `rdma statistic show` prints them: `link <dev>/<port> name value …`;
    /// on a verbs device, its `hw_counters` from sysfs (rxe's or mlx5's own).
    #[must_use]
    pub fn statistics_line(&self, device: &str) -> String {
        self.backend.statistics_line(device)
    }

    /// Whether the NIC sends by UDP GSO, and if not, why not ([`NicConfig::gso`]); a verbs
    /// device segments in its own hardware or driver: [`GsoStatus::Hardware`] naming it.
    #[must_use]
    pub fn gso_status(&self) -> GsoStatus {
        self.backend.gso_status()
    }

    /// Why the NIC failed for good, if it did: the soft NIC's socket failed; or a verbs
    /// device's async events said the device failed or its port went down. Open it again to
    /// go on. (An address that went away, and may come back, is [`Nic::address_gone`].)
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.backend.failure()
    }

    /// Asks for socket buffers of `bytes` (a frame receiver wants room for whole frames while
    /// its thread is not scheduled). Granted in full to root (`SO_RCVBUFFORCE`), capped by
    /// `net.core.rmem_max` otherwise. Returns the receive buffer the kernel granted.
    ///
    /// # Errors
    ///
    /// What the kernel said when it refused both options.
    pub fn grow_buffers(&self, bytes: usize) -> io::Result<usize> {
        self.backend.grow_buffers(bytes)
    }

    /// Whether the NIC's address has gone from the host (an interface taken down, an address
    /// deleted): the socket stays open but nothing reaches it any more. Checked by binding a
    /// throw-away socket to the address, which costs a few microseconds. On a verbs device,
    /// also while its RoCE v2 GID is out of the device's table (rxe takes it out with the
    /// address and puts it back some time after the address returns).
    #[must_use]
    pub fn address_gone(&self) -> bool {
        // A verbs device: also while our GID is out of its table (rxe takes an address's GID
        // out when the address goes, and back some time after it returns).
        if self.backend.gid_gone() {
            return true;
        }
        let probe = SocketAddr::new(self.addr().ip(), 0);
        matches!(
            UdpSocket::bind(probe),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable
        )
    }

    /// Wakes a thread that waits on the NIC's socket itself (a frame receiver's monitor).
    pub(crate) fn wake(&self) {
        self.backend.wake();
    }

    /// Soft NIC: stops the progress thread and releases the socket once every handle is
    /// dropped; outstanding work requests never complete afterwards. Verbs device: stops the
    /// event thread; the device closes when its last object is dropped. Idempotent.
    pub fn close(&self) {
        self.backend.close();
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("device", &self.device_name())
            .field("addr", &self.addr())
            .finish_non_exhaustive()
    }
}
