//! Opcodes: the first byte of the Base Transport Header.
//!
//! An opcode is a transport class (the top three bits: RC, UC, RD, UD, CNP, XRC) and an
//! operation (the low five bits). Each known opcode fixes which extension headers follow the
//! BTH and whether a payload may follow them; that table lives here, once, and every parser
//! and emitter reads it. Values and header sets follow IBTA Vol. 1 §9.2 and Linux's
//! `include/rdma/ib_pack.h` / `rxe_opcode.c`.

use core::fmt;

/// The transport service an opcode belongs to (IBTA Vol. 1 §9.2, the opcode's top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// Reliable Connected (0x00–0x1F).
    Rc,
    /// Unreliable Connected (0x20–0x3F).
    Uc,
    /// Unreliable Datagram (0x60–0x7F).
    Ud,
    /// Congestion Notification Packet (0x80–0x9F, RoCEv2 annex A17).
    Cnp,
}

/// What a packet does, independent of its transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // the variant names are the IBTA operation names
pub enum Operation {
    SendFirst,
    SendMiddle,
    SendLast,
    SendLastWithImmediate,
    SendOnly,
    SendOnlyWithImmediate,
    RdmaWriteFirst,
    RdmaWriteMiddle,
    RdmaWriteLast,
    RdmaWriteLastWithImmediate,
    RdmaWriteOnly,
    RdmaWriteOnlyWithImmediate,
    RdmaReadRequest,
    RdmaReadResponseFirst,
    RdmaReadResponseMiddle,
    RdmaReadResponseLast,
    RdmaReadResponseOnly,
    Acknowledge,
    AtomicAcknowledge,
    CompareSwap,
    FetchAdd,
    SendLastWithInvalidate,
    SendOnlyWithInvalidate,
    Flush,
    AtomicWrite,
    /// Congestion notification (RoCEv2 CNP).
    CongestionNotification,
}

impl Operation {
    /// Whether this is one of the four RDMA READ responses (FIRST, MIDDLE, LAST, ONLY).
    #[must_use]
    #[inline]
    pub const fn is_read_response(self) -> bool {
        matches!(
            self,
            Self::RdmaReadResponseFirst
                | Self::RdmaReadResponseMiddle
                | Self::RdmaReadResponseLast
                | Self::RdmaReadResponseOnly
        )
    }
}

/// The set of extension headers that follow the BTH, in wire order.
///
/// The order on the wire is always DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt,
/// IETH, then the CNP's 16 reserved bytes; an opcode uses a subset.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HeaderSet(u16);

impl HeaderSet {
    /// No extension header.
    pub const NONE: Self = Self(0);
    /// Datagram Extended Transport Header (UD).
    pub const DETH: Self = Self(1 << 0);
    /// Flush Extended Transport Header (FLUSH).
    pub const FETH: Self = Self(1 << 1);
    /// RDMA Extended Transport Header.
    pub const RETH: Self = Self(1 << 2);
    /// Atomic Extended Transport Header.
    pub const ATOMIC: Self = Self(1 << 3);
    /// ACK Extended Transport Header.
    pub const AETH: Self = Self(1 << 4);
    /// Atomic ACK Extended Transport Header.
    pub const ATOMIC_ACK: Self = Self(1 << 5);
    /// Immediate data.
    pub const IMM: Self = Self(1 << 6);
    /// Invalidate Extended Transport Header.
    pub const IETH: Self = Self(1 << 7);
    /// The 16 reserved bytes of a CNP.
    pub const CNP_RESERVED: Self = Self(1 << 8);

