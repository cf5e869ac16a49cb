//! The 256-byte CM MAD: the 24-byte MAD common header and the eleven CM messages.
//!
//! ```text
//! MAD bytes 0-23    common header (MadHeader): base version 1, class 0x07, class version 2,
//!                   method 0x03, status, class-specific, transaction ID, attribute ID,
//!                   2 reserved bytes, attribute modifier
//! MAD bytes 24-255  the message (232 bytes), laid out by its attribute ID
//! ```
//!
//! Offsets in the field docs below are from the start of the message (MAD byte 24), and bits
//! are numbered as IBA does: bit 7 is a byte's most significant. Multi-byte fields are
//! big-endian. The layouts are IBTA Vol. 1 chapter 12's, as Linux spells them in
//! `include/rdma/ibta_vol1_c12.h` (`CM_REQ_*`, `CM_REP_*`, …).
//!
//! Fields narrower than their Rust type (5-bit timeouts, 24-bit QPNs, …) keep their width in
//! their docs: `parse` never yields a wider value, and `emit` refuses one with
//! [`CmError::FieldRange`]. Reserved bytes and bits are dropped by `parse` and written as zero
//! by `emit`. LAP and APR, which the kernel ignores on RoCE, keep their body after the two
//! communication IDs as opaque bytes, so they too round-trip exactly.

use core::fmt;
use std::net::Ipv6Addr;

use super::{CmError, ServiceId};
pub use crate::qp::Mtu;
use crate::wire::Qpn;
use crate::Psn;

/// The length of every MAD, and so of every CM message on the wire.
pub const MAD_LEN: usize = 256;
/// The MAD base version (`IB_MGMT_BASE_VERSION`).
pub const MAD_BASE_VERSION: u8 = 1;
/// The management class of communication management (`IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The CM class version (`IB_CM_CLASS_VERSION`); the kernel's agent ignores other versions.
pub const CM_CLASS_VERSION: u8 = 2;
/// The MAD method every CM message uses: Send.
pub const METHOD_SEND: u8 = 0x03;
/// The Q_Key of QP 1 (`IB_QP1_QKEY`): the DETH Q_Key of every CM MAD, which rxe checks
/// exactly.
pub const IB_QP1_QKEY: u32 = 0x8001_0000;

/// Where the message starts in the MAD.
const DATA_AT: usize = MadHeader::LEN;
/// The message's length: everything after the MAD header.
const DATA_LEN: usize = MAD_LEN - MadHeader::LEN;

/// The attribute ID of a CM MAD: which message it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttributeId {
    /// 0x0010: connect request.
    Req,
    /// 0x0011: message receipt acknowledgement ("I need more time").
    Mra,
    /// 0x0012: reject.
    Rej,
    /// 0x0013: connect reply.
    Rep,
    /// 0x0014: ready to use.
    Rtu,
    /// 0x0015: disconnect request.
    Dreq,
    /// 0x0016: disconnect reply.
    Drep,
    /// 0x0017: service ID resolution request (UD).
    SidrReq,
    /// 0x0018: service ID resolution reply.
    SidrRep,
    /// 0x0019: load alternate path.
    Lap,
    /// 0x001A: alternate path response.
    Apr,
}

impl AttributeId {
    /// The attribute from its 16-bit ID, or `None` for an ID that names no CM message.
    #[must_use]
    pub const fn from_value(value: u16) -> Option<Self> {
        Some(match value {
            0x0010 => Self::Req,
            0x0011 => Self::Mra,
            0x0012 => Self::Rej,
            0x0013 => Self::Rep,
            0x0014 => Self::Rtu,
            0x0015 => Self::Dreq,
            0x0016 => Self::Drep,
            0x0017 => Self::SidrReq,
            0x0018 => Self::SidrRep,
            0x0019 => Self::Lap,
            0x001a => Self::Apr,
            _ => return None,
        })
    }

    /// The 16-bit attribute ID.
    #[must_use]
    pub const fn value(self) -> u16 {
        match self {
            Self::Req => 0x0010,
            Self::Mra => 0x0011,
            Self::Rej => 0x0012,
            Self::Rep => 0x0013,
            Self::Rtu => 0x0014,
            Self::Dreq => 0x0015,
            Self::Drep => 0x0016,
            Self::SidrReq => 0x0017,
            Self::SidrRep => 0x0018,
            Self::Lap => 0x0019,
            Self::Apr => 0x001a,
        }
    }

    /// The message's name as IBTA spells it: `"REQ"`, `"SIDR_REP"`, …
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Req => "REQ",
            Self::Mra => "MRA",
            Self::Rej => "REJ",
            Self::Rep => "REP",
            Self::Rtu => "RTU",
            Self::Dreq => "DREQ",
            Self::Drep => "DREP",
            Self::SidrReq => "SIDR_REQ",
            Self::SidrRep => "SIDR_REP",
            Self::Lap => "LAP",
            Self::Apr => "APR",
        }
    }
}

/// The MAD common header (`struct ib_mad_hdr`), 24 bytes. Bytes 18-19 are reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Byte 0: the MAD base version, 1.
    pub base_version: u8,
    /// Byte 1: the management class, 0x07 for CM.
    pub mgmt_class: u8,
    /// Byte 2: the class version, 2 for CM.
    pub class_version: u8,
    /// Byte 3: the method (bit 7 marks a response); 0x03 Send for every CM message.
    pub method: u8,
    /// Bytes 4-5: status, 0 in CM messages.
    pub status: u16,
    /// Bytes 6-7: class-specific, 0 in CM messages.
    pub class_specific: u16,
    /// Bytes 8-15: the transaction ID. The kernel builds it for REQ, DREQ and SIDR_REQ and
    /// echoes it in the answers, but matches messages by communication ID, never by it.
    pub transaction_id: u64,
    /// Bytes 16-17: the attribute ID ([`AttributeId::value`]).
    pub attribute_id: u16,
    /// Bytes 20-23: the attribute modifier, 0 in CM messages.
    pub attribute_modifier: u32,
}

