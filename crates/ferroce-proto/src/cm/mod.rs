//! InfiniBand connection management messages, as RoCEv2 carries them: 256-byte MADs sent as
//! UD SEND_ONLY to QP 1 (the GSI) with the Q_Key [`IB_QP1_QKEY`].
//!
//! This module owns the bytes only, not the protocol: [`MadHeader`] is the 24-byte MAD common
//! header, [`CmMessage`] the eleven CM attributes (REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ, SIDR_REP, LAP, APR; IBTA Vol. 1 ch. 12) as typed structs, and [`CmaHeader`] and
//! [`ServiceId`] the rdma_cm layer that rides in a REQ's private data and service ID. The
//! state machine, timers and retransmission that use them live elsewhere.
//!
//! The contract is the wire layer's: [`CmMessage::parse`] takes any bytes and returns a
//! message or a [`CmError`] that says what is wrong, never a panic. A parsed message emits
//! back ([`CmMessage::emit`]) to the same bytes in every field the codec defines; reserved
//! bytes and bits are written as zero. `emit` refuses what `parse` would refuse (a value wider
//! than its field, a header that is not a CM MAD), so whatever it writes parses again.

mod cma;
pub mod machine;
mod mad;
#[cfg(test)]
mod tests;

pub use cma::{CmaHeader, PortSpace, ServiceId};
pub use mad::{
    Apr, AttributeId, CmMessage, Drep, Dreq, FixedBytes, Lap, MadHeader, MessageKind, Mra, Mtu,
    PathInfo, Rej, RejectReason, Rep, Req, Rtu, SidrRep, SidrReq, SidrStatus, TransportType,
    CM_CLASS_VERSION, IB_QP1_QKEY, MAD_BASE_VERSION, MAD_LEN, METHOD_SEND, MGMT_CLASS_CM,
};

/// Why bytes could not be read as, or written as, a CM MAD or an rdma_cm header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// A CM MAD is exactly [`MAD_LEN`] (256) bytes; the GSI receive buffer holds no other size.
    #[error("a CM MAD is {MAD_LEN} bytes, this one is {0}")]
    Length(usize),
    /// The bytes end before the header they should hold (the rdma_cm header is 36 bytes).
    #[error("truncated {what}: needs {needed} bytes, has {available}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// How many bytes it needs.
        needed: usize,
        /// How many bytes there are.
        available: usize,
    },
    /// The MAD base version is not 1 (the kernel's MAD layer drops such a MAD).
    #[error("MAD base version {0}, expected {MAD_BASE_VERSION}")]
    BaseVersion(u8),
    /// The management class is not 0x07, communication management.
    #[error("management class 0x{0:02x} is not CM (0x{MGMT_CLASS_CM:02x})")]
    MgmtClass(u8),
    /// The CM class version is not 2 (the kernel's CM agent ignores other versions).
    #[error("CM class version {0}, expected {CM_CLASS_VERSION}")]
    ClassVersion(u8),
    /// The method is not 0x03 (Send), the only one CM messages use.
    #[error("MAD method 0x{0:02x} is not Send (0x{METHOD_SEND:02x})")]
    Method(u8),
    /// The attribute ID names no CM message.
    #[error("unknown CM attribute ID 0x{0:04x}")]
    UnknownAttribute(u16),
    /// A field holds a value its specification reserves (an MTU code of 0 or above 5, a
    /// "message REJected/MRAed" code of 3, an rdma_cm IP version other than 4 or 6).
    #[error("{field} = {value} is a reserved value")]
    Reserved {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A value given to `emit` is wider than its field on the wire.
    #[error("{field} = {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The width on the wire.
        bits: u32,
    },
    /// The header given to [`CmMessage::emit`] names another attribute than the message's.
    #[error("header attribute ID 0x{header:04x} does not match the {message} message")]
    AttributeMismatch {
        /// The header's attribute ID.
        header: u16,
        /// The message's name.
        message: &'static str,
    },
    /// The rdma_cm header's version is not 0, the only one defined.
    #[error("rdma_cm header version {0}, expected 0")]
    CmaVersion(u8),
    /// An rdma_cm header to emit has addresses of two families.
    #[error("rdma_cm header addresses {src} and {dst} are of different IP families")]
    MixedFamilies {
        /// The source address.
        src: std::net::IpAddr,
        /// The destination address.
        dst: std::net::IpAddr,
    },
}