    /// Every header, in wire order, with its name and length in bytes.
    pub const ALL: [(Self, &'static str, usize); 9] = [
        (Self::DETH, "DETH", super::Deth::LEN),
        (Self::FETH, "FETH", super::Feth::LEN),
        (Self::RETH, "RETH", super::Reth::LEN),
        (Self::ATOMIC, "AtomicETH", super::AtomicEth::LEN),
        (Self::AETH, "AETH", super::Aeth::LEN),
        (Self::ATOMIC_ACK, "AtomicAckETH", super::AtomicAckEth::LEN),
        (Self::IMM, "ImmDt", 4),
        (Self::IETH, "IETH", 4),
        (Self::CNP_RESERVED, "CNP reserved", 16),
    ];

    /// The union of two sets.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every header of `other` is in `self`.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The total length in bytes of the extension headers in this set.
    #[must_use]
    pub const fn len(self) -> usize {
        let mut total = 0;
        let mut i = 0;
        while i < Self::ALL.len() {
            if self.contains(Self::ALL[i].0) {
                total += Self::ALL[i].2;
            }
            i += 1;
        }
        total
    }

    /// Whether the set is empty (the packet carries the BTH alone).
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The byte offset of header `which` from the end of the BTH, if the set contains it.
    #[must_use]
    pub const fn offset_of(self, which: Self) -> Option<usize> {
        if !self.contains(which) || which.0 == 0 {
            return None;
        }
        let mut offset = 0;
        let mut i = 0;
        while i < Self::ALL.len() {
            let (h, _, len) = Self::ALL[i];
            if h.0 == which.0 {
                return Some(offset);
            }
            if self.contains(h) {
                offset += len;
            }
            i += 1;
        }
        None
    }
}

impl fmt::Debug for HeaderSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut set = f.debug_set();
        for (h, name, _) in Self::ALL {
            if self.contains(h) {
                set.entry(&format_args!("{name}"));
            }
        }
        set.finish()
    }
}

/// A known BTH opcode.
///
/// Only the opcodes ferroce understands can be constructed ([`Opcode::new`] returns `None`
/// for the rest), so holding an `Opcode` means its header layout is known.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(u8);

/// One row of the opcode table.
struct Row {
    value: u8,
    name: &'static str,
    operation: Operation,
    headers: HeaderSet,
    payload: bool,
    /// Offset of each header of [`HeaderSet::ALL`] after the BTH, `u8::MAX` when absent:
    /// computed at compile time so the packet path pays one load per header.
    offsets: [u8; 9],
    /// BTH plus extension headers, in bytes.
    header_len: u8,
    /// What the packet path asks of every packet's opcode ([`RESPONSE`], [`FIRST`],
    /// [`LAST`], [`REQUEST`]): computed at compile time, one load and a mask each.
    kind: u8,
}

/// [`Row::kind`]: an ACK, an atomic ACK or a READ response.
const RESPONSE: u8 = 1;
/// [`Row::kind`]: starts a message (FIRST or ONLY, or a single-packet operation).
const FIRST: u8 = 2;
/// [`Row::kind`]: ends a message (LAST or ONLY, or a single-packet operation).
const LAST: u8 = 4;
/// [`Row::kind`]: sent by a requester.
const REQUEST: u8 = 8;

const fn kind(op: Operation) -> u8 {
    use Operation as O;
    let response = matches!(
        op,
        O::Acknowledge
            | O::AtomicAcknowledge
            | O::RdmaReadResponseFirst
            | O::RdmaReadResponseMiddle
            | O::RdmaReadResponseLast
            | O::RdmaReadResponseOnly
    );
    let first = !matches!(
        op,
        O::SendMiddle
            | O::SendLast
            | O::SendLastWithImmediate
            | O::SendLastWithInvalidate
            | O::RdmaWriteMiddle
            | O::RdmaWriteLast
            | O::RdmaWriteLastWithImmediate
            | O::RdmaReadResponseMiddle
            | O::RdmaReadResponseLast
    );
    let last = !matches!(
        op,
        O::SendFirst
            | O::SendMiddle
            | O::RdmaWriteFirst
            | O::RdmaWriteMiddle
            | O::RdmaReadResponseFirst
            | O::RdmaReadResponseMiddle
    );
    let request = !response && !matches!(op, O::CongestionNotification);
    (if response { RESPONSE } else { 0 })
        | (if first { FIRST } else { 0 })
        | (if last { LAST } else { 0 })
        | (if request { REQUEST } else { 0 })
}