impl MadHeader {
    /// The header's length in bytes.
    pub const LEN: usize = 24;

    /// The header of a CM message: base version 1, class 0x07, class version 2, method Send,
    /// the attribute's ID, zero status, class-specific and modifier.
    #[must_use]
    pub const fn cm(attribute: AttributeId, transaction_id: u64) -> Self {
        Self {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attribute_id: attribute.value(),
            attribute_modifier: 0,
        }
    }

    /// Reads the first 24 bytes of any MAD, without judging its class or version.
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] for fewer than 24 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, CmError> {
        let Some(h) = bytes.first_chunk::<{ Self::LEN }>() else {
            return Err(CmError::Truncated {
                what: "MAD header",
                needed: Self::LEN,
                available: bytes.len(),
            });
        };
        let f = Fields(h);
        Ok(Self {
            base_version: f.u8(0),
            mgmt_class: f.u8(1),
            class_version: f.u8(2),
            method: f.u8(3),
            status: f.u16(4),
            class_specific: f.u16(6),
            transaction_id: f.u64(8),
            attribute_id: f.u16(16),
            attribute_modifier: f.u32(20),
        })
    }

    /// Writes the header into the first 24 bytes of `out`, reserved bytes as zero.
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] when `out` is shorter than 24 bytes.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), CmError> {
        let available = out.len();
        let Some(o) = out.first_chunk_mut::<{ Self::LEN }>() else {
            return Err(CmError::Truncated {
                what: "MAD header buffer",
                needed: Self::LEN,
                available,
            });
        };
        self.write(o);
        Ok(())
    }

    fn write(&self, o: &mut [u8; Self::LEN]) {
        o[0] = self.base_version;
        o[1] = self.mgmt_class;
        o[2] = self.class_version;
        o[3] = self.method;
        o[4..6].copy_from_slice(&self.status.to_be_bytes());
        o[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        o[8..16].copy_from_slice(&self.transaction_id.to_be_bytes());
        o[16..18].copy_from_slice(&self.attribute_id.to_be_bytes());
        o[18..20].fill(0);
        o[20..24].copy_from_slice(&self.attribute_modifier.to_be_bytes());
    }

    /// The attribute of a header the kernel's MAD layer and CM agent would accept.
    ///
    /// # Errors
    ///
    /// [`CmError::BaseVersion`], [`CmError::MgmtClass`], [`CmError::ClassVersion`],
    /// [`CmError::Method`] or [`CmError::UnknownAttribute`], checked in that order.
    pub fn cm_attribute(&self) -> Result<AttributeId, CmError> {
        // What the kernel accepts (rdmacm.md §1.1): its MAD layer (`mad.c validate_mad`)
        // drops a base version other than 1 and a CM MAD whose method is not Send, and the
        // CM agent registers for class 0x07, version 2, only.
        if self.base_version != MAD_BASE_VERSION {
            return Err(CmError::BaseVersion(self.base_version));
        }
        if self.mgmt_class != MGMT_CLASS_CM {
            return Err(CmError::MgmtClass(self.mgmt_class));
        }
        if self.class_version != CM_CLASS_VERSION {
            return Err(CmError::ClassVersion(self.class_version));
        }
        if self.method != METHOD_SEND {
            return Err(CmError::Method(self.method));
        }
        AttributeId::from_value(self.attribute_id)
            .ok_or(CmError::UnknownAttribute(self.attribute_id))
    }
}

/// A fixed-size byte field carried verbatim: private data, REJ's additional reject
/// information, SIDR_REP's additional information, the LAP and APR bodies.
///
/// The wire always carries all `N` bytes; how many of them mean something is up to the
/// application (rdma_cm reports the whole field, zero padded).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedBytes<const N: usize>(pub [u8; N]);

impl<const N: usize> FixedBytes<N> {
    /// The field's length in bytes.
    pub const LEN: usize = N;

    /// All zeros.
    pub const ZERO: Self = Self([0; N]);

    /// `bytes` followed by zeros, or `None` when `bytes` is longer than the field.
    #[must_use]
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let mut out = [0; N];
        out.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(Self(out))
    }

    /// The bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }

    /// The bytes up to and including the last non-zero one: the part that is not padding,
    /// when the content itself does not end in zeros.
    #[must_use]
    pub fn trimmed(&self) -> &[u8] {
        let end = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        &self.0[..end]
    }
}

impl<const N: usize> Default for FixedBytes<N> {
    fn default() -> Self {
        Self::ZERO
    }
}

impl<const N: usize> AsRef<[u8]> for FixedBytes<N> {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl<const N: usize> fmt::Debug for FixedBytes<N> {
    /// The bytes in hex up to the last non-zero one, then how many zeros follow.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = self.trimmed();
        write!(f, "FixedBytes<{N}>(")?;
        for b in data {
            write!(f, "{b:02x}")?;
        }
        write!(f, " +{} zero)", N - data.len())
    }
}

/// The transport a REQ asks for (Transport Service Type, 2 bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransportType {
    /// 0: reliable connected.
    Rc,
    /// 1: unreliable connected.
    Uc,
    /// 2: reliable datagram.
    Rd,
    /// 3: the Extended Transport Type field says which (1 = XRC).
    Extended,
}

impl TransportType {
    const fn from_code(code: u8) -> Self {
        match code & 3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => Self::Extended,
        }
    }

    /// The 2-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Rc => 0,
            Self::Uc => 1,
            Self::Rd => 2,
            Self::Extended => 3,
        }
    }
}

/// Which message a REJ rejects or an MRA acknowledges (2 bits; 3 is reserved).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// 0: a REQ.
    Req,
    /// 1: a REP.
    Rep,
    /// 2: another message (a LAP, for MRA).
    Other,
}

impl MessageKind {
    fn from_code(field: &'static str, code: u8) -> Result<Self, CmError> {
        match code {
            0 => Ok(Self::Req),
            1 => Ok(Self::Rep),
            2 => Ok(Self::Other),
            _ => Err(CmError::Reserved {
                field,
                value: code.into(),
            }),
        }
    }

