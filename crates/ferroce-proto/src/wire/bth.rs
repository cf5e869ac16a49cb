//! The Base Transport Header (IBTA Vol. 1 §9.2): 12 bytes at the start of every packet.
//!
//! ```text
//! byte 0      opcode
//! byte 1      SE (7) | MigReq (6) | PadCnt (5-4) | TVer (3-0)
//! bytes 2-3   P_Key
//! byte 4      FECN (7) | BECN (6) | reserved (5-0)     masked in the ICRC
//! bytes 5-7   destination QP
//! byte 8      AckReq (7) | reserved (6-0)
//! bytes 9-11  PSN
//! ```

use core::fmt;

use super::{be_u16, be_u24, check_u24, put_u24, Error, Opcode};
use crate::Psn;

pub(crate) mod field {
    pub(crate) const OPCODE: usize = 0;
    pub(crate) const FLAGS: usize = 1;
    pub(crate) const PKEY: usize = 2;
    pub(crate) const RESV8A: usize = 4;
    pub(crate) const DEST_QP: usize = 5;
    pub(crate) const ACK_REQ: usize = 8;
    pub(crate) const PSN: usize = 9;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

/// A 24-bit queue pair number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// QP 1, the General Services Interface (connection management MADs).
    pub const GSI: Self = Self(1);

    /// A QPN from its value, or `None` if `value` needs more than 24 bits.
    #[must_use]
    pub const fn new(value: u32) -> Option<Self> {
        if value <= 0x00ff_ffff {
            Some(Self(value))
        } else {
            None
        }
    }

    /// A QPN from the low 24 bits of `value`.
    #[must_use]
    pub const fn from_low_bits(value: u32) -> Self {
        Self(value & 0x00ff_ffff)
    }

    /// The QPN's value.
    #[must_use]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A parsed Base Transport Header.
///
/// The pad count is not here: it belongs to the packet (it follows from the payload length),
/// so [`super::Packet::pad`] reads it and [`super::PacketRepr::emit`] writes it. Reserved
/// bits are ignored when parsing and sent as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bth {
    /// The operation and transport.
    pub opcode: Opcode,
    /// Solicited event: the receiver should raise a completion event.
    pub solicited: bool,
    /// Migration request (APM); RoCE peers send 0.
    pub mig_req: bool,
    /// Partition key; rxe sends 0xFFFF (the default partition).
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination queue pair.
    pub dest_qp: Qpn,
    /// The requester asks for an acknowledgement of this packet.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Bth {
    /// The header's length in bytes.
    pub const LEN: usize = 12;

    /// Parses the first 12 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 12 bytes, [`Error::UnknownOpcode`] and
    /// [`Error::TransportVersion`] for headers ferroce cannot interpret.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        super::check_len("BTH", bytes, Self::LEN)?;
        let opcode = Opcode::try_from(bytes[field::OPCODE])?;
        let flags = bytes[field::FLAGS];
        let tver = flags & 0x0f;
        if tver != 0 {
            return Err(Error::TransportVersion(tver));
        }
        Ok(Self::read(opcode, bytes))
    }

    /// Reads the fields of a BTH whose opcode is known and whose 12 bytes are present.
    #[inline]
    pub(crate) fn read(opcode: Opcode, bytes: &[u8]) -> Self {
        let flags = bytes[field::FLAGS];
        Self {
            opcode,
            solicited: flags & SE != 0,
            mig_req: flags & MIG_REQ != 0,
            pkey: be_u16(bytes, field::PKEY),
            fecn: bytes[field::RESV8A] & FECN != 0,
            becn: bytes[field::RESV8A] & BECN != 0,
            dest_qp: Qpn::from_low_bits(be_u24(bytes, field::DEST_QP)),
            ack_req: bytes[field::ACK_REQ] & ACK_REQ != 0,
            psn: Psn::from_low_bits(be_u24(bytes, field::PSN)),
        }
    }

    /// Writes the header into the first 12 bytes of `out`, with pad count `pad`.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] if `out` is shorter than 12 bytes, [`Error::FieldRange`] if
    /// `pad` is above 3.
    pub fn emit(&self, pad: u8, out: &mut [u8]) -> Result<(), Error> {
        if out.len() < Self::LEN {
            return Err(Error::BufferTooSmall {
                needed: Self::LEN,
                available: out.len(),
            });
        }
        if pad > 3 {
            return Err(Error::FieldRange {
                field: "pad count",
                value: pad.into(),
                bits: 2,
            });
        }
        check_u24("destination QP", self.dest_qp.value())?;
        out[field::OPCODE] = self.opcode.value();
        out[field::FLAGS] = (if self.solicited { SE } else { 0 })
            | (if self.mig_req { MIG_REQ } else { 0 })
            | (pad << 4);
        out[field::PKEY..field::PKEY + 2].copy_from_slice(&self.pkey.to_be_bytes());
        out[field::RESV8A] =
            (if self.fecn { FECN } else { 0 }) | (if self.becn { BECN } else { 0 });
        put_u24(out, field::DEST_QP, self.dest_qp.value());
        out[field::ACK_REQ] = if self.ack_req { ACK_REQ } else { 0 };
        put_u24(out, field::PSN, self.psn.value());
        Ok(())
    }

    /// A header with the defaults ferroce and rxe send: P_Key 0xFFFF, every flag clear.
    #[must_use]
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> Self {
        Self {
            opcode,
            solicited: false,
            mig_req: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }
}
