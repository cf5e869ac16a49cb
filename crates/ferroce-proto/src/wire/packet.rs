//! A whole RoCE packet as a UDP socket carries it: BTH, extension headers, payload, pad, ICRC.

use super::bth::field;
use super::{
    be_u32, check_u24, Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Error, Feth, HeaderSet, Opcode,
    Reth,
};
use crate::Psn;

/// The length of the ICRC trailer.
pub(crate) const ICRC_LEN: usize = 4;

/// A zero-copy view of a RoCE packet: the UDP payload from the BTH through the ICRC.
///
/// [`Packet::new_checked`] validates the layout once (a known opcode, transport version 0,
/// room for the opcode's headers, a pad count that fits and aligns the payload to 4 bytes, no
/// payload where the opcode allows none); after that every accessor is infallible and none panics. It does not check the
/// ICRC: that needs the IP and UDP headers, see [`super::icrc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    opcode: Opcode,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps and validates untrusted bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] when the bytes end before the opcode's headers and the ICRC,
    /// [`Error::UnknownOpcode`] / [`Error::TransportVersion`] for a BTH ferroce cannot read,
    /// [`Error::Pad`] when the pad count exceeds the bytes after the headers,
    /// [`Error::Unaligned`] when payload and pad do not end on a 4-byte boundary, and
    /// [`Error::UnexpectedPayload`] when an opcode without payload has one.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let bytes = buffer.as_ref();
        super::check_len("BTH", bytes, Bth::LEN)?;
        let opcode = Opcode::try_from(bytes[field::OPCODE])?;
        let tver = bytes[field::FLAGS] & 0x0f;
        if tver != 0 {
            return Err(Error::TransportVersion(tver));
        }
        let header_len = opcode.header_len();
        super::check_len(opcode.name(), bytes, header_len + ICRC_LEN)?;
        let available = bytes.len() - header_len - ICRC_LEN;
        let pad = (bytes[field::FLAGS] >> 4) & 0x3;
        if usize::from(pad) > available {
            return Err(Error::Pad { pad, available });
        }
        if available % 4 != 0 {
            return Err(Error::Unaligned {
                payload: available - usize::from(pad),
                pad,
            });
        }
        if !opcode.carries_payload() && available != 0 {
            return Err(Error::UnexpectedPayload {
                opcode,
                len: available,
            });
        }
        Ok(Self { buffer, opcode })
    }

    /// The underlying bytes.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// All the packet's bytes, BTH through ICRC.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        self.opcode
    }

    /// The parsed BTH.
    #[inline]
    pub fn bth(&self) -> Bth {
        // `new_checked` found the 12 BTH bytes, a known opcode and TVer 0.
        Bth::read(self.opcode, self.as_bytes())
    }

    /// The destination queue pair.
    #[inline]
    pub fn dest_qp(&self) -> super::Qpn {
        super::Qpn::from_low_bits(super::be_u24(self.as_bytes(), field::DEST_QP))
    }

    /// The packet sequence number.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::from_low_bits(super::be_u24(self.as_bytes(), field::PSN))
    }

    /// Whether the requester asks for a solicited event at the receiver (the BTH's SE bit,
    /// `IBV_SEND_SOLICITED`).
    #[inline]
    pub fn solicited(&self) -> bool {
        self.as_bytes()[field::FLAGS] & 0x80 != 0
    }

    /// Whether the requester asks for an acknowledgement.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.as_bytes()[field::ACK_REQ] & 0x80 != 0
    }

    /// The pad count: zero bytes between the payload and the ICRC.
    #[inline]
    pub fn pad(&self) -> u8 {
        (self.as_bytes()[field::FLAGS] >> 4) & 0x3
    }

    /// The extension headers this packet carries.
    #[inline]
    pub fn headers(&self) -> HeaderSet {
        self.opcode.headers()
    }

    /// The length of the BTH and the extension headers.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.opcode.header_len()
    }

    #[inline]
    fn ext(&self, which: HeaderSet) -> Option<&[u8]> {
        let offset = self.opcode.header_offset(which)?;
        Some(&self.as_bytes()[Bth::LEN + offset..])
    }

    /// The DETH, if the opcode has one (UD).
    #[inline]
    pub fn deth(&self) -> Option<Deth> {
        self.ext(HeaderSet::DETH).and_then(|b| Deth::parse(b).ok())
    }

    /// The FETH, if the opcode has one (FLUSH).
    #[inline]
    pub fn feth(&self) -> Option<Feth> {
        self.ext(HeaderSet::FETH).and_then(|b| Feth::parse(b).ok())
    }

    /// The RETH, if the opcode has one (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE).
    #[inline]
    pub fn reth(&self) -> Option<Reth> {
        self.ext(HeaderSet::RETH).and_then(|b| Reth::parse(b).ok())
    }

    /// The AtomicETH, if the opcode has one (COMPARE_SWAP, FETCH_ADD).
    #[inline]
    pub fn atomic_eth(&self) -> Option<AtomicEth> {
        self.ext(HeaderSet::ATOMIC)
            .and_then(|b| AtomicEth::parse(b).ok())
    }

    /// The AETH, if the opcode has one (ACKs, READ responses FIRST/LAST/ONLY).
    #[inline]
    pub fn aeth(&self) -> Option<Aeth> {
        self.ext(HeaderSet::AETH).and_then(|b| Aeth::parse(b).ok())
    }

    /// The AtomicAckETH, if the opcode has one (ATOMIC_ACKNOWLEDGE).
    #[inline]
    pub fn atomic_ack(&self) -> Option<AtomicAckEth> {
        self.ext(HeaderSet::ATOMIC_ACK)
            .and_then(|b| AtomicAckEth::parse(b).ok())
    }

    /// The immediate data, if the opcode carries it, as the big-endian value of its 4 bytes.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        self.ext(HeaderSet::IMM).map(|b| be_u32(b, 0))
    }

    /// The R_Key to invalidate, if the opcode carries an IETH.
    #[inline]
    pub fn ieth(&self) -> Option<u32> {
        self.ext(HeaderSet::IETH).map(|b| be_u32(b, 0))
    }

    /// The payload, without pad and ICRC.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let bytes = self.as_bytes();
        &bytes[self.header_len()..bytes.len() - ICRC_LEN - usize::from(self.pad())]
    }

    /// The bytes the ICRC covers beyond the IP and UDP headers: BTH through pad.
    #[inline]
    pub fn covered(&self) -> &[u8] {
        let bytes = self.as_bytes();
        &bytes[..bytes.len() - ICRC_LEN]
    }

    /// The ICRC as carried (the wire holds it little-endian).
    #[inline]
    pub fn icrc(&self) -> u32 {
        let bytes = self.as_bytes();
        let mut le = [0; 4];
        le.copy_from_slice(&bytes[bytes.len() - ICRC_LEN..]);
        u32::from_le_bytes(le)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// The payload, writable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        let end = self.buffer.as_ref().len() - ICRC_LEN - usize::from(self.pad());
        &mut self.buffer.as_mut()[start..end]
    }

    /// Overwrites the ICRC trailer.
    #[inline]
    pub fn set_icrc(&mut self, icrc: u32) {
        let bytes = self.buffer.as_mut();
        let at = bytes.len() - ICRC_LEN;
        bytes[at..].copy_from_slice(&icrc.to_le_bytes());
    }
}