    /// The 2-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
        }
    }
}

/// The reason of a REJ (`enum ib_cm_rej_reason`). The reasons rdma_cm peers meet are named;
/// every other number is kept as [`RejectReason::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// 1: no QP available.
    NoQp,
    /// 3: no resources.
    NoResources,
    /// 4: timeout (the ARI holds the sender's CA GUID).
    Timeout,
    /// 5: unsupported request.
    Unsupported,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID: no listener on that port.
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection (a QPN or communication ID still in timewait).
    StaleConnection,
    /// 12: invalid GID (the ARI holds the local GID).
    InvalidGid,
    /// 26: invalid MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientRespResources,
    /// 28: consumer defined: `rdma_reject`, or rdma_cm refusing the rdma_cm header.
    ConsumerDefined,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// Any other reason, kept verbatim.
    Other(u16),
}

impl RejectReason {
    /// The reason from its 16-bit code.
    #[must_use]
    pub const fn from_code(code: u16) -> Self {
        match code {
            1 => Self::NoQp,
            3 => Self::NoResources,
            4 => Self::Timeout,
            5 => Self::Unsupported,
            6 => Self::InvalidCommId,
            7 => Self::InvalidCommInstance,
            8 => Self::InvalidServiceId,
            9 => Self::InvalidTransportType,
            10 => Self::StaleConnection,
            12 => Self::InvalidGid,
            26 => Self::InvalidMtu,
            27 => Self::InsufficientRespResources,
            28 => Self::ConsumerDefined,
            29 => Self::InvalidRnrRetry,
            30 => Self::DuplicateLocalCommId,
            31 => Self::InvalidClassVersion,
            other => Self::Other(other),
        }
    }

    /// The 16-bit code.
    #[must_use]
    pub const fn code(self) -> u16 {
        match self {
            Self::NoQp => 1,
            Self::NoResources => 3,
            Self::Timeout => 4,
            Self::Unsupported => 5,
            Self::InvalidCommId => 6,
            Self::InvalidCommInstance => 7,
            Self::InvalidServiceId => 8,
            Self::InvalidTransportType => 9,
            Self::StaleConnection => 10,
            Self::InvalidGid => 12,
            Self::InvalidMtu => 26,
            Self::InsufficientRespResources => 27,
            Self::ConsumerDefined => 28,
            Self::InvalidRnrRetry => 29,
            Self::DuplicateLocalCommId => 30,
            Self::InvalidClassVersion => 31,
            Self::Other(code) => code,
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::NoQp => "no QP",
            Self::NoResources => "no resources",
            Self::Timeout => "timeout",
            Self::Unsupported => "unsupported",
            Self::InvalidCommId => "invalid communication ID",
            Self::InvalidCommInstance => "invalid communication instance",
            Self::InvalidServiceId => "invalid service ID",
            Self::InvalidTransportType => "invalid transport type",
            Self::StaleConnection => "stale connection",
            Self::InvalidGid => "invalid GID",
            Self::InvalidMtu => "invalid MTU",
            Self::InsufficientRespResources => "insufficient responder resources",
            Self::ConsumerDefined => "consumer defined",
            Self::InvalidRnrRetry => "invalid RNR retry count",
            Self::DuplicateLocalCommId => "duplicate local communication ID",
            Self::InvalidClassVersion => "invalid class version",
            Self::Other(code) => return write!(f, "reason {code}"),
        };
        f.write_str(text)
    }
}

/// The status of a SIDR_REP (`enum ib_cm_sidr_status`), 8 bits; unnamed values are kept as
/// [`SidrStatus::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported: no listener.
    Unsupported,
    /// 2: rejected by the consumer.
    Reject,
    /// 3: no QP.
    NoQp,
    /// 4: redirect (the additional information says where).
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Any other status, kept verbatim.
    Other(u8),
}

impl SidrStatus {
    /// The status from its code.
    #[must_use]
    pub const fn from_code(code: u8) -> Self {
        match code {
            0 => Self::Success,
            1 => Self::Unsupported,
            2 => Self::Reject,
            3 => Self::NoQp,
            4 => Self::Redirect,
            5 => Self::UnsupportedVersion,
            other => Self::Other(other),
        }
    }

    /// The 8-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Unsupported => 1,
            Self::Reject => 2,
            Self::NoQp => 3,
            Self::Redirect => 4,
            Self::UnsupportedVersion => 5,
            Self::Other(code) => code,
        }
    }
}

impl fmt::Display for SidrStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Self::Success => "success",
            Self::Unsupported => "unsupported service ID",
            Self::Reject => "rejected",
            Self::NoQp => "no QP",
            Self::Redirect => "redirect",
            Self::UnsupportedVersion => "unsupported version",
            Self::Other(code) => return write!(f, "status {code}"),
        };
        f.write_str(text)
    }
}

/// One path of a REQ (the primary at message byte 52, the alternate at 96), 44 bytes.
/// Offsets here are from the path's start.
///
/// On RoCE the alternate path is all zero: the kernel takes a non-zero alternate local LID
/// as "has an alternate path". [`PathInfo::NONE`] is that path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathInfo {
    /// Bytes 0-1: local port LID (0xFFFF, permissive, on RoCE).
    pub local_lid: u16,
    /// Bytes 2-3: remote port LID.
    pub remote_lid: u16,
    /// Bytes 4-19: local port GID (`::ffff:a.b.c.d` for a RoCEv2 IPv4 GID).
    pub local_gid: Ipv6Addr,
    /// Bytes 20-35: remote port GID.
    pub remote_gid: Ipv6Addr,
    /// Bits 31-12 of the big-endian word at bytes 36-39: the flow label (20 bits).
    pub flow_label: u32,
    /// Byte 39, bits 5-0: the packet rate (6 bits; 0 = the port's current rate).
    pub packet_rate: u8,
    /// Byte 40: traffic class.
    pub traffic_class: u8,
    /// Byte 41: hop limit.
    pub hop_limit: u8,
    /// Byte 42, bits 7-4: service level (4 bits).
    pub sl: u8,
    /// Byte 42, bit 3: subnet local.
    pub subnet_local: bool,
    /// Byte 43, bits 7-3: local ACK timeout (5 bits), 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
}