const fn offsets(headers: HeaderSet) -> [u8; 9] {
    let mut out = [u8::MAX; 9];
    let mut i = 0;
    while i < HeaderSet::ALL.len() {
        if let Some(offset) = headers.offset_of(HeaderSet::ALL[i].0) {
            out[i] = offset as u8;
        }
        i += 1;
    }
    out
}

const fn h(a: HeaderSet, b: HeaderSet) -> HeaderSet {
    a.with(b)
}

macro_rules! opcodes {
    ($($konst:ident = $value:literal, $op:ident, $headers:expr, $payload:literal;)*) => {
        impl Opcode {
            $(
                #[doc = concat!("`", stringify!($konst), "` (", stringify!($value), ").")]
                pub const $konst: Self = Self($value);
            )*

            /// Every known opcode, in numeric order.
            pub const ALL: &'static [Self] = &[$(Self::$konst),*];
        }

        static TABLE: &[Row] = &[$(
            Row {
                value: $value,
                name: stringify!($konst),
                operation: Operation::$op,
                headers: $headers,
                payload: $payload,
                offsets: offsets($headers),
                header_len: (super::Bth::LEN + $headers.len()) as u8,
                kind: kind(Operation::$op),
            },
        )*];
    };
}

const N: HeaderSet = HeaderSet::NONE;
const IMM: HeaderSet = HeaderSet::IMM;
const RETH: HeaderSet = HeaderSet::RETH;
const AETH: HeaderSet = HeaderSet::AETH;

opcodes! {
    RC_SEND_FIRST = 0x00, SendFirst, N, true;
    RC_SEND_MIDDLE = 0x01, SendMiddle, N, true;
    RC_SEND_LAST = 0x02, SendLast, N, true;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, SendLastWithImmediate, IMM, true;
    RC_SEND_ONLY = 0x04, SendOnly, N, true;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, SendOnlyWithImmediate, IMM, true;
    RC_RDMA_WRITE_FIRST = 0x06, RdmaWriteFirst, RETH, true;
    RC_RDMA_WRITE_MIDDLE = 0x07, RdmaWriteMiddle, N, true;
    RC_RDMA_WRITE_LAST = 0x08, RdmaWriteLast, N, true;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, RdmaWriteLastWithImmediate, IMM, true;
    RC_RDMA_WRITE_ONLY = 0x0a, RdmaWriteOnly, RETH, true;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, RdmaWriteOnlyWithImmediate, h(RETH, IMM), true;
    RC_RDMA_READ_REQUEST = 0x0c, RdmaReadRequest, RETH, false;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, RdmaReadResponseFirst, AETH, true;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, RdmaReadResponseMiddle, N, true;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, RdmaReadResponseLast, AETH, true;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, RdmaReadResponseOnly, AETH, true;
    RC_ACKNOWLEDGE = 0x11, Acknowledge, AETH, false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12, AtomicAcknowledge, h(AETH, HeaderSet::ATOMIC_ACK), false;
    RC_COMPARE_SWAP = 0x13, CompareSwap, HeaderSet::ATOMIC, false;
    RC_FETCH_ADD = 0x14, FetchAdd, HeaderSet::ATOMIC, false;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, SendLastWithInvalidate, HeaderSet::IETH, true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, SendOnlyWithInvalidate, HeaderSet::IETH, true;
    RC_FLUSH = 0x1c, Flush, h(HeaderSet::FETH, RETH), false;
    RC_ATOMIC_WRITE = 0x1d, AtomicWrite, RETH, true;
    UC_SEND_FIRST = 0x20, SendFirst, N, true;
    UC_SEND_MIDDLE = 0x21, SendMiddle, N, true;
    UC_SEND_LAST = 0x22, SendLast, N, true;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, SendLastWithImmediate, IMM, true;
    UC_SEND_ONLY = 0x24, SendOnly, N, true;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, SendOnlyWithImmediate, IMM, true;
    UC_RDMA_WRITE_FIRST = 0x26, RdmaWriteFirst, RETH, true;
    UC_RDMA_WRITE_MIDDLE = 0x27, RdmaWriteMiddle, N, true;
    UC_RDMA_WRITE_LAST = 0x28, RdmaWriteLast, N, true;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, RdmaWriteLastWithImmediate, IMM, true;
    UC_RDMA_WRITE_ONLY = 0x2a, RdmaWriteOnly, RETH, true;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, RdmaWriteOnlyWithImmediate, h(RETH, IMM), true;
    UD_SEND_ONLY = 0x64, SendOnly, HeaderSet::DETH, true;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, SendOnlyWithImmediate, h(HeaderSet::DETH, IMM), true;
    CNP = 0x81, CongestionNotification, HeaderSet::CNP_RESERVED, false;
}

