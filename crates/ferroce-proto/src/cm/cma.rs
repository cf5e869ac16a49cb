//! The rdma_cm layer over IB CM: service IDs built from (port space, port), and the 36-byte
//! `cma_hdr` at the start of a REQ's or SIDR_REQ's private data.
//!
//! ```text
//! byte 0      cma_version, 0
//! byte 1      IP version in bits 7-4 (4 or 6); bits 3-0 zero
//! bytes 2-3   source rdma_cm port, big-endian
//! bytes 4-19  source IP      (IPv4: 12 zero bytes, then the 4 address bytes)
//! bytes 20-35 destination IP (the same)
//! ```
//!
//! [`CmaHeader::parse`] ignores the low nibble of byte 1 and the 12 padding bytes before an
//! IPv4 address, as the kernel does; [`CmaHeader::emit`] writes them as zero.

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::CmError;

/// An rdma_cm port space (`enum rdma_ucm_port_space`): the upper half of a service ID's low
/// 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`, 0x0002.
    IpoIb,
    /// `RDMA_PS_TCP`, 0x0106: RC and UC connections (rping, ucmatose, perftest -R, NVMe-oF).
    Tcp,
    /// `RDMA_PS_UDP`, 0x0111: UD QPs resolved by SIDR (udaddy).
    Udp,
    /// `RDMA_PS_IB`, 0x013F: any QP type.
    Ib,
}

impl PortSpace {
    /// The port space from its 16-bit number, or `None` for a number rdma_cm does not define.
    #[must_use]
    pub const fn from_value(value: u16) -> Option<Self> {
        match value {
            0x0002 => Some(Self::IpoIb),
            0x0106 => Some(Self::Tcp),
            0x0111 => Some(Self::Udp),
            0x013f => Some(Self::Ib),
            _ => None,
        }
    }

    /// The port space's 16-bit number.
    #[must_use]
    pub const fn value(self) -> u16 {
        match self {
            Self::IpoIb => 0x0002,
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
            Self::Ib => 0x013f,
        }
    }
}

/// A CM service ID: the 64-bit value a REQ or SIDR_REQ names its listener by.
///
/// rdma_cm builds it as `(port_space << 16) | port` (`rdma_get_service_id`), so on the wire
/// it reads `00 00 00 00 01 PP DD DD`; the passive kernel finds the listener by
/// `(sid >> 16) & 0xffff` and `sid & 0xffff`. Any other 64-bit value is still a service ID,
/// just not one of rdma_cm's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// The service ID rdma_cm uses for `port` in `space`.
    #[must_use]
    pub const fn rdma_cm(space: PortSpace, port: u16) -> Self {
        Self(((space.value() as u64) << 16) | port as u64)
    }

    /// The port space, when the ID has rdma_cm's shape (upper 32 bits zero, a known port
    /// space in bits 31-16).
    #[must_use]
    pub const fn port_space(self) -> Option<PortSpace> {
        if self.0 >> 32 != 0 {
            return None;
        }
        PortSpace::from_value((self.0 >> 16) as u16)
    }

    /// The port (the low 16 bits), when the ID has rdma_cm's shape.
    #[must_use]
    pub const fn port(self) -> Option<u16> {
        match self.port_space() {
            Some(_) => Some(self.0 as u16),
            None => None,
        }
    }

    /// The 64-bit value.
    #[must_use]
    pub const fn value(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({:#018x})", self.0)
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#018x}", self.0)
    }
}

impl From<u64> for ServiceId {
    fn from(value: u64) -> Self {
        Self(value)
    }
}

impl From<ServiceId> for u64 {
    fn from(id: ServiceId) -> Self {
        id.0
    }
}

/// The rdma_cm header (`struct cma_hdr`, version 0) that starts a REQ's or SIDR_REQ's
/// private data: who is connecting, from which rdma_cm port, to which address.
///
/// Both addresses are of one family, the one byte 1 names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmaHeader {
    /// The active side's rdma_cm port (its ephemeral port, not the listener's).
    pub src_port: u16,
    /// The active side's IP address.
    pub src: IpAddr,
    /// The address the active side connects to.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// The header's length in bytes; user private data follows it.
    pub const LEN: usize = 36;

    /// Parses the first 36 bytes of `bytes` (a REQ's or SIDR_REQ's private data).
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] for fewer than 36 bytes, [`CmError::CmaVersion`] when byte 0 is
    /// not 0, [`CmError::Reserved`] when the IP version is neither 4 nor 6.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmError> {
        let Some(h) = bytes.get(..Self::LEN) else {
            return Err(CmError::Truncated {
                what: "rdma_cm header",
                needed: Self::LEN,
                available: bytes.len(),
            });
        };
        if h[0] != 0 {
            return Err(CmError::CmaVersion(h[0]));
        }
        let address = |at: usize| -> IpAddr {
            let mut octets = [0; 16];
            octets.copy_from_slice(&h[at..at + 16]);
            if h[1] >> 4 == 4 {
                let [.., a, b, c, d] = octets;
                Ipv4Addr::new(a, b, c, d).into()
            } else {
                Ipv6Addr::from(octets).into()
            }
        };
        match h[1] >> 4 {
            4 | 6 => Ok(Self {
                src_port: u16::from_be_bytes([h[2], h[3]]),
                src: address(4),
                dst: address(20),
            }),
            other => Err(CmError::Reserved {
                field: "rdma_cm header IP version",
                value: other.into(),
            }),
        }
    }

    /// Writes the header into the first 36 bytes of `out`.
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] when `out` is shorter than 36 bytes, [`CmError::MixedFamilies`]
    /// when `src` and `dst` are of different families. Nothing is written on error.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), CmError> {
        let available = out.len();
        let Some(o) = out.get_mut(..Self::LEN) else {
            return Err(CmError::Truncated {
                what: "rdma_cm header buffer",
                needed: Self::LEN,
                available,
            });
        };
        let version = match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            (src, dst) => return Err(CmError::MixedFamilies { src, dst }),
        };
        o.fill(0);
        o[1] = version << 4;
        o[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        for (at, ip) in [(4, self.src), (20, self.dst)] {
            match ip {
                IpAddr::V4(a) => o[at + 12..at + 16].copy_from_slice(&a.octets()),
                IpAddr::V6(a) => o[at..at + 16].copy_from_slice(&a.octets()),
            }
        }
        Ok(())
    }
}