impl PathInfo {
    /// The path's length in bytes.
    pub const LEN: usize = 44;

    /// The all-zero path: "no alternate path".
    pub const NONE: Self = Self {
        local_lid: 0,
        remote_lid: 0,
        local_gid: Ipv6Addr::UNSPECIFIED,
        remote_gid: Ipv6Addr::UNSPECIFIED,
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0,
    };

    fn read(f: &Fields<'_, DATA_LEN>, at: usize) -> Self {
        Self {
            local_lid: f.u16(at),
            remote_lid: f.u16(at + 2),
            local_gid: f.gid(at + 4),
            remote_gid: f.gid(at + 20),
            flow_label: f.u32(at + 36) >> 12,
            packet_rate: f.bits(at + 39, 5, 0),
            traffic_class: f.u8(at + 40),
            hop_limit: f.u8(at + 41),
            sl: f.bits(at + 42, 7, 4),
            subnet_local: f.flag(at + 42, 3),
            local_ack_timeout: f.bits(at + 43, 7, 3),
        }
    }

    fn write(&self, w: &mut Writer, at: usize) -> Result<(), CmError> {
        w.u16(at, self.local_lid);
        w.u16(at + 2, self.remote_lid);
        w.bytes(at + 4, &self.local_gid.octets());
        w.bytes(at + 20, &self.remote_gid.octets());
        fits("path flow label", self.flow_label.into(), 20)?;
        w.u32(at + 36, self.flow_label << 12);
        w.bits(at + 39, 5, 0, "path packet rate", self.packet_rate)?;
        w.u8(at + 40, self.traffic_class);
        w.u8(at + 41, self.hop_limit);
        w.bits(at + 42, 7, 4, "path SL", self.sl)?;
        w.flag(at + 42, 3, self.subnet_local);
        w.bits(
            at + 43,
            7,
            3,
            "path local ACK timeout",
            self.local_ack_timeout,
        )
    }
}

impl Default for PathInfo {
    fn default() -> Self {
        Self::NONE
    }
}

/// REQ (0x0010), the connect request (`CM_REQ_*`). Reserved: bytes 4-7 and 24-27, and the
/// reserved bits of each path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Req {
    /// Byte 0: the sender's communication ID for this connection.
    pub local_comm_id: u32,
    /// Bytes 8-15: the service to connect to (rdma_cm: [`ServiceId::rdma_cm`]).
    pub service_id: ServiceId,
    /// Bytes 16-23: the sender's CA GUID (rxe: the EUI-64 of the MAC).
    pub local_ca_guid: u64,
    /// Bytes 28-31: the sender's Q_Key (0 for RC).
    pub local_qkey: u32,
    /// Bytes 32-34: the sender's QPN.
    pub local_qpn: Qpn,
    /// Byte 35: responder resources: the RDMA READs and atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Bytes 36-38: the sender's EE context (24 bits; 0 but for RD).
    pub local_eecn: u32,
    /// Byte 39: initiator depth: the RDMA READs and atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Bytes 40-42: the remote EE context (24 bits).
    pub remote_eecn: u32,
    /// Byte 43, bits 7-3: how long the sender waits for the answer (5 bits, 4.096 µs · 2^n).
    pub remote_cm_response_timeout: u8,
    /// Byte 43, bits 2-1: the transport.
    pub transport_type: TransportType,
    /// Byte 43, bit 0: end-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Bytes 44-46: the PSN the *passive* side starts sending with (the sender's expected
    /// receive PSN).
    pub starting_psn: Psn,
    /// Byte 47, bits 7-3: how long the receiver may take to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Byte 47, bits 2-0: the transport retry count the passive QP uses (3 bits).
    pub retry_count: u8,
    /// Bytes 48-49: the partition key (0xFFFF on RoCE).
    pub pkey: u16,
    /// Byte 50, bits 7-4: the path MTU, final for the connection.
    pub path_mtu: Mtu,
    /// Byte 50, bit 3: RDC exists (RD only).
    pub rdc_exists: bool,
    /// Byte 50, bits 2-0: the RNR retry count the passive QP uses (3 bits; 7 = forever).
    pub rnr_retry_count: u8,
    /// Byte 51, bits 7-4: how often the sender retries this REQ (4 bits).
    pub max_cm_retries: u8,
    /// Byte 51, bit 3: the sender's QP uses an SRQ.
    pub srq: bool,
    /// Byte 51, bits 2-0: the extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// Bytes 52-95: the primary path.
    pub primary_path: PathInfo,
    /// Bytes 96-139: the alternate path, [`PathInfo::NONE`] on RoCE.
    pub alternate_path: PathInfo,
    /// Bytes 140-231: private data (rdma_cm: a [`super::CmaHeader`], then up to 56 bytes).
    pub private_data: FixedBytes<92>,
}