/// A validated, owned description of a RoCE packet's headers and payload length.
///
/// Exactly the extension headers the opcode requires are `Some`: [`PacketRepr::parse`]
/// guarantees it, and [`PacketRepr::emit`] refuses a representation that breaks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketRepr {
    /// The Base Transport Header.
    pub bth: Bth,
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// FETH (FLUSH).
    pub feth: Option<Feth>,
    /// RETH (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE).
    pub reth: Option<Reth>,
    /// AtomicETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic: Option<AtomicEth>,
    /// AETH (ACKs and READ responses FIRST/LAST/ONLY).
    pub aeth: Option<Aeth>,
    /// AtomicAckETH (ATOMIC_ACKNOWLEDGE).
    pub atomic_ack: Option<AtomicAckEth>,
    /// Immediate data (…WITH_IMMEDIATE), the big-endian value of its 4 bytes.
    pub imm: Option<u32>,
    /// R_Key to invalidate (…WITH_INVALIDATE).
    pub ieth: Option<u32>,
    /// Payload length in bytes, without pad.
    pub payload_len: usize,
}

impl PacketRepr {
    /// A representation with the given BTH, no extension headers and no payload; set the
    /// headers the opcode needs before emitting.
    #[must_use]
    pub const fn new(bth: Bth) -> Self {
        Self {
            bth,
            deth: None,
            feth: None,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
            payload_len: 0,
        }
    }