/// Position of each opcode value in `TABLE`, or `u8::MAX` when unknown.
static INDEX: [u8; 256] = {
    let mut index = [u8::MAX; 256];
    let mut i = 0;
    while i < TABLE.len() {
        index[TABLE[i].value as usize] = i as u8;
        i += 1;
    }
    index
};

impl Opcode {
    /// The opcode with this value, or `None` if ferroce does not know it (RD and XRC opcodes,
    /// reserved values).
    #[must_use]
    #[inline]
    pub const fn new(value: u8) -> Option<Self> {
        if INDEX[value as usize] == u8::MAX {
            None
        } else {
            Some(Self(value))
        }
    }

    /// The opcode for `operation` on `transport`, if that combination exists (UC has no READ or
    /// atomics, UD only SEND ONLY).
    #[must_use]
    pub fn from_parts(transport: Transport, operation: Operation) -> Option<Self> {
        TABLE
            .iter()
            .find(|row| row.operation == operation && Self(row.value).transport() == transport)
            .map(|row| Self(row.value))
    }

    #[inline]
    const fn row(self) -> &'static Row {
        &TABLE[INDEX[self.0 as usize] as usize]
    }

    /// The opcode's byte value.
    #[must_use]
    #[inline]
    pub const fn value(self) -> u8 {
        self.0
    }

    /// The transport class (the top three bits).
    #[must_use]
    #[inline]
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            _ => Transport::Cnp,
        }
    }

    /// The operation, independent of transport.
    #[must_use]
    #[inline]
    pub const fn operation(self) -> Operation {
        self.row().operation
    }

    /// The name used in IBTA tables and Linux's `ib_pack.h`, e.g. `RC_RDMA_WRITE_FIRST`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.row().name
    }

    /// The extension headers that follow the BTH.
    #[must_use]
    #[inline]
    pub const fn headers(self) -> HeaderSet {
        self.row().headers
    }

    /// The offset after the BTH of extension header `which` (one header, not a set), or
    /// `None` when this opcode does not carry it.
    #[must_use]
    #[inline]
    pub const fn header_offset(self, which: HeaderSet) -> Option<usize> {
        let index = which.0.trailing_zeros() as usize;
        if which.0.count_ones() != 1 || index >= HeaderSet::ALL.len() {
            return None;
        }
        match self.row().offsets[index] {
            u8::MAX => None,
            offset => Some(offset as usize),
        }
    }

    /// The length of the BTH and its extension headers, i.e. the offset of the payload.
    #[must_use]
    #[inline]
    pub const fn header_len(self) -> usize {
        self.row().header_len as usize
    }

    /// Whether packets with this opcode may carry a payload.
    #[must_use]
    #[inline]
    pub const fn carries_payload(self) -> bool {
        self.row().payload
    }

    /// Whether this opcode is sent by a requester (as opposed to an ACK or a READ response).
    #[must_use]
    #[inline]
    pub const fn is_request(self) -> bool {
        self.row().kind & REQUEST != 0
    }

    /// Whether this opcode is a response: an ACK, an atomic ACK or a READ response.
    #[must_use]
    #[inline]
    pub const fn is_response(self) -> bool {
        self.row().kind & RESPONSE != 0
    }

    /// Whether this packet starts a message (FIRST or ONLY, or a single-packet operation).
    #[must_use]
    #[inline]
    pub const fn is_first(self) -> bool {
        self.row().kind & FIRST != 0
    }

    /// Whether this packet ends a message (LAST or ONLY, or a single-packet operation).
    #[must_use]
    #[inline]
    pub const fn is_last(self) -> bool {
        self.row().kind & LAST != 0
    }
}