impl Req {
    fn read(f: &Fields<'_, DATA_LEN>) -> Result<Self, CmError> {
        let mtu = f.bits(50, 7, 4);
        Ok(Self {
            local_comm_id: f.u32(0),
            service_id: ServiceId(f.u64(8)),
            local_ca_guid: f.u64(16),
            local_qkey: f.u32(28),
            local_qpn: Qpn::from_low_bits(f.u24(32)),
            responder_resources: f.u8(35),
            local_eecn: f.u24(36),
            initiator_depth: f.u8(39),
            remote_eecn: f.u24(40),
            remote_cm_response_timeout: f.bits(43, 7, 3),
            transport_type: TransportType::from_code(f.bits(43, 2, 1)),
            end_to_end_flow_control: f.flag(43, 0),
            starting_psn: Psn::from_low_bits(f.u24(44)),
            local_cm_response_timeout: f.bits(47, 7, 3),
            retry_count: f.bits(47, 2, 0),
            pkey: f.u16(48),
            path_mtu: Mtu::from_ibv_value(mtu as i64).ok_or(CmError::Reserved {
                field: "REQ path MTU",
                value: mtu.into(),
            })?,
            rdc_exists: f.flag(50, 3),
            rnr_retry_count: f.bits(50, 2, 0),
            max_cm_retries: f.bits(51, 7, 4),
            srq: f.flag(51, 3),
            extended_transport_type: f.bits(51, 2, 0),
            primary_path: PathInfo::read(f, 52),
            alternate_path: PathInfo::read(f, 96),
            private_data: f.fixed(140),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), CmError> {
        w.u32(0, self.local_comm_id);
        w.u64(8, self.service_id.0);
        w.u64(16, self.local_ca_guid);
        w.u32(28, self.local_qkey);
        w.u24(32, "REQ local QPN", self.local_qpn.value())?;
        w.u8(35, self.responder_resources);
        w.u24(36, "REQ local EECN", self.local_eecn)?;
        w.u8(39, self.initiator_depth);
        w.u24(40, "REQ remote EECN", self.remote_eecn)?;
        let timeout = self.remote_cm_response_timeout;
        w.bits(43, 7, 3, "REQ remote CM response timeout", timeout)?;
        w.bits(43, 2, 1, "REQ transport type", self.transport_type.code())?;
        w.flag(43, 0, self.end_to_end_flow_control);
        w.u24(44, "REQ starting PSN", self.starting_psn.value())?;
        let timeout = self.local_cm_response_timeout;
        w.bits(47, 7, 3, "REQ local CM response timeout", timeout)?;
        w.bits(47, 2, 0, "REQ retry count", self.retry_count)?;
        w.u16(48, self.pkey);
        w.bits(50, 7, 4, "REQ path MTU", self.path_mtu.ibv_value())?;
        w.flag(50, 3, self.rdc_exists);
        w.bits(50, 2, 0, "REQ RNR retry count", self.rnr_retry_count)?;
        w.bits(51, 7, 4, "REQ max CM retries", self.max_cm_retries)?;
        w.flag(51, 3, self.srq);
        let ext = self.extended_transport_type;
        w.bits(51, 2, 0, "REQ extended transport type", ext)?;
        self.primary_path.write(w, 52)?;
        self.alternate_path.write(w, 96)?;
        w.bytes(140, &self.private_data.0);
        Ok(())
    }
}

/// MRA (0x0011), "message received, I need more time". Reserved: byte 8 bits 5-0, byte 9
/// bits 2-0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mra {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Byte 8, bits 7-6: which message this acknowledges.
    pub message_mraed: MessageKind,
    /// Byte 9, bits 7-3: how much longer to wait (5 bits, 4.096 µs · 2^n; rdma_cm sends 24).
    pub service_timeout: u8,
    /// Bytes 10-231: private data.
    pub private_data: FixedBytes<222>,
}

impl Mra {
    fn read(f: &Fields<'_, DATA_LEN>) -> Result<Self, CmError> {
        Ok(Self {
            local_comm_id: f.u32(0),
            remote_comm_id: f.u32(4),
            message_mraed: MessageKind::from_code("MRA message MRAed", f.bits(8, 7, 6))?,
            service_timeout: f.bits(9, 7, 3),
            private_data: f.fixed(10),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), CmError> {
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.bits(8, 7, 6, "MRA message MRAed", self.message_mraed.code())?;
        w.bits(9, 7, 3, "MRA service timeout", self.service_timeout)?;
        w.bytes(10, &self.private_data.0);
        Ok(())
    }
}

/// REJ (0x0012), reject. Reserved: byte 8 bits 5-0, byte 9 bit 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rej {
    /// Byte 0: the sender's communication ID (0 when rejecting a REQ it never accepted).
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Byte 8, bits 7-6: which message is rejected.
    pub message_rejected: MessageKind,
    /// Byte 9, bits 7-1: how many ARI bytes mean something (7 bits).
    pub reject_info_length: u8,
    /// Bytes 10-11: why.
    pub reason: RejectReason,
    /// Bytes 12-83: additional reject information.
    pub ari: FixedBytes<72>,
    /// Bytes 84-231: private data.
    pub private_data: FixedBytes<148>,
}

impl Rej {
    fn read(f: &Fields<'_, DATA_LEN>) -> Result<Self, CmError> {
        Ok(Self {
            local_comm_id: f.u32(0),
            remote_comm_id: f.u32(4),
            message_rejected: MessageKind::from_code("REJ message rejected", f.bits(8, 7, 6))?,
            reject_info_length: f.bits(9, 7, 1),
            reason: RejectReason::from_code(f.u16(10)),
            ari: f.fixed(12),
            private_data: f.fixed(84),
        })
    }

    fn write(&self, w: &mut Writer) -> Result<(), CmError> {
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.bits(
            8,
            7,
            6,
            "REJ message rejected",
            self.message_rejected.code(),
        )?;
        w.bits(9, 7, 1, "REJ reject info length", self.reject_info_length)?;
        w.u16(10, self.reason.code());
        w.bytes(12, &self.ari.0);
        w.bytes(84, &self.private_data.0);
        Ok(())
    }
}

/// REP (0x0013), the connect reply (`CM_REP_*`). Reserved: bytes 15, 19 and 23, byte 27
/// bits 3-0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rep {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the REQ's local communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-11: the sender's Q_Key.
    pub local_qkey: u32,
    /// Bytes 12-14: the sender's QPN.
    pub local_qpn: Qpn,
    /// Bytes 16-18: the sender's EE context (24 bits).
    pub local_eecn: u32,
    /// Bytes 20-22: the PSN the *active* side starts sending with.
    pub starting_psn: Psn,
    /// Byte 24: responder resources.
    pub responder_resources: u8,
    /// Byte 25: initiator depth.
    pub initiator_depth: u8,
    /// Byte 26, bits 7-3: target ACK delay (5 bits; rxe sends 15).
    pub target_ack_delay: u8,
    /// Byte 26, bits 2-1: failover accepted (2 bits: 0 accepted, 1 rejected, 2 unsupported).
    pub failover_accepted: u8,
    /// Byte 26, bit 0: end-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Byte 27, bits 7-5: the RNR retry count the active QP uses (3 bits).
    pub rnr_retry_count: u8,
    /// Byte 27, bit 4: the sender's QP uses an SRQ.
    pub srq: bool,
    /// Bytes 28-35: the sender's CA GUID.
    pub local_ca_guid: u64,
    /// Bytes 36-231: private data.
    pub private_data: FixedBytes<196>,
}

impl Rep {
    fn read(f: &Fields<'_, DATA_LEN>) -> Self {
        Self {
            local_comm_id: f.u32(0),
            remote_comm_id: f.u32(4),
            local_qkey: f.u32(8),
            local_qpn: Qpn::from_low_bits(f.u24(12)),
            local_eecn: f.u24(16),
            starting_psn: Psn::from_low_bits(f.u24(20)),
            responder_resources: f.u8(24),
            initiator_depth: f.u8(25),
            target_ack_delay: f.bits(26, 7, 3),
            failover_accepted: f.bits(26, 2, 1),
            end_to_end_flow_control: f.flag(26, 0),
            rnr_retry_count: f.bits(27, 7, 5),
            srq: f.flag(27, 4),
            local_ca_guid: f.u64(28),
            private_data: f.fixed(36),
        }
    }

