//! Out-of-band endpoint exchange: how two peers tell each other their queue pair number, first
//! PSN and address before RDMA can flow.
//!
//! [`PingpongDest`] is the 52-byte `LID:QPN:PSN:GID` message of rdma-core's `ibv_rc_pingpong`
//! (protocol.md §5), so `ferroce pingpong` talks to that very tool over TCP port 18515.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ferroce_proto::wire::{Qpn, ROCE_PORT};
use ferroce_proto::Psn;

use crate::QpEndpoint;

/// The length of `ibv_rc_pingpong`'s message: 51 characters and a NUL.
pub const PINGPONG_MSG_LEN: usize = 52;

/// One side's endpoint as `ibv_rc_pingpong` sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingpongDest {
    /// The local identifier; 0 on RoCE.
    pub lid: u16,
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first PSN.
    pub psn: Psn,
    /// The GID: an IPv6 address, or IPv4-mapped (`::ffff:a.b.c.d`) for an IPv4 peer.
    pub gid: Ipv6Addr,
}

/// Why a peer's message could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The connection failed or closed early.
    #[error("out-of-band exchange failed: {0}")]
    Io(#[from] io::Error),
    /// The message is not `LID:QPN:PSN:GID` in hex.
    #[error("malformed endpoint message {0:?} (expected LLLL:QQQQQQ:PPPPPP:<32 hex digits>)")]
    Malformed(String),
}

impl PingpongDest {
    /// The message for a queue pair endpoint (LID 0).
    #[must_use]
    pub fn from_endpoint(endpoint: &QpEndpoint) -> Self {
        let gid = match endpoint.addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Self {
            lid: 0,
            qpn: endpoint.qpn,
            psn: endpoint.psn,
            gid,
        }
    }

    /// The endpoint this message names, on the RoCEv2 port.
    #[must_use]
    pub fn endpoint(&self) -> QpEndpoint {
        let ip = self
            .gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(self.gid), IpAddr::V4);
        QpEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            addr: SocketAddr::new(ip, ROCE_PORT),
        }
    }

    /// The 52 bytes on the wire.
    #[must_use]
    pub fn to_wire(&self) -> [u8; PINGPONG_MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid
                .octets()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let mut out = [0u8; PINGPONG_MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses the 52 bytes a peer sent.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Malformed`] with the text received.
    pub fn parse(bytes: &[u8]) -> Result<Self, ExchangeError> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let bad = || ExchangeError::Malformed(text.clone());
        let mut parts = text.split(':');
        let mut field = |digits: usize| {
            let part = parts.next().filter(|p| p.len() == digits).ok_or_else(bad)?;
            u128::from_str_radix(part, 16).map_err(|_| bad())
        };
        let lid = field(4)? as u16;
        let qpn = Qpn::from_low_bits(field(6)? as u32);
        let psn = Psn::from_low_bits(field(6)? as u32);
        let gid = Ipv6Addr::from(field(32)?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self { lid, qpn, psn, gid })
    }

    /// Sends this message on `stream`.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Io`].
    pub fn send(&self, stream: &mut impl Write) -> Result<(), ExchangeError> {
        stream.write_all(&self.to_wire())?;
        Ok(())
    }

    /// Reads a peer's message from `stream`.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Io`] or [`ExchangeError::Malformed`].
    pub fn receive(stream: &mut impl Read) -> Result<Self, ExchangeError> {
        let mut buf = [0u8; PINGPONG_MSG_LEN];
        stream.read_exact(&mut buf)?;
        Self::parse(&buf)
    }
}

impl fmt::Display for PingpongDest {
    /// `LID 0x0000, QPN 0x000011, PSN 0x3a2f1c, GID ::ffff:127.0.0.1`, as `ibv_rc_pingpong`
    /// prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_of_protocol_md() {
        let wire = b"0000:000011:5f2841:00000000000000000000ffff0a000001";
        let dest = PingpongDest::parse(wire).unwrap();
        assert_eq!(dest.qpn, Qpn::new(0x11).unwrap());
        assert_eq!(dest.psn, Psn::new(0x5f2841).unwrap());
        assert_eq!(dest.endpoint().addr, "10.0.0.1:4791".parse().unwrap());
        let round = dest.to_wire();
        assert_eq!(&round[..51], &wire[..]);
        assert_eq!(round[51], 0);
        assert_eq!(
            dest.to_string(),
            "LID 0x0000, QPN 0x000011, PSN 0x5f2841, GID ::ffff:10.0.0.1"
        );
        assert!(PingpongDest::parse(b"0000:11:5f2841:00").is_err());
        assert!(
            PingpongDest::parse(b"zzzz:000011:5f2841:00000000000000000000ffff0a000001").is_err()
        );
    }
}
