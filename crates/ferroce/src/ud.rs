//! Unreliable datagrams: address handles and the destinations of UD sends
//! (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_send_wr.wr.ud`).
//!
//! A UD queue pair ([`crate::qp::QpType::Ud`], brought up with [`crate::Qp::ready_ud`]) sends each
//! message as one packet to the QP its work request names, at most the port's MTU
//! ([`crate::Nic::active_mtu`]). Every receive buffer begins with [`UD_GRH_LEN`] bytes that
//! say who sent it (20 zero bytes and the IPv4 header, or the IPv6 header, as rxe writes
//! them), then the payload. Nothing is acknowledged or resent: a datagram that finds no
//! receive posted is dropped and counted (`ud_no_recv`).

use std::net::{IpAddr, SocketAddr};

use ferroce_proto::qp::Completion;
pub use ferroce_proto::qp::{UdDest, UdSource, GSI_QKEY, UD_GRH_LEN};
use ferroce_proto::wire::{Qpn, ROCE_PORT};

/// The Q_Key rdma_cm gives UD queue pairs (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Where datagrams go: a peer NIC's address (`ibv_ah`). On RoCE v2 that is all an address
/// handle holds that matters; the GID is the IPv4-mapped address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddressHandle {
    peer: SocketAddr,
}

impl AddressHandle {
    /// The address handle of the NIC on `ip` (`ibv_create_ah`); datagrams go to its UDP port
    /// 4791.
    #[must_use]
    pub fn new(ip: IpAddr) -> Self {
        Self {
            peer: SocketAddr::new(ip, ROCE_PORT),
        }
    }

    /// The address handle of a soft NIC on a port other than 4791 (tests that run several
    /// NICs on one address).
    #[must_use]
    pub fn with_port(peer: SocketAddr) -> Self {
        Self { peer }
    }

    /// The address handle to answer the sender of a UD receive (`ibv_create_ah_from_wc`);
    /// `None` for a completion that is not a UD receive.
    #[must_use]
    pub fn from_completion(completion: &Completion) -> Option<Self> {
        completion.ud.map(|source| Self::new(source.ip))
    }

    /// The peer's address and port.
    #[must_use]
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The destination of a UD send to queue pair `qpn` behind this handle with `qkey`
    /// (a top bit set means the sending QP's own Q_Key).
    #[must_use]
    pub fn dest(&self, qpn: Qpn, qkey: u32) -> UdDest {
        UdDest {
            peer: self.peer,
            qpn,
            qkey,
        }
    }
}