    fn write(&self, w: &mut Writer) -> Result<(), CmError> {
        w.u32(0, self.local_comm_id);
        w.u32(4, self.remote_comm_id);
        w.u32(8, self.local_qkey);
        w.u24(12, "REP local QPN", self.local_qpn.value())?;
        w.u24(16, "REP local EECN", self.local_eecn)?;
        w.u24(20, "REP starting PSN", self.starting_psn.value())?;
        w.u8(24, self.responder_resources);
        w.u8(25, self.initiator_depth);
        w.bits(26, 7, 3, "REP target ACK delay", self.target_ack_delay)?;
        w.bits(26, 2, 1, "REP failover accepted", self.failover_accepted)?;
        w.flag(26, 0, self.end_to_end_flow_control);
        w.bits(27, 7, 5, "REP RNR retry count", self.rnr_retry_count)?;
        w.flag(27, 4, self.srq);
        w.u64(28, self.local_ca_guid);
        w.bytes(36, &self.private_data.0);
        Ok(())
    }
}

/// RTU (0x0014), ready to use: the active side's answer to a REP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Rtu {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-231: private data.
    pub private_data: FixedBytes<224>,
}

/// DREQ (0x0015), disconnect request. Reserved: byte 11.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Dreq {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-10: the receiver's QPN (or EECN). The kernel drops a DREQ whose QPN is not
    /// its own.
    pub remote_qpn: Qpn,
    /// Bytes 12-231: private data.
    pub private_data: FixedBytes<220>,
}

/// DREP (0x0016), disconnect reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Drep {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-231: private data.
    pub private_data: FixedBytes<224>,
}

/// SIDR_REQ (0x0017), service ID resolution request (UD). Reserved: bytes 6-7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SidrReq {
    /// Byte 0: the request ID the reply echoes.
    pub request_id: u32,
    /// Bytes 4-5: partition key.
    pub pkey: u16,
    /// Bytes 8-15: the service to resolve.
    pub service_id: ServiceId,
    /// Bytes 16-231: private data (rdma_cm: a [`super::CmaHeader`], then up to 180 bytes).
    pub private_data: FixedBytes<216>,
}

/// SIDR_REP (0x0018), service ID resolution reply. Reserved: bytes 6-7 and 11.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// Byte 0: the SIDR_REQ's request ID.
    pub request_id: u32,
    /// Byte 4: the outcome.
    pub status: SidrStatus,
    /// Byte 5: how many additional information bytes mean something.
    pub additional_info_length: u8,
    /// Bytes 8-10: the QPN to send to.
    pub qpn: Qpn,
    /// Bytes 12-19: the service ID resolved.
    pub service_id: ServiceId,
    /// Bytes 20-23: the Q_Key to send with (rdma_cm: 0x01234567; never 0).
    pub qkey: u32,
    /// Bytes 24-95: additional information (a redirect's ClassPortInfo).
    pub additional_info: FixedBytes<72>,
    /// Bytes 96-231: private data.
    pub private_data: FixedBytes<136>,
}

/// LAP (0x0019), load alternate path. Unused on RoCE (the kernel ignores it), so only the
/// communication IDs are typed and the rest is kept verbatim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Lap {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-231: the rest of the message, untyped.
    pub body: FixedBytes<224>,
}

/// APR (0x001A), alternate path response. Unused on RoCE, typed as far as [`Lap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Apr {
    /// Byte 0: the sender's communication ID.
    pub local_comm_id: u32,
    /// Byte 4: the receiver's communication ID.
    pub remote_comm_id: u32,
    /// Bytes 8-231: the rest of the message, untyped.
    pub body: FixedBytes<224>,
}

/// One CM message, by attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// Connect request.
    Req(Req),
    /// Message receipt acknowledgement.
    Mra(Mra),
    /// Reject.
    Rej(Rej),
    /// Connect reply.
    Rep(Rep),
    /// Ready to use.
    Rtu(Rtu),
    /// Disconnect request.
    Dreq(Dreq),
    /// Disconnect reply.
    Drep(Drep),
    /// Service ID resolution request.
    SidrReq(SidrReq),
    /// Service ID resolution reply.
    SidrRep(SidrRep),
    /// Load alternate path.
    Lap(Lap),
    /// Alternate path response.
    Apr(Apr),
}