    /// Reads a validated view into a representation.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Self {
        let bytes = packet.as_bytes();
        let headers = packet.headers();
        // Walk the headers in wire order with a running offset: one pass, no table lookups.
        // `new_checked` verified that all of them fit, so no parse below can fail.
        let mut at = Bth::LEN;
        let mut next = |h: HeaderSet, len: usize| {
            headers.contains(h).then(|| {
                let start = at;
                at += len;
                &bytes[start..]
            })
        };
        let deth = next(HeaderSet::DETH, Deth::LEN).and_then(|b| Deth::parse(b).ok());
        let feth = next(HeaderSet::FETH, Feth::LEN).and_then(|b| Feth::parse(b).ok());
        let reth = next(HeaderSet::RETH, Reth::LEN).and_then(|b| Reth::parse(b).ok());
        let atomic = next(HeaderSet::ATOMIC, AtomicEth::LEN).and_then(|b| AtomicEth::parse(b).ok());
        let aeth = next(HeaderSet::AETH, Aeth::LEN).and_then(|b| Aeth::parse(b).ok());
        let atomic_ack = next(HeaderSet::ATOMIC_ACK, AtomicAckEth::LEN)
            .and_then(|b| AtomicAckEth::parse(b).ok());
        let imm = next(HeaderSet::IMM, 4).map(|b| be_u32(b, 0));
        let ieth = next(HeaderSet::IETH, 4).map(|b| be_u32(b, 0));
        Self {
            bth: packet.bth(),
            deth,
            feth,
            reth,
            atomic,
            aeth,
            atomic_ack,
            imm,
            ieth,
            payload_len: packet.payload().len(),
        }
    }

    /// The extension headers present in this representation.
    #[must_use]
    pub fn present(&self) -> HeaderSet {
        let mut set = HeaderSet::NONE;
        let mut add = |present: bool, h: HeaderSet| {
            if present {
                set = set.with(h);
            }
        };
        add(self.deth.is_some(), HeaderSet::DETH);
        add(self.feth.is_some(), HeaderSet::FETH);
        add(self.reth.is_some(), HeaderSet::RETH);
        add(self.atomic.is_some(), HeaderSet::ATOMIC);
        add(self.aeth.is_some(), HeaderSet::AETH);
        add(self.atomic_ack.is_some(), HeaderSet::ATOMIC_ACK);
        add(self.imm.is_some(), HeaderSet::IMM);
        add(self.ieth.is_some(), HeaderSet::IETH);
        if self.bth.opcode.headers().contains(HeaderSet::CNP_RESERVED) {
            set = set.with(HeaderSet::CNP_RESERVED);
        }
        set
    }

    /// Checks that the representation can be emitted: the headers match the opcode, an
    /// opcode without payload has none, and every field fits its wire width.
    ///
    /// # Errors
    ///
    /// [`Error::HeaderMismatch`], [`Error::UnexpectedPayload`] or [`Error::FieldRange`].
    pub fn check(&self) -> Result<(), Error> {
        let opcode = self.bth.opcode;
        let expected = opcode.headers();
        let found = self.present();
        if expected != found {
            return Err(Error::HeaderMismatch {
                opcode,
                expected,
                found,
            });
        }
        if !opcode.carries_payload() && self.payload_len != 0 {
            return Err(Error::UnexpectedPayload {
                opcode,
                len: self.payload_len,
            });
        }
        check_u24("destination QP", self.bth.dest_qp.value())?;
        if let Some(aeth) = &self.aeth {
            check_u24("AETH MSN", aeth.msn)?;
        }
        Ok(())
    }

    /// The pad count the payload needs to reach a multiple of 4 bytes.
    #[must_use]
    pub const fn pad(&self) -> u8 {
        (self.payload_len.wrapping_neg() & 3) as u8
    }

    /// The length of the BTH and extension headers: where the payload starts.
    #[must_use]
    pub const fn header_len(&self) -> usize {
        self.bth.opcode.header_len()
    }

    /// The whole packet's length: headers, payload, pad and ICRC.
    #[must_use]
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload_len + self.pad() as usize + ICRC_LEN
    }

    /// Writes the BTH and extension headers (with the pad count for `payload_len`) into
    /// `out`, and returns the header length. The caller then places `payload_len` bytes of
    /// payload at that offset, zero pad, and the ICRC. This lets a sender build the payload
    /// in place, straight from registered memory.
    ///
    /// # Errors
    ///
    /// Those of [`PacketRepr::check`], and [`Error::BufferTooSmall`] when `out` is shorter
    /// than the headers.
    pub fn emit_headers(&self, out: &mut [u8]) -> Result<usize, Error> {
        self.check()?;
        let header_len = self.header_len();
        if out.len() < header_len {
            return Err(Error::BufferTooSmall {
                needed: header_len,
                available: out.len(),
            });
        }
        self.bth.emit(self.pad(), out)?;
        let headers = self.bth.opcode.headers();
        let at = |h: HeaderSet| headers.offset_of(h).map(|o| Bth::LEN + o);
        if let (Some(deth), Some(o)) = (&self.deth, at(HeaderSet::DETH)) {
            deth.emit(&mut out[o..])?;
        }
        if let (Some(feth), Some(o)) = (&self.feth, at(HeaderSet::FETH)) {
            feth.emit(&mut out[o..])?;
        }
        if let (Some(reth), Some(o)) = (&self.reth, at(HeaderSet::RETH)) {
            reth.emit(&mut out[o..]);
        }
        if let (Some(atomic), Some(o)) = (&self.atomic, at(HeaderSet::ATOMIC)) {
            atomic.emit(&mut out[o..]);
        }
        if let (Some(aeth), Some(o)) = (&self.aeth, at(HeaderSet::AETH)) {
            aeth.emit(&mut out[o..])?;
        }
        if let (Some(ack), Some(o)) = (&self.atomic_ack, at(HeaderSet::ATOMIC_ACK)) {
            ack.emit(&mut out[o..]);
        }
        if let (Some(imm), Some(o)) = (self.imm, at(HeaderSet::IMM)) {
            out[o..o + 4].copy_from_slice(&imm.to_be_bytes());
        }
        if let (Some(rkey), Some(o)) = (self.ieth, at(HeaderSet::IETH)) {
            out[o..o + 4].copy_from_slice(&rkey.to_be_bytes());
        }
        if let Some(o) = at(HeaderSet::CNP_RESERVED) {
            out[o..o + 16].fill(0);
        }
        Ok(header_len)
    }

    /// Writes the whole packet into `out`: headers, `payload`, zero pad and a zero ICRC
    /// (seal it with [`super::icrc::seal`] once the IP and UDP headers are known). Returns
    /// the number of bytes written, [`PacketRepr::buffer_len`].
    ///
    /// # Errors
    ///
    /// Those of [`PacketRepr::emit_headers`]; [`Error::Length`] when `payload` is not
    /// `payload_len` bytes; [`Error::BufferTooSmall`] when `out` is shorter than the packet.
    pub fn emit(&self, payload: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        if payload.len() != self.payload_len {
            return Err(Error::Length {
                what: "payload_len",
                claimed: self.payload_len,
                actual: payload.len(),
            });
        }
        let len = self.buffer_len();
        if out.len() < len {
            return Err(Error::BufferTooSmall {
                needed: len,
                available: out.len(),
            });
        }
        let header_len = self.emit_headers(out)?;
        let payload_end = header_len + payload.len();
        out[header_len..payload_end].copy_from_slice(payload);
        out[payload_end..len].fill(0);
        Ok(len)
    }
}
