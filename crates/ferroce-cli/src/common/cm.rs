//! What the connection-manager tools (`rping`, `ucmatose`, `udaddy`) share, as librdmacm's
//! `examples/common.{c,h}` holds it for its examples: choosing the local address that routes
//! to the server, and naming a failed connect the way rdma_cm's events do.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use ferroce::cm::CmError;

/// The source address the kernel would pick to reach `to` (no packet is sent).
pub(crate) fn route_source(to: IpAddr) -> Option<IpAddr> {
    let any: IpAddr = if to.is_ipv4() {
        Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let socket = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    socket.connect(SocketAddr::new(to, 4791)).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

/// rdma_cm's event name and status for a failed connect, as cmatose prints them.
pub(crate) fn event_of(e: &CmError) -> (&'static str, i32) {
    match e {
        CmError::Rejected { reason, .. } => ("RDMA_CM_EVENT_REJECTED", i32::from(reason.code())),
        CmError::Sidr(status) => ("RDMA_CM_EVENT_UNREACHABLE", i32::from(status.code())),
        CmError::Unreachable | CmError::Timeout { .. } => ("RDMA_CM_EVENT_UNREACHABLE", -110),
        _ => ("RDMA_CM_EVENT_CONNECT_ERROR", -22),
    }
}