impl CmMessage {
    /// Parses a 256-byte CM MAD into its header and message.
    ///
    /// # Errors
    ///
    /// [`CmError::Length`] unless `mad` is exactly 256 bytes; those of
    /// [`MadHeader::cm_attribute`] for a header that is not a CM MAD's;
    /// [`CmError::Reserved`] for a REQ's reserved MTU code or an MRA's or REJ's reserved
    /// message code.
    pub fn parse(mad: &[u8]) -> Result<(MadHeader, Self), CmError> {
        if mad.len() != MAD_LEN {
            return Err(CmError::Length(mad.len()));
        }
        let header = MadHeader::parse(mad)?;
        let attribute = header.cm_attribute()?;
        let data = mad
            .last_chunk::<DATA_LEN>()
            .ok_or(CmError::Length(mad.len()))?;
        let f = Fields(data);
        let message = match attribute {
            AttributeId::Req => Self::Req(Req::read(&f)?),
            AttributeId::Mra => Self::Mra(Mra::read(&f)?),
            AttributeId::Rej => Self::Rej(Rej::read(&f)?),
            AttributeId::Rep => Self::Rep(Rep::read(&f)),
            AttributeId::Rtu => Self::Rtu(Rtu {
                local_comm_id: f.u32(0),
                remote_comm_id: f.u32(4),
                private_data: f.fixed(8),
            }),
            AttributeId::Dreq => Self::Dreq(Dreq {
                local_comm_id: f.u32(0),
                remote_comm_id: f.u32(4),
                remote_qpn: Qpn::from_low_bits(f.u24(8)),
                private_data: f.fixed(12),
            }),
            AttributeId::Drep => Self::Drep(Drep {
                local_comm_id: f.u32(0),
                remote_comm_id: f.u32(4),
                private_data: f.fixed(8),
            }),
            AttributeId::SidrReq => Self::SidrReq(SidrReq {
                request_id: f.u32(0),
                pkey: f.u16(4),
                service_id: ServiceId(f.u64(8)),
                private_data: f.fixed(16),
            }),
            AttributeId::SidrRep => Self::SidrRep(SidrRep {
                request_id: f.u32(0),
                status: SidrStatus::from_code(f.u8(4)),
                additional_info_length: f.u8(5),
                qpn: Qpn::from_low_bits(f.u24(8)),
                service_id: ServiceId(f.u64(12)),
                qkey: f.u32(20),
                additional_info: f.fixed(24),
                private_data: f.fixed(96),
            }),
            AttributeId::Lap => Self::Lap(Lap {
                local_comm_id: f.u32(0),
                remote_comm_id: f.u32(4),
                body: f.fixed(8),
            }),
            AttributeId::Apr => Self::Apr(Apr {
                local_comm_id: f.u32(0),
                remote_comm_id: f.u32(4),
                body: f.fixed(8),
            }),
        };
        Ok((header, message))
    }

    /// Writes `header` and the message as a 256-byte MAD, reserved bytes and bits as zero.
    /// [`CmMessage::header`] gives the usual header.
    ///
    /// # Errors
    ///
    /// Those of [`MadHeader::cm_attribute`] for a header [`CmMessage::parse`] would refuse;
    /// [`CmError::AttributeMismatch`] when the header names another message;
    /// [`CmError::FieldRange`] for a value wider than its field. `out` is untouched on error.
    pub fn emit(&self, header: &MadHeader, out: &mut [u8; MAD_LEN]) -> Result<(), CmError> {
        if header.cm_attribute()? != self.attribute_id() {
            return Err(CmError::AttributeMismatch {
                header: header.attribute_id,
                message: self.name(),
            });
        }
        let mut w = Writer([0; DATA_LEN]);
        match self {
            Self::Req(m) => m.write(&mut w)?,
            Self::Mra(m) => m.write(&mut w)?,
            Self::Rej(m) => m.write(&mut w)?,
            Self::Rep(m) => m.write(&mut w)?,
            Self::Rtu(m) => {
                w.ids(m.local_comm_id, m.remote_comm_id);
                w.bytes(8, &m.private_data.0);
            }
            Self::Dreq(m) => {
                w.ids(m.local_comm_id, m.remote_comm_id);
                w.u24(8, "DREQ remote QPN", m.remote_qpn.value())?;
                w.bytes(12, &m.private_data.0);
            }
            Self::Drep(m) => {
                w.ids(m.local_comm_id, m.remote_comm_id);
                w.bytes(8, &m.private_data.0);
            }
            Self::SidrReq(m) => {
                w.u32(0, m.request_id);
                w.u16(4, m.pkey);
                w.u64(8, m.service_id.0);
                w.bytes(16, &m.private_data.0);
            }
            Self::SidrRep(m) => {
                w.u32(0, m.request_id);
                w.u8(4, m.status.code());
                w.u8(5, m.additional_info_length);
                w.u24(8, "SIDR_REP QPN", m.qpn.value())?;
                w.u64(12, m.service_id.0);
                w.u32(20, m.qkey);
                w.bytes(24, &m.additional_info.0);
                w.bytes(96, &m.private_data.0);
            }
            Self::Lap(m) => {
                w.ids(m.local_comm_id, m.remote_comm_id);
                w.bytes(8, &m.body.0);
            }
            Self::Apr(m) => {
                w.ids(m.local_comm_id, m.remote_comm_id);
                w.bytes(8, &m.body.0);
            }
        }
        let (head, data) = out.split_at_mut(DATA_AT);
        let mut header_bytes = [0; MadHeader::LEN];
        header.write(&mut header_bytes);
        head.copy_from_slice(&header_bytes);
        data.copy_from_slice(&w.0);
        Ok(())
    }

    /// The header the kernel puts on this message: [`MadHeader::cm`] with its attribute.
    #[must_use]
    pub const fn header(&self, transaction_id: u64) -> MadHeader {
        MadHeader::cm(self.attribute_id(), transaction_id)
    }

    /// The message's attribute.
    #[must_use]
    pub const fn attribute_id(&self) -> AttributeId {
        match self {
            Self::Req(_) => AttributeId::Req,
            Self::Mra(_) => AttributeId::Mra,
            Self::Rej(_) => AttributeId::Rej,
            Self::Rep(_) => AttributeId::Rep,
            Self::Rtu(_) => AttributeId::Rtu,
            Self::Dreq(_) => AttributeId::Dreq,
            Self::Drep(_) => AttributeId::Drep,
            Self::SidrReq(_) => AttributeId::SidrReq,
            Self::SidrRep(_) => AttributeId::SidrRep,
            Self::Lap(_) => AttributeId::Lap,
            Self::Apr(_) => AttributeId::Apr,
        }
    }

