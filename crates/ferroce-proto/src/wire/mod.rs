//! The RoCEv2 wire format: views over untrusted bytes and validated representations.
//!
//! Layout of a RoCEv2 packet on the wire (IBTA Vol. 1 §9 and annex A17):
//!
//! ```text
//! Ethernet | IPv4 (20) or IPv6 (40) | UDP (8, dst 4791) | BTH (12) | extension headers |
//! payload | pad (0–3) | ICRC (4, little-endian)
//! ```
//!
//! The pieces follow smoltcp's split:
//!
//! - [`Packet`] is a zero-copy view over the UDP payload (BTH through ICRC). Build it from
//!   untrusted bytes with [`Packet::new_checked`]; once that succeeds no accessor panics.
//! - [`PacketRepr`], [`Bth`] and the extension header types ([`Reth`], [`Aeth`], [`AtomicEth`],
//!   [`AtomicAckEth`], [`Deth`], [`Feth`]; immediate data and the IETH are plain `u32`s) are
//!   validated values. [`PacketRepr::emit`] writes them into a caller's buffer of
//!   [`PacketRepr::buffer_len`] bytes.
//! - [`Datagram`] frames a whole IPv4 or IPv6 + UDP packet (captures and raw sockets), and
//!   [`IpHeader`] carries the IP fields as values, which is all a UDP socket ever sees.
//! - [`icrc`] computes, seals and verifies the invariant CRC from those values.
//!
//! Nothing here panics on any input: every failure is an [`Error`].

mod aeth;
mod atomic;
mod bth;
mod datagram;
pub mod icrc;
mod opcode;
mod packet;
mod reth;

pub use aeth::{Aeth, NakCode, RnrTimer, Syndrome};
pub use atomic::{AtomicAckEth, AtomicEth};
pub use bth::{Bth, Qpn};
pub use datagram::{Datagram, IpHeader, Ipv4Header, Ipv6Header, UdpHeader};
pub use opcode::{HeaderSet, Opcode, Operation, Transport};
pub use packet::{Packet, PacketRepr};
pub use reth::{Deth, Feth, Reth};

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCE_PORT: u16 = 4791;

/// Why bytes could not be read as, or written as, a RoCEv2 packet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The bytes end before a header or field does.
    #[error("truncated {what}: needs {needed} bytes, has {available}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// How many bytes it needs.
        needed: usize,
        /// How many bytes there are.
        available: usize,
    },
    /// The BTH opcode is reserved or belongs to a transport ferroce does not speak (RD, XRC).
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0.
    #[error("unsupported BTH transport version {0}")]
    TransportVersion(u8),
    /// The BTH pad count is larger than the bytes between the headers and the ICRC.
    #[error("pad count {pad} exceeds the {available} bytes after the headers")]
    Pad {
        /// The pad count from the BTH.
        pad: u8,
        /// Bytes available for payload and pad.
        available: usize,
    },
    /// Payload and pad together are not a multiple of 4 bytes, as the pad count requires.
    #[error("payload {payload} + pad {pad} bytes is not a multiple of 4")]
    Unaligned {
        /// Payload bytes (after removing the pad).
        payload: usize,
        /// The pad count from the BTH.
        pad: u8,
    },
    /// A packet whose opcode carries no payload (READ request, ACK, atomics, CNP) has one.
    #[error("{opcode} carries no payload but has {len} bytes")]
    UnexpectedPayload {
        /// The packet's opcode.
        opcode: Opcode,
        /// The payload bytes found.
        len: usize,
    },
    /// A representation's extension headers are not the ones its opcode requires.
    #[error("{opcode} needs headers {expected:?}, the representation has {found:?}")]
    HeaderMismatch {
        /// The opcode.
        opcode: Opcode,
        /// The headers the opcode requires.
        expected: HeaderSet,
        /// The headers present in the representation.
        found: HeaderSet,
    },
    /// A field holds a value wider than the wire allows.
    #[error("{field} = {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The width on the wire.
        bits: u32,
    },
    /// The output buffer is shorter than the packet.
    #[error("output buffer holds {available} bytes, the packet needs {needed}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The IP version nibble is neither 4 nor 6.
    #[error("not an IP packet (version {0})")]
    IpVersion(u8),
    /// IPv4 options are present; RoCEv2 packets carry none and the ICRC recipe assumes none.
    #[error("IPv4 header has options (IHL {0}); RoCEv2 sends none")]
    Ipv4Options(u8),
    /// The IPv4 packet is a fragment.
    #[error("IPv4 fragment (flags/offset 0x{0:04x}); RoCEv2 packets are never fragmented")]
    Fragment(u16),
    /// The IP protocol / next header is not UDP (IPv6 extension headers included).
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// The IP and UDP lengths disagree with each other or with the bytes present.
    #[error("length mismatch: {what} says {claimed}, {actual} bytes present")]
    Length {
        /// Which length field.
        what: &'static str,
        /// What the header claims.
        claimed: usize,
        /// What the bytes allow.
        actual: usize,
    },
}

/// Reads a big-endian integer of `N` bytes at `at`. Callers have checked the length.
#[inline]
fn be<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

#[inline]
fn be_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(be(bytes, at))
}

#[inline]
fn be_u24(bytes: &[u8], at: usize) -> u32 {
    let [a, b, c] = be(bytes, at);
    u32::from_be_bytes([0, a, b, c])
}

#[inline]
fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(be(bytes, at))
}

#[inline]
fn be_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(be(bytes, at))
}

#[inline]
fn put_u24(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 3].copy_from_slice(&value.to_be_bytes()[1..]);
}

#[inline]
fn check_len(what: &'static str, bytes: &[u8], needed: usize) -> Result<(), Error> {
    if bytes.len() < needed {
        Err(Error::Truncated {
            what,
            needed,
            available: bytes.len(),
        })
    } else {
        Ok(())
    }
}

fn check_u24(field: &'static str, value: u32) -> Result<(), Error> {
    if value > 0x00ff_ffff {
        Err(Error::FieldRange {
            field,
            value: value.into(),
            bits: 24,
        })
    } else {
        Ok(())
    }
}
