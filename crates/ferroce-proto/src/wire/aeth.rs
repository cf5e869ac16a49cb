//! The ACK Extended Transport Header (IBTA Vol. 1 §9.3.5) and its syndrome.
//!
//! The syndrome byte's top three bits give the kind: `000` ACK (low five bits: credits),
//! `001` RNR NAK (low five bits: the RNR timer code), `011` NAK (low five bits: the NAK code);
//! `010` and `1xx` are reserved. Every one of the 256 syndromes parses to a [`Syndrome`] and
//! emits back to the same byte.

use core::fmt;
use core::time::Duration;

use super::{be_u24, check_len, check_u24, put_u24, Error};

/// The syndrome of an AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// A positive acknowledgement with the responder's end-to-end credit count (0–31; 31
    /// means "invalid": no credit information, which is what rxe always sends).
    Ack {
        /// The credit count code.
        credits: u8,
    },
    /// Receiver not ready: no receive WQE was posted. The requester waits the timer's time and
    /// retries.
    RnrNak(RnrTimer),
    /// A negative acknowledgement.
    Nak(NakCode),
    /// A reserved syndrome (types `010` and `1xx`), kept verbatim.
    Reserved(u8),
}

impl Syndrome {
    /// The ACK credit code meaning "no credit information" (rxe always sends it).
    pub const INVALID_CREDITS: u8 = 0x1f;

    /// The syndrome of a plain ACK with no credit information, as rxe sends.
    pub const ACK: Self = Self::Ack {
        credits: Self::INVALID_CREDITS,
    };

    /// Decodes a syndrome byte.
    #[must_use]
    #[inline]
    pub const fn from_byte(byte: u8) -> Self {
        let low = byte & 0x1f;
        match byte >> 5 {
            0b000 => Self::Ack { credits: low },
            0b001 => Self::RnrNak(RnrTimer(low)),
            0b011 => Self::Nak(NakCode::from_code(low)),
            _ => Self::Reserved(byte),
        }
    }

    /// Encodes the syndrome byte.
    #[must_use]
    pub const fn to_byte(self) -> u8 {
        match self {
            Self::Ack { credits } => credits & 0x1f,
            Self::RnrNak(timer) => 0x20 | (timer.0 & 0x1f),
            Self::Nak(code) => 0x60 | (code.code() & 0x1f),
            Self::Reserved(byte) => byte,
        }
    }

    /// Whether the syndrome round-trips: every field fits its bits and `Reserved` holds a
    /// reserved byte.
    const fn is_valid(self) -> bool {
        match self {
            Self::Ack { credits } => credits <= 0x1f,
            Self::RnrNak(timer) => timer.0 <= 0x1f,
            Self::Nak(NakCode::Reserved(code)) => code >= 5 && code <= 0x1f,
            Self::Nak(_) => true,
            Self::Reserved(byte) => matches!(byte >> 5, 0b010 | 0b100..=0b111),
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ack { credits } => write!(f, "ACK credits={credits}"),
            Self::RnrNak(timer) => write!(f, "RNR-NAK timer={} ({:?})", timer.0, timer.duration()),
            Self::Nak(code) => write!(f, "NAK {code}"),
            Self::Reserved(byte) => write!(f, "reserved 0x{byte:02x}"),
        }
    }
}

/// The code of a NAK (IBTA Vol. 1 §9.7.5.2.1, table 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; the requester goes back to the PSN the NAK carries.
    PsnSequenceError,
    /// 1: invalid request (bad opcode sequence, length, or an unsupported operation).
    InvalidRequest,
    /// 2: remote access error (key, bounds or access rights).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request (Reliable Datagram only).
    InvalidRdRequest,
    /// 5–31: reserved, kept verbatim.
    Reserved(u8),
}

impl NakCode {
    /// Decodes the low five bits of a NAK syndrome.
    #[must_use]
    pub const fn from_code(code: u8) -> Self {
        match code {
            0 => Self::PsnSequenceError,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccessError,
            3 => Self::RemoteOperationalError,
            4 => Self::InvalidRdRequest,
            other => Self::Reserved(other),
        }
    }

    /// The five-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequenceError => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccessError => 2,
            Self::RemoteOperationalError => 3,
            Self::InvalidRdRequest => 4,
            Self::Reserved(code) => code,
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PsnSequenceError => f.write_str("PSN sequence error"),
            Self::InvalidRequest => f.write_str("invalid request"),
            Self::RemoteAccessError => f.write_str("remote access error"),
            Self::RemoteOperationalError => f.write_str("remote operational error"),
            Self::InvalidRdRequest => f.write_str("invalid RD request"),
            Self::Reserved(code) => write!(f, "reserved code {code}"),
        }
    }
}

/// An RNR NAK timer code (0–31) and the wait it stands for (IBTA Vol. 1 §9.7.5.2.8, table 45).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct RnrTimer(u8);

/// Table 45, in units of 10 µs (0.01 ms). Code 0 is the longest wait, 655.36 ms.
const RNR_TIMER_10US: [u32; 32] = [
    65_536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

impl RnrTimer {
    /// A timer code, or `None` above 31.
    #[must_use]
    pub const fn new(code: u8) -> Option<Self> {
        if code <= 0x1f {
            Some(Self(code))
        } else {
            None
        }
    }

    /// The five-bit code.
    #[must_use]
    pub const fn code(self) -> u8 {
        self.0
    }

    /// How long the requester waits before retrying.
    #[must_use]
    pub const fn duration(self) -> Duration {
        // 0.01 ms steps: 10 µs each.
        Duration::from_micros(RNR_TIMER_10US[(self.0 & 0x1f) as usize] as u64 * 10)
    }
}

/// ACK Extended Transport Header, 4 bytes: syndrome and message sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// What kind of acknowledgement this is.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits): how many messages the responder has completed.
    pub msn: u32,
}

impl Aeth {
    /// The header's length in bytes.
    pub const LEN: usize = 4;

    /// Parses the first 4 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 4 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("AETH", bytes, Self::LEN)?;
        Ok(Self {
            syndrome: Syndrome::from_byte(bytes[0]),
            msn: be_u24(bytes, 1),
        })
    }

    pub(crate) fn emit(&self, out: &mut [u8]) -> Result<(), Error> {
        check_u24("AETH MSN", self.msn)?;
        if !self.syndrome.is_valid() {
            return Err(Error::FieldRange {
                field: "AETH syndrome",
                value: self.syndrome.to_byte().into(),
                bits: 5,
            });
        }
        out[0] = self.syndrome.to_byte();
        put_u24(out, 1, self.msn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_syndrome_byte_round_trips() {
        for byte in 0..=u8::MAX {
            let s = Syndrome::from_byte(byte);
            assert!(s.is_valid(), "{byte:#x}");
            assert_eq!(s.to_byte(), byte);
        }
    }

    #[test]
    fn syndromes_rxe_sends() {
        assert_eq!(Syndrome::from_byte(0x1f), Syndrome::ACK);
        assert_eq!(Syndrome::from_byte(0x2c), Syndrome::RnrNak(RnrTimer(12)));
        assert_eq!(
            Syndrome::from_byte(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_byte(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(RnrTimer(0).duration(), Duration::from_micros(655_360));
        assert_eq!(RnrTimer(1).duration(), Duration::from_micros(10));
        assert_eq!(RnrTimer(12).duration(), Duration::from_micros(640));
        assert_eq!(RnrTimer(31).duration(), Duration::from_micros(491_520));
        assert_eq!(RnrTimer::new(32), None);
    }
}