impl TryFrom<u8> for Opcode {
    type Error = super::Error;

    fn try_from(value: u8) -> Result<Self, Self::Error> {
        Self::new(value).ok_or(super::Error::UnknownOpcode(value))
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> Self {
        op.0
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(0x{:02x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kind bits agree with what each opcode's IBTA name says: FIRST, MIDDLE, LAST or
    /// ONLY place a packet in its message (an operation without them is one packet), ACKs and
    /// READ responses are the responses, and the READ responses are what their operation says.
    #[test]
    fn kinds_follow_the_ibta_names() {
        for &op in Opcode::ALL {
            let name = op.name();
            let part = |p: &str| name.contains(p);
            let staged = part("_FIRST") || part("_MIDDLE") || part("_LAST") || part("_ONLY");
            let response = part("ACKNOWLEDGE") || part("READ_RESPONSE");
            assert_eq!(
                op.is_first(),
                !staged || part("_FIRST") || part("_ONLY"),
                "{name}"
            );
            assert_eq!(
                op.is_last(),
                !staged || part("_LAST") || part("_ONLY"),
                "{name}"
            );
            assert_eq!(op.is_response(), response, "{name}");
            assert_eq!(op.is_request(), !response && name != "CNP", "{name}");
            assert_eq!(
                op.operation().is_read_response(),
                part("READ_RESPONSE"),
                "{name}"
            );
        }
    }

    #[test]
    fn header_lengths_match_rxe_opcode_table() {
        // Lengths from BTH start to payload, as in rxe_opcode.c.
        let expect = [
            (0x00, 12),
            (0x03, 16),
            (0x06, 28),
            (0x0b, 32),
            (0x0c, 28),
            (0x0d, 16),
            (0x0e, 12),
            (0x11, 16),
            (0x12, 24),
            (0x13, 40),
            (0x14, 40),
            (0x16, 16),
            (0x1c, 32),
            (0x2a, 28),
            (0x2b, 32),
            (0x64, 20),
            (0x65, 24),
            (0x81, 28),
        ];
        for (value, len) in expect {
            let op = Opcode::new(value).unwrap();
            assert_eq!(op.header_len(), len, "{op:?}");
        }
    }

    #[test]
    fn unknown_opcodes_are_refused() {
        for value in [0x15, 0x18, 0x1f, 0x2c, 0x40, 0x63, 0x66, 0x80, 0xa0, 0xff] {
            assert_eq!(Opcode::new(value), None, "0x{value:02x}");
        }
        assert_eq!(Opcode::ALL.len(), 40);
    }

    #[test]
    fn parts_round_trip() {
        for &op in Opcode::ALL {
            assert_eq!(Opcode::from_parts(op.transport(), op.operation()), Some(op));
        }
        assert_eq!(
            Opcode::from_parts(Transport::Uc, Operation::RdmaReadRequest),
            None
        );
    }

    #[test]
    fn header_offsets_follow_wire_order() {
        let flush = Opcode::RC_FLUSH.headers();
        assert_eq!(flush.offset_of(HeaderSet::FETH), Some(0));
        assert_eq!(flush.offset_of(HeaderSet::RETH), Some(4));
        let ud = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.headers();
        assert_eq!(ud.offset_of(HeaderSet::IMM), Some(8));
        assert_eq!(ud.offset_of(HeaderSet::RETH), None);
        for &op in Opcode::ALL {
            for (h, _, _) in HeaderSet::ALL {
                assert_eq!(
                    op.header_offset(h),
                    op.headers().offset_of(h),
                    "{op:?} {h:?}"
                );
            }
            assert_eq!(op.header_offset(HeaderSet::RETH.with(HeaderSet::IMM)), None);
        }
    }
}