    /// The message's name as IBTA spells it: `"REQ"`, `"MRA"`, `"REJ"`, `"REP"`, `"RTU"`,
    /// `"DREQ"`, `"DREP"`, `"SIDR_REQ"`, `"SIDR_REP"`, `"LAP"` or `"APR"`.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        self.attribute_id().name()
    }

    /// The sender's communication ID; `None` for SIDR messages, which have a request ID
    /// instead.
    #[must_use]
    pub const fn local_comm_id(&self) -> Option<u32> {
        Some(match self {
            Self::Req(m) => m.local_comm_id,
            Self::Mra(m) => m.local_comm_id,
            Self::Rej(m) => m.local_comm_id,
            Self::Rep(m) => m.local_comm_id,
            Self::Rtu(m) => m.local_comm_id,
            Self::Dreq(m) => m.local_comm_id,
            Self::Drep(m) => m.local_comm_id,
            Self::Lap(m) => m.local_comm_id,
            Self::Apr(m) => m.local_comm_id,
            Self::SidrReq(_) | Self::SidrRep(_) => return None,
        })
    }

    /// The receiver's communication ID; `None` for REQ (which opens the exchange) and SIDR.
    #[must_use]
    pub const fn remote_comm_id(&self) -> Option<u32> {
        Some(match self {
            Self::Mra(m) => m.remote_comm_id,
            Self::Rej(m) => m.remote_comm_id,
            Self::Rep(m) => m.remote_comm_id,
            Self::Rtu(m) => m.remote_comm_id,
            Self::Dreq(m) => m.remote_comm_id,
            Self::Drep(m) => m.remote_comm_id,
            Self::Lap(m) => m.remote_comm_id,
            Self::Apr(m) => m.remote_comm_id,
            Self::Req(_) | Self::SidrReq(_) | Self::SidrRep(_) => return None,
        })
    }

    /// The SIDR request ID; `None` for the other messages.
    #[must_use]
    pub const fn request_id(&self) -> Option<u32> {
        match self {
            Self::SidrReq(m) => Some(m.request_id),
            Self::SidrRep(m) => Some(m.request_id),
            _ => None,
        }
    }

    /// The service ID of a REQ, SIDR_REQ or SIDR_REP.
    #[must_use]
    pub const fn service_id(&self) -> Option<ServiceId> {
        match self {
            Self::Req(m) => Some(m.service_id),
            Self::SidrReq(m) => Some(m.service_id),
            Self::SidrRep(m) => Some(m.service_id),
            _ => None,
        }
    }
}

/// Checks that `value` fits in `bits` bits.
fn fits(field: &'static str, value: u64, bits: u32) -> Result<(), CmError> {
    if value >> bits == 0 {
        Ok(())
    } else {
        Err(CmError::FieldRange { field, value, bits })
    }
}

/// Reads fields from a fixed-size array. Every offset the codec passes is a constant inside
/// the array, so no read can go out of bounds.
struct Fields<'a, const N: usize>(&'a [u8; N]);

impl<const N: usize> Fields<'_, N> {
    fn u8(&self, at: usize) -> u8 {
        self.0[at]
    }

    fn array<const M: usize>(&self, at: usize) -> [u8; M] {
        let mut out = [0; M];
        out.copy_from_slice(&self.0[at..at + M]);
        out
    }

    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes(self.array(at))
    }

    fn u24(&self, at: usize) -> u32 {
        let [a, b, c] = self.array(at);
        u32::from_be_bytes([0, a, b, c])
    }

    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.array(at))
    }

    fn u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.array(at))
    }

    /// Bits `hi..=lo` of byte `at`, IBA numbering (bit 7 is the most significant).
    fn bits(&self, at: usize, hi: u32, lo: u32) -> u8 {
        let width = hi - lo + 1;
        (self.0[at] >> lo) & ((1u16 << width) - 1) as u8
    }

    fn flag(&self, at: usize, bit: u32) -> bool {
        self.bits(at, bit, bit) == 1
    }

    fn gid(&self, at: usize) -> Ipv6Addr {
        Ipv6Addr::from(self.array::<16>(at))
    }

    fn fixed<const M: usize>(&self, at: usize) -> FixedBytes<M> {
        FixedBytes(self.array(at))
    }
}

/// Builds a message's 232 bytes, starting from zeros (so every reserved bit stays zero).
/// As with [`Fields`], every offset is a constant inside the array.
struct Writer([u8; DATA_LEN]);

impl Writer {
    fn bytes(&mut self, at: usize, bytes: &[u8]) {
        self.0[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn u8(&mut self, at: usize, value: u8) {
        self.0[at] = value;
    }

    fn u16(&mut self, at: usize, value: u16) {
        self.bytes(at, &value.to_be_bytes());
    }

    fn u24(&mut self, at: usize, field: &'static str, value: u32) -> Result<(), CmError> {
        fits(field, value.into(), 24)?;
        self.bytes(at, &value.to_be_bytes()[1..]);
        Ok(())
    }

    fn u32(&mut self, at: usize, value: u32) {
        self.bytes(at, &value.to_be_bytes());
    }

    fn u64(&mut self, at: usize, value: u64) {
        self.bytes(at, &value.to_be_bytes());
    }

    fn ids(&mut self, local: u32, remote: u32) {
        self.u32(0, local);
        self.u32(4, remote);
    }

    /// Sets bits `hi..=lo` of byte `at`, which must still be zero there.
    fn bits(
        &mut self,
        at: usize,
        hi: u32,
        lo: u32,
        field: &'static str,
        value: u8,
    ) -> Result<(), CmError> {
        fits(field, value.into(), hi - lo + 1)?;
        self.0[at] |= value << lo;
        Ok(())
    }

    fn flag(&mut self, at: usize, bit: u32, value: bool) {
        self.0[at] |= u8::from(value) << bit;
    }
}
